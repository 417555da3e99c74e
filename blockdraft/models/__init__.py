"""Drafts and the target adapter. A new draft kind is a new file plus one line here."""

from blockdraft.models.dflash import DFlashDraftModel
from blockdraft.models.dflash2 import DFlash2DraftModel
from blockdraft.models.domino import DominoDraftModel
from blockdraft.models.dspark import DSparkDraftModel
from blockdraft.models.lilicorr import LiLiCorrDraftModel
from blockdraft.models.draft_config import DRAFT_KINDS, DraftModelConfig, check_kind

# JetSpec is DFlash with causal attention inside the block (`DraftModelConfig.is_causal`): same weights.
DRAFT_CLASSES = {"dflash": DFlashDraftModel, "dflash2": DFlash2DraftModel, "jetspec": DFlashDraftModel,
                 "domino": DominoDraftModel, "dspark": DSparkDraftModel,
                 "lilicorr": LiLiCorrDraftModel}


def build_draft(cfg: DraftModelConfig):
    check_kind(cfg.kind)
    return DRAFT_CLASSES[cfg.kind](cfg.validate())


__all__ = ["DRAFT_CLASSES", "DRAFT_KINDS", "DraftModelConfig", "build_draft"]
