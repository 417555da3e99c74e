"""Checkpoints: `<run_dir>/checkpoints/step_<N>/` written under a temporary name, then renamed.

A checkpoint holds the draft (model.safetensors + draft_config.json, as export reads
them), the trainer state (optimizer, scheduler, RNG, data position, step), the
resolved config and the record of the prompts the run trains on (training_prompts.bin),
so a kill during a save leaves the previous checkpoint intact and `resume=auto`
continues the same run. The files, the rename and the directory are fsynced (blockdraft/durable.py): a
checkpoint listed after a power loss is whole.

A train.draft_sharding=fsdp run keeps the draft's weights and optimizer state as every rank's
shards under draft/ instead (sharded_checkpoint.py); the rest is the same, written by rank 0
once every rank has written its shards.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import List, Optional

import torch

from blockdraft.disk_full import disk_full, is_disk_full
from blockdraft import faults
from blockdraft.errors import ConfigError, DataError
from blockdraft.durable import fsync_dir, fsync_tree, replace_durably
from blockdraft.integrity import CHECKSUMS_NAME, checksum_problem, write_checksums
from blockdraft import kinds
from blockdraft.models.io import load_draft_config, save_draft, save_draft_config
from blockdraft.models import sharded_io as shards
from blockdraft.train.training_prompts import copy_run_record

STEP_DIR = re.compile(r"^step_(\d+)$")
TRAINER_STATE = "trainer_state.pt"
OLD_SUFFIX = ".old"  # a step's previous copy while it is saved again (commit)


def checkpoints_dir(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


def complete_checkpoints(run_dir) -> List[Path]:
    """Finished checkpoints, oldest first; half-written ones (still `.tmp`) never count."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and (p / TRAINER_STATE).exists()]
    return [p for _, p in sorted(found)]


def save_checkpoint(run_dir, step: int, draft, trainer_state: dict, config_yaml: str, keep_last: int) -> Path:
    root = checkpoints_dir(run_dir)
    final = root / f"step_{step}"
    tmp = root / f"step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_draft(tmp, draft)
        faults.point("checkpoint.after_weights")
        torch.save(trainer_state, tmp / TRAINER_STATE)
        (tmp / "config.yaml").write_text(config_yaml)
        copy_run_record(run_dir, tmp)  # the prompts it trained on travel with the weights, to the export
        write_checksums(tmp)
        faults.point("checkpoint.before_rename")
        commit(tmp, final)
    except OSError as err:
        if not is_disk_full(err):
            raise
        raise _save_failed(err, run_dir, tmp, final) from None
    _prune(run_dir, keep_last)
    return final


def _save_failed(err: OSError, run_dir, tmp: Path, final: Path) -> Exception:
    """A full disk mid-save: the partial copy removed (its space freed), and what is intact said."""
    shutil.rmtree(tmp, ignore_errors=True)
    kept = [p.name for p in complete_checkpoints(run_dir)]
    return disk_full(err, f"checkpoint {final}",
                     f"the partial copy was removed and the checkpoints before it are intact ({', '.join(kept) or 'none yet'})",
                     "rerun the same command with resume=auto (a lower train.keep_last keeps fewer checkpoints)")


def save_sharded_checkpoint(run_dir, step: int, draft, optimizer, trainer_state: dict, config_yaml: str, keep_last: int,
                            is_main: bool) -> Optional[Path]:
    """Every rank: its shards of the draft and optimizer state, in parallel; rank 0 then the small files, the
    checksums, the rename and the pruning while the other ranks train on. The path on rank 0, else None."""
    from blockdraft.ranks.distributed import barrier

    root = checkpoints_dir(run_dir)
    final, tmp = root / f"step_{step}", root / f"step_{step}.tmp"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()  # no rank writes into a stale step_<N>.tmp that rank 0 is still deleting
    digests = shards.gather_digests(shards.write_shards(tmp, draft, optimizer))
    faults.point("checkpoint.after_weights")
    if not is_main:
        return None
    (tmp / shards.SHARD_CHECKSUMS).write_text(json.dumps(dict(sorted(digests.items())), indent=2))
    save_draft_config(tmp, draft)
    torch.save(trainer_state, tmp / TRAINER_STATE)
    (tmp / "config.yaml").write_text(config_yaml)
    copy_run_record(run_dir, tmp)
    write_checksums(tmp)  # the small files; the shards are in shard_checksums.json, hashed by their writers
    faults.point("checkpoint.before_rename")
    commit(tmp, final)
    _prune(run_dir, keep_last)
    return final


def commit(tmp: Path, final: Path) -> None:
    """`tmp` (complete, its checksums written) becomes `final`, durably. Re-saving a step (the final save after a
    periodic one) keeps the old copy until the new one is in place: renamed aside to step_<N>.old, the new one
    renamed in, then the old one removed, so a kill at any moment leaves a complete copy of the step
    (finish_interrupted_saves puts it back)."""
    aside = final.with_name(final.name + OLD_SUFFIX)
    fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
        faults.point("checkpoint.after_set_aside")
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def finish_interrupted_saves(run_dir) -> List[str]:
    """What a kill mid-save left, made whole before a resume chooses (one process: rank 0, or the only one):
    - step_<N>.old beside step_<N>: the new copy was in place; the old one goes;
    - step_<N>.old alone: the new copy, step_<N>.tmp, is taken if its checksums verify, else the old one is put
      back;
    - step_<N>.tmp alone, complete (its checksums written and verified): a save killed before its rename; it
      counts. One that does not verify is left for the next save of that step to replace.
    Returns a line for each repair."""
    root = checkpoints_dir(run_dir)
    said = []
    if not root.is_dir():
        return said
    for aside in sorted(root.glob(f"step_*{OLD_SUFFIX}")):
        final = aside.with_name(aside.name[: -len(OLD_SUFFIX)])
        tmp = final.with_name(final.name + ".tmp")
        if (final / TRAINER_STATE).exists():
            shutil.rmtree(aside)
        elif _verifies(tmp):
            replace_durably(tmp, final)
            shutil.rmtree(aside)
            said.append(f"{final.name}: a re-save was interrupted after its new copy was complete; the new copy kept")
        else:
            shutil.rmtree(final, ignore_errors=True)
            replace_durably(aside, final)
            said.append(f"{final.name}: a re-save was interrupted before its new copy was complete; the previous copy kept")
    for tmp in sorted(root.glob("step_*.tmp")):
        final = tmp.with_name(tmp.name[: -len(".tmp")])
        if STEP_DIR.match(final.name) and not final.exists() and _verifies(tmp):
            replace_durably(tmp, final)
            said.append(f"{final.name}: a save was interrupted before its rename, complete and verified; it counts")
    return said


def _verifies(path: Path) -> bool:
    return (path / TRAINER_STATE).exists() and (path / CHECKSUMS_NAME).exists() and not checkpoint_problem(path)


def verify_checkpoint(path: Path, share: Optional[tuple] = None) -> None:
    """Raise naming the first corrupt or missing file. `share` (rank, world): the ranks of a resume split the
    hashing of the checkpoint's files between them, and every rank raises the first fault any rank found."""
    problem = checkpoint_problem(path, share)
    if share is not None and share[1] > 1:
        from blockdraft.ranks.distributed import all_gather_object, patient_barrier

        patient_barrier(f"every rank hashing its share of {path}")  # shares of one big file each: no timeout
        problem = next((p for p in all_gather_object(problem) if p), "")
    if problem:
        raise DataError(problem)


def checkpoint_problem(path: Path, share: Optional[tuple] = None) -> str:
    """This rank's share of verify_checkpoint: the first fault it finds, or ''."""
    problem = checksum_problem(path, share)
    if not problem and shards.is_sharded(path):
        problem = shards.shard_problem(path, share)
    return problem


def _prune(run_dir, keep_last: int) -> None:
    if keep_last < 1:
        return
    for old in complete_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def find_resume_checkpoint(run_dir, resume: str, share: Optional[tuple] = None) -> Optional[Path]:
    """never -> None; auto -> latest or None; must -> latest or an error; else a path; verified.
    `share`: verify_checkpoint's (a run of several ranks agrees on it first: resume_choice.py)."""
    path = choose_resume_checkpoint(run_dir, resume)
    if path is not None:
        verify_checkpoint(path, share)  # a corrupt file is named now, before the target loads
    return path


def choose_resume_checkpoint(run_dir, resume: str) -> Optional[Path]:
    """find_resume_checkpoint's choice, from this process's view of the file system, not verified."""
    if resume == "never":
        return None
    if resume in ("auto", "must"):
        for line in finish_interrupted_saves(run_dir):
            print(f"[train] {line}", flush=True)
        found = complete_checkpoints(run_dir)
        if found:
            return found[-1]
        if resume == "must":
            raise ConfigError(
                f"resume=must but {checkpoints_dir(run_dir)} holds no complete checkpoint; "
                "check run_dir, or use resume=auto to start fresh when none exists."
            )
        return None
    path = Path(resume)
    if not (path / TRAINER_STATE).exists():
        raise ConfigError(f"resume={resume!r} is not a checkpoint directory (no {TRAINER_STATE}); give a checkpoints/step_<N> path, auto, must or never.")
    return path


def check_resume_sharding(checkpoint: Optional[Path], strategy: str, world_size: int) -> None:
    """A sharded checkpoint resumes under either strategy (DCP reads it whole into a replicated draft); a
    model.safetensors one holds its optimizer state keyed for a whole draft, so not into FSDP2 shards."""
    if checkpoint is None or strategy != "fsdp" or world_size == 1 or shards.is_sharded(checkpoint):
        return
    raise ConfigError(
        f"cannot resume {checkpoint} with train.draft_sharding=fsdp on {world_size} ranks: it was written by a "
        "train.draft_sharding=ddp run (model.safetensors); resume it with train.draft_sharding=ddp, or on one "
        "process (which then writes sharded checkpoints), or start a new run_dir.")


def load_trainer_state(checkpoint: Path) -> dict:
    """The trainer state as data only: tensors, numbers, strings and containers of them. A checkpoint is
    data, not code: torch's weights_only unpickler refuses any other object (a crafted pickle included)."""
    try:
        return torch.load(checkpoint / TRAINER_STATE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ConfigError(
            f"{checkpoint / TRAINER_STATE} holds more than plain data and was not loaded "
            f"({' '.join(str(err).split())[:300]}). A trainer state holds tensors and numbers only; resume from "
            "another checkpoint (resume=<its checkpoints/step_<N> directory>) or start a new run_dir.") from None


def checkpoint_batch(checkpoint: Path, state: Optional[dict] = None):
    """The global batch's split a checkpoint was trained with: its config's micro_batch_size and grad_accum, its
    trainer state's world size. Without `state` (already loaded) the state is mapped, not read: an optimizer's
    state can be gigabytes."""
    from omegaconf import OmegaConf

    from blockdraft.train.global_batch import Batch

    if state is None:
        state = torch.load(checkpoint / TRAINER_STATE, map_location="cpu", weights_only=True, mmap=True)
    saved = OmegaConf.load(checkpoint / "config.yaml")
    return Batch(int(OmegaConf.select(saved, "train.micro_batch_size", default=1)),
                 int(OmegaConf.select(saved, "train.grad_accum", default=1)), int(state.get("world_size", 1)))


# The draft's identity: resuming with any of these changed would silently train another model.
IDENTITY_KEYS = (
    "kind", "mask_token_id", "target_layer_ids", "block_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "target_hidden_size", "num_target_layers", "draft_vocab_size", "train_mask_embedding",
)
# A kind's own settings that change nothing it is built from (the rest of KindSpec.settings are its identity).
NOT_IDENTITY = ("selector_top_k", "input_embedding_scale", "output_multiplier", "final_logit_softcapping",
                "dspark_draft_topk")


def _identity_keys(kind_names: set) -> List[str]:
    """The shared identity keys, and the settings of the two kinds compared. Another kind's settings build nothing
    there, and its export does not carry them (a DFlash export has no conv_group_size, so its import holds the
    dataclass default)."""
    own = [key for spec in kinds.all_kinds() if spec.name in kind_names for key in spec.settings
           if key not in NOT_IDENTITY]
    return list(IDENTITY_KEYS) + list(dict.fromkeys(own))


def identity_diffs(saved, now, ignore: tuple = ()) -> List[str]:
    saved, now = saved.to_dict(), now.to_dict()
    keys = [k for k in _identity_keys({saved.get("kind"), now.get("kind")}) if k not in ignore]
    return [f"{k}: saved {saved.get(k)!r} vs now {now.get(k)!r}" for k in keys if saved.get(k) != now.get(k)]


def check_same_identity(saved, now, source: str) -> None:
    """An imported draft (init_from) against the configured one. num_target_layers shapes no weight, and
    exports of other stacks (speculators' among them) do not record it: the importer can only infer it
    from the target layers, and the configured target's own count is checked against them already."""
    diffs = identity_diffs(saved, now, ignore=("num_target_layers",))
    if diffs:
        raise ConfigError(f"{source} holds a different draft than configured:\n  " + "\n  ".join(diffs)
                          + "\nSet the draft.* keys to match it.")


def check_resume_compatible(checkpoint: Path, draft_config, target_path: Optional[str], saved_target_path: Optional[str]) -> None:
    diffs = identity_diffs(load_draft_config(checkpoint), draft_config)
    if saved_target_path and target_path and Path(saved_target_path).resolve() != Path(target_path).resolve():
        diffs.append(f"target.path: checkpoint {saved_target_path!r} vs now {target_path!r}")
    if diffs:
        raise ConfigError(
            f"cannot resume from {checkpoint}: the run changed\n  " + "\n  ".join(diffs)
            + "\nRestore those settings, or start a new run_dir (or resume=never)."
        )
