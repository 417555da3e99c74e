"""Held-out accept_len two ways against vLLM's, on the replies the demo's serve stage generated.

    .venv/bin/python scripts/bench/bench_heldout_walk.py [--demo .cache/demo]

The demo's serve stage sends the first N held-out prompts (N = its report's prompts_sent); their
held-out rows hold the target's greedy replies to them, which the lossless serve reproduces. On
those rows, with every valid anchor drawn, the exported draft is scored as training scores it (the
mean over anchors) and as serving walks a reply (each round's anchor where the last one ended,
`blockdraft.train.metrics.walked_accept_length`); the table sets both beside the vLLM counters of
the serve report. Needs `make demo`'s outputs. Writes its section of docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from publish import REPO, command_line, provenance, publish, shown_path

TARGET = REPO / ".cache" / "targets" / "smollm2-135m-instruct"


def scored(export: Path, rows: list, tmp: Path, experiment: str = "smollm2_dflash_cpu") -> dict:
    """The export on `rows`: training's uniform mean over every anchor and the walk as serving takes it,
    per slot; for a DSpark draft also the confidence head's calibration on the walked rounds."""
    import blockdraft.train.__main__  # noqa: F401  (registers the train schema)
    from blockdraft.config import compose
    from blockdraft.data.dataset import collate
    from blockdraft.ranks.distributed import init_distributed
    from blockdraft.train.loop import Trainer
    from blockdraft.train.metrics import walked_accept_length, walked_calibration
    from blockdraft.train.setup import config_yaml
    from blockdraft.train.step import train_step

    (tmp / "rows.jsonl").write_text("".join(r + "\n" for r in rows))
    # data.train is the same rows only because a run needs one; nothing trains.
    cfg = compose("train", [f"experiment={experiment}", f"run_dir={tmp / 'run'}", f"target.path={TARGET}",
                            f"data.train={tmp / 'rows.jsonl'}", f"data.val={tmp / 'rows.jsonl'}", "data.features=null",
                            f"init_from={export}", "init_from_target=false", "train.num_anchors=${data.seq_length}"])  # every anchor of a row
    trainer = Trainer(OmegaConf.to_object(cfg), config_yaml(cfg), init_distributed())
    trainer.model.eval()
    pad = trainer.tokenizer.pad_token_id or 0
    uniform_sum = uniform_blocks = tokens = rounds = 0
    slot_correct, slot_supervised, walked_slots, calibration = 0, 0, None, None
    with torch.no_grad():
        for i in range(len(trainer.val_data)):
            batch = collate([trainer.val_data[i]], pad_id=pad)
            out = train_step(trainer.model, trainer.target, batch, trainer.cfg.train, torch.Generator().manual_seed(0),
                             trainer.backend)
            uniform_sum += out.sums["accept_len_sum"].item()
            uniform_blocks += out.sums["accept_len_blocks"].item()
            slot_correct = slot_correct + out.sums["slot_correct"]
            slot_supervised = slot_supervised + out.sums["slot_supervised"]
            b = out.blocks
            t, r, per_slot = walked_accept_length(out.pred, b.labels, b.label_mask, b.anchors, b.anchor_valid)
            tokens, rounds = tokens + t, rounds + r
            walked_slots = per_slot if walked_slots is None else [x + y for x, y in zip(walked_slots, per_slot)]
            if out.confidence is not None:
                these = walked_calibration(out.pred, b.labels, b.label_mask, b.anchors, b.anchor_valid, out.confidence)
                calibration = these if calibration is None else [[x + y for x, y in zip(*pair)] for pair in zip(calibration, these)]
    result = {"rows": len(trainer.val_data), "anchors": int(uniform_blocks), "uniform": uniform_sum / uniform_blocks,
              "uniform_slots": (slot_correct / slot_supervised).tolist()[1:], "rounds": rounds,
              "walked": tokens / rounds, "walked_slots": [x / rounds for x in walked_slots]}
    if calibration is not None:
        result["calibration"] = dict(zip(("reached", "accepted", "predicted_sum"), calibration))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", default=str(REPO / ".cache" / "demo"))
    args = parser.parse_args()
    demo = Path(args.demo)
    report_path = demo / "serve" / "report.json"
    for needed in (demo / "export" / "config.json", demo / "regen" / "heldout.jsonl", report_path):
        if not needed.is_file():
            sys.exit(f"{needed} is missing: run `make demo` (or pass --demo <its out>) first")
    report = json.loads(report_path.read_text())
    n = report["prompts_sent"]
    rows = (demo / "regen" / "heldout.jsonl").read_text().splitlines()[:n]
    with tempfile.TemporaryDirectory() as tmp:
        s = scored(demo / "export", rows, Path(tmp))
    fmt = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    body = "\n".join([
        "| measured | accept_len | per slot | over |", "|---|---|---|---|",
        f"| training's held-out metric: every anchor, uniformly | {s['uniform']:.3f} | {fmt(s['uniform_slots'])} (accuracy) "
        f"| {s['anchors']} anchors |",
        f"| the same predictions walked as serving walks a reply | {s['walked']:.3f} | {fmt(s['walked_slots'])} (accepted per round) "
        f"| {s['rounds']} rounds |",
        f"| vLLM, the serve report's counters | {report['mean_acceptance_length']:.3f} | "
        f"{fmt(report['acceptance_per_position'])} (accepted per round) | {n} prompts x {report.get('max_tokens', '?')} tokens |",
        "", f"The draft `{shown_path(demo / 'export')}` on the first {s['rows']} rows of `{shown_path(demo / 'regen' / 'heldout.jsonl')}`, "
        f"the prompts its serve report ({report['date']}) sent."])
    publish("heldout_walk", "Held-out accept_len, walked as serving walks it, against vLLM's (SmolLM2-135M)",
            provenance(command_line()) + "\n" + body)


if __name__ == "__main__":
    main()
