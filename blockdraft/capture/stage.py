"""The capture stage on one rank of any number: every rank loads the target (whole, or by shard with
distributed.target_sharding=fsdp, as online training loads it) and tokenises the rows, captures the shards
shard_split.py gives it, and rank 0 lists them in the index once all ranks are done (store_writer.py).
One process is the world of one. With backend=vllm one process sends the rows to vLLM servers instead
(capture/vllm_rows.py), whole shards at a time, so that every server has requests in flight.

A target loaded by shard runs every forward as a collective (each layer is all-gathered from every rank), so
every rank runs the same number of forwards: the plan is every rank's, and a rank whose shards are done runs
one-token stand-ins until the busiest rank's last forward."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import List

from tqdm import tqdm

from blockdraft import faults
from blockdraft.capture import store_writer
from blockdraft.capture.config import CaptureAppConfig
from blockdraft.capture.forward import RowForward
from blockdraft.capture.identity import capture_compute_dtype, capture_identity, store_teacher_top_k
from blockdraft.capture.shard_split import rank_shards, shard_rows
from blockdraft.data.dataset import collate, prepare_dataset
from blockdraft.data.feature_store import STORAGE_DTYPES, FeatureStore
from blockdraft.data.store_identity import split_source
from blockdraft.errors import ConfigError
from blockdraft.models.draft_config import check_layer_ids
from blockdraft.models.resolve import resolve_layer_ids
from blockdraft.models.target_checks import resolve_target_dtype
from blockdraft.models.target_sharding import loads_by_shard
from blockdraft.ranks.distributed import all_gather_object, broadcast_object, init_distributed, patient_barrier


def all_gather_lists(local: list) -> list:
    """Every rank's list, joined in rank order (the list itself for one process)."""
    return [x for part in all_gather_object(local) for x in part]


class CaptureStage:
    def __init__(self, cfg: CaptureAppConfig):
        from transformers import AutoTokenizer

        from blockdraft.models.target_families import load_text_config

        self.cfg = cfg
        self.dist = init_distributed(cfg.distributed.startup_timeout_s, cfg.distributed.timeout_s,
                                     use_gpu=cfg.backend != "vllm")  # with vllm the servers take the GPUs
        if cfg.target.tiny and self.dist.is_main:
            from blockdraft.models.tiny_target import save_tiny_target

            save_tiny_target(cfg.target.path, cfg.target.tiny)
        patient_barrier("rank 0 writing the tiny target")
        # Both dtypes are settled (and a bf16 target under an fp32 step refused) before anything loads.
        self.dtype = capture_compute_dtype(cfg, self._engine_device())
        self.target_dtype = resolve_target_dtype(cfg.target.dtype, self.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.target.path)
        self.target_config = load_text_config(cfg.target.path)
        self.layer_ids = resolve_layer_ids(cfg.draft, self.target_config)
        check_layer_ids(self.layer_ids, self.target_config.num_hidden_layers)
        self.target = None  # loaded only once the store's identity has been checked
        self.engine = contextlib.ExitStack()  # backend=vllm: the servers and their client, started at the first shard
        self.vllm_rows = None
        self.by_shard = loads_by_shard(cfg.distributed.target_sharding, self.dist)
        # Soft labels are kept when the run these overrides describe trains with them.
        with contextlib.nullcontext() if self.dist.is_main else contextlib.redirect_stdout(None):  # said once
            self.teacher_top_k = store_teacher_top_k(cfg.train.kl_weight, cfg.train.teacher_top_k)

    def say(self, text: str) -> None:
        if self.dist.is_main:
            print(f"[capture] {text}", flush=True)

    def splits(self):
        return [(name, path) for name, path in (("train", self.cfg.data.train), ("val", self.cfg.data.val)) if path]

    def run(self) -> Path:
        self._regenerate_builtin_rows()
        identity = capture_identity(self.cfg, self.target_config, self.layer_ids, self.tokenizer, self.teacher_top_k, self.dtype)
        identity["sources"] = {name: split_source(path) for name, path in self.splits()}
        store = self._open_store(identity)
        with self.engine:
            for name, path in self.splits():
                store = self._capture_split(store, name, path)
        held = ", ".join(f"{n}: {s['rows']} rows, {s['tokens']} tokens" for n, s in store.splits.items())
        self.say(f"done: {store.root} ({held})")
        return store.root

    # --- set-up ---------------------------------------------------------------------------
    def _regenerate_builtin_rows(self) -> None:
        """Recipes like tiny_cpu answer built-in prompts with the target first, as training does."""
        if self.cfg.prepare.regenerate_builtin is None:
            return
        from blockdraft.regen.builtin_data import ensure_builtin_data, refuse_builtin_data_by_shard

        if self.by_shard:  # answering needs the whole target, which no rank loads: refused unless already answered
            refuse_builtin_data_by_shard(self.cfg)
            return

        ensure_builtin_data(self.cfg, self._target().model, self.tokenizer, self.dist)

    def _open_store(self, identity: dict) -> FeatureStore:
        """Rank 0 creates or resumes the store; its refusal is every rank's, so none waits on it."""
        store, refusal = None, None
        if self.dist.is_main:
            try:
                store = store_writer.create_or_resume(self.cfg.out, identity, self.cfg.overwrite)
            except ConfigError as err:
                refusal = str(err)
        refusal = broadcast_object(refusal)
        if refusal is not None:
            raise ConfigError(refusal)
        return store or FeatureStore.open(self.cfg.out, key="out")

    def _engine_device(self):
        import torch

        if self.cfg.backend == "vllm":
            from blockdraft.capture.vllm_servers import default_device

            return torch.device(default_device())
        return self.dist.device

    def _vllm_rows(self):
        """The vLLM servers (started here, or the endpoints) and their client, once for every split."""
        if self.vllm_rows is None:
            from blockdraft.capture.vllm_rows import VllmRows
            from blockdraft.capture.vllm_servers import capture_servers

            v = self.cfg.vllm
            if not v.scratch_dir:  # our own: a killed capture's unread files are of no later request
                own = Path(self.cfg.out) / "vllm_scratch"
                shutil.rmtree(own, ignore_errors=True)
                self.engine.callback(_remove_if_empty, own)  # last, once the servers have stopped
            servers = self.engine.enter_context(capture_servers(
                v, self.cfg.target.path, self.layer_ids, self.teacher_top_k, self.cfg.data.seq_length + 1, self.cfg.out,
                dtype=str(self.dtype).replace("torch.", "")))
            self.vllm_rows = self.engine.enter_context(VllmRows(
                servers.urls, servers.scratch_dir, self.layer_ids, self.teacher_top_k, workers=v.workers,
                timeout_s=v.request_timeout_s, retries=v.retries, storage_dtype=self.cfg.storage_dtype))
        return self.vllm_rows

    def _target(self):
        if self.target is None:
            from blockdraft.models.target import TargetModel

            if self.by_shard:
                from blockdraft.models.target_sharding import load_sharded_target

                # No rank holds the whole target: each reads its rows of each layer up to the deepest captured
                # one (every layer when soft labels need the final hidden states).
                model = load_sharded_target(self.cfg.target.path, self.layer_ids, self.teacher_top_k > 0,
                                            self.target_dtype, self.dist, self.cfg.distributed.target_mesh)
                self.target = TargetModel(model, self.layer_ids)
                self.say(f"the target loaded by shard over {self.dist.world_size} ranks "
                         f"(distributed.target_mesh={self.cfg.distributed.target_mesh})")
            else:
                self.target = TargetModel.load(self.cfg.target.path, self.layer_ids, self.target_dtype, self.dist.device)
        return self.target

    def _tokenised(self, name: str, path: str):
        """Rank 0 tokenises (and fills the cache) first; the other ranks then read the cache."""
        if not self.dist.is_main:
            patient_barrier(f"rank 0 tokenising {path}")
        dataset, report = prepare_dataset(path, self.tokenizer, self.cfg.data)  # tokenised exactly as training does
        if self.dist.is_main:
            patient_barrier(f"rank 0 tokenising {path}")
        if report.total_rejected:
            self.say(f"data.{name}: {report.summary()}")
        return dataset, report

    # --- one split --------------------------------------------------------------------------
    def _capture_split(self, store: FeatureStore, name: str, path: str) -> FeatureStore:
        cfg, world = self.cfg, self.dist.world_size
        dataset, report = self._tokenised(name, path)
        if self.dist.is_main:
            store_writer.begin_split(store, name, split_source(path), len(dataset), cfg.rows_per_shard, report.to_dict())
        patient_barrier(f"rank 0 opening split {name}")
        if not self.dist.is_main:  # the index as rank 0 left it
            store = FeatureStore.open(cfg.out, key="out")
        num_shards = store.splits[name]["num_shards"]
        done = sorted(store_writer.finished_shards(store, name))
        # Each rank hashes its share of the finished shards; a damaged one is everyone's to know of.
        damaged = set(all_gather_lists(store_writer.damaged_shards(store, name, done[self.dist.rank::world])))
        todo = [n for n in range(num_shards) if n not in done or n in damaged]
        if not todo:
            self.say(f"{name}: all {num_shards} shard(s) already captured")
        else:
            if len(todo) < num_shards:
                self.say(f"{name}: resuming after {num_shards - len(todo)} finished shard(s) of {num_shards}")
            tokens = {n: sum(len(dataset[i]["input_ids"]) for i in shard_rows(n, cfg.rows_per_shard, len(dataset)))
                      for n in todo}
            plans = [rank_shards(tokens, r, world) for r in range(world)]
            # Under a target loaded by shard, every rank runs as many forwards as the busiest.
            forwards = max(self._forwards(plan, len(dataset)) for plan in plans) if self.by_shard else 0
            self._capture_shards(store.root, dataset, name, plans[self.dist.rank], forwards)
        # A rank whose shards took longer is waited for as long as it is alive, not the process group's timeout.
        patient_barrier(f"every rank capturing its shards of {name}")
        if self.dist.is_main:
            store_writer.list_shards(store, name)
        return store

    def _forwards(self, numbers: List[int], num_rows: int) -> int:
        per = self.cfg.rows_per_forward
        return sum(-(-len(shard_rows(n, self.cfg.rows_per_shard, num_rows)) // per) for n in numbers)

    def _capture_shards(self, root: Path, dataset, name: str, numbers: List[int], forwards: int = 0) -> None:
        """This rank's shards; then, to reach `forwards` forwards in all, stand-ins (a target loaded by shard)."""
        cfg = self.cfg
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if cfg.backend == "vllm":
            # A whole shard's rows in flight at once, spread over every server's request slots.
            run, at_once = self._vllm_rows().rows, cfg.rows_per_shard
        else:
            forward = RowForward(self._target(), self.dist.device, self.dtype, self.teacher_top_k, cfg.storage_dtype)
            run, at_once = (lambda items, wheres: forward.rows(items, collate(items, pad_id=pad), wheres)), cfg.rows_per_forward
        rows_total = sum(len(shard_rows(n, cfg.rows_per_shard, len(dataset))) for n in numbers)
        bar = tqdm(total=rows_total, unit="row", desc=f"capture {name}", dynamic_ncols=True, mininterval=1.0,
                   disable=not (cfg.train.progress and self.dist.is_main))
        tokens, started = 0, time.perf_counter()
        for number in numbers:
            rows = []
            indices = list(shard_rows(number, cfg.rows_per_shard, len(dataset)))
            for at in range(0, len(indices), at_once):
                chunk = indices[at:at + at_once]
                items = [{**dataset[i], "prompt_hashes": dataset.row_prompt_hashes(i)} for i in chunk]
                wheres = [f"data.{name} row from line(s) {dataset.source_lines(i)}" for i in chunk]
                rows += run(items, wheres)
                tokens += sum(len(item["input_ids"]) for item in items)
                bar.update(len(chunk))
                bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - started):.0f}", refresh=False)
            store_writer.write_shard(root, name, number, rows, STORAGE_DTYPES[cfg.storage_dtype])
            faults.point("capture.after_shard")
        for _ in range(forwards - self._forwards(numbers, len(dataset))):
            forward.stand_in(pad)
        bar.close()
        seconds = time.perf_counter() - started
        who = f" on rank {self.dist.rank} of {self.dist.world_size}" if self.dist.enabled else ""
        print(f"[capture] {name}{who}: {len(numbers)} shard(s), {rows_total} rows, {tokens} tokens in {seconds:.1f} s "
              f"({tokens / max(seconds, 1e-9):.0f} tokens/s)", flush=True)


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):
        directory.rmdir()
