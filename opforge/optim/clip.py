"""``clip_grad_norm_``: scale all gradients down together when their global norm exceeds a bound;
``clip_grad_value_``: clamp each gradient element. ``torch.nn.utils``' functions (``opforge.nn.utils`` has them)."""

from __future__ import annotations

import math

from .. import ops as F
from ..core.errors import ArgumentError, GradientError, describe
from ..core.grad_mode import no_grad
from ..core.interpreters import current_interpreter
from ..creation import tensor
from ..tensor import Tensor
from .optimizer import grad_of, set_grad


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None):
    """Scale the gradients of ``parameters`` by min(1, max_norm / (total + 1e-6)), where total is the norm of all
    of them as one vector, and return total — ``torch.nn.utils.clip_grad_norm_``'s formula (the total is the
    ``norm_type``-norm of the per-gradient norms; ``float("inf")`` for the largest magnitude).

    Eagerly, each ``p.grad`` is replaced by its scaled copy (a new tensor: a gradient array may be shared between
    parameters by the backward pass, so it is never changed in place). While tracing, the scaled gradients become
    the program's gradients of the parameters (``program.grad_names``), which an optimizer step recorded after
    this call reads, and the returned total is a program variable: so the same training step code clips eagerly
    and compiled. Call it after ``loss.backward()`` and before ``opt.step()``.

    ``error_if_nonfinite=True`` raises when the total is NaN or infinite (eagerly: a compiled program cannot stop on
    a value it computes, so there it is refused); ``foreach`` (how torch loops) changes nothing.
    """
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not max_norm >= 0:
        raise ArgumentError(f"clip_grad_norm_(): max_norm must be >= 0, got {max_norm}")
    pairs = [(p, g) for p in params for g in [grad_of(p)] if g is not None]
    if not pairs:
        return tensor(0.0)
    if error_if_nonfinite and current_interpreter().symbolic:
        raise ArgumentError("clip_grad_norm_(): error_if_nonfinite=True reads the norm's value, which a compiled "
                            "function cannot do; check the returned norm after the step instead")
    with no_grad():
        norms = [F.norm(g, p=norm_type) for _, g in pairs]
        total = F.norm(F.stack(norms), p=norm_type)
        if error_if_nonfinite and not math.isfinite(total.item()):
            raise GradientError(f"clip_grad_norm_(): the total norm of order {norm_type} of the gradients is "
                                f"{total.item()}, so it cannot be clipped (error_if_nonfinite=False scales by it "
                                "anyway), as in torch")
        scale = F.clip(max_norm / (total + 1e-6), max=1.0)  # applied even when it is 1, as torch does
        for p, g in pairs:
            set_grad(p, g * scale)
    return total


def clip_grad_value_(parameters, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient of ``parameters`` to [−clip_value, clip_value], as ``torch.nn.utils.clip_grad_value_``
    (which returns None). As ``clip_grad_norm_``: eagerly each ``p.grad`` is replaced by its clamped copy, and while
    tracing the clamped gradients become the program's, which a later ``opt.step()`` reads. A negative or NaN
    ``clip_value`` is refused (torch would clamp every element to −|clip_value|)."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    if isinstance(clip_value, bool) or not isinstance(clip_value, (int, float)) or not clip_value >= 0:
        raise ArgumentError(f"clip_grad_value_(): clip_value must be a number >= 0, got {describe(clip_value)}")
    clip_value = float(clip_value)
    with no_grad():
        for p in params:
            g = grad_of(p)
            if g is not None:
                set_grad(p, F.clip(g, -clip_value, clip_value))
