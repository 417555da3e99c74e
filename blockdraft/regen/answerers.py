"""Who answers the prompts of a run: the endpoints given (checked first, before any server starts), the vLLM
servers regen starts, or the target loaded in this process (the transformers backend)."""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional

from blockdraft.errors import ConfigError

if TYPE_CHECKING:
    from blockdraft.regen.config import RegenConfig
    from blockdraft.regen.endpoints import EndpointCheck
    from blockdraft.vllm_runtime.server import VllmServer


@dataclass
class Answerer:
    """One server (or the in-process model) and how far it may be loaded."""

    url: Optional[str]  # None: the target in this process
    model: str  # the model name sent (the endpoint's served name); the target's directory in-process
    reply: Callable  # reply(messages) -> Reply | None
    in_flight: int  # requests it is sent at once
    kind: str  # "started" (by regen) | "endpoint" (already running) | "in-process"
    still_there: Callable[[], bool]  # asked after a request got no answer: False = stop sending to it
    devices: Optional[str] = None
    log: Optional[Path] = None
    tokenizer_checked: Optional[bool] = None
    process: Optional["VllmServer"] = None  # the server regen started; None for an endpoint

    @property
    def name(self) -> str:
        return self.url or "in-process"

    def served_by(self) -> dict:
        """What a row records of who wrote it."""
        return {"url": self.url, "model": self.model}

    def record(self) -> dict:
        """What regen.json records of it (never an API key)."""
        from blockdraft.vllm_runtime.omp_binding import omp_binding

        binding = omp_binding(self.log) if self.log is not None else None
        return {"url": self.url, "model": self.model, "kind": self.kind, "in_flight": self.in_flight,
                "devices": self.devices, "log": str(self.log) if self.log else None,
                "tokenizer_checked": self.tokenizer_checked, "vllm_omp_binding": binding}


@contextmanager
def answerers(cfg: "RegenConfig", backend: str, tokenizer, out: Path) -> Iterator[List[Answerer]]:
    """Every answerer of the run, ready; the servers regen started are stopped when the block ends."""
    if backend == "transformers":
        yield [_in_process(cfg, tokenizer)]
        return
    remote = _endpoints(cfg, tokenizer)  # checked before any server starts: a wrong URL costs no start-up
    with ExitStack() as stack:
        starts_servers = cfg.servers != 0 and not (cfg.servers is None and cfg.endpoints)
        yield (_started(cfg, tokenizer, out, stack) if starts_servers else []) + remote


def _endpoints(cfg: "RegenConfig", tokenizer) -> List[Answerer]:
    from blockdraft.regen.endpoints import api_headers, base_url, check_endpoint, still_answers

    headers = api_headers(cfg.endpoint_api_key_env)
    found = []
    for url in dict.fromkeys(base_url(u) for u in cfg.endpoints):  # an endpoint given twice is one server
        check = check_endpoint(url, cfg.endpoint_model, tokenizer, cfg.chat_template_kwargs,
                               cfg.max_prompt_tokens + cfg.max_tokens, headers)
        print(f"[regen] endpoint {url} serves {check.model!r}", flush=True)
        found.append(_over_http(cfg, tokenizer, check, headers, "endpoint", lambda url=url: still_answers(url, headers)))
    return found


def _started(cfg: "RegenConfig", tokenizer, out: Path, stack: ExitStack) -> List[Answerer]:
    """The servers regen starts, on the devices planned for them; `stack` stops them."""
    from blockdraft.regen.endpoints import check_endpoint, still_answers
    from blockdraft.regen.server_checks import data_parallel_size
    from blockdraft.regen.servers import local_server_count, plan_slots, started_servers
    from blockdraft.vllm_runtime.server import visible_gpus

    python, device = serving_python_and_device(cfg)
    gpus = visible_gpus() if device == "cuda" else []
    ranks = cfg.tensor_parallel_size * data_parallel_size(cfg.extra_vllm_args)
    slots = plan_slots(local_server_count(cfg, device, gpus), ranks, device, cfg.cpu_threads_bind, gpus, out)
    started = []
    for slot, server in zip(slots, stack.enter_context(started_servers(python, cfg, device, slots))):
        check = check_endpoint(server.url, None, tokenizer, cfg.chat_template_kwargs, cfg.max_prompt_tokens + cfg.max_tokens, {})
        answerer = _over_http(cfg, tokenizer, check, {}, "started",
                              lambda server=server: server.alive() and still_answers(server.url, {}),
                              devices=slot.devices, log=slot.log)
        answerer.process = server
        started.append(answerer)
    return started


def _over_http(cfg: "RegenConfig", tokenizer, check: "EndpointCheck", headers: Dict[str, str], kind: str,
               still_there: Callable[[], bool], devices: Optional[str] = None, log: Optional[Path] = None) -> Answerer:
    from blockdraft.regen.server_checks import data_parallel_size
    from blockdraft.regen.vllm_backend import vllm_reply

    reply = vllm_reply(check.url, check.model, tokenizer, cfg.max_tokens, cfg.max_prompt_tokens, cfg.temperature,
                       cfg.chat_template_kwargs, cfg.seed, cfg.request_timeout_s, headers)
    # A server regen started with vLLM's data parallelism batches `workers` on each of its engines.
    in_flight = cfg.workers * (data_parallel_size(cfg.extra_vllm_args) if kind == "started" else 1)
    return Answerer(check.url, check.model, reply, in_flight, kind, still_there, devices, log, check.tokenizer_checked)


def serving_python_and_device(cfg: "RegenConfig"):
    from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON
    from blockdraft.vllm_runtime.probe import probe_vllm

    python = Path(cfg.vllm_python).expanduser() if cfg.vllm_python else DEFAULT_VLLM_PYTHON
    if not python.is_file():
        raise ConfigError(f"vllm_python={str(python)!r} does not exist; run `make setup-serve`, set backend=transformers, "
                          "or answer with endpoints=[...] and servers=0")
    architecture = json.loads((Path(cfg.target_dir) / "config.json").read_text()).get("architectures", ["?"])[0]
    return python, probe_vllm(python, architecture).device


def _in_process(cfg: "RegenConfig", tokenizer) -> Answerer:
    import torch
    from transformers import AutoModelForCausalLM

    from blockdraft.regen.hf_backend import transformers_reply

    model = AutoModelForCausalLM.from_pretrained(cfg.target_dir, dtype=torch.float32).eval()
    reply = transformers_reply(model, tokenizer, cfg.max_tokens, cfg.max_prompt_tokens, cfg.temperature,
                               cfg.chat_template_kwargs, cfg.seed)
    return Answerer(None, cfg.target_dir, reply, 1, "in-process", lambda: True)
