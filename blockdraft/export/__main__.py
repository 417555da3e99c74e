"""Export a checkpoint for vLLM, or describe a draft directory.

    python -m blockdraft.export checkpoint=<run or step dir> out=<dir> [dtype=float32|bfloat16] [target=<HF dir>]
    python -m blockdraft.export inspect=<dir>

`target=` is an alias of `target_dir=` (see ExportConfig.target_dir).

Errors a user can cause print their message (no traceback) and exit with status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import hydra
from omegaconf import OmegaConf

from blockdraft import faults
from blockdraft.config import CONFIG_DIR, register_schema
from blockdraft.config.app_help import AppHelp, exit_if_help_asked
from blockdraft.draft_format.contract import ContractError
from blockdraft.draft_format.importer import read_config
from blockdraft.draft_format.speculators import is_speculators_config, verifier_path
from blockdraft.errors import ConfigError, DataError
from blockdraft.export.config import ExportConfig
from blockdraft.export.inspect import describe
from blockdraft.export.source import resolve_checkpoint
from blockdraft.export.speculators_serving import vllm_reading_notes
from blockdraft.export.writer import ExportCheckError, export_draft, is_other_stacks_draft
from blockdraft.out_lock import beside, hold_out_lock

register_schema("export_schema", ExportConfig)

USER_ERRORS = (ConfigError, DataError, ContractError, ExportCheckError)

HELP = AppHelp(
    app="export", module="blockdraft.export", schema=ExportConfig,
    usage="checkpoint=<run or step dir> out=<dir> [target=<HF dir>] [key=value ...]   |   inspect=<dir>",
    example="checkpoint=runs/try out=exports/try dtype=float32",
    notes=("target=<dir> is target_dir=<dir>; `blockdraft inspect <dir>` is inspect=<dir>.",),
)


def run(cfg: ExportConfig) -> str:
    """What the command prints; separate from the Hydra entry so tests call it with a composed config."""
    if cfg.inspect and not cfg.checkpoint:
        return describe(cfg.inspect)
    cfg.check_export_keys()
    # One export per out (blockdraft/out_lock.py): a second one is refused here, before it reads the checkpoint.
    # The lock lies beside out, <out>.lock (as the staging directory <out>.tmp does): out is replaced by a rename.
    with hold_out_lock(cfg.out, "export", lock_path=beside(cfg.out), remedy=EXPORT_REMEDY):
        faults.point("export.after_lock")
        target = cfg.target_dir or training_target(cfg.checkpoint)
        out = export_draft(cfg.checkpoint, cfg.out, cfg.dtype, target, cfg.overwrite, cfg.shard_size_bytes)
    checked = f"checked against the target {target}" if target else "no target checks (pass target=<HF dir>)"
    return f"exported to {out} ({checked})\n{describe(out)}{speculators_source_lines(cfg.checkpoint)}"


# What a second export to the same out is told to do (the holder's pid and host filled in).
EXPORT_REMEDY = ("Wait for that export to end (it replaces out only once its export has passed its checks), or stop it "
                 "(kill {pid} on {host}) and rerun the same command; for another export use another out=")


def speculators_source_lines(checkpoint: str) -> str:
    """For a speculators checkpoint: where vLLM, given its own config.json, would serve it otherwise than this export."""
    if not is_other_stacks_draft(Path(checkpoint)):
        return ""
    config = read_config(Path(checkpoint))
    notes = vllm_reading_notes(config) if is_speculators_config(config) else []
    if not notes:
        return ""
    return ("\n  vLLM on the speculators checkpoint's own config.json (each note says what this export does):\n"
            + "\n".join(f"    - {note}" for note in notes))


def training_target(checkpoint: str) -> Optional[str]:
    """The checkpoint's training target.path (speculators': its verifier), when that directory is here to check against."""
    if is_other_stacks_draft(Path(checkpoint)):
        path = verifier_path(read_config(Path(checkpoint)))
    else:
        path = resolve_checkpoint(checkpoint).target_path
    if path and (Path(path) / "config.json").is_file():
        return path
    if path:
        print(
            f"note: the training target.path={path} is not here; the target checks are skipped. "
            "Pass target=<HF dir> to run them.",
            file=sys.stderr,
        )
    return None


@hydra.main(config_path=str(CONFIG_DIR), config_name="export", version_base=None)
def main(conf) -> None:
    cfg: ExportConfig = OmegaConf.to_object(conf)
    try:
        print(run(cfg))
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def alias_target_argument(argv: List[str]) -> List[str]:
    """`target=<dir>` -> `target_dir=<dir>`: `target` is a config group in configs/, so Hydra
    would take the path for a group choice and fail."""
    return ["target_dir=" + a[len("target="):] if a.startswith("target=") else a for a in argv]


if __name__ == "__main__":
    exit_if_help_asked(HELP)
    sys.argv = alias_target_argument(sys.argv)
    main()
