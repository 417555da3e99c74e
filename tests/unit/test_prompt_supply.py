"""The pipeline's checks before regen: rows that the recipe's seq_length cannot hold are said, or refused."""

from types import SimpleNamespace

import pytest

from blockdraft.data.config import DataConfig
from blockdraft.regen.config import RegenConfig
from blockdraft.errors import ConfigError
from blockdraft.pipeline.prompt_supply import check_row_length


def regen(**overrides):
    return RegenConfig(target_dir="t", out="o", **{"max_prompt_tokens": 384, "max_tokens": 192, **overrides})


def test_prompts_longer_than_seq_length_are_counted_and_the_fix_named(capsys):
    check_row_length(regen(), DataConfig(seq_length=160), [20, 170, 400, 90, 160])
    err = capsys.readouterr().err
    assert "rows can reach 576 tokens, over the recipe's data.seq_length=160" in err
    assert "3 of the 5 training prompts" in err and "data.seq_length= to 576" in err


def test_a_seq_length_that_holds_every_row_says_nothing(capsys):
    check_row_length(regen(), DataConfig(seq_length=576), [20, 500])
    assert capsys.readouterr().err == ""


def test_a_seq_length_no_prompt_fits_in_is_refused():
    with pytest.raises(ConfigError, match="every one of the 2 training prompts .* data.seq_length= to 576"):
        check_row_length(regen(), DataConfig(seq_length=16), [20, 40])
