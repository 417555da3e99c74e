"""Regenerate assistant turns with the target itself, so the draft learns what serving will see.

Writes JSONL rows `{"messages": [... prompt ..., {"role": "assistant", ...}], "generation": {...}}`.
An interrupted run resumes: rows already written (by prompt index) are not generated again.
This is the transformers backend (batch of one per call, greedy by default); below it are
the pieces both backends share (turns, rollouts, shard files, resume), and `regen_vllm`
is the batched vLLM backend.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import torch
from tqdm import tqdm


def _done_indices(path: Path) -> set:
    done = set()
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            done.add(json.loads(line)["generation"]["index"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a torn last line from a kill: regenerate that row
    return done


@torch.no_grad()
def regenerate_with_transformers(
    model, tokenizer, prompts: Sequence[List[dict]], out_path, max_new_tokens: int,
    temperature: float = 0.0, chat_template_kwargs: dict | None = None, seed: int = 0, progress: bool = True,
) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = _done_indices(out_path)
    kwargs = dict(chat_template_kwargs or {})
    settings = {"backend": "transformers", "max_new_tokens": max_new_tokens, "temperature": temperature, "chat_template_kwargs": kwargs}
    todo = [i for i in range(len(prompts)) if i not in done]
    bar = tqdm(todo, desc=f"regenerate {out_path.name}", disable=not progress)
    tokens, start = 0, time.perf_counter()
    with open(out_path, "a") as fh:
        for i in bar:
            ids = tokenizer.apply_chat_template(prompts[i], add_generation_prompt=True, return_tensors="pt", return_dict=True, **kwargs)["input_ids"]
            torch.manual_seed(seed + i)
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id,
            )[0, ids.shape[1]:]
            text = tokenizer.decode(gen, skip_special_tokens=True)
            row = {"messages": [*prompts[i], {"role": "assistant", "content": text}], "generation": {**settings, "index": i}}
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            tokens += len(gen)
            bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
    return out_path


# --- shared by both backends: turns to answer, rollouts, shard files, resume ---------------
# The regeneration app (`blockdraft.data.regen_app`) drives these; the transformers backend
# above stays as the tiny recipes use it.


@dataclass
class Reply:
    """One generated assistant turn."""

    text: str
    tokens: int
    finish_reason: str  # "stop" (the target ended its turn) | "length" (cut at max_tokens)


def turn_inputs(messages: Sequence[dict], max_turns: int) -> List[List[dict]]:
    """What the target answers, turn by turn: the non-assistant messages before each original
    assistant turn (the first one with any leading system message), at most `max_turns` of
    them. The original assistant turns are dropped: the target writes its own. A turn with no
    user question (a conversation opening with the assistant, two replies in a row) ends it."""
    segments: List[List[dict]] = [[]]
    for message in messages:
        if message["role"] == "assistant":
            segments.append([])
            continue
        segments[-1].append({"role": message["role"], "content": message["content"]})
    answerable = []
    for segment in segments:
        if not any(m["role"] == "user" and m["content"].strip() for m in segment):
            break  # a turn without a question ends the conversation
        answerable.append(segment)
    return answerable[:max_turns]


def rollout(segments: Sequence[List[dict]], reply: Callable[[List[dict]], Optional[Reply]]) -> tuple[List[dict], List[Reply]]:
    """The conversation with every turn answered by `reply`, in order, each answer the context
    of the next. A reply cut at max_tokens, or `None` (the context no longer fits), ends it."""
    conversation: List[dict] = []
    replies: List[Reply] = []
    for segment in segments:
        answer = reply(conversation + list(segment))
        if answer is None:
            break
        conversation += [*segment, {"role": "assistant", "content": answer.text}]
        replies.append(answer)
        if answer.finish_reason == "length":
            break  # the target never ended this turn; a next turn would follow a cut reply
    return conversation, replies


def regen_row(conversation: List[dict], settings: dict, index: int, replies: Sequence[Reply]) -> dict:
    """The JSONL row both backends write: the chat, and how (and which prompt) it was generated."""
    finish = [r.finish_reason for r in replies]
    return {"messages": conversation, "generation": {**settings, "index": index, "finish_reasons": finish}}


class ShardedRows:
    """Rows of one split as `<dir>/NNNNN.jsonl` shards of `shard_size` prompt indices each.

    Rows are appended as they finish (in any order) and flushed at once, so a kill loses at
    most the row being written; `done()` reads back which indices are finished, skipping a
    torn last line. `merge` writes all rows, sorted by index, to one JSONL file atomically.
    """

    def __init__(self, directory, shard_size: int):
        self.directory = Path(directory)
        self.shard_size = shard_size

    def shard_path(self, index: int) -> Path:
        return self.directory / f"{index // self.shard_size:05d}.jsonl"

    def shards(self) -> List[Path]:
        return sorted(self.directory.glob("*.jsonl")) if self.directory.is_dir() else []

    def done(self) -> set:
        finished = set()
        for shard in self.shards():
            finished |= _done_indices(shard)
        return finished

    def append(self, row: dict) -> None:
        path = self.shard_path(row["generation"]["index"])
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()

    def rows(self) -> List[dict]:
        by_index = {}
        for shard in self.shards():
            for line in shard.read_text().splitlines():
                try:
                    row = json.loads(line)
                    by_index[row["generation"]["index"]] = row
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn line: its prompt was answered again later
        return [by_index[i] for i in sorted(by_index)]

    def merge(self, out_path) -> int:
        """Write every row, ordered by prompt index, to `out_path` (tmp + rename); returns the count."""
        out_path = Path(out_path)
        rows = self.rows()
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(tmp, out_path)
        return len(rows)


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


def transformers_reply(model, tokenizer, max_tokens: int, max_prompt_tokens: int, temperature: float = 0.0,
                       chat_template_kwargs: dict | None = None, seed: int = 0):
    """The fallback backend: `generate` one turn at a time (no batching; slow but needs no vLLM)."""
    kwargs = dict(chat_template_kwargs or {})

    @torch.no_grad()
    def reply(messages: List[dict]) -> Optional[Reply]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True, **kwargs)["input_ids"]
        if ids.shape[1] > max_prompt_tokens:
            return None
        torch.manual_seed(seed + ids.shape[1])
        gen = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
            do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
            top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id,
        )[0, ids.shape[1]:]
        ended = bool(len(gen)) and int(gen[-1]) in eos_ids(model, tokenizer)
        text = tokenizer.decode(gen, skip_special_tokens=True)
        return Reply(text, len(gen), "stop" if ended or len(gen) < max_tokens else "length")

    return reply


def eos_ids(model, tokenizer) -> set:
    """The ids that end a reply: the generation config's, else the tokenizer's."""
    ids = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    return set(ids) if isinstance(ids, (list, tuple)) else {ids}


if __name__ == "__main__":
    # `python -m blockdraft.data.regen target=... out=...`: the regeneration app.
    from blockdraft.data.regen_app import main

    main()
