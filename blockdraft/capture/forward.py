"""One target forward over right-padded rows, turned into the rows a store shard keeps."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from blockdraft.data.feature_store import STORAGE_DTYPES
from blockdraft.errors import DataError


@dataclass
class RowForward:
    target: object
    """The loaded TargetModel (its captured layers, and its head where soft labels are kept)."""
    device: torch.device
    dtype: torch.dtype
    """The compute dtype (identity.capture_compute_dtype): bfloat16 runs under autocast."""
    teacher_top_k: int
    """The target's best tokens kept per position (0: no soft labels)."""
    storage_dtype: str

    def autocast(self):
        if self.dtype == torch.bfloat16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def rows(self, items: list, batch: dict, wheres: list) -> list:
        """One forward over right-padded rows; each row keeps only its own positions."""
        from blockdraft.models.features import batch_features, batch_features_and_final

        device_batch = {k: v.to(self.device) for k, v in batch.items()}
        with self.autocast():
            if self.teacher_top_k:
                features, final = batch_features_and_final(self.target, device_batch)
            else:
                features, final = batch_features(self.target, device_batch), None
        return [self._row(r, item, where, batch, device_batch, features, final)
                for r, (item, where) in enumerate(zip(items, wheres))]

    def stand_in(self, token_id: int) -> None:
        """A forward of one token whose output is dropped: what a rank with no row left runs while a target
        loaded by shard still needs it in every forward's all-gathers (the same kind of forward as the rows')."""
        from blockdraft.models.features import batch_features, batch_features_and_final

        one = torch.tensor([[token_id]], device=self.device)
        batch = {"input_ids": one, "attention_mask": torch.ones_like(one), "document_ids": torch.zeros_like(one)}
        with self.autocast():
            (batch_features_and_final if self.teacher_top_k else batch_features)(self.target, batch)

    def _row(self, r: int, item: dict, where: str, batch: dict, device_batch: dict, features, final) -> dict:
        from blockdraft.models.teacher import teacher_topk_rows

        n = len(item["input_ids"])
        teacher = {}
        if final is not None:
            with self.autocast():
                ids, logits = teacher_topk_rows(final[r, :n], device_batch["loss_mask"][r, :n], self.target.lm_head_weight,
                                                self.teacher_top_k)
            teacher = {"teacher_ids": ids, "teacher_logits": logits}
        row_features = features[r, :n].float().cpu()  # [n, L*H_t]
        self._check_range(row_features, where)
        return {
            "input_ids": batch["input_ids"][r, :n], "loss_mask": batch["loss_mask"][r, :n],
            "position_ids": batch["position_ids"][r, :n], "document_lengths": item["document_lengths"],
            "prompt_hashes": item["prompt_hashes"], "features": row_features, **teacher,
        }

    def _check_range(self, row_features: torch.Tensor, where: str) -> None:
        limit = torch.finfo(STORAGE_DTYPES[self.storage_dtype]).max
        peak = float(row_features.abs().max()) if row_features.numel() else 0.0
        if peak > limit:
            raise DataError(
                f"{where}: a target feature reaches {peak:.4g}, "
                f"beyond {self.storage_dtype}'s range; capture with storage_dtype=bfloat16 or float32."
            )
