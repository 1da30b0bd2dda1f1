"""``Adam`` (L2 weight decay in the gradient) and ``AdamW`` (decoupled weight decay)."""

from __future__ import annotations

import numpy as np

from .. import ops as F
from ..core.errors import ArgumentError
from ..creation import tensor
from ..program import assign
from .optimizer import Optimizer, live


class Adam(Optimizer):
    """``torch.optim.Adam``, step for step: at a parameter's step t = 1, 2, ..., with g = grad + weight_decay·p,

        m ← β₁·m + (1 − β₁)·g,   v ← β₂·v + (1 − β₂)·g²
        p ← p − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + eps)

    State per parameter: ``step`` (int64), ``exp_avg`` (m) and ``exp_avg_sq`` (v).
    """

    decoupled = False  # AdamW: weight decay shrinks p by (1 − lr·weight_decay) instead of entering g

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    def _check(self, hyper: dict) -> None:
        super()._check(hyper)
        name = type(self).__name__
        betas = hyper["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ArgumentError(f"{name}(): betas must be two numbers in [0, 1), got {betas!r}")
        hyper["betas"] = tuple(float(b) for b in betas)
        for key in ("eps", "weight_decay"):
            if not hyper[key] >= 0:
                raise ArgumentError(f"{name}(): {key} must be >= 0, got {hyper[key]}")

    def _new_state(self, p, group) -> dict:
        return {"step": tensor(np.array(0, dtype=np.int64), device=p.device),
                "exp_avg": tensor(np.zeros(p.shape, p.dtype), device=p.device),
                "exp_avg_sq": tensor(np.zeros(p.shape, p.dtype), device=p.device)}

    def _update(self, p, g, lr, group, state) -> None:
        (beta1, beta2), weight_decay = group["betas"], group["weight_decay"]
        l2 = 0.0 if self.decoupled else weight_decay  # Adam's decay enters the moments, AdamW's the parameter
        step = live(state["step"]) + 1
        m = F.adam_exp_avg(live(state["exp_avg"]), g, p, beta1=beta1, weight_decay=l2)
        v = F.adam_exp_avg_sq(live(state["exp_avg_sq"]), g, p, beta2=beta2, weight_decay=l2)
        new = F.adam_update(p, m, v, step, lr, beta1=beta1, beta2=beta2, eps=group["eps"],
                            weight_decay=weight_decay, decoupled=self.decoupled)
        assign(state["step"], step)
        assign(state["exp_avg"], m)
        assign(state["exp_avg_sq"], v)
        assign(p, new)


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam whose weight decay is decoupled from the gradient — p ← p·(1 − lr·weight_decay)
    before the Adam update, and the moments see the plain gradient."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
