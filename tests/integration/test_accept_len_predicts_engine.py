"""Training-time accept_len on held-out rows must predict what speculative decoding measures."""

import json

import pytest
from transformers import AutoTokenizer

from blockdraft.engine.decoder import SpeculativeEngine
from blockdraft.models.io import load_draft
from blockdraft.models.target import TargetModel
from blockdraft.train.logger import read_metrics
from tests.integration.conftest import REPO


@pytest.mark.parametrize("fixture", ["tiny_dflash_run", "tiny_dflash2_run"])
def test_val_accept_len_matches_engine_within_15_percent(fixture, request):
    run_dir = request.getfixturevalue(fixture)
    val_accept = [r for r in read_metrics(run_dir) if r.get("split") == "val"][-1]["val/accept_len"]
    draft = load_draft(run_dir / "checkpoints" / "step_120")
    target_dir = REPO / ".cache" / "targets" / "tiny-qwen3"
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    engine = SpeculativeEngine(TargetModel.load(str(target_dir), draft.config.target_layer_ids), draft,
                               eos_token_ids=[tokenizer.eos_token_id])
    accepted = drafts = 0
    for line in (REPO / ".cache" / "tiny_cpu" / "val.jsonl").read_text().splitlines():
        row = json.loads(line)
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, return_dict=True)["input_ids"]
        result = engine.generate(prompt, row["generation"]["max_new_tokens"])
        assert result.tokens == engine.target_generate(prompt, row["generation"]["max_new_tokens"]).tokens
        accepted += result.stats.num_accepted
        drafts += result.stats.num_drafts
    engine_accept = 1 + accepted / drafts
    print(f"{fixture}: engine mean acceptance {engine_accept:.3f}, training val accept_len {val_accept:.3f}")
    assert engine_accept == pytest.approx(val_accept, rel=0.15), (engine_accept, val_accept)
