"""Before regen: the prompts hold both splits, and the recipe's rows hold what regen will write.

Both facts are known before the first reply is generated, so a run that would end with too few
held-out rows, or with rows training sets aside, is refused or told so here, not after the work.
"""

from __future__ import annotations

import sys
from pathlib import Path

from blockdraft.errors import ConfigError


def check_prompt_supply(regen, train) -> None:
    """`regen`: the regen stage's RegenConfig; `train`: the training app's composed config."""
    from transformers import AutoTokenizer

    from blockdraft.regen.prompt_plan import plan_splits

    out = Path(regen.out)
    if not (Path(regen.target_dir) / "config.json").is_file():
        return  # the regen stage refuses it by itself, in one line
    if (out / "train.jsonl").is_file() and (out / "heldout.jsonl").is_file():
        return  # regen has run: its rows are what training reads
    splits = plan_splits(regen, AutoTokenizer.from_pretrained(regen.target_dir))  # refuses a file too small for both
    check_row_length(regen, train.data, splits["train"].opening_lengths)


def check_row_length(regen, data, opening_lengths) -> None:
    """Rows reach max_prompt_tokens + max_tokens (per turn); the recipe keeps data.seq_length of each."""
    longest = regen.max_turns * (regen.max_prompt_tokens + regen.max_tokens)
    if longest <= data.seq_length or not opening_lengths:
        return
    over = sum(length >= data.seq_length for length in opening_lengths)
    fix = (f"raise data.seq_length= to {longest} (regen's longest row), or lower regen.max_prompt_tokens= "
           f"below {data.seq_length}")
    if over == len(opening_lengths):
        raise ConfigError(f"every one of the {over} training prompts is {data.seq_length} tokens or longer, the recipe's "
                          f"data.seq_length: training would set every row aside; {fix}")
    after = ("truncated there" if data.overlong == "truncate" else "dropped (data.overlong=drop)")
    print(f"[pipeline] note: regen's rows can reach {longest} tokens, over the recipe's data.seq_length={data.seq_length}: "
          f"{over} of the {len(opening_lengths)} training prompts are that long on their own, and training will set "
          f"their rows aside; longer rows are {after}. To keep them: {fix}", file=sys.stderr)
