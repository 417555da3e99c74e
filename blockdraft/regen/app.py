"""Regenerate a training set and a held-out set with the target: the `regen.yaml` app.

    python -m blockdraft.regen target=<HF dir> out=<dir> [prompts=sharegpt|tiny_prompts|<file.jsonl>]
        [num_train=1000] [num_heldout=64] [max_tokens=192] [temperature=0.0] [backend=auto|vllm|transformers]

Writes, under `out`:
  train.jsonl, heldout.jsonl   rows ordered by prompt index; the held-out prompts are a
                               disjoint range, never trained on
  parts/<split>/NNNNN.jsonl    shards written as rows finish; a rerun resumes from them
  parts/<split>/rejects.jsonl  prompts that failed every retry, with the reason; a rerun tries them again
  vllm_regen.<i>.log           each vLLM server regen started
  regen.json                   the generation settings, the servers that answered, and per split
                               rows, rejects, tokens, tokens/s and rows per server
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import List

from blockdraft import faults
from blockdraft.config import CONFIG_DIR, register_schema
from blockdraft.out_lock import hold_out_lock
from blockdraft.regen.answerers import answerers
from blockdraft.regen.config import SPLITS, RegenConfig
from blockdraft.regen.prompt_plan import PromptSplit, plan_splits
from blockdraft.errors import ConfigError, DataError

MANIFEST = "regen.json"


# --- resume bookkeeping -------------------------------------------------------------------
def read_manifest(out: Path) -> dict:
    path = out / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def check_resumable(manifest: dict, settings: dict, out: Path) -> None:
    """Rows generated with other settings must not be mixed with new ones."""
    old = manifest.get("settings")
    if old is None or old == settings:
        return
    differing = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
    raise ConfigError(
        f"out={out} holds rows generated with other settings ({', '.join(f'{k}: was {a!r}, now {b!r}' for k, (a, b) in differing.items())}); "
        "use another out=, or delete that directory to start over"
    )


def split_is_complete(manifest: dict, out: Path, name: str, split: PromptSplit) -> bool:
    record = manifest.get("splits", {}).get(name, {})
    same_prompts = record.get("prompts") == len(split.conversations) and record.get("source_positions") == [
        split.first_source_position, split.end_source_position]
    if not (record.get("complete") and same_prompts):
        return False
    problem = merged_file_problem(out / f"{name}.jsonl", record)
    if problem:  # torn by a power loss or edited: merged again from the answered parts, nothing asked twice
        print(f"[regen] {name}: {problem}; it is written again from {out / 'parts' / name}", flush=True)
    return not problem


def merged_file_problem(path: Path, record: dict) -> str:
    """'' when the split's file is the one its record describes (its sha256; a record from before digests were
    kept is checked by its row count)."""
    if not path.is_file():
        return f"{path.name} is missing"
    if record.get("sha256"):
        from blockdraft.integrity import sha256_of

        same = sha256_of(path) == record["sha256"]
        return "" if same else f"{path.name} is not the file regen wrote (its sha256 differs)"
    with open(path, "rb") as fh:
        lines = sum(1 for line in fh if line.strip())
    return "" if lines == record.get("rows") else f"{path.name} holds {lines} rows, regen wrote {record.get('rows')}"


def write_manifest(out: Path, manifest: dict) -> None:
    from blockdraft.durable import write_json

    write_json(out / MANIFEST, manifest)


# --- the run ------------------------------------------------------------------------------
def resolve_backend(cfg: RegenConfig) -> str:
    """vllm: the completions API of vLLM servers (regen's own, or endpoints); transformers: the target in-process."""
    if cfg.backend != "auto":
        return cfg.backend
    from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON

    python = Path(cfg.vllm_python) if cfg.vllm_python else DEFAULT_VLLM_PYTHON
    if python.is_file() or cfg.endpoints:
        return "vllm"
    if (cfg.servers or 1) > 1:
        raise ConfigError(f"servers={cfg.servers} needs the serving environment, and {python} does not exist: "
                          "run `make setup-serve`, or set vllm_python=")
    print(f"[regen] note: no serving environment at {python} (`make setup-serve` builds it); using the slower transformers backend")
    return "transformers"


def run_regen(cfg: RegenConfig) -> Path:
    """Generate whatever the splits still miss; returns `out`."""
    cfg.validate()
    out = Path(cfg.out)
    backend = resolve_backend(cfg)
    # One regen per out (blockdraft/out_lock.py): a second one is refused here, before it reads or writes a row.
    with hold_out_lock(out, "regen", remedy=REGEN_REMEDY):
        faults.point("regen.after_lock")
        return _regenerate(cfg, out, backend)


# What a second regen on the same out is told to do (the holder's pid and host filled in).
REGEN_REMEDY = ("Wait for that regen to end, or stop it (kill {pid} on {host}) and rerun the same command, which "
                "resumes from the rows it wrote; for other rows use another out=")


def _regenerate(cfg: RegenConfig, out: Path, backend: str) -> Path:
    from transformers import AutoTokenizer

    settings = cfg.settings(backend)
    manifest = read_manifest(out)
    check_resumable(manifest, settings, out)
    tokenizer = AutoTokenizer.from_pretrained(cfg.target_dir)
    splits = plan_splits(cfg, tokenizer)
    pending = {k: s for k, s in splits.items() if not split_is_complete(manifest, out, k, s)}
    for name in SPLITS:
        if name not in pending:
            print(f"[regen] {name}: already complete in {out / (name + '.jsonl')}; skipped")
    if pending:
        out.mkdir(parents=True, exist_ok=True)
        manifest = {"settings": settings, "splits": manifest.get("splits", {})}
        with answerers(cfg, backend, tokenizer, out) as answering:
            # Who answers, with what: the endpoints, the model names sent, each server's devices and vLLM's
            # thread binding as its log states it (what the tokens/s were measured on).
            manifest["servers"] = [a.record() for a in answering]
            for name, split in pending.items():
                forget_moved_split(manifest, out, name, split)
                manifest["splits"][name] = {**_split_record(split), "complete": False}
                write_manifest(out, manifest)
                manifest["splits"][name] = _run_split(cfg, name, split, answering, settings, out)
                write_manifest(out, manifest)
            manifest["servers"] = [a.record() for a in answering]  # the binding lines, now in the logs
        from blockdraft.machine import machine_facts

        manifest["machine"] = machine_facts()
        write_manifest(out, manifest)
        say_rejects(manifest, out)
    return out


def say_rejects(manifest: dict, out: Path) -> None:
    """Rejects leave every other row in place and the split incomplete: say where they are and that a rerun retries them."""
    for name, record in manifest["splits"].items():
        if record.get("rejects"):
            print(f"[regen] warning: {name}: {record['rejects']} prompts got no answer after every retry; their reasons "
                  f"are in {out / 'parts' / name / 'rejects.jsonl'}, and {name}.jsonl holds every other row. Rerun the "
                  "same command to try them again", file=sys.stderr)


def _split_record(split: PromptSplit) -> dict:
    return {"prompts": len(split.conversations), "source_positions": [split.first_source_position, split.end_source_position],
            "skipped_long_prompts": len(split.skipped_long)}


def forget_moved_split(manifest: dict, out: Path, name: str, split: PromptSplit) -> None:
    """Rows are resumed by their index within the split; if the split now starts at another
    prompt (the held-out range follows a grown training range), those rows answer other prompts."""
    import shutil

    record = manifest.get("splits", {}).get(name)
    if record and record.get("source_positions", [None])[0] != split.first_source_position:
        print(f"[regen] {name}: its prompts now start at position {split.first_source_position} "
              f"(was {record['source_positions'][0]}); its old rows are discarded")
        shutil.rmtree(out / "parts" / name, ignore_errors=True)
        (out / f"{name}.jsonl").unlink(missing_ok=True)


def _run_split(cfg: RegenConfig, name: str, split: PromptSplit, answering, settings: dict, out: Path) -> dict:
    from blockdraft.regen.runner import regenerate_rows
    from blockdraft.regen.shards import RejectLog, ShardedRows

    store = ShardedRows(out / "parts" / name, cfg.shard_size)
    rejects = RejectLog(store.directory)
    rejects.clear()  # this run tries them again
    stats = regenerate_rows(split.conversations, store, answering, settings, cfg.max_turns, cfg.retries,
                            cfg.retry_backoff_s, f"regenerate {name}", cfg.progress, rejects)
    rows, digest = store.merge(out / f"{name}.jsonl")
    print(f"[regen] {name}: {rows} rows in {out / (name + '.jsonl')}; this run {stats.tokens} tokens in "
          f"{stats.seconds:.0f} s ({stats.tokens_per_s:.0f} tokens/s), {stats.cut_at_max_tokens} replies cut at max_tokens"
          + (f", {stats.rejects} prompts rejected" if stats.rejects else ""))
    return {**_split_record(split), "rows": rows, "sha256": digest, "rejects": stats.rejects, "complete": stats.rejects == 0,
            "last_run": {**asdict(stats), "tokens_per_s": stats.tokens_per_s}}


# --- the Hydra entry ----------------------------------------------------------------------
register_schema("regen_schema", RegenConfig)  # at import, so tests can compose configs/regen.yaml


def alias_target_argument(argv: List[str]) -> List[str]:
    """`target=<dir>` -> `target_dir=<dir>`: `target` is a config group in configs/, so Hydra
    would take the path for a group choice and fail."""
    return ["target_dir=" + a[len("target="):] if a.startswith("target=") else a for a in argv]


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    from blockdraft.config.app_help import AppHelp, exit_if_help_asked

    exit_if_help_asked(AppHelp(
        app="regen", module="blockdraft.regen", schema=RegenConfig,
        usage="target=<HF dir> out=<dir> [prompts=sharegpt|tiny_prompts|<rows>] [key=value ...]",
        example="target=.cache/targets/smollm2-135m-instruct out=runs/regen num_train=200 num_heldout=16",
        notes=("target=<dir> is target_dir=<dir>. Writes <out>/train.jsonl, heldout.jsonl, parts/ and regen.json; "
               "a rerun resumes.",
               "servers=N starts N vLLM servers, each on its own GPUs or cores (null: one per tensor_parallel_size "
               "visible GPUs); endpoints=[http://host:port,...] adds servers that already run. Every server takes the "
               "next prompt when it is free; failed requests are retried, then recorded in parts/<split>/rejects.jsonl."),
        rewrite=alias_target_argument,
    ))
    sys.argv = alias_target_argument(sys.argv)

    @hydra.main(config_path=str(CONFIG_DIR), config_name="regen", version_base=None)
    def app(conf) -> None:
        from blockdraft.regen.vllm_backend import RegenRequestError
        from blockdraft.vllm_runtime.server import ServerError

        try:
            print(f"[regen] done: {run_regen(OmegaConf.to_object(conf))}")
        except (ConfigError, DataError, RegenRequestError, ServerError) as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("[regen] stopped; rerun the same command to resume from the rows written", file=sys.stderr)
            sys.exit(130)

    # SIGTERM (a scheduler, or the parent-death signal of a pipeline that died) unwinds as Ctrl-C does: the rows
    # written stay, regen's vLLM servers are stopped and its lock on out released, rather than left to be taken over.
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    app()


def _terminate_as_interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
