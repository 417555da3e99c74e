"""The vLLM servers regen starts: how many, on which devices, with which arguments, and their start and stop.

Each server gets its own devices: on a CUDA machine its own group of tensor_parallel_size GPUs (times vLLM's
--data-parallel-size when passed), on CPU its own run of cores (split once more per rank, as vLLM's
VLLM_CPU_OMP_THREADS_BIND takes ranks separated by `|`). They start together and are stopped together, in
every outcome.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator, List, Sequence

from blockdraft.errors import ConfigError
from blockdraft.vllm_runtime.server import (VllmServer, bindable_cores, core_list_text, server_settings, split_evenly,
                                            start_together, visible_gpus)

if TYPE_CHECKING:
    from blockdraft.regen.config import RegenConfig

# What regen sets itself on every server's command line, and the key that sets it.
REGEN_FLAGS = {
    "--model": "target_dir=", "--host": "nothing: regen serves on loopback", "--port": "nothing: each server gets a free port",
    "--tensor-parallel-size": "tensor_parallel_size=", "-tp": "tensor_parallel_size=", "--max-num-seqs": "workers=",
    "--max-model-len": "max_prompt_tokens= and max_tokens=",
    "--api-key": "nothing: regen's own servers listen on loopback only, and a key there would lock regen itself out",
}
DATA_PARALLEL_FLAGS = ("--data-parallel-size", "-dp")


@dataclass
class ServerSlot:
    """Where one server runs."""

    index: int
    log: Path
    devices: str  # as said in the log and regen.json: "GPUs 0,1", "cores 0-3", "cores 0|1" (one run per rank)
    env: Dict[str, str] = field(default_factory=dict)


# --- checked with the config, before any work -------------------------------------------------
def data_parallel_size(args: Sequence[str]) -> int:
    """vLLM's --data-parallel-size as passed in extra_vllm_args (1 when it is not)."""
    for i, word in enumerate(args):
        name, eq, value = str(word).partition("=")
        if name in DATA_PARALLEL_FLAGS:
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"extra_vllm_args: {name} {value!r} is not a whole number; e.g. [{name}, '8']") from None
    return 1


def check_servers(cfg: "RegenConfig") -> None:
    """The servers' settings against each other and against the machine's GPUs or cores, one line per fault."""
    from blockdraft.regen.endpoints import check_endpoint_urls

    check_endpoint_urls(cfg.endpoints)
    _check_extra_args(cfg.extra_vllm_args)
    if cfg.servers is not None and cfg.servers < 0:
        raise ConfigError(f"servers={cfg.servers} must be 0 or more")
    if cfg.servers == 0 and not cfg.endpoints:
        raise ConfigError("servers=0 and no endpoints: nothing would answer; set servers=1 or more, "
                          "or endpoints=[http://host:port] of servers that already run")
    scaled = cfg.endpoints or (cfg.servers or 1) > 1 or cfg.tensor_parallel_size > 1 or cfg.extra_vllm_args
    if cfg.backend == "transformers":
        if scaled:
            raise ConfigError("backend=transformers answers in this process, one prompt at a time: servers, endpoints, "
                              "tensor_parallel_size and extra_vllm_args need backend=vllm (or auto)")
        return
    if cfg.servers == 0 or (cfg.servers is None and cfg.endpoints):
        return  # no server of its own: nothing to place
    per_server = cfg.tensor_parallel_size * data_parallel_size(cfg.extra_vllm_args)
    gpus = visible_gpus()
    if gpus:
        _check_gpus(cfg, per_server, gpus)
    else:
        _check_cores(cfg, per_server)


def _check_extra_args(args: Sequence) -> None:
    if not all(isinstance(a, str) for a in args):
        raise ConfigError(f"extra_vllm_args={list(args)!r} must be strings, one per argv word; "
                          "quote numbers, e.g. ['--gpu-memory-utilization', '0.85']")
    for word in args:
        name = word.partition("=")[0]
        if name in REGEN_FLAGS:
            raise ConfigError(f"extra_vllm_args sets {name}, which regen sets itself; set {REGEN_FLAGS[name]} instead")


def _check_gpus(cfg: "RegenConfig", per_server: int, gpus: List[str]) -> None:
    count = cfg.servers or 1  # null: as many as fit, at least one
    if count * per_server <= len(gpus):
        return
    seen = (f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in os.environ
            else "nvidia-smi")
    dp = data_parallel_size(cfg.extra_vllm_args)
    each = f"tensor_parallel_size={cfg.tensor_parallel_size}" + (f" x --data-parallel-size {dp}" if dp > 1 else "")
    raise ConfigError(f"servers={cfg.servers if cfg.servers is not None else 'null (at least 1)'} with {each} GPUs each needs "
                      f"{count * per_server} GPUs; {len(gpus)} are visible ({seen}): lower servers= or tensor_parallel_size=")


def _check_cores(cfg: "RegenConfig", per_server: int) -> None:
    count = cfg.servers or 1
    if count * per_server == 1:
        return
    if cfg.cpu_threads_bind == "auto":
        raise ConfigError(f"cpu_threads_bind=auto lets each vLLM take every core but one, so servers={count} "
                          f"(or its ranks) would share cores; use all (the cores split between them) or a core list such as 0-7")
    cores = bindable_cores(cfg.cpu_threads_bind)
    if count * per_server > len(cores):
        raise ConfigError(f"servers={count} with {per_server} rank(s) each needs a core per rank, {count * per_server} cores; "
                          f"cpu_threads_bind={cfg.cpu_threads_bind} gives {len(cores)}: lower servers=")


# --- the plan, once the serving vLLM has said which device it runs on ---------------------------
def local_server_count(cfg: "RegenConfig", device: str, gpus: List[str]) -> int:
    """servers= as set; null: every group of GPUs a server takes on a CUDA machine, else one."""
    if cfg.servers is not None:
        return cfg.servers
    if device == "cuda" and gpus:
        return max(1, len(gpus) // (cfg.tensor_parallel_size * data_parallel_size(cfg.extra_vllm_args)))
    return 1


def plan_slots(count: int, ranks: int, device: str, cpu_threads_bind: str, gpus: List[str], out: Path) -> List[ServerSlot]:
    """`count` servers of `ranks` GPUs or core runs each (tensor x data parallel), on devices of their own."""
    slots = [ServerSlot(i, Path(out) / f"vllm_regen.{i}.log", "vLLM's choice") for i in range(count)]
    if device == "cuda":
        if gpus:  # else CUDA picks, as it would for one server without CUDA_VISIBLE_DEVICES
            for slot in slots:
                group = gpus[slot.index * ranks:(slot.index + 1) * ranks]
                slot.env, slot.devices = {"CUDA_VISIBLE_DEVICES": ",".join(group)}, "GPUs " + ",".join(group)
    elif device == "cpu" and (count * ranks > 1 or cpu_threads_bind != "auto"):
        runs = split_evenly(bindable_cores(cpu_threads_bind), count * ranks)
        for slot in slots:
            bind = "|".join(core_list_text(run) for run in runs[slot.index * ranks:(slot.index + 1) * ranks])
            slot.env, slot.devices = {"VLLM_CPU_OMP_THREADS_BIND": bind}, f"cores {bind}"
        if count == 1 and ranks == 1 and "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
            slots[0].env, slots[0].devices = {}, f"cores {os.environ['VLLM_CPU_OMP_THREADS_BIND']} (as set)"
    return slots


def server_arguments(cfg: "RegenConfig", device: str) -> tuple[List[str], Dict[str, str]]:
    """Every server's vLLM arguments and environment; extra_vllm_args come last."""
    args, env = server_settings(device, cfg.max_prompt_tokens + cfg.max_tokens, cfg.workers, cfg.kv_cache_gib, "auto")
    if cfg.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    return args + list(cfg.extra_vllm_args), env


# --- start and stop -----------------------------------------------------------------------------
@contextmanager
def started_servers(python, cfg: "RegenConfig", device: str, slots: List[ServerSlot]) -> Iterator[List[VllmServer]]:
    """Every slot's server, started at once and ready; all of them stopped when the block ends, however it ends."""
    args, env = server_arguments(cfg, device)
    servers = [VllmServer(python, cfg.target_dir, log_path=slot.log, args=args, env={**env, **slot.env},
                          startup_timeout_s=cfg.startup_timeout_s) for slot in slots]
    print(f"[regen] starting {len(servers)} vLLM server(s) for {cfg.target_dir}: "
          + "; ".join(f"{slot.devices}, log {slot.log}" for slot in slots) + " ...", flush=True)
    with ExitStack() as stack:
        for server in servers:
            stack.callback(server.stop)
        start_together(servers)  # side by side: start-up is mostly loading weights, each on its own devices
        for slot, server in zip(slots, servers):
            print(f"[regen] vLLM {slot.index} ready after {server.startup_s:.0f} s at {server.url}", flush=True)
        yield servers
