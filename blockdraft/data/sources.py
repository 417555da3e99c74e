"""Where chat rows come from, named by one string (`data.train`, `data.val`, regeneration's
`prompts`, capture's input):

  rows.jsonl                    a JSONL file, one row per line
  <folder>                      a folder written by `datasets`' `save_to_disk` (of a DatasetDict, its `train`)
  rows.parquet | <folder>       a parquet file, or a folder of them
  rows.arrow | <folder>         an arrow file as `datasets` writes them, or a folder of them
  owner/name[:config][@split]   a Hugging Face hub dataset (split `train` unless given)

Hub datasets load through `datasets`, which honours HF_HUB_OFFLINE. blockdraft sets it to 1 unless the
environment says otherwise (blockdraft/__init__.py): an id that is not in the local cache is refused when
the config is checked, before any model loads; HF_HUB_OFFLINE=0 lets it download.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from blockdraft.errors import ConfigError, DataError

FILE_KINDS = {".parquet": "parquet", ".arrow": "arrow"}
_HUB_ID = re.compile(r"^(?P<name>[A-Za-z0-9][\w.-]*(?:/[\w.-]+)?)(?::(?P<config>[\w.-]+))?(?:@(?P<split>[\w.%:\[\]+-]+))?$")
_PATH_LIKE = (".jsonl", ".json", ".parquet", ".arrow")


@dataclass(frozen=True)
class RowSource:
    spec: str
    kind: str  # jsonl | disk | parquet | arrow | hub
    files: tuple = ()  # parquet / arrow: the files, sorted
    name: Optional[str] = None  # hub only
    config: Optional[str] = None
    split: str = "train"

    @property
    def unit(self) -> str:
        """What a rejection report counts: lines of a JSONL file, rows of anything else."""
        return "line" if self.kind == "jsonl" else "row"


def parse_source(spec: str, key: str = "data.train") -> RowSource:
    """What `spec` names; a path that does not exist, or a string that is neither, is refused."""
    path = Path(str(spec)).expanduser()
    if path.is_dir():
        return _folder_source(str(spec), path, key)
    if path.is_file():
        kind = FILE_KINDS.get(path.suffix.lower(), "jsonl")
        return RowSource(str(spec), kind, (str(path),) if kind != "jsonl" else ())
    match = _HUB_ID.match(str(spec))
    looks_like_path = str(spec).startswith(("/", ".", "~")) or str(spec).lower().endswith(_PATH_LIKE)
    if match is None or looks_like_path:
        raise ConfigError(
            f"{key}={spec!r} does not exist; point it at a JSONL, parquet or arrow file, a folder written by "
            "datasets.save_to_disk, or a Hugging Face dataset id (owner/name[:config][@split])"
        )
    return RowSource(str(spec), "hub", name=match["name"], config=match["config"], split=match["split"] or "train")


def _folder_source(spec: str, path: Path, key: str) -> RowSource:
    if any((path / marker).is_file() for marker in ("dataset_info.json", "dataset_dict.json", "state.json")):
        return RowSource(spec, "disk")
    for suffix, kind in FILE_KINDS.items():
        files = sorted(str(p) for p in path.rglob(f"*{suffix}"))
        if files:
            return RowSource(spec, kind, tuple(files))
    raise ConfigError(
        f"{key}={spec!r} is a folder, but neither one written by datasets.save_to_disk nor one holding "
        "parquet or arrow files; point it at such a folder or at a file"
    )


def check_source(spec: str, key: str) -> RowSource:
    """Parse `spec` and, for a hub id, make sure it can be loaded now (cheap: no rows are read)."""
    source = parse_source(spec, key)
    if source.kind == "hub":
        _hub_builder(source, key)
    return source


def _hub_builder(source: RowSource, key: str) -> Any:
    import datasets

    try:
        return datasets.load_dataset_builder(source.name, source.config)
    except ConnectionError as err:
        raise ConfigError(_unreachable(source, key, err)) from None
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"{key}={source.spec!r}: `datasets` cannot load {source.name!r}: {err}") from None


def _unreachable(source: RowSource, key: str, err: Exception) -> str:
    import os

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return (
            f"{key}={source.spec!r}: the dataset {source.name!r} is not in the local Hugging Face cache, and "
            "blockdraft downloads nothing unless told to (HF_HUB_OFFLINE=1, its default). Run again with "
            "HF_HUB_OFFLINE=0 in the environment to let `datasets` download it once into that cache, or point "
            f"{key} at local files (JSONL, parquet, arrow, or a save_to_disk folder)."
        )
    return f"{key}={source.spec!r}: the hub could not be reached for {source.name!r} ({err}); check the network or the id."


def load_rows(source: RowSource) -> Any:
    """The `datasets.Dataset` of a non-JSONL source."""
    import datasets

    if source.kind == "disk":
        return _train_split(datasets.load_from_disk(source.spec), source.spec)
    if source.kind in ("parquet", "arrow"):
        return datasets.load_dataset(source.kind, data_files=list(source.files), split="train")
    return _load_hub(source)


@lru_cache(maxsize=8)
def _load_hub(source: RowSource) -> Any:
    # Cached: the tokenisation cache's key reads its fingerprint, then the rows are iterated.
    import datasets

    try:
        return datasets.load_dataset(source.name, source.config, split=source.split)
    except ConnectionError as err:
        raise DataError(_unreachable(source, "data", err)) from None
    except ValueError as err:  # an unknown split names the ones there are
        raise DataError(f"{source.spec}: {err}") from None


def _train_split(loaded: Any, spec: str) -> Any:
    import datasets

    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DataError(
                f"{spec} holds splits {sorted(loaded)} but no `train`; "
                f"save the split to use on its own, e.g. dataset[{sorted(loaded)[0]!r}].save_to_disk(...)"
            )
        return loaded["train"]
    return loaded
