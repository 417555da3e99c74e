"""A kind's References lines on the model card: what it follows (KindSpec.references)."""

from __future__ import annotations

from typing import List

from blockdraft import kinds


def reference_lines(kind: str) -> List[str]:
    """The markdown bullets for one kind."""
    return [f"- {line}" for line in kinds.get(kind).references]
