"""DFlash2: DFlash layers with an in-block convolution, and a pairwise selector choosing each slot's token among
its top-k candidates given the one chosen before it. Only vLLM's V2 model runner serves it."""

from blockdraft.kinds.dflash2.checks import check
from blockdraft.kinds.dflash2.contract import weight_shapes
from blockdraft.kinds.dflash2.export import REQUIRED, export_keys, read_keys
from blockdraft.kinds.dflash2.reload import probe_outputs
from blockdraft.kinds.dflash2.serving import anchor_clamp_warning
from blockdraft.kinds.registry import register
from blockdraft.kinds.spec import VLLM_MODELS, KindSpec

SPEC = register(KindSpec(
    name="dflash2",
    title="DFlash2",
    model="blockdraft.kinds.dflash2.model:DFlash2DraftModel",
    architecture="DFlash2DraftModel",
    references=(f"code: {VLLM_MODELS}qwen3_dflash2.py (`DFlash2DraftModel`), which extends qwen3_dflash.py as this draft does",),
    reads=("Qwen3DFlash2DraftModel",),
    # vLLM 0.32 serves it on its V2 GPU model runner only (config/vllm.py, V1's refusals).
    v2_runner="its candidate selector runs only in V2's DFlash2 speculator; V1 refuses `DFlash candidate-head drafts`",
    draft_vocab_refusal="vLLM's DFlash2 takes its candidate top-k from the target's full head",
    # Its settings, and the target's embedding scale and logit transform it carries (resolved, never set).
    settings=REQUIRED + ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"),
    keyed_alone=(),
    check=check,
    export_keys=export_keys,
    read_keys=read_keys,
    required_keys=REQUIRED,
    weight_shapes=weight_shapes,
    weights_label="conv/selector",
    probe_outputs=probe_outputs,
    serving_warnings=anchor_clamp_warning,
))
