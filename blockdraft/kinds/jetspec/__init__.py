"""JetSpec: DFlash's weights with causal attention inside the block (slot k sees slots 0..k). vLLM serves it as
DFlashDraftModel with `is_causal: true`; its config is told from DFlash's by that flag (export/causality.py)."""

from blockdraft.kinds.registry import register
from blockdraft.kinds.spec import KindSpec

SPEC = register(KindSpec(
    name="jetspec",
    title="JetSpec",
    model="blockdraft.kinds.dflash.model:DFlashDraftModel",
    architecture="DFlashDraftModel",
    owns_architecture=False,  # DFlash's: a config causal in every layer is JetSpec's
    causal_in_block=True,
))
