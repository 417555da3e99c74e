"""Drafts that the real speculators package (0.9.0, in its own environment, as vLLM's own trainer
writes them) saves, imported here, give speculators' own block logits: DFlash, DFlash2 and DSpark,
sliding-window layers causal inside the block, mixed with full layers, a reduced vocabulary, and
DSpark in both block layouts.

`speculators_drafts.py` runs in `.venv-speculators` (speculators pins transformers <= 5.19): it
writes a tiny verifier, the checkpoints, and per checkpoint the hidden states, logits and heads'
scores its `_backbone_forward` gives for fixed anchors. Here each anchor's block is drafted the
way the reference engine and vLLM draft it: the context's features up to the anchor, then
[anchor, MASK, ...] at positions anchor.. anchor+B-1.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.draft_format.causality import vllm_layer_causality
from blockdraft.draft_format.importer import import_draft
from blockdraft.export.__main__ import speculators_source_lines
from blockdraft.export.inspect import describe
from blockdraft.export.writer import export_draft
from blockdraft.models.layers import per_layer_masks

REPO = Path(__file__).resolve().parents[2]
SPECULATORS_PYTHON = REPO / ".venv-speculators" / "bin" / "python"
WRITER = Path(__file__).with_name("speculators_drafts.py")
CASES = ("dflash_sliding", "dflash_mixed", "dflash_reduced_vocab", "dflash2", "dspark", "dspark_bonus_anchor")
ATOL = 1e-5


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    if not SPECULATORS_PYTHON.is_file():
        pytest.skip("needs speculators' environment: make setup-speculators")
    out = tmp_path_factory.mktemp("speculators")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    subprocess.run([str(SPECULATORS_PYTHON), str(WRITER), str(out)], check=True, env=env, timeout=600)
    return out


class Verifier:
    """The verifier's embedding and head, which speculators leaves out of a draft's save."""

    def __init__(self, directory: Path):
        state = load_file(directory / "model.safetensors")
        self.embed = torch.nn.Embedding.from_pretrained(state["model.embed_tokens.weight"])
        self.lm_head = state["lm_head.weight"]


def draft_block(draft, verifier, parity, anchor: int, masks=None) -> torch.Tensor:
    """The normed hidden [1, B, H] of the block at `anchor`, drafted over the context before it."""
    b, ids = parity["block_size"], parity["input_ids"]
    kv = draft.context_kv(parity["hidden_states"][:, :anchor], torch.arange(anchor)[None])
    block = torch.full((1, b), draft.config.mask_token_id)
    block[0, 0] = ids[0, anchor]
    positions = torch.arange(anchor, anchor + b)[None]
    return draft(draft.embed(block, verifier.embed), positions, kv, masks(anchor) if masks else None)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_speculators_checkpoint_imports_with_its_own_block_logits(written, case):
    draft, cfg = import_draft(written / case)
    verifier = Verifier(written / "verifier")
    parity = torch.load(written / f"{case}.parity.pt")
    for j, anchor in enumerate(parity["anchors"].tolist()):
        hidden = draft_block(draft, verifier, parity, anchor)
        torch.testing.assert_close(hidden[0], parity["hidden"][j], atol=ATOL, rtol=0)
        logits = draft.draft_logits(hidden, verifier.lm_head)
        if cfg.kind == "dspark":
            previous = parity["prev_token_ids"][j][None]
            torch.testing.assert_close(logits[0], parity["backbone_logits"][j], atol=ATOL, rtol=0)
            logits = draft.corrected_logits(hidden, previous, verifier.lm_head)
            confidence = draft.confidence_logits(draft.joint_hidden(hidden, previous))
            torch.testing.assert_close(confidence[0], parity["confidence_logits"][j], atol=ATOL, rtol=0)
        torch.testing.assert_close(logits[0], parity["logits"][j], atol=ATOL, rtol=0)
        if cfg.kind == "dflash2":
            candidates = parity["candidate_ids"][j]
            scores = draft.candidate_selector.score(
                hidden[0], parity["predecessor_ids"][j], candidates, logits[0].gather(-1, candidates))
            torch.testing.assert_close(scores, parity["selector_scores"][j], atol=ATOL, rtol=0)


def speculators_window_masks(draft, block_size: int):
    """speculators' window rule per layer (models/dflash/attention.py): every slot of a block sees the
    context from anchor - W on, and its block (causally where the layer is)."""
    def masks(anchor: int):
        def build(window, causal):
            keys = torch.arange(anchor + block_size)
            context = keys < anchor
            if window is not None:
                context = context & (keys >= anchor - window)
            in_block = ~(keys < anchor)
            slot = torch.arange(block_size)[:, None]
            block = in_block & ((keys - anchor <= slot) if causal else True)
            return (context | block)[None, None]
        return per_layer_masks(draft.config.layer_attention(), build)
    return masks


@pytest.mark.slow
def test_a_narrow_window_parts_from_speculators_only_where_its_window_rule_does(written):
    """This project attends as vLLM serves (slot i sees keys after anchor + i - W); speculators trains
    every slot on the context from anchor - W. With speculators' rule the weights give its logits
    exactly; with vLLM's they agree on a block whose context fits W - B + 1 tokens, and part after."""
    case = "dflash_narrow_window"
    draft, cfg = import_draft(written / case)
    verifier = Verifier(written / "verifier")
    parity = torch.load(written / f"{case}.parity.pt")
    b, window = parity["block_size"], cfg.sliding_window
    assert cfg.layer_types == ["sliding_attention", "full_attention"] and cfg.sliding_causal
    rule = speculators_window_masks(draft, b)
    for j, anchor in enumerate(parity["anchors"].tolist()):
        expected = parity["logits"][j]
        logits = draft.draft_logits(draft_block(draft, verifier, parity, anchor, rule), verifier.lm_head)
        torch.testing.assert_close(logits[0], expected, atol=ATOL, rtol=0)
        served = draft.draft_logits(draft_block(draft, verifier, parity, anchor), verifier.lm_head)[0]
        if anchor + b <= window:
            torch.testing.assert_close(served, expected, atol=ATOL, rtol=0)
        else:
            assert not torch.allclose(served, expected, atol=ATOL)


@pytest.mark.slow
def test_inspect_says_where_vllm_would_serve_the_checkpoint_otherwise(written):
    mixed = describe(written / "dflash_mixed")
    assert "a speculators DFlash checkpoint" in mixed
    assert "attention: layer 0 sliding window 2048, causal inside the block; layer 1 full, bidirectional" in mixed
    # vLLM's converter sets dflash_config.causal for every layer: the full layer would turn causal.
    assert "layer 1 (full_attention): vLLM would attend causally inside the block" in mixed
    # DFlash2 trains bidirectionally in every layer and vLLM reads it so: only the window rule is left to say.
    dflash2 = describe(written / "dflash2")
    assert "vLLM would attend" not in dflash2 and "sliding window 2048: vLLM shows slot i" in dflash2


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dflash_mixed", "dspark"])
def test_an_export_of_a_speculators_checkpoint_serves_as_it_trained(written, tmp_path, case):
    out = export_draft(written / case, tmp_path / "export", dtype="float32", target_dir=written / "verifier")
    config = json.loads((out / "config.json").read_text())
    # vLLM resolves each layer from layer_types when is_causal (and dflash_config.causal) is absent.
    assert config["layer_types"] == ["sliding_attention", "full_attention"] and config["sliding_window"] == 2048
    assert "is_causal" not in config and "causal" not in config["dflash_config"]
    assert vllm_layer_causality(config) == [True, False]
    assert "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve" in describe(out)  # mixed layers: V2 runner only
    # The export command says where vLLM, given speculators' own config.json, would not serve it as trained.
    said = speculators_source_lines(str(written / case))
    assert ("layer 1 (full_attention): vLLM would attend causally" in said) == (case == "dflash_mixed")
    draft, cfg = import_draft(out)
    verifier = Verifier(written / "verifier")
    parity = torch.load(written / f"{case}.parity.pt")
    for j, anchor in enumerate(parity["anchors"].tolist()):
        torch.testing.assert_close(draft_block(draft, verifier, parity, anchor)[0], parity["hidden"][j], atol=ATOL, rtol=0)
