"""The fully resolved shape of a draft: what a model is built from and what export writes.

Every field is concrete (no "same as target" placeholders); `blockdraft.models.resolve`
turns a user's draft settings plus a target's HF config into one of these.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from blockdraft.errors import ConfigError

DRAFT_KINDS = ("dflash", "dflash2", "jetspec", "domino", "dspark", "lilicorr")
# transformers' and vLLM's names for a layer's attention (`layer_types`).
SLIDING = "sliding_attention"
LAYER_TYPES = ("full_attention", SLIDING)
# vLLM 0.32 implements only the first-order Markov head for Qwen3 DSpark drafts (qwen3_dspark.py).
MARKOV_HEAD_TYPES = ("vanilla",)
# The settings that shape a DSpark draft beyond its DFlash backbone (its weights and its block layout).
DSPARK_HEAD_KEYS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov",
                    "sample_from_anchor")
# LiLiCorr's head settings: vLLM's dflash_config keys of the same names (lilicorr_enabled aside).
LILICORR_KEYS = ("lilicorr_hidden_size", "lilicorr_candidate_topk", "lilicorr_num_heads", "lilicorr_mlp_ratio",
                 "lilicorr_factor_dim", "lilicorr_vector_eps", "lilicorr_logit_scale", "lilicorr_num_layers")


@dataclass
class DraftModelConfig:
    kind: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_hidden_size: int
    num_target_layers: int
    target_layer_ids: List[int]
    mask_token_id: int
    block_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    hidden_act: str = "silu"
    sliding_window: Optional[int] = None
    layer_types: Optional[List[str]] = None
    """Per draft layer, "full_attention" or "sliding_attention" as transformers and vLLM read `layer_types`
    (null: every layer sliding when sliding_window is set, else every layer full)."""
    sliding_causal: bool = False
    """The sliding-window layers attend causally inside the block while full layers stay bidirectional:
    speculators' trainer default for DFlash and DSpark (`sliding_window_non_causal: false`), which vLLM 0.32
    reproduces from `layer_types` when neither `is_causal` nor `dflash_config.causal` is set."""
    draft_vocab_size: Optional[int] = None
    """DFlash: the draft's own reduced vocabulary (null = the target's full head)."""
    train_mask_embedding: bool = False
    """The MASK slots' embedding is a trained parameter (exported as mask_embedding.pt)."""
    # DFlash2 only.
    conv_kernel_size: int = 2
    conv_group_size: int = 1
    selector_rank: int = 64
    selector_top_k: int = 8
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: Optional[float] = None
    # Domino only: the GRU state's width and the rank of the logit correction (models/domino.py).
    correction_hidden_size: int = 1024
    correction_rank: int = 256
    # DSpark only (models/dspark.py): the Markov head's rank and type, the confidence head, the block layout.
    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    sample_from_anchor: bool = True
    dspark_draft_topk: Optional[int] = None
    # LiLiCorr only (models/lilicorr.py): vLLM's `lilicorr_*` dflash_config keys of its candidate-lattice head.
    # conv_kernel_size / conv_group_size above are its optional in-block convolution (both 0 = none).
    lilicorr_hidden_size: Optional[int] = None
    """LiLiCorr: width of the lattice transformer; null = the draft's hidden_size."""
    lilicorr_candidate_topk: int = 8
    """LiLiCorr: candidates per drafted slot (a power of two <= 16, as vLLM requires)."""
    lilicorr_num_heads: int = 4
    """LiLiCorr: attention heads of the lattice transformer; must divide its width."""
    lilicorr_mlp_ratio: float = 2.0
    """LiLiCorr: the lattice MLP's width over the lattice width."""
    lilicorr_factor_dim: int = 64
    """LiLiCorr: width of the normalized outgoing/incoming vectors whose dot products score transitions."""
    lilicorr_vector_eps: float = 1e-6
    """LiLiCorr: the epsilon of those vectors' normalization."""
    lilicorr_logit_scale: float = 10.0
    """LiLiCorr: the scale turning the vectors' cosine (in [-1, 1]) into selector logits."""
    lilicorr_num_layers: int = 2
    """LiLiCorr: layers of the lattice transformer."""
    # Token ids the mask token must never alias (pad/eos/bos); checked, not serialised.
    forbidden_mask_ids: List[int] = field(default_factory=list)

    def validate(self) -> "DraftModelConfig":
        check_kind(self.kind)
        check_layer_ids(self.target_layer_ids, self.num_target_layers)
        check_mask_token(self.mask_token_id, self.vocab_size, self.forbidden_mask_ids)
        if self.block_size < 2:
            raise ConfigError(
                f"draft.block_size={self.block_size}: a block needs the anchor and at least one "
                "drafted slot. Set draft.block_size >= 2 (16 is the usual choice)."
            )
        if self.num_hidden_layers < 1:
            raise ConfigError(f"draft.num_layers={self.num_hidden_layers}: set draft.num_layers >= 1.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"draft.num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"draft.num_key_value_heads={self.num_key_value_heads}; pick heads divisible by kv heads."
            )
        self._validate_layer_types()
        if self.kind == "dflash2":
            self._validate_dflash2()
        if self.kind == "domino":
            self._validate_domino()
        if self.kind == "dspark":
            self._validate_dspark()
        if self.kind == "lilicorr":
            self._validate_lilicorr()
        if self.draft_vocab_size is not None:
            self._validate_draft_vocab()
        return self

    def _validate_draft_vocab(self) -> None:
        n = self.draft_vocab_size
        if self.kind == "lilicorr":
            raise ConfigError(
                f"draft.draft_vocab_size={n} with draft.kind=lilicorr: vLLM's LiLiCorr scores candidates from the "
                "target's full head and embedding; keep the full vocabulary (draft_vocab_size=null) or train dflash."
            )
        if self.kind == "dflash2":
            raise ConfigError(
                f"draft.draft_vocab_size={n} with draft.kind={self.kind}: vLLM's DFlash2 takes its candidate "
                "top-k from the target's full head; keep the full vocabulary (draft_vocab_size=null) or train dflash."
            )
        if not 1 <= n < self.vocab_size:
            raise ConfigError(
                f"draft.draft_vocab_size={n} must be in [1, {self.vocab_size}) (the target's vocabulary); "
                "use null for the full vocabulary."
            )

    def _validate_layer_types(self) -> None:
        types = self.layer_types
        if types is None:
            return
        bad = sorted({t for t in types if t not in LAYER_TYPES})
        if len(types) != self.num_hidden_layers or bad:
            raise ConfigError(
                f"draft.layer_types={list(types)}: give one of {list(LAYER_TYPES)} per draft layer "
                f"({self.num_hidden_layers} layers), or null for the same attention in every layer."
            )
        if SLIDING in types and self.sliding_window is None:
            raise ConfigError(
                f"draft.layer_types has sliding layers {[i for i, t in enumerate(types) if t == SLIDING]} but "
                "draft.sliding_window is null; set the window (speculators' default is 2048)."
            )

    def _validate_dflash2(self) -> None:
        self._validate_dflash2_conv()
        if not 1 <= self.selector_top_k <= self.vocab_size:
            raise ConfigError(
                f"draft.selector_top_k={self.selector_top_k} is outside [1, vocab_size={self.vocab_size}]; "
                "set a k no larger than the vocabulary (8 is usual)."
            )
        if self.selector_rank < 1:
            raise ConfigError(f"draft.selector_rank={self.selector_rank}: set it >= 1 (64 is usual).")

    def _validate_dflash2_conv(self) -> None:
        if self.hidden_size % self.conv_group_size:
            raise ConfigError(
                f"draft.conv_group_size={self.conv_group_size} does not divide hidden_size="
                f"{self.hidden_size}; choose a divisor of {self.hidden_size}."
            )
        if self.conv_kernel_size < 1:
            raise ConfigError(f"draft.conv_kernel_size={self.conv_kernel_size}: set it >= 1 (2 is usual).")

    def _validate_domino(self) -> None:
        if self.draft_vocab_size is not None:
            raise ConfigError(
                f"draft.draft_vocab_size={self.draft_vocab_size} with draft.kind=domino: the Domino correction "
                "spans the target's full vocabulary; keep draft_vocab_size=null, or train dflash for a reduced head."
            )
        for key in ("correction_hidden_size", "correction_rank"):
            if getattr(self, key) < 1:
                raise ConfigError(f"draft.{key}={getattr(self, key)}: set it >= 1 (1024 and 256 are the published sizes).")

    def _validate_dspark(self) -> None:
        if self.markov_rank < 1:
            raise ConfigError(
                f"draft.markov_rank={self.markov_rank}: vLLM's DSpark always builds its Markov head, so set it >= 1 "
                "(256 is speculators' default); for a draft without one, train draft=dflash."
            )
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ConfigError(
                f"draft.markov_head_type={self.markov_head_type!r}: vLLM 0.32's Qwen3 DSpark drafter implements only "
                f"{list(MARKOV_HEAD_TYPES)} (qwen3_dspark.py DSparkMarkovHead); its loader would refuse the extra "
                "weights of a gated or rnn head. Set draft.markov_head_type=vanilla."
            )
        if self.train_mask_embedding:
            raise ConfigError(
                "draft.train_mask_embedding=true with draft.kind=dspark: vLLM's DSpark drafter embeds the MASK slots "
                "with the target's row for the mask token and ignores a mask embedding (qwen3_dspark.py load_weights "
                "drops it). Set draft.train_mask_embedding=false."
            )
        vocab = self.draft_vocab_size or self.vocab_size
        if self.dspark_draft_topk is not None and not 1 <= self.dspark_draft_topk <= vocab:
            raise ConfigError(
                f"draft.dspark_draft_topk={self.dspark_draft_topk} must be in [1, {vocab}] (the draft's vocabulary), "
                "or null to apply the Markov head to every token, as vLLM checks (config/speculative.py)."
            )

    def _validate_lilicorr(self) -> None:
        taps, groups = self.conv_kernel_size, self.conv_group_size
        if taps < 0 or groups < 0 or bool(taps) != bool(groups):
            raise ConfigError(
                f"draft.conv_kernel_size={taps} with draft.conv_group_size={groups}: vLLM's LiLiCorr needs both "
                "(the DFlash2 convolution) or neither (plain DFlash layers); set both > 0, or both to 0."
            )
        if taps:
            self._validate_dflash2_conv()
        k = self.lilicorr_candidate_topk
        if not (1 <= k <= 16 and k & (k - 1) == 0) or k > self.vocab_size:
            raise ConfigError(
                f"draft.lilicorr_candidate_topk={k}: vLLM's LiLiCorr takes a power of two <= 16 (and within the "
                f"vocabulary of {self.vocab_size}); set 1, 2, 4, 8 or 16."
            )
        # num_speculative_tokens < block_size holds for what training writes: this layout drafts block_size - 1
        # slots (drafted_per_round). A larger count asked of serve is refused there, as vLLM would refuse it
        # (serve/preflight.py, check_drafted_tokens; the pipeline checks its serve key before any stage).
        width, heads = self.lilicorr_width, self.lilicorr_num_heads
        if heads < 1 or width % heads:
            raise ConfigError(
                f"draft.lilicorr_num_heads={heads} does not divide the lattice width {width} "
                "(draft.lilicorr_hidden_size, or hidden_size when null); pick a divisor of it."
            )
        for key in ("lilicorr_factor_dim", "lilicorr_num_layers"):
            if getattr(self, key) < 1:
                raise ConfigError(f"draft.{key}={getattr(self, key)}: set it >= 1 (64 and 2 are the defaults).")
        if int(width * self.lilicorr_mlp_ratio) < 1:
            raise ConfigError(f"draft.lilicorr_mlp_ratio={self.lilicorr_mlp_ratio}: set it > 0 (2.0 is the default).")

    @property
    def lilicorr_width(self) -> int:
        """The lattice transformer's width: vLLM reads `lilicorr_hidden_size or hidden_size`."""
        return self.lilicorr_hidden_size or self.hidden_size

    @property
    def num_speculative_tokens(self) -> int:
        return drafted_per_round(self.kind, self.block_size, self.sample_from_anchor)

    @property
    def anchor_predicts(self) -> bool:
        return anchor_predicts(self.kind, self.sample_from_anchor)

    @property
    def is_causal(self) -> bool:
        """JetSpec: slot k attends to the context and slots 0..k of its block (DFlash sees the whole block)."""
        return self.kind == "jetspec"

    def is_sliding(self, layer: int) -> bool:
        if self.layer_types is None:
            return self.sliding_window is not None
        return self.layer_types[layer] == SLIDING

    @property
    def mixes_attention(self) -> bool:
        """Sliding and full layers in one draft: vLLM 0.32 serves it on its V2 model runner only."""
        return len({self.is_sliding(i) for i in range(self.num_hidden_layers)}) > 1

    def layer_attention(self) -> List[Tuple[Optional[int], bool]]:
        """Per draft layer: (its window, or None for full attention; whether it is causal inside the block)."""
        out = []
        for i in range(self.num_hidden_layers):
            sliding = self.is_sliding(i)
            out.append((self.sliding_window if sliding else None, self.is_causal or (self.sliding_causal and sliding)))
        return out

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DraftModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def check_kind(kind: str) -> None:
    if kind not in DRAFT_KINDS:
        raise ConfigError(f"draft.kind={kind!r} is unknown; use one of {list(DRAFT_KINDS)}.")


def check_layer_ids(ids, num_target_layers: int) -> None:
    """target_layer_ids must be non-empty, sorted, unique, in [0, L-2].

    L-1 is excluded because HF's last hidden state is taken after the final norm,
    and vLLM captures aux layer i+1 as the residual entering that layer.
    """
    key = "draft.target_layer_ids"
    ids = list(ids) if ids is not None else []
    if not ids:
        raise ConfigError(f"{key} is empty; give at least one target layer, e.g. {default_layer_ids(num_target_layers, 1)}.")
    if len(set(ids)) != len(ids):
        raise ConfigError(
            f"{key}={ids} has duplicates (the default spread collapses on small targets); "
            f"give distinct layers, or fewer draft layers, for a {num_target_layers}-layer target."
        )
    if ids != sorted(ids):
        raise ConfigError(f"{key}={ids} is not sorted; use {sorted(ids)}.")
    hi = num_target_layers - 2
    bad = [i for i in ids if not 0 <= i <= hi]
    if bad:
        raise ConfigError(
            f"{key}={ids} has {bad} outside [0, {hi}] for a target with {num_target_layers} layers "
            "(the last layer is excluded); pick layers within that range."
        )


def check_mask_token(mask_token_id, vocab_size: int, forbidden: List[int]) -> None:
    key = "draft.mask_token_id"
    if mask_token_id is None:
        raise ConfigError(
            f"{key} is not set and has no default: pick a reserved, rarely used token of the target "
            "(`python -m blockdraft.models.suggest target=<dir>` lists candidates)."
        )
    if not 0 <= int(mask_token_id) < vocab_size:
        raise ConfigError(f"{key}={mask_token_id} is outside the target vocabulary [0, {vocab_size}); pick a reserved token id inside it.")
    if int(mask_token_id) in set(forbidden):
        raise ConfigError(
            f"{key}={mask_token_id} is the target's pad/eos/bos token; the mask would alias it and "
            "quietly erode acceptance. Pick another reserved token."
        )


def default_layer_ids(num_target_layers: int, n: int) -> List[int]:
    """The usual spread round(1 + i*(L-4)/(n-1)); may collapse on small targets (callers check)."""
    if n == 1:
        return [max(0, min(1, num_target_layers - 2))]
    return [round(1 + i * (num_target_layers - 4) / (n - 1)) for i in range(n)]


def anchor_predicts(kind: str, sample_from_anchor: bool) -> bool:
    """Slot q's output predicts the token after it (DSpark's sample_from_anchor layout), not its own."""
    return kind == "dspark" and bool(sample_from_anchor)


def drafted_per_round(kind: str, block_size: int, sample_from_anchor: bool = True) -> int:
    """The tokens one round drafts. DSpark with sample_from_anchor predicts from every slot, anchor
    included (vLLM's DSpark speculator: N query slots, N drafts); every other layout drafts from the
    MASK slots only (1 + N query slots)."""
    return int(block_size) if anchor_predicts(kind, sample_from_anchor) else int(block_size) - 1
