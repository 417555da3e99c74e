"""Everything that can be refused before a server starts, each refusal saying what and how to fix.

Two layers: `read_draft` / `check_against_target` read only config.json files and
safetensors headers (pure, fast, unit-tested); `plan_serving` adds what the serving vLLM
says it can do (`blockdraft.vllm_runtime.probe`) and decides between vLLM and the reference engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

from blockdraft import kinds
from blockdraft.draft_format.causality import kind_with_causality
from blockdraft.errors import ConfigError
from blockdraft.export.reference_only import vllm_servable
from blockdraft.export.writer import EXPORT_INFO
from blockdraft.integrity import verify_checksums
from blockdraft.kinds.registry import architectures
from blockdraft.kinds.spec import drafted_per_round
from blockdraft.models.draft_config import layers_outside
from blockdraft.models.target_families import num_layers_in
from blockdraft.serve.config import ServeConfig
from blockdraft.serve.draft_aliases import alias_problem
from blockdraft.vllm_runtime.probe import VllmInfo, probe_vllm


@dataclass
class DraftFacts:
    """What serving needs to know about an exported draft, read from its config.json."""

    directory: Path
    architecture: str
    kind: str
    vocab_size: int
    hidden_size: int
    head_dim: int
    target_hidden_size: int
    target_layer_ids: List[int]
    mask_token_id: int
    block_size: Optional[int]
    vllm_servable: bool = True
    """False for a kind vLLM has no drafter for (config.json's `vllm_servable: false`)."""
    anchor_predicts: bool = False
    """DSpark's sample_from_anchor layout: every slot drafts, so a round drafts block_size tokens."""
    mixed_attention: bool = False
    """Sliding and full layers (`layer_types`): vLLM 0.32 serves that on its V2 model runner only."""

    @property
    def trained_tokens(self) -> Optional[int]:
        """The drafted tokens per round the draft was trained for (None without a block size)."""
        if self.block_size is None:
            return None
        return drafted_per_round(self.block_size, self.anchor_predicts)

    @property
    def trained_tokens_label(self) -> str:
        return "block_size" if self.anchor_predicts else "block_size - 1"


@dataclass
class TargetFacts:
    directory: Path
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    head_dim: int


@dataclass
class Plan:
    """The decided run: which engine checks the draft, on what, with how many drafted tokens."""

    draft: DraftFacts
    target: TargetFacts
    num_speculative_tokens: int
    engine: str  # "vllm" | "reference"
    device: str
    vllm: VllmInfo
    warnings: List[str] = field(default_factory=list)


# --- the draft and the target, from their files ---------------------------------------
def read_json(path: Path, key: str) -> dict:
    if not path.is_file():
        raise ConfigError(f"{key}: {path} does not exist; {_MISSING_FIX[key]}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{key}: {path} is not valid JSON ({err}); {_MISSING_FIX[key]}") from None


_MISSING_FIX = {
    "draft_dir": "export the draft with `python -m blockdraft.export checkpoint=<ckpt> out=<dir>` and pass that dir.",
    "target_dir": "pass the target's Hugging Face directory (it holds config.json).",
}


def read_draft(directory: str | Path) -> DraftFacts:
    directory = Path(directory)
    config = read_json(directory / "config.json", "draft_dir")
    where = f"{directory / 'config.json'}"
    archs = list(config.get("architectures") or [])
    # A kind's own name and other stacks' names for it (those served unchanged through vllm_plugin/).
    read = architectures()
    arch = next((a for a in archs if a in read), None)
    if arch is None:
        raise ConfigError(
            f"{where}: architectures={archs} is not a DFlash draft vLLM can serve; it must be "
            f"{list(read)} (vLLM renames anything else). Re-export with `python -m blockdraft.export`."
        )
    dflash = config.get("dflash_config")
    if not isinstance(dflash, dict) or "mask_token_id" not in dflash or not dflash.get("target_layer_ids"):
        raise ConfigError(
            f"{where}: dflash_config with mask_token_id and target_layer_ids is required (vLLM reads the "
            "target layers and the mask token from it); re-export the draft with `python -m blockdraft.export`."
        )
    kind = check_trained_attention(kind_with_causality(read[arch], config, where), directory, where)
    spec = kinds.get(kind)
    missing = [k for k in spec.required_keys if dflash.get(k) is None]
    if missing:
        raise ConfigError(
            f"{where}: a {spec.title} draft needs dflash_config.{missing[0]} (all of {list(spec.required_keys)}; vLLM "
            "reads each without a default); re-export it."
        )
    hidden = int(config["hidden_size"])
    return DraftFacts(
        directory=directory,
        architecture=arch,
        kind=kind,
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        head_dim=int(config.get("head_dim") or hidden // int(config["num_attention_heads"])),
        target_hidden_size=int(config.get("target_hidden_size") or hidden),
        target_layer_ids=[int(i) for i in dflash["target_layer_ids"]],
        mask_token_id=int(dflash["mask_token_id"]),
        block_size=_block_size(dflash, config),
        vllm_servable=vllm_servable(config, kind),
        anchor_predicts=spec.anchor_predicts(config),
        mixed_attention=len(set(config.get("layer_types") or [])) > 1,
    )


def check_trained_attention(kind: str, directory: Path, where: str) -> str:
    """The kind config.json makes vLLM serve must be the kind the export says it trained: a JetSpec
    draft served non-causally (or a DFlash draft causally) loses most of its acceptance, silently."""
    info_path = directory / EXPORT_INFO
    trained = json.loads(info_path.read_text()).get("draft_kind") if info_path.is_file() else None
    if trained is None or trained == kind or trained not in kinds.kind_names():
        return kind
    served, was = kinds.get(kind), kinds.get(trained)
    if served.architecture == was.architecture and served.causal_in_block != was.causal_in_block:
        def causal(spec):
            return "causal" if spec.causal_in_block else "non-causal"

        raise ConfigError(
            f"{where}: vLLM would run this draft's attention {causal(served)}, but it was trained as {trained} "
            f"({causal(was)} attention, {info_path.name}). Set `is_causal` to {str(was.causal_in_block).lower()} "
            "or export the checkpoint again."
        )
    return kind


def _block_size(dflash: dict, config: dict) -> Optional[int]:
    value = dflash.get("block_size", config.get("block_size"))
    return int(value) if value is not None else None


def read_target(directory: str | Path) -> TargetFacts:
    directory = Path(directory)
    config = read_json(directory / "config.json", "target_dir")
    text = config.get("text_config") or config  # multimodal wrappers keep the LM's sizes inside
    archs = list(config.get("architectures") or ["<none>"])
    hidden = int(text["hidden_size"])
    return TargetFacts(
        directory=directory,
        architecture=archs[0],
        vocab_size=int(text["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(num_layers_in(text) or 0),
        head_dim=int(text.get("head_dim") or hidden // int(text["num_attention_heads"])),
    )


def check_against_target(draft: DraftFacts, target: TargetFacts) -> None:
    """The draft must read exactly what this target produces: vocabulary, layers and widths."""
    where = f"{draft.directory / 'config.json'}"
    if draft.vocab_size != target.vocab_size:
        raise ConfigError(
            f"{where}: vocab_size={draft.vocab_size} but the target has {target.vocab_size}; the draft "
            "shares the target's embedding and head, so it must be trained and exported for this target."
        )
    if not 0 <= draft.mask_token_id < target.vocab_size:
        raise ConfigError(
            f"{where}: dflash_config.mask_token_id={draft.mask_token_id} is outside the target vocabulary "
            f"[0, {target.vocab_size}); the draft was trained for another target."
        )
    ids, hi = draft.target_layer_ids, target.num_layers - 2
    if ids != sorted(set(ids)) or layers_outside(ids, target.num_layers):
        raise ConfigError(
            f"{where}: dflash_config.target_layer_ids={ids} must be sorted, unique and within [0, {hi}] "
            f"for this {target.num_layers}-layer target; the draft was trained for another target."
        )
    if draft.target_hidden_size != target.hidden_size:
        raise ConfigError(
            f"{where}: target_hidden_size={draft.target_hidden_size} but the target's hidden_size is "
            f"{target.hidden_size}; the draft's fc reads {len(ids)} target layers of that width. "
            "Use the target it was trained on."
        )


def check_fc_weight(draft: DraftFacts, target: TargetFacts, in_features: Optional[int]) -> None:
    """The stored fc must read n target layers of the target's width (config and weights can disagree)."""
    n = len(draft.target_layer_ids)
    expected = n * target.hidden_size
    if in_features is None:
        raise ConfigError(
            f"{draft.directory}: the weights hold no 2-D fc.weight; re-export the draft with `python -m blockdraft.export`."
        )
    if in_features != expected:
        raise ConfigError(
            f"{draft.directory}: fc.weight takes {in_features} inputs, but {n} target layers "
            f"(dflash_config.target_layer_ids) x hidden_size {target.hidden_size} = {expected}; re-export the draft."
        )


def fc_in_features(directory: Path) -> Optional[int]:
    """fc.weight's input width from the safetensors headers (nothing is loaded); None if absent."""
    from blockdraft.draft_format.importer import canonical_name, tensor_headers

    for name, (shape, _dtype) in tensor_headers(directory).items():
        if canonical_name(name) == "fc.weight" and len(shape) == 2:
            return int(shape[1])
    return None


def check_drafted_tokens(kind: str, k: int, block_size: Optional[int], key: str = "num_speculative_tokens") -> None:
    """vLLM 0.32's LiLiCorr refuses to start unless 1 <= num_speculative_tokens < its block_size (its lattice
    has block_size - 1 slots after the anchor): refused here, with the fix, before any server loads."""
    spec = kinds.get(kind)
    if spec.drafts_below_block and block_size is not None and k >= block_size:
        raise ConfigError(f"{key}={k} with a {spec.title} draft of block_size={block_size}: vLLM's {spec.title} drafts at most "
                          f"block_size - 1 = {block_size - 1} tokens a round and will not start otherwise; set {key}="
                          f"{block_size - 1} or fewer (null: {block_size - 1}).")


# --- what the serving vLLM can do ------------------------------------------------------
def speculative_tokens(requested: Optional[int], trained: Optional[int], label: str = "block_size - 1") -> tuple[int, List[str]]:
    """-> (num_speculative_tokens, warnings). Default: the trained drafted tokens (`label` says how they
    follow from the block: block_size - 1, or block_size for DSpark's anchor-first layout)."""
    if requested is None:
        if trained is None:
            raise ConfigError(
                "the draft's config.json has no dflash_config.block_size, so num_speculative_tokens has "
                f"no default; set num_speculative_tokens=<{label} of training>."
            )
        return trained, []
    if trained is None or requested == trained:
        return requested, []
    if requested > trained:
        return requested, [
            f"num_speculative_tokens={requested} is above {label} = {trained}: slots past "
            "the trained block were never trained, so their acceptance will be near zero."
        ]
    return requested, [
        f"num_speculative_tokens={requested} is below {label} = {trained} "
        "(allowed; the trained block's last slots go unused)."
    ]


def target_serving_problem(info: VllmInfo, target: TargetFacts) -> Optional[str]:
    """Why the serving vLLM cannot run this target with a DFlash draft, or None if it can."""
    arch, version = target.architecture, info.version
    if not info.arch_known:
        return f"architecture {arch!r} is not in vLLM {version}'s registry"
    if info.arch_error:
        return f"vLLM {version} cannot import its class for {arch!r} here ({info.arch_error})"
    if not info.arch_supports_eagle3:
        return (
            f"architecture {arch!r} cannot expose the hidden states DFlash needs in vLLM {version} "
            "(its model class lacks the EAGLE3 aux-hidden-state interface)"
        )
    if info.arch_has_inner_state and not info.has_triton:
        # Measured with vLLM 0.32.0 on CPU: with prefix caching the first drafted request fails in
        # mamba_utils' Triton precopy kernel; without it the output differs from the target's.
        return (
            f"{arch!r} keeps Mamba / linear-attention state, which vLLM {version} rewinds past rejected "
            f"drafts with Triton kernels this {info.device} build lacks (speculative decoding would fail "
            "or change the output)"
        )
    return None


def check_vllm_support(info: VllmInfo, draft: DraftFacts, target: TargetFacts) -> None:
    """Refuse a pair vLLM cannot serve, naming the architecture and the reason."""
    problem = target_serving_problem(info, target)
    if problem:
        raise ConfigError(
            f"target_dir: {problem}; vLLM cannot serve this target with a DFlash draft. Serve with "
            "engine=auto or engine=reference to check the draft on the reference engine, or use a target "
            "whose vLLM class supports it (Qwen3, Qwen2, Llama, Mistral, NemotronH, ...)."
        )
    alias = alias_problem(info, draft.architecture)
    if alias:
        raise ConfigError(f"{draft.directory / 'config.json'}: {alias}")
    spec = kinds.get(draft.kind)
    if spec.vllm_method and not spec.v2_runner and draft.architecture not in info.dflash_archs:
        raise ConfigError(
            f"vLLM {info.version} has no {draft.architecture} in its registry; serve with a vLLM that has "
            "DFlash (`make setup-serve` installs one) via vllm_python."
        )


def resolve_device(requested: str, info: VllmInfo) -> str:
    if requested != "auto" and requested != info.device:
        raise ConfigError(
            f"device={requested} but the serving vLLM ({info.version}) is built for {info.device}; "
            "set device=auto, or point vllm_python at a vLLM built for that device."
        )
    return info.device


def choose_engine(
    draft: DraftFacts, info: VllmInfo, target: Optional[TargetFacts] = None, requested: str = "auto"
) -> tuple[str, List[str]]:
    """vLLM where it can serve the pair (DFlash2 only where its V2 runner can run it), else the
    reference engine, saying why; `requested` = vllm refuses instead, = reference skips vLLM."""
    if requested == "reference":
        return "reference", ["engine=reference: the draft is checked with the project's reference engine, not with vLLM."]
    if not draft.vllm_servable:
        reason = kinds.get(draft.kind).reference_only or "its config.json says `vllm_servable: false`"
        if requested == "vllm":
            raise ConfigError(
                f"engine=vllm: {reason}, so vLLM cannot serve {draft.directory}. Set engine=auto or "
                "engine=reference to check it with the project's reference engine."
            )
        return "reference", [f"{reason}. The draft is checked with the project's own reference engine instead, not with vLLM."]
    problem = target_serving_problem(info, target) if target is not None else None
    if problem is not None:
        if requested == "vllm":
            check_vllm_support(info, draft, target)
        return "reference", [
            f"{problem}, so vLLM cannot serve this target here. The draft is checked with the project's own "
            "reference engine instead, not with vLLM."
        ]
    spec = kinds.get(draft.kind)
    # A kind only vLLM's V2 runner serves needs its own class there; a mixed-attention draft, the V2 runner.
    v2_architecture = spec.architecture if spec.v2_runner else draft.architecture
    if not spec.v2_runner and not draft.mixed_attention or info.can_run_v2_draft(v2_architecture):
        return "vllm", []
    why = "it has no Triton GPU backend" if info.device == "cpu" or not info.has_triton else "its V2 model runner is off"
    if not spec.v2_runner:  # a draft of mixed sliding and full layers
        refusal = (f"vLLM {info.version} on {info.device} cannot run this draft's mixed sliding/full attention layers "
                   f"({why}; its V1 runner refuses them)")
        if requested == "vllm":
            raise ConfigError(f"engine=vllm: {refusal}. Serve on a GPU vLLM, or set engine=auto for the reference engine.")
        return "reference", [f"{refusal}. The draft is checked with the project's own reference engine instead, not with vLLM."]
    if spec.architecture not in info.dflash_archs and info.runs_v2_runner:
        why = f"its registry has no {spec.architecture}"
    name = spec.title
    refusal = f"vLLM {info.version} on {info.device} cannot run {name} ({why}; its V1 runner refuses {name} drafts)"
    if requested == "vllm":
        raise ConfigError(f"engine=vllm: {refusal}. Serve on a GPU vLLM, or set engine=auto for the reference engine.")
    return "reference", [f"{refusal}. The draft is checked with the project's own reference engine instead, not with vLLM."]


def check_cpu_head_sizes(info: VllmInfo, draft: DraftFacts, target: TargetFacts) -> None:
    """vLLM's CPU attention only has kernels for some head sizes; it fails at the first request otherwise."""
    sizes = info.cpu_head_sizes
    for who, head_dim in (("target", target.head_dim), ("draft", draft.head_dim)):
        if sizes and head_dim not in sizes:
            raise ConfigError(
                f"{who}_dir: head_dim={head_dim} has no kernel in vLLM {info.version}'s CPU attention "
                f"(supported: {sizes}). Use a model with one of those head sizes (a tiny test target: "
                "save_tiny_target(dir, hidden_size=128) gives head_dim 32), or serve on a GPU."
            )


def without_vllm(requested_device: str, why: str) -> VllmInfo:
    """What the plan records where engine=reference runs: the reference engine needs no vLLM, so nothing of it
    is asked (on a GPU machine with torch alone there is none to ask; elsewhere asking costs a vLLM import,
    9 s on a 2-core CPU)."""
    import torch

    device = requested_device if requested_device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    return VllmInfo(version=f"none ({why})", device=device, has_triton=False, v2_runner_env=None)


def plan_serving(cfg: ServeConfig, probe: Callable[..., VllmInfo] = probe_vllm) -> Plan:
    """All checks, cheapest first; returns the plan or raises ConfigError before anything heavy runs."""
    cfg.validate()
    python = None if cfg.engine == "reference" else cfg.vllm_python_path()
    verify_checksums(cfg.draft_dir)  # a corrupt export is named here, not by a vLLM crash
    draft, target = read_draft(cfg.draft_dir), read_target(cfg.target_dir)
    check_against_target(draft, target)
    check_fc_weight(draft, target, fc_in_features(draft.directory))
    k, warnings = speculative_tokens(cfg.num_speculative_tokens, draft.trained_tokens, draft.trained_tokens_label)
    check_drafted_tokens(draft.kind, k, draft.block_size)
    if python:
        info = probe(python, target.architecture)
    else:
        info = without_vllm(cfg.device, "not asked: engine=reference" if cfg.has_vllm_python() else
                            "no serving environment; engine=reference")
    engine, notes = choose_engine(draft, info, target, cfg.engine)
    if engine == "vllm":
        check_vllm_support(info, draft, target)
    device = resolve_device(cfg.device, info)
    if engine == "vllm" and device == "cpu":
        check_cpu_head_sizes(info, draft, target)
    return Plan(draft, target, k, engine, device, info, warnings + notes + kinds.get(draft.kind).serving_warnings(info, draft))
