"""``Adagrad``, ``Adadelta`` and ``RMSprop``: steps scaled by a running sum or average of squared gradients.

Each update rule is written once, with ops (``_math``'s helpers in torch's order of evaluation), and runs eagerly
or recorded into a compiled step, where each new state value is written into the state's own array.
"""

from __future__ import annotations

import numpy as np

from .. import ops as F
from ..creation import tensor
from ..program import assign
from ._math import addcdiv, addcmul, count, lerp, scalar, signed_decayed
from .optimizer import Optimizer, live


def _zeros(p):
    return tensor(np.zeros(p.shape, p.dtype), device=p.device)


def _step():
    return np.array(0, dtype=np.int64)


class Adagrad(Optimizer):
    """``torch.optim.Adagrad``, step for step: at step t, with g = ±grad + weight_decay·p,

        clr = lr / (1 + (t − 1)·lr_decay)
        sum ← sum + g²,    p ← p − clr·g / (√sum + eps)

    State per parameter: ``step`` (int64) and ``sum`` (starting at ``initial_accumulator_value``).
    """

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False, fused: bool | None = None):
        super().__init__(params, {"lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
                                  "initial_accumulator_value": initial_accumulator_value, "foreach": foreach,
                                  "maximize": maximize, "differentiable": differentiable, "fused": fused})

    def _check(self, hyper: dict) -> None:
        super()._check(hyper)
        self._check_nonnegative(hyper, "lr_decay", "weight_decay", "initial_accumulator_value", "eps")

    def _new_state(self, p, group) -> dict:
        return {"step": tensor(_step(), device=p.device),
                "sum": tensor(np.full(p.shape, group["initial_accumulator_value"], p.dtype), device=p.device)}

    def _update(self, p, g, lr, group, state) -> None:
        step = live(state["step"]) + 1
        g = signed_decayed(g, p, group)
        clr = lr / (1 + (count(step) - 1) * group["lr_decay"])
        total = addcmul(live(state["sum"]), g, g)
        std = F.sqrt(total) + group["eps"]
        assign(state["step"], step)
        assign(state["sum"], total)
        assign(p, addcdiv(p, g, std, -scalar(clr, p)))


class Adadelta(Optimizer):
    """``torch.optim.Adadelta``, step for step: with g = ±grad + weight_decay·p,

        v ← rho·v + (1 − rho)·g²,    δ = √(u + eps) / √(v + eps) · g
        u ← rho·u + (1 − rho)·δ²,    p ← p − lr·δ

    State per parameter: ``step`` (int64), ``square_avg`` (v) and ``acc_delta`` (u).
    """

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0,
                 foreach: bool | None = None, *, capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False):
        super().__init__(params, {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay,
                                  "maximize": maximize, "capturable": capturable, "foreach": foreach,
                                  "differentiable": differentiable})

    def _check(self, hyper: dict) -> None:
        super()._check(hyper)
        if not 0 <= hyper["rho"] <= 1:
            raise self._error(f"rho must be in [0, 1], got {hyper['rho']}")
        self._check_nonnegative(hyper, "eps", "weight_decay")

    def _new_state(self, p, group) -> dict:
        return {"step": tensor(_step(), device=p.device), "square_avg": _zeros(p), "acc_delta": _zeros(p)}

    def _update(self, p, g, lr, group, state) -> None:
        rho, eps = group["rho"], group["eps"]
        g = signed_decayed(g, p, group)
        square_avg = addcmul(live(state["square_avg"]) * rho, g, g, 1 - rho)
        acc_delta = live(state["acc_delta"])
        delta = F.sqrt(acc_delta + eps) / F.sqrt(square_avg + eps) * g
        assign(state["step"], live(state["step"]) + 1)
        assign(state["square_avg"], square_avg)
        assign(state["acc_delta"], addcmul(acc_delta * rho, delta, delta, 1 - rho))
        assign(p, p - scalar(lr, p) * delta)


class RMSprop(Optimizer):
    """``torch.optim.RMSprop``, step for step: with g = ±grad + weight_decay·p,

        v ← alpha·v + (1 − alpha)·g²
        centered: ḡ ← lerp(ḡ, g, 1 − alpha), avg = √(v − ḡ²) + eps;  else avg = √v + eps
        momentum > 0: b ← momentum·b + g/avg, p ← p − lr·b;  else p ← p − lr·g/avg

    State per parameter: ``step`` (int64), ``square_avg`` (v), ``momentum_buffer`` (b, when momentum > 0) and
    ``grad_avg`` (ḡ, when centered).
    """

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0,
                 momentum: float = 0, centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False, differentiable: bool = False):
        super().__init__(params, {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps, "centered": centered,
                                  "weight_decay": weight_decay, "capturable": capturable, "foreach": foreach,
                                  "maximize": maximize, "differentiable": differentiable})

    def _check(self, hyper: dict) -> None:
        super()._check(hyper)
        self._check_nonnegative(hyper, "eps", "momentum", "weight_decay", "alpha")

    def _new_state(self, p, group) -> dict:
        state = {"step": tensor(_step(), device=p.device), "square_avg": _zeros(p)}
        if group.nonzero("momentum"):
            state["momentum_buffer"] = _zeros(p)
        if group["centered"]:
            state["grad_avg"] = _zeros(p)
        return state

    def _update(self, p, g, lr, group, state) -> None:
        alpha, momentum = group["alpha"], group.value("momentum")  # (a tensor: schedules cycle it)
        if (group.nonzero("momentum") and "momentum_buffer" not in state) or (
                group["centered"] and "grad_avg" not in state):
            self._add_missing_state(p, group, state)
        g = signed_decayed(g, p, group)
        square_avg = addcmul(live(state["square_avg"]) * alpha, g, g, 1 - alpha)
        assign(state["step"], live(state["step"]) + 1)
        assign(state["square_avg"], square_avg)
        if group["centered"]:
            grad_avg = lerp(live(state["grad_avg"]), g, 1 - alpha)
            assign(state["grad_avg"], grad_avg)
            avg = F.sqrt(addcmul(square_avg, grad_avg, grad_avg, -1))
        else:
            avg = F.sqrt(square_avg)
        avg = avg + group["eps"]
        lr = scalar(lr, p)
        if group.nonzero("momentum"):
            buf = addcdiv(live(state["momentum_buffer"]) * scalar(momentum, p), g, avg)
            assign(state["momentum_buffer"], buf)
            assign(p, p - lr * buf)
        else:
            assign(p, addcdiv(p, g, avg, -lr))
