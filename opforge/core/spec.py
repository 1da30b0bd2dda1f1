"""``Spec``: what is known of a tensor before it is computed — its shape (dims may be None) and dtype."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .errors import ShapeError


class Spec(NamedTuple):
    """Shape and dtype of a tensor. A dim of ``None`` is unknown until run time (a batch dim, say)."""

    shape: tuple
    dtype: np.dtype

    @classmethod
    def of(cls, shape, dtype) -> Spec:
        from .dtypes import as_dtype

        return cls(tuple(None if d is None else int(d) for d in shape), as_dtype(dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def matches(self, other: Spec) -> bool:
        """True if a concrete ``other`` fits this spec (None dims match any size)."""
        return self.dtype == other.dtype and shapes_agree(self.shape, other.shape)

    def __repr__(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"Spec(({dims}{',' if len(self.shape) == 1 else ''}), {self.dtype})"


def shapes_agree(a, b) -> bool:
    """Whether two shapes can be the same: one rank, and equal sizes wherever both are known (None: unknown)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def broadcast_shapes(*shapes, op: str = "") -> tuple:
    """NumPy broadcasting of shapes whose dims may be None (unknown).

    An unknown dim against 1 stays unknown; against a known n > 1 it becomes n (it must be n or 1).
    """
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(-ndim, 0):
        dims = [s[i] for s in shapes if len(s) >= -i]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise ShapeError(
                f"{op + '(): ' if op else ''}shapes {' and '.join(str(tuple(s)) for s in shapes)}"
                f" do not broadcast: dim {i} has sizes {sorted(known)}"
            )
        if known:
            out.append(known.pop())
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


class Dim:
    """A dim whose size is known only at run time: the size of axis ``axis`` of program variable ``var``.

    Program variables report unknown dims as ``Dim``s (``x.shape[0]`` of a batch of unknown size), so that an
    attr computed from a shape (``reshape(dy, shape=x.shape)``) can be resolved by the executor once the feed
    shapes are known. Shape rules never see a Dim: it reaches them as None (unknown).
    """

    __slots__ = ("axis", "var")

    def __init__(self, var: str, axis: int):
        self.var = var
        self.axis = axis

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and (self.var, self.axis) == (other.var, other.axis)

    def __hash__(self) -> int:
        return hash((type(self), self.var, self.axis))

    def __repr__(self) -> str:
        return f"{self.var}.shape[{self.axis}]"

    def _refuse(self, *_):
        raise ShapeError(
            f"{self!r} is only known at run time: a program computes with it by +, -, *, // and % with ints and "
            "other sizes, and it stands where an op takes a tensor, but it is no Python number (compared, divided "
            "by /, raised to a power, made an int or a float); use -1 in reshape, or an op that takes the shape "
            "from a tensor"
        )

    def _size_op(name: str, reflected: bool = False):
        def arithmetic(self, other):
            """``self <op> other`` computed in the program being traced, from shapes: a size ``Elem``."""
            from .interpreters import current_interpreter

            compute = getattr(current_interpreter(), "size_arithmetic", None)
            if compute is None or isinstance(other, (bool, float, complex, np.bool_, np.inexact)):
                self._refuse()
            if not isinstance(other, (int, np.integer, Dim)):
                return NotImplemented  # (a tensor: its own operator takes the size as a tensor)
            return compute(name, other, self) if reflected else compute(name, self, other)

        return arithmetic

    __add__, __radd__ = _size_op("add"), _size_op("add", True)
    __sub__, __rsub__ = _size_op("sub"), _size_op("sub", True)
    __mul__, __rmul__ = _size_op("mul"), _size_op("mul", True)
    __floordiv__, __rfloordiv__ = _size_op("floordiv"), _size_op("floordiv", True)
    __mod__, __rmod__ = _size_op("mod"), _size_op("mod", True)
    del _size_op

    def __neg__(self):
        return 0 - self

    __truediv__ = __rtruediv__ = __pow__ = __rpow__ = __float__ = _refuse
    __index__ = __int__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse


class Elem(Dim):
    """A size computed at run time: element ``axis`` of the int64 program variable ``var`` (a shape value, 1-d, or
    0-d with ``axis`` 0), negated when ``sign`` is -1. A program may compute shapes from shapes (ONNX's Shape →
    Gather → Concat → Reshape): an op's attr then reads them from such a variable, whose value the executor computes
    when it plans the run for the feeds' shapes. Like a Dim, it reaches shape rules as None."""

    __slots__ = ("sign",)

    def __init__(self, var: str, axis: int, sign: int = 1):
        super().__init__(var, axis)
        self.sign = sign

    def __eq__(self, other) -> bool:
        return super().__eq__(other) and self.sign == other.sign

    def __hash__(self) -> int:
        return hash((Elem, self.var, self.axis, self.sign))

    def __neg__(self) -> Elem:  # (a gradient rule negates pads: the adjoint of padding crops)
        return Elem(self.var, self.axis, -self.sign)

    def __repr__(self) -> str:
        return f"{'-' if self.sign < 0 else ''}{self.var}[{self.axis}]"


def undim(value):
    """``value`` with every Dim or Elem (also inside a tuple) replaced by None, for shape rules."""
    if isinstance(value, Dim):
        return None
    if isinstance(value, tuple) and any(isinstance(v, Dim) for v in value):
        return tuple(None if isinstance(v, Dim) else v for v in value)
    return value
