"""The two ways a training run stops before train.max_steps on purpose, as exceptions the command turns
into its exit status and advice (blockdraft/train/__main__.py)."""

from __future__ import annotations

from pathlib import Path


class NonFiniteSteps(RuntimeError):
    """train.max_nonfinite_steps steps in a row had a non-finite loss or gradient norm; nothing of them
    was applied, and the last checkpoint is the newest one."""

    def __init__(self, step: int, skipped: list):
        where = "; ".join(f"step {s}: {what}, rows {rows}" for s, what, rows in skipped)
        super().__init__(
            f"stopped at step {step}: the last {len(skipped)} steps were not finite and were skipped ({where}). "
            "Rows are 0-based positions among data.train's usable rows. Nothing of these steps was applied; the "
            "latest checkpoint is the last good one. Check those rows, lower optim.lr, or set optim.grad_clip; "
            "rerun with resume=auto to continue from the checkpoint.")
        self.step = step


class Preempted(Exception):
    """SIGTERM arrived: a checkpoint of `step` was saved; rerun with resume=auto to go on."""

    def __init__(self, step: int, run_dir: Path):
        super().__init__(f"stopped by SIGTERM after step {step}; checkpoint saved in {run_dir}/checkpoints; rerun with resume=auto")
        self.step = step
