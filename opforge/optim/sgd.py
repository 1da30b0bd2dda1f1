"""``SGD``: stochastic gradient descent with momentum, dampening, Nesterov momentum and L2 weight decay."""

from __future__ import annotations

import numpy as np

from .. import ops as F
from ..core.errors import ArgumentError
from ..creation import tensor
from ..program import assign
from .optimizer import Optimizer, live


class SGD(Optimizer):
    """``torch.optim.SGD``, step for step: with d = ±grad + weight_decay·p (−grad when ``maximize``),

        b ← d on a parameter's first step, else momentum·b + (1 − dampening)·d      (when momentum ≠ 0)
        d ← d + momentum·b (nesterov) or b
        p ← p − lr·d

    State per parameter when momentum ≠ 0: ``momentum_buffer`` and ``step`` (the steps taken, int64: it tells the
    first step, whose buffer is d itself, from the others inside a compiled program).
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False, fused: bool | None = None):
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize,
                                  "foreach": foreach, "differentiable": differentiable, "fused": fused})

    def _check(self, hyper: dict) -> None:
        super()._check(hyper)
        for key in ("momentum", "weight_decay"):
            if not hyper[key] >= 0:
                raise ArgumentError(f"SGD(): {key} must be >= 0, got {hyper[key]}")
        if hyper["nesterov"] and (hyper["momentum"] <= 0 or hyper["dampening"] != 0):
            raise ArgumentError("SGD(): nesterov=True needs momentum > 0 and dampening = 0, got "
                                f"momentum={hyper['momentum']}, dampening={hyper['dampening']}")

    def _new_state(self, p, group) -> dict:
        if not group.nonzero("momentum"):
            return {}
        return {"momentum_buffer": tensor(np.zeros(p.shape, p.dtype), device=p.device),
                "step": tensor(np.array(0, dtype=np.int64), device=p.device)}

    def _complete_state(self, entries: dict) -> dict:
        # torch's SGD keeps no step count: its buffer existing means a step was taken, which is all ours tells
        if "momentum_buffer" in entries and "step" not in entries:
            return {**entries, "step": np.array(1, dtype=np.int64)}
        return entries

    def _update(self, p, g, lr, group, state) -> None:
        momentum, weight_decay = group.value("momentum"), group["weight_decay"]  # (a tensor: schedules cycle it)
        if group["maximize"]:
            g = -g
        buf = None
        if group.nonzero("momentum"):
            if "momentum_buffer" not in state:  # a schedule (CyclicLR, OneCycleLR) turned momentum on
                self._add_missing_state(p, group, state)
            step = live(state["step"])
            buf = F.sgd_momentum_buffer(live(state["momentum_buffer"]), g, p, step, momentum,
                                        dampening=group["dampening"], weight_decay=weight_decay)
            assign(state["momentum_buffer"], buf)
            assign(state["step"], step + 1)
        assign(p, F.sgd_update(p, g, lr, buf, momentum if group["nesterov"] else None, weight_decay=weight_decay,
                               nesterov=group["nesterov"]))
