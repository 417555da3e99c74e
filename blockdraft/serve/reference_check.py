"""The same check with the project's own engine, where the serving vLLM cannot run the draft.

vLLM runs DFlash2 only on its V2 model runner, which needs Triton with a GPU backend; on
a CPU machine it refuses the draft. Then the exported DFlash2 draft is checked here:
greedy `SpeculativeEngine.generate` against `target_generate` on the same token ids,
with the same report. This proves the export and the draft, not vLLM's serving of it.
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence

from blockdraft.engine.decoder import DecodeStats, SpeculativeEngine
from blockdraft.engine.sampling import SamplingParams
from blockdraft.models.target import TargetModel
from blockdraft.serve.client import Completion, SpecMetrics
from blockdraft.serve.preflight import Plan
from blockdraft.serve.prompts import EncodedPrompt
from blockdraft.serve.report import Round, RunRecord

# The reference engine builds its tensors on the CPU and runs batch size 1: it is a
# correctness check, and its tokens/s say nothing about vLLM's.
DEVICE = "cpu"


def load_engine(plan: Plan, ignore_eos: bool) -> SpeculativeEngine:
    from blockdraft.draft_format.importer import import_draft

    draft, draft_config = import_draft(plan.draft.directory)
    target = TargetModel.load(str(plan.target.directory), draft_config.target_layer_ids, device=DEVICE)
    eos = () if ignore_eos else eos_token_ids(target)
    return SpeculativeEngine(target, draft, plan.num_speculative_tokens, eos_token_ids=eos)


def eos_token_ids(target: TargetModel) -> List[int]:
    """The ids that end generation, as vLLM reads them: generation_config first, then config."""
    ids: List[int] = []
    for source in (getattr(target.model, "generation_config", None), target.model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        ids += [value] if isinstance(value, int) else list(value or [])
    return sorted(set(ids))


def run_reference(
    plan: Plan, prompts: Sequence[EncodedPrompt], max_tokens: int, ignore_eos: bool, record: RunRecord
) -> None:
    """Fill `record` with both runs and the draft's counters; phase by phase, so a stop keeps what ran."""
    began = time.perf_counter()
    engine = load_engine(plan, ignore_eos)
    record.timings_s["load_reference"] = time.perf_counter() - began
    round_ = Round()
    record.rounds.append(round_)
    round_.baseline = decode_all(engine.target_generate, prompts, max_tokens)
    record.timings_s["generation_baseline"] = sum(c.seconds for c in round_.baseline)
    stats = DecodeStats(engine.k)
    round_.draft = decode_all(engine.generate, prompts, max_tokens, stats)
    record.timings_s["generation_draft"] = sum(c.seconds for c in round_.draft)
    round_.metrics = spec_metrics(stats, engine.k)
    calibration = stats.calibration()
    if calibration:  # a DSpark draft's confidence head: what it predicted per slot, and what happened
        record.environment["confidence_calibration"] = [
            {"position": c.position, "reached": c.reached, "accepted": c.accepted,
             "mean_confidence": c.mean_confidence, "acceptance_rate": c.acceptance_rate} for c in calibration]


def decode_all(
    decode, prompts: Sequence[EncodedPrompt], max_tokens: int, stats: Optional[DecodeStats] = None,
    params: SamplingParams = SamplingParams(), seed: int = 0,
) -> List[Completion]:
    """Each prompt decoded alone, timed; prompt i drawn with seed + i (greedy ignores it). A draft's
    per-step acceptances are added to `stats`."""
    out: List[Completion] = []
    for prompt in prompts:
        began = time.perf_counter()
        result = decode(prompt.token_ids, max_tokens, params, seed + prompt.index)
        out.append(Completion(prompt.index, list(result.tokens), time.perf_counter() - began, None))
        if stats is not None and result.stats is not None:
            stats.add(result.stats)
    return out


def spec_metrics(stats: DecodeStats, k: int) -> SpecMetrics:
    """The engine's counters in vLLM's terms."""
    return SpecMetrics(
        num_drafts=float(stats.num_drafts),
        num_draft_tokens=float(stats.num_drafts * k),
        num_accepted_tokens=float(stats.num_accepted),
        accepted_per_position=[float(n) for n in stats.accepted_per_position()],
    )
