"""The meaning of each schema key: the string literal right after its field in the class source.

Read with `ast` rather than copied into a table, so `--help` says what the schema says and cannot drift.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import lru_cache
from typing import Dict


@lru_cache(maxsize=None)
def field_docs(cls: type) -> Dict[str, str]:
    """{field name: its attribute docstring, on one line} over the class and its bases (a subclass's wins)."""
    docs: Dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # a class built at run time has no source to read
            continue
        body = ast.parse(source).body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs
