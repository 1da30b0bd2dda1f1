"""Ops that move elements around without changing them: reshape, transpose, broadcast, slice, squeeze, permute,
concat, stack, split, flip, tile, tril/triu, roll, repeat_interleave, diagonal, pad. Indexing by integer tensors
and masks is in ``indexing.py``."""

import builtins
import math

from opforge import ops as F

from ..core.errors import ArgumentError, describe
from ._common import (
    D,
    P,
    S,
    Sample,
    ShapeError,
    Spec,
    array_module,
    broadcast_shapes,
    function,
    normalize_axes,
    np,
    op,
    shapes_agree,
)


@op("reshape(Tensor x, int[] shape) -> Tensor y", traits=["view"])
def reshape(x, *, shape):
    """The same elements in a new shape; one dim may be -1 (inferred)."""
    return np.reshape(x, shape)


@reshape.onnx
def _(g, x, *, shape):
    # ONNX reads a 0 as "keep this dim" unless allowzero (which refuses -1): a literal 0 asks for allowzero.
    zero = any(isinstance(d, int) and d == 0 for d in shape)
    return g.op("Reshape", x, g.ints(shape), allowzero=1 if zero else None)


@reshape.infer
def _(x, *, shape):
    if None in shape:  # a size known at run time (inside a program): checked by the executor then; so is the
        return Spec(tuple(None if d == -1 else d for d in shape), x.dtype)  # -1, which such a size leaves unknown
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


@reshape.sbp
def _(x, *, shape, ranks):
    # Row-major order: for each index of the dims before axis k, rank r's block of x along k holds elements
    # [r·T/ranks, (r+1)·T/ranks) of the T that follow, and so does its block of y along j when the dims before j
    # count as many as those before k and both dims split evenly (a batch kept, heads split off a batch or off
    # features). On the blocks, y's dim j is a rank's share.
    y = reshape.infer_fn(x, shape=shape).shape
    for k, d in enumerate(x.shape):
        for j, e in enumerate(y):
            if all(v is None or v % ranks == 0 for v in (d, e)) and _same_count(x.shape[:k], y[:j]):
                local = list(shape)
                if local[j] is not None and local[j] != -1:
                    local[j] //= ranks
                yield (S(k),), S(j), {"shape": local}
                break
    yield (P,), P


def _same_count(a, b) -> bool:
    """Whether dims ``a`` and ``b`` hold as many elements (the same dims, or known ones whose products agree)."""
    return tuple(a) == tuple(b) or (None not in a and None not in b and math.prod(a) == math.prod(b))


@reshape.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), shape=[3, 2])
    yield Sample.of(rng.standard_normal((2, 3, 2)), shape=[-1, 2])
    yield Sample.of(rng.standard_normal(()), shape=[1, 1])


@op("shape_as_tensor(Tensor x) -> Tensor y", traits=["no_grad", "shape_only"])
def shape_as_tensor(x):
    """The shape of ``x`` as a 1-d int64 tensor (``torch._shape_as_tensor``, ONNX's Shape). In a program whose dims
    are known only at run time, sizes computed from it (``reshape(x, shape=...)`` fed by Shape → Gather → Concat in an
    imported ONNX model) are computed when the executor plans the run for the feeds' shapes."""
    return np.asarray(x.shape, np.int64, like=x).reshape(x.ndim)  # (made on x's device)


shape_as_tensor.onnx(lambda g, x: g.op("Shape", x))


@shape_as_tensor.infer
def _(x):
    return Spec((len(x.shape),), D.int64)


@shape_as_tensor.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal(()))


@op("transpose(Tensor x, *, int[] perm=None) -> Tensor y", traits=["view"])
def transpose(x, *, perm):
    """Permutes the dims (reverses them when ``perm`` is None)."""
    # The array's own method, which np.transpose calls after its Python wrapper: a compiled plan runs this right
    # after large GEMMs have pushed the interpreter out of the core's caches, where each wrapper costs several µs
    # (measured: 4.9 µs for np.transpose cold against 2.4 for the method; 0.8 against 0.3 warm).
    return x.transpose() if perm is None else x.transpose(perm)


@transpose.onnx
def _(g, x, *, perm):
    if x.ndim == 0:
        return g.op("Identity", x)
    return g.op("Transpose", x, perm=[p % x.ndim for p in perm] if perm is not None else range(x.ndim)[::-1])


@transpose.infer
def _(x, *, perm):
    if perm is None:
        return Spec(tuple(reversed(x.shape)), x.dtype)
    return Spec(tuple(x.shape[p] for p in _permutation("transpose", perm, x.shape)), x.dtype)


@transpose.grad
def _(dy, *, perm):
    if perm is None:
        return F.transpose(dy)
    n = len(perm)
    return F.transpose(dy, perm=[int(i) for i in np.argsort([p % n for p in perm])])


@transpose.sbp
def _(x, *, perm):
    order = list(reversed(range(len(x.shape)))) if perm is None else [p % len(x.shape) for p in perm]
    for k in range(len(x.shape)):
        yield (S(k),), S(order.index(k))
    yield (P,), P


@transpose.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), perm=[1, 2, 0])
    yield Sample.of(rng.standard_normal((2, 3, 4)), perm=[-1, 0, 1])


@op("broadcast_to(Tensor x, int[] shape/size) -> Tensor y", traits=["view"])
def broadcast_to(x, *, shape):
    """``x`` repeated along dims of size 1 (and new leading dims) to ``shape``. A -1 keeps the size of the dim of
    ``x`` it lines up with, as ``Tensor.expand`` (not allowed for a new leading dim)."""
    return np.broadcast_to(x, _expanded_shape(x.shape, shape))


def _expanded_shape(x_shape, shape):
    """``shape`` with each -1 replaced by the size of the dim of ``x_shape`` it lines up with (from the right)."""
    lead = len(shape) - len(x_shape)
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, int) and d < 0:
            if d != -1 or i < lead:
                where = "a new leading dim" if d == -1 else "a negative size"
                raise ShapeError(f"broadcast_to(): shape {list(shape)} has {d} at dim {i}, {where}: -1 (keep the size) "
                                 f"is allowed only for the dims of x, of shape {x_shape}, counted from the right")
            d = x_shape[i - lead]
        out.append(d)
    return tuple(out)


# ONNX's Expand broadcasts both ways, so a -1 ("keep this dim of x") becomes 1.
broadcast_to.onnx(lambda g, x, *, shape: g.op("Expand", x, g.ints([1 if d == -1 else d for d in shape])))


@broadcast_to.infer
def _(x, *, shape):
    shape = _expanded_shape(x.shape, shape)
    try:  # (a size of None, known at run time, is checked then: a dim of x other than 1 is what it must be)
        both = broadcast_shapes(x.shape, shape) if len(shape) >= len(x.shape) else None
        ok = both is not None and shapes_agree(both, shape)
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(f"broadcast_to(): cannot broadcast a tensor of shape {x.shape} to {list(shape)}")
    return Spec(tuple(b if s is None else s for s, b in zip(shape, both)), x.dtype)


@broadcast_to.grad
def _(dy, x_spec):
    return F.sum_to(dy, shape=x_spec.shape)


@broadcast_to.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 1)), shape=[2, 3, 4])
    yield Sample.of(rng.standard_normal(()), shape=[2])
    yield Sample.of(rng.standard_normal((3, 1)), shape=[2, -1, 4])  # -1: keep x's size


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
            raise ShapeError(f"{op_name}(): step must not be 0")  # (None, a step known at run time: checked then)
        if st is None:
            out[a] = None
        elif shape[a] is not None and s is not None and e is not None:  # (None: a size computed at run time)
            out[a] = len(range(*builtins.slice(s, e if e >= 0 else None, st).indices(shape[a])))
        else:
            out[a] = None
    return tuple(out)


@op("slice(Tensor x, *, int[] axes, int[] starts, int[] ends, int[] steps) -> Tensor y", traits=["view"])
def slice(x, *, axes, starts, ends, steps):
    """Basic slicing, ``x[starts:ends:steps]`` along ``axes`` (indices already normalised by the caller)."""
    return x[_slice_index(x.ndim, axes, starts, ends, steps)]


@slice.onnx
def _(g, x, *, axes, starts, ends, steps):
    if not axes:
        return g.op("Identity", x)
    # here a negative end means "past index 0" (a backward slice to the start); ONNX says so with INT64_MIN
    ends = [e if not isinstance(e, int) or e >= 0 else -(2**63) for e in ends]
    return g.op("Slice", x, g.ints(starts), g.ints(ends), g.ints(axes), g.ints(steps))


@slice.infer
def _(x, *, axes, starts, ends, steps):
    return Spec(_slice_spec("slice", x.shape, axes, starts, ends, steps), x.dtype)


@slice.grad
def _(dy, x_spec, *, axes, starts, ends, steps):
    return F.slice_grad(dy, shape=x_spec.shape, axes=axes, starts=starts, ends=ends, steps=steps)


@slice.sbp
def _(x, *, axes, starts, ends, steps):
    cut = {a % len(x.shape) for a in axes}
    for k in range(len(x.shape)):  # the dims it does not slice: each rank slices its block alike
        if k not in cut:
            yield (S(k),), S(k)
    yield (P,), P


@slice.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 5)), axes=[0], starts=[1], ends=[3], steps=[1])
    yield Sample.of(rng.standard_normal((4, 5)), axes=[0, 1], starts=[3, 0], ends=[-1, 5], steps=[-2, 2])
    yield Sample.of(rng.standard_normal((4, 6)), axes=[0], starts=[0], ends=[3], steps=[2])  # 6 columns split


@op("slice_grad(Tensor dy, *, int[] shape, int[] axes, int[] starts, int[] ends, int[] steps) -> Tensor dx")
def slice_grad(dy, *, shape, axes, starts, ends, steps):
    """Gradient of slice: zeros of ``shape`` with ``dy`` written where the slice took its elements."""
    dx = np.zeros(shape, dy.dtype, like=dy)
    dx[_slice_index(len(shape), axes, starts, ends, steps)] = dy
    return dx


@slice_grad.infer
def _(dy, *, shape, axes, starts, ends, steps):
    if any(d is not None and d < 0 for d in shape):
        raise ShapeError(f"slice_grad(): argument 'shape' {list(shape)} has a negative size")
    expected = _slice_spec("slice_grad", tuple(shape), axes, starts, ends, steps)
    if not shapes_agree(expected, dy.shape):
        raise ShapeError(f"slice_grad(): dy has shape {dy.shape}, the slice of {list(shape)} has {expected}")
    return Spec(tuple(shape), dy.dtype)


@slice_grad.grad
def _(ddx, *, axes, starts, ends, steps):
    return F.slice(ddx, axes=axes, starts=starts, ends=ends, steps=steps)


@slice_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 5)), shape=[4, 5], axes=[0], starts=[1], ends=[3], steps=[1])


# -- dims: squeeze, unsqueeze, permute, flip ---------------------------------------------------------------


def _one_axis(op_name, axis, ndim):
    """One axis in [-ndim, ndim) -> non-negative; out of range is a ShapeError naming the op."""
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op_name}(): axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim


def _squeezed_axes(op_name, shape, axis):
    """The dims squeeze removes: those of size 1 among ``axis`` (all dims when None)."""
    axes = normalize_axes(op_name, axis, len(shape))
    if any(shape[a] is None for a in axes):
        raise ShapeError(f"{op_name}(): cannot tell whether a dim of unknown size is 1 (shape {shape}, "
                         f"axis {axis}); squeeze dims of known size")
    return tuple(a for a in axes if shape[a] == 1)


@op("squeeze(Tensor x, int[] axis/dim=None) -> Tensor y", traits=["view"])
def squeeze(x, *, axis):
    """Removes dims of size 1: every one when ``axis`` is None, else those listed (a listed dim whose size is
    not 1 is left alone, as in PyTorch)."""
    return np.squeeze(x, axis=_squeezed_axes("squeeze", x.shape, axis))


@squeeze.onnx
def _(g, x, *, axis):
    axes = _squeezed_axes("squeeze", x.shape, axis)
    return g.op("Squeeze", x, g.ints(axes)) if axes else g.op("Identity", x)


@squeeze.infer
def _(x, *, axis):
    drop = _squeezed_axes("squeeze", x.shape, axis)
    return Spec(tuple(d for i, d in enumerate(x.shape) if i not in drop), x.dtype)


@squeeze.grad
def _(dy, x_spec):
    return F.reshape(dy, shape=x_spec.shape)


@squeeze.sbp
def _(x, *, axis):
    drop = _squeezed_axes("squeeze", x.shape, axis)
    for k in range(len(x.shape)):  # the dims it drops, named: a rank's block may have others of size 1
        if k not in drop and x.shape[k] != 1:
            yield (S(k),), S(k - sum(d < k for d in drop)), {"axis": list(drop)}
    yield (P,), P


@squeeze.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 1, 3, 1)))
    yield Sample.of(rng.standard_normal((2, 1, 3, 1)), axis=[-1])
    yield Sample.of(rng.standard_normal((1, 3)), axis=[0, 1])  # dim 1 (size 3) stays
    yield Sample.of(rng.standard_normal((1, 6, 1)))  # blocks of the 6 split on 2 or 3 ranks
    yield Sample.of(rng.standard_normal(()))


@op("unsqueeze(Tensor x, int axis/dim) -> Tensor y", traits=["view"])
def unsqueeze(x, *, axis):
    """Inserts a dim of size 1 at ``axis`` (in [-ndim-1, ndim], counted in the result)."""
    a = axis + x.ndim + 1 if axis < 0 else axis
    if not 0 <= a <= x.ndim:
        return np.expand_dims(x, axis)  # (its error)
    # a reshape adding a dim of size 1 is always a view, as expand_dims's; without its Python layers (18 µs cold
    # after a GEMM, 2.3 warm; the reshape 2.4 and 0.4)
    return x.reshape((*x.shape[:a], 1, *x.shape[a:]))


unsqueeze.onnx(lambda g, x, *, axis: g.op("Unsqueeze", x, g.ints([axis])))


@unsqueeze.infer
def _(x, *, axis):
    a = _one_axis("unsqueeze", axis, len(x.shape) + 1)
    return Spec((*x.shape[:a], 1, *x.shape[a:]), x.dtype)


@unsqueeze.grad
def _(dy, *, axis):
    return F.squeeze(dy, axis=[axis])  # the same axis of the result


@unsqueeze.sbp
def _(x, *, axis):
    a = _one_axis("unsqueeze", axis, len(x.shape) + 1)
    for k in range(len(x.shape)):
        yield (S(k),), S(k if k < a else k + 1)
    yield (P,), P


@unsqueeze.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), axis=1)
    yield Sample.of(rng.standard_normal((2, 3)), axis=-1)
    yield Sample.of(rng.standard_normal(()), axis=0)


def _permutation(op_name, perm, shape):
    """``perm`` (negative dims allowed) -> non-negative, checked to be a permutation of the dims of ``shape``."""
    n = len(shape)
    if len(perm) != n or any(not -n <= p < n for p in perm) or sorted(p % n for p in perm) != list(range(n)):
        raise ShapeError(f"{op_name}(): {list(perm)} is not a permutation of the {n} dims "
                         f"of a tensor of shape {shape}")
    return tuple(p % n for p in perm)


@op("permute(Tensor x, int[] dims) -> Tensor y", traits=["view"])
def permute(x, *, dims):
    """Reorders the dims: dim i of the result is dim ``dims[i]`` of ``x`` (``torch.permute``)."""
    return np.transpose(x, dims)


permute.onnx(lambda g, x, *, dims: g.call("transpose", x, perm=dims))


@permute.infer
def _(x, *, dims):
    return Spec(tuple(x.shape[p] for p in _permutation("permute", dims, x.shape)), x.dtype)


@permute.grad
def _(dy, *, dims):
    inverse = [int(i) for i in np.argsort([p % len(dims) for p in dims])]
    return F.permute(dy, dims=inverse)


@permute.sbp
def _(x, *, dims):
    order = [p % len(x.shape) for p in dims]
    for k in range(len(x.shape)):  # the split dim goes where the permutation takes it
        yield (S(k),), S(order.index(k))
    yield (P,), P


@permute.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), dims=[2, 0, 1])
    yield Sample.of(rng.standard_normal((2, 3)), dims=[-1, 0])
    yield Sample.of(rng.standard_normal(()), dims=[])


@op("flip(Tensor x, int[] axis/dims) -> Tensor y")
def flip(x, *, axis):
    """Reverses the order of the elements along each dim in ``axis``. The result is a copy, as torch's (NumPy's
    flip is a view: an in-place write to the result would change ``x``)."""
    return np.flip(x, normalize_axes("flip", axis, x.ndim)).copy()


@flip.onnx
def _(g, x, *, axis):
    if not axis or x.ndim == 0:
        return g.op("Identity", x)
    n = len(axis)
    return g.op("Slice", x, g.ints([-1] * n), g.ints([-(2**63)] * n), g.ints(axis), g.ints([-1] * n))


@flip.infer
def _(x, *, axis):
    normalize_axes("flip", axis, len(x.shape))
    return x


@flip.grad
def _(dy, *, axis):
    return F.flip(dy, axis=axis)


@flip.sbp
def _(x, *, axis):
    flipped = set(normalize_axes("flip", axis, len(x.shape)))
    for k in range(len(x.shape)):
        if k not in flipped:
            yield (S(k),), S(k)
    yield (P,), P


@flip.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=[0, -1])
    yield Sample.of(rng.standard_normal(5), axis=[0])
    yield Sample.of(rng.standard_normal(()), axis=[0])


# -- joining and splitting: concat, stack, split -------------------------------------------------------------


def _same_dims(op_name, dims):
    """One size from several that must agree (unknown ones match anything)."""
    known = {d for d in dims if d is not None}
    if len(known) > 1:
        raise ShapeError(f"{op_name}(): sizes {list(dims)} must agree")
    return known.pop() if known else None


@op("concat(Tensor[] xs, int axis/dim=0) -> Tensor y")
def concat(xs, *, axis):
    """Joins tensors along an existing dim ``axis``; the other dims must agree (``torch.cat``)."""
    return np.concatenate(xs, axis=axis, dtype=D.promote(*(x.dtype for x in xs)))


@concat.onnx
def _(g, xs, *, axis):
    dtype = g.outputs[0].dtype
    return g.op("Concat", *(g.cast(x, dtype) for x in xs), axis=axis)


@concat.infer
def _(xs, *, axis):
    if not xs:
        raise ShapeError("concat(): needs at least one tensor")
    ndim = len(xs[0].shape)
    if ndim == 0 or any(len(s.shape) != ndim for s in xs):
        raise ShapeError(f"concat(): the tensors must all have the same rank, at least 1; got shapes "
                         f"{[s.shape for s in xs]} (use stack to join 0-d tensors)")
    a = _one_axis("concat", axis, ndim)
    shape = []
    for d in range(ndim):
        dims = [s.shape[d] for s in xs]
        if d == a:
            shape.append(None if None in dims else sum(dims))
        else:
            try:
                shape.append(_same_dims("concat", dims))
            except ShapeError:
                raise ShapeError(f"concat(): shapes {[s.shape for s in xs]} differ in dim {d}, "
                                 f"which is not the axis {axis}") from None
    return Spec(tuple(shape), D.promote(*(s.dtype for s in xs)))


@concat.grad
def _(xs_spec, dy, *, axis):
    if len(xs_spec) == 1:
        return [F.identity(dy)]
    return F.split(dy, sections=[s.shape[axis] for s in xs_spec], axis=axis)


@concat.sbp
def _(xs, *, axis):
    ndim = len(xs[0].shape)
    for k in range(ndim):  # every piece split alike along another dim: each rank joins its blocks
        if k != axis % ndim:
            yield (S(k),), S(k)
    yield (P,), P


@concat.samples
def _(rng):
    yield Sample.of([rng.standard_normal((2, 3)), rng.standard_normal((4, 3))])
    yield Sample.of([rng.standard_normal((2, 1)), rng.standard_normal((2, 3)), rng.standard_normal((2, 2))], axis=-1)
    yield Sample.of([rng.standard_normal(3)])


@op("stack(Tensor[] xs, int axis/dim=0) -> Tensor y")
def stack(xs, *, axis):
    """Joins tensors of one shape along a new dim ``axis`` (in [-ndim-1, ndim], counted in the result)."""
    return np.stack(xs, axis=axis, dtype=D.promote(*(x.dtype for x in xs)))


@stack.onnx
def _(g, xs, *, axis):
    dtype = g.outputs[0].dtype
    axis = axis % (xs[0].ndim + 1)
    return g.op("Concat", *(g.op("Unsqueeze", g.cast(x, dtype), g.ints([axis])) for x in xs), axis=axis)


@stack.infer
def _(xs, *, axis):
    if not xs:
        raise ShapeError("stack(): needs at least one tensor")
    ndim = len(xs[0].shape)
    if any(len(s.shape) != ndim for s in xs):
        raise ShapeError(f"stack(): the tensors must all have one shape, got {[s.shape for s in xs]}")
    try:
        shape = [_same_dims("stack", [s.shape[d] for s in xs]) for d in range(ndim)]
    except ShapeError:
        raise ShapeError(f"stack(): the tensors must all have one shape, got {[s.shape for s in xs]}") from None
    a = _one_axis("stack", axis, ndim + 1)
    return Spec((*shape[:a], len(xs), *shape[a:]), D.promote(*(s.dtype for s in xs)))


@stack.grad
def _(dy, *, axis):
    return [F.squeeze(g, axis=[axis]) for g in F.split(dy, sections=[1], axis=axis)]


@stack.sbp
def _(xs, *, axis):
    ndim = len(xs[0].shape)
    a = axis % (ndim + 1)
    for k in range(ndim):
        yield (S(k),), S(k if k < a else k + 1)
    yield (P,), P


@stack.samples
def _(rng):
    yield Sample.of([rng.standard_normal((2, 3)), rng.standard_normal((2, 3))])
    yield Sample.of([rng.standard_normal((2, 3)) for _ in range(3)], axis=-1)
    yield Sample.of([rng.standard_normal(()), rng.standard_normal(())])


def _split_sizes(size, sections):
    """The size of each piece: ``sections`` itself, or, when it holds one number n, pieces of n (the last one
    smaller), as ``torch.split(x, n)``. The two readings agree whenever a one-entry list of sizes is valid."""
    if len(sections) > 1:
        return list(sections)
    chunk = sections[0]
    return [chunk] * (size // chunk) + ([size % chunk] if size % chunk or size == 0 else [])


@op("split(Tensor x, int[] sections/split_size_or_sections, int axis/dim=0) -> Tensor[] ys", traits=["view"])
def split(x, *, sections, axis):
    """Cuts ``x`` along ``axis`` into pieces of the sizes in ``sections`` (which must add up to the dim), or, when
    ``sections`` is one number n (``split(x, sections=n)``), into pieces of n, the last one smaller: both as
    ``torch.split``. The pieces are views of ``x``."""
    a, sizes = _split_plan(x.shape, sections, axis)
    return np.split(x, np.cumsum(sizes)[:-1].tolist(), axis=a)  # (host offsets, as a list: a device takes those)


@split.onnx
def _(g, x, *, sections, axis):
    sizes = [s.shape[axis] for s in g.outputs]
    if len(sizes) == 1:
        return [g.op("Identity", x)]
    return list(g.op("Split", x, g.ints(sizes), axis=axis, outputs=len(sizes)))


@split.check
def _(*, sections, axis):
    known = [s for s in sections if isinstance(s, int)]  # in a program, a size may be known at run time only
    if not sections or any(s < 0 for s in known) or (len(sections) == 1 and known and known[0] < 1):
        raise ValueError(f"argument 'sections' must be a list of sizes >= 0 or one chunk size >= 1, "
                         f"got {list(sections)}")


def _split_plan(shape, sections, axis):
    """The (non-negative) axis and the size of each piece, checked against ``shape``."""
    if not shape:
        raise ShapeError("split(): cannot split a 0-d tensor")
    a = _one_axis("split", axis, len(shape))
    size = shape[a]
    if size is None and len(sections) == 1:
        raise ShapeError(f"split(): the number of pieces of size {sections[0]} depends on dim {a}, "
                         "whose size is unknown")
    sizes = _split_sizes(size, sections) if size is not None else list(sections)
    if size is not None and None not in sizes and sum(sizes) != size:
        raise ShapeError(f"split(): sections {list(sections)} add up to {sum(sizes)}, "
                         f"but dim {a} of a tensor of shape {shape} has size {size}")
    return a, sizes


@split.infer
def _(x, *, sections, axis):
    a, sizes = _split_plan(x.shape, sections, axis)
    return ([Spec((*x.shape[:a], n, *x.shape[a + 1:]), x.dtype) for n in sizes],)


@split.grad
def _(dys, *, axis):
    return F.concat(dys, axis=axis)


@split.sbp
def _(x, *, sections, axis):
    for k in range(len(x.shape)):  # cut along another dim than the split one: each rank cuts its block alike
        if k != axis % len(x.shape):
            yield (S(k),), S(k)
    yield (P,), P


@split.samples
def _(rng):
    yield Sample.of(rng.standard_normal((5, 3)), sections=[2, 3])
    yield Sample.of(rng.standard_normal((2, 7)), sections=[3], axis=-1)  # pieces of 3, 3, 1
    yield Sample.of(rng.standard_normal((2, 4)), sections=[1, 0, 3], axis=1)
    yield Sample.of(rng.standard_normal(4), sections=[4])


# -- repeating and masking: tile, tril, triu -----------------------------------------------------------------


@op("tile(Tensor x, int[] reps/dims) -> Tensor y")
def tile(x, *, reps):
    """``x`` repeated ``reps[i]`` times along dim i (``torch.tile``, ``np.tile``): the shorter of ``x.shape`` and
    ``reps`` is padded with leading 1s."""
    return np.tile(x, reps)


@tile.onnx
def _(g, x, *, reps):
    if len(reps) > x.ndim:  # np.tile: the shorter of shape and reps gets leading 1s
        x = g.op("Unsqueeze", x, g.ints(range(len(reps) - x.ndim)), spec=Spec((1,) * len(reps), x.dtype))
    reps = [1] * (x.ndim - len(reps)) + list(reps) if x.spec and len(reps) < x.ndim else list(reps)
    return g.op("Tile", x, g.ints(reps))


@tile.check
def _(*, reps):
    if any(r < 0 for r in reps):
        raise ValueError(f"argument 'reps' must hold counts >= 0, got {list(reps)}")


def _tile_dims(shape, reps):
    n = max(len(shape), len(reps))
    return (1,) * (n - len(shape)) + tuple(shape), (1,) * (n - len(reps)) + tuple(reps)


@tile.infer
def _(x, *, reps):
    shape, reps = _tile_dims(x.shape, reps)
    return Spec(tuple(None if s is None or r is None else s * r for s, r in zip(shape, reps)), x.dtype)


@tile.grad
def _(dy, x_spec, *, reps):
    # y viewed as (r₀, s₀, r₁, s₁, ...) holds rᵢ copies of x along each dim: dx is the sum over the copies.
    shape, reps = _tile_dims(x_spec.shape, reps)
    if not shape:  # a 0-d x tiled by no reps: y is x
        return F.reshape(dy, shape=x_spec.shape)
    copies = F.reshape(dy, shape=[d for r, s in zip(reps, shape) for d in (r, s)])
    return F.reshape(F.sum(copies, axis=list(range(0, 2 * len(shape), 2))), shape=x_spec.shape)


@tile.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), reps=[2, 1])
    yield Sample.of(rng.standard_normal(3), reps=[2, 2])  # more reps than dims
    yield Sample.of(rng.standard_normal((2, 1, 2)), reps=[3])  # fewer reps than dims
    yield Sample.of(rng.standard_normal(()), reps=[2])


def _matrices(op_name, shape):
    if len(shape) < 2:
        raise ShapeError(f"{op_name}(): needs a tensor of rank >= 2 (a matrix or a batch of them), got shape {shape}")


def _triangle_spec(op_name):
    def infer(x, *, diagonal):
        _matrices(op_name, x.shape)
        return x

    return infer


def _triangle_samples(rng):
    yield Sample.of(rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((2, 3, 3)), diagonal=1)
    yield Sample.of(rng.standard_normal((4, 3)), diagonal=-2)


@op("tril(Tensor x, int diagonal=0) -> Tensor y", infer=_triangle_spec("tril"))
def tril(x, *, diagonal):
    """The lower triangle of each matrix (last two dims): elements (i, j) with j - i <= ``diagonal``, others 0."""
    _matrices("tril", x.shape)
    return np.tril(x, diagonal)


tril.onnx(lambda g, x, *, diagonal: g.op("Trilu", x, g.const(np.array(diagonal, np.int64)), upper=0))


@tril.grad
def _(dy, *, diagonal):
    return F.tril(dy, diagonal=diagonal)


@op("triu(Tensor x, int diagonal=0) -> Tensor y", infer=_triangle_spec("triu"))
def triu(x, *, diagonal):
    """The upper triangle of each matrix (last two dims): elements (i, j) with j - i >= ``diagonal``, others 0."""
    _matrices("triu", x.shape)
    return np.triu(x, diagonal)


triu.onnx(lambda g, x, *, diagonal: g.op("Trilu", x, g.const(np.array(diagonal, np.int64)), upper=1))


@triu.grad
def _(dy, *, diagonal):
    return F.triu(dy, diagonal=diagonal)


tril.samples(_triangle_samples)
triu.samples(_triangle_samples)


# -- roll, repeat_interleave, diagonal -------------------------------------------------------------------------


@op("roll(Tensor x, int[] shifts, int[] axis/dims=None) -> Tensor y")
def roll(x, *, shifts, axis):
    """``torch.roll``: the elements shifted by ``shifts[i]`` along ``axis[i]``, those pushed off one end coming back
    at the other. With ``axis=None``, the flattened tensor is rolled by the one shift and reshaped back. An axis
    may repeat (its shifts add up)."""
    _roll_axes(x.shape, shifts, axis)
    return np.roll(x, shifts[0] if axis is None else shifts, axis=axis)


def _roll_axes(shape, shifts, axis):
    if axis is None:
        if len(shifts) != 1:
            raise ShapeError(f"roll(): without axis, shifts must hold one number (the flattened tensor is rolled), "
                             f"got {list(shifts)}")
        return None
    if len(shifts) != len(axis):
        raise ShapeError(f"roll(): shifts {list(shifts)} and axis {list(axis)} must have one entry each")
    return [_one_axis("roll", a, len(shape)) for a in axis]


@roll.infer
def _(x, *, shifts, axis):
    _roll_axes(x.shape, shifts, axis)
    return x


@roll.grad
def _(dy, *, shifts, axis):
    return F.roll(dy, shifts=[-s for s in shifts], axis=axis)


@roll.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), shifts=[1, -2], axis=[0, 1])
    yield Sample.of(rng.standard_normal((3, 4)), shifts=[5])  # flattened
    yield Sample.of(rng.standard_normal((2, 3, 4)), shifts=[1, 2, 7], axis=[-1, 0, -1])  # axis -1 twice
    yield Sample.of(rng.standard_normal(()), shifts=[3])


@roll.onnx
def _(g, x, *, shifts, axis):
    if axis is None:  # the flattened tensor rolled, and shaped back
        flat = g.op("Reshape", x, g.ints([-1]), spec=Spec((None,), x.dtype))
        return g.op("Reshape", _onnx_roll(g, flat, shifts[0], 0), g.op("Shape", x), spec=g.outputs[0])
    for s, a in zip(shifts, axis):
        x = _onnx_roll(g, x, s, a % x.ndim)
    return x


def _onnx_roll(g, x, shift, a):
    """x rolled by ``shift`` along axis ``a``: its last (shift mod n) elements, then the others (n read at run
    time)."""
    n = g.op("Shape", x, start=a, end=a + 1, spec=Spec((1,), D.int64))
    cut = g.op("Sub", n, g.op("Mod", g.ints([shift]), n, fmod=0))  # Mod of int64: the sign of n, as Python's %
    axes = g.ints([a])
    tail = g.op("Slice", x, cut, g.ints([2**63 - 1]), axes, spec=x.spec)
    head = g.op("Slice", x, g.ints([0]), cut, axes, spec=x.spec)
    return g.op("Concat", tail, head, axis=a, spec=x.spec)


def _repeat_plan(op_name, shape, repeats, axis):
    """(the axis repeated, or None for the flattened tensor; the size of the dim before and after repeating)."""
    if axis is None:
        n = None if None in shape else math.prod(shape)
    else:
        if not shape:
            raise ShapeError(f"{op_name}(): a 0-d tensor has no axis {axis} (pass axis=None)")
        axis = _one_axis(op_name, axis, len(shape))
        n = shape[axis]
    if len(repeats) == 1:
        m = None if n is None else n * repeats[0]
    elif n is not None and len(repeats) != n:
        raise ShapeError(f"{op_name}(): repeats holds {len(repeats)} counts, but the dim it repeats has {n} "
                         f"elements (shape {shape}, axis {axis}); give one count, or one per element")
    else:
        n, m = len(repeats), builtins.sum(repeats)
    rest = 1 if axis is None else math.prod(d for i, d in enumerate(shape) if i != axis and d is not None)
    if m is not None and m * rest > 2**62:  # NumPy's repeat overflows its size computation there (and crashes)
        raise ShapeError(f"{op_name}(): these repeats would give {m * rest} elements, more than any array holds")
    return axis, n, m


def _repeat_check(*, repeats, **_):
    if not repeats or any(r < 0 for r in repeats):
        raise ValueError(f"argument 'repeats' must hold counts >= 0 (one, or one per element), got {list(repeats)}")


def _repeated_shape(op_name, shape, repeats, axis):
    a, _, m = _repeat_plan(op_name, shape, repeats, axis)
    return (m,) if a is None else (*shape[:a], m, *shape[a + 1:])


@op("repeat_interleave(Tensor x, int[] repeats, int? axis/dim=None) -> Tensor y")
def repeat_interleave(x, *, repeats, axis):
    """``torch.repeat_interleave``: each element (each slice along ``axis``) repeated ``repeats[i]`` times in place:
    [a, b] with repeats [2] gives [a, a, b, b], with [1, 3] gives [a, b, b, b]. With ``axis=None`` the flattened
    tensor is repeated. ``repeats`` is a list (one count for all, or one per element), not a tensor, so that the
    result's shape is known without the data: for counts in a tensor ``r``, pass ``repeats=r.tolist()``."""
    a, _, _ = _repeat_plan("repeat_interleave", x.shape, repeats, axis)
    return np.repeat(x.reshape(-1) if a is None else x, repeats[0] if len(repeats) == 1 else repeats,
                     axis=0 if a is None else a)


repeat_interleave.check(_repeat_check)


@repeat_interleave.infer
def _(x, *, repeats, axis):
    return Spec(_repeated_shape("repeat_interleave", x.shape, repeats, axis), x.dtype)


@repeat_interleave.grad
def _(dy, x_spec, *, repeats, axis):
    return F.repeat_interleave_grad(dy, shape=x_spec.shape, repeats=repeats, axis=axis)


@repeat_interleave.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), repeats=[2], axis=1)
    yield Sample.of(rng.standard_normal((3, 2)), repeats=[1, 0, 3], axis=0)
    yield Sample.of(rng.standard_normal((2, 2)), repeats=[2, 1, 1, 3])  # flattened, one count per element
    yield Sample.of(rng.standard_normal(()), repeats=[3])


@repeat_interleave.onnx
def _(g, x, *, repeats, axis):
    a, n, _ = _repeat_plan("repeat_interleave", x.shape, repeats, axis)
    if a is None:
        x, a = g.op("Reshape", x, g.ints([-1]), spec=Spec((n,), x.dtype)), 0
    if len(repeats) > 1 or n is not None:  # a Gather of each element as many times as it repeats
        counts = np.broadcast_to(np.asarray(repeats), (n,))
        return g.op("Gather", x, g.const(np.repeat(np.arange(n), counts)), axis=a, spec=g.outputs[0])
    # one count, a size known at run time: each slice tiled along a new dim after it, which is then merged into it
    r = repeats[0]
    tiled = g.op("Tile", g.op("Unsqueeze", x, g.ints([a + 1])), g.ints([r if i == a + 1 else 1
                                                                        for i in range(x.ndim + 1)]))
    shape = g.op("Shape", x)
    merged = g.op("Concat", g.op("Slice", shape, g.ints([0]), g.ints([a])), g.ints([-1]),
                  g.op("Slice", shape, g.ints([a + 1]), g.ints([x.ndim])), axis=0)
    return g.op("Reshape", tiled, merged, spec=g.outputs[0])


@op("repeat_interleave_grad(Tensor dy, *, int[] shape, int[] repeats, int? axis=None) -> Tensor dx")
def repeat_interleave_grad(dy, *, shape, repeats, axis):
    """Gradient of ``repeat_interleave``: the copies of each element of an input of ``shape`` summed back into it."""
    a, n, _ = _repeat_plan("repeat_interleave_grad", tuple(shape), repeats, axis)
    counts = np.broadcast_to(np.asarray(repeats), (n,))
    dx = np.zeros((n, *dy.shape[1:]) if a is None else (*dy.shape[:a], n, *dy.shape[a + 1:]), dy.dtype, like=dy)
    array_module(dx).add.at(dx, (builtins.slice(None),) * (a or 0) + (np.repeat(np.arange(n), counts),), dy)
    return dx.reshape(shape)


repeat_interleave_grad.check(_repeat_check)


@repeat_interleave_grad.infer
def _(dy, *, shape, repeats, axis):
    expected = _repeated_shape("repeat_interleave_grad", tuple(shape), repeats, axis)
    if not shapes_agree(dy.shape, expected):
        raise ShapeError(f"repeat_interleave_grad(): dy has shape {dy.shape}, repeating {list(shape)} gives "
                         f"{expected}")
    return Spec(tuple(shape), dy.dtype)


@repeat_interleave_grad.grad
def _(ddx, *, repeats, axis):
    return F.repeat_interleave(ddx, repeats=repeats, axis=axis)


@repeat_interleave_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 6)), shape=[2, 3], repeats=[2], axis=1)
    yield Sample.of(rng.standard_normal((4, 2)), shape=[3, 2], repeats=[1, 0, 3], axis=0)
    yield Sample.of(rng.standard_normal(3), shape=[], repeats=[3])


def _diagonal_plan(op_name, shape, offset, axis1, axis2):
    """(axis1, axis2 non-negative; the diagonal's length): as np.diagonal, ``offset`` > 0 above the main one."""
    if len(shape) < 2:
        raise ShapeError(f"{op_name}(): needs a tensor of rank >= 2, got shape {shape}")
    a1, a2 = _one_axis(op_name, axis1, len(shape)), _one_axis(op_name, axis2, len(shape))
    if a1 == a2:
        raise ShapeError(f"{op_name}(): axis1 and axis2 must be two different dims, got {axis1} and {axis2}")
    n1, n2 = shape[a1], shape[a2]
    if n1 is None or n2 is None:
        return a1, a2, None
    return a1, a2, builtins.max(0, builtins.min(n1 + builtins.min(offset, 0), n2 - builtins.max(offset, 0)))


def _diagonal_shape(shape, a1, a2, length):
    return (*(d for i, d in enumerate(shape) if i not in (a1, a2)), length)


@op("diagonal(Tensor x, int offset=0, int axis1/dim1=0, int axis2/dim2=1) -> Tensor y")
def diagonal(x, *, offset, axis1, axis2):
    """``torch.diagonal`` (``np.diagonal``): the elements (i, i + offset) of the matrices spanned by ``axis1`` and
    ``axis2``, in a new last dim; the other dims stay in order. ``offset`` > 0 is above the main diagonal."""
    _diagonal_plan("diagonal", x.shape, offset, axis1, axis2)
    return np.diagonal(x, offset, axis1, axis2).copy()  # NumPy gives a read-only view


@diagonal.infer
def _(x, *, offset, axis1, axis2):
    return Spec(_diagonal_shape(x.shape, *_diagonal_plan("diagonal", x.shape, offset, axis1, axis2)), x.dtype)


@diagonal.grad
def _(dy, x_spec, *, offset, axis1, axis2):
    return F.diagonal_grad(dy, shape=x_spec.shape, offset=offset, axis1=axis1, axis2=axis2)


@diagonal.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((3, 4)), offset=1)
    yield Sample.of(rng.standard_normal((2, 3, 4)), offset=-1, axis1=-1, axis2=0)
    yield Sample.of(rng.standard_normal((2, 3)), offset=4)  # beyond the matrix: empty


@diagonal.onnx
def _(g, x, *, offset, axis1, axis2):
    a1, a2, length = _diagonal_plan("diagonal", x.shape, offset, axis1, axis2)
    if length is None:
        raise g.unsupported(f"the diagonal of dims {a1}, {a2} of sizes known only at run time (shape {x.shape})")
    # the two dims moved last and merged: the diagonal is a Gather of flat positions there
    rest = [i for i in range(x.ndim) if i not in (a1, a2)]
    n2 = x.shape[a2]
    moved = g.op("Transpose", x, perm=[*rest, a1, a2])
    merged = g.op("Reshape", moved, g.ints([0] * len(rest) + [-1]))
    k = np.arange(length)
    flat = (k - builtins.min(offset, 0)) * n2 + k + builtins.max(offset, 0)
    return g.op("Gather", merged, g.const(flat.astype(np.int64)), axis=len(rest), spec=g.outputs[0])


@op("diagonal_grad(Tensor dy, *, int[] shape, int offset=0, int axis1=0, int axis2=1) -> Tensor dx")
def diagonal_grad(dy, *, shape, offset, axis1, axis2):
    """Gradient of ``diagonal``: zeros of ``shape`` with ``dy`` written on the diagonal ``diagonal`` reads (with
    ``axis1``, ``axis2`` = -2, -1, ``torch.diag_embed``)."""
    a1, a2, length = _diagonal_grad_plan(dy.shape, shape, offset, axis1, axis2)
    dx = np.zeros(shape, dy.dtype, like=dy)
    k = np.arange(length)
    np.moveaxis(dx, (a1, a2), (-2, -1))[..., k - builtins.min(offset, 0), k + builtins.max(offset, 0)] = dy
    return dx


def _diagonal_grad_plan(dy_shape, shape, offset, axis1, axis2):
    plan = _diagonal_plan("diagonal_grad", tuple(shape), offset, axis1, axis2)
    expected = _diagonal_shape(shape, *plan)
    if not shapes_agree(dy_shape, expected):
        raise ShapeError(f"diagonal_grad(): dy has shape {dy_shape}, the diagonal of {list(shape)} has {expected}")
    return plan


@diagonal_grad.infer
def _(dy, *, shape, offset, axis1, axis2):
    _diagonal_grad_plan(dy.shape, shape, offset, axis1, axis2)
    return Spec(tuple(shape), dy.dtype)


@diagonal_grad.grad
def _(ddx, *, offset, axis1, axis2):
    return F.diagonal(ddx, offset=offset, axis1=axis1, axis2=axis2)


@diagonal_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal(3), shape=[3, 4], offset=1)
    yield Sample.of(rng.standard_normal((3, 2)), shape=[2, 3, 4], offset=-1, axis1=-1, axis2=0)


# -- pad -----------------------------------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_pairs(pad, ndim):
    """torch's flat ``pad`` (last dim first: left, right, then the dim before, ...) -> one (before, after) per dim."""
    pairs = [(0, 0)] * ndim
    for k in range(len(pad) // 2):
        pairs[ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    return pairs


def _pad_check(*, pad, mode, **_):
    if mode not in _PAD_MODES:
        raise ValueError(f"argument 'mode' must be one of {', '.join(map(repr, _PAD_MODES))}, got {mode!r}")
    if len(pad) % 2:
        raise ValueError(f"argument 'pad' must hold pairs (before, after) per dim, last dim first; "
                         f"got {len(pad)} numbers")


def _pad_problem(n, before, after, mode):
    """Why ``mode`` cannot pad a dim of size ``n`` by (before, after), or None. A negative pad crops first."""
    if mode == "constant" or not (before or after):
        return None
    if n == 0:
        return f"an empty dim has nothing to {dict(reflect='mirror', replicate='repeat', circular='wrap')[mode]}"
    if mode == "reflect" and max(before, after) > n - 1:  # the mirror image of n elements holds n - 1 more
        return f"needs pads <= {n - 1}"
    kept = n - max(-before, 0) - max(-after, 0)
    if mode == "circular" and max(before, after) > kept:  # PyTorch reads memory it never wrote here
        return f"needs pads <= {kept}, the size left after cropping (it wraps around once at most)"
    return None


def _padded_shape(op_name, shape, pad, mode):
    if len(pad) // 2 > len(shape):
        raise ShapeError(f"{op_name}(): pad {list(pad)} pads {len(pad) // 2} dims, "
                         f"a tensor of shape {shape} has {len(shape)}")
    out = []
    for d, (n, (before, after)) in enumerate(zip(shape, _pad_pairs(pad, len(shape)))):
        if n is None or before is None or after is None:  # (a pad computed at run time: checked then)
            out.append(None)
            continue
        if n + before + after < 0:
            raise ShapeError(f"{op_name}(): pads ({before}, {after}) crop more than dim {d} of size {n} holds")
        problem = _pad_problem(n, before, after, mode)
        if problem:
            raise ShapeError(f"{op_name}(): padding dim {d} of size {n} by ({before}, {after}) in mode '{mode}' "
                             f"{problem}")
        out.append(n + before + after)
    return tuple(out)


def _pad_source(n, before, after, mode):
    """For each position along a dim of size ``n`` padded by (before, after), the index of the element it copies
    (modes "reflect", "replicate", "circular"). As PyTorch: reflect and replicate read position p - before of
    the uncropped dim (mirrored or clamped into it); circular wraps around what is left after cropping."""
    if mode == "circular":
        start, kept = max(-before, 0), n - max(-before, 0) - max(-after, 0)
        return start + (np.arange(n + before + after) - max(before, 0)) % builtins.max(kept, 1)
    p = np.arange(-before, n + after)
    if mode == "replicate":
        return np.clip(p, 0, n - 1)
    p = np.abs(p)
    return np.where(p > n - 1, 2 * (n - 1) - p, p)


@op('pad(Tensor x, int[] pad, str mode="constant", float value=0.0) -> Tensor y')
def pad(x, *, pad, mode, value):
    """Pads ``x`` as ``torch.nn.functional.pad``: ``pad`` lists (before, after) pairs from the last dim backwards.
    Modes: "constant" (fill with ``value``), "reflect" (mirror without repeating the edge: pads < the dim's size),
    "replicate" (repeat the edge), "circular" (wrap around, once at most). A negative pad crops, in every mode,
    as in PyTorch. Any dims can be padded (PyTorch pads only the last 1-3 dims in the modes other than constant)."""
    _padded_shape("pad", x.shape, pad, mode)
    pairs = _pad_pairs(pad, x.ndim)
    if mode == "constant":
        x = x[tuple(builtins.slice(-min(b, 0), n + min(a, 0)) for n, (b, a) in zip(x.shape, pairs))]  # crop
        pairs = [(max(b, 0), max(a, 0)) for b, a in pairs]
        return np.pad(x, pairs, constant_values=value) if any(b or a for b, a in pairs) else x.copy()
    y = x
    for d, (before, after) in enumerate(pairs):
        if before or after:
            y = np.take(y, np.asarray(_pad_source(x.shape[d], before, after, mode), like=y), axis=d)
    return y if y is not x else x.copy()


@pad.onnx
def _(g, x, *, pad, mode, value):
    pairs = _pad_pairs(pad, x.ndim)
    onnx_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    if onnx_mode == "wrap" and g.opset < 19:  # no mode 'wrap' before 19: the kernel's Gather of each padded dim
        y = x
        for d, (before, after) in enumerate(pairs):
            if not (before or after):
                continue
            if x.shape[d] is None:
                raise g.unsupported(f"mode 'circular' over dim {d} of a size known only at run time needs opset 19 "
                                    "(Pad's mode 'wrap')")
            y = g.op("Gather", y, g.const(_pad_source(x.shape[d], before, after, mode)), axis=d)
        return g.op("Identity", y, spec=g.outputs[0])
    if not pairs:
        return g.op("Identity", x)
    pads = g.ints([b for b, _ in pairs] + [a for _, a in pairs])
    return g.op("Pad", x, pads, g.scalar(value, x) if mode == "constant" else None, mode=onnx_mode)


pad.check(_pad_check)


@pad.infer
def _(x, *, pad, mode, value):
    return Spec(_padded_shape("pad", x.shape, pad, mode), x.dtype)


@pad.grad
def _(dy, x_spec, *, pad, mode):
    if mode == "constant":  # the adjoint of padding with zeros is cropping, and the other way round
        return F.pad(dy, pad=[-p for p in pad])
    return F.pad_grad(dy, shape=x_spec.shape, pad=pad, mode=mode)


@pad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), pad=[1, 2])
    yield Sample.of(rng.standard_normal((2, 3, 4)), pad=[1, 0, -1, 2], value=1.5)
    yield Sample.of(rng.standard_normal((2, 5)), pad=[2, 3], mode="reflect")
    yield Sample.of(rng.standard_normal((2, 3, 4)), pad=[1, 2, 3, 0], mode="replicate")
    yield Sample.of(rng.standard_normal((1, 2, 4)), pad=[2, 4], mode="circular")
    yield Sample.of(rng.standard_normal(()), pad=[])
    yield Sample.of(rng.standard_normal((2, 5)), pad=[-1, 3], mode="reflect")  # crops, then pads
    yield Sample.of(rng.standard_normal((1, 3, 4)), pad=[2, -3, -1, 1], mode="replicate")
    yield Sample.of(rng.standard_normal((2, 5)), pad=[-2, 3], mode="circular")
    yield Sample.of(rng.standard_normal((0, 2, 3)), pad=[1, 1], mode="reflect")  # an empty dim that is not padded


@op("pad_grad(Tensor dy, *, int[] shape, int[] pad, str mode) -> Tensor dx")
def pad_grad(dy, *, shape, pad, mode):
    """Gradient of ``pad`` in modes "reflect", "replicate" and "circular": each element of ``dy`` is added to the
    element of an input of ``shape`` that the padded position copied."""
    _pad_grad_spec(dy.shape, shape, pad, mode)
    dx = dy
    for d, (before, after) in enumerate(_pad_pairs(pad, len(shape))):
        if before or after:
            acc = np.zeros((*dx.shape[:d], shape[d], *dx.shape[d + 1:]), dy.dtype, like=dy)
            where = (builtins.slice(None),) * d + (_pad_source(shape[d], before, after, mode),)
            array_module(acc).add.at(acc, where, dx)
            dx = acc
    return dx if dx is not dy else dy.copy()


@pad_grad.check
def _(*, shape, pad, mode):
    _pad_check(pad=pad, mode=mode)
    if mode == "constant":
        raise ValueError("argument 'mode': the gradient of constant padding is pad() with the pads negated")


def _pad_grad_spec(dy_shape, shape, pad, mode):
    expected = _padded_shape("pad_grad", tuple(shape), pad, mode)
    if not shapes_agree(dy_shape, expected):
        raise ShapeError(f"pad_grad(): dy has shape {dy_shape}, padding {list(shape)} by {list(pad)} "
                         f"gives {expected}")


@pad_grad.infer
def _(dy, *, shape, pad, mode):
    _pad_grad_spec(dy.shape, shape, pad, mode)
    return Spec(tuple(shape), dy.dtype)


@pad_grad.grad
def _(ddx, *, pad, mode):
    return F.pad(ddx, pad=pad, mode=mode)


@pad_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 10)), shape=[2, 5], pad=[2, 3], mode="reflect")
    yield Sample.of(rng.standard_normal((1, 3, 6, 7)), shape=[1, 2, 3, 4], pad=[1, 2, 3, 0, 1, 0], mode="replicate")
    yield Sample.of(rng.standard_normal((1, 10)), shape=[1, 4], pad=[2, 4], mode="circular")
    yield Sample.of(rng.standard_normal((3, 5)), shape=[3, 4], pad=[-2, 3], mode="reflect")


# -- torch's functions written with the ops above: flatten, unflatten, chunk, unbind, narrow, t -----------------------


def _dim(name: str, dim, ndim: int) -> int:
    """One dim in [-ndim, ndim) (a 0-d tensor takes 0 and -1, as torch) -> non-negative."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, (bool, np.bool_)):
        raise ArgumentError(f"{name}(): argument 'dim' expected int, got {describe(dim)}")
    return _one_axis(name, int(dim), builtins.max(ndim, 1))


@function
def flatten(x, start_dim=0, end_dim=-1):
    """``torch.flatten``: dims ``start_dim`` .. ``end_dim`` merged into one (a 0-d tensor becomes 1-d)."""
    shape = list(x.shape)
    if not shape:
        return F.reshape(x, [1])
    start, end = _dim("flatten", start_dim, len(shape)), _dim("flatten", end_dim, len(shape))
    if start > end:
        raise ArgumentError(f"flatten(): start_dim {start_dim} comes after end_dim {end_dim}")
    merged = shape[start:end + 1]
    size = math.prod(merged) if all(isinstance(d, int) for d in merged) else -1  # -1: a size known at run time
    return F.reshape(x, [*shape[:start], size, *shape[end + 1:]])


@function
def unflatten(x, dim, sizes):
    """``torch.unflatten``: dim ``dim`` split into dims of ``sizes`` (one of them may be -1)."""
    shape = list(x.shape)
    d = _dim("unflatten", dim, len(shape))
    return F.reshape(x, [*shape[:d], *sizes, *shape[d + 1:]])


@function
def chunk(x, chunks, dim=0):
    """``torch.chunk``: ``x`` cut along ``dim`` into at most ``chunks`` pieces of ceil(size / chunks) elements, the
    last one smaller (so there may be fewer pieces than asked for). A tuple, as torch's."""
    if not isinstance(chunks, (int, np.integer)) or isinstance(chunks, bool) or chunks < 1:
        raise ArgumentError(f"chunk(): argument 'chunks' must be an int >= 1, got {describe(chunks)}")
    size = x.shape[_dim("chunk", dim, len(x.shape))]
    return tuple(F.split(x, [builtins.max(-(-size // int(chunks)), 1)], dim))


@function
def unbind(x, dim=0):
    """``torch.unbind``: the slices of ``x`` along ``dim``, that dim removed, as a tuple."""
    d = _dim("unbind", dim, len(x.shape))
    if not x.shape[d]:
        return ()
    return tuple(F.squeeze(piece, [d]) for piece in F.split(x, [1], d))


@function
def narrow(x, dim, start, length):
    """``torch.narrow``: elements ``start`` .. ``start + length - 1`` along ``dim`` (``start`` may be negative)."""
    d = _dim("narrow", dim, len(x.shape))
    size = x.shape[d]
    begin = start + size if start < 0 else start
    if not 0 <= begin <= size or length < 0 or begin + length > size:
        raise ShapeError(f"narrow(): start {start} and length {length} do not fit in dim {dim} of size {size}")
    start = begin
    return F.slice(x, axes=[d], starts=[start], ends=[start + length], steps=[1])


@function
def t(x):
    """``torch.t``: a 2-D tensor transposed; 0-D and 1-D tensors as they are."""
    if len(x.shape) > 2:
        raise ShapeError(f"t(): expects a tensor of at most 2 dims, got shape {tuple(x.shape)} (use transpose(d0, d1) "
                         "or permute)")
    return F.transpose(x) if len(x.shape) == 2 else F.identity(x)
