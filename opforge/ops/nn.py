"""Neural-network ops: softmax and log_softmax, losses, dropout, embedding, attention (normalisation: norm.py).

Semantics follow ``torch.nn.functional`` (``axis`` for ``dim``). Kernels compute with NumPy; every gradient rule
is written with ops, so backward passes can be differentiated again. Where a rule needs a scatter or a one-hot
(nll_loss, embedding) or where a formula pays (softmax, log_softmax), a dedicated grad op carries it, with a
gradient of its own.
"""

import math

from opforge import ops as F

from ..core.errors import ArgumentError
from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, normalize_axes, np, op

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"argument 'reduction' must be 'mean', 'sum' or 'none', got {reduction!r}")


def _same_dims(a: tuple, b: tuple) -> bool:
    """Shapes equal where both dims are known (None is unknown)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """True if ``shape`` broadcasts to ``target`` (unknown dims fit anything)."""
    if len(shape) > len(target):
        return False
    try:
        return _same_dims(broadcast_shapes(shape, target), target)
    except ShapeError:
        return False


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _validate(opdef, *arrays, **attrs) -> None:
    """Run the op's infer rule on the kernel's arrays. The eager path runs kernels without it, and NumPy would
    broadcast some wrong shapes silently: this way a kernel refuses exactly what the rule refuses, in its words."""
    opdef.infer_fn(*(None if a is None else Spec(a.shape, a.dtype) for a in arrays), **attrs)


def _swap_last(t):
    n = t.ndim
    return F.transpose(t, perm=[*range(n - 2), n - 1, n - 2])


# -- softmax and log_softmax ---------------------------------------------------------------------------------------
# A 0-d tensor accepts axis 0 or -1 and is its own (one-element) group: softmax gives 1, log_softmax 0.


def _softmax_np(x, axes):
    # exp(x − m) / Σ exp(x − m) with m = max x: no exp overflows.
    e = np.exp(x - np.max(x, axis=axes, keepdims=True, initial=-np.inf))
    return e / np.sum(e, axis=axes, keepdims=True)


def _log_softmax_np(x, axes):
    # log softmax(x) = (x − m) − log Σ exp(x − m) with m = max x: no exp overflows, the largest term is exp(0).
    z = x - np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    return z - np.log(np.sum(np.exp(z), axis=axes, keepdims=True))


def _softmax_spec(op_name):
    def infer(x, *, axis):
        normalize_axes(op_name, [axis], len(x.shape))
        return Spec(x.shape, x.dtype)

    return infer


def _softmax_grad_spec(op_name):
    def infer(y, dy, *, axis):
        if not _same_dims(y.shape, dy.shape):
            raise ShapeError(f"{op_name}(): y has shape {y.shape} but dy has shape {dy.shape}")
        normalize_axes(op_name, [axis], len(y.shape))
        return Spec(y.shape, y.dtype)

    return infer


@op("softmax(Tensor<floating> x, *, int axis=-1) -> Tensor y", infer=_softmax_spec("softmax"))
def softmax(x, *, axis):
    """exp(x) / Σ exp(x) along ``axis``, computed as exp(x − max x) / Σ exp(x − max x) so nothing overflows."""
    return _softmax_np(x, normalize_axes("softmax", [axis], x.ndim))


softmax.onnx(lambda g, x, *, axis: g.op("Softmax", x, axis=axis) if x.ndim else g.filled(g.op("Shape", x), 1, x.dtype))


@softmax.grad
def _(y, dy, *, axis):
    return F.softmax_grad(y, dy, axis=axis)  # from the output alone, as torch's _softmax_backward_data


@op("softmax_grad(Tensor<floating> y, Tensor<floating> dy, *, int axis=-1) -> Tensor dx",
    infer=_softmax_grad_spec("softmax_grad"))
def softmax_grad(y, dy, *, axis):
    """Gradient of softmax from its output y: dx = y·(dy − Σ dy·y) along ``axis``."""
    _validate(softmax_grad, y, dy, axis=axis)
    axes = normalize_axes("softmax_grad", [axis], y.ndim)
    return y * (dy - np.sum(dy * y, axis=axes, keepdims=True))


@softmax_grad.grad
def _(y, dy, ddx, *, axis):
    # dx = y·(dy − s), s = Σ dy·y.  For L = Σ ddx·dx:  ∂L/∂dy = y·(ddx − Σ ddx·y) (softmax_grad again) and
    # ∂L/∂y = ddx·(dy − s) − (Σ ddx·y)·dy.
    s = F.sum(dy * y, axis=[axis], keepdim=True)
    t = F.sum(ddx * y, axis=[axis], keepdim=True)
    return ddx * (dy - s) - t * dy, F.softmax_grad(y, ddx, axis=axis)


@op("log_softmax(Tensor<floating> x, *, int axis=-1) -> Tensor y", infer=_softmax_spec("log_softmax"))
def log_softmax(x, *, axis):
    """log(softmax(x)) along ``axis``, computed as (x − max x) − log Σ exp(x − max x)."""
    return _log_softmax_np(x, normalize_axes("log_softmax", [axis], x.ndim))


log_softmax.onnx(lambda g, x, *, axis: g.op("LogSoftmax", x, axis=axis) if x.ndim else
                 g.filled(g.op("Shape", x), 0, x.dtype))


@log_softmax.grad
def _(y, dy, *, axis):
    return F.log_softmax_grad(y, dy, axis=axis)


@op("log_softmax_grad(Tensor<floating> y, Tensor<floating> dy, *, int axis=-1) -> Tensor dx",
    infer=_softmax_grad_spec("log_softmax_grad"))
def log_softmax_grad(y, dy, *, axis):
    """Gradient of log_softmax from its output y: dx = dy − exp(y)·Σ dy along ``axis``."""
    _validate(log_softmax_grad, y, dy, axis=axis)
    axes = normalize_axes("log_softmax_grad", [axis], y.ndim)
    return dy - np.exp(y) * np.sum(dy, axis=axes, keepdims=True)


@log_softmax_grad.grad
def _(y, dy, ddx, *, axis):
    # dx = dy − exp(y)·S, S = Σ dy.  For L = Σ ddx·dx:  ∂L/∂dy = ddx − Σ ddx·exp(y), ∂L/∂y = −ddx·exp(y)·S.
    p = F.exp(y)
    return (-ddx * p * F.sum(dy, axis=[axis], keepdim=True),
            ddx - F.sum(ddx * p, axis=[axis], keepdim=True))


def _softmax_samples(rng):
    yield Sample.of(rng.standard_normal((3, 5)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1)
    yield Sample.of(rng.standard_normal((2, 3)), axis=-2)
    yield Sample.of(rng.standard_normal(4), axis=0)
    yield Sample.of(rng.standard_normal(()))


def _softmax_grad_samples(rng):
    # y need not be a real softmax output for the formula to be checked; keep it one anyway.
    for shape, axis in (((3, 5), -1), ((2, 3, 4), 1), ((), -1)):
        x = rng.standard_normal(shape)
        yield Sample.of(_softmax_np(x, normalize_axes("", [axis], x.ndim)), rng.standard_normal(shape), axis=axis)


def _log_softmax_grad_samples(rng):
    for shape, axis in (((3, 5), -1), ((2, 3, 4), 1), ((), -1)):
        x = rng.standard_normal(shape)
        yield Sample.of(_log_softmax_np(x, normalize_axes("", [axis], x.ndim)), rng.standard_normal(shape), axis=axis)


softmax.samples(_softmax_samples)
log_softmax.samples(_softmax_samples)
softmax_grad.samples(_softmax_grad_samples)
log_softmax_grad.samples(_log_softmax_grad_samples)


# -- classification losses with class-index targets -------------------------------------------------------------
# Layout as torch: scores (C,) with a 0-d target, or (N, C, d1, ...) with a target (N, d1, ...); the class axis is 1
# (0 for 1-D scores). Targets equal to ignore_index add nothing, and "mean" divides by the number of the others.


def _class_axis(ndim: int) -> int:
    return 1 if ndim > 1 else 0


def _loss_spec(op_name):
    def infer(scores, target, *, reduction, **_):
        if not scores.shape:
            raise ShapeError(f"{op_name}(): scores need a class dim, got a 0-d tensor")
        axis = _class_axis(len(scores.shape))
        expected = scores.shape[:axis] + scores.shape[axis + 1:]
        if not _same_dims(expected, target.shape):
            raise ShapeError(f"{op_name}(): scores of shape {scores.shape} need a target of shape {expected} "
                             f"(the class dim {axis} removed), got {target.shape}")
        return Spec(expected if reduction == "none" else (), scores.dtype)

    return infer


def _valid_targets(op_name, target, num_classes, ignore_index):
    """The mask of targets that count; a class index out of range is an error naming the op (as torch)."""
    valid = target != ignore_index
    bad = valid & ((target < 0) | (target >= num_classes))
    if bad.any():
        raise ArgumentError(f"{op_name}(): target holds class {int(target[bad].flat[0])}, outside [0, {num_classes})"
                            f" and not ignore_index ({ignore_index})")
    return valid


def _reduce_losses(losses, valid, reduction):
    if reduction == "none":
        return losses
    total = np.sum(losses)
    if reduction == "sum":
        return np.asarray(total)
    with np.errstate(invalid="ignore", divide="ignore"):  # every target ignored: 0/0 = nan, as torch
        return np.asarray(total / int(np.count_nonzero(valid)))


def _picked(scores, target, valid):
    """scores[n, target[n], ...] along the class axis (0 where the target is ignored)."""
    axis = _class_axis(scores.ndim)
    index = np.expand_dims(np.where(valid, target, 0), axis)
    return np.squeeze(np.take_along_axis(scores, index, axis), axis)


@op("nll_loss(Tensor<floating> log_probs, nograd Tensor<int32|int64> target, *, int ignore_index=-100, "
    "str reduction=\"mean\") -> Tensor loss", infer=_loss_spec("nll_loss"))
def nll_loss(log_probs, target, *, ignore_index, reduction):
    """Negative log-likelihood of class-index targets: −log_probs[n, target[n]], reduced by ``reduction``."""
    _validate(nll_loss, log_probs, target, reduction=reduction)
    valid = _valid_targets("nll_loss", target, log_probs.shape[_class_axis(log_probs.ndim)], ignore_index)
    return _reduce_losses(np.where(valid, -_picked(log_probs, target, valid), 0), valid, reduction)


def _onnx_nll(g, log_probs, target, ignore_index, reduction):
    if log_probs.ndim == 1:  # ONNX wants a batch dim: (C,) and a 0-d target become (1, C) and (1,)
        log_probs = g.op("Unsqueeze", log_probs, g.ints([0]), spec=Spec((1, *log_probs.shape), log_probs.dtype))
        target = g.op("Unsqueeze", target, g.ints([0]))
        loss = g.op("NegativeLogLikelihoodLoss", log_probs, g.cast(target, D.int64), reduction=reduction,
                    ignore_index=ignore_index)
        return g.op("Squeeze", loss, g.ints([0])) if reduction == "none" else loss
    return g.op("NegativeLogLikelihoodLoss", log_probs, g.cast(target, D.int64), reduction=reduction,
                ignore_index=ignore_index)


nll_loss.onnx(lambda g, log_probs, target, *, ignore_index, reduction:
              _onnx_nll(g, log_probs, target, ignore_index, reduction))


@nll_loss.check
def _(*, reduction, **_):
    _check_reduction(reduction)


@nll_loss.grad
def _(target, dloss, log_probs_spec, *, ignore_index, reduction):
    num_classes = log_probs_spec.shape[_class_axis(len(log_probs_spec.shape))]
    return F.nll_loss_grad(dloss, target, num_classes=num_classes, ignore_index=ignore_index,
                           reduction=reduction), None


@op("nll_loss_grad(Tensor<floating> dloss, nograd Tensor<int32|int64> target, *, int num_classes, "
    "int ignore_index=-100, str reduction=\"mean\") -> Tensor dlog_probs")
def nll_loss_grad(dloss, target, *, num_classes, ignore_index, reduction):
    """Gradient of nll_loss: −dloss (÷ the count of valid targets for "mean") at each target class, 0 elsewhere."""
    _validate(nll_loss_grad, dloss, target, num_classes=num_classes, reduction=reduction)
    valid = _valid_targets("nll_loss_grad", target, num_classes, ignore_index)
    axis = _class_axis(target.ndim + 1)
    scale = -dloss / max(int(np.count_nonzero(valid)), 1) if reduction == "mean" else -dloss
    weights = np.where(valid, np.broadcast_to(scale, target.shape), 0)
    dx = np.zeros((*target.shape[:axis], num_classes, *target.shape[axis:]), dloss.dtype)
    index = np.expand_dims(np.where(valid, target, 0), axis)
    np.put_along_axis(dx, index, np.expand_dims(weights, axis).astype(dloss.dtype), axis)
    return dx


@nll_loss_grad.check
def _(*, num_classes, reduction, **_):
    _check_reduction(reduction)
    if num_classes < 1:
        raise ValueError(f"argument 'num_classes' must be >= 1, got {num_classes}")


@nll_loss_grad.infer
def _(dloss, target, *, num_classes, reduction, **_):
    want = target.shape if reduction == "none" else ()
    if not _same_dims(dloss.shape, want):
        raise ShapeError(f"nll_loss_grad(): with reduction={reduction!r} and a target of shape {target.shape}, "
                         f"dloss must have shape {want}, got {dloss.shape}")
    axis = _class_axis(len(target.shape) + 1)
    return Spec((*target.shape[:axis], num_classes, *target.shape[axis:]), dloss.dtype)


@nll_loss_grad.grad
def _(target, ddlog_probs, *, ignore_index, reduction):
    # nll_loss_grad is linear in dloss, and <ddx, nll_loss_grad(dloss)> = dloss·nll_loss(ddx) term by term:
    # its adjoint is nll_loss itself.
    return F.nll_loss(ddlog_probs, target, ignore_index=ignore_index, reduction=reduction), None


@op("cross_entropy(Tensor<floating> logits, nograd Tensor<int32|int64> target, *, int ignore_index=-100, "
    "str reduction=\"mean\", float label_smoothing=0.0) -> Tensor loss", infer=_loss_spec("cross_entropy"))
def cross_entropy(logits, target, *, ignore_index, reduction, label_smoothing):
    """nll_loss(log_softmax(logits)) with class-index targets; with label smoothing ε the target distribution is
    (1 − ε)·onehot + ε/C, so each valid term is (1 − ε)·(−log p[target]) + ε·mean_c(−log p[c])."""
    _validate(cross_entropy, logits, target, reduction=reduction)
    axis = _class_axis(logits.ndim)
    valid = _valid_targets("cross_entropy", target, logits.shape[axis], ignore_index)
    logp = _log_softmax_np(logits, (axis,))
    losses = -_picked(logp, target, valid)
    if label_smoothing:
        losses = losses * (1 - label_smoothing) - np.mean(logp, axis=axis) * label_smoothing
    return _reduce_losses(np.where(valid, losses, 0), valid, reduction)


@cross_entropy.onnx
def _(g, logits, target, *, ignore_index, reduction, label_smoothing):
    axis = _class_axis(logits.ndim)
    logp = g.op("LogSoftmax", logits, axis=axis)
    if not label_smoothing:
        return _onnx_nll(g, logp, target, ignore_index, reduction)
    # (1 − ε)·(−log p[target]) + ε·mean_c(−log p[c]) for each valid target, then reduced over the valid ones
    picked = _onnx_nll(g, logp, target, ignore_index, "none")
    valid = g.op("Not", g.op("Equal", g.cast(target, D.int64), g.const(np.array(ignore_index, np.int64))))
    smooth = g.op("Neg", g.reduce("ReduceMean", logp, [axis], False))
    losses = g.op("Add", g.op("Mul", picked, g.scalar(1 - label_smoothing, logits)),
                  g.op("Mul", smooth, g.scalar(label_smoothing, logits)))
    losses = g.op("Where", valid, losses, g.scalar(0, logits))
    if reduction == "none":
        return losses
    total = g.reduce("ReduceSum", losses, None, False)
    if reduction == "sum":
        return total
    return g.op("Div", total, g.reduce("ReduceSum", g.cast(valid, logits.dtype), None, False))


@cross_entropy.check
def _(*, reduction, label_smoothing, **_):
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"argument 'label_smoothing' must be in [0, 1], got {label_smoothing}")


@cross_entropy.grad
def _(logits, target, dloss, *, ignore_index, reduction, label_smoothing):
    # loss = nll_loss(logp) mixed with the smoothing term; as a function of logp the gradient g of the nll part is
    # nll_loss_grad, and the smoothing term spreads each row's weight Σ_c g evenly over the classes: mean_c g.
    # Then through logp = log_softmax(logits), recomputed here with ops so double backward reaches the logits.
    axis = _class_axis(logits.ndim)
    logp = F.log_softmax(logits, axis=axis)
    g = F.nll_loss_grad(dloss, target, num_classes=logits.shape[axis], ignore_index=ignore_index,
                        reduction=reduction)
    if label_smoothing:
        g = g * (1 - label_smoothing) + F.mean(g, axis=[axis], keepdim=True) * label_smoothing
    return F.log_softmax_grad(logp, g, axis=axis), None


def _class_target(rng, shape, num_classes, ignore=0):
    """Random class indices, the first ``ignore`` of them (in flat order) set to -100."""
    target = rng.integers(0, num_classes, shape).astype(np.int64)
    target.reshape(-1)[:ignore] = -100
    return target


@nll_loss.samples
def _(rng):
    def logp(*shape):
        return _log_softmax_np(rng.standard_normal(shape), (_class_axis(len(shape)),))

    yield Sample.of(logp(4, 5), _class_target(rng, 4, 5))
    yield Sample.of(logp(4, 5), _class_target(rng, 4, 5, ignore=1), reduction="sum")
    yield Sample.of(logp(2, 3, 4), _class_target(rng, (2, 4), 3, ignore=2), reduction="none")
    yield Sample.of(logp(2, 3, 2, 2), _class_target(rng, (2, 2, 2), 3), ignore_index=1)
    yield Sample.of(logp(5), _class_target(rng, (), 5))


@nll_loss_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal(()), _class_target(rng, 4, 5, ignore=1), num_classes=5)
    yield Sample.of(rng.standard_normal((2, 4)), _class_target(rng, (2, 4), 3, ignore=2), num_classes=3,
                    reduction="none")
    yield Sample.of(rng.standard_normal(()), _class_target(rng, (), 5), num_classes=5, reduction="sum")


@cross_entropy.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 5)), _class_target(rng, 4, 5))
    yield Sample.of(rng.standard_normal((4, 5)), _class_target(rng, 4, 5, ignore=1), reduction="sum",
                    label_smoothing=0.2)
    yield Sample.of(rng.standard_normal((2, 3, 4)), _class_target(rng, (2, 4), 3, ignore=2), reduction="none")
    yield Sample.of(rng.standard_normal((2, 3, 2, 2)), _class_target(rng, (2, 2, 2), 3, ignore=1),
                    label_smoothing=0.1)
    yield Sample.of(rng.standard_normal(5), _class_target(rng, (), 5), label_smoothing=0.3)


# -- regression and binary losses --------------------------------------------------------------------------------


@op("mse_loss(Tensor<floating> x, Tensor<floating> target, *, str reduction=\"mean\") -> Tensor loss")
def mse_loss(x, target, *, reduction):
    """(x − target)², elementwise (shapes broadcast), then the mean, the sum, or nothing ("none")."""
    d = x - target
    d = d * d
    return d if reduction == "none" else np.asarray(np.mean(d) if reduction == "mean" else np.sum(d))


@mse_loss.onnx
def _(g, x, target, *, reduction):
    dtype = g.outputs[0].dtype
    d = g.op("Sub", g.cast(x, dtype), g.cast(target, dtype))
    d = g.op("Mul", d, d)
    return d if reduction == "none" else g.reduce("ReduceMean" if reduction == "mean" else "ReduceSum", d, None, False)


@mse_loss.check
def _(*, reduction):
    _check_reduction(reduction)


@mse_loss.infer
def _(x, target, *, reduction):
    shape = broadcast_shapes(x.shape, target.shape, op="mse_loss")
    return Spec(shape if reduction == "none" else (), D.promote(x.dtype, target.dtype))


@mse_loss.grad
def _(x, target, dloss, *, reduction):
    shape = broadcast_shapes(x.shape, target.shape)
    g = (x - target) * dloss * (2.0 / max(_numel(shape), 1) if reduction == "mean" else 2.0)
    return g, -g  # the engine sums each down to its input's shape


@mse_loss.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal(4), reduction="sum")
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), reduction="none")
    yield Sample.of(rng.standard_normal(()), rng.standard_normal(()))


@op("binary_cross_entropy_with_logits(Tensor<floating> logits, Tensor<floating> target, "
    "Tensor<floating>? pos_weight=None, *, str reduction=\"mean\") -> Tensor loss")
def binary_cross_entropy_with_logits(logits, target, pos_weight, *, reduction):
    """−[w·y·log σ(x) + (1 − y)·log(1 − σ(x))] with w = pos_weight (1 if absent), computed without overflow as
    (1 − y)·x + (1 + (w − 1)·y)·softplus(−x), softplus(z) = log(1 + eᶻ); then reduced."""
    _validate(binary_cross_entropy_with_logits, logits, target, pos_weight, reduction=reduction)
    sp = np.logaddexp(0, -logits)  # softplus(−x) = −log σ(x)
    coef = 1 + (pos_weight - 1) * target if pos_weight is not None else 1
    losses = ((1 - target) * logits + coef * sp).astype(logits.dtype, copy=False)
    if reduction == "none":
        return losses
    return np.asarray(np.mean(losses) if reduction == "mean" else np.sum(losses))


@binary_cross_entropy_with_logits.onnx
def _(g, logits, target, pos_weight, *, reduction):
    x, y = logits, g.cast(target, logits.dtype)
    # softplus(−x) = max(−x, 0) + ln(1 + e^−|x|): no overflow
    sp = g.op("Add", g.op("Relu", g.op("Neg", x)), g.call("log1p", g.op("Exp", g.op("Neg", g.op("Abs", x)))))
    coef = sp if pos_weight is None else g.op("Mul", sp, g.op("Add", g.scalar(1, x), g.op(
        "Mul", g.op("Sub", g.cast(pos_weight, x.dtype), g.scalar(1, x)), y)))
    losses = g.op("Add", g.op("Mul", g.op("Sub", g.scalar(1, x), y), x), coef)
    if reduction == "none":
        return losses
    return g.reduce("ReduceMean" if reduction == "mean" else "ReduceSum", losses, None, False)


@binary_cross_entropy_with_logits.check
def _(*, reduction):
    _check_reduction(reduction)


@binary_cross_entropy_with_logits.infer
def _(logits, target, pos_weight, *, reduction):
    if not _same_dims(logits.shape, target.shape):
        raise ShapeError(f"binary_cross_entropy_with_logits(): target must have the shape of logits {logits.shape}, "
                         f"got {target.shape}")
    if pos_weight is not None and not _broadcasts_to(pos_weight.shape, logits.shape):
        raise ShapeError(f"binary_cross_entropy_with_logits(): pos_weight of shape {pos_weight.shape} must "
                         f"broadcast to the shape of logits {logits.shape}")
    return Spec(logits.shape if reduction == "none" else (), logits.dtype)


@binary_cross_entropy_with_logits.grad
def _(logits, target, pos_weight, dloss, *, reduction, needs_input_grad):
    if reduction == "mean":
        dloss = dloss * (1.0 / max(_numel(logits.shape), 1))
    # ∂/∂x = (1 − y) + (1 + (w − 1)·y)·(σ(x) − 1), which is σ(x) − y when w = 1;
    # ∂/∂y = −x + (w − 1)·softplus(−x);  ∂/∂w = y·softplus(−x).
    s = F.sigmoid(logits)
    if pos_weight is None:
        dx = (s - target) * dloss if needs_input_grad[0] else None
        dy = -logits * dloss if needs_input_grad[1] else None
        return dx, dy, None
    coef = (pos_weight - 1.0) * target + 1.0
    dx = ((s - 1.0) * coef - target + 1.0) * dloss if needs_input_grad[0] else None
    # softplus(−x), exact (no linear piece past a threshold, unlike torch's default): its derivative is σ(x) − 1.
    sp = F.softplus(-logits, threshold=math.inf) if needs_input_grad[1] or needs_input_grad[2] else None
    dy = ((pos_weight - 1.0) * sp - logits) * dloss if needs_input_grad[1] else None
    dw = target * sp * dloss if needs_input_grad[2] else None
    return dx, dy, dw


@binary_cross_entropy_with_logits.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)) * 3, rng.uniform(0, 1, (3, 4)))
    yield Sample.of(rng.standard_normal((3, 4)), rng.uniform(0, 1, (3, 4)), rng.uniform(0.5, 2, 4), reduction="sum")
    yield Sample.of(rng.standard_normal((2, 3)), rng.uniform(0, 1, (2, 3)), reduction="none")
    yield Sample.of(rng.standard_normal(()), rng.uniform(0, 1, ()), rng.uniform(0.5, 2, ()))


# -- dropout ---------------------------------------------------------------------------------------------------


def _dropout_scale(p: float, training: bool) -> float:
    if not training:
        return 1.0
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)


@op("dropout(Tensor<floating> x, *, float p=0.5, bool training=True) -> (Tensor y, Tensor<bool> mask)",
    traits=["random"])
def dropout(x, *, p, training, rng):
    """Zeroes each element with probability ``p`` and scales the kept ones by 1/(1 − p) (identity when not
    ``training``). Also returns the boolean ``mask`` of kept elements.

    The mask is an output so that backward uses exactly the mask of the forward pass: the gradient rule reads it
    (dx = dy·mask/(1 − p)) instead of drawing again, and no hidden state ties a backward to its forward. It is
    boolean, so it never carries a gradient itself. Draws come from the seeded generator: ``of.manual_seed``
    reproduces them. Nothing is drawn when the op is the identity (not training, or p = 0).
    """
    if not training or p == 0.0:
        return x.copy(), np.ones(x.shape, np.bool_)
    keep = rng.random(x.shape) >= p
    return np.where(keep, x * _dropout_scale(p, training), 0).astype(x.dtype, copy=False), keep


@dropout.onnx
def _(g, x, *, p, training):
    if not training or p == 0.0:
        return g.op("Identity", x), g.filled(g.op("Shape", x), True, D.bool_)
    y, mask = g.op("Dropout", x, g.scalar(p, x), g.const(np.array(True)), outputs=2)
    return y, mask


@dropout.check
def _(*, p, training):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"argument 'p' must be a probability in [0, 1], got {p}")


@dropout.infer
def _(x, *, p, training):
    return Spec(x.shape, x.dtype), Spec(x.shape, D.bool_)


@dropout.grad
def _(mask, dy, *, p, training):
    return F.where(mask, dy * _dropout_scale(p, training), 0.0)


@dropout.samples
def _(rng):
    # Numeric gradient checks call the op again and again: only calls that draw nothing give them a fixed mask.
    # tests/test_oracle_nn.py checks p > 0 (the same mask in backward, reproducibility with of.manual_seed).
    yield Sample.of(rng.standard_normal((3, 4)), p=0.5, training=False)
    yield Sample.of(rng.standard_normal(5), p=0.0)
    yield Sample.of(rng.standard_normal(()), training=False)


# -- embedding -------------------------------------------------------------------------------------------------


def _check_indices(op_name, index, n):
    if index.size and (index.min() < 0 or index.max() >= n):
        bad = index[(index < 0) | (index >= n)].flat[0]
        raise ArgumentError(f"{op_name}(): index holds {int(bad)}, outside [0, {n}) (the rows of the weight)")


def _padding_row(op_name, padding_idx, n):
    if padding_idx is None:
        return None
    if n is not None and not -n <= padding_idx < n:
        raise ShapeError(f"{op_name}(): padding_idx {padding_idx} is out of range for {n} embeddings")
    return padding_idx % n if n else padding_idx


@op("embedding(nograd Tensor<int32|int64> index, Tensor<floating> weight, *, int? padding_idx=None) -> Tensor y")
def embedding(index, weight, *, padding_idx):
    """Rows of ``weight`` (num_embeddings, D) picked by ``index``: y[..., :] = weight[index[...]]. The row
    ``padding_idx`` (if given) is looked up as any other but gets no gradient."""
    _validate(embedding, index, weight, padding_idx=padding_idx)
    _check_indices("embedding", index, weight.shape[0])
    return weight[index]


embedding.onnx(lambda g, index, weight, *, padding_idx: g.op("Gather", weight, index, axis=0, spec=g.outputs[0]))


@embedding.infer
def _(index, weight, *, padding_idx):
    if len(weight.shape) != 2:
        raise ShapeError(f"embedding(): weight must be 2-D (num_embeddings, embedding_dim), got shape {weight.shape}")
    _padding_row("embedding", padding_idx, weight.shape[0])
    return Spec((*index.shape, weight.shape[1]), weight.dtype)


@embedding.grad
def _(index, dy, weight_spec, *, padding_idx):
    return None, F.embedding_grad(dy, index, num_embeddings=weight_spec.shape[0], padding_idx=padding_idx)


@op("embedding_grad(Tensor<floating> dy, nograd Tensor<int32|int64> index, *, int num_embeddings, "
    "int? padding_idx=None) -> Tensor dweight")
def embedding_grad(dy, index, *, num_embeddings, padding_idx):
    """Gradient of embedding with respect to the weight: each dy[...] is added to row index[...] (rows picked
    several times add up); the padding row stays 0."""
    _validate(embedding_grad, dy, index, num_embeddings=num_embeddings, padding_idx=padding_idx)
    _check_indices("embedding_grad", index, num_embeddings)
    dw = np.zeros((num_embeddings, dy.shape[-1]), dy.dtype)
    np.add.at(dw, index.reshape(-1), dy.reshape(index.size, dy.shape[-1]))  # (not -1: rows of 0 elements)
    if padding_idx is not None:
        dw[padding_idx % num_embeddings] = 0
    return dw


@embedding_grad.infer
def _(dy, index, *, num_embeddings, padding_idx):
    if len(dy.shape) != len(index.shape) + 1 or not _same_dims(dy.shape[:-1], index.shape):
        raise ShapeError(f"embedding_grad(): dy must have shape index.shape + (embedding_dim,) = "
                         f"{index.shape} + (D,), got {dy.shape}")
    if num_embeddings < 1:
        raise ShapeError(f"embedding_grad(): num_embeddings must be >= 1, got {num_embeddings}")
    _padding_row("embedding_grad", padding_idx, num_embeddings)
    return Spec((num_embeddings, dy.shape[-1]), dy.dtype)


@embedding_grad.grad
def _(index, ddweight, *, padding_idx):
    # embedding_grad is linear in dy; its adjoint looks the rows up again, except at the padding row.
    ddy = F.embedding(index, ddweight)
    if padding_idx is not None:
        pad = padding_idx % ddweight.shape[0]
        ddy = F.where(F.reshape(index != pad, shape=[*index.shape, 1]), ddy, 0.0)
    return {"dy": ddy}


@embedding.samples
def _(rng):
    # The padding row's gradient is 0 by definition, not by derivative: numeric checks can only see samples that
    # do not look it up. tests/test_oracle_nn.py checks lookups of it against torch.
    yield Sample.of(np.array([[0, 2, 0], [4, 1, 2]]), rng.standard_normal((5, 3)))
    yield Sample.of(np.array([2, 3, 2, 0]), rng.standard_normal((4, 2)), padding_idx=1)
    yield Sample.of(np.array(2), rng.standard_normal((3, 4)), padding_idx=-3)  # -3: row 0 of 3


@embedding_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 3)), np.array([[0, 2, 0], [4, 1, 2]]), num_embeddings=5)
    yield Sample.of(rng.standard_normal((4, 2)), np.array([1, 3, 1, 0]), num_embeddings=4, padding_idx=1)


# -- attention -------------------------------------------------------------------------------------------------


def _attention_scale(e, scale):
    return 1.0 / math.sqrt(e) if scale is None else scale


def _attention_np(q, k, v, attn_mask, is_causal, scale):
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    allowed = None
    if attn_mask is not None and attn_mask.dtype == np.bool_:
        allowed = attn_mask
    elif attn_mask is not None:
        s = s + attn_mask
    if is_causal:
        allowed = np.tril(np.ones(s.shape[-2:], np.bool_))
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    # A "safe" softmax, as torch's: a row where every score is −inf attends to nothing and gives zeros.
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
    alive = m > -np.inf
    e = np.exp(s - np.where(alive, m, 0))
    return np.matmul(e / np.where(alive, np.sum(e, axis=-1, keepdims=True), 1), v)


def _attention_probs(q, k, attn_mask, is_causal, scale):
    """The attention weights with ops, as the kernel computes them."""
    s = F.matmul(q, _swap_last(k)) * scale
    if attn_mask is not None and attn_mask.dtype != D.bool_:
        s = s + attn_mask
    if is_causal:  # row i attends to columns j <= i (top-left aligned, as torch): never a row of nothing
        rows = F.reshape(F.arange(start=0, stop=q.shape[-2], dtype="int64"), shape=[q.shape[-2], 1])
        allowed = rows >= F.arange(start=0, stop=k.shape[-2], dtype="int64")
        return F.softmax(F.where(allowed, s, -math.inf), axis=-1)
    if attn_mask is None:
        return F.softmax(s, axis=-1)
    if attn_mask.dtype == D.bool_:
        s = F.where(attn_mask, s, -math.inf)
    # Rows with no finite score get zeros; their scores are replaced by 0 before softmax so nothing is NaN, in the
    # value or in any derivative.
    alive = F.sum(F.cast(s > -math.inf, dtype=s.dtype), axis=[-1], keepdim=True) > 0
    return F.where(alive, F.softmax(F.where(alive, s, 0.0), axis=-1), 0.0)


@op("scaled_dot_product_attention(Tensor<floating> q, Tensor<floating> k, Tensor<floating> v, "
    "Tensor? attn_mask=None, *, bool is_causal=False, float? scale=None) -> Tensor out")
def scaled_dot_product_attention(q, k, v, attn_mask, *, is_causal, scale):
    """softmax(q·kᵀ·scale + mask)·v for q (..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev); batch dims
    broadcast. ``scale`` defaults to 1/√E. ``attn_mask`` (broadcast to (..., L, S)) is boolean (True: may attend)
    or added to the scores; ``is_causal`` lets query i attend to keys j <= i. A query that may attend to nothing
    gets zeros, as in torch."""
    _validate(scaled_dot_product_attention, q, k, v, attn_mask, is_causal=is_causal, scale=scale)
    out = _attention_np(q, k, v, attn_mask, is_causal, _attention_scale(q.shape[-1], scale))
    return out.astype(np.result_type(q, k, v), copy=False)


@scaled_dot_product_attention.onnx
def _(g, q, k, v, attn_mask, *, is_causal, scale):
    dtype = g.outputs[0].dtype
    q, k, v = (g.cast(t, dtype) for t in (q, k, v))
    swap = [*range(k.ndim - 2), k.ndim - 1, k.ndim - 2]
    scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=swap)),
                  g.scalar(_attention_scale(q.shape[-1], scale), q))
    minus_inf = g.scalar(-np.inf, q)
    if attn_mask is not None and attn_mask.dtype == D.bool_:
        scores = g.op("Where", attn_mask, scores, minus_inf)
    elif attn_mask is not None:
        scores = g.op("Add", scores, g.cast(attn_mask, dtype))
    if is_causal:  # query i sees keys j <= i: rows (L, 1) >= columns (S,), sizes read from the shapes
        def positions(t):
            size = g.op("Squeeze", g.op("Shape", t, start=-2, end=-1), g.ints([0]))
            return g.op("Range", g.const(np.array(0, np.int64)), size, g.const(np.array(1, np.int64)))

        rows = g.op("Unsqueeze", positions(q), g.ints([1]))
        scores = g.op("Where", g.op("GreaterOrEqual", rows, positions(k)), scores, minus_inf)
    probs = g.op("Softmax", scores, axis=-1)
    probs = g.op("Where", g.op("IsNaN", probs), g.scalar(0, q), probs)  # a query that sees nothing gets zeros
    return g.op("MatMul", probs, v)


@scaled_dot_product_attention.infer
def _(q, k, v, attn_mask, *, is_causal, scale):
    name = "scaled_dot_product_attention()"
    if min(len(q.shape), len(k.shape), len(v.shape)) < 2:
        raise ShapeError(f"{name}: q, k and v need at least 2 dims (..., L, E), got shapes {q.shape}, {k.shape}, "
                         f"{v.shape}")
    if not _same_dims(q.shape[-1:], k.shape[-1:]) or not _same_dims(k.shape[-2:-1], v.shape[-2:-1]):
        raise ShapeError(f"{name}: q (..., L, E), k (..., S, E) and v (..., S, Ev) do not fit: got shapes {q.shape}, "
                         f"{k.shape}, {v.shape}")
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], op="scaled_dot_product_attention")
    scores = (*batch, q.shape[-2], k.shape[-2])
    if attn_mask is not None:
        if is_causal:
            raise ArgumentError(f"{name}: give attn_mask or is_causal=True, not both")
        if attn_mask.dtype != D.bool_ and not D.is_floating(attn_mask.dtype):
            raise ArgumentError(f"{name}: argument 'attn_mask' must be bool or floating, got {attn_mask.dtype}")
        if not _broadcasts_to(attn_mask.shape, scores):
            raise ShapeError(f"{name}: attn_mask of shape {attn_mask.shape} must broadcast to the scores' shape "
                             f"{scores}")
    return Spec((*batch, q.shape[-2], v.shape[-1]), D.promote(q.dtype, k.dtype, v.dtype))


@scaled_dot_product_attention.grad
def _(q, k, v, attn_mask, dout, *, is_causal, scale, needs_input_grad):
    # out = P·v with P = softmax(S), S = q·kᵀ·scale (+ mask): dv = Pᵀ·dout, dP = dout·vᵀ, dS = softmax_grad(P, dP),
    # dq = dS·k·scale, dk = dSᵀ·q·scale, d(additive mask) = dS. The engine sums broadcast batch dims down.
    scale = _attention_scale(q.shape[-1], scale)
    p = _attention_probs(q, k, attn_mask, is_causal, scale)
    dp = F.matmul(dout, _swap_last(v))
    if tuple(p.shape) != tuple(dp.shape):  # v has batch dims q and k lack: P broadcasts to them in the forward
        p = F.broadcast_to(p, shape=dp.shape)
    ds = F.softmax_grad(p, dp, axis=-1)
    dq = F.matmul(ds, k) * scale if needs_input_grad[0] else None
    dk = F.matmul(_swap_last(ds), q) * scale if needs_input_grad[1] else None
    dv = F.matmul(_swap_last(p), dout) if needs_input_grad[2] else None
    return dq, dk, dv, ds if needs_input_grad[3] else None


@scaled_dot_product_attention.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2)))
    yield Sample.of(rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)),
                    is_causal=True, scale=0.7)
    yield Sample.of(rng.standard_normal((2, 1, 3, 2)), rng.standard_normal((2, 2, 4, 2)),
                    rng.standard_normal((2, 4, 2)), rng.standard_normal((3, 4)))  # broadcast batch, additive mask
    mask = np.array([[True, False, True, True], [False, False, False, False], [True, True, False, True]])
    yield Sample.of(rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)), mask)
