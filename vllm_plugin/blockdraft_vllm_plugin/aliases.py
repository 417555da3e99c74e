"""The training stacks' draft names, mapped onto vLLM's own DFlash and DSpark implementations.

Pure functions over a registry-like object (`.models`: name -> entry, `.register_model(name,
"module:Class" | class)`), so they run against vLLM's ModelRegistry and against a stand-in alike.
Nothing here imports vLLM.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

# alias -> the registry name vLLM serves it as. vLLM chooses its DFlash2 speculator (and the
# V2 model runner) by the literal name DFlash2DraftModel, and its Qwen3 DSpark path by the literal
# Qwen3DSparkModel (config/speculative.py: any other DSpark name is taken for a DeepSeek-V4 draft),
# so such an alias must not merely resolve to the same class: the in-memory config must carry the
# registry name (see hook.py). Qwen3DSparkDraftModel is SGLang's name for a Qwen3 DSpark draft.
ALIASES: Dict[str, str] = {
    "Qwen3DFlashDraftModel": "DFlashDraftModel",
    "Qwen3DFlash2DraftModel": "DFlash2DraftModel",
    "Qwen3DSparkDraftModel": "Qwen3DSparkModel",
}
# The registry names vLLM tests for literally: an alias of one is registered only with the rename.
SELECTED_BY_NAME = ("DFlash2DraftModel", "Qwen3DSparkModel")


def registrable(aliases: Dict[str, str], renamed: bool) -> Dict[str, str]:
    """The aliases to register: all with the in-memory rename, else none vLLM would select wrongly."""
    return dict(aliases) if renamed else {a: n for a, n in aliases.items() if n not in SELECTED_BY_NAME}


def implementation(entry) -> Optional[str]:
    """"module:Class" of a registry entry: a lazy one names it, a class-backed one holds the class."""
    lazy = _lazy_reference(entry)
    if lazy:
        return lazy
    cls = getattr(entry, "model_cls", None)
    return f"{cls.__module__}:{cls.__qualname__}" if isinstance(cls, type) else None


def register_aliases(registry, aliases: Dict[str, str] = ALIASES) -> Tuple[List[str], List[str], List[str]]:
    """Add each of `aliases` vLLM lacks, pointing at vLLM's own class for its registry name.

    -> (added, already present, not addable because vLLM has no such implementation).
    An existing entry is never replaced, so a second call (vLLM loads plugins in every
    process, and a process may call this again) changes nothing.
    """
    added, present, missing = [], [], []
    for alias, name in aliases.items():
        if alias in registry.models:
            present.append(alias)
            continue
        entry = registry.models.get(name)
        target = _lazy_reference(entry) or getattr(entry, "model_cls", None)
        if target is None:
            missing.append(alias)
            continue
        registry.register_model(alias, target)
        added.append(alias)
    return added, present, missing


def _lazy_reference(entry) -> Optional[str]:
    # A lazy entry stays lazy: importing the class here could initialise CUDA in the
    # parent before vLLM forks its workers.
    module, name = getattr(entry, "module_name", None), getattr(entry, "class_name", None)
    return f"{module}:{name}" if module and name else None


def normalise_architectures(config, registry) -> Optional[Tuple[List[str], List[str]]]:
    """Rename aliases in `config.architectures` to their registry names, in memory.

    Only where the registry serves the alias with the same implementation as the name (the
    alias this plugin added, or an identical one of vLLM's); an alias vLLM implements
    differently is vLLM's to handle. -> (before, after) when something changed, else None.
    """
    before = list(getattr(config, "architectures", None) or [])
    after = [_registry_name(arch, registry) for arch in before]
    if after == before:
        return None
    config.architectures = after
    return before, after


def _registry_name(arch: str, registry) -> str:
    name = ALIASES.get(arch)
    if name is None:
        return arch
    mine, theirs = implementation(registry.models.get(arch)), implementation(registry.models.get(name))
    return name if mine is not None and mine == theirs else arch
