"""DSpark's own settings checked, against what vLLM 0.32's Qwen3 DSpark drafter serves."""

from __future__ import annotations

from blockdraft.errors import ConfigError

# vLLM 0.32 implements only the first-order Markov head for Qwen3 DSpark drafts (qwen3_dspark.py).
MARKOV_HEAD_TYPES = ("vanilla",)


def check(cfg) -> None:
    if cfg.markov_rank < 1:
        raise ConfigError(
            f"draft.markov_rank={cfg.markov_rank}: vLLM's DSpark always builds its Markov head, so set it >= 1 "
            "(256 is speculators' default); for a draft without one, train draft=dflash."
        )
    if cfg.markov_head_type not in MARKOV_HEAD_TYPES:
        raise ConfigError(
            f"draft.markov_head_type={cfg.markov_head_type!r}: vLLM 0.32's Qwen3 DSpark drafter implements only "
            f"{list(MARKOV_HEAD_TYPES)} (qwen3_dspark.py DSparkMarkovHead); its loader would refuse the extra "
            "weights of a gated or rnn head. Set draft.markov_head_type=vanilla."
        )
    if cfg.train_mask_embedding:
        raise ConfigError(
            "draft.train_mask_embedding=true with draft.kind=dspark: vLLM's DSpark drafter embeds the MASK slots "
            "with the target's row for the mask token and ignores a mask embedding (qwen3_dspark.py load_weights "
            "drops it). Set draft.train_mask_embedding=false."
        )
    vocab = cfg.draft_vocab_size or cfg.vocab_size
    if cfg.dspark_draft_topk is not None and not 1 <= cfg.dspark_draft_topk <= vocab:
        raise ConfigError(
            f"draft.dspark_draft_topk={cfg.dspark_draft_topk} must be in [1, {vocab}] (the draft's vocabulary), "
            "or null to apply the Markov head to every token, as vLLM checks (config/speculative.py)."
        )
