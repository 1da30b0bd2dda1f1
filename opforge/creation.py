"""Making tensors: ``tensor`` from data, and ``zeros``/``ones``/``full``/``randn``/``rand``/``arange``,
each of which is a registered op (so a traced program records it too). ``device=`` says where the tensor is made
(the default device otherwise: "cpu", unless ``of.using_device`` says another)."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from . import ops as F
from .core import dtypes as D
from .core.devices import CPU, get_device, manual_seed, using_device
from .core.errors import ArgumentError, describe
from .core.spec import Dim
from .tensor import Tensor, as_array, wrap


def tensor(data, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """A new tensor holding a copy of ``data``."""
    return Tensor(data, dtype=dtype, requires_grad=requires_grad, device=device)


_DLPACK_CPU, _DLPACK_CUDA = 1, 2  # DLPack's device types (kDLCPU, kDLCUDA)


def from_dlpack(obj) -> Tensor:
    """A tensor sharing ``obj``'s memory, no copy: any DLPack producer (a torch tensor, a CuPy or NumPy array, a JAX
    array). GPU memory gives a tensor on "cuda", host memory one on "cpu"; ``torch.from_dlpack(t)`` and
    ``cupy.from_dlpack(t)`` take opforge's tensors the other way. A write through either side is seen by the other,
    and autograd does not see it (as in PyTorch)."""
    if not hasattr(obj, "__dlpack_device__"):
        raise ArgumentError(f"from_dlpack(): argument 'obj' expected an object with __dlpack__ and __dlpack_device__ "
                            f"(a torch tensor, a CuPy or NumPy array), got {describe(obj)}")
    kind = int(obj.__dlpack_device__()[0])
    if kind == _DLPACK_CPU:
        device, data = CPU, np.from_dlpack(obj)
    elif kind == _DLPACK_CUDA:
        device = get_device("cuda", "from_dlpack()")
        data = device.xp.from_dlpack(obj)
    else:
        raise ArgumentError(f"from_dlpack(): {describe(obj)} lives on DLPack device type {kind}; opforge reads host "
                            f"memory ({_DLPACK_CPU}) and CUDA memory ({_DLPACK_CUDA})")
    D.as_dtype(data.dtype, op="from_dlpack", arg="obj")  # a dtype opforge has, else a clear error
    return wrap(data, device)


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


def zeros_like(x, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """Zeros of ``x``'s shape, dtype (unless ``dtype``) and device (unless ``device``)."""
    t = _make(F.zeros_like, requires_grad, None, x=x, dtype=dtype)
    return t if device is None else t.to(device)


def ones_like(x, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    t = _make(F.ones_like, requires_grad, None, x=x, dtype=dtype)
    return t if device is None else t.to(device)


def _like(x, op, dtype, requires_grad, device, **attrs) -> Tensor:
    """``op`` (a creation op) in ``x``'s shape, and its dtype and device unless given (torch's ``*_like``)."""
    return _make(op, requires_grad, x.device if device is None else device, shape=list(x.shape),
                 dtype=x.dtype if dtype is None else dtype, **attrs)


def empty(*shape, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """``torch.empty``: here zeros (memory is never handed out uninitialised)."""
    return zeros(*shape, dtype=dtype, requires_grad=requires_grad, device=device)


def empty_like(x, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """``torch.empty_like``: here zeros."""
    return zeros_like(x, dtype=dtype, requires_grad=requires_grad, device=device)


def full_like(x, fill_value, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    return _like(x, F.full, dtype, requires_grad, device, fill_value=float(fill_value))


def randn_like(x, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """Standard normal samples in ``x``'s shape, dtype and device (unless given)."""
    return _like(x, F.normal, dtype, requires_grad, device)


def rand_like(x, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """Uniform samples in [0, 1) in ``x``'s shape, dtype and device (unless given)."""
    return _like(x, F.uniform, dtype, requires_grad, device)


def eye(n, m=None, *, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """The n×m identity matrix (m defaults to n), as ``torch.eye``."""
    return _make(F.eye, requires_grad, device, n=n, m=m, dtype=dtype)


def randint(low, high=None, size=None, *, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """``torch.randint(high, size)`` or ``randint(low, high, size)``: integers drawn uniformly from [low, high),
    int64 unless ``dtype`` says otherwise (floor of ``uniform`` samples drawn in float64)."""
    if size is None:
        low, high, size = 0, low, high
    if size is None or high is None:
        raise ArgumentError("randint(): takes (high, size) or (low, high, size), as torch's")
    if not high > low:
        raise ArgumentError(f"randint(): high ({high}) must be larger than low ({low})")
    with using_device(device) if device is not None else nullcontext():
        draws = F.floor(F.uniform(shape=_shape(tuple(size) if isinstance(size, (list, tuple)) else (size,)),
                                  low=float(low), high=float(high), dtype="float64"))
        t = F.cast(F.clip(draws, None, float(high - 1)), dtype=dtype or D.DEFAULT_INT)  # [low, high) even rounded
    return t.requires_grad_(True) if requires_grad else t


def randperm(n, *, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    """A random permutation of 0 .. n − 1 (int64 unless ``dtype``): the order that sorts ``n`` uniform samples."""
    with using_device(device) if device is not None else nullcontext():
        t = F.argsort(F.uniform(shape=[n], dtype="float64"), stable=True)
        if dtype is not None:
            t = F.cast(t, dtype=dtype)
    return t.requires_grad_(True) if requires_grad else t


def tril_indices(row, col, offset=0, *, dtype=None, device=None) -> Tensor:
    """``torch.tril_indices``: the op ``tril_indices``, on ``device`` (by default the default device)."""
    return _make(F.tril_indices, False, device, row=row, col=col, offset=offset, dtype=dtype)


def triu_indices(row, col, offset=0, *, dtype=None, device=None) -> Tensor:
    """``torch.triu_indices``: the op ``triu_indices``, on ``device`` (by default the default device)."""
    return _make(F.triu_indices, False, device, row=row, col=col, offset=offset, dtype=dtype)


def from_numpy(array) -> Tensor:
    """``torch.from_numpy``: a tensor sharing ``array``'s memory (writes to either are seen by both)."""
    if not isinstance(array, np.ndarray):
        raise ArgumentError(f"from_numpy(): expected a NumPy array, got {describe(array)}")
    D.as_dtype(array.dtype, op="from_numpy", arg="array")  # a dtype opforge supports
    return wrap(array, CPU)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """``torch.as_tensor``: ``data`` itself when it is a tensor of that dtype and device already, a tensor sharing
    a NumPy array's memory where it can, else a new tensor."""
    if isinstance(data, Tensor):
        return data.to(*(a for a in (device, dtype) if a is not None))
    if isinstance(data, np.ndarray) and device in (None, "cpu", CPU) and (dtype is None or np.dtype(
            D.as_dtype(dtype)) == data.dtype):
        return from_numpy(data)
    return Tensor(data, dtype=dtype, device=device)


def cat(tensors, *args, **kwargs) -> Tensor:
    """Join tensors along an existing dim, ``cat(tensors, dim=0)`` (``torch.cat``; the op is ``concat``)."""
    return F.concat(tensors, *args, **kwargs)


def stack(tensors, *args, **kwargs) -> Tensor:
    """Join tensors along a new dim, ``stack(tensors, dim=0)``."""
    return F.stack(tensors, *args, **kwargs)


def arange(start, stop=None, step=1, dtype=None, requires_grad: bool = False, device=None) -> Tensor:
    if stop is None:
        start, stop = 0, start
    if dtype is None:  # (a Dim, a size known only at run time in a program, is an int)
        ints = all(isinstance(v, (int, np.integer, Dim)) and not isinstance(v, bool) for v in (start, stop, step))
        dtype = D.DEFAULT_INT if ints else D.DEFAULT_FLOAT
    start, stop, step = (v if isinstance(v, Dim) else float(v) for v in (start, stop, step))
    return _make(F.arange, requires_grad, device, start=start, stop=stop, step=step, dtype=dtype)


__all__ = ["arange", "as_array", "as_tensor", "cat", "empty", "empty_like", "eye", "from_numpy", "full", "full_like",
           "manual_seed", "ones", "ones_like", "rand", "rand_like", "randint", "randn", "randn_like", "randperm",
           "stack", "tensor", "tril_indices", "triu_indices", "zeros", "zeros_like"]
