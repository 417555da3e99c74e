"""The transformers backend: `generate` one turn at a time with the target loaded in this process (no batching;
slow, but it needs no serving environment), and the older whole-file regeneration the tiny recipes use."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional, Sequence

import torch
from tqdm import tqdm

from blockdraft.regen.shards import done_indices
from blockdraft.regen.turns import Reply


@torch.no_grad()
def regenerate_with_transformers(
    model, tokenizer, prompts: Sequence[List[dict]], out_path, max_new_tokens: int,
    temperature: float = 0.0, chat_template_kwargs: dict | None = None, seed: int = 0, progress: bool = True,
) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = done_indices(out_path)
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
