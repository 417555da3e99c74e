"""Reference engine decode speed on CPU: target alone vs target + a draft that is always right.

The target is a random Qwen3 (wide enough that its forward dominates) whose weights are set so
that its greedy continuation is known; the draft's layers are silenced so that it proposes
exactly that continuation. This measures the engine's ceiling (every draft accepted) and its
overhead (a draft that is always wrong: nothing accepted). Prints a table; no figure is hard-coded.

    .venv/bin/python scripts/bench/bench_engine.py
"""

from __future__ import annotations

import time

import torch

from blockdraft.engine.decoder import SpeculativeEngine
from blockdraft.models import build_draft
from blockdraft.models.resolve import DraftConfig, resolve_draft_config
from blockdraft.models.target import TargetModel
from blockdraft.models.tiny_target import build_tiny_model
from publish import stamp

TOKENS = 96
BLOCK = 8


def predictable_target(seed=0):
    hf = build_tiny_model("qwen3", seed=seed, vocab_size=4096, num_layers=8, hidden_size=512)
    with torch.no_grad():  # embeddings dominate the residual stream; token 42 always wins
        hf.get_input_embeddings().weight[:, 0] = 5.0
        head = hf.get_output_embeddings().weight
        head[42].zero_()
        head[42, 0] = 10.0
    return hf


def draft_for(hf, right: bool):
    cfg = resolve_draft_config(DraftConfig(kind="dflash", num_layers=1, block_size=BLOCK, mask_token_id=4095, target_layer_ids=[1, 6]), hf.config)
    torch.manual_seed(1)
    draft = build_draft(cfg)
    with torch.no_grad():
        for layer in draft.layers:  # silenced layers: each slot's logits follow its embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        if not right:
            draft.norm.weight.fill_(-1.0)  # flips every logit: the target's token is never proposed
    return draft


def timed(fn):
    fn()  # warm-up
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    torch.manual_seed(0)
    hf = predictable_target()
    target = TargetModel(hf, [1, 6])
    prompt = list(range(100, 164))
    rows = []
    base, t_base = timed(lambda: SpeculativeEngine(target, draft_for(hf, True)).target_generate(prompt, TOKENS))
    rows.append(("target alone", TOKENS / t_base, None))
    for name, right in (("draft always right", True), ("draft always wrong", False)):
        engine = SpeculativeEngine(target, draft_for(hf, right))
        res, t = timed(lambda: engine.generate(prompt, TOKENS))
        assert res.tokens == base.tokens, "speculative output differs from the target's"
        rows.append((name, TOKENS / t, res.stats.mean_acceptance_length))
    print(f"reference engine, greedy, {TOKENS} tokens, K={BLOCK - 1}, torch {torch.__version__} with "
          f"{torch.get_num_threads()} threads; {stamp()}")
    print(f"{'run':<20} {'tokens/s':>9} {'accept len':>11} {'vs target':>10}")
    for name, tps, acc in rows:
        print(f"{name:<20} {tps:9.1f} {acc if acc is not None else '-':>11} {tps / rows[0][1]:9.2f}x")


if __name__ == "__main__":
    main()
