"""The demo's 30-minute budget on each CPU class: the arithmetic of blockdraft/demo_budget.py, and this CPU's
finished demo beside it.

    .venv/bin/python scripts/bench/bench_demo_budget.py [--demo .cache/demo]

For each CPU class the preset's size (blockdraft/demo.py, SIZES) turned into seconds per stage from that
class's measured throughputs (demo_budget.MEASURED, each from a fresh-checkout demo), with the shares of
training and of measuring (probe + serve) that the preset must keep (at least 35%, at most 35%, within
1800 s). For this CPU's class, the demo given by --demo (its stages.json) is set beside the prediction.
Writes the `demo_budget` section of docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# publish first: where no blockdraft is installed, it puts this checkout's on the path.
from publish import REPO, command_line, provenance, publish
from blockdraft.demo import CPU_NAMES, SIZES, cpu_class
from blockdraft.demo_budget import BUDGET_S, MEASURED, shares, stage_seconds
from blockdraft.machine import machine_facts

ORDER = ("target", "probe", "regen", "capture", "train", "export", "serve")


def measured_demo(demo: Path) -> dict:
    """Seconds per stage (and the probe) of a finished demo, from its stages.json."""
    stages = json.loads((demo / "stages.json").read_text())
    seconds = {name: stages[name]["seconds"] for name in ORDER if name != "probe" and name in stages}
    seconds["probe"] = (stages.get("pipeline", {}).get("round_cost") or {}).get("seconds") or 0.0
    return seconds


def table(predicted: dict, measured: dict | None) -> str:
    head = "| stage | predicted s | measured s |" if measured else "| stage | predicted s |"
    rows = [head, "|---|---|---|" if measured else "|---|---|"]
    for name in ORDER:
        cells = [name, f"{predicted[name]:.0f}"] + ([f"{measured.get(name, 0.0):.0f}"] if measured else [])
        rows.append("| " + " | ".join(cells) + " |")
    for label, split in (("predicted", shares(predicted)), *((("measured", shares(measured)),) if measured else ())):
        rows.append(f"| **{label}: all** | **{split['total_s']:.0f} s ({split['total_s'] / 60:.1f} min)**, training "
                    f"{split['train']:.0%}, measuring {split['measure']:.0%} |" + (" |" if measured else ""))
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", default=str(REPO / ".cache" / "demo"))
    args = parser.parse_args()
    here = cpu_class(machine_facts())
    demo = Path(args.demo)
    parts = []
    for kind in ("amx", "avx512_bf16", "other"):
        size = SIZES[kind]
        measured = measured_demo(demo) if kind == here and (demo / "stages.json").is_file() else None
        parts.append(f"### {CPU_NAMES[kind]}: {size['rows']} rows, {size['minutes']:g} min / {size['steps']} steps of "
                     f"training, {size['serve_prompts']} served prompts\n\n"
                     + table(stage_seconds(size, MEASURED[kind]), measured)
                     + ("\n\nMeasured: the demo in `" + str(demo) + "` on this CPU." if measured else "") + "\n")
    body = (f"The preset's size per CPU class (`blockdraft/demo.py`, `SIZES`) in seconds per stage, from each class's "
            f"measured throughputs (`blockdraft/demo_budget.py`, `MEASURED`); the bounds: all within {BUDGET_S:.0f} s, "
            "training at least 35%, measuring (probe + serve) at most 35%.\n\n" + "\n".join(parts))
    publish("demo_budget", "The demo's 30-minute budget on each CPU", provenance(command_line()) + "\n" + body)


if __name__ == "__main__":
    main()
