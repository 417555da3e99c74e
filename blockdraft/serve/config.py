"""Schema of the smoke-serve app: which draft and target, which prompts, how vLLM is run.

Checks here are the cheap ones (types, ranges, files that must exist); everything that
needs the draft's config, the target's config or the serving vLLM lives in `preflight`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from blockdraft.errors import ConfigError
from blockdraft.vllm_runtime import DEFAULT_VLLM_PYTHON

BUILTIN_PROMPT_SETS = ("sharegpt", "humaneval", "tiny")
ENGINES = ("auto", "vllm", "reference")
SERVER_METHODS = ("auto", "fresh", "frozen", "kept")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class ServeConfig:
    """`python -m blockdraft.serve draft=<dir> target=<dir> ...`: a lossless and acceptance check.

    `draft` and `target` are config groups of the training app, so Hydra would read
    `draft=<dir>` as a group choice; the keys are `draft_dir` / `target_dir`, and the
    command line (`__main__`) accepts `draft=` / `target=` as aliases of them.
    """

    draft_dir: str = MISSING
    """An exported draft directory (config.json + safetensors), as `blockdraft.export` writes it."""
    target_dir: str = MISSING
    """The target's local Hugging Face directory (model, tokenizer, chat template)."""
    prompts: str = "tiny"
    """A JSONL file (`messages` or `{"prompt": ...}` per line) or a built-in set: sharegpt | humaneval | tiny."""
    prompts_skip: Optional[int] = None
    """Prompts skipped before the first one used; null = 10000 for sharegpt (its held-out range, which regen never trains on), else 0."""
    allow_training_prompts: bool = False
    """Measure prompts the draft trained on (its training_prompts.bin holds them) instead of refusing them; the
    report's headline then says its acceptance is inflated by memorised prompts."""
    num_prompts: int = 8
    """How many prompts are sent (fewer if the set runs out)."""
    max_tokens: int = 64
    """Tokens generated per prompt."""
    rounds: int = 2
    """Baseline/draft passes over the prompts, the order alternating; the speedup is their median, beside a
    paired interval over every prompt of every round (one round gives that interval alone)."""
    servers: str = "auto"
    """Where the rounds run: kept (one baseline and one draft server for every round, started side by side, each
    prompt sent to both in turn: 2 start-ups; it measured 1.375x where fresh servers measured 1.376x on a 2-core
    CPU, docs/benchmarks-history.md serve_methods) | frozen (the same, the idle one stopped with SIGSTOP; it read 3.7%
    high there) | fresh (a new pair every round: 2 start-ups a round) | auto (kept on a CPU; fresh on a GPU,
    where two servers at once would each claim their memory share)."""
    warmup_prompts: int = 2
    """Prompts generated in full, untimed, on each server before its first measured phase."""
    out: str = "runs/serve"
    """Report directory: report.json, acceptance.png and the vLLM logs."""
    overwrite: bool = False
    """Replace the report and logs of an earlier run in `out` (refused otherwise)."""
    num_speculative_tokens: Optional[int] = None
    """Drafted tokens per step; null = what the draft was trained to draft: block_size - 1, or block_size for
    a DSpark draft that drafts from its anchor (sample_from_anchor). Another value is allowed, with a warning."""
    vllm_python: Optional[str] = None
    """The serving interpreter; null = <repo>/.venv-serve/bin/python (built by `make setup-serve`)."""
    startup_timeout_s: float = 600.0
    """Seconds a vLLM server may take to answer /health before the run is stopped."""
    request_timeout_s: float = 300.0
    """Seconds one generation request may take."""
    kv_cache_gib: int = 1
    """CPU only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    max_model_len: int = 512
    """Context length vLLM reserves; prompts longer than max_model_len - max_tokens are skipped."""
    max_num_seqs: int = 4
    """vLLM's batch limit; requests are sent one at a time, so a small value saves memory."""
    min_acceptance_length: Optional[float] = None
    """Fail when the mean acceptance length (1 + accepted / drafts) is below this; null = no floor."""
    use_chat_template: bool = True
    """Apply the target's chat template client-side; a `prompt` row becomes one user message."""
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra chat template variables, e.g. {enable_thinking: false}; use what training used."""
    ignore_eos: bool = False
    """Generate max_tokens for every prompt even past EOS (steadier tokens/s, more tokens compared)."""
    allow_near_ties: bool = False
    """Pass a run whose only mismatches are near-ties of the target (still reported)."""
    extra_vllm_args: List[str] = field(default_factory=list)
    """More vLLM server arguments, one list item per argv word, e.g. [--gpu-memory-utilization, '0.5']."""
    device: str = "auto"
    """auto (what the serving vLLM was built for) | cpu | cuda."""
    engine: str = "auto"
    """auto (vLLM where it can serve the pair, else the project's reference engine, saying why) |
    vllm (refuse a pair vLLM cannot serve) | reference."""

    # Where the interpreter is and how long to wait: the report's figures do not depend on them.
    OUTPUT_NEUTRAL = ("vllm_python", "startup_timeout_s", "request_timeout_s", "overwrite")

    def _check_out(self) -> None:
        out = Path(self.out).expanduser()
        earlier = [p.name for p in out.glob("*")] if out.is_dir() else []
        if earlier and not self.overwrite:
            raise ConfigError(
                f"out={self.out!r} already holds {', '.join(sorted(earlier)[:4])}; pick another out, "
                "or pass overwrite=true to replace that report."
            )

    def validate(self) -> "ServeConfig":
        """Cheap checks that catch a typo before any model or server is touched."""
        for key in ("draft_dir", "target_dir"):
            path = Path(str(getattr(self, key))).expanduser()
            if not path.is_dir():
                raise ConfigError(f"{key}={getattr(self, key)!r} is not a directory; {_FIXES[key]}")
        self._check_out()
        self._check_prompts()
        return self.validate_settings()

    def validate_settings(self) -> "ServeConfig":
        """The checks that need no draft, target or prompts on disk: a pipeline runs them before its
        first stage, hours before its serve stage would."""
        self._check_positive("num_prompts", "rounds", "max_tokens", "max_model_len", "max_num_seqs", "kv_cache_gib")
        self._check_positive("startup_timeout_s", "request_timeout_s")
        if self.max_tokens >= self.max_model_len:
            raise ConfigError(
                f"max_tokens={self.max_tokens} leaves no room for a prompt in "
                f"max_model_len={self.max_model_len}; raise max_model_len or lower max_tokens."
            )
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 1:
            raise ConfigError(
                f"num_speculative_tokens={self.num_speculative_tokens}: draft at least 1 token, "
                "or set null for the draft's trained count (block_size - 1; block_size for DSpark from its anchor)."
            )
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r} is not one of {list(DEVICES)}; pick one.")
        if self.servers not in SERVER_METHODS:
            raise ConfigError(f"servers={self.servers!r} is not one of {list(SERVER_METHODS)}; pick one "
                              "(auto: one server of each side kept for every round on a CPU).")
        if not isinstance(self.warmup_prompts, int) or self.warmup_prompts < 0:
            raise ConfigError(f"warmup_prompts={self.warmup_prompts!r}: set 0 or more prompts.")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine={self.engine!r} is not one of {list(ENGINES)}; pick one.")
        if not all(isinstance(a, str) for a in self.extra_vllm_args):
            raise ConfigError(
                f"extra_vllm_args={list(self.extra_vllm_args)!r} must be strings, one per argv word; "
                "quote numbers, e.g. ['--gpu-memory-utilization', '0.5']."
            )
        return self

    def _check_prompts(self) -> None:
        if self.prompts not in BUILTIN_PROMPT_SETS and not Path(self.prompts).expanduser().is_file():
            raise ConfigError(
                f"prompts={self.prompts!r} is neither a file nor a built-in set; "
                f"give a JSONL path or one of {list(BUILTIN_PROMPT_SETS)}."
            )
        if self.prompts_skip is not None and self.prompts_skip < 0:
            raise ConfigError(f"prompts_skip={self.prompts_skip}: set 0 or more (null = the set's default).")

    def _check_positive(self, *keys: str) -> None:
        for key in keys:
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{key}={value!r} must be a positive number; set {key} above 0.")

    def server_method(self, device: str) -> str:
        """The `servers` method on `device`; kept and frozen pairs are refused on a GPU, whose two servers
        would each claim their gpu_memory_utilization share at once."""
        if device == "cpu":
            return "kept" if self.servers == "auto" else self.servers
        if self.servers in ("kept", "frozen"):
            raise ConfigError(f"servers={self.servers} keeps a baseline and a draft vLLM server up at once, which on "
                              f"{device} would each claim their gpu_memory_utilization share; set servers=fresh "
                              "(or auto: a fresh pair per round on a GPU).")
        return "fresh"

    def has_vllm_python(self) -> bool:
        return (Path(self.vllm_python).expanduser() if self.vllm_python else DEFAULT_VLLM_PYTHON).is_file()

    def vllm_python_path(self) -> Path:
        """The serving interpreter, which must exist: vLLM pins its own torch, so it lives apart."""
        path = Path(self.vllm_python).expanduser() if self.vllm_python else DEFAULT_VLLM_PYTHON
        if not path.is_file():
            raise ConfigError(
                f"vllm_python={str(path)!r} does not exist: the serving environment is not built. "
                "Run `make setup-serve` (it creates .venv-serve), or point vllm_python at a "
                "Python that has vLLM installed."
            )
        return path


_FIXES = {
    "draft_dir": "point it at a directory written by `python -m blockdraft.export` (config.json + model.safetensors).",
    "target_dir": "point it at the target's local Hugging Face directory (the one the draft was trained on).",
}
