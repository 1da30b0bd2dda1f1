"""What op definitions share: the decorator, sample helpers and small shape helpers for infer rules."""

import math

import numpy as np

from ..core import dtypes as D
from ..core.declare import function, op
from ..core.devices import array_module
from ..core.errors import OpforgeError, ShapeError
from ..core.opdef import Sample
from ..core.sbp import B, P, S
from ..core.spec import Spec, broadcast_shapes, shapes_agree

try:  # NumPy's own handle on its ufunc settings (private: the fast way to change them for a with block)
    from numpy._core.umath import _extobj_contextvar, _make_extobj
except ImportError:  # a NumPy that moved them: the public functions below set the same settings, only slower
    _extobj_contextvar = _make_extobj = None

__all__ = ["B", "D", "P", "S", "Sample", "ShapeError", "Spec", "array_module", "broadcast_shapes", "called_as",
           "function", "normalize_axes", "np", "op", "promoted", "reduce_at", "shapes_agree"]


# The ufuncs of the hottest small kernels, bound once: a module attribute lookup is 20 ns of a 0.3–0.5 µs kernel on
# 16 elements (every tiny op of an eager chain is one of these), and so is passing out=None.
_add, _subtract, _multiply, _divide = np.add, np.subtract, np.multiply, np.true_divide
_maximum, _minimum = np.maximum, np.minimum


def promoted(*arrays, dtype=None) -> list:
    """The arrays in ``dtype``, by default their result dtype (``D.result_type``: PyTorch's promotion). A kernel that
    combines inputs of several dtypes calls it where they differ, since NumPy's own promotion is another (int64 with
    float32 is float64 there, and a 0-d float64 array upcasts a float32 one)."""
    dtype = D.result_type(*arrays) if dtype is None else dtype
    return [a if a.dtype == dtype else a.astype(dtype) for a in arrays]


def reduce_at(ufunc, out, where, values) -> None:
    """``ufunc.at(out, where, values)`` for multiply, maximum or minimum on any device: ``where`` an index array or a
    tuple of them for the first dims of ``out`` (C-contiguous), ``values`` shaped as the indices then the other
    dims. On a device (CuPy) ufunc.at is no answer: CuPy has no multiply.at, and its maximum.at on float64 gave
    float32-rounded values on a GPU (CuPy 14.2). There each place's values are combined by a segmented scan over
    the places sorted (log₂ n steps, no read of the device), and every write to a place then writes its result."""
    if type(out) is np.ndarray:
        ufunc.at(out, where, values)
        return
    xp = array_module(out)
    combine = getattr(xp, ufunc.__name__)
    where = where if isinstance(where, tuple) else (where,)
    k = len(where)
    shape = xp.broadcast_shapes(*(i.shape for i in where))
    row = math.prod(out.shape[k:])  # each place is a row of the dims the indices leave
    place = sum(xp.broadcast_to(i, shape) * math.prod(out.shape[d + 1:k]) for d, i in enumerate(where)).reshape(-1)
    order = xp.argsort(place)
    place, result = place[order], xp.broadcast_to(values, (*shape, *out.shape[k:])).reshape(-1, row)[order]
    step = 1
    while step < place.size:  # inclusive scan within runs of one place: the last of a run holds its result
        same = (place[step:] == place[:-step])[:, None]
        result = xp.concatenate([result[:step], xp.where(same, combine(result[step:], result[:-step]),
                                                          result[step:])])
        step *= 2
    step = 1
    while step < place.size:  # each element takes its run's last value, so that a place's writes agree
        same = (place[:-step] == place[step:])[:, None]
        result = xp.concatenate([xp.where(same, result[step:], result[:-step]), result[-step:]])
        step *= 2
    rows = out.reshape(-1, row)
    rows[place] = combine(rows[place], result)


def called_as(called: str, op_name: str, *args, **kwargs):
    """The op ``op_name`` called for the function ``called`` (torch's ``F.max_pool2d``, whose op is
    ``max_pool2d_values``): its result, or its error renamed to name what the user called (a message that begins
    "op_name(" begins "called(")."""
    from opforge import ops as F

    try:
        return getattr(F, op_name)(*args, **kwargs)
    except OpforgeError as e:
        message = str(e)
        if message.startswith(op_name + "("):
            e.args = (called + message[len(op_name):], *e.args[1:])
        raise


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


# -- row-wise helpers for kernels that reduce or broadcast along the last axis (softmax, the losses) ---------------
# Two costs of NumPy's (2.4) iterator that these kernels would otherwise pay, measured on 64×1000 and 128×10 float32
# (1 thread): a reduction along a short contiguous axis calls its inner loop once per row, ~40 ns each (np.max over
# rows of 10 takes 5.8 µs for 128 rows, 40 µs for 1,000; reduceat 1.5 and 4.2 µs through a transposed copy); and
# a ufunc broadcasting a (rows, 1) column over rows that fit twice in its buffer (8192 elements by default) copies
# both operands through that buffer: x − m takes 10 µs for 64×1000 where 5 µs do with a buffer under two rows.

def max_last(x):
    """max x over the last axis, kept as a size-1 dim (−inf for an empty axis). The same values as
    np.maximum.reduce (max is exact and propagates nan either way), without its per-row cost on many short rows."""
    width = x.shape[-1]
    if type(x) is not np.ndarray:  # a device's array: its own max (CuPy's ufuncs reduce with add and multiply only)
        return x.max(axis=-1, keepdims=True) if width else np.full_like(x, -np.inf, shape=(*x.shape[:-1], 1))
    rows = x.size // width if width else 0
    if rows < 16 or not x.flags.c_contiguous:
        return np.maximum.reduce(x, axis=-1, keepdims=True, initial=-np.inf)
    if width < 32:  # a contiguous copy with the rows as columns: one long inner loop per class
        m = np.maximum.reduce(np.ascontiguousarray(x.reshape(rows, width).T), axis=0)
    else:
        m = np.maximum.reduceat(x.reshape(-1), np.arange(0, x.size, width))
    return m.reshape(*x.shape[:-1], 1)


def max_over(x, axes: tuple):
    """max x over ``axes`` (normalised, sorted), kept as size-1 dims (−inf for an empty axis): max_last's route
    for the last axis alone."""
    if axes == (x.ndim - 1,):
        return max_last(x)
    if type(x) is np.ndarray:
        return np.maximum.reduce(x, axis=axes, keepdims=True, initial=-np.inf)
    if all(x.shape[a] for a in axes):  # a device's array, as in max_last
        return x.max(axis=axes, keepdims=True)
    return np.full_like(x, -np.inf, shape=tuple(1 if a in axes else d for a, d in enumerate(x.shape)))


def min_over(x, axes: tuple):
    """min x over ``axes`` (normalised, sorted), kept as size-1 dims (+inf for an empty axis)."""
    if type(x) is np.ndarray:
        return np.minimum.reduce(x, axis=axes, keepdims=True, initial=np.inf)
    return -max_over(-x, axes)  # a device's array (negation is exact)


_ROWS: dict = {}  # (value, length, dtype) -> a read-only row of that value


def constant_row(value, length: int, dtype):
    """A read-only row of ``length`` copies of ``value`` in ``dtype``, made once: what a kernel broadcasts or dots
    against where NumPy's own handling of a scalar would be slower (relu's zeros, a row sum's ones)."""
    key = (value, length, dtype)
    row = _ROWS.get(key)
    if row is None:
        if len(_ROWS) > 64:  # lengths that keep changing must not grow it without bound
            _ROWS.clear()
        row = _ROWS[key] = np.full(length, value, dtype)
        row.flags.writeable = False
    return row


def row_width(x, axes) -> int:
    """The elements of one group when ``axes`` are x's last axes and x is C-contiguous (a group is a row of memory,
    and a column of per-group values broadcasts over it: what row_buffers takes); else 0."""
    if len(axes) == 1 and axes[0] in (-1, x.ndim - 1) and x.ndim:  # the usual last axis, without the general test
        return x.shape[-1] if x.flags.c_contiguous else 0
    axes = tuple(a % x.ndim for a in axes) if x.ndim else ()
    if not axes or axes != tuple(range(x.ndim - len(axes), x.ndim)) or not x.flags.c_contiguous:
        return 0
    return math.prod(x.shape[a] for a in axes)


class _ufunc_settings:
    """A ``with`` block under other ufunc settings (the others, such as the user's ``np.errstate``, kept);
    subclasses say which in ``__init__``, leaving ``old`` None to change nothing. NumPy (2.0 on, as pyproject asks)
    keeps these settings as one object in a context variable, per thread and task: swapping that object costs
    0.2 µs, where np.setbufsize or np.seterr build it in Python (0.7 µs each way). Without that private handle
    (``_extobj_contextvar`` None) ``old`` holds the public context that was entered."""

    __slots__ = ("old",)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            if _extobj_contextvar is None:
                self.old.__exit__(*exc)
            else:
                _extobj_contextvar.reset(self.old)


class overflow_ignored(_ufunc_settings):
    """``with overflow_ignored():`` around a ufunc whose overflow the kernel detects and handles itself (a probe
    that is redone another way where it overflowed): no RuntimeWarning for the user."""

    __slots__ = ()

    def __init__(self):
        if _extobj_contextvar is None:
            self.old = np.errstate(over="ignore")
            self.old.__enter__()
        else:
            self.old = _extobj_contextvar.set(_make_extobj(over="ignore"))


class row_buffers(_ufunc_settings):
    """``with row_buffers(width):`` around ufuncs that broadcast a column over rows of ``width`` elements: a ufunc
    buffer shorter than two rows while the rows are long enough for it to matter (512 ≤ width ≤ 4096; from 4097
    NumPy's default buffer holds less than two rows already). Shorter rows, where buffering pays, keep NumPy's.
    Only speed depends on it."""

    __slots__ = ()

    def __init__(self, width: int):
        if not 512 <= width <= 4096:
            self.old = None
        elif _extobj_contextvar is None:
            self.old = _bufsize(-(-width // 16) * 16)
            self.old.__enter__()
        else:
            self.old = _extobj_contextvar.set(_make_extobj(bufsize=-(-width // 16) * 16))


class _bufsize:
    """np.setbufsize for a with block: row_buffers' public way."""

    def __init__(self, size: int):
        self.size, self.previous = size, None

    def __enter__(self):
        self.previous = np.setbufsize(self.size)

    def __exit__(self, *exc):
        np.setbufsize(self.previous)
