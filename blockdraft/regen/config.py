"""The regen stage's settings (`configs/regen.yaml`): every key with its documentation, checked before any work."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from blockdraft.errors import ConfigError

PROMPT_SETS = ("sharegpt", "tiny_prompts")
BACKENDS = ("auto", "vllm", "transformers")
SPLITS = ("train", "heldout")


@dataclass
class RegenConfig:
    """Schema of `configs/regen.yaml`."""

    target_dir: str = MISSING
    """The target's local HF directory (`target=` works too on the command line)."""
    out: str = MISSING
    """Output directory: train.jsonl, heldout.jsonl, parts/, regen.json."""
    prompts: str = "sharegpt"
    """sharegpt (the installed package) | tiny_prompts | rows of `messages`/`conversations`: a JSONL, parquet
    or arrow file, a save_to_disk folder, or a Hugging Face dataset id (as data.train takes)."""
    num_train: int = 1000
    """Training conversations to generate."""
    num_heldout: int = 64
    """Held-out conversations (for validation and serving checks; never trained on)."""
    train_skip: int = 0
    """Prompts of the set skipped before the training ones."""
    heldout_skip: Optional[int] = None
    """Prompts skipped before the held-out ones; null = 10000 for sharegpt (its held-out range, which serve and eval read), else right after the training prompts (reserved first when the file is short). Held-out prompts asked again among the training ones are passed over."""
    allow_held_out_training: bool = False
    """sharegpt: let the training prompts reach its held-out range (positions 10000 on) and take prompts asked again there; serve and eval then refuse this draft's ShareGPT prompts unless allow_training_prompts=true."""
    max_turns: int = 1
    """User turns answered per conversation: 1 drops everything after the first user turn; more rolls the conversation out, each reply the target's own."""
    max_tokens: int = 192
    """Most tokens per reply; a reply cut here ends its conversation."""
    max_prompt_tokens: int = 384
    """Prompts (templated) longer than this are skipped and counted; later turns stop when the context would exceed it."""
    temperature: float = 0.0
    """0 = greedy (what the demo serves); above 0 samples with a per-conversation seed."""
    seed: int = 0
    """Base of the per-conversation sampling seeds (temperature above 0)."""
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra chat template variables; use what training and serving use."""
    backend: str = "auto"
    """auto (vLLM when the serving environment exists, else transformers) | vllm | transformers."""
    workers: int = 16
    """Conversations in flight at once per server (vLLM's --max-num-seqs; one with --data-parallel-size D takes
    D times as many); each server takes the next prompt when one of its own finishes. The transformers backend uses 1."""
    servers: Optional[int] = None
    """vLLM servers regen starts here, each on its own devices and port (log: vllm_regen.<i>.log): on a CUDA
    machine its own tensor_parallel_size GPUs (CUDA_VISIBLE_DEVICES), on CPU its own share of the cores.
    null = as many as the visible GPUs hold on a CUDA machine, 1 on CPU, 0 when endpoints are given (set it to
    run both)."""
    tensor_parallel_size: int = 1
    """GPUs per server (vLLM's --tensor-parallel-size), for a target that does not fit one GPU."""
    extra_vllm_args: List[str] = field(default_factory=list)
    """More arguments for every server regen starts, one list item per argv word, e.g.
    [--gpu-memory-utilization, '0.85'], or [--data-parallel-size, '8'] for vLLM's own data parallelism."""
    endpoints: List[str] = field(default_factory=list)
    """OpenAI-compatible servers that already run (vLLM, SGLang: http(s)://host:port), answering beside the
    servers regen starts. Each is checked before any generation: it lists the model (/v1/models), holds
    max_prompt_tokens + max_tokens, and tokenizes as target_dir does where it offers /tokenize."""
    endpoint_model: Optional[str] = None
    """The name the endpoints serve the target under (their --served-model-name); null = the one model each lists."""
    endpoint_api_key_env: Optional[str] = None
    """The environment variable holding the endpoints' API key, sent as a Bearer token; null = none."""
    retries: int = 3
    """Tries again after a failed request (5xx, 429, timeout, dropped connection) before its prompt is recorded as
    a reject in parts/<split>/rejects.jsonl; a rerun tries the rejects again. Other rows are kept either way."""
    retry_backoff_s: float = 2.0
    """Seconds before the first retry of a prompt; each later retry waits twice as long."""
    shard_size: int = 256
    """Prompt indices per shard file."""
    vllm_python: Optional[str] = None
    """The serving interpreter; null = <repo>/.venv-serve/bin/python."""
    kv_cache_gib: int = 2
    """vLLM on CPU: KV cache size in GiB."""
    cpu_threads_bind: str = "all"
    """vLLM on CPU: its OpenMP threads on every core (all), vLLM's default (auto: every core but one, kept for
    its engine loop), or a core list (0-1). For a batch of 32 on 2 cores, all gave 1.31x the tokens/s of auto."""
    startup_timeout_s: float = 600.0
    """Seconds the vLLM server may take to answer /health."""
    request_timeout_s: float = 900.0
    """Seconds one conversation's request may take."""
    progress: bool = True
    """Progress bar on the terminal."""

    # How fast, where and how loudly it runs: no row changes with them, so a rerun that changes only these
    # keeps the rows (the pipeline's regen key leaves them out).
    # Which servers answer is one of them: each checks it serves the target, and every row names its server.
    OUTPUT_NEUTRAL = ("workers", "vllm_python", "kv_cache_gib", "cpu_threads_bind", "startup_timeout_s",
                      "request_timeout_s", "progress", "servers", "tensor_parallel_size", "extra_vllm_args",
                      "endpoints", "endpoint_model", "endpoint_api_key_env", "retries", "retry_backoff_s")

    def validate(self) -> "RegenConfig":
        if not (Path(self.target_dir) / "config.json").is_file():
            raise ConfigError(
                f"target_dir={self.target_dir!r} has no config.json; point it at the target's HF directory "
                "(for SmolLM2: `python -m blockdraft.models.prepare_gguf` writes .cache/targets/smollm2-135m-instruct)"
            )
        if self.prompts not in PROMPT_SETS:
            from blockdraft.data.sources import check_source

            try:
                check_source(self.prompts, "prompts")
            except ConfigError as err:
                raise ConfigError(f"{err}; or use one of the built-in sets {list(PROMPT_SETS)}") from None
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r}; use one of {list(BACKENDS)}")
        for key in ("max_turns", "max_tokens", "max_prompt_tokens", "workers", "shard_size", "tensor_parallel_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)} must be 1 or more")
        for key in ("num_train", "num_heldout", "train_skip", "retries", "retry_backoff_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}={getattr(self, key)} must be 0 or more")
        if self.temperature < 0:
            raise ConfigError(f"temperature={self.temperature}: use 0 for greedy or a positive value to sample")
        from blockdraft.vllm_runtime.server import is_cpu_threads_bind

        if not is_cpu_threads_bind(self.cpu_threads_bind):
            raise ConfigError(f"cpu_threads_bind={self.cpu_threads_bind!r}: use auto (vLLM's default), all (every core), "
                              "or a core list such as 0-1.")
        from blockdraft.regen.server_checks import check_servers

        check_servers(self)
        return self

    def settings(self, backend: str) -> dict:
        """What decides the rows' content: recorded in every row and checked on resume."""
        return {
            "backend": backend, "max_tokens": self.max_tokens, "temperature": self.temperature, "seed": self.seed,
            "max_turns": self.max_turns, "max_prompt_tokens": self.max_prompt_tokens,
            "chat_template_kwargs": dict(self.chat_template_kwargs), "prompts": self.prompts,
        }
