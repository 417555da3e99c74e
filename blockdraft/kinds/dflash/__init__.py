"""DFlash: one non-causal pass drafts a block (slot 0 the last accepted token, the rest MASK), conditioned on the
target's hidden states at target_layer_ids; vLLM's DFlashDraftModel serves it on either model runner."""

from blockdraft.kinds.registry import register
from blockdraft.kinds.spec import VLLM_MODELS, KindSpec

SPEC = register(KindSpec(
    name="dflash",
    title="DFlash",
    model="blockdraft.kinds.dflash.model:DFlashDraftModel",
    architecture="DFlashDraftModel",
    references=(f"code: {VLLM_MODELS}qwen3_dflash.py (`DFlashDraftModel`): module names, masks and computation match it",),
    reads=("Qwen3DFlashDraftModel",),  # speculators' and other trainers' name for it
))
