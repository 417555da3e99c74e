"""The one `vllm serve` line that deploys a draft, with what it needs beyond itself.

The export, `inspect`, the model card and the pipeline's final table all print what `deploy_line`
builds, so a user never reads vLLM's source to serve a draft. What each part is, from vLLM 0.32:

- the method: `dspark` for DSpark (qwen3_dspark.py), `dflash` for every DFlash kind: vLLM tells
  DFlash2 from DFlash by the architecture `DFlash2DraftModel`, JetSpec by `is_causal`;
- num_speculative_tokens: block_size - 1 (DFlash drafts from the MASK slots, the anchor being the
  bonus query), block_size for DSpark with `sample_from_anchor` (every slot, the anchor's included,
  predicts; config/speculative.py defaults it to `block_size` only when absent). Always written: vLLM
  never checks it against the trained block;
- VLLM_USE_V2_MODEL_RUNNER=1 for DFlash2 and DSpark: config/vllm.py's `use_v2_model_runner` takes
  the variable first and otherwise picks V2 only with Triton and no feature V2 lacks, falling back to
  V1, which refuses both ("Model Runner V1 does not support: DFlash candidate-head drafts" /
  "dspark speculative decoding"). With the variable set, vLLM runs V2 or refuses at start-up with V2's
  own reason ("Model Runner V2 requires Triton." on a machine without it);
- the files: `mask_embedding.pt` is read from the draft directory (qwen3_dflash.py
  `_read_mask_embedding`) and its absence is silent; a reduced vocabulary's `lm_head.weight` and
  `d2t` ride in the safetensors, and a missing weight is not noticed by vLLM either.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Tuple

from blockdraft import kinds
from blockdraft.draft_format.config_reader import draft_config_from_vllm_config
from blockdraft.draft_format.importer import CONFIG_NAME, read_config, with_mask_embedding
from blockdraft.draft_format.mask_embedding import MASK_EMBEDDING_FILE
from blockdraft.export.export_info import read_export_info
from blockdraft.models.draft_config import DraftModelConfig

V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
# A draft of any kind whose layers mix sliding and full attention (speculators' --full-attention-indices).
MIXED_ATTENTION = ("its mixed sliding/full attention layers need several KV-cache groups, which only V2 has; V1 refuses "
                   "`DFlash drafters with mixed sliding/full attention` (qwen3_dflash.py)")
TARGET_PLACEHOLDER = "<target>"
# Other stacks' names for our kinds, which vLLM serves only through vllm_plugin/ (its ALIASES).
PLUGIN_ALIASES = ("Qwen3DFlashDraftModel", "Qwen3DFlash2DraftModel", "Qwen3DSparkDraftModel")


@dataclass(frozen=True)
class DeployLine:
    command: str
    """One shell line: the environment vLLM needs, then `vllm serve` (the reference engine's command for a
    kind vLLM cannot serve)."""
    notes: Tuple[str, ...]
    """Why each part of the line is there, and what the draft directory must carry."""
    vllm: bool
    """False where vLLM cannot serve the kind at all."""

    def lines(self, indent: str = "") -> list:
        return [f"{indent}{self.command}", *(f"{indent}- {note}" for note in self.notes)]


def v2_runner_reason(kind: str, mixes_attention: bool) -> Optional[str]:
    """Why vLLM 0.32 serves this draft only on its V2 model runner, or None where V1 serves it too."""
    return kinds.get(kind).v2_runner or (MIXED_ATTENTION if mixes_attention else None)


def vllm_method(kind: str) -> str:
    """vLLM's speculative method for the kind (KindSpec.vllm_method): `dspark` for DSpark, `dflash` for the rest."""
    return kinds.get(kind).vllm_method


def drafted_tokens_note(cfg: DraftModelConfig) -> str:
    """How num_speculative_tokens follows from the block, in the draft's layout."""
    if cfg.anchor_predicts:
        return f"num_speculative_tokens = block_size = {cfg.num_speculative_tokens} (every slot, the anchor's included, predicts)"
    return f"num_speculative_tokens = block_size - 1 = {cfg.num_speculative_tokens}"


def deploy_line(cfg: DraftModelConfig, draft_dir: str | Path, target: Optional[str], mask_embedding: bool) -> DeployLine:
    """The line for a draft of `cfg` in `draft_dir` (`mask_embedding`: it carries mask_embedding.pt)."""
    served = shlex.quote(str(target)) if target else TARGET_PLACEHOLDER
    reason = kinds.get(cfg.kind).reference_only
    if reason:
        command = f"python -m blockdraft.serve draft={shlex.quote(str(draft_dir))} target={served} engine=reference"
        return DeployLine(command, (f"not servable by vLLM: {reason}; the reference engine decodes it "
                                    "(greedy output identical to the target's, batch size 1)",), vllm=False)
    spec = {"method": vllm_method(cfg.kind), "model": str(draft_dir), "num_speculative_tokens": cfg.num_speculative_tokens}
    env = f"{V2_RUNNER_ENV}=1 " if v2_runner_reason(cfg.kind, cfg.mixes_attention) else ""
    command = f"{env}vllm serve {served} --speculative-config {shlex.quote(json.dumps(spec))}"
    return DeployLine(command, _notes(cfg, mask_embedding), vllm=True)


def _notes(cfg: DraftModelConfig, mask_embedding: bool) -> Tuple[str, ...]:
    notes = [f"{drafted_tokens_note(cfg)}: vLLM does not check it against the trained block and accepts any "
             "other value without warning"]
    v2_reason = v2_runner_reason(cfg.kind, cfg.mixes_attention)
    if v2_reason:
        notes.append(
            f"{V2_RUNNER_ENV}=1: vLLM 0.32 serves this {cfg.kind} draft only on its V2 GPU model runner ({v2_reason}), "
            "which needs Triton (a GPU); the variable makes vLLM use it or refuse at start-up with the "
            "reason, and its log then says `Using V2 Model Runner`. A CPU vLLM cannot serve it: check it there "
            "with the reference engine (engine=reference)")
    causal = [i for i, (_, c) in enumerate(cfg.layer_attention()) if c]
    if causal and len(causal) < cfg.num_hidden_layers:
        notes.append(
            f"config.json leaves `is_causal` out, so that vLLM attends causally inside the block in layers {causal} "
            "(their layer_types slide) and bidirectionally in the others, as the draft trained; do not add it")
    if mask_embedding:
        notes.append(
            f"the draft directory carries {MASK_EMBEDDING_FILE}, the trained embedding of the mask slots: keep it "
            "beside config.json (copy the whole directory). vLLM reads it from there and logs `Loaded DFlash mask "
            f"embedding for mask_token_id {cfg.mask_token_id}`; without it vLLM embeds the mask slots with the "
            "target's row, silently")
    if cfg.draft_vocab_size:
        notes.append(
            f"a reduced vocabulary ({cfg.draft_vocab_size} of {cfg.vocab_size} tokens): the draft's own "
            "`lm_head.weight` and `d2t` are in its safetensors and `draft_vocab_size` in config.json; ship them "
            "together (vLLM does not notice a missing weight)")
    return tuple(notes)


def export_deploy_line(directory: str | Path, target: Optional[str] = None) -> DeployLine:
    """The line for an export directory, read from its config.json and files; `target`: null = the one
    the export recorded (blockdraft_export.json)."""
    directory = Path(directory).absolute()
    config = read_config(directory)
    cfg = draft_config_from_vllm_config(config, where=str(directory / CONFIG_NAME))
    line = deploy_line(cfg, directory, target or recorded_target(directory), with_mask_embedding(directory, cfg))
    alias = next((a for a in config.get("architectures") or [] if a in PLUGIN_ALIASES), None)
    if alias and line.vllm:
        note = (f"vLLM's registry has no `{alias}` (another stack's name for the same draft): install the "
                "project's vLLM plugin into the serving environment first (docs/serving.md), or re-export the draft")
        line = replace(line, notes=line.notes + (note,))
    return line


def recorded_target(directory: Path) -> Optional[str]:
    """The target the export was checked against (or trained on), as blockdraft_export.json records it."""
    return read_export_info(directory).get("target")
