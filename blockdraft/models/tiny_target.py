"""Tiny random targets of each supported family built from a config, for tests and the tiny_cpu recipe.

Nothing is downloaded: the weights are random (seeded) and the tokenizer is the
project's own byte-level tokenizer, so a target directory can be made anywhere offline.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


TINY_ARCHS = ("qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe", "qwen3_5_vl", "nemotron_h", "nemotron_h_moe", "qwen3_vl")


def tiny_config(arch: str = "qwen3", vocab_size: int = 272, num_layers: int = 6, hidden_size: int = 64):
    """A small config of one target family; every family keeps head_dim 32 (the smallest vLLM's
    CPU attention accepts) and a hybrid one alternates its recurrent and attention layers."""
    import transformers as T

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    dense = dict(intermediate_size=hidden_size * 2, num_hidden_layers=num_layers, **common)
    linear = dict(linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
    hybrid = [("linear_attention", "full_attention")[i % 2] for i in range(num_layers)]
    if arch == "qwen3":
        return T.Qwen3Config(architectures=["Qwen3ForCausalLM"], rope_theta=10000.0, **dense)
    if arch == "qwen3_moe":
        return T.Qwen3MoeConfig(
            architectures=["Qwen3MoeForCausalLM"], rope_theta=10000.0, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=hidden_size, decoder_sparse_step=1, **dense,
        )
    if arch == "qwen3_5":
        return T.Qwen3_5TextConfig(architectures=["Qwen3_5ForCausalLM"], layer_types=hybrid, **linear, **dense)
    if arch == "qwen3_5_moe":
        return T.Qwen3_5MoeTextConfig(
            architectures=["Qwen3_5MoeForCausalLM"], layer_types=hybrid, num_hidden_layers=num_layers,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden_size,
            shared_expert_intermediate_size=hidden_size, **linear, **common,
        )
    if arch in ("nemotron_h", "nemotron_h_moe"):
        # Mamba, attention and MLP blocks in turn (as Nemotron-Nano-9B-v2); the MoE variant has MoE blocks for MLPs.
        blocks = [("mamba", "attention", "moe" if arch == "nemotron_h_moe" else "mlp")[i % 3] for i in range(num_layers)]
        return T.NemotronHConfig(
            architectures=["NemotronHForCausalLM"], layers_block_type=blocks, intermediate_size=hidden_size * 2,
            mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1, chunk_size=16,
            n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden_size,
            moe_shared_expert_intermediate_size=hidden_size, n_group=1, topk_group=1,
            # At the default 0.02 a random NemotronH answers with chaotic text no short run can learn;
            # smaller weights let the residual stream lead, and it repeats itself as the others do.
            initializer_range=0.005, **common,
        )
    # Text-only mrope: all three sections see the same position, which is plain rotary.
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 4, 4], "mrope_interleaved": True}
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden_size,
                  patch_size=16, num_position_embeddings=64)
    if arch == "qwen3_5_vl":
        return T.Qwen3_5Config(
            architectures=["Qwen3_5ForConditionalGeneration"], vision_config=vision, tie_word_embeddings=False,
            text_config=dict(rope_parameters=rope, layer_types=hybrid, **linear, **dense),
        )
    if arch == "qwen3_vl":
        vision = dict(vision, deepstack_visual_indexes=[0])
        return T.Qwen3VLConfig(
            architectures=["Qwen3VLForConditionalGeneration"], text_config=dict(rope_parameters=rope, **dense),
            vision_config=vision, tie_word_embeddings=False,
        )
    raise ValueError(f"unknown tiny target arch {arch!r}; use one of {list(TINY_ARCHS)}")


def build_tiny_model(arch: str = "qwen3", seed: int = 0, **kwargs):
    import transformers

    torch.manual_seed(seed)
    config = tiny_config(arch, **kwargs)
    return getattr(transformers, config.architectures[0])._from_config(config).eval()


def _speak_printable_ascii(model, keep: set) -> None:
    """Zero the head rows of every token but printable ASCII (and `keep`).

    A random model's argmax then always lands on a printable character (some of ~95 random
    logits is > 0 = the zeroed ones), so its greedy text decodes and re-tokenises to the very
    ids it generated: data regenerated as text stays what the target actually said.
    """
    allowed = set(range(ord(" "), ord("~") + 1)) | keep
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        for token in range(head.shape[0]):
            if token not in allowed:
                head[token].zero_()


def save_tiny_target(path: str | os.PathLike, arch: str = "qwen3", seed: int = 0, **kwargs) -> Path:
    """Write a loadable HF directory (model + tokenizer with chat template). Idempotent."""
    from blockdraft.data.tiny_tokenizer import build_tiny_tokenizer

    path = Path(path)
    if (path / "config.json").exists():
        return path
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(arch, seed, vocab_size=len(tokenizer), **kwargs)
    _speak_printable_ascii(model, keep={tokenizer.eos_token_id})
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.pad_token_id = tokenizer.pad_token_id
        config.eos_token_id = tokenizer.eos_token_id
        config.bos_token_id = None
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, path)
    return path
