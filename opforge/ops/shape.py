"""Ops that move elements around without changing them: reshape, transpose, broadcast, slice, squeeze, permute,
concat, stack, split, flip, tile, tril/triu, pad; and indexing by integer tensors: take, gather, index_select,
scatter_add, one_hot."""

import builtins

from opforge import ops as F

from ..core.errors import ArgumentError
from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, normalize_axes, np, op


@op("reshape(Tensor x, *, int[] shape) -> Tensor y")
def reshape(x, *, shape):
    """The same elements in a new shape; one dim may be -1 (inferred)."""
    return np.reshape(x, shape)


@reshape.infer
def _(x, *, shape):
    if None in shape:  # a size known at run time (inside a program): checked by the executor then
        return Spec(tuple(shape), x.dtype)
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
    return Spec(tuple(x.shape[p] for p in _permutation("transpose", perm, x.shape)), x.dtype)


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
    if any(d is not None and d < 0 for d in shape):
        raise ShapeError(f"slice_grad(): argument 'shape' {list(shape)} has a negative size")
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


@op("squeeze(Tensor x, *, int[] axis=None) -> Tensor y")
def squeeze(x, *, axis):
    """Removes dims of size 1: every one when ``axis`` is None, else those listed (a listed dim whose size is
    not 1 is left alone, as in PyTorch)."""
    return np.squeeze(x, axis=_squeezed_axes("squeeze", x.shape, axis))


@squeeze.infer
def _(x, *, axis):
    drop = _squeezed_axes("squeeze", x.shape, axis)
    return Spec(tuple(d for i, d in enumerate(x.shape) if i not in drop), x.dtype)


@squeeze.grad
def _(dy, x_spec):
    return F.reshape(dy, shape=x_spec.shape)


@squeeze.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 1, 3, 1)))
    yield Sample.of(rng.standard_normal((2, 1, 3, 1)), axis=[-1])
    yield Sample.of(rng.standard_normal((1, 3)), axis=[0, 1])  # dim 1 (size 3) stays
    yield Sample.of(rng.standard_normal(()))


@op("unsqueeze(Tensor x, *, int axis) -> Tensor y")
def unsqueeze(x, *, axis):
    """Inserts a dim of size 1 at ``axis`` (in [-ndim-1, ndim], counted in the result)."""
    return np.expand_dims(x, axis)


@unsqueeze.infer
def _(x, *, axis):
    a = _one_axis("unsqueeze", axis, len(x.shape) + 1)
    return Spec((*x.shape[:a], 1, *x.shape[a:]), x.dtype)


@unsqueeze.grad
def _(dy, *, axis):
    return F.squeeze(dy, axis=[axis])  # the same axis of the result


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


@op("permute(Tensor x, *, int[] dims) -> Tensor y")
def permute(x, *, dims):
    """Reorders the dims: dim i of the result is dim ``dims[i]`` of ``x`` (``torch.permute``)."""
    return np.transpose(x, dims)


@permute.infer
def _(x, *, dims):
    return Spec(tuple(x.shape[p] for p in _permutation("permute", dims, x.shape)), x.dtype)


@permute.grad
def _(dy, *, dims):
    inverse = [int(i) for i in np.argsort([p % len(dims) for p in dims])]
    return F.permute(dy, dims=inverse)


@permute.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), dims=[2, 0, 1])
    yield Sample.of(rng.standard_normal((2, 3)), dims=[-1, 0])
    yield Sample.of(rng.standard_normal(()), dims=[])


@op("flip(Tensor x, *, int[] axis) -> Tensor y")
def flip(x, *, axis):
    """Reverses the order of the elements along each dim in ``axis``."""
    return np.flip(x, normalize_axes("flip", axis, x.ndim))


@flip.infer
def _(x, *, axis):
    normalize_axes("flip", axis, len(x.shape))
    return x


@flip.grad
def _(dy, *, axis):
    return F.flip(dy, axis=axis)


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


@op("concat(Tensor[] xs, *, int axis=0) -> Tensor y")
def concat(xs, *, axis):
    """Joins tensors along an existing dim ``axis``; the other dims must agree (``torch.cat``)."""
    return np.concatenate(xs, axis=axis)


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


@concat.samples
def _(rng):
    yield Sample.of([rng.standard_normal((2, 3)), rng.standard_normal((4, 3))])
    yield Sample.of([rng.standard_normal((2, 1)), rng.standard_normal((2, 3)), rng.standard_normal((2, 2))], axis=-1)
    yield Sample.of([rng.standard_normal(3)])


@op("stack(Tensor[] xs, *, int axis=0) -> Tensor y")
def stack(xs, *, axis):
    """Joins tensors of one shape along a new dim ``axis`` (in [-ndim-1, ndim], counted in the result)."""
    return np.stack(xs, axis=axis)


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


@op("split(Tensor x, *, int[] sections, int axis=0) -> Tensor[] ys")
def split(x, *, sections, axis):
    """Cuts ``x`` along ``axis`` into pieces of the sizes in ``sections`` (which must add up to the dim), or, when
    ``sections`` is one number n (``split(x, sections=n)``), into pieces of n, the last one smaller: both as
    ``torch.split``. The pieces are views of ``x``."""
    a, sizes = _split_plan(x.shape, sections, axis)
    return np.split(x, np.cumsum(sizes)[:-1], axis=a)


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


@split.samples
def _(rng):
    yield Sample.of(rng.standard_normal((5, 3)), sections=[2, 3])
    yield Sample.of(rng.standard_normal((2, 7)), sections=[3], axis=-1)  # pieces of 3, 3, 1
    yield Sample.of(rng.standard_normal((2, 4)), sections=[1, 0, 3], axis=1)
    yield Sample.of(rng.standard_normal(4), sections=[4])


# -- repeating and masking: tile, tril, triu -----------------------------------------------------------------


@op("tile(Tensor x, *, int[] reps) -> Tensor y")
def tile(x, *, reps):
    """``x`` repeated ``reps[i]`` times along dim i (``torch.tile``, ``np.tile``): the shorter of ``x.shape`` and
    ``reps`` is padded with leading 1s."""
    return np.tile(x, reps)


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
    return Spec(tuple(None if s is None else s * r for s, r in zip(shape, reps)), x.dtype)


@tile.grad
def _(dy, x_spec, *, reps):
    # y viewed as (r₀, s₀, r₁, s₁, ...) holds rᵢ copies of x along each dim: dx is the sum over the copies.
    shape, reps = _tile_dims(x_spec.shape, reps)
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


@op("tril(Tensor x, *, int diagonal=0) -> Tensor y", infer=_triangle_spec("tril"))
def tril(x, *, diagonal):
    """The lower triangle of each matrix (last two dims): elements (i, j) with j - i <= ``diagonal``, others 0."""
    _matrices("tril", x.shape)
    return np.tril(x, diagonal)


@tril.grad
def _(dy, *, diagonal):
    return F.tril(dy, diagonal=diagonal)


@op("triu(Tensor x, *, int diagonal=0) -> Tensor y", infer=_triangle_spec("triu"))
def triu(x, *, diagonal):
    """The upper triangle of each matrix (last two dims): elements (i, j) with j - i >= ``diagonal``, others 0."""
    _matrices("triu", x.shape)
    return np.triu(x, diagonal)


@triu.grad
def _(dy, *, diagonal):
    return F.triu(dy, diagonal=diagonal)


tril.samples(_triangle_samples)
triu.samples(_triangle_samples)


# -- pad -----------------------------------------------------------------------------------------------------

_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}  # -> np.pad


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
    if mode != "constant" and any(p < 0 for p in pad):
        raise ValueError(f"argument 'pad' may be negative (cropping) in mode 'constant' only, got {list(pad)}")


def _padded_shape(op_name, shape, pad, mode):
    if len(pad) // 2 > len(shape):
        raise ShapeError(f"{op_name}(): pad {list(pad)} pads {len(pad) // 2} dims, "
                         f"a tensor of shape {shape} has {len(shape)}")
    out = []
    for d, (n, (before, after)) in enumerate(zip(shape, _pad_pairs(pad, len(shape)))):
        if n is None:
            out.append(None)
            continue
        limit = {"constant": None, "reflect": n - 1, "circular": n, "replicate": None if n else 0}[mode]
        if limit is not None and max(before, after) > limit:
            raise ShapeError(f"{op_name}(): padding dim {d} of size {n} by ({before}, {after}) in mode '{mode}' "
                             f"needs pads <= {limit}")
        if n + before + after < 0:
            raise ShapeError(f"{op_name}(): pads ({before}, {after}) crop more than dim {d} of size {n} holds")
        out.append(n + before + after)
    return tuple(out)


@op('pad(Tensor x, *, int[] pad, str mode="constant", float value=0.0) -> Tensor y')
def pad(x, *, pad, mode, value):
    """Pads ``x`` as ``torch.nn.functional.pad``: ``pad`` lists (before, after) pairs from the last dim backwards.
    Modes: "constant" (fill with ``value``; negative pads crop), "reflect" (mirror without repeating the edge),
    "replicate" (repeat the edge), "circular" (wrap around)."""
    _padded_shape("pad", x.shape, pad, mode)
    pairs = _pad_pairs(pad, x.ndim)
    if mode == "constant":
        x = x[tuple(builtins.slice(-min(b, 0), n + min(a, 0)) for n, (b, a) in zip(x.shape, pairs))]  # crop
        pairs = [(max(b, 0), max(a, 0)) for b, a in pairs]
    if not any(b or a for b, a in pairs):
        return x.copy()
    if mode == "constant":
        return np.pad(x, pairs, constant_values=value)
    return np.pad(x, pairs, mode=_PAD_MODES[mode])


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


@op("pad_grad(Tensor dy, *, int[] shape, int[] pad, str mode) -> Tensor dx")
def pad_grad(dy, *, shape, pad, mode):
    """Gradient of ``pad`` in modes "reflect", "replicate" and "circular": each element of ``dy`` is added to the
    element of an input of ``shape`` that the padded position copied."""
    _pad_grad_spec(dy.shape, shape, pad, mode)
    dx = dy
    for d, (before, after) in enumerate(_pad_pairs(pad, len(shape))):
        if before or after:
            source = np.pad(np.arange(shape[d]), (before, after), mode=_PAD_MODES[mode])  # read by each position
            acc = np.zeros((*dx.shape[:d], shape[d], *dx.shape[d + 1:]), dy.dtype)
            np.add.at(acc, (builtins.slice(None),) * d + (source,), dx)
            dx = acc
    return dx if dx is not dy else dy.copy()


@pad_grad.check
def _(*, shape, pad, mode):
    _pad_check(pad=pad, mode=mode)
    if mode == "constant":
        raise ValueError("argument 'mode': the gradient of constant padding is pad() with the pads negated")


def _pad_grad_spec(dy_shape, shape, pad, mode):
    expected = _padded_shape("pad_grad", tuple(shape), pad, mode)
    if len(dy_shape) != len(expected) or any(a is not None and a != b for a, b in zip(dy_shape, expected)):
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


# -- indexing with integer tensors: take, gather, index_select, scatter_add, one_hot ---------------------------


def _checked_index(op_name, index, size, *, negative=True):
    """Index values checked against a dim of ``size``; negative ones count from the end (when allowed)."""
    if index.size:
        low, high = int(index.min()), int(index.max())
        if low < (-size if negative else 0) or high >= size:
            bad = low if low < 0 else high
            raise ArgumentError(f"{op_name}(): argument 'index' holds {bad}, which is out of range for a dim "
                                f"of size {size}")
        if low < 0:
            return np.where(index < 0, index + size, index)
    return index


def _take_shape(op_name, x_shape, index_shape, axis):
    if axis is None:
        return tuple(index_shape)
    if not x_shape:
        raise ShapeError(f"{op_name}(): a 0-d tensor has no axis {axis} to index (pass axis=None)")
    a = _one_axis(op_name, axis, len(x_shape))
    return (*x_shape[:a], *index_shape, *x_shape[a + 1:])


@op("take(Tensor x, nograd Tensor<int32|int64> index, *, int axis=None) -> Tensor y")
def take(x, index, *, axis):
    """The elements of ``x`` at ``index`` along ``axis``, as ``np.take``: the result's shape is ``x.shape`` with dim
    ``axis`` replaced by ``index.shape``. With ``axis=None`` it indexes the flattened ``x`` (``torch.take``).
    Negative indices count from the end. ``x[index_tensor]`` is this op."""
    if axis is None:
        return np.take(x.reshape(-1), _checked_index("take", index, x.size))
    return np.take(x, _checked_index("take", index, x.shape[axis]), axis=axis)


@take.infer
def _(x, index, *, axis):
    return Spec(_take_shape("take", x.shape, index.shape, axis), x.dtype)


@take.grad
def _(index, dy, x_spec, *, axis):
    return F.take_grad(dy, index, shape=x_spec.shape, axis=axis), None


@take.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 3)), np.array([[1, 0], [-1, 2]]), axis=-1)
    yield Sample.of(rng.standard_normal((4, 3)), np.array([2, 0, 2, -1]), axis=0)  # repeats accumulate
    yield Sample.of(rng.standard_normal((3, 4)), np.array(1), axis=1)  # a 0-d index drops the dim
    yield Sample.of(rng.standard_normal((2, 3)), np.array([5, 0, 5]))  # axis=None: the flattened x
    yield Sample.of(rng.standard_normal(()), np.array([0, 0]))


@op("take_grad(Tensor dy, nograd Tensor<int32|int64> index, *, int[] shape, int axis=None) -> Tensor dx")
def take_grad(dy, index, *, shape, axis):
    """Gradient of ``take``: zeros of ``shape`` with each element of ``dy`` added at the position ``take`` read
    it from (an index that repeats collects the sum)."""
    _take_grad_spec(dy.shape, index.shape, shape, axis)
    if axis is None:
        dx = np.zeros(int(np.prod(shape)), dy.dtype)
        np.add.at(dx, _checked_index("take_grad", index, dx.size), dy)
        return dx.reshape(shape)
    dx = np.zeros(shape, dy.dtype)
    np.add.at(dx, (builtins.slice(None),) * (axis % len(shape)) + (_checked_index("take_grad", index, shape[axis]),),
              dy)
    return dx


def _take_grad_spec(dy_shape, index_shape, shape, axis):
    expected = _take_shape("take_grad", tuple(shape), index_shape, axis)
    if len(dy_shape) != len(expected) or any(a is not None and b is not None and a != b
                                             for a, b in zip(dy_shape, expected)):
        raise ShapeError(f"take_grad(): dy has shape {dy_shape}, taking {index_shape} from {list(shape)} "
                         f"along axis {axis} gives {expected}")


@take_grad.infer
def _(dy, index, *, shape, axis):
    _take_grad_spec(dy.shape, index.shape, shape, axis)
    return Spec(tuple(shape), dy.dtype)


@take_grad.grad
def _(index, ddx, *, axis):
    return F.take(ddx, index, axis=axis), None


@take_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 3)), np.array([2, 0, 2, -1]), shape=[3, 3], axis=0)
    yield Sample.of(rng.standard_normal((2, 2, 2)), np.array([[1, 4], [0, 1]]), shape=[2, 5], axis=1)
    yield Sample.of(rng.standard_normal(3), np.array([5, 0, 5]), shape=[2, 3])


def _grid_index(index, axis):
    """The index tuple that picks ``x[..., index[i, j, k], ...]`` at (i, j, k): ``index`` along ``axis``,
    the position itself along every other dim (the regions ``index.shape`` covers)."""
    ndim = index.ndim
    return tuple(index if d == axis else np.arange(n).reshape([-1 if k == d else 1 for k in range(ndim)])
                 for d, n in enumerate(index.shape))


def _gather_shapes(op_name, x_shape, index_shape, axis, src_shape=None):
    """torch's rule: ``index`` has the rank of ``x`` and fits in it except along ``axis`` (and fits in ``src``)."""
    if not x_shape or len(index_shape) != len(x_shape) or (src_shape is not None and len(src_shape) != len(x_shape)):
        shapes = f"x {x_shape}, index {index_shape}" + ("" if src_shape is None else f", src {src_shape}")
        raise ShapeError(f"{op_name}(): x, index{'' if src_shape is None else ' and src'} must have one rank, "
                         f"at least 1; got {shapes}")
    a = _one_axis(op_name, axis, len(x_shape))
    for d, i in enumerate(index_shape):
        limits = [] if d == a else [("x", x_shape[d])]
        limits += [] if src_shape is None else [("src", src_shape[d])]
        for name, n in limits:
            if i is not None and n is not None and i > n:
                raise ShapeError(f"{op_name}(): index has shape {index_shape}; dim {d} does not fit in {name} "
                                 f"of shape {x_shape if name == 'x' else src_shape}")
    return a


@op("gather(Tensor x, nograd Tensor<int32|int64> index, *, int axis) -> Tensor y")
def gather(x, index, *, axis):
    """``torch.gather``: ``y[i][j][k] = x[index[i][j][k]][j][k]`` for ``axis=0`` (and so on for other axes); ``y`` has
    the shape of ``index``, which has the rank of ``x`` and may be smaller in the other dims. NumPy's
    ``take_along_axis`` is the same op where ``index`` matches ``x`` in the other dims. Negative indices count
    from the end."""
    a = _gather_shapes("gather", x.shape, index.shape, axis)
    return x[_grid_index(_checked_index("gather", index, x.shape[a]), a)]


@gather.infer
def _(x, index, *, axis):
    _gather_shapes("gather", x.shape, index.shape, axis)
    return Spec(tuple(index.shape), x.dtype)


@gather.grad
def _(index, dy, x_spec, *, axis):
    return F.gather_grad(dy, index, shape=x_spec.shape, axis=axis), None


@gather.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), np.array([[0, 2, 2, 1], [2, 0, 1, 1]]), axis=0)
    yield Sample.of(rng.standard_normal((3, 4)), np.array([[3, 3], [0, -1], [2, 1]]), axis=1)
    yield Sample.of(rng.standard_normal((2, 3, 4)), np.array([[[1], [0]]]), axis=-1)  # index smaller than x


@op("gather_grad(Tensor dy, nograd Tensor<int32|int64> index, *, int[] shape, int axis) -> Tensor dx")
def gather_grad(dy, index, *, shape, axis):
    """Gradient of ``gather``: zeros of ``shape`` with each element of ``dy`` added where ``gather`` read it from
    (``scatter_add`` into zeros, without making the zeros first)."""
    a = _gather_shapes("gather_grad", tuple(shape), index.shape, axis, dy.shape)
    dx = np.zeros(shape, dy.dtype)
    np.add.at(dx, _grid_index(_checked_index("gather_grad", index, shape[a]), a), dy)
    return dx


@gather_grad.infer
def _(dy, index, *, shape, axis):
    _gather_shapes("gather_grad", tuple(shape), index.shape, axis, dy.shape)
    if any(d is not None and i is not None and d != i for d, i in zip(dy.shape, index.shape)):
        raise ShapeError(f"gather_grad(): dy of shape {dy.shape} must have the shape of index, {index.shape}")
    return Spec(tuple(shape), dy.dtype)


@gather_grad.grad
def _(index, ddx, *, axis):
    return F.gather(ddx, index, axis=axis), None


@gather_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 4)), np.array([[0, 2, 2, 1], [2, 0, 1, -1]]), shape=[3, 4], axis=0)
    yield Sample.of(rng.standard_normal((1, 2, 1)), np.array([[[3], [0]]]), shape=[2, 3, 4], axis=-1)


@op("scatter_add(Tensor x, nograd Tensor<int32|int64> index, Tensor src, *, int axis) -> Tensor y")
def scatter_add(x, index, src, *, axis):
    """``torch.scatter_add``: a copy of ``x`` to which ``src[i][j][k]`` is added at ``[index[i][j][k]][j][k]`` for
    ``axis=0`` (and so on); elements of ``src`` outside ``index.shape`` are not used. Positions that ``index`` names
    more than once get every contribution. The adjoint of ``gather``."""
    a = _gather_shapes("scatter_add", x.shape, index.shape, axis, src.shape)
    out = x.astype(D.promote(x.dtype, src.dtype), copy=True)
    np.add.at(out, _grid_index(_checked_index("scatter_add", index, x.shape[a]), a),
              src[tuple(builtins.slice(0, n) for n in index.shape)])
    return out


@scatter_add.infer
def _(x, index, src, *, axis):
    _gather_shapes("scatter_add", x.shape, index.shape, axis, src.shape)
    return Spec(tuple(x.shape), D.promote(x.dtype, src.dtype))


@scatter_add.grad
def _(index, src_spec, dy, *, axis, needs_input_grad):
    dsrc = None
    if needs_input_grad[2]:
        dsrc = F.gather(dy, index, axis=axis)
        if tuple(dsrc.shape) != tuple(src_spec.shape):  # src elements that index does not reach get 0
            n = len(src_spec.shape)
            dsrc = F.slice_grad(dsrc, shape=src_spec.shape, axes=list(range(n)), starts=[0] * n,
                                ends=list(dsrc.shape), steps=[1] * n)
    return dy, None, dsrc


@scatter_add.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), np.array([[0, 2, 2, 1], [2, 0, 1, 1]]), rng.standard_normal((2, 4)),
                    axis=0)
    yield Sample.of(rng.standard_normal((3, 4)), np.array([[3, 3], [0, -1]]), rng.standard_normal((3, 3)), axis=-1)
    yield Sample.of(rng.standard_normal(5), np.array([4, 0, 4]), rng.standard_normal(3), axis=0)


@op("index_select(Tensor x, nograd Tensor<int32|int64> index, *, int axis) -> Tensor y")
def index_select(x, index, *, axis):
    """``torch.index_select``: the slices of ``x`` at the positions ``index`` (1-D; a 0-d index counts as one
    position) lists along ``axis``, which keeps its place with size ``len(index)``. Negative indices count from
    the end."""
    _index_select_shape(x.shape, index.shape, axis)
    return np.take(x, _checked_index("index_select", index.reshape(-1), x.shape[axis]), axis=axis)


def _index_select_shape(x_shape, index_shape, axis):
    if len(index_shape) > 1:
        raise ShapeError(f"index_select(): index must be 1-D, got shape {index_shape} (take() accepts any shape)")
    return _take_shape("index_select", x_shape, index_shape or (1,), axis)


@index_select.infer
def _(x, index, *, axis):
    return Spec(_index_select_shape(x.shape, index.shape, axis), x.dtype)


@index_select.grad
def _(index, dy, x_spec, *, axis):
    flat = F.reshape(index, shape=[-1]) if index.ndim == 0 else index
    return F.take_grad(dy, flat, shape=x_spec.shape, axis=axis), None


@index_select.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), np.array([-1, 1]), axis=-1)
    yield Sample.of(rng.standard_normal((4, 3)), np.array([3, 0, 3]), axis=0)
    yield Sample.of(rng.standard_normal((2, 3)), np.array(2), axis=1)


@op("one_hot(nograd Tensor<int32|int64> index, *, int num_classes) -> Tensor<int64> y", traits=["no_grad"])
def one_hot(index, *, num_classes):
    """``torch.nn.functional.one_hot``: int64 of shape ``(*index.shape, num_classes)``, 1 at the class ``index``
    names and 0 elsewhere. Indices must lie in [0, num_classes)."""
    index = _checked_index("one_hot", index, num_classes, negative=False)
    return (index[..., None] == np.arange(num_classes)).astype(np.int64)


@one_hot.check
def _(*, num_classes):
    if num_classes < 1:
        raise ValueError(f"argument 'num_classes' must be >= 1, got {num_classes}")


@one_hot.infer
def _(index, *, num_classes):
    return Spec((*index.shape, num_classes), D.int64)


@one_hot.samples
def _(rng):
    yield Sample.of(np.array([0, 2, 1, 2]), num_classes=3)
    yield Sample.of(np.array([[4, 0], [1, 1]], np.int32), num_classes=5)
    yield Sample.of(np.array(1), num_classes=2)
