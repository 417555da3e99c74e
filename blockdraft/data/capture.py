"""`python -m blockdraft.data.capture <training overrides> out=<dir>`: a feature store.

Composed from the training app's groups, so `experiment=`, `target.path=`, `data.*` and
`draft.target_layer_ids=` mean what they mean for training: the rows are tokenised by the
same code (and the same cache), the target runs once per row through the same capture,
and each shard holds exactly the tensor online training would feed the draft. Train from
it with `data.features=<dir>`. A killed capture resumes at its first unfinished shard.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass

import hydra
import torch
from omegaconf import MISSING, OmegaConf
from tqdm import tqdm

from blockdraft import faults
from blockdraft.config import CONFIG_DIR, register_schema
from blockdraft.config.app_help import AppHelp, exit_if_help_asked
from blockdraft.config.target_argument import rewrite_target_argument, target_argument_or_exit
from blockdraft.data.dataset import collate, prepare_dataset
from blockdraft.data.feature_store import STORAGE_DTYPES, FeatureStore, check_storage_dtype
from blockdraft.data.store_identity import split_source, store_identity
from blockdraft.errors import ConfigError, DataError
from blockdraft.models.draft_config import check_layer_ids
from blockdraft.models.resolve import resolve_layer_ids
from blockdraft.train.config import TrainAppConfig
from blockdraft.train.setup import check_target_path


@dataclass
class CaptureAppConfig(TrainAppConfig):
    """The training app's settings, plus where and how the store is written."""

    out: str = MISSING
    """The store directory (index.json + <split>/shard-*.safetensors)."""
    storage_dtype: str = "float16"
    """float16 | bfloat16 | float32 (exact: training from it equals online training to fp32 rounding)."""
    rows_per_shard: int = 256
    """Rows per shard file: the unit a killed capture redoes."""
    rows_per_forward: int = 1
    """Rows the target runs at once, right-padded (padding after a row changes none of its positions)."""
    compute_dtype: str = "train"
    """The target's matmuls: train (as training runs it, train.dtype) | float32 | bfloat16 | auto (bfloat16 on
    a GPU or on a CPU with AVX512-BF16 or AMX, float32 elsewhere). The store keeps storage_dtype either way."""


register_schema("capture_schema", CaptureAppConfig)

HELP = AppHelp(
    app="capture", module="blockdraft.data.capture", schema=CaptureAppConfig,
    usage="<training overrides: experiment=<recipe> target=<group or dir> key=value ...> out=<dir>",
    example="experiment=tiny_cpu out=runs/store  (then: blockdraft train experiment=tiny_cpu data.features=runs/store)",
    notes=("The training app's keys mean what they mean for training; the capture's own keys are the top-level ones after run_dir.",
           "target=<dir> captures a local Hugging Face directory (target.path=<dir>, no tiny target)."),
    rewrite=rewrite_target_argument,
)


COMPUTE_DTYPES = ("train", "float32", "bfloat16", "auto")


def check_capture_options(cfg: CaptureAppConfig) -> None:
    """The capture's own keys: what a pipeline checks before its first stage too."""
    check_storage_dtype(cfg.storage_dtype)
    if cfg.rows_per_shard < 1:
        raise ConfigError(f"rows_per_shard={cfg.rows_per_shard}: use 1 or more rows per shard.")
    if cfg.rows_per_forward < 1:
        raise ConfigError(f"rows_per_forward={cfg.rows_per_forward}: run 1 or more rows per target forward.")
    if cfg.compute_dtype not in COMPUTE_DTYPES:
        raise ConfigError(f"compute_dtype={cfg.compute_dtype!r}; use one of {list(COMPUTE_DTYPES)}.")


def check_capture_config(cfg: CaptureAppConfig) -> None:
    check_capture_options(cfg)
    if cfg.data.features:
        raise ConfigError("data.features is set: a capture writes a store (out=), it does not read one; drop data.features.")
    check_target_path(cfg.target)
    if cfg.prepare.regenerate_builtin is None:
        cfg.data.validate(require_train=True)


def store_teacher_top_k(kl_weight: float, teacher_top_k) -> int:
    """How many of the target's best tokens the store keeps per position: the run's top-k; for a run on
    the full distribution (teacher_top_k null), STORE_FULL_TOP_K, said once, since a store keeps no
    [tokens, vocab] table; 0 without soft labels."""
    if kl_weight <= 0:
        return 0
    if teacher_top_k:
        return teacher_top_k
    print(f"[capture] train.teacher_top_k=null asks for the target's full distribution, which a feature store "
          f"does not keep: keeping its top {STORE_FULL_TOP_K} (training from this store renormalises over them; "
          "train online, without data.features, for the full distribution).", flush=True)
    return STORE_FULL_TOP_K


# The top-k a store keeps for a recipe on the full distribution (JetSpec's): the usual truncation.
STORE_FULL_TOP_K = 32


def capture_compute_dtype(cfg: CaptureAppConfig, device: torch.device) -> torch.dtype:
    from blockdraft.machine import fast_cpu_bfloat16
    from blockdraft.train.setup import resolve_dtype

    if cfg.compute_dtype == "train":
        return resolve_dtype(cfg.train.dtype, device)
    if cfg.compute_dtype == "auto":
        return torch.bfloat16 if device.type != "cpu" or fast_cpu_bfloat16() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.compute_dtype]


def capture_identity(cfg: CaptureAppConfig, target_config, layer_ids, tokenizer, teacher_top_k: int,
                     dtype: torch.dtype) -> dict:
    """The store's identity but for its rows' sources: what its content depends on. The pipeline's capture
    key is this (the sources are the regen stage's rows, which its key already covers)."""
    identity = store_identity(cfg.target.path, target_config, layer_ids, tokenizer, cfg.data,
                              cfg.storage_dtype, cfg.rows_per_shard, teacher_top_k)
    if dtype != torch.float32:  # absent from float32 captures, so the stores made before stay what they were
        identity["compute_dtype"] = str(dtype).replace("torch.", "")
    return identity


def planned_identity(cfg: CaptureAppConfig, device: torch.device) -> dict:
    """capture_identity of the store these settings would capture, without loading the target's weights."""
    from transformers import AutoTokenizer

    from blockdraft.models.target_families import load_text_config

    target_config = load_text_config(cfg.target.path)
    with contextlib.redirect_stdout(None):  # its note on a full-distribution run is the capture's to print
        top_k = store_teacher_top_k(cfg.train.kl_weight, cfg.train.teacher_top_k)
    return capture_identity(cfg, target_config, resolve_layer_ids(cfg.draft, target_config),
                            AutoTokenizer.from_pretrained(cfg.target.path), top_k, capture_compute_dtype(cfg, device))


def run_capture(cfg) -> Path:
    """Entry used by the command line and by tests with a composed config."""
    if OmegaConf.is_missing(cfg, "out"):
        raise ConfigError("out is not set: give the store's directory, e.g. out=.cache/stores/<name>.")
    schema: CaptureAppConfig = OmegaConf.to_object(cfg)
    check_capture_config(schema)
    return Capture(schema).run()


class Capture:
    def __init__(self, cfg: CaptureAppConfig):
        from transformers import AutoTokenizer

        from blockdraft.models.target_families import load_text_config
        from blockdraft.train.distributed import init_distributed

        self.cfg = cfg
        if cfg.target.tiny:
            from blockdraft.models.tiny_target import save_tiny_target

            save_tiny_target(cfg.target.path, cfg.target.tiny)
        self.device = init_distributed().device
        from blockdraft.train.setup import resolve_target_dtype

        # Both dtypes are settled (and a bf16 target under an fp32 step refused) before anything loads.
        self.dtype = capture_compute_dtype(cfg, self.device)
        self.target_dtype = resolve_target_dtype(cfg.target.dtype, self.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.target.path)
        self.target_config = load_text_config(cfg.target.path)
        self.layer_ids = resolve_layer_ids(cfg.draft, self.target_config)
        check_layer_ids(self.layer_ids, self.target_config.num_hidden_layers)
        self.target = None  # loaded only once the store's identity has been checked
        # Soft labels are kept when the run these overrides describe trains with them.
        self.teacher_top_k = store_teacher_top_k(cfg.train.kl_weight, cfg.train.teacher_top_k)

    def splits(self):
        return [(name, path) for name, path in (("train", self.cfg.data.train), ("val", self.cfg.data.val)) if path]

    def run(self) -> Path:
        cfg = self.cfg
        self._regenerate_builtin_rows()
        identity = capture_identity(cfg, self.target_config, self.layer_ids, self.tokenizer, self.teacher_top_k, self.dtype)
        identity["sources"] = {name: split_source(path) for name, path in self.splits()}
        store = FeatureStore.create_or_resume(cfg.out, identity, cfg.overwrite)
        for name, path in self.splits():
            self._capture_split(store, name, path)
        held = ", ".join(f"{n}: {s['rows']} rows, {s['tokens']} tokens" for n, s in store.splits.items())
        print(f"[capture] done: {store.root} ({held})", flush=True)
        return store.root

    # --- set-up ---------------------------------------------------------------------------
    def _regenerate_builtin_rows(self) -> None:
        """Recipes like tiny_cpu answer built-in prompts with the target first, as training does."""
        if self.cfg.prepare.regenerate_builtin is None:
            return
        from blockdraft.train.data_loading import ensure_builtin_data
        from blockdraft.train.distributed import DistInfo

        ensure_builtin_data(self.cfg, self._target().model, self.tokenizer, DistInfo(0, 1, 0, self.device))

    def _target(self):
        if self.target is None:
            from blockdraft.models.target import TargetModel

            self.target = TargetModel.load(self.cfg.target.path, self.layer_ids, self.target_dtype, self.device)
        return self.target

    def _autocast(self):
        if self.dtype == torch.bfloat16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # --- one split --------------------------------------------------------------------------
    def _capture_split(self, store: FeatureStore, name: str, path: str) -> None:
        cfg = self.cfg
        dataset, report = prepare_dataset(path, self.tokenizer, cfg.data)  # tokenised exactly as training does
        if report.total_rejected:
            print(f"[capture] data.{name}: {report.summary()}", flush=True)
        entry = store.begin_split(name, split_source(path), len(dataset), cfg.rows_per_shard, report.to_dict())
        done = store.finished_shards(name)
        if done == entry["num_shards"]:
            entry["complete"] = True
            store.write_index()
            print(f"[capture] {name}: all {done} shard(s) already captured", flush=True)
            return
        if done:
            print(f"[capture] {name}: resuming after {done} finished shard(s) of {entry['num_shards']}", flush=True)
        target = self._target()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        rps, limit = cfg.rows_per_shard, torch.finfo(STORAGE_DTYPES[cfg.storage_dtype]).max
        bar = tqdm(total=len(dataset), initial=done * rps, unit="row", desc=f"capture {name}", disable=not cfg.train.progress, dynamic_ncols=True, mininterval=1.0)
        tokens, started = 0, time.perf_counter()
        for number in range(done, entry["num_shards"]):
            rows = []
            indices = list(range(number * rps, min((number + 1) * rps, len(dataset))))
            for at in range(0, len(indices), cfg.rows_per_forward):
                chunk = indices[at:at + cfg.rows_per_forward]
                items = [{**dataset[i], "prompt_hashes": dataset.row_prompt_hashes(i)} for i in chunk]
                wheres = [f"data.{name} row from line(s) {dataset.source_lines(i)}" for i in chunk]
                rows += self._rows(target, items, collate(items, pad_id=pad), limit, wheres)
                tokens += sum(len(item["input_ids"]) for item in items)
                bar.update(len(chunk))
                bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - started):.0f}", refresh=False)
            store.write_shard(name, number, rows, STORAGE_DTYPES[cfg.storage_dtype])
            faults.point("capture.after_shard")
        bar.close()
        seconds = time.perf_counter() - started
        print(f"[capture] {name}: {tokens} tokens in {seconds:.1f} s ({tokens / max(seconds, 1e-9):.0f} tokens/s)", flush=True)

    def _rows(self, target, items: list, batch: dict, limit: float, wheres: list) -> list:
        """One forward over right-padded rows; each row keeps only its own positions."""
        from blockdraft.train.features import batch_features, batch_features_and_final
        from blockdraft.train.teacher import teacher_topk_rows

        device_batch = {k: v.to(self.device) for k, v in batch.items()}
        with self._autocast():
            if self.teacher_top_k:
                features, final = batch_features_and_final(target, device_batch)
            else:
                features, final = batch_features(target, device_batch), None
        rows = []
        for r, (item, where) in enumerate(zip(items, wheres)):
            n = len(item["input_ids"])
            teacher = {}
            if final is not None:
                with self._autocast():
                    ids, logits = teacher_topk_rows(final[r, :n], device_batch["loss_mask"][r, :n], target.lm_head_weight,
                                                    self.teacher_top_k)
                teacher = {"teacher_ids": ids, "teacher_logits": logits}
            row_features = features[r, :n].float().cpu()  # [n, L*H_t]
            peak = float(row_features.abs().max()) if row_features.numel() else 0.0
            if peak > limit:
                raise DataError(
                    f"{where}: a target feature reaches {peak:.4g}, "
                    f"beyond {self.cfg.storage_dtype}'s range; capture with storage_dtype=bfloat16 or float32."
                )
            rows.append({
                "input_ids": batch["input_ids"][r, :n], "loss_mask": batch["loss_mask"][r, :n],
                "position_ids": batch["position_ids"][r, :n], "document_lengths": item["document_lengths"],
                "prompt_hashes": item["prompt_hashes"], "features": row_features, **teacher,
            })
        return rows


@hydra.main(config_path=str(CONFIG_DIR), config_name="capture", version_base=None)
def main(cfg) -> None:
    try:
        out = run_capture(cfg)
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"[capture] train from it with data.features={out}")


if __name__ == "__main__":
    exit_if_help_asked(HELP)
    sys.argv = target_argument_or_exit(sys.argv)
    main()
