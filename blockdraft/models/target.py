"""The frozen target: loads a Hugging Face model of a known family and captures decoder-layer outputs.

`target_layer_ids = [i, ...]` means the output of 0-indexed decoder layer i, which is
HF `hidden_states[i + 1]` and what vLLM captures as aux layer i + 1 (the residual entering
layer i + 1); `target_families` says where each family keeps its layers. Capture uses
forward hooks, so only the requested layers are kept, and feature-only passes stop after
the last layer needed.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from blockdraft.errors import ConfigError
from blockdraft.models.target_families import TargetFamily, backbone_of, family_of


class _StopForward(Exception):
    """Raised by the last needed hook to skip the target's remaining layers."""


def causal_lm_class(path: str):
    """(the transformers class the target's config names, its config), the architecture checked before any
    weight is read. A multimodal `*ForConditionalGeneration` target keeps its own layout (its language model
    is what the draft reads)."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    architectures = getattr(config, "architectures", None)
    family_of(architectures)
    model_class = getattr(transformers, architectures[0], None)
    if model_class is None:
        raise ConfigError(
            f"target.path={path}: the installed transformers {transformers.__version__} has no "
            f"{architectures[0]}; install a release that pyproject.toml allows (`make setup`)."
        )
    return model_class, config


def load_causal_lm(path: str, dtype=torch.float32, device="cpu") -> nn.Module:
    """The whole HF model of a local directory on `device`."""
    model_class, _ = causal_lm_class(path)
    return model_class.from_pretrained(path, dtype=dtype).to(device)


class TargetModel:
    """A frozen causal LM with feature capture at `layer_ids`.

    Shard the model (FSDP) before wrapping it: the capture hooks must run after FSDP's own
    post-forward hooks, which reshard a layer before an early stop leaves it.
    """

    def __init__(self, model: nn.Module, layer_ids: Sequence[int]):
        self.family: TargetFamily = family_of(getattr(model.config, "architectures", None) or [type(model).__name__])
        self.model = model.eval().requires_grad_(False)
        self.backbone = backbone_of(model, self.family)
        self.layer_ids = list(layer_ids)
        self._captured: Dict[int, torch.Tensor] = {}
        self._stop_after: Optional[int] = None
        for i in self.layer_ids:
            if not 0 <= i < self.num_layers:
                raise ConfigError(
                    f"draft.target_layer_ids has {i}, but the target has {self.num_layers} layers; "
                    f"use ids in [0, {self.num_layers - 2}]."
                )
            self.decoder_layers[i].register_forward_hook(self._make_hook(i))

    @classmethod
    def load(cls, path: str, layer_ids: Sequence[int], dtype=torch.float32, device="cpu") -> "TargetModel":
        return cls(load_causal_lm(path, dtype, device), layer_ids)

    # --- what the draft borrows -----------------------------------------------------
    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.backbone.layers

    @property
    def num_layers(self) -> int:
        return len(self.decoder_layers)

    @property
    def hidden_size(self) -> int:
        return self.model.config.get_text_config().hidden_size

    @property
    def vocab_size(self) -> int:
        return self.embed_tokens.weight.shape[0]

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    # --- capture --------------------------------------------------------------------
    def _make_hook(self, layer_idx: int):
        def hook(_module, _inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self._captured[layer_idx] = hidden
            if self._stop_after == layer_idx:
                raise _StopForward

        return hook

    @contextmanager
    def _capturing(self, stop_early: bool):
        self._captured = {}
        self._stop_after = max(self.layer_ids) if stop_early else None
        try:
            yield
        finally:
            self._stop_after = None

    def _features(self) -> torch.Tensor:
        return torch.cat([self._captured[i] for i in self.layer_ids], dim=-1)  # [N, T, n*H]

    @torch.no_grad()
    def capture_with_final(self, input_ids, attention_mask=None) -> tuple:
        """(features [N, T, n*H], final hidden states [N, T, H] after the final norm): every layer
        runs, the head does not (the caller projects only the positions it needs)."""
        with self._capturing(stop_early=False):
            out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            return self._features(), out.last_hidden_state

    @torch.no_grad()
    def capture(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Features only: [N, T, n*H]; layers after the last needed one are not run."""
        with self._capturing(stop_early=True):
            try:
                self.model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    use_cache=False,
                )
            except _StopForward:
                pass
            return self._features()

    @torch.no_grad()
    def forward(self, input_ids, past_key_values=None, position_ids=None, attention_mask=None):
        """Full pass (logits for verification) that also returns the features: (logits, features)."""
        kwargs = {}
        if past_key_values is not None:
            kwargs[self._cache_argument()] = past_key_values
        with self._capturing(stop_early=False):
            out = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=attention_mask,
                use_cache=past_key_values is not None,
                **kwargs,
            )
            return out.logits, self._features()

    def _cache_argument(self) -> str:
        # Newer transformers renamed `past_key_values` to `cache`; accept both releases.
        import inspect

        return "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    def special_token_ids(self, tokenizer=None) -> List[int]:
        return special_token_ids(self.model.config, getattr(self.model, "generation_config", None), tokenizer)


def special_token_ids(*sources) -> List[int]:
    """pad/eos/bos ids named by any of the sources (configs, tokenizer): never valid mask tokens."""
    ids = set()
    for src in sources:
        for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
            value = getattr(src, name, None) if src is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(v for v in value if isinstance(v, int))
    return sorted(ids)
