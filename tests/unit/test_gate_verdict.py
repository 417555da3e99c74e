"""The gate's verdict compares serving with what training reached on the same sample: serving that
accepts less is a serving fault, a draft that never memorised the sample is its own verdict, and
serving that does better than an unmemorised draft is no false alarm."""

import json

import pytest

from blockdraft.serve.gate import GateConfig, Served, judge
from blockdraft.serve.gate_response import Sample

REPLY = list(range(10, 58))


def verdict(tmp_path, train_accept_len: float, served_accept_len: float, block_size: int = 16, tokens=REPLY):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 300, "loss": 0.1, "accept_len": train_accept_len}) + "\n")
    drafts = 100
    served = Served("vllm", list(tokens), drafts, (served_accept_len - 1) * drafts, [], block_size, "dflash", [])
    sample = Sample(prompt="p", prompt_ids=[1, 2], reply_ids=REPLY, reply_text="r", generated_tokens=len(REPLY))
    return judge(GateConfig(target=str(tmp_path)), tmp_path, sample, served)


def test_serving_better_than_an_unmemorised_draft_is_not_blamed_on_serving(tmp_path):
    # The false alarm: block 16, training reached 11.96 on the sample, vLLM accepted 13.0.
    v = verdict(tmp_path, 11.96, 13.0)
    assert v["verdict"] == "undertrained" and not v["passed"]
    assert "training did not memorise the sample" in v["failures"][0]
    assert all("serving does not compute" not in f for f in v["failures"])


def test_serving_far_below_what_training_reached_is_a_serving_fault(tmp_path):
    v = verdict(tmp_path, 15.5, 8.0)
    assert v["verdict"] == "serving differs" and not v["passed"]
    assert "serving does not compute what training learned" in v["failures"][0] and "15.50" in v["failures"][0]


def test_a_memorised_draft_served_as_trained_passes(tmp_path):
    v = verdict(tmp_path, 15.5, 15.2)
    assert v["passed"] and v["verdict"] == "passed" and v["train_accept_len"] == pytest.approx(15.5)


def test_a_differing_output_is_named_first(tmp_path):
    v = verdict(tmp_path, 15.5, 15.2, tokens=[0, *REPLY[1:]])
    assert v["verdict"] == "not lossless" and "differs from the target's reply at token 0" in v["failures"][0]
