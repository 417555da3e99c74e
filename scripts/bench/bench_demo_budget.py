"""The demo's 30-minute budget on each CPU of this machine kind: measured on this one, computed for the others.

    .venv/bin/python scripts/bench/bench_demo_budget.py [--demo .cache/demo]

Reads a finished `make demo` (its stages.json, rows, training metrics and serve report) for this CPU's
per-stage throughputs; the other CPUs' come from their fresh-checkout demos in docs/benchmarks.md
(OTHER_CPUS below, with their dates and commits). For each CPU it computes the stages' seconds under the
preset sized for it (blockdraft/demo.py, SIZES), showing the arithmetic, and for this CPU sets the
prediction beside what the demo measured. Writes the `demo_budget` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# publish first: where no blockdraft is installed, it puts this checkout's on the path.
from publish import REPO, command_line, provenance, publish
from blockdraft.demo import SIZES, cpu_class
from blockdraft.machine import describe, machine_facts

SERVED_TOKENS = 16 * 128  # the serve stage, the same on every CPU: 16 held-out prompts x 128 tokens
ROUNDS, WARMUP_TOKENS = 2, 2 * 128  # two rounds, each on a fresh pair of servers; two warm-up prompts per server
PROBE_TOKENS, PROBE_WARMUP = 2 * 64, 64  # the round-cost probe: two prompts of 64 tokens, one warm-up
HELDOUT = 48

# Per-stage figures of fresh-checkout demos on the other CPUs (docs/benchmarks.md, "The demo on
# SmolLM2-135M-Instruct"), kept servers: seconds, rows and steps as measured.
OTHER_CPUS = {
    "amx": dict(name="2-core Intel Xeon (model 167; avx512f, avx512_bf16, amx)", source="2026-12-03, commit 9323034",
                target=18, regen=613, rows=1500, capture=223, train=319, steps=3000, step_s=0.1025, export=3,
                startup=(30.1 + 34.6) / 2, base_tps=14.73, draft_tps=16.91, probe=None),
    "other": dict(name="2-core AMD EPYC (no avx512f, avx512_bf16, amx)", source="2026-12-03, commit 7b0ee35",
                  target=48, regen=1301, rows=1500, capture=1102, train=671, steps=3000, step_s=0.21, export=6,
                  startup=(72 + 91) / 2, base_tps=7.55, draft_tps=7.41, probe=None),
}


def measured_here(demo: Path) -> dict:
    """This CPU's figures from a finished demo."""
    stages = json.loads((demo / "stages.json").read_text())
    report = json.loads((demo / "serve" / "report.json").read_text())
    metrics = [json.loads(line) for line in (demo / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in metrics if "step_time_s" in r]
    startups = [v for k, v in report["timings_s"].items() if k.startswith("startup_")]
    seconds = {name: stages[name]["seconds"] for name in ("target", "regen", "capture", "train", "export", "serve")}
    probe = (stages.get("pipeline", {}).get("round_cost") or {}).get("seconds")
    rows = sum(1 for _ in (demo / "regen" / "train.jsonl").open())
    return dict(name=describe(), source="this run", **seconds, rows=rows, steps=steps[-1]["step"],
                step_s=statistics.median(r["step_time_s"] for r in steps), startup=statistics.mean(startups),
                base_tps=report["tokens_per_s_baseline"], draft_tps=report["tokens_per_s_draft"], probe=probe,
                measured_total=sum(seconds.values()) + (probe or 0))


def predicted(m: dict, size: dict) -> list:
    """(stage, seconds, arithmetic) under `size` from the figures `m` of one CPU."""
    per_token = 1 / m["base_tps"] + 1 / m["draft_tps"]  # one token on each side
    regen_row = (m["regen"] - m["startup"]) / (m["rows"] + HELDOUT)
    capture_row = m["capture"] / m["rows"]
    train_overhead = m["train"] - m["steps"] * m["step_s"]
    minutes_s = min(size["minutes"] * 60, size["steps"] * m["step_s"])
    probe = m["probe"] if m["probe"] else 2 * m["startup"] + (PROBE_TOKENS + PROBE_WARMUP) * per_token
    return [
        ("target", m["target"], "measured"),
        ("round-cost probe", probe, "measured" if m["probe"] else
         f"2 x {m['startup']:.0f} s start-up + {PROBE_TOKENS + PROBE_WARMUP} tokens a side x {per_token:.3f} s"),
        ("regen", m["startup"] + (size["rows"] + HELDOUT) * regen_row,
         f"{m['startup']:.0f} s start-up + {size['rows'] + HELDOUT} rows x {regen_row:.3f} s"),
        ("capture", size["rows"] * capture_row, f"{size['rows']} rows x {capture_row:.3f} s"),
        ("train", minutes_s + train_overhead,
         f"min({size['minutes']:g} min, {size['steps']} steps x {m['step_s']:.4f} s) + {train_overhead:.0f} s set-up"),
        ("export", m["export"], "measured"),
        ("serve", 2 * ROUNDS * m["startup"] + ROUNDS * (SERVED_TOKENS + WARMUP_TOKENS) * per_token,
         f"{2 * ROUNDS} x {m['startup']:.0f} s start-up + {ROUNDS} x ({SERVED_TOKENS} + {WARMUP_TOKENS} warm-up) tokens a "
         f"side x {per_token:.3f} s (1/{m['base_tps']:.2f} + 1/{m['draft_tps']:.2f} tokens/s)"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", default=str(REPO / ".cache" / "demo"))
    args = parser.parse_args()
    here_kind = cpu_class(machine_facts())
    cpus = dict(OTHER_CPUS)
    cpus[here_kind] = measured_here(Path(args.demo))
    parts = []
    for kind in ("amx", "avx512_bf16", "other"):
        if kind not in cpus:
            parts.append(f"### {kind}\n\nNo fresh-checkout demo measured on such a CPU yet.\n")
            continue
        m, size = cpus[kind], SIZES[kind]
        lines = predicted(m, size)
        total = sum(s for _, s, _ in lines)
        table = ["| stage | seconds | arithmetic |", "|---|---|---|"]
        table += [f"| {stage} | {s:.0f} | {how} |" for stage, s, how in lines]
        table.append(f"| **all stages** | **{total:.0f} ({total / 60:.1f} min)** | the budget: 1800 s |")
        measured = (f"\n\nMeasured by this run with this size: **{m['measured_total']:.0f} s ({m['measured_total'] / 60:.1f} "
                    "min)** of stages and probe." if "measured_total" in m else "")
        parts.append(f"### {m['name']}: {size['rows']} rows, {size['minutes']:g} min / {size['steps']} steps of training\n\n"
                     f"Throughputs from its demo of {m['source']}.\n\n" + "\n".join(table) + measured + "\n")
    body = ("The preset's size per CPU (`blockdraft/demo.py`, `SIZES`): the serve stage and the round-cost probe are "
            "the same work on every CPU, the rows and training minutes take what is left of 30 minutes. Each table "
            "computes the stages from that CPU's per-stage throughputs.\n\n" + "\n".join(parts))
    publish("demo_budget", "The demo's 30-minute budget on each CPU", provenance(command_line()) + "\n" + body)


if __name__ == "__main__":
    main()
