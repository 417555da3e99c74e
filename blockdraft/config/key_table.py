"""Every key of a schema dataclass as a row (key, type, default, meaning), and those rows as help text.

Nested dataclasses become dotted keys (`train.max_steps`); a dict-typed field is one key (its entries are
free-form). The meaning is the field's attribute docstring (field_docs), the default what `values` holds:
the composed config of a Hydra app, or a settings object.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import typing
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional

from blockdraft.config.field_docs import field_docs

NO_VALUE = object()


@dataclass
class KeyRow:
    key: str
    type: str
    default: str
    meaning: str


def type_name(t: Any) -> str:
    """Types as a user writes values: `int | null`, `list[int]`, `dict`."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Union:
        named = [type_name(a) for a in args if a is not type(None)]
        return " | ".join(named + (["null"] if type(None) in args else []))
    if origin in (list, tuple):
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin is dict or t is dict:
        return "dict"
    if t is Any:
        return "any"
    return getattr(t, "__name__", str(t))


def is_dict_type(t: Any) -> bool:
    return typing.get_origin(t) is dict or t is dict or any(is_dict_type(a) for a in typing.get_args(t) if a is not type(None))


def value_text(value: Any) -> str:
    """A value as it is written on the command line (null, true, [1, 2], ???)."""
    if value is NO_VALUE:
        return "-"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def read_value(values: Any, key: str) -> Any:
    """`key` of a composed config (interpolations resolved where they can be) or of a plain object."""
    if values is None:
        return NO_VALUE
    from omegaconf import DictConfig, OmegaConf

    if isinstance(values, DictConfig):
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(values, parent_key) if parent_key else values
        if not OmegaConf.is_config(parent) or parent._get_node(leaf) is None:
            return NO_VALUE
        if OmegaConf.is_missing(parent, leaf):
            return "??? (required)"
        if OmegaConf.is_interpolation(parent, leaf):  # how it is derived says more than today's value
            return parent._get_node(leaf)._value()
        value = parent[leaf]
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    for part in key.split("."):
        values = getattr(values, part, NO_VALUE)
        if values is NO_VALUE:
            return NO_VALUE
    return values


def key_rows(schema: type, values: Any = None, prefix: str = "", only: Optional[Iterable[str]] = None) -> List[KeyRow]:
    """One row per leaf key of `schema` (recursing into dataclass fields); `only` keeps those names."""
    hints = typing.get_type_hints(schema)
    docs = field_docs(schema)
    rows = []
    for f in dataclasses.fields(schema):
        if only is not None and f.name not in only:
            continue
        t = hints.get(f.name, f.type)
        key = prefix + f.name
        if dataclasses.is_dataclass(t):
            rows += key_rows(t, values, key + ".")
            continue
        rows.append(KeyRow(key, type_name(t), value_text(read_value(values, key)), docs.get(f.name, "")))
    return rows


def render_rows(rows: List[KeyRow], width: int = 100) -> str:
    """`key: type = default` then its meaning, indented, wrapped."""
    out = []
    for row in rows:
        out.append(f"  {row.key}: {row.type} = {row.default}")
        out += textwrap.wrap(row.meaning or "(no description)", width, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(out)
