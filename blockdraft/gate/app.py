"""The one-sample fidelity gate: does serving compute what training computed?

    python -m blockdraft.gate target=<HF dir> [out=runs/gate] [prompt="..."] \
        [draft=<kind>] [draft.<key>=...] [train.<key>=...] [experiment=<recipe>] ...

It takes the target's own greedy reply to one prompt, trains a draft on that single row
until it has memorised it (`steps`, doubled up to `max_steps` while training's acceptance
length on the row is below min_ratio x what a perfect draft reaches there), exports the draft,
and serves it on that prompt (vLLM where it can run the draft, the reference engine otherwise,
as the smoke-serve check decides). Serving must then accept about what training reached on the
same row: at least min_ratio x a perfect draft's serving acceptance on the reply, scaled by the
share of a perfect draft's accept_len training reached (gate/floors.py: a short reply
holds even a perfect draft below block_size). Anything that differs between training and
serving (layer offsets, positions, masks, names, dtypes) makes it fall far short, in minutes
and with no data. A draft that never memorised the row is its own verdict ("undertrained"),
not a serving fault. Every key the gate does not know goes to training.

Exit status: 0 passed, 1 failed (the verdict says why), 2 refused before any work.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

from blockdraft.durable import write_json
from blockdraft.build_info import build_info
from blockdraft.errors import ConfigError
from blockdraft.gate.response import DATA_NAME, PROMPT_NAME, Sample, make_sample, read_sample

VERDICT_NAME = "gate.json"
CEILINGS_NAME = "perfect_draft.json"  # what a perfect draft reaches on the sample in training
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_PROMPT = "Tell me about the moon."


@dataclass
class GateConfig:
    target: str = ""
    """The target's local Hugging Face directory."""
    out: str = "runs/gate"
    """Where the sample, the run, the export, the serving log and gate.json go."""
    prompt: str = DEFAULT_PROMPT
    """The one user message whose reply the draft memorises."""
    max_tokens: int = 48
    """Length cap of the target's reply (it stops earlier at end of turn)."""
    steps: int = 300
    """Optimizer steps on the one row; doubled, up to max_steps, until the draft has memorised it."""
    max_steps: int = 1200
    """The most steps the gate trains while training's accept_len on the row is below min_ratio x a perfect draft's."""
    min_ratio: float = 0.9
    """Memorised: training's accept_len >= min_ratio x a perfect draft's on the row; pass: serving's >= min_ratio x a
    perfect draft's on the reply, scaled by the share of a perfect draft's accept_len training reached."""
    engine: str = "auto"
    """auto (vLLM where it can run the draft) | vllm | reference, as in `blockdraft.serve`."""
    dtype: str = "auto"
    """Export dtype, the one served: auto (bfloat16 on a GPU, float32 for vLLM on a CPU, as the pipeline exports) | float32 | bfloat16 | float16."""
    vllm_python: Optional[str] = None
    """The serving interpreter; null = <repo>/.venv-serve/bin/python."""
    overwrite: bool = False
    """Replace an earlier gate run in `out`."""
    recheck: bool = False
    """Serve the export already in `out` again against its sample (after editing it, or another vLLM)."""
    allow_training_prompts: bool = False
    """recheck=true on an export the gate did not train: serve it on the gate's prompt even where its
    training_prompts.bin says it trained on it (its verdict's first warning says so). The gate's own draft
    trains on that prompt by design and is never refused."""
    train_overrides: List[str] = field(default_factory=list)
    """Every word that is not a gate key (experiment=, draft=, draft.*, train.*, ...): a training override."""

    # Where and with which interpreter it runs, and whether an earlier run is replaced: no verdict changes
    # with them (the serving stack's versions are keyed apart, by the pipeline).
    OUTPUT_NEUTRAL = ("out", "vllm_python", "overwrite", "recheck")

    def validate(self) -> "GateConfig":
        if not self.target or not Path(self.target).is_dir():
            raise ConfigError(f"target={self.target!r} is not a directory; pass the target's local Hugging Face directory.")
        out = Path(self.out)
        if self.recheck:
            return self
        if (out / VERDICT_NAME).is_file() and not self.overwrite:
            raise ConfigError(f"out={self.out} already holds a finished gate run; pick another out, pass overwrite=true, "
                              "or recheck=true to serve its export again.")
        if out.is_dir() and any(out.iterdir()) and not is_gate_run(out):
            raise ConfigError(f"out={self.out} holds files that are not a gate run; pick an empty or new directory.")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}; use one of {list(DTYPES)}.")
        for key in ("max_tokens", "steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)}: set it to 1 or more.")
        if self.max_steps < self.steps:
            raise ConfigError(f"max_steps={self.max_steps} < steps={self.steps}: the gate trains at least `steps`; "
                              f"raise max_steps to {self.steps} or more.")
        if not 0 < self.min_ratio <= 1:
            raise ConfigError(f"min_ratio={self.min_ratio}: use a fraction in (0, 1] of the block size.")
        return self


def parse_arguments(argv: List[str]) -> GateConfig:
    """`key=value` words: the gate's own keys, everything else a training override."""
    cfg, defaults = GateConfig(), GateConfig()
    known = {f for f in GateConfig.__dataclass_fields__ if f != "train_overrides"}
    for word in argv:
        key, sep, value = word.partition("=")
        if not sep:
            raise ConfigError(f"{word!r} is not key=value; write e.g. target=<dir> or draft=jetspec.")
        if key not in known:
            cfg.train_overrides.append(word)
            continue
        kind = type(getattr(defaults, key))
        if kind is bool:
            if value.lower() not in ("true", "false"):
                raise ConfigError(f"{key}={value!r}: use true or false.")
            value = value.lower() == "true"
        elif getattr(defaults, key) is not None and kind is not str:
            try:
                value = kind(value)
            except ValueError:
                raise ConfigError(f"{key}={value!r} is not a {kind.__name__}.") from None
        setattr(cfg, key, value)
    return cfg.validate()


def is_gate_run(out: Path) -> bool:
    """What a gate run writes first (its sample), so an unfinished run is replaced without overwrite=true."""
    return (out / DATA_NAME).is_file() or (out / PROMPT_NAME).is_file() or (out / VERDICT_NAME).is_file()


def export_dtype(cfg: GateConfig) -> str:
    if cfg.dtype != "auto":
        return cfg.dtype
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"


def choose_mask_token(cfg: GateConfig) -> None:
    """Where neither the recipe nor the overrides set draft.mask_token_id, take suggest's first candidate:
    the gate checks fidelity, which any reserved token serves; the choice is said and kept in the overrides."""
    from blockdraft.models.mask_choice import first_mask_candidate, missing_mask_message

    candidate = first_mask_candidate(cfg.target)
    if candidate is None:
        raise ConfigError(missing_mask_message(cfg.target))
    token_id, text = candidate
    say(f"draft.mask_token_id is not set: the gate uses {token_id} ({text!r}), the target's first reserved special "
        "token (any reserved token serves a fidelity check; training needs the one you choose)")
    cfg.train_overrides.append(f"draft.mask_token_id={token_id}")


def check_before_work(cfg: GateConfig, out: Path) -> None:
    """A typo in an override, or a setting training refuses, is said before `out` is touched or a model loads."""
    from omegaconf import OmegaConf

    from blockdraft.train.setup import check_config

    composed = training_config(cfg, out, 1)
    if composed.draft.mask_token_id is None:
        choose_mask_token(cfg)
        composed = training_config(cfg, out, 1)
    if composed.train.loss_type != "block":
        raise ConfigError(f"train.loss_type={composed.train.loss_type}: the gate trains plain blocks, as serving drafts "
                          "them, and its memorised floor is a perfect plain-block draft's; drop the override.")
    check_config(OmegaConf.to_object(composed), data_ready=False)


def training_config(cfg: GateConfig, out: Path, anchors: int, steps: Optional[int] = None):
    """The training app's config for the one row: the gate's defaults, the user's overrides, then
    what the gate must fix (its one row, never a recipe's regenerated data, no validation, its run
    directory, this target). `anchors`: the row's valid anchors (every one is drawn each step)."""
    from blockdraft.config import compose, register_schema
    from blockdraft.config.recipe import TrainAppConfig

    register_schema("train_schema", TrainAppConfig)
    anchors = max(1, anchors)
    # Memorising is fastest on the hard labels: a recipe's KL (JetSpec's) against a target whose
    # next-token distribution is flat would take many more steps to fix each argmax, and the
    # loss is not what the gate checks. Plain blocks are what serving drafts, and what the
    # memorised floor is computed for. An override on the command line still wins.
    steps = steps or cfg.steps
    defaults = [f"train.max_steps={steps}", "train.micro_batch_size=1", "train.grad_accum=1",
                "train.ce_weight=1.0", "train.kl_weight=0.0", "train.loss_type=block",
                f"train.num_anchors={anchors}", f"train.log_every={max(1, cfg.steps // 10)}", f"train.save_every={steps}"]
    # The first `steps` start a new run; more steps continue it from its checkpoint.
    start = ["overwrite=true"] if steps == cfg.steps else ["resume=auto"]
    forced = [f"data.train={out / DATA_NAME}", "data.val=null", "data.features=null", "prepare.regenerate_builtin=null",
              f"run_dir={out / 'run'}",
              f"target.path={Path(cfg.target).resolve()}", "target.tiny=null", *start]
    from hydra.errors import HydraException

    try:
        return compose("train", [*defaults, *cfg.train_overrides, *forced])
    except HydraException as err:
        raise ConfigError(f"a training override of {cfg.train_overrides} is not valid: {err}".replace("\n", " ")) from None


def run_gate(cfg: GateConfig) -> dict:
    out = Path(cfg.out).absolute()
    if not cfg.recheck:
        check_before_work(cfg, out)
        if out.exists():  # a finished run only with overwrite=true (validate), or an unfinished one
            shutil.rmtree(out)
        out.mkdir(parents=True)
        say(f"target's greedy reply to {cfg.prompt!r} ...")
        sample = make_sample(cfg.prompt, Path(cfg.target), cfg.max_tokens, out)
        say(f"{len(sample.reply_ids)} reply tokens after {len(sample.prompt_ids)} prompt tokens; training {cfg.steps} steps on them")
        train_and_export(cfg, out, sample)
    sample = read_sample(out)
    return judge(cfg, out, sample, serve(cfg, out, sample), recorded_ceilings(cfg, out, sample))


@dataclass
class Ceilings:
    """Training on the sample (gate/floors.py): a perfect draft's accept_len (None: no valid anchor)
    and the valid anchors it is the mean over."""

    training: Optional[float]
    anchors: int


def sample_ceilings(cfg: GateConfig, out: Path, sample: Sample) -> Ceilings:
    """The sample's row tokenised as training tokenises it (the composed data settings), and so the
    anchors training draws on it and a perfect draft's accept_len there."""
    from transformers import AutoTokenizer

    from blockdraft.data.tokenize import RowRejected, tokenize_row
    from blockdraft.gate.floors import drafted_tokens, training_ceiling

    composed = training_config(cfg, out, len(sample.reply_ids))
    data = composed.data
    row = tokenize_row(sample.messages(), AutoTokenizer.from_pretrained(cfg.target), data.seq_length, data.overlong,
                       dict(data.chat_template_kwargs))
    if isinstance(row, RowRejected):
        raise ConfigError(f"training would set the gate's sample aside ({row.detail}); pick another prompt= or raise "
                          "data.seq_length=.")
    mask = row.loss_mask
    anchors = sum(1 for here, after in zip(mask, mask[1:]) if here and after)
    return Ceilings(training_ceiling(mask, drafted_tokens(composed.draft)), anchors)


def recorded_ceilings(cfg: GateConfig, out: Path, sample: Sample) -> Ceilings:
    """The ceilings the run was trained with (a recheck may pass other training overrides, or none)."""
    path = out / CEILINGS_NAME
    return Ceilings(**json.loads(path.read_text())) if path.is_file() else sample_ceilings(cfg, out, sample)


def train_and_export(cfg: GateConfig, out: Path, sample: Sample) -> None:
    from blockdraft.export.writer import export_draft
    from blockdraft.train.loop import run_training

    steps = cfg.steps
    ceilings = sample_ceilings(cfg, out, sample)
    (out / CEILINGS_NAME).write_text(json.dumps(asdict(ceilings)) + "\n")
    anchors = max(ceilings.anchors, len(sample.reply_ids))
    floor = cfg.min_ratio * (ceilings.training or 0.0)
    run = run_training(training_config(cfg, out, anchors, steps))
    while (reached := (last_training_row(out) or {}).get("accept_len")) is not None and reached < floor and steps < cfg.max_steps:
        steps = min(2 * steps, cfg.max_steps)
        say(f"training's accept_len on the sample is {reached:.2f} < {floor:.2f} = {cfg.min_ratio} x {ceilings.training:.2f}, "
            f"a perfect draft's on this sample: not memorised yet; training on to {steps} steps (max_steps={cfg.max_steps})")
        run = run_training(training_config(cfg, out, anchors, steps))
    dtype = export_dtype(cfg)
    say(f"exporting {run} ({dtype})")
    export_draft(run, out / "export", dtype=dtype, target_dir=cfg.target)


@dataclass
class Served:
    engine: str
    tokens: List[int]
    num_drafts: float
    num_accepted: float
    accepted_per_position: List[float]
    block_size: int
    kind: str
    warnings: List[str]
    drafted: int
    """Tokens drafted per round (num_speculative_tokens)."""


def serve(cfg: GateConfig, out: Path, sample: Sample) -> Served:
    from blockdraft.serve.config import ServeConfig
    from blockdraft.serve.held_out_check import check_gate_prompt
    from blockdraft.serve.preflight import plan_serving

    serve_cfg = ServeConfig(draft_dir=str(out / "export"), target_dir=cfg.target, prompts=str(out / PROMPT_NAME),
                            num_prompts=1, max_tokens=max(1, len(sample.reply_ids)), rounds=1, out=str(out / "serve"),
                            overwrite=True, engine=cfg.engine, vllm_python=cfg.vllm_python,
                            max_model_len=len(sample.prompt_ids) + len(sample.reply_ids) + 64)
    # Before any server: a draft the gate did not train must not have trained on its prompt.
    notes = check_gate_prompt(out / "export", sample.prompt, cfg.allow_training_prompts)
    plan = plan_serving(serve_cfg)
    for warning in [*notes, *plan.warnings]:
        say(f"warning: {warning}")
    facts = dict(block_size=plan.draft.block_size, kind=plan.draft.kind, warnings=[*notes, *plan.warnings],
                 drafted=plan.num_speculative_tokens)
    if plan.engine == "reference":
        return _serve_reference(plan, sample, facts)
    return _serve_vllm(serve_cfg, plan, sample, facts)


def _serve_vllm(serve_cfg, plan, sample: Sample, facts: dict) -> Served:
    from blockdraft.serve.harness import serve_and_generate, speculative_config
    from blockdraft.serve.prompts import EncodedPrompt
    from blockdraft.serve.report import Round, RunRecord

    Path(serve_cfg.out).mkdir(parents=True, exist_ok=True)
    record = RunRecord(engine="vllm", planned_rounds=1, rounds=[Round(order=("draft",))])
    prompt = EncodedPrompt(index=0, source="gate prompt", token_ids=sample.prompt_ids)
    completions = serve_and_generate(serve_cfg, plan, [prompt], record, "draft", speculative_config(plan), 1)
    m = record.rounds[0].metrics
    return Served("vllm", completions[0].token_ids, m.num_drafts, m.num_accepted_tokens, list(m.accepted_per_position), **facts)


def _serve_reference(plan, sample: Sample, facts: dict) -> Served:
    from blockdraft.serve.reference_check import load_engine

    engine = load_engine(plan, ignore_eos=False)
    result = engine.generate(sample.prompt_ids, max(1, len(sample.reply_ids)))
    stats = result.stats
    return Served("reference", result.tokens, stats.num_drafts, stats.num_accepted,
                  [float(n) for n in stats.accepted_per_position()], **facts)


def last_training_row(out: Path) -> Optional[dict]:
    """Training's last log line on the sample (its step and accept_len); None before any."""
    from blockdraft.train.logger import read_metrics

    rows = [r for r in read_metrics(out / "run") if "accept_len" in r]
    return rows[-1] if rows else None


def judge(cfg: GateConfig, out: Path, sample: Sample, served: Served, ceilings: Ceilings) -> dict:
    """Serving's acceptance on the sample against what training reached on it, each as a share of what a
    perfect draft reaches there (a short reply holds even a perfect draft below block_size): serving's far
    below training's is a serving fault; a draft that never memorised the sample is its own verdict,
    whatever serving did."""
    from blockdraft.gate.floors import serving_ceiling
    from blockdraft.serve.verdict import first_difference

    acceptance = 1.0 + served.num_accepted / served.num_drafts if served.num_drafts else 0.0
    last = last_training_row(out) or {}
    trained = last.get("accept_len")
    # Serving's ceiling with the drafts it made (num_speculative_tokens may differ from training's).
    serve_best = serving_ceiling(len(sample.reply_ids), served.drafted) or 0.0
    floor = cfg.min_ratio * ceilings.training if ceilings.training else None
    # How close training came to a perfect draft; serving should come as close to its own perfect.
    share = min(1.0, trained / ceilings.training) if trained is not None and ceilings.training else 1.0
    expected = cfg.min_ratio * serve_best * share
    failures, verdict_name = [], "passed"
    at = first_difference(served.tokens, sample.reply_ids)
    if at is not None:
        verdict_name = "not lossless"
        failures.append(f"served output differs from the target's reply at token {at}: not lossless, or the serving "
                        "target computes other logits than the training one")
    if served.num_drafts == 0:
        verdict_name = "draft unused"
        failures.append("no draft was proposed: the draft was not used")
    elif acceptance < expected:
        verdict_name = "serving differs"
        reached = "" if trained is None else (f", scaled by {share:.2f}: training reached {trained:.2f} of a perfect "
                                              f"draft's {ceilings.training:.2f}")
        failures.append(f"mean acceptance length {acceptance:.2f} in serving < {expected:.2f} = {cfg.min_ratio} x "
                        f"{serve_best:.2f}, what a perfect draft accepts on this {len(sample.reply_ids)}-token reply"
                        f"{reached}: serving does not compute what training learned (check target_layer_ids, positions, "
                        "masks, names, dtypes)")
    elif trained is not None and floor is not None and trained < floor:
        verdict_name = "undertrained"
        failures.append(f"training did not memorise the sample: its accept_len {trained:.2f} < {cfg.min_ratio} x "
                        f"{ceilings.training:.2f} = {floor:.2f}, what a perfect draft reaches on this sample at block "
                        f"{served.block_size}, after {last.get('step')} steps. Serving accepted {acceptance:.2f}, as much "
                        "as training reached, so nothing says serving differs; the check is weaker than with a memorised "
                        "draft: rerun with a larger max_steps= (or a higher optim.lr=)")
    verdict = {
        "passed": not failures,
        "verdict": verdict_name,
        "failures": failures,
        "kind": served.kind,
        "engine": served.engine,
        "block_size": served.block_size,
        "mean_acceptance_length": acceptance,
        "min_acceptance_length": expected,
        "memorised_floor": floor,
        "perfect_train_accept_len": ceilings.training,
        "perfect_acceptance_length": serve_best,
        "acceptance_per_position": [n / served.num_drafts for n in served.accepted_per_position] if served.num_drafts else [],
        "num_drafts": served.num_drafts,
        "reply_tokens": len(sample.reply_ids),
        "train_accept_len": trained,
        "warnings": served.warnings,
        **build_info(),
    }
    write_json(out / VERDICT_NAME, verdict)  # whole or not at all: a pipeline caches it as the gate's result
    return verdict


def say(message: str) -> None:
    print(f"[gate] {message}", file=sys.stderr, flush=True)


def usage() -> str:
    from blockdraft.config.key_table import key_rows, render_rows

    own = [name for name in GateConfig.__dataclass_fields__ if name != "train_overrides"]  # not a word: the rest of them
    return (f"{__doc__.strip()}\n\nkeys (every other key=value is a training override):\n"
            f"{render_rows(key_rows(GateConfig, GateConfig(), only=own))}\n\n--cfg job prints these settings and the "
            "training config they compose, and exits.")


def print_config(cfg: GateConfig) -> None:
    """`--cfg job`: the gate's settings, then the training config it composes (nothing is run or written)."""
    from omegaconf import OmegaConf

    print(OmegaConf.to_yaml(asdict(cfg)))
    print(f"# --- training, for a reply of max_tokens={cfg.max_tokens} tokens (train.num_anchors follows the reply's length)")
    print(OmegaConf.to_yaml(training_config(cfg, Path(cfg.out).absolute(), cfg.max_tokens)))


def main(argv: List[str]) -> int:
    from blockdraft.config.cfg_flag import split_cfg_job
    from blockdraft.serve.cli import USER_ERRORS

    if any(a in ("-h", "--help") for a in argv):
        print(usage())
        return 0
    try:
        argv, show_config = split_cfg_job(argv, "the gate's settings and the training config it composes")
        cfg = parse_arguments(argv)
        if show_config:
            print_config(cfg)
            return 0
        verdict = run_gate(cfg)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; every server started was stopped", file=sys.stderr)
        return 130
    print(json.dumps({k: verdict[k] for k in ("passed", "verdict", "kind", "engine", "mean_acceptance_length", "min_acceptance_length",
                                              "perfect_acceptance_length", "block_size", "train_accept_len",
                                              "perfect_train_accept_len")}))
    for failure in verdict["failures"]:
        say(f"FAILED: {failure}")
    say(f"{'PASSED' if verdict['passed'] else 'FAILED'}: {Path(cfg.out) / VERDICT_NAME}")
    return 0 if verdict["passed"] else 1

