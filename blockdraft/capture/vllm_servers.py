"""The vLLM servers a capture reads the target's features from (`capture.backend=vllm`).

Each server runs the target with vLLM's `extract_hidden_states` speculative method (a stand-in draft
that stores the target's aux hidden states of every token in its own KV cache group) and our KV
connector (blockdraft/capture/vllm_connector.py), which writes each finished request's states to
`<scratch_dir>/<name>.safetensors`. The servers are started as regen starts its own (each on its own
GPUs or cores: regen/servers.py plan_slots; started and stopped together: vllm_runtime/server.py), or
are endpoints that already run with the same configs (`capture_server_command` prints their command)
and write into a scratch_dir this machine shares at the same path.
"""

from __future__ import annotations

import json
import os
import shlex
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from blockdraft.capture.vllm_config import CaptureVllmConfig
from blockdraft.capture.vllm_rows import aux_layer_ids
from blockdraft.errors import ConfigError

CONNECTOR_CLASS = "CaptureConnector"
CONNECTOR_MODULE = "blockdraft.capture.vllm_connector"
# The directory that holds the blockdraft package: on the servers' PYTHONPATH so vLLM imports the connector
# (the serving interpreter has vLLM, not blockdraft; the connector imports only vLLM, torch and safetensors).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def speculative_config(layer_ids: Sequence[int]) -> dict:
    """extract_hidden_states, capturing target layer i as vLLM's aux layer i + 1 (vllm_rows.py says why)."""
    return {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": aux_layer_ids(layer_ids)}}}


def kv_transfer_config(scratch_dir: str | os.PathLike) -> dict:
    return {"kv_connector": CONNECTOR_CLASS, "kv_connector_module_path": CONNECTOR_MODULE, "kv_role": "kv_producer",
            "kv_connector_extra_config": {"capture_dir": str(Path(scratch_dir).resolve())}}


def capture_args(scratch_dir: str | os.PathLike, teacher_top_k: int) -> List[str]:
    """The arguments every capture server needs besides --speculative-config:
    the connector; no prefix caching (a cache hit skips the forward of the tokens whose states are wanted);
    with soft labels, the top-k allowed per position and raw logits instead of logprobs (what the store keeps)."""
    args = ["--kv-transfer-config", json.dumps(kv_transfer_config(scratch_dir)), "--no-enable-prefix-caching"]
    if teacher_top_k:
        args += ["--max-logprobs", str(int(teacher_top_k)), "--logprobs-mode", "raw_logits"]
    return args


def server_env() -> Dict[str, str]:
    """PYTHONPATH with the blockdraft package first, so vLLM imports our connector by its module path."""
    rest = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(PACKAGE_ROOT)] + ([rest] if rest else []))}


def capture_server_command(python: str, target: str, layer_ids: Sequence[int], scratch_dir: str, teacher_top_k: int,
                           max_model_len: int) -> str:
    """The shell command of one capture server, for endpoints started by hand (on another machine: scratch_dir on a
    shared file system, and this repository's copy there for PYTHONPATH)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", target,
            "--speculative-config", json.dumps(speculative_config(layer_ids)), "--max-model-len", str(max_model_len),
            *capture_args(scratch_dir, teacher_top_k)]
    return f"PYTHONPATH={shlex.quote(str(PACKAGE_ROOT))} " + " ".join(shlex.quote(a) for a in argv)


# --- placement ----------------------------------------------------------------------------------
def default_device() -> str:
    from blockdraft.vllm_runtime.server import visible_gpus

    return "cuda" if visible_gpus() else "cpu"


def server_count(cfg: CaptureVllmConfig, device: str, gpus: List[str]) -> int:
    """servers= as set; null: 0 beside endpoints, else every tensor_parallel_size group of GPUs (CUDA), else 1."""
    from blockdraft.regen.server_checks import data_parallel_size

    if cfg.servers is not None:
        return cfg.servers
    if cfg.endpoints:
        return 0
    if device == "cuda" and gpus:
        return max(1, len(gpus) // (cfg.tensor_parallel_size * data_parallel_size(cfg.extra_vllm_args)))
    return 1


def check_placement(cfg: CaptureVllmConfig) -> None:
    """The servers against the machine's GPUs or cores (regen's checks, which read the same keys)."""
    from blockdraft.regen import server_checks
    from blockdraft.vllm_runtime.server import visible_gpus

    if server_count(cfg, default_device(), visible_gpus()) == 0:
        return
    per_server = cfg.tensor_parallel_size * server_checks.data_parallel_size(cfg.extra_vllm_args)
    try:
        gpus = visible_gpus()
        if gpus:
            server_checks.check_gpus(cfg, per_server, gpus)
        else:
            server_checks.check_cores(cfg, per_server)
    except ConfigError as err:
        raise ConfigError(f"capture.vllm: {err}") from None


@dataclass
class CaptureServers:
    """What the capture sends its requests to."""

    urls: List[str]
    scratch_dir: Path
    started: list = field(default_factory=list)  # VllmServer of the servers started here
    devices: List[str] = field(default_factory=list)  # per started server, as said in its log line


@contextmanager
def capture_servers(cfg: CaptureVllmConfig, target: str, layer_ids: Sequence[int], teacher_top_k: int, max_model_len: int,
                    out: str | os.PathLike, device: Optional[str] = None, dtype: Optional[str] = None) -> Iterator[CaptureServers]:
    """The started servers (ready) and the endpoints; the started ones stopped when the block ends, however it ends.

    max_model_len: the longest document + 1 (the generated token): data.seq_length + 1. dtype: the GPU servers'
    --dtype (on CPU vLLM runs float32)."""
    from blockdraft.regen.servers import plan_slots
    from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON
    from blockdraft.vllm_runtime.server import VllmServer, server_settings, start_together, visible_gpus

    out = Path(out)
    scratch = (Path(cfg.scratch_dir) if cfg.scratch_dir else out / "vllm_scratch").resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    device = device or default_device()
    gpus = visible_gpus() if device == "cuda" else []
    count = server_count(cfg, device, gpus)
    python = cfg.vllm_python or str(DEFAULT_VLLM_PYTHON)
    if count and not Path(python).is_file():
        raise ConfigError(f"capture.vllm.vllm_python={python} does not exist; run `make setup-serve`, or set it to the "
                          "serving environment's python")
    slots = plan_slots(count, cfg.tensor_parallel_size, device, cfg.cpu_threads_bind, gpus, out)
    for slot in slots:
        slot.log = out / f"vllm_capture.{slot.index}.log"
    args, env = server_settings(device, max_model_len, cfg.workers, cfg.kv_cache_gib, "auto")
    if cfg.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    if dtype and device != "cpu":
        args += ["--dtype", dtype]
    args += capture_args(scratch, teacher_top_k) + list(cfg.extra_vllm_args)
    env.update(server_env())
    servers = [VllmServer(python, target, log_path=slot.log, speculative_config=speculative_config(layer_ids), args=args,
                          env={**env, **slot.env}, startup_timeout_s=cfg.startup_timeout_s) for slot in slots]
    with ExitStack() as stack:
        for server in servers:
            stack.callback(server.stop)
        if servers:
            print(f"[capture] starting {len(servers)} vLLM capture server(s) for {target}: "
                  + "; ".join(f"{slot.devices}, log {slot.log}" for slot in slots) + " ...", flush=True)
            start_together(servers)
            for slot, server in zip(slots, servers):
                print(f"[capture] vLLM {slot.index} ready after {server.startup_s:.0f} s at {server.url}", flush=True)
        urls = [server.url for server in servers] + list(cfg.endpoints)
        yield CaptureServers(urls, scratch, servers, [slot.devices for slot in slots])
