"""Answer every prompt not yet written, several conversations at a time, writing rows as they finish."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from tqdm import tqdm

from blockdraft.regen.shards import ShardedRows
from blockdraft.regen.turns import Reply, regen_row, rollout, turn_inputs


@dataclass
class RegenStats:
    rows: int = 0
    replies: int = 0
    tokens: int = 0
    cut_at_max_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def regenerate_rows(
    prompts: Sequence[Sequence[dict]], store: ShardedRows, reply, settings: dict, max_turns: int = 1,
    workers: int = 1, desc: str = "regenerate", progress: bool = True,
) -> RegenStats:
    """Answer every prompt not yet in `store`, `workers` conversations at a time; rows are
    written as they finish. `reply(messages) -> Reply | None` is the backend."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    done = store.done()
    todo = [i for i in range(len(prompts)) if i not in done]
    stats, began = RegenStats(), time.perf_counter()
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc=desc, disable=not progress, unit="row")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(rollout, turn_inputs(prompts[i], max_turns), reply): i for i in todo}
        for future in as_completed(futures):
            conversation, replies = future.result()  # a failed request stops the run; rows so far stay
            if replies:
                store.append(regen_row(conversation, settings, futures[future], replies))
            _count(stats, replies, time.perf_counter() - began)
            bar.update(1)
            bar.set_postfix(tok_s=f"{stats.tokens_per_s:.0f}")
    bar.close()
    return stats


def _count(stats: RegenStats, replies: Sequence[Reply], seconds: float) -> None:
    stats.rows += 1 if replies else 0
    stats.replies += len(replies)
    stats.tokens += sum(r.tokens for r in replies)
    stats.cut_at_max_tokens += sum(r.finish_reason == "length" for r in replies)
    stats.seconds = seconds
