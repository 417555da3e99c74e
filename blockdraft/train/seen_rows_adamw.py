"""AdamW that steps a lookup table only in the rows a batch saw.

DSpark's Markov table (`markov_w1`, [target vocabulary, rank]: 12.6M values for SmolLM2, 39M for Qwen3)
is read at the few hundred previous tokens of a batch. Dense AdamW reads and writes the whole table, its
two moments and its gradient every step, which made a DSpark step 1.49x a DFlash step on a 2-core CPU.
Here a table marked `row_lazy` is stepped in the rows whose gradient is not zero (after any all-reduce,
so every rank's rows count), each row with its own step count for the bias correction: a row seen in
every step moves exactly as under AdamW; a row not seen keeps its value and its moments (no weight decay
while unseen, as in lazy Adam and torch's SparseAdam). Every other parameter is AdamW's, unchanged.
A sharded (DTensor) table is stepped densely by AdamW: its rows live on other ranks.
"""

from __future__ import annotations

import torch

LAZY_FLAG = "row_lazy"  # a model sets it on a [rows, width] lookup table's parameter


def is_row_lazy(param: torch.Tensor) -> bool:
    if not getattr(param, LAZY_FLAG, False) or param.ndim != 2:  # every step, every parameter: the flag first
        return False
    from torch.distributed.tensor import DTensor

    return not isinstance(param, DTensor)


class SeenRowsAdamW(torch.optim.AdamW):
    """torch.optim.AdamW, with the tables marked `row_lazy` stepped in their seen rows only."""

    @torch.no_grad()
    def step(self, closure=None):
        lazy = [(p, p.grad, group) for group in self.param_groups for p in group["params"]
                if p.grad is not None and is_row_lazy(p)]
        for p, _, _ in lazy:
            p.grad = None  # AdamW's own step skips a parameter without a gradient
        try:
            loss = super().step(closure)
        finally:
            for p, grad, _ in lazy:
                p.grad = grad
        for p, grad, group in lazy:
            self._step_seen_rows(p, grad, group)
        return loss

    def _step_seen_rows(self, param: torch.Tensor, grad: torch.Tensor, group: dict) -> None:
        state = self.state[param]
        if "row_step" not in state:
            # A dense AdamW's state (a checkpoint from before): its moments go on, every row at its step count.
            begun = float(state.get("step", 0.0))
            state["row_step"] = torch.full((param.shape[0],), begun, dtype=torch.float32, device=param.device)
            for moment in ("exp_avg", "exp_avg_sq"):
                if moment not in state:
                    state[moment] = torch.zeros_like(param, memory_format=torch.preserve_format)
        # The steps taken on the table (AdamW's loader expects the key); each row's own count is row_step.
        state["step"] = torch.tensor(float(state.get("step", 0.0)) + 1.0)
        rows = grad.ne(0).any(dim=1).nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        beta1, beta2 = group["betas"]
        lr, eps, decay = _value(group["lr"]), group["eps"], group["weight_decay"]
        g = grad.index_select(0, rows).to(state["exp_avg"].dtype)
        steps = state["row_step"].index_select(0, rows) + 1
        state["row_step"].index_copy_(0, rows, steps)
        m = state["exp_avg"].index_select(0, rows).mul_(beta1).add_(g, alpha=1 - beta1)
        v = state["exp_avg_sq"].index_select(0, rows).mul_(beta2).addcmul_(g, g, value=1 - beta2)
        state["exp_avg"].index_copy_(0, rows, m)
        state["exp_avg_sq"].index_copy_(0, rows, v)
        correction1 = (1 - beta1 ** steps).unsqueeze(1)
        correction2 = (1 - beta2 ** steps).unsqueeze(1)
        values = param.index_select(0, rows)
        values.mul_(1 - lr * decay)  # decoupled weight decay, as AdamW, on the rows stepped
        values.sub_(lr * (m / correction1) / ((v / correction2).sqrt_().add_(eps)).to(values.dtype))
        param.index_copy_(0, rows, values)


def _value(lr) -> float:
    return float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)
