"""Making tensors: ``tensor`` from data, and ``zeros``/``ones``/``full``/``randn``/``rand``/``arange``,
each of which is a registered op (so a traced program records it too)."""

from __future__ import annotations

import numpy as np

from .core import dtypes as D
from .core.errors import ArgumentError, describe
from .core.random import manual_seed
from .tensor import Tensor


def as_array(data, dtype=None) -> np.ndarray:
    """Data -> a fresh array of a supported dtype. Python floats become float32, ints int64;
    NumPy arrays keep their dtype unless ``dtype`` says otherwise."""
    if isinstance(data, Tensor):
        data = data._data
    if isinstance(data, (np.ndarray, np.generic)):
        dt = D.as_dtype(data.dtype if dtype is None else dtype, arg="dtype")
        return np.array(data, dtype=dt)
    try:
        array = np.asarray(data)
    except (ValueError, TypeError) as e:
        raise ArgumentError(f"tensor(): cannot make a tensor from {describe(data)}: {e}") from None
    if dtype is not None:
        return np.array(array, dtype=D.as_dtype(dtype))
    if array.dtype.kind == "f":
        return array.astype(D.DEFAULT_FLOAT)
    if array.dtype.kind in "iu":
        return array.astype(D.DEFAULT_INT)
    if array.dtype.kind == "b":
        return array
    raise ArgumentError(f"tensor(): cannot make a tensor from {describe(data)} (dtype {array.dtype})")


def tensor(data, dtype=None, requires_grad: bool = False, device: str = "cpu") -> Tensor:
    """A new tensor holding a copy of ``data``."""
    return Tensor(data, dtype=dtype, requires_grad=requires_grad, device=device)


def _shape(shape: tuple) -> tuple:
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    return t.requires_grad_(True) if requires_grad else t


def zeros(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    return _finish(F.zeros(shape=_shape(shape), dtype=dtype), requires_grad)


def ones(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    return _finish(F.ones(shape=_shape(shape), dtype=dtype), requires_grad)


def full(shape, fill_value, dtype=None, requires_grad: bool = False) -> Tensor:
    if dtype is None:
        dtype = D.scalar_dtype(fill_value, None)
    return _finish(F.full(shape=shape, fill_value=float(fill_value), dtype=dtype), requires_grad)


def randn(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    """Standard normal samples from the generator seeded by ``manual_seed``."""
    return _finish(F.normal(shape=_shape(shape), dtype=dtype), requires_grad)


def rand(*shape, dtype=None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1) from the generator seeded by ``manual_seed``."""
    return _finish(F.uniform(shape=_shape(shape), dtype=dtype), requires_grad)


def arange(start, stop=None, step=1, dtype=None, requires_grad: bool = False) -> Tensor:
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, stop, step))
        dtype = D.DEFAULT_INT if ints else D.DEFAULT_FLOAT
    return _finish(F.arange(start=float(start), stop=float(stop), step=float(step), dtype=dtype), requires_grad)


__all__ = ["arange", "as_array", "full", "manual_seed", "ones", "rand", "randn", "tensor", "zeros"]

from . import ops as F  # noqa: E402  (creation ops are registered there)
