"""What op definitions share: the decorator, sample helpers and small shape helpers for infer rules."""

import numpy as np

from ..core import dtypes as D
from ..core.errors import ShapeError
from ..core.opdef import Sample
from ..core.sbp import B, P, S
from ..core.spec import Spec, broadcast_shapes, shapes_agree
from ..dispatch import op

__all__ = ["B", "D", "P", "S", "Sample", "ShapeError", "Spec", "broadcast_shapes", "normalize_axes", "np", "op",
           "shapes_agree"]


def normalize_axes(op_name: str, axes, ndim: int) -> tuple:
    """Axes (None = all) -> sorted non-negative tuple; an axis out of range is a ShapeError naming the op.

    A 0-d tensor accepts axis 0 and -1 (as PyTorch does) and has no axes to reduce: the result is ().
    """
    if axes is None:
        return tuple(range(ndim))
    out = []
    for a in axes:
        if not -max(ndim, 1) <= a < max(ndim, 1):
            raise ShapeError(f"{op_name}(): axis {a} is out of range for a tensor of rank {ndim}")
        a = a % ndim if ndim else None
        if a in out:
            raise ShapeError(f"{op_name}(): axis {a} is given twice in {tuple(axes)}")
        out.append(a)
    return tuple(sorted(a for a in out if a is not None))
