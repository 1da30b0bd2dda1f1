"""``of.detect_anomaly()``: stop at the first op whose forward or backward produces NaN or infinity.

It is an interpreter (see ``opforge.dispatch``): while it is the innermost one, every op call runs eagerly as usual,
then its float outputs are checked; the call site in the user's code is kept on the autograd node, so that when a
gradient rule's ops produce a non-finite value, the error names the forward op, where it was called, and the
input whose gradient it is. Off — the default — nothing is checked and nothing is kept: the eager fast path sees
no difference.
"""

from __future__ import annotations

import os
import sys

from ..core import dtypes as D
from ..core.errors import AnomalyError
from ..core.interpreters import EAGER, Interpreter, interpreting
from ..tensor import Tensor

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class AnomalyDetection(Interpreter):
    """Runs every call eagerly and refuses non-finite float outputs, naming the op and the user's line."""

    def __init__(self):
        self.backward_of = None  # while a gradient rule runs: (its forward node, the forward call site)

    def apply(self, op, inputs, attrs):
        result = EAGER.apply(op, inputs, attrs)
        outputs = [t for item in (result if isinstance(result, tuple) else (result,))
                   for t in (item if isinstance(item, list) else (item,)) if isinstance(t, Tensor)]
        if self.backward_of is None:
            where = call_site()
            for t in outputs:
                if t._node is not None:
                    t._node.origin = where
            bad = _first_non_finite(op, outputs)
            if bad is not None:
                raise AnomalyError(f"{op.name}() forward produced {bad} (called at {where})")
        else:
            node, where = self.backward_of
            bad = _first_non_finite(op, outputs)
            if bad is not None:
                raise AnomalyError(f"backward of {node.op.name}() (called at {where}): its gradient rule's op "
                                   f"{op.name}() produced {bad}")
        return result

    def check_gradient(self, node, label: str, grad: Tensor) -> None:
        """The engine's check of each gradient a rule returned (a rule may return an input's gradient unchanged)."""
        bad = _non_finite(grad)
        if bad is not None:
            where = getattr(node, "origin", None) or "an unknown place"
            raise AnomalyError(f"backward of {node.op.name}() (called at {where}) produced {bad} in the gradient "
                               f"of its input '{label}'")


def _first_non_finite(op, outputs: list) -> str | None:
    for name, t in zip(op.output_names * len(outputs), outputs):
        bad = _non_finite(t)
        if bad is not None:
            return f"{bad} in output '{name}'"
    return None


def _non_finite(t: Tensor) -> str | None:
    data = t._data
    if not D.is_floating(data.dtype):
        return None
    xp = t._device.xp
    finite = xp.isfinite(data)
    if bool(finite.all()):
        return None
    return "NaN" if bool(xp.isnan(data).any()) else "infinity"


def call_site() -> str:
    """The innermost frame outside opforge: where the user's code called the op (file:line in function)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE) and not filename.startswith("<opforge"):
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "inside opforge"


class detect_anomaly:
    """``with of.detect_anomaly(): ...``: the first op whose forward or backward produces NaN or infinity raises
    ``AnomalyError`` naming the op, the direction and the line of the user's code that called the op."""

    def __enter__(self) -> AnomalyDetection:
        self._interpreter = AnomalyDetection()
        self._scope = interpreting(self._interpreter)
        return self._scope.__enter__()

    def __exit__(self, *exc) -> None:
        self._scope.__exit__(*exc)
