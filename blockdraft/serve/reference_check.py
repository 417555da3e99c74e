"""The same check with the project's own engine, where the serving vLLM cannot run the draft.

vLLM runs DFlash2 only on its V2 model runner, which needs Triton with a GPU backend; on
a CPU machine it refuses the draft. Then the exported DFlash2 draft is checked here:
greedy `SpeculativeEngine.generate` against `target_generate` on the same token ids,
with the same report. This proves the export and the draft, not vLLM's serving of it.
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence

from blockdraft.models.target import TargetModel
from blockdraft.serve.client import Completion, SpecMetrics
from blockdraft.serve.engine import DecodeStats, SpeculativeEngine
from blockdraft.serve.preflight import Plan
from blockdraft.serve.prompts import EncodedPrompt
from blockdraft.serve.report import Round, RunRecord

# The reference engine builds its tensors on the CPU and runs batch size 1: it is a
# correctness check, and its tokens/s say nothing about vLLM's.
DEVICE = "cpu"


def load_engine(plan: Plan, ignore_eos: bool) -> SpeculativeEngine:
    from blockdraft.export.importer import import_draft

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
    round_.baseline = _generate(engine.target_generate, prompts, max_tokens, record, "generation_baseline")
    stats = DecodeStats(engine.k)
    round_.draft = _generate(engine.generate, prompts, max_tokens, record, "generation_draft", stats)
    round_.metrics = SpecMetrics(
        num_drafts=float(stats.num_drafts),
        num_draft_tokens=float(stats.num_drafts * engine.k),
        num_accepted_tokens=float(stats.num_accepted),
        accepted_per_position=[float(n) for n in stats.accepted_per_position()],
    )


def _generate(
    decode, prompts, max_tokens: int, record: RunRecord, phase: str, stats: Optional[DecodeStats] = None
) -> List[Completion]:
    out: List[Completion] = []
    for prompt in prompts:
        began = time.perf_counter()
        result = decode(prompt.token_ids, max_tokens)
        out.append(Completion(prompt.index, list(result.tokens), time.perf_counter() - began, None))
        if stats is not None and result.stats is not None:
            stats.accepted_per_step += result.stats.accepted_per_step
    record.timings_s[phase] = sum(c.seconds for c in out)
    return out
