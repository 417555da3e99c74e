"""JetSpec: DFlash's weights with causal attention inside the block (slot k sees slots 0..k). vLLM serves it as
DFlashDraftModel with `is_causal: true`; its config is told from DFlash's by that flag (draft_format/causality.py)."""

from blockdraft.kinds.registry import register
from blockdraft.kinds.spec import VLLM_MODELS, KindSpec

SPEC = register(KindSpec(
    name="jetspec",
    title="JetSpec",
    model="blockdraft.kinds.dflash.model:DFlashDraftModel",
    architecture="DFlashDraftModel",
    card_title="JetSpec (causal DFlash)",
    references=(f"code: {VLLM_MODELS}qwen3_dflash.py with `is_causal: true` (its per-layer causal attention)",
                "objective: the JetSpec paper's Eq. 9 (configs/objective/jetspec.yaml); no arXiv id is cited here"),
    owns_architecture=False,  # DFlash's: a config causal in every layer is JetSpec's
    causal_in_block=True,
))
