"""Hidden-state capture speed: transformers (blockdraft's TargetModel) vs vLLM `extract_hidden_states`.

    .venv/bin/python scripts/bench/bench_capture_backends.py [--target T] [--rows R.jsonl] [--num-rows N] [--layers 1,10,18,27]

Both backends capture the same thing for the same token ids: for `target_layer_ids = [i, ...]`
the outputs of decoder layers i (HF `hidden_states[i + 1]`), concatenated per token.

(a) transformers: `TargetModel.load(target, layers).capture(ids[None])`, one row at a time, fp32,
    early stop after the last needed layer (what `python -m blockdraft.capture` runs);
    one warm-up row, then every row is timed. States stay in memory (nothing is written).
(b) vLLM: a child process in the serving interpreter (.venv-serve; it has no blockdraft) starts
    `LLM(..., speculative_config={"method": "extract_hidden_states", ...})` and generates one
    token for every prompt in one `generate` call. vLLM's aux layer k is the residual stream
    after k decoder layers (`hidden_states + residual` after layer k-1), i.e. HF
    `hidden_states[k]`, so target layer i is aux layer i + 1. The states are written by a KV
    connector, one safetensors file per request (`hidden_states` [T, n_layers, H] and
    `token_ids` [T]). vLLM's `ExampleHiddenStatesConnector` copies them off the device with CUDA
    streams, events and pinned memory, which a CPU-only torch does not have; `--connector cpu`
    (default) uses a subclass defined here that only replaces that device-to-host copy with a
    plain CPU copy (same extraction from the cache, same files, same thread-pool writer).
    `--connector example` runs the stock class, to see what it does on this machine.

For 3 rows the vLLM files are compared with the transformers capture (max |diff| over max
|value| < 1e-3 per layer); where a layer does not match, every HF hidden_states index is tried
and the one that matches is reported. Prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from publish import REPO, command_line, provenance
SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
TOLERANCE = 1e-3
CHECK_ROWS = 3
CONNECTOR_CLASS = "CpuHiddenStatesConnector"


# --------------------------------------------------------------------------------------
# rows and tokens (training interpreter)
# --------------------------------------------------------------------------------------
def complete_lines(path: Path):
    """JSON rows of the file's complete lines (a writer may be appending the last one)."""
    data = path.read_bytes()
    end = data.rfind(b"\n")
    for line in data[: end + 1].splitlines():
        if line.strip():
            yield json.loads(line)


def read_rows(path: Path, n: int) -> list:
    files = [path]
    if not path.exists():
        # blockdraft.regen writes parts/<split>/NNNNN.jsonl and joins them at the end.
        parts = sorted((path.parent / "parts" / path.stem).glob("*.jsonl"))
        if not parts:
            sys.exit(f"{path} does not exist (and no {path.parent}/parts/{path.stem}/*.jsonl)")
        print(f"[rows] {path} not written yet; reading the complete lines of {len(parts)} part file(s) "
              f"in {path.parent}/parts/{path.stem}/", flush=True)
        files = parts
    rows = []
    for f in files:
        for row in complete_lines(f):
            rows.append(row)
            if len(rows) == n:
                return rows
    if len(rows) < n:
        print(f"[rows] only {len(rows)} complete rows available (asked for {n})", flush=True)
    return rows


def tokenize(target: str, rows: list, max_len: int) -> list:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    out = []
    for row in rows:
        ids = tok.apply_chat_template(row["messages"], tokenize=True)
        if not isinstance(ids, list):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        out.append([int(t) for t in ids[:max_len]])
    return out


# --------------------------------------------------------------------------------------
# (a) transformers
# --------------------------------------------------------------------------------------
def run_transformers(target: str, layers: list, prompts: list):
    import torch

    from blockdraft.models.target import TargetModel

    began = time.perf_counter()
    model = TargetModel.load(target, layers, dtype=torch.float32)
    startup = time.perf_counter() - began
    model.capture(torch.tensor(prompts[0])[None])  # warm-up
    kept = {}
    began = time.perf_counter()
    for r, ids in enumerate(prompts):
        feats = model.capture(torch.tensor(ids)[None])
        if r < CHECK_ROWS:
            kept[r] = feats[0].clone()
    seconds = time.perf_counter() - began
    return model, {"startup_s": startup, "capture_s": seconds, "tokens": sum(map(len, prompts))}, kept


def all_hidden_states(model, ids):
    import torch

    with torch.no_grad():
        out = model.model(input_ids=torch.tensor(ids)[None], output_hidden_states=True, use_cache=False)
    return [h[0] for h in out.hidden_states]


def rel_diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


def check_states(model, layers, prompts, kept, paths) -> tuple:
    """(matched, notes): vLLM files vs the transformers capture for the first rows."""
    from safetensors.torch import load_file

    hidden = model.hidden_size
    matched, notes = True, []
    for r in sorted(kept):
        data = load_file(paths[r])
        hs, token_ids = data["hidden_states"], data["token_ids"]
        if token_ids.tolist() != prompts[r]:
            matched = False
            notes.append(f"row {r}: token_ids in the file differ from the prompt")
        if tuple(hs.shape) != (len(prompts[r]), len(layers), hidden):
            matched = False
            notes.append(f"row {r}: vLLM hidden_states shape {tuple(hs.shape)}, expected "
                         f"{(len(prompts[r]), len(layers), hidden)}")
            continue
        ref = kept[r].view(len(prompts[r]), len(layers), hidden)
        diffs = [rel_diff(hs[:, k], ref[:, k]) for k in range(len(layers))]
        notes.append(f"row {r} ({len(prompts[r])} tokens): rel max diff per layer "
                     + ", ".join(f"{i}: {d:.1e}" for i, d in zip(layers, diffs)))
        if any(d >= TOLERANCE for d in diffs):
            matched = False
            full = all_hidden_states(model, prompts[r])
            for k, i in enumerate(layers):
                if diffs[k] < TOLERANCE:
                    continue
                best = min(range(len(full)), key=lambda j: rel_diff(hs[:, k], full[j]))
                notes.append(f"  layer {i}: vLLM slot {k} best matches HF hidden_states[{best}] "
                             f"(rel diff {rel_diff(hs[:, k], full[best]):.1e}; expected index {i + 1})")
    return matched, notes


# --------------------------------------------------------------------------------------
# (b) vLLM child (serving interpreter)
# --------------------------------------------------------------------------------------
def run_vllm(args, layers: list, prompts: list, work: Path) -> dict:
    request = {"target": str(Path(args.target).resolve()), "layers": layers, "prompts": prompts,
               "storage": str(work / "hs"), "connector": args.connector, "max_model_len": args.max_model_len}
    (work / "request.json").write_text(json.dumps(request))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")]))}
    argv = [str(SERVE_PYTHON), str(Path(__file__).resolve()), "--vllm-child", str(work)]
    print("$", " ".join(argv), flush=True)
    with open(work / "child.log", "w") as log:
        done = subprocess.run(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.child_timeout)
    result_file = work / "result.json"
    if done.returncode != 0 or not result_file.exists():
        tail = (work / "child.log").read_text()[-6000:]
        return {"error": f"vLLM child exited {done.returncode}", "log_tail": tail}
    return json.loads(result_file.read_text())


_CLASSES: dict = {}


def _cpu_connector_class():
    """ExampleHiddenStatesConnector with its CUDA device-to-host copy replaced by a CPU copy."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as ehs

    class _Done:
        """Stands for the CUDA event that marks the copy finished: on CPU it is finished at once."""

        def synchronize(self):
            pass

        def query(self):
            return True

    class CpuHiddenStatesConnector(ehs.ExampleHiddenStatesConnector):
        def _submit_async_write(self, pending):
            if not self._is_tp_rank_zero:
                return
            block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
            slots = (torch.arange(self._block_size, dtype=torch.long)[None, :]
                     + block_ids[:, None] * self._block_size).flatten()
            num_tokens = pending.token_ids.shape[0]
            states = ehs.extract_from_kv_cache(self._kv_cache, slots, num_tokens).clone()
            tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            if lock_fd is None and self.use_lock:
                import fcntl

                lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            done = _Done()
            future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
            self._req_copy_events[pending.req_id] = done
            self._req_futures[pending.req_id] = future
            future.add_done_callback(lambda f, rid=pending.req_id: self._on_write_done(rid, f))

    return CpuHiddenStatesConnector


def __getattr__(name):  # vLLM's connector factory does getattr(import_module(path), class name)
    if name == CONNECTOR_CLASS:
        if name not in _CLASSES:  # one class per process, however often the factory asks
            _CLASSES[name] = _cpu_connector_class()
        return _CLASSES[name]
    raise AttributeError(name)


def vllm_child(work: Path) -> None:
    request = json.loads((work / "request.json").read_text())
    began = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import load_hidden_states

    import_s = time.perf_counter() - began
    aux = [i + 1 for i in request["layers"]]  # target layer i = HF hidden_states[i + 1] = vLLM aux layer i + 1
    kv_transfer = {"kv_role": "kv_producer", "kv_buffer_device": "cpu",
                   "kv_connector_extra_config": {"shared_storage_path": request["storage"]}}
    if request["connector"] == "cpu":
        kv_transfer.update(kv_connector=CONNECTOR_CLASS, kv_connector_module_path=Path(__file__).stem)
    else:
        kv_transfer.update(kv_connector="ExampleHiddenStatesConnector")
    began = time.perf_counter()
    llm = LLM(
        model=request["target"],
        dtype="float32",
        enforce_eager=True,
        max_model_len=request["max_model_len"],
        enable_prefix_caching=False,
        seed=0,
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": aux}},
        },
        kv_transfer_config=kv_transfer,
    )
    startup_s = time.perf_counter() - began
    sched = llm.llm_engine.vllm_config.scheduler_config
    prompts = [{"prompt_token_ids": ids} for ids in request["prompts"]]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    began = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    generate_s = time.perf_counter() - began
    paths = [(o.kv_transfer_params or {}).get("hidden_states_path") for o in outputs]
    if any(p is None for p in paths):
        raise RuntimeError(f"{sum(p is None for p in paths)} outputs carry no hidden_states_path")
    for p in paths:  # the writer threads may still be flushing; each file's lock says when done
        load_hidden_states(p)
    written_s = time.perf_counter() - began
    result = {"import_s": import_s, "startup_s": startup_s, "capture_s": generate_s, "written_s": written_s,
              "tokens": sum(len(ids) for ids in request["prompts"]), "paths": paths, "aux_layer_ids": aux,
              "max_num_batched_tokens": sched.max_num_batched_tokens, "max_num_seqs": sched.max_num_seqs}
    (work / "result.json").write_text(json.dumps(result))
    print("[vllm-child] done", json.dumps({k: v for k, v in result.items() if k != "paths"}), flush=True)
    # Stop the engine's processes (EngineCore, Worker) before leaving: skipping this orphans them.
    llm.llm_engine.engine_core.shutdown()


# --------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=".cache/targets/smollm2-135m-instruct")
    ap.add_argument("--rows", default=".cache/demo/regen/train.jsonl")
    ap.add_argument("--num-rows", type=int, default=100)
    ap.add_argument("--layers", default="1,10,18,27")
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--connector", choices=("cpu", "example"), default="cpu")
    ap.add_argument("--child-timeout", type=int, default=1800)
    ap.add_argument("--keep", action="store_true", help="keep the vLLM files and child log")
    ap.add_argument("--vllm-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_child:
        return vllm_child(Path(args.vllm_child))

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    layers = [int(x) for x in args.layers.split(",")]
    rows = read_rows(Path(args.rows), args.num_rows)
    prompts = tokenize(args.target, rows, args.max_len)
    tokens = sum(map(len, prompts))
    print(f"[rows] {len(prompts)} rows, {tokens} tokens (max {max(map(len, prompts))}), layers {layers}, "
          f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}", flush=True)

    model, hf, kept = run_transformers(args.target, layers, prompts)
    print(f"[transformers] {hf['capture_s']:.2f} s, {hf['tokens'] / hf['capture_s']:.0f} tokens/s, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="bench_capture_"))
    vl = run_vllm(args, layers, prompts, work)
    load_after = os.getloadavg()[0]
    if "error" in vl:
        print(f"[vllm] FAILED: {vl['error']}\n--- child log tail ---\n{vl['log_tail']}", flush=True)
        matched, notes = None, []
    else:
        print(f"[vllm] aux layers {vl['aux_layer_ids']}, max_num_batched_tokens {vl['max_num_batched_tokens']}, "
              f"max_num_seqs {vl['max_num_seqs']}, import {vl['import_s']:.1f} s, load {load_after:.2f}", flush=True)
        matched, notes = check_states(model, layers, prompts, kept, vl["paths"])
        for note in notes:
            print("[check]", note)

    print()
    print(f"| backend | startup s | capture s | tokens/s | states matched |")
    print(f"|---|---:|---:|---:|---|")
    print(f"| transformers (TargetModel.capture, fp32, per row) | {hf['startup_s']:.1f} | {hf['capture_s']:.2f} | "
          f"{hf['tokens'] / hf['capture_s']:.0f} | reference |")
    if "error" in vl:
        print(f"| vLLM extract_hidden_states ({args.connector} connector) | - | - | - | failed: {vl['error']} |")
    else:
        print(f"| vLLM extract_hidden_states (fp32, one generate, max_tokens=1) | {vl['startup_s']:.1f} | "
              f"{vl['capture_s']:.2f} | {vl['tokens'] / vl['capture_s']:.0f} | "
              f"{'yes' if matched else 'NO'} (rows 0-{CHECK_ROWS - 1}, tol {TOLERANCE:g}) |")
        print(f"\nvLLM: files all on disk {vl['written_s']:.2f} s after generate began "
              f"({vl['tokens'] / vl['written_s']:.0f} tokens/s); startup excludes the {vl['import_s']:.1f} s vllm import.")
    print(f"{len(prompts)} rows, {tokens} tokens, target {args.target}, layers {layers}.")
    print(provenance(command_line()))
    if args.keep:
        print(f"kept {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
