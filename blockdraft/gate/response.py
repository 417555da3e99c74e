"""The fidelity gate's one sample: a prompt, the target's own greedy reply to it, and that pair as
the training row and the serving prompt, token for token the same ids in both.

The reply is the target's (not a dataset's) so that a draft that has memorised it is right at
every position serving verifies: any acceptance lost is then lost to a mismatch between what
training computed and what serving computes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List

import torch

from blockdraft.data.tokenize import RowRejected, tokenize_row
from blockdraft.errors import ConfigError
from blockdraft.serve.prompts import encode_prompts, iter_prompts
from blockdraft.serve.verdict import first_difference

# A memorised prefix shorter than this says too little: a few blocks, each accepted or not by chance.
MIN_REPLY_TOKENS = 16
RESPONSE_NAME = "response.json"
DATA_NAME = "data.jsonl"
PROMPT_NAME = "prompt.jsonl"


@dataclass
class Sample:
    prompt: str
    prompt_ids: List[int]
    reply_ids: List[int]
    reply_text: str
    generated_tokens: int = 0
    """The reply's length as generated; reply_ids is its longest prefix that round-trips through the tokenizer."""

    def messages(self) -> list:
        return [{"role": "user", "content": self.prompt}, {"role": "assistant", "content": self.reply_text}]


def make_sample(prompt: str, target_dir: Path, max_tokens: int, out: Path) -> Sample:
    """Generate the target's greedy reply and write response.json, data.jsonl and prompt.jsonl in `out`."""
    from transformers import AutoTokenizer

    from blockdraft.regen.hf_backend import eos_ids
    from blockdraft.models.target import load_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    (out / PROMPT_NAME).write_text(json.dumps({"messages": [{"role": "user", "content": prompt}]}) + "\n")
    encoded, _ = encode_prompts(iter_prompts(str(out / PROMPT_NAME)), tokenizer, True, 10**9, limit=1)
    prompt_ids = encoded[0].token_ids
    model = load_causal_lm(str(target_dir), dtype=torch.float32).eval()
    reply_ids = greedy_reply(model, prompt_ids, max_tokens, eos_ids(model, tokenizer))
    sample = round_trip_prefix(prompt, prompt_ids, reply_ids, tokenizer)
    (out / DATA_NAME).write_text(json.dumps({"messages": sample.messages()}) + "\n")
    (out / RESPONSE_NAME).write_text(json.dumps(asdict(sample), indent=2) + "\n")
    return sample


def read_sample(out: Path) -> Sample:
    path = out / RESPONSE_NAME
    if not path.is_file():
        raise ConfigError(f"recheck=true needs {path}, written by an earlier gate run in out={out}; run the gate without recheck first.")
    return Sample(**json.loads(path.read_text()))


@torch.no_grad()
def greedy_reply(model, prompt_ids: List[int], max_tokens: int, eos: set) -> List[int]:
    ids = torch.tensor([prompt_ids])
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                               temperature=None, top_p=None, top_k=None, pad_token_id=min(eos))[0, len(prompt_ids):].tolist()
    end = next((i for i, tok in enumerate(generated) if tok in eos), None)
    return generated if end is None else generated[: end + 1]


def round_trip_prefix(prompt: str, prompt_ids: List[int], reply_ids: List[int], tokenizer) -> Sample:
    """The longest prefix of the reply whose training row tokenises to the prompt ids followed by that
    prefix's ids: a row that does not would teach the draft tokens serving never shows it (a mismatch of
    the sample, not of the draft). Decoded text can re-tokenise differently from where a reply goes
    on (a byte-level piece, a merge across words), so the prefix ends before the first difference."""
    def sample_of(n: int) -> Sample:
        ids = reply_ids[:n]
        return Sample(prompt, prompt_ids, ids, tokenizer.decode(ids, skip_special_tokens=True), len(reply_ids))

    def differs(sample: Sample):
        """None when the row round-trips, else (first differing reply position or None, why)."""
        row = tokenize_row(sample.messages(), tokenizer, seq_length=10**9)
        want = sample.prompt_ids + sample.reply_ids
        if isinstance(row, RowRejected):
            return None, row.detail
        at = first_difference(row.input_ids[: len(want)], want)
        return None if at is None else (at - len(prompt_ids), f"they differ from token {at}")

    full = sample_of(len(reply_ids))
    found = differs(full)
    if found is None:
        return full
    at, why = found
    n = len(reply_ids) - 1 if at is None else min(len(reply_ids) - 1, max(0, at))
    while n >= MIN_REPLY_TOKENS:
        if differs(sample_of(n)) is None:
            print(f"[gate] the reply does not round-trip through the tokenizer and chat template ({why}); its first "
                  f"{n} of {len(reply_ids)} tokens do: the gate trains and serves those", flush=True)
            return sample_of(n)
        n -= 1
    raise ConfigError(
        f"the target's reply to prompt={sample_of(0).prompt!r} does not round-trip through its tokenizer and chat "
        f"template ({why}), and no prefix of {MIN_REPLY_TOKENS} tokens or more does: too short to judge a draft by. "
        "Pick another prompt=."
    )
