"""Schema of the `target` config group: which frozen model the draft serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TargetConfig:
    path: Optional[str] = None
    """A local Hugging Face model directory (nothing is downloaded)."""
    tiny: Optional[str] = None
    """Build a tiny random target of this family (tiny_target.TINY_ARCHS: qwen3, qwen3_5, nemotron_h,
    qwen3_vl, ...) at `path` if it is missing; tests only."""
    dtype: str = "auto"
    """auto (fp32 on CPU, bf16 on GPU) | float32 | bfloat16."""
