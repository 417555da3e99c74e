"""A reduced draft vocabulary: which tokens, how the head maps back, and how the loss treats the rest."""

import pytest
import torch

from blockdraft.errors import ConfigError
from blockdraft.models import build_draft
from blockdraft.models.draft_config import DraftModelConfig
from blockdraft.train.draft_vocab import coverage, select_draft_vocab
from blockdraft.train.setup import check_draft_vocab

V, H = 50, 64


def _cfg(**kw) -> DraftModelConfig:
    base = dict(kind="dflash", hidden_size=H, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, vocab_size=V, target_hidden_size=H, num_target_layers=6,
                target_layer_ids=[1, 3], mask_token_id=7, block_size=4, draft_vocab_size=8)
    return DraftModelConfig(**{**base, **kw}).validate()


def test_the_most_frequent_tokens_are_chosen_with_the_required_ones():
    counts = torch.zeros(V, dtype=torch.long)
    counts[[3, 9, 11, 20, 40]] = torch.tensor([5, 50, 50, 7, 1])
    ids = select_draft_vocab(counts, 4, required=torch.tensor([45]))
    # 45 is required though never counted; 9 and 11 tie (lower id first); 20 beats 3 and 40.
    assert ids.tolist() == [9, 11, 20, 45]
    assert coverage(counts, ids) == pytest.approx(107 / 113)


def test_a_size_that_cannot_hold_the_required_tokens_is_refused():
    with pytest.raises(ConfigError, match="cannot hold the 3 tokens"):
        select_draft_vocab(torch.ones(V, dtype=torch.long), 2, required=torch.tensor([1, 2, 3]))


def test_reduced_head_maps_draft_ids_to_target_ids_as_vllm_does():
    draft = build_draft(_cfg())
    target_head = torch.randn(V, H)
    ids = torch.tensor([0, 4, 5, 9, 17, 30, 31, 49])
    draft.set_draft_vocab(ids, target_head)
    # d2t is an offset: target id = draft id + d2t[draft id].
    assert torch.equal(torch.arange(8) + draft.d2t, ids)
    assert torch.equal(draft.lm_head.weight, target_head[ids])
    hidden = torch.randn(3, H)
    own = draft.draft_logits(hidden, target_head)  # [3, 8]
    full = draft.logits(hidden, target_head)  # [3, V]
    torch.testing.assert_close(full[:, ids], own)
    torch.testing.assert_close(own, hidden @ target_head[ids].T)
    outside = torch.ones(V, dtype=torch.bool)
    outside[ids] = False
    assert torch.isinf(full[:, outside]).all() and (full[:, outside] < 0).all()
    assert draft.to_draft_ids(torch.tensor([9, 10, 49])).tolist() == [3, -1, 7]
    assert draft.to_target_ids(torch.tensor([3, 7])).tolist() == [9, 49]


def test_reduced_head_is_frozen_and_travels_in_the_state_dict():
    draft = build_draft(_cfg())
    assert not draft.lm_head.weight.requires_grad
    state = draft.state_dict()
    assert state["d2t"].dtype == torch.long and state["lm_head.weight"].shape == (8, H)


def test_dflash2_with_a_reduced_vocabulary_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="candidate top-k from the target's full head"):
        _cfg(kind="dflash2", conv_group_size=8)

    class Draft:
        kind, draft_vocab_size = "dflash2", 4096

    class Cfg:
        draft = Draft()

    with pytest.raises(ConfigError, match="DFlash2 takes its candidate top-k"):
        check_draft_vocab(Cfg())


def test_full_or_larger_sizes_are_refused():
    for n in (V, V + 1, 0):
        with pytest.raises(ConfigError, match="draft_vocab_size"):
            _cfg(draft_vocab_size=n)


def test_vocabulary_comes_from_the_reply_tokens_and_keeps_their_end_tokens():
    from blockdraft.data.dataset import Documents, TokenizedDataset
    from blockdraft.train.draft_vocab import choose_draft_vocab

    # Two conversations: prompt tokens (unsupervised) then a reply ending with 45 (end of turn).
    ids = [[1, 2, 3, 10, 10, 10, 11, 45], [1, 2, 12, 10, 11, 11, 45]]
    masks = [[False] * 3 + [True] * 5, [False] * 3 + [True] * 4]
    dataset = TokenizedDataset(Documents.from_lists(ids, masks, [1, 2]), seq_length=16)
    assert sorted(dataset.reply_tokens().tolist()) == [10, 10, 10, 10, 11, 11, 11, 45, 45]
    assert dataset.reply_end_tokens().tolist() == [45, 45]
    draft = build_draft(_cfg(draft_vocab_size=3))
    share = choose_draft_vocab(draft, dataset, torch.randn(V, H), tokenizer=None, target_config=None, verbose=False)
    assert draft.draft_token_ids().tolist() == [10, 11, 45]  # prompt-only tokens 1, 2, 3, 12 are never chosen
    assert share == 1.0
