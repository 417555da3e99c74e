"""The memory-mapped token file at 10k, 100k and 1M rows: the time to tokenise and write it, its size,
and for two ranks mapping it at once, each rank's resident memory, open time and random batches read per
second; against the single `.pt` cache every rank loaded whole before it, where that is cheap.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench/bench_token_file.py \\
        [--rows 10000 100000 1000000] [--tokenise-up-to 100000] [--old-up-to 100000] [--dir /tmp/bench-token-file]

Rows are synthetic chats whose token counts follow a log-normal law like a chat set's (median 450, a long
tail, cut to 2048 = data.seq_length). Up to --tokenise-up-to rows they are JSONL rows put through the whole
path (row checks, chat template, the byte-level tiny tokenizer: one token per character, in
data.tokenize_workers processes); above it they are pre-tokenised random ids written through the same
writer, so the 1M figure times writing, not tokenising. Every measurement runs in its own process (the
script calls itself with --child), so each peak is that process's own. Writes into --dir and removes it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

# publish first: where no blockdraft is installed, it puts this checkout's on the path.
from publish import command_line, provenance, publish

SEQ_LENGTH, MEDIAN, SIGMA, BATCH, READ_SECONDS = 2048, 450, 0.8, 8, 3.0


def lengths(rows: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(MEDIAN), SIGMA, rows), 48, SEQ_LENGTH).astype(np.int64)


def memory() -> dict:
    """This process's resident memory now (VmRSS, split into anonymous and file pages) and at its peak, MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    mib = {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}
    return {**mib, "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# --- children: each prints one JSON line ----------------------------------------------------------
def write_jsonl(path: Path, rows: int) -> None:
    import numpy as np

    rng, words = np.random.default_rng(1), ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa"]
    with open(path, "w") as f:
        for n in lengths(rows):
            text = " ".join(rng.choice(words, size=max(2, int(n) // 6)))
            cut = max(1, len(text) // 5)  # the user's fifth, the assistant's rest
            f.write(json.dumps({"messages": [{"role": "user", "content": text[:cut]},
                                             {"role": "assistant", "content": text[cut:]}]}) + "\n")


def child_tokenise(rows_file: str, cache: str, workers: int) -> dict:
    from blockdraft.data.config import DataConfig
    from blockdraft.data.dataset import dataset_key, prepare_dataset
    from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer

    tok, cfg = build_tiny_tokenizer(), DataConfig(seq_length=SEQ_LENGTH, cache_dir=cache, tokenize_workers=workers)
    started = time.perf_counter()
    ds, report = prepare_dataset(rows_file, tok, cfg)
    seconds = time.perf_counter() - started
    workers_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"seconds": seconds, "folder": str(Path(cache) / dataset_key(rows_file, tok, cfg)), "rows": len(ds),
            "tokens": int(ds.documents.starts[-1]), **memory(), "workers_peak": workers_peak}


def child_write_ids(folder: str, rows: int) -> dict:
    import numpy as np

    from blockdraft.data.dataset import CACHE_FORMAT
    from blockdraft.data.rows import RejectReport
    from blockdraft.data.token_file import TokenFileWriter

    rng, sizes = np.random.default_rng(2), lengths(rows)
    started = time.perf_counter()
    writer = TokenFileWriter(Path(folder), "synthetic", CACHE_FORMAT)
    for line, n in enumerate(sizes, start=1):
        ids = rng.integers(0, 151_000, int(n), dtype=np.int32)
        mask = np.arange(n) >= n // 5
        writer.add(ids, mask, line, line)
    writer.commit(RejectReport(source="synthetic", unit="row", rows_read=rows, rows_kept=rows))
    return {"seconds": time.perf_counter() - started, "folder": folder, "rows": rows, "tokens": int(sizes.sum()),
            **memory(), "workers_peak": 0.0}


def child_old_write(folder: str, out: str) -> dict:
    """The cache as it was: every conversation as Python lists, then one torch.save (from the token file's rows)."""
    import torch

    from blockdraft.data.dataset import Documents

    docs = open_mapped(folder).documents
    started = time.perf_counter()
    starts = docs.starts.tolist()
    ids = [docs.tokens[a:b].tolist() for a, b in zip(starts, starts[1:])]
    masks = [docs.loss_mask[a:b].tolist() for a, b in zip(starts, starts[1:])]
    documents = Documents.from_lists(ids, masks, docs.lines.tolist(), docs.prompt_hashes.tolist())
    torch.save({**documents.__dict__, "report": {}}, out)
    return {"seconds": time.perf_counter() - started, **memory()}


def open_mapped(folder: str):
    """What prepare_dataset does once it has the key: the manifest checked, the arrays mapped."""
    from blockdraft.data.dataset import CACHE_FORMAT, Documents, TokenizedDataset
    from blockdraft.data.token_file import MANIFEST, map_arrays, read_manifest

    key = json.loads((Path(folder) / MANIFEST).read_text())["key"]
    manifest = read_manifest(Path(folder), key, CACHE_FORMAT)
    return TokenizedDataset(Documents(**map_arrays(Path(folder), manifest)), SEQ_LENGTH)


def open_pt(path: str):
    import torch

    from blockdraft.data.dataset import Documents, TokenizedDataset

    saved = torch.load(path, weights_only=True)
    return TokenizedDataset(Documents(**{k: saved[k] for k in ("tokens", "loss_mask", "starts", "lines", "prompt_hashes")}),
                            SEQ_LENGTH)


def child_read(kind: str, where: str, rank: int) -> dict:
    import torch

    from blockdraft.data.dataset import collate

    before = memory()
    started = time.perf_counter()
    ds = open_mapped(where) if kind == "mapped" else open_pt(where)
    opened = time.perf_counter() - started
    after_open = memory()
    g, batches, started = torch.Generator().manual_seed(rank), 0, time.perf_counter()
    while time.perf_counter() - started < READ_SECONDS:
        collate([ds[int(i)] for i in torch.randint(len(ds), (BATCH,), generator=g)], pad_id=0)
        batches += 1
    reads = batches / (time.perf_counter() - started)
    return {"open_s": opened, "batches_per_s": reads, "base": before, "after_open": after_open, "after_reads": memory()}


CHILDREN = {"tokenise": lambda a: child_tokenise(a[0], a[1], int(a[2])), "write_ids": lambda a: child_write_ids(a[0], int(a[1])),
            "old_write": lambda a: child_old_write(a[0], a[1]), "read": lambda a: child_read(a[0], a[1], int(a[2]))}


# --- the parent -------------------------------------------------------------------------------------
def run_child(*args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *map(str, args)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def two_ranks(kind: str, where) -> list:
    procs = [subprocess.Popen([sys.executable, __file__, "--child", "read", kind, str(where), str(r)],
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def drop_cache(folder: Path) -> None:
    """The file's pages out of the page cache, so an open reads from disk as a fresh node would."""
    for f in Path(folder).glob("*"):
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def measure(rows: int, args, root: Path) -> dict:
    work = root / str(rows)
    work.mkdir(parents=True, exist_ok=True)
    if rows <= args.tokenise_up_to:
        rows_file = work / "rows.jsonl"
        write_jsonl(rows_file, rows)
        written = run_child("tokenise", rows_file, work / "cache", args.workers)
        how = f"tokenised ({args.workers} workers)"
    else:
        written = run_child("write_ids", work / "cache" / "synthetic", rows)
        how = "pre-tokenised ids"
    folder = Path(written["folder"])
    size = sum(f.stat().st_size for f in folder.iterdir())
    drop_cache(folder)
    result = {"rows": rows, "how": how, "written": written, "bytes": size, "mapped": two_ranks("mapped", folder)}
    if rows <= args.old_up_to:
        pt = work / "old.pt"
        result["old_write"] = run_child("old_write", folder, pt)
        result["old_bytes"] = pt.stat().st_size
        drop_cache(pt.parent)
        result["old"] = two_ranks("pt", pt)
        pt.unlink()
    shutil.rmtree(work, ignore_errors=True)
    return result


def rank_line(label: str, ranks: list) -> str:
    rss = "/".join(f"{r['after_reads']['VmRSS'] - r['base']['VmRSS']:.0f}" for r in ranks)
    anon = "/".join(f"{r['after_reads']['RssAnon'] - r['base']['RssAnon']:.0f}" for r in ranks)
    peak = "/".join(f"{r['after_reads']['VmHWM']:.0f}" for r in ranks)
    opened = "/".join(f"{r['open_s'] * 1000:.0f}" for r in ranks)
    reads = "/".join(f"{r['batches_per_s']:.0f}" for r in ranks)
    return f"{label} | {rss} | {anon} | {peak} | {opened} | {reads}"


def table(results: list) -> str:
    head = ["| rows | tokens | how written | write s | writer peak MiB (largest worker) | size MiB |",
            "|---:|---:|---|---:|---:|---:|"]
    for r in results:
        w = r["written"]
        head.append(f"| {r['rows']:,} | {w['tokens']:,} | {r['how']} | {w['seconds']:.1f} | {w['VmHWM']:.0f} "
                    f"({w['workers_peak']:.0f}) | {r['bytes'] / 2**20:.0f} |")
        if "old_write" in r:
            o = r["old_write"]
            head.append(f"| {r['rows']:,} | | old `.pt`: lists + torch.save (tokenising excluded) | {o['seconds']:.1f} | "
                        f"{o['VmHWM']:.0f} | {r['old_bytes'] / 2**20:.0f} |")
    ranks = ["", "Two ranks reading at once (rank 0/rank 1), from a cold page cache; memory is the growth over the "
             f"process before it opened the data; reads are random batches of {BATCH} rows collated, for {READ_SECONDS:.0f} s:", "",
             "| rows, cache | RSS growth MiB | of it anonymous MiB | peak RSS MiB | open ms | batches/s |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ranks.append("| " + rank_line(f"{r['rows']:,}, token file (mapped)", r["mapped"]) + " |")
        if "old" in r:
            ranks.append("| " + rank_line(f"{r['rows']:,}, old `.pt` (torch.load)", r["old"]) + " |")
    return "\n".join(head + ranks)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(CHILDREN[sys.argv[2]](sys.argv[3:])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--tokenise-up-to", type=int, default=100_000)
    parser.add_argument("--old-up-to", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", default="/tmp/bench-token-file")
    parser.add_argument("--print-only", action="store_true", help="print the table; leave docs/benchmarks-history.md as it is")
    args = parser.parse_args()
    command = command_line(env="OMP_WAIT_POLICY=PASSIVE")
    root = Path(args.dir)
    results = []
    try:
        for rows in args.rows:
            results.append(measure(rows, args, root))
            print(json.dumps(results[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    body = provenance(command) + "\n" + table(results)
    if args.print_only:
        print(body)
    else:
        publish("token_file", "The memory-mapped token file at 10k, 100k and 1M rows", body)


if __name__ == "__main__":
    main()
