"""Shared pieces of the CUDA tests: the marker that skips them without a GPU, and packed batches.

`scripts/gpu_check.sh` runs `pytest -m cuda` on a GPU machine; on a CPU they are collected and
skipped, so `make test` keeps them importable.
"""

import pytest
import torch

needs_cuda = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh runs these)"),
]


def packed_batch(n=2, t=96, seed=0, device="cuda", vocab=256):
    """Rows as training sees them: row 0 packs two documents, row 1 is padded at its end; the loss
    covers each document's second half (its reply)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, t), generator=g)
    doc = torch.zeros(n, t, dtype=torch.long)
    doc[0, t // 2:] = 1
    doc[1, t - t // 5:] = -1
    attention = doc >= 0
    position = torch.arange(t).expand(n, -1).clone()
    position[0, t // 2:] -= t // 2
    loss = torch.zeros(n, t, dtype=torch.bool)
    loss[0, t // 4: t // 2] = True
    loss[0, 3 * t // 4:] = True
    loss[1, t // 3:] = True
    loss &= attention
    batch = {"input_ids": ids, "loss_mask": loss, "attention_mask": attention,
             "position_ids": torch.where(attention, position, 0), "document_ids": doc}
    return {k: v.to(device) for k, v in batch.items()}


def grads_of(module):
    return {name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None}


def assert_grads_close(got, expected, rtol, atol):
    assert got.keys() == expected.keys()
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def cosine(a: dict, b: dict) -> float:
    x = torch.cat([v.flatten().float() for v in a.values()])
    y = torch.cat([b[k].flatten().float() for k in a])
    return float(torch.nn.functional.cosine_similarity(x, y, dim=0))
