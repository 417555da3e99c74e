"""Where metrics go: metrics.jsonl (always, rank 0), wandb when configured, a progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from blockdraft.config.recipe import WandbConfig


class MetricsLogger:
    def __init__(self, run_dir, enabled: bool, wandb_cfg: WandbConfig, config_dict: dict, max_steps: int, start_step: int, progress: bool):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.bar = tqdm(total=max_steps, initial=start_step, disable=not (enabled and progress), dynamic_ncols=True)
        self.wandb = self._init_wandb(run_dir, wandb_cfg, config_dict) if enabled else None

    @staticmethod
    def _init_wandb(run_dir, cfg: WandbConfig, config_dict: dict):
        if cfg.mode == "disabled":
            return None
        import wandb

        return wandb.init(
            project=cfg.project, name=cfg.name, mode=cfg.mode, config=config_dict,
            dir=cfg.dir or str(Path(run_dir)), resume="allow",
        )

    def log(self, record: dict, advance: int = 0) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(clean) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in clean.items() if isinstance(v, (int, float))}, step=record.get("step"))
        if advance:
            self.bar.update(advance)
        if "loss" in record:
            self.bar.set_postfix(loss=f"{record['loss']:.3f}", accept_len=f"{record.get('accept_len', 0):.2f}", tok_s=f"{record.get('tokens_per_s', 0):.0f}")

    def advance(self, n: int = 1) -> None:
        if self.enabled:
            self.bar.update(n)

    def close(self) -> None:
        self.bar.close()
        if self.wandb is not None:
            import wandb

            self.wandb.finish()
            wandb.teardown()  # stop wandb's background service process with the run


def read_metrics(run_dir, report_torn: bool = False) -> list:
    """All complete JSON lines of metrics.jsonl; a torn line (a kill mid-write) is skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows, torn = [], 0
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            torn += 1
    if torn and report_torn:
        print(f"[metrics] {path}: skipped {torn} torn line(s)", flush=True)
    return rows


def trim_metrics(run_dir, step: int) -> int:
    """Keep the lines up to `step` (a resumed run rewrites what came after its checkpoint);
    returns how many lines were dropped, torn ones included. Rewritten atomically."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return 0
    total = len(path.read_text().splitlines())
    kept = [r for r in read_metrics(run_dir, report_torn=True) if r.get("step", 0) <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)
    return total - len(kept)


def summarize(sums: dict, world_tokens: Optional[float] = None) -> dict:
    """Metrics from all-reduced sums (see train.step.StepResult)."""
    out = {
        "loss": float(sums["loss_sum"] / sums["micro_batches"]),
        "accept_len": float(sums["accept_len_sum"] / sums["accept_len_blocks"].clamp_min(1)),
    }
    acc = sums["slot_correct"] / sums["slot_supervised"]
    out["acc_per_slot"] = [None if math.isnan(x) else round(x, 4) for x in acc.tolist()[1:]]
    if "kl_sum" in sums:
        out["kl"] = float(sums["kl_sum"] / sums["micro_batches"])
        # Slots none of whose teacher candidates the draft's vocabulary holds: left out of the KL.
        out["kl_rows_without_teacher"] = int(sums["kl_rows_without_teacher"])
    if "labels_outside_vocab" in sums:
        out["label_outside_vocab_share"] = float(sums["labels_outside_vocab"] / sums["slot_supervised"].sum().clamp_min(1))
    if "confidence_loss_sum" in sums:  # DSpark: the confidence head's loss and its calibration over all slots
        m = sums["slot_supervised"].sum().clamp_min(1)
        out["confidence_loss"] = float(sums["confidence_loss_sum"] / sums["micro_batches"])
        out["confidence_mean"] = float(sums["confidence_predicted_sum"] / m)
        out["confidence_target_mean"] = float(sums["confidence_target_sum"] / m)
        out["confidence_abs_error"] = float(sums["confidence_abs_error_sum"] / m)
    if "correction_base_correct" in sums:  # Domino, DSpark: the backbone's own accuracy, beside the corrected acc_per_slot
        out["base_acc"] = float(sums["correction_base_correct"] / sums["slot_supervised"].sum().clamp_min(1))
    if "selector_loss_sum" in sums:
        m = sums["slot_supervised"].sum().clamp_min(1)
        out["selector_loss"] = float(sums["selector_loss_sum"] / sums["micro_batches"])
        out["candidate_recall"] = float(sums["recall_hits"] / m)
        out["base_acc"] = float(sums["base_correct"] / m)
        out["selector_acc"] = float(sums["selector_correct"] / m)
    return out
