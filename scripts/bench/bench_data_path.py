"""The data path at users' scale: how long the training thread waits for each step's batches, and the host
memory of building the draft.

Waits: a synthetic token file and a synthetic feature store of 10k, 100k and 1M short rows, and a store of 1000
wide rows, read as training reads them (micro_batch_size 4 x grad_accum 2 a step), against a fixed step of --step-ms milliseconds of sleep as the
compute to overlap. Three ways: as before this change (the epoch's permutation drawn again, as a list, every
step, the rows read in the training thread), in the training thread with the permutation drawn once an epoch
(train.loader_workers=0), and read ahead by 2 workers (the default). The wait is the time the thread spends
getting a step's micro-batches. Before each run the files' pages are dropped from the page cache, so rows come
from the disk as they do from a store larger than memory. The runs alternate the ways; each is repeated.

Memory: a ~1B-parameter draft (5 layers of a Qwen3-8B-shaped DFlash draft) built on the host as before, against
built on the meta device and initialised by models/meta_build.py, each in its own process: the peak resident
memory (VmHWM) above the interpreter's. With no GPU here, the replay hands each finished tensor to the meta
device instead: what the host holds while a GPU receives them. A checksum of the weights says they agree.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench/bench_data_path.py \\
        [--rows 10000 100000 1000000] [--wide-rows 1000] [--steps 40] [--repeats 3] [--step-ms 50] [--builds 2] \\
        [--dir /tmp/bench-data-path]

Writes its section of docs/benchmarks.md; removes --dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

# publish first: where no blockdraft is installed, it puts this checkout's on the path.
from publish import REPO, command_line, provenance, publish

MICRO, ACCUM, WORKERS = 4, 2, 2
TOKEN_ROW = 64
# (tokens, float16 features) of a store's rows: short ones, a million of which fit in 2 GiB, and wide ones, a
# layer of Qwen3-8B over 256 tokens (2 MiB a row), of which a thousand do.
STORE_ROWS = {"feature store": (32, 32), "feature store, wide rows": (256, 4096)}
SHARD_BYTES = 32 << 20
DOC = REPO / "docs" / "benchmarks.md"
WAYS = ("before", "in thread", "2 workers")


# --- the data -------------------------------------------------------------------------------------
def make_token_file(folder: Path, rows: int) -> None:
    import numpy as np

    from blockdraft.data.dataset import CACHE_FORMAT
    from blockdraft.data.rows import RejectReport
    from blockdraft.data.token_file import TokenFileWriter

    ids = np.random.default_rng(0).integers(0, 151_000, (rows, TOKEN_ROW), dtype=np.int32)
    mask = np.arange(TOKEN_ROW) >= TOKEN_ROW // 4
    writer = TokenFileWriter(folder, "synthetic", CACHE_FORMAT)
    for line in range(rows):
        writer.add(ids[line], mask, line + 1, line)
    writer.commit(RejectReport(source="synthetic", unit="row", rows_read=rows, rows_kept=rows))


def open_token_file(folder: Path):
    from blockdraft.data.dataset import CACHE_FORMAT, Documents, TokenizedDataset
    from blockdraft.data.token_file import MANIFEST, map_arrays, read_manifest

    key = json.loads((folder / MANIFEST).read_text())["key"]
    return TokenizedDataset(Documents(**map_arrays(folder, read_manifest(folder, key, CACHE_FORMAT))), 2048)


def make_store(root: Path, rows: int, tokens: int, width: int) -> None:
    """Rows of `tokens` tokens with `width` float16 features each, written as the capture writes shards."""
    import torch

    from blockdraft.capture.store_writer import begin_split, create_or_resume, list_shards, write_shard

    per_shard = max(1, min(8192, SHARD_BYTES // (tokens * width * 2)))
    store = create_or_resume(root, {"synthetic": True}, overwrite=True)
    begin_split(store, "train", {"synthetic": rows}, rows, per_shard, {})
    g = torch.Generator().manual_seed(0)
    for number, start in enumerate(range(0, rows, per_shard)):
        n = min(per_shard, rows - start)
        ids = torch.randint(0, 151_000, (n, tokens), generator=g)
        features = torch.randn(n, tokens, width, generator=g).half()
        mask, positions, lengths = torch.arange(tokens) >= tokens // 4, torch.arange(tokens), torch.tensor([tokens])
        write_shard(root, "train", number, [{"input_ids": ids[r], "loss_mask": mask, "position_ids": positions,
                                             "document_lengths": lengths, "features": features[r]} for r in range(n)],
                    torch.float16)
    list_shards(store, "train")


def open_store(root: Path):
    from blockdraft.data.feature_store import FeatureStore, FeatureStoreDataset

    return FeatureStoreDataset(FeatureStore.open(root), "train")


def drop_cache(root: Path) -> None:
    """The files' pages out of the page cache: the rows are read from the disk."""
    for f in root.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def disk_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


# --- the waits ------------------------------------------------------------------------------------
def before(dataset):
    """The order as it was read before: the epoch's permutation drawn again, as a list, every step; rows read here."""
    import torch

    from blockdraft.data.dataset import collate
    from blockdraft.train.batch_order import GlobalBatches

    class EveryStep(GlobalBatches):
        def next_step(self):
            if self.samples + self.global_micro > len(self.dataset):
                self.epoch, self.samples = self.epoch + 1, 0
            g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
            perm = torch.randperm(len(self.dataset), generator=g).tolist()
            self.last_step_rows = perm[self.samples:self.samples + self.global_micro]
            out = []
            for i in range(self.accum):
                start = self.samples + (self.dist.rank * self.accum + i) * self.mbs
                rows = [self.dataset[j] for j in perm[start:start + self.mbs]]
                index = (self.epoch * len(self.dataset) + start) // self.mbs
                out.append((collate(rows, pad_id=self.pad_id), torch.Generator().manual_seed(self.seed * 1_000_003 + index)))
            self.samples += self.global_micro
            return out

    return EveryStep(dataset, MICRO, ACCUM, 0, one_rank(), seed=0)


def one_rank():
    import torch

    from blockdraft.ranks.distributed import DistInfo

    return DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def source(way: str, dataset):
    from blockdraft.train.batch_loader import BatchLoader
    from blockdraft.train.batch_order import GlobalBatches

    if way == "before":
        return before(dataset)
    order = GlobalBatches(dataset, MICRO, ACCUM, 0, one_rank(), seed=0)
    return BatchLoader(order, 0 if way == "in thread" else WORKERS)


def waits(way: str, dataset, steps: int, step_s: float) -> list:
    """Seconds the training thread waited for each step's micro-batches, each step then taking step_s."""
    batches, out = source(way, dataset), []
    try:
        for _ in range(steps):
            began = time.perf_counter()
            micro = list(batches.next_step())
            out.append(time.perf_counter() - began)
            assert len(micro) == ACCUM
            time.sleep(step_s)  # the step's compute
    finally:
        getattr(batches, "close", lambda: None)()
    return out


def measure_waits(kind: str, rows: int, args, root: Path) -> dict:
    where = root / f"{kind}-{rows}"
    began = time.perf_counter()
    if kind == "token file":
        make_token_file(where, rows)
    else:
        make_store(where, rows, *STORE_ROWS[kind])
    written_s = time.perf_counter() - began
    dataset = (open_token_file if kind == "token file" else open_store)(where)
    runs = {way: [] for way in WAYS}
    for repeat in range(args.repeats):
        for way in (WAYS if repeat % 2 == 0 else WAYS[::-1]):  # the ways alternate: the machine is shared
            drop_cache(where)
            runs[way].append(waits(way, dataset, args.steps, args.step_ms / 1000))
    result = {"kind": kind, "rows": rows, "bytes": disk_bytes(where), "written_s": written_s, "runs": runs}
    del dataset
    shutil.rmtree(where, ignore_errors=True)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}), flush=True)
    return result


# --- the draft's host memory (each build in its own process) ---------------------------------------
def draft_config():
    from blockdraft.models.draft_config import DraftModelConfig

    # Qwen3-8B's shape (hidden 4096, 32 heads of 128, 8 key/value heads, MLP 12288), 5 draft layers, 5 target layers.
    return DraftModelConfig(kind="dflash", hidden_size=4096, intermediate_size=12288, num_hidden_layers=5,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151_936,
                            target_hidden_size=4096, num_target_layers=36, target_layer_ids=[1, 9, 17, 25, 33],
                            mask_token_id=151_669, block_size=16)


def vm(field: str) -> float:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(status[field].split()[0]) / 1024  # MiB


def checksum(t) -> float:
    """A float64 sum, a million elements at a time: a float64 copy of the largest tensor would weigh on the peak."""
    return sum(chunk.double().sum().item() for chunk in t.reshape(-1).split(1 << 20))


def child_build(way: str) -> dict:
    import torch

    from blockdraft.models import build_draft
    from blockdraft.models.meta_build import Plan, record

    torch.manual_seed(0)
    cfg, base, sums = draft_config(), vm("VmRSS"), []
    began = time.perf_counter()
    if way == "host":
        model = build_draft(cfg)
        sums = [checksum(p.detach()) for p in model.parameters()]
        params = sum(p.numel() for p in model.parameters())
    else:
        plan = Plan(*record(lambda: build_draft(cfg)))

        def to_device(t):  # no GPU here: the value leaves the host as it would for one
            sums.append(checksum(t))
            return torch.empty_like(t, device="meta")

        model = plan.materialise(to_device)
        params = sum(p.numel() for p in model.parameters())
    seconds = time.perf_counter() - began
    # The order in which the replay hands tensors over is its own: the checksum is of the sorted sums.
    return {"way": way, "params": params, "base_mib": base, "peak_mib": vm("VmHWM"), "seconds": seconds,
            "checksum": repr(sorted(sums))}


def run_child(*args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_builds(repeats: int) -> dict:
    runs = {"host": [], "meta": []}
    for repeat in range(repeats):
        for way in (("host", "meta") if repeat % 2 == 0 else ("meta", "host")):
            runs[way].append(run_child(way))
            print(json.dumps({k: v for k, v in runs[way][-1].items() if k != "checksum"}), flush=True)
    return runs


# --- the section ----------------------------------------------------------------------------------
def ms(values) -> str:
    return f"{statistics.median(values) * 1000:.2f}"


def wait_cell(runs: list) -> str:
    """The median step's wait over every run's steps, and the range of the runs' own medians."""
    medians = [statistics.median(r) for r in runs]
    every = [w for r in runs for w in r]
    return f"{ms(every)} ({min(medians) * 1000:.2f} to {max(medians) * 1000:.2f}); mean {statistics.mean(every) * 1000:.2f}"


def reading(wait_results: list) -> str:
    """What the table says, in the figures of this run."""
    def median(kind, rows, way):
        r = next(r for r in wait_results if r["kind"] == kind and (rows is None or r["rows"] == rows))
        return statistics.median([w for run in r["runs"][way] for w in run]) * 1000

    most = max(r["rows"] for r in wait_results if r["kind"] == "token file")
    token, store, wide = "token file", "feature store", "feature store, wide rows"
    return (f"At {most:,} rows the permutation drawn again every step was most of a step's wait: "
            f"{median(token, most, 'before'):.1f} ms on the token file and {median(store, most, 'before'):.1f} ms on the "
            f"store, against {median(token, most, 'in thread'):.1f} and {median(store, most, 'in thread'):.1f} ms with it "
            "drawn once an epoch. Taking a micro-batch from a worker (a shared-memory buffer handed over between "
            "processes) costs the training thread about a millisecond on this 2-core machine, more than reading "
            f"rows this short ({median(token, most, '2 workers'):.1f} ms a step with 2 workers against "
            f"{median(token, most, 'in thread'):.1f} in the thread); where reading a row costs more than that, the "
            f"workers take it off the step: {median(wide, None, 'in thread'):.1f} ms a step in the thread against "
            f"{median(wide, None, '2 workers'):.1f} ms with 2 workers for the wide rows, a real store's being wider "
            "still. On a GPU the hand-over is received by the DataLoader's pinning thread, not the training thread "
            "(not measured here: no GPU).\n")


def body(args, wait_results: list, builds: dict) -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    lines = [provenance(command_line(env="OMP_WAIT_POLICY=PASSIVE")), f"CPU model (lscpu): {model}\n",
             f"Per-step wait of the training thread for its step's {ACCUM} micro-batches of {MICRO} rows, in ms: the "
             f"median over {args.repeats} runs of {args.steps} steps each (the range of the runs' medians), and the mean "
             f"(the first step's start of the workers included); each step then sleeps {args.step_ms} ms as its compute. "
             "Pages dropped from the page cache before each run; the three ways alternated, on a machine other work "
             "shares.\n",
             "| data | rows | on disk | before: permutation every step, read in the thread | read in the thread "
             "(`train.loader_workers=0`) | 2 workers read ahead (the default) |",
             "|---|---|---|---|---|---|"]
    for r in wait_results:
        cells = [wait_cell(r["runs"][way]) for way in WAYS]
        lines.append(f"| {r['kind']} | {r['rows']:,} | {r['bytes'] / 2**30:.2f} GiB | " + " | ".join(cells) + " |")
    (short, wide) = STORE_ROWS.values()
    lines.append(f"\nToken file rows: {TOKEN_ROW} tokens. Store rows: {short[0]} tokens x {short[1]} float16 features "
                 f"({short[0] * short[1] * 2} bytes of features a row), or wide: {wide[0]} x {wide[1]} "
                 f"({wide[0] * wide[1] * 2 / 2**20:.0f} MiB a row). A real store's rows are thousands of tokens x tens of "
                 "thousands of features (5 layers of 4096 for Qwen3-8B), tens of MiB each: 1M of them would not fit on "
                 "this disk, nor be written in minutes. The short rows measure what a step costs per row and per "
                 "permutation at 1M rows, the wide ones what reading bytes costs, at the rows that fit.\n")
    lines.append(reading(wait_results))
    host, meta = builds["host"], builds["meta"]
    if not host:  # --builds 0
        return "\n".join(lines) + "\n"
    same = len({b["checksum"] for b in host + meta}) == 1
    lines += [f"Host memory of building a {host[0]['params'] / 1e9:.2f}B-parameter draft (DFlash, 5 Qwen3-8B-shaped "
              f"layers, float32), each build in its own process, {len(host)} each, alternated; peak resident memory "
              f"above the interpreter's before the build (VmHWM - VmRSS), and its seconds (median, range):\n",
              "| build | peak above the interpreter | seconds | the same weights |", "|---|---|---|---|"]
    for name, runs in (("on the host, as before", host), ("on the meta device, then replayed (models/meta_build.py)", meta)):
        above = [(b["peak_mib"] - b["base_mib"]) / 1024 for b in runs]
        seconds = [b["seconds"] for b in runs]
        lines.append(f"| {name} | {statistics.median(above):.2f} GiB ({min(above):.2f} to {max(above):.2f}) | "
                     f"{statistics.median(seconds):.1f} ({min(seconds):.1f} to {max(seconds):.1f}) | "
                     f"{'yes' if same else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--wide-rows", type=int, default=1000)
    parser.add_argument("--builds", type=int, default=2, help="each draft build's runs")
    parser.add_argument("--dir", default="/tmp/bench-data-path")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_build(args.child[0])))
        return
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        results = [measure_waits(kind, rows, args, root) for kind in ("token file", "feature store") for rows in args.rows]
        results.append(measure_waits("feature store, wide rows", args.wide_rows, args, root))
        builds = measure_builds(args.builds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    publish("data_path", "The data path: the wait for each step's batches, and the draft's host memory",
            body(args, results, builds), doc=DOC)


if __name__ == "__main__":
    main()
