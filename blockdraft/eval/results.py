"""From finished cells to what a user reads: eval.json (every figure), eval.md (drafts as columns)
and the plots (acceptance per position per dataset; speedup per dataset and concurrency)."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Dict, List, Optional

from blockdraft.build_info import build_info
from blockdraft.eval.cells import BASELINE, Cell, CellKey
from blockdraft.machine import describe, machine_facts
from blockdraft.vllm_runtime.omp_binding import omp_binding
from blockdraft.serve.verdict import acceptance, compare_outputs

SAMPLED_NOTE = ("sampled output is not compared token by token: vLLM's rejection sampling keeps it distributed "
                "as the target's own; only greedy cells are checked for identical tokens")
_VAL_LINE = re.compile(r"validation accept_len \(step (\d+)\): ([0-9.]+)")


def training_accept_len(draft_dir: str, run_dir: Optional[str]) -> Optional[dict]:
    """The last validation accept_len of the draft's training: from its run, else from its model card."""
    if run_dir:
        from blockdraft.train.logger import read_metrics

        rows = [r for r in read_metrics(run_dir) if r.get("split") == "val" and "accept_len" in r]
        return {"step": rows[-1]["step"], "accept_len": rows[-1]["accept_len"], "from": str(run_dir)} if rows else None
    card = Path(draft_dir) / "README.md"
    match = _VAL_LINE.search(card.read_text()) if card.is_file() else None
    return {"step": int(match[1]), "accept_len": float(match[2]), "from": str(card)} if match else None


def cell_result(evaluation, key: CellKey) -> Optional[dict]:
    """One draft's figures in one (dataset, setting, concurrency), against the target alone."""
    cell: Optional[Cell] = evaluation.cells.get(key)
    if cell is None:
        return None
    cfg = evaluation.cfg
    if cell.engine == "reference":
        base_completions, base_wall = cell.reference_baseline, cell.reference_baseline_wall_s
    else:
        base = evaluation.cells.get(CellKey(key.dataset, key.setting, key.concurrency, BASELINE))
        base_completions, base_wall = (base.completions, base.wall_s) if base else (None, None)
    accept = acceptance(cell.metrics)
    base_tps = sum(len(c.token_ids) for c in base_completions) / base_wall if base_completions and base_wall else None
    greedy = cfg.spec(key.setting).temperature <= 0
    lossless, mismatches = None, []
    if greedy and base_completions is not None:
        sources = [p.source for p in evaluation.prompts[key.dataset]]
        found = compare_outputs(base_completions, cell.completions, sources)
        mismatches = [m.describe() for m in found]
        lossless = not found or (cfg.allow_near_ties and all(m.near_tie == "yes" for m in found))
    return {
        "dataset": key.dataset, "setting": key.setting, "concurrency": key.concurrency, "draft": key.server,
        "engine": cell.engine, "prompts": len(cell.completions), "tokens": cell.tokens,
        "mean_acceptance_length": accept.mean_acceptance_length,
        "acceptance_per_position": accept.acceptance_per_position,
        "num_drafts": accept.num_drafts, "num_accepted_tokens": accept.num_accepted_tokens,
        "tokens_per_s": cell.tokens_per_s, "baseline_tokens_per_s": base_tps,
        "speedup": cell.tokens_per_s / base_tps if cell.tokens_per_s and base_tps else None,
        "wall_s": cell.wall_s, "lossless": lossless, "lossless_checked": greedy, "mismatches": mismatches,
    }


def build(evaluation) -> dict:
    cfg = evaluation.cfg
    labels = list(evaluation.plans)
    results = [r for label in labels for key in evaluation.keys(label) if (r := cell_result(evaluation, key))]
    not_run = evaluation.not_run
    expected = len(labels) * len(evaluation.keys(BASELINE)) - len(not_run)  # cells no engine here can run
    plan = evaluation.first_plan
    return {
        "target": str(Path(cfg.target_dir).resolve()),
        "drafts": {label: {"dir": str(directory), "kind": p.draft.kind, "engine": p.engine,
                           "num_speculative_tokens": p.num_speculative_tokens,
                           "training": training_accept_len(directory, cfg.runs[i] if cfg.runs else None),
                           "held_out": {d: held.as_dict() for d, held in evaluation.held_out.get(label, {}).items()}}
                   for i, (label, (directory, p)) in enumerate(evaluation.plans.items())},
        "datasets": {d: {"prompts": len(evaluation.prompts.get(d, [])), "skipped_too_long": evaluation.too_long.get(d, []),
                         **{k: v for k, v in vars(cfg.options(d)).items()}} for d in cfg.datasets},
        "settings": {s: vars(cfg.spec(s)) for s in cfg.settings},
        "concurrency": list(cfg.concurrency),
        "results": results,
        "complete": len(results) == expected,
        "not_run": not_run,
        "sampled_note": SAMPLED_NOTE,
        "sampling_notes": list(getattr(evaluation, "sampling_notes", [])),
        "environment": {"vllm_version": plan.vllm.version, "device": plan.device, "machine": machine_facts(),
                        "vllm_omp_binding": logged_binding(evaluation.out / "logs"), "python": platform.python_version()},
        "this_run_timings_s": evaluation.timings,
        **build_info(),
    }


def logged_binding(logs: Path) -> Optional[str]:
    """vLLM's OpenMP binding as the first server log states it (every server here starts alike)."""
    for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        if binding := omp_binding(log):
            return binding
    return None


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None else format(x, spec)


def held_out_lines(report: dict) -> List[str]:
    """eval.md's headline: each draft and dataset measured on prompts the draft trained on, and each draft
    whose record of training prompts is missing."""
    lines = []
    for label, draft in report["drafts"].items():
        for dataset, held in (draft.get("held_out") or {}).items():
            if held["trained_on"]:
                lines.append(f"**{label} on {Path(dataset).name}: {held['headline']}.**")
        if any(not held["recorded"] for held in (draft.get("held_out") or {}).values()):
            lines.append(f"{label}: no record of its training prompts: nothing says these prompts are held out.")
    return lines + [""] if lines else []


def markdown(report: dict) -> str:
    labels = list(report["drafts"])
    head = "| dataset | setting | concurrency | target tokens/s | " + " | ".join(labels) + " |"
    lines = [*held_out_lines(report), head, "|" + "---|" * (4 + len(labels))]
    by_cell: Dict[tuple, Dict[str, dict]] = {}
    for r in report["results"]:
        by_cell.setdefault((r["dataset"], r["setting"], r["concurrency"]), {})[r["draft"]] = r
    for (dataset, setting, conc), row in by_cell.items():
        base = next((r["baseline_tokens_per_s"] for r in row.values() if r["engine"] == "vllm"), None)
        cols = []
        for label in labels:
            r = row.get(label)
            if r is None:
                cols.append("not run")
                continue
            mark = {True: ", lossless", False: ", NOT lossless", None: ""}[r["lossless"]]
            engine = " (reference engine)" if r["engine"] == "reference" else ""
            cols.append(f"{_fmt(r['mean_acceptance_length'], '.2f')} / {_fmt(r['speedup'], '.2f')}x{mark}{engine}")
        lines.append(f"| {Path(dataset).name} | {setting} | {conc} | {_fmt(base, '.1f')} | " + " | ".join(cols) + " |")
    training = [f"{label} {d['training']['accept_len']:.3f} (step {d['training']['step']})" if d["training"] else f"{label} -"
                for label, d in report["drafts"].items()]
    lines += ["", "Cells: mean acceptance length / speedup over the target alone (tokens/s ratio).",
              f"Training's last validation accept_len: {', '.join(training)}.",
              f"Sampled cells: {SAMPLED_NOTE}."]
    lines += [f"{note[0].upper()}{note[1:]}." for note in report.get("sampling_notes", [])]
    env = report.get("environment", {})
    if env.get("machine"):
        lines.append(f"Machine: {describe(env['machine'])}; vLLM {env.get('vllm_version')} on {env.get('device')}"
                     + (f", OpenMP binding: {env['vllm_omp_binding']}." if env.get("vllm_omp_binding") else "."))
    if report["not_run"]:
        lines.append("Not run: " + "; ".join(report["not_run"]) + ".")
    if not report["complete"]:
        lines.append("INCOMPLETE: some cells did not run (see eval.json: not_run).")
    return "\n".join(lines) + "\n"


def plots(report: dict, out: Path) -> List[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written, results = [], report["results"]
    for dataset in report["datasets"]:
        rows = [r for r in results if r["dataset"] == dataset]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in rows:
            if r["concurrency"] != min(report["concurrency"]):
                continue
            rates = r["acceptance_per_position"]
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{r['draft']} ({r['setting']})")
        ax.set_xticks(range(1, 1 + max(len(r["acceptance_per_position"]) for r in rows)))
        ax.set(xlabel="drafted position", ylabel="P(accepted)", ylim=(0, 1.05),
               title=f"{Path(dataset).name}: acceptance per position (concurrency {min(report['concurrency'])})")
        ax.legend(fontsize=8)
        path = out / f"acceptance_{Path(dataset).stem}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    settings, labels = list(report["settings"]), list(report["drafts"])
    groups = [(d, c) for d in report["datasets"] for c in report["concurrency"]]
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 4), squeeze=False)
    width = 0.8 / max(1, len(labels))
    for ax, setting in zip(axes[0], settings):
        for i, label in enumerate(labels):
            values = []
            for dataset, conc in groups:
                match = [r for r in results if (r["dataset"], r["setting"], r["concurrency"], r["draft"]) == (dataset, setting, conc, label)]
                values.append((match[0]["speedup"] or 0.0) if match else 0.0)
            ax.bar([g + i * width for g in range(len(groups))], values, width, label=label)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks([g + width * (len(labels) - 1) / 2 for g in range(len(groups))])
        ax.set_xticklabels([f"{Path(d).stem}\nc={c}" for d, c in groups], fontsize=8)
        ax.set(ylabel="speedup over the target alone", title=setting)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "speedup.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return written + [path]


def write(evaluation) -> dict:
    """eval.md, the plots, then eval.json (which lists them); prints the table; returns the report."""
    report = build(evaluation)
    out = evaluation.out
    table = markdown(report)
    (out / "eval.md").write_text(table)
    report["plots"] = [str(p) for p in plots(report, out)]
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    print(table)
    return report
