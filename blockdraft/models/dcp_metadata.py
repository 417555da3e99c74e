"""torch.distributed.checkpoint's `.metadata` vetted before DCP unpickles it.

DCP reads `.metadata` with pickle, which runs whatever a crafted file asks for; a checkpoint is data, not code
(train/checkpoint.py reads its trainer state with torch's weights_only unpickler for the same reason). So the file
is first read here with an unpickler that builds only what DCP's metadata is made of (its dataclasses, torch's
dtypes, sizes, memory formats and layouts, a path), and refused, naming what it asked for, on anything else.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch

from blockdraft.errors import DataError

# (module, name) -> allowed; a module mapped to None allows every class it defines (DCP's own metadata module).
ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout from its name
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    *(("builtins", name) for name in ("set", "frozenset", "dict", "list", "tuple", "int", "float", "bool", "str", "bytes")),
}
METADATA_MODULE = "torch.distributed.checkpoint.metadata"


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == METADATA_MODULE and isinstance(getattr(_metadata_module(), name, None), type):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format, torch.layout)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def _metadata_module():
    import torch.distributed.checkpoint.metadata as metadata

    return metadata


def check_dcp_metadata(directory: Path) -> None:
    """Raise DataError unless `<directory>/.metadata` holds only what DCP's metadata is made of."""
    path = Path(directory) / ".metadata"
    try:
        _DataOnly(io.BytesIO(path.read_bytes())).load()
    except pickle.UnpicklingError as err:
        raise DataError(f"{path} asks to build {err}, which a checkpoint's metadata never holds; it was not loaded "
                        "(unpickling it could run code). Use another checkpoint.") from None
    except (EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError) as err:
        raise DataError(f"{path} is not a readable checkpoint index ({type(err).__name__}: {err}); the checkpoint is "
                        "damaged: use another one.") from None

