"""Drafts and the target adapter. A draft kind lives in its own folder under blockdraft/kinds/, registered there."""

from blockdraft import kinds
from blockdraft.models.draft_config import DraftModelConfig


def build_draft(cfg: DraftModelConfig):
    """The draft model of `cfg`'s kind (KindSpec.model), built from the checked config."""
    return kinds.get(cfg.kind).model_class()(cfg.validate())


__all__ = ["DraftModelConfig", "build_draft"]
