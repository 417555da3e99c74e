"""The one-sample fidelity gate on the tiny target: DFlash, JetSpec and a reduced-vocabulary DFlash
draft memorise the target's reply and vLLM on CPU accepts nearly every drafted token; an export
with its target_layer_ids shifted by one fails it. DFlash is gated at block 16 on a 26-token reply,
where even a perfect draft stays far below 0.9 x 16 in training and in serving: it passes, its
floors being what a perfect draft reaches on that reply (gate/floors.py).

`make test` gates DFlash (one vLLM start); JetSpec and the reduced vocabulary are gated in `make
test-slow`, while faster tests in `make test` hold what vLLM reads of them: vLLM parses the exports'
`is_causal` (test_export_vllm_config.py), our mirror of its causality rule (test_jetspec.py), and its
own reduced-vocabulary logits on our head (test_vllm_reduced_vocab_contract.py)."""

import json
import shutil

import pytest

from blockdraft.data.prompt_record import RECORD_NAME, PromptRecord, prompt_hash
from blockdraft.gate import app as gate
from tests.integration.conftest import REDUCED_VOCAB, REPO

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
TARGET = REPO / ".cache" / "targets" / "tiny-qwen3"
pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(not SERVE_PYTHON.exists(), reason="no vLLM serving environment: run `make setup-serve`"),
]
STEPS = 150  # the tiny draft has memorised its 48-token reply by then (all slots right at ~120)
SHORT_REPLY = 26  # at block 16: two rounds in serving, at most 13.0 accepted; 11.96 in training
KINDS = {
    "dflash": ["draft.block_size=16", f"max_tokens={SHORT_REPLY}"],
    "jetspec": ["draft=jetspec"],
    "reduced_vocab": [f"draft.draft_vocab_size={REDUCED_VOCAB}"],
}
# JetSpec is gated on a target whose reply to the default prompt does not round-trip (below); DFlash
# keeps the whole reply, which the shifted-layers check needs to tell a broken export apart.
ROUND_TRIP_BREAKER = ";"


def run_gate(out, *extra, target=TARGET):
    return gate.main([f"target={target}", f"out={out}", "experiment=tiny_cpu", "train.progress=false", f"steps={STEPS}", *extra])


def save_target_whose_reply_does_not_round_trip(path):
    """The tiny target, but byte 0x80 wins wherever ';' would: a lone UTF-8 continuation byte decodes
    to U+FFFD, which the tokenizer encodes as three other bytes, so the reply's text no longer gives
    back its ids from there on (as a random target speaking any byte does)."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(TARGET, path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[0x80] = 1.05 * head[ord(ROUND_TRIP_BREAKER)]
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """(root, gate(kind) -> exit code): each kind gated once, when a test first asks for it."""
    root, codes = tmp_path_factory.mktemp("gate"), {}

    def gate_kind(kind):
        if kind not in codes:
            target = save_target_whose_reply_does_not_round_trip(root / "target") if kind == "jetspec" else TARGET
            codes[kind] = run_gate(root / kind, *KINDS[kind], target=target)
        return codes[kind]

    return root, gate_kind


@pytest.mark.parametrize("kind", ["dflash", pytest.param("jetspec", marks=pytest.mark.slow),
                                  pytest.param("reduced_vocab", marks=pytest.mark.slow)])
def test_the_gate_passes_through_vllm(gated, kind):
    root, gate_kind = gated
    code = gate_kind(kind)
    verdict = json.loads((root / kind / "gate.json").read_text())
    assert code == 0, verdict["failures"]
    assert verdict["passed"] and verdict["engine"] == "vllm" and verdict["num_drafts"] > 0
    if kind == "dflash":  # a perfect draft's acceptance on 26 tokens in vLLM: 1 + (15 + 9) / 2
        assert verdict["block_size"] == 16 and verdict["reply_tokens"] == SHORT_REPLY
        assert verdict["mean_acceptance_length"] == verdict["perfect_acceptance_length"] == 13.0
        assert 0.9 * 11.96 <= verdict["train_accept_len"] < 0.9 * 16
    else:
        assert verdict["block_size"] == 4 and verdict["mean_acceptance_length"] >= 0.9 * 4
    print(f"{kind}: gate acceptance {verdict['mean_acceptance_length']:.2f}, per position {verdict['acceptance_per_position']}")
    config = json.loads((root / kind / "export" / "config.json").read_text())
    assert config["is_causal"] is (kind == "jetspec")
    assert ("draft_vocab_size" in config) is (kind == "reduced_vocab")
    # Served by vLLM on the prompt whose reply the draft memorised: the output is the target's own.
    response = json.loads((root / kind / "response.json").read_text())
    # Its own draft trained on that one prompt, by design, as its record says: served there, not refused.
    record = PromptRecord.read(root / kind / "export" / RECORD_NAME)
    assert record.hashes.tolist() == [prompt_hash([{"role": "user", "content": response["prompt"]}])]
    assert len(response["reply_ids"]) > 16 and not verdict["failures"]
    if kind == "jetspec":  # trained and served on the longest prefix that round-trips, before the first 0x80
        assert 0x80 not in response["reply_ids"] and response["generated_tokens"] > len(response["reply_ids"]) >= 16
    else:
        assert response["generated_tokens"] == len(response["reply_ids"])


def test_an_export_with_shifted_target_layers_fails_the_gate(gated, tmp_path):
    out = tmp_path / "broken"
    gated[1]("dflash")
    shutil.copytree(gated[0] / "dflash", out)
    config_path = out / "export" / "config.json"
    config = json.loads(config_path.read_text())
    config["dflash_config"]["target_layer_ids"] = [i + 1 for i in config["dflash_config"]["target_layer_ids"]]
    config_path.write_text(json.dumps(config))
    (out / "export" / "checksums.json").unlink()  # edited on purpose
    # The reference engine reads the same config.json vLLM reads, at no server start.
    assert gate.main([f"target={TARGET}", f"out={out}", "recheck=true", "engine=reference"]) == 1
    verdict = json.loads((out / "gate.json").read_text())
    assert not verdict["passed"] and verdict["mean_acceptance_length"] < verdict["min_acceptance_length"]
    assert "serving does not compute what training learned" in verdict["failures"][0]


def test_a_typo_in_a_training_override_is_refused_before_any_work(tmp_path):
    assert run_gate(tmp_path / "typo", "train.max_stepz=3") == 2
    assert not (tmp_path / "typo").exists()
