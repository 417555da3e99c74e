"""The plugin's lines in vLLM's log.

vLLM's server loads general plugins while it builds its argument parser, before it configures
its logging, so an INFO line logged there would be dropped. Such a line is held and logged
with the next one, or when the draft's config is read (hook.py), by which time vLLM's handler
is in place.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm.blockdraft_vllm_plugin")  # a child of vLLM's logger: same log, same format
_held: list = []


def info(message: str, *args) -> None:
    _held.append((message, args))
    flush()


def flush() -> None:
    if logger.isEnabledFor(logging.INFO):
        while _held:
            message, args = _held.pop(0)
            logger.info(message, *args)
