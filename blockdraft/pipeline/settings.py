"""The pipeline's command line: its own keys, and each `<stage>.<key>=value` routed to the app that owns it.

Every override is checked by composing the app that takes it, before any stage runs, so a
misspelt key is refused by name instead of failing an hour later in the stage that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from blockdraft.errors import ConfigError

# The stages in the order a pipeline runs them (app.py): the gate first, with gate=true, before any long stage.
STAGES = ("gate", "regen", "capture", "train", "export", "serve")
STORE_CHOICES = ("auto", "true", "false")
# Stage apps with their own keys (`regen.workers=8` is the regen app's `workers=8`).
APP_PREFIXES = ("regen", "capture", "export", "gate", "serve")
# torchrun's options, asked for as train.<key>: not keys of the training app.
TORCHRUN_KEYS = ("nproc", "nnodes", "node_rank", "rdzv_endpoint", "max_restarts")
# How often torchrun restarts the training group after a rank dies; each restart resumes from the last checkpoint.
MAX_RESTARTS = 3
# What the pipeline sets itself: the paths that join one stage's output to the next stage's input.
OWNED = {
    "regen": ("target", "target_dir", "out", "prompts"),
    "capture": ("out",),
    "export": ("checkpoint", "out", "target_dir", "inspect"),
    "gate": ("target", "out"),
    "serve": ("draft", "draft_dir", "target", "target_dir", "out"),
    "recipe": ("data.train", "data.features", "run_dir", "resume", "overwrite", "target.path", "target.tiny"),
}


@dataclass
class PipelineSettings:
    target: str = ""
    """The target's local Hugging Face directory."""
    out: str = ""
    """Where every artifact of the run goes: regen/, store/, run/, export/, gate/, serve/, stages.json."""
    prompts: str = "sharegpt"
    """What the target answers in the regen stage: sharegpt | tiny | a JSONL/parquet/arrow file or dataset of chat rows."""
    rows: Optional[str] = None
    """Rows the target already answered (a JSONL/parquet/arrow file, a save_to_disk folder or a dataset, as data.train
    takes): the run starts from them instead of regenerating; the regen stage is recorded as given, keyed by their content."""
    heldout_rows: Optional[str] = None
    """With rows=: the held-out rows (validation and the serve check), none of whose prompts rows= may ask; null =
    regen.num_heldout rows carved out of rows= by prompt content."""
    experiment: Optional[str] = None
    """A training recipe of configs/experiment/ (its target's draft settings included)."""
    gate: bool = False
    """Run the one-sample gate first, before regen (minutes; it proves this target and serving stack serve the draft as
    training computes it): a failing verdict stops the run before the long stages."""
    round_cost: bool = True
    """Before the long stages, measure this machine's draft-and-verify round cost with an untrained draft of the
    recipe's shape (two vLLM start-ups, about 2 minutes on a 2-core CPU; recorded per machine in stages.json) and print the
    acceptance length the draft needs to pay."""
    store: str = "auto"
    """auto (a feature store on a CPU, or when training passes over the rows more than once) | true | false."""
    force: List[str] = field(default_factory=list)
    """Stages run again even when their record says they are done, e.g. force=[train]: what they made is
    moved to <out>/superseded/ first."""
    node_wait_minutes: float = 1440.0
    """A node of rank > 0: how long it waits for node 0's stages before it gives up (and exits 1)."""
    regen: List[str] = field(default_factory=list)
    capture: List[str] = field(default_factory=list)
    recipe: List[str] = field(default_factory=list)
    """Training overrides (train.*, draft.*, optim.*, data.*, ...): given to the capture and to training."""
    torchrun: Dict[str, str] = field(default_factory=dict)
    export: List[str] = field(default_factory=list)
    gate_args: List[str] = field(default_factory=list)
    serve: List[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return Path(self.out)

    def paths(self) -> Dict[str, Path]:
        r = self.root
        # Given rows with their held-out rows are trained on in place; carved or regenerated ones are written under regen/.
        train_rows = Path(self.rows) if self.rows and self.heldout_rows else r / "regen" / "train.jsonl"
        return {
            "train_rows": train_rows, "heldout_rows": r / "regen" / "heldout.jsonl", "store": r / "store",
            "run": r / "run", "export": r / "export", "gate": r / "gate" / "gate.json", "report": r / "serve" / "report.json",
            "acceptance_plot": r / "serve" / "acceptance.png",
            "tokenized": r / "tokenized",  # the token files, beside out so that every node maps the same ones
        }

    @property
    def nproc(self) -> int:
        return int(self.torchrun.get("nproc", 1))

    @property
    def node_rank(self) -> int:
        return int(self.torchrun.get("node_rank", 0))

    @property
    def max_restarts(self) -> int:
        return int(self.torchrun.get("max_restarts", MAX_RESTARTS))


OWN_KEYS = ("target", "out", "prompts", "rows", "heldout_rows", "experiment", "gate", "round_cost", "store", "force",
            "node_wait_minutes")
NULLABLE = ("experiment", "rows", "heldout_rows")


def keys_help(s: PipelineSettings) -> str:
    """The pipeline's own keys with type, default (`s`'s: a preset's where it has one) and meaning."""
    from blockdraft.config.key_table import key_rows, render_rows

    return (f"keys:\n{render_rows(key_rows(PipelineSettings, s, only=OWN_KEYS))}\n\n"
            "--cfg job prints what each stage would run, composed and checked, and exits without work.")


def parse_overrides(words: List[str], base: Optional[PipelineSettings] = None) -> PipelineSettings:
    """`key=value` words onto `base` (a preset's settings; a later word wins over an earlier one)."""
    s = base or PipelineSettings()
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ConfigError(f"{word!r} is not key=value; write e.g. target=<dir>, train.max_steps=200 or serve.num_prompts=8.")
        bare = key.lstrip("+~")
        head, _, rest = bare.partition(".")
        if bare in OWN_KEYS:
            _set_own(s, bare, value)
        elif head == "train" and rest in TORCHRUN_KEYS:
            _set_torchrun(s, rest, value)
        elif head in APP_PREFIXES and rest:
            if rest in OWNED[head]:
                raise ConfigError(f"{key} is set by the pipeline (it joins one stage to the next); drop it.")
            target = "gate_args" if head == "gate" else head
            _replace(getattr(s, target), f"{key[:len(key) - len(bare)]}{rest}={value}")
        else:
            if bare in OWNED["recipe"]:
                raise ConfigError(f"{key} is set by the pipeline (from target= and the regen stage's rows); drop it.")
            _replace(s.recipe, word)
    return s


def _replace(overrides: List[str], word: str) -> None:
    """A later value of a key replaces the earlier one (a preset's, say): Hydra refuses a key given twice."""
    key = word.partition("=")[0].lstrip("+~")
    overrides[:] = [w for w in overrides if w.partition("=")[0].lstrip("+~") != key]
    overrides.append(word)


BOOLEAN_KEYS = {"gate": "run the one-sample gate first, before the long stages",
                "round_cost": "measure this machine's round cost before the long stages"}


def _set_own(s: PipelineSettings, key: str, value: str) -> None:
    if key in BOOLEAN_KEYS:
        if value.lower() not in ("true", "false"):
            raise ConfigError(f"{key}={value!r}: use true ({BOOLEAN_KEYS[key]}) or false.")
        setattr(s, key, value.lower() == "true")
    elif key == "store":
        if value.lower() not in STORE_CHOICES:
            raise ConfigError(f"store={value!r}: use one of {list(STORE_CHOICES)}.")
        s.store = value.lower()
    elif key == "force":
        stages = [x.strip() for x in value.strip("[]").split(",") if x.strip()]
        unknown = [x for x in stages if x not in STAGES]
        if unknown:
            raise ConfigError(f"force={value}: {unknown} are not stages; the stages are {list(STAGES)}.")
        s.force = stages
    elif key == "node_wait_minutes":
        try:
            s.node_wait_minutes = float(value)
        except ValueError:
            raise ConfigError(f"node_wait_minutes={value!r} is not a number of minutes.") from None
        if s.node_wait_minutes <= 0:
            raise ConfigError(f"node_wait_minutes={value}: use a positive number of minutes.")
    else:
        setattr(s, key, None if key in NULLABLE and value in ("", "null") else value)


def _set_torchrun(s: PipelineSettings, key: str, value: str) -> None:
    if key != "rdzv_endpoint":
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"train.{key}={value!r} is not a whole number.") from None
        floor = 0 if key in ("node_rank", "max_restarts") else 1
        if number < floor:
            raise ConfigError(f"train.{key}={value}: use {floor} or more.")
    s.torchrun[key] = value


def check_settings(s: PipelineSettings) -> None:
    """The pipeline's own keys; the stage apps' keys are checked by composing them (compose.py)."""
    if not s.target:
        raise ConfigError("target= is missing: pass the target's local Hugging Face directory (nothing is downloaded).")
    if not (Path(s.target) / "config.json").is_file():
        raise ConfigError(f"target={s.target} has no config.json; point it at the target's local Hugging Face directory.")
    if not s.out:
        raise ConfigError("out= is missing: pass the directory every artifact of the run goes to.")
    if s.gate_args and not s.gate:
        raise ConfigError(f"{['gate.' + a for a in s.gate_args]} without gate=true: add gate=true to run the gate.")
    if s.heldout_rows and not s.rows:
        raise ConfigError(f"heldout_rows={s.heldout_rows} without rows=: add rows=<the training rows it is held out "
                          "from>, or drop it (regen holds out regen.num_heldout prompts of its own).")
    for key in ("rows", "heldout_rows"):
        given = getattr(s, key)
        if given and s.out and Path(s.out, "regen") in (Path(given), *Path(given).parents):
            raise ConfigError(f"{key}={given} lies in {Path(s.out, 'regen')}, which the regen stage writes (and moves aside "
                              "when its inputs change); copy the rows elsewhere first, or pick another out=.")
    if s.rows and s.prompts != PipelineSettings.prompts:
        raise ConfigError(f"prompts={s.prompts} and rows={s.rows}: prompts= is what regen answers, rows= replaces regen "
                          "with rows already answered; drop one.")
    nnodes = int(s.torchrun.get("nnodes", 1))
    if nnodes > 1 and "rdzv_endpoint" not in s.torchrun:
        raise ConfigError(f"train.nnodes={nnodes}: set train.rdzv_endpoint=<host of node 0>:<port> too.")
    if s.node_rank >= nnodes:
        raise ConfigError(f"train.node_rank={s.node_rank} with train.nnodes={nnodes}: a node's rank is below the node count.")
