"""Pooling (1-, 2- and 3-D): max and average over sliding windows, and adaptive pooling to a given output size; one
n-d implementation behind thin op definitions.

Inputs are (N, C, *spatial) or (C, *spatial) unbatched; the window geometry (kernel, stride — by default the kernel
size —, padding, dilation, ``ceil_mode``) is PyTorch's and lives in ``_window.py``, with the batch-innermost memory
layout the kernels compute in. Each kernel is a loop over the window's taps, each tap one vectorized operation on
a strided view of the padded input: no window is ever copied out.

Max pooling: a window's gradient goes to its first maximum (row-major over the taps), or to its last NaN if it
holds any, as in PyTorch ("the maximum" below). max_pool → max_pool_grad (scatter dy to each window's maximum,
found again from x: the tap loop that finds it costs about what the forward costs) → max_pool_grad_grad (gather
at the maximum), the two being each other's transposes. The ``*_with_indices`` ops return the flat spatial index
of each maximum too (PyTorch's ``return_indices=True``); their gradient scatters dy at those indices
(pool_scatter, whose transpose is pool_gather), and so does adaptive max pooling's.

Average pooling: the window sum divided by the window size (``count_include_pad``: padding counts; positions past
the padding, which ``ceil_mode`` windows may reach, never count) or by ``divisor_override``; avg_pool and
avg_pool_grad are each other's transposes. Adaptive average pooling averages over PyTorch's adaptive windows
(output i of n → o covers ⌊i·n/o⌋ … ⌈(i+1)·n/o⌉ − 1), a linear map along each spatial dim: a matrix product per
dim, whose transpose is the gradient.
"""

import functools
import math

from opforge import ops as F

from . import _window as win
from ._common import D, S, Sample, ShapeError, Spec, array_module, called_as, function, np, op, shapes_agree

# -- geometry --------------------------------------------------------------------------------------------------------


def _check(nd, **attrs) -> None:
    win.check_lists(nd, attrs)


@functools.lru_cache(maxsize=1024)  # the same shapes come back every step
def _geometry(op_name, nd, shape, kernel_size, stride, padding, dilation=(1,), ceil_mode=False, batched_only=False):
    """Check a pooling op's input shape and attrs; return (batched, Windows)."""
    batched = win.spatial_rank(op_name, shape, nd, batched_only=batched_only)
    kernel = win.expand(kernel_size, nd)
    stride = kernel if stride is None else win.expand(stride, nd)
    w = win.pool_windows(op_name, shape[-nd:], kernel, stride, win.expand(padding, nd), win.expand(dilation, nd),
                         ceil_mode)
    return batched, w


def _batched(a, batched: bool):
    return a if batched else a[None]


def _unbatched(a, batched: bool):
    return a if batched else a[0]


def _flat_positions(w: win.Windows, tap, like) -> np.ndarray:
    """For one tap: the flat index, in the unpadded input's spatial dims, of what it reads at each output, shaped
    (1, *out, 1) to broadcast against a batch-last array; on the device of the array ``like``."""
    flat = np.zeros((), np.int64, like=like)
    for i, (t, o, s, d, lo, n) in enumerate(zip(tap, w.out, w.stride, w.dilation, w.lo, w.size)):
        shape = [1] * len(w.out)
        shape[i] = o
        flat = flat * n + (np.arange(o, like=like) * s + t * d - lo).reshape(shape)
    return flat.reshape(1, *w.out, 1)


# -- max pooling: NumPy on batch-last arrays (C, *spatial, N) -------------------------------------------------------


def _window_max(views, out=None):
    """The maximum of each window (a NaN wins, as NumPy's maximum keeps it), in ``out`` or a fresh batch-last
    array."""
    if out is None:
        out = views[0].copy()  # a batch-last view copies to a batch-last array
    else:
        np.copyto(out, views[0])
    for v in views[1:]:
        np.maximum(out, v, out=out)
    return out


def _first_maxima(views, y=None):
    """For each tap, the mask of the windows whose maximum it holds, as PyTorch assigns them: the first tap with
    the maximum value, or in a window holding a NaN the last NaN. ``y``: the maxima, if computed already."""
    if y is None:
        y = _window_max(views, win.scratch("max", views[0].shape, views[0].dtype, views[0]))
    hits = [v == y for v in views]
    nan = np.isnan(y)  # such a window's hits are all False so far (NaN equals nothing)
    any_nan = type(y) is not np.ndarray or nan.any()  # (a device's array takes the general path: no read)
    if not any_nan and sum(np.count_nonzero(h) for h in hits) == y.size:
        return hits  # one tap per window holds its maximum: no tie to break (the common case)
    if any_nan:
        for v, hit in zip(reversed(views), reversed(hits)):
            last_nan = np.isnan(v) & nan
            hit |= last_nan
            nan ^= last_nan
    free = array_module(y).ones(y.shape, bool)
    for hit in hits:
        hit &= free
        free ^= hit
    return hits


def _padded_views(x, w: win.Windows, value, name="pad"):
    """x padded (in scratch buffer ``name``) and the view of it each tap reads."""
    ap = win.pad(win.batch_last(x), w, value, name)
    return ap, [ap[index] for index in win.tap_slices(w)]


def _max_pool(x, w):
    return win.batch_first(_window_max(_padded_views(x, w, -np.inf)[1]))


def _max_pool_indices(x, w):
    _, views = _padded_views(x, w, -np.inf)
    y = _window_max(views)
    indices = np.zeros(y.shape, np.int64, like=y)
    for tap, hit in zip(np.ndindex(*w.kernel), _first_maxima(views, y)):
        indices += hit * _flat_positions(w, tap, y)
    return win.batch_first(y), win.batch_first(indices)


# -- max_pool{1,2,3}d_values and *_with_indices, and torch's functions max_pool{1,2,3}d choosing one ------------


def _max_pool_kernel(op_name, nd, x, kernel_size, stride, padding, dilation, ceil_mode, indices: bool):
    batched, w = _geometry(op_name, nd, x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    if indices:
        return tuple(_unbatched(a, batched) for a in _max_pool_indices(_batched(x, batched), w))
    return _unbatched(_max_pool(_batched(x, batched), w), batched)


def _max_pool_spec(op_name, nd, x, *, kernel_size, stride, padding, dilation, ceil_mode):
    _, w = _geometry(op_name, nd, x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    return Spec((*x.shape[:-nd], *w.out), x.dtype)


def _max_pool_indices_spec(op_name, nd, x, **attrs):
    y = _max_pool_spec(op_name, nd, x, **attrs)
    return y, Spec(y.shape, D.int64)


def _max_pool_rule(nd, x, dy, *, kernel_size, stride, padding, dilation, ceil_mode):
    batched = len(x.shape) == nd + 2
    if not batched:  # the grad ops take batches
        x, dy = F.unsqueeze(x, axis=0), F.unsqueeze(dy, axis=0)
    dx = F.max_pool_grad(x, dy, kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation,
                         ceil_mode=ceil_mode)
    return dx if batched else F.squeeze(dx, axis=[0])


def _scatter_rule(nd, indices, dy, x_spec):
    """The gradient of a max pooling that returned its indices: dy added at them (pool_scatter)."""
    batched = len(x_spec.shape) == nd + 2
    if not batched:
        indices, dy = F.unsqueeze(indices, axis=0), F.unsqueeze(dy, axis=0)
    dx = F.pool_scatter(dy, indices, input_size=x_spec.shape[-nd:])
    return dx if batched else F.squeeze(dx, axis=[0])


def _sbp(nd, x, *_, outputs=1, **__):
    yield (S(0),), (S(0),) * outputs if outputs > 1 else S(0)  # images (or, unbatched, channels)
    if len(x.shape) == nd + 2:
        yield (S(1),), (S(1),) * outputs if outputs > 1 else S(1)  # channels


def _max_pool_onnx(nd, g, x, *, kernel_size, stride, padding, dilation, ceil_mode):
    # the windows padded out with -inf here, as the kernel pads them: no reliance on ONNX's ceil_mode rules
    _, w = _geometry("", nd, x.shape, kernel_size, stride, padding, dilation, ceil_mode)

    def build(x, spec):
        return g.op("MaxPool", win.onnx_pad(g, x, w, -np.inf), kernel_shape=w.kernel, strides=w.stride,
                    dilations=w.dilation, spec=spec)

    return win.onnx_batched(g, x, nd, build)


def _max_pool_indices_onnx(nd, g, x, *, kernel_size, stride, padding, dilation, ceil_mode):
    # ONNX's MaxPool indices are flat over the whole (padded) tensor, PyTorch's over each unpadded image: the
    # position in the image is taken apart into coordinates, which lose the padding in front
    _, w = _geometry("", nd, x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    if None in x.shape[-nd:]:
        raise g.unsupported(f"max pooling's indices over spatial sizes {list(x.shape[-nd:])} known only at run time")
    i64 = np.dtype(np.int64)
    batched = x.ndim == nd + 2
    if not batched:
        x = g.op("Unsqueeze", x, g.ints([0]), spec=Spec((1, *x.shape), x.dtype))
    padded = [n + lo + hi for n, lo, hi in zip(x.shape[2:], w.lo, w.hi)]
    y, flat = g.op("MaxPool", win.onnx_pad(g, x, w, -np.inf), kernel_shape=w.kernel, strides=w.stride,
                   dilations=w.dilation, outputs=2)
    rest = g.op("Mod", flat, g.const(np.array(math.prod(padded), np.int64)), spec=Spec((), i64))
    index, unit = None, 1
    for size, lo, n in reversed(list(zip(padded, w.lo, x.shape[2:]))):
        size = g.const(np.array(size, np.int64))
        at = g.op("Sub", g.op("Mod", rest, size), g.const(np.array(lo, np.int64)))
        term = g.op("Mul", at, g.const(np.array(unit, np.int64))) if unit != 1 else at
        index = term if index is None else g.op("Add", index, term)
        rest, unit = g.op("Div", rest, size), unit * n
    if not batched:
        y, index = (g.op("Squeeze", v, g.ints([0])) for v in (y, index))
    return y, index


def _define_max_pool(opdef, nd, samples, indices: bool = False) -> None:
    opdef.check(functools.partial(_check, nd))
    opdef.infer(functools.partial(_max_pool_indices_spec if indices else _max_pool_spec, opdef.name, nd))
    opdef.grad(functools.partial(_scatter_rule if indices else _max_pool_rule, nd))
    opdef.sbp(functools.partial(_sbp, nd, outputs=2 if indices else 1))
    opdef.onnx(functools.partial(_max_pool_indices_onnx if indices else _max_pool_onnx, nd))
    opdef.samples(samples)


def _distinct(rng, *shape):
    """Values in [-2, 2) that are all different (no ties in any window: numeric gradients are well defined)."""
    size = int(np.prod(shape))
    return (rng.permutation(size).reshape(shape) + rng.uniform(0.1, 0.9, shape)) * (4.0 / size) - 2.0


def _randn(rng, *shape):
    return rng.standard_normal(shape)


def _max_pool1d_samples(rng):
    yield Sample.of(_distinct(rng, 2, 3, 7), kernel_size=2)
    yield Sample.of(_distinct(rng, 2, 2, 8), kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True)
    yield Sample.of(_distinct(rng, 2, 6), kernel_size=2, stride=1)  # unbatched, overlapping windows


def _max_pool2d_samples(rng):
    yield Sample.of(_distinct(rng, 2, 3, 6, 7), kernel_size=2)
    yield Sample.of(_distinct(rng, 2, 2, 7, 5), kernel_size=3, stride=2, padding=1)
    yield Sample.of(_distinct(rng, 1, 2, 5, 6), kernel_size=[3, 2], stride=[1, 2], padding=[1, 0], dilation=[1, 2],
                    ceil_mode=True)
    yield Sample.of(_distinct(rng, 2, 5, 5), kernel_size=2, ceil_mode=True)  # unbatched


def _max_pool3d_samples(rng):
    yield Sample.of(_distinct(rng, 1, 2, 4, 4, 3), kernel_size=2)
    yield Sample.of(_distinct(rng, 2, 3, 5, 4), kernel_size=[2, 3, 2], stride=[1, 2, 2], padding=[1, 1, 0],
                    ceil_mode=True)  # unbatched


_MAX_POOL_ATTRS = "int[] stride=None, int[] padding={0}, int[] dilation={1}, bool ceil_mode=False"


@op("max_pool1d_values(Tensor<floating> x, int[] kernel_size, " + _MAX_POOL_ATTRS.format("[0]", "[1]")
    + ") -> Tensor y")
def max_pool1d_values(x, *, kernel_size, stride, padding, dilation, ceil_mode):
    """The maximum of each window of x (N, C, L) — or (C, L) — windows ``stride`` apart (default: the kernel
    size), over x padded with -inf."""
    return _max_pool_kernel("max_pool1d_values", 1, x, kernel_size, stride, padding, dilation, ceil_mode, False)


_define_max_pool(max_pool1d_values, 1, _max_pool1d_samples)


@op("max_pool2d_values(Tensor<floating> x, int[] kernel_size, " + _MAX_POOL_ATTRS.format("[0, 0]", "[1, 1]")
    + ") -> Tensor y")
def max_pool2d_values(x, *, kernel_size, stride, padding, dilation, ceil_mode):
    """The maximum of each kH×kW window of x (N, C, H, W) — or (C, H, W) — windows ``stride`` apart (default: the
    kernel size), over x padded with -inf."""
    return _max_pool_kernel("max_pool2d_values", 2, x, kernel_size, stride, padding, dilation, ceil_mode, False)


_define_max_pool(max_pool2d_values, 2, _max_pool2d_samples)


@op("max_pool3d_values(Tensor<floating> x, int[] kernel_size, " + _MAX_POOL_ATTRS.format("[0, 0, 0]", "[1, 1, 1]")
    + ") -> Tensor y")
def max_pool3d_values(x, *, kernel_size, stride, padding, dilation, ceil_mode):
    """The maximum of each kD×kH×kW window of x (N, C, D, H, W) — or (C, D, H, W) — windows ``stride`` apart
    (default: the kernel size), over x padded with -inf."""
    return _max_pool_kernel("max_pool3d_values", 3, x, kernel_size, stride, padding, dilation, ceil_mode, False)


_define_max_pool(max_pool3d_values, 3, _max_pool3d_samples)


@op("max_pool1d_with_indices(Tensor<floating> x, int[] kernel_size, " + _MAX_POOL_ATTRS.format("[0]", "[1]")
    + ") -> (Tensor y, Tensor indices)")
def max_pool1d_with_indices(x, *, kernel_size, stride, padding, dilation, ceil_mode):
    """max_pool1d_values, and the index (int64, along L) of each window's maximum: PyTorch's
    ``max_pool1d(..., return_indices=True)``."""
    return _max_pool_kernel("max_pool1d_with_indices", 1, x, kernel_size, stride, padding, dilation, ceil_mode, True)


_define_max_pool(max_pool1d_with_indices, 1, _max_pool1d_samples, indices=True)


@op("max_pool2d_with_indices(Tensor<floating> x, int[] kernel_size, "
    + _MAX_POOL_ATTRS.format("[0, 0]", "[1, 1]") + ") -> (Tensor y, Tensor indices)")
def max_pool2d_with_indices(x, *, kernel_size, stride, padding, dilation, ceil_mode):
    """max_pool2d_values, and the flat index h·W + w (int64) of each window's maximum: PyTorch's
    ``max_pool2d(..., return_indices=True)``."""
    return _max_pool_kernel("max_pool2d_with_indices", 2, x, kernel_size, stride, padding, dilation, ceil_mode, True)


_define_max_pool(max_pool2d_with_indices, 2, _max_pool2d_samples, indices=True)


@op("max_pool3d_with_indices(Tensor<floating> x, int[] kernel_size, "
    + _MAX_POOL_ATTRS.format("[0, 0, 0]", "[1, 1, 1]") + ") -> (Tensor y, Tensor indices)")
def max_pool3d_with_indices(x, *, kernel_size, stride, padding, dilation, ceil_mode):
    """max_pool3d_values, and the flat index (d·H + h)·W + w (int64) of each window's maximum: PyTorch's
    ``max_pool3d(..., return_indices=True)``."""
    return _max_pool_kernel("max_pool3d_with_indices", 3, x, kernel_size, stride, padding, dilation, ceil_mode, True)


_define_max_pool(max_pool3d_with_indices, 3, _max_pool3d_samples, indices=True)


def _max_pool_function(nd: int):
    """torch's ``F.max_pool{nd}d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
    return_indices=False)``: the op ``max_pool{nd}d_values``, or ``max_pool{nd}d_with_indices`` for (values,
    indices)."""
    name = f"max_pool{nd}d"

    def pool(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        op_name = f"{name}_with_indices" if return_indices else f"{name}_values"
        return called_as(name, op_name, input, kernel_size, stride, padding, dilation, ceil_mode)

    pool.__name__ = pool.__qualname__ = name
    pool.__doc__ = (f"``torch.nn.functional.{name}(input, kernel_size, stride=None, padding=0, dilation=1, "
                    f"ceil_mode=False, return_indices=False)``: the op ``{name}_values``, or with ``return_indices`` "
                    f"``{name}_with_indices``, the named tuple (y, indices), indices flat over each (N, C) plane's "
                    f"positions as ``F.max_unpool{nd}d`` takes them.")
    return function(pool)


max_pool1d, max_pool2d, max_pool3d = (_max_pool_function(nd) for nd in (1, 2, 3))


# -- max pooling's gradient ops: n-d, batched ---------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _grad_geometry(op_name, x, other, kernel_size, stride, padding, dilation, ceil_mode, other_is_dy: bool):
    nd = len(x) - 2
    if not 1 <= nd <= 3:
        raise ShapeError(f"{op_name}(): x must have rank 3, 4 or 5 (N, C, *spatial), got shape {tuple(x)}")
    win.fit_rank(op_name, nd, kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation)
    _, w = _geometry(op_name, nd, x, kernel_size, stride, padding, dilation, ceil_mode, batched_only=True)
    win.check_dy(op_name, other, (*x[:2], *w.out) if other_is_dy else x)
    return w


@op("max_pool_grad(Tensor<floating> x, Tensor<floating> dy, *, int[] kernel_size, int[] stride=None, "
    "int[] padding=[0], int[] dilation=[1], bool ceil_mode=False) -> Tensor dx")
def max_pool_grad(x, dy, *, kernel_size, stride, padding, dilation, ceil_mode):
    """Gradient of max pooling (1-, 2- or 3-D, by x's rank): each window's dy goes to the window's maximum
    of x; overlapping windows add up."""
    w = _grad_geometry("max_pool_grad", x.shape, dy.shape, kernel_size, stride, padding, dilation, ceil_mode, True)
    ap, views = _padded_views(x, w, -np.inf)
    hits = _first_maxima(views)
    dy = win.batch_last_array(dy, "dy").astype(np.result_type(x, dy), copy=False)
    dxp = np.zeros(ap.shape, dy.dtype, like=dy)
    for index, hit in zip(win.tap_slices(w), hits):
        if w.disjoint:  # every position lies in one window at most: write, do not add
            np.multiply(dy, hit, out=dxp[index])
        else:
            dxp[index] += dy * hit
    return win.batch_first(win.interior(dxp, w))


max_pool_grad.check(functools.partial(_check, None))
max_pool_grad.sbp(lambda x, dy, **_: [((S(0), S(0)), S(0)), ((S(1), S(1)), S(1))])  # images or channels


@max_pool_grad.infer
def _(x, dy, *, kernel_size, stride, padding, dilation, ceil_mode):
    _grad_geometry("max_pool_grad", x.shape, dy.shape, kernel_size, stride, padding, dilation, ceil_mode, True)
    return Spec(x.shape, D.promote(x.dtype, dy.dtype))


@max_pool_grad.grad
def _(x, ddx, *, kernel_size, stride, padding, dilation, ceil_mode):
    # dx is piecewise constant in x (the argmax only moves at ties) and linear in dy; its transpose in dy gathers
    # ddx at each window's maximum.
    return None, F.max_pool_grad_grad(x, ddx, kernel_size=kernel_size, stride=stride, padding=padding,
                                      dilation=dilation, ceil_mode=ceil_mode)


@max_pool_grad.samples
def _(rng):
    yield Sample.of(_distinct(rng, 2, 3, 6, 7), _randn(rng, 2, 3, 3, 3), kernel_size=2)
    yield Sample.of(_distinct(rng, 2, 2, 7, 5), _randn(rng, 2, 2, 4, 3), kernel_size=3, stride=2, padding=1)
    yield Sample.of(_distinct(rng, 2, 2, 8), _randn(rng, 2, 2, 4), kernel_size=3, stride=2, padding=1, dilation=2,
                    ceil_mode=True)


@op("max_pool_grad_grad(Tensor<floating> x, Tensor<floating> ddx, *, int[] kernel_size, int[] stride=None, "
    "int[] padding=[0], int[] dilation=[1], bool ceil_mode=False) -> Tensor ddy")
def max_pool_grad_grad(x, ddx, *, kernel_size, stride, padding, dilation, ceil_mode):
    """Gradient of max_pool_grad with respect to dy (TensorFlow's MaxPoolGradGrad): ddx, an input-shaped tensor,
    read at each window's maximum of x."""
    w = _grad_geometry("max_pool_grad_grad", x.shape, ddx.shape, kernel_size, stride, padding, dilation, ceil_mode,
                       False)
    _, views = _padded_views(x, w, -np.inf)
    hits = _first_maxima(views)
    _, dd_views = _padded_views(ddx.astype(np.result_type(x, ddx), copy=False), w, 0.0, "pad2")
    ddy = np.zeros(hits[0].shape, dd_views[0].dtype, like=dd_views[0])
    for v, hit in zip(dd_views, hits):
        ddy += v * hit
    return win.batch_first(ddy)


max_pool_grad_grad.check(functools.partial(_check, None))
max_pool_grad_grad.sbp(lambda x, ddx, **_: [((S(0), S(0)), S(0)), ((S(1), S(1)), S(1))])


@max_pool_grad_grad.infer
def _(x, ddx, *, kernel_size, stride, padding, dilation, ceil_mode):
    w = _grad_geometry("max_pool_grad_grad", x.shape, ddx.shape, kernel_size, stride, padding, dilation, ceil_mode,
                       False)
    return Spec((*x.shape[:2], *w.out), D.promote(x.dtype, ddx.dtype))


@max_pool_grad_grad.grad
def _(x, dddy, *, kernel_size, stride, padding, dilation, ceil_mode):
    # gathering at the maximum is the transpose of scattering there; constant in x away from ties
    return None, F.max_pool_grad(x, dddy, kernel_size=kernel_size, stride=stride, padding=padding,
                                 dilation=dilation, ceil_mode=ceil_mode)


@max_pool_grad_grad.samples
def _(rng):
    yield Sample.of(_distinct(rng, 2, 3, 6, 7), _randn(rng, 2, 3, 6, 7), kernel_size=2)
    yield Sample.of(_distinct(rng, 2, 2, 7, 5), _randn(rng, 2, 2, 7, 5), kernel_size=3, stride=2, padding=1)
    yield Sample.of(_distinct(rng, 1, 2, 3, 4, 3), _randn(rng, 1, 2, 3, 4, 3), kernel_size=2, ceil_mode=True)


# -- scatter to and gather at flat spatial indices: the gradients of pooling that returned its indices ---------------


def _index_geometry(op_name, indices, x, input_size=None) -> tuple:
    """Check (N, C, *out) indices against x (N, C, *spatial) or the input size; return the spatial size."""
    size = tuple(x[2:]) if input_size is None else tuple(input_size)
    if len(indices) < 3 or (x is not None and (len(x) < 3 or any(
            a is not None and b is not None and a != b for a, b in zip(indices[:2], x[:2])))):
        shapes = f"indices {tuple(indices)}" + ("" if x is None else f" and x {tuple(x)}")
        raise ShapeError(f"{op_name}(): indices must be (N, C, *out) and x (N, C, *spatial) with the same N and C, "
                         f"got {shapes}")
    return size


def _flat_index(op_name, indices, size):
    """The indices as (N·C, m) positions into (N·C, ∏size), checked."""
    count = math.prod(size)
    if indices.size and (indices.min() < 0 or indices.max() >= count):
        raise ShapeError(f"{op_name}(): indices must lie in [0, {count}) (flat over the spatial size {tuple(size)}), "
                         f"got values in [{indices.min()}, {indices.max()}]")
    n, c = indices.shape[:2]
    return indices.reshape(n * c, -1)


@op("pool_scatter(Tensor<floating> dy, nograd Tensor<int64> indices, *, int[] input_size) -> Tensor dx")
def pool_scatter(dy, indices, *, input_size):
    """Zeros (N, C, *input_size) to which each dy value is added at the flat spatial index ``indices`` holds for
    it (as ``max_pool*_with_indices`` return them): the gradient of pooling with indices. Repeats add up."""
    size = _index_geometry("pool_scatter", indices.shape, None, input_size)
    win.check_dy("pool_scatter", dy.shape, indices.shape)
    flat = _flat_index("pool_scatter", indices, size)
    rows, count = flat.shape[0], math.prod(size)
    keys = (flat + np.arange(rows, like=flat)[:, None] * count).ravel()
    dx = np.bincount(keys, weights=dy.reshape(rows, -1).ravel(), minlength=rows * count)  # sums in float64
    return dx.astype(dy.dtype, copy=False).reshape(*dy.shape[:2], *size)


pool_scatter.check(functools.partial(_check, None))


@pool_scatter.infer
def _(dy, indices, *, input_size):
    size = _index_geometry("pool_scatter", indices.shape, None, input_size)
    win.check_dy("pool_scatter", dy.shape, indices.shape)
    return Spec((*dy.shape[:2], *size), dy.dtype)


@pool_scatter.onnx
def _(g, dy, indices, *, input_size):
    # per image and channel, each dy added at its flat spatial index: ScatterElements over (N, C, ∏size)
    flat = [0, 0, -1]
    zeros = g.filled(g.op("Concat", g.op("Shape", dy, start=0, end=2), g.ints([math.prod(input_size)]), axis=0), 0,
                     dy.dtype)
    dx = g.op("ScatterElements", zeros, g.op("Reshape", indices, g.ints(flat)), g.op("Reshape", dy, g.ints(flat)),
              axis=2, reduction="add")
    return g.op("Reshape", dx, g.op("Concat", g.op("Shape", dy, start=0, end=2), g.ints(input_size), axis=0),
                spec=g.outputs[0])


@pool_scatter.grad
def _(indices, ddx):
    return F.pool_gather(ddx, indices), None


def _index_samples(rng, size, out):
    """Flat indices into ``size`` for (2, 2, *out) outputs, some repeated."""
    return rng.integers(0, math.prod(size), (2, 2, *out))


@pool_scatter.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 2, 2, 3), _index_samples(rng, (3, 4), (2, 3)), input_size=[3, 4])
    yield Sample.of(_randn(rng, 2, 2, 5), _index_samples(rng, (4,), (5,)), input_size=[4])


@op("pool_gather(Tensor<floating> x, nograd Tensor<int64> indices) -> Tensor y")
def pool_gather(x, indices):
    """x (N, C, *spatial) read at the flat spatial indices ``indices`` (N, C, *out) holds: the transpose of
    pool_scatter."""
    size = _index_geometry("pool_gather", indices.shape, x.shape)
    flat = _flat_index("pool_gather", indices, size)
    return np.take_along_axis(x.reshape(flat.shape[0], -1), flat, axis=1).reshape(indices.shape)


@pool_gather.infer
def _(x, indices):
    _index_geometry("pool_gather", indices.shape, x.shape)
    return Spec(tuple(indices.shape), x.dtype)


@pool_gather.onnx
def _(g, x, indices):
    flat = g.ints([0, 0, -1])
    y = g.op("GatherElements", g.op("Reshape", x, flat), g.op("Reshape", indices, flat), axis=2)
    return g.op("Reshape", y, g.op("Shape", indices), spec=g.outputs[0])


@pool_gather.grad
def _(indices, dy, x_spec):
    return F.pool_scatter(dy, indices, input_size=x_spec.shape[2:]), None


@pool_gather.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 2, 3, 4), _index_samples(rng, (3, 4), (2, 3)))
    yield Sample.of(_randn(rng, 2, 2, 4), _index_samples(rng, (4,), (5,)))


# -- max_unpool: the (partial) inverse of max pooling ------------------------------------------------------------------


def _unpool_geometry(x, indices, output_size) -> tuple:
    if not shapes_agree(x, indices) or len(x) < 3:
        raise ShapeError(f"max_unpool(): x and indices must have one shape (N, C, *in), got {tuple(x)} and "
                         f"{tuple(indices)}")
    return _index_geometry("max_unpool", indices, None, output_size)


@op("max_unpool(Tensor<floating> x, nograd Tensor<int64> indices, *, int[] output_size) -> Tensor y")
def max_unpool(x, indices, *, output_size, xp=np):
    """Zeros (N, C, *output_size) in which each value of x (N, C, *in) is written at the flat spatial index that
    ``indices`` (as ``max_pool*_with_indices`` return them) holds for it; of two values for one place the later
    stays, as in torch's CPU kernel. The gradient reads dy at the indices (pool_gather), as torch's."""
    size = _unpool_geometry(x.shape, indices.shape, output_size)
    flat = _flat_index("max_unpool", indices, size)
    rows = xp.arange(flat.shape[0])[:, None]
    if xp is np:  # NumPy's assignment keeps the last of repeated places
        y = np.zeros((flat.shape[0], math.prod(size)), x.dtype)
        y[rows, flat] = x.reshape(flat.shape)
        return y.reshape(*x.shape[:2], *size)
    # CuPy's leaves the order of repeated writes open: each place takes the value of the latest position sent there
    latest = xp.full((flat.shape[0], math.prod(size)), -1, np.int64)
    xp.maximum.at(latest, (rows, flat), xp.broadcast_to(xp.arange(flat.shape[1]), flat.shape))
    y = xp.take_along_axis(x.reshape(flat.shape), xp.maximum(latest, 0), axis=1) if flat.shape[1] else latest * 0
    return xp.where(latest >= 0, y, x.dtype.type(0)).astype(x.dtype, copy=False).reshape(*x.shape[:2], *size)


max_unpool.check(functools.partial(_check, None))


@max_unpool.infer
def _(x, indices, *, output_size):
    size = _unpool_geometry(x.shape, indices.shape, output_size)
    return Spec((*x.shape[:2], *size), x.dtype)


@max_unpool.grad
def _(indices, dy):
    return F.pool_gather(dy, indices), None


@max_unpool.samples
def _(rng):
    def distinct(size, out):  # each plane's indices all different: every value lands in the output
        return np.stack([rng.permutation(math.prod(size))[:math.prod(out)].reshape(out) for _ in range(4)]).reshape(
            2, 2, *out)
    yield Sample.of(_randn(rng, 2, 2, 2, 3), distinct((4, 6), (2, 3)), output_size=[4, 6])
    yield Sample.of(_randn(rng, 2, 2, 3), distinct((7,), (3,)), output_size=[7])


@max_unpool.onnx
def _(g, x, indices, *, output_size):
    # each (n, c) plane flattened: x's values scattered into zeros at their indices (ONNX's MaxUnpool reads indices
    # over the whole tensor, ours are per plane)
    planes = g.op("Concat", g.op("Shape", x, end=2), g.ints([math.prod(output_size)]), axis=0)
    zeros = g.filled(planes, 0, x.dtype)
    flat = [g.op("Reshape", v, g.ints([0, 0, -1])) for v in (indices, x)]
    y = g.op("ScatterElements", zeros, *flat, axis=2)
    return g.op("Reshape", y, g.ints([0, 0, *output_size]), spec=g.outputs[0])


def _sizes(name: str, arg: str, value, nd: int) -> tuple:
    """A function's int-or-ints argument as nd ints (a lone int repeats), or an error naming the function."""
    values = (value,) if isinstance(value, (int, np.integer)) else tuple(value) if isinstance(value, (tuple, list)) \
        else None
    if values is None or len(values) not in (1, nd) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise ShapeError(f"{name}(): argument '{arg}' must be an int or {nd} ints, got {value!r}")
    return tuple(int(v) for v in values) * (nd if len(values) == 1 else 1)


def _unpool_function(nd: int):
    name = f"max_unpool{nd}d"

    def unpool(input, indices, kernel_size, stride=None, padding=0, output_size=None):
        kernel = _sizes(name, "kernel_size", kernel_size, nd)
        stride = kernel if stride is None else _sizes(name, "stride", stride, nd)
        padding = _sizes(name, "padding", padding, nd)
        if len(input.shape) not in (nd + 1, nd + 2):
            raise ShapeError(f"{name}(): input must be (N, C, *{nd} dims) or (C, *{nd} dims), got shape "
                             f"{tuple(input.shape)}")
        spatial = tuple(input.shape[-nd:])
        default = [(n - 1) * s + k - 2 * p for n, s, k, p in zip(spatial, stride, kernel, padding)]
        if output_size is None:
            size = default
        else:  # torch's rule: the last nd sizes given, each less than a stride away from the default
            size = list(output_size)[-nd:] if len(output_size) in (nd + 1, nd + 2) else list(output_size)
            if len(size) != nd or any(not d - s < o < d + s for o, d, s in zip(size, default, stride)):
                raise ShapeError(f"{name}(): output_size {list(output_size)} must be {nd} sizes, each within a stride "
                                 f"{list(stride)} of the default {default}")
        batched = len(input.shape) == nd + 2
        if not batched:
            input, indices = F.unsqueeze(input, axis=0), F.unsqueeze(indices, axis=0)
        y = F.max_unpool(input, indices, output_size=size)
        return y if batched else F.squeeze(y, axis=[0])

    unpool.__name__ = unpool.__qualname__ = name
    unpool.__doc__ = (f"``torch.nn.functional.{name}``: ``max_unpool`` into the size max_pool{nd}d's input had, "
                      "(in − 1)·stride + kernel_size − 2·padding per dim, or ``output_size`` (within a stride of "
                      "it, as torch checks); an unbatched input (C, ...) too.")
    return function(unpool)


max_unpool1d, max_unpool2d, max_unpool3d = (_unpool_function(nd) for nd in (1, 2, 3))


# -- average pooling -------------------------------------------------------------------------------------------------


def _divisor(w: win.Windows, count_include_pad: bool, divisor_override, dtype, like=None):
    """What each window's sum is divided by: a number, or an array (1, *out, 1) of ``dtype`` where window sizes
    differ (on the device of the array ``like``, if given)."""
    if divisor_override is not None:
        return divisor_override
    counts = []
    for n, k, s, p, o in zip(w.size, w.kernel, w.stride, w.lo, w.out):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        counts.append(end - start if count_include_pad else np.minimum(end, n) - np.maximum(start, 0))
    if all((c == c[0]).all() for c in counts):
        return math.prod(int(c[0]) for c in counts)
    grid = functools.reduce(np.multiply.outer, counts)
    return np.asarray(grid.reshape(1, *w.out, 1), dtype, like=like)


def _avg_pool(x, w, count_include_pad, divisor_override):
    _, views = _padded_views(x, w, 0.0)
    y = views[0].copy()
    for v in views[1:]:
        y += v
    np.divide(y, _divisor(w, count_include_pad, divisor_override, y.dtype, like=y), out=y)
    return win.batch_first(y)


def _avg_pool_kernel(op_name, nd, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    batched, w = _geometry(op_name, nd, x.shape, kernel_size, stride, padding, ceil_mode=ceil_mode)
    return _unbatched(_avg_pool(_batched(x, batched), w, count_include_pad, divisor_override), batched)


def _avg_pool_spec(op_name, nd, x, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    _, w = _geometry(op_name, nd, x.shape, kernel_size, stride, padding, ceil_mode=ceil_mode)
    return Spec((*x.shape[:-nd], *w.out), x.dtype)


def _avg_pool_rule(nd, dy, x_spec, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    batched = len(x_spec.shape) == nd + 2
    dx = F.avg_pool_grad(dy if batched else F.unsqueeze(dy, axis=0), input_size=x_spec.shape[-nd:],
                         kernel_size=kernel_size, stride=stride, padding=padding, ceil_mode=ceil_mode,
                         count_include_pad=count_include_pad, divisor_override=divisor_override)
    return dx if batched else F.squeeze(dx, axis=[0])


def _avg_pool_onnx(nd, g, x, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    # window sums (an AveragePool of the explicitly zero-padded input, times the window size) divided as the kernel
    # divides them: ONNX's own padding, ceil_mode and count rules are not PyTorch's in every case
    _, w = _geometry("", nd, x.shape, kernel_size, stride, padding, ceil_mode=ceil_mode)
    if None in w.size:
        raise g.unsupported("average pooling of spatial sizes known only at run time")
    divisor = _divisor(w, count_include_pad, divisor_override, x.dtype)
    scale = np.asarray(w.taps / (divisor if np.isscalar(divisor) else divisor[..., 0]), x.dtype)

    def build(x, spec):
        mean = g.op("AveragePool", win.onnx_pad(g, x, w, 0.0), kernel_shape=w.kernel, strides=w.stride, spec=spec)
        return g.op("Mul", mean, g.const(scale), spec=spec)

    return win.onnx_batched(g, x, nd, build)


def _define_avg_pool(opdef, nd, samples) -> None:
    opdef.check(functools.partial(_check, nd))
    opdef.infer(functools.partial(_avg_pool_spec, opdef.name, nd))
    opdef.grad(functools.partial(_avg_pool_rule, nd))
    opdef.onnx(functools.partial(_avg_pool_onnx, nd))
    opdef.sbp(functools.partial(_sbp, nd))
    opdef.samples(samples)


_AVG_POOL_ATTRS = ("int[] stride=None, int[] padding={0}, bool ceil_mode=False, bool count_include_pad=True, "
                   "int? divisor_override=None")


@op("avg_pool1d(Tensor<floating> x, int[] kernel_size, " + _AVG_POOL_ATTRS.format("[0]") + ") -> Tensor y")
def avg_pool1d(x, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """The mean of each window of x (N, C, L) — or (C, L) — windows ``stride`` apart (default: the kernel size),
    over x padded with zeros that count in the mean unless ``count_include_pad`` is False; ``divisor_override``
    replaces the window size."""
    return _avg_pool_kernel("avg_pool1d", 1, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                            divisor_override)


_define_avg_pool(avg_pool1d, 1, lambda rng: [
    Sample.of(_randn(rng, 2, 3, 7), kernel_size=2),
    Sample.of(_randn(rng, 2, 2, 8), kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    Sample.of(_randn(rng, 2, 6), kernel_size=3, stride=1, padding=1, divisor_override=2),  # unbatched
])


@op("avg_pool2d(Tensor<floating> x, int[] kernel_size, " + _AVG_POOL_ATTRS.format("[0, 0]") + ") -> Tensor y")
def avg_pool2d(x, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """The mean of each kH×kW window of x (N, C, H, W) — or (C, H, W) — windows ``stride`` apart (default: the
    kernel size), over x padded with zeros that count in the mean unless ``count_include_pad`` is False;
    ``divisor_override`` replaces the window size."""
    return _avg_pool_kernel("avg_pool2d", 2, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                            divisor_override)


_define_avg_pool(avg_pool2d, 2, lambda rng: [
    Sample.of(_randn(rng, 2, 3, 6, 7), kernel_size=2),
    Sample.of(_randn(rng, 2, 2, 7, 5), kernel_size=3, stride=2, padding=1),
    Sample.of(_randn(rng, 2, 2, 5, 6), kernel_size=[3, 2], stride=[2, 1], padding=[1, 0], ceil_mode=True,
              count_include_pad=False),
    Sample.of(_randn(rng, 2, 5, 5), kernel_size=2, ceil_mode=True, divisor_override=3),  # unbatched
])


@op("avg_pool3d(Tensor<floating> x, int[] kernel_size, " + _AVG_POOL_ATTRS.format("[0, 0, 0]") + ") -> Tensor y")
def avg_pool3d(x, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """The mean of each kD×kH×kW window of x (N, C, D, H, W) — or (C, D, H, W) — windows ``stride`` apart (default:
    the kernel size), over x padded with zeros that count in the mean unless ``count_include_pad`` is False;
    ``divisor_override`` replaces the window size."""
    return _avg_pool_kernel("avg_pool3d", 3, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                            divisor_override)


_define_avg_pool(avg_pool3d, 3, lambda rng: [
    Sample.of(_randn(rng, 1, 2, 4, 4, 3), kernel_size=2),
    Sample.of(_randn(rng, 2, 3, 5, 4), kernel_size=[2, 3, 2], stride=[1, 2, 2], padding=[1, 1, 0], ceil_mode=True,
              count_include_pad=False),  # unbatched
])


def _avg_pool_grad_spec(dy, input_size, kernel_size, stride, padding, ceil_mode):
    """The input Spec avg_pool_grad returns and its Windows, after checking dy against the forward geometry."""
    nd = len(dy.shape) - 2
    if not 1 <= nd <= 3:
        raise ShapeError(f"avg_pool_grad(): dy must have rank 3, 4 or 5 (N, C, *out), got shape {dy.shape}")
    win.fit_rank("avg_pool_grad", nd, input_size=input_size, kernel_size=kernel_size, stride=stride, padding=padding)
    x = (*dy.shape[:2], *win.expand(input_size, nd))
    _, w = _geometry("avg_pool_grad", nd, x, kernel_size, stride, padding, ceil_mode=ceil_mode, batched_only=True)
    win.check_dy("avg_pool_grad", dy.shape, (*x[:2], *w.out))
    return Spec(x, dy.dtype), w


@op("avg_pool_grad(Tensor<floating> dy, *, int[] input_size, int[] kernel_size, int[] stride=None, "
    "int[] padding=[0], bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor dx")
def avg_pool_grad(dy, *, input_size, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """Gradient of average pooling (1-, 2- or 3-D, by dy's rank) for an input of spatial size ``input_size``:
    each window's dy divided as its sum was and spread over the window; overlapping windows add up."""
    _, w = _avg_pool_grad_spec(Spec(dy.shape, dy.dtype), input_size, kernel_size, stride, padding, ceil_mode)
    share = win.batch_last(dy) / _divisor(w, count_include_pad, divisor_override, dy.dtype, like=dy)
    dxp = np.zeros((share.shape[0], *w.padded, share.shape[-1]), dy.dtype, like=dy)
    for index in win.tap_slices(w):
        dxp[index] += share
    return win.batch_first(win.interior(dxp, w))


avg_pool_grad.check(functools.partial(_check, None))
avg_pool_grad.sbp(lambda dy, **_: [((S(0),), S(0)), ((S(1),), S(1))])


@avg_pool_grad.infer
def _(dy, *, input_size, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_grad_spec(dy, input_size, kernel_size, stride, padding, ceil_mode)[0]


@avg_pool_grad.grad
def _(ddx, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[len(ddx.shape) - 3]
    return pool(ddx, kernel_size=kernel_size, stride=stride, padding=padding, ceil_mode=ceil_mode,
                count_include_pad=count_include_pad, divisor_override=divisor_override)  # the transpose's transpose


@avg_pool_grad.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 3, 3, 3), input_size=[6, 7], kernel_size=2)
    yield Sample.of(_randn(rng, 2, 2, 4, 3), input_size=[7, 5], kernel_size=3, stride=2, padding=1)
    yield Sample.of(_randn(rng, 2, 2, 5), input_size=[8], kernel_size=3, stride=2, padding=1, ceil_mode=True,
                    count_include_pad=False)
    yield Sample.of(_randn(rng, 1, 2, 2, 2, 2), input_size=[4, 4, 5], kernel_size=2, divisor_override=3)


# -- adaptive pooling ------------------------------------------------------------------------------------------------


def _adaptive_bounds(n: int, o: int):
    """PyTorch's adaptive windows of n inputs for o outputs: output i covers [⌊i·n/o⌋, ⌈(i+1)·n/o⌉)."""
    i = np.arange(o)
    return i * n // o, -(-(i + 1) * n // o)


def _averaging(n: int, o: int) -> np.ndarray:
    """The (o, n) matrix that averages each adaptive window."""
    start, end = _adaptive_bounds(n, o)
    j = np.arange(n)
    inside = (j >= start[:, None]) & (j < end[:, None])
    return inside / (end - start)[:, None]


def _along_spatial(a, matrices):
    """a (N, C, *spatial) with matrix d (m, n_d) applied along spatial dim d: (N, C, *m)."""
    for d, m in enumerate(matrices):  # (host matrices, from the geometry: copied to a's device)
        a = np.moveaxis(np.matmul(np.asarray(m, a.dtype, like=a), np.moveaxis(a, 2 + d, -2)), -2, 2 + d)
    return a


def _adaptive_geometry(op_name, nd, shape, output_size, batched_only=False) -> tuple:
    batched = win.spatial_rank(op_name, shape, nd, batched_only=batched_only)
    return batched, win.expand(output_size, nd)


def _check_output_size(nd, *, output_size):
    win.check_lists(nd, {"output_size": output_size})


def _adaptive_avg_pool(op_name, nd, x, output_size):
    batched, out = _adaptive_geometry(op_name, nd, x.shape, output_size)
    x = _batched(x, batched)
    y = _along_spatial(x, [_averaging(n, o) for n, o in zip(x.shape[2:], out)])
    return _unbatched(y, batched)


def _adaptive_spec(op_name, nd, x, *, output_size):
    _, out = _adaptive_geometry(op_name, nd, x.shape, output_size)
    return Spec((*x.shape[:-nd], *out), x.dtype)


def _adaptive_avg_rule(nd, dy, x_spec):
    batched = len(x_spec.shape) == nd + 2
    dx = F.adaptive_avg_pool_grad(dy if batched else F.unsqueeze(dy, axis=0), input_size=x_spec.shape[-nd:])
    return dx if batched else F.squeeze(dx, axis=[0])


def _adaptive_onnx_dims(g, x, nd, output_size):
    """([(axis, input size, output size)] of the spatial dims pooled in windows, [the axes pooled whole (output
    size 1)]); a dim of a size known only at run time can only be pooled whole."""
    dims, whole = [], []
    for d, (n, o) in enumerate(zip(x.shape[-nd:], win.expand(output_size, nd))):
        if o == 1:
            whole.append(x.ndim - nd + d)
        elif n is None:
            raise g.unsupported(f"adaptive pooling to {o} over spatial dim {d}, of a size known only at run time "
                                "(output size 1, global pooling, is written then)")
        else:
            dims.append((x.ndim - nd + d, n, o))
    return dims, whole


def _adaptive_avg_onnx(nd, g, x, *, output_size):
    dims, whole = _adaptive_onnx_dims(g, x, nd, output_size)
    if whole:  # global average pooling over these dims
        x = g.reduce("ReduceMean", x, whole, True, spec=Spec(tuple(1 if i in whole else d for i, d in
                                                                  enumerate(x.shape)), x.dtype))
    for a, n, o in dims:  # each spatial dim in turn, moved last and multiplied by the averaging matrix, as the kernel
        perm = list(range(x.ndim))
        perm[a], perm[-1] = perm[-1], perm[a]
        moved = x if a == x.ndim - 1 else g.op("Transpose", x, perm=perm)
        y = g.op("MatMul", moved, g.const(_averaging(n, o).T.astype(x.dtype)))
        x = y if a == x.ndim - 1 else g.op("Transpose", y, perm=perm)
        x.spec = Spec(tuple(o if i == a else d for i, d in enumerate(x.shape)), x.dtype)
    return x


def _define_adaptive_avg(opdef, nd, samples) -> None:
    opdef.check(functools.partial(_check_output_size, nd))
    opdef.infer(functools.partial(_adaptive_spec, opdef.name, nd))
    opdef.grad(functools.partial(_adaptive_avg_rule, nd))
    opdef.onnx(functools.partial(_adaptive_avg_onnx, nd))
    opdef.samples(samples)


@op("adaptive_avg_pool1d_sized(Tensor<floating> x, int[] output_size) -> Tensor y")
def adaptive_avg_pool1d_sized(x, *, output_size):
    """x (N, C, L) — or (C, L) — averaged down (or up) to ``output_size``: output i is the mean of inputs
    ⌊i·L/o⌋ … ⌈(i+1)·L/o⌉ − 1 (PyTorch's adaptive windows)."""
    return _adaptive_avg_pool("adaptive_avg_pool1d_sized", 1, x, output_size)


_define_adaptive_avg(adaptive_avg_pool1d_sized, 1, lambda rng: [
    Sample.of(_randn(rng, 2, 3, 7), output_size=3),
    Sample.of(_randn(rng, 2, 3), output_size=5),  # unbatched, more outputs than inputs
])


@op("adaptive_avg_pool2d_sized(Tensor<floating> x, int[] output_size) -> Tensor y")
def adaptive_avg_pool2d_sized(x, *, output_size):
    """x (N, C, H, W) — or (C, H, W) — averaged to ``output_size`` (OH, OW) over PyTorch's adaptive windows
    (rows ⌊i·H/OH⌋ … ⌈(i+1)·H/OH⌉ − 1, and so for columns); output_size 1 is global average pooling."""
    return _adaptive_avg_pool("adaptive_avg_pool2d_sized", 2, x, output_size)


_define_adaptive_avg(adaptive_avg_pool2d_sized, 2, lambda rng: [
    Sample.of(_randn(rng, 2, 3, 5, 7), output_size=[2, 3]),
    Sample.of(_randn(rng, 2, 4, 4), output_size=1),  # unbatched, global
    Sample.of(_randn(rng, 1, 2, 3, 4), output_size=[4, 4]),  # upsampling: windows of one
])


def _adaptive_avg_grad_spec(dy, input_size):
    nd = len(dy.shape) - 2
    if not 1 <= nd <= 3:
        raise ShapeError(f"adaptive_avg_pool_grad(): dy must have rank 3, 4 or 5 (N, C, *out), got shape {dy.shape}")
    win.fit_rank("adaptive_avg_pool_grad", nd, input_size=input_size)
    return Spec((*dy.shape[:2], *win.expand(input_size, nd)), dy.dtype)


@op("adaptive_avg_pool_grad(Tensor<floating> dy, *, int[] input_size) -> Tensor dx")
def adaptive_avg_pool_grad(dy, *, input_size):
    """Gradient of adaptive average pooling (1-, 2- or 3-D, by dy's rank) for an input of spatial size
    ``input_size``: each output's dy spread evenly over its window; overlapping windows add up."""
    spec = _adaptive_avg_grad_spec(Spec(dy.shape, dy.dtype), input_size)
    return _along_spatial(dy, [_averaging(n, o).T for n, o in zip(spec.shape[2:], dy.shape[2:])])


adaptive_avg_pool_grad.check(functools.partial(_check, None))
avg_pool_grad.sbp(lambda dy, **_: [((S(0),), S(0)), ((S(1),), S(1))])


@adaptive_avg_pool_grad.infer
def _(dy, *, input_size):
    return _adaptive_avg_grad_spec(dy, input_size)


@adaptive_avg_pool_grad.grad
def _(ddx, dy_spec):
    return getattr(F, f"adaptive_avg_pool{len(ddx.shape) - 2}d_sized")(ddx, output_size=dy_spec.shape[2:])


@adaptive_avg_pool_grad.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 3, 2, 3), input_size=[5, 7])
    yield Sample.of(_randn(rng, 2, 2, 5), input_size=[3])


@op("adaptive_avg_pool3d_sized(Tensor<floating> x, int[] output_size) -> Tensor y")
def adaptive_avg_pool3d_sized(x, *, output_size):
    """x (N, C, D, H, W) — or (C, D, H, W) — averaged to ``output_size`` (OD, OH, OW) over PyTorch's adaptive
    windows."""
    return _adaptive_avg_pool("adaptive_avg_pool3d_sized", 3, x, output_size)


_define_adaptive_avg(adaptive_avg_pool3d_sized, 3, lambda rng: [
    Sample.of(_randn(rng, 1, 2, 3, 4, 5), output_size=[2, 2, 3]),
])


def _adaptive_taps(n: int, o: int) -> np.ndarray:
    """The (o, k) input positions of each adaptive window's taps, the short windows repeating their last."""
    start, end = _adaptive_bounds(n, o)
    return np.minimum(start[:, None] + np.arange(int((end - start).max())), end[:, None] - 1)


def _adaptive_max(x, out):
    """Adaptive max pooling of a batched x: (y, the flat index of each window's maximum)."""
    a = win.batch_last(x)
    tables = [_adaptive_taps(n, o) for n, o in zip(x.shape[2:], out)]  # per dim
    views, flats = [], []
    for tap in np.ndindex(*(t.shape[1] for t in tables)):
        positions = np.ix_(*(t[:, i] for t, i in zip(tables, tap)))
        views.append(a[(slice(None), *positions)])
        flat = np.zeros((), np.int64)
        for p, n in zip(positions, x.shape[2:]):
            flat = flat * n + p
        flats.append(np.asarray(flat[..., None], like=a))  # (host geometry, copied to a's device)
    y = _window_max(views)
    hits = _first_maxima(views, y)  # a repeated position equals an earlier tap, so never takes a window's max
    indices = np.zeros(y.shape, np.int64, like=y)
    for flat, hit in zip(flats, hits):
        indices += hit * flat
    return win.batch_first(y), win.batch_first(indices)


@op("adaptive_max_pool2d_values(Tensor<floating> x, int[] output_size) -> Tensor y")
def adaptive_max_pool2d_values(x, *, output_size):
    """The maximum of each of PyTorch's adaptive windows of x (N, C, H, W) — or (C, H, W) — for ``output_size``
    (OH, OW): rows ⌊i·H/OH⌋ … ⌈(i+1)·H/OH⌉ − 1, and so for columns. ``F.adaptive_max_pool2d`` (torch's
    function) calls it, or adaptive_max_pool2d_with_indices for ``return_indices=True``."""
    batched, out = _adaptive_geometry("adaptive_max_pool2d_values", 2, x.shape, output_size)
    return _unbatched(_adaptive_max(_batched(x, batched), out)[0], batched)


adaptive_max_pool2d_values.check(functools.partial(_check_output_size, 2))
adaptive_max_pool2d_values.infer(functools.partial(_adaptive_spec, "adaptive_max_pool2d_values", 2))


def _onnx_gather_taps(g, x, a, n, o):
    """x with spatial dim ``a`` (of size n) replaced by the (o, k) taps of the adaptive windows."""
    return g.op("Gather", x, g.const(_adaptive_taps(n, o)), axis=a,
                spec=Spec((*x.shape[:a], o, None, *x.shape[a + 1:]), x.dtype))


def _adaptive_max_onnx(nd, g, x, *, output_size):
    dims, whole = _adaptive_onnx_dims(g, x, nd, output_size)
    if whole:  # global max pooling over these dims
        x = g.reduce("ReduceMax", x, whole, True, spec=Spec(tuple(1 if i in whole else d for i, d in
                                                                 enumerate(x.shape)), x.dtype))
    for a, n, o in dims:  # a window's max is the max over its rows of the max over its columns: one dim at a time
        x = g.reduce("ReduceMax", _onnx_gather_taps(g, x, a, n, o), [a + 1], False,
                     spec=Spec(tuple(o if i == a else d for i, d in enumerate(x.shape)), x.dtype))
    return x


adaptive_max_pool2d_values.onnx(functools.partial(_adaptive_max_onnx, 2))


@adaptive_max_pool2d_values.grad
def _(x, dy, *, output_size):
    # the indices, found again, say where each dy goes
    indices = F.adaptive_max_pool2d_with_indices(x, output_size=output_size).indices
    return _scatter_rule(2, indices, dy, x)


def _adaptive_max_samples(rng):
    yield Sample.of(_distinct(rng, 2, 3, 5, 7), output_size=[2, 3])
    yield Sample.of(_distinct(rng, 2, 3, 3), output_size=[2, 5])  # unbatched; more columns out than in


adaptive_max_pool2d_values.samples(_adaptive_max_samples)


@op("adaptive_max_pool2d_with_indices(Tensor<floating> x, int[] output_size) -> (Tensor y, Tensor indices)")
def adaptive_max_pool2d_with_indices(x, *, output_size):
    """adaptive_max_pool2d, and the flat index h·W + w (int64) of each window's maximum: PyTorch's
    ``adaptive_max_pool2d(..., return_indices=True)``."""
    batched, out = _adaptive_geometry("adaptive_max_pool2d_with_indices", 2, x.shape, output_size)
    return tuple(_unbatched(a, batched) for a in _adaptive_max(_batched(x, batched), out))


adaptive_max_pool2d_with_indices.check(functools.partial(_check_output_size, 2))


@adaptive_max_pool2d_with_indices.infer
def _(x, *, output_size):
    y = _adaptive_spec("adaptive_max_pool2d_with_indices", 2, x, output_size=output_size)
    return y, Spec(y.shape, D.int64)


adaptive_max_pool2d_with_indices.grad(functools.partial(_scatter_rule, 2))
adaptive_max_pool2d_with_indices.samples(_adaptive_max_samples)


def _adaptive_max_indices_onnx(nd, g, x, *, output_size):
    # every window's taps gathered into a last dim (o1, …, on, k1·…·kn), in the kernel's order: the first maximum is
    # the kernel's, and a table gives its flat index ((i1·n2 + i2)·n3 + i3 …)
    if None in x.shape[-nd:]:
        raise g.unsupported(f"the indices of adaptive max pooling over sizes {list(x.shape[-nd:])} known only at "
                            "run time")
    lead = x.ndim - nd
    dims = [(lead + d, n, o) for d, (n, o) in enumerate(zip(x.shape[-nd:], win.expand(output_size, nd)))]
    taps = x
    for a, n, o in reversed(dims):  # (..., o1, k1, …, on, kn): the later dims first, so the earlier axes stay put
        taps = _onnx_gather_taps(g, taps, a, n, o)
    taps = g.op("Transpose", taps, perm=[*range(lead), *range(lead, lead + 2 * nd, 2),
                                         *range(lead + 1, lead + 2 * nd, 2)])
    tables = [_adaptive_taps(n, o) for _, n, o in dims]
    outs = [o for _, _, o in dims]
    taps = g.op("Reshape", taps, g.ints([*(0,) * lead, *outs, math.prod(t.shape[1] for t in tables)]))
    first = g.op("ArgMax", taps, axis=-1, keepdims=1, select_last_index=0)
    flat, stride = np.zeros((1,) * (2 * nd), np.int64), 1
    for d in reversed(range(nd)):  # (o1, …, on, k1, …, kn)
        shape = [1] * (2 * nd)
        shape[d], shape[nd + d] = tables[d].shape
        flat = flat + tables[d].reshape(shape) * stride
        stride *= dims[d][1]
    flat = g.op("Expand", g.const(flat.reshape(*outs, -1)), g.op("Shape", taps))
    y = g.op("Squeeze", g.op("GatherElements", taps, first, axis=-1), g.ints([-1]), spec=g.outputs[0])
    return y, g.op("Squeeze", g.op("GatherElements", flat, first, axis=-1), g.ints([-1]), spec=g.outputs[1])


adaptive_max_pool2d_with_indices.onnx(functools.partial(_adaptive_max_indices_onnx, 2))


def _define_adaptive_max(nd: int, dims: str, samples) -> tuple:
    """adaptive_max_pool{nd}d_values and its _with_indices op, as adaptive_max_pool2d's: the ops of torch's 1-D
    and 3-D adaptive max pooling."""
    name = f"adaptive_max_pool{nd}d"
    flat = {1: "l", 3: "(d·H + h)·W + w"}[nd]

    def pool(x, *, output_size):
        batched, out = _adaptive_geometry(f"{name}_values", nd, x.shape, output_size)
        return _unbatched(_adaptive_max(_batched(x, batched), out)[0], batched)

    def pool_with_indices(x, *, output_size):
        batched, out = _adaptive_geometry(f"{name}_with_indices", nd, x.shape, output_size)
        return tuple(_unbatched(a, batched) for a in _adaptive_max(_batched(x, batched), out))

    pool.__doc__ = (f"The maximum of each of PyTorch's adaptive windows of x (N, C, {dims}) — or (C, {dims}) — for "
                    f"``output_size``: along each dim of size n, output i takes inputs ⌊i·n/o⌋ … ⌈(i+1)·n/o⌉ − 1.")
    pool_with_indices.__doc__ = (f"{name}, and the flat index {flat} (int64) of each window's maximum: PyTorch's "
                                 f"``{name}(..., return_indices=True)``.")
    plain = op(f"{name}_values(Tensor<floating> x, int[] output_size) -> Tensor y")(pool)
    indexed = op(f"{name}_with_indices(Tensor<floating> x, int[] output_size) -> (Tensor y, Tensor indices)")(
        pool_with_indices)
    for opdef in (plain, indexed):
        opdef.check(functools.partial(_check_output_size, nd))
        opdef.samples(samples)
    plain.infer(functools.partial(_adaptive_spec, f"{name}_values", nd))
    plain.onnx(functools.partial(_adaptive_max_onnx, nd))
    indexed.onnx(functools.partial(_adaptive_max_indices_onnx, nd))

    def indexed_spec(x, *, output_size):
        y = _adaptive_spec(f"{name}_with_indices", nd, x, output_size=output_size)
        return y, Spec(y.shape, D.int64)

    indexed.infer(indexed_spec)

    def plain_rule(x, dy, *, output_size):  # the indices, found again, say where each dy goes
        return _scatter_rule(nd, getattr(F, f"{name}_with_indices")(x, output_size=output_size).indices, dy, x)

    plain.grad(plain_rule)
    indexed.grad(functools.partial(_scatter_rule, nd))
    return plain, indexed


adaptive_max_pool1d_values, adaptive_max_pool1d_with_indices = _define_adaptive_max(1, "L", lambda rng: [
    Sample.of(_distinct(rng, 2, 3, 7), output_size=3),
    Sample.of(_distinct(rng, 2, 3), output_size=5),  # unbatched, more outputs than inputs
])
adaptive_max_pool3d_values, adaptive_max_pool3d_with_indices = _define_adaptive_max(3, "D, H, W", lambda rng: [
    Sample.of(_distinct(rng, 1, 2, 3, 4, 5), output_size=[2, 2, 3]),
    Sample.of(_distinct(rng, 2, 3, 2, 3), output_size=[3, 1, 2]),  # unbatched
])


def _output_sizes(name: str, nd: int, input, output_size) -> list:
    """torch's adaptive pooling ``output_size``: an int or nd ints, where for 2-D and 3-D a None among the nd keeps
    that dim of ``input``'s size (torch refuses a None alone and a 1-D None); as nd ints, or an error naming the
    function."""
    sizes = (output_size,) if isinstance(output_size, (int, np.integer)) \
        else tuple(output_size) if isinstance(output_size, (tuple, list)) else None
    if sizes is None or len(sizes) not in (1, nd) or not all(
            (v is None and nd > 1) or (isinstance(v, (int, np.integer)) and not isinstance(v, bool)) for v in sizes):
        keep = " (None: keep the input's size)" if nd > 1 else ""
        raise ShapeError(f"{name}(): argument 'output_size' must be an int or {nd} ints{keep}, got {output_size!r}")
    sizes = sizes * (nd if len(sizes) == 1 else 1)
    if None in sizes:
        if len(input.shape) not in (nd + 1, nd + 2):
            raise ShapeError(f"{name}(): input must be (N, C, *{nd} dims) or (C, *{nd} dims), got shape "
                             f"{tuple(input.shape)}")
        sizes = [n if o is None else o for n, o in zip(input.shape[-nd:], sizes)]
        if not all(isinstance(v, (int, np.integer)) for v in sizes):  # a program's dim known only at run time
            raise ShapeError(f"{name}(): output_size {output_size!r} keeps a spatial dim whose size is known only "
                             f"at run time (input {tuple(input.shape)}): give that size")
    return [int(v) for v in sizes]


def _adaptive_max_function(nd: int):
    """torch's ``F.adaptive_max_pool{nd}d(input, output_size, return_indices=False)``: the op
    ``adaptive_max_pool{nd}d_values``, or ``..._with_indices`` for (values, indices); a None in ``output_size``
    keeps that dim's size, as torch's."""
    name = f"adaptive_max_pool{nd}d"

    def pool(input, output_size, return_indices=False):
        op_name = f"{name}_with_indices" if return_indices else f"{name}_values"
        return called_as(name, op_name, input, output_size=_output_sizes(name, nd, input, output_size))

    pool.__name__ = pool.__qualname__ = name
    pool.__doc__ = (f"``torch.nn.functional.{name}(input, output_size, return_indices=False)``: the op "
                    f"``{name}_values``, or with ``return_indices`` ``{name}_with_indices``, the named tuple "
                    "(y, indices); a None in ``output_size`` keeps that dim's size.")
    return function(pool)


adaptive_max_pool1d, adaptive_max_pool2d, adaptive_max_pool3d = (_adaptive_max_function(nd) for nd in (1, 2, 3))


def _adaptive_avg_function(nd: int):
    """torch's ``F.adaptive_avg_pool{nd}d(input, output_size)``: the op ``adaptive_avg_pool{nd}d_sized``, to the
    output size given in full (a None in ``output_size`` keeps that dim's size, as torch's)."""
    name = f"adaptive_avg_pool{nd}d"

    def pool(input, output_size):
        return called_as(name, f"{name}_sized", input, output_size=_output_sizes(name, nd, input, output_size))

    pool.__name__ = pool.__qualname__ = name
    pool.__doc__ = (f"``torch.nn.functional.{name}(input, output_size)``: the op ``{name}_sized``; a None in "
                    "``output_size`` keeps that dim's size.")
    return function(pool)


adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d = (_adaptive_avg_function(nd) for nd in (1, 2, 3))
