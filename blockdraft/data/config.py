"""Schema of the `data` config group: where the chat rows come from and how they are cut."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from blockdraft.data.sources import check_source
from blockdraft.errors import ConfigError

OVERLONG_CHOICES = ("truncate", "drop")


@dataclass
class DataConfig:
    """Training and validation chat rows, and how they become token ids and a loss mask."""

    train: Optional[str] = None
    """Training rows (`messages` or `conversations` each): a JSONL file, a `save_to_disk` folder, parquet or
    arrow files, or a Hugging Face dataset id `owner/name[:config][@split]` (see blockdraft.data.sources)."""
    val: Optional[str] = None
    """Validation rows, same formats as `train`; null skips validation."""
    seq_length: int = 512
    """Most tokens in one row (a packed row included); longer conversations follow `overlong`."""
    overlong: str = "truncate"
    """What to do with a conversation over `seq_length`: `truncate` keeps its head, `drop` skips it."""
    strict: bool = False
    """Stop at the first unreadable line instead of counting and skipping it."""
    packing: bool = False
    """Pack several conversations into one row up to `seq_length`; positions restart per conversation."""
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra chat template variables, e.g. `{enable_thinking: false}`; use what serving will use."""
    cache_dir: Optional[str] = None
    """Where tokenised rows are kept, as one memory-mapped token file per dataset that every rank maps; null
    means $BLOCKDRAFT_CACHE_DIR/tokenized (blockdraft.cache_paths). Give every node the same folder (the pipeline
    uses <out>/tokenized) so the rows are tokenised once, not once per node."""
    tokenize_workers: Optional[int] = None
    """Processes that tokenise rows into the token file, in order; null means min(8, the CPUs this process may
    use), 1 tokenises in the process itself."""
    max_rows: Optional[int] = None
    """Train on the first N training rows of each file (after rows set aside, and after packing): the rows
    a feature store of the file holds first, so a run reads the same rows online and from a store."""
    features: Optional[str] = None
    """A feature store (`python -m blockdraft.capture ... out=<dir>`) to train from instead of
    running the target: its rows and target features replace data.train / data.val."""

    def resolved_cache_dir(self) -> Path:
        """The cache folder this config points at, with the environment default applied."""
        from blockdraft.cache_paths import token_files_dir

        return Path(self.cache_dir).expanduser() if self.cache_dir else token_files_dir()

    def check_max_rows(self) -> None:
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(
                f"data.max_rows={self.max_rows!r} must be 1 or more; set null to read every row"
            )

    def validate(self, require_train: bool = True) -> None:
        """Cheap checks that catch a typo before any tokenisation starts."""
        if require_train and not self.train:
            raise ConfigError("data.train is not set; set data.train=/path/to/train.jsonl")
        for key in ("train", "val"):
            spec = getattr(self, key)
            if spec:
                check_source(str(spec), f"data.{key}")
        if not isinstance(self.seq_length, int) or self.seq_length < 2:
            raise ConfigError(
                f"data.seq_length={self.seq_length!r} is too small; a row needs at least "
                "2 tokens (one to read, one to predict): set it to 2 or more"
            )
        if self.overlong not in OVERLONG_CHOICES:
            raise ConfigError(
                f"data.overlong={self.overlong!r} is not one of {', '.join(OVERLONG_CHOICES)}; "
                "pick `truncate` to keep the head of a long conversation or `drop` to skip it"
            )
        self.check_max_rows()
        if self.tokenize_workers is not None and (not isinstance(self.tokenize_workers, int) or self.tokenize_workers < 1):
            raise ConfigError(
                f"data.tokenize_workers={self.tokenize_workers!r} must be 1 or more; set null for min(8, the CPUs)"
            )
        if not isinstance(self.chat_template_kwargs, dict):
            raise ConfigError(
                f"data.chat_template_kwargs={self.chat_template_kwargs!r} is not a mapping; "
                "write it as {enable_thinking: false}"
            )


def as_data_config(cfg: Any) -> DataConfig:
    """A `DataConfig` from itself, an OmegaConf node of the `data` group, or a plain mapping."""
    if isinstance(cfg, DataConfig):
        return cfg
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
    except ImportError:
        pass
    try:
        return DataConfig(**dict(cfg))
    except TypeError as e:
        raise ConfigError(f"the data config does not fit the `data` schema ({e}); check its keys") from None
