"""Indexing with integer tensors and masks: take, gather, index_select, scatter_add, index_add, masked_fill,
one_hot. Negative indices count from the end throughout (where PyTorch refuses them, opforge's convention wins)."""

import builtins

from opforge import ops as F

from ..core.errors import ArgumentError
from ._common import D, Sample, ShapeError, Spec, array_module, broadcast_shapes, np, op, shapes_agree
from .shape import _one_axis


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


@op("take(Tensor x, nograd Tensor<int32|int64> index, *, int axis/dim=None) -> Tensor y")
def take(x, index, *, axis):
    """The elements of ``x`` at ``index`` along ``axis``, as ``np.take``: the result's shape is ``x.shape`` with dim
    ``axis`` replaced by ``index.shape``. With ``axis=None`` it indexes the flattened ``x`` (``torch.take``).
    Negative indices count from the end. ``x[index_tensor]`` is this op."""
    if axis is None:
        return np.take(x.reshape(-1), _checked_index("take", index, x.size))
    return np.take(x, _checked_index("take", index, x.shape[axis]), axis=axis)


@take.onnx
def _(g, x, index, *, axis):
    if axis is None:
        x, axis = g.op("Reshape", x, g.ints([-1])), 0
    return g.op("Gather", x, index, axis=axis, spec=g.outputs[0])


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
        dx = np.zeros(int(np.prod(shape)), dy.dtype, like=dy)
        array_module(dx).add.at(dx, _checked_index("take_grad", index, dx.size), dy)
        return dx.reshape(shape)
    dx = np.zeros(shape, dy.dtype, like=dy)
    where = (builtins.slice(None),) * (axis % len(shape)) + (_checked_index("take_grad", index, shape[axis]),)
    array_module(dx).add.at(dx, where, dy)
    return dx


def _take_grad_spec(dy_shape, index_shape, shape, axis):
    expected = _take_shape("take_grad", tuple(shape), index_shape, axis)
    if not shapes_agree(dy_shape, expected):
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


def _grid_index(index, axis, xp=np):
    """The index tuple that picks ``x[..., index[i, j, k], ...]`` at (i, j, k): ``index`` along ``axis``,
    the position itself along every other dim (the regions ``index.shape`` covers), made by ``xp``."""
    ndim = index.ndim
    return tuple(index if d == axis else xp.arange(n).reshape([-1 if k == d else 1 for k in range(ndim)])
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


@op("gather(Tensor x, int axis/dim, nograd Tensor<int32|int64> index) -> Tensor y")
def gather(x, index, *, axis):
    """``torch.gather``: ``y[i][j][k] = x[index[i][j][k]][j][k]`` for ``axis=0`` (and so on for other axes); ``y`` has
    the shape of ``index``, which has the rank of ``x`` and may be smaller in the other dims. NumPy's
    ``take_along_axis`` is the same op where ``index`` matches ``x`` in the other dims. Negative indices count
    from the end."""
    a = _gather_shapes("gather", x.shape, index.shape, axis)
    return x[_grid_index(_checked_index("gather", index, x.shape[a]), a)]


@gather.onnx
def _(g, x, index, *, axis):
    axis = axis % max(x.ndim, 1)
    if index.shape != x.shape:  # index may be smaller than x in the other dims: ONNX wants them equal, so crop x
        if any(d is None for d in index.shape):
            raise g.unsupported("an index smaller than x in a dim known only at run time")
        ends = [n if a != axis else 2**62 for a, n in enumerate(index.shape)]
        x = g.op("Slice", x, g.ints([0] * x.ndim), g.ints(ends), g.ints(range(x.ndim)))
    return g.op("GatherElements", x, index, axis=axis, spec=g.outputs[0])


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
    dx = np.zeros(shape, dy.dtype, like=dy)
    array_module(dx).add.at(dx, _grid_index(_checked_index("gather_grad", index, shape[a]), a), dy)
    return dx


@gather_grad.infer
def _(dy, index, *, shape, axis):
    _gather_shapes("gather_grad", tuple(shape), index.shape, axis, dy.shape)
    if any(d is not None and i is not None and d != i for d, i in zip(dy.shape, index.shape)):
        raise ShapeError(f"gather_grad(): dy of shape {dy.shape} must have the shape of index, {index.shape}")
    return Spec(tuple(shape), dy.dtype)


@gather_grad.grad
def _(index, ddx, *, axis):
    return F.gather(ddx, axis, index), None


@gather_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 4)), np.array([[0, 2, 2, 1], [2, 0, 1, -1]]), shape=[3, 4], axis=0)
    yield Sample.of(rng.standard_normal((1, 2, 1)), np.array([[[3], [0]]]), shape=[2, 3, 4], axis=-1)


@op("scatter_add(Tensor x, int axis/dim, nograd Tensor<int32|int64> index, Tensor src) -> Tensor y")
def scatter_add(x, index, src, *, axis):
    """``torch.scatter_add``: a copy of ``x`` to which ``src[i][j][k]`` is added at ``[index[i][j][k]][j][k]`` for
    ``axis=0`` (and so on); elements of ``src`` outside ``index.shape`` are not used. Positions that ``index`` names
    more than once get every contribution. The adjoint of ``gather``."""
    a = _gather_shapes("scatter_add", x.shape, index.shape, axis, src.shape)
    out = x.astype(D.promote(x.dtype, src.dtype), copy=True)
    array_module(out).add.at(out, _grid_index(_checked_index("scatter_add", index, x.shape[a]), a),
              src[tuple(builtins.slice(0, n) for n in index.shape)])
    return out


@scatter_add.onnx
def _(g, x, index, src, *, axis):
    dtype = g.outputs[0].dtype
    if src.shape != index.shape:  # only the part of src that index covers is used
        src = g.op("Slice", src, g.ints([0] * src.ndim), g.ints(index.shape), g.ints(range(src.ndim)))
    return g.op("ScatterElements", g.cast(x, dtype), index, g.cast(src, dtype), axis=axis, reduction="add")


@scatter_add.infer
def _(x, index, src, *, axis):
    _gather_shapes("scatter_add", x.shape, index.shape, axis, src.shape)
    return Spec(tuple(x.shape), D.promote(x.dtype, src.dtype))


@scatter_add.grad
def _(index, src_spec, dy, *, axis, needs_input_grad):
    dsrc = None
    if needs_input_grad[2]:
        dsrc = F.gather(dy, axis, index)
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


@op("index_select(Tensor x, int axis/dim, nograd Tensor<int32|int64> index) -> Tensor y")
def index_select(x, index, *, axis):
    """``torch.index_select``: the slices of ``x`` at the positions ``index`` (1-D; a 0-d index counts as one
    position) lists along ``axis``, which keeps its place with size ``len(index)``. Negative indices count from
    the end."""
    _index_select_shape(x.shape, index.shape, axis)
    return np.take(x, _checked_index("index_select", index.reshape(-1), x.shape[axis]), axis=axis)


@index_select.onnx
def _(g, x, index, *, axis):
    return g.op("Gather", x, g.op("Reshape", index, g.ints([-1])), axis=axis, spec=g.outputs[0])


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


@op("one_hot(nograd Tensor<int32|int64> index, int num_classes=-1) -> Tensor<int64> y", traits=["no_grad"])
def one_hot(index, *, num_classes):
    """``torch.nn.functional.one_hot``: int64 of shape ``(*index.shape, num_classes)``, 1 at the class ``index``
    names and 0 elsewhere. Indices must lie in [0, num_classes). ``num_classes=-1`` takes one more than the largest
    index, as PyTorch: a size only the data knows, so only eager calls can use it (a program needs the number)."""
    if num_classes == -1:
        if not index.size:
            raise ArgumentError("one_hot(): num_classes=-1 takes the number of classes from the largest index, "
                                "and index is empty; pass num_classes")
        num_classes = builtins.max(int(index.max()) + 1, 1)
    index = _checked_index("one_hot", index, num_classes, negative=False)
    column = index[..., None]  # (an array even where index came as a NumPy scalar)
    return (column == np.arange(num_classes, like=column)).astype(np.int64)


@one_hot.onnx
def _(g, index, *, num_classes):
    # ONNX Runtime's OneHot writes floats (and reads int64 indices): cast around it; ONNX wants indices of rank >= 1
    flat = g.op("Reshape", g.cast(index, D.int64), g.ints([-1])) if index.ndim == 0 else g.cast(index, D.int64)
    hot = g.op("OneHot", flat, g.const(np.array(num_classes, np.int64)), g.const(np.array([0, 1], np.float32)),
               axis=-1, spec=Spec(g.outputs[0].shape, D.float32))
    if index.ndim == 0:
        hot = g.op("Reshape", hot, g.ints([num_classes]))
    return g.cast(hot, D.int64)


@one_hot.check
def _(*, num_classes):
    if num_classes < 1 and num_classes != -1:
        raise ValueError(f"argument 'num_classes' must be >= 1, or -1 (one more than the largest index), "
                         f"got {num_classes}")


@one_hot.infer
def _(index, *, num_classes):
    if num_classes == -1:
        raise ShapeError("one_hot(): num_classes=-1 makes the number of classes depend on the values of index, which "
                         "shape inference (a program) cannot see; pass num_classes")
    return Spec((*index.shape, num_classes), D.int64)


@one_hot.samples
def _(rng):
    yield Sample.of(np.array([0, 2, 1, 2]), num_classes=3)
    yield Sample.of(np.array([[4, 0], [1, 1]], np.int32), num_classes=5)
    yield Sample.of(np.array(1), num_classes=2)


@op("index_add(Tensor x, int axis/dim, nograd Tensor<int32|int64> index, Tensor source, *, float alpha=1.0) "
    "-> Tensor y")
def index_add(x, index, source, *, axis, alpha):
    """``torch.index_add``: a copy of ``x`` to which ``alpha·source`` is added slice by slice: the slice ``i`` of
    ``source`` along ``axis`` goes to the slice ``index[i]`` of ``x`` (indices that repeat collect every
    contribution). ``source`` has the shape of ``x`` with dim ``axis`` of size ``len(index)``. The adjoint of
    ``index_select``."""
    dtype = _index_add_dtype(x, index, source, axis, alpha)
    added = (source * alpha if alpha != 1 else source).astype(dtype, copy=False)
    if x.ndim == 0:  # a 0-d x is its one slice
        _checked_index("index_add", index, 1)
        return (x + added).astype(dtype)
    out = x.astype(dtype, copy=True)
    where = (builtins.slice(None),) * (axis % x.ndim) + (_checked_index("index_add", index.reshape(-1), x.shape[axis]),)
    array_module(out).add.at(out, where, added)
    return out


def _index_add_dtype(x, index, source, axis, alpha):
    """The result's dtype, after checking the shapes (Specs or arrays)."""
    xs, ns = tuple(x.shape), tuple(index.shape)
    if len(ns) > 1:
        raise ShapeError(f"index_add(): index must be 1-D, got shape {ns}")
    if not xs:
        _one_axis("index_add", axis, 1)
        if ns not in ((), (1,)):
            raise ShapeError(f"index_add(): a 0-d x has one slice, index must name it once, got shape {ns}")
        expected = ()
    else:
        a = _one_axis("index_add", axis, len(xs))
        expected = (*xs[:a], ns[0] if ns else 1, *xs[a + 1:])
    if len(source.shape) != len(expected) or any(s is not None and e is not None and s != e
                                                 for s, e in zip(source.shape, expected)):
        raise ShapeError(f"index_add(): source must have shape {expected} (x's shape {xs} with dim {axis} the "
                         f"length of index), got {tuple(source.shape)}")
    dtype = D.promote(x.dtype, source.dtype)
    if not D.is_floating(dtype) and not float(alpha).is_integer():
        raise ArgumentError(f"index_add(): argument 'alpha' must be a whole number for {dtype} tensors, got {alpha}")
    return dtype


@index_add.infer
def _(x, index, source, *, axis, alpha):
    return Spec(tuple(x.shape), _index_add_dtype(x, index, source, axis, alpha))


@index_add.grad
def _(index, dy, *, axis, alpha, needs_input_grad):
    dsource = None
    if needs_input_grad[2]:  # source slice i went to slice index[i]: it reads the gradient there
        dsource = F.index_select(dy, axis, index) if dy.ndim else dy
        dsource = dsource * alpha if alpha != 1 else dsource
    return dy, None, dsource


@index_add.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 3)), np.array([0, 2, 0]), rng.standard_normal((3, 3)), axis=0)
    yield Sample.of(rng.standard_normal((2, 5)), np.array([-1, 1]), rng.standard_normal((2, 2)), axis=1, alpha=-0.5)
    yield Sample.of(rng.standard_normal((2, 3, 2)), np.array([2, 2, 2, 0]), rng.standard_normal((2, 4, 2)), axis=-2)
    yield Sample.of(rng.standard_normal(()), np.array([0]), rng.standard_normal(()), axis=0, alpha=2.0)


def _masked_fill_spec(x, mask, value):
    if len(value.shape):
        raise ShapeError(f"masked_fill(): value must be 0-d (a number), got shape {tuple(value.shape)}")
    return Spec(broadcast_shapes(x.shape, mask.shape, op="masked_fill"), x.dtype)


@op("masked_fill(Tensor x, nograd Tensor<bool> mask, Tensor value) -> Tensor y", infer=_masked_fill_spec)
def masked_fill(x, mask, value):
    """``torch.masked_fill``: ``value`` where ``mask`` is True, ``x`` elsewhere (``x`` and ``mask`` broadcast). The
    result keeps ``x``'s dtype; ``value`` is a number or a 0-d tensor, and gets the gradient of the positions it
    fills."""
    _masked_fill_spec(x, mask, value)
    return np.where(mask, value, x).astype(x.dtype, copy=False)


@masked_fill.grad
def _(mask, dy):
    return F.where(mask, 0, dy), None, F.where(mask, dy, 0)  # the engine sums each down to its input's shape


@masked_fill.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)) > 0, rng.standard_normal(()))
    yield Sample.of(rng.standard_normal(3), rng.standard_normal((2, 3)) > 0, rng.standard_normal(()))  # broadcast
    yield Sample.of(rng.integers(-3, 3, (4,)), np.array([True, False, True, False]), np.array(5))


@masked_fill.onnx
def _(g, x, mask, value):
    return g.op("Where", mask, g.cast(value, x.dtype), x, spec=g.outputs[0])


@index_add.onnx
def _(g, x, index, source, *, axis, alpha):
    dtype = g.outputs[0].dtype
    x, source = g.cast(x, dtype), g.cast(source, dtype)
    if alpha != 1:
        source = g.op("Mul", source, g.scalar(alpha, source))
    if x.ndim == 0:  # a 0-d x is its one slice
        return g.op("Add", x, g.op("Reshape", source, g.ints([]), spec=g.outputs[0]), spec=g.outputs[0])
    # ScatterElements adds source[..., i, ...] at x[..., index[i], ...]: index laid along the axis, spread over the
    # other dims of source
    a = axis % x.ndim
    along = g.op("Reshape", g.cast(index, D.int64), g.ints([-1 if d == a else 1 for d in range(x.ndim)]))
    spread = g.op("Expand", along, g.op("Shape", source))
    return g.op("ScatterElements", x, spread, source, axis=a, reduction="add", spec=g.outputs[0])
