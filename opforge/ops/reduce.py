"""Reductions over axes (an int, a list, or None for all), with ``keepdim``, and cumulative sums."""

import builtins
import math
from collections import namedtuple

from opforge import ops as F

from ..core.errors import ArgumentError, describe
from ._common import (
    D,
    P,
    S,
    Sample,
    ShapeError,
    Spec,
    broadcast_shapes,
    function,
    max_over,
    normalize_axes,
    np,
    op,
    shapes_agree,
)


def refuse_no_axes(op_name, axis):
    """An empty ``dim``/``axis`` is refused by every reduction: PyTorch reads ``dim=()`` as every dim, NumPy's
    ``axis=()`` as none. Either reading would silently differ from the other's code; None means every dim."""
    if axis is not None and len(axis) == 0:
        raise ArgumentError(
            f"{op_name}(): dim=() (an empty list of dims) is ambiguous: PyTorch reduces every dim, NumPy none. "
            "Pass dim=None to reduce every dim; a reduction over no dim is the tensor itself (leave the call out)")


def reduction_axes(op_name, axis, ndim):
    """A reduction's axes as a sorted tuple (None: all), an empty list refused (``refuse_no_axes``)."""
    refuse_no_axes(op_name, axis)
    return normalize_axes(op_name, axis, ndim)


def _reduced_shape(op_name, shape, axis, keepdim):
    axes = reduction_axes(op_name, axis, len(shape))
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


@op("sum(Tensor x, int[] axis/dim=None, bool keepdim/keepdims=False) -> Tensor y")
def sum(x, *, axis, keepdim):
    """Sum over ``axis`` (all axes when None). Integer and bool tensors sum to int64."""
    axes = None if axis is None else reduction_axes("sum", axis, x.ndim)  # (None: every axis, as all of them)
    # the array's method: np.sum's reduce without its Python wrapper (10 µs against 21 cold, 2.0 against 4.4 warm)
    return x.sum(axis=axes, keepdims=keepdim, dtype=None if D.is_floating(x.dtype) else np.int64)


@sum.onnx
def _(g, x, *, axis, keepdim):
    work = g.outputs[0].dtype  # integers and bools sum in int64
    return g.reduce("ReduceSum", g.cast(x, work), axis, keepdim)


@sum.infer
def _(x, *, axis, keepdim):
    dtype = x.dtype if D.is_floating(x.dtype) else D.int64
    return Spec(_reduced_shape("sum", x.shape, axis, keepdim), dtype)


@sum.grad
def _(dy, x_spec, *, axis, keepdim):
    if not keepdim:
        dy = F.reshape(dy, shape=_kept_shape(x_spec.shape, axis))
    return F.broadcast_to(dy, shape=x_spec.shape)


def _reduction_sbp(split_reduced):
    def sbp(x, *, axis, keepdim, **_):
        axes = normalize_axes("sbp", axis, len(x.shape))
        kept = [i for i in range(len(x.shape)) if i not in axes]
        for k in range(len(x.shape)):
            yield (S(k),), split_reduced if k in axes else S(k if keepdim else kept.index(k))
        yield (P,), P  # linear: partial sums stay partial sums
        yield (P("mean"),), P("mean")
    return sbp


sum.sbp(_reduction_sbp(P))
sum.samples(_reduce_samples)


@op("mean(Tensor<floating> x, int[] axis/dim=None, bool keepdim/keepdims=False) -> Tensor y")
def mean(x, *, axis, keepdim):
    """Mean over ``axis`` (all axes when None)."""
    return np.mean(x, axis=reduction_axes("mean", axis, x.ndim), keepdims=keepdim)


mean.onnx(lambda g, x, *, axis, keepdim: g.reduce("ReduceMean", x, axis, keepdim))


@mean.infer
def _(x, *, axis, keepdim):
    return Spec(_reduced_shape("mean", x.shape, axis, keepdim), x.dtype)


@mean.grad
def _(dy, x_spec, *, axis, keepdim):
    return F.mean_grad(dy, shape=x_spec.shape, axis=axis, keepdim=keepdim)


@op("mean_grad(Tensor<floating> dy, *, int[] shape, int[] axis=None, bool keepdim=False) -> Tensor dx")
def mean_grad(dy, *, shape, axis, keepdim):
    """Gradient of mean: dy spread evenly over the reduced elements of an input of ``shape``.

    A dedicated op because the count of reduced elements may be known only at run time (a batch dim in a
    program): the kernel computes it from the concrete ``shape``.
    """
    axes = normalize_axes("mean_grad", axis, len(shape))
    count = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    kept = _kept_shape(tuple(shape), axis)
    return np.broadcast_to(dy.reshape(kept) * (1.0 / builtins.max(count, 1)), tuple(shape)).astype(dy.dtype)


@mean_grad.infer
def _(dy, *, shape, axis, keepdim):
    expected = _reduced_shape("mean_grad", tuple(shape), axis, keepdim)
    if not shapes_agree(expected, dy.shape):
        raise ShapeError(f"mean_grad(): dy has shape {dy.shape}; the mean of shape {list(shape)} over axis "
                         f"{axis} has shape {expected}")
    return Spec(tuple(shape), dy.dtype)


@mean_grad.grad
def _(ddx, *, axis, keepdim):
    return F.mean(ddx, axis=axis, keepdim=keepdim)  # mean_grad is the adjoint of mean, and vice versa


@mean_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 4)), shape=[2, 3, 4], axis=1)
    yield Sample.of(rng.standard_normal(()), shape=[2, 3])
    yield Sample.of(rng.standard_normal((2, 1)), shape=[2, 3], axis=-1, keepdim=True)


mean.sbp(_reduction_sbp(P("mean")))  # each rank's mean of its rows
mean.samples(_reduce_samples)


@op("sum_to(Tensor x, *, int[] shape) -> Tensor y")
def sum_to(x, *, shape):
    """Sums ``x`` down to ``shape``, the inverse of broadcasting ``shape`` up to ``x.shape``."""
    lead = x.ndim - len(shape)
    if lead == 1 and tuple(shape) == x.shape[1:]:  # a bias's gradient: the sum over the batch axis
        return np.add.reduce(x, axis=0)
    if lead < 0 or any(d not in (1, n) for d, n in zip(shape, x.shape[lead:])):
        raise ValueError("the target shape does not broadcast to the input's")  # (reshape below would take it)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    y = np.add.reduce(x, axis=axes, keepdims=True) if axes else x  # np.sum's own reduce, without its wrapper
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


@sum_to.onnx
def _(g, x, *, shape):
    lead = x.ndim - len(shape)
    axes = [*range(lead), *(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)]
    y = g.reduce("ReduceSum", x, axes, True) if axes else x
    return g.op("Reshape", y, g.ints(shape), spec=g.outputs[0])


@sum_to.grad
def _(dy, x_spec):
    return F.broadcast_to(dy, shape=x_spec.shape)


@sum_to.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), shape=[3, 1])
    yield Sample.of(rng.standard_normal((2, 3)), shape=[])
    yield Sample.of(rng.standard_normal((2, 3)), shape=[2, 3])


# -- more reductions ------------------------------------------------------------------------------------------------


def _group_size(shape, axis) -> int:
    """How many elements each reduction group holds."""
    return math.prod(shape[a] for a in normalize_axes("", axis, len(shape)))


def _expand(t, shape, axis, keepdim):
    """A reduction's result (or its gradient) with the reduced dims put back as size 1, to broadcast against x."""
    return t if keepdim else F.reshape(t, shape=_kept_shape(shape, axis))


def _refuse_empty(op_name, shape, axis):
    for a in normalize_axes(op_name, axis, len(shape)):
        if shape[a] == 0:
            raise ShapeError(f"{op_name}(): cannot reduce over axis {a} of size 0 (input shape {tuple(shape)}): "
                             "an empty group has no value")


@op("prod(Tensor x, int[] axis/dim=None, bool keepdim/keepdims=False) -> Tensor y")
def prod(x, *, axis, keepdim):
    """Product over ``axis`` (all axes when None). Integer and bool tensors multiply in int64."""
    axes = reduction_axes("prod", axis, x.ndim)
    return np.prod(x, axis=axes, keepdims=keepdim, dtype=None if D.is_floating(x.dtype) else np.int64)


prod.onnx(lambda g, x, *, axis, keepdim: g.reduce("ReduceProd", g.cast(x, g.outputs[0].dtype), axis, keepdim))


@prod.infer
def _(x, *, axis, keepdim):
    return Spec(_reduced_shape("prod", x.shape, axis, keepdim), x.dtype if D.is_floating(x.dtype) else D.int64)


@prod.grad
def _(x, dy, *, axis, keepdim):
    # ∂y/∂xᵢ is the product of the other elements of xᵢ's group: y/xᵢ when there is no zero. With zeros (the rule
    # cannot look at the data to pick a formula, as PyTorch does) it is split into
    #   (product of the other nonzero elements) · (product of the other zeros),
    # the first Q/x̃ᵢ, with x̃ = x with its zeros set to 1 and Q = prod(x̃); the second 1 when no other element is
    # 0, that other element itself when one is (0, with derivative 1: this keeps second derivatives right), and
    # 0 when two or more are.
    is_zero = x == 0
    nonzero = F.where(is_zero, 1, x)
    zero_count = F.cast(is_zero, dtype=x.dtype)
    others_zero = F.sum(zero_count, axis=axis, keepdim=True) - zero_count
    zeros = F.where(is_zero, x, 0)
    other_zero = F.sum(zeros, axis=axis, keepdim=True) - zeros
    zero_part = F.where(others_zero == 0, 1, F.where(others_zero == 1, other_zero, 0))
    nonzero_part = F.prod(nonzero, axis=axis, keepdim=True) / nonzero
    return _expand(dy, x.shape, axis, keepdim) * nonzero_part * zero_part


@prod.samples
def _(rng):
    def signed(*shape):  # magnitudes near 1 keep products moderate
        return np.asarray(rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape))

    yield Sample.of(signed(2, 3, 4))
    yield Sample.of(signed(2, 3, 4), axis=1)
    yield Sample.of(signed(2, 3, 4), axis=[0, -1], keepdim=True)
    yield Sample.of(signed())
    # Zeros: one in some groups, two in others. The product is a polynomial, smooth there too.
    yield Sample.of(np.array([[0.0, 1.2, -0.7], [0.0, 0.0, 1.3], [0.9, -1.1, 0.6]]), axis=1)
    yield Sample.of(np.array([[0.0, 1.2, -0.7], [0.8, 0.0, 1.3]]))
    yield Sample.of(rng.integers(-3, 4, (2, 3)), axis=0)


# amax/amin: the largest (smallest) values over axes. The gradient goes to the elements equal to the result, shared
# equally among ties (as torch.amax/amin). F.max/F.min are torch.max/min's three forms, written with ops (below).


def _extreme_spec(op_name):
    def infer(x, *, axis, keepdim):
        _refuse_empty(op_name, x.shape, axis)
        return Spec(_reduced_shape(op_name, x.shape, axis, keepdim), x.dtype)

    return infer


def _extreme_grad(x, y, dy, *, axis, keepdim):
    hit = F.cast(x == _expand(y, x.shape, axis, keepdim), dtype=dy.dtype)
    return hit * (_expand(dy, x.shape, axis, keepdim) / F.sum(hit, axis=axis, keepdim=True))


def _extreme_samples(rng):
    yield from _reduce_samples(rng)  # distinct values: the ties, where the derivative jumps, are tested in tests/
    yield Sample.of(rng.integers(-3, 4, (3, 4)), axis=0)


@op("amax(Tensor x, int[] axis/dim=None, bool keepdim/keepdims=False) -> Tensor y")
def amax(x, *, axis, keepdim):
    """Largest element over ``axis`` (all axes when None), as ``torch.amax`` and NumPy's ``max``; NaN if the group
    holds one. ``F.max(x, dim)`` gives torch's (values, indices) along one dim."""
    return np.max(x, axis=reduction_axes("amax", axis, x.ndim), keepdims=keepdim)


@op("amin(Tensor x, int[] axis/dim=None, bool keepdim/keepdims=False) -> Tensor y")
def amin(x, *, axis, keepdim):
    """Smallest element over ``axis`` (all axes when None), as ``torch.amin`` and NumPy's ``min``."""
    return np.min(x, axis=reduction_axes("amin", axis, x.ndim), keepdims=keepdim)


for _extreme, _onnx_type in ((amax, "ReduceMax"), (amin, "ReduceMin")):
    _extreme.infer(_extreme_spec(_extreme.name))
    _extreme.grad(_extreme_grad)
    _extreme.samples(_extreme_samples)
    _extreme.onnx(lambda g, x, *, axis, keepdim, _t=_onnx_type: g.reduce(_t, x, axis, keepdim))


_RETURN_TYPES = {name: namedtuple(name, ("values", "indices")) for name in ("max", "min")}  # as torch.return_types


def _torch_extreme(name: str, x, dim, keepdim: bool, axis):
    """torch.max or torch.min (``name``) in each of its three forms, written with ops (see ``max``)."""
    if axis is not None:
        if dim is not None:
            raise ArgumentError(f"{name}(): give dim or axis (two spellings of one argument), not both")
        dim = axis
    if dim is None:
        return (F.amax if name == "max" else F.amin)(x, keepdim=keepdim)
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, (bool, np.bool_)):
        if hasattr(dim, "shape") and hasattr(dim, "dtype"):  # a tensor or an array: the elementwise form
            return (F.maximum if name == "max" else F.minimum)(x, dim)
        raise ArgumentError(f"{name}(): dim must be one int (the values and indices along it, as torch's "
                            f"{name}(x, dim)) or a tensor (the elementwise {name}imum), got {describe(dim)}; "
                            f"for the {name}imum over several dims use a{name}(x, axis=...)")
    rank = len(x.shape)
    rows = x if rank else F.reshape(x, shape=[1])
    indices = (F.argmax if name == "max" else F.argmin)(rows, axis=dim, keepdim=True)
    values = F.gather(rows, dim, indices)  # its gradient goes to the index alone, as torch's
    if not rank:
        values, indices = F.reshape(values, shape=[]), F.reshape(indices, shape=[])
    elif not keepdim:
        values, indices = F.squeeze(values, axis=[dim]), F.squeeze(indices, axis=[dim])
    return _RETURN_TYPES[name](values, indices)


@function
def max(x, dim=None, keepdim=False, *, axis=None):
    """``torch.max`` (and ``Tensor.max``): ``max(x)`` the largest value (the gradient shared among ties, as
    ``amax``); ``max(x, dim, keepdim=False)`` the named tuple ``(values, indices)`` along one dim, the first largest
    where values tie, NaN counting as the largest (the gradient to that index alone); ``max(x, other)`` the
    elementwise ``maximum``. ``axis=`` is another spelling of ``dim=``, as in torch. Not an op of its own: it calls
    amax, argmax and gather, or maximum."""
    return _torch_extreme("max", x, dim, keepdim, axis)


@function
def min(x, dim=None, keepdim=False, *, axis=None):
    """``torch.min`` (and ``Tensor.min``): ``min(x)``, ``min(x, dim)`` -> ``(values, indices)``, ``min(x, other)``
    (see ``max``)."""
    return _torch_extreme("min", x, dim, keepdim, axis)


def _arg_extreme(op_name, find, x, axis, keepdim):
    """Index of the first largest (smallest) element along ``axis``; over the flattened tensor when None."""
    if axis is None:
        return find(x).astype(np.int64).reshape((1,) * x.ndim if keepdim else ())  # (a NumPy scalar on the host)
    if x.ndim == 0:
        normalize_axes(op_name, (axis,), 0)  # 0 and -1 are the only axes of a 0-d tensor
        return np.zeros((), np.int64, like=x)
    return find(x, axis=axis, keepdims=keepdim).astype(np.int64, copy=False)


def _arg_extreme_spec(op_name):
    def infer(x, *, axis, keepdim):
        axes = None if axis is None else (axis,)
        _refuse_empty(op_name, x.shape, axes)
        if axis is None:
            return Spec((1,) * len(x.shape) if keepdim else (), D.int64)
        return Spec(_reduced_shape(op_name, x.shape, axes, keepdim), D.int64)

    return infer


@op("argmax(Tensor x, int? axis/dim=None, bool keepdim/keepdims=False) -> Tensor<int64> y", traits=["no_grad"])
def argmax(x, *, axis, keepdim):
    """Index of the largest element along ``axis`` (of the flattened tensor when None); the first one on ties."""
    return _arg_extreme("argmax", np.argmax, x, axis, keepdim)


@op("argmin(Tensor x, int? axis/dim=None, bool keepdim/keepdims=False) -> Tensor<int64> y", traits=["no_grad"])
def argmin(x, *, axis, keepdim):
    """Index of the smallest element along ``axis`` (of the flattened tensor when None); the first one on ties."""
    return _arg_extreme("argmin", np.argmin, x, axis, keepdim)


def _onnx_arg_extreme(onnx_type):
    def mapping(g, x, *, axis, keepdim):
        if x.dtype == D.bool_:
            x = g.cast(x, D.int32)
        if axis is None:  # over the flattened tensor, then shaped as the op's result
            flat = g.op(onnx_type, g.op("Reshape", x, g.ints([-1])), axis=0, keepdims=False)
            return g.op("Reshape", flat, g.ints(g.outputs[0].shape), spec=g.outputs[0])
        if x.ndim == 0:
            return g.const(np.zeros((), np.int64))
        return g.op(onnx_type, x, axis=axis, keepdims=keepdim, spec=g.outputs[0])

    return mapping


argmax.onnx(_onnx_arg_extreme("ArgMax"))
argmin.onnx(_onnx_arg_extreme("ArgMin"))


@argmax.samples
@argmin.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((3, 4)), axis=1)
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=-3, keepdim=True)
    yield Sample.of(rng.standard_normal((2, 3)), keepdim=True)
    yield Sample.of(rng.standard_normal(()), axis=0)
    yield Sample.of(rng.integers(0, 3, (4, 3)), axis=0)  # ties: the first index


argmax.infer(_arg_extreme_spec("argmax"))
argmin.infer(_arg_extreme_spec("argmin"))


# -- statistics ----------------------------------------------------------------------------------------------------


def _var(op_name, x, axis, correction, keepdim):
    """Σ(x − mean)² / (N − correction) per group; N − correction ≤ 0 gives inf (or NaN), as PyTorch."""
    axes = reduction_axes(op_name, axis, x.ndim)
    n = _group_size(x.shape, axes)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = x - np.sum(x, axis=axes, keepdims=True) / n
        return np.sum(d * d, axis=axes, keepdims=keepdim) / builtins.max(n - correction, 0)


def _var_grad(x, dvar, axis, correction, keepdim):
    # ∂var/∂xᵢ = 2·(xᵢ − mean)/(N − correction); the mean's own dependence on x sums to zero. As PyTorch, N − c
    # here is not clamped at 0 as in the forward pass.
    dims = [x.shape[a] for a in normalize_axes("", axis, x.ndim)]
    if all(isinstance(d, int) for d in dims):
        dof = math.prod(dims) - correction
        factor = 2 / dof if dof else math.inf  # int / int: exact for any correction (2.0 / 10**400 overflows)
    else:  # in a program, a dim known only at run time: count the group there
        factor = 2.0 / (F.sum(F.ones_like(x), axis=axis, keepdim=True) - correction)
    return _expand(dvar, x.shape, axis, keepdim) * (x - F.mean(x, axis=axis, keepdim=True)) * factor


def _stat_spec(op_name):
    def infer(x, *, axis, correction, keepdim):
        return Spec(_reduced_shape(op_name, x.shape, axis, keepdim), x.dtype)

    return infer


def _stat_samples(rng):
    yield Sample.of(rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1, keepdim=True)
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=[0, -1], correction=0)
    yield Sample.of(rng.standard_normal(5), axis=0, correction=2)
    yield Sample.of(rng.standard_normal((2, 3)), axis=1, correction=0.5)
    yield Sample.of(rng.standard_normal(()), correction=0)


@op("var(Tensor<floating> x, int[] axis/dim=None, *, float correction=1.0, bool keepdim/keepdims=False) -> Tensor y")
def var(x, *, axis, correction, keepdim):
    """Variance over ``axis``: Σ(x − mean)²/(N − correction); correction=1 is the unbiased estimate, and any real
    correction works (as PyTorch's; N − correction ≤ 0 gives inf)."""
    return _var("var", x, axis, correction, keepdim)


def _onnx_var(g, x, axis, correction, keepdim):
    mean = g.reduce("ReduceMean", x, axis, True)
    d = g.op("Sub", x, mean)
    total = g.reduce("ReduceSum", g.op("Mul", d, d), axis, keepdim)
    # the group size N from the shape (run-time dims included), N − correction clamped at 0 as the kernel does
    axes = range(x.ndim) if axis is None else [a % builtins.max(x.ndim, 1) for a in axis]
    n = g.reduce("ReduceProd", g.op("Gather", g.op("Shape", x), g.ints(list(axes)), axis=0), None, False)
    dof = g.op("Max", g.op("Sub", g.cast(n, x.dtype), g.scalar(correction, x)), g.scalar(0, x))
    return g.op("Div", total, dof)


var.onnx(lambda g, x, *, axis, correction, keepdim: _onnx_var(g, x, axis, correction, keepdim))


@var.grad
def _(x, dy, *, axis, correction, keepdim):
    return _var_grad(x, dy, axis, correction, keepdim)


@op("std(Tensor<floating> x, int[] axis/dim=None, *, float correction=1.0, bool keepdim/keepdims=False) -> Tensor y")
def std(x, *, axis, correction, keepdim):
    """Standard deviation over ``axis``: the square root of ``var``."""
    return np.sqrt(_var("std", x, axis, correction, keepdim))


std.onnx(lambda g, x, *, axis, correction, keepdim: g.op("Sqrt", _onnx_var(g, x, axis, correction, keepdim)))


@std.grad
def _(x, y, dy, *, axis, correction, keepdim):
    # ∂std = ∂var/(2·std), and 0 where std = 0 (PyTorch's choice there: the derivative is infinite). The divisor
    # is made safe first, so that double backward does not meet 0·∞ either.
    zero = y == 0
    dvar = F.where(zero, 0, dy / (F.where(zero, 1, y) * 2))
    return _var_grad(x, dvar, axis, correction, keepdim)


for _stat in (var, std):
    _stat.infer(_stat_spec(_stat.name))
    _stat.samples(_stat_samples)


@op("logsumexp(Tensor<floating> x, int[] axis/dim=None, bool keepdim/keepdims=False) -> Tensor y")
def logsumexp(x, *, axis, keepdim):
    """ln Σ eˣ over ``axis``, computed as m + ln Σ e^(x − m) with m the group's largest element (no overflow)."""
    axes = reduction_axes("logsumexp", axis, x.ndim)
    m = max_over(x, axes)
    m = np.where(np.isfinite(m), m, 0)  # a group of −inf (or holding ±inf, NaN): shifting would make NaN
    with np.errstate(divide="ignore"):  # ln 0 = −inf, for an empty or all-(−inf) group
        y = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return y if keepdim else y.reshape(_reduced_shape("logsumexp", x.shape, axis, False))


logsumexp.onnx(lambda g, x, *, axis, keepdim: g.reduce("ReduceLogSumExp", x, axis, keepdim))


@logsumexp.infer
def _(x, *, axis, keepdim):
    return Spec(_reduced_shape("logsumexp", x.shape, axis, keepdim), x.dtype)


@logsumexp.grad
def _(x, y, dy, *, axis, keepdim):
    # ∂y/∂xᵢ = e^(xᵢ − y): the softmax of the group.
    return _expand(dy, x.shape, axis, keepdim) * F.exp(x - _expand(y, x.shape, axis, keepdim))


@logsumexp.samples
def _(rng):
    yield from _reduce_samples(rng)
    yield Sample.of(rng.standard_normal((2, 3)) + np.array([[1000.0], [-1000.0]]), axis=1)  # no overflow


@op("norm(Tensor<floating> x, float p=2.0, int[] axis/dim=None, bool keepdim/keepdims=False) -> Tensor y")
def norm(x, *, p, axis, keepdim):
    """Vector p-norm over ``axis`` (all axes when None), as ``torch.linalg.vector_norm``: (Σ|x|ᵖ)^(1/p);
    p = inf gives max |x|, p = −inf min |x|, p = 0 the number of nonzero elements."""
    return vector_norm(x, p, reduction_axes("norm", axis, x.ndim), keepdim)


def vector_norm(x, p, axes, keepdim):
    """The kernel of ``norm`` over ``axes`` (a tuple), for the kernels of other ops too."""
    if p == 2:
        return np.sqrt(np.sum(x * x, axis=axes, keepdims=keepdim))
    if p == 0:
        return np.sum(x != 0, axis=axes, keepdims=keepdim, dtype=x.dtype)
    a = np.abs(x)
    if p == 1:
        return np.sum(a, axis=axes, keepdims=keepdim)
    if math.isinf(p):
        return (np.max if p > 0 else np.min)(a, axis=axes, keepdims=keepdim)
    with np.errstate(divide="ignore"):  # 0 to a negative power: inf, and the norm 0, as PyTorch
        return np.sum(a ** p, axis=axes, keepdims=keepdim) ** (1 / p)


@norm.onnx
def _(g, x, *, p, axis, keepdim):
    if p == 2:
        return g.reduce("ReduceL2", x, axis, keepdim)
    if p == 1:
        return g.reduce("ReduceL1", x, axis, keepdim)
    if p == 0:
        return g.reduce("ReduceSum", g.cast(g.op("Not", g.op("Equal", x, g.scalar(0, x))), x.dtype), axis, keepdim)
    if math.isinf(p):
        return g.reduce("ReduceMax" if p > 0 else "ReduceMin", g.op("Abs", x), axis, keepdim)
    powered = g.reduce("ReduceSum", g.op("Pow", g.op("Abs", x), g.scalar(p, x)), axis, keepdim)
    return g.op("Pow", powered, g.scalar(1 / p, x))


@norm.check
def _(*, p, axis, keepdim):
    if math.isnan(p):
        raise ValueError("argument 'p' must not be NaN")


@norm.infer
def _(x, *, p, axis, keepdim):
    if math.isinf(p):
        _refuse_empty("norm", x.shape, axis)
    return Spec(_reduced_shape("norm", x.shape, axis, keepdim), x.dtype)


@norm.grad
def norm_grad_rule(x, y, dy, *, p, axis, keepdim):
    """The gradient rule of ``norm``, for the rules of ops built on a norm (normalize, pairwise_distance, ...)."""
    # PyTorch's rules, each giving 0 where the norm or |xᵢ| is 0 and the derivative is not defined.
    if p == 0:
        return F.zeros_like(x)  # a count: piecewise constant
    if math.isinf(p):
        return F.sign(x) * _extreme_grad(F.abs(x), y, dy, axis=axis, keepdim=keepdim)  # as max |x| (min |x|)
    dy = _expand(dy, x.shape, axis, keepdim)
    if p == 1:
        return F.sign(x) * dy
    y = _expand(y, x.shape, axis, keepdim)
    y_zero = y == 0
    y_safe = F.where(y_zero, 1, y)  # keeps the divisions finite where they are masked, also in double backward
    if p == 2:
        return x * F.where(y_zero, 0, dy / y_safe)  # ∂‖x‖/∂xᵢ = xᵢ/‖x‖
    # ∂‖x‖ₚ/∂xᵢ = sign(xᵢ)·|xᵢ|^(p−1)·‖x‖^(1−p)
    x_zero = x == 0
    x_part = F.where(x_zero, 0, F.sign(x) * F.pow(F.where(x_zero, 1, F.abs(x)), p - 1))
    return x_part * F.where(y_zero, 0, dy * F.pow(y_safe, 1 - p))


@norm.samples
def _(rng):
    def away_from_zero(*shape):  # |x| is not differentiable at 0
        return np.asarray(rng.uniform(0.3, 2.0, shape) * rng.choice([-1, 1], shape))

    yield Sample.of(rng.standard_normal((2, 3, 4)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1, keepdim=True)
    yield Sample.of(away_from_zero(3, 4), p=1.0, axis=[0, 1])
    yield Sample.of(away_from_zero(3, 4), p=3.0, axis=0)
    yield Sample.of(away_from_zero(3, 4), p=0.5, axis=-1)
    yield Sample.of(away_from_zero(3, 4), p=-1.5, axis=1)
    yield Sample.of(away_from_zero(3, 4), p=math.inf, axis=1)  # distinct values: no ties for the largest
    yield Sample.of(away_from_zero(3, 4), p=-math.inf)
    yield Sample.of(np.array([[0.0, 1.5, -2.0], [0.3, 0.0, 0.0]]), p=0.0, axis=1)
    yield Sample.of(away_from_zero())


# -- cumulative ----------------------------------------------------------------------------------------------------


def _cumsum_dtype(dtype):
    return dtype if D.is_floating(dtype) else D.int64


@op("cumsum(Tensor x, int axis/dim) -> Tensor y")
def cumsum(x, *, axis):
    """Running sums along ``axis``: yᵢ = x₀ + … + xᵢ. Integer and bool tensors sum in int64."""
    dtype = _cumsum_dtype(x.dtype)
    if x.ndim == 0:
        normalize_axes("cumsum", (axis,), 0)
        return x.astype(dtype)
    return np.cumsum(x, axis=axis, dtype=dtype)


@cumsum.onnx
def _(g, x, *, axis):
    x = g.cast(x, g.outputs[0].dtype)
    if x.ndim == 0:
        return g.op("Identity", x)
    return g.op("CumSum", x, g.const(np.array(axis, np.int64)))


@cumsum.infer
def _(x, *, axis):
    normalize_axes("cumsum", (axis,), len(x.shape))
    return Spec(x.shape, _cumsum_dtype(x.dtype))


@cumsum.grad
def _(dy, *, axis):
    # xᵢ enters every yⱼ with j ≥ i, so dxᵢ = Σⱼ≥ᵢ dyⱼ: a cumulative sum from the other end.
    if dy.ndim == 0:
        return dy
    return F.flip(F.cumsum(F.flip(dy, axis=[axis]), axis=axis), axis=[axis])


@cumsum.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1)
    yield Sample.of(rng.standard_normal((2, 3)), axis=-1)
    yield Sample.of(rng.standard_normal(5), axis=0)
    yield Sample.of(rng.standard_normal(()), axis=0)
    yield Sample.of(rng.integers(-3, 4, (2, 3)), axis=0)


@op("cumprod(Tensor x, int axis/dim) -> Tensor y")
def cumprod(x, *, axis):
    """Running products along ``axis``: yᵢ = x₀·x₁·…·xᵢ. Integer and bool tensors multiply in int64."""
    dtype = _cumsum_dtype(x.dtype)
    if x.ndim == 0:
        normalize_axes("cumprod", (axis,), 0)
        return x.astype(dtype)
    return np.cumprod(x, axis=axis, dtype=dtype)


@cumprod.onnx
def _(g, x, *, axis):
    # ONNX has no CumProd: a scan in ⌈log₂ n⌉ steps, each multiplying in the running products 2ᵏ places before
    # (shifted in from the front, with ones); the products come in another order than NumPy's, to the rounding
    x = g.cast(x, g.outputs[0].dtype)
    if x.ndim == 0:
        return g.op("Identity", x)
    a = axis % x.ndim
    n = x.shape[a]
    if n is None:
        raise g.unsupported(f"cumprod along dim {a} of a size known only at run time (shape {x.shape})")
    step, axes, one = 1, g.ints([a]), g.scalar(1, x)
    while step < n:
        pads = [step if i == a else 0 for i in range(x.ndim)] + [0] * x.ndim
        shifted = g.op("Slice", g.op("Pad", x, g.ints(pads), one), g.ints([0]), g.ints([n]), axes)
        x = g.op("Mul", x, shifted)
        step *= 2
    return x


@cumprod.infer
def _(x, *, axis):
    normalize_axes("cumprod", (axis,), len(x.shape))
    return Spec(x.shape, _cumsum_dtype(x.dtype))


@cumprod.grad
def _(x, dy, *, axis):
    # ∂yⱼ/∂xᵢ = Πₖ≤ⱼ,ₖ≠ᵢ xₖ for j ≥ i, so dxᵢ = Σⱼ≥ᵢ dyⱼ·Πₖ≤ⱼ,ₖ≠ᵢ xₖ. Without zeros that is Σⱼ≥ᵢ dyⱼ·yⱼ / xᵢ, one
    # reversed cumsum. Zeros are handled as in prod's rule, in O(n) and without looking at the data: with x̃ = x
    # with its zeros set to 1 and C = cumprod(x̃), the product splits into C_j/x̃ᵢ times the zeros it holds, which
    # is 1 with none, the zero itself with one (its value 0, its derivative 1: this keeps second derivatives
    # right), and 0 with two or more. The zeros before i are one factor; those in (i, j] another, found by
    # numbering the runs between zeros: gᵢ = the number of zeros at or before i, so that j ≥ i is in i's run when
    # gⱼ = gᵢ and one zero further when gⱼ = gᵢ + 1 (that zero starts run gᵢ + 1). Sums over a run, and the zero
    # that starts it, come from scatter_add into one bucket per run and gather back.
    if x.ndim == 0:
        return dy
    a = axis % x.ndim
    is_zero = x == 0
    nonzero = F.where(is_zero, 1, x)
    run = F.cumsum(F.cast(is_zero, dtype="int64"), axis=a)
    w = dy * F.cumprod(nonzero, axis=a)  # dyⱼ·Cⱼ
    buckets = F.pad(F.zeros_like(w), pad=[0, 0] * (x.ndim - 1 - a) + [0, 3])  # runs 0..n, and two past the end

    def from_end(t):  # Σ over positions (runs) at or after each one
        return F.flip(F.cumsum(F.flip(t, axis=[a]), axis=a), axis=[a])

    after = from_end(F.scatter_add(buckets, a, run, w))  # Σ of w over runs ≥ g
    later = F.gather(after, a, run + 1)  # over runs after i's
    same_run = from_end(w) - later  # Σⱼ≥ᵢ in i's run
    next_run = later - F.gather(after, a, run + 2)
    zero_of_run = F.scatter_add(buckets, a, run, F.where(is_zero, x, 0))  # the zero that starts each run
    next_zero = F.gather(zero_of_run, a, run + 1)
    zeros_before = run - F.cast(is_zero, dtype="int64")
    first_zero = F.gather(zero_of_run, a, F.ones_like(run))
    before = F.where(zeros_before == 0, 1, F.where(zeros_before == 1, first_zero, 0))
    return before / nonzero * (same_run + next_zero * next_run)


@cumprod.samples
def _(rng):
    def signed(*shape):  # magnitudes near 1 keep products moderate
        return np.asarray(rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape))

    yield Sample.of(signed(2, 3, 4), axis=1)
    yield Sample.of(signed(2, 3), axis=-1)
    yield Sample.of(signed(), axis=0)
    yield Sample.of(rng.integers(-3, 4, (2, 3)), axis=0)
    # Zeros: none, one, two, and zeros next to each other; the products are polynomials, smooth there too.
    yield Sample.of(np.array([[0.9, 0.0, 1.2, -0.7, 1.1], [0.0, 1.3, 0.0, 0.8, -1.2], [1.1, -0.6, 0.0, 0.0, 0.7]]),
                    axis=1)
    yield Sample.of(np.array([[0.0, 1.2], [0.0, -0.9], [1.4, 0.0]]), axis=0)
