"""Draft kinds: one folder per kind (its model, its checks, its export mapping, its registry entry) and the
registry every stage asks (registry.py). Adding a kind: docs/adding-a-kind.md."""

from blockdraft.kinds.registry import all_kinds, get, kind_names, register
from blockdraft.kinds.spec import KindSpec

__all__ = ["KindSpec", "all_kinds", "get", "kind_names", "register"]
