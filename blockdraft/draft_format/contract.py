"""The weight names and shapes vLLM's DFlash-family loaders accept, derived from the config: the DFlash
backbone here, each kind's own tensors from its folder (KindSpec.weight_shapes).

Written from the contract (docs/vllm-dflash-contract.md), not from the draft modules,
so checking a module's state_dict against it actually checks the module. vLLM does not
notice a missing weight (it stays uninitialised memory), so completeness is checked here.
"""

from __future__ import annotations

from typing import Dict, Mapping

from blockdraft import kinds
from blockdraft.kinds.spec import Shape
from blockdraft.models.draft_config import DraftModelConfig

# A config describing another draft altogether mismatches every tensor; the first lines say enough.
MAX_LISTED = 40


class ContractError(ValueError):
    """Weights that vLLM would reject, or silently leave uninitialised."""


def expected_shapes(cfg: DraftModelConfig) -> Dict[str, Shape]:
    h = cfg.hidden_size
    shapes: Dict[str, Shape] = {
        "fc.weight": (h, len(cfg.target_layer_ids) * cfg.target_hidden_size),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(cfg.num_hidden_layers):
        shapes.update(_layer_shapes(cfg, f"layers.{i}."))
    shapes.update(kinds.get(cfg.kind).weight_shapes(cfg))
    if cfg.train_mask_embedding:
        # In a checkpoint a tensor like any other; an export keeps it in mask_embedding.pt.
        shapes["mask_embedding"] = (h,)
    if cfg.draft_vocab_size:
        # vLLM's loader keeps `lm_head` unprefixed and renames `d2t` to draft_id_to_target_id.
        shapes["lm_head.weight"] = (cfg.draft_vocab_size, h)
        shapes["d2t"] = (cfg.draft_vocab_size,)
    return shapes


def _layer_shapes(cfg: DraftModelConfig, p: str) -> Dict[str, Shape]:
    h, hd, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    return {
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q, h),
        p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h),
        p + "self_attn.o_proj.weight": (h, q),
        p + "self_attn.q_norm.weight": (hd,),
        p + "self_attn.k_norm.weight": (hd,),
        p + "mlp.gate_proj.weight": (i, h),
        p + "mlp.up_proj.weight": (i, h),
        p + "mlp.down_proj.weight": (h, i),
    }


def contract_problems(state: Mapping, cfg: DraftModelConfig) -> list[str]:
    """One line per missing, unexpected or mis-shaped name; `state` maps names to tensors or shapes."""
    expected = expected_shapes(cfg)
    got = {k: tuple(getattr(v, "shape", v)) for k, v in state.items()}
    problems = [f"missing {k} {list(s)}" for k, s in sorted(expected.items()) if k not in got]
    problems += [f"unexpected {k} {list(s)}" for k, s in sorted(got.items()) if k not in expected]
    problems += [
        f"mis-shaped {k}: {list(got[k])}, expected {list(s)}"
        for k, s in sorted(expected.items())
        if k in got and got[k] != s
    ]
    return problems


def check_state_dict(state: Mapping, cfg: DraftModelConfig, where: str = "state_dict") -> None:
    problems = contract_problems(state, cfg)
    if problems:
        shown = problems[:MAX_LISTED] + ([f"... and {len(problems) - MAX_LISTED} more"] if len(problems) > MAX_LISTED else [])
        raise ContractError(
            f"{where} does not match the vLLM {cfg.kind} contract for its config "
            f"({len(problems)} problem(s)):\n  " + "\n  ".join(shown)
            + "\nThe weights and config.json describe different drafts; export from the checkpoint "
            "the weights came from, or fix the config keys named above."
        )
