"""Write draft checkpoints with the real speculators trainer code, and their own block logits.

Run in the speculators environment, never blockdraft's (speculators pins its own transformers):

    .venv-speculators/bin/python tests/slow/speculators_drafts.py OUT_DIR

It writes OUT_DIR/verifier/ (a tiny random Qwen3 verifier), one speculators checkpoint per case
(OUT_DIR/<case>/, built exactly as speculators' trainer builds a fresh draft, then saved with its
own save_pretrained), OUT_DIR/<case>.parity.pt (the block logits speculators' own forward gives on
fixed anchors) and OUT_DIR/manifest.json. Every draft parameter that speculators initialises to an
identity or zero is randomised first, so that a wrong weight mapping on import cannot pass.
The script imports nothing from blockdraft: the test that imports these drafts compares the two.
"""

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from loguru import logger  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

import speculators.models.dflash.core as dflash_core  # noqa: E402
import speculators.models.dspark.core as dspark_core  # noqa: E402
from speculators.models.dflash import DFlashDraftModel  # noqa: E402
from speculators.models.dflash2 import DFlash2DraftModel  # noqa: E402
from speculators.models.dspark import DSparkDraftModel  # noqa: E402
from speculators.train.cli import create_transformer_layer_config  # noqa: E402
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution  # noqa: E402

HIDDEN = 64
VOCAB = 256
VERIFIER_LAYERS = 4
# speculators' layer ids index the verifier's hidden states as HF's output_hidden_states does:
# 0 is the embedding output, i the output of decoder layer i-1, VERIFIER_LAYERS the final one.
# vLLM serves aux id i from target layer i - 1, so 0 (the embeddings) is never a servable id.
TARGET_LAYER_IDS = [1, 3]
MASK_TOKEN_ID = 255
SLIDING_WINDOW = 2048  # larger than SEQ_LEN: every context token is inside the window
SEQ_LEN = 40
NARROW_WINDOW = 12  # >= the block, < the contexts of the last two anchors
ANCHORS = [1, 7, 16, 30]  # anchor + block_size <= SEQ_LEN for every case
ATTN_IMPL = "sdpa"  # checked against "eager" (an explicit additive mask) below
REDUCED_VOCAB = 128

CASES = {
    "dflash_sliding": dict(cls=DFlashDraftModel, full_attention_indices=[],
                           kwargs=dict(sliding_window_non_causal=False)),
    "dflash_mixed": dict(cls=DFlashDraftModel, full_attention_indices=[1],
                         kwargs=dict(sliding_window_non_causal=False)),
    "dflash_reduced_vocab": dict(cls=DFlashDraftModel, full_attention_indices=[],
                                 kwargs=dict(sliding_window_non_causal=False),
                                 draft_vocab_size=REDUCED_VOCAB),
    "dflash2": dict(cls=DFlash2DraftModel, full_attention_indices=[],
                    kwargs=dict(conv_kernel_size=2, conv_group_size=16, selector_rank=32,
                                selector_top_k=4)),
    "dspark": dict(cls=DSparkDraftModel, full_attention_indices=[1],
                   kwargs=dict(markov_rank=16, markov_head_type="vanilla",
                               enable_confidence_head=True, confidence_head_with_markov=True)),
    # A window narrower than the later anchors' contexts: where speculators' window rule (every slot
    # sees the context from anchor - W on) and vLLM's (slot i sees keys after anchor + i - W) part.
    "dflash_narrow_window": dict(cls=DFlashDraftModel, full_attention_indices=[1], sliding_window=NARROW_WINDOW,
                                 kwargs=dict(sliding_window_non_causal=False)),
    "dspark_bonus_anchor": dict(cls=DSparkDraftModel, full_attention_indices=[],
                                kwargs=dict(sample_from_anchor=False, sliding_window_non_causal=False,
                                            markov_rank=16, markov_head_type="vanilla",
                                            enable_confidence_head=True,
                                            confidence_head_with_markov=True)),
}


def write_verifier(path: Path) -> None:
    """A tiny random Qwen3 verifier. Its norms are randomised so that verifier_norm matters, and
    its lm_head (the full-vocabulary drafts' lm_head) is scaled up so logits are of order one and
    the DFlash2 top-k candidates are far from ties."""
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=VERIFIER_LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
        tie_word_embeddings=False, max_position_embeddings=512,
    )
    model = Qwen3ForCausalLM(config).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
        model.lm_head.weight.normal_(std=0.2)
    model.save_pretrained(path)
    # A plain weights + config save: nothing downstream reads a generation config.
    (path / "generation_config.json").unlink(missing_ok=True)


def reduced_vocab_mappings() -> tuple[torch.Tensor, torch.Tensor]:
    """t2d/d2t as the speculators trainer builds them: the most frequent target ids are kept."""
    counts = torch.randint(1, 1000, (VOCAB,))
    token_freq = {tid: int(counts[tid]) for tid in range(VOCAB)}
    d2t, t2d = build_vocab_mappings_from_distribution(
        token_freq_dict=token_freq, draft_vocab_size=REDUCED_VOCAB, target_vocab_size=VOCAB)
    return t2d, d2t


def build_draft(case: dict, verifier: Path):
    """The trainer's default draft construction path (speculators.train.cli.build_draft_model)."""
    layer_config = create_transformer_layer_config(
        str(verifier), num_layers=2, draft_arch="qwen3", hidden_act=None,
        sliding_window=case.get("sliding_window", SLIDING_WINDOW), full_attention_indices=case["full_attention_indices"])
    kwargs = dict(
        verifier_name_or_path=str(verifier), target_layer_ids=TARGET_LAYER_IDS,
        draft_vocab_size=case.get("draft_vocab_size", VOCAB), block_size=8,
        mask_token_id=MASK_TOKEN_ID, draft_attn_impl=ATTN_IMPL, **case["kwargs"])
    t2d = d2t = None
    if kwargs["draft_vocab_size"] != VOCAB:
        t2d, d2t = reduced_vocab_mappings()
    model = case["cls"].from_training_args(layer_config, t2d=t2d, d2t=d2t, **kwargs)
    return model.float().eval(), kwargs


# Verifier-owned and not saved: speculators rebuilds them from the verifier on load.
VERIFIER_OWNED = ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight")


def randomise_draft(model) -> None:
    """Move every trainable draft weight off its initial value (identity convolutions, unit norms,
    zero kernel projections...) so that a weight read from the wrong place changes the logits."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in VERIFIER_OWNED:
                continue
            if name == "lm_head.weight" and not model.use_draft_vocab:
                continue  # the full-vocabulary lm_head is the verifier's, and is not saved
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("base_kernel"):
                param.copy_(0.3 * torch.randn_like(param))
                param[:, 0] += 1.0  # near, not at, the identity convolution
            elif name == "lm_head.weight":
                # A reduced-vocab lm_head is saved in the checkpoint and read from there by
                # speculators (and by vLLM), so it is randomised too: an importer must read it.
                param.copy_(0.2 * torch.randn_like(param))
            else:
                param.copy_(0.05 * torch.randn_like(param))


def parity_inputs() -> dict:
    return dict(
        hidden_states=torch.randn(1, SEQ_LEN, len(TARGET_LAYER_IDS) * HIDDEN),
        input_ids=torch.randint(0, 250, (1, SEQ_LEN)),
        loss_mask=torch.ones(1, SEQ_LEN, dtype=torch.long),
        verifier_last_hidden_states=torch.randn(1, SEQ_LEN, HIDDEN),
        document_ids=torch.zeros(1, SEQ_LEN, dtype=torch.long),
        position_ids=torch.arange(SEQ_LEN).unsqueeze(0),
    )


@contextmanager
def fixed_anchors(anchors: torch.Tensor):
    """speculators draws anchors at random; its forward picks select_anchors up from this module."""
    original = dflash_core.select_anchors

    def select(loss_mask, num_anchors, block_size):
        assert num_anchors == anchors.numel()
        return anchors.clone(), torch.ones(num_anchors, dtype=torch.bool)

    dflash_core.select_anchors = select
    try:
        yield
    finally:
        dflash_core.select_anchors = original


def backbone(model, inputs: dict, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The normed draft hidden and the draft logits, each [A, B, ...]."""
    with torch.no_grad(), fixed_anchors(anchors):
        hidden, logits, *_ = model._backbone_forward(**inputs, max_anchors=anchors.numel())
    shape = (anchors.numel(), model.block_size, -1)
    return hidden.view(shape), logits.view(shape)


def dflash2_outputs(model, inputs: dict, anchors: torch.Tensor, hidden, logits) -> dict:
    """Serving-side selector outputs: unary top-k, then the bilinear rescoring of those ids."""
    block_indices = dflash_core.get_base_indices_for_anchored_blocks(anchors, model.block_size)
    predecessor_ids = model._predecessor_ids(inputs["input_ids"], block_indices)
    with torch.no_grad():
        candidate_ids = logits.topk(model.candidate_selector.top_k, dim=-1).indices
        scores = model.candidate_selector.score_candidates(
            logits, hidden, predecessor_ids, candidate_ids)
    return dict(predecessor_ids=predecessor_ids, candidate_ids=candidate_ids,
                selector_scores=scores)


def dspark_outputs(model, inputs: dict, anchors: torch.Tensor) -> dict:
    """Run DSparkDraftModel.forward itself and capture what it hands its loss: the logits after
    the Markov bias (teacher-forced previous tokens) and the confidence logits."""
    seen = {}

    def capture_metrics(logits, targets, confidence_logits, *args, **kwargs):
        seen.update(logits=logits, confidence_logits=confidence_logits)
        return logits.new_zeros(()), {}

    bias = model.markov_head.block_bias

    def capture_bias(*, prev_token_ids, **kwargs):
        seen["prev_token_ids"] = prev_token_ids
        return bias(prev_token_ids=prev_token_ids, **kwargs)

    original_metrics = dspark_core.compute_metrics
    dspark_core.compute_metrics = capture_metrics
    model.markov_head.block_bias = capture_bias
    try:
        with torch.no_grad(), fixed_anchors(anchors):
            model(**inputs, max_anchors=anchors.numel())
    finally:
        dspark_core.compute_metrics = original_metrics
        del model.markov_head.block_bias
    shape = (anchors.numel(), model.block_size)
    return dict(logits=seen["logits"].view(*shape, -1),
                confidence_logits=seen["confidence_logits"].view(shape),
                prev_token_ids=seen["prev_token_ids"].view(shape))


def parity(model, inputs: dict, anchors: torch.Tensor) -> dict:
    hidden, logits = backbone(model, inputs, anchors)
    out = dict(hidden_states=inputs["hidden_states"], input_ids=inputs["input_ids"],
               anchors=anchors, block_size=model.block_size, hidden=hidden, logits=logits)
    if isinstance(model, DFlash2DraftModel):
        out.update(dflash2_outputs(model, inputs, anchors, hidden, logits))
    if isinstance(model, DSparkDraftModel):
        dspark = dspark_outputs(model, inputs, anchors)
        torch.testing.assert_close(dspark["logits"] - logits,
                                   model.markov_head.block_bias(
                                       prev_token_ids=dspark["prev_token_ids"],
                                       hidden_states=hidden))
        out.update(backbone_logits=logits, **dspark)
    return out


def reload(case: dict, path: Path, attn_impl: str):
    """speculators' own loader, as its trainer resumes (--from-pretrained): the attention
    implementation is not serialised, so it is set on the config before construction;
    from_pretrained then restores embed_tokens, verifier_norm (and lm_head) from the verifier."""
    config = case["cls"].config_class.from_pretrained(path)
    config.transformer_layer_config._attn_implementation = attn_impl
    return case["cls"].from_pretrained(path, config=config).float().eval()


def self_check(case: dict, path: Path, inputs: dict, anchors: torch.Tensor, expected: dict) -> None:
    """The saved files alone reproduce the logits, the mask is honoured by sdpa, and no block
    sees its own anchor's (or any later) context position."""
    reloaded = reload(case, path, ATTN_IMPL)
    got = parity(reloaded, inputs, anchors)
    for key in ("hidden", "logits", "confidence_logits", "selector_scores", "candidate_ids"):
        if key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-6)
    _, eager_logits = backbone(reload(case, path, "eager"), inputs, anchors)
    torch.testing.assert_close(eager_logits, got.get("backbone_logits", got["logits"]),
                               rtol=1e-5, atol=1e-5)
    later = dict(inputs, hidden_states=inputs["hidden_states"].clone())
    later["hidden_states"][:, anchors[0]:] += 1.0
    _, moved = backbone(reloaded, later, anchors)
    unmoved = got.get("backbone_logits", got["logits"])
    assert torch.equal(moved[0], unmoved[0]), "block 0 saw context at or after its anchor"
    assert not torch.allclose(moved[1], unmoved[1]), "block 1 ignored its context"


def write_case(name: str, case: dict, verifier: Path, out_dir: Path, seed: int) -> dict:
    torch.manual_seed(seed)
    model, kwargs = build_draft(case, verifier)
    randomise_draft(model)
    model.save_pretrained(out_dir / name)
    inputs = parity_inputs()
    anchors = torch.tensor(ANCHORS, dtype=torch.long)
    result = parity(model, inputs, anchors)
    assert torch.isfinite(result["logits"]).all()
    torch.save(result, out_dir / f"{name}.parity.pt")
    self_check(case, out_dir / name, inputs, anchors, result)
    kwargs["verifier_name_or_path"] = "verifier"  # relative to OUT_DIR
    return dict(speculators_class=case["cls"].__name__,
                create_transformer_layer_config=dict(
                    num_layers=2, draft_arch="qwen3", hidden_act=None,
                    sliding_window=SLIDING_WINDOW,
                    full_attention_indices=case["full_attention_indices"]),
                from_training_args=kwargs,
                vocab_mappings=("build_vocab_mappings_from_distribution over random token counts"
                                if "draft_vocab_size" in case else None),
                parity_attn_implementation=ATTN_IMPL,
                parity_attn_checked_against="eager")


def main(out_dir: Path) -> None:
    # Keep the output to one line per case: speculators logs every verifier file it opens.
    logger.disable("speculators")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    verifier = out_dir / "verifier"
    write_verifier(verifier)
    manifest = {"verifier": dict(dir="verifier", cls="Qwen3ForCausalLM", hidden_size=HIDDEN,
                                 vocab_size=VOCAB, num_hidden_layers=VERIFIER_LAYERS),
                "anchors": ANCHORS, "seq_len": SEQ_LEN, "cases": {}}
    for seed, (name, case) in enumerate(CASES.items(), start=1):
        manifest["cases"][name] = write_case(name, case, verifier.resolve(), out_dir, seed)
        print(f"wrote {out_dir / name} ({case['cls'].__name__}) and {name}.parity.pt")
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: speculators_drafts.py OUT_DIR")
    main(Path(sys.argv[1]))
