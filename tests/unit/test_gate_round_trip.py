"""The gate's training row: the longest prefix of the target's reply that round-trips through the
tokenizer and chat template, refused only when that prefix is too short to judge a draft by."""

import pytest

from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer
from blockdraft.errors import ConfigError
from blockdraft.gate.response import MIN_REPLY_TOKENS, round_trip_prefix

LONE_CONTINUATION_BYTE = 0x80  # decodes to U+FFFD, which encodes as three other bytes


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def prompt_ids(tokenizer):
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                                          tokenize=False), add_special_tokens=False)


def test_a_reply_that_round_trips_is_kept_whole(tokenizer):
    reply = [ord(c) for c in "the moon is far"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]  # the turn's end
    sample = round_trip_prefix("hi", prompt_ids(tokenizer), reply, tokenizer)
    assert sample.reply_ids == reply and sample.generated_tokens == len(reply)


def test_a_reply_is_cut_before_the_first_token_that_does_not_round_trip(tokenizer, capsys):
    head = [ord(c) for c in "the moon is far away from us"]  # 28 tokens
    reply = head + [LONE_CONTINUATION_BYTE] + [ord(c) for c in "and more"]
    sample = round_trip_prefix("hi", prompt_ids(tokenizer), reply, tokenizer)
    assert sample.reply_ids == head and sample.reply_text == "the moon is far away from us"
    assert sample.generated_tokens == len(reply)
    assert f"its first {len(head)} of {len(reply)} tokens do" in capsys.readouterr().out


def test_a_round_tripping_prefix_under_the_minimum_is_refused_with_the_fix(tokenizer):
    reply = [ord(c) for c in "short"] + [LONE_CONTINUATION_BYTE] + [ord("x")] * 30
    with pytest.raises(ConfigError, match=f"no prefix of {MIN_REPLY_TOKENS} tokens or more does.*Pick another prompt="):
        round_trip_prefix("hi", prompt_ids(tokenizer), reply, tokenizer)
