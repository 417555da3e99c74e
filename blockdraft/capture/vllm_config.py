"""`capture.vllm.*`: the settings of a capture whose target runs in vLLM servers (`capture.backend=vllm`).

The servers run vLLM's `extract_hidden_states` speculative method with our KV connector
(blockdraft/capture/vllm_connector.py), which writes each request's hidden states to a file the
capture reads back (blockdraft/capture/vllm_rows.py); vllm_servers.py starts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from blockdraft.errors import ConfigError

# What the capture sets itself on every server's command line, and why (or the key that sets it).
CAPTURE_FLAGS = {
    "--model": "the capture's target.path", "--host": "nothing: servers listen on loopback",
    "--port": "nothing: each server gets a free port", "--tensor-parallel-size": "capture.vllm.tensor_parallel_size",
    "-tp": "capture.vllm.tensor_parallel_size", "--max-num-seqs": "capture.vllm.workers",
    "--max-model-len": "data.seq_length", "--speculative-config": "nothing: the capture runs extract_hidden_states",
    "--kv-transfer-config": "nothing: the capture runs its own connector",
    "--enable-prefix-caching": "nothing: a prefix-cache hit would skip the tokens whose states are wanted",
    "--api-key": "nothing: the capture's own servers listen on loopback only, and a key there would lock the capture out",
    "--max-logprobs": "train.teacher_top_k", "--dtype": "compute_dtype (on a GPU; vLLM on CPU runs float32)", "--logprobs-mode": "nothing: the capture asks for raw logits",
}


@dataclass
class CaptureVllmConfig:
    """Schema of `capture.vllm`."""

    servers: Optional[int] = None
    """vLLM servers the capture starts, each on its own devices, port and log (vllm_capture.<i>.log under out):
    null = one per tensor_parallel_size visible GPUs on a CUDA machine, 1 on CPU, 0 when endpoints are given."""
    tensor_parallel_size: int = 1
    """GPUs per server (--tensor-parallel-size), for a target that does not fit one GPU."""
    endpoints: List[str] = field(default_factory=list)
    """Capture servers that already run (http(s)://host:port), started with the capture's speculative and
    kv-transfer configs (vllm_servers.capture_server_args prints them); they write into scratch_dir, which must
    be a file system this machine shares, at the same path."""
    scratch_dir: Optional[str] = None
    """Where the servers' connector writes one file per request, read and deleted by the capture. null = <out>/vllm_scratch
    (servers started here); required with endpoints: the capture_dir they were started with."""
    vllm_python: Optional[str] = None
    """The serving interpreter; null = .venv-serve/bin/python."""
    extra_vllm_args: List[str] = field(default_factory=list)
    """More arguments for every server the capture starts, one list item per argv word, e.g.
    [--gpu-memory-utilization, '0.85']; the flags the capture sets itself are refused, naming the key that sets them."""
    kv_cache_gib: int = 2
    """vLLM on CPU: its KV cache in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    workers: int = 16
    """Requests (documents) in flight at once per server; also each started server's --max-num-seqs."""
    startup_timeout_s: float = 600.0
    """Seconds a started server has to answer /health."""
    request_timeout_s: float = 600.0
    """Seconds one request may take, and again for its file to appear, before it counts as failed and is retried."""
    retries: int = 3
    """Tries again after a failed request (a dropped connection, a timeout, 5xx, 429, no file) before the capture stops."""
    cpu_threads_bind: str = "all"
    """vLLM on CPU: its OpenMP threads on every core (all), vLLM's default (auto), or a core list such as 0-3;
    several servers split these cores."""


def check_capture_vllm(cfg: CaptureVllmConfig, teacher_top_k: int = 0) -> None:
    """Every fault of the settings, one ConfigError naming the key and the fix (before any server starts)."""
    from blockdraft.regen.endpoints import check_endpoint_urls
    from blockdraft.vllm_runtime.server import is_cpu_threads_bind

    try:
        check_endpoint_urls(list(cfg.endpoints))
    except ConfigError as err:
        raise ConfigError(f"capture.vllm.{err}") from None
    if cfg.servers is not None and cfg.servers < 0:
        raise ConfigError(f"capture.vllm.servers={cfg.servers} must be 0 or more (null: 1 per GPU group, 1 on CPU)")
    if cfg.servers == 0 and not cfg.endpoints:
        raise ConfigError("capture.vllm.servers=0 and no capture.vllm.endpoints: nothing would answer; set servers=1 "
                          "or more, or endpoints=[http://host:port] of capture servers that already run")
    if cfg.endpoints and not cfg.scratch_dir:
        raise ConfigError("capture.vllm.endpoints are set but capture.vllm.scratch_dir is not: endpoints write their "
                          "files into the capture_dir they were started with; set scratch_dir to that directory, on a "
                          "file system shared with this machine at the same path")
    for name in ("tensor_parallel_size", "workers", "kv_cache_gib"):
        if int(getattr(cfg, name)) < 1:
            raise ConfigError(f"capture.vllm.{name}={getattr(cfg, name)} must be 1 or more")
    if cfg.retries < 0:
        raise ConfigError(f"capture.vllm.retries={cfg.retries} must be 0 or more")
    for name in ("startup_timeout_s", "request_timeout_s"):
        if not float(getattr(cfg, name)) > 0:
            raise ConfigError(f"capture.vllm.{name}={getattr(cfg, name)} must be above 0 seconds")
    if not is_cpu_threads_bind(cfg.cpu_threads_bind):
        raise ConfigError(f"capture.vllm.cpu_threads_bind={cfg.cpu_threads_bind!r}: use all, auto, or a core list such "
                          "as 0-3 or 0,2-3")
    if not all(isinstance(a, str) for a in cfg.extra_vllm_args):
        raise ConfigError(f"capture.vllm.extra_vllm_args={list(cfg.extra_vllm_args)!r} must be strings, one per argv "
                          "word; quote numbers, e.g. ['--gpu-memory-utilization', '0.85']")
    for word in cfg.extra_vllm_args:
        flag = word.partition("=")[0]
        if flag in CAPTURE_FLAGS or flag == "--no-enable-prefix-caching":
            raise ConfigError(f"capture.vllm.extra_vllm_args sets {flag}, which the capture sets itself; set "
                              f"{CAPTURE_FLAGS.get(flag, 'nothing: the capture turns prefix caching off')} instead")
    if teacher_top_k < 0:
        raise ConfigError(f"train.teacher_top_k={teacher_top_k} must be 0 (no soft labels) or more")
