"""The kinds the pipeline knows, by name: the six built in (each registered by its folder) and any a user
registers (`register`). Lookups load the built-in kinds on first use, so this module imports nothing heavy."""

from __future__ import annotations

import importlib
from typing import Dict, Optional, Tuple

from blockdraft.errors import ConfigError
from blockdraft.kinds.spec import KindSpec

BUILTIN = ("dflash", "dflash2", "jetspec", "domino", "dspark", "lilicorr")
_KINDS: Dict[str, KindSpec] = {}
_loading = False


def _load_builtin() -> None:
    global _loading
    if _loading or all(name in _KINDS for name in BUILTIN):
        return
    _loading = True
    try:
        for name in BUILTIN:
            importlib.import_module(f"blockdraft.kinds.{name}")
    finally:
        _loading = False


def register(spec: KindSpec) -> KindSpec:
    """Add a kind. A name or an owned architecture already taken by another kind is refused."""
    known = _KINDS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"draft kind {spec.name!r} is registered already ({known.model}); pick another name.")
    for other in _KINDS.values():
        if other.name == spec.name:
            continue
        if set(architectures_read(spec)) & set(architectures_read(other)):
            raise ValueError(f"kind {spec.name!r} reads an architecture kind {other.name!r} reads already: "
                             f"{sorted(set(architectures_read(spec)) & set(architectures_read(other)))}.")
    _KINDS[spec.name] = spec
    return spec


def _in_order() -> Tuple[KindSpec, ...]:
    """The built-in kinds in BUILTIN's order (whichever module imported one first), then the registered ones."""
    _load_builtin()
    builtin = tuple(_KINDS[name] for name in BUILTIN if name in _KINDS)
    return builtin + tuple(spec for name, spec in _KINDS.items() if name not in BUILTIN)


def kind_names() -> Tuple[str, ...]:
    return tuple(spec.name for spec in _in_order())


def all_kinds() -> Tuple[KindSpec, ...]:
    return _in_order()


def get(name: str) -> KindSpec:
    """The entry of `draft.kind=name`, or a ConfigError naming the kinds there are."""
    _load_builtin()
    spec = _KINDS.get(name)
    if spec is None:
        raise ConfigError(f"draft.kind={name!r} is unknown; use one of {list(kind_names())}.")
    return spec


def architectures_read(spec: KindSpec) -> Tuple[str, ...]:
    return ((spec.architecture,) if spec.owns_architecture else ()) + tuple(spec.reads)


def architectures() -> Dict[str, str]:
    """Every architecture name read, -> its kind."""
    return {arch: spec.name for spec in all_kinds() for arch in architectures_read(spec)}


def recognized(kind: str, config) -> str:
    """The kind a config.json holds, where kinds share an architecture: the one whose `recognize` says so."""
    for spec in all_kinds():
        if spec.recognize is not None and spec.name != kind and spec.recognize(kind, config):
            return spec.name
    return kind


def causal_in_block_kind(kind: str) -> Optional[str]:
    """The kind sharing `kind`'s architecture whose slots attend causally inside the block (JetSpec for DFlash):
    what a config of that architecture, causal in every layer, holds. None where there is none."""
    architecture = get(kind).architecture
    for spec in all_kinds():
        if spec.architecture == architecture and spec.causal_in_block:
            return spec.name
    return None
