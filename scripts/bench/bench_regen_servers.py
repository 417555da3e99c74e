"""Regeneration on one vLLM server against two (each on its own cores) and against one with vLLM's own data
parallelism, on the same prompts, with the same requests in flight.

    .venv/bin/python scripts/bench/bench_regen_servers.py [--sides one two dp] [--rounds 3] [--rows 48]
        [--max-tokens 64] [--in-flight 32] [--target .cache/targets/smollm2-135m-instruct] [--out runs/bench_regen_servers]

Each side is started once, by regen's own code (blockdraft.regen.answerers), with `cpu_threads_bind=all`:
`one` is servers=1 on every core, `two` is servers=2 with the cores split between them, `dp` is servers=1 with
`extra_vllm_args=[--data-parallel-size, 2]` (a core per engine). Every side keeps `--in-flight` requests in
flight in all (regen.workers is per server, and per engine under data parallelism). Each side answers a few
warm-up prompts, then `--rounds` rounds: in each, every side answers the same `--rows` ShareGPT prompts
(another slice each round, so no prefix cache helps), the sides in turn, their order reversed every other
round; the sides not measured are frozen (SIGSTOP of their process groups) so they take no CPU. Tokens/s is
regen's own count of generated tokens over the seconds of its run (blockdraft.regen.runner), start-up
excluded. Needs .venv-serve; the SmolLM2 target comes from `python -m blockdraft.models.prepare_gguf` (else
pass `--target` the tiny one). Run nothing else on the cores meanwhile. Writes the `regen_servers` section of
docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path

from publish import REPO, command_line, provenance, publish, shown_path

SIDES = {
    "one": ("one server, every core", dict(servers=1), 1),
    "two": ("two servers, the cores split", dict(servers=2), 2),
    "dp": ("one server, --data-parallel-size 2", dict(servers=1, extra_vllm_args=["--data-parallel-size", "2"]), 2),
}


def side_config(args, name: str, out: Path):
    from blockdraft.regen.config import RegenConfig

    _, overrides, share = SIDES[name]
    return RegenConfig(target_dir=str(args.target), out=str(out / name), prompts="sharegpt", max_tokens=args.max_tokens,
                       max_prompt_tokens=args.max_prompt_tokens, workers=args.in_flight // share, kv_cache_gib=1,
                       cpu_threads_bind="all", progress=False, backend="vllm", **overrides).validate()


def prompts(args, tokenizer) -> list:
    from blockdraft.regen.config import RegenConfig
    from blockdraft.regen.prompt_plan import plan_splits

    total = args.rows * (args.rounds + 1)  # a slice of warm-up prompts, then one per round
    plan = RegenConfig(target_dir=str(args.target), out="-", prompts="sharegpt", num_train=total, num_heldout=0,
                       heldout_skip=0, max_prompt_tokens=args.max_prompt_tokens)
    conversations = plan_splits(plan, tokenizer)["train"].conversations
    assert len(conversations) == total, f"only {len(conversations)} usable ShareGPT prompts"
    return conversations


def machine_cpu_s() -> float:
    """CPU seconds every process of the machine has used since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s(answering) -> float:
    """CPU seconds of this process and of the measured side's servers (their live processes)."""
    times = os.times()
    return times.user + times.system + sum(a.process.cpu_seconds() for a in answering)


def answer(cfg, answering, conversations, scratch: Path) -> dict:
    """Regen's own run over the prompts; `others_cpu_s`: what the rest of the machine used meanwhile (a shared
    machine's other work, which the round's figure does not control for)."""
    from blockdraft.regen.runner import regenerate_rows
    from blockdraft.regen.shards import ShardedRows

    shutil.rmtree(scratch, ignore_errors=True)
    machine, ours = machine_cpu_s(), own_cpu_s(answering)
    stats = regenerate_rows(conversations, ShardedRows(scratch, 256), answering, cfg.settings("vllm"), progress=False)
    others = (machine_cpu_s() - machine) - (own_cpu_s(answering) - ours)
    return {"tokens": stats.tokens, "seconds": stats.seconds, "tokens_per_s": stats.tokens_per_s, "rows": stats.rows,
            "others_cpu_s": max(0.0, others)}


def freeze(answering, frozen: bool) -> None:
    for answerer in answering:
        answerer.process.freeze() if frozen else answerer.process.thaw()


def measure(args, out: Path) -> tuple:
    from transformers import AutoTokenizer

    from blockdraft.regen.answerers import answerers

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    conversations = prompts(args, tokenizer)
    warm, rows = conversations[: args.rows], [conversations[args.rows * (r + 1): args.rows * (r + 2)] for r in range(args.rounds)]
    results = {name: [] for name in args.sides}
    with ExitStack() as stack:
        sides = {}
        for name in args.sides:  # started one after another, each frozen once warm: no start-up runs beside another
            cfg = side_config(args, name, out)
            sides[name] = (cfg, stack.enter_context(answerers(cfg, "vllm", tokenizer, Path(cfg.out))))
            answer(cfg, sides[name][1], warm[: max(8, args.in_flight // 2)], out / "scratch")
            freeze(sides[name][1], True)
        for r in range(args.rounds):
            for name in args.sides if r % 2 == 0 else list(reversed(args.sides)):
                cfg, answering = sides[name]
                freeze(answering, False)
                result = answer(cfg, answering, rows[r], out / "scratch")
                freeze(answering, True)
                results[name].append(result)
                print(f"round {r + 1} {name}: {result['tokens']} tokens in {result['seconds']:.1f} s, "
                      f"{result['tokens_per_s']:.1f} tokens/s; other processes {result['others_cpu_s']:.1f} CPU s", flush=True)
        details = {name: [a.record() for a in answering] for name, (_, answering) in sides.items()}
        for _, answering in sides.values():
            freeze(answering, False)  # continued before the stack stops them
    return results, details


def table(args, results: dict, details: dict) -> str:
    base = statistics.median(r["tokens_per_s"] for r in results[args.sides[0]])
    lines = ["| side | in flight | servers (devices) | tokens/s by round | median tokens/s (spread) | vs "
             f"`{args.sides[0]}` | other processes' CPU s by round |", "|---|---|---|---|---|---|---|"]
    for name in args.sides:
        speeds = [r["tokens_per_s"] for r in results[name]]
        median = statistics.median(speeds)
        # vLLM writes one run of cores per rank joined by |, which would end a table cell.
        servers = "; ".join(f"{d['devices']}, {d['in_flight']} in flight" for d in details[name]).replace("|", "\\|")
        others = " / ".join(f"{r['others_cpu_s']:.1f}" for r in results[name])
        lines.append(f"| `{name}`: {SIDES[name][0]} | {args.in_flight} | {servers} | "
                     f"{' / '.join(f'{s:.1f}' for s in speeds)} | **{median:.1f}** ({min(speeds):.1f}-{max(speeds):.1f}) "
                     f"| {median / base:.2f}x | {others} |")
    tokens = {name: sorted({r['tokens'] for r in results[name]}) for name in args.sides}
    bindings = "; ".join(f"`{name}`: " + " / ".join(str(d["vllm_omp_binding"]) for d in details[name]) for name in args.sides)
    return ("\n".join(lines) + "\n\n"
            f"{args.rows} ShareGPT prompts a round (another slice each round, the same for every side), replies of at most "
            f"{args.max_tokens} tokens, {args.rounds} rounds with the order of the sides reversed every other round, the idle "
            f"sides frozen; target `{shown_path(args.target)}`. Generated tokens per round and side: {tokens}. "
            f"vLLM's binding lines (the first each log holds: one engine's under data parallelism): {bindings}.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sides", nargs="+", default=["one", "two", "dp"], choices=list(SIDES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--in-flight", type=int, default=32)
    default_target = REPO / ".cache" / "targets" / "smollm2-135m-instruct"
    parser.add_argument("--target", type=Path, default=default_target if default_target.is_dir()
                        else REPO / ".cache" / "targets" / "tiny-qwen3")
    parser.add_argument("--out", type=Path, default=None, help="logs and regen.json per side (default: a temporary folder)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_regen_servers_"))
    results, details = measure(args, out)
    body = provenance(command_line(env="OMP_WAIT_POLICY=PASSIVE")) + "\n" + table(args, results, details)
    publish("regen_servers", "Regeneration: one server, two, or vLLM's data parallelism on one CPU", body)


if __name__ == "__main__":
    main()
