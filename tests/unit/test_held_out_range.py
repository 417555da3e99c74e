"""ShareGPT's held-out range is defined once (blockdraft/data/held_out.py) and kept apart by content:
regen's training prompts stop before it and pass over every prompt it asks again, regen's held-out
rows share no prompt with the training ones, serve and eval read from it by default, and the README's
Qwen3-8B recipe keeps its training, held-out and eval prompts apart.

The plans read the bundled ShareGPT once (about a second) and count a token per byte of a plain chat
rendering: never fewer tokens than a byte-level BPE tokenizer such as Qwen3's gives (each of its tokens
covers a byte or more; each special token here is many bytes), so every prompt skipped as too long for
Qwen3 is skipped here too, and each range reaches at least as far as it would for Qwen3."""

import shlex
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from blockdraft.config import compose, register_schema
from blockdraft.data.held_out import SHAREGPT_HELD_OUT_START, held_out_hashes
from blockdraft.data.prompt_record import prompt_hash, prompt_opening
from blockdraft.errors import ConfigError
from blockdraft.eval.config import EvalAppConfig
from blockdraft.pipeline import commands
from blockdraft.pipeline.settings import parse_overrides
from blockdraft.regen import prompt_plan
from blockdraft.regen.config import RegenConfig
from blockdraft.serve.config import ServeConfig
from blockdraft.serve import prompts as serve_prompts
from blockdraft.serve.prompts import encode_prompts, iter_prompts
from tests.unit.command_check import REPO, commands_in_markdown

register_schema("regen_schema", RegenConfig)
register_schema("eval_schema", EvalAppConfig)
register_schema("serve_schema", ServeConfig)


class ByteTokenizer:
    """A token per byte of a Qwen3-style rendering, thinking turned off."""

    chat_template = "bytes"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + "<|im_start|>assistant\n<think>\n\n</think>\n\n"

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=list(text.encode("utf-8", "surrogatepass")))


@pytest.fixture(scope="module")
def sharegpt():
    return prompt_plan.source_conversations("sharegpt", 10**9)


@pytest.fixture
def plan(sharegpt, monkeypatch):
    monkeypatch.setattr(prompt_plan, "source_conversations", lambda spec, limit: sharegpt[:limit])

    def planned(**keys):
        return prompt_plan.plan_splits(RegenConfig(target_dir="t", out="o", **keys), ByteTokenizer())
    return planned


def hashes(conversations) -> set:
    return {prompt_hash(c) for c in conversations}


def test_training_stops_before_the_held_out_range_and_passes_over_prompts_asked_again_there(plan, sharegpt, capsys):
    held_out = held_out_hashes(sharegpt)
    splits = plan(num_train=len(sharegpt), num_heldout=64, max_prompt_tokens=4096)
    train, heldout = splits["train"], splits["heldout"]
    assert train.end_source_position == SHAREGPT_HELD_OUT_START and not hashes(train.conversations) & held_out
    repeated = [i for i in range(SHAREGPT_HELD_OUT_START) if prompt_hash(sharegpt[i]) in held_out]
    assert repeated and train.skipped_repeated == repeated  # ShareGPT asks some openings again past 10,000
    assert heldout.first_source_position == SHAREGPT_HELD_OUT_START and len(heldout.conversations) == 64
    note = capsys.readouterr().err
    assert f"training takes {len(train.conversations)} ShareGPT prompts" in note
    assert f"{len(repeated)} asked again in the held-out range were passed over" in note


def test_a_training_range_inside_the_held_out_range_is_refused_unless_asked(plan, sharegpt):
    with pytest.raises(ConfigError, match="train_skip=10100 starts the training prompts inside ShareGPT's held-out "
                                          "range .* allow_held_out_training=true"):
        plan(num_train=50, num_heldout=16, train_skip=10_100)
    splits = plan(num_train=50, num_heldout=16, train_skip=10_100, heldout_skip=0, allow_held_out_training=True)
    assert splits["train"].first_source_position == 10_100 and len(splits["train"].conversations) == 50
    assert not hashes(splits["heldout"].conversations) & hashes(splits["train"].conversations)


def test_held_out_rows_pass_over_prompts_the_training_rows_hold(plan, sharegpt):
    """A held-out range apart by position from the training one still shares no prompt with it."""
    held_out, first = held_out_hashes(sharegpt), {}
    again = next(j for j, c in enumerate(sharegpt) if first.setdefault(prompt_hash(c), j) != j
                 and prompt_hash(c) not in held_out)  # a prompt ShareGPT asks twice before 10,000
    asked = first[prompt_hash(sharegpt[again])]
    splits = plan(num_train=1, train_skip=asked, num_heldout=8, heldout_skip=again, max_prompt_tokens=10**6)
    assert splits["train"].first_source_position == asked and splits["heldout"].skipped_repeated == [again]
    assert not hashes(splits["heldout"].conversations) & hashes(splits["train"].conversations)


def test_serve_and_eval_read_sharegpt_from_where_regen_counts_its_held_out_range(sharegpt):
    served = next(iter(iter_prompts("sharegpt")))
    assert prompt_hash(served.messages) == prompt_hash(sharegpt[SHAREGPT_HELD_OUT_START])


def readme_recipe():
    """The README's Qwen3-8B pipeline and eval commands, as words."""
    found = [shlex.split(c.text) for c in commands_in_markdown(REPO / "README.md") if "runs/q8b" in c.text]
    pipeline = next(w for w in found if w[1] == "pipeline")
    evaluation = next(w for w in found if w[1] == "eval")
    return pipeline[2:], evaluation[2:]


def test_the_readme_recipe_keeps_training_held_out_and_eval_prompts_apart(plan, sharegpt, monkeypatch):
    # The eval reads ShareGPT as the serve check does (the test above), here from the set already read.
    monkeypatch.setattr(serve_prompts, "_sharegpt", lambda skip: (
        serve_prompts.Prompt(f"ShareGPT #{i}", prompt_opening(c)) for i, c in enumerate(sharegpt[skip:], skip)))
    pipeline_words, eval_words = readme_recipe()
    s = parse_overrides(pipeline_words)
    regen = OmegaConf.to_object(compose("regen", commands.regen_overrides(s)))
    serve = OmegaConf.to_object(compose("serve", commands.serve_overrides(s)))
    assert serve.prompts == str(s.paths()["heldout_rows"])  # the serve check reads regen's held-out rows
    splits = prompt_plan.plan_splits(regen, ByteTokenizer())
    train, heldout = splits["train"], splits["heldout"]
    trained = hashes(train.conversations)

    cfg = OmegaConf.to_object(compose("eval", [w.replace("target=", "target_dir=", 1) for w in eval_words]))
    options = cfg.options("sharegpt")
    kept, too_long = encode_prompts(iter_prompts("sharegpt", options.skip), ByteTokenizer(), True,
                                    cfg.max_model_len - options.max_tokens, options.chat_template_kwargs, limit=options.num_prompts)
    assert len(kept) == options.num_prompts
    # Every prompt each side could take with Qwen3's shorter token counts lies in these ranges.
    heldout_range = sharegpt[heldout.first_source_position:heldout.end_source_position]
    eval_range = sharegpt[options.skip:options.skip + len(kept) + len(too_long)]
    assert heldout.first_source_position >= train.end_source_position
    assert options.skip >= heldout.end_source_position
    assert not trained & held_out_hashes(sharegpt)  # nothing from the held-out range, where both others read
    assert not trained & hashes(heldout.conversations) and not trained & {p.identity for p in kept}
    assert not hashes(heldout_range) & hashes(eval_range)
