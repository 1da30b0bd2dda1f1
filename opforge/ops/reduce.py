"""Reductions over axes (an int, a list, or None for all), with ``keepdim``."""

from opforge import ops as F

from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, normalize_axes, np, op


def _reduced_shape(op_name, shape, axis, keepdim):
    axes = normalize_axes(op_name, axis, len(shape))
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _kept_shape(shape, axis):
    """The shape of a reduction's result with keepdim=True, to broadcast a gradient back."""
    axes = normalize_axes("", axis, len(shape))
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _reduce_samples(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1)
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=[0, -1], keepdim=True)
    yield Sample.of(rng.standard_normal(()))
    yield Sample.of(rng.standard_normal(5), axis=0, keepdim=True)


@op("sum(Tensor x, *, int[] axis=None, bool keepdim=False) -> Tensor y")
def sum(x, *, axis, keepdim):
    """Sum over ``axis`` (all axes when None). Integer and bool tensors sum to int64."""
    axes = normalize_axes("sum", axis, x.ndim)
    return np.sum(x, axis=axes, keepdims=keepdim, dtype=None if x.dtype.kind == "f" else np.int64)


@sum.infer
def _(x, *, axis, keepdim):
    dtype = x.dtype if x.dtype.kind == "f" else D.int64
    return Spec(_reduced_shape("sum", x.shape, axis, keepdim), dtype)


@sum.grad
def _(dy, x_spec, *, axis, keepdim):
    if not keepdim:
        dy = F.reshape(dy, shape=_kept_shape(x_spec.shape, axis))
    return F.broadcast_to(dy, shape=x_spec.shape)


sum.samples(_reduce_samples)


@op("mean(Tensor<floating> x, *, int[] axis=None, bool keepdim=False) -> Tensor y")
def mean(x, *, axis, keepdim):
    """Mean over ``axis`` (all axes when None)."""
    return np.mean(x, axis=normalize_axes("mean", axis, x.ndim), keepdims=keepdim)


@mean.infer
def _(x, *, axis, keepdim):
    return Spec(_reduced_shape("mean", x.shape, axis, keepdim), x.dtype)


@mean.grad
def _(dy, x_spec, *, axis, keepdim):
    axes = normalize_axes("mean", axis, len(x_spec.shape))
    count = int(np.prod([x_spec.shape[a] for a in axes]))
    if not keepdim:
        dy = F.reshape(dy, shape=_kept_shape(x_spec.shape, axis))
    return F.broadcast_to(dy * (1.0 / max(count, 1)), shape=x_spec.shape)


mean.samples(_reduce_samples)


@op("sum_to(Tensor x, *, int[] shape) -> Tensor y")
def sum_to(x, *, shape):
    """Sums ``x`` down to ``shape``, the inverse of broadcasting ``shape`` up to ``x.shape``."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    y = np.sum(x, axis=axes, keepdims=True) if axes else x
    return y.reshape(shape)


@sum_to.infer
def _(x, *, shape):
    try:
        fits = len(shape) <= len(x.shape) and broadcast_shapes(shape, x.shape) == tuple(x.shape)
    except ValueError:
        fits = False
    if not fits:
        raise ShapeError(f"sum_to(): cannot sum a tensor of shape {x.shape} to shape {shape}: "
                         "the target must broadcast to the input's shape")
    return Spec(tuple(shape), x.dtype)


@sum_to.grad
def _(dy, x_spec):
    return F.broadcast_to(dy, shape=x_spec.shape)


@sum_to.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), shape=[3, 1])
    yield Sample.of(rng.standard_normal((2, 3)), shape=[])
    yield Sample.of(rng.standard_normal((2, 3)), shape=[2, 3])
