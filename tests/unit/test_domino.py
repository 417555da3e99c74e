"""The Domino draft: its correction head's shapes and causality, teacher forcing against serial
decoding, its training step against a naive loop, its export and where preflight sends it."""

import json
import sys

import pytest
import torch

from blockdraft.config.recipe import LoopConfig
from blockdraft.draft_format.contract import ContractError
from blockdraft.draft_format.importer import import_draft
from blockdraft.engine.decoder import SpeculativeEngine
from blockdraft.errors import ConfigError
from blockdraft.export.reload_check import make_probe, run_probe
from blockdraft.export.writer import export_draft
from blockdraft.models.resolve import DraftConfig, resolve_draft_config
from blockdraft.models.tiny_target import save_tiny_target
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.preflight import choose_engine, plan_serving, read_draft
from blockdraft.train.step import draw_blocks, train_step
from blockdraft.vllm_runtime.probe import VllmInfo
from tests.conftest import MASK_ID, make_draft
from tests.unit.export_helpers import make_run
from tests.unit.test_step import _batch, _each_block

CPU_VLLM = VllmInfo(
    version="0.32.0", device="cpu", has_triton=False, v2_runner_env=None,
    dflash_archs=["DFlash2DraftModel", "DFlashDraftModel"], arch_known=True, arch_supports_eagle3=True,
    anchor_clamp=False, cpu_head_sizes=[32, 64, 128],
)
GPU_VLLM = VllmInfo(**{**CPU_VLLM.__dict__, "device": "cuda", "has_triton": True, "cpu_head_sizes": []})


@pytest.fixture
def domino(tiny_hf):
    """A Domino draft whose correction is switched on (a fresh one is its DFlash backbone)."""
    draft = make_draft(tiny_hf, "domino", correction_hidden_size=16, correction_rank=8)
    with torch.no_grad():
        for param in draft.correction.parameters():
            param.normal_(0.0, 0.3)
    return draft.eval()


def _inputs(draft, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, h = draft.config.block_size, draft.config.hidden_size
    return torch.randn(n, b, h, generator=g), torch.randint(0, 256, (n, b), generator=g)


def test_shapes(domino, tiny_target):
    hidden, preds = _inputs(domino)
    states = domino.correction_states(preds.view(1, 3, -1), tiny_target.embed_tokens)
    assert states.shape == (1, 3, 4, 16) and torch.all(states[:, :, 0] == 0)  # slot 0 is never drafted
    logits = domino.corrected_logits(hidden, states.view(3, 4, -1), tiny_target.lm_head_weight)
    assert logits.shape == (3, 4, 272)
    assert domino.joint_head(tiny_target.lm_head_weight).shape == (272, 64 + 8)
    tokens, probs = domino.decode(hidden[:, 1:], preds[:, 0], tiny_target.embed_tokens, tiny_target.lm_head_weight)
    assert tokens.shape == (3, 3) and probs.shape == (3, 3, 272)


def test_a_fresh_domino_draft_computes_its_dflash_backbone(tiny_hf, tiny_target):
    draft = make_draft(tiny_hf, "domino")
    hidden, preds = _inputs(draft)
    states = draft.correction_states(preds, tiny_target.embed_tokens)
    torch.testing.assert_close(draft.corrected_logits(hidden, states, tiny_target.lm_head_weight),
                               draft.draft_logits(hidden, tiny_target.lm_head_weight))


def test_slot_k_depends_only_on_its_hidden_and_the_predecessors_up_to_it(domino, tiny_target):
    hidden, preds = _inputs(domino)
    embed, head = tiny_target.embed_tokens, tiny_target.lm_head_weight

    def logits(h, p):
        return domino.corrected_logits(h, domino.correction_states(p, embed), head)

    base = logits(hidden, preds)
    for k in range(1, 4):
        for j in range(4):
            moved_pred, moved_hidden = preds.clone(), hidden.clone()
            moved_pred[:, j] = (moved_pred[:, j] + 17) % 256
            moved_hidden[:, j] += 1.0
            by_pred, by_hidden = logits(hidden, moved_pred)[:, k], logits(moved_hidden, preds)[:, k]
            # Slot k reads slot k's predecessor (the token at k-1) and those before it, never later ones;
            # slot 0's predecessor is never read (the anchor is slot 1's).
            assert torch.equal(by_pred, base[:, k]) == (j > k or j == 0), (k, j)
            assert torch.equal(by_hidden, base[:, k]) == (j != k), (k, j)


def test_teacher_forcing_equals_serial_decoding_on_the_decoded_tokens(domino, tiny_target):
    hidden, preds = _inputs(domino)
    seen = []

    def pick(slot_logits):
        seen.append(slot_logits)
        return slot_logits.argmax(-1), torch.softmax(slot_logits, -1)

    tokens, _ = domino.decode(hidden[:, 1:], preds[:, 0], tiny_target.embed_tokens, tiny_target.lm_head_weight, pick)
    anchor = preds[:, :1]  # slot 1's predecessor; slot 0's entry is never read
    teacher = torch.cat([anchor, anchor, tokens[:, :-1]], dim=1)  # slot k >= 2: the token decoded at k-1
    states = domino.correction_states(teacher, tiny_target.embed_tokens)
    forced = domino.corrected_logits(hidden, states, tiny_target.lm_head_weight)[:, 1:]
    torch.testing.assert_close(forced, torch.stack(seen, 1), rtol=1e-5, atol=1e-5)
    assert torch.equal(forced.argmax(-1), tokens)


def _naive_domino_loss(draft, target, batch, cfg, blocks):
    """Each block alone through the backbone, its correction teacher-forced on the true tokens."""
    total, weight = 0.0, 0.0
    for row, j, hidden in _each_block(draft, target, batch, blocks):
        states = draft.correction_states(blocks.predecessors[row, j][None], target.embed_tokens)
        logits = draft.corrected_logits(hidden, states, target.lm_head_weight)[0]  # [B, V]
        for k in range(1, draft.config.block_size):
            if blocks.label_mask[row, j, k]:
                w = float(torch.exp(-blocks.slot_weights_offset[row, j, k].clamp(min=0).float() / cfg.gamma))
                ce = torch.nn.functional.cross_entropy(logits[k], blocks.labels[row, j, k])
                total, weight = total + w * ce, weight + w
    return total / weight


@pytest.mark.parametrize("chunk", [None, 7])
def test_training_step_is_the_block_ce_of_the_corrected_logits(domino, tiny_target, chunk):
    cfg = LoopConfig(num_anchors=5, gamma=4.0, loss_chunk_size=chunk)
    batch = _batch()
    blocks = draw_blocks(batch, cfg, domino.config.block_size, MASK_ID, torch.Generator().manual_seed(3))
    result = train_step(domino, tiny_target, batch, cfg, torch.Generator().manual_seed(3))
    torch.testing.assert_close(result.loss, _naive_domino_loss(domino, tiny_target, batch, cfg, blocks), rtol=1e-5, atol=1e-5)
    result.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in domino.correction.parameters())
    assert "correction_base_correct" in result.sums


def test_config_refuses_a_reduced_vocabulary_and_empty_sizes(tiny_hf):
    with pytest.raises(ConfigError, match="draft_vocab_size=32 with draft.kind=domino.*full vocabulary"):
        make_draft(tiny_hf, "domino", draft_vocab_size=32)
    with pytest.raises(ConfigError, match="correction_rank=0"):
        make_draft(tiny_hf, "domino", correction_rank=0)
    cfg = resolve_draft_config(DraftConfig(kind="domino", mask_token_id=MASK_ID, target_layer_ids=[1, 3]), tiny_hf.config)
    assert (cfg.correction_hidden_size, cfg.correction_rank) == (64, 256)  # min(hidden, 1024)


def test_engine_is_lossless_greedy(domino, tiny_target):
    engine = SpeculativeEngine(tiny_target, domino)
    prompt = [5, 6, 7, 8, 9]
    result = engine.generate(prompt, 16)
    assert result.tokens == engine.target_generate(prompt, 16).tokens and result.stats.num_drafts > 0


def test_export_is_marked_not_vllm_servable_and_preflight_sends_it_to_the_reference_engine(tmp_path):
    _, draft = make_run(tmp_path / "run", "domino")
    out = export_draft(tmp_path / "run", tmp_path / "out", dtype="float32")  # includes the reload check
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DominoDraftModel"] and config["vllm_servable"] is False
    assert "vLLM has no Domino drafter" in config["serving_note"]
    assert "Not servable by vLLM" in (out / "README.md").read_text()
    reloaded, cfg = import_draft(out)
    assert cfg.kind == "domino" and cfg.correction_hidden_size == draft.config.correction_hidden_size
    probe = make_probe(cfg, seed=3)
    torch.testing.assert_close(run_probe(reloaded, probe), run_probe(draft, probe), rtol=0, atol=1e-6)

    # Declared as DFlash, the head would be silently dropped: refused, naming it.
    written = (out / "config.json").read_text()
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["DFlashDraftModel"]}))
    with pytest.raises(ContractError, match="declares a DFlash draft, but the weights carry Domino correction tensors"):
        import_draft(out)
    (out / "config.json").write_text(written)

    facts = read_draft(out)
    assert (facts.kind, facts.vllm_servable) == ("domino", False)
    for info in (CPU_VLLM, GPU_VLLM):
        engine, notes = choose_engine(facts, info, None, "auto")
        assert engine == "reference" and "vLLM has no Domino drafter" in notes[0]
        with pytest.raises(ConfigError, match="engine=vllm: vLLM has no Domino drafter.*engine=auto or engine=reference"):
            choose_engine(facts, info, None, "vllm")
    # The whole plan, as the harness makes it, on a GPU vLLM that serves DFlash and DFlash2.
    target = save_tiny_target(tmp_path / "target")
    plan = plan_serving(ServeConfig(draft_dir=str(out), target_dir=str(target), vllm_python=sys.executable),
                        probe=lambda *_: GPU_VLLM)
    assert plan.engine == "reference" and plan.num_speculative_tokens == 3
    assert any("vLLM has no Domino drafter" in w for w in plan.warnings)



def test_sampled_decoding_returns_the_distribution_each_slot_was_drawn_from(domino, tiny_target):
    """Rejection sampling needs q_k given the tokens drafted before slot k: teacher forcing on the
    sampled tokens must give back exactly the q the serial decode reported."""
    from blockdraft.engine.sampling import SamplingParams, draw, probabilities

    hidden, preds = _inputs(domino, n=1)
    params, gen = SamplingParams(temperature=1.0, top_p=0.9), torch.Generator().manual_seed(0)

    def pick(slot_logits):
        q = probabilities(slot_logits, params)
        return draw(q, gen), q

    tokens, q = domino.decode(hidden[:, 1:], preds[:, 0], tiny_target.embed_tokens, tiny_target.lm_head_weight, pick)
    teacher = torch.cat([preds[:, :1], preds[:, :1], tokens[:, :-1]], dim=1)
    forced = domino.corrected_logits(hidden, domino.correction_states(teacher, tiny_target.embed_tokens), tiny_target.lm_head_weight)
    torch.testing.assert_close(q, probabilities(forced[:, 1:], params), rtol=1e-5, atol=1e-6)
    assert torch.all(q.gather(-1, tokens[..., None]) > 0)  # each token was drawable from its q


def test_a_checkpoint_keeps_the_head_and_resuming_with_other_head_sizes_is_refused(domino, tiny_hf, tmp_path):
    from blockdraft.models.io import load_draft, save_draft
    from blockdraft.train.checkpoint import check_same_identity

    save_draft(tmp_path / "step", domino)
    back = load_draft(tmp_path / "step")
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in domino.state_dict().items())
    other = make_draft(tiny_hf, "domino", correction_hidden_size=16, correction_rank=4).config
    with pytest.raises(ConfigError, match="correction_rank: saved 8 vs now 4"):
        check_same_identity(back.config, other, "the checkpoint")
