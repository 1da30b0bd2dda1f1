"""``Adam`` (L2 weight decay in the gradient) and ``AdamW`` (decoupled weight decay)."""

from __future__ import annotations

import numpy as np

from .. import ops as F
from ..creation import tensor
from ..program import assign
from ._math import addcdiv, addcmul, count, lerp, scalar
from .optimizer import Optimizer, live


class Adam(Optimizer):
    """``torch.optim.Adam``, step for step: at a parameter's step t = 1, 2, ..., with g = ±grad + weight_decay·p,

        m ← β₁·m + (1 − β₁)·g,   v ← β₂·v + (1 − β₂)·g²,   v̂ = max(v̂, v) with ``amsgrad``, else v
        p ← p − lr/(1 − β₁ᵗ) · m / (√v̂ / √(1 − β₂ᵗ) + eps)

    ``decoupled_weight_decay`` (AdamW) shrinks p by (1 − lr·weight_decay) instead of adding to g; ``maximize``
    ascends. State per parameter: ``step`` (int64), ``exp_avg`` (m), ``exp_avg_sq`` (v) and, with ``amsgrad``,
    ``max_exp_avg_sq`` (v̂).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, decoupled_weight_decay: bool = False):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "amsgrad": amsgrad, "maximize": maximize, "foreach": foreach,
                                  "capturable": capturable, "differentiable": differentiable, "fused": fused,
                                  "decoupled_weight_decay": decoupled_weight_decay})

    def _check(self, hyper: dict) -> None:
        super()._check(hyper)
        self._check_betas(hyper)
        self._check_nonnegative(hyper, "eps", "weight_decay")

    def _new_state(self, p, group) -> dict:
        state = {"step": tensor(np.array(0, dtype=np.int64), device=p.device),
                 "exp_avg": tensor(np.zeros(p.shape, p.dtype), device=p.device),
                 "exp_avg_sq": tensor(np.zeros(p.shape, p.dtype), device=p.device)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = tensor(np.zeros(p.shape, p.dtype), device=p.device)
        return state

    def _update(self, p, g, lr, group, state) -> None:
        beta2, weight_decay = group.setting("betas")[1], group["weight_decay"]
        beta1 = group.value("beta1")  # a tensor: schedules cycle it
        decoupled = group["decoupled_weight_decay"]
        l2 = 0.0 if decoupled else weight_decay  # Adam's decay enters the moments, AdamW's the parameter
        if group["maximize"]:
            g = -g
        if group["amsgrad"] and "max_exp_avg_sq" not in state:  # turned on after the parameter joined
            self._add_missing_state(p, group, state)
        step = live(state["step"]) + 1
        m = F.adam_exp_avg(live(state["exp_avg"]), g, p, beta1, weight_decay=l2)
        v = F.adam_exp_avg_sq(live(state["exp_avg_sq"]), g, p, beta2=beta2, weight_decay=l2)
        denominator = v
        if group["amsgrad"]:
            denominator = F.maximum(live(state["max_exp_avg_sq"]), v)
            assign(state["max_exp_avg_sq"], denominator)
        new = F.adam_update(p, m, denominator, step, lr, beta1, beta2=beta2, eps=group["eps"],
                            weight_decay=weight_decay, decoupled=decoupled)
        assign(state["step"], step)
        assign(state["exp_avg"], m)
        assign(state["exp_avg_sq"], v)
        assign(p, new)


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam whose weight decay is decoupled from the gradient — p ← p·(1 − lr·weight_decay)
    before the Adam update, and the moments see the plain gradient (``decoupled_weight_decay`` is True)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True)


# -- the Adam family written with ops ----------------------------------------------------------------------------
# Adam and AdamW run the dedicated update ops of opforge.ops.optim; the variants below are written with ops (in
# torch's order of evaluation, see _math), which record into a compiled step as well.


class _AdamFamily(Optimizer):
    """What Adamax, NAdam and RAdam share: betas, eps, weight decay, torch's flags, and the state ``step`` (int64),
    ``exp_avg`` and a second moment."""

    second_moment = "exp_avg_sq"

    def _check(self, hyper: dict) -> None:
        super()._check(hyper)
        self._check_betas(hyper)
        self._check_nonnegative(hyper, "eps", "weight_decay")

    def _new_state(self, p, group) -> dict:
        return {"step": tensor(np.array(0, dtype=np.int64), device=p.device),
                "exp_avg": tensor(np.zeros(p.shape, p.dtype), device=p.device),
                self.second_moment: tensor(np.zeros(p.shape, p.dtype), device=p.device)}

    def _decay(self, p, g, lr, group):
        """(p, g) after weight decay: decoupled (p·(1 − lr·weight_decay)) or L2 (g + weight_decay·p)."""
        g = -g if group["maximize"] else g
        wd = group["weight_decay"]
        if wd == 0:
            return p, g
        if group.get("decoupled_weight_decay", False):
            return p * scalar(1 - lr * wd, p), g
        return p, g + wd * p


class Adamax(_AdamFamily):
    """``torch.optim.Adamax``, step for step: at step t, with g = ±grad + weight_decay·p,

        m ← lerp(m, g, 1 − β₁),   u ← max(β₂·u, |g| + eps),   p ← p − lr/(1 − β₁ᵗ) · m/u

    State per parameter: ``step`` (int64), ``exp_avg`` (m) and ``exp_inf`` (u).
    """

    second_moment = "exp_inf"

    def __init__(self, params, lr: float = 2e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "foreach": foreach, "maximize": maximize, "differentiable": differentiable,
                                  "capturable": capturable})

    def _update(self, p, g, lr, group, state) -> None:
        beta1, beta2 = group.value("beta1"), group.setting("betas")[1]
        step = live(state["step"]) + 1
        p_, g = self._decay(p, g, lr, group)
        exp_avg = lerp(live(state["exp_avg"]), g, 1 - beta1)
        exp_inf = F.maximum(live(state["exp_inf"]) * beta2, F.abs(g) + group["eps"])
        clr = lr / (1 - beta1 ** count(step))
        assign(state["step"], step)
        assign(state["exp_avg"], exp_avg)
        assign(state["exp_inf"], exp_inf)
        assign(p, addcdiv(p_, exp_avg, exp_inf, -scalar(clr, p)))


class NAdam(_AdamFamily):
    """``torch.optim.NAdam`` (Adam with Nesterov momentum), step for step: at step t, with g = ±grad (+ L2 decay,
    or p·(1 − lr·weight_decay) when ``decoupled_weight_decay``),

        μₜ = β₁·(1 − ½·0.96^(t·momentum_decay)),   Πₜ = μ₁···μₜ
        m ← lerp(m, g, 1 − β₁),   v ← β₂·v + (1 − β₂)·g²,   d = √(v/(1 − β₂ᵗ)) + eps
        p ← p − lr·(1 − μₜ)/(1 − Πₜ) · g/d − lr·μₜ₊₁/(1 − Πₜ·μₜ₊₁) · m/d

    State per parameter: ``step`` (int64), ``mu_product`` (Π, 0-d float64: torch keeps it in its default scalar
    dtype, float32 unless the default dtype is float64, so torch's own trajectory rounds Π to float32 there),
    ``exp_avg`` (m) and ``exp_avg_sq`` (v).
    """

    scalar_state = ("mu_product",)

    def __init__(self, params, lr: float = 2e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "momentum_decay": momentum_decay, "decoupled_weight_decay": decoupled_weight_decay,
                                  "maximize": maximize, "foreach": foreach, "capturable": capturable,
                                  "differentiable": differentiable})

    def _check(self, hyper: dict) -> None:
        super()._check(hyper)
        self._check_nonnegative(hyper, "momentum_decay")

    def _new_state(self, p, group) -> dict:
        state = super()._new_state(p, group)
        return {"step": state.pop("step"), "mu_product": tensor(np.array(1.0), device=p.device), **state}

    def _update(self, p, g, lr, group, state) -> None:
        beta1, beta2, decay = group.value("beta1"), group.setting("betas")[1], group["momentum_decay"]
        step = live(state["step"]) + 1
        t = count(step)
        p_, g = self._decay(p, g, lr, group)
        mu = beta1 * (1.0 - 0.5 * 0.96 ** (t * decay))
        mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * decay))
        mu_product = live(state["mu_product"]) * mu
        exp_avg = lerp(live(state["exp_avg"]), g, 1 - beta1)
        exp_avg_sq = addcmul(live(state["exp_avg_sq"]) * beta2, g, g, 1 - beta2)
        denom = F.sqrt(exp_avg_sq / scalar(1 - beta2 ** t, p)) + group["eps"]
        p_ = addcdiv(p_, g, denom, scalar(-lr * (1.0 - mu) / (1.0 - mu_product), p))
        p_ = addcdiv(p_, exp_avg, denom, scalar(-lr * mu_next / (1.0 - mu_product * mu_next), p))
        assign(state["step"], step)
        assign(state["mu_product"], mu_product)
        assign(state["exp_avg"], exp_avg)
        assign(state["exp_avg_sq"], exp_avg_sq)
        assign(p, p_)


class RAdam(_AdamFamily):
    """``torch.optim.RAdam`` (rectified Adam), step for step: at step t, with g = ±grad (+ L2 decay, or
    p·(1 − lr·weight_decay) when ``decoupled_weight_decay``), m and v as Adam's,

        ρ∞ = 2/(1 − β₂) − 1,   ρₜ = ρ∞ − 2t·β₂ᵗ/(1 − β₂ᵗ),   m̂ = m/(1 − β₁ᵗ)
        ρₜ > 5:  p ← p − m̂·lr·√(1 − β₂ᵗ)/(√v + eps)·r,  r = √((ρₜ−4)(ρₜ−2)ρ∞ / ((ρ∞−4)(ρ∞−2)ρₜ))
        else:    p ← p − m̂·lr

    The branch is a ``where`` on the 0-d ρₜ, so a compiled step takes it at run time.
    State per parameter: ``step`` (int64), ``exp_avg`` (m) and ``exp_avg_sq`` (v).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "maximize": maximize, "foreach": foreach, "capturable": capturable,
                                  "decoupled_weight_decay": decoupled_weight_decay,
                                  "differentiable": differentiable})

    def _update(self, p, g, lr, group, state) -> None:
        beta1, beta2 = group.value("beta1"), group.setting("betas")[1]
        step = live(state["step"]) + 1
        t = count(step)
        p_, g = self._decay(p, g, lr, group)
        exp_avg = lerp(live(state["exp_avg"]), g, 1 - beta1)
        exp_avg_sq = addcmul(live(state["exp_avg_sq"]) * beta2, g, g, 1 - beta2)
        bias_correction2 = 1 - beta2 ** t
        corrected = exp_avg / scalar(1 - beta1 ** t, p) * scalar(lr, p)
        rho_inf = 2 / (1 - beta2) - 1
        change = corrected
        if rho_inf > 5:  # else ρₜ < ρ∞ never passes 5: every step takes the plain branch
            rho_t = rho_inf - 2 * t * beta2 ** t / bias_correction2
            # r at max(ρₜ, 5): the same where ρₜ > 5 (where it is used), and no square root of a negative elsewhere
            rho = F.maximum(rho_t, 5.0)
            rect = ((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho)) ** 0.5
            adaptive = F.reciprocal(F.sqrt(exp_avg_sq) + group["eps"]) * scalar(bias_correction2 ** 0.5, p)
            change = F.where(rho_t > 5.0, corrected * adaptive * scalar(rect, p), corrected)
        assign(state["step"], step)
        assign(state["exp_avg"], exp_avg)
        assign(state["exp_avg_sq"], exp_avg_sq)
        assign(p, p_ - change)
