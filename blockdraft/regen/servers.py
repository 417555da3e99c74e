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
from typing import TYPE_CHECKING, Dict, Iterator, List

from blockdraft.regen.server_checks import data_parallel_size
from blockdraft.vllm_runtime.server import (VllmServer, bindable_cores, core_list_text, server_settings, split_evenly,
                                            start_together)

if TYPE_CHECKING:
    from blockdraft.regen.config import RegenConfig


@dataclass
class ServerSlot:
    """Where one server runs."""

    index: int
    log: Path
    devices: str  # as said in the log and regen.json: "GPUs 0,1", "cores 0-3", "cores 0|1" (one run per rank)
    env: Dict[str, str] = field(default_factory=dict)


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
