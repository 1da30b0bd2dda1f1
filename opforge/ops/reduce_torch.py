"""torch's reductions beyond ``reduce.py``'s: all and any, count_nonzero, nansum and nanmean, aminmax, var_mean and
std_mean, trace, diff, logcumsumexp, cummax and cummin, the order statistics (kthvalue, median, nanmedian, mode,
quantile, nanquantile), bincount and unique; the trapezoidal rule (trapezoid, trapz, cumulative_trapezoid), cov and
corrcoef.

Each means what its torch namesake means: its call forms (positional in torch's order, ``dim=`` beside ``axis=``,
``keepdim``), values, dtypes, which element a value-selecting reduction names on ties and NaN, and its gradient's
convention (to the selected index, or shared among ties where torch shares it). Those written with existing ops are
functions; the others are ops whose gradient rules are written with ops, so they differentiate again.
"""

import builtins
import warnings
from collections import namedtuple

from opforge import ops as F

from ..core.errors import ArgumentError, describe
from ._common import D, Sample, ShapeError, Spec, function, normalize_axes, np, op
from .reduce import _expand, _reduce_samples, _reduced_shape, reduction_axes, refuse_no_axes


def _dims(dim, axis, name: str):
    """torch's ``dim`` (or its spelling ``axis``) as the axes of a reduction: None, one int or a sequence."""
    if axis is not None:
        if dim is not None:
            raise ArgumentError(f"{name}(): give dim or axis (two spellings of one argument), not both")
        dim = axis
    if dim is None or isinstance(dim, (list, tuple)):
        refuse_no_axes(name, dim)
        return dim
    if isinstance(dim, (int, np.integer)) and not isinstance(dim, (bool, np.bool_)):
        return [int(dim)]
    raise ArgumentError(f"{name}(): dim must be an int, a sequence of ints or None, got {describe(dim)}")




# -- all, any ------------------------------------------------------------------------------------------------------


def _bool_reduction_spec(op_name):
    def infer(x, *, axis, keepdim):
        return Spec(_reduced_shape(op_name, x.shape, axis, keepdim), D.bool_)
    return infer


def _bool_samples(rng):
    yield from _reduce_samples(rng)
    yield Sample.of(rng.integers(0, 2, (3, 4)).astype(bool), axis=1)
    yield Sample.of(np.array([[0.0, 1.0], [2.0, np.nan]]), axis=0)


@op("all(Tensor x, int[] axis/dim=None, bool keepdim/keepdims=False) -> Tensor<bool> y", traits=["no_grad"])
def all(x, *, axis, keepdim):
    """``torch.all``: whether every element over ``axis`` is nonzero (all axes when None; NaN counts as nonzero)."""
    return np.all(x, axis=reduction_axes("all", axis, x.ndim), keepdims=keepdim)


@op("any(Tensor x, int[] axis/dim=None, bool keepdim/keepdims=False) -> Tensor<bool> y", traits=["no_grad"])
def any(x, *, axis, keepdim):
    """``torch.any``: whether some element over ``axis`` is nonzero (all axes when None)."""
    return np.any(x, axis=reduction_axes("any", axis, x.ndim), keepdims=keepdim)


for _fn in (all, any):
    _fn.infer(_bool_reduction_spec(_fn.name))
    _fn.samples(_bool_samples)


# -- reductions written with ops -------------------------------------------------------------------------------------


@function
def count_nonzero(input, dim=None, *, axis=None):
    """``torch.count_nonzero``: the number of nonzero elements over ``dim`` (every dim when None), int64."""
    return F.sum(F.not_equal(input, F.zeros_like(input)), axis=_dims(dim, axis, "count_nonzero"))


@function
def nansum(input, dim=None, keepdim=False, *, dtype=None, axis=None):
    """``torch.nansum``: the sum over ``dim`` with NaN counted as zero (its gradient 0 there)."""
    if dtype is not None:
        input = F.cast(input, dtype=dtype)
    dims = _dims(dim, axis, "nansum")
    if D.is_floating(input.dtype):
        input = F.where(F.isnan(input), F.zeros_like(input), input)
    return F.sum(input, axis=dims, keepdim=keepdim)


@function
def nanmean(input, dim=None, keepdim=False, *, dtype=None, axis=None):
    """``torch.nanmean``: the mean over ``dim`` of the elements that are not NaN (NaN where all are)."""
    if dtype is not None:
        input = F.cast(input, dtype=dtype)
    if not D.is_floating(input.dtype):
        raise ArgumentError(f"nanmean(): argument 'input' must be a floating tensor, got {input.dtype} (as torch's)")
    dims = _dims(dim, axis, "nanmean")
    present = F.logical_not(F.isnan(input))
    total = F.sum(F.where(present, input, F.zeros_like(input)), axis=dims, keepdim=keepdim)
    return total / F.cast(F.sum(present, axis=dims, keepdim=keepdim), dtype=input.dtype)


_AMINMAX = namedtuple("aminmax", ("min", "max"))


@function
def aminmax(input, *, dim=None, keepdim=False):
    """``torch.aminmax``: the named tuple ``(min, max)`` over ``dim`` (all dims when None), each as ``amin`` and
    ``amax`` (the gradient shared among ties)."""
    dims = _dims(dim, None, "aminmax")
    return _AMINMAX(F.amin(input, axis=dims, keepdim=keepdim), F.amax(input, axis=dims, keepdim=keepdim))


def _moments(name, input, dim, unbiased, keepdim, correction, axis):
    """torch.var_mean's call forms: (input, dim, unbiased, keepdim), (input, unbiased), (input, dim, *, correction,
    keepdim). Returns the dims and the correction."""
    if isinstance(dim, (bool, np.bool_)):  # var_mean(x, True): unbiased, over every dim
        dim, unbiased = None, builtins.bool(dim)
    if unbiased is not None and correction is not None:
        raise ArgumentError(f"{name}(): give unbiased or correction, not both")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return _dims(dim, axis, name), float(correction)


_VAR_MEAN = namedtuple("var_mean", ("var", "mean"))  # torch returns a plain tuple: these compare equal to one
_STD_MEAN = namedtuple("std_mean", ("std", "mean"))


@function
def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None):
    """``torch.var_mean``: ``(var, mean)`` over ``dim``, as ``var`` and ``mean`` compute them."""
    dims, correction = _moments("var_mean", input, dim, unbiased, keepdim, correction, axis)
    return _VAR_MEAN(F.var(input, axis=dims, correction=correction, keepdim=keepdim),
                     F.mean(input, axis=dims, keepdim=keepdim))


@function
def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None):
    """``torch.std_mean``: ``(std, mean)`` over ``dim``, as ``std`` and ``mean`` compute them."""
    dims, correction = _moments("std_mean", input, dim, unbiased, keepdim, correction, axis)
    return _STD_MEAN(F.std(input, axis=dims, correction=correction, keepdim=keepdim),
                     F.mean(input, axis=dims, keepdim=keepdim))


@function
def trace(input):
    """``torch.trace`` (``Tensor.trace``): the sum of a matrix's main diagonal (int64 for integer matrices). Not
    ``of.trace``, which traces a program."""
    if len(input.shape) != 2:
        raise ShapeError(f"trace(): expects a matrix (2-D), got a tensor of shape {tuple(input.shape)}")
    return F.sum(F.diagonal(input))


@function
def diff(input, n=1, dim=-1, prepend=None, append=None, *, axis=None):
    """``torch.diff``: the n-th forward difference along ``dim``, ``out[i] = x[i + 1] − x[i]`` applied ``n`` times,
    after ``prepend`` and ``append`` are joined to ``input`` along ``dim``; for bool tensors ``x[i + 1] != x[i]``."""
    (dim,) = _dims(dim, axis, "diff")
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ArgumentError(f"diff(): argument 'n' must be a non-negative int, got {describe(n)}")
    if not input.shape:
        raise ShapeError("diff(): expects a tensor of at least one dim, got a 0-d tensor")
    d = normalize_axes("diff", [dim], len(input.shape))[0]
    if n == 0:  # as torch: prepend and append are not joined either
        return input
    parts = [t for t in (prepend, input, append) if t is not None]
    x = F.concat(parts, axis=d) if len(parts) > 1 else input
    for _ in range(n):
        size = x.shape[d]
        if size == 0:
            break
        later = F.slice(x, axes=[d], starts=[1], ends=[size], steps=[1])
        earlier = F.slice(x, axes=[d], starts=[0], ends=[size - 1], steps=[1])
        x = F.not_equal(later, earlier) if x.dtype == D.bool_ else later - earlier
    return x


# -- logcumsumexp ---------------------------------------------------------------------------------------------------


def _one_axis(op_name, shape, axis):
    return normalize_axes(op_name, [axis], len(shape))


def _accumulate(ufunc, x, axis, xp):
    """``ufunc.accumulate(x, axis=axis)``: NumPy's on the host; elsewhere (CuPy accumulates add and multiply alone)
    a scan in log₂ n steps (Hillis and Steele's), each element combined with the one 1, 2, 4 … places before it —
    exactly NumPy's for maximum and minimum, within rounding for logaddexp (its terms grouped otherwise)."""
    if xp is np:
        return ufunc.accumulate(x, axis=axis)
    y = xp.moveaxis(x, axis, -1)
    step = 1
    while step < y.shape[-1]:
        y = xp.concatenate([y[..., :step], ufunc(y[..., step:], y[..., :-step])], axis=-1)
        step *= 2
    return xp.moveaxis(y, -1, axis)


@op("logcumsumexp(Tensor<floating> x, int axis/dim) -> Tensor y")
def logcumsumexp(x, *, axis, xp=np):
    """``torch.logcumsumexp``: running ln Σ eˣ along ``axis``, yᵢ = ln(e^x₀ + … + e^xᵢ), without overflow."""
    if x.ndim == 0:
        _one_axis("logcumsumexp", x.shape, axis)
        return x.copy()
    with np.errstate(invalid="ignore"):  # −inf + inf: NaN, as torch (the host's warning; a device warns of nothing)
        return _accumulate(np.logaddexp, x, axis, xp)


@logcumsumexp.infer
def _(x, *, axis):
    _one_axis("logcumsumexp", x.shape, axis)
    return Spec(x.shape, x.dtype)


@logcumsumexp.grad
def _(x, y, dy, *, axis):
    # dxᵢ = Σⱼ≥ᵢ dyⱼ·e^(xᵢ − yⱼ), computed as torch (after TensorFlow) does without overflow: the positive and the
    # negative parts of dy each as e^(xᵢ + ln Σⱼ≥ᵢ e^(ln|dyⱼ| − yⱼ)), a reversed logcumsumexp.
    if not x.shape:
        return dy
    lowest = float(np.finfo(np.dtype(str(x.dtype))).min)

    def from_end(t):
        return F.flip(F.logcumsumexp(F.flip(t, axis=[axis]), axis=axis), axis=[axis])

    log_abs = F.log(F.abs(F.where(dy == 0, F.ones_like(dy), dy)))
    positive = F.exp(from_end(F.where(dy > 0, log_abs, lowest) - y) + x)
    negative = F.exp(from_end(F.where(dy < 0, log_abs, lowest) - y) + x)
    return positive - negative


@logcumsumexp.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1)
    yield Sample.of(rng.standard_normal((2, 3)) * 300, axis=-1)  # would overflow as ln(cumsum(eˣ))
    yield Sample.of(rng.standard_normal(5), axis=0)
    yield Sample.of(rng.standard_normal(()), axis=0)


# -- cummax, cummin --------------------------------------------------------------------------------------------------


def _cumulative_extreme(x, axis, extreme, xp):
    """Running extremes along ``axis`` and, as torch, the index of the last element equal to each (the last NaN
    once one has come: NaN propagates)."""
    if x.ndim == 0:
        return x.copy(), xp.zeros((), np.int64)
    values = _accumulate(extreme, x, axis, xp)
    hit = (x == values) | (np.isnan(x) & np.isnan(values)) if D.is_floating(x.dtype) else x == values
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    positions = np.where(hit, xp.arange(x.shape[axis]).reshape(shape), 0)
    return values, _accumulate(np.maximum, positions, axis, xp) if x.size else positions.astype(np.int64)


@op("cummax(Tensor x, int axis/dim) -> (Tensor values, Tensor<int64> indices)")
def cummax(x, *, axis, xp=np):
    """``torch.cummax``: the running largest element along ``axis`` and the index of the last one equal to it."""
    _one_axis("cummax", x.shape, axis)
    values, indices = _cumulative_extreme(x, axis, np.maximum, xp)
    return values, indices.astype(np.int64)


@op("cummin(Tensor x, int axis/dim) -> (Tensor values, Tensor<int64> indices)")
def cummin(x, *, axis, xp=np):
    """``torch.cummin``: the running smallest element along ``axis`` and the index of the last one equal to it."""
    _one_axis("cummin", x.shape, axis)
    values, indices = _cumulative_extreme(x, axis, np.minimum, xp)
    return values, indices.astype(np.int64)


def _cumulative_extreme_spec(op_name):
    def infer(x, *, axis):
        _one_axis(op_name, x.shape, axis)
        return Spec(x.shape, x.dtype), Spec(x.shape, D.int64)
    return infer


def _selected_grad(indices, dvalues, x_spec, *, axis):
    """Each value's gradient to the element it was taken from (torch's value_selecting_reduction_backward)."""
    if not x_spec.shape:
        return dvalues
    return F.gather_grad(dvalues, indices, shape=x_spec.shape, axis=axis)


def _cumulative_samples(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1)
    yield Sample.of(rng.standard_normal((3, 5)), axis=-1)
    yield Sample.of(rng.standard_normal(()), axis=0)
    yield Sample.of(rng.integers(-2, 3, (3, 4)), axis=1)  # ties: the last index


for _fn in (cummax, cummin):
    _fn.infer(_cumulative_extreme_spec(_fn.name))
    _fn.grad(_selected_grad)
    _fn.samples(_cumulative_samples)


# -- order statistics -----------------------------------------------------------------------------------------------
# Sorting is stable with NaN as the largest element (as ``sort``), which picks torch's index among ties in the
# samples here; torch's own selection (a quickselect) names some other tied index, or NaN, in cases it leaves
# unspecified (docs/pytorch.md).


def _along_last(x, axis):
    """x with ``axis`` moved last (a 0-d x as one element), and a function that puts a kept last axis back."""
    if x.ndim == 0:
        return x.reshape(1), lambda t, keepdim: t.reshape(())
    moved = np.moveaxis(x, axis, -1)

    def back(t, keepdim):  # t has a last axis of size 1
        t = np.moveaxis(t, -1, axis)
        return t if keepdim else np.squeeze(t, axis)

    return moved, back


def _refuse_empty_tensor(shape):
    if 0 in shape:
        raise ShapeError(f"median_select(): cannot take the median of an empty tensor (shape {tuple(shape)})")


def _select_spec(op_name):
    def infer(x, *, axis, keepdim, k=None, ignore_nan=None):
        if axis is None:
            _refuse_empty_tensor(x.shape)
            shape = (1,) * len(x.shape) if keepdim else ()
        else:
            _refuse_empty_axis(op_name, x.shape, axis)
            shape = _reduced_shape(op_name, x.shape, [axis], keepdim)
        return Spec(shape, x.dtype), Spec(shape, D.int64)
    return infer


def _refuse_empty_axis(op_name, shape, axis):
    (a,) = _one_axis(op_name, shape, axis) if shape else (None,)
    if a is not None and shape[a] == 0:
        raise ShapeError(f"{op_name}(): cannot select from dim {a} of size 0 (input shape {tuple(shape)})")


def _selection_grad(x, values, indices, dvalues, axis, keepdim):
    """The gradient of a value-selecting reduction: to the selected index along ``axis``; over all elements
    (``axis`` None), shared among the elements equal to the value (NaN counting as equal to NaN), as torch's."""
    if axis is None:
        v = F.reshape(values, shape=[1] * len(x.shape))
        hit = F.logical_or(x == v, F.logical_and(F.isnan(x), F.isnan(v)))
        share = F.cast(hit, dtype=dvalues.dtype)
        return share * (F.reshape(dvalues, shape=[1] * len(x.shape)) / F.sum(share))
    if not x.shape:
        return dvalues
    return F.gather_grad(_expand(dvalues, x.shape, [axis], keepdim), _expand(indices, x.shape, [axis], keepdim),
                         shape=x.shape, axis=axis)


@op("kthvalue(Tensor<number> x, int k, int axis/dim=-1, bool keepdim/keepdims=False) -> (Tensor values, "
    "Tensor<int64> indices)")
def kthvalue(x, *, k, axis, keepdim):
    """``torch.kthvalue``: the k-th smallest element along ``axis`` (k from 1) and its index."""
    _refuse_empty_axis("kthvalue", x.shape, axis)
    n = x.shape[axis] if x.ndim else 1
    if not 1 <= k <= n:
        raise ArgumentError(f"kthvalue(): argument 'k' must be in [1, {n}] (the size of dim {axis}), got {k}")
    rows, back = _along_last(x, axis)
    index = np.argsort(rows, axis=-1, kind="stable")[..., k - 1:k]
    return back(np.take_along_axis(rows, index, -1), keepdim), back(index, keepdim).astype(np.int64)


kthvalue.infer(_select_spec("kthvalue"))
kthvalue.grad(lambda x, values, indices, dvalues, *, axis, keepdim:
             _selection_grad(x, values, indices, dvalues, axis, keepdim))


@kthvalue.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), k=2, axis=1)
    yield Sample.of(rng.standard_normal((3, 5)), k=5, keepdim=True)
    yield Sample.of(rng.standard_normal(()), k=1, axis=0)
    yield Sample.of(rng.integers(0, 3, (2, 6)), k=3)  # ties


@op("median_select(Tensor<number> x, int? axis/dim=None, bool keepdim/keepdims=False, *, bool ignore_nan=False) "
    "-> (Tensor values, Tensor<int64> indices)")
def median_select(x, *, axis, keepdim, ignore_nan, xp=np):
    """The lower median along ``axis`` (of all elements when None) and its index: what ``median`` and
    ``nanmedian`` return. A row holding NaN has median NaN (at its first NaN) unless ``ignore_nan``, which leaves
    NaN out (NaN only where the row is all NaN)."""
    if axis is None:
        _refuse_empty_tensor(x.shape)
        values, indices = _median_along(x.reshape(-1), 0, False, ignore_nan, xp)
        shape = (1,) * x.ndim if keepdim else ()
        return values.reshape(shape), indices.reshape(shape)
    _refuse_empty_axis("median_select", x.shape, axis)
    return _median_along(x, axis, keepdim, ignore_nan, xp)


def _median_along(x, axis, keepdim, ignore_nan, xp):
    rows, back = _along_last(x, axis)
    order = np.argsort(rows, axis=-1, kind="stable")
    nan = np.isnan(rows) if D.is_floating(x.dtype) else xp.zeros(rows.shape, bool)
    if ignore_nan:
        present = rows.shape[-1] - np.sum(nan, axis=-1, keepdims=True)
        index = np.take_along_axis(order, np.maximum(present - 1, 0) // 2, -1)
    else:
        index = order[..., (rows.shape[-1] - 1) // 2:][..., :1]
        index = np.where(nan.any(-1, keepdims=True), np.argmax(nan, -1)[..., None], index)
    return back(np.take_along_axis(rows, index, -1), keepdim), back(index, keepdim).astype(np.int64)


median_select.infer(_select_spec("median_select"))
median_select.grad(lambda x, values, indices, dvalues, *, axis, keepdim:
             _selection_grad(x, values, indices, dvalues, axis, keepdim))


@median_select.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1)
    yield Sample.of(rng.standard_normal((3, 4)), axis=0, keepdim=True)
    yield Sample.of(rng.standard_normal((3, 4)))
    # (ties, where the gradient is shared, are not differentiable: tests/test_oracle_opinfo.py checks torch's rule)
    yield Sample.of(np.array([[1.0, np.nan, -1.0, 2.0], [0.5, 0.25, 3.0, 2.5]]), axis=1, ignore_nan=True)
    yield Sample.of(rng.integers(0, 3, (2, 5)), axis=1)


_MEDIAN_TYPES = {name: namedtuple(name, ("values", "indices")) for name in ("median", "nanmedian")}


def _median(name, input, dim, keepdim, axis):
    if axis is not None:
        if dim is not None:
            raise ArgumentError(f"{name}(): give dim or axis (two spellings of one argument), not both")
        dim = axis
    if dim is None:
        return F.median_select(input, ignore_nan=name == "nanmedian").values
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, (bool, np.bool_)):
        raise ArgumentError(f"{name}(): dim must be one int or None, got {describe(dim)}")
    return _MEDIAN_TYPES[name](*F.median_select(input, dim, keepdim, ignore_nan=name == "nanmedian"))


@function
def median(input, dim=None, keepdim=False, *, axis=None):
    """``torch.median``: ``median(x)`` the lower median of all elements (NaN if one is NaN; the gradient shared
    among the elements equal to it), ``median(x, dim, keepdim=False)`` the named tuple ``(values, indices)`` along
    ``dim`` (the gradient to the index). The lower of the two middle elements for an even count, not their mean."""
    return _median("median", input, dim, keepdim, axis)


@function
def nanmedian(input, dim=None, keepdim=False, *, axis=None):
    """``torch.nanmedian``: ``median`` with NaN left out (NaN only where every element is)."""
    return _median("nanmedian", input, dim, keepdim, axis)


@op("mode(Tensor x, int axis/dim=-1, bool keepdim/keepdims=False) -> (Tensor values, Tensor<int64> indices)")
def mode(x, *, axis, keepdim, xp=np):
    """``torch.mode``: the most frequent value along ``axis`` (the smallest of equally frequent ones) and the index
    of its last occurrence. Each NaN counts as a value of its own."""
    _refuse_empty_axis("mode", x.shape, axis)
    rows, back = _along_last(x, axis)
    n = rows.shape[-1]
    flat = rows.reshape(-1, n)
    # every row sorted (NaN last), cut into runs of equal values (NaN != NaN: a run each); a run's length counted
    # at its number in the row; the first longest run holds the smallest of the most frequent values
    ordered = np.sort(flat, axis=-1)
    starts = xp.concatenate([xp.ones((len(flat), min(n, 1)), bool), ordered[:, 1:] != ordered[:, :-1]], axis=-1)
    run = np.cumsum(starts, axis=-1) - 1
    counts = xp.zeros(flat.shape, np.int64)
    xp.add.at(counts, (xp.arange(len(flat))[:, None], run), 1)
    best = np.argmax(counts, axis=-1)[:, None]
    values = np.take_along_axis(ordered, np.argmax(run == best, axis=-1)[:, None], -1)  # the run's first element
    hit = (flat == values) | (np.isnan(flat) & np.isnan(values)) if D.is_floating(x.dtype) else flat == values
    indices = n - 1 - np.argmax(hit[:, ::-1], axis=-1)  # the last occurrence
    shape = (*rows.shape[:-1], 1)
    return back(values.reshape(shape), keepdim), back(indices.astype(np.int64).reshape(shape), keepdim)


mode.infer(_select_spec("mode"))
mode.grad(lambda x, values, indices, dvalues, *, axis, keepdim:
             _selection_grad(x, values, indices, dvalues, axis, keepdim))


@mode.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1)
    yield Sample.of(rng.standard_normal((2, 5)), keepdim=True)  # distinct: the smallest (ties in the oracle test)
    yield Sample.of(rng.standard_normal(()))
    yield Sample.of(rng.integers(0, 3, (2, 6)), axis=0)


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(name, input, q, dim, keepdim, interpolation, ignore_nan):
    if interpolation not in _INTERPOLATIONS:
        raise ArgumentError(f"{name}(): argument 'interpolation' must be one of {', '.join(_INTERPOLATIONS)}, got "
                            f"{interpolation!r}")
    if not D.is_floating(input.dtype):
        raise ArgumentError(f"{name}(): argument 'input' must be a floating tensor, got {input.dtype} (as torch's)")
    if hasattr(q, "shape"):  # a tensor: differentiable, as torch's (the lerp weights depend on it)
        if len(q.shape) > 1:
            raise ShapeError(f"{name}(): argument 'q' must be a number or a 0-d or 1-D tensor, got shape "
                             f"{tuple(q.shape)}")
        scalar_q, values_q = len(q.shape) == 0, np.reshape(q.numpy(), -1)
        qs = [q] if scalar_q else [F.reshape(F.slice(q, axes=[0], starts=[i], ends=[i + 1], steps=[1]), shape=[])
                                   for i in range(q.shape[0])]
    else:
        scalar_q, values_q, qs = True, np.array([q], float), [float(q)]
    if not ((values_q >= 0) & (values_q <= 1)).all():  # NaN fails this too
        raise ArgumentError(f"{name}(): argument 'q' must be in [0, 1], got {values_q.tolist()}")
    if dim is None:
        x, d = F.reshape(input, shape=[-1]), 0
    else:
        x, d = input, normalize_axes(name, [dim], len(input.shape))[0] if input.shape else 0
        if not input.shape:
            x = F.reshape(input, shape=[1])
    if x.shape[d] == 0:
        raise ShapeError(f"{name}(): cannot take quantiles over an empty dim (input shape {tuple(input.shape)})")
    values = F.sort(x, axis=d).values  # NaN last
    nan_count = F.sum(F.isnan(values), axis=d, keepdim=True)
    last = x.shape[d] - 1
    if ignore_nan:
        top = F.cast(F.maximum(last - nan_count, F.zeros_like(nan_count)), dtype=x.dtype)  # torch's ranks
        top_nan = F.zeros_like(nan_count) > 0  # an all-NaN row reads its first, NaN, element
    else:
        top, top_nan = F.cast(F.zeros_like(nan_count) + last, dtype=x.dtype), nan_count > 0
    results = []
    for v in qs:
        # torch: a row holding NaN reads its last element, NaN
        rank = F.where(top_nan, float(last), top * (v if type(v) is float else F.cast(v, dtype=x.dtype)))
        if interpolation in ("lower", "higher", "nearest"):
            rank = {"lower": F.floor, "higher": F.ceil, "nearest": F.round}[interpolation](rank)
        below = F.gather(values, d, F.cast(F.floor(rank), dtype="int64"))
        if interpolation in ("linear", "midpoint"):
            above = F.gather(values, d, F.cast(F.ceil(rank), dtype="int64"))
            weight = F.zeros_like(rank) + 0.5 if interpolation == "midpoint" else rank - F.floor(rank)
            below = F.lerp(below, above, weight)
        if dim is None:
            below = F.reshape(below, shape=[1] * len(input.shape) if keepdim else [])
        elif not keepdim or not input.shape:
            below = F.squeeze(below, axis=[d]) if input.shape else F.reshape(below, shape=[])
        results.append(below)
    return results[0] if scalar_q else F.stack(results)


@function
def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear", axis=None):
    """``torch.quantile``: the q-th quantiles along ``dim`` (of all elements when None), q a number or a 1-D tensor
    of them in [0, 1] (then their results stacked first), between the sorted elements by ``interpolation``
    ('linear', 'lower', 'higher', 'midpoint', 'nearest': ties to even). NaN where the row holds one."""
    return _quantile("quantile", input, q, _median_dim(dim, axis, "quantile"), keepdim, interpolation, False)


@function
def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear", axis=None):
    """``torch.nanquantile``: ``quantile`` with NaN left out (NaN only where every element is)."""
    return _quantile("nanquantile", input, q, _median_dim(dim, axis, "nanquantile"), keepdim, interpolation, True)


def _median_dim(dim, axis, name):
    dims = _dims(dim, axis, name)
    if dims is not None and len(dims) != 1:
        raise ArgumentError(f"{name}(): dim must be one int or None, got {dims}")
    return None if dims is None else dims[0]


# -- bincount, unique -----------------------------------------------------------------------------------------------


@op("bincount(Tensor<int32|int64> x, Tensor? weights=None, int minlength=0) -> Tensor y",
    traits=["no_grad", "data_shaped"])
def bincount(x, weights, *, minlength):
    """``torch.bincount``: how often each value 0, 1, ... occurs in the 1-D non-negative ``x`` (int64), or the sum
    of the ``weights`` at each (float32 weights sum in float32, all others in float64, as torch's); at least
    ``minlength`` bins. Its length depends on the data: a program knows it at run time only."""
    if x.size and x.min() < 0:
        raise ArgumentError(f"bincount(): argument 'x' must hold no negative values, got {int(x.min())}")
    if weights is None:
        return np.bincount(x, minlength=minlength).astype(np.int64)
    dtype = np.float32 if weights.dtype == np.float32 else np.float64
    return np.bincount(x, weights.astype(np.float64), minlength=minlength).astype(dtype)


@bincount.infer
def _(x, weights, *, minlength):
    if len(x.shape) != 1:
        raise ShapeError(f"bincount(): argument 'x' must be 1-D, got shape {x.shape}")
    if weights is not None and weights.shape != x.shape:
        raise ShapeError(f"bincount(): weights of shape {weights.shape} must have x's shape, {x.shape}")
    if minlength < 0:
        raise ArgumentError(f"bincount(): argument 'minlength' must be >= 0, got {minlength}")
    dtype = D.int64 if weights is None else D.float32 if weights.dtype == D.float32 else D.float64
    return Spec((None,), dtype)


@bincount.samples
def _(rng):
    yield Sample.of(rng.integers(0, 5, 7))
    yield Sample.of(rng.integers(0, 4, 6), rng.standard_normal(6), minlength=8)
    yield Sample.of(np.zeros(0, np.int64), minlength=2)


@op("unique_all(Tensor x, *, int? axis=None) -> (Tensor values, Tensor<int64> inverse, Tensor<int64> counts)",
    traits=["no_grad", "data_shaped"])
def unique_all(x, *, axis):
    """The sorted distinct elements of ``x`` (along ``axis``: its distinct slices), where each element came from
    and how often each occurs: what ``unique`` returns. Each NaN is distinct, as in torch."""
    if axis is None:
        values, inverse, counts = np.unique(x.reshape(-1), return_inverse=True, return_counts=True, equal_nan=False)
        return values, inverse.reshape(x.shape).astype(np.int64), counts.astype(np.int64)
    _one_axis("unique_all", x.shape, axis)
    values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True, axis=axis, equal_nan=False)
    return values, inverse.reshape(-1).astype(np.int64), counts.astype(np.int64)


@unique_all.infer
def _(x, *, axis):
    if axis is None:
        return Spec((None,), x.dtype), Spec(x.shape, D.int64), Spec((None,), D.int64)
    (a,) = _one_axis("unique_all", x.shape, axis)
    return (Spec(tuple(None if i == a else d for i, d in enumerate(x.shape)), x.dtype), Spec((x.shape[a],), D.int64),
            Spec((None,), D.int64))


@unique_all.samples
def _(rng):
    yield Sample.of(rng.integers(0, 4, (3, 4)))
    yield Sample.of(np.array([1.0, np.nan, 2.0, np.nan, 1.0]))
    yield Sample.of(rng.integers(0, 2, (4, 2)), axis=0)


@function
def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """``torch.unique``: the sorted distinct elements (along ``dim``: the distinct slices), and with
    ``return_inverse`` / ``return_counts`` where each element went and how often each occurs (a tuple, as torch).
    Sorted also with ``sorted=False``, as torch's CPU kernel does."""
    values, inverse, counts = F.unique_all(input, axis=dim)
    extra = [t for t, wanted in ((inverse, return_inverse), (counts, return_counts)) if wanted]
    return (values, *extra) if extra else values


# -- ONNX export -------------------------------------------------------------------------------------------------


def _onnx_nonzero(g, x):
    return g.op("Not", g.op("Equal", x, g.scalar(0, x))) if x.dtype != D.bool_ else x


def _onnx_truth(reduction):
    def mapping(g, x, *, axis, keepdim):
        # ReduceMin/ReduceMax of 0/1 (NaN is nonzero: True); over no elements ONNX gives the type's extremes,
        # which compare as all's True and any's False
        flags = g.cast(_onnx_nonzero(g, x), D.int32)
        axes = None if axis is None else list(normalize_axes("all", axis, x.ndim))
        return g.op("Greater", g.reduce(reduction, flags, axes, keepdim), g.const(np.array(0, np.int32)),
                    spec=g.outputs[0])
    return mapping


all.onnx(_onnx_truth("ReduceMin"))
any.onnx(_onnx_truth("ReduceMax"))


def _onnx_scan(g, x, axis, combine, fill):
    """The running ``combine`` along ``axis`` (associative), in ⌈log₂ n⌉ steps: each combines in the running value
    2ᵏ places before (shifted in from the front, ``fill`` where there is none)."""
    a = axis % x.ndim
    n = x.shape[a]
    if n is None:
        raise g.unsupported(f"a running reduction along dim {a} of a size known only at run time (shape {x.shape})")
    step, axes = 1, g.ints([a])
    while step < n:
        pads = [step if i == a else 0 for i in range(x.ndim)] + [0] * x.ndim
        shifted = g.op("Slice", g.op("Pad", x, g.ints(pads), fill), g.ints([0]), g.ints([n]), axes, spec=x.spec)
        x = combine(x, shifted)
        step *= 2
    return x


@logcumsumexp.onnx
def _(g, x, *, axis):
    if x.ndim == 0:
        return g.op("Identity", x)
    return _onnx_scan(g, x, axis, lambda a, b: g.call("logaddexp", a, b), g.scalar(-np.inf, x))


def _onnx_cumulative_extreme(extreme):
    def mapping(g, x, *, axis):
        if x.ndim == 0:
            return g.op("Identity", x), g.const(np.zeros((), np.int64))
        a = axis % x.ndim
        floating = D.is_floating(x.dtype)

        def combine(u, v):  # NaN, once come, stays (as NumPy's accumulate)
            out = g.op(extreme, u, v, spec=u.spec)
            if floating:
                out = g.op("Where", g.op("IsNaN", u), u, g.op("Where", g.op("IsNaN", v), v, out), spec=u.spec)
            return out

        info = np.finfo(x.dtype) if floating else np.iinfo(x.dtype)
        fill = (-np.inf if extreme == "Max" else np.inf) if floating else (info.min if extreme == "Max" else info.max)
        values = _onnx_scan(g, x, a, combine, g.scalar(fill, x))
        hit = g.op("Equal", x, values)
        if floating:
            hit = g.op("Or", hit, g.op("And", g.op("IsNaN", x), g.op("IsNaN", values)))
        n = x.shape[a]
        positions = g.const(np.arange(n, dtype=np.int64).reshape([-1 if i == a else 1 for i in range(x.ndim)]))
        spec = Spec(x.shape, D.int64)
        hits = g.op("Where", hit, positions, g.const(np.array(0, np.int64)), spec=spec)
        zero = g.const(np.array(np.iinfo(np.int64).min, np.int64))
        indices = _onnx_scan(g, hits, a, lambda u, v: g.op("Max", u, v, spec=spec), zero)
        return values, indices
    return mapping


cummax.onnx(_onnx_cumulative_extreme("Max"))
cummin.onnx(_onnx_cumulative_extreme("Min"))


def _onnx_kept(g, t, a, keepdim, spec):
    return t if keepdim else g.op("Squeeze", t, g.ints([a]), spec=spec)


@kthvalue.onnx
def _(g, x, *, k, axis, keepdim):
    # the k-th of TopK's k smallest, which orders ties by index (our stable sort) and NaN last
    if x.ndim == 0:
        return g.op("Identity", x), g.const(np.zeros((), np.int64))
    a = axis % x.ndim
    values, indices = g.op("TopK", x, g.ints([k]), axis=a, largest=0, sorted=1, outputs=2)
    last = (g.ints([k - 1]), g.ints([k]), g.ints([a]))
    return (_onnx_kept(g, g.op("Slice", values, *last), a, keepdim, g.outputs[0]),
            _onnx_kept(g, g.op("Slice", indices, *last), a, keepdim, g.outputs[1]))


@median_select.onnx
def _(g, x, *, axis, keepdim, ignore_nan):
    if axis is None:  # of all elements: those of the flattened x, shaped as the result
        flat = g.op("Reshape", x, g.ints([-1]), spec=Spec((None,), x.dtype))
        values, indices = _onnx_median(g, flat, 0, ignore_nan)
        shape = g.ints([1] * x.ndim if keepdim else [])
        return (g.op("Reshape", values, shape, spec=g.outputs[0]), g.op("Reshape", indices, shape, spec=g.outputs[1]))
    if x.ndim == 0:
        return g.op("Identity", x), g.const(np.zeros((), np.int64))
    a = axis % x.ndim
    values, indices = _onnx_median(g, x, a, ignore_nan)
    return _onnx_kept(g, values, a, keepdim, g.outputs[0]), _onnx_kept(g, indices, a, keepdim, g.outputs[1])


def _onnx_median(g, x, a, ignore_nan):
    """(values, indices) of the lower median along axis ``a``, kept as a dim of 1: the kernel's stable order
    (TopK of every element, NaN last) read at the middle."""
    i64 = D.int64
    n = g.op("Shape", x, start=a, end=a + 1, spec=Spec((1,), i64))
    order = g.op("TopK", x, n, axis=a, largest=0, sorted=1, outputs=2)[1]
    one = g.const(np.array(1, np.int64))
    nan = g.op("IsNaN", x) if D.is_floating(x.dtype) else None
    if nan is not None and ignore_nan:  # the middle of the elements that are not NaN (they come first)
        present = g.op("Sub", n, g.reduce("ReduceSum", g.cast(nan, i64), [a], True, spec=Spec((), i64)))
        middle = g.op("Div", g.op("Max", g.op("Sub", present, one), g.const(np.array(0, np.int64))),
                      g.const(np.array(2, np.int64)))
        index = g.op("GatherElements", order, middle, axis=a)
    else:
        middle = g.op("Div", g.op("Sub", n, one), g.const(np.array(2, np.int64)))
        index = g.op("Slice", order, middle, g.op("Add", middle, one), g.ints([a]))
        if nan is not None:  # a row holding NaN: its first NaN
            flags = g.cast(nan, D.int32)
            first = g.op("ArgMax", flags, axis=a, keepdims=1, select_last_index=0)
            index = g.op("Where", g.op("Greater", g.reduce("ReduceMax", flags, [a], True, spec=Spec((), D.int32)),
                                       g.const(np.array(0, np.int32))), first, index)
    return g.op("GatherElements", x, index, axis=a), index


@mode.onnx
def _(g, x, *, axis, keepdim):
    # each element's count among its row's (an (n, n) comparison), the smallest value of the largest count, and
    # its last occurrence; each NaN is a value of its own, counted once
    if x.ndim == 0:
        return g.op("Identity", x), g.const(np.zeros((), np.int64))
    a = axis % x.ndim
    n = x.shape[a]
    if n is None:
        raise g.unsupported(f"mode along dim {a} of a size known only at run time (shape {x.shape})")
    i64 = D.int64
    pairs = g.op("Equal", g.op("Unsqueeze", x, g.ints([a + 1])), g.op("Unsqueeze", x, g.ints([a])),
                 spec=Spec((None,) * (x.ndim + 1), D.bool_))
    counts = g.reduce("ReduceSum", g.cast(pairs, i64), [a + 1], False, spec=Spec(x.shape, i64))
    floating = D.is_floating(x.dtype)
    nan = g.op("IsNaN", x) if floating else None
    if floating:
        counts = g.op("Add", counts, g.cast(nan, i64))
    best = g.reduce("ReduceMax", counts, [a], True, spec=Spec(x.shape, i64))
    candidate = g.op("Equal", counts, best)
    if floating:
        candidate = g.op("And", candidate, g.op("Not", nan))
    top = np.inf if floating else np.iinfo(x.dtype).max
    value = g.reduce("ReduceMin", g.op("Where", candidate, x, g.scalar(top, x), spec=x.spec), [a], True,
                     spec=x.spec)
    same = g.op("Equal", x, value)
    if floating:  # a row of NaN alone: NaN, at its last
        all_nan = g.op("Equal", g.reduce("ReduceMax", g.cast(candidate, D.int32), [a], True,
                                         spec=Spec(x.shape, D.int32)), g.const(np.array(0, np.int32)))
        value = g.op("Where", all_nan, g.scalar(np.nan, x), value, spec=x.spec)
        same = g.op("Or", same, g.op("And", all_nan, nan))
    positions = g.const(np.arange(n, dtype=np.int64).reshape([-1 if i == a else 1 for i in range(x.ndim)]))
    index = g.reduce("ReduceMax", g.op("Where", same, positions, g.const(np.array(-1, np.int64)),
                                       spec=Spec(x.shape, i64)), [a], True, spec=Spec(x.shape, i64))
    return _onnx_kept(g, value, a, keepdim, g.outputs[0]), _onnx_kept(g, index, a, keepdim, g.outputs[1])


@bincount.onnx
def _(g, x, weights, *, minlength):
    # max(x) + 1 bins, at least minlength (an empty x: minlength), each the count or the sum of the weights there
    dtype = g.outputs[0].dtype
    x = g.cast(x, D.int64)
    top = g.op("ReduceMax", g.op("Concat", x, g.ints([minlength - 1]), axis=0), keepdims=1)
    bins = g.op("Add", top, g.ints([1]))
    added = g.filled(g.op("Shape", x), 1, dtype) if weights is None else g.cast(weights, dtype)
    return g.op("ScatterElements", g.filled(bins, 0, dtype), x, added, axis=0, reduction="add", spec=g.outputs[0])


@unique_all.onnx
def _(g, x, *, axis):
    # ONNX's Unique, sorted; it takes NaNs as one value, ours are each distinct: they are left out of it and come
    # last, one value each, as NumPy's sort puts them
    i64 = D.int64
    if axis is not None:
        if D.is_floating(x.dtype):
            raise g.unsupported("unique slices of floating tensors (ONNX's Unique takes NaNs as equal, ours not)")
        a = normalize_axes("unique", [axis], x.ndim)[0]
        values, _, inverse, counts = g.op("Unique", x, axis=a, sorted=1, outputs=4)
        return values, inverse, counts
    flat = g.op("Reshape", x, g.ints([-1]), spec=Spec((None,), x.dtype))
    if not D.is_floating(x.dtype):
        values, _, inverse, counts = g.op("Unique", flat, sorted=1, outputs=4)
        return values, g.op("Reshape", inverse, g.op("Shape", x)), counts
    nan = g.op("IsNaN", flat, spec=Spec((None,), D.bool_))
    number = g.op("Not", nan)
    values, _, found, counts = g.op("Unique", g.op("Compress", flat, number, axis=0), sorted=1, outputs=4)
    nans = g.reduce("ReduceSum", g.cast(nan, i64), [0], True, spec=Spec((1,), i64))
    distinct = g.op("Shape", values, spec=Spec((1,), i64))
    values = g.op("Concat", values, g.filled(nans, np.nan, x.dtype), axis=0)
    counts = g.op("Concat", counts, g.filled(nans, 1, i64), axis=0)
    # each number's place among the distinct values, each NaN's after them in its order
    at_numbers = g.op("Squeeze", g.op("NonZero", number), g.ints([0]))
    inverse = g.op("ScatterElements", g.filled(g.op("Shape", flat), 0, i64), at_numbers, found, axis=0)
    nan_place = g.op("Add", distinct, g.op("Sub", g.op("CumSum", g.cast(nan, i64), g.const(np.array(0, np.int64))),
                                          g.const(np.array(1, np.int64))))
    inverse = g.op("Where", nan, nan_place, inverse)
    return values, g.op("Reshape", inverse, g.op("Shape", x)), counts


# -- integrals, covariance and correlation: torch's formulas written with ops (their gradients are those ops') ----


def _samples(name: str, y, x, dx, dim):
    """The dim of y along which ``name`` integrates, and the spacing: the differences of x (1-D: one per sample,
    laid along dim; else broadcast, leading dims padded) or the number dx, as torch reads them."""
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
        raise ArgumentError(f"{name}(): argument 'dim' must be an int, got {describe(dim)}")
    d = normalize_axes(name, [int(dim)], len(y.shape))[0] if y.shape else None
    if d is None:
        raise ShapeError(f"{name}(): y must have at least one dim, got a 0-d tensor")
    if x is not None and not hasattr(x, "shape"):
        raise ArgumentError(f"{name}(): argument 'x' must be a tensor (the spacing as a number is dx=), got "
                            f"{describe(x)}")
    if y.dtype == D.bool_ or (x is not None and x.dtype == D.bool_):
        raise ArgumentError(f"{name}(): bool y or x is not supported (as in torch), got {y.dtype}"
                            f"{'' if x is None else ' and ' + str(x.dtype)}")
    if x is None:
        if isinstance(dx, (bool, np.bool_)) or not isinstance(dx, (int, float, np.integer, np.floating)):
            raise ArgumentError(f"{name}(): argument 'dx' must be a real number, got {describe(dx)}")
        return d, float(dx)
    if dx is not None:
        raise ArgumentError(f"{name}(): give x or dx, not both (torch's two forms)")
    if len(x.shape) == 1:
        if x.shape[0] != y.shape[d]:
            raise ShapeError(f"{name}(): there must be one x value for each sample point: x has {x.shape[0]}, y "
                             f"{y.shape[d]} along dim {d}")
        x = F.reshape(x, shape=[x.shape[0] if i == d else 1 for i in range(len(y.shape))])
    elif len(x.shape) < len(y.shape):
        x = F.reshape(x, shape=[1] * (len(y.shape) - len(x.shape)) + list(x.shape))
    left, right = _ends(x, d)
    return d, right - left


def _ends(y, d: int):
    """y's samples but the last, and but the first, along d (none of either when there are none)."""
    n = y.shape[d]
    return F.narrow(y, d, 0, max(n - 1, 0)), F.narrow(y, d, min(n, 1), max(n - 1, 0))


@function
def trapezoid(y, x=None, *, dx=None, dim=-1):
    """``torch.trapezoid``: the trapezoidal rule along ``dim`` — at the points ``x`` (1-D, one per sample, or a
    tensor broadcasting with y) or spaced ``dx`` apart (1 by default). No samples give 0 in y's dtype, as
    torch's; integers give float32."""
    d, spacing = _samples("trapezoid", y, x, 1 if dx is None and x is None else dx, dim)
    if y.shape[d] == 0:  # torch's zeros_like_except: y's dtype, the dim gone
        return F.cast(F.sum(y, axis=[d]), dtype=y.dtype)
    if isinstance(spacing, float):  # torch's formula for a constant spacing: dx·(Σy − (y₀ + yₙ)/2)
        first, last = F.narrow(y, d, 0, 1), F.narrow(y, d, y.shape[d] - 1, 1)
        return (F.sum(y, axis=[d]) - F.squeeze(first + last, axis=[d]) * 0.5) * spacing
    left, right = _ends(y, d)
    return F.sum((left + right) * spacing, axis=[d]) / 2.0


@function
def trapz(y, x=None, *, dx=None, dim=-1):
    """``torch.trapz``: ``trapezoid``, under torch's older name."""
    return trapezoid(y, x, dx=dx, dim=dim)


@function
def cumulative_trapezoid(y, x=None, *, dx=None, dim=-1):
    """``torch.cumulative_trapezoid``: the running trapezoidal rule along ``dim`` (one element fewer than y
    there), at the points ``x`` or spaced ``dx`` apart (1 by default); integers give float32."""
    d, spacing = _samples("cumulative_trapezoid", y, x, 1 if dx is None and x is None else dx, dim)
    left, right = _ends(y, d)
    if isinstance(spacing, float):
        return F.cumsum(spacing / 2.0 * (left + right), axis=d)
    return F.cumsum((left + right) * spacing, axis=d) / 2.0


def _weights(kind: str, w, observations: int):
    """cov's ``fweights`` (integers) or ``aweights`` (floats): ≤ 1-D, one per observation, none negative. Their
    values are read (as torch reads them), so a traced program refuses them rather than skip the checks."""
    if w is None:
        return None
    if not hasattr(w, "shape"):
        raise ArgumentError(f"cov(): {kind} must be a tensor, got {describe(w)}")
    if len(w.shape) > 1:
        raise ShapeError(f"cov(): expected {kind} to have one or fewer dimensions, got shape {tuple(w.shape)}")
    integral = not D.is_floating(w.dtype) and w.dtype != D.bool_
    if (kind == "fweights") != integral:
        raise ArgumentError(f"cov(): expected {kind} to have {'an integral' if kind == 'fweights' else 'a floating'}"
                            f" dtype, got {w.dtype}")
    if (w.shape[0] if w.shape else 1) != observations:
        raise ShapeError(f"cov(): expected {kind} to have one element per observation ({observations}), got shape "
                         f"{tuple(w.shape)}")
    if getattr(w, "interpreter", None) is not None:
        raise ArgumentError(f"cov(): {kind} in a traced program: torch's checks of their values (none negative, "
                            "a sum other than 0) need them; compute cov with weights eagerly")
    if observations and bool((w < 0).numpy().any()):
        raise ArgumentError(f"cov(): {kind} cannot be negative")
    return w


@function
def cov(input, *, correction=1, fweights=None, aweights=None):
    """``torch.cov``: the covariance matrix of the variables in ``input``'s rows (its columns are the
    observations; a 1-D input is one variable), divided by observations − ``correction``, size-1 dims squeezed as
    torch squeezes them; observations weighed by the integer ``fweights`` times the float ``aweights`` (read
    eagerly: refused in a traced program). No degrees of freedom left divides by 0 (torch warns the same).
    Integers give float32."""
    if len(input.shape) > 2:
        raise ShapeError(f"cov(): expected input to have two or fewer dimensions, got shape {tuple(input.shape)}")
    if input.dtype == D.bool_:
        raise ArgumentError("cov(): bool input is not supported (as in torch)")
    if isinstance(correction, (bool, np.bool_)) or not isinstance(correction, (int, np.integer)):
        raise ArgumentError(f"cov(): argument 'correction' must be an int, got {describe(correction)}")
    rows = input if len(input.shape) == 2 else F.reshape(input, shape=[1, -1])
    n, correction = rows.shape[1], int(correction)
    fweights, aweights = _weights("fweights", fweights, n), _weights("aweights", aweights, n)
    w = aweights if fweights is None else fweights if aweights is None else fweights * aweights
    if w is None:
        total, factor = n, n - correction
        weighed = rows
    else:  # torch's formula: the weighted mean, and the sum of weights less the correction's share of them
        total = F.sum(w)
        if not bool((total != 0).numpy()):
            raise ArgumentError("cov(): weights sum to zero, can't be normalized")
        factor = total - (correction * F.sum(w * aweights) / total if aweights is not None and correction else
                          correction)
        weighed = rows * w
    centred = rows - F.unsqueeze(F.sum(weighed, axis=[1]) / total, axis=1)
    if bool(factor <= 0) if w is None else bool((factor <= 0).numpy()):
        warnings.warn("cov(): degrees of freedom is <= 0. Correction should be strictly less than the number of "
                      "observations.", UserWarning, stacklevel=2)
        factor = 0
    other = centred if w is None else centred * w
    return F.squeeze(F.matmul(centred, F.transpose(other, perm=[1, 0])) / factor)


@function
def corrcoef(input):
    """``torch.corrcoef``: Pearson's correlation coefficients of the variables in ``input``'s rows (``cov``
    normalised by the standard deviations, clipped to [-1, 1]); for one variable c/c (1, or NaN where its
    variance is 0, NaN or inf), as torch's."""
    if len(input.shape) > 2:
        raise ShapeError(f"corrcoef(): expected input to have two or fewer dimensions, got shape "
                         f"{tuple(input.shape)}")
    c = cov(input)
    if not c.shape:
        return c / c
    deviation = F.sqrt(F.diagonal(c))
    c = c / F.unsqueeze(deviation, axis=1)
    return F.clip(c / F.unsqueeze(deviation, axis=0), -1, 1)
