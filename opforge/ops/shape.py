"""Ops that move elements around without changing them: reshape, transpose, broadcast, slice."""

import builtins

from opforge import ops as F

from ._common import Sample, ShapeError, Spec, broadcast_shapes, np, op


@op("reshape(Tensor x, *, int[] shape) -> Tensor y")
def reshape(x, *, shape):
    """The same elements in a new shape; one dim may be -1 (inferred)."""
    return np.reshape(x, shape)


@reshape.infer
def _(x, *, shape):
    if sum(d == -1 for d in shape) > 1 or any(d < -1 for d in shape):
        raise ShapeError(f"reshape(): shape {list(shape)} may hold at most one -1 and no other negative dim")
    if None in x.shape:
        if -1 in shape:
            return Spec(tuple(None if d == -1 else d for d in shape), x.dtype)
        return Spec(tuple(shape), x.dtype)
    size = int(np.prod(x.shape))
    known = int(np.prod([d for d in shape if d != -1]))
    if -1 in shape:
        if known == 0 or size % known:
            raise ShapeError(f"reshape(): cannot reshape a tensor of shape {x.shape} to {list(shape)}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    elif known != size:
        raise ShapeError(f"reshape(): cannot reshape a tensor of shape {x.shape} ({size} elements) "
                         f"to {list(shape)} ({known} elements)")
    return Spec(tuple(shape), x.dtype)


@reshape.grad
def _(dy, x_spec):
    return F.reshape(dy, shape=x_spec.shape)


@reshape.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), shape=[3, 2])
    yield Sample.of(rng.standard_normal((2, 3, 2)), shape=[-1, 2])
    yield Sample.of(rng.standard_normal(()), shape=[1, 1])


@op("transpose(Tensor x, *, int[] perm=None) -> Tensor y")
def transpose(x, *, perm):
    """Permutes the dims (reverses them when ``perm`` is None)."""
    return np.transpose(x, perm)


@transpose.infer
def _(x, *, perm):
    if perm is None:
        return Spec(tuple(reversed(x.shape)), x.dtype)
    if sorted(p % max(len(x.shape), 1) for p in perm) != list(range(len(x.shape))) or len(perm) != len(x.shape):
        raise ShapeError(f"transpose(): perm {list(perm)} is not a permutation of the {len(x.shape)} dims "
                         f"of a tensor of shape {x.shape}")
    return Spec(tuple(x.shape[p] for p in perm), x.dtype)


@transpose.grad
def _(dy, *, perm):
    if perm is None:
        return F.transpose(dy)
    n = len(perm)
    return F.transpose(dy, perm=[int(i) for i in np.argsort([p % n for p in perm])])


@transpose.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), perm=[1, 2, 0])
    yield Sample.of(rng.standard_normal((2, 3, 4)), perm=[-1, 0, 1])


@op("broadcast_to(Tensor x, *, int[] shape) -> Tensor y")
def broadcast_to(x, *, shape):
    """``x`` repeated along dims of size 1 (and new leading dims) to ``shape``."""
    return np.broadcast_to(x, shape)


@broadcast_to.infer
def _(x, *, shape):
    try:
        ok = len(shape) >= len(x.shape) and broadcast_shapes(x.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(f"broadcast_to(): cannot broadcast a tensor of shape {x.shape} to {list(shape)}")
    return Spec(tuple(shape), x.dtype)


@broadcast_to.grad
def _(dy, x_spec):
    return F.sum_to(dy, shape=x_spec.shape)


@broadcast_to.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 1)), shape=[2, 3, 4])
    yield Sample.of(rng.standard_normal(()), shape=[2])


def _slice_index(ndim, axes, starts, ends, steps):
    index = [builtins.slice(None)] * ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = builtins.slice(s, e if e >= 0 else None, st)  # a negative end (after normalising) means "past 0"
    return tuple(index)


def _slice_spec(op_name, shape, axes, starts, ends, steps):
    if not len(axes) == len(starts) == len(ends) == len(steps):
        raise ShapeError(f"{op_name}(): axes, starts, ends and steps must have one entry each, got lengths "
                         f"{len(axes)}, {len(starts)}, {len(ends)}, {len(steps)}")
    out = list(shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if not 0 <= a < len(shape):
            raise ShapeError(f"{op_name}(): axis {a} is out of range for a tensor of shape {shape}")
        if st == 0:
            raise ShapeError(f"{op_name}(): step must not be 0")
        if shape[a] is not None:
            out[a] = len(range(*builtins.slice(s, e if e >= 0 else None, st).indices(shape[a])))
    return tuple(out)


@op("slice(Tensor x, *, int[] axes, int[] starts, int[] ends, int[] steps) -> Tensor y")
def slice(x, *, axes, starts, ends, steps):
    """Basic slicing, ``x[starts:ends:steps]`` along ``axes`` (indices already normalised by the caller)."""
    return x[_slice_index(x.ndim, axes, starts, ends, steps)]


@slice.infer
def _(x, *, axes, starts, ends, steps):
    return Spec(_slice_spec("slice", x.shape, axes, starts, ends, steps), x.dtype)


@slice.grad
def _(dy, x_spec, *, axes, starts, ends, steps):
    return F.slice_grad(dy, shape=x_spec.shape, axes=axes, starts=starts, ends=ends, steps=steps)


@slice.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 5)), axes=[0], starts=[1], ends=[3], steps=[1])
    yield Sample.of(rng.standard_normal((4, 5)), axes=[0, 1], starts=[3, 0], ends=[-1, 5], steps=[-2, 2])


@op("slice_grad(Tensor dy, *, int[] shape, int[] axes, int[] starts, int[] ends, int[] steps) -> Tensor dx")
def slice_grad(dy, *, shape, axes, starts, ends, steps):
    """Gradient of slice: zeros of ``shape`` with ``dy`` written where the slice took its elements."""
    dx = np.zeros(shape, dy.dtype)
    dx[_slice_index(len(shape), axes, starts, ends, steps)] = dy
    return dx


@slice_grad.infer
def _(dy, *, shape, axes, starts, ends, steps):
    expected = _slice_spec("slice_grad", tuple(shape), axes, starts, ends, steps)
    if len(expected) != len(dy.shape) or any(a is not None and b is not None and a != b
                                             for a, b in zip(expected, dy.shape)):
        raise ShapeError(f"slice_grad(): dy has shape {dy.shape}, the slice of {list(shape)} has {expected}")
    return Spec(tuple(shape), dy.dtype)


@slice_grad.grad
def _(ddx, *, axes, starts, ends, steps):
    return F.slice(ddx, axes=axes, starts=starts, ends=ends, steps=steps)


@slice_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 5)), shape=[4, 5], axes=[0], starts=[1], ends=[3], steps=[1])
