"""Regenerate assistant turns with the target itself, so the draft learns what serving will see.

Writes JSONL rows `{"messages": [... prompt ..., {"role": "assistant", ...}], "generation": {...}}`.
An interrupted run resumes: rows already written (by prompt index) are not generated again.
This is the transformers backend (batch of one per call, greedy by default).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Sequence

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
