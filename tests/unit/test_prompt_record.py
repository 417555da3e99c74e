"""A prompt's identity and the record of training prompts: the same prompt hashes the same whichever path
it comes through (a regenerated row, a ShareGPT row, a serve or eval prompt file), and the record file
round-trips, stays compact and refuses a damaged copy."""

import json

import numpy as np
import pytest

from blockdraft.data.prompt_record import HEADER, NO_PROMPT, RECORD_NAME, PromptRecord, find_record, prompt_hash, prompt_opening
from blockdraft.data.rows import normalize_row
from blockdraft.errors import DataError
from blockdraft.regen.turns import Reply, regen_row, rollout, turn_inputs
from blockdraft.serve.prompts import encode_prompts, identity_of, load_prompts

SYSTEM = {"role": "system", "content": "Be brief."}
ASK = {"role": "user", "content": "What is\n  speculative decoding?"}
REPLY = {"role": "assistant", "content": "A draft proposes, the target verifies."}
CONVERSATIONS = [
    [SYSTEM, ASK, REPLY, {"role": "user", "content": "And why?"}, REPLY],
    [ASK, {"role": "user", "content": "Short, please."}, REPLY],
    [REPLY, ASK],  # opens with the assistant: no prompt
    [{"role": "user", "content": "   "}, REPLY],  # a blank question: no prompt
    [SYSTEM, {"role": "user", "content": "x"}],  # no reply yet
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_the_opening_is_regens_first_turn(messages):
    first = turn_inputs(messages, 1)
    assert prompt_opening(messages) == (first[0] if first else [])
    assert (prompt_hash(messages) == NO_PROMPT) == (not first)


def test_a_prompt_hashes_the_same_through_every_path(tmp_path):
    conversation = CONVERSATIONS[0]
    expected = prompt_hash(conversation)
    # regen's row: the opening sent to the target, then the target's own reply.
    row, _ = rollout(turn_inputs(conversation, 1), lambda messages: Reply("its own words", 3, "stop"))
    assert prompt_hash(regen_row(row, {}, 0, [])["messages"]) == expected
    # ShareGPT's from/value shape, as data rows read it, with other whitespace in the question.
    sharegpt = {"conversations": [{"from": "system", "value": "Be brief. "}, {"from": "human", "value": "What is speculative decoding?"},
                                  {"from": "gpt", "value": "Something else entirely."}]}
    assert prompt_hash(normalize_row(sharegpt)) == expected
    # A serve or eval prompt file: a whole conversation (cut at the first reply) and its opening alone.
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"messages": conversation}) + "\n" + json.dumps({"messages": conversation[:2]}) + "\n"
                    + json.dumps({"prompt": "Name a fruit."}) + "\n")
    whole, opening, text = load_prompts(str(path), 3)
    assert identity_of(whole) == identity_of(opening) == expected
    assert identity_of(text) == prompt_hash([{"role": "user", "content": "Name a fruit."}]) != expected


def test_roles_and_words_tell_prompts_apart():
    assert prompt_hash([{"role": "system", "content": "hi"}, ASK]) != prompt_hash([{"role": "user", "content": "hi"}, ASK])
    assert prompt_hash([ASK]) != prompt_hash([{"role": "user", "content": "What is speculative encoding?"}])
    assert prompt_hash([ASK]) != prompt_hash([SYSTEM, ASK])


def test_encoded_prompts_carry_their_identity():
    from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer

    prompts = load_prompts("tiny", 3)
    encoded, _ = encode_prompts(prompts, build_tiny_tokenizer(), True, 10_000)
    assert [p.identity for p in encoded] == [prompt_hash(p.messages) for p in prompts]


def test_the_record_round_trips_sorted_once_each_in_eight_bytes_a_prompt(tmp_path):
    record = PromptRecord.of([5, -3, 5, NO_PROMPT, 2**63 - 1, -(2**63)])
    assert record.hashes.tolist() == [-(2**63), -3, 5, 2**63 - 1] and record.complete
    path = record.write(tmp_path / RECORD_NAME)
    assert path.stat().st_size == HEADER.size + 8 * 4 == 56
    back = find_record(tmp_path)
    assert back.hashes.tolist() == record.hashes.tolist() and back.complete
    assert back.contains([5, 6, -3, NO_PROMPT]).tolist() == [True, False, True, False]
    PromptRecord(back.hashes, complete=False).write(path)
    assert not find_record(tmp_path).complete and find_record(tmp_path / "elsewhere") is None
    assert record.union(PromptRecord.of([1])).hashes.tolist() == [-(2**63), -3, 1, 5, 2**63 - 1]


def test_a_million_prompts_take_eight_megabytes(tmp_path):
    hashes = np.random.default_rng(0).integers(-(2**63), 2**63 - 1, size=1_000_000, dtype=np.int64)
    path = PromptRecord.of(hashes).write(tmp_path / RECORD_NAME)
    assert path.stat().st_size == HEADER.size + 8 * 1_000_000
    assert PromptRecord.read(path).contains(hashes[:3]).all()


@pytest.mark.parametrize("damage", [lambda b: b[:10], lambda b: b[:-1], lambda b: b"notarecd" + b[8:]])
def test_a_damaged_record_is_refused_with_the_fix(tmp_path, damage):
    path = PromptRecord.of([1, 2, 3]).write(tmp_path / RECORD_NAME)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=f"copy {RECORD_NAME} again from the run directory it came from"):
        PromptRecord.read(path)
