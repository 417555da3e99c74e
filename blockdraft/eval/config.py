"""Schema of the eval app (`configs/eval.yaml`): which drafts, on which prompt sets, how drawn,
at which concurrencies, and the vLLM servers' settings."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from blockdraft.errors import ConfigError
from blockdraft.serve.client import Sampling
from blockdraft.serve.config import BUILTIN_PROMPT_SETS, ServeConfig


@dataclass
class DatasetOptions:
    """Per dataset; null keeps the app-wide value."""

    num_prompts: Optional[int] = None
    max_tokens: Optional[int] = None
    skip: Optional[int] = None
    """Prompts skipped first (null = the set's default: ShareGPT starts at its held-out range, position 10000, which regen never trains on)."""
    use_chat_template: Optional[bool] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    """e.g. {enable_thinking: false} where the template has it."""


@dataclass
class SamplingSpec:
    temperature: float = 0.0
    """0 = greedy: output must then be token-identical to the target's."""
    top_p: float = 1.0
    top_k: Optional[int] = 0
    """0 = no top-k truncation; null (the default sampled setting's) = 20 where the engine can verify drafts
    with a top-k, none on a CPU vLLM (whose rejection sampler cannot take one), said in the table."""


@dataclass
class EvalAppConfig:
    target_dir: str = MISSING
    """The target's local Hugging Face directory (`target=` on the command line)."""
    drafts: List[str] = field(default_factory=list)
    """Exported draft directories; each is one column of the table."""
    runs: List[Optional[str]] = field(default_factory=list)
    """Training run directories, one per draft (or none): their last validation accept_len is shown
    beside the served figure. Empty: read from each export's model card when it names its run."""
    datasets: List[str] = field(default_factory=lambda: ["sharegpt", "humaneval"])
    """Built-in sets (sharegpt: held-out prompts | humaneval | tiny) or chat / prompt JSONL files."""
    # Plain dicts, checked against DatasetOptions / SamplingSpec by `validate`: a typed dict of
    # dataclasses would refuse new keys from the command line (+sampling.hot.temperature=1.2).
    dataset_options: Dict[str, Any] = field(default_factory=lambda: {"humaneval": {"use_chat_template": False}})
    """Per dataset name, what differs from the app-wide keys: {num_prompts, max_tokens, skip, use_chat_template,
    chat_template_kwargs} (DatasetOptions)."""
    num_prompts: int = 16
    """Prompts per dataset (dataset_options.<name>.num_prompts overrides it)."""
    max_tokens: int = 128
    """Tokens generated per prompt (dataset_options.<name>.max_tokens overrides it)."""
    settings: List[str] = field(default_factory=lambda: ["greedy", "sampled"])
    """Names from `sampling`."""
    sampling: Dict[str, Any] = field(default_factory=lambda: {
        "greedy": {"temperature": 0.0}, "sampled": {"temperature": 1.0, "top_p": 0.95, "top_k": None}})
    """Named sampling settings {temperature, top_p, top_k} (SamplingSpec); add one with
    +sampling.<name>={temperature: ...}."""
    concurrency: List[int] = field(default_factory=lambda: [1])
    """Requests in flight at once; a draft's speedup shrinks as the batch grows."""
    seed: int = 0
    """Sampled prompt i is drawn with seed + i, by the target alone and with every draft."""
    out: str = "runs/eval"
    """eval.json, eval.md, the plots, and cells/ (each finished cell: a rerun skips it)."""
    use_chat_template: bool = True
    """Apply the target's chat template client-side (dataset_options.<name> overrides it)."""
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra chat template variables, e.g. {enable_thinking: false}; use what training used."""
    allow_near_ties: bool = False
    """Greedy: count a first difference at a near-tie of the target's top two logprobs as lossless."""
    allow_training_prompts: bool = False
    """Measure a dataset's prompts that a draft trained on (its training_prompts.bin holds them) instead of refusing
    them; eval.md's headline then names each draft and dataset whose figures they inflate."""
    ignore_eos: bool = False
    """Generate max_tokens for every prompt even past EOS."""
    # The servers (as in smoke-serve).
    vllm_python: Optional[str] = None
    """The serving interpreter; null = <repo>/.venv-serve/bin/python."""
    device: str = "auto"
    """auto (what the serving vLLM was built for) | cpu | cuda."""
    max_model_len: int = 1024
    """Context length vLLM reserves."""
    max_num_seqs: Optional[int] = None
    """null = the largest concurrency."""
    kv_cache_gib: int = 2
    """CPU only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    startup_timeout_s: float = 600.0
    """Seconds a vLLM server may take to answer /health."""
    request_timeout_s: float = 600.0
    """Seconds one generation request may take."""
    extra_vllm_args: List[str] = field(default_factory=list)
    """More vLLM server arguments, one list item per argv word."""

    # --- derived ----------------------------------------------------------------------
    def options(self, dataset: str) -> DatasetOptions:
        given = _typed(DatasetOptions, self.dataset_options.get(dataset) or {}, f"dataset_options.{dataset}")
        return DatasetOptions(
            num_prompts=given.num_prompts or self.num_prompts,
            max_tokens=given.max_tokens or self.max_tokens,
            skip=given.skip,
            use_chat_template=self.use_chat_template if given.use_chat_template is None else given.use_chat_template,
            chat_template_kwargs=dict(self.chat_template_kwargs if given.chat_template_kwargs is None else given.chat_template_kwargs),
        )

    def spec(self, setting: str) -> SamplingSpec:
        return _typed(SamplingSpec, self.sampling[setting], f"sampling.{setting}")

    def sampling_of(self, setting: str) -> Sampling:
        spec = self.spec(setting)
        return Sampling(spec.temperature, spec.top_p, spec.top_k)

    def serve_config(self, draft: str) -> ServeConfig:
        """What the smoke-serve preflight checks a draft against (nothing is written there)."""
        return ServeConfig(
            draft_dir=draft, target_dir=self.target_dir, out=str(Path(self.out) / "preflight"), overwrite=True,
            vllm_python=self.vllm_python, device=self.device, max_model_len=self.max_model_len,
            max_num_seqs=self.num_seqs(), kv_cache_gib=self.kv_cache_gib, startup_timeout_s=self.startup_timeout_s,
            request_timeout_s=self.request_timeout_s, extra_vllm_args=list(self.extra_vllm_args),
            max_tokens=max(self.options(d).max_tokens for d in self.datasets), ignore_eos=self.ignore_eos,
        )

    def num_seqs(self) -> int:
        return self.max_num_seqs or max(self.concurrency)

    def validate(self) -> "EvalAppConfig":
        """Cheap checks first: a typo fails in a second, before any model or server."""
        if not self.drafts:
            raise ConfigError("drafts=[] : give at least one exported draft directory, e.g. drafts=[exports/a,exports/b].")
        if self.runs and len(self.runs) != len(self.drafts):
            raise ConfigError(f"runs has {len(self.runs)} entries for {len(self.drafts)} drafts: give one run directory "
                              "per draft (null where unknown), or none.")
        labels = [draft_label(d) for d in self.drafts]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"drafts {list(self.drafts)} share a directory name ({labels}); each column is named "
                              "after its directory: rename or copy one.")
        if not self.datasets:
            raise ConfigError("datasets=[] : name at least one, e.g. datasets=[sharegpt,humaneval].")
        for d in self.datasets:
            if d not in BUILTIN_PROMPT_SETS and not Path(d).expanduser().is_file():
                raise ConfigError(f"datasets has {d!r}: neither a built-in set {list(BUILTIN_PROMPT_SETS)} nor a file.")
        unknown = [s for s in self.settings if s not in self.sampling]
        if unknown or not self.settings:
            raise ConfigError(f"settings={list(self.settings)}: {unknown or 'none'} not defined in sampling "
                              f"({sorted(self.sampling)}); add them, e.g. +sampling.hot={{temperature:1.2}}.")
        for name in self.dataset_options:
            self.options(name)
        for name in self.sampling:
            spec = self.spec(name)
            if spec.temperature < 0 or not 0 < spec.top_p <= 1 or (spec.top_k or 0) < 0:
                raise ConfigError(f"sampling.{name}={spec}: use temperature >= 0, 0 < top_p <= 1, top_k >= 0.")
        if not self.concurrency or any(c < 1 for c in self.concurrency) or len(set(self.concurrency)) != len(self.concurrency):
            raise ConfigError(f"concurrency={list(self.concurrency)}: give distinct values of 1 or more, e.g. [1,4,16].")
        if self.num_seqs() < max(self.concurrency):
            raise ConfigError(f"max_num_seqs={self.max_num_seqs} is below concurrency {max(self.concurrency)}: "
                              "the server would queue requests; raise it or leave it null.")
        return self


DEFAULT_TOP_K = 20  # Qwen3's recommended sampling (temperature 1, top-p 0.95, top-k 20)


def settle_top_k(cfg: EvalAppConfig, device: str, vllm: bool) -> List[str]:
    """A setting's top_k left null becomes 20, or none on a CPU vLLM; an explicit top-k there is refused
    (vLLM 0.32.0 on CPU crashes a draft's sampled request that has one: the rejection sampler's top-k path
    indexes past the vocabulary, or reduces an empty tensor; top-p alone works). Returns what was dropped."""
    cpu_vllm = vllm and device == "cpu"
    notes = []
    for name in cfg.sampling:
        spec = cfg.spec(name)
        if spec.top_k is None:
            cfg.sampling[name] = {**cfg.sampling[name], "top_k": 0 if cpu_vllm else DEFAULT_TOP_K}
            if cpu_vllm and spec.temperature > 0 and name in cfg.settings:
                notes.append(f"sampling.{name} runs without its default top-k {DEFAULT_TOP_K}: vLLM on CPU cannot "
                             "verify drafts with a top-k (top-p alone works)")
    broken = [s for s in cfg.settings if cpu_vllm and cfg.spec(s).temperature > 0 and cfg.spec(s).top_k > 0]
    if broken:
        fixes = " ".join(f"sampling.{s}.top_k=0" for s in broken)
        raise ConfigError(
            f"settings {broken} sample with a top-k, which vLLM on CPU cannot verify drafts with (its rejection "
            f"sampler fails on the top-k path and the server dies). On a CPU vLLM drop the top-k ({fixes}) or "
            "leave it null (the default): top-p alone works; on a GPU a top-k runs as it is.")
    return notes


def _typed(schema, values, where: str):
    """A dict from the command line as its dataclass; an unknown key is named with the known ones."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}={values!r}: give a mapping, e.g. {where}={{temperature:1.0}}.")
    known = {f.name for f in fields(schema)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {unknown}; use {sorted(known)}.")
    return schema(**values)


def draft_label(path: str) -> str:
    return Path(path).expanduser().resolve().name
