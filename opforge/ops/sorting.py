"""Sorting along an axis: sort, argsort, topk. The sorted values are differentiable: each one's gradient goes back to
the element it came from (``gather_grad`` with the indices), so second derivatives follow from gather's rules.

Sorting is stable (equal elements keep their order, in both directions) and NaN sorts as the largest element,
as in PyTorch."""

from opforge import ops as F

from ._common import D, Sample, ShapeError, Spec, normalize_axes, np, op
from .shape import _one_axis


def _order(x, axis, descending):
    """The stable sorting permutation along ``axis`` (0 for a 0-d tensor)."""
    if x.ndim == 0:
        return np.zeros((), np.int64, like=x)
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    # Largest first with ties in their original order: sort the reversed tensor ascending (ties then come last
    # index first), reverse that, and map positions back.
    return x.shape[axis] - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)


def _sort_axis(op_name, shape, axis):
    normalize_axes(op_name, (axis,), len(shape))  # a 0-d tensor accepts 0 and -1


def _sort_samples(rng):
    yield Sample.of(rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1, descending=True)
    yield Sample.of(rng.standard_normal(5), axis=0)
    yield Sample.of(rng.standard_normal(()))
    yield Sample.of(rng.integers(0, 3, (2, 5)), descending=True)  # ties keep their order


def _take_along(x, indices, axis):
    return np.take_along_axis(x, indices, axis) if x.ndim else x.copy()


@op("sort(Tensor x, int axis/dim=-1, bool descending=False, *, bool stable=False) -> (Tensor values, "
    "Tensor<int64> indices)")
def sort(x, *, axis, descending, stable):
    """``torch.sort``: the elements along ``axis`` in ascending (``descending``: descending) order, and where each
    came from. Always stable; ``stable`` is accepted for PyTorch's signature."""
    _sort_axis("sort", x.shape, axis)
    indices = _order(x, axis, descending)
    return _take_along(x, indices, axis), indices


@sort.infer
def _(x, *, axis, descending, stable):
    _sort_axis("sort", x.shape, axis)
    return Spec(x.shape, x.dtype), Spec(x.shape, D.int64)


def _values_grad(indices, dvalues, x_spec, *, axis):
    if not x_spec.shape:
        return dvalues
    return F.gather_grad(dvalues, indices, shape=x_spec.shape, axis=axis)


sort.grad(_values_grad)
sort.samples(_sort_samples)


@op("argsort(Tensor x, int axis/dim=-1, bool descending=False, bool stable=False) -> Tensor<int64> indices",
    traits=["no_grad"])
def argsort(x, *, axis, descending, stable):
    """``torch.argsort``: the indices that sort ``x`` along ``axis`` (``sort``'s second output)."""
    _sort_axis("argsort", x.shape, axis)
    return _order(x, axis, descending)


@argsort.infer
def _(x, *, axis, descending, stable):
    _sort_axis("argsort", x.shape, axis)
    return Spec(x.shape, D.int64)


argsort.samples(_sort_samples)


def _topk_shape(shape, k, axis):
    if not shape:
        if k != 1:
            raise ShapeError(f"topk(): a 0-d tensor holds one element, k must be 1, got {k}")
        return ()
    a = _one_axis("topk", axis, len(shape))
    if shape[a] is not None and k > shape[a]:
        raise ShapeError(f"topk(): k={k} is more than the {shape[a]} elements along axis {axis} of shape {shape}")
    return (*shape[:a], k, *shape[a + 1:])


@op("topk(Tensor x, int k, int axis/dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, "
    "Tensor<int64> indices)")
def topk(x, *, k, axis, largest, sorted):
    """``torch.topk``: the ``k`` largest (``largest=False``: smallest) elements along ``axis``, largest first
    (smallest first), and where they came from. Equal elements come in their original order; the result is
    sorted also with ``sorted=False`` (PyTorch leaves the order unspecified then)."""
    _topk_shape(x.shape, k, axis)
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64, like=x)
    indices = np.take(_order(x, axis, largest), np.arange(k, like=x), axis=axis)
    return np.take_along_axis(x, indices, axis), indices


@topk.check
def _(*, k, axis, largest, sorted):
    if k < 0:
        raise ValueError(f"argument 'k' must be >= 0, got {k}")


@topk.infer
def _(x, *, k, axis, largest, sorted):
    shape = _topk_shape(x.shape, k, axis)
    return Spec(shape, x.dtype), Spec(shape, D.int64)


topk.grad(_values_grad)


@topk.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 5)), k=2)
    yield Sample.of(rng.standard_normal((4, 3)), k=3, axis=0, largest=False)
    yield Sample.of(rng.standard_normal((2, 3, 4)), k=0, axis=1)
    yield Sample.of(rng.standard_normal(()), k=1)
    yield Sample.of(rng.integers(0, 3, (6,)), k=4)


# -- ONNX export: TopK, whose ties go to the lower index first, as our stable order ---------------------------------


def _onnx_topk(g, x, k, axis, largest):
    """(values, indices) of TopK along ``axis``; ``k`` an int or None (the whole axis, read from x's shape)."""
    if x.ndim == 0:
        return g.op("Identity", x), g.const(np.zeros((), np.int64))
    a = axis % x.ndim
    count = g.ints([k]) if k is not None else g.op("Shape", x, start=a, end=a + 1, spec=Spec((1,), D.int64))
    values, indices = g.op("TopK", x, count, axis=a, largest=largest, sorted=1, outputs=2)
    return values, indices


sort.onnx(lambda g, x, *, axis, descending, stable: _onnx_topk(g, x, None, axis, descending))
argsort.onnx(lambda g, x, *, axis, descending, stable: _onnx_topk(g, x, None, axis, descending)[1])
topk.onnx(lambda g, x, *, k, axis, largest, sorted: _onnx_topk(g, x, k, axis, largest))
