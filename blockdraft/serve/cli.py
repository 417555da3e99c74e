"""What the serving command lines share: the errors a user causes, argument aliases, and SIGTERM
handled as Ctrl-C (so that every vLLM server started is stopped on the way out)."""

from __future__ import annotations

from typing import Dict, List

from blockdraft.errors import ConfigError, DataError
from blockdraft.vllm_runtime.probe import ProbeError

USER_ERRORS = (ConfigError, DataError, ProbeError)
"""Refusals before launch: the message says what to fix (exit status 2)."""


def alias_arguments(argv: List[str], aliases: Dict[str, str]) -> List[str]:
    """`draft=<dir>` -> `draft_dir=<dir>` (and the like): `draft` and `target` are config groups in
    configs/, so Hydra would take the path for a group choice and fail."""
    out = []
    for arg in argv:
        for alias, key in aliases.items():
            if arg.startswith(alias):
                arg = key + arg[len(alias) :]
        out.append(arg)
    return out


def terminate_as_interrupt(_signum, _frame) -> None:
    # A plain SIGTERM would end Python without unwinding, leaving the vLLM server running;
    # as KeyboardInterrupt it goes through every `with VllmServer(...)` exit.
    raise KeyboardInterrupt
