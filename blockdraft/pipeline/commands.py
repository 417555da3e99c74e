"""Each stage's command (the same `python -m` app a user would run by hand), and the check that
composes every app with its overrides before the first stage starts."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import List, Sequence

from blockdraft.errors import ConfigError
from blockdraft.pipeline.settings import PipelineSettings


def python() -> str:
    return sys.executable


def regen_prompts(prompts: str) -> str:
    return "tiny_prompts" if prompts == "tiny" else prompts  # the serve harness's name for the same set


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def regen_overrides(s: PipelineSettings) -> List[str]:
    return [f"target_dir={s.target}", f"out={s.root / 'regen'}", f"prompts={regen_prompts(s.prompts)}", *s.regen]


def recipe_overrides(s: PipelineSettings) -> List[str]:
    """What the capture and training compose: the recipe, the target and the regen stage's rows, then the
    user's overrides (a later override wins, so `data.val=null` drops the held-out validation)."""
    p = s.paths()
    experiment = [f"experiment={s.experiment}"] if s.experiment else []
    return [*experiment, f"target.path={s.target}", "target.tiny=null", "prepare.regenerate_builtin=null",
            f"data.train={p['train_rows']}", f"data.val={p['heldout_rows']}", f"data.cache_dir={p['tokenized']}",
            *s.recipe]


def capture_overrides(s: PipelineSettings) -> List[str]:
    return [*recipe_overrides(s), *s.capture, f"out={s.paths()['store']}"]


def train_overrides(s: PipelineSettings, use_store: bool, batch: Sequence[str] = ()) -> List[str]:
    """`batch`: the train.grad_accum that keeps a continued run's global batch (train_batch.py)."""
    p = s.paths()
    store = [f"data.features={p['store']}"] if use_store else []
    return [*recipe_overrides(s), *store, f"run_dir={p['run']}", "resume=auto", *batch]


def export_dtype(s: PipelineSettings) -> str:
    """The dtype the pipeline exports, and so serves: bfloat16 on a GPU, float32 for vLLM on a CPU,
    unless export.dtype= says otherwise (the last one given wins, as in Hydra)."""
    given = [w.split("=", 1)[1] for w in s.export if w.split("=", 1)[0].lstrip("+") == "dtype"]
    return given[-1] if given else ("bfloat16" if on_cuda() else "float32")


def export_overrides(s: PipelineSettings) -> List[str]:
    p = s.paths()
    return [f"checkpoint={p['run']}", f"out={p['export']}", f"target_dir={s.target}", f"dtype={export_dtype(s)}",
            "overwrite=true", *s.export]


def gate_words(s: PipelineSettings) -> List[str]:
    # The gate trains its own one-row draft: of the recipe, only what shapes the draft reaches it.
    experiment = [f"experiment={s.experiment}"] if s.experiment else []
    draft = [w for w in s.recipe if w.lstrip("+~").split("=")[0].split(".")[0] == "draft"]
    # It checks the dtype that will be served, the export stage's, on the serve stage's engine and interpreter
    # (a gate.<key>= still wins).
    serving = [w.lstrip("+") for w in s.serve if not w.startswith("~") and w.lstrip("+").split("=")[0] in ("engine", "vllm_python")]
    return [f"target={s.target}", f"out={s.paths()['gate'].parent}", "overwrite=true", f"dtype={export_dtype(s)}",
            *serving, *experiment, *draft, *s.gate_args]


def serve_overrides(s: PipelineSettings) -> List[str]:
    p = s.paths()
    return [f"draft_dir={p['export']}", f"target_dir={s.target}", f"prompts={p['heldout_rows']}",
            f"out={p['report'].parent}", "overwrite=true", *s.serve]


def train_argv(s: PipelineSettings, use_store: bool, batch: Sequence[str] = ()) -> List[str]:
    """Several processes train under torchrun, elastically: a rank that dies (or its node) makes torchrun stop the
    group and start it again, up to train.max_restarts times, and each new attempt resumes from the last checkpoint
    (train_overrides' resume=auto; the run's lock, held by the failed attempt, is taken over: train/run_lock.py)."""
    return launched(s, "blockdraft.train", train_overrides(s, use_store, batch), rendezvous_id(s))


def capture_argv(s: PipelineSettings) -> List[str]:
    """The capture on every node, launched as training is (train.nproc ranks per node, the same nodes and
    rendezvous endpoint, elastic): each rank captures its share of the shards, and the store is the same for any
    count. A restarted attempt resumes at the unfinished shards. Its own rendezvous id, so that its rendezvous
    and training's, one after the other on the same endpoint, are never taken for one another.
    With capture.backend=vllm one process on node 0 sends the rows to its vLLM servers."""
    if capture_through_vllm(s):
        return [python(), "-m", "blockdraft.capture", *capture_overrides(s)]
    return launched(s, "blockdraft.capture", capture_overrides(s), rendezvous_id(s) + "-capture")


def capture_through_vllm(s: PipelineSettings) -> bool:
    """capture.backend=vllm given (the last word wins, as Hydra takes it)."""
    said = [w.lstrip("+").partition("=")[2] for w in s.capture if w.lstrip("+").partition("=")[0] == "backend"]
    return bool(said) and said[-1] == "vllm"


def launched(s: PipelineSettings, module: str, overrides: List[str], rdzv_id: str) -> List[str]:
    """`python -m module` for one process, else torchrun over train.nproc ranks on each of train.nnodes nodes."""
    nnodes = int(s.torchrun.get("nnodes", 1))
    if s.nproc == 1 and nnodes == 1:
        return [python(), "-m", module, *overrides]
    launch = [f"--nproc_per_node={s.nproc}"]
    if nnodes == 1:
        launch.append("--standalone")
    else:
        launch += [f"--nnodes={nnodes}", f"--node_rank={s.node_rank}", "--rdzv_backend=c10d",
                   f"--rdzv_endpoint={s.torchrun['rdzv_endpoint']}", f"--rdzv_id={rdzv_id}"]
    launch.append(f"--max-restarts={s.max_restarts}")
    return [python(), "-m", "torch.distributed.run", *launch, "-m", module, *overrides]


def rendezvous_id(s: PipelineSettings) -> str:
    """The job's id on several nodes, from the run's out dir: every node's torchrun is given the same out= and so
    agrees on it, and it stays the same across restarts, so the run's lock knows a restarted attempt of its job."""
    return "blockdraft-" + hashlib.sha256(str(Path(s.out).absolute()).encode()).hexdigest()[:16]


def stage_argv(stage: str, s: PipelineSettings, use_store: bool, batch: Sequence[str] = ()) -> List[str]:
    """`batch`: training only, the train.grad_accum that keeps a continued run's global batch."""
    return {
        "regen": lambda: [python(), "-m", "blockdraft.regen", *regen_overrides(s)],
        "capture": lambda: capture_argv(s),
        "train": lambda: train_argv(s, use_store, batch),
        "export": lambda: [python(), "-m", "blockdraft.export", *export_overrides(s)],
        "gate": lambda: [python(), "-m", "blockdraft.gate", *gate_words(s)],
        "serve": lambda: [python(), "-m", "blockdraft.serve", *serve_overrides(s)],
    }[stage]()


# --- composing every app before any work ---------------------------------------------------
def composed(s: PipelineSettings, use_store: bool = True) -> dict:
    """Each app's config as that app would compose it; a key no stage knows is refused here, by name."""
    from omegaconf import OmegaConf

    from blockdraft.capture.config import CaptureAppConfig
    from blockdraft.config import compose, register_schema
    from blockdraft.config.recipe import TrainAppConfig
    from blockdraft.export.config import ExportConfig
    from blockdraft.regen.config import RegenConfig
    from blockdraft.serve.config import ServeConfig

    for name, schema in (("train_schema", TrainAppConfig), ("capture_schema", CaptureAppConfig),
                         ("regen_schema", RegenConfig), ("export_schema", ExportConfig), ("serve_schema", ServeConfig)):
        register_schema(name, schema)
    out = {}
    for stage, app, overrides in (("regen", "regen", regen_overrides(s)), ("capture", "capture", capture_overrides(s)),
                                  ("train", "train", train_overrides(s, use_store)), ("export", "export", export_overrides(s)),
                                  ("serve", "serve", serve_overrides(s))):
        try:
            out[stage] = OmegaConf.to_object(compose(app, overrides))
        except Exception as err:  # Hydra's and OmegaConf's errors: the message names the key
            raise ConfigError(f"the {stage} stage refuses its overrides: {_one_line(err)}. {ROUTING}") from None
    from blockdraft.capture.config import check_capture_options
    from blockdraft.train.setup import check_config

    # Each app's own checks of what it was given, as far as they need no output of an earlier stage.
    out["regen"].validate()
    check_config(out["train"], data_ready=False)
    check_capture_options(out["capture"])
    out["serve"].validate_settings()
    check_recipe_drafted_tokens(out["train"], out["serve"])
    if out["serve"].engine != "reference":
        out["serve"].vllm_python_path()  # the serving environment exists
        check_server_method(out["serve"])
    if s.gate:
        from blockdraft.gate.app import parse_arguments

        out["gate"] = parse_arguments(gate_words(s))
    return out


def check_server_method(serve) -> None:
    """The serve harness refuses a kept or frozen pair on a GPU (each server would claim its memory share):
    said here, before the training it would otherwise follow. A CUDA machine serves with the CUDA vLLM."""
    gpu = serve.device == "cuda" or (serve.device == "auto" and on_cuda())
    try:
        serve.server_method("cuda" if gpu else "cpu")
    except ConfigError as err:
        raise ConfigError(f"serve.{err}") from None


ROUTING = ("The pipeline's own keys are target, out, prompts, rows, heldout_rows, experiment, gate, round_cost, store, force, node_wait_minutes; regen.*, capture.*, "
           "export.*, gate.* and serve.* go to those stages' apps; train.nproc/nnodes/node_rank/rdzv_endpoint/max_restarts to "
           "torchrun; everything else (train.*, draft.*, optim.*, data.*, ...) to the training recipe")


def _one_line(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text[:600]


def check_recipe_drafted_tokens(train_cfg, serve_cfg) -> None:
    """serve.num_speculative_tokens against the recipe's draft, before any stage: a count vLLM would refuse for
    this kind (LiLiCorr: at most block_size - 1) would otherwise stop the run at its serve stage, hours on."""
    from blockdraft.serve.preflight import check_drafted_tokens

    k = serve_cfg.num_speculative_tokens
    if k is not None:
        check_drafted_tokens(train_cfg.draft.kind, k, train_cfg.draft.block_size, key="serve.num_speculative_tokens")
