"""The smoke-serve check: preflight -> rounds of (baseline server, draft server) -> verdict and report.

Every server gets the same target, arguments and token-id prompts; only the draft runs
add `--speculative-config`. `servers=` says where the rounds run: one server of each side for
every round, started side by side (kept, the default on a CPU; or frozen: the idle one stopped
with SIGSTOP), each round's prompts in two halves, the order of the sides reversed for the second
(baseline, draft, draft, baseline); or a fresh pair per round (the default on a GPU, where two
servers would each claim their memory share), each side's prompts in one phase. Rounds alternate
which side goes first. The report gives the median over `rounds=` and a paired interval over
prompts (docs/benchmarks-history.md, serve_methods, sets the methods side by side).
Each server generates `warmup_prompts` untimed before its first measured prompt, and the idle
server's CPU seconds during the measured requests go into the report. A DFlash2 or DSpark draft that
the serving vLLM cannot run (they need its V2 GPU runner) goes to the reference engine instead, and
the report says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import time
from pathlib import Path
from typing import List, Optional

from blockdraft import kinds
from blockdraft.data.held_out import SHAREGPT_HELD_OUT_START
from blockdraft.errors import ConfigError
from blockdraft.export.deploy_line import V2_RUNNER_ENV, v2_runner_reason, vllm_method
from blockdraft.machine import machine_facts
from blockdraft.serve.client import Completion, RequestError, SpecMetrics, complete, complete_all, read_spec_metrics
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.held_out_check import measure, refuse_trained_on
from blockdraft.serve.preflight import Plan, plan_serving
from blockdraft.serve.prompts import EncodedPrompt, encode_prompts, iter_prompts
from blockdraft.serve.report import PHASES, Round, RunRecord, build_report, print_table, write_report
from blockdraft.vllm_runtime.omp_binding import omp_binding
from blockdraft.vllm_runtime.server import ServerError, VllmServer, server_settings, start_together, stop_together

WARM_UP_TOKENS = 8  # one short request first: lazy initialisation must not count as decoding time
# A server counts as quiet once it uses under 20 ms of CPU in 0.1 s (its CPU time ticks in 10 ms; one busy
# after answering reads 0.1 s).
QUIET_CPU_S, QUIET_WINDOW_S, QUIET_MAX_S = 0.02, 0.1, 15.0
RUNNER_MARKERS = (("Using V2 Model Runner", "v2"), ("using the V1 model runner instead", "v1"))


def say(message: str) -> None:
    print(f"[serve] {message}", file=sys.stderr, flush=True)


def run(cfg: ServeConfig) -> dict:
    """The whole check; returns the report (also written to <out>/report.json and printed).

    A refusal before launch raises ConfigError / DataError and writes nothing. Once
    something runs, a report is always written, marked `incomplete` if the run stopped.
    """
    began = time.monotonic()
    plan = plan_serving(cfg)
    for warning in plan.warnings:
        say(f"warning: {warning}")
    method = cfg.server_method(plan.device) if plan.engine == "vllm" else None
    record = _new_record(cfg, plan, method)
    prompts = _prompts(cfg, record)
    record.held_out = check_held_out(cfg, prompts)
    try:
        if plan.engine == "reference":
            say("REFERENCE ENGINE, not vLLM (see the warning above): checking the draft with blockdraft.engine")
            from blockdraft.serve.reference_check import run_reference

            run_reference(plan, prompts, cfg.max_tokens, cfg.ignore_eos, record)
        else:
            _run_vllm(cfg, plan, prompts, record)
    except (ServerError, RequestError) as err:
        record.error = str(err)
        say(f"stopped: {err}")
    except BaseException as err:  # Ctrl-C, SIGTERM or a bug: the report still says how far it got
        interrupted = isinstance(err, KeyboardInterrupt)
        record.error = "interrupted (Ctrl-C or SIGTERM)" if interrupted else f"{type(err).__name__}: {err}"
        _finish(cfg, record, began)
        raise
    return _finish(cfg, record, began)


def _finish(cfg: ServeConfig, record: RunRecord, began: float) -> dict:
    record.timings_s["total"] = time.monotonic() - began
    report = build_report(record, cfg.min_acceptance_length, cfg.allow_near_ties)
    path = write_report(report, cfg.out)
    print_table(report)
    say(f"report: {path}")
    return report


def _new_record(cfg: ServeConfig, plan: Plan, method: Optional[str]) -> RunRecord:
    settings = {
        "draft": str(Path(cfg.draft_dir).resolve()),
        "target": str(Path(cfg.target_dir).resolve()),
        "draft_kind": plan.draft.kind,
        "block_size": plan.draft.block_size,
        "num_speculative_tokens": plan.num_speculative_tokens,
        "prompts": cfg.prompts,
        "max_tokens": cfg.max_tokens,
        "min_acceptance_length": cfg.min_acceptance_length,
        "rounds_planned": rounds_for(cfg, plan),
        "servers": method,
        "warmup_prompts": cfg.warmup_prompts if method else None,
    }
    # The machine and (below) vLLM's thread binding: the same recipe gave 0.93x and 1.27x on two
    # machines of one kind, so a report says where it ran.
    environment = {"vllm_version": plan.vllm.version, "device": plan.device, "runner": None, "machine": machine_facts(),
                   "vllm_omp_binding": {}}
    return RunRecord(engine=plan.engine, settings=settings, environment=environment, warnings=list(plan.warnings),
                     planned_rounds=rounds_for(cfg, plan))


def rounds_for(cfg: ServeConfig, plan: Plan) -> int:
    # The reference engine runs in this process, with no server to restart: one round says it all.
    return 1 if plan.engine == "reference" else cfg.rounds


def _prompts(cfg: ServeConfig, record: RunRecord) -> List[EncodedPrompt]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.target_dir)
    rows = iter_prompts(cfg.prompts, cfg.prompts_skip)
    budget = cfg.max_model_len - cfg.max_tokens
    kwargs = dict(cfg.chat_template_kwargs)
    prompts, too_long = encode_prompts(rows, tokenizer, cfg.use_chat_template, budget, kwargs, limit=cfg.num_prompts)
    if too_long:
        say(f"{len(too_long)} prompt(s) skipped: longer than max_model_len - max_tokens = {budget} tokens")
    if not prompts:
        raise ConfigError(
            f"no prompt of prompts={cfg.prompts!r} fits in max_model_len - max_tokens = {budget} tokens "
            f"({len(too_long)} read); raise max_model_len or lower max_tokens."
        )
    record.sources = [p.source for p in prompts]
    record.prompts_too_long = too_long
    return prompts


def check_held_out(cfg: ServeConfig, prompts: List[EncodedPrompt]) -> dict:
    """The prompts against the draft's record of training prompts, before any server starts: refused when
    it trained on any, unless allow_training_prompts=true; without a record, a warning."""
    held = measure(cfg.draft_dir, [p.identity for p in prompts])
    refuse_trained_on([(f"prompts={cfg.prompts}", held)], cfg.allow_training_prompts, prompts_fix(cfg))
    if not held.recorded:
        say(f"warning: {held.line()}")
    elif held.trained_on:
        say(held.headline())
    return held.as_dict()


def prompts_fix(cfg: ServeConfig) -> str:
    """The keys that pick other prompts."""
    if cfg.prompts == "sharegpt" and cfg.prompts_skip is not None:
        return f"prompts_skip=null reads ShareGPT's held-out range, from {SHAREGPT_HELD_OUT_START}; or another prompts="
    return "another prompts= file or set, or a prompts_skip= past them"


# --- the vLLM runs ---------------------------------------------------------------------
def speculative_config(plan: Plan) -> dict:
    """vLLM's --speculative-config for the planned draft (DSpark is method dspark, every DFlash kind dflash)."""
    return {
        "method": vllm_method(plan.draft.kind),
        "model": str(plan.draft.directory.resolve()),
        "num_speculative_tokens": plan.num_speculative_tokens,
    }


def _run_vllm(cfg: ServeConfig, plan: Plan, prompts: List[EncodedPrompt], record: RunRecord) -> None:
    speculative = speculative_config(plan)
    method = record.settings["servers"]
    with contextlib.ExitStack() as pair:
        servers = start_pair(cfg, plan, record, speculative, pair) if method != "fresh" else {}
        for number in range(1, record.planned_rounds + 1):
            round_ = Round(order=PHASES if number % 2 else PHASES[::-1])
            record.rounds.append(round_)
            if servers:
                paired_round(cfg, servers, prompts, record, round_, number, frozen=method == "frozen")
                continue
            for phase in round_.order:
                spec = speculative if phase == "draft" else None
                setattr(round_, phase, serve_and_generate(cfg, plan, prompts, record, phase, spec, number))
    runner = runner_from_log(Path(cfg.out) / log_name("draft", 1))
    record.environment["runner"] = runner
    for phase in PHASES:
        binding = omp_binding(Path(cfg.out) / log_name(phase, 1))
        if binding:
            record.environment["vllm_omp_binding"][phase] = binding
    spec = kinds.get(plan.draft.kind)
    if spec.v2_runner and runner != "v2":
        name = spec.title
        record.extra_failures.append(
            f"the {name} draft was not served by vLLM's V2 model runner (log says: {runner or 'no runner line'}); "
            "only that runner runs it as trained. Serve on a GPU vLLM with Triton."
        )


def other_phase(phase: str) -> str:
    return PHASES[1 - PHASES.index(phase)]


def log_name(phase: str, round_number: int) -> str:
    """vllm_<phase>.log for round 1 (as with a single round), vllm_<phase>_round<N>.log after it."""
    return f"vllm_{phase}{phase_suffix(round_number)}.log"


def phase_suffix(round_number: int) -> str:
    return "" if round_number == 1 else f"_round{round_number}"


def serve_and_generate(
    cfg: ServeConfig, plan: Plan, prompts, record: RunRecord, phase: str, speculative: Optional[dict], number: int
) -> List[Completion]:
    """One fresh server for `phase` (with the draft when `speculative` is given): start it, generate
    every prompt (timed, the draft's counters read around them), stop it."""
    with start_server(cfg, plan, record, phase, speculative, number) as server:
        completions = generate_on(cfg, server, prompts, record, phase, speculative is not None, number)
    say(f"{_label(record, phase, number)}: server stopped")
    return completions


def start_pair(cfg: ServeConfig, plan: Plan, record: RunRecord, speculative: dict, stack: contextlib.ExitStack) -> dict:
    """One server of each side for every round, loading side by side (one start-up's wait for both); `stack`
    stops them when the rounds end. A frozen pair's servers are frozen until their own requests."""
    method = record.settings["servers"]
    servers = {phase: new_server(cfg, plan, phase, speculative if phase == "draft" else None, 1) for phase in PHASES}
    say(f"baseline and draft ({method}, for every round): starting both vLLM servers side by side "
        f"(logs: {', '.join(str(s.log_path) for s in servers.values())})")
    start_together(list(servers.values()))
    stack.callback(stop_together, list(servers.values()))  # both at once: two stuck servers, one grace period
    for phase, server in servers.items():
        record.timings_s[f"startup_{phase}"] = server.startup_s
        say(f"{phase} ({method}): server up on {server.url} after {server.startup_s:.1f} s")
        if method == "frozen":
            server.freeze()
    return servers


def new_server(cfg: ServeConfig, plan: Plan, phase: str, speculative: Optional[dict], number: int) -> VllmServer:
    """The vLLM server of one side, not yet started; its log starts afresh."""
    args, env = server_arguments(cfg, plan.device)
    if speculative is not None:
        env = with_v2_runner(env, plan.draft.kind, plan.draft.mixed_attention)
    log_path = Path(cfg.out) / log_name(phase, number)
    log_path.unlink(missing_ok=True)
    return VllmServer(cfg.vllm_python_path(), _model(cfg), log_path=log_path, speculative_config=speculative,
                      args=args, env=env, startup_timeout_s=cfg.startup_timeout_s)


@contextlib.contextmanager
def start_server(cfg: ServeConfig, plan: Plan, record: RunRecord, phase: str, speculative: Optional[dict], number: int):
    label = _label(record, phase, number)
    server = new_server(cfg, plan, phase, speculative, number)
    say(f"{label}: starting vLLM (log: {server.log_path})")  # before the minute of its start-up, not after
    with server:
        record.timings_s[f"startup_{phase}{phase_suffix(number)}"] = server.startup_s
        say(f"{label}: server up on {server.url} after {server.startup_s:.1f} s")
        yield server


def paired_round(cfg: ServeConfig, servers: dict, prompts: List[EncodedPrompt], record: RunRecord, round_: Round,
                 number: int, frozen: bool) -> None:
    """Every prompt on both servers in two halves, the order reversed for the second (baseline, draft, draft,
    baseline in an odd round): drift on the machine that runs one way through the round hits both sides
    alike, with three switches between the servers in all. Not prompt by prompt: a server that has just
    answered keeps a core busy for a while (0.6 s a request measured on a draft server), which would slow
    the other side's next request at every switch. The draft's counters are read around each of its
    prompts (its drafting rounds per prompt give the round cost's interval). Before each half a side
    starts, the other server is waited on until it is quiet. Each server warms up before round 1. A server
    that dies mid-round leaves the prompts both sides finished in the report."""
    if number == 1:
        for phase in PHASES:
            with awake(servers[phase], frozen):
                warm_up(cfg, servers[phase], prompts, record, phase)
    done = {phase: {} for phase in PHASES}  # prompt index -> Completion
    drafts = {}  # prompt index -> the draft's counters over that prompt
    half = (len(prompts) + 1) // 2
    try:
        for block, order in ((range(half), round_.order), (range(half, len(prompts)), round_.order[::-1])):
            for phase in order:
                serve_half(cfg, servers, prompts, block, record, phase, number, frozen, done[phase], drafts)
    finally:
        both = [i for i in range(len(prompts)) if i in done["baseline"] and i in done["draft"]]
        round_.baseline, round_.draft = [done["baseline"][i] for i in both], [done["draft"][i] for i in both]
        round_.prompt_drafts, round_.halves = [drafts[i].num_drafts for i in both], True
        round_.metrics = functools.reduce(SpecMetrics.plus, (drafts[i] for i in both), SpecMetrics()) if both else None
    which = f"round {number}/{record.planned_rounds}" if record.planned_rounds > 1 else "the round"
    spent = [record.timings_s[f"generation_{phase}{phase_suffix(number)}"] for phase in PHASES]
    say(f"{which}: {len(prompts)} prompts on each side in two halves, the order reversed for the second "
        f"({spent[0]:.1f} s baseline, {spent[1]:.1f} s draft)")


def serve_half(cfg: ServeConfig, servers: dict, prompts: List[EncodedPrompt], block: range, record: RunRecord,
               phase: str, number: int, frozen: bool, done: dict, drafts: dict) -> None:
    """`block`'s prompts on `phase`'s server, once the other is quiet; its seconds, and the idle server's CPU
    seconds meanwhile, are added to the phase's timings."""
    server, idle = servers[phase], servers[other_phase(phase)]
    key = f"{phase}{phase_suffix(number)}"
    record.quiet_wait_s[key] = record.quiet_wait_s.get(key, 0.0) + wait_until_quiet(idle)
    with awake(server, frozen):
        idle_before = idle.cpu_seconds()
        for i in block:
            before = read_metrics(server, phase) if phase == "draft" else None
            done[i] = request(cfg, server, prompts[i], record, phase, number)
            record.timings_s[f"generation_{key}"] = record.timings_s.get(f"generation_{key}", 0.0) + done[i].seconds
            if before is not None:
                drafts[i] = read_metrics(server, phase).minus(before)
        record.idle_cpu_s[key] = record.idle_cpu_s.get(key, 0.0) + idle.cpu_seconds() - idle_before


def wait_until_quiet(server: VllmServer) -> float:
    """Seconds until `server` used under QUIET_CPU_S of CPU in QUIET_WINDOW_S (at most QUIET_MAX_S): a vLLM
    server that has just answered keeps a core busy for up to a second (1.0 s measured while the other
    side's first requests ran), which the other side's timing must not pay."""
    began = time.monotonic()
    last = server.cpu_seconds()
    while time.monotonic() - began < QUIET_MAX_S:
        time.sleep(QUIET_WINDOW_S)
        now = server.cpu_seconds()
        if now - last < QUIET_CPU_S:
            break
        last = now
    return time.monotonic() - began


@contextlib.contextmanager
def awake(server: VllmServer, frozen: bool):
    """A frozen pair's server thawed for its own requests only."""
    if frozen:
        server.thaw()
    try:
        yield server
    finally:
        if frozen:
            server.freeze()


def warm_up(cfg: ServeConfig, server: VllmServer, prompts, record: RunRecord, phase: str) -> None:
    """Untimed: `warmup_prompts` prompts in full, then one short request (lazy initialisation and first-call
    costs must not count as decoding time)."""
    try:
        began = time.perf_counter()
        if cfg.warmup_prompts:
            complete_all(server.url, _model(cfg), prompts[: cfg.warmup_prompts], cfg.max_tokens, cfg.request_timeout_s,
                         cfg.ignore_eos)
        complete(server.url, _model(cfg), prompts[0], min(WARM_UP_TOKENS, cfg.max_tokens), cfg.request_timeout_s)
        record.timings_s[f"warmup_{phase}"] = time.perf_counter() - began
    except RequestError as err:
        raise _failed(server, f"the {phase} warm-up", err) from None


def request(cfg: ServeConfig, server: VllmServer, prompt: EncodedPrompt, record: RunRecord, phase: str, number: int) -> Completion:
    try:
        return complete(server.url, _model(cfg), prompt, cfg.max_tokens, cfg.request_timeout_s, cfg.ignore_eos)
    except RequestError as err:
        raise _failed(server, f"the {_label(record, phase, number)} run", err) from None


def read_metrics(server: VllmServer, phase: str):
    try:
        return read_spec_metrics(server.url)
    except RequestError as err:
        raise _failed(server, f"reading the {phase} server's counters", err) from None


def _failed(server: VllmServer, what: str, err: Exception) -> ServerError:
    state = "is still up" if server.alive() else "has exited"
    return ServerError(f"{what} failed: {err}\nThe server {state}; {server.tail_message()}")


def generate_on(cfg: ServeConfig, server: VllmServer, prompts, record: RunRecord, phase: str, speculative: bool,
                number: int) -> List[Completion]:
    """Every prompt on a fresh `server`, after its warm-up, timed."""
    key = f"{phase}{phase_suffix(number)}"
    warm_up(cfg, server, prompts, record, key)
    try:
        completions = _generate(cfg, server, _model(cfg), prompts, record, key, speculative)
    except RequestError as err:
        raise _failed(server, f"the {_label(record, phase, number)} run", err) from None
    say(f"{_label(record, phase, number)}: {len(completions)} prompts in {record.timings_s[f'generation_{key}']:.1f} s")
    return completions


def _label(record: RunRecord, phase: str, number: int) -> str:
    return phase if record.planned_rounds == 1 else f"round {number}/{record.planned_rounds} {phase}"


def _model(cfg: ServeConfig) -> str:
    return str(Path(cfg.target_dir).resolve())


def _generate(
    cfg: ServeConfig, server: VllmServer, model: str, prompts, record: RunRecord, key: str, speculative: bool
) -> List[Completion]:
    """Every prompt timed; a draft run also reads the counters around them."""
    before = read_spec_metrics(server.url) if speculative else None
    began = time.perf_counter()
    completions = complete_all(server.url, model, prompts, cfg.max_tokens, cfg.request_timeout_s, cfg.ignore_eos)
    record.timings_s[f"generation_{key}"] = time.perf_counter() - began
    if speculative:
        record.rounds[-1].metrics = read_spec_metrics(server.url).minus(before)
    return completions


def with_v2_runner(env: dict, kind: str, mixed_attention: bool = False) -> dict:
    """The draft server's environment: for a draft vLLM serves only on its V2 model runner, the variable the
    deploy line sets (export/deploy_line.py), so the check serves the draft as users will deploy it; a
    value the user set wins."""
    if not v2_runner_reason(kind, mixed_attention) or V2_RUNNER_ENV in os.environ or V2_RUNNER_ENV in env:
        return env
    return {**env, V2_RUNNER_ENV: "1"}


def server_arguments(cfg: ServeConfig, device: str) -> tuple[list, dict]:
    """(vLLM arguments, environment) shared by both runs; extra_vllm_args come last and win."""
    args, env = server_settings(device, cfg.max_model_len, cfg.max_num_seqs, cfg.kv_cache_gib)
    # Every measured phase prefills every prompt: a kept or frozen server would otherwise serve rounds 2+
    # from its prefix cache and a fresh one would not, and methods could not be compared.
    args.append("--no-enable-prefix-caching")
    return args + list(cfg.extra_vllm_args), env


def runner_from_log(path: Path) -> Optional[str]:
    """"v2" / "v1" from vLLM's own start-up lines; None when the log names neither."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for marker, runner in RUNNER_MARKERS:
        if re.search(re.escape(marker), text):
            return runner
    return None
