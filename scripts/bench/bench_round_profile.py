"""Where a vLLM draft-and-verify round's time goes on a CPU, phase by phase, and the round cost at each k.

    OMP_WAIT_POLICY=PASSIVE .venv-serve/bin/python scripts/bench/bench_round_profile.py \\
        [--target .cache/targets/smollm2-135m-instruct] [--ks 1,2,3] [--repeats 2] [--levers]

Run with the serving interpreter. The drafts are untrained drafts of the demo recipe's shape
(experiment=smollm2_dflash_cpu), written once under --draft-root by the training interpreter: a
round's time does not depend on the weights. Each configuration (plain decode, then the draft at each
num_speculative_tokens k) gets its own process running vLLM in-process (no engine subprocess), so
every engine step and the methods inside it can be timed directly: on a CPU every call is synchronous.
Greedy, one request, ignore_eos; only decode steps are kept (each request's prefill step is dropped).
The configurations are alternated --repeats times so that drift on the machine hits them alike; the
round cost at k is the median decode step with the draft over the median plain step of the same repeat.
--levers adds, to every repeat, the draft at the largest k with a 4096-token draft vocabulary, and plain
and that draft with VLLM_CPU_OMP_THREADS_BIND=nobind (OpenMP threads left to torch, not pinned).
Writes docs/benchmarks-history.md (section round_profile).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from publish import DOC, REPO, command_line, provenance, publish

RECIPE = "smollm2_dflash_cpu"
# Set by scripts/bench/emulate_avx2.sh: every process of the run takes the code paths of a CPU without AVX-512.
EMULATED = os.environ.get("BLOCKDRAFT_EMULATED_ISA", "")
EMULATION_NOTE = {"avx2": (
    "Run under `scripts/bench/emulate_avx2.sh`: torch, oneDNN, MKL and vLLM (its `_C_AVX2` kernels) take the "
    "code paths of a CPU without AVX-512 on this AVX-512 machine, whose cores, caches and memory stay its own. "
    "Its milliseconds are not that CPU's; how a round's cost grows against a plain step is what it shows.\n\n")}
# What each timed method is called in the table, in the order a round runs them. Timings nest
# (propose holds the draft's forward); exclusive times are taken in `phases_of`.
PHASES = (
    ("target_forward", "target forward"),  # the target over 1 token (plain) or 1+k (a round)
    ("target_logits", "target logits"),  # the target's lm_head over the tokens sampled
    ("sample", "sampling"),  # the sampler, or the rejection sampler in a round
    ("draft_inputs", "draft inputs"),  # set_inputs_first_pass, attention metadata, model inputs
    ("draft_context", "draft context K/V"),  # fc over the target's layers, K/V of the context positions
    ("draft_forward", "draft forward"),  # the draft model over the 1+k query positions
    ("draft_head", "draft head"),  # its lm_head over the draft vocabulary, scattered to the full one, argmax
    ("draft_other", "draft other"),  # propose_draft_token_ids less the above: next tokens, copies to the CPU
    ("rest", "rest"),  # the step's wall time less every phase: scheduler, metadata, output processing
)


# --- the child: one configuration, vLLM in this process ------------------------------------
class StepClock:
    """Seconds spent in each wrapped method during the current engine step."""

    def __init__(self):
        self.now = {}

    def wrap(self, owner, attr: str, key: str) -> None:
        inner = getattr(owner, attr)

        def timed(*a, **kw):
            began = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.now[key] = self.now.get(key, 0.0) + time.perf_counter() - began

        setattr(owner, attr, timed)  # an instance attribute: `self.x(...)` and nn.Module.__call__ find it first


def instrument(llm, clock: StepClock) -> None:
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    clock.wrap(runner, "_model_forward", "target_forward")
    clock.wrap(runner.model, "compute_logits", "target_logits")
    clock.wrap(runner, "_sample", "sample")
    drafter = getattr(runner, "drafter", None)
    if drafter is None:
        return
    clock.wrap(runner, "propose_draft_token_ids", "drafter_total")
    clock.wrap(drafter, "propose", "propose")
    clock.wrap(drafter, "set_inputs_first_pass", "set_inputs")
    clock.wrap(drafter, "build_per_group_and_layer_attn_metadata", "attn_metadata")
    clock.wrap(drafter, "build_model_inputs_first_pass", "build_inputs")
    clock.wrap(drafter.model, "combine_hidden_states", "combine")
    clock.wrap(drafter.model, "precompute_and_store_context_kv", "context_kv")
    clock.wrap(drafter.model, "forward", "draft_forward")
    clock.wrap(drafter, "_sample_draft_tokens", "draft_head")


def phases_of(step: dict) -> dict:
    """One step's exclusive milliseconds per phase; `rest` is the step's wall time less every phase."""
    t = {k: v * 1e3 for k, v in step.items()}
    out = {k: t.get(k, 0.0) for k in ("target_forward", "target_logits", "sample", "draft_forward", "draft_head")}
    out["draft_context"] = t.get("combine", 0.0) + t.get("context_kv", 0.0)
    # build_model_inputs_first_pass holds the context K/V precompute: only its remainder is input building.
    out["draft_inputs"] = t.get("set_inputs", 0.0) + t.get("attn_metadata", 0.0) + t.get("build_inputs", 0.0) - t.get("context_kv", 0.0)
    out["draft_other"] = t.get("drafter_total", 0.0) - sum(out[k] for k in ("draft_inputs", "draft_context", "draft_forward", "draft_head"))
    out["rest"] = t["wall"] - sum(out[k] for k, _ in PHASES if k != "rest")
    out["wall"] = t["wall"]
    return out


def prompt_ids(args, tokenizer) -> list:
    if args.prompts == "tiny":
        from blockdraft.serve.prompts import TINY_PROMPTS

        conversations = [[{"role": "user", "content": text}] for text in TINY_PROMPTS]
    else:
        rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        conversations = [[m for m in row["messages"] if m["role"] == "user"][:1] for row in rows]
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations[:args.num_prompts]]
    return [tokenizer(text, add_special_tokens=False).input_ids for text in texts]


def decode(llm, clock: StepClock, ids: list, params, name: str) -> list:
    """Every step of one request, timed; its first (the prefill) dropped."""
    engine = llm.llm_engine
    engine.add_request(name, {"prompt_token_ids": ids}, params)
    steps = []
    while engine.has_unfinished_requests():
        clock.now = {}
        began = time.perf_counter()
        engine.step()
        steps.append({**clock.now, "wall": time.perf_counter() - began})
    return steps[1:]


def child(args) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    spec = {}
    if args.k:
        spec = {"speculative_config": {"method": "dflash", "model": args.draft, "num_speculative_tokens": args.k}}
    llm = LLM(model=args.target, enforce_eager=True, dtype="float32", max_model_len=1024, max_num_seqs=1, seed=0, **spec)
    clock = StepClock()
    instrument(llm, clock)
    print(f"TORCH_THREADS {torch.get_num_threads()}", flush=True)
    ids = prompt_ids(args, AutoTokenizer.from_pretrained(args.target))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    decode(llm, clock, ids[0], params, "warm-up")
    steps = []
    for i, prompt in enumerate(ids):
        steps += decode(llm, clock, prompt, params, f"p{i}")
    print("PROFILE " + json.dumps({"steps": [phases_of(s) for s in steps]}), flush=True)


# --- the parent: configurations alternated, the table written --------------------------------
def ensure_drafts(args, vocabs) -> dict:
    """The untrained export of the recipe's shape for each draft vocabulary, written by the training interpreter."""
    out = {}
    for vocab in vocabs:
        root = Path(args.draft_root) / f"vocab{vocab}"
        if not (root / "export" / "config.json").is_file():
            code = ("import sys; from pathlib import Path; from omegaconf import OmegaConf\n"
                    "from blockdraft.config import compose, register_schema\n"
                    "from blockdraft.config.recipe import TrainAppConfig\n"
                    "from blockdraft.pipeline.round_cost import write_untrained_export\n"
                    "register_schema('train_schema', TrainAppConfig)\n"
                    "t, root, vocab = sys.argv[1:4]\n"
                    f"cfg = OmegaConf.to_object(compose('train', ['experiment={RECIPE}', f'target.path={{t}}', 'target.tiny=null', "
                    "f'draft.draft_vocab_size={vocab}']))\n"
                    "write_untrained_export(cfg, t, Path(root))\n")
            env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
            done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", code, args.target, str(root), str(vocab)],
                                  cwd=REPO, env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"writing the untrained draft (draft_vocab_size={vocab}) failed:\n{done.stderr[-3000:]}")
        out[vocab] = str(root / "export")
    return out


def configurations(args, drafts: dict) -> list:
    """(label, k, draft dir, VLLM_CPU_OMP_THREADS_BIND)."""
    ks = [int(k) for k in args.ks.split(",")]
    main_vocab = drafts[args.vocab]
    out = [("plain", 0, None, "auto")] + [(f"k={k}", k, main_vocab, "auto") for k in ks]
    if args.levers:
        top = max(ks)
        out += [(f"k={top}, draft vocabulary {args.lever_vocab}", top, drafts[args.lever_vocab], "auto"),
                ("plain, nobind", 0, None, "nobind"), (f"k={top}, nobind", top, main_vocab, "nobind")]
    return out


def omp_env(bind: str) -> dict:
    """The OpenMP environment vLLM's multiprocessing executor gives its CPU worker under
    VLLM_CPU_OMP_THREADS_BIND=bind (auto: the model's threads pinned to every core but one, kept for the
    engine loop). In-process vLLM never applies it, so each child gets it here, as a server's worker would."""
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": bind}
    done = subprocess.run([sys.executable, __file__, "--omp-env"], cwd=REPO, env=env, capture_output=True, text=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("OMPENV ")), None)
    if line is None:
        sys.exit(f"could not read vLLM's OpenMP binding for {bind}:\n{done.stderr[-2000:]}")
    return json.loads(line[7:])


def print_omp_env() -> None:
    from types import SimpleNamespace

    from vllm.utils.ompmultiprocessing import OMPProcessManager

    # The fields OMPProcessManager reads of a one-worker, one-node config.
    config = SimpleNamespace(parallel_config=SimpleNamespace(local_world_size=1, data_parallel_rank_local=None,
                                                             _api_process_count=1), kv_transfer_config=None)
    before = dict(os.environ)
    with OMPProcessManager(config).configure_omp_envs(rank=0, local_rank=0):
        print("OMPENV " + json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}), flush=True)


def measure(args, label: str, k: int, draft, bind: str, binds: dict) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": bind,
           **binds[bind]}
    argv = [sys.executable, __file__, "--child", "--k", str(k), "--target", args.target, "--prompts", args.prompts,
            "--num-prompts", str(args.num_prompts), "--max-tokens", str(args.max_tokens)] + (["--draft", draft] if draft else [])
    began = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("PROFILE ")), None)
    if line is None:
        sys.exit(f"vLLM run for {label} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    threads = re.search(r"TORCH_THREADS (\d+)", done.stdout)
    places = binds[bind].get("OMP_PLACES", "unpinned")
    return {**json.loads(line[8:]), "cores": f"{threads.group(1) if threads else '?'} thread(s), {places}",
            "process_s": time.perf_counter() - began}


def median_of(run: dict, key: str) -> float:
    return statistics.median(s[key] for s in run["steps"])


def summary(label: str, runs: list, plains: list) -> str:
    """One row: each phase's median ms over the configuration's steps (pooled over repeats) with its share
    of the mean step, the median step, and the round cost per repeat against the plain run of that repeat."""
    steps = [s for r in runs for s in r["steps"]]
    mean_wall = statistics.fmean(s["wall"] for s in steps)
    cells = []
    for key, _ in PHASES:
        values = [s[key] for s in steps]
        cells.append(f"{statistics.median(values):.1f} ({statistics.fmean(values) / mean_wall:.0%})"
                     if any(abs(v) > 1e-3 for v in values) else "-")
    costs = [median_of(r, "wall") / median_of(p, "wall") for r, p in zip(runs, plains)]
    step = statistics.median(s["wall"] for s in steps)
    return (f"| {label} | " + " | ".join(cells) + f" | {step:.1f} | "
            f"**{statistics.median(costs):.2f}** [{min(costs):.2f}-{max(costs):.2f}] |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=".cache/targets/smollm2-135m-instruct")
    parser.add_argument("--draft-root", default=".cache/round_profile", help="where the untrained drafts are written (reused when there: delete it after changing the recipe)")
    parser.add_argument("--ks", default="1,2,3", help="num_speculative_tokens to profile (the demo's block 4 serves 3)")
    parser.add_argument("--vocab", type=int, default=8192, help="the draft vocabulary (the recipe's)")
    parser.add_argument("--lever-vocab", type=int, default=4096)
    parser.add_argument("--levers", action="store_true", help="also the smaller draft vocabulary and VLLM_CPU_OMP_THREADS_BIND=nobind")
    parser.add_argument("--prompts", default="tiny", help="tiny (built-in) or a JSONL of chat rows")
    parser.add_argument("--num-prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--doc", default=str(DOC), help="the page the section is written into")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--draft", help=argparse.SUPPRESS)
    parser.add_argument("--omp-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.omp_env:
        return print_omp_env()
    if args.child:
        return child(args)
    drafts = ensure_drafts(args, {args.vocab, *([args.lever_vocab] if args.levers else [])})
    configs = configurations(args, drafts)
    binds = {bind: omp_env(bind) for *_, bind in configs}
    runs = {label: [] for label, *_ in configs}
    for repeat in range(args.repeats):
        for label, k, draft, bind in configs:
            runs[label].append(measure(args, label, k, draft, bind, binds))
            r = runs[label][-1]
            print(f"repeat {repeat + 1} {label}: step {median_of(r, 'wall'):.2f} ms over {len(r['steps'])} steps, "
                  f"cores {r['cores']}, {r['process_s']:.0f} s", flush=True)
    key, title = "round_profile", "vLLM round profile: where a draft-and-verify round's time goes on a CPU (SmolLM2-135M)"
    if EMULATED == "avx2":
        key, title = "round_profile_avx2", "vLLM round profile with AVX2 code paths on an AVX-512 CPU (SmolLM2-135M)"
    publish(key, title, body(args, configs, runs), doc=Path(args.doc))


def body(args, configs, runs) -> str:
    rows = ["| configuration | " + " | ".join(name for _, name in PHASES) + " | step (ms) | round cost, median [min-max] |",
            "|---" * (len(PHASES) + 3) + "|"]
    for label, _, _, bind in configs:
        rows.append(summary(label, runs[label], runs["plain, nobind" if bind == "nobind" else "plain"]))
    cores = "; ".join(sorted({f"{bind}: {runs[label][0]['cores']}" for label, _, _, bind in configs}))
    command = command_line(python=".venv-serve/bin/python", env="OMP_WAIT_POLICY=PASSIVE")
    if EMULATED:
        command = command.replace("OMP_WAIT_POLICY=PASSIVE ", f"OMP_WAIT_POLICY=PASSIVE scripts/bench/emulate_{EMULATED}.sh ")
    return (provenance(command) + "\n" + EMULATION_NOTE.get(EMULATED, "") + f"vLLM {__import__('vllm').__version__}, CPU, float32, enforce_eager, greedy, one request, "
            f"{args.num_prompts} prompts ({args.prompts}) x {args.max_tokens} tokens (ignore_eos), decode steps only; "
            f"untrained drafts of `experiment={RECIPE}` (1 layer, block 4, draft vocabulary {args.vocab}); "
            f"configurations alternated {args.repeats} times, each in its own process. Phases are exclusive times "
            "in ms per decode step (median over the steps, pooled over the repeats: medians need not add up to the step), "
            "with their share of the mean step in brackets. Target forward: the target over 1 token (plain) or 1+k "
            "(a round); target logits: its lm_head; sampling: the sampler or the rejection sampler; draft inputs: "
            "the drafter's input and attention-metadata building; draft context K/V: the fc over the target's layers and "
            "the K/V of the new context positions; draft forward: the draft over its 1+k queries; draft head: its "
            "lm_head over the draft vocabulary, scattered into the full one, and the argmax; draft other: the rest of "
            "propose_draft_token_ids; rest: the step's wall time less all of these (scheduler, metadata, output "
            "processing). "
            "Round cost: the median step with the draft over the median plain step of the same repeat, median [min-max] "
            f"over the repeats (nobind rows against plain nobind). vLLM in-process applies no OpenMP binding, so each "
            "process gets the environment vLLM's multiprocessing executor gives a server's CPU worker under its "
            f"VLLM_CPU_OMP_THREADS_BIND (auto unless the row says nobind); the model's threads: {cores}.\n\n"
            + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
