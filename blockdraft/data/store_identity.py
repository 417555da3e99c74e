"""What a feature store was captured from, and the check that a training run wants the same.

The identity is written by the capture and compared, leaf by leaf, by a later capture into
the same directory (a store never mixes rows of two settings) and by training (a run
whose target, layers or tokenisation differ from the store's would train on features
serving never produces).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import List, Optional, Sequence

from blockdraft.data.config import DataConfig
from blockdraft.data.dataset import source_fingerprint, tokenizer_fingerprint
from blockdraft.data.feature_store import FeatureStore, identity_differences
from blockdraft.errors import ConfigError

# What training must match; storage settings (dtype, shard size) only change how it is kept.
TRAINING_KEYS = ("target", "target_layer_ids", "tokenization")


def target_identity(target_path, target_config) -> dict:
    path = Path(target_path).expanduser().resolve()
    config_file = path / "config.json"
    return {
        "path": str(path),
        "config_sha256": hashlib.sha256(config_file.read_bytes()).hexdigest(),
        "vocab_size": int(target_config.vocab_size),
        "hidden_size": int(target_config.hidden_size),
        "num_layers": int(target_config.num_hidden_layers),
    }


def tokenization_identity(tokenizer, data: DataConfig) -> dict:
    """Every setting that changes the tokenised rows (as the tokenisation cache keys them)."""
    return {
        "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
        "seq_length": data.seq_length,
        "overlong": data.overlong,
        "packing": data.packing,
        "strict": data.strict,
        "max_rows": data.max_rows,
        "chat_template_kwargs": dict(data.chat_template_kwargs),
    }


def store_identity(target_path, target_config, layer_ids: Sequence[int], tokenizer, data: DataConfig,
                   storage_dtype: str, rows_per_shard: int, teacher_top_k: int = 0) -> dict:
    identity = {
        "target": target_identity(target_path, target_config),
        "target_layer_ids": [int(i) for i in layer_ids],
        "feature_width": len(layer_ids) * int(target_config.hidden_size),
        "tokenization": tokenization_identity(tokenizer, data),
        "storage_dtype": storage_dtype,
        "rows_per_shard": rows_per_shard,
    }
    if teacher_top_k:  # absent from stores without soft labels, so those stay what they were
        identity["teacher_top_k"] = int(teacher_top_k)
    return identity


def check_store_teacher(store: FeatureStore, kl_weight: float, teacher_top_k: Optional[int]) -> None:
    """Soft labels from a store need the target's top-k, kept at capture for at least k tokens (the full
    distribution, teacher_top_k null, takes whatever top-k the store kept)."""
    kept = int(store.identity.get("teacher_top_k", 0))
    if kl_weight > 0 and kept < (teacher_top_k or 1):
        have = f"kept the target's top {kept}" if kept else "kept no soft labels"
        raise ConfigError(
            f"train.kl_weight={kl_weight} with train.teacher_top_k={teacher_top_k}, but the feature store {store.root} {have}. "
            f"Capture it with the same overrides (train.kl_weight>0 train.teacher_top_k={teacher_top_k}) into a new out=, "
            + (f"or set train.teacher_top_k<={kept}." if kept else "or set train.kl_weight=0.")
        )


def split_source(path) -> dict:
    return {"path": str(Path(path).expanduser().resolve()), "sha256": source_fingerprint(path)}


def check_store_for_training(store: FeatureStore, target_path, target_config, layer_ids: Sequence[int],
                             tokenizer, data: DataConfig) -> None:
    """Refuse, naming every mismatch, a store that is not what this run would capture online."""
    wanted = {
        "target": target_identity(target_path, target_config),
        "target_layer_ids": [int(i) for i in layer_ids],
        "tokenization": tokenization_identity(tokenizer, data),
    }
    stored = {k: store.identity.get(k) for k in TRAINING_KEYS}
    stored_rows = _pop_max_rows(stored)
    diffs = _rows_differences(stored_rows, _pop_max_rows(wanted)) + identity_differences(stored, wanted)
    diffs += _source_differences(store, data)
    if diffs:
        raise ConfigError(
            f"data.features={store.root} was captured with other settings than this run:\n  " + "\n  ".join(diffs)
            + "\nSet the keys above to the store's values, or capture a new store with this run's overrides "
            "(`python -m blockdraft.capture <the same overrides> out=<dir>`)."
        )


def _pop_max_rows(identity: dict) -> Optional[int]:
    """data.max_rows out of a copy of the tokenisation: it is compared by _rows_differences instead."""
    tokenization = dict(identity.get("tokenization") or {})
    rows = tokenization.pop("max_rows", None)
    identity["tokenization"] = tokenization
    return rows


def _rows_differences(stored: Optional[int], wanted: Optional[int]) -> List[str]:
    """A run may read the first N rows of a store that holds more: the store keeps a source's rows in
    its order, so they are the N rows the run would read online (training takes them with max_rows)."""
    if stored is None or (wanted is not None and wanted <= stored):
        return []
    return [f"data.max_rows: the store holds the first {stored} rows, this run asks for "
            f"{wanted if wanted is not None else 'every row (null)'}"]


def _source_differences(store: FeatureStore, data: DataConfig) -> List[str]:
    """Rows named by data.train / data.val that exist but are not the rows the store holds."""
    out = []
    for split in ("train", "val"):
        path: Optional[str] = getattr(data, split)
        if not path or not Path(path).expanduser().exists() or not store.has_split(split):
            continue
        if store.split(split)["source"]["sha256"] != source_fingerprint(path):
            out.append(f"data.{split}: {path} holds other rows than the store's {split} split "
                       f"(captured from {store.split(split)['source']['path']})")
    return out
