"""LiLiCorr: a DFlash backbone (optionally with DFlash2's convolution) and a candidate-lattice head that walks
one path through each slot's top-k; vLLM's LiLiCorrForCausalLM (`method: dflash`) serves it on its V2 runner."""

from blockdraft.kinds.lilicorr.checks import check
from blockdraft.kinds.lilicorr.contract import weight_shapes
from blockdraft.kinds.lilicorr.export import LILICORR_KEYS, export_keys, read_keys
from blockdraft.kinds.lilicorr.reload import probe_outputs
from blockdraft.kinds.registry import register
from blockdraft.kinds.spec import VLLM_MODELS, KindSpec

SPEC = register(KindSpec(
    name="lilicorr",
    title="LiLiCorr",
    model="blockdraft.kinds.lilicorr.model:LiLiCorrDraftModel",
    architecture="LiLiCorrDraftModel",
    card_title="LiLiCorr (DFlash + candidate-lattice head)",
    references=("paper: arXiv 2608.20530 (LiLiCorr), the id docs/training.md cites",
                f"code: {VLLM_MODELS}lilicorr.py (`LiLiCorrDraftModel`), whose head vLLM adapted from sglang PR #37462"),
    # vLLM 0.32 serves it on its V2 GPU model runner only (config/vllm.py, V1's refusals).
    v2_runner="its lattice head runs only in V2's LiLiCorr speculator; V1 refuses `DFlash candidate-head drafts`",
    drafts_below_block=True,
    draft_vocab_refusal="vLLM's LiLiCorr scores candidates from the target's full head and embedding",
    settings=("conv_kernel_size", "conv_group_size") + LILICORR_KEYS,
    keyed_alone=tuple(f"draft.{key}" for key in LILICORR_KEYS),  # the convolution's keys are DFlash2's, keyed for all
    check=check,
    export_keys=export_keys,
    read_keys=read_keys,
    required_keys=LILICORR_KEYS,
    weight_shapes=weight_shapes,
    weights_label="conv/lattice head",
    probe_outputs=probe_outputs,
))
