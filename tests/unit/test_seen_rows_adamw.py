"""AdamW that steps a lookup table in the rows a batch saw: the same as AdamW where every row is seen,
untouched rows where none is, and a checkpoint that resumes."""

import copy

import torch

from blockdraft.train.seen_rows_adamw import SeenRowsAdamW

KW = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)


def table(rows=6, width=4, lazy=True, seed=0):
    torch.manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(rows, width))
    if lazy:
        p.row_lazy = True
    return p


def step(opt, p, rows, seed):
    torch.manual_seed(seed)
    grad = torch.zeros_like(p)
    grad[rows] = torch.randn(len(rows), p.shape[1])
    p.grad = grad
    opt.step()


def test_a_table_seen_in_every_row_moves_exactly_as_under_adamw():
    lazy, dense = table(), table(lazy=False)
    opt_lazy, opt_dense = SeenRowsAdamW([lazy], **KW), torch.optim.AdamW([dense], **KW)
    for i in range(5):
        step(opt_lazy, lazy, list(range(6)), i)
        step(opt_dense, dense, list(range(6)), i)
    torch.testing.assert_close(lazy.detach(), dense.detach(), rtol=1e-5, atol=1e-6)


def test_rows_not_seen_keep_their_values_and_seen_rows_step_on_their_own_count():
    p = table()
    before = p.detach().clone()
    opt = SeenRowsAdamW([p], **KW)
    step(opt, p, [1, 4], 0)
    step(opt, p, [1], 1)
    unseen = [0, 2, 3, 5]
    assert torch.equal(p.detach()[unseen], before[unseen])  # not even weight decay while unseen
    assert not torch.equal(p.detach()[1], before[1]) and not torch.equal(p.detach()[4], before[4])
    assert opt.state[p]["row_step"].tolist() == [0, 2, 0, 0, 1, 0]
    # Row 4, seen once, moved as a first AdamW step moves: lr * sign(g), after the decay.
    fresh = table()
    first = SeenRowsAdamW([fresh], **KW)
    step(first, fresh, [1, 4], 0)
    torch.testing.assert_close(p.detach()[4], fresh.detach()[4])


def test_other_parameters_are_adamws_and_the_state_resumes():
    p, bias = table(), torch.nn.Parameter(torch.ones(3))
    opt = SeenRowsAdamW([p, bias], **KW)
    bias.grad = torch.ones(3)
    step(opt, p, [2], 0)
    assert opt.state[bias]["step"] == 1 and not torch.equal(bias.detach(), torch.ones(3))
    saved = copy.deepcopy(opt.state_dict())  # as written to disk: no tensor shared with the running optimizer
    again, again_bias = p.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    again.row_lazy = True
    resumed = SeenRowsAdamW([again, again_bias], **KW)
    resumed.load_state_dict(saved)
    step(opt, p, [2, 3], 1)
    step(resumed, again, [2, 3], 1)
    torch.testing.assert_close(again.detach(), p.detach())
    assert resumed.state[again]["row_step"].tolist() == [0, 0, 2, 1, 0, 0]


def test_a_dense_adamw_checkpoint_goes_on_with_its_moments():
    dense = table(lazy=False)
    opt = torch.optim.AdamW([dense], **KW)
    step(opt, dense, list(range(6)), 0)
    lazy = dense.detach().clone().requires_grad_()
    lazy.row_lazy = True
    resumed = SeenRowsAdamW([lazy], **KW)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    step(opt, dense, list(range(6)), 1)
    step(resumed, lazy, list(range(6)), 1)
    torch.testing.assert_close(lazy.detach(), dense.detach(), rtol=1e-5, atol=1e-6)
