"""The gate's verdict compares serving with what training reached on the same sample, each as a share of
what a perfect draft reaches there: serving that accepts less is a serving fault, a draft that never
memorised the sample is its own verdict, and a perfect draft on a reply too short for block_size passes."""

import json

import pytest

import blockdraft
from blockdraft.build_info import git_commit
from blockdraft.gate.app import VERDICT_NAME, Ceilings, GateConfig, Served, judge
from blockdraft.gate.floors import serving_ceiling, training_ceiling
from blockdraft.gate.response import Sample

REPLY = list(range(10, 58))


def verdict(tmp_path, train_accept_len: float, served_accept_len: float, block_size: int = 16, tokens=None, reply=REPLY):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 300, "loss": 0.1, "accept_len": train_accept_len}) + "\n")
    drafts = 2
    served = Served("vllm", list(reply if tokens is None else tokens), drafts, (served_accept_len - 1) * drafts, [],
                    block_size, "dflash", [], block_size - 1)
    sample = Sample(prompt="p", prompt_ids=[1, 2], reply_ids=reply, reply_text="r", generated_tokens=len(reply))
    # The row as the chat template lays it out: the prompt, the reply, its end-of-turn marker.
    perfect = training_ceiling([False] * 5 + [True] * (len(reply) + 1), block_size - 1)
    return judge(GateConfig(target=str(tmp_path)), tmp_path, sample, served, Ceilings(perfect, len(reply)))


SHORT = REPLY[:26]


def test_a_perfect_draft_on_a_short_reply_at_block_16_passes(tmp_path):
    # The case a floor of 0.9 x block_size failed: training reached 11.96 and vLLM accepted 13.0, a perfect
    # draft's values on a 26-token reply (0.9 x 16 = 14.4 is out of reach of both).
    v = verdict(tmp_path, 11.96, 13.0, reply=SHORT)
    assert v["passed"] and v["verdict"] == "passed", v["failures"]
    assert v["perfect_acceptance_length"] == 13.0 and v["memorised_floor"] == pytest.approx(0.9 * 11.96, abs=0.01)
    # gate.json names the blockdraft that judged it, as serve and eval reports do.
    written = json.loads((tmp_path / VERDICT_NAME).read_text())
    assert written["blockdraft_version"] == blockdraft.__version__ and written["blockdraft_commit"] == git_commit()


def test_a_draft_short_of_a_perfect_one_in_training_is_undertrained(tmp_path):
    v = verdict(tmp_path, 9.0, 13.0, reply=SHORT)
    assert v["verdict"] == "undertrained" and not v["passed"]
    assert "training did not memorise the sample" in v["failures"][0] and "max_steps=" in v["failures"][0]
    assert all("serving does not compute" not in f for f in v["failures"])


def test_serving_far_below_its_perfect_share_is_a_serving_fault(tmp_path):
    perfect_train = training_ceiling([False] * 5 + [True] * 49, 15)
    v = verdict(tmp_path, perfect_train, 8.0)
    assert v["verdict"] == "serving differs" and not v["passed"]
    assert "serving does not compute what training learned" in v["failures"][0]
    assert f"{serving_ceiling(48, 15):.2f}, what a perfect draft accepts" in v["failures"][0]


def test_serving_is_held_to_the_share_training_reached(tmp_path):
    # Training reached half of a perfect draft's accept_len: serving needs 0.9 x half of its own perfect value.
    half = training_ceiling([False] * 5 + [True] * 49, 15) / 2
    need = 0.9 * 0.5 * serving_ceiling(48, 15)
    assert verdict(tmp_path, half, need + 0.05)["verdict"] == "undertrained"
    assert verdict(tmp_path, half, need - 0.05)["verdict"] == "serving differs"


def test_a_memorised_draft_served_as_trained_passes(tmp_path):
    v = verdict(tmp_path, 13.7, 15.2)
    assert v["passed"] and v["verdict"] == "passed" and v["train_accept_len"] == pytest.approx(13.7)


def test_a_differing_output_is_named_first(tmp_path):
    v = verdict(tmp_path, 13.7, 15.2, tokens=[0, *REPLY[1:]])
    assert v["verdict"] == "not lossless" and "differs from the target's reply at token 0" in v["failures"][0]
