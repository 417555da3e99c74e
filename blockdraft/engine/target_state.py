"""The target's side of reference decoding: what it has read so far, and how it forgets the
drafted tokens it rejected.

An attention-only target keeps a KV cache and crops it to the accepted prefix. A target with
recurrent layers (Mamba, linear attention) cannot rewind their state to an earlier token, so
it re-reads the whole kept sequence at every step instead: slower (quadratic in the length),
and exactly what a fresh pass over the accepted tokens computes.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from blockdraft.models.target import TargetModel


class TargetState:
    def __init__(self, target: TargetModel):
        self.target = target
        self.recurrent = target.family.recurrent
        self.cache = None if self.recurrent else DynamicCache()
        self.kept = torch.empty(1, 0, dtype=torch.long)  # recurrent only: the tokens read so far
        self._read = self.kept

    def run(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple:
        """(logits, features) of `ids` at `positions`, read after everything kept so far."""
        if not self.recurrent:
            return self.target.forward(ids, self.cache, positions)
        # The whole sequence from position 0: `positions` are the tail of these.
        self._read = torch.cat([self.kept, ids], 1)
        logits, features = self.target.forward(self._read, None, torch.arange(self._read.shape[1])[None])
        return logits[:, -ids.shape[1] :], features[:, -ids.shape[1] :]

    def keep(self, length: int) -> None:
        """Forget every token read past the first `length`."""
        if self.recurrent:
            self.kept = self._read[:, :length]
            return
        # A negative crop removes that many tokens in every transformers release we support.
        surplus = self.cache.get_seq_length() - length
        if surplus > 0:
            self.cache.crop(-surplus)
