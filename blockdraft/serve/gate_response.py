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

RESPONSE_NAME = "response.json"
DATA_NAME = "data.jsonl"
PROMPT_NAME = "prompt.jsonl"


@dataclass
class Sample:
    prompt: str
    prompt_ids: List[int]
    reply_ids: List[int]
    reply_text: str

    def messages(self) -> list:
        return [{"role": "user", "content": self.prompt}, {"role": "assistant", "content": self.reply_text}]


def make_sample(prompt: str, target_dir: Path, max_tokens: int, out: Path) -> Sample:
    """Generate the target's greedy reply and write response.json, data.jsonl and prompt.jsonl in `out`."""
    from transformers import AutoTokenizer

    from blockdraft.data.regen import eos_ids
    from blockdraft.models.target import load_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    (out / PROMPT_NAME).write_text(json.dumps({"messages": [{"role": "user", "content": prompt}]}) + "\n")
    encoded, _ = encode_prompts(iter_prompts(str(out / PROMPT_NAME)), tokenizer, True, 10**9, limit=1)
    prompt_ids = encoded[0].token_ids
    model = load_causal_lm(str(target_dir), dtype=torch.float32).eval()
    reply_ids = greedy_reply(model, prompt_ids, max_tokens, eos_ids(model, tokenizer))
    sample = Sample(prompt, prompt_ids, reply_ids, tokenizer.decode(reply_ids, skip_special_tokens=True))
    check_round_trip(sample, tokenizer)
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


def check_round_trip(sample: Sample, tokenizer) -> None:
    """The training row must tokenise to the prompt ids followed by the reply ids, or the draft
    memorises tokens serving never shows it (a mismatch of the sample, not of the draft)."""
    row = tokenize_row(sample.messages(), tokenizer, seq_length=10**9)
    want = sample.prompt_ids + sample.reply_ids
    got = [] if isinstance(row, RowRejected) else row.input_ids[: len(want)]
    if got != want:
        detail = row.detail if isinstance(row, RowRejected) else f"they differ from token {first_difference(got, want)}"
        raise ConfigError(
            f"the target's reply to prompt={sample.prompt!r} does not round-trip through its tokenizer and chat "
            f"template ({detail}), so it cannot be the gate's training row; pick another prompt= or fewer max_tokens=."
        )
