"""What one draft-and-verify round costs in vLLM, and the draft's own share of it, per draft.

    .venv-serve/bin/python scripts/bench/bench_vllm_round.py --target .cache/targets/smollm2-135m-instruct \\
        --draft full=<export> --draft reduced8192=<export> [--prompts .cache/demo/regen/heldout.jsonl]

Run with the serving interpreter. Each draft gets its own process running vLLM in-process
(no engine subprocess), so the drafter's `propose` can be timed directly: on a CPU every call is
synchronous. A round is one engine step while decoding (one `propose` call); its time is the
decode wall time over the rounds. Greedy, one request at a time, the drafts alternated
`--repeats` times so that drift on the machine hits both alike. Writes docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from publish import REPO, command_line, provenance, publish


def prompts_of(path: Path, n: int) -> list:
    out = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        messages = row.get("messages") or []
        user = [m for m in messages if m.get("role") == "user"]
        if user:
            out.append([user[0]])
        if len(out) == n:
            break
    return out


def child(args) -> None:
    """One draft: decode every prompt, time the drafter's propose calls."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    config = json.loads((Path(args.child) / "config.json").read_text())
    k = config["dflash_config"]["block_size"] - 1
    llm = LLM(model=args.target, speculative_config={"method": "dflash", "model": args.child, "num_speculative_tokens": k},
              enforce_eager=True, dtype="float32", max_model_len=1024, max_num_seqs=1, seed=0)
    drafter = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
    spent = {"propose_s": 0.0, "rounds": 0}
    propose = drafter.propose

    def timed(*a, **kw):
        began = time.perf_counter()
        try:
            return propose(*a, **kw)
        finally:
            spent["propose_s"] += time.perf_counter() - began
            spent["rounds"] += 1

    drafter.propose = timed
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in prompts_of(Path(args.prompts), args.num_prompts)]
    ids = [tokenizer(text, add_special_tokens=False).input_ids for text in texts]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": ids[0]}], params, use_tqdm=False)  # warm-up
    spent.update(propose_s=0.0, rounds=0)
    began, tokens = time.perf_counter(), 0
    for prompt in ids:
        tokens += len(llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0].token_ids)
    wall = time.perf_counter() - began
    print("ROUND " + json.dumps({"wall_s": wall, "tokens": tokens, "draft_vocab_size": config.get("draft_vocab_size"), **spent}), flush=True)


def measure(args, path: str) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, __file__, "--child", path, "--target", args.target, "--prompts", args.prompts,
            "--num-prompts", str(args.num_prompts), "--max-tokens", str(args.max_tokens)]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("ROUND ")), None)
    if line is None:
        sys.exit(f"vLLM run for {path} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(line[6:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=".cache/targets/smollm2-135m-instruct")
    parser.add_argument("--draft", action="append", default=[], metavar="LABEL=DIR")
    parser.add_argument("--prompts", default=".cache/demo/regen/heldout.jsonl")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    drafts = dict(d.split("=", 1) for d in args.draft)
    runs = {label: [] for label in drafts}
    for _ in range(args.repeats):
        for label, path in drafts.items():
            runs[label].append(measure(args, path))
            print(label, runs[label][-1], flush=True)
    rows = ["| draft | draft vocabulary | round (ms), median [min-max] | draft's propose (ms) | draft's share of a round | tokens/s |",
            "|---|---|---|---|---|---|"]
    for label, rs in runs.items():
        round_ms = [r["wall_s"] / r["rounds"] * 1e3 for r in rs]
        propose_ms = [r["propose_s"] / r["rounds"] * 1e3 for r in rs]
        share = [r["propose_s"] / r["wall_s"] for r in rs]
        tps = [r["tokens"] / r["wall_s"] for r in rs]
        rows.append(f"| {label} | {rs[0]['draft_vocab_size'] or 'full (49152)'} | {statistics.median(round_ms):.1f} [{min(round_ms):.1f}-{max(round_ms):.1f}] | "
                    f"{statistics.median(propose_ms):.1f} | {statistics.median(share):.0%} | {statistics.median(tps):.1f} |")
    command = command_line(python=".venv-serve/bin/python", env="OMP_WAIT_POLICY=PASSIVE")
    body = (provenance(command) + "\n" + f"vLLM {__import__('vllm').__version__}, CPU, float32, greedy, one request at a time, "
            f"{args.num_prompts} held-out prompts x {args.max_tokens} tokens (ignore_eos), {args.repeats} runs per draft alternated. "
            "A round is one decode step: the drafter's propose plus the target's verification of the block; "
            "tokens/s depends on each draft's acceptance, the round's cost does not.\n\n" + "\n".join(rows) + "\n")
    publish("vllm_round", "vLLM decode round: reduced vs full draft vocabulary (SmolLM2-135M)", body)


if __name__ == "__main__":
    main()
