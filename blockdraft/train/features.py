"""Target features for a training batch, with packed rows split so no document sees another."""

from __future__ import annotations

import torch

from blockdraft.models.target import TargetModel


@torch.no_grad()
def batch_features(target: TargetModel, batch: dict) -> torch.Tensor:
    """-> [N, T, n*H]. Rows holding one document go through the target as they are; packed
    rows are run document by document, since the target's causal mask alone would let a
    document attend to the one packed before it."""
    docs = batch["document_ids"]
    if int(docs.max()) <= 0:
        return target.capture(batch["input_ids"], attention_mask=batch["attention_mask"].long())
    n, t = docs.shape
    pieces = []  # (row, start, end)
    for row in range(n):
        for d in docs[row].unique().tolist():
            if d < 0:
                continue
            idx = (docs[row] == d).nonzero().squeeze(-1)
            pieces.append((row, int(idx[0]), int(idx[-1]) + 1))
    longest = max(e - s for _, s, e in pieces)
    ids = torch.zeros(len(pieces), longest, dtype=torch.long, device=docs.device)
    mask = torch.zeros_like(ids)
    for i, (row, s, e) in enumerate(pieces):
        ids[i, : e - s] = batch["input_ids"][row, s:e]
        mask[i, : e - s] = 1
    feats = target.capture(ids, attention_mask=mask)  # [D, Lmax, F]
    out = torch.zeros(n, t, feats.shape[-1], dtype=feats.dtype, device=feats.device)
    for i, (row, s, e) in enumerate(pieces):
        out[row, s:e] = feats[i, : e - s]
    return out
