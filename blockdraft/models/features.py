"""Target features for a training batch, with packed rows split so no document sees another."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from blockdraft.models.target import TargetModel


@torch.no_grad()
def batch_features(target: TargetModel, batch: dict) -> torch.Tensor:
    """-> [N, T, n*H]; layers after the deepest captured one are not run."""
    return _run(target, batch, with_final=False)[0]


@torch.no_grad()
def batch_features_and_final(target: TargetModel, batch: dict) -> Tuple[torch.Tensor, torch.Tensor]:
    """-> (features [N, T, n*H], the target's final hidden states [N, T, H]): what soft labels need."""
    return _run(target, batch, with_final=True)


def _run(target: TargetModel, batch: dict, with_final: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rows holding one document go through the target as they are; packed rows are run
    document by document, since the target's causal mask alone would let a document attend
    to the one packed before it."""

    def forward(ids, mask):
        if with_final:
            return target.capture_with_final(ids, attention_mask=mask)
        return target.capture(ids, attention_mask=mask), None

    docs = batch["document_ids"]
    if int(docs.max()) <= 0:
        return forward(batch["input_ids"], batch["attention_mask"].long())
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
    outputs = [o for o in forward(ids, mask) if o is not None]  # [D, Lmax, *] each
    placed = []
    for piece_out in outputs:
        out = torch.zeros(n, t, piece_out.shape[-1], dtype=piece_out.dtype, device=piece_out.device)
        for i, (row, s, e) in enumerate(pieces):
            out[row, s:e] = piece_out[i, : e - s]
        placed.append(out)
    return placed[0], (placed[1] if with_final else None)
