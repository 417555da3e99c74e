"""Training refuses bad input with a clear message, before the target's weights are loaded."""

import json

import pytest

from blockdraft.errors import ConfigError, DataError
from tests.integration.conftest import REPO, train_tiny


@pytest.fixture
def never_load_weights(monkeypatch):
    from blockdraft.models import target

    def refuse(*a, **k):
        raise AssertionError("the target's weights were loaded before the error")

    monkeypatch.setattr(target.TargetModel, "load", classmethod(refuse))


@pytest.mark.parametrize("override,needle", [
    ("data.train=/nonexistent/train.jsonl", "data.train='/nonexistent/train.jsonl' does not exist"),
    # HF_HUB_OFFLINE=1 (as `make test` sets it): a dataset id not in the local cache fails at once.
    ("data.val=nobody-here/no-such-rows@validation", "is not in the local Hugging Face cache"),
    ("train.num_anchors=0", "train.num_anchors=0"),
    ("train.grad_accum=0", "train.grad_accum=0"),
    ("draft.mask_token_id=null", "add draft.mask_token_id=260 ('<|reserved_0|>'"),  # suggest's first candidate
    ("draft.mask_token_id=256", "pad/eos/bos"),
    ("draft.target_layer_ids=[1,9]", "[9] outside [0, 4]"),
    ("train.attention_backend=flex", "needs a CUDA device"),
])
def test_refused_before_the_target_loads(tmp_path, override, needle, never_load_weights):
    with pytest.raises(ConfigError) as err:
        train_tiny(tmp_path / "run", "prepare.regenerate_builtin=null", override)
    assert needle in str(err.value)


def test_resume_must_without_checkpoint(tmp_path, never_load_weights):
    with pytest.raises(ConfigError, match="resume=must"):
        train_tiny(tmp_path / "run", "resume=must")


def test_rows_without_any_valid_anchor_are_refused(tmp_path):
    rows = tmp_path / "short.jsonl"
    with open(rows, "w") as fh:
        for i in range(8):
            fh.write(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": ""}]}) + "\n")
    # An empty answer supervises only its end marker: no reply token is followed by another.
    with pytest.raises(DataError, match="no anchor can be drawn"):
        train_tiny(tmp_path / "run", f"data.train={rows}", "data.val=null", "prepare.regenerate_builtin=null")


def test_tokenizer_without_chat_template_is_refused(tmp_path):
    import shutil

    target = tmp_path / "target"
    shutil.copytree(REPO / ".cache" / "targets" / "tiny-qwen3", target)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(cfg))
    for f in target.glob("chat_template.*"):
        f.unlink()
    with pytest.raises(DataError, match="chat template"):
        train_tiny(tmp_path / "run", f"target.path={target}", "target.tiny=null")
