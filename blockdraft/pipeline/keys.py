"""What each stage's output depends on, as its key: its app's composed config less the settings that
change only how fast, how loudly or where it runs (each app names those beside its schema as
OUTPUT_NEUTRAL), and the capture's key is the store's own identity. Paths under `out` and the target's
path are written as <out> and <target>: moving a finished run, or the target, keeps every stage; the
target's content is in the key through its fingerprint (models/target_fingerprint.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, Iterable

from blockdraft import kinds
from blockdraft.pipeline.settings import PipelineSettings


def without(schema, neutral: Iterable[str]) -> dict:
    """The schema as a dict, less the dotted keys in `neutral`."""
    tree = dataclasses.asdict(schema)
    for dotted in neutral:
        node: Any = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.get(part, {})
        node.pop(leaf, None)
    return tree


def placeheld(value, s: PipelineSettings):
    """Every string with the run's own paths written as <out> and <target>, and rows given by path (read in
    place, keyed by their content through the regen stage) as <rows>."""
    if isinstance(value, dict):
        return {k: placeheld(v, s) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [placeheld(v, s) for v in value]
    if isinstance(value, str):
        if s.rows and value in (s.rows, str(Path(s.rows))):
            return "<rows>"
        return value.replace(str(s.root), "<out>").replace(str(Path(s.target)), "<target>")
    return value


def regen_inputs(s: PipelineSettings, cfg, target_fingerprint: str) -> dict:
    from blockdraft.data.dataset import source_fingerprint

    prompts = Path(cfg.prompts).expanduser()
    return placeheld({"target": target_fingerprint, "config": without(cfg, type(cfg).OUTPUT_NEUTRAL),
                      "prompts_file": source_fingerprint(prompts) if prompts.exists() else None}, s)


def given_inputs(s: PipelineSettings, given, num_heldout: int) -> dict:
    """Given rows: their content (and the held-out rows', or the carve's count and rule), not their paths."""
    from blockdraft.pipeline.given_split import SPLIT_RULE

    carve = None if given.heldout_rows else {"num_heldout": num_heldout, "rule": SPLIT_RULE}
    return {"given": {"rows": given.identity["rows"]["sha256"],
                      "heldout_rows": given.heldout_rows and given.identity["heldout_rows"]["sha256"], "carve": carve}}


def capture_inputs(s: PipelineSettings, cfg) -> dict:
    import torch

    from blockdraft.capture.identity import planned_identity
    from blockdraft.pipeline.commands import on_cuda

    return placeheld({"store": planned_identity(cfg, torch.device("cuda" if on_cuda() else "cpu"))}, s)


def kind_only() -> Dict[str, tuple]:
    """Settings that shape one draft kind only (KindSpec.keyed_alone): keyed for that kind, left out for the
    others, so that a finished run of another kind keeps its key when they were added."""
    return {spec.name: spec.keyed_alone_settings() for spec in kinds.all_kinds()}


# One rank's share of the global batch: the key holds the global batch instead (rows per optimizer step, what the
# training's math depends on), so a run continued on more or fewer ranks, grad_accum following, keeps its key.
PER_RANK = ("train.grad_accum",)


def train_inputs(s: PipelineSettings, cfg, use_store: bool, global_batch: int) -> dict:
    """The recipe, the store choice and the global batch (pipeline/train_batch.py); not the world size, the
    node's rank, the rendezvous address or the interpreter: every node computes the same key."""
    return placeheld({"config": without(cfg, train_neutral(cfg, PER_RANK)), "store": use_store,
                      "global_batch": global_batch}, s)


def train_neutral(cfg, more: tuple = ()) -> tuple:
    other_kinds = [key for kind, keys in kind_only().items() if kind != cfg.draft.kind for key in keys]
    return (*type(cfg).OUTPUT_NEUTRAL, *type(cfg).EXTENT, *other_kinds, *more)


def former_train_inputs(s: PipelineSettings, cfg, use_store: bool, grad_accum: int, world_size: int) -> dict:
    """The train key as records made before it held the global batch computed it: the recipe with the grad_accum,
    and the world size, the run was trained with. A record keyed so is the same training (runner.py)."""
    config = without(cfg, train_neutral(cfg))
    config["train"]["grad_accum"] = grad_accum
    return placeheld({"config": config, "store": use_store, "world_size": world_size}, s)


def train_resume_inputs(s: PipelineSettings, cfg, use_store: bool, global_batch: int) -> dict:
    """train_inputs less what a stopped run may continue under (optim.lr, optim.grad_clip)."""
    inputs = train_inputs(s, cfg, use_store, global_batch)
    for dotted in type(cfg).RESUMABLE:
        section, leaf = dotted.split(".")
        inputs["config"][section].pop(leaf, None)
    return inputs


def train_extent(cfg) -> dict:
    """How far training goes: a record that went as far or further (no time limit is furthest) is cached."""
    minutes = cfg.train.max_minutes
    return {"max_steps": int(cfg.train.max_steps), "max_minutes": None if minutes is None else float(minutes)}


def export_inputs(s: PipelineSettings, cfg) -> dict:
    return placeheld({"config": without(cfg, type(cfg).OUTPUT_NEUTRAL)}, s)


def gate_inputs(s: PipelineSettings, cfg, training, target_fingerprint: str, serving_stack) -> dict:
    """What the gate's verdict depends on: the target, the serving stack (its packages' versions), the gate's
    own settings and the training it composes for its sample (the recipe's draft settings resolved). No
    stage of the run is in it: the gate runs first, and a retrain keeps it."""
    from blockdraft.config.recipe import TrainAppConfig

    own = without(cfg, (*type(cfg).OUTPUT_NEUTRAL, "train_overrides"))  # the overrides as `training` composes them
    return placeheld({"target": target_fingerprint, "serving": serving_stack, "config": own,
                      "training": without(training, (*TrainAppConfig.OUTPUT_NEUTRAL, *gate_other_kinds(training)))}, s)


def gate_other_kinds(training) -> tuple:
    """Kind settings added after the gate's key held every draft setting (KindSpec.gate_keyed_alone): left out
    of it for the other kinds, so their gates keep their keys."""
    return tuple(key for spec in kinds.all_kinds() if spec.gate_keyed_alone and spec.name != training.draft.kind
                 for key in spec.keyed_alone_settings())


def serve_inputs(s: PipelineSettings, cfg) -> dict:
    return placeheld({"config": without(cfg, type(cfg).OUTPUT_NEUTRAL)}, s)


def key_settings(inputs: Dict[str, Any], prefix: str = "") -> list:
    """The dotted names of every setting in a stage's key (what the tests and --cfg job show)."""
    names = []
    for k, v in inputs.items():
        if isinstance(v, dict) and v:
            names += key_settings(v, f"{prefix}{k}.")
        else:
            names.append(f"{prefix}{k}")
    return names
