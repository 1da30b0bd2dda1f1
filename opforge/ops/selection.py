"""torch's indexing ops beyond ``indexing.py``: take_along_dim, index_fill, index_copy, masked_select and
masked_scatter, scatter (a tensor or a value), nonzero/argwhere, searchsorted/bucketize, isin, and
tril_indices/triu_indices.

Each means what its torch namesake means, call form included (``dim`` positional where torch has it there). The
ops whose result size depends on the data (nonzero, masked_select) have an unknown dim in a traced program's shape
rule, as the design allows. Gradient rules are written with ops, so they differentiate again.
"""

import math

from opforge import ops as F

from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, function, np, op, reduce_at
from .indexing import _checked_index, _gather_shapes, _grid_index, _index_select_shape


def _axis(op_name: str, axis: int, ndim: int) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ShapeError(f"{op_name}(): dim {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim if ndim else 0


# -- take_along_dim -------------------------------------------------------------------------------------------------


@function
def take_along_dim(input, indices, dim=None):
    """``torch.take_along_dim``: ``input`` read at ``indices`` along ``dim`` (NumPy's take_along_axis); the other
    dims broadcast between the two. Without ``dim``, both are flattened first."""
    if dim is None:
        return F.gather(F.reshape(input, shape=[-1]), 0, F.reshape(indices, shape=[-1]))
    if len(input.shape) != len(indices.shape):
        raise ShapeError(f"take_along_dim(): input and indices must have the same number of dims, got shapes "
                         f"{tuple(input.shape)} and {tuple(indices.shape)}")
    a = _axis("take_along_dim", dim, len(input.shape))
    shape = list(broadcast_shapes(tuple(d for i, d in enumerate(input.shape) if i != a),
                                  tuple(d for i, d in enumerate(indices.shape) if i != a), op="take_along_dim"))
    x_shape = [*shape[:a], input.shape[a], *shape[a:]]
    i_shape = [*shape[:a], indices.shape[a], *shape[a:]]
    if list(input.shape) != x_shape:
        input = F.broadcast_to(input, shape=x_shape)
    if list(indices.shape) != i_shape:
        indices = F.broadcast_to(indices, shape=i_shape)
    return F.gather(input, a, indices)


# -- index_fill and index_copy ----------------------------------------------------------------------------------------


def _along(index, axis: int, ndim: int) -> tuple:
    """A NumPy index that picks positions ``index`` (1-D) along ``axis``."""
    return (slice(None),) * axis + (index,)


@op("index_fill(Tensor x, int axis/dim, nograd Tensor<int32|int64> index, Tensor value) -> Tensor y")
def index_fill(x, index, value, *, axis):
    """``torch.index_fill``: a copy of x whose slices at the positions ``index`` (0-d or 1-D) lists along ``axis``
    hold ``value`` (a number or a 0-d tensor, which gets the gradient of those places)."""
    a = _axis("index_fill", axis, x.ndim)
    y = x.copy()
    y1 = y.reshape(1) if y.ndim == 0 else y  # (a 0-d x: one place, 0)
    y1[_along(_checked_index("index_fill", index.reshape(-1), y1.shape[a]), a, y1.ndim)] = value
    return y


@index_fill.infer
def _(x, index, value, *, axis):
    _axis("index_fill", axis, len(x.shape))
    if len(index.shape) > 1 or value.shape:
        raise ShapeError(f"index_fill(): index must be 0-d or 1-D and value 0-d, got shapes {index.shape} and "
                         f"{value.shape}")
    return Spec(x.shape, x.dtype)


@index_fill.grad
def _(index, value, dy, *, axis, needs_input_grad):
    dx = F.index_fill(dy, axis, index, 0.0) if needs_input_grad[0] else None
    dvalue = None
    if needs_input_grad[2]:  # each filled place once, however often index names it
        placed = F.index_fill(F.zeros_like(dy), axis, index, 1.0)
        dvalue = F.cast(F.sum(dy * placed), dtype=value.dtype)
    return dx, None, dvalue


@index_fill.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), np.array([0, 2]), rng.standard_normal(()), axis=1)
    yield Sample.of(rng.standard_normal((3, 4)), np.array([2, -3, 2]), rng.standard_normal(()), axis=0)
    yield Sample.of(rng.standard_normal((2, 3, 2)), np.array(1), rng.standard_normal(()), axis=-2)


def _onnx_scatter_along(g, x, index, updates, axis):
    """x with the slices of ``updates`` written at the positions ``index`` (0-d or 1-D) along ``axis`` (index_fill
    and index_copy): ScatterElements of index laid along the axis and spread over the other dims of updates (a 0-d
    x is its one place)."""
    flat = x if x.ndim else g.op("Reshape", x, g.ints([1]), spec=Spec((1,), x.dtype))
    a = axis % flat.ndim
    along = g.op("Reshape", g.cast(index, D.int64), g.ints([-1 if d == a else 1 for d in range(flat.ndim)]))
    if updates.ndim == 0:  # a value: at every place of x's slices
        ones = g.op("Shape", g.op("Slice", flat, g.ints([0]), g.ints([1]), g.ints([a])))
        spread = g.op("Expand", along, ones)
        updates = g.op("Expand", updates, g.op("Shape", spread))
    else:
        updates = g.op("Reshape", updates, g.op("Shape", flat)) if not x.ndim else updates
        spread = g.op("Expand", along, g.op("Shape", updates))
    y = g.op("ScatterElements", flat, spread, updates, axis=a, spec=Spec(flat.shape, x.dtype))
    return y if x.ndim else g.op("Reshape", y, g.ints([]), spec=g.outputs[0])


@index_fill.onnx
def _(g, x, index, value, *, axis):
    return _onnx_scatter_along(g, x, index, g.cast(value, x.dtype), axis)


@op("index_copy(Tensor x, int axis/dim, nograd Tensor<int32|int64> index, Tensor source) -> Tensor y")
def index_copy(x, index, source, *, axis):
    """``torch.index_copy``: a copy of x whose slices at the positions ``index`` (1-D) lists along ``axis`` are
    the slices of ``source`` in order (of two for one place the later stays, as torch's CPU kernel)."""
    a = _axis("index_copy", axis, x.ndim)
    y = x.astype(D.promote(x.dtype, source.dtype), copy=True)
    y1 = y.reshape(1) if y.ndim == 0 else y  # (a 0-d x: one place, 0)
    y1[_along(_checked_index("index_copy", index.reshape(-1), y1.shape[a]), a, y1.ndim)] = \
        source if y.ndim else source.reshape(-1)
    return y


@index_copy.infer
def _(x, index, source, *, axis):
    _axis("index_copy", axis, len(x.shape))  # (named here: the shape below is index_select's)
    if len(index.shape) > 1:
        raise ShapeError(f"index_copy(): index must be 0-d or 1-D, got shape {index.shape}")
    want = _index_select_shape(x.shape, index.shape, axis) if x.shape else index.shape
    if tuple(source.shape) != tuple(want):
        raise ShapeError(f"index_copy(): source must have shape {want} (x's {x.shape} with {index.shape} places "
                         f"along dim {axis}), got {source.shape}")
    return Spec(x.shape, D.promote(x.dtype, source.dtype))


@index_copy.grad
def _(index, source, dy, *, axis, needs_input_grad):
    dx = F.index_fill(dy, axis, index, 0.0) if needs_input_grad[0] else None
    dsource = None
    if needs_input_grad[2]:  # (a 0-d x's one place: dy itself)
        dsource = F.index_select(dy, axis, index) if dy.ndim else F.reshape(dy, shape=list(source.shape))
    return dx, None, dsource


@index_copy.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 3)), np.array([3, 0]), rng.standard_normal((2, 3)), axis=0)
    yield Sample.of(rng.standard_normal((2, 5)), np.array([1, -1, 2]), rng.standard_normal((2, 3)), axis=1)


@index_copy.onnx
def _(g, x, index, source, *, axis):
    dtype = g.outputs[0].dtype
    return _onnx_scatter_along(g, g.cast(x, dtype), index, g.cast(source, dtype), axis)


# -- masked_select and masked_scatter -------------------------------------------------------------------------------


@op("masked_select(Tensor x, nograd Tensor<bool> mask) -> Tensor y", traits=["data_shaped"])
def masked_select(x, mask):
    """``torch.masked_select``: the elements of x where ``mask`` (x and mask broadcast together) is True, in
    order, as a 1-D tensor; its length depends on the mask (unknown in a traced program's shape rule)."""
    shape = np.broadcast_shapes(x.shape, mask.shape)
    return np.broadcast_to(x, shape)[np.broadcast_to(mask, shape)]


@masked_select.infer
def _(x, mask):
    broadcast_shapes(x.shape, mask.shape, op="masked_select")
    return Spec((None,), x.dtype)


@masked_select.grad
def _(x, mask, dy):
    # dy back at the selected places of the broadcast shape (the engine sums it down to x's)
    shape = list(broadcast_shapes(tuple(x.shape), tuple(mask.shape)))
    return F.masked_scatter(F.zeros_like(F.broadcast_to(x, shape=shape)), mask, dy), None


@masked_select.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)) > 0)
    yield Sample.of(rng.standard_normal((3, 1)), rng.standard_normal((3, 4)) > 0)  # x broadcast
    yield Sample.of(rng.standard_normal((2, 3)), np.array([True, False, True]))


@masked_select.onnx
def _(g, x, mask):
    # Expand broadcasts both ways: x and mask to their common shape, then the selected elements in C order
    x = g.op("Expand", x, g.op("Shape", mask))
    mask = g.op("Expand", mask, g.op("Shape", x))
    flat = [g.op("Reshape", v, g.ints([-1])) for v in (x, mask)]
    return g.op("Compress", *flat, axis=0, spec=g.outputs[0])


@op("masked_scatter(Tensor x, nograd Tensor<bool> mask, Tensor source) -> Tensor y")
def masked_scatter(x, mask, source):
    """``torch.masked_scatter``: a copy of x (broadcast with ``mask`` to mask's shape, as torch) in which the
    places where mask is True take the elements of ``source`` in order; source needs at least as many."""
    shape = np.broadcast_shapes(x.shape, mask.shape)
    m = np.broadcast_to(mask, shape)
    count = int(np.count_nonzero(m))
    if count > source.size:
        raise ShapeError(f"masked_scatter(): the mask has {count} True places, source only {source.size} "
                         "elements")
    y = np.broadcast_to(x, shape).astype(D.promote(x.dtype, source.dtype))  # a copy, of x's device
    y[m] = source.reshape(-1)[:count]
    return y


@masked_scatter.infer
def _(x, mask, source):
    shape = broadcast_shapes(x.shape, mask.shape, op="masked_scatter")
    return Spec(shape, D.promote(x.dtype, source.dtype))


@masked_scatter.grad
def _(mask, source, dy, *, needs_input_grad):
    dx = F.where(mask, 0.0, dy) if needs_input_grad[0] else None
    dsource = None
    if needs_input_grad[2]:  # the selected dy in source's first places, 0 in the rest: the k-th True place of
        # the mask sends its dy to source's k-th element (the others add 0 to the first), shapes known when traced
        m = F.reshape(F.broadcast_to(mask, shape=list(dy.shape)), shape=[-1])
        order = F.cumsum(F.cast(m, dtype=D.int64), 0) - 1
        flat = F.scatter_add(F.zeros(shape=[int(np.prod(source.shape))], dtype=dy.dtype), 0,
                             F.where(m, order, 0), F.where(m, F.reshape(dy, shape=[-1]), 0.0))
        dsource = F.reshape(flat, shape=list(source.shape))
    return dx, None, dsource


@masked_scatter.samples
def _(rng):
    # (sources with spare elements: the suite's calls with an x of another rank broadcast the mask further)
    yield Sample.of(rng.standard_normal((3, 4)), np.arange(12).reshape(3, 4) % 3 == 0, rng.standard_normal(10))
    yield Sample.of(rng.standard_normal((2, 3)), np.array([True, False, True]), rng.standard_normal((3, 3)))


@masked_scatter.onnx
def _(g, x, mask, source):
    dtype = g.outputs[0].dtype
    x = g.op("Expand", g.cast(x, dtype), g.op("Shape", mask))
    m = g.op("Reshape", g.op("Expand", mask, g.op("Shape", x)), g.ints([-1]))
    # the k-th True place of the mask takes source's k-th element
    one = g.const(np.array(1, np.int64))
    order = g.op("Sub", g.op("CumSum", g.cast(m, D.int64), g.const(np.array(0, np.int64))), one)
    taken = g.op("Gather", g.op("Reshape", g.cast(source, dtype), g.ints([-1])),
                 g.op("Where", m, order, g.const(np.array(0, np.int64))), axis=0)
    y = g.op("Where", m, taken, g.op("Reshape", x, g.ints([-1])))
    return g.op("Reshape", y, g.op("Shape", x), spec=g.outputs[0])


# -- scatter ------------------------------------------------------------------------------------------------------


@op("scatter(Tensor x, int axis/dim, nograd Tensor<int32|int64> index, Tensor src/value) -> Tensor y")
def scatter(x, index, src, *, axis):
    """``torch.scatter``: a copy of x in which ``src[i][j][k]`` is written at ``[index[i][j][k]][j][k]`` for
    ``axis=0`` (and so on); elements of src outside index's shape are not used. Of two writes to one place the
    later stays, as torch's CPU kernel (torch calls it undefined). ``F.scatter(x, dim, index, value=v)`` writes a
    number (or a 0-d src: the same value at every place index names). torch's deprecated ``reduce=`` is
    ``Tensor.scatter``'s and ``of.scatter``'s (they call scatter_reduce)."""
    if src.ndim == 0:
        src = np.broadcast_to(src, index.shape)
    out = x.astype(D.promote(x.dtype, src.dtype), copy=True)
    if x.ndim == 0:  # all 0-d: one place (torch's)
        x, index, src = x.reshape(1), index.reshape(1), src.reshape(1)
    a = _gather_shapes("scatter", x.shape, index.shape, axis, src.shape)
    out1 = out.reshape(x.shape)
    out1[_grid_index(_checked_index("scatter", index, x.shape[a]), a)] = src[tuple(slice(0, n) for n in index.shape)]
    return out


@scatter.infer
def _(x, index, src, *, axis):
    if x.shape or index.shape or src.shape:
        _gather_shapes("scatter", x.shape, index.shape, axis, src.shape if src.shape else index.shape)
    return Spec(tuple(x.shape), D.promote(x.dtype, src.dtype))


@scatter.grad
def _(index, src_spec, dy, *, axis, needs_input_grad):
    dx = F.scatter(dy, axis, index, F.zeros_like(F.cast(index, dtype=dy.dtype))) if needs_input_grad[0] else None
    dsrc = None
    if needs_input_grad[2] and not dy.ndim:  # all 0-d: the one place src wrote
        dsrc = dy
    elif needs_input_grad[2]:
        dsrc = F.gather(dy, axis, index)
        if src_spec.shape and tuple(dsrc.shape) != tuple(src_spec.shape):  # src elements index does not reach: 0
            n = len(src_spec.shape)
            dsrc = F.slice_grad(dsrc, shape=src_spec.shape, axes=list(range(n)), starts=[0] * n,
                                ends=list(dsrc.shape), steps=[1] * n)
    return dx, None, dsrc  # (a 0-d src's is summed down by the engine)


@scatter.samples
def _(rng):
    def distinct(rows, n, k):  # index rows without repeats: the numeric gradient sees every src element
        return np.stack([rng.permutation(n)[:k] for _ in range(rows)])
    yield Sample.of(rng.standard_normal((3, 5)), distinct(2, 5, 3), rng.standard_normal((2, 4)), axis=1)
    yield Sample.of(rng.standard_normal((4, 2)), distinct(2, 4, 2).T, rng.standard_normal((2, 2)), axis=0)
    yield Sample.of(rng.standard_normal((3, 4)), distinct(3, 4, 2), rng.standard_normal(()), axis=1)  # a value


@scatter.onnx
def _(g, x, index, src, *, axis):
    dtype = g.outputs[0].dtype
    x, src = g.cast(x, dtype), g.cast(src, dtype)
    if x.ndim == 0:  # all 0-d: one place
        x, index, src = (g.op("Reshape", v, g.ints([1]), spec=Spec((1,), v.dtype)) for v in (x, index, src))
    if src.ndim == 0:  # a value at every place index names
        src = g.op("Expand", src, g.op("Shape", index))
    elif src.shape != index.shape:  # only the part of src that index covers is used
        src = g.op("Slice", src, g.ints([0] * src.ndim), g.op("Shape", index), g.ints(range(src.ndim)))
    y = g.op("ScatterElements", x, index, src, axis=axis % x.ndim, spec=Spec(x.shape, dtype))
    return y if g.outputs[0].shape else g.op("Reshape", y, g.ints([]), spec=g.outputs[0])


# -- nonzero, searchsorted, bucketize, isin, tril/triu_indices ------------------------------------------------------


@op("argwhere(Tensor x) -> Tensor<int64> y", traits=["no_grad", "data_shaped"])
def argwhere(x):
    """``torch.argwhere`` (and ``torch.nonzero``): the index of each nonzero element of x, one row (of x's rank)
    per element in C order, int64; a 0-d x gives (0 or 1, 0). The number of rows depends on the data."""
    return np.argwhere(x).astype(np.int64)


@argwhere.infer
def _(x):
    return Spec((None, len(x.shape)), D.int64)


@argwhere.samples
def _(rng):
    yield Sample.of(rng.integers(-1, 2, (3, 4)))
    yield Sample.of(rng.standard_normal(5) > 0)
    yield Sample.of(np.array(2.5))


@argwhere.onnx
def _(g, x):
    if x.ndim == 0:  # one place or none, and no columns: NonZero of x as a vector, its one row dropped
        rows = g.op("NonZero", g.op("Reshape", x, g.ints([1])))
        rows = g.op("Slice", rows, g.ints([0]), g.ints([0]), g.ints([0]))
    else:
        rows = g.op("NonZero", x)  # (rank, count)
    return g.op("Transpose", rows, perm=[1, 0], spec=g.outputs[0])


@function
def nonzero(input, *, as_tuple=False):
    """``torch.nonzero``: ``argwhere``'s rows, or with ``as_tuple`` one 1-D tensor per dim (its column; a 0-d
    input counts as 1-D)."""
    if not as_tuple:
        return F.argwhere(input)
    rows = F.argwhere(input if len(input.shape) else F.reshape(input, shape=[1]))
    return tuple(F.unbind(rows, 1))


def _check_side(*, right, side, **_):
    if side not in ("", "left", "right"):
        raise ValueError(f"argument 'side' must be 'left' or 'right', got {side!r}")
    if side == "left" and right:  # (torch's rule: side="right" with right=False is side's)
        raise ValueError("side='left' contradicts right=True")


@op("searchsorted(nograd Tensor sorted_sequence, nograd Tensor x, *, bool out_int32=False, bool right=False, "
    "str side=\"\", nograd Tensor<int64>? sorter=None) -> Tensor y", traits=["no_grad"])
def searchsorted(sorted_sequence, x, sorter, *, out_int32, right, side, xp=np):
    """``torch.searchsorted``: for each value of x, the index where it would go into ``sorted_sequence`` (sorted
    along its last dim) to keep it sorted: the first such place, or with ``right`` (or side="right") the last.
    A 1-D sequence serves every value; an N-D one holds one sequence per row of x's leading dims. ``sorter``
    sorts an unsorted sequence (argsort's indices). int64, or int32 with ``out_int32``."""
    seq = sorted_sequence if sorter is None else np.take_along_axis(sorted_sequence, sorter, axis=-1)
    how = "right" if right or side == "right" else "left"
    seq, values = (a.astype(np.result_type(seq, x), copy=False) for a in (seq, x))
    if seq.ndim == 1:
        y = np.searchsorted(seq, values, side=how)
    else:  # one sequence per row (sizes given: reshaping no elements cannot infer a -1)
        rows = seq.reshape(math.prod(seq.shape[:-1]), seq.shape[-1])
        n = values.reshape(math.prod(values.shape[:-1]), values.shape[-1])
        y = xp.zeros(n.shape, np.int64)
        for i, (r, v) in enumerate(zip(rows, n)):
            y[i] = np.searchsorted(r, v, side=how)
        y = y.reshape(values.shape)
    return y.astype(np.int32 if out_int32 else np.int64, copy=False)


searchsorted.check(_check_side)


@searchsorted.infer
def _(sorted_sequence, x, sorter, *, out_int32, right, side):
    seq = sorted_sequence.shape
    if not seq:
        raise ShapeError("searchsorted(): sorted_sequence must have at least one dim, got a 0-d tensor")
    if len(seq) > 1 and tuple(seq[:-1]) != tuple(x.shape[:-1]):
        raise ShapeError(f"searchsorted(): an N-D sorted_sequence {seq} needs values with the same leading dims "
                         f"{seq[:-1]}, got {x.shape}")
    if sorter is not None and tuple(sorter.shape) != tuple(seq):
        raise ShapeError(f"searchsorted(): sorter must have the sequence's shape {seq}, got {sorter.shape}")
    return Spec(x.shape, D.int32 if out_int32 else D.int64)


@searchsorted.samples
def _(rng):
    yield Sample.of(np.sort(rng.standard_normal(6)), rng.standard_normal((2, 3)))
    yield Sample.of(np.sort(rng.integers(0, 5, (2, 4)), axis=-1), rng.integers(0, 5, (2, 3)), right=True)
    yield Sample.of(np.array([1.0, 3.0, 5.0]), np.array(3.0), side="right", right=True, out_int32=True)


@searchsorted.onnx
def _(g, sorted_sequence, x, sorter, *, out_int32, right, side):
    # the place of a value is how many of its sequence's elements are below it (or not above it, on the right)
    dtype = D.promote(sorted_sequence.dtype, x.dtype)
    seq, values = g.cast(sorted_sequence, dtype), g.cast(x, dtype)
    if sorter is not None:
        seq = g.op("GatherElements", seq, sorter, axis=-1)
    if seq.ndim > 1:  # one sequence per row of x's leading dims: (..., 1, M) against (..., K, 1)
        seq = g.op("Unsqueeze", seq, g.ints([-2]))
    values = g.op("Unsqueeze", values, g.ints([-1]))
    below = g.op("LessOrEqual" if right or side == "right" else "Less", seq, values,
                 spec=Spec((*x.shape, sorted_sequence.shape[-1]), D.bool_))
    count = g.reduce("ReduceSum", g.cast(below, D.int64), [-1], False, spec=Spec(x.shape, D.int64))
    return g.cast(count, g.outputs[0].dtype)


@function
def bucketize(input, boundaries, *, out_int32=False, right=False):
    """``torch.bucketize``: for each value the index of its bucket among the 1-D ``boundaries`` — i with
    boundaries[i−1] < x ≤ boundaries[i], or with ``right`` boundaries[i−1] ≤ x < boundaries[i]."""
    if len(boundaries.shape) != 1:
        raise ShapeError(f"bucketize(): boundaries must be 1-D, got shape {tuple(boundaries.shape)}")
    return F.searchsorted(boundaries, input, out_int32=out_int32, right=right)


@op("isin(nograd Tensor elements, nograd Tensor test_elements, *, bool assume_unique=False, bool invert=False) -> "
    "Tensor<bool> y", traits=["no_grad"])
def isin(elements, test_elements, *, assume_unique, invert):
    """``torch.isin``: True where an element of ``elements`` is among ``test_elements`` (False with
    ``invert``); the shape of ``elements``."""
    dtype = D.result_type(elements, test_elements)
    return np.isin(elements.astype(dtype, copy=False), test_elements.astype(dtype, copy=False),
                   assume_unique=assume_unique, invert=invert)


@isin.infer
def _(elements, test_elements, *, assume_unique, invert):
    return Spec(elements.shape, D.bool_)


@isin.samples
def _(rng):
    yield Sample.of(rng.integers(0, 6, (3, 4)), np.array([1, 3, 9]))
    yield Sample.of(rng.integers(0, 4, 5).astype(np.float64), np.array(2), invert=True)


@isin.onnx
def _(g, elements, test_elements, *, assume_unique, invert):
    dtype = D.promote(elements.dtype, test_elements.dtype)
    tests = g.op("Reshape", g.cast(test_elements, dtype), g.ints([-1]))
    equal = g.op("Equal", g.op("Unsqueeze", g.cast(elements, dtype), g.ints([-1])), tests,
                 spec=Spec((*elements.shape, None), D.bool_))
    hits = g.reduce("ReduceSum", g.cast(equal, D.int64), [-1], False, spec=Spec(elements.shape, D.int64))
    found = g.op("Greater", hits, g.const(np.array(0, np.int64)))
    return g.op("Not", found) if invert else found


def _triangle(name: str):
    def kernel(*, row, col, offset, dtype, xp=np):
        return xp.stack(getattr(xp, name)(row, offset, col)).astype(dtype or np.int64).reshape(2, -1)

    kernel.__doc__ = (f"``torch.{name}``: the (row, column) indices of the {'lower' if 'tril' in name else 'upper'} "
                      "triangle of a row × col matrix, on and beyond the diagonal ``offset``, as a (2, N) tensor "
                      "in row-major order (int64 unless ``dtype`` says).")
    opdef = op(f"{name}(int row, int col, int offset=0, *, dtype dtype=None) -> Tensor y", traits=["no_grad"])(kernel)

    @opdef.check
    def _(*, row, col, offset, dtype):
        if row < 0 or col < 0:
            raise ValueError(f"arguments 'row' and 'col' must be >= 0, got {row} and {col}")
        if dtype is not None and np.dtype(dtype).kind not in "iu":
            raise ValueError(f"argument 'dtype' must be an integer dtype, got {dtype}")

    @opdef.infer
    def _(*, row, col, offset, dtype):
        return Spec((2, len(getattr(np, name)(row, offset, col)[0])), dtype or D.int64)

    opdef.samples(lambda rng: [Sample.of(row=4, col=3), Sample.of(row=3, col=5, offset=1, dtype=D.int32),
                               Sample.of(row=0, col=2, offset=-1)])
    opdef.onnx(lambda g, **attrs: g.const(kernel(**attrs)))  # attrs only: a constant
    return opdef


tril_indices = _triangle("tril_indices")
triu_indices = _triangle("triu_indices")


# -- scatter_reduce -----------------------------------------------------------------------------------------------


def _element_strides(shape):
    """How far apart, in elements, neighbours along each dim of a C-ordered array of ``shape`` are."""
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


_REDUCE_AT = {"sum": np.add, "prod": np.multiply, "mean": np.add, "amax": np.maximum, "amin": np.minimum}


def _identity(reduce: str, dtype):
    """What a place starts from when include_self leaves x out: the reduction's identity."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    big = np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).max
    return -big if reduce == "amax" else big


@op("scatter_reduce(Tensor x, int axis/dim, nograd Tensor<int32|int64> index, Tensor src, str reduce, *, "
    "bool include_self=True) -> Tensor y")
def scatter_reduce(x, index, src, *, axis, reduce, include_self, xp=np):
    """``torch.scatter_reduce``: a copy of x in which each place that ``index`` names (as scatter's) is reduced
    with the src values sent there — "sum", "prod", "mean", "amax" or "amin" — together with x's own value, or
    without it when not ``include_self``. "mean" divides by the number of values reduced (floor division for
    integers, as torch). Places no index names keep x's value."""
    if x.ndim == 0:  # all 0-d (as torch allows): one place
        return _scatter_reduce(x.reshape(1), index.reshape(1), src.reshape(1), 0, reduce, include_self,
                               xp).reshape(())
    return _scatter_reduce(x, index, src, axis, reduce, include_self, xp)


def _scatter_reduce(x, index, src, axis, reduce, include_self, xp):
    a = _gather_shapes("scatter_reduce", x.shape, index.shape, axis, src.shape)
    where = _grid_index(_checked_index("scatter_reduce", index, x.shape[a]), a, xp)
    values = src[tuple(slice(0, n) for n in index.shape)].astype(x.dtype, copy=False)
    out = x.copy()
    if not include_self:
        out[where] = _identity(reduce, x.dtype)
    if reduce in ("sum", "mean"):
        xp.add.at(out, where, values)
    else:
        reduce_at(_REDUCE_AT[reduce], out, where, values)
    if reduce == "mean":
        counts = xp.zeros(x.shape, np.int64)
        xp.add.at(counts, where, 1)
        counts += 1 if include_self else 0
        touched = counts > 0
        if x.dtype.kind == "f":
            out = np.where(touched, out / np.maximum(counts, 1), out).astype(x.dtype, copy=False)
        else:
            out = np.where(touched, out // np.maximum(counts, 1), out).astype(x.dtype, copy=False)
    return out


@scatter_reduce.check
def _(*, reduce, **_):
    if reduce not in _REDUCE_AT:
        raise ValueError(f"argument 'reduce' must be one of 'sum', 'prod', 'mean', 'amax', 'amin', got {reduce!r}")


@scatter_reduce.infer
def _(x, index, src, *, axis, reduce, include_self):
    if x.shape or index.shape or src.shape:
        _gather_shapes("scatter_reduce", x.shape, index.shape, axis, src.shape)
    if x.dtype != src.dtype:
        raise ShapeError(f"scatter_reduce(): x and src must have one dtype (as torch's), got {x.dtype} and "
                         f"{src.dtype}")
    return Spec(tuple(x.shape), x.dtype)


@scatter_reduce.grad
def _(x, index, src, y, dy, *, axis, reduce, include_self, needs_input_grad):
    # torch's scatter_reduce_backward, formula for formula (derivatives.yaml), so that ties and zeros agree.
    def gather(t):
        return F.gather(t, axis, index)

    if not x.ndim:  # all 0-d: the rule on one-element vectors, its results made 0-d again
        one = [F.reshape(t, shape=[1]) for t in (x, index, src, y, dy)]
        dx, _, dsrc = scatter_reduce.grad_rule.fn(*one, axis=0, reduce=reduce, include_self=include_self,
                                                  needs_input_grad=needs_input_grad)
        return (None if dx is None else F.reshape(dx, shape=[]), None,
                None if dsrc is None else F.reshape(dsrc, shape=[]))
    src_shape, src = list(src.shape), _covered(src, index)
    if reduce == "sum":
        dx, dsrc = dy, gather(dy)
    elif reduce == "mean":
        counts = F.scatter_add(F.ones_like(dy) if include_self else F.zeros_like(dy), axis, index, F.ones_like(src))
        counts = F.where(counts == 0, 1.0, counts)
        dx = dy / counts
        dsrc = gather(dx)
    elif reduce in ("amax", "amin"):
        value = gather(y)
        x_is, src_is = F.cast(x == y, dtype=dy.dtype), F.cast(src == value, dtype=dy.dtype)
        spread = dy / F.scatter_add(x_is, axis, index, src_is)
        dx, dsrc = x_is * spread, src_is * gather(spread)
    else:  # prod: the product of the others, without dividing by a zero
        kept_x = F.where(x == 0, 1.0, x)
        dx = dy * F.scatter_reduce(kept_x, axis, index, src, "prod", include_self=include_self) / kept_x
        src_zero = src == 0
        zeros = gather(F.scatter_add(F.zeros_like(x), axis, index, F.cast(src_zero, dtype=x.dtype)))
        single = F.logical_and(src_zero, zeros == 1)
        others = gather(dy * F.scatter_reduce(x, axis, index, F.where(single, 1.0, src), "prod",
                                              include_self=include_self))
        dsrc = F.where(single, others, gather(dy * y) / F.where(src_zero, 1.0, src))
    if not include_self:  # x's own value at the places index names took no part
        dx = F.scatter(dx, axis, index, 0.0)
    return (dx if needs_input_grad[0] else None, None,
            _uncovered(dsrc, src_shape) if needs_input_grad[2] else None)


def _covered(src, index):
    """The part of src that index covers (the rest is not used)."""
    if tuple(src.shape) == tuple(index.shape):
        return src
    n = len(index.shape)
    return F.slice(src, axes=list(range(n)), starts=[0] * n, ends=list(index.shape), steps=[1] * n)


def _uncovered(dsrc, shape):
    """src's gradient: dsrc where index covers it, 0 beyond."""
    if list(dsrc.shape) == list(shape):
        return dsrc
    n = len(shape)
    return F.slice_grad(dsrc, shape=shape, axes=list(range(n)), starts=[0] * n, ends=list(dsrc.shape), steps=[1] * n)


@scatter_reduce.samples
def _(rng):
    index = np.array([[0, 2, 2, 1], [2, 0, 2, 1]])
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        yield Sample.of(rng.uniform(0.5, 2, (3, 4)), index, rng.uniform(0.5, 2, (2, 4)), axis=0, reduce=reduce)
    yield Sample.of(rng.uniform(0.5, 2, (3, 4)), index.T[:3], rng.uniform(0.5, 2, (3, 2)), axis=1, reduce="mean",
                    include_self=False)


_ONNX_REDUCTION = {"sum": "add", "mean": "add", "prod": "mul", "amax": "max", "amin": "min"}


@scatter_reduce.onnx
def _(g, x, index, src, *, axis, reduce, include_self):
    if reduce in ("amax", "amin") and g.opset < 18:
        raise g.unsupported(f"scatter_reduce with reduce={reduce!r}: ScatterElements reduces by max and min from "
                            "opset 18 on")
    if x.ndim == 0:  # all 0-d: one place
        x, index, src = (g.op("Reshape", v, g.ints([1]), spec=Spec((1,), v.dtype)) for v in (x, index, src))
    if src.shape != index.shape:  # only the part of src that index covers is used
        src = g.op("Slice", src, g.ints([0] * src.ndim), g.op("Shape", index), g.ints(range(src.ndim)))
    a, spec = axis % x.ndim, Spec(x.shape, x.dtype)
    start = x
    if not include_self:  # the places index names start from the reduction's identity instead of x's value
        identity = g.op("Expand", g.scalar(_identity(reduce, x.dtype), x), g.op("Shape", index))
        start = g.op("ScatterElements", x, index, identity, axis=a, spec=spec)
    y = g.op("ScatterElements", start, index, src, axis=a, reduction=_ONNX_REDUCTION[reduce], spec=spec)
    if reduce == "mean":  # divided by how many values each place reduced (x's own among them with include_self)
        base = g.filled(g.op("Shape", x), int(include_self), D.int64)
        ones = g.op("Expand", g.const(np.array(1, np.int64)), g.op("Shape", index))
        counts = g.op("ScatterElements", base, index, ones, axis=a, reduction="add", spec=Spec(x.shape, D.int64))
        divisor = g.cast(g.op("Max", counts, g.const(np.array(1, np.int64))), x.dtype)
        mean = g.op("Div", y, divisor) if x.dtype.kind == "f" else g.call("floor_divide", y, divisor)
        y = g.op("Where", g.op("Greater", counts, g.const(np.array(0, np.int64))), mean, start, spec=spec)
    return y if g.outputs[0].shape else g.op("Reshape", y, g.ints([]), spec=g.outputs[0])
