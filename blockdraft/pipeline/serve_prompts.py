"""Before the first stage: the serve stage's prompts are held out from the training ones.

Training's prompts are known before regen (its planned split) and are its rows once written (or the
rows a run is given). The serve stage's are regen's held-out rows by default, apart from the training
ones by construction, or what serve.prompts names: a set holding training prompts is refused here, in
one line, hours before the serve stage would refuse it against the export's record, unless
serve.allow_training_prompts=true.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import List

from blockdraft.data.prompt_record import PromptRecord, prompt_hash
from blockdraft.serve.config import BUILTIN_PROMPT_SETS
from blockdraft.serve.held_out_check import HeldOut, refuse_trained_on

FIX = ("serve.prompts= another file or set, or serve.prompts_skip= past them; by default the serve stage takes "
       "regen's held-out rows, which share no prompt with the training ones")


def check_serve_prompts(cfgs: dict) -> None:
    """`cfgs`: each stage app's composed config. Regen's own held-out rows (the serve stage's default) share no
    prompt with its training rows by construction (regen/prompt_plan.py): only another serve set is read."""
    serve, regen = cfgs["serve"], cfgs["regen"]
    given = Path(serve.prompts).expanduser()
    if serve.allow_training_prompts or given == Path(regen.out) / "heldout.jsonl":
        return
    if not (Path(serve.target_dir) / "config.json").is_file() or not (given.is_file() or serve.prompts in BUILTIN_PROMPT_SETS):
        return  # said by the stage that reads them
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(serve.target_dir)
    record = PromptRecord.of(training_hashes(cfgs, tokenizer))
    serving = serve_identities(serve, tokenizer)
    held = HeldOut("this run", len(serving), int(record.contains(serving).sum()), len(record))
    refuse_trained_on([(f"serve.prompts={serve.prompts}", held)], False, FIX, "serve.allow_training_prompts")


def training_hashes(cfgs: dict, tokenizer) -> List[int]:
    """The prompts of the training rows once they are on disk; before that, of the rows a run is given
    (`rows=`: every one, the held-out ones carved from them included), else of regen's planned split."""
    from blockdraft.data.rows import iter_rows, new_report

    rows, given = cfgs["train"].data.train, cfgs.get("given")
    source = rows if rows and Path(rows).expanduser().exists() else given.rows if given is not None else None
    if source is not None:
        return [prompt_hash(row.messages) for row in iter_rows(source, new_report(source))]
    from blockdraft.regen.prompt_plan import plan_splits

    with contextlib.redirect_stderr(io.StringIO()):  # its notes were said once, by the prompt supply check
        planned = plan_splits(cfgs["regen"], tokenizer)
    return [prompt_hash(c) for c in planned["train"].conversations]


def serve_identities(serve, tokenizer) -> List[int]:
    """The prompts the serve stage will send, read as it reads them."""
    from blockdraft.serve.prompts import encode_prompts, iter_prompts

    kept, _ = encode_prompts(iter_prompts(serve.prompts, serve.prompts_skip), tokenizer, serve.use_chat_template,
                             serve.max_model_len - serve.max_tokens, dict(serve.chat_template_kwargs), limit=serve.num_prompts)
    return [p.identity for p in kept]
