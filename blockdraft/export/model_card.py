"""README.md for an exported draft: what it is, what it was trained on, and how to serve it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from blockdraft import kinds
from blockdraft.build_info import card_line as build_line
from blockdraft.export.deploy_line import deploy_line
from blockdraft.export.references import reference_lines
from blockdraft.export.source import CheckpointSource, last_accept_lengths
from blockdraft.export.training_prompts import card_line as training_prompts_line
from blockdraft.models.draft_config import DraftModelConfig


def shape_line(cfg: DraftModelConfig) -> str:
    return (
        f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, intermediate {cfg.intermediate_size}, "
        f"{cfg.num_attention_heads} heads / {cfg.num_key_value_heads} kv heads x {cfg.head_dim}, "
        f"vocab {cfg.vocab_size}, fc input {len(cfg.target_layer_ids)} x {cfg.target_hidden_size}"
    )


def model_card(cfg: DraftModelConfig, source: CheckpointSource, out_dir: Path, target: Optional[str], dtype: str) -> str:
    target_name = Path(target).name if target else "unknown"
    lines = [
        "---",
        *_license_lines(target),
        f"base_model: {target_name}",
        "tags: [speculative-decoding, dflash, " + {"domino": "domino]", "dspark": "dspark, vllm]"}.get(cfg.kind, "vllm]"),
        "---",
        "",
        f"# {kind_title(cfg)} draft for {target_name}",
        "",
        f"A block drafter for speculative decoding of `{target or 'unknown'}` "
        + ("with the project's reference engine (not vLLM)." if kinds.get(cfg.kind).reference_only else "with vLLM."),
        "",
        f"- kind: {cfg.kind} (`{kinds.get(cfg.kind).architecture}`), dtype {dtype}",
        f"- shape: {shape_line(cfg)}",
        f"- target layers: {cfg.target_layer_ids}; mask token id {cfg.mask_token_id}; block size {cfg.block_size}",
        f"- data: {source.train_data or 'unknown'}",
        f"- steps: {source.step if source.step is not None else 'unknown'}",
        training_prompts_line(source),
        build_line(),
        *_metric_lines(source),
        "",
        "## Serve",
        "",
        *_serve_lines(cfg, target, out_dir),
        "## References",
        "",
        *reference_lines(cfg.kind),
    ]
    return "\n".join(lines)


def _serve_lines(cfg: DraftModelConfig, target: Optional[str], out_dir: Path) -> list:
    line = deploy_line(cfg, out_dir, target, cfg.train_mask_embedding)
    if not line.vllm:
        return [f"**Not servable by vLLM**: {kinds.get(cfg.kind).reference_only}; config.json says so (`vllm_servable: false`). "
                "The project's reference engine decodes it (greedy output identical to the target's, batch size 1):",
                "", "```", line.command, "```", ""]
    return ["```bash", line.command, "```", "", *(f"- {note}" for note in line.notes), ""]


def _license_lines(target: Optional[str]) -> list:
    """The target's license, as its own model card states it: a draft trained on a model's outputs
    usually falls under that model's terms. Without one, `other`, and a line saying to choose."""
    found = target_license(Path(target)) if target else None
    if found:
        return ["# The target's license, from its model card; check its terms before publishing.", f"license: {found}"]
    return ["# The target's model card states no license: choose one before publishing (its terms apply).",
            "license: other"]


def target_license(target_dir: Path) -> Optional[str]:
    """`license:` from the front matter of the target directory's README.md, or None."""
    readme = target_dir / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(errors="replace")
    if not text.startswith("---"):
        return None
    for line in text.split("\n")[1:]:
        if line.strip() == "---":
            break
        key, _, value = line.partition(":")
        if key.strip() == "license" and value.strip():
            return value.strip()
    return None


def kind_title(cfg: DraftModelConfig) -> str:
    spec = kinds.get(cfg.kind)
    return spec.card_title or spec.title


def _metric_lines(source: CheckpointSource) -> list:
    found = last_accept_lengths(source)
    lines = []
    if "train" in found:
        step, value = found["train"]
        lines.append(f"- training accept_len (step {step}): {value:.3f}")
    if "val" in found:
        step, value = found["val"]
        lines.append(f"- validation accept_len (step {step}): {value:.3f}")
    return lines or ["- accept_len: not recorded"]
