"""Making tensors: ``tensor`` from data, and ``zeros``/``ones``/``full``/``randn``/``rand``/``arange``,
each of which is a registered op (so a traced program records it too). ``device=`` says where the tensor is made
(the default device otherwise: "cpu", unless ``of.using_device`` says another)."""

from __future__ import annotations

import numpy as np

from . import ops as F
from .core import dtypes as D
from .core.devices import manual_seed, using_device
from .tensor import Tensor, as_array


def tensor(data, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """A new tensor holding a copy of ``data``."""
    return Tensor(data, dtype=dtype, requires_grad=requires_grad, device=device)


def _shape(shape: tuple) -> tuple:
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape


def _make(op, requires_grad: bool, device, **attrs) -> Tensor:
    if device is None:
        t = op(**attrs)
    else:
        with using_device(device):
            t = op(**attrs)
    return t.requires_grad_(True) if requires_grad else t


def zeros(*shape, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    return _make(F.zeros, requires_grad, device, shape=_shape(shape), dtype=dtype)


def ones(*shape, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    return _make(F.ones, requires_grad, device, shape=_shape(shape), dtype=dtype)


def full(shape, fill_value, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    if dtype is None:
        dtype = D.scalar_dtype(fill_value, None)
    return _make(F.full, requires_grad, device, shape=shape, fill_value=float(fill_value), dtype=dtype)


def randn(*shape, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """Standard normal samples from the generator seeded by ``manual_seed``."""
    return _make(F.normal, requires_grad, device, shape=_shape(shape), dtype=dtype)


def rand(*shape, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """Uniform samples in [0, 1) from the generator seeded by ``manual_seed``."""
    return _make(F.uniform, requires_grad, device, shape=_shape(shape), dtype=dtype)


def zeros_like(x, dtype=None, requires_grad: bool = False) -> Tensor:
    """Zeros of ``x``'s shape, dtype (unless ``dtype``) and device."""
    return _make(F.zeros_like, requires_grad, None, x=x, dtype=dtype)


def ones_like(x, dtype=None, requires_grad: bool = False) -> Tensor:
    return _make(F.ones_like, requires_grad, None, x=x, dtype=dtype)


def cat(tensors, *args, **kwargs) -> Tensor:
    """Join tensors along an existing dim, ``cat(tensors, dim=0)`` (``torch.cat``; the op is ``concat``)."""
    return F.concat(tensors, *args, **kwargs)


def stack(tensors, *args, **kwargs) -> Tensor:
    """Join tensors along a new dim, ``stack(tensors, dim=0)``."""
    return F.stack(tensors, *args, **kwargs)


def arange(start, stop=None, step=1, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, stop, step))
        dtype = D.DEFAULT_INT if ints else D.DEFAULT_FLOAT
    return _make(F.arange, requires_grad, device, start=float(start), stop=float(stop), step=float(step), dtype=dtype)


__all__ = ["arange", "as_array", "cat", "full", "manual_seed", "ones", "ones_like", "rand", "randn", "stack", "tensor",
           "zeros", "zeros_like"]
