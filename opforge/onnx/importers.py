"""ONNX op type -> how it becomes our ops. Each importer calls ``opforge.ops`` on program variables (the import is a
trace), so one ONNX node may become several of our ops; shape rules and argument checks are the ops' own.

Why a table keyed by ONNX op type here, rather than next to each op (as export mappings are): the importer looks
nodes up by ONNX type, and an ONNX op's meaning moves with the opset (Softmax before 13, axes as attribute or input,
Clip's bounds, Pad's pads); most ONNX ops land on a composition of ours (Gemm, Conv with asymmetric pads, Selu with
its own constants, HardSigmoid, InstanceNormalization...), and several ONNX types land on one op of ours (ReduceMax
and GlobalMaxPool on amax). The table is ONNX's vocabulary, which is also what the conformance report counts.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .. import ops as F
from ..core import dtypes as D
from ..core.spec import Dim, Elem
from .shapes import NotAtImport, constant, sizes_of, value_at_import
from .types import LOW_FLOATS, NARROW, NeedsConstant, OnnxImportError, Seq, dtype_of, round_to, type_name

IMPORTERS: dict = {}


def onnx_op(*types):
    def register(fn):
        for t in types:
            IMPORTERS[t] = fn
        return fn

    return register


def _ints_attr_or_input(n, name, index, since):
    """An int list given as attribute before opset ``since`` and as input ``index`` from it on (axes, pads...)."""
    if n.opset < since:
        value = n.attr(name)
        return None if value is None else tuple(value)
    return n.ints(index, name)


# -- elementwise ------------------------------------------------------------------------------------------------------

_UNARY = {"Identity": F.identity, "Neg": F.neg, "Exp": F.exp, "Log": F.log, "Tanh": F.tanh, "Sigmoid": F.sigmoid,
          "Relu": F.relu, "Abs": F.abs, "Sign": F.sign, "Floor": F.floor, "Ceil": F.ceil, "Round": F.round,
          "Sqrt": F.sqrt, "Reciprocal": F.reciprocal, "Sin": F.sin, "Cos": F.cos, "Erf": F.erf,
          "IsNaN": F.isnan, "Not": F.logical_not, "Asin": F.asin, "Acos": F.acos, "Atan": F.atan}


@onnx_op(*_UNARY)
def _(n):
    value = n.env[n.proto.input[0]]
    if n.op_type == "Identity" and (value is None or isinstance(value, Seq)):  # a sequence or an empty optional
        return value
    return _UNARY[n.op_type](n.input(0))


@onnx_op("Tan")
def _(n):
    x = n.input(0)
    return F.sin(x) / F.cos(x)


@onnx_op("Sinh", "Cosh")
def _(n):
    x = n.input(0)
    a, b = F.exp(x), F.exp(-x)
    return (a - b) * 0.5 if n.op_type == "Sinh" else (a + b) * 0.5


@onnx_op("LeakyRelu")
def _(n):
    return F.leaky_relu(n.input(0), alpha=n.attr("alpha", 0.01))


@onnx_op("Elu")
def _(n):
    return F.elu(n.input(0), alpha=n.attr("alpha", 1.0))


@onnx_op("Selu")
def _(n):
    x = n.input(0)
    alpha, gamma = n.attr("alpha", 1.67326319217681884765625), n.attr("gamma", 1.05070102214813232421875)
    return F.where(x > 0, x, F.expm1(F.minimum(x, 0)) * alpha) * gamma


@onnx_op("Celu")
def _(n):
    alpha = n.attr("alpha", 1.0)
    if math.isnan(alpha) or alpha == 0:  # (ONNX's formula divides by alpha: NaN everywhere, torch's celu does not)
        raise n.unsupported(f"alpha={alpha}")
    return F.celu(n.input(0), alpha=alpha)


@onnx_op("Softplus")
def _(n):
    return F.softplus(n.input(0))


@onnx_op("Softsign")
def _(n):
    x = n.input(0)
    return x / (F.abs(x) + 1)


@onnx_op("Gelu")
def _(n):
    return F.gelu(n.input(0), approximate=n.attr("approximate", "none"))


@onnx_op("HardSigmoid")
def _(n):
    return F.clip(n.input(0) * n.attr("alpha", 0.2) + n.attr("beta", 0.5), min=0.0, max=1.0)


@onnx_op("HardSwish")
def _(n):
    return F.hardswish(n.input(0))


@onnx_op("Mish")
def _(n):
    return F.mish(n.input(0))


@onnx_op("PRelu")
def _(n):
    x, slope = n.input(0), n.input(1)
    shape, channels = n.shape(0), n.shape(1)
    if n.opset < 7 and len(channels) == 1 and len(shape) > 2 and channels[0] == shape[1] != shape[-1]:
        slope = F.reshape(slope, shape=[-1, *[1] * (len(shape) - 2)])  # one slope per channel, as opset 6 meant
    return F.where(x < 0, x * slope, x)


@onnx_op("ThresholdedRelu")
def _(n):
    x = n.input(0)
    return F.where(x > n.attr("alpha", 1.0), x, 0)


@onnx_op("Clip")
def _(n):
    x = n.input(0)
    if n.opset < 11:
        lo, hi = n.attr("min"), n.attr("max")
        return F.clip(x, min=lo, max=hi) if lo is not None or hi is not None else F.identity(x)
    y = x
    for i, pick in ((1, F.maximum), (2, F.minimum)):
        if n.has(i):
            if any(d != 1 for d in n.spec(i).shape):  # (a tensor of bounds would be elementwise where ONNX refuses)
                raise n.unsupported(f"a bound of shape {n.spec(i).shape} (Clip's bounds are scalars)")
            y = pick(y, n.input(i))
    return y if y is not x else F.identity(x)


@onnx_op("IsInf")
def _(n):
    x = n.input(0)
    inf = F.logical_not(F.logical_or(F.isfinite(x), F.isnan(x)))
    negative, positive = n.attr("detect_negative", 1), n.attr("detect_positive", 1)
    if negative and positive:
        return inf
    if not negative and not positive:
        return F.logical_and(inf, F.zeros_like(x, dtype=D.bool_))
    return F.logical_and(inf, x > 0 if positive else x < 0)


@onnx_op("Cast")
def _(n):
    n.attr("saturate")  # (float8 outputs: read where the result is rounded to the type, _wrap_narrow)
    to = dtype_of(n.attr("to"), f"{n.where()}: attribute 'to'")
    return F.cast(n.input(0), dtype=to)


@onnx_op("CastLike")
def _(n):
    n.attr("saturate")
    return F.cast(n.input(0), dtype=n.spec(1).dtype)


# -- binary and variadic ----------------------------------------------------------------------------------------------

_BINARY = {"Add": F.add, "Sub": F.sub, "Mul": F.mul, "Less": F.less, "LessOrEqual": F.less_equal,
           "Greater": F.greater, "GreaterOrEqual": F.greater_equal, "Equal": F.equal, "And": F.logical_and,
           "Or": F.logical_or, "Xor": F.not_equal}


def _operands(n):
    """Both operands; before opset 7, B broadcasts only when told, and its dims line up with A's from ``axis`` on
    (not from the right, as NumPy's): trailing 1s put them there."""
    a, b = n.input(0), n.input(1)
    axis = n.attr("axis")
    if n.attr("broadcast", 0) and axis is not None:
        rank_a, rank_b = len(n.shape(0)), len(n.shape(1))
        trailing = rank_a - n.axes([axis], rank_a, "axis")[0] - rank_b
        if trailing > 0:
            b = F.reshape(b, shape=[*n.shape(1), *[1] * trailing])
    return a, b


@onnx_op(*_BINARY)
def _(n):
    return _BINARY[n.op_type](*_operands(n))


@onnx_op("Div")
def _(n):
    x, y = _operands(n)
    if n.spec(0).dtype.kind == "f":
        return F.div(x, y)
    # integer division truncates toward zero in ONNX: the floor, plus one where it is negative and inexact (exact in
    # integers, where a quotient through float32 loses digits past 2**24, and refuses division by zero)
    q = F.floor_divide(x, y)
    return F.where(F.logical_and(q < 0, F.remainder(x, y) != 0), q + 1, q)


@onnx_op("Mod")
def _(n):
    x, y = _operands(n)
    r = F.remainder(x, y)  # the sign of y, as Python's %: ONNX's fmod=0
    if not n.attr("fmod", 0):
        return r
    # fmod=1, C's fmod: the sign of x. Where the remainder is not 0 and its sign is not x's, it is y away from it.
    return F.where(F.logical_and(r != 0, F.not_equal(r < 0, x < 0)), r - y, r)


@onnx_op("Pow")
def _(n):
    y = F.pow(*_operands(n))
    dtype = n.spec(0).dtype
    return y if y.dtype == dtype else F.cast(y, dtype=dtype)  # ONNX's result has the base's type


@onnx_op("Max", "Min", "Sum", "Mean")
def _(n):
    xs = n.inputs()
    if n.op_type in ("Sum", "Mean"):
        total = F.add_n(xs) if len(xs) > 1 else F.identity(xs[0])
        return total if n.op_type == "Sum" else total * (1.0 / len(xs))
    pick = F.maximum if n.op_type == "Max" else F.minimum
    y = xs[0]
    for x in xs[1:]:
        y = pick(y, x)
    return y if len(xs) > 1 else F.identity(y)


@onnx_op("Where")
def _(n):
    return F.where(n.input(0), n.input(1), n.input(2))


# -- matrix products ----------------------------------------------------------------------------------------------


@onnx_op("MatMul")
def _(n):
    return F.matmul(n.input(0), n.input(1))


@onnx_op("Gemm")
def _(n):
    a, b, c = n.input(0), n.input(1), n.input(2)
    alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
    n.attr("broadcast")  # (before opset 7: C broadcasts when told; ours always does)
    if len(n.shape(0)) != 2 or len(n.shape(1)) != 2:
        raise n.unsupported(f"inputs of shapes {n.spec(0).shape} and {n.spec(1).shape} (Gemm takes matrices)")
    if n.attr("transA", 0):
        a = F.transpose(a)
    if n.attr("transB", 0):
        b = F.transpose(b)
    y = F.matmul(a, b)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return y


@onnx_op("Einsum")
def _(n):
    return F.einsum(n.inputs(), equation=n.attr("equation").replace(" ", ""))


# -- reductions ---------------------------------------------------------------------------------------------------


def _reduce_axes(n):
    """The axes of a Reduce* node: None (all) or a tuple; () when noop_with_empty_axes asks for no reduction."""
    since = 13 if n.op_type == "ReduceSum" else 18
    axes = _ints_attr_or_input(n, "axes", 1, since)
    noop = n.attr("noop_with_empty_axes", 0) if n.opset >= since else 0
    if not axes:
        return () if noop else None
    return axes


_REDUCE = {"ReduceSum": F.sum, "ReduceMean": F.mean, "ReduceMax": F.amax, "ReduceMin": F.amin,
           "ReduceProd": F.prod, "ReduceLogSumExp": F.logsumexp}


@onnx_op(*_REDUCE, "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum")
def _(n):
    x = n.input(0)
    axes, keep = _reduce_axes(n), bool(n.attr("keepdims", 1))
    if axes == ():
        return F.identity(x)
    empty = _empty_extreme(n, axes, keep)
    if empty is not None:
        return empty
    if n.op_type in _REDUCE:
        y = _REDUCE[n.op_type](x, axis=axes, keepdim=keep)
    elif n.op_type in ("ReduceL1", "ReduceL2"):
        if x.dtype.kind != "f":
            y = F.sum(F.abs(x) if n.op_type == "ReduceL1" else x * x, axis=axes, keepdim=keep)
            y = y if n.op_type == "ReduceL1" else F.sqrt(F.cast(y, dtype=D.float64))
        else:
            y = F.norm(x, p=1.0 if n.op_type == "ReduceL1" else 2.0, axis=axes, keepdim=keep)
    elif n.op_type == "ReduceSumSquare":
        y = F.sum(x * x, axis=axes, keepdim=keep)
    else:
        y = F.log(F.sum(x, axis=axes, keepdim=keep))
    return y if y.dtype == x.dtype else F.cast(y, dtype=x.dtype)


def _empty_extreme(n, axes, keep):
    """ReduceMax/ReduceMin over a group with no elements: ONNX's identities (the type's lowest value for max, its
    highest for min; -inf and inf for floats), where amax and amin refuse (no value)."""
    shape = n.shape(0)
    rank = len(shape)
    reduced = list(range(rank)) if axes is None else n.axes(axes, rank)
    if n.op_type not in ("ReduceMax", "ReduceMin") or not any(shape[a] == 0 for a in reduced) or \
            any(isinstance(d, Dim) for d in shape):
        return None
    dtype = n.spec(0).dtype
    highest = n.op_type == "ReduceMin"
    if dtype == D.bool_:
        value = highest
    elif D.is_floating(dtype):
        value = math.inf if highest else -math.inf
    else:
        value = (np.iinfo(dtype).max if highest else np.iinfo(dtype).min)
    out = [1 if a in reduced else d for a, d in enumerate(shape) if keep or a not in reduced]
    return np.full(n.allocate(out, dtype), value, dtype=dtype)


@onnx_op("ArgMax", "ArgMin")
def _(n):
    x = n.input(0)
    axis, keep = n.attr("axis", 0), bool(n.attr("keepdims", 1))
    find = F.argmax if n.op_type == "ArgMax" else F.argmin
    if n.attr("select_last_index", 0):  # the last of equal extremes: the first one of the flipped tensor
        size = n.shape(0)[axis]
        if isinstance(size, Dim):
            raise n.unsupported("select_last_index along a dim known only at run time")
        return (size - 1) - find(F.flip(x, axis=[axis]), axis=axis, keepdim=keep)
    return find(x, axis=axis, keepdim=keep)


@onnx_op("CumSum")
def _(n):
    x = n.input(0)
    axis = int(n.const(1, "axis"))
    flip = bool(n.attr("reverse", 0))
    x_in = F.flip(x, axis=[axis]) if flip else x
    y = F.cumsum(x_in, axis=axis)
    if n.attr("exclusive", 0):
        y = y - x_in
    y = F.flip(y, axis=[axis]) if flip else y
    return y if y.dtype == x.dtype else F.cast(y, dtype=x.dtype)


# -- nn ------------------------------------------------------------------------------------------------------------


def _softmax(n, fn):
    x = n.input(0)
    if n.opset >= 13:
        return fn(x, axis=n.attr("axis", -1))
    # before 13: the input is seen as 2-D, (dims before axis) x (dims from axis on)
    shape = n.shape(0)
    axis = n.axes([n.attr("axis", 1)], len(shape), "axis")[0]
    if any(isinstance(d, Dim) for d in shape[axis:]):
        raise n.unsupported("opset < 13 softmax over dims known only at run time")
    inner = math.prod(shape[axis:])
    return F.reshape(fn(F.reshape(x, shape=[-1, inner]), axis=-1), shape=list(shape))


@onnx_op("Softmax")
def _(n):
    return _softmax(n, F.softmax)


@onnx_op("LogSoftmax")
def _(n):
    return _softmax(n, F.log_softmax)


@onnx_op("Dropout")
def _(n):
    x = n.input(0)
    n.attr("seed")
    ratio = float(n.attr("ratio", 0.5)) if n.opset < 12 else (float(n.const(1, "ratio")) if n.has(1) else 0.5)
    training = bool(n.const(2, "training_mode")) if n.opset >= 12 and n.has(2) else False
    if n.opset < 7:
        n.attr("is_test")
    y, mask = F.dropout_with_mask(x, p=ratio, training=training)
    return [y, mask]


@onnx_op("BatchNormalization")
def _(n):
    n.attr("momentum")
    n.attr("consumed_inputs")
    if n.opset < 7 and not n.attr("is_test", 0):
        raise n.unsupported("training mode (is_test=0)")
    if n.attr("spatial", 1) != 1:
        raise n.unsupported("spatial=0")
    if n.opset >= 14 and n.attr("training_mode", 0):
        return _batch_norm_training(n)
    if n.attr("training_mode", 0) or n.outputs > 1:
        raise n.unsupported("training mode (batch statistics as outputs) before opset 14")
    x, scale, bias, mean, var = (n.input(i) for i in range(5))
    y, _, _ = F.batch_norm_with_stats(x, mean, var, scale, bias, training=False, eps=n.attr("epsilon", 1e-5))
    return y


def _batch_norm_training(n):
    """Training mode (opset 14 on): normalised by the batch's mean and (biased) variance per channel; the running
    statistics given back as running·momentum + batch·(1 − momentum), as ONNX's reference."""
    x, scale, bias, mean, var = (n.input(i) for i in range(5))
    rank = len(n.shape(0))
    axes = [0, *range(2, rank)]
    momentum, eps = n.attr("momentum", 0.9), n.attr("epsilon", 1e-5)
    batch_mean = F.mean(x, axis=axes, keepdim=True)
    centred = x - batch_mean
    batch_var = F.mean(centred * centred, axis=axes, keepdim=True)
    per_channel = [-1, *[1] * (rank - 2)]
    y = centred * F.rsqrt(batch_var + eps) * F.reshape(scale, shape=per_channel) + F.reshape(bias, shape=per_channel)
    flat_mean, flat_var = F.reshape(batch_mean, shape=[-1]), F.reshape(batch_var, shape=[-1])
    return [y, mean * momentum + flat_mean * (1 - momentum), var * momentum + flat_var * (1 - momentum)][:n.outputs]


@onnx_op("InstanceNormalization")
def _(n):
    return F.instance_norm_affine(n.input(0), n.input(1), n.input(2), eps=n.attr("epsilon", 1e-5))


@onnx_op("GroupNormalization")
def _(n):
    n.attr("stash_type")
    x, scale, bias, groups = n.input(0), n.input(1), n.input(2), n.attr("num_groups")
    channels = n.shape(0)[1]
    if n.opset < 21:  # one scale and bias per group then: repeated over the group's channels
        if isinstance(channels, Dim):
            raise n.unsupported("per-group scale over a channel dim known only at run time")

        def per_channel(t):
            t = F.broadcast_to(F.reshape(t, shape=[groups, 1]), shape=[groups, channels // groups])
            return F.reshape(t, shape=[channels])

        scale, bias = per_channel(scale), per_channel(bias)
    return F.group_norm(x, groups, scale, bias, eps=n.attr("epsilon", 1e-5))


@onnx_op("RMSNormalization")
def _(n):
    n.attr("stash_type")
    shape = n.shape(0)
    axis = n.axes([n.attr("axis", -1)], len(shape), "axis")[0]
    if any(isinstance(d, Dim) for d in shape[axis:]):
        raise n.unsupported("normalising over dims known only at run time")
    return F.rms_norm(n.input(0), list(shape[axis:]), None, eps=n.attr("epsilon", 1e-5)) * \
        n.input(1)


@onnx_op("LayerNormalization")
def _(n):
    n.attr("stash_type")
    x = n.input(0)
    shape = n.shape(0)
    axis = n.axes([n.attr("axis", -1)], len(shape), "axis")[0]
    normalized = shape[axis:]
    eps = n.attr("epsilon", 1e-5)
    if any(isinstance(d, Dim) for d in normalized):
        raise n.unsupported("normalising over dims known only at run time")
    y = F.layer_norm(x, list(normalized), n.input(1), n.input(2), eps=eps)
    if n.outputs == 1:
        return y
    axes = list(range(axis, len(shape)))  # the statistics outputs, computed as the kernel does
    mean = F.mean(x, axis=axes, keepdim=True)
    xc = x - mean
    return [y, mean, F.rsqrt(F.mean(xc * xc, axis=axes, keepdim=True) + eps)]


@onnx_op("LpNormalization")
def _(n):
    x = n.input(0)
    p = n.attr("p", 2)
    if p not in (1, 2):
        raise n.unsupported(f"p={p} (ONNX's LpNormalization takes 1 or 2)")
    norm = F.norm(x, p=float(p), axis=[n.attr("axis", -1)], keepdim=True)
    zero = norm == 0
    return F.where(zero, 0, x / F.where(zero, 1, norm))  # a zero vector stays zero


@onnx_op("MeanVarianceNormalization")
def _(n):
    x = n.input(0)
    axes = list(n.attr("axes", (0, 2, 3)))
    xc = x - F.mean(x, axis=axes, keepdim=True)
    return xc / (F.sqrt(F.mean(xc * xc, axis=axes, keepdim=True)) + 1e-9)


def _reduction(n) -> str:
    reduction = n.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise n.unsupported(f"reduction={reduction!r} (none, sum or mean)")
    return reduction


def _nll(n, log_probs, target, weight):
    ignore, reduction = n.attr("ignore_index", -100), _reduction(n)
    if weight is not None and len(weight.shape) != 1:
        raise n.unsupported(f"class weights of shape {weight.shape} (one weight per class)")
    if weight is None:
        return F.nll_loss(log_probs, target, ignore_index=ignore, reduction=reduction)
    # class weights: each term weighed by its target's weight; "mean" divides by the weights of the valid terms
    picked = F.nll_loss(log_probs, target, ignore_index=ignore, reduction="none")
    valid = F.not_equal(target, ignore)
    w = F.where(valid, F.take(weight, F.where(valid, target, 0)), 0)
    losses = picked * w
    if reduction == "none":
        return losses
    return F.sum(losses) if reduction == "sum" else F.sum(losses) / F.sum(w)


@onnx_op("NegativeLogLikelihoodLoss")
def _(n):
    return _nll(n, n.input(0), n.input(1), n.input(2))


@onnx_op("SoftmaxCrossEntropyLoss")
def _(n):
    scores, target, weight = n.input(0), n.input(1), n.input(2)
    if weight is None:
        loss = F.cross_entropy(scores, target, ignore_index=n.attr("ignore_index", -100), reduction=_reduction(n))
        return [loss, F.log_softmax(scores, axis=1)] if n.outputs > 1 else loss
    log_probs = F.log_softmax(scores, axis=1)
    loss = _nll(n, log_probs, target, weight)
    return [loss, log_probs] if n.outputs > 1 else loss


# -- convolution and pooling ----------------------------------------------------------------------------------------


def _per_dim(n, name: str, default: int, count: int) -> tuple:
    """An ints attribute with one value per spatial dim (two for pads): ``count`` of them, or the default."""
    values = tuple(n.attr(name, (default,) * count))
    if len(values) != count:
        raise n.unsupported(f"{name}={list(values[:64])} ({len(values)} values; {count} wanted)")
    return values


def _window(n, spatial: int, kernel):
    """strides, dilations and (begin, end) pads per spatial dim from the node's attributes (auto_pad included)."""
    strides, dilations = _per_dim(n, "strides", 1, spatial), _per_dim(n, "dilations", 1, spatial)
    auto = n.attr("auto_pad", "NOTSET")
    pads = _per_dim(n, "pads", 0, 2 * spatial)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        sizes = n.shape(0)[2:]
        if any(isinstance(s, Dim) for s in sizes):
            raise n.unsupported(f"auto_pad={auto} over dims known only at run time")
        pads_b, pads_e = [], []
        for size, k, s, d in zip(sizes, kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            pads_b.append(small if auto == "SAME_UPPER" else big)
            pads_e.append(big if auto == "SAME_UPPER" else small)
        pads = (*pads_b, *pads_e)
    elif auto == "VALID":
        pads = (0,) * (2 * spatial)
    elif auto != "NOTSET":
        raise n.unsupported(f"auto_pad={auto!r}")
    return strides, dilations, list(zip(pads[:spatial], pads[spatial:]))


def _symmetric(x, pairs, value=0.0):
    """Pads as (symmetric padding for the op, x padded beforehand where begin and end differ)."""
    if all(b == e for b, e in pairs):
        return x, [b for b, _ in pairs]
    flat = [p for b, e in reversed(pairs) for p in (b, e)]
    return F.pad(x, pad=flat, value=value), [0] * len(pairs)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _spatial(n, table: dict, rank: int):
    if rank not in table:
        raise n.unsupported(f"{rank}-d {n.op_type}")
    return table[rank]


def _kernel(n, weights_input: int = 1) -> tuple:
    """A convolution's kernel_shape: the weights' shape says it; a kernel_shape attribute must say the same."""
    weights = n.spec(weights_input).shape[2:]
    kernel = tuple(n.attr("kernel_shape", weights))
    if len(kernel) != len(weights) or any(w is not None and k != w for k, w in zip(kernel, weights)):
        raise n.unsupported(f"kernel_shape {list(kernel)} with weights of shape {n.spec(weights_input).shape}")
    return kernel


@onnx_op("Conv")
def _(n):
    return _conv(n, n.input(0), n.input(1), n.input(2))


def _conv(n, x, w, b, weights_input: int = 1):
    """Conv's computation on x, w and b given (ConvInteger and QLinearConv give theirs), its window attributes read
    from the node."""
    kernel = _kernel(n, weights_input)
    spatial = len(n.shape(0)) - 2
    conv = _spatial(n, _CONV, spatial)
    strides, dilations, pairs = _window(n, spatial, kernel)
    x, padding = _symmetric(x, pairs)
    return conv(x, w, b, stride=list(strides), padding=padding, dilation=list(dilations), groups=n.attr("group", 1))


@onnx_op("ConvTranspose")
def _(n):
    x, w, b = n.input(0), n.input(1), n.input(2)
    spatial = len(n.shape(0)) - 2
    conv_transpose = _spatial(n, _CONV_TRANSPOSE, spatial)
    kernel = _kernel(n)
    strides, dilations = _per_dim(n, "strides", 1, spatial), _per_dim(n, "dilations", 1, spatial)
    output_padding = _per_dim(n, "output_padding", 0, spatial)
    auto = n.attr("auto_pad", "NOTSET")
    output_shape = n.attr("output_shape")
    full = []  # each spatial size with no padding at all: what pads then cut from both ends
    for i, size in enumerate(n.shape(0)[2:]):
        if isinstance(size, Dim) and (output_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER")):
            raise n.unsupported("output_shape or auto_pad over dims known only at run time")
        full.append(None if isinstance(size, Dim) else
                    strides[i] * (size - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1)
    if output_shape is not None and len(output_shape) != spatial:
        raise n.unsupported(f"output_shape={list(output_shape[:64])} ({spatial} sizes wanted)")
    if output_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        # ONNX's rule: the pads that give the requested size, the odd one at the end with SAME_UPPER, else at the
        # front; a negative total (a size past the full output) pads the end, as output_padding does
        wanted = output_shape[-spatial:] if output_shape is not None else \
            [size * s for size, s in zip(n.shape(0)[2:], strides)]
        totals = [f - o for f, o in zip(full, wanted)]
        pairs = [(t // 2, t - t // 2) if auto == "SAME_UPPER" else (t - t // 2, t // 2) for t in totals]
        if any(b_ < 0 for b_, _ in pairs):
            raise n.unsupported(f"output_shape {list(wanted)} past the full output {full} at the front")
        output_padding = tuple(p - min(e, 0) for p, (_, e) in zip(output_padding, pairs))
        full = [f - min(e, 0) for f, (_, e) in zip(full, pairs)]
        pairs = [(b_, max(e, 0)) for b_, e in pairs]
    elif auto in ("NOTSET", "VALID"):
        pads = _per_dim(n, "pads", 0, 2 * spatial) if auto == "NOTSET" else (0,) * (2 * spatial)
        pairs = list(zip(pads[:spatial], pads[spatial:]))
    else:
        raise n.unsupported(f"auto_pad={auto!r}")
    # our op pads both ends alike: the common part as its padding, the rest cut off the result
    common = [min(b_, e) for b_, e in pairs]
    y = conv_transpose(x, w, b, stride=list(strides), padding=common, output_padding=list(output_padding),
                       groups=n.attr("group", 1), dilation=list(dilations))
    cut = [(b_ - c, e - c) for (b_, e), c in zip(pairs, common)]
    if not any(b_ or e for b_, e in cut):
        return y
    if any(e and size is None for (_, e), size in zip(cut, full)):
        raise n.unsupported("pads cut from the end of a dim known only at run time")
    ends = [2**62 if size is None else size - e for (_, e), size in zip(cut, full)]  # slice takes ends ≥ 0
    return F.slice(y, axes=[2 + i for i in range(spatial)], starts=[b_ for b_, _ in cut], ends=ends,
                   steps=[1] * spatial)


@onnx_op("MaxPool", "AveragePool")
def _(n):
    if n.outputs > 1 and n.proto.output[1]:
        return _max_pool_with_indices(n)
    if n.attr("storage_order", 0):
        raise n.unsupported("storage_order=1 without the Indices output")
    kernel = tuple(n.attr("kernel_shape"))
    spatial = len(kernel)
    maximum = n.op_type == "MaxPool"
    pool = _spatial(n, _MAX_POOL if maximum else _AVG_POOL, spatial)
    strides, dilations, pairs = _window(n, spatial, kernel)
    dilated = not maximum and any(d != 1 for d in dilations)
    if dilated:  # avg_pool has no dilations (as PyTorch's): window sums by a convolution, over the counts below
        pool = _window_sums(n, list(dilations))
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]  # the dilated kernel's extent
    sizes = n.shape(0)[2:]
    if n.attr("ceil_mode", 0):  # more padding at the end, so that the floor of our ops gives ONNX's ceil
        if any(isinstance(d, Dim) for d in sizes):
            raise n.unsupported("ceil_mode=1 over dims known only at run time")
        extra = []
        for size, k, s, (b, e) in zip(sizes, reach, strides, pairs):
            out = -(-(size + b + e - k) // s) + 1
            if (out - 1) * s >= size + b:  # a last window starting in the end padding is dropped
                out -= 1
            extra.append(max((out - 1) * s + k - (size + b + e), 0))
    else:
        extra = [0] * spatial
    x = n.input(0)
    window = {"kernel_size": list(kernel), "stride": list(strides)}
    if maximum:
        window["dilation"] = list(dilations)
    padded = [(0, 0), (0, 0), *((b, e + x_) for (b, e), x_ in zip(pairs, extra))]
    fits = all(b == e + x_ and 2 * b <= k for (b, e), x_, k in zip(pairs, extra, kernel))
    if maximum:
        exact = x.dtype.kind in "iu"  # integers (uint8 images) pooled as float64: exact below 2**53
        y = F.cast(x, dtype=D.float64) if exact else x
        if fits:
            y = pool(y, padding=[b for b, _ in pairs], **window)
        else:
            y = pool(_pad(y, padded, -math.inf), padding=[0] * spatial, **window)
        return F.cast(y, dtype=x.dtype) if exact else y
    include = bool(n.attr("count_include_pad", 0))
    if fits and (include or not any(pairs)) and not any(extra) and not dilated:
        return pool(x, padding=[b for b, _ in pairs], **window)
    # window sums over the count of what each window covers: the input, and the pads when they count (never the
    # ceil-mode extra)
    ones = F.ones_like(x)
    counted = _pad(ones, [(0, 0), (0, 0), *pairs], 1.0 if include else 0.0)
    counted = _pad(counted, [(0, 0), (0, 0), *((0, x_) for x_ in extra)], 0.0)
    total = pool(_pad(x, padded, 0.0), padding=[0] * spatial, **window)
    return total / pool(counted, padding=[0] * spatial, **window)


_MAX_POOL_INDICES = {1: F.max_pool1d_with_indices, 2: F.max_pool2d_with_indices, 3: F.max_pool3d_with_indices}


def _max_pool_with_indices(n):
    """MaxPool and its Indices: ours give each maximum's index in its (unpadded) plane; ONNX's count over the whole
    tensor (batch and channel too), in row-major order, or column-major with storage_order=1."""
    kernel = tuple(n.attr("kernel_shape"))
    spatial = len(kernel)
    strides, dilations, pairs = _window(n, spatial, kernel)
    if any(b != e or 2 * b > k for (b, e), k in zip(pairs, kernel)):
        raise n.unsupported(f"the Indices output with pads {pairs} (equal at both ends, at most half the kernel)")
    sizes = n.shape(0)[1:]
    if any(isinstance(d, Dim) for d in sizes):
        raise n.unsupported("the Indices output over dims known only at run time")
    pool = _spatial(n, _MAX_POOL_INDICES, spatial)
    y, index = pool(n.input(0), kernel_size=list(kernel), stride=list(strides), padding=[b for b, _ in pairs],
                    dilation=list(dilations), ceil_mode=bool(n.attr("ceil_mode", 0)))
    plane = sizes[1:]
    if n.attr("storage_order", 0):  # column-major within the plane: the position's digits read in reverse order
        digits, rest = [], index
        for size in reversed(plane):
            digits.append(F.remainder(rest, size))
            rest = F.floor_divide(rest, size)
        index = None
        for i, digit in enumerate(digits):  # digits[0] is the last dim's, now the slowest
            stride = math.prod(plane[:len(plane) - 1 - i])
            index = digit * stride if index is None else index + digit * stride
    # each (batch, channel) plane's first element's index in the whole tensor: (n·C + c)·plane
    planes = math.prod(plane)
    channel_first = (np.arange(sizes[0], dtype=np.int64) * planes).reshape(-1, *[1] * spatial)
    return [y, index + channel_first + _batch_offsets(index, sizes[0] * planes)]


def _batch_offsets(like, per_item: int):
    """n·per_item for each batch item n, broadcast to ``like``'s shape (its batch size may be known at run time
    only)."""
    ones = F.ones_like(like)
    return (F.cumsum(ones, axis=0) - ones) * per_item


def _window_sums(n, dilations):
    """A function like avg_pool's that sums each (dilated) window of each channel: a depthwise convolution by ones."""
    channels = n.shape(0)[1]
    if isinstance(channels, Dim):
        raise n.unsupported("window sums over a channel count known only at run time")
    conv = _spatial(n, _CONV, len(dilations))

    def sums(x, padding, kernel_size, stride):
        ones = np.ones((channels, 1, *kernel_size), dtype=n.spec(0).dtype)
        return conv(x, ones, None, stride=stride, padding=padding, dilation=dilations, groups=channels)

    return sums


@onnx_op("LpPool")
def _(n):
    kernel = tuple(n.attr("kernel_shape"))
    spatial = len(kernel)
    if n.attr("ceil_mode", 0):
        raise n.unsupported("ceil_mode=1")
    strides, dilations, pairs = _window(n, spatial, kernel)
    p = n.attr("p", 2)
    x = n.input(0)
    powered = F.abs(x) if p == 1 else x * x if p == 2 else F.pow(F.abs(x), float(p))
    powered, padding = _symmetric(powered, pairs)
    total = _window_sums(n, list(dilations))(powered, padding, list(kernel), list(strides))
    return total if p == 1 else F.sqrt(total) if p == 2 else F.pow(total, 1.0 / p)


def _pad(x, pairs, value):
    if not any(b or e for b, e in pairs):
        return x
    return F.pad(x, pad=[p for b, e in reversed(pairs) for p in (b, e)], value=value)


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _(n):
    axes = list(range(2, len(n.shape(0))))
    x = n.input(0)
    return F.mean(x, axis=axes, keepdim=True) if n.op_type == "GlobalAveragePool" else \
        F.amax(x, axis=axes, keepdim=True)


# -- shapes ----------------------------------------------------------------------------------------------------------


@onnx_op("Constant")
def _(n):
    for name, wrap in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        value = n.attr(name)
        if value is not None:
            return np.asarray(value, dtype=wrap) if wrap is not None else value
    n.attr("value_string")
    n.attr("value_strings")
    n.attr("sparse_value")
    raise n.unsupported("a Constant without a numeric value")


@onnx_op("Shape")
def _(n):
    shape = tuple(n.shape(0))
    start, end = n.attr("start", 0), n.attr("end")
    shape = shape[start:end]
    return shape if any(isinstance(d, Dim) for d in shape) else np.array(shape, np.int64)


@onnx_op("Size")
def _(n):
    shape = n.shape(0)
    if any(isinstance(d, Dim) for d in shape):
        return F.sum(F.ones_like(n.input(0), dtype=D.int64))
    return np.array(math.prod(shape), np.int64)


def _computed(sizes) -> bool:
    """Whether sizes were computed in the program (``Elem``s, read from a variable when a run is planned)."""
    return any(isinstance(d, Elem) for d in sizes)


def _dims(x, count: int, fill: int):
    """The sizes of ``x`` as an int64 variable of ``count`` entries: its last ``count`` dims, or all its dims after
    ``count - rank`` entries ``fill``."""
    sizes, rank = F.shape_as_tensor(x), len(x.shape)
    if count <= rank:
        return F.slice(sizes, axes=[0], starts=[rank - count], ends=[rank], steps=[1])
    return F.concat([constant(np.full(count - rank, fill, np.int64)), sizes], axis=0)


@onnx_op("Reshape")
def _(n):
    shape = list(n.ints(1, "shape"))
    given = n.shape(0)
    if _computed(shape) and not n.attr("allowzero", 0):  # a 0 keeps the dim of x at its index: decided at run time
        sizes, rank, dims = n.input(1), len(given), F.shape_as_tensor(n.input(0))
        # (a 0 past x's rank has no dim to keep: ONNX refuses it, and our reshape reads it as a size 0)
        kept = F.slice(dims, axes=[0], starts=[0], ends=[len(shape)], steps=[1]) if len(shape) <= rank else \
            F.concat([dims, constant(np.zeros(len(shape) - rank, np.int64))], axis=0)
        shape = list(sizes_of(F.where(sizes == 0, kept, sizes)))
    elif not n.attr("allowzero", 0):
        shape = [given[i] if isinstance(d, int) and d == 0 else d for i, d in enumerate(shape)]
    return F.reshape(n.input(0), shape=shape)


@onnx_op("Flatten")
def _(n):
    shape = n.shape(0)
    axis = n.attr("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise n.unsupported(f"axis={axis} for an input of rank {len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    outer, inner = shape[:axis], shape[axis:]
    known = [all(isinstance(d, int) for d in part) for part in (outer, inner)]
    if not any(known):
        raise n.unsupported("flattening where both sides hold dims known only at run time")
    return F.reshape(n.input(0), shape=[math.prod(outer) if known[0] else -1, math.prod(inner) if known[1] else -1])


@onnx_op("Transpose")
def _(n):
    perm = n.attr("perm")
    return F.transpose(n.input(0), perm=None if perm is None else list(perm))


@onnx_op("Squeeze")
def _(n):
    axes = _ints_attr_or_input(n, "axes", 1, 13)
    shape = n.shape(0)
    if axes:  # ONNX refuses a listed dim whose size is not 1, where our squeeze (PyTorch's) leaves it
        axes = n.axes(axes, len(shape))
        if any(isinstance(shape[a], int) and shape[a] != 1 for a in axes):
            raise n.unsupported(f"squeezing axes {axes} of a tensor of shape {n.spec(0).shape} (dims of size 1 only)")
    return F.squeeze(n.input(0), axis=None if not axes else list(axes))


@onnx_op("Unsqueeze")
def _(n):
    axes = _ints_attr_or_input(n, "axes", 1, 13)
    rank = len(n.shape(0)) + len(axes)
    y = n.input(0)
    for a in sorted(n.axes(axes, rank)):
        y = F.unsqueeze(y, axis=a)
    return y if axes else F.identity(y)


@onnx_op("Concat")
def _(n):
    return F.concat(n.inputs(), axis=n.attr("axis", 0))


@onnx_op("Split")
def _(n):
    axis = n.axes([n.attr("axis", 0)], len(n.shape(0)), "axis")[0]
    size = n.shape(0)[axis]
    sizes = _ints_attr_or_input(n, "split", 1, 13)
    count = n.attr("num_outputs")
    if count is not None and (sizes or count != n.outputs):
        raise n.unsupported(f"num_outputs={count} with {n.outputs} outputs{' and a split' if sizes else ''}")
    if not sizes:
        if n.opset >= 18 and count is None:
            raise n.unsupported("a Split with neither a split input nor num_outputs (from opset 18 one is needed)")
        if isinstance(size, Dim):
            raise n.unsupported("an even split of a dim known only at run time")
        count = n.outputs
        if n.opset < 18 and size % count:
            raise n.unsupported(f"splitting a dim of size {size} into {count} equal parts")
        chunk = -(-size // count)  # ONNX's parts: as even as can be, the last one smaller
        sizes = [chunk] * (count - 1) + [size - chunk * (count - 1)]
        if sizes[-1] < 0:
            raise n.unsupported(f"splitting a dim of size {size} into {count} parts")
    return list(F.split(n.input(0), sections=list(sizes), axis=axis))


@onnx_op("Slice")
def _(n):
    shape = n.shape(0)
    if n.opset < 10:
        starts, ends, axes, steps = n.attr("starts"), n.attr("ends"), n.attr("axes"), None
    else:
        starts, ends, axes, steps = n.ints(1, "starts"), n.ints(2, "ends"), n.ints(3, "axes"), n.ints(4, "steps")
    axes = n.axes(axes if axes is not None else range(len(starts)), len(shape))
    steps = list(steps) if steps is not None else [1] * len(axes)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise n.unsupported(f"{len(starts)} starts, {len(ends)} ends, {len(axes)} axes and {len(steps)} steps")
    if any(isinstance(st, Dim) for st in steps):
        raise n.unsupported("steps computed at run time")
    # ONNX clamps like Python slicing; our slice reads a negative end as "past index 0" (a backward slice to the
    # start): normalise the ends against the dim, so that only that meaning is left negative.
    if _computed(ends):  # ends computed in the program: normalised there, as below
        e = n.input(2)
        size = F.take(F.shape_as_tensor(n.input(0)), constant(np.array(axes, np.int64)), axis=0)
        e = F.where(e < 0, e + size, e)
        e = F.maximum(e, constant(np.array([0 if st > 0 else -1 for st in steps], np.int64)))
        return F.slice(n.input(0), axes=axes, starts=list(starts), ends=list(sizes_of(e)), steps=steps)
    norm_ends = []
    for a, e, st in zip(axes, ends, steps):
        size = shape[a]
        if isinstance(e, int) and e < 0:
            if isinstance(size, Dim):
                raise n.unsupported("a negative end along a dim known only at run time")
            e = e + size
            e = -1 if e < 0 and st < 0 else max(e, 0)
        norm_ends.append(e)
    return F.slice(n.input(0), axes=axes, starts=list(starts), ends=norm_ends, steps=steps)


@onnx_op("Gather")
def _(n):
    return F.take(n.input(0), n.input(1), axis=n.attr("axis", 0))


@onnx_op("GatherElements")
def _(n):
    return F.gather(n.input(0), n.attr("axis", 0), n.input(1))


_SCATTER_REDUCTIONS = {"max": "amax", "min": "amin", "mul": "prod"}  # ONNX's reductions as scatter_reduce's


@onnx_op("ScatterElements")
def _(n):
    x, index, src, axis = n.input(0), n.input(1), n.input(2), n.attr("axis", 0)
    reduction = n.attr("reduction", "none")
    if reduction == "add":
        return F.scatter_add(x, axis, index, src)
    if reduction in _SCATTER_REDUCTIONS:  # x's own value takes part, as in ONNX
        return F.scatter_reduce(x, axis, index, src, _SCATTER_REDUCTIONS[reduction])
    if reduction != "none":
        raise n.unsupported(f"reduction={reduction!r}")
    # the written positions (indices are distinct, as ONNX requires) take src, the others keep x
    written = F.scatter_add(F.zeros_like(x), axis, index, F.ones_like(src)) > 0
    return F.where(written, F.scatter_add(F.zeros_like(x), axis, index, src), x)


@onnx_op("Expand")
def _(n):
    shape = list(n.ints(1, "shape"))
    given = list(n.shape(0))
    if _computed(shape):  # both ways: a 1 in the shape keeps x's dim, decided at run time
        rank = max(len(shape), len(given))
        sizes = n.input(1) if len(shape) == rank else \
            F.concat([constant(np.ones(rank - len(shape), np.int64)), n.input(1)], axis=0)
        return F.broadcast_to(n.input(0), shape=list(sizes_of(F.where(sizes == 1, _dims(n.input(0), rank, 1),
                                                                          sizes))))
    rank = max(len(shape), len(given))
    shape, given = [1] * (rank - len(shape)) + shape, [1] * (rank - len(given)) + given
    target = [s if isinstance(g, int) and g == 1 else g for s, g in zip(shape, given)]
    return F.broadcast_to(n.input(0), shape=target)


@onnx_op("Tile")
def _(n):
    repeats = list(n.ints(1, "repeats"))
    if len(repeats) != len(n.shape(0)):  # (ours, NumPy's, would take fewer as repeats of the trailing dims)
        raise n.unsupported(f"{len(repeats)} repeats for an input of rank {len(n.shape(0))}")
    return F.tile(n.input(0), reps=repeats)


@onnx_op("Trilu")
def _(n):
    k = int(n.const(1, "k")) if n.has(1) else 0
    return (F.triu if n.attr("upper", 1) else F.tril)(n.input(0), diagonal=k)


@onnx_op("Pad")
def _(n):
    rank = len(n.shape(0))
    if n.opset < 11:
        pads, value, axes = n.attr("pads"), n.attr("value", 0.0), None
    else:
        pads = n.ints(1, "pads")
        value = n.const(2, "constant_value") if n.has(2) else 0.0
        axes = n.ints(3, "axes") if n.has(3) else None
    axes = n.axes(axes, rank) if axes is not None else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise n.unsupported(f"{len(pads)} pads for {len(axes)} axes (two per axis)")
    half = len(pads) // 2
    pairs = dict(zip(axes, zip(pads[:half], pads[half:])))
    flat = [p for a in reversed(range(rank)) for p in pairs.get(a, (0, 0))]
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}.get(
        n.attr("mode", "constant"))
    if mode is None:
        raise n.unsupported(f"mode={n.attr('mode')!r}")
    return F.pad(n.input(0), pad=flat, mode=mode, value=float(np.asarray(value).reshape(-1)[0]) if
                 np.asarray(value).size else 0.0)


# -- making tensors --------------------------------------------------------------------------------------------------


@onnx_op("ConstantOfShape")
def _(n):
    value = n.attr("value")
    value = np.zeros(1, np.float32) if value is None else value
    shape = n.ints(0, "shape")
    if any(isinstance(d, Dim) for d in shape):  # a shape known only at run time: made in the program
        fill = value.reshape(-1)[0]
        if float(fill) != fill:
            raise n.unsupported(f"a value of {value.dtype} ({fill}) that a float does not hold exactly, with a shape "
                                "known only at run time")
        return F.full(shape=list(shape), fill_value=float(fill), dtype=value.dtype)
    return np.full(n.allocate(shape, value.dtype), value.reshape(-1)[0], dtype=value.dtype)


def _symbolic_input(n, i: int) -> bool:
    """Whether input ``i`` is a shape known symbolically at import (sizes ``Dim``s: computed in the program)."""
    value = n.env[n.proto.input[i]]
    return isinstance(value, (tuple, np.ndarray)) and any(
        isinstance(d, Dim) for d in np.asarray(value, dtype=object).reshape(-1).tolist())


def _range_at_run_time(n):
    """Range over start, limit and delta some of which are computed in the program: ONNX's count of elements,
    max(ceil((limit - start) / delta), 0), then start + i·delta for i below it."""
    start, limit, delta = n.inputs()
    if any(len(v.shape) for v in (start, limit, delta)):
        raise n.unsupported("start, limit or delta that is not a scalar")
    dtype = start.dtype
    if dtype.kind in "iu":
        count = -F.floor_divide(start - limit, delta)
    else:
        count = F.cast(F.ceil((limit - start) / delta), dtype=D.int64)
    count = F.maximum(count, constant(np.array(0, np.int64)))
    steps = F.cumsum(F.full(shape=list(sizes_of(F.reshape(count, shape=[1]))), fill_value=1.0, dtype=D.int64),
                     axis=0) - 1
    return start + F.cast(steps, dtype=dtype) * delta


@onnx_op("Range")
def _(n):
    if not all(n.known(i) for i in range(3)) and all(n.known(i) or n.from_shapes(i) or _symbolic_input(n, i)
                                                     for i in range(3)):
        return _range_at_run_time(n)  # (an input fed or computed from data: n.const says it is needed at load)
    start, limit, delta = (n.const(i, what) for i, what in enumerate(("start", "limit", "delta")))
    if any(np.size(v) != 1 for v in (start, limit, delta)):
        raise n.unsupported("start, limit or delta that is not a scalar")
    dtype = np.asarray(start).dtype
    start, limit, delta = (np.asarray(v).item() for v in (start, limit, delta))
    if delta == 0 or not all(math.isfinite(v) for v in (start, limit, delta)):
        raise n.unsupported(f"a range from {start} to {limit} by {delta}")
    count = -((start - limit) // delta) if dtype.kind in "iu" else math.ceil((limit - start) / delta)
    n.allocate((max(count, 0),), dtype)  # ONNX's count of elements, checked before they are made
    return np.arange(start, limit, delta).astype(dtype)


@onnx_op("EyeLike")
def _(n):
    shape = n.shape(0)
    if any(isinstance(d, Dim) for d in shape):
        raise n.unsupported("a shape known only at run time")
    if len(shape) != 2:
        raise n.unsupported(f"an input of shape {shape} (EyeLike takes a matrix)")
    dtype = n.attr("dtype")
    dtype = n.spec(0).dtype if dtype is None else dtype_of(dtype, f"{n.where()}: attribute 'dtype'")
    return np.eye(*n.allocate(shape, dtype), k=n.attr("k", 0), dtype=dtype)


@onnx_op("OneHot")
def _(n):
    depth = int(np.asarray(n.const(1, "depth")).reshape(-1)[0])
    values = n.input(2)
    index = n.input(0)
    if index.dtype.kind == "f":
        index = F.cast(index, dtype=D.int64)
    index = F.where(index < 0, index + depth, index)  # ONNX counts negative indices from the end
    inside = F.logical_and(index >= 0, index < depth)  # and gives a row of "off" to one out of range
    hot = F.one_hot(F.where(inside, index, 0), num_classes=depth) * F.cast(F.unsqueeze(inside, axis=-1),
                                                                          dtype=D.int64)
    rank = len(n.shape(0)) + 1
    axis = n.axes([n.attr("axis", -1)], rank, "axis")[0]
    if axis != rank - 1:
        order = list(range(rank - 1))
        order.insert(axis, rank - 1)
        hot = F.permute(hot, dims=order)
    off, on = values[0], values[1]
    return F.cast(hot, dtype=values.dtype) * (on - off) + off


# -- attention -------------------------------------------------------------------------------------------------------


def _heads(x, shape, heads, n, what):
    """A 3-D (batch, sequence, heads·size) input as 4-D (batch, heads, sequence, size)."""
    if heads is None:
        raise n.unsupported(f"a 3-D {what} without q_num_heads and kv_num_heads")
    if isinstance(shape[2], int) and shape[2] % heads:
        raise n.unsupported(f"{what} of hidden size {shape[2]} split into {heads} heads")
    return F.permute(F.reshape(x, shape=[shape[0], shape[1], heads, -1]), dims=[0, 2, 1, 3])


@onnx_op("Attention")
def _(n):
    """ONNX's Attention (opset 23 on) as our ops, step by step as ONNX's reference computes it: Q and K both scaled
    by √scale, the key and value caches concatenated, the masks (attn_mask, causal, sliding window, key padding)
    summed into one additive bias, softcap before the bias, a row whose bias is -inf throughout gives zeros."""
    q, k, v = n.input(0), n.input(1), n.input(2)
    rank = len(n.shape(0))
    q_heads, kv_heads = n.attr("q_num_heads"), n.attr("kv_num_heads")
    if not rank == len(n.shape(1)) == len(n.shape(2)) or rank not in (3, 4):
        raise n.unsupported(f"Q, K and V of ranks {rank}, {len(n.shape(1))} and {len(n.shape(2))} (3 or 4 each)")
    if rank == 3:
        q = _heads(q, n.shape(0), q_heads, n, "Q")
        k, v = (_heads(t, n.shape(i), kv_heads, n, name) for t, i, name in ((k, 1, "K"), (v, 2, "V")))
    dtype = n.spec(0).dtype
    head_size = q.shape[3]
    scale = n.attr("scale")
    if scale is None:
        if isinstance(head_size, Dim):
            raise n.unsupported("the default scale over a head size known only at run time")
        root = math.sqrt(1 / math.sqrt(head_size))
    else:  # a float attribute: its root is taken in float32, as ONNX's function body and reference take it
        root = float(np.sqrt(np.float32(scale)))
    root = float(np.asarray(root, dtype))  # ONNX scales Q and K each by √scale, in Q's type
    if n.has(4) != n.has(5):
        raise n.unsupported("past_key without past_value, or past_value without past_key")
    if n.has(6) and n.has(4):
        raise n.unsupported("nonpad_kv_seqlen with a past cache")
    past = 0
    if n.has(4):
        past = n.shape(4)[2]
        k, v = F.concat([n.input(4), k], axis=2), F.concat([n.input(5), v], axis=2)
    present_k, present_v = k, v
    q_len, kv_len = q.shape[2], k.shape[2]
    run_time = any(isinstance(d, Dim) for d in (q_len, kv_len))
    if isinstance(past, Dim) or (run_time and (n.has(6) or (n.has(3) and n.shape(3)[-1] != kv_len))):
        raise n.unsupported("sequence lengths known only at run time with a past cache, nonpad_kv_seqlen or a mask "
                            "shorter than the keys")

    # the additive bias, (q_len, kv_len) or broadcasting to (batch, heads, q_len, kv_len): 0 or -inf, or the mask
    bias = None
    if n.has(3):
        mask = n.input(3)
        missing = 0 if run_time else kv_len - n.shape(3)[-1]
        if missing > 0:  # a mask shorter than the keys: the rest is masked out
            mask = F.pad(mask, pad=[0, missing], value=0.0 if mask.dtype == D.bool_ else -math.inf)
        bias = F.where(mask, 0.0, -math.inf) if mask.dtype == D.bool_ else mask
        bias = F.cast(bias, dtype=dtype) if bias.dtype != dtype else bias
    if run_time:  # query i's position minus key j's, computed in the program (torch's dynamo exporter: causal SDPA)
        ahead = F.unsqueeze(F.arange(start=0, stop=q_len, dtype=D.int64), axis=-1) - F.arange(start=0, stop=kv_len,
                                                                                              dtype=D.int64)
    else:
        n.allocate((q_len, kv_len), np.int64)  # (the sizes come from the file)
        ahead = np.arange(q_len)[:, None] - np.arange(kv_len)[None, :]
    if n.has(6):  # the keys past each batch's count are padding; its queries are the last q_len before them
        lengths = F.reshape(n.input(6), shape=[-1, 1, 1, 1])
        offset, pad = lengths - q_len, F.less_equal(lengths, np.arange(kv_len))
        pad_bias = F.where(pad, -math.inf, 0.0)
    else:
        offset, pad_bias = past, None
    allowed = None
    if n.attr("is_causal", 0):
        allowed = -ahead <= offset  # key j <= i + offset
    left, right = n.attr("left_window_size", -1), n.attr("right_window_size", -1)
    for size, sign in ((left, 1), (right, -1)):
        if size >= 0:
            inside = (ahead * sign + offset * sign) <= size
            allowed = inside if allowed is None else F.logical_and(allowed, inside) if not isinstance(
                allowed, np.ndarray) or not isinstance(inside, np.ndarray) else allowed & inside
    if allowed is not None:
        allowed = F.where(allowed, 0.0, -math.inf) if not isinstance(allowed, np.ndarray) else \
            np.where(allowed, 0.0, -math.inf).astype(dtype)
        bias = allowed if bias is None else bias + allowed
    if pad_bias is not None:
        bias = pad_bias if bias is None else bias + pad_bias
    if isinstance(bias, np.ndarray):
        bias = n._importer.constant(f"{n.name}.bias", bias)
    if bias is not None and bias.dtype != dtype:
        bias = F.cast(bias, dtype=dtype)

    q_count, k_count = q.shape[1], k.shape[1]
    if q_count != k_count:  # grouped-query attention: each key/value head serves q_count // k_count query heads
        if any(isinstance(d, Dim) for d in (q_count, k_count)) or q_count % k_count:
            raise n.unsupported(f"{q_count} query heads over {k_count} key/value heads")
        k = F.repeat_interleave(k, repeats=[q_count // k_count], axis=1)
        v = F.repeat_interleave(v, repeats=[q_count // k_count], axis=1)
    scores = F.matmul(q * root, F.transpose(k * root, perm=[0, 1, 3, 2]))
    raw = scores
    softcap = n.attr("softcap", 0.0)
    if softcap > 0:
        scores = F.tanh(scores * (1 / softcap)) * softcap
    capped = scores
    if bias is not None:
        scores = scores + bias
    precision = n.attr("softmax_precision")
    logits = scores if precision is None else F.cast(scores, dtype=dtype_of(precision, f"{n.where()}: "
                                                                                        "softmax_precision"))
    weights = F.softmax(logits, axis=-1)
    if bias is not None:  # a query whose keys are all masked out gets zeros (its softmax is 0/0)
        weights = F.where(F.amax(bias, axis=-1, keepdim=True) == -math.inf, 0.0, weights)
    weights = F.cast(weights, dtype=dtype) if weights.dtype != dtype else weights
    y = F.matmul(weights, v)
    if rank == 3:
        y = F.reshape(F.permute(y, dims=[0, 2, 1, 3]), shape=[y.shape[0], y.shape[2], -1])
    mode = n.attr("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise n.unsupported(f"qk_matmul_output_mode={mode} (0 to 3)")
    outputs = [y, present_k, present_v]
    if n.outputs > 3 and n.proto.output[3]:
        outputs.append((raw, capped, scores, weights)[mode])
    return outputs[:n.outputs]


# -- resizing --------------------------------------------------------------------------------------------------------


def _resize_coeffs(mode, nearest_mode, a, antialias):
    """ONNX's interpolation weights of the neighbours of a source coordinate, as a function of its distance past the
    neighbour on its left (``ratio``, in (0, 1]) and the axis' scale: as ONNX's reference defines them."""

    def nearest(ratio, scale):
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        pick = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False,
                "ceil": True}[nearest_mode]
        return np.array([0.0, 1.0]) if pick else np.array([1.0, 0.0])

    def cubic(ratio, scale):
        if not antialias:
            return np.array([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a if i in (0, 3) else
                             ((a + 2) * r - (a + 3)) * r * r + 1 for i, r in enumerate(
                                 (ratio, ratio, 1 - ratio, 1 - ratio))])
        scale = min(scale, 1.0)  # antialiasing widens the kernel where the axis shrinks
        start = int(np.floor(-2 / scale) + 1)
        x = np.abs(scale * (np.arange(start, 2 - start) - ratio))
        w = np.where(x <= 1, (a + 2) * x**3 - (a + 3) * x**2 + 1,
                     np.where(x < 2, a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a, 0.0))
        return w / w.sum()

    def linear(ratio, scale):
        if not antialias:
            return np.array([1 - ratio, ratio])
        scale = min(scale, 1.0)
        start = int(np.floor(-1 / scale) + 1)
        w = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * scale), 0, 1)
        return w / w.sum()

    return {"nearest": nearest, "cubic": cubic, "linear": linear}[mode]


def _resize_matrix(n, size, out, scale, coeffs, transform, roi, exclude_outside):
    """The (out, size) matrix that resizes one axis as ONNX's reference does (its resizing is linear in the data and
    separable by axis), and the output positions that take the extrapolation value (tf_crop_and_resize's outside)."""
    y = np.arange(out, dtype=np.float64)
    width = scale * size
    extrapolated = None
    if transform == "align_corners":
        x = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
    elif transform == "asymmetric":
        x = y / scale
    elif transform == "tf_crop_and_resize":
        x = np.full(out, (roi[1] - roi[0]) * (size - 1) / 2) if width == 1 else \
            y * (roi[1] - roi[0]) * (size - 1) / (width - 1)
        x = x + roi[0] * (size - 1)
        extrapolated = (x < 0) | (x > size - 1)
    elif transform == "pytorch_half_pixel":
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif transform == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif transform == "half_pixel_symmetric":
        x = size / 2 * (1 - out / width) + (y + 0.5) / scale - 0.5
    else:
        raise n.unsupported(f"coordinate_transformation_mode={transform!r}")
    left = np.floor(x)
    ratios = np.where(x == left, 1.0, x - left)  # an exact coordinate counts as 1 past the neighbour on its left
    w = np.array([coeffs(float(r), scale) for r in ratios]).reshape(out, -1)
    taps = w.shape[1]
    pad = -(-taps // 2)  # the taps nearest the coordinate, ties to the smaller index, over the edge-padded axis
    padded = x + pad
    p = np.floor(padded).astype(np.int64)
    frac = padded - p
    if taps % 2 == 0:
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    index = (p + offset)[:, None] + np.arange(taps)[None, :] - pad
    if exclude_outside:
        w = np.where((index < 0) | (index >= size), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    matrix = np.zeros((out, size))
    np.add.at(matrix, (np.repeat(np.arange(out), taps), np.clip(index, 0, size - 1).reshape(-1)), w.reshape(-1))
    return matrix, extrapolated


@onnx_op("Resize", "Upsample")
def _(n):
    """Resize as one matrix product per resized axis (the matrix built here from the sizes, as ONNX's reference
    computes the weights): every mode, coordinate transformation, antialiasing and aspect-ratio policy, with
    gradients."""
    shape = list(n.shape(0))
    rank = len(shape)
    if n.op_type == "Upsample" or n.opset < 11:  # Upsample, Resize-10: scales only, asymmetric coordinates
        scales = n.attr("scales") if n.op_type == "Upsample" and n.opset < 9 else n.const(1, "scales")
        sizes, roi, axes = None, None, list(range(rank))
        transform, nearest_mode, a, exclude, extrapolation, policy, antialias = \
            "asymmetric", "floor" if n.op_type == "Upsample" else "round_prefer_floor", -0.75, 0, 0.0, "stretch", 0
        n.attr("width_scale")
        n.attr("height_scale")
    else:
        roi = n.const(1, "roi") if n.has(1) else None
        scales = n.const(2, "scales") if n.has(2) else None
        sizes = n.const(3, "sizes") if n.has(3) else None
        transform = n.attr("coordinate_transformation_mode", "half_pixel")
        nearest_mode = n.attr("nearest_mode", "round_prefer_floor")
        a, exclude = n.attr("cubic_coeff_a", -0.75), n.attr("exclude_outside", 0)
        extrapolation, policy = n.attr("extrapolation_value", 0.0), n.attr("keep_aspect_ratio_policy", "stretch")
        antialias = n.attr("antialias", 0)
        axes = n.axes(n.attr("axes", range(rank)), rank)
    mode = n.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise n.unsupported(f"mode={mode!r}")
    if mode == "nearest" and antialias:
        raise n.unsupported("antialias with mode='nearest'")
    if scales is not None and np.size(scales) == 0:
        scales = None
    if (scales is None) == (sizes is None):
        raise n.unsupported("both scales and sizes, or neither (ONNX wants one)")
    if any(isinstance(shape[i], Dim) for i in axes):
        raise n.unsupported("resizing a dim known only at run time")
    given = [float(s) for s in np.asarray(scales if sizes is None else sizes).reshape(-1)]
    if len(given) != len(axes):
        raise n.unsupported(f"{len(given)} {'scales' if sizes is None else 'sizes'} for {len(axes)} axes")
    if roi is not None and np.size(roi):
        roi = [float(r) for r in np.asarray(roi).reshape(-1)]
        if len(roi) != 2 * len(axes):
            raise n.unsupported(f"a roi of {len(roi)} values for {len(axes)} axes (two per axis)")
        roi = {ax: (roi[i], roi[len(axes) + i]) for i, ax in enumerate(axes)}
    else:
        roi = {ax: (0.0, 1.0) for ax in axes}
    if sizes is None:
        if any(s <= 0 or not math.isfinite(s) for s in given):
            raise n.unsupported(f"scales {given} (positive and finite)")
        scale = dict(zip(axes, given))
        out = {ax: int(scale[ax] * shape[ax]) for ax in axes}
    else:
        scale = {ax: s / shape[ax] for ax, s in zip(axes, given)}
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise n.unsupported(f"keep_aspect_ratio_policy={policy!r}")
            common = (min if policy == "not_larger" else max)(scale.values())
            scale = dict.fromkeys(axes, common)
            out = {ax: int(common * shape[ax] + 0.5) for ax in axes}
        else:
            out = {ax: int(s) for ax, s in zip(axes, given)}
    n.allocate([max(out.values(), default=0), max(shape[ax] for ax in axes)], np.float64)  # the largest matrix
    coeffs = _resize_coeffs(mode, nearest_mode, a, antialias)
    x = n.input(0)
    dtype = n.spec(0).dtype
    y = x if dtype.kind != "i" else F.cast(x, dtype=D.float64)
    for ax in axes:
        if math.isclose(scale[ax], 1.0) and out[ax] == shape[ax] and roi[ax] == (0.0, 1.0):
            continue  # (the reference skips it too: an identity)
        matrix, extrapolated = _resize_matrix(n, shape[ax], out[ax], scale[ax], coeffs, transform, roi[ax],
                                              exclude)
        y = F.transpose(y, perm=[*(i for i in range(rank) if i != ax), ax])  # the axis last, for the product
        y = F.matmul(y, np.ascontiguousarray(matrix.T).astype(y.dtype))
        if extrapolated is not None and extrapolated.any():
            y = F.where(extrapolated, extrapolation, y)
        back = list(range(rank - 1))
        back.insert(ax, rank - 1)
        y = F.transpose(y, perm=back)
    if y is x:
        return F.identity(x)
    return y if dtype.kind != "i" else F.cast(F.round(y), dtype=dtype)


# -- more ops by composition ------------------------------------------------------------------------------------------


@onnx_op("TopK")
def _(n):
    shape = n.shape(0)
    axis = n.axes([n.attr("axis", -1)], len(shape), "axis")[0]
    k = int(np.asarray(n.const(1, "K")).reshape(-1)[0]) if n.opset >= 10 else n.attr("k")
    n.attr("sorted")  # (unsorted: any order ONNX allows; ours is sorted)
    values, indices = F.topk(n.input(0), k, axis=axis, largest=bool(n.attr("largest", 1)))
    return [values, indices]


@onnx_op("CumProd")
def _(n):
    x = n.input(0)
    axis = n.axes([int(np.asarray(n.const(1, "axis")).reshape(-1)[0])], len(n.shape(0)), "axis")[0]
    reverse = bool(n.attr("reverse", 0))
    y = F.flip(x, axis=[axis]) if reverse else x
    if n.attr("exclusive", 0):  # each product of the elements before it: the input shifted by one, a 1 first
        size = n.shape(0)[axis]
        if isinstance(size, Dim):
            raise n.unsupported("exclusive along a dim known only at run time")
        pairs = [(0, 0)] * len(n.shape(0))
        pairs[axis] = (1, 0)
        y = _pad(F.slice(y, axes=[axis], starts=[0], ends=[max(size - 1, 0)], steps=[1]), pairs, 1.0)
    y = F.cumprod(y, axis=axis)
    y = F.flip(y, axis=[axis]) if reverse else y
    return y if y.dtype == x.dtype else F.cast(y, dtype=x.dtype)  # (ours makes int32 products int64, as torch)


@onnx_op("Hardmax")
def _(n):
    x = n.input(0)
    shape = n.shape(0)
    if n.opset < 13:  # the input seen as 2-D, (dims before axis) x (dims from axis on), as Softmax then
        axis = n.axes([n.attr("axis", 1)], len(shape), "axis")[0]
        if any(isinstance(d, Dim) for d in shape[axis:]):
            raise n.unsupported("opset < 13 hardmax over dims known only at run time")
        flat = F.reshape(x, shape=[-1, math.prod(shape[axis:])])
        hot = F.one_hot(F.argmax(flat, axis=-1), num_classes=math.prod(shape[axis:]))
        return F.reshape(F.cast(hot, dtype=x.dtype), shape=list(shape))
    axis = n.axes([n.attr("axis", -1)], len(shape), "axis")[0]
    if isinstance(shape[axis], Dim):
        raise n.unsupported("hardmax along a dim known only at run time")
    hot = F.cast(F.one_hot(F.argmax(x, axis=axis), num_classes=shape[axis]), dtype=x.dtype)  # the first maximum
    order = list(range(len(shape) - 1))
    order.insert(axis, len(shape) - 1)
    return F.permute(hot, dims=order)


def _nd_rows(n, batch_dims):
    """GatherND and ScatterND: the data as rows (its leading dims flattened: the batch dims, then those the
    indices' last dim names), and the row each index tuple names, of the indices' shape less its last dim."""
    shape, index_shape = n.shape(0), n.shape(1)
    k = index_shape[-1]
    if isinstance(k, Dim) or any(isinstance(d, Dim) for d in shape[:batch_dims + k]) or \
            any(isinstance(d, Dim) for d in index_shape[:batch_dims]):
        raise n.unsupported("indexed dims known only at run time")
    if not 0 <= batch_dims < len(shape) or k > len(shape) - batch_dims or len(index_shape) <= batch_dims:
        raise n.unsupported(f"batch_dims={batch_dims} with data of shape {n.spec(0).shape} and indices of shape "
                            f"{n.spec(1).shape}")
    indexed = shape[batch_dims:batch_dims + k]
    index = n.input(1)
    index = F.where(index < 0, index + np.array(indexed, np.int64), index)  # negative: from the end
    strides = np.array([math.prod(indexed[i + 1:]) for i in range(k)], np.int64)
    row = F.sum(index * strides, axis=-1)
    if batch_dims:  # each batch's rows come after the rows of the batches before it
        batches = math.prod(shape[:batch_dims])
        n.allocate((batches,), np.int64)
        first = (np.arange(batches, dtype=np.int64) * math.prod(indexed)).reshape(
            *shape[:batch_dims], *[1] * (len(index_shape) - 1 - batch_dims))
        row = row + first
    rows = F.reshape(n.input(0), shape=[math.prod(shape[:batch_dims + k]), *shape[batch_dims + k:]])
    return rows, row


@onnx_op("GatherND")
def _(n):
    rows, row = _nd_rows(n, n.attr("batch_dims", 0))
    return F.take(rows, row, axis=0)


@onnx_op("ScatterND")
def _(n):
    rows, row = _nd_rows(n, 0)
    reduction = n.attr("reduction", "none")
    flat = F.reshape(row, shape=[-1])
    updates = F.reshape(n.input(2), shape=[-1, *rows.shape[1:]])
    if reduction == "add":
        y = F.index_add(rows, 0, flat, updates)
    elif reduction == "none":  # the written rows (ONNX requires them distinct) take the updates, the rest stays
        written = F.index_add(F.zeros_like(rows, dtype=D.int64), 0, flat, F.ones_like(updates, dtype=D.int64)) > 0
        y = F.where(written, F.index_add(F.zeros_like(rows), 0, flat, updates), rows)
    elif reduction in _SCATTER_REDUCTIONS:  # each update row's elements, reduced into its row with the data's
        index = F.reshape(flat, shape=[-1, *[1] * (len(updates.shape) - 1)]) + F.zeros_like(updates, dtype=D.int64)
        y = F.scatter_reduce(rows, 0, index, updates, _SCATTER_REDUCTIONS[reduction])
    else:
        raise n.unsupported(f"reduction={reduction!r}")
    return F.reshape(y, shape=list(n.shape(0)))


@onnx_op("SpaceToDepth", "DepthToSpace")
def _(n):
    b = n.attr("blocksize")
    shape = n.shape(0)
    if len(shape) != 4 or any(isinstance(d, Dim) for d in shape[1:]):
        raise n.unsupported(f"an input of shape {n.spec(0).shape} (N, C, H, W with C, H and W known)")
    batch, c, h, w = shape
    x = n.input(0)
    if n.op_type == "SpaceToDepth":  # DCR: depth as (row offset, column offset, channel); CRD the other way
        y = F.reshape(x, shape=[batch, c, h // b, b, w // b, b])
        order = [0, 3, 5, 1, 2, 4] if n.attr("mode", "DCR") == "DCR" else [0, 1, 3, 5, 2, 4]
        return F.reshape(F.permute(y, dims=order), shape=[batch, c * b * b, h // b, w // b])
    if n.attr("mode", "DCR") == "DCR":  # depth as (row offset, column offset, channel)
        y = F.permute(F.reshape(x, shape=[batch, b, b, c // (b * b), h, w]), dims=[0, 3, 4, 1, 5, 2])
    else:  # CRD: (channel, row offset, column offset), PyTorch's pixel_shuffle
        y = F.permute(F.reshape(x, shape=[batch, c // (b * b), b, b, h, w]), dims=[0, 1, 4, 2, 5, 3])
    return F.reshape(y, shape=[batch, c // (b * b), h * b, w * b])


@onnx_op("LRN")
def _(n):
    size = n.attr("size")
    alpha, beta, bias = n.attr("alpha", 1e-4), n.attr("beta", 0.75), n.attr("bias", 1.0)
    shape = n.shape(0)
    channels = shape[1]
    if isinstance(channels, Dim):
        raise n.unsupported("a channel count known only at run time")
    x = n.input(0)
    # the sum of squares over channels c - ⌊(size-1)/2⌋ .. c + ⌈(size-1)/2⌉, those past the ends counting 0
    pairs = [(0, 0)] * len(shape)
    pairs[1] = ((size - 1) // 2, size - 1 - (size - 1) // 2)
    squares = _pad(x * x, pairs, 0.0)
    windows = [F.slice(squares, axes=[1], starts=[i], ends=[i + channels], steps=[1]) for i in range(size)]
    total = F.add_n(windows) if size > 1 else windows[0]
    return x / F.pow(total * (alpha / size) + bias, beta)


@onnx_op("Shrink")
def _(n):
    x = n.input(0)
    bias, lambd = n.attr("bias", 0.0), n.attr("lambd", 0.5)
    if x.dtype.kind in "iu":  # the bias in the input's type, as ONNX's reference casts it
        bias = int(bias)
    return F.where(x < -lambd, x + bias, F.where(x > lambd, x - bias, F.zeros_like(x)))


@onnx_op("Swish")
def _(n):
    x = n.input(0)
    alpha = n.attr("alpha", 1.0)
    return x * F.sigmoid(x * alpha if alpha != 1.0 else x)


@onnx_op("Det")
def _(n):
    return F.linalg_det(n.input(0))


@onnx_op("Asinh", "Acosh", "Atanh")
def _(n):
    x = n.input(0)
    if n.op_type == "Asinh":  # odd: computed on |x|, where log(|x| + √(x² + 1)) does not cancel
        a = F.abs(x)
        return F.sign(x) * F.log(a + F.sqrt(a * a + 1))
    if n.op_type == "Acosh":
        return F.log(x + F.sqrt(x * x - 1))
    return (F.log1p(x) - F.log1p(-x)) * 0.5


@onnx_op("Scatter")
def _(n):  # ScatterElements' name before opset 11
    x, index, src, axis = n.input(0), n.input(1), n.input(2), n.attr("axis", 0)
    written = F.scatter_add(F.zeros_like(x), axis, index, F.ones_like(src)) > 0
    return F.where(written, F.scatter_add(F.zeros_like(x), axis, index, src), x)


# -- recurrent layers ------------------------------------------------------------------------------------------------

_RNN_DEFAULTS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
_RNN_PARAMETERS = {"LeakyRelu": (0.01,), "ThresholdedRelu": (1.0,), "Elu": (1.0,), "HardSigmoid": (0.2, 0.5),
                   "Affine": (1.0, 0.0), "ScaledTanh": (1.0, 1.0)}  # their alpha (and beta) when not given


def _rnn_activation(n, name, alphas, betas):
    """An activation of ONNX's recurrent ops, taking its alpha and beta from the front of the node's lists."""
    params = list(_RNN_PARAMETERS.get(name, ()))
    if params:
        params[0] = alphas.pop(0) if alphas else params[0]
    if len(params) > 1:
        params[1] = betas.pop(0) if betas else params[1]
    a, b = [*params, None, None][:2]
    table = {"Sigmoid": F.sigmoid, "Tanh": F.tanh, "Relu": F.relu, "Softsign": lambda x: x / (F.abs(x) + 1),
             "Softplus": F.softplus, "LeakyRelu": lambda x: F.leaky_relu(x, alpha=a),
             "ThresholdedRelu": lambda x: F.where(x > a, x, 0), "Elu": lambda x: F.elu(x, alpha=a),
             "HardSigmoid": lambda x: F.clip(x * a + b, min=0.0, max=1.0), "Affine": lambda x: x * a + b,
             "ScaledTanh": lambda x: F.tanh(x * b) * a}
    if name not in table:
        raise n.unsupported(f"activation {name!r}")
    return table[name]


def _blocks_of(t, count, size):
    """t's last dim cut in ``count`` blocks of ``size``."""
    last = len(t.shape) - 1
    return [F.slice(t, axes=[last], starts=[i * size], ends=[(i + 1) * size], steps=[1]) for i in range(count)]


@onnx_op("RNN", "GRU", "LSTM")
def _(n):
    """ONNX's recurrent layers. LSTM with its default activations and no peepholes, and GRU with
    linear_before_reset=1 (PyTorch's cell), run on lstm_layer and gru_layer, ONNX's gate order (i, o, f, c; z, r,
    h) mapped onto torch's (i, f, g, o; r, z, n); the other cells are unrolled over the steps, as our ops."""
    kind = n.op_type
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    direction = n.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise n.unsupported(f"direction={direction!r}")
    dirs = 2 if direction == "bidirectional" else 1
    size = n.attr("hidden_size")
    layout, clip = n.attr("layout", 0), n.attr("clip")
    lbr = n.attr("linear_before_reset", 0) if kind == "GRU" else 0
    input_forget = n.attr("input_forget", 0) if kind == "LSTM" else 0
    names = n.attr("activations") or _RNN_DEFAULTS[kind] * dirs
    alphas, betas = list(n.attr("activation_alpha", ())), list(n.attr("activation_beta", ()))
    if len(names) != len(_RNN_DEFAULTS[kind]) * dirs:
        raise n.unsupported(f"{len(names)} activations ({len(_RNN_DEFAULTS[kind])} a direction wanted)")
    acts = [_rnn_activation(n, name, alphas, betas) for name in names]
    x = n.input(0)
    if layout:  # batch first: ours run time first
        x = F.transpose(x, perm=[1, 0, 2])
    steps = n.shape(0)[1 if layout else 0]  # (a Dim is enough for lstm_layer and gru_layer; not to unroll)
    if size is None:
        size = n.shape(2)[-1]
    if n.has(4):  # sequence_lens: every sequence of the full length only (no padded batches)
        lens = np.asarray(n.const(4, "sequence_lens")).reshape(-1)
        if isinstance(steps, Dim) or np.any(lens != steps):
            raise n.unsupported(f"sequence_lens {lens.tolist()[:16]} shorter than the {steps} steps")
    peepholes = n.input(7) if kind == "LSTM" and n.has(7) else None

    def state(i):  # an initial state (dirs, N, H), zeros when not given
        if n.has(i):
            s = n.input(i)
            return F.transpose(s, perm=[1, 0, 2]) if layout else s
        zero = F.zeros_like(F.slice(F.take(x, np.array(0), axis=0), axes=[1], starts=[0], ends=[1], steps=[1]))
        return F.stack([zero + np.zeros(n.allocate((size,), n.spec(0).dtype), n.spec(0).dtype)] * dirs, axis=0)

    h0s, c0s = state(5), state(6) if kind == "LSTM" else None
    default = list(names) == list(_RNN_DEFAULTS[kind] * dirs) and clip is None and not input_forget
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        pick = np.array(d)
        w, r = F.take(n.input(1), pick, axis=0), F.take(n.input(2), pick, axis=0)
        wb, rb = _blocks_of(F.take(n.input(3), pick, axis=0), 2, gates * size) if n.has(3) else (None, None)
        h0 = F.take(h0s, pick, axis=0)
        act = acts[d * len(_RNN_DEFAULTS[kind]):(d + 1) * len(_RNN_DEFAULTS[kind])]
        if default and ((kind == "LSTM" and peepholes is None) or (kind == "GRU" and lbr)):
            order = [0, 2, 3, 1] if kind == "LSTM" else [1, 0, 2]  # torch's gate order from ONNX's
            rows = np.concatenate([np.arange(g * size, (g + 1) * size) for g in order])
            w, r = F.take(w, rows, axis=0), F.take(r, rows, axis=0)
            wb, rb = (None, None) if wb is None else (F.take(wb, rows, axis=0), F.take(rb, rows, axis=0))
            gx = F.matmul(x, F.transpose(w))
            if kind == "LSTM":
                gx = gx if wb is None else gx + (wb + rb)
                y, cells, _ = F.lstm_layer(gx, h0, F.take(c0s, pick, axis=0), r, reverse=reverse)
                cs.append(F.take(cells, np.array(0 if reverse else -1), axis=0))
            else:
                gx = gx if wb is None else gx + wb
                y = F.gru_layer(gx, h0, r, rb, reverse=reverse)[0]
            ys.append(y)
            hs.append(F.take(y, np.array(0 if reverse else -1), axis=0))
            continue
        if isinstance(steps, Dim):
            raise n.unsupported(f"this {kind} cell (unrolled over the steps) over a sequence length known only at "
                                "run time")
        y, h, c = _rnn_unrolled(n, kind, x, w, r, wb, rb, h0, None if c0s is None else F.take(c0s, pick, axis=0),
                                None if peepholes is None else F.take(peepholes, pick, axis=0), act, clip, lbr,
                                input_forget, size, steps, reverse)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y = F.stack(ys, axis=1)  # (T, dirs, N, H)
    y_h = F.stack(hs, axis=0)  # (dirs, N, H)
    outs = [F.permute(y, dims=[2, 0, 1, 3]) if layout else y, F.transpose(y_h, perm=[1, 0, 2]) if layout else y_h]
    if kind == "LSTM":
        y_c = F.stack(cs, axis=0)
        outs.append(F.transpose(y_c, perm=[1, 0, 2]) if layout else y_c)
    return outs[:n.outputs]


def _rnn_unrolled(n, kind, x, w, r, wb, rb, h, c, peepholes, act, clip, lbr, input_forget, size, steps, reverse):
    """One direction of an ONNX recurrent layer, step by step as ONNX's definition reads: y (T, N, H), the last h
    and (LSTM) c."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]

    def f(i, t):
        return act[i](F.clip(t, min=-clip, max=clip) if clip is not None else t)

    gx = F.matmul(x, F.transpose(w))
    if wb is not None:
        gx = gx + wb
    r_blocks = _blocks_of(F.transpose(r), gates, size)  # each (H, H): h times it
    rb_blocks = _blocks_of(rb, gates, size) if rb is not None else [None] * gates
    p = _blocks_of(peepholes, 3, size) if peepholes is not None else None  # i, o, f

    def recur(hidden, g):
        out = F.matmul(hidden, r_blocks[g])
        return out if rb_blocks[g] is None else out + rb_blocks[g]

    ys = [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        g = _blocks_of(F.take(gx, np.array(t), axis=0), gates, size)
        if kind == "RNN":
            h = f(0, g[0] + recur(h, 0))
        elif kind == "GRU":  # z, r, h
            z = f(0, g[0] + recur(h, 0))
            reset = f(0, g[1] + recur(h, 1))
            hh = f(1, g[2] + (reset * recur(h, 2) if lbr else recur(reset * h, 2)))
            h = hh + z * (h - hh)
        else:  # i, o, f, c
            i = f(0, g[0] + recur(h, 0) + (p[0] * c if p else 0))
            forget = 1 - i if input_forget else f(0, g[2] + recur(h, 2) + (p[2] * c if p else 0))
            c = forget * c + i * f(1, g[3] + recur(h, 3))
            o = f(0, g[1] + recur(h, 1) + (p[1] * c if p else 0))
            h = o * act[2](c)
        ys[t] = h
    return F.stack(ys, axis=0), h, c


# -- quantization and bits ----------------------------------------------------------------------------------------

_QUANT_RANGES = {elem: (int(ml_dtypes.iinfo(t).min), int(ml_dtypes.iinfo(t).max)) for elem, t in NARROW.items()
                 if elem != 12}  # the integer types ONNX quantizes to: uint8, int8, uint16, int16, (u)int4, (u)int2


def _along(n, t, rank: int, axis: int, block: int, shape):
    """A quantization parameter (a scalar, one value per slice along ``axis``, or one per block of ``block`` along
    it) shaped to broadcast against the input."""
    t_shape = list(t.shape)
    if len(t_shape) == 0 or (len(t_shape) == 1 and t_shape[0] == 1 and not block):
        return t
    axis = n.axes([axis], rank, "axis")[0]  # (checked where it is used: a scalar scale has none)
    if block:
        if len(t_shape) != rank:
            raise n.unsupported(f"a blocked parameter of shape {t_shape} for an input of rank {rank}")
        if isinstance(shape[axis], Dim):
            raise n.unsupported("blocks along a dim known only at run time")
        t = F.repeat_interleave(t, repeats=[block], axis=axis)
        return F.slice(t, axes=[axis], starts=[0], ends=[shape[axis]], steps=[1])
    if len(t_shape) != 1:
        raise n.unsupported(f"a parameter of shape {t_shape} (a scalar or one value per slice along axis)")
    return F.reshape(t, shape=[*[1] * axis, -1, *[1] * (rank - axis - 1)])


def _quant_axis(n):
    rank = len(n.shape(0))
    axis = n.attr("axis", 1)
    block = n.attr("block_size", 0)
    return rank, axis, block


@onnx_op("QuantizeLinear")
def _(n):
    """y = saturate(round_half_even(x / scale) + zero_point) in the zero point's type (uint8 by default); for a
    float8 or float4 type, x / scale + zero_point rounded to the type (saturating unless told not to)."""
    saturate = n.attr("saturate", 1)  # (float8 outputs only)
    rank, axis, block = _quant_axis(n)
    elem = n.narrow.get(n.proto.output[0])
    if elem not in _QUANT_RANGES and elem not in LOW_FLOATS:
        raise n.unsupported(f"quantizing to {type_name(elem) if elem else 'this type'}")
    x = n.input(0)
    precision = n.attr("precision")
    scale = _along(n, n.input(1), rank, axis, block, n.shape(0))
    if precision:
        dtype = dtype_of(precision, f"{n.where()}: attribute 'precision'")
        x, scale = F.cast(x, dtype=dtype), F.cast(scale, dtype=dtype)
    elif x.dtype.kind in "iu":
        x = F.cast(x, dtype=scale.dtype)
    n.attr("output_dtype")
    if elem in LOW_FLOATS:
        q = x / scale
        if n.has(2):
            q = q + F.cast(_along(n, n.input(2), rank, axis, block, n.shape(0)), dtype=q.dtype)
        return round_to(q, elem, F, saturate=bool(saturate))
    q = F.cast(F.round(x / scale), dtype=D.int64)  # (NumPy's round: half to even, as ONNX)
    if n.has(2):
        q = q + _along(n, n.input(2), rank, axis, block, n.shape(0))
    lo, hi = _QUANT_RANGES[elem]
    return F.clip(q, min=lo, max=hi)


@onnx_op("DequantizeLinear")
def _(n):
    """y = (x - zero_point) * scale, in the scale's type."""
    rank, axis, block = _quant_axis(n)
    n.attr("output_dtype")
    x = n.input(0)
    if n.has(2):
        x = x - _along(n, n.input(2), rank, axis, block, n.shape(0))
    scale = n.input(1)
    return F.cast(x, dtype=scale.dtype) * _along(n, scale, rank, axis, block, n.shape(0))


@onnx_op("DynamicQuantizeLinear")
def _(n):
    """uint8 quantization of x over its range widened to hold 0: scale (max - min) / 255, zero point the rounded
    -min / scale."""
    x = n.input(0)
    lo, hi = F.minimum(F.amin(x), 0.0), F.maximum(F.amax(x), 0.0)
    scale = (hi - lo) / 255.0
    zero = F.cast(F.clip(F.round(-lo / scale), min=0.0, max=255.0), dtype=D.int64)
    y = F.clip(F.cast(F.round(x / scale), dtype=D.int64) + zero, min=0, max=255)
    return [y, scale, zero]


@onnx_op("BitShift")
def _(n):
    """x shifted by y bits, as ONNX's reference: a shift past the type's width (or negative) gives 0, or -1 shifting
    a negative x right; left shifts wrap in the type. Computed in int64 (x·2^y wraps modulo 2**64 as the shift)."""
    x, y = n.input(0), n.input(1)
    elem = n.narrow.get(n.proto.input[0])
    bits = ml_dtypes.iinfo(NARROW[elem]).bits if elem else x.dtype.itemsize * 8
    wide, shift = (F.cast(t, dtype=D.int64) if t.dtype != D.int64 else t for t in (x, y))
    inside = F.logical_and(shift >= 0, shift < bits)
    amount = F.where(inside, shift, 0)
    if n.attr("direction") == "LEFT":
        out = F.where(inside, wide * F.pow(np.int64(2), amount), 0)
    else:  # (a shift by 63 gives the sign, as past the width: 2**63 is past int64)
        sign = F.where(wide < 0, -1, 0)
        out = F.where(F.logical_and(inside, amount < 63),
                      F.floor_divide(wide, F.pow(np.int64(2), F.minimum(amount, 62))), sign)
    return out if x.dtype == D.int64 else F.cast(out, dtype=x.dtype)


@onnx_op("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot")
def _(n):
    x = n.input(0)
    if n.op_type == "BitwiseNot":
        return F.bitwise_not(x)
    y = n.input(1)
    if n.op_type == "BitwiseAnd":
        return F.bitwise_and(x, y)
    if n.op_type == "BitwiseOr":
        return F.bitwise_or(x, y)
    return F.bitwise_and(F.bitwise_or(x, y), F.bitwise_not(F.bitwise_and(x, y)))


# -- more ops: windows, crops, selections ----------------------------------------------------------------------------


@onnx_op("HannWindow", "HammingWindow", "BlackmanWindow")
def _(n):
    """The window, made at load from its size (ONNX's formulas; periodic divides by the size, else by size - 1)."""
    size = int(np.asarray(n.const(0, "size")).reshape(-1)[0])
    dtype = dtype_of(n.attr("output_datatype", 1), f"{n.where()}: attribute 'output_datatype'")
    period = size if n.attr("periodic", 1) else size - 1
    k = np.arange(n.allocate((max(size, 0),), np.float64)[0], dtype=np.float64)
    if n.op_type == "HannWindow":
        w = np.sin(k * np.pi / period) ** 2
    elif n.op_type == "HammingWindow":
        w = 25 / 46 - np.cos(k * np.pi * 2 / period) * (21 / 46)
    else:
        w = 0.42 - 0.5 * np.cos(k * np.pi * 2 / period) + 0.08 * np.cos(k * np.pi * 4 / period)
    return w.astype(dtype)


@onnx_op("CausalConvWithState")
def _(n):
    """A depthwise causal 1-d convolution over (past state, input), SiLU optionally, and the last k - 1 steps as
    the next state."""
    x, w, b = n.input(0), n.input(1), n.input(2)
    shape, k = n.shape(0), n.shape(1)[2]
    if len(shape) != 3 or isinstance(shape[1], Dim) or isinstance(k, Dim):
        raise n.unsupported(f"an input of shape {n.spec(0).shape} and weights of shape {n.spec(1).shape}")
    if n.has(3):
        past = n.input(3)
    else:
        past = F.zeros_like(F.slice(x, axes=[2], starts=[0], ends=[1], steps=[1])) * np.zeros((k - 1,), x.dtype)
    padded = F.concat([past, x], axis=2)
    y = F.conv1d(padded, w, b, stride=[1], padding=[0], dilation=[1], groups=shape[1])
    activation = n.attr("activation", "none")
    if activation in ("silu", "swish"):
        y = y * F.sigmoid(y)
    elif activation != "none":
        raise n.unsupported(f"activation={activation!r}")
    length = padded.shape[2]
    if isinstance(length, Dim):
        raise n.unsupported("a sequence length known only at run time")
    state = F.slice(padded, axes=[2], starts=[length - (k - 1)], ends=[length], steps=[1])
    return [y, state]


@onnx_op("CenterCropPad")
def _(n):
    shape = list(n.shape(0))
    rank = len(shape)
    wanted = n.ints(1, "shape")
    axes = n.axes(n.attr("axes", range(rank)), rank)
    if len(wanted) != len(axes):
        raise n.unsupported(f"{len(wanted)} sizes for {len(axes)} axes")
    y = n.input(0)
    for a, size in zip(axes, wanted):
        dim = shape[a]
        if isinstance(dim, Dim) or isinstance(size, Dim):
            raise n.unsupported("cropping or padding a dim known only at run time")
        if size < dim:  # the centre, the odd one off the end
            start = (dim - size) // 2
            y = F.slice(y, axes=[a], starts=[start], ends=[start + size], steps=[1])
        elif size > dim:  # zeros around, the odd one at the end
            pairs = [(0, 0)] * rank
            pairs[a] = ((size - dim) // 2, size - dim - (size - dim) // 2)
            y = _pad(y, pairs, 0.0)
    return y if y is not n.env[n.proto.input[0]] else F.identity(y)


@onnx_op("Compress")
def _(n):
    """The slices where the condition (known at load) is true; along no axis, of the flattened input."""
    keep = np.flatnonzero(np.asarray(n.const(1, "condition")).reshape(-1))
    x = n.input(0)
    axis = n.attr("axis")
    if axis is None:
        x, axis = F.reshape(x, shape=[-1]), 0
    else:
        axis = n.axes([axis], len(n.shape(0)), "axis")[0]
    size = F.reshape(x, shape=[-1]).shape[0] if axis is None else x.shape[axis]
    if not isinstance(size, Dim) and keep.size and keep[-1] >= size:
        raise n.unsupported(f"a condition of {keep[-1] + 1} or more values for a dim of size {size}")
    return F.take(x, keep.astype(np.int64), axis=axis)


@onnx_op("NonZero")
def _(n):
    """The indices of the nonzero elements of an input known at load (how many there are is its data: a shape a
    program must know)."""
    return np.stack(np.nonzero(np.asarray(n.const(0, "X")))).astype(np.int64).reshape(len(n.shape(0)), -1)


@onnx_op("ReverseSequence")
def _(n):
    """Each batch row's first sequence_lens[i] steps reversed (the lengths known at load): one gather."""
    lens = np.asarray(n.const(1, "sequence_lens")).reshape(-1)
    batch_axis, time_axis = n.attr("batch_axis", 1), n.attr("time_axis", 0)
    shape = n.shape(0)
    steps = shape[time_axis]
    if isinstance(steps, Dim) or len(lens) != shape[batch_axis] or np.any((lens < 0) | (lens > steps)):
        raise n.unsupported(f"sequence_lens {lens.tolist()[:16]} for a time dim of {steps}")
    order = np.tile(np.arange(steps), (len(lens), 1))  # (batch, time): the step each position reads
    for i, length in enumerate(lens):
        order[i, :length] = order[i, :length][::-1]
    index = order if batch_axis < time_axis else order.T
    index = index.reshape([index.shape[0] if a == min(batch_axis, time_axis) else index.shape[1]
                           if a == max(batch_axis, time_axis) else 1 for a in range(len(shape))])
    return F.gather(n.input(0), time_axis, np.broadcast_to(index, shape).copy())


@onnx_op("LinearAttention")
def _(n):
    """ONNX's linear attention, its recurrence unrolled over the (known) steps as ONNX's reference runs it, in
    float32: a state S (B, H_kv, d_k, d_v) decayed by exp(decay) (gated rules), the value corrected by beta·(v −
    Sᵀk) (delta rules), then S += k ⊗ v; each step reads scale·q·S, S's heads repeated over the query groups."""
    rule = n.attr("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise n.unsupported(f"update_rule={rule!r}")
    n.attr("chunk_size")  # (a tuning hint: no effect on the result)
    q_heads, kv_heads = n.attr("q_num_heads"), n.attr("kv_num_heads")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != n.has(4) or delta != n.has(5):
        raise n.unsupported(f"update_rule={rule!r} with{'' if n.has(4) else 'out'} decay and "
                            f"with{'' if n.has(5) else 'out'} beta")
    shapes = [n.shape(i) for i in range(3)]
    if any(len(s) != 3 or any(isinstance(d, Dim) for d in s[1:]) for s in shapes) or q_heads % kv_heads:
        raise n.unsupported(f"query, key and value of shapes {[n.spec(i).shape for i in range(3)]} with "
                            f"{q_heads} and {kv_heads} heads")
    dtype = n.spec(0).dtype
    f32 = D.float32
    batch, steps = shapes[0][0], shapes[0][1]
    d_k, d_v = shapes[0][2] // q_heads, shapes[2][2] // kv_heads

    def heads(t, count, size):  # (B, T, count·size) -> (B, count, T, size), in float32
        t = F.permute(F.reshape(t, shape=[batch, steps, count, size]), dims=[0, 2, 1, 3])
        return F.cast(t, dtype=f32) if t.dtype != f32 else t

    q, k, v = heads(n.input(0), q_heads, d_k), heads(n.input(1), kv_heads, d_k), heads(n.input(2), kv_heads, d_v)
    if gating:
        last = n.shape(4)[2]
        decay = heads(n.input(4), kv_heads, 1 if last == kv_heads else d_k)
    if delta:
        last = n.shape(5)[2]
        beta = heads(n.input(5), last, 1)
    if n.has(3):
        state = n.input(3)
        state_dtype = state.dtype
        state = F.cast(state, dtype=f32) if state.dtype != f32 else state
    else:
        state_dtype = dtype
        state = F.zeros_like(F.slice(k, axes=[2, 3], starts=[0, 0], ends=[1, 1], steps=[1, 1])) * \
            np.zeros((d_k, d_v), np.float32)
    scale = n.attr("scale") or 1 / math.sqrt(d_k)
    group = q_heads // kv_heads
    outputs = []

    def at(t, i):
        return F.take(t, np.array(i), axis=2)

    for i in range(steps):
        k_t, v_t = at(k, i), at(v, i)  # (B, H_kv, d)
        if gating:
            state = state * F.unsqueeze(F.exp(at(decay, i)), axis=-1)
        if delta:
            retrieved = F.sum(state * F.unsqueeze(k_t, axis=-1), axis=2)  # Sᵀk: (B, H_kv, d_v)
            v_t = at(beta, i) * (v_t - retrieved)
        state = state + F.unsqueeze(k_t, axis=-1) * F.unsqueeze(v_t, axis=-2)
        read = F.repeat_interleave(state, repeats=[group], axis=1) if group > 1 else state
        outputs.append(F.sum(F.unsqueeze(at(q, i), axis=-1) * read, axis=2) * scale)  # (B, H_q, d_v)
    y = F.reshape(F.stack(outputs, axis=1), shape=[batch, steps, q_heads * d_v])
    y = F.cast(y, dtype=dtype) if dtype != f32 else y
    return [y, F.cast(state, dtype=state_dtype) if state_dtype != f32 else state]


@onnx_op("RotaryEmbedding")
def _(n):
    """Rotary position embedding, as ONNX's reference: the first rotary_embedding_dim features of each head
    rotated pairwise (halves, or interleaved pairs) by the cached cos and sin of each position."""
    x = n.input(0)
    shape = list(n.shape(0))
    rank = len(shape)
    if rank == 4:  # (B, H, S, D) -> (B, S, H, D)
        x = F.permute(x, dims=[0, 2, 1, 3])
    elif rank == 3:
        heads = n.attr("num_heads")
        if not heads or isinstance(shape[2], Dim):
            raise n.unsupported("a 3-D input without num_heads")
        x = F.reshape(x, shape=[shape[0], shape[1], heads, shape[2] // heads])
    else:
        raise n.unsupported(f"an input of rank {rank} (3 or 4)")
    n.attr("num_heads")
    size = x.shape[3]
    if isinstance(size, Dim):
        raise n.unsupported("a head size known only at run time")
    dim = n.attr("rotary_embedding_dim", 0) or size
    cos, sin = n.input(1), n.input(2)
    if n.has(3):  # the caches' rows at each position: (B, S, dim/2)
        cos, sin = F.take(cos, n.input(3), axis=0), F.take(sin, n.input(3), axis=0)
    cos, sin = F.unsqueeze(cos, axis=2), F.unsqueeze(sin, axis=2)
    rotated = F.slice(x, axes=[3], starts=[0], ends=[dim], steps=[1])
    if n.attr("interleaved", 0):
        x1 = F.slice(rotated, axes=[3], starts=[0], ends=[dim], steps=[2])
        x2 = F.slice(rotated, axes=[3], starts=[1], ends=[dim], steps=[2])
    else:
        x1, x2 = _blocks_of(rotated, 2, dim // 2)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if n.attr("interleaved", 0):
        rotated = F.reshape(F.stack([real, imag], axis=-1), shape=[*rotated.shape[:3], dim])
    else:
        rotated = F.concat([real, imag], axis=-1)
    y = F.concat([rotated, F.slice(x, axes=[3], starts=[dim], ends=[size], steps=[1])], axis=-1) if dim < size \
        else rotated
    return F.permute(y, dims=[0, 2, 1, 3]) if rank == 4 else F.reshape(y, shape=shape)


# -- integer and quantized products -----------------------------------------------------------------------------------


def _centred(n, i, zero_i, per_channel_axis=None):
    """Input ``i`` less its zero point (input ``zero_i``; one per output channel along ``per_channel_axis`` when it
    is 1-D there), in float64: integer sums of products, exact below 2**53."""
    x = F.cast(n.input(i), dtype=D.float64)
    if n.has(zero_i):
        zero = F.cast(n.input(zero_i), dtype=D.float64)
        if per_channel_axis is not None and len(zero.shape) == 1 and zero.shape[0] != 1:
            zero = F.reshape(zero, shape=[-1, *[1] * (len(n.shape(i)) - 1)])
        x = x - zero
    return x


def _requantize(n, acc, scale, zero_i, like_i):
    """round_half_even(acc·scale) + zero point, saturated to the output's type (the zero point's, or input
    ``like_i``'s)."""
    elem = n.narrow.get(n.proto.output[0])
    if elem not in _QUANT_RANGES:
        raise n.unsupported("an output type other than int8, uint8, int16 or uint16")
    y = acc * scale
    if n.has(zero_i):
        y = y + F.cast(n.input(zero_i), dtype=y.dtype)
    lo, hi = _QUANT_RANGES[elem]
    return F.cast(F.clip(F.round(y), min=float(lo), max=float(hi)), dtype=D.int64)


@onnx_op("MatMulInteger")
def _(n):
    return F.cast(F.round(F.matmul(_centred(n, 0, 2), _centred(n, 1, 3))), dtype=D.int32)


@onnx_op("ConvInteger")
def _(n):
    y = _conv(n, _centred(n, 0, 2), _centred(n, 1, 3, per_channel_axis=0), None)
    return F.cast(F.round(y), dtype=D.int32)


@onnx_op("QLinearMatMul")
def _(n):
    acc = F.matmul(_centred(n, 0, 2), _centred(n, 3, 5))
    scale = n.input(1) * n.input(4) / n.input(6)  # (in the scales' type, as ONNX's reference)
    return _requantize(n, F.cast(acc, dtype=scale.dtype), scale, 7, 0)


@onnx_op("QLinearConv")
def _(n):
    bias = F.cast(n.input(8), dtype=D.float64) if n.has(8) else None
    acc = _conv(n, _centred(n, 0, 2), _centred(n, 3, 5, per_channel_axis=0), bias, weights_input=3)
    w_scale = n.input(4)
    if len(w_scale.shape) == 1 and w_scale.shape[0] != 1:  # one scale per output channel
        w_scale = F.reshape(w_scale, shape=[-1, *[1] * (len(n.shape(0)) - 2)])
    scale = n.input(1) * w_scale / n.input(6)
    return _requantize(n, F.cast(acc, dtype=scale.dtype), scale, 7, 0)


# -- grid sampling ---------------------------------------------------------------------------------------------------


def _reflect(u, lo: float, hi: float):
    """u reflected by the near border until it lies in [lo, hi] (ONNX's and torch's GridSample)."""
    span = hi - lo
    if span <= 0:
        return F.zeros_like(u) + lo
    below, above = lo - u, u - hi
    out = []
    for dx, even, odd in ((below, lambda r: lo + r, lambda r: hi - r), (above, lambda r: hi - r, lambda r: lo + r)):
        d = F.maximum(dx, 0.0)
        count = F.floor(d / span)
        r = d - count * span
        out.append(F.where(F.remainder(count, 2.0) == 0, even(r), odd(r)))
    return F.where(below > 0, out[0], F.where(above > 0, out[1], u))


def _cubic_weights(t, a=-0.75):
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for a fraction t in [0, 1)."""
    s, u = t + 1, 1 - t
    return [((a * s - 5 * a) * s + 8 * a) * s - 4 * a, ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * u - (a + 3)) * u * u + 1, ((a * (u + 1) - 5 * a) * (u + 1) + 8 * a) * (u + 1) - 4 * a]


@onnx_op("GridSample")
def _(n):
    """Each output point reads the input at its grid coordinates (x first, in [-1, 1]), as ONNX's reference: taps
    gathered from the flattened spatial dims, weighed (nearest: one tap, rounded half to even; linear: 2 a dim;
    cubic: 4), padded by zeros, the border or reflections."""
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(n.attr("mode", "linear"), n.attr("mode", "linear"))
    padding, align = n.attr("padding_mode", "zeros"), n.attr("align_corners", 0)
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise n.unsupported(f"mode={mode!r} with padding_mode={padding!r}")
    shape, grid_shape = n.shape(0), n.shape(1)
    sizes = list(shape[2:])
    k = len(sizes)
    if any(isinstance(d, Dim) for d in [*sizes, shape[1], *grid_shape[1:]]) or grid_shape[-1] != k:
        raise n.unsupported(f"an input of shape {n.spec(0).shape} and a grid of shape {n.spec(1).shape}")
    x, grid = n.input(0), n.input(1)
    batch, channels = shape[0], shape[1]
    points = math.prod(grid_shape[1:-1])
    grid = F.reshape(grid, shape=[batch, points, k])
    coords = []
    for i, size in enumerate(sizes):  # the grid gives the last spatial dim first
        g = F.reshape(F.slice(grid, axes=[2], starts=[k - 1 - i], ends=[k - i], steps=[1]), shape=[batch, points])
        u = (g + 1) * ((size - 1) / 2) if align else ((g + 1) * size - 1) / 2
        if mode == "nearest":
            u = F.round(u)  # (half to even, as ONNX's reference and torch)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if padding == "border":  # (a coordinate within [lo, hi] stays: the taps are clamped below)
            u = F.where(F.logical_or(u < lo, u > hi), F.clip(u, min=0.0, max=size - 1.0), u)
        elif padding == "reflection":
            u = _reflect(u, lo, hi)
        coords.append((u, lo, hi))
    taps_per_dim = []  # per dim: [(index as float, weight)]
    for u, _, _ in coords:
        if mode == "nearest":
            taps_per_dim.append([(u, None)])
            continue
        base = F.floor(u)
        t = u - base
        if mode == "linear":
            taps_per_dim.append([(base, 1 - t), (base + 1, t)])
        else:
            taps_per_dim.append([(base + (j - 1), w) for j, w in enumerate(_cubic_weights(t))])
    flat = F.reshape(x, shape=[batch, channels, math.prod(sizes)])
    total = None
    for combo in np.ndindex(*[len(taps) for taps in taps_per_dim]):
        index, weight, inside = None, None, None
        for i, (size, j) in enumerate(zip(sizes, combo)):
            tap, w = taps_per_dim[i][j]
            _, lo, hi = coords[i]
            if padding == "zeros":
                ok = F.logical_and(tap >= 0, tap <= size - 1)
                inside = ok if inside is None else F.logical_and(inside, ok)
                tap = F.clip(tap, min=0.0, max=size - 1.0)
            elif padding == "border":
                tap = F.clip(tap, min=0.0, max=size - 1.0)
            else:
                tap = F.clip(F.floor(F.abs(_reflect(tap, lo, hi))) * F.sign(_reflect(tap, lo, hi)), min=0.0,
                             max=size - 1.0)  # (int() of the reflected tap: toward zero)
            stride = math.prod(sizes[i + 1:])
            term = F.cast(tap, dtype=D.int64) * stride
            index = term if index is None else index + term
            weight = w if weight is None else (weight if w is None else weight * w)
        if inside is not None:
            weight = F.cast(inside, dtype=x.dtype) if weight is None else F.where(inside, weight, 0.0)
        picked = F.gather(flat, 2, F.broadcast_to(F.unsqueeze(index, axis=1), shape=[batch, channels, points]))
        term = picked if weight is None else picked * F.unsqueeze(weight, axis=1)
        total = term if total is None else total + term
    return F.reshape(total, shape=[batch, channels, *grid_shape[1:-1]])


@onnx_op("AffineGrid")
def _(n):
    """theta (N, k, k+1) applied to the homogeneous coordinates of the output's grid points (in [-1, 1], at the
    pixels' corners or centres), as ONNX's reference: (N, *size, k), x first."""
    size = [int(s) for s in n.ints(1, "size")]
    spatial = size[2:]
    if len(spatial) not in (2, 3):
        raise n.unsupported(f"size {size} (2-D or 3-D)")
    align = n.attr("align_corners", 0)
    n.allocate([math.prod(spatial), len(spatial) + 1], np.float64)
    axes = []
    for d in spatial:
        if align:
            axes.append(np.linspace(-1.0, 1.0, d) if d > 1 else np.array([-1.0]))
        else:
            axes.append(-1 + (2 * np.arange(d) + 1) / d)
    mesh = np.meshgrid(*axes, indexing="ij")  # per dim, over the grid
    homogeneous = np.stack([*reversed([m.reshape(-1) for m in mesh]), np.ones(math.prod(spatial))])  # (k+1, P)
    theta = n.input(0)
    grid = F.matmul(theta, homogeneous.astype(theta.dtype))  # (N, k, P)
    return F.reshape(F.transpose(grid, perm=[0, 2, 1]), shape=[-1, *spatial, len(spatial)])


@onnx_op("Col2Im")
def _(n):
    """Columns added back into the image (PyTorch's fold), begin and end pads cut from the image after."""
    image, block = [int(s) for s in n.ints(1, "image_shape")], [int(s) for s in n.ints(2, "block_shape")]
    k = len(image)
    strides, dilations = _per_dim(n, "strides", 1, k), _per_dim(n, "dilations", 1, k)
    pads = _per_dim(n, "pads", 0, 2 * k)
    if k != 2:
        raise n.unsupported(f"a {k}-d image (fold is 2-d)")
    padded = [s + b + e for s, b, e in zip(image, pads[:k], pads[k:])]
    y = F.fold(n.input(0), output_size=padded, kernel_size=block, dilation=list(dilations), padding=[0, 0],
               stride=list(strides))
    if not any(pads):
        return y
    return F.slice(y, axes=[2, 3], starts=list(pads[:k]), ends=[p - e for p, e in zip(padded, pads[k:])],
                   steps=[1, 1])


@onnx_op("MaxUnpool")
def _(n):
    """Each value put back at its index (MaxPool's Indices: counted over the whole output tensor) in zeros of the
    output's shape (output_shape, or the pooling's input size from kernel, strides and pads)."""
    kernel = tuple(n.attr("kernel_shape"))
    spatial = len(kernel)
    strides, pads = _per_dim(n, "strides", 1, spatial), _per_dim(n, "pads", 0, 2 * spatial)
    shape = n.shape(0)
    if any(isinstance(d, Dim) for d in shape):
        raise n.unsupported("an input of sizes known only at run time")
    out = [*shape[:2], *((size - 1) * s + k - b - e for size, s, k, b, e in zip(
        shape[2:], strides, kernel, pads[:spatial], pads[spatial:]))]
    total = math.prod(n.allocate(out, n.spec(0).dtype))
    x = n.input(0)
    # written, not added: where overlapping windows picked one element twice, it is that element once (as ONNX's
    # reference and ONNX Runtime write it: "pooling the result of an unpooling should give back its input")
    flat = F.index_copy(np.zeros(total, x.dtype), 0, F.reshape(n.input(1), shape=[-1]), F.reshape(x, shape=[-1]))
    y = F.reshape(flat, shape=out)
    if not n.has(2):
        return y
    # output_shape: the indices still count over the shape above (as ONNX's reference reads them), zeros after
    wanted = [int(d) for d in n.ints(2, "output_shape")]
    if len(wanted) != len(out) or any(w < o for w, o in zip(wanted, out)) or wanted[:2] != out[:2]:
        raise n.unsupported(f"output_shape {wanted} smaller than the unpooled {out}")
    return _pad(y, [(0, w - o) for w, o in zip(wanted, out)], 0.0)


@onnx_op("MelWeightMatrix")
def _(n):
    """The mel filter bank, made at load from its (known) inputs as ONNX's reference makes it: triangles between
    mel-spaced frequency bins over the dft_length // 2 + 1 spectrogram bins."""
    mels, dft, rate, low, high = (np.asarray(n.const(i, what)).reshape(-1)[0] for i, what in enumerate(
        ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")))
    mels, dft, rate = int(mels), int(dft), int(rate)
    dtype = dtype_of(n.attr("output_datatype", 1), f"{n.where()}: attribute 'output_datatype'")
    if mels < 1 or dft < 1 or rate < 1:
        raise n.unsupported(f"num_mel_bins={mels}, dft_length={dft}, sample_rate={rate} (positive)")
    out = np.zeros(n.allocate((dft // 2 + 1, mels), np.float64))
    low_mel, high_mel = (2595 * np.log1p(f / 700) / np.log(10) for f in (float(low), float(high)))
    edges = np.arange(mels + 2) * ((high_mel - low_mel) / (mels + 2)) + low_mel
    edges = (((dft + 1) * (700 * np.expm1(edges / 2595 * np.log(10)))) // rate).astype(int)
    if edges.min() < 0 or edges.max() >= out.shape[0]:
        raise n.unsupported(f"frequency edges past the {out.shape[0]} spectrogram bins")
    for i in range(mels):
        left, centre, right = edges[i:i + 3]
        if centre == left:
            out[centre, i] = 1
        else:
            out[left:centre + 1, i] = (np.arange(left, centre + 1) - left) / (centre - left)
        if right > centre:
            out[centre:right, i] = (right - np.arange(centre, right)) / (right - centre)
    return out.astype(dtype)


# -- control flow: subgraphs inlined ----------------------------------------------------------------------------------
# A branch or a loop's body becomes the ops of its nodes, imported where the node stands (``Node.run_graph``): an
# If whose condition is known at load imports the branch it picks; a Loop is unrolled, so its trip count and each
# iteration's condition must be known at load (constants, or computed from constants: ``Node.const``), and so must
# a Scan's length (its input's size along the scanned axis). Gradients flow through the inlined ops.

def _known(n, value, what: str):
    """``value`` (a value of the import) as an array when it is known at load, else None."""
    if isinstance(value, tuple):
        return None if any(isinstance(d, Dim) for d in value) else np.array(value, np.int64)
    if isinstance(value, np.ndarray):
        return None if value.dtype == object else value
    try:
        return value_at_import(value)
    except NotAtImport:
        return None


@onnx_op("If")
def _(n):
    """The branch the condition picks when it is known at load; else both branches, each output chosen by ``where``
    (ONNX runs one branch; ours computes both, so their outputs must agree in shape and type)."""
    then_branch, else_branch = n.attr("then_branch"), n.attr("else_branch")
    cond = _known(n, n.env[n.proto.input[0]], "cond")
    if cond is not None:
        if cond.size != 1:
            raise OnnxImportError(f"{n.where()}: the condition holds {cond.size} values; If takes one")
        return n.run_graph(then_branch if bool(cond.reshape(-1)[0]) else else_branch, {})
    outs = []
    for k, (a, b) in enumerate(zip(n.run_graph(then_branch, {}), n.run_graph(else_branch, {}))):
        if any(v is None or isinstance(v, Seq) for v in (a, b)):
            _needs_condition(n, "a condition known only at run time whose branches give sequences or optionals")
        a, b = n.operand(a, f"{n.proto.output[k]}.then"), n.operand(b, f"{n.proto.output[k]}.else")
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            _needs_condition(n, f"a condition known only at run time whose branches give output {k} of other "
                                f"shapes or types ({a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)})")
        outs.append(F.where(F.reshape(n.input(0), shape=[]), a, b))
    return outs


def _needs_condition(n, why: str):
    """Refuse an If that cannot pick at run time: ``NeedsConstant`` naming what to bind (its condition, or the
    graph input it is computed from), so that a caller who binds it gets the branch it picks."""
    try:
        n.const(0, "cond")
    except NeedsConstant as e:
        raise NeedsConstant(f"{n.where()}: {why} is not supported; bind {e.input_name!r} "
                            "(onnx.load(..., bind={name: value})) to import the branch it picks", e.input_name) \
            from None


def _stacked(n, values: list, axis: int, reverse: bool, what: str):
    if not values:
        raise n.unsupported(f"{what} of no iterations (an empty stack: its shape is not known at load)")
    values = [n.operand(v, f"{n.proto.output[0]}.{what}.{k}") for k, v in enumerate(values)]
    return F.stack(values[::-1] if reverse else values, axis=axis)


@onnx_op("Loop")
def _(n):
    """Unrolled at load: loop-carried values pass from one iteration's body to the next, scan outputs are stacked
    along a new first axis."""
    body = n.attr("body")
    trip = n.const(0, "M (the loop is unrolled at load)")
    cond = n.const(1, "cond (the loop is unrolled at load)") if n.has(1) else np.array(True)
    trip = None if trip is None else int(trip.reshape(-1)[0])
    names = [vi.name for vi in body.input]
    carried = [n.env[name] for name in n.proto.input[2:]]
    if len(names) != 2 + len(carried) or len(body.output) < 1 + len(carried):
        raise OnnxImportError(f"{n.where()}: the body takes {len(names)} inputs and gives {len(body.output)} "
                              f"outputs; a Loop with {len(carried)} carried values needs {2 + len(carried)} inputs")
    scans: list = [[] for _ in range(len(body.output) - 1 - len(carried))]
    i = 0
    while bool(cond.reshape(-1)[0]) and (trip is None or i < trip):
        n._importer.unroll(n.where())
        results = n.run_graph(body, {names[0]: np.array(i, np.int64), names[1]: np.array(cond, bool).reshape(()),
                                     **dict(zip(names[2:], carried))})
        cond = _known(n, results[0], "the body's condition")
        if cond is None:
            raise n.unsupported("a body whose condition is computed at run time (the loop is unrolled at load)")
        carried = results[1:1 + len(carried)]
        for k, value in enumerate(results[1 + len(carried):]):
            scans[k].append(value)
        i += 1
    return [*carried, *(_stacked(n, s, 0, False, "scan output") for s in scans)]


@onnx_op("Scan")
def _(n):
    """Unrolled at load over the scanned axis (its size must be known): states pass from one step's body to the
    next, scan outputs are stacked along their axis; opset 8's batch axis is unrolled too."""
    body = n.attr("body")
    scanned = n.attr("num_scan_inputs")
    if n.opset < 9:
        if n.has(0):
            raise n.unsupported("sequence_lens (opset 8)")
        n.attr("directions")
        inputs = [n.input(i) for i in range(1, n.count)]
        batch = inputs[0].shape[0] if inputs else None
        if not isinstance(batch, int):
            raise n.unsupported("a batch size known only at run time (the scan is unrolled at load)")
        per_item = [_scan(n, body, [F.squeeze(F.slice(x, axes=[0], starts=[b], ends=[b + 1], steps=[1]), axis=0)
                                    for x in inputs], scanned, n.attr("directions") or (), (), ())
                    for b in range(batch)]
        return [_stacked(n, [item[k] for item in per_item], 0, False, "batch") for k in range(len(body.output))]
    return _scan(n, body, n.inputs(), scanned, n.attr("scan_input_directions") or (), n.attr("scan_input_axes") or (),
                 n.attr("scan_output_axes") or (), n.attr("scan_output_directions") or ())


def _scan(n, body, inputs: list, scanned: int, directions, axes, out_axes, out_directions=()) -> list:
    states, xs = inputs[:len(inputs) - scanned], inputs[len(inputs) - scanned:]
    axes = [n.axes([a], len(x.shape), "scan_input_axes")[0] for a, x in zip(list(axes) or [0] * len(xs), xs)]
    lengths = {x.shape[a] for x, a in zip(xs, axes)}
    if len(lengths) != 1 or not isinstance(next(iter(lengths)), int):
        raise n.unsupported(f"scan inputs of lengths {sorted(map(str, lengths))} (one length, known at load: the "
                            "scan is unrolled)")
    length = lengths.pop()
    directions = list(directions) or [0] * len(xs)
    names = [vi.name for vi in body.input]
    outs: list = [[] for _ in range(len(body.output) - len(states))]
    for t in range(length):
        n._importer.unroll(n.where())
        step = [F.squeeze(F.slice(x, axes=[a], starts=[length - 1 - t if d else t], ends=[length - t if d else t + 1],
                                  steps=[1]), axis=a) for x, a, d in zip(xs, axes, directions)]
        results = n.run_graph(body, dict(zip(names, [*states, *step])))
        states = results[:len(states)]
        for k, value in enumerate(results[len(states):]):
            outs[k].append(value)
    out_axes = list(out_axes) or [0] * len(outs)
    out_directions = list(out_directions) or [0] * len(outs)
    stacked = []
    for values, a, d in zip(outs, out_axes, out_directions):
        rank = len(n.operand(values[0], "scan.step").shape) + 1 if values else 1
        stacked.append(_stacked(n, values, n.axes([a], rank, "scan_output_axes")[0], bool(d), "scan output"))
    return [*states, *stacked]


# -- data-dependent sizes ---------------------------------------------------------------------------------------

@onnx_op("Unique")
def _(n):
    """The distinct elements (along ``axis``: slices), where each first occurs, where each element went and how often
    each occurs: ``unique_all`` (sorted), its first occurrences the least index reduced into each; ``sorted=0``
    orders them by first occurrence instead."""
    x = n.input(0)
    axis = n.attr("axis")
    if axis is None:
        x = F.reshape(x, shape=[-1])
        axis = 0
    axis = n.axes([axis], len(x.shape), "axis")[0]
    size = x.shape[axis]
    if isinstance(size, Dim):
        raise n.unsupported("an axis of a size known only at run time")
    values, inverse, counts = F.unique_all(x, axis=axis if n.attr("axis") is not None else None)
    positions = F.arange(start=0, stop=size, dtype=D.int64)
    first = F.scatter_reduce(F.zeros_like(counts) + size, 0, inverse, positions, "amin")
    if not n.attr("sorted", 1):  # in order of first occurrence: permute, and renumber the inverse to match
        order = F.argsort(first, axis=0, stable=True)
        values, first, counts = F.index_select(values, axis, order), F.index_select(first, 0, order), \
            F.index_select(counts, 0, order)
        inverse = F.index_select(F.argsort(order, axis=0), 0, inverse)  # (the rank of each in the new order)
    return [values, first, inverse, counts]


# -- sequences and optionals: lists of values (types.Seq) and values or None, all known at load ----------------------

def _sequence(n, i: int = 0) -> Seq:
    value = n.env[n.proto.input[i]]
    if not isinstance(value, Seq):
        raise OnnxImportError(f"{n.where()}: input {i} ({n.proto.input[i]!r}) is not a sequence")
    return value


def _position(n, i: int, length: int, default: int, insert: bool = False) -> int:
    """Input ``i``, a position in a sequence of ``length`` (negative from the end), known at load."""
    if not n.has(i):
        return default
    pos = int(np.asarray(n.const(i, "position")).reshape(-1)[0])
    top = length if insert else length - 1
    if not -length <= pos <= top:
        raise OnnxImportError(f"{n.where()}: position {pos} is outside a sequence of {length} (from {-length} to "
                              f"{top})")
    return pos + length if pos < 0 else pos  # (-1 inserts before the last element, as Python's list.insert)


@onnx_op("SequenceEmpty")
def _(n):
    n.attr("dtype")
    return Seq()


@onnx_op("SequenceConstruct")
def _(n):
    return Seq(n.env[name] for name in n.proto.input)


@onnx_op("SequenceLength")
def _(n):
    return np.array(len(_sequence(n)), np.int64)


@onnx_op("SequenceAt")
def _(n):
    seq = _sequence(n)
    return seq[_position(n, 1, len(seq), 0)]


@onnx_op("SequenceInsert")
def _(n):
    seq = _sequence(n)
    out = Seq(seq)
    out.insert(_position(n, 2, len(seq), len(seq), insert=True), n.env[n.proto.input[1]])
    return out


@onnx_op("SequenceErase")
def _(n):
    seq = _sequence(n)
    out = Seq(seq)
    del out[_position(n, 1, len(seq), len(seq) - 1)]
    return out


@onnx_op("SplitToSequence")
def _(n):
    x = n.input(0)
    axis = n.axes([n.attr("axis", 0)], len(x.shape), "axis")[0]
    size = x.shape[axis]
    if isinstance(size, Dim):
        raise n.unsupported("splitting a dim known only at run time (a sequence's length is known at load)")
    split = None if not n.has(1) else np.asarray(n.const(1, "split")).astype(np.int64)
    if split is None:
        sizes = [1] * size
    elif split.ndim == 0:
        chunk = int(split)
        if chunk <= 0:
            raise OnnxImportError(f"{n.where()}: split {chunk} must be positive")
        sizes = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
    else:
        sizes = [int(v) for v in split]
        if any(v < 0 for v in sizes) or sum(sizes) != size:
            raise OnnxImportError(f"{n.where()}: split {sizes} must be sizes that sum to {size}")
    keep = n.attr("keepdims", 1) or split is not None  # (keepdims applies only where split is not given)
    out, start = Seq(), 0
    for length in sizes:
        part = F.slice(x, axes=[axis], starts=[start], ends=[start + length], steps=[1])
        out.append(part if keep else F.squeeze(part, axis=axis))
        start += length
    return out


@onnx_op("ConcatFromSequence")
def _(n):
    seq = [n.operand(v, f"{n.proto.input[0]}[{k}]") for k, v in enumerate(_sequence(n))]
    if not seq:
        raise OnnxImportError(f"{n.where()}: an empty sequence has nothing to concatenate")
    rank = len(seq[0].shape)
    if n.attr("new_axis", 0):
        return F.stack(seq, axis=n.axes([n.attr("axis")], rank + 1, "axis")[0])
    return F.concat(seq, axis=n.axes([n.attr("axis")], rank, "axis")[0])


@onnx_op("SequenceMap")
def _(n):
    """The body inlined once per element: a sequence input gives it that element, a tensor input itself."""
    body = n.attr("body")
    seq = _sequence(n)
    others = [n.env[name] for name in n.proto.input[1:]]
    for k, other in enumerate(others):
        if isinstance(other, Seq) and len(other) != len(seq):
            raise OnnxImportError(f"{n.where()}: input {k + 1} is a sequence of {len(other)}; the first of "
                                  f"{len(seq)}")
    names = [vi.name for vi in body.input]
    outs = [Seq() for _ in body.output]
    for k, element in enumerate(seq):
        values = [element, *(o[k] if isinstance(o, Seq) else o for o in others)]
        for out, value in zip(outs, n.run_graph(body, dict(zip(names, values)))):
            out.append(value)
    return outs


@onnx_op("Optional")
def _(n):
    n.attr("type")
    return n.env[n.proto.input[0]] if n.has(0) else None


@onnx_op("OptionalHasElement")
def _(n):
    return np.array(n.has(0) and n.env[n.proto.input[0]] is not None)


@onnx_op("OptionalGetElement")
def _(n):
    value = n.env[n.proto.input[0]]
    if value is None:
        raise OnnxImportError(f"{n.where()}: the optional {n.proto.input[0]!r} is empty (ONNX: an error)")
    return value


@onnx_op("TensorScatter")
def _(n):
    """The update written into a copy of the cache along ``axis``, from each batch item's write index (0 when not
    given; modulo the cache's length in "circular" mode): a scatter along ``axis``."""
    cache, update = n.input(0), n.input(1)
    rank = len(cache.shape)
    axis = n.axes([n.attr("axis", -2)], rank, "axis")[0]
    if axis == 0:
        raise OnnxImportError(f"{n.where()}: axis 0 is the batch axis; the sequence axis comes after it")
    mode = n.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise OnnxImportError(f"{n.where()}: mode {mode!r} is not 'linear' or 'circular'")
    length, steps = cache.shape[axis], update.shape[axis]
    if isinstance(length, Dim) or isinstance(steps, Dim):
        raise n.unsupported("a sequence axis of a size known only at run time")
    index = constant(np.arange(steps, dtype=np.int64).reshape([steps if a == axis else 1 for a in range(rank)]))
    if n.has(2):
        index = F.reshape(n.input(2), shape=[-1, *[1] * (rank - 1)]) + index
    if mode == "circular":
        index = F.remainder(index, length)
    return F.scatter(cache, axis, index + F.zeros_like(update, dtype=D.int64), update)
