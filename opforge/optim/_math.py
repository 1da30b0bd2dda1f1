"""The tensor methods torch's optimizers are written with (``lerp_``, ``addcmul_``, ``addcdiv_``, ``add(alpha=)``),
written with ops in torch's order of evaluation, so an update rule written with them rounds as torch's does.

They take Tensors eagerly and program variables while tracing: an optimizer's ``_update`` built from them is one
definition for eager and compiled steps. Scalars that depend on the step count (bias corrections, ...) are 0-d
float64 tensors, computed as torch computes them in Python doubles; ``scalar`` casts one to the parameter's dtype
where torch hands a Python scalar to a tensor op (which casts it to the tensor's dtype).
"""

from __future__ import annotations

from .. import ops as F
from ..core import dtypes as D


def lerp(start, end, weight):
    """start + weight·(end − start), as ``torch.lerp``: from the nearer end, so weight 1 gives ``end`` exactly.
    ``weight`` is a Python number, or a 0-d float64 tensor (a scheduled beta1's 1 − β₁), whose end is picked at
    run time, with the same bits."""
    if isinstance(weight, (int, float)):
        if abs(weight) < 0.5:
            return start + weight * (end - start)
        return end - (end - start) * (1 - weight)
    near_start = F.abs(weight) < 0.5
    return F.where(near_start, start + scalar(weight, start) * (end - start),
                   end - (end - start) * scalar(1 - weight, start))


def addcmul(x, a, b, value=1.0):
    """``x.addcmul(a, b, value=value)``: x + (value·a)·b (1·a is a, exactly: no multiply then)."""
    return x + (a if _is_one(value) else value * a) * b


def addcdiv(x, a, b, value=1.0):
    """``x.addcdiv(a, b, value=value)``: x + (value·a)/b."""
    return x + (a if _is_one(value) else value * a) / b


def _is_one(value) -> bool:
    return isinstance(value, (int, float)) and value == 1


def signed_decayed(g, p, group):
    """The gradient an update follows: −grad when ``maximize``, plus ``weight_decay``·p (L2 decay in the
    gradient: ``grad.add(param, alpha=weight_decay)``)."""
    if group["maximize"]:
        g = -g
    wd = group["weight_decay"]
    return g + wd * p if wd != 0 else g


def count(step):
    """The step count (an int64 state tensor) as float64, as torch reads its step (``_get_value(step)``)."""
    return F.cast(step, dtype=D.float64)


def scalar(value, like):
    """A 0-d float64 value (a learning rate, a bias correction) as the Python scalar torch passes to a tensor op on
    ``like``: cast to ``like``'s dtype (torch casts a scalar operand to the tensor's dtype)."""
    return value if like.dtype == D.float64 else F.cast(value, dtype=like.dtype)


__all__ = ["addcdiv", "addcmul", "count", "lerp", "scalar", "signed_decayed"]
