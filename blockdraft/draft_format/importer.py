"""Read a draft written for vLLM, by this project or another training stack.

Only two renames are applied, both known spellings of the same tensor: a leading
`model.` (some stacks save the wrapped module) and a `.weight` suffix on the selector
codebooks. Anything else must already carry vLLM's name, or it is refused by name:
a weight dropped here would be a weight silently missing in serving. The one exception is a
speculators checkpoint (speculators.py), whose copies of the verifier's embedding
and head, and whose t2d, are not the draft's and are dropped by name.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from safetensors.torch import load_file

from blockdraft import kinds
from blockdraft.draft_format.config_reader import draft_config_from_vllm_config
from blockdraft.draft_format.contract import ContractError, check_state_dict, expected_shapes
from blockdraft.draft_format.mask_embedding import STATE_NAME, check_mask_token, read_mask_embedding
from blockdraft.draft_format.speculators import draft_tensors as speculators_draft_tensors
from blockdraft.draft_format.speculators import is_speculators_config
from blockdraft.errors import ConfigError
from blockdraft.integrity import verify_checksums
from blockdraft.kinds.spec import KindSpec
from blockdraft.models import build_draft
from blockdraft.models.draft_config import DraftModelConfig
from blockdraft.models.io import DRAFT_CONFIG_NAME, as_fp32

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# How safetensors headers name dtypes, for the tensor of mask_embedding.pt.
SAFETENSORS_DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


def import_draft(directory: str | Path) -> Tuple[torch.nn.Module, DraftModelConfig]:
    """(fp32 draft module, its config) from `config.json` + safetensors (single or sharded)."""
    directory = Path(directory)
    try:
        config = read_config(directory)
        cfg = draft_config_from_vllm_config(config, where=str(directory / CONFIG_NAME))
        cfg.train_mask_embedding = with_mask_embedding(directory, cfg)
        state = canonical_names(read_tensors(directory))
        if is_speculators_config(config):
            state = speculators_draft_tensors(state, cfg)
        check_kind_consistency(state, cfg, directory)
        check_state_dict(state, cfg, where=f"{directory}")
        check_d2t(state, cfg, directory)
    except (ConfigError, ContractError):
        raise  # these name the key or tensor at fault: more use than "the file changed"
    except Exception:
        verify_checksums(directory)  # a file that cannot be read: name it when the checksums can
        raise
    verify_checksums(directory)  # an export records them; a flipped bit passes every check above
    draft = build_draft(cfg)
    draft.load_state_dict(as_fp32(state), strict=True)
    return draft, cfg


def read_config(directory: Path) -> dict:
    path = directory / CONFIG_NAME
    if not path.is_file():
        hint = (
            f" It holds {DRAFT_CONFIG_NAME}: that is a training checkpoint; export it with "
            f"`python -m blockdraft.export checkpoint={directory} out=<dir>`."
            if (directory / DRAFT_CONFIG_NAME).is_file()
            else " Point at a directory with a draft's config.json and safetensors weights."
        )
        raise ConfigError(f"{path} does not exist.{hint}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON ({err}); rewrite or re-export it.") from err


def weight_files(directory: Path) -> List[Path]:
    """The safetensors files of a directory: the shards its index names, or model.safetensors."""
    index = directory / INDEX_NAME
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        outside = [s for s in shards if not _inside(directory, s)]
        if outside:
            raise ConfigError(f"{index} names weight files outside {directory}: {outside}; a draft's shards are files "
                              "of its own directory: re-export the draft.")
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing or not shards:
            raise ConfigError(
                f"{index} names shards that are not there: {missing or 'none at all'}; "
                "copy the missing files or re-export the draft."
            )
        return [directory / s for s in shards]
    if (directory / WEIGHTS_NAME).is_file():
        return [directory / WEIGHTS_NAME]
    found = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    raise ConfigError(
        f"{directory} has neither {WEIGHTS_NAME} nor {INDEX_NAME} (it holds {found}); "
        "export the draft's weights as safetensors under one of those names."
    )


def _inside(directory: Path, name) -> bool:
    """A shard name the index may give: a relative path that stays within the draft's directory."""
    if not isinstance(name, str) or not name or Path(name).is_absolute():
        return False
    root = directory.resolve()
    return (root / name).resolve().is_relative_to(root)


def with_mask_embedding(directory: Path, cfg: DraftModelConfig) -> bool:
    """Whether the directory carries a trained mask embedding (checked against the config's mask id)."""
    found = read_mask_embedding(directory)
    if found is None:
        return False
    check_mask_token(directory, found[0], cfg.mask_token_id)
    return True


def read_tensors(directory: Path) -> Dict[str, torch.Tensor]:
    """Every tensor of the draft directory: its safetensors, and mask_embedding.pt if there."""
    found = read_mask_embedding(directory)
    state: Dict[str, torch.Tensor] = {STATE_NAME: found[1]} if found is not None else {}
    for path in weight_files(directory):
        shard = load_file(str(path))
        twice = sorted(set(shard) & set(state))
        if twice:
            raise ContractError(f"{path.name} repeats tensors already read from another shard: {twice}; re-export the draft.")
        state.update(shard)
    return state


def tensor_headers(directory: Path) -> Dict[str, Tuple[tuple, str]]:
    """{name: (shape, dtype)} as stored, names untouched, read from the headers without loading."""
    from safetensors import safe_open

    out: Dict[str, Tuple[tuple, str]] = {}
    found = read_mask_embedding(directory)
    if found is not None:
        out[STATE_NAME] = (tuple(found[1].shape), SAFETENSORS_DTYPE_NAMES.get(found[1].dtype, str(found[1].dtype)))
    for path in weight_files(directory):
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():
                piece = fh.get_slice(name)
                out[name] = (tuple(piece.get_shape()), piece.get_dtype())
    return out


def canonical_name(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model."):]
    for codebook in CODEBOOKS:
        if name == codebook + ".weight":
            return codebook
    return name


def canonical_names(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    out: Dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        new = canonical_name(name)
        if new in out:
            raise ContractError(f"two tensors are both {new!r} once `model.` / `.weight` are dropped (one is {name!r}); keep only one.")
        out[new] = tensor
    return out


def check_kind_consistency(state: Dict[str, torch.Tensor], cfg: DraftModelConfig, directory: Path) -> None:
    """Tensors only another kind holds (KindSpec.weight_shapes) are refused under this kind's config: loading
    them as this kind would silently drop them. So are this kind's own tensors where the file lacks them: vLLM
    would serve uninitialised memory in their place."""
    where = directory / CONFIG_NAME
    spec = kinds.get(cfg.kind)
    own = {_any_layer(name) for name in expected_shapes(cfg)}
    other, theirs = _likeliest_owner([name for name in sorted(state) if _any_layer(name) not in own], cfg)
    if other is not None:
        text = _stray_weights_refusal(spec, other, _as_kind(cfg, other), _some(theirs))
        raise ContractError(f"{where} {text}")
    missing = sorted(name for name in spec.weight_shapes(cfg) if name not in state)
    if missing:
        served = " vLLM would serve uninitialised memory in their place." if spec.vllm_method else ""
        raise ContractError(
            f"{where} declares a {spec.title} draft, but the weights lack its {spec.weights_label} tensors: "
            f"{_some(missing)}.{served} Export the {spec.title} checkpoint these weights came from, or set "
            "architectures to the draft's real kind."
        )


def _any_layer(name: str) -> str:
    """The name with its layer indices blanked: a tensor of another layer count is still the same kind's."""
    return re.sub(r"\.\d+\.", ".#.", name)


def _likeliest_owner(foreign: List[str], cfg: DraftModelConfig) -> Tuple[Optional[KindSpec], List[str]]:
    """The other kind naming the most of `foreign` (the first registered on a tie), and the ones it names."""
    best: Tuple[Optional[KindSpec], List[str]] = (None, [])
    if not foreign:
        return best
    for other in kinds.all_kinds():
        if other.name == cfg.kind:
            continue
        names = {_any_layer(name) for name in other.weight_shapes(_as_kind(cfg, other))}
        theirs = [name for name in foreign if _any_layer(name) in names]
        if len(theirs) > len(best[1]):
            best = (other, theirs)
    return best


def _as_kind(cfg: DraftModelConfig, spec: KindSpec) -> DraftModelConfig:
    """This draft's shape as a draft of kind `spec` with that kind's default settings: which tensors it would
    hold, whatever this kind's values of keys they share (LiLiCorr's conv_kernel_size is DFlash2's)."""
    other = copy.copy(cfg)
    other.kind = spec.name
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)
                if f.name in spec.settings and f.default is not dataclasses.MISSING}
    for key, value in spec.resolve_settings(defaults, cfg.hidden_size).items():  # nulls filled as training fills them
        setattr(other, key, value)
    return other


def _stray_weights_refusal(declared: KindSpec, other: KindSpec, other_cfg: DraftModelConfig, listed: str) -> str:
    dflash, top = other.export_keys(other_cfg)
    keys = ([f"dflash_config.{_and(list(dflash))}"] if dflash else []) + ([f"the top-level {_and(list(top))}"] if top else [])
    return (
        f"declares a {declared.title} draft, but the weights carry {other.title} {other.weights_label} tensors: "
        f"{listed}. Loading it as {declared.title} would silently drop them. If it is a {other.title} draft, "
        f"set architectures to {json.dumps([other.architecture])}" + (f" and add {' and '.join(keys)}." if keys else ".")
    )


def _and(names: List[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def check_d2t(state: Dict[str, torch.Tensor], cfg: DraftModelConfig, directory: Path) -> None:
    """A reduced vocabulary's d2t must name distinct target ids inside the vocabulary, or vLLM
    scatters draft logits onto the wrong (or the same) tokens."""
    if not cfg.draft_vocab_size:
        return
    d2t = state["d2t"]
    if d2t.is_floating_point():
        raise ContractError(f"{directory}: d2t is {d2t.dtype}; vLLM reads it as int64 offsets. Re-export the draft.")
    ids = torch.arange(len(d2t)) + d2t.long()
    if ids.min() < 0 or ids.max() >= cfg.vocab_size or len(ids.unique()) != len(ids):
        raise ContractError(
            f"{directory}: d2t does not map the {len(d2t)} draft ids to distinct target ids in [0, {cfg.vocab_size}) "
            "(d2t[i] is an offset: target id = i + d2t[i]). Re-export the draft from its checkpoint."
        )


def _some(names: List[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
