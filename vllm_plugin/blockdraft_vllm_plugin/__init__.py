"""A vLLM general plugin: serve DFlash / DFlash2 / DSpark drafts saved by other training stacks unchanged.

Those stacks write `architectures: ["Qwen3DFlashDraftModel"]` / `["Qwen3DFlash2DraftModel"]` /
`["Qwen3DSparkDraftModel"]`; vLLM knows only DFlashDraftModel / DFlash2DraftModel /
Qwen3DSparkModel. `register` (the entry point vLLM calls in each of its processes) adds the
aliases vLLM lacks, pointing at vLLM's own classes, and makes a loaded draft config carry the
registry name (hook.py says why both are needed).
"""

from __future__ import annotations

from blockdraft_vllm_plugin import announce, hook
from blockdraft_vllm_plugin.aliases import ALIASES, register_aliases, registrable

_registered = False  # vLLM loads plugins once per process; a direct second call is a no-op too


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from vllm.model_executor.models import ModelRegistry

    hooked = hook.install()
    # Without the rename a DFlash2 or DSpark alias must stay unknown to vLLM: resolved to the right
    # class but selected by name as plain DFlash (or a DeepSeek-V4 DSpark draft), it would draft
    # wrongly or fail to load.
    aliases = registrable(ALIASES, hooked)
    try:
        added, present, missing = register_aliases(ModelRegistry, aliases)
    except (AttributeError, TypeError, ValueError) as err:  # a registry of another shape: vLLM must still start
        announce.logger.warning("blockdraft_vllm_plugin: could not register %s in this vLLM's registry (%s: %s)",
                                list(aliases), type(err).__name__, err)
        return
    announce.info("blockdraft_vllm_plugin: %s", summary(added, present, missing, hooked))


def summary(added, present, missing, hooked: bool) -> str:
    parts = []
    if added:
        parts.append("registered " + ", ".join(f"{a} -> {ALIASES[a]}" for a in added) + " (vLLM's own classes)")
    if present:
        parts.append("the registry already had " + ", ".join(present) + " (left as they are)")
    if missing:
        parts.append("not registered (this vLLM has no " + ", ".join(ALIASES[a] for a in missing) + ")")
    parts.append(f"draft configs naming them are read as the registry names ({hook.HOOKED} hooked)"
                 if hooked else f"no {hook.HOOKED} here: draft configs are not renamed")
    return "; ".join(parts)
