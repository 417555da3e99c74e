"""The evaluation: preflight every draft -> one server per draft (and one for the target alone)
running every cell it owns -> eval.json, eval.md and the plots.

A server is started once and answers all its cells (datasets x settings x concurrencies) one
after the other, its spec-decode counters read around each; the target alone runs each cell once,
shared by every draft. Finished cells are kept (cells.py), so a rerun starts only the servers
that still have work. A DFlash2 draft that the serving vLLM cannot run goes to the reference
engine, at concurrency 1, and its cells say so.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

from blockdraft.data.held_out import SHAREGPT_HELD_OUT_START
from blockdraft.eval.cells import BASELINE, Cell, CellKey, CellStore, directory_fingerprint, identity
from blockdraft.eval.config import EvalAppConfig, draft_label, settle_top_k
from blockdraft.serve.client import RequestError, complete, complete_concurrently, read_spec_metrics
from blockdraft.serve.harness import WARM_UP_TOKENS, server_arguments, speculative_config
from blockdraft.serve.held_out_check import HeldOut, measure, refuse_trained_on
from blockdraft.serve.preflight import Plan, plan_serving
from blockdraft.serve.prompts import EncodedPrompt, encode_prompts, iter_prompts
from blockdraft.vllm_runtime.probe import probe_vllm
from blockdraft.vllm_runtime.server import ServerError, VllmServer


def say(message: str) -> None:
    print(f"[eval] {message}", file=sys.stderr, flush=True)


class Evaluation:
    def __init__(self, cfg: EvalAppConfig):
        self.cfg = cfg.validate()
        self.out = Path(cfg.out)
        # Every draft is checked against the target and the serving vLLM before anything loads.
        self.plans: Dict[str, Tuple[str, Plan]] = {}
        probed: Dict[tuple, object] = {}

        def probe_once(python, architecture):  # the same vLLM answers the same for every draft
            if (python, architecture) not in probed:
                probed[(python, architecture)] = probe_vllm(python, architecture)
            return probed[(python, architecture)]

        for directory in cfg.drafts:
            plan = plan_serving(cfg.serve_config(directory), probe=probe_once)
            for warning in plan.warnings:
                say(f"{draft_label(directory)}: warning: {warning}")
            self.plans[draft_label(directory)] = (directory, plan)
        # What the table says of the sampled settings: a default top-k a CPU vLLM cannot take is dropped.
        self.sampling_notes = settle_top_k(cfg, self.first_plan.device,
                                           any(plan.engine == "vllm" for _, plan in self.plans.values()))
        for note in self.sampling_notes:
            say(note)
        self.out.mkdir(parents=True, exist_ok=True)
        self.store = CellStore(self.out)
        self.cells: Dict[CellKey, Cell] = {}
        self.prompts: Dict[str, List[EncodedPrompt]] = {}
        self.too_long: Dict[str, List[str]] = {}  # per dataset: prompts over max_model_len - max_tokens
        self.not_run: List[str] = []  # cells no engine here can run
        self.held_out: Dict[str, Dict[str, HeldOut]] = {}  # per draft, per dataset: its prompts against its training
        self.timings: Dict[str, float] = {}

    @property
    def first_plan(self) -> Plan:
        return next(iter(self.plans.values()))[1]

    # --- prompts ------------------------------------------------------------------------
    def encode(self) -> None:
        """Every dataset's prompts as token ids, checked against each draft's training prompts before any
        server starts (kept only once they pass: a refused rerun rewrites no report)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.cfg.target_dir)
        encoded: Dict[str, List[EncodedPrompt]] = {}
        for dataset in self.cfg.datasets:
            o = self.cfg.options(dataset)
            budget = self.cfg.max_model_len - o.max_tokens
            rows = iter_prompts(dataset, o.skip)
            kept, too_long = encode_prompts(rows, tokenizer, o.use_chat_template, budget, o.chat_template_kwargs, limit=o.num_prompts)
            if not kept:
                from blockdraft.errors import ConfigError

                raise ConfigError(f"datasets: no prompt of {dataset!r} fits in max_model_len - max_tokens = {budget} tokens; "
                                  "raise max_model_len or lower max_tokens.")
            encoded[dataset] = kept
            self.too_long[dataset] = too_long
            say(f"{dataset}: {len(kept)} prompts" + (f" ({len(too_long)} longer than {budget} tokens skipped)" if too_long else ""))
        self.check_held_out(encoded)
        self.prompts = encoded

    def check_held_out(self, encoded: Dict[str, List[EncodedPrompt]]) -> None:
        """Refused when a draft trained on a dataset's prompts, unless allow_training_prompts=true; a draft
        without a record of its training prompts is measured with a warning."""
        found = []
        for label, (directory, _) in self.plans.items():
            self.held_out[label] = {d: measure(directory, [p.identity for p in prompts]) for d, prompts in encoded.items()}
            found += [(f"dataset {d!r} for {label}", held) for d, held in self.held_out[label].items()]
            first = next(iter(self.held_out[label].values()))
            if not first.recorded:
                say(f"{label}: warning: {first.line()}")
        refuse_trained_on(found, self.cfg.allow_training_prompts,
                          "dataset_options.<name>.skip= past them (ShareGPT's held-out range starts at "
                          f"{SHAREGPT_HELD_OUT_START}), or another dataset")
        for what, held in found:
            if held.trained_on:
                say(f"{what}: {held.headline()}")

    # --- cells --------------------------------------------------------------------------
    def keys(self, server: str) -> List[CellKey]:
        c = self.cfg
        return [CellKey(d, s, n, server) for d in c.datasets for s in c.settings for n in c.concurrency]

    def cell_identity(self, key: CellKey) -> str:
        o, spec = self.cfg.options(key.dataset), self.cfg.spec(key.setting)
        plan = None if key.server == BASELINE else self.plans[key.server][1]
        prompts = hashlib.sha256(repr([p.token_ids for p in self.prompts[key.dataset]]).encode()).hexdigest()
        return identity(
            target=directory_fingerprint(self.cfg.target_dir), prompts=prompts, max_tokens=o.max_tokens,
            sampling=[spec.temperature, spec.top_p, spec.top_k], concurrency=key.concurrency, seed=self.cfg.seed,
            ignore_eos=self.cfg.ignore_eos, vllm=self.first_plan.vllm.version, args=list(self.cfg.extra_vllm_args),
            draft=None if plan is None else directory_fingerprint(str(plan.draft.directory)),
            speculative_tokens=None if plan is None else plan.num_speculative_tokens,
            engine=None if plan is None else plan.engine,
        )

    def runnable(self, key: CellKey) -> bool:
        """The reference engine decodes one prompt at a time: it has no concurrency to measure."""
        return key.server == BASELINE or self.plans[key.server][1].engine == "vllm" or key.concurrency == 1

    def pending(self, server: str) -> List[CellKey]:
        todo = []
        for key in self.keys(server):
            if not self.runnable(key):
                self.not_run.append(
                    f"{server}: {key.dataset} / {key.setting} at concurrency {key.concurrency} "
                    "(the reference engine decodes one prompt at a time)")
                continue
            done = self.store.load(key, self.cell_identity(key))
            if done is None:
                todo.append(key)
            else:
                self.cells[key] = done
        return todo

    # --- the runs -----------------------------------------------------------------------
    def run(self) -> None:
        began = time.monotonic()
        self.encode()
        vllm_drafts = [label for label, (_, plan) in self.plans.items() if plan.engine == "vllm"]
        servers = ([BASELINE] if vllm_drafts else []) + list(self.plans)
        for number, server in enumerate(servers, start=1):
            todo = self.pending(server)
            label = f"[{number}/{len(servers)}] {server}"
            owned = sum(self.runnable(k) for k in self.keys(server))
            if not todo:
                say(f"{label}: all {owned} cells already done; nothing to run")
                continue
            say(f"{label}: {len(todo)} of {owned} cells to run")
            if server != BASELINE and self.plans[server][1].engine == "reference":
                self._run_reference(server, todo)
            else:
                self._run_vllm(server, todo, label)
        self.timings["total"] = time.monotonic() - began  # this invocation's (a rerun skips finished cells)

    def _run_vllm(self, server: str, todo: List[CellKey], label: str) -> None:
        cfg = self.cfg
        model = str(Path(cfg.target_dir).resolve())
        speculative = None
        if server != BASELINE:
            speculative = speculative_config(self.plans[server][1])
        serving = cfg.serve_config(cfg.drafts[0])  # the server settings, the same for every draft
        args, env = server_arguments(serving, self.first_plan.device)
        log_path = self.out / "logs" / f"vllm_{server}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        python = serving.vllm_python_path()
        say(f"{label}: starting vLLM (log: {log_path})")
        with VllmServer(python, model, log_path=log_path, speculative_config=speculative, args=args, env=env,
                        startup_timeout_s=cfg.startup_timeout_s) as srv:
            self.timings[f"startup_{server}"] = srv.startup_s
            say(f"{label}: server up after {srv.startup_s:.1f} s")
            try:
                first = next(iter(self.prompts.values()))[0]
                complete(srv.url, model, first, WARM_UP_TOKENS, cfg.request_timeout_s)
                for i, key in enumerate(todo, start=1):
                    self._run_cell(srv.url, model, key, speculative is not None, f"{label} cell {i}/{len(todo)}")
            except RequestError as err:
                state = "is still up" if srv.alive() else "has exited"
                raise ServerError(f"{label}: {err}\nThe server {state}; {srv.tail_message()}") from None
        say(f"{label}: server stopped")

    def _run_cell(self, url: str, model: str, key: CellKey, speculative: bool, label: str) -> None:
        cfg, prompts = self.cfg, self.prompts[key.dataset]
        o = cfg.options(key.dataset)
        say(f"{label}: {key.dataset} / {key.setting} / concurrency {key.concurrency}: {len(prompts)} prompts")
        before = read_spec_metrics(url) if speculative else None
        began = time.perf_counter()
        completions = complete_concurrently(url, model, prompts, o.max_tokens, cfg.request_timeout_s, key.concurrency,
                                            cfg.ignore_eos, cfg.sampling_of(key.setting), cfg.seed)
        wall = time.perf_counter() - began
        metrics = read_spec_metrics(url).minus(before) if speculative else None
        cell = Cell(key, self.cell_identity(key), "vllm", completions, wall, metrics)
        self.store.save(cell)
        self.cells[key] = cell
        say(f"{label}: {cell.tokens} tokens in {wall:.1f} s ({cell.tokens_per_s or 0:.1f} tokens/s)")

    def _run_reference(self, server: str, todo: List[CellKey]) -> None:
        """A draft the serving vLLM cannot run (DFlash2 on a CPU, Domino anywhere): the reference
        engine, one prompt at a time, with the target alone decoded in the same process as this
        cell's own baseline."""
        from blockdraft.engine.decoder import DecodeStats
        from blockdraft.engine.sampling import SamplingParams
        from blockdraft.serve.reference_check import decode_all, load_engine, spec_metrics

        plan = self.plans[server][1]
        say(f"{server}: REFERENCE ENGINE (this vLLM cannot run the draft: see its warning above), concurrency 1 only")
        engine = load_engine(plan, self.cfg.ignore_eos)
        for key in todo:
            spec, o = self.cfg.spec(key.setting), self.cfg.options(key.dataset)
            params = SamplingParams(spec.temperature, spec.top_k, spec.top_p)
            prompts, stats = self.prompts[key.dataset], DecodeStats(engine.k)
            began = time.perf_counter()
            baseline = decode_all(engine.target_generate, prompts, o.max_tokens, None, params, self.cfg.seed)
            middle = time.perf_counter()
            draft = decode_all(engine.generate, prompts, o.max_tokens, stats, params, self.cfg.seed)
            cell = Cell(key, self.cell_identity(key), "reference", draft, time.perf_counter() - middle,
                        spec_metrics(stats, engine.k), baseline, middle - began)
            self.store.save(cell)
            self.cells[key] = cell
            say(f"{server}: {key.dataset} / {key.setting}: done on the reference engine")
