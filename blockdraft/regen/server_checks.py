"""The settings of the vLLM servers a stage starts, checked before any work: against each other, against regen's own
flags, and against the machine's GPUs or cores. Regen and the capture through vLLM read the same keys
(`ServerSettings`), so both check them here; this module imports neither stage's config.
"""

from __future__ import annotations

import os
from typing import List, Optional, Protocol, Sequence

from blockdraft.errors import ConfigError
from blockdraft.vllm_runtime.server import bindable_cores, visible_gpus


class ServerSettings(Protocol):
    """The keys of a stage's config these checks read (RegenConfig's and CaptureVllmConfig's)."""

    servers: Optional[int]
    tensor_parallel_size: int
    extra_vllm_args: Sequence[str]
    cpu_threads_bind: str


# What regen sets itself on every server's command line, and the key that sets it.
REGEN_FLAGS = {
    "--model": "target_dir=", "--host": "nothing: regen serves on loopback", "--port": "nothing: each server gets a free port",
    "--tensor-parallel-size": "tensor_parallel_size=", "-tp": "tensor_parallel_size=", "--max-num-seqs": "workers=",
    "--max-model-len": "max_prompt_tokens= and max_tokens=",
    "--api-key": "nothing: regen's own servers listen on loopback only, and a key there would lock regen itself out",
}
DATA_PARALLEL_FLAGS = ("--data-parallel-size", "-dp")


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


def check_servers(cfg) -> None:
    """Regen's servers' settings (a RegenConfig) against each other and against the machine's GPUs or cores, one
    line per fault."""
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
        check_gpus(cfg, per_server, gpus)
    else:
        check_cores(cfg, per_server)


def _check_extra_args(args: Sequence) -> None:
    if not all(isinstance(a, str) for a in args):
        raise ConfigError(f"extra_vllm_args={list(args)!r} must be strings, one per argv word; "
                          "quote numbers, e.g. ['--gpu-memory-utilization', '0.85']")
    for word in args:
        name = word.partition("=")[0]
        if name in REGEN_FLAGS:
            raise ConfigError(f"extra_vllm_args sets {name}, which regen sets itself; set {REGEN_FLAGS[name]} instead")


def check_gpus(cfg: ServerSettings, per_server: int, gpus: List[str]) -> None:
    count = cfg.servers or 1  # null: as many as fit, at least one
    if count * per_server <= len(gpus):
        return
    seen = (f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in os.environ
            else "nvidia-smi")
    dp = data_parallel_size(cfg.extra_vllm_args)
    each = f"tensor_parallel_size={cfg.tensor_parallel_size}" + (f" x --data-parallel-size {dp}" if dp > 1 else "")
    raise ConfigError(f"servers={cfg.servers if cfg.servers is not None else 'null (at least 1)'} with {each} GPUs each needs "
                      f"{count * per_server} GPUs; {len(gpus)} are visible ({seen}): lower servers= or tensor_parallel_size=")


def check_cores(cfg: ServerSettings, per_server: int) -> None:
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
