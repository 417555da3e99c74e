"""Judging a run: was greedy output unchanged by the draft, and did the draft do any work?

Pure functions over completions and counters, so they are tested without a server.
A mismatch is always reported (prompt, first differing position, the two tokens), and
said to be a near-tie when the target's own log-probabilities put the two tokens within
NEAR_TIE_GAP: different kernels (verification runs prefill kernels) can flip such a tie.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from blockdraft.serve.client import Completion, SpecMetrics

NEAR_TIE_GAP = 0.05  # nats between the two tokens' log-probabilities


@dataclass
class Mismatch:
    prompt_index: int
    source: str
    position: int  # first differing generated token, 0-based
    baseline_token: Optional[int]  # None: that run had already stopped
    draft_token: Optional[int]
    near_tie: str  # "yes" | "no" | "unknown" (no log-probabilities to tell)
    logprob_gap: Optional[float] = None
    round: int = 1  # which round's draft run differs

    def describe(self) -> str:
        gap = f", gap {self.logprob_gap:.4f} nats" if self.logprob_gap is not None else ""
        where = f" in round {self.round}" if self.round > 1 else ""
        return (
            f"prompt {self.prompt_index} ({self.source}){where}: first difference at generated token {self.position}: "
            f"baseline {self.baseline_token} vs draft {self.draft_token}; near-tie: {self.near_tie}{gap}"
        )


@dataclass
class Acceptance:
    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    mean_acceptance_length: Optional[float]  # 1 + accepted / drafts; None without drafts
    acceptance_per_position: List[float]  # P(slot i accepted) per draft step
    cumulative_acceptance_length: List[float]  # expected length when drafting up to slot i


@dataclass
class Verdict:
    lossless: bool
    draft_active: bool
    mismatches: List[Mismatch]
    acceptance: Acceptance
    failures: List[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


# --- output equality ------------------------------------------------------------------
def compare_outputs(
    baseline: Sequence[Completion], draft: Sequence[Completion], sources: Sequence[str], gap: float = NEAR_TIE_GAP
) -> List[Mismatch]:
    """One Mismatch per prompt whose token ids differ, at the first differing position."""
    mismatches = []
    for base, spec, source in zip(baseline, draft, sources):
        position = first_difference(base.token_ids, spec.token_ids)
        if position is not None:
            tie, tie_gap = near_tie(base, spec, position, gap)
            ours, theirs = _at(base.token_ids, position), _at(spec.token_ids, position)
            mismatches.append(Mismatch(base.prompt_index, source, position, ours, theirs, tie, tie_gap))
    return mismatches


def first_difference(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _at(tokens: Sequence[int], i: int) -> Optional[int]:
    return tokens[i] if i < len(tokens) else None


def near_tie(base: Completion, spec: Completion, position: int, gap: float = NEAR_TIE_GAP) -> tuple[str, Optional[float]]:
    """("yes"|"no"|"unknown", the log-prob gap between the two tokens when known)."""
    a, b = _at(base.token_ids, position), _at(spec.token_ids, position)
    tables = [t[position] for t in (base.top_logprobs, spec.top_logprobs) if position < len(t) and t[position]]
    if a is None or b is None or not tables:
        return "unknown", None
    for table in tables:
        if a in table and b in table:
            diff = abs(table[a] - table[b])
            return ("yes" if diff <= gap else "no"), diff
    # The other token is below every listed candidate: the gap is at least the listed spread.
    spread = min(max(t.values()) - min(t.values()) for t in tables)
    return ("no", None) if spread > gap else ("unknown", None)


# --- acceptance -----------------------------------------------------------------------
def acceptance(metrics: SpecMetrics) -> Acceptance:
    drafts = metrics.num_drafts
    rates = [a / drafts for a in metrics.accepted_per_position] if drafts else [0.0] * len(metrics.accepted_per_position)
    cumulative, total = [], 1.0
    for rate in rates:
        total += rate
        cumulative.append(total)
    mean = 1.0 + metrics.num_accepted_tokens / drafts if drafts else None
    return Acceptance(drafts, metrics.num_draft_tokens, metrics.num_accepted_tokens, mean, rates, cumulative)


# --- the verdict ----------------------------------------------------------------------
def judge(
    mismatches: List[Mismatch],
    metrics: SpecMetrics,
    min_acceptance_length: Optional[float] = None,
    allow_near_ties: bool = False,
    extra_failures: Sequence[str] = (),
) -> Verdict:
    accept = acceptance(metrics)
    lossless = not mismatches
    active = accept.num_drafts > 0 and accept.num_accepted_tokens > 0
    failures = list(extra_failures)
    if not lossless and not (allow_near_ties and all(m.near_tie == "yes" for m in mismatches)):
        first = mismatches[0].describe()
        failures.append(f"not lossless: {len(mismatches)} prompt(s) differ from the baseline; first: {first}")
    if accept.num_drafts <= 0:
        failures.append("draft not active: no drafts were proposed, so the draft was never used")
    elif accept.num_accepted_tokens <= 0:
        failures.append(f"draft not active: {accept.num_drafts:g} drafts proposed but not one token accepted")
    if min_acceptance_length is not None and (accept.mean_acceptance_length or 0.0) < min_acceptance_length:
        failures.append(
            f"mean acceptance length {accept.mean_acceptance_length or 0.0:.3f} is below "
            f"min_acceptance_length={min_acceptance_length:g}"
        )
    return Verdict(lossless, active, mismatches, accept, failures)


def tokens_per_second(completions: Sequence[Completion]) -> Optional[float]:
    seconds = sum(c.seconds for c in completions)
    return sum(len(c.token_ids) for c in completions) / seconds if seconds > 0 else None

