"""What a smoke-serve run found: report.json, a printed table, and acceptance.png.

The harness fills a `RunRecord` round by round, phase by phase; `build_report` turns
whatever is there into the report, so a run stopped half-way still writes one, marked
`incomplete`. Decode speed on a shared or throttled machine drifts between runs, so the
speedup is the median of the rounds' ratios, with their spread and each round kept.
"""

from __future__ import annotations

import datetime as _dt
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, TextIO, Tuple

from blockdraft.durable import write_json
from blockdraft.build_info import build_info
from blockdraft.machine import describe
from blockdraft.serve import paired_interval
from blockdraft.serve.client import Completion, SpecMetrics
from blockdraft.serve.paired_interval import PromptPair
from blockdraft.serve.verdict import compare_outputs, judge, tokens_per_second

REPORT_NAME = "report.json"
PLOT_NAME = "acceptance.png"


PHASES = ("baseline", "draft")


@dataclass
class Round:
    """One baseline run and one draft run of every prompt, in `order` (a kept pair's round: the first half of
    the prompts in `order`, the second half in the reverse)."""

    order: Tuple[str, ...] = PHASES
    baseline: Optional[List[Completion]] = None
    draft: Optional[List[Completion]] = None
    metrics: Optional[SpecMetrics] = None  # the draft run's counters
    prompt_drafts: Optional[List[float]] = None  # drafting rounds per prompt, where read prompt by prompt
    halves: bool = False  # a kept pair's round: two halves of the prompts, the order reversed for the second

    def pairs(self) -> List[PromptPair]:
        """Each prompt's baseline and draft timings side by side (the draft's rounds where known)."""
        if not (self.baseline and self.draft):
            return []
        drafts = self.prompt_drafts or [None] * len(self.draft)
        return [PromptPair(len(b.token_ids), b.seconds, len(d.token_ids), d.seconds, n)
                for b, d, n in zip(self.baseline, self.draft, drafts)]

    @property
    def complete(self) -> bool:
        return self.baseline is not None and self.draft is not None and self.metrics is not None

    def throughput(self) -> dict:
        base = tokens_per_second(self.baseline) if self.baseline else None
        spec = tokens_per_second(self.draft) if self.draft else None
        return {"order": list(self.order), "tokens_per_s_baseline": base, "tokens_per_s_draft": spec,
                "speedup": spec / base if base and spec else None, "round_cost": self.round_cost()}

    def round_cost(self) -> Optional[float]:
        """A draft-and-verify round's seconds over a plain decode step's: the draft run's seconds per
        drafting round over the baseline's seconds per token (each request's prefill in both). The
        speedup is about the tokens a round yields (the acceptance length) over this."""
        if not (self.baseline and self.draft and self.metrics and self.metrics.num_drafts):
            return None
        base_tokens = sum(len(c.token_ids) for c in self.baseline)
        base_s, draft_s = sum(c.seconds for c in self.baseline), sum(c.seconds for c in self.draft)
        if not base_tokens or base_s <= 0:
            return None
        return (draft_s / self.metrics.num_drafts) / (base_s / base_tokens)


@dataclass
class RunRecord:
    engine: str = "vllm"  # "vllm" | "reference"
    settings: Dict[str, object] = field(default_factory=dict)  # draft, target, prompts, max_tokens, ...
    sources: List[str] = field(default_factory=list)  # per prompt sent, where it came from
    prompts_too_long: List[str] = field(default_factory=list)
    rounds: List[Round] = field(default_factory=list)
    planned_rounds: int = 1
    timings_s: Dict[str, float] = field(default_factory=dict)
    idle_cpu_s: Dict[str, float] = field(default_factory=dict)  # the idle server's CPU seconds per measured phase
    quiet_wait_s: Dict[str, float] = field(default_factory=dict)  # waits for the idle server to go quiet, per phase
    environment: Dict[str, object] = field(default_factory=dict)  # vllm_version, device, runner
    warnings: List[str] = field(default_factory=list)
    extra_failures: List[str] = field(default_factory=list)
    error: Optional[str] = None
    held_out: Optional[dict] = None  # the prompts against the draft's training prompts (held_out_check.HeldOut)

    @property
    def complete(self) -> bool:
        return len(self.rounds) == self.planned_rounds and all(r.complete for r in self.rounds)


def build_report(record: RunRecord, min_acceptance_length: Optional[float] = None, allow_near_ties: bool = False) -> dict:
    report = {
        "engine": record.engine,
        "incomplete": not record.complete or record.error is not None,
        "error": record.error,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **build_info(),
        **record.environment,
        **record.settings,
        "prompts_sent": len(record.sources),
        "prompts_skipped_too_long": record.prompts_too_long,
        "timings_s": record.timings_s,
        "idle_server_cpu_s": record.idle_cpu_s,
        "idle_server_quiet_wait_s": record.quiet_wait_s,
        "warnings": list(record.warnings),
        "held_out": record.held_out,
    }
    if record.held_out and not record.held_out["recorded"]:
        report["warnings"].append(record.held_out["line"])
    report.update(_throughput(record))
    suspect = round_cost_suspect(report, record.settings.get("servers"))
    if suspect:
        report["round_cost_suspect"] = True
        report["warnings"].append(suspect)
    if record.complete and not record.error:  # a run stopped by an error passes nothing, whatever it finished
        report.update(_verdict(record, min_acceptance_length, allow_near_ties))
        report["pays"] = payoff(report["mean_acceptance_length"], report["round_cost"], report["speedup"])
    else:
        why = record.error or "the run stopped before every run finished"
        report.update(lossless=None, draft_active=None, mean_acceptance_length=None, passed=False)
        report["acceptance_per_position"] = []
        report["failures"] = [*record.extra_failures, f"incomplete: {(why.splitlines() or [why])[0]}"]
    return report


def payoff(acceptance: Optional[float], round_cost: Optional[float], speedup: Optional[float]) -> Optional[dict]:
    """Did the draft pay on this machine, and if not, by how much it missed. A round yields `acceptance`
    tokens at `round_cost` plain decode steps, so the speedup is about their ratio: the draft pays where
    its mean acceptance length exceeds this machine's round cost."""
    if acceptance is None or round_cost is None or speedup is None:
        return None
    paid = speedup > 1.0
    if paid:
        line = (f"the draft pays here: {speedup:.2f}x, a mean acceptance length of {acceptance:.2f} over a round cost "
                f"of {round_cost:.2f} plain decode steps")
    else:
        line = (f"the draft does not pay here ({speedup:.2f}x): a round costs {round_cost:.2f} plain decode steps and "
                f"yields {acceptance:.2f} tokens; it pays with a mean acceptance length above {round_cost:.2f} "
                f"(+{round_cost - acceptance:.2f}) or on a machine whose round costs less than {acceptance:.2f} steps")
    return {"paid": paid, "acceptance_needed": round_cost, "acceptance": acceptance, "round_cost": round_cost,
            "line": line}


def _median(values: List[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def round_cost_suspect(report: dict, method: Optional[str]) -> Optional[str]:
    """A warning where the round cost is below 1.0 beyond what this run's own measurement allows: a draft-and-
    verify round (a target step over several tokens plus the draft) cannot cost less than one plain decode
    step. Inside the spread, a figure under 1.0 is the spread's doing and is no warning. The advice is one
    this run has not taken."""
    cost = report.get("round_cost")
    if cost is None or cost >= 1.0:
        return None
    interval = report.get("round_cost_interval")
    spread = [r["round_cost"] for r in report.get("rounds") or [] if r.get("round_cost") is not None]
    highest = interval[1] if interval else max(spread) if len(spread) > 1 else cost
    if highest >= 1.0:
        return None
    where = (f"its {paired_interval.LEVEL:.0%} interval over prompts reaches only {highest:.2f}" if interval
             else f"every round measured below 1.0 (at most {highest:.2f})")
    advice = ("measure again with servers=fresh (a new pair of servers per round)" if method in ("kept", "frozen")
              else "measure again on an idle machine (nothing else on its cores) with more prompts (num_prompts=)")
    return (f"round cost {cost:.2f} < 1.0 and {where}: a draft-and-verify round cannot cost less than one plain "
            f"decode step, so some phase was measured slow; distrust this speedup and {advice}")


def _throughput(record: RunRecord) -> dict:
    """Per round tokens/s and ratio; the report's figures are the medians over the rounds, with a paired
    interval over every prompt of every round."""
    rounds = [r.throughput() for r in record.rounds]
    ratios = [r["speedup"] for r in rounds if r["speedup"] is not None]
    pairs = [pair for r in record.rounds for pair in r.pairs()]
    return {
        "speedup_interval": paired_interval.interval(pairs, paired_interval.speedup),
        "round_cost_interval": paired_interval.interval(pairs, paired_interval.round_cost)
        if pairs and all(p.drafts is not None for p in pairs) else None,
        "interval": {"level": paired_interval.LEVEL, "pairs": len(pairs), "method": "paired bootstrap over prompts",
                     "halves_in_reversed_order": all(r.halves for r in record.rounds)} if pairs else None,
        "tokens_per_s_baseline": _median([r["tokens_per_s_baseline"] for r in rounds]),
        "tokens_per_s_draft": _median([r["tokens_per_s_draft"] for r in rounds]),
        "speedup": _median(ratios),
        "speedup_spread": [min(ratios), max(ratios)] if ratios else None,
        "round_cost": _median([r["round_cost"] for r in rounds]),
        "rounds": rounds,
        "tokens_generated": {
            phase: sum(len(c.token_ids) for r in record.rounds for c in getattr(r, phase) or []) for phase in PHASES
        },
    }


def _verdict(record: RunRecord, min_acceptance_length: Optional[float], allow_near_ties: bool) -> dict:
    """Every round's draft output against the first baseline's; the counters of all draft runs summed."""
    reference = record.rounds[0].baseline
    mismatches, failures = [], list(record.extra_failures)
    for number, round_ in enumerate(record.rounds, start=1):
        if number > 1:
            drift = compare_outputs(reference, round_.baseline, record.sources)
            if drift:
                failures.append(f"the baseline itself is not reproducible: round {number}'s baseline differs from "
                                f"round 1's ({drift[0].describe()}), so no draft run can be judged against it")
        for m in compare_outputs(reference, round_.draft, record.sources):
            m.round = number
            mismatches.append(m)
    metrics = SpecMetrics()
    for round_ in record.rounds:
        metrics = metrics.plus(round_.metrics)
    verdict = judge(mismatches, metrics, min_acceptance_length, allow_near_ties, failures)
    accept = verdict.acceptance
    return {
        "passed": verdict.passed,
        "failures": verdict.failures,
        "lossless": verdict.lossless,
        "draft_active": verdict.draft_active,
        "mean_acceptance_length": accept.mean_acceptance_length,
        "acceptance_per_position": accept.acceptance_per_position,
        "cumulative_acceptance_length": accept.cumulative_acceptance_length,
        "spec_decode": {
            "num_drafts": accept.num_drafts,
            "num_draft_tokens": accept.num_draft_tokens,
            "num_accepted_tokens": accept.num_accepted_tokens,
        },
        "mismatches": [asdict(m) for m in mismatches],
        "per_prompt": _per_prompt(record, {m.prompt_index for m in mismatches}),
    }


def _per_prompt(record: RunRecord, differing: set) -> List[dict]:
    """Tokens and seconds per prompt (round 1's runs): where the time went, and which prompts differ."""
    first = record.rounds[0]
    return [
        {
            "index": base.prompt_index,
            "source": source,
            "identical": base.prompt_index not in differing,
            "tokens": [len(base.token_ids), len(spec.token_ids)],
            "seconds": [round(base.seconds, 4), round(spec.seconds, 4)],
        }
        for base, spec, source in zip(first.baseline, first.draft, record.sources)
    ]


def write_report(report: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_NAME
    write_json(path, report)  # whole or not at all: a pipeline caches it as the serve stage's result
    if report.get("acceptance_per_position"):
        plot_acceptance(report["acceptance_per_position"], report["cumulative_acceptance_length"], out / PLOT_NAME)
    return path


def plot_acceptance(per_position: List[float], cumulative: List[float], path: Path) -> None:
    """Left: P(slot i accepted) per step. Right: expected tokens per step when drafting up to slot i."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    slots = list(range(1, len(per_position) + 1))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(slots, per_position, color="tab:blue")
    left.set(xlabel="drafted slot", ylabel="acceptance rate", title="Acceptance per position", ylim=(0, 1))
    right.plot([0, *slots], [1.0, *cumulative], marker="o", color="tab:green")
    right.set(xlabel="slots drafted", ylabel="expected tokens per step", title="Cumulative acceptance length")
    for axis in (left, right):
        axis.set_xticks([0, *slots] if axis is right else slots)
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _calibration_line(rows: List[dict]) -> str:
    """Per drafted slot: the confidence head's mean prediction against the share of the rounds that
    reached the slot and accepted it."""
    return "; ".join(f"slot {r['position']}: predicted {r['mean_confidence']:.2f}, accepted {r['acceptance_rate']:.2f} "
                     f"of {r['reached']}" for r in rows if r["reached"])


def print_table(report: dict, stream: Optional[TextIO] = None) -> None:
    stream = stream or sys.stdout  # looked up per call, so a redirected stdout is honoured
    headline = (report.get("held_out") or {}).get("headline")
    if headline:
        print(f"  {headline}", file=stream)
    rows = [
        ("engine", _engine_line(report)),
        ("held out", _held_out_line(report.get("held_out"))),
        ("result", "PASS" if report.get("passed") else "FAIL"),
        ("lossless", _fmt(report.get("lossless"))),
        ("draft active", _fmt(report.get("draft_active"))),
        ("mean acceptance length", _fmt(report.get("mean_acceptance_length"))),
        ("acceptance per position", " ".join(f"{r:.2f}" for r in report.get("acceptance_per_position") or []) or "-"),
        *((("confidence calibration", _calibration_line(report["confidence_calibration"])),)
          if report.get("confidence_calibration") else ()),
        ("tokens/s baseline", _fmt(report.get("tokens_per_s_baseline"))),
        ("tokens/s draft", _fmt(report.get("tokens_per_s_draft"))),
        ("speedup", _speedup_line(report)),
        ("round cost", _round_cost_line(report)),
        ("pays?", (report.get("pays") or {}).get("line", "-")),
        ("servers", _servers_line(report)),
        *((f"time {k}", f"{v:.1f} s") for k, v in report.get("timings_s", {}).items()),
        ("prompts sent", str(report.get("prompts_sent"))),
        ("vLLM", f"{report.get('vllm_version')} on {report.get('device')}"),
        ("machine", describe(report["machine"]) if report.get("machine") else "-"),
        *(("vLLM OpenMP binding", f"{phase}: {line}") for phase, line in (report.get("vllm_omp_binding") or {}).items()),
        ("date", str(report.get("date"))),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}", file=stream)
    for line in report.get("warnings", []):
        print(f"  warning: {line}", file=stream)
    for line in report.get("failures", []):
        print(f"  FAILED: {line}", file=stream)
    for mismatch in report.get("mismatches", [])[:10]:
        print(f"  mismatch: prompt {mismatch['prompt_index']} at token {mismatch['position']} "
              f"({mismatch['baseline_token']} vs {mismatch['draft_token']}, near-tie {mismatch['near_tie']})", file=stream)


def _held_out_line(held: Optional[dict]) -> str:
    """Whether the prompts were held out from the draft's training, as its record says."""
    if not held:
        return "-"
    if not held["recorded"]:
        return "unknown: the draft carries no record of its training prompts"
    if held["trained_on"]:
        return f"NO: {held['trained_on']} of {held['prompts']} prompts trained on (allow_training_prompts=true)"
    return "yes: " + held["line"]


def _servers_line(report: dict) -> str:
    method = report.get("servers")
    if not method:
        return "-"
    idle = report.get("idle_server_cpu_s") or {}
    cpu = f"; idle server's CPU during measured phases: {sum(idle.values()):.2f} s in all" if idle else ""
    return f"{method}, {report.get('warmup_prompts')} warm-up prompt(s) per server{cpu}"


def _speedup_line(report: dict) -> str:
    rounds, spread = report.get("rounds") or [], report.get("speedup_spread")
    if report.get("speedup") is None:
        return "-"
    parts = []
    if len(rounds) >= 2 and spread:
        parts.append(f"median of {len(rounds)} rounds, {spread[0]:.3f} to {spread[1]:.3f}")
    parts += _interval_words(report, "speedup_interval", "{:.3f}")
    return f"{report['speedup']:.3f}" + (f" ({'; '.join(parts)})" if parts else "")


def _round_cost_line(report: dict) -> str:
    if not report.get("round_cost"):
        return "-"
    words = _interval_words(report, "round_cost_interval", "{:.2f}")
    return (f"{report['round_cost']:.2f} plain decode steps per draft-and-verify round"
            + (f" ({words[0]})" if words else "") + (" (below 1.0: distrust)" if report.get("round_cost_suspect") else ""))


def _interval_words(report: dict, key: str, number: str) -> List[str]:
    """'95% interval 1.38 to 1.46 over 16 paired prompts', or nothing where the run gave no interval."""
    bounds, about = report.get(key), report.get("interval") or {}
    if not bounds:
        return []
    low, high = (number.format(b) for b in bounds)
    return [f"{about['level']:.0%} interval {low} to {high} over {about['pairs']} paired prompts"]


def _engine_line(report: dict) -> str:
    if report.get("engine") == "reference":
        return "REFERENCE engine (blockdraft.engine), not vLLM"
    runner = report.get("runner")
    return f"vLLM ({runner} model runner)" if runner else "vLLM"


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
