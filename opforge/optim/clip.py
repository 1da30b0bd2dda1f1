"""``clip_grad_norm_``: scale all gradients down together when their global norm exceeds a bound."""

from __future__ import annotations

from .. import ops as F
from ..core.errors import ArgumentError
from ..core.grad_mode import no_grad
from ..creation import tensor
from ..tensor import Tensor
from .optimizer import grad_of, set_grad


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0):
    """Scale the gradients of ``parameters`` by min(1, max_norm / (total + 1e-6)), where total is the norm of all
    of them as one vector, and return total — ``torch.nn.utils.clip_grad_norm_``'s formula (the total is the
    ``norm_type``-norm of the per-gradient norms; ``float("inf")`` for the largest magnitude).

    Eagerly, each ``p.grad`` is replaced by its scaled copy (a new tensor: a gradient array may be shared between
    parameters by the backward pass, so it is never changed in place). While tracing, the scaled gradients become
    the program's gradients of the parameters (``program.grad_names``), which an optimizer step recorded after
    this call reads, and the returned total is a program variable: so the same training step code clips eagerly
    and compiled. Call it after ``loss.backward()`` and before ``opt.step()``.
    """
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not max_norm >= 0:
        raise ArgumentError(f"clip_grad_norm_(): max_norm must be >= 0, got {max_norm}")
    pairs = [(p, g) for p in params for g in [grad_of(p)] if g is not None]
    if not pairs:
        return tensor(0.0)
    with no_grad():
        norms = [F.norm(g, p=norm_type) for _, g in pairs]
        total = F.norm(F.stack(norms), p=norm_type)
        scale = F.clip(max_norm / (total + 1e-6), max=1.0)  # applied even when it is 1, as torch does
        for p, g in pairs:
            set_grad(p, g * scale)
    return total
