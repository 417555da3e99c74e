"""The datasets a run trains on: a tokenised split, or a feature store's (the order of micro-batches:
batch_order.py; data a recipe makes for itself: regen/builtin_data.py)."""

from __future__ import annotations

from blockdraft.data.dataset import collate, dataset_key, prepare_dataset
from blockdraft.errors import ConfigError, DataError
from blockdraft.ranks.distributed import DistInfo, broadcast_object, patient_barrier
from blockdraft.train.anchors import valid_anchor_mask


def load_split(path, tokenizer, data_cfg, name: str, dist: DistInfo, block_size: int):
    """Rank 0 hashes the rows and writes the token file; then each node's first rank maps it (or, where
    data.cache_dir is node-local, writes its node's copy); then every other rank maps it. No rank loads it."""
    key, failure, dataset = None, None, None
    if dist.is_main:
        try:
            key = dataset_key(path, tokenizer, data_cfg)
            dataset, _report = prepare_dataset(path, tokenizer, data_cfg, key=key)  # logs its reject report itself
        except (ConfigError, DataError) as err:
            failure = err
    # Rank 0's key (the rows are hashed once) and its error, if any, which every rank then raises. However long
    # rank 0 hashes and tokenises, the others wait for it without a timeout while it is alive (rank_watch.py).
    patient_barrier(f"rank 0 hashing and tokenising {path}")
    key, failure = broadcast_object((key, failure))
    if failure is not None:
        raise failure
    for first_of_node in (True, False):
        if not dist.is_main and (dist.local_rank == 0) == first_of_node:
            dataset, _report = prepare_dataset(path, tokenizer, data_cfg, key=key)
        patient_barrier(f"each node's first rank mapping {path}" if first_of_node else f"every rank mapping {path}")
    _require_anchors(dataset, block_size, name, path)
    return dataset


def open_training_store(cfg, target_config, tokenizer, layer_ids):
    """The store of data.features, checked against this run before any weight loads."""
    from blockdraft.data.feature_store import FeatureStore
    from blockdraft.data.store_identity import check_store_for_training, check_store_teacher

    store = FeatureStore.open(cfg.data.features)
    check_store_for_training(store, cfg.target.path, target_config, layer_ids, tokenizer, cfg.data)
    check_store_teacher(store, cfg.train.kl_weight, cfg.train.teacher_top_k)
    if cfg.train.kl_weight > 0 and not cfg.train.teacher_top_k:
        print(f"[train] train.teacher_top_k=null asks for the target's full distribution; the feature store "
              f"{store.root} kept its top {store.identity['teacher_top_k']}: training on those, renormalised "
              "(train online, without data.features, for the full distribution).", flush=True)
    if cfg.data.val and not store.has_split("val"):
        raise ConfigError(
            f"data.val={cfg.data.val} is set but the store {store.root} holds no val split; capture one with "
            "data.val=<rows>, or set data.val=null to train without validation."
        )
    store.split("train")  # refuses a store whose train split is unfinished
    return store


def load_store_split(store, name: str, block_size: int, max_rows=None):
    from blockdraft.data.feature_store import FeatureStoreDataset

    dataset = FeatureStoreDataset(store, name, max_rows)
    _require_anchors(dataset, block_size, name, store.root)
    return dataset


def _require_anchors(dataset, block_size: int, name: str, path, sample: int = 2000) -> None:
    """Refuse data where no anchor can be drawn (no reply token followed by another): training would only skip steps."""
    for i in range(min(len(dataset), sample)):
        batch = collate([dataset[i]], pad_id=0)
        if valid_anchor_mask(batch["loss_mask"], batch["attention_mask"], batch["document_ids"], block_size).any():
            return
    raise DataError(
        f"data.{name}={path}: no row has two assistant tokens in a row, so no anchor can be drawn "
        "(a block starts on a reply token and predicts the next one). Use rows with longer replies, "
        "or a larger data.seq_length if replies are cut away."
    )
