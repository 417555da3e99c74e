"""`blockdraft <command> [overrides]`: one front door to the product's apps.

Each command is the `python -m` module it names, run unchanged in this process: the same Hydra
config, `--help`, `--cfg job` and exit codes. (`torchrun -m blockdraft.train` is still the way to
start several training processes by hand; `blockdraft pipeline target=<dir> out=<dir> train.nproc=N`
does it for you.)
"""

from __future__ import annotations

import difflib
import runpy
import sys
from typing import List, Optional

from blockdraft.pipeline.settings import STAGES

# command: (module, one line of what it does)
COMMANDS = {
    "pipeline": ("blockdraft.pipeline", f"{' -> '.join(STAGES)}, each stage cached (the gate with gate=true)"),
    "regen": ("blockdraft.regen", "the target answers prompts: the training and held-out rows"),
    "capture": ("blockdraft.capture", "the target's features of the rows, once: a feature store"),
    "train": ("blockdraft.train", "train a draft (a recipe: experiment=<name>; key=value overrides)"),
    "export": ("blockdraft.export", "a checkpoint as a vLLM draft directory, reloaded and checked"),
    "inspect": ("blockdraft.export", "what an exported draft holds and what vLLM will read (blockdraft inspect <dir>)"),
    "serve": ("blockdraft.serve", "smoke-serve a draft in vLLM: lossless, draft active, acceptance, speedup"),
    "eval": ("blockdraft.eval", "acceptance and speedup of drafts per dataset, greedy and sampled"),
    "gate": ("blockdraft.gate", "the one-sample gate: does serving compute what training computed?"),
    "suggest": ("blockdraft.models.suggest", "target_layer_ids and mask-token candidates for a target"),
    "demo": ("blockdraft.demo", "the pipeline on SmolLM2-135M-Instruct, offline (what make demo runs)"),
    "doctor": ("blockdraft.doctor", "is everything the product needs on this machine? one line a check, with the fix"),
}

# The `blockdraft <command>` running in this process, for the usage line of its help: runpy replaces
# sys.argv[0] with the module's file, so the app cannot read it from there.
RUNNING: Optional[str] = None


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("blockdraft")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed: pip install -e .)"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return ("usage: blockdraft <command> [key=value ...]   (blockdraft <command> --help for its keys)\n\n"
            "commands:\n" + "\n".join(lines) + "\n\n  --version  the installed version")


def inspect_arguments(words: List[str]) -> List[str]:
    """A bare word is the directory to inspect, except the value of Hydra's `--cfg job`."""
    out = []
    for i, word in enumerate(words):
        flag_value = i > 0 and words[i - 1] in ("--cfg", "-c")
        out.append(word if "=" in word or word.startswith("-") or flag_value else f"inspect={word}")
    return out


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"blockdraft {version()}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        print(f"error: unknown command '{command}'; {hint}the commands are: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = COMMANDS[command][0]
    if command == "inspect":  # `blockdraft inspect <dir>` is the export app's inspect=<dir>
        rest = inspect_arguments(rest)
    global RUNNING
    sys.argv = [f"blockdraft {command}", *rest]
    RUNNING = f"blockdraft {command}"
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:  # the app's own exit status, as `python -m` would return it
        code = done.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    finally:
        RUNNING = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
