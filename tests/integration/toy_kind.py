"""A draft kind registered from the tests alone, as a user would add one (docs/adding-a-kind.md): DFlash with its
block loss weighted up. vLLM serves it as DFlash (the same architecture and weights); its export carries one
top-level key more, by which a reader tells it from DFlash. No stage's file names it."""

import torch

from blockdraft import kinds
from blockdraft.kinds.dflash.loss import BlockLoss, KindLoss, SupervisedSlots
from blockdraft.kinds.dflash.model import DFlashDraftModel
from blockdraft.kinds.spec import KindSpec

NAME = "toy"
SCALE_KEY = "toy_ce_scale"
CE_SCALE = 2.0  # the block CE counts twice: a changed loss weight is all that sets this kind apart


class ToyDraftModel(DFlashDraftModel):
    def kind_losses(self, slots: SupervisedSlots, block: BlockLoss) -> KindLoss:
        """The block CE once more, times CE_SCALE - 1, as the position weights spread it over the slots."""
        weights = block.weights * ~slots.outside
        extra = (CE_SCALE - 1.0) * (block.ce * weights).sum() / weights.sum().clamp(min=1e-6)
        return KindLoss(loss=extra.to(torch.float32))


SPEC = KindSpec(
    name=NAME,
    title="Toy",
    model=f"{__name__}:ToyDraftModel",
    architecture="DFlashDraftModel",
    owns_architecture=False,  # DFlash's: vLLM serves it as DFlash
    recognize=lambda kind, config: kind == "dflash" and SCALE_KEY in config,
    export_keys=lambda cfg: ({}, {SCALE_KEY: CE_SCALE}),
)


def register_toy() -> None:
    kinds.register(SPEC)
