"""The training run: set up, then step / log / validate / save until max_steps."""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
from pathlib import Path
from typing import Sequence

import torch
from omegaconf import OmegaConf

from blockdraft import faults
from blockdraft.config.recipe import TrainAppConfig
from blockdraft.errors import ConfigError
from blockdraft.models import build_draft
from blockdraft.models.init_from_target import init_draft_from_safetensors, init_draft_from_target
from blockdraft.models.meta_build import build_draft_on
from blockdraft.models.resolve import resolve_draft_config
from blockdraft.models.target import TargetModel, load_causal_lm, special_token_ids
from blockdraft.models.target_families import load_text_config
from blockdraft.models.target_heads import TargetHeads
from blockdraft.ranks.distributed import (DistInfo, all_reduce_sum, all_reduce_sums, init_distributed, patient_barrier,
                                          report_failure, set_step_timeout, shutdown)
from blockdraft.regen.builtin_data import ensure_builtin_data, refuse_builtin_data_by_shard
from blockdraft.train import checkpoint as ckpt
from blockdraft.train.batch_loader import BatchLoader
from blockdraft.train.batch_order import GlobalBatches
from blockdraft.train.data_loading import load_split, load_store_split, open_training_store
from blockdraft.train.draft_vocab import choose_draft_vocab
from blockdraft.train.frozen import check_frozen, check_resume_frozen, freeze
from blockdraft.train.global_batch import given_on_command_line, resumed_grad_accum
from blockdraft.train.logger import MetricsLogger, summarize, trim_metrics
from blockdraft.train.optim import build_optimizer, build_scheduler, continue_schedule
from blockdraft.train.parallelize import (full_norm, gradient_sync, load_sharded_target, loads_by_shard, parallelize_draft,
                                          release_gathered, run_step, shard_target)
from blockdraft.train.resume_choice import agree_on_resume_checkpoint
from blockdraft.train.run_lock import RunLock
from blockdraft.train.setup import check_config, config_yaml, resolve_backend, resolve_dtype, resolve_target_dtype
from blockdraft.train.step import train_step
from blockdraft.train.step_timer import Span, step_times
from blockdraft.train.stops import NonFiniteSteps, Preempted
from blockdraft.train.time_budget import TimeBudget
from blockdraft.train.training_prompts import run_record, write_run_record


def run_training(cfg, overrides: Sequence[str] = ()) -> Path:
    """Entry used by `python -m blockdraft.train` and by tests with a composed config; `overrides`: the command
    line's words (a train.grad_accum given there is used as given on a resume, global_batch.py)."""
    schema: TrainAppConfig = OmegaConf.to_object(cfg)
    check_config(schema)
    dist = init_distributed(schema.distributed.startup_timeout_s, schema.distributed.timeout_s)
    lock = None
    try:
        lock = RunLock(schema.run_dir, schema.distributed.lease_s).acquire() if dist.is_main else None
        trainer = Trainer(schema, config_yaml(cfg), dist, given_on_command_line(overrides))
        trainer.run_lock = lock
        run_dir = trainer.fit()
    except (Preempted, NonFiniteSteps):
        raise  # decided by every rank together: each leaves with it
    except BaseException as err:
        # Whatever one rank raises (a refusal of rank 0's alone, a bad row, an OOM) every rank learns within
        # seconds, with the reason, instead of waiting in its next collective until the timeout.
        report_failure(err, dist.rank)
        raise
    finally:
        if lock is not None:
            lock.release()
    shutdown()
    return run_dir


def merge_sums(window: dict, sums: dict) -> dict:
    """A log window's sums plus one step's: a step can lack a key (no valid anchor: no gradient norm)."""
    return {k: window.get(k, 0) + sums.get(k, 0) for k in {**window, **sums}}


def claim_run_dir(run_dir: Path, overwrite: bool, resume: str = "never") -> None:
    """A fresh run never silently mixes with (or deletes) an earlier run's files."""
    old = [p for p in (run_dir / "metrics.jsonl", ckpt.checkpoints_dir(run_dir)) if p.exists()]
    if not old:
        return
    if resume == "auto" and not overwrite and not ckpt.complete_checkpoints(run_dir):
        # A run killed before its first checkpoint: starting over is how it continues, and its
        # metrics lines are of steps done again (as any resume drops the lines after its checkpoint).
        dropped = trim_metrics(run_dir, 0)
        print(f"[resume] no complete checkpoint in {run_dir}: starting at step 0; dropped {dropped} metrics line(s)", flush=True)
        return
    if not overwrite:
        raise ConfigError(
            f"run_dir {run_dir} already holds a run ({', '.join(p.name for p in old)}); continue it with "
            "resume=auto, pick another run_dir, or pass overwrite=true to delete it and start afresh."
        )
    for p in old:
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class Trainer:
    run_lock = None  # rank 0's lease on run_dir (run_training sets it), checked before each save

    def __init__(self, cfg: TrainAppConfig, cfg_yaml: str, dist: DistInfo, grad_accum_given: bool = False):
        self.cfg, self.cfg_yaml, self.dist = cfg, cfg_yaml, dist
        self.run_dir = Path(cfg.run_dir)
        self.device = dist.device
        self.backend = resolve_backend(cfg.train.attention_backend, self.device)
        self.dtype = resolve_dtype(cfg.train.dtype, self.device)
        self.target_dtype = resolve_target_dtype(cfg.target.dtype, self.dtype)
        # Fails before any loading: rank 0 chooses, every rank sees the same files, the ranks split the hashing.
        self.resume_from = agree_on_resume_checkpoint(self.run_dir, cfg.resume, dist)
        ckpt.check_resume_sharding(self.resume_from, cfg.train.draft_sharding, dist.world_size)
        self.saved_state = ckpt.load_trainer_state(self.resume_from) if self.resume_from is not None else None
        if self.saved_state is not None:
            self._keep_global_batch(grad_accum_given)
        if self.resume_from is None and dist.is_main:
            claim_run_dir(self.run_dir, cfg.overwrite, cfg.resume)
        self.stop_requested = False
        self.started = False  # no optimizer step done yet in this process: the start-up timeout holds
        self.budget = TimeBudget(cfg.train.max_minutes)  # its time spent so far comes back with a resume
        self.nonfinite_run: list = []  # (step, what, rows) of the skipped steps since the last good one
        self._build()

    # --- set-up -----------------------------------------------------------------------
    def _build(self) -> None:
        cfg = self.cfg
        if cfg.target.tiny and self.dist.is_main:
            from blockdraft.models.tiny_target import save_tiny_target

            save_tiny_target(cfg.target.path, cfg.target.tiny)
        patient_barrier("rank 0 writing the tiny target")
        self.tokenizer = _load_tokenizer(cfg.target.path)
        target_hf_cfg = load_text_config(cfg.target.path)
        # The draft is resolved (and every id checked) against the target's config before its weights load.
        self.draft_cfg = resolve_draft_config(cfg.draft, target_hf_cfg, special_token_ids(target_hf_cfg, self.tokenizer))
        check_frozen(lambda: build_draft(self.draft_cfg), cfg.train.frozen)
        store = open_training_store(cfg, target_hf_cfg, self.tokenizer, self.draft_cfg.target_layer_ids) if cfg.data.features else None
        hf_model, by_shard = None, store is None and loads_by_shard(cfg.distributed.target_sharding, self.dist)
        if by_shard:
            refuse_builtin_data_by_shard(cfg)
            # No rank ever holds the whole target: each reads its rows of each layer it keeps.
            hf_model = load_sharded_target(cfg.target.path, self.draft_cfg.target_layer_ids, cfg.train.kl_weight > 0,
                                           self.target_dtype, self.dist, cfg.distributed.target_mesh)
        elif store is None:
            hf_model = load_causal_lm(cfg.target.path, self.target_dtype, self.device)
            # Rank 0 answers a recipe's built-in prompts while the target is still whole.
            ensure_builtin_data(cfg, hf_model, self.tokenizer, self.dist)
        torch.manual_seed(cfg.seed)
        # Before sharding: it may copy target layers (a target loaded by shard gives them from its files).
        self.draft = self._initial_draft(None if by_shard else hf_model).to(self.device)
        if store is None:
            sharded = hf_model if by_shard else shard_target(hf_model, cfg.distributed.target_sharding, self.dist,
                                                                     cfg.distributed.target_mesh)
            self.target = TargetModel(sharded, self.draft_cfg.target_layer_ids)
        else:
            # From a store only the embeddings and the head are read; the decoder layers never load.
            self.target = TargetHeads.load(cfg.target.path, self.device, self.target_dtype)
        self.train_data, self.val_data = self._datasets(store)
        self.prompt_record = run_record(self.train_data, cfg.init_from) if self.dist.is_main else None
        if self.draft_cfg.draft_vocab_size and self.resume_from is None and not cfg.init_from:
            choose_draft_vocab(self.draft, self.train_data, self.target.lm_head_weight, self.tokenizer, target_hf_cfg, self.dist.is_main)
        if self.draft_cfg.train_mask_embedding and self.resume_from is None and not cfg.init_from:
            self.draft.init_mask_embedding(self.target.embed_tokens.weight, cfg.draft.mask_embedding_init)
        self.draft.activation_checkpointing = cfg.train.activation_checkpointing
        frozen = freeze(self.draft, cfg.train.frozen)
        if frozen and self.dist.is_main:
            print(f"[frozen] kept as initialised: {', '.join(frozen)}", flush=True)
        # Before the optimizer: FSDP2 replaces the draft's parameters with their shards.
        self.model = parallelize_draft(self.draft, self.dist, cfg.train.draft_sharding, self.dtype)
        self.optimizer = build_optimizer([p for p in self.draft.parameters() if p.requires_grad], cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, cfg.train.max_steps)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        order = GlobalBatches(self.train_data, cfg.train.micro_batch_size, cfg.train.grad_accum, pad, self.dist, cfg.seed)
        # Read ahead by train.loader_workers processes while the steps compute, pinned for the copy to a GPU.
        self.batches = BatchLoader(order, cfg.train.loader_workers, pin_memory=self.device.type == "cuda")
        self.step = 0
        if self.resume_from is not None:
            self._restore(self.resume_from)

    def _datasets(self, store):
        cfg, b = self.cfg, self.draft_cfg.block_size
        if store is not None:
            val = load_store_split(store, "val", b, cfg.data.max_rows) if cfg.data.val else None
            return load_store_split(store, "train", b, cfg.data.max_rows), val
        train = load_split(cfg.data.train, self.tokenizer, cfg.data, "train", self.dist, b)
        return train, (load_split(cfg.data.val, self.tokenizer, cfg.data, "val", self.dist, b) if cfg.data.val else None)

    def _initial_draft(self, hf_model):
        if self.cfg.init_from:
            from blockdraft.draft_format.importer import import_draft

            draft, imported_cfg = import_draft(self.cfg.init_from)
            ckpt.check_same_identity(imported_cfg, self.draft_cfg, f"init_from={self.cfg.init_from}")
            return draft
        # Built on the meta device and initialised on this one, as a host build would be: no host copy of it.
        draft = build_draft_on(self.draft_cfg, self.device)
        if self.cfg.init_from_target:
            # From a feature store the target's layers were never built: read the copied ones from its files.
            copied = (init_draft_from_target(draft, hf_model) if hf_model is not None
                      else init_draft_from_safetensors(draft, self.cfg.target.path))
            if self.dist.is_main:
                print(f"[init] from the target: {', '.join(copied)}", flush=True)
        return draft

    # --- checkpoints --------------------------------------------------------------------
    def _trainer_state(self) -> dict:
        return {
            "step": self.step,
            **({} if self.sharded_checkpoints else {"optimizer": self.optimizer.state_dict()}),
            "scheduler": self.scheduler.state_dict(),
            "data_position": self.batches.position,
            "torch_rng": torch.get_rng_state(),
            "world_size": self.dist.world_size,
            "train_seconds": self.budget.spent_s,
        }

    @property
    def sharded_checkpoints(self) -> bool:
        """An fsdp run's checkpoints hold every rank's shards (DCP), on any world size."""
        return self.cfg.train.draft_sharding == "fsdp"

    def _save(self, last: bool = False) -> None:
        if self.run_lock is not None:  # a run taken over while it stalled must not overwrite the new holder's saves
            self.run_lock.check_held()
        if self.sharded_checkpoints:
            release_gathered(self.model)  # the shards are what is saved, not a copy gathered by validation
            ckpt.save_sharded_checkpoint(self.run_dir, self.step, self.draft, self.optimizer, self._trainer_state(),
                                         self.cfg_yaml, self.cfg.train.keep_last, self.dist.is_main)
            if last:  # the other ranks train on while rank 0 finishes a save; the run ends once it has
                patient_barrier(f"rank 0 finishing checkpoint step_{self.step}")
            return
        if self.dist.is_main:
            ckpt.save_checkpoint(self.run_dir, self.step, self.draft, self._trainer_state(), self.cfg_yaml, self.cfg.train.keep_last)
        # However long the write and fsync take, no rank times out on it in its next step's collective.
        patient_barrier(f"rank 0 writing checkpoint step_{self.step}")

    def _keep_global_batch(self, given: bool) -> None:
        """On another world size (or micro_batch_size) the run keeps its checkpoint's global batch, grad_accum
        following, unless train.grad_accum was given (global_batch.py); the config it saves says what it ran."""
        t, saved = self.cfg.train, ckpt.checkpoint_batch(self.resume_from, self.saved_state)
        accum, line = resumed_grad_accum(saved, t.micro_batch_size, t.grad_accum, self.dist.world_size, given, self.resume_from)
        if accum != t.grad_accum:
            t.grad_accum = accum
            self.cfg_yaml = OmegaConf.to_yaml(OmegaConf.merge(OmegaConf.create(self.cfg_yaml), {"train": {"grad_accum": accum}}))
        if line and self.dist.is_main:
            print(line, flush=True)

    def _restore(self, path: Path) -> None:
        saved_cfg = OmegaConf.load(path / "config.yaml")
        ckpt.check_resume_compatible(path, self.draft_cfg, self.cfg.target.path, OmegaConf.select(saved_cfg, "target.path"))
        saved_optim = OmegaConf.select(saved_cfg, "optim.name", default="adamw")
        if saved_optim != self.cfg.optim.name:
            raise ConfigError(f"cannot resume from {path}: it was trained with optim.name={saved_optim}, this run sets "
                              f"optim.name={self.cfg.optim.name}; resume with optim.name={saved_optim}, or start a new run_dir.")
        check_resume_frozen(path, OmegaConf.select(saved_cfg, "train.frozen", default=[]), self.cfg.train.frozen)
        from blockdraft.models import sharded_io
        from blockdraft.models.io import load_draft

        sharded = sharded_io.is_sharded(path)
        if sharded:  # resharded onto this run's ranks, the optimizer's state with it
            sharded_io.read_shards(path, self.draft, self.optimizer)
        else:
            self.draft.load_state_dict(load_draft(path, verified=True).state_dict())
        # Loaded onto the CPU (load_trainer_state): a checkpoint written on a GPU resumes on a CPU-only machine too
        # (the optimizer moves its state to the parameters' device; the RNG state must be a CPU tensor).
        state, self.saved_state = self.saved_state, None
        wanted_lrs = list(self.scheduler.base_lrs)  # this run's optim.lr (and muon_lr), before the saved ones
        if not sharded:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.batches.restore(state["data_position"])
        torch.set_rng_state(state["torch_rng"])
        self.step = state["step"]
        self.budget.spent_before_s = float(state.get("train_seconds", 0.0))
        changes = continue_schedule(self.optimizer, self.scheduler, wanted_lrs, OmegaConf.select(saved_cfg, "train.max_steps"),
                                    self.cfg.train.max_steps, self.step)
        if self.dist.is_main:
            dropped = trim_metrics(self.run_dir, self.step) if self.step <= self.cfg.train.max_steps else 0
            print(f"[resume] continuing from {path} at step {self.step}"
                  + (f"; dropped {dropped} metrics line(s) written after it" if dropped else ""), flush=True)
            for change in changes:
                print(f"[resume] {change}", flush=True)

    # --- the loop -----------------------------------------------------------------------
    def fit(self) -> Path:
        cfg = self.cfg
        if self.resume_from is not None and self.step > cfg.train.max_steps:
            if self.dist.is_main:
                print(f"[resume] the run is already at step {self.step}, past train.max_steps={cfg.train.max_steps}: "
                      f"nothing to train, {self.resume_from} stays as it is. Train it longer with a larger "
                      "train.max_steps; start a new run with another run_dir (or overwrite=true).", flush=True)
            return self.run_dir
        if self.resume_from is not None and self.budget.exhausted():
            if self.dist.is_main:
                print(f"[resume] the run has spent its train.max_minutes={cfg.train.max_minutes:g} "
                      f"({self.budget.spent_s / 60:.2f} min): nothing to train, {self.resume_from} stays as it is. "
                      "Train it longer with a larger train.max_minutes (or null).", flush=True)
            return self.run_dir
        if self.resume_from is not None and self.step == cfg.train.max_steps and self.dist.is_main:
            # A run stopped between its last step and the end of its final save: that validation and save run again.
            print(f"[resume] the run is at train.max_steps={self.step}: nothing to train; its final validation and "
                  "checkpoint are written again. Train it longer with a larger train.max_steps.", flush=True)
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(self.cfg_yaml)
            write_run_record(self.run_dir, self.prompt_record, resumed=self.resume_from is not None)
        self.logger = MetricsLogger(self.run_dir, self.dist.is_main, cfg.wandb, OmegaConf.to_container(OmegaConf.create(self.cfg_yaml)),
                                    cfg.train.max_steps, self.step, cfg.train.progress)
        window, window_start = None, time.perf_counter()
        previous_handler = signal.signal(signal.SIGTERM, self._request_stop)
        try:
            return self._loop(window, window_start)
        finally:
            signal.signal(signal.SIGTERM, previous_handler)
            self.logger.close()
            self.batches.close()  # its workers and the batches they read ahead

    def _request_stop(self, *_):
        # Schedulers send SIGTERM before preempting: finish the step, save, then leave.
        self.stop_requested = True

    def _stop_agreed(self) -> bool:
        """Every rank stops at the same step if any of them was told to."""
        flag = torch.tensor([1.0 if self.stop_requested else 0.0], device=self.device)
        return bool(all_reduce_sum(flag).item() > 0)

    def _loop(self, window, window_start) -> Path:
        cfg = self.cfg
        skipped_in_window = 0
        self.budget.start()
        while self.step < cfg.train.max_steps:
            sums = self._optimizer_step()
            self.step += 1
            if not self.started:  # start-up is over: collectives now fail after distributed.timeout_s
                set_step_timeout(cfg.distributed.timeout_s)
                self.started = True
            if sums is None:
                skipped_in_window += 1
                self._note_nonfinite()
            else:
                self.nonfinite_run = []
                window = sums if window is None else merge_sums(window, sums)
            if (self.step % cfg.train.log_every == 0 or self.step == cfg.train.max_steps) and window is not None:
                self._log(window, time.perf_counter() - window_start, skipped_in_window)
                window, window_start, skipped_in_window = None, time.perf_counter(), 0
            else:
                self.logger.advance()
            if cfg.train.val_every and self.step % cfg.train.val_every == 0:
                self.validate()
            # While steps are being skipped the last good checkpoint stays the newest.
            if cfg.train.save_every and self.step % cfg.train.save_every == 0 and not self.nonfinite_run:
                self._save()
            if self._stop_agreed():
                if window is not None:  # the steps since the last line: no later run would log them
                    self._log(window, time.perf_counter() - window_start)
                self._save(last=True)
                raise Preempted(self.step, self.run_dir)
            if self._budget_spent():
                if window is not None:
                    self._log(window, time.perf_counter() - window_start, skipped_in_window)
                break
        if self.val_data is not None:
            self.validate()
        self._save(last=True)
        return self.run_dir

    def _budget_spent(self) -> bool:
        """train.max_minutes is spent and this is a checkpoint step: every rank agrees, and the stop is recorded."""
        save_every = self.cfg.train.save_every
        if self.cfg.train.max_minutes is None or (save_every and self.step % save_every) or self.step >= self.cfg.train.max_steps:
            return False
        flag = torch.tensor([1.0 if self.budget.exhausted() else 0.0], device=self.device)
        if not all_reduce_sum(flag).item() > 0:
            return False
        if self.dist.is_main:
            reason = self.budget.stop_reason(self.step, self.cfg.train.max_steps)
            print(f"[train] stopping: {reason}; the final validation and checkpoint follow", flush=True)
            self.logger.log({"step": self.step, "event": "stopped", "reason": reason})
        return True

    def _autocast(self):
        if self.dtype == torch.bfloat16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _optimizer_step(self) -> dict:
        cfg = self.cfg
        self.model.train()
        totals = None
        spans = []  # each micro-step's and its target's: read at the step's end, when its results are waited for
        for micro, (batch, generator) in enumerate(self.batches.next_step()):
            # From pinned memory the copy runs while the host goes on (a CPU's tensors are already there).
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            last = micro == cfg.train.grad_accum - 1
            sync = gradient_sync(self.model, last or not self.dist.enabled)
            span = Span(self.device)
            with sync, self._autocast():
                result = run_step(self.model, train_step, self.target, batch, cfg.train, generator, self.backend)
                (result.loss / cfg.train.grad_accum).backward()
            spans.append((span.stop(), result.target_time))
            # Summed where they are (on a GPU: no wait for the micro-step's end here).
            sums = {k: v.detach().float() for k, v in result.sums.items()}
            sums["tokens"] = batch["attention_mask"].sum().float()
            totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
        # The draft's share: its forward and backward, i.e. the micro-steps less the target's capture.
        totals.update(step_times(spans))
        totals = all_reduce_sums(totals, self.device)  # one collective for every metric
        faults.point("train.after_backward")  # gradients summed, weights not yet updated
        if totals["valid_anchors"] == 0:
            # No rank had a single valid anchor: skip the update on every rank together.
            self.optimizer.zero_grad(set_to_none=True)
            return totals
        # The norm before clipping (an infinite bound clips nothing): the check below needs it either way.
        grad_norm = full_norm(torch.nn.utils.clip_grad_norm_(self.draft.parameters(), cfg.optim.grad_clip or float("inf"))).detach()
        problem = self._nonfinite(totals["loss_sum"], grad_norm)
        if problem:
            # Nothing of this step may reach the weights, the optimizer's moments or the schedule.
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_run.append((self.step + 1, problem, self.batches.last_step_rows))
            return None
        if cfg.optim.grad_clip:
            totals["grad_norm"] = grad_norm.cpu()
            totals["grad_norm_steps"] = torch.tensor(1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return totals

    def _nonfinite(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> str:
        """What was not finite in this step ('' if nothing), decided the same on every rank: the loss is
        already summed over ranks, and each rank's verdict on its own gradients is summed too."""
        local = torch.tensor([0.0 if torch.isfinite(grad_norm) else 1.0], device=self.device)
        grads_bad = bool(all_reduce_sum(local).item() > 0)
        loss_bad = not bool(torch.isfinite(loss_sum))
        return " and ".join(what for what, bad in (("loss", loss_bad), ("gradient norm", grads_bad)) if bad)

    def _note_nonfinite(self) -> None:
        step, what, rows = self.nonfinite_run[-1]
        limit = self.cfg.train.max_nonfinite_steps
        if self.dist.is_main:
            print(f"[train] step {step}: non-finite {what} (rows {rows}); skipped, nothing applied "
                  f"({len(self.nonfinite_run)} in a row, the run stops at {limit})", flush=True)
            self.logger.log({"step": step, "event": "nonfinite_step_skipped", "nonfinite": what, "rows": rows,
                             "in_a_row": len(self.nonfinite_run)})
        if len(self.nonfinite_run) >= limit:
            raise NonFiniteSteps(step, self.nonfinite_run)

    def _log(self, window: dict, seconds: float, skipped: int = 0) -> None:
        steps = self.cfg.train.log_every if self.step % self.cfg.train.log_every == 0 else self.step % self.cfg.train.log_every
        world = self.dist.world_size
        record = {"step": self.step, **summarize(window), "lr": self.scheduler.get_last_lr()[0],
                  "tokens_per_s": float(window["tokens"]) / seconds, "step_time_s": seconds / steps,
                  # Time shares are per rank (sums over ranks / world size) against this rank's wall time.
                  "share_target": float(window["time_target_s"]) / world / seconds,
                  "share_draft": float(window["time_draft_s"]) / world / seconds}
        record["share_other"] = 1.0 - record["share_target"] - record["share_draft"]
        if float(window.get("grad_norm_steps", 0)) > 0:  # steps without a valid anchor took no gradient
            record["grad_norm"] = float(window["grad_norm"] / window["grad_norm_steps"])
        if skipped:
            record["skipped_nonfinite_steps"] = skipped
        if self.device.type == "cuda":
            record["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        else:
            import resource

            record["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        self.logger.log(record, advance=1)

    @torch.no_grad()
    def validate(self) -> dict:
        from blockdraft.train.validation import evaluate

        record = evaluate(self, self.val_data)
        self.logger.log({"step": self.step, "split": "val", **record})
        return record
