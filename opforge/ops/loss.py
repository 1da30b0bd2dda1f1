"""Losses, as ``torch.nn.functional`` defines them, reduced by ``reduction``: "mean" (the default), "sum" or
"none" (one loss per element, or per sample for the class and embedding losses; kl_div also takes "batchmean").

Kernels compute with NumPy; gradient rules are written with ops, so every loss can be differentiated twice. The
elementwise losses need nothing more. The class-index losses have dedicated grad ops, each with a gradient of its
own: ``nll_loss_grad`` (a scatter) and ``cross_entropy_grad``, which makes (softmax − target)·dloss in one pass over
the logits, in place, where log_softmax's and nll_loss's gradients in turn would take seven passes and three
temporaries.
"""

import math

from opforge import ops as F

from ..core.errors import ArgumentError
from ..core.sbp import Decomposition
from ..core.spec import Dim
from ._common import (
    B,
    D,
    P,
    S,
    Sample,
    ShapeError,
    Spec,
    broadcast_shapes,
    function,
    max_last,
    np,
    op,
    row_buffers,
    row_width,
)
from .nn import _broadcasts_to, _exp_sums, _log_softmax_np, _same_dims, _sum, _validate
from .reduce import norm_grad_rule, vector_norm

# -- reductions ------------------------------------------------------------------------------------------------

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str, allowed: tuple = _REDUCTIONS) -> None:
    if reduction not in allowed:
        names = ", ".join(map(repr, allowed[:-1]))
        raise ValueError(f"argument 'reduction' must be {names} or {allowed[-1]!r}, got {reduction!r}")


def _reduce(losses, reduction: str):
    """A kernel's unreduced losses, reduced. The mean of no losses is nan, as in torch."""
    if reduction == "none":
        return losses
    total = np.add.reduce(losses, axis=None)  # a NumPy scalar on the host: dispatch makes it a 0-d array
    if reduction == "sum":
        return total
    return _divide(total, losses.size)


def _divide(total, count):
    """total / count (a NumPy scalar on the host, which dispatch makes a 0-d array); 0/0 is nan (as in torch),
    without NumPy's warning. A count on a device is not read to choose."""
    if isinstance(count, (int, np.generic)) and count:
        return total / count
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count


def _spread(dloss, reduction: str, shape: tuple, batch: tuple | None = None):
    """The gradient of the reduced loss with respect to each unreduced loss (of ``shape``), as a factor that
    broadcasts against them: dloss itself for "none" and "sum"; for "mean" dloss over the number of losses, for
    "batchmean" over the size of ``batch`` (the first input's first dim). When that number is known only at run
    time (a batch dim in a program), mean_grad divides by it then."""
    if reduction in ("none", "sum"):
        return dloss
    counted = tuple(shape) if reduction == "mean" else tuple(batch)
    if all(isinstance(d, int) for d in counted):
        return dloss * (1.0 / max(math.prod(counted), 1))
    return F.mean_grad(dloss, shape=[*counted, *[1] * (len(shape) - len(counted))])


def _loss_shape(*tensors) -> tuple:
    """The shape the tensors broadcast to. In a program a dim may be known only at run time (a Dim): per axis, a
    known size other than 1 wins, else the first run-time dim (run-time dims that broadcast are taken as equal)."""
    shapes = [tuple(t.shape) for t in tensors if t is not None]
    if all(s == shapes[0] for s in shapes):
        return shapes[0]
    if not any(isinstance(d, Dim) for s in shapes for d in s):
        return broadcast_shapes(*shapes)
    out = []
    for i in range(-max(map(len, shapes)), 0):
        dims = [s[i] for s in shapes if len(s) >= -i]
        known = [d for d in dims if isinstance(d, int) and d != 1]
        out.append(known[0] if known else next((d for d in dims if isinstance(d, Dim)), 1))
    return tuple(out)


def _into(out, result):
    """A kernel's result in the buffer the executor handed it (when it did)."""
    if out is None or result is out:
        return result
    out[...] = result
    return out


def _elementwise_loss_spec(op_name: str, reductions: tuple = _REDUCTIONS):
    """The shape rule of a loss whose inputs broadcast together into one loss per element."""

    def infer(*inputs, reduction, **_):
        specs = [s for s in inputs if s is not None]
        shape = broadcast_shapes(*(s.shape for s in specs), op=op_name)
        return Spec(shape if reduction == "none" else (), D.promote(*(s.dtype for s in specs)))

    return infer


def _check_reduction_attr(*, reduction, **_):
    _check_reduction(reduction)


# -- class-index losses: nll_loss and cross_entropy -------------------------------------------------------------
# Layout as torch: scores (C,) with a 0-d target, or (N, C, d1, ...) with a target (N, d1, ...); the class axis is 1
# (0 for 1-D scores). Kernels work on rows (M, C), the class axis last. A target equal to ignore_index adds nothing;
# a class weight w scales each sample's loss by w[target], and "mean" divides by the sum of those weights (the count
# of counted targets without weights). Every target ignored: "mean" is 0/0 = nan, and the gradient 0, as torch's.
# Class weights are constants, as in torch: nograd inputs, and the rules that read them detach them.


def _class_axis(ndim: int) -> int:
    return 1 if ndim > 1 else 0


def _rows(x):
    """Scores as rows (M, C) with the classes last: x itself for (N, C), a view for (C,), a copy for (N, C, d...)."""
    if x.ndim == 2:
        return x
    if x.ndim == 1:
        return x.reshape(1, -1)
    return np.moveaxis(x, 1, -1).reshape(-1, x.shape[1])


def _unrows(rows, shape: tuple):
    """The inverse of _rows, for an array of the scores' shape."""
    if len(shape) == 2:
        return rows
    if len(shape) == 1:
        return rows.reshape(shape)
    return np.ascontiguousarray(np.moveaxis(rows.reshape(shape[0], *shape[2:], shape[1]), -1, 1), like=rows)


def _scores_shape(target_shape: tuple, num_classes) -> tuple:
    axis = _class_axis(len(target_shape) + 1)
    return (*target_shape[:axis], num_classes, *target_shape[axis:])


def _targets(op_name: str, target, num_classes: int, ignore_index: int, read: bool = True):
    """Flat class indices and the mask of those that count (None when all do; the others then read class 0). An
    index out of range that is not ignore_index is an error naming the op, as in torch.

    On a device, the checks' answers come back in one read (each read stalls it); with ``read=False`` (a gradient,
    whose forward pass checked the same targets) nothing is read: out-of-range targets count as ignored."""
    t = target.reshape(-1)
    if type(t) is not np.ndarray and not read:
        valid = (t != ignore_index) & (t >= 0) & (t < num_classes)
        return np.where(valid, t, 0), valid
    if type(t) is not np.ndarray:
        valid = t != ignore_index
        bad = valid & ((t < 0) | (t >= num_classes))
        any_bad, some_ignored = np.stack([bad.any(), ~valid.all()]).tolist() if t.size else (False, False)
        if any_bad:
            raise ArgumentError(f"{op_name}(): target holds class {int(t[bad][0])}, outside [0, {num_classes}) and "
                                f"not ignore_index ({ignore_index})")
        return (np.where(valid, t, 0), valid) if some_ignored else (t, None)
    # 0 <= t < num_classes for all t, in one reduce: read as unsigned, a negative index is larger than any class
    if not t.size or (np.maximum.reduce(t.view(f"u{t.itemsize}")) < num_classes
                      and not 0 <= ignore_index < num_classes):
        return t, None
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= num_classes))
    if bad.any():
        raise ArgumentError(f"{op_name}(): target holds class {int(t[bad][0])}, outside [0, {num_classes}) and not "
                            f"ignore_index ({ignore_index})")
    return (t, None) if valid.all() else (np.where(valid, t, 0), valid)


def _row_weights(t, valid, weight, dtype):
    """Each row's weight w[target] (0 where ignored), or None when every row weighs 1."""
    if weight is None:
        return None if valid is None else valid.astype(dtype)
    w = weight[t]
    return w if valid is None else np.where(valid, w, 0)


def _row_scale(dloss, rows: int, row_weights, valid, reduction: str):
    """dL/dloss_n for each row n (or one number for all), before the class weight: dloss, or for "mean" dloss
    over the sum of the row weights; 0 in ignored rows (where the sum is 0, torch's gradient is 0 too)."""
    if reduction == "none":
        s = dloss.reshape(-1)
    elif reduction == "sum":
        s = dloss
    else:
        s = _divide(dloss, rows if row_weights is None else np.add.reduce(row_weights))
    return s if valid is None else np.where(valid, s, 0)


def _reduce_rows(losses, row_weights, rows: int, reduction: str):
    if reduction == "none":
        return losses
    total = np.add.reduce(losses, axis=None)  # a NumPy scalar on the host: dispatch makes it a 0-d array
    if reduction == "sum":
        return total
    return _divide(total, rows if row_weights is None else np.add.reduce(row_weights))


def _class_loss_spec(op_name: str):
    def infer(scores, target, weight, *, reduction, ignore_index=-100, **_):
        if not scores.shape:
            raise ShapeError(f"{op_name}(): scores need a class dim, got a 0-d tensor")
        axis = _class_axis(len(scores.shape))
        samples = scores.shape[:axis] + scores.shape[axis + 1:]
        if D.is_floating(target.dtype):  # cross_entropy's probability targets
            if not _same_dims(scores.shape, target.shape):
                raise ShapeError(f"{op_name}(): probability targets (floating) must have the shape of the scores "
                                 f"{scores.shape}, got {target.shape}")
            if ignore_index >= 0:
                raise ArgumentError(f"{op_name}(): ignore_index ({ignore_index}) is not supported for probability "
                                    "targets (floating)")
        elif not _same_dims(samples, target.shape):
            raise ShapeError(f"{op_name}(): scores of shape {scores.shape} need a target of shape {samples} "
                             f"(the class dim {axis} removed), got {target.shape}")
        _check_class_weight(op_name, weight, scores.shape[axis])
        return Spec(samples if reduction == "none" else (), scores.dtype)

    return infer


def _check_class_weight(op_name: str, weight, num_classes) -> None:
    if weight is not None and not _same_dims(weight.shape, (num_classes,)):
        raise ShapeError(f"{op_name}(): weight must hold one value per class, shape ({num_classes},), got "
                         f"{weight.shape}")


def _check_class_call(opdef, scores, target, weight, attrs: dict, soft: bool = False) -> None:
    """The shape checks of the op's rule, run only when a cheap look says they would fail (kernels run often)."""
    axis = _class_axis(scores.ndim)
    if (scores.ndim == 0 or target.shape != (scores.shape if soft else scores.shape[:axis] + scores.shape[axis + 1:])
            or (weight is not None and weight.shape != scores.shape[axis:axis + 1])
            or (soft and attrs.get("ignore_index", -1) >= 0)):
        _validate(opdef, scores, target, weight, **attrs)


@op("nll_loss(Tensor<floating> log_probs, nograd Tensor<int32|int64> target, nograd Tensor<floating>? weight=None, "
    "*, int ignore_index=-100, str reduction=\"mean\") -> Tensor loss", infer=_class_loss_spec("nll_loss"))
def nll_loss(log_probs, target, weight, *, ignore_index, reduction):
    """Negative log-likelihood of class-index targets: −weight[target[n]]·log_probs[n, target[n]], reduced.

    ``weight`` (one value per class) gets no gradient, as in torch: it also sets the denominator of "mean".
    """
    _check_class_call(nll_loss, log_probs, target, weight, {"reduction": reduction})
    x = _rows(log_probs)
    t, valid = _targets("nll_loss", target, x.shape[1], ignore_index)
    rw = _row_weights(t, valid, None if weight is None else weight.astype(x.dtype, copy=False), x.dtype)
    losses = -x[np.arange(len(t), like=x), t]
    if weight is not None:
        losses *= rw
    if valid is not None:  # not a product: an ignored −inf must not make a nan
        losses = np.where(valid, losses, 0).astype(x.dtype, copy=False)
    return _reduce_rows(losses.reshape(target.shape), rw, len(t), reduction)


def _onnx_nll(g, log_probs, target, weight, ignore_index, reduction):
    target = g.cast(target, D.int64)
    extra = () if weight is None else (g.cast(weight, log_probs.dtype),)
    if log_probs.ndim == 1:  # ONNX wants a batch dim: (C,) and a 0-d target become (1, C) and (1,)
        log_probs = g.op("Unsqueeze", log_probs, g.ints([0]), spec=Spec((1, *log_probs.shape), log_probs.dtype))
        loss = g.op("NegativeLogLikelihoodLoss", log_probs, g.op("Unsqueeze", target, g.ints([0])), *extra,
                    reduction=reduction, ignore_index=ignore_index)
        return g.op("Squeeze", loss, g.ints([0])) if reduction == "none" else loss
    return g.op("NegativeLogLikelihoodLoss", log_probs, target, *extra, reduction=reduction,
                ignore_index=ignore_index)


nll_loss.onnx(lambda g, log_probs, target, weight, *, ignore_index, reduction:
              _onnx_nll(g, log_probs, target, weight, ignore_index, reduction))


nll_loss.check(_check_reduction_attr)


@nll_loss.grad
def _(target, weight, dloss, log_probs_spec, *, ignore_index, reduction):
    num_classes = log_probs_spec.shape[_class_axis(len(log_probs_spec.shape))]
    return F.nll_loss_grad(dloss, target, weight, num_classes=num_classes, ignore_index=ignore_index,
                           reduction=reduction), None, None


@op("nll_loss_grad(Tensor<floating> dloss, nograd Tensor<int32|int64> target, nograd Tensor<floating>? weight=None, "
    "*, int num_classes, int ignore_index=-100, str reduction=\"mean\") -> Tensor dlog_probs")
def nll_loss_grad(dloss, target, weight, *, num_classes, ignore_index, reduction):
    """Gradient of nll_loss: −dloss·weight[target] (÷ the sum of the counted weights for "mean") at each target
    class, 0 elsewhere."""
    if dloss.shape != (target.shape if reduction == "none" else ()) or (
            weight is not None and weight.shape != (num_classes,)):  # (the rule's checks, run only when they fail)
        _validate(nll_loss_grad, dloss, target, weight, num_classes=num_classes, reduction=reduction)
    t, valid = _targets("nll_loss_grad", target, num_classes, ignore_index)
    rw = _row_weights(t, valid, None if weight is None else weight.astype(dloss.dtype, copy=False), dloss.dtype)
    s = _row_scale(dloss, len(t), rw, valid, reduction)
    dx = np.zeros((len(t), num_classes), dloss.dtype, like=dloss)
    dx[np.arange(len(t), like=dx), t] = -(s if weight is None else s * rw)
    return _unrows(dx, _scores_shape(target.shape, num_classes))


@nll_loss_grad.check
def _(*, num_classes, reduction, **_):
    _check_reduction(reduction)
    if num_classes < 1:
        raise ValueError(f"argument 'num_classes' must be >= 1, got {num_classes}")


@nll_loss_grad.infer
def _(dloss, target, weight, *, num_classes, reduction, **_):
    want = target.shape if reduction == "none" else ()
    if not _same_dims(dloss.shape, want):
        raise ShapeError(f"nll_loss_grad(): with reduction={reduction!r} and a target of shape {target.shape}, "
                         f"dloss must have shape {want}, got {dloss.shape}")
    _check_class_weight("nll_loss_grad", weight, num_classes)
    return Spec(_scores_shape(target.shape, num_classes), dloss.dtype)


@nll_loss_grad.grad
def _(target, weight, ddlog_probs, *, ignore_index, reduction):
    # nll_loss_grad is linear in dloss, and <ddx, nll_loss_grad(dloss)> = dloss·nll_loss(ddx) term by term, "mean"'s
    # denominator included: its adjoint is nll_loss itself.
    return F.nll_loss(ddlog_probs, target, weight, ignore_index=ignore_index, reduction=reduction), None, None


def _minus_log_softmax_at(x, t, e, sums, c):
    """−log softmax(x)[n, t[n]] from e = exp(x − c) and its row sums: log(Σ e / e[t]), a ratio of at least 1, so
    nothing cancels however large the logits (log Σ e − (x[t] − c) would lose digits to the size of x[t] when c is
    0). Where e[t] is under the smallest normal number the loss is large (over 87 in float32), and that difference
    is exact enough; the ratio's e[t] would not be. So where the ratio overflows (e[t] = exp(−74), Σ e = exp(60) in
    float32: the loss is 134, not inf)."""
    rows = np.arange(len(t), like=e)
    e_t = e[rows, t]
    tiny = np.finfo(e.dtype).tiny
    with np.errstate(over="ignore", divide="ignore"):  # (those rows take the other form below)
        ratio = sums / e_t
    if type(e) is np.ndarray and np.minimum.reduce(e_t, initial=np.inf) >= tiny and \
            np.maximum.reduce(ratio, initial=0) < np.inf:  # (on a device, no read to choose: the general form)
        return np.log(ratio)
    z_t = x[rows, t] if c is None else x[rows, t] - c[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((e_t >= tiny) & (ratio < np.inf), np.log(ratio), np.log(sums) - z_t)


@op("cross_entropy(Tensor<floating> logits, Tensor<number> target, nograd Tensor<floating>? weight=None, *, "
    "int ignore_index=-100, str reduction=\"mean\", float label_smoothing=0.0) -> Tensor loss",
    infer=_class_loss_spec("cross_entropy"), saves=("exp_rows", "row_sums"))
def cross_entropy(logits, target, weight, *, ignore_index, reduction, label_smoothing, save=None):
    """Cross entropy of logits against class indices (integer targets) or class probabilities (floating targets of
    the logits' shape), as torch: −Σ_c w_c·q_c·log softmax(logits)_c per sample, where q is the target with label
    smoothing ε — (1 − ε)·onehot(target) + ε/C, or (1 − ε)·probs + ε/C — and w the class ``weight`` (1 if absent).

    With class indices, targets equal to ``ignore_index`` add nothing and "mean" divides by Σ w[target] over the
    others; with probabilities, "mean" divides by the number of samples and the targets get a gradient too.
    ``weight`` gets none, as in torch.

    With class indices, a recorded call keeps exp(logits − c) and its row sums for the backward pass (c is 0 in
    the rows where nothing overflows, else the row's max: softmax's rule), which then makes the softmax with one
    multiply instead of exp and sum again (torch keeps log_softmax's output alike): memory of one more array the
    logits' size until the backward pass.
    """
    soft = D.is_floating(target.dtype)
    _check_class_call(cross_entropy, logits, target, weight, {"reduction": reduction, "ignore_index": ignore_index},
                      soft)
    x = _rows(logits)
    rows, classes = x.shape
    w = None if weight is None else weight.astype(x.dtype, copy=False)
    eps = label_smoothing
    if soft:
        return _soft_cross_entropy(x, _rows(target).astype(x.dtype, copy=False), w, eps, reduction, target.shape)
    t, valid = _targets("cross_entropy", target, classes, ignore_index)
    rw = _row_weights(t, valid, w, x.dtype)
    if eps:  # the smoothing term needs Σ_c z_c with z = x − max x (no cancellation however large the logits)
        with row_buffers(row_width(x, (1,))):
            z = x - max_last(x)
        losses = -z[np.arange(rows, like=z), t]
        smooth = np.add.reduce(z, axis=1) if w is None else z @ w
        np.exp(z, out=z)  # in place: exp(x − max), the same values as _exp_sums(x, (1,), shift=True)
        e, sums = z, _sum(z, (1,))[:, 0]
        lse = np.log(sums)
        losses += lse
    else:
        e, sums, c = _exp_sums(x, (1,))  # exp(x − c) and its row sums: c is 0 in most rows, else the row's max
        sums = sums[:, 0]
        losses = _minus_log_softmax_at(x, t, e, sums, c)
    if save is not None:  # what cross_entropy_grad would compute again from the logits: the same values
        save["exp_rows"], save["row_sums"] = e, sums
    if w is not None:
        losses *= rw
    if eps:  # −Σ_c w_c·log p_c = lse·Σ_c w_c − Σ_c w_c·z_c
        losses = losses * (1 - eps) + (lse * (classes if w is None else w.sum()) - smooth) * (eps / classes)
    if valid is not None:
        losses = np.where(valid, losses, 0).astype(x.dtype, copy=False)
    return _reduce_rows(losses.reshape(target.shape), rw, rows, reduction)


@cross_entropy.sbp
def _(logits, target, weight, *, reduction, **_):
    if len(logits.shape) < 2:
        return
    rows = (S(0), S(0), None if weight is None else B)
    if reduction != "mean":
        yield rows, {"sum": P, "none": S(0)}[reduction]
    elif D.is_floating(target.dtype):
        yield rows, P("mean")  # probability targets: every row counts, and each rank has as many
    else:  # the mean over the rows that count, on every rank: not the mean of the ranks' means
        yield Decomposition(rows, _mean_over_split_rows)


def _mean_over_split_rows(logits, target, weight, *, ignore_index, reduction, label_smoothing):
    """cross_entropy(reduction="mean") with class indices, as a sum over the rows divided by the rows' weight
    (Σ w[target] over the targets that are not ``ignore_index``): what the kernel computes, written with ops so
    that split rows give the sum and the count over every rank's rows."""
    total = F.cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction="sum",
                            label_smoothing=label_smoothing)
    counts = F.not_equal(target, ignore_index)
    if weight is not None:
        counts = F.where(counts, F.take(weight, F.where(counts, target, 0)), 0.0)
    return total / F.sum(F.cast(counts, dtype=total.dtype))


@cross_entropy.onnx
def _(g, logits, target, weight, *, ignore_index, reduction, label_smoothing):
    axis = _class_axis(logits.ndim)
    classes = logits.shape[axis]
    logp = g.op("LogSoftmax", logits, axis=axis)
    if weight is not None:  # the class weights along the class axis, to multiply log-probabilities with
        weight = g.cast(weight, logits.dtype)
        along = g.op("Reshape", weight, g.ints([classes] + [1] * (logits.ndim - axis - 1)))
        logp_w = g.op("Mul", logp, along)
    else:
        logp_w = logp
    if D.is_floating(target.dtype):  # −Σ_c w_c·q_c·log p_c, q = (1 − ε)·target + ε/C; "mean" over the samples
        q = g.cast(target, logits.dtype)
        if label_smoothing:
            q = g.op("Add", g.op("Mul", q, g.scalar(1 - label_smoothing, logits)),
                     g.scalar(label_smoothing / classes, logits))
        losses = g.op("Neg", g.reduce("ReduceSum", g.op("Mul", q, logp_w), [axis], False))
        if reduction == "none":
            return losses
        return g.reduce("ReduceMean" if reduction == "mean" else "ReduceSum", losses, None, False)
    if not label_smoothing:
        return _onnx_nll(g, logp, target, weight, ignore_index, reduction)
    # (1 − ε)·w[t]·(−log p[t]) + (ε/C)·Σ_c w_c·(−log p_c) for each valid target t; "mean" divides by Σ w[t]
    picked = _onnx_nll(g, logp, target, weight, ignore_index, "none")
    index = g.cast(target, D.int64)
    valid = g.op("Not", g.op("Equal", index, g.const(np.array(ignore_index, np.int64))))
    smooth = g.op("Neg", g.reduce("ReduceSum", logp_w, [axis], False))
    losses = g.op("Add", g.op("Mul", picked, g.scalar(1 - label_smoothing, logits)),
                  g.op("Mul", smooth, g.scalar(label_smoothing / classes, logits)))
    losses = g.op("Where", valid, losses, g.scalar(0, logits))
    if reduction == "none":
        return losses
    total = g.reduce("ReduceSum", losses, None, False)
    if reduction == "sum":
        return total
    counted = g.cast(valid, logits.dtype)
    if weight is not None:
        safe = g.op("Where", valid, index, g.const(np.array(0, np.int64)))
        counted = g.op("Mul", counted, g.op("Gather", weight, safe, axis=0))
    return g.op("Div", total, g.reduce("ReduceSum", counted, None, False))


def _soft_cross_entropy(x, probs, w, eps, reduction, target_shape):
    classes = x.shape[1]
    z = x - np.max(x, axis=1, keepdims=True)
    logp = z - np.log(_sum(np.exp(z), (1,)))
    q = probs * (1 - eps) + eps / classes if eps else probs
    losses = -np.sum(q * logp if w is None else q * logp * w, axis=1)
    return _reduce(losses.reshape(target_shape[:1] + target_shape[2:] if len(target_shape) > 1 else ()), reduction)


@cross_entropy.check
def _(*, reduction, label_smoothing, **_):
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"argument 'label_smoothing' must be in [0, 1], got {label_smoothing}")


@cross_entropy.grad
def _(logits, target, weight, dloss, exp_rows, row_sums, *, ignore_index, reduction, label_smoothing,
      needs_input_grad):
    if not D.is_floating(target.dtype):
        return F.cross_entropy_grad(logits, target, dloss, weight, exp_rows, row_sums, ignore_index=ignore_index,
                                    reduction=reduction, label_smoothing=label_smoothing), None, None
    # Probability targets y: with q = w·((1 − ε)·y + ε/C) the loss is −Σ_c q·log p, whose gradient is log_softmax's
    # for an incoming −s·q (s = dloss per sample); the target's is −s·(1 − ε)·w·log p.
    axis = _class_axis(logits.ndim)
    classes = logits.shape[axis]
    eps = label_smoothing
    wb = None if weight is None else F.reshape(weight.detach(), shape=[classes, *[1] * (logits.ndim - axis - 1)])
    s = _spread(dloss, reduction, logits.shape[:axis] + logits.shape[axis + 1:])
    if s.ndim:
        s = F.unsqueeze(s, axis=axis)
    logp = F.log_softmax(logits, axis=axis)
    dlogits = dtarget = None
    if needs_input_grad[0]:
        q = target * (1 - eps) + eps / classes if eps else target
        dlogits = F.log_softmax_grad(logp, -s * (q if wb is None else q * wb), axis=axis)
    if needs_input_grad[1]:
        dtarget = -s * (1 - eps) * (logp if wb is None else logp * wb)
    return dlogits, dtarget, None


@op("cross_entropy_grad(Tensor<floating> logits, nograd Tensor<int32|int64> target, Tensor<floating> dloss, "
    "nograd Tensor<floating>? weight=None, nograd Tensor<floating>? exp_rows=None, "
    "nograd Tensor<floating>? row_sums=None, *, int ignore_index=-100, str reduction=\"mean\", "
    "float label_smoothing=0.0) -> Tensor dlogits", inplace={"dlogits": "logits"})
def cross_entropy_grad(logits, target, dloss, weight, exp_rows, row_sums, *, ignore_index, reduction,
                       label_smoothing, out=None):
    """Gradient of cross_entropy with class-index targets, in one pass over the logits: per sample
    s·(Q·softmax(logits) − q), where q is the smoothed, weighted target ((1 − ε)·w[t] at class t, ε/C·w_c at every
    class c), Q = Σ_c q_c and s = dloss (÷ Σ w[target] for "mean"). The softmax is made as softmax makes it
    (exp(logits − c), c = 0 where nothing overflows, else the row's max), then one multiply by s·Q/Σ exp; then
    the target's share is subtracted.

    ``exp_rows`` and ``row_sums``, exp(logits − c) as rows (samples, classes) and their sums, are what
    cross_entropy's forward pass kept: given, the softmax is one multiply of them (the same values).

    On a device the targets are not read to check them again (cross_entropy did): there a target out of range
    gets no gradient instead of an error."""
    axis = _class_axis(logits.ndim)
    samples = logits.shape[:axis] + logits.shape[axis + 1:]
    if (logits.ndim == 0 or target.shape != samples or dloss.shape != (samples if reduction == "none" else ())
            or (weight is not None and weight.shape != logits.shape[axis:axis + 1])
            or (exp_rows is None) != (row_sums is None)):
        _validate(cross_entropy_grad, logits, target, dloss, weight, exp_rows, row_sums, reduction=reduction)
    x = _rows(logits)
    rows, classes = x.shape
    w = None if weight is None else weight.astype(x.dtype, copy=False)
    eps = label_smoothing
    t, valid = _targets("cross_entropy_grad", target, classes, ignore_index, read=False)
    rw = _row_weights(t, valid, w, x.dtype)
    s = _row_scale(dloss, rows, rw, valid, reduction)
    hot = s if w is None else s * rw  # s·w[t]: the target class's share of Q
    if eps:
        spread = s * (eps / classes)  # times w_c at every class c
        hot = hot * (1 - eps)
        sq = hot + spread * (classes if w is None else w.sum())
    else:
        sq = hot
    dst = out if out is not None and x is logits else None  # the executor's buffer, when it has the rows' layout
    if exp_rows is not None and row_sums is not None:
        if exp_rows.shape != x.shape or row_sums.shape != (rows,):
            raise ShapeError(f"cross_entropy_grad(): exp_rows and row_sums must have shapes {x.shape} and "
                             f"{(rows,)} (the logits as rows), got {exp_rows.shape} and {row_sums.shape}")
        e, sq = exp_rows, sq / row_sums  # the forward's arrays are read only
    else:
        e, sums, _ = _exp_sums(x, (1,), shift=bool(eps))  # as the forward pass made them
        sq, dst = sq / sums[:, 0], e if dst is None else dst
    with row_buffers(row_width(x, (1,))):
        p = np.multiply(e, sq.reshape(-1, 1), out=dst)
    p[np.arange(rows, like=p), t] -= hot
    if eps:
        spread = spread.reshape(-1, 1) if np.ndim(spread) else spread
        p -= spread if w is None else spread * w
    return _into(out, _unrows(p, logits.shape))


@cross_entropy_grad.check
def _(*, reduction, label_smoothing, **_):
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"argument 'label_smoothing' must be in [0, 1], got {label_smoothing}")


@cross_entropy_grad.infer
def _(logits, target, dloss, weight, exp_rows, row_sums, *, reduction, **_):
    _class_loss_spec("cross_entropy_grad")(logits, target, weight, reduction=reduction)
    axis = _class_axis(len(logits.shape))
    want = logits.shape[:axis] + logits.shape[axis + 1:] if reduction == "none" else ()
    if not _same_dims(dloss.shape, want):
        raise ShapeError(f"cross_entropy_grad(): with reduction={reduction!r} and logits of shape {logits.shape}, "
                         f"dloss must have shape {want}, got {dloss.shape}")
    if (exp_rows is None) != (row_sums is None):
        raise ArgumentError("cross_entropy_grad(): exp_rows and row_sums come together (the forward pass's pair), "
                            f"got {'exp_rows' if row_sums is None else 'row_sums'} alone")
    if exp_rows is not None:
        classes = logits.shape[axis]
        if len(exp_rows.shape) != 2 or not _same_dims(exp_rows.shape[1:], (classes,)) or len(row_sums.shape) != 1:
            raise ShapeError(f"cross_entropy_grad(): exp_rows must be the logits as rows (samples, {classes}) and "
                             f"row_sums one value per row, got shapes {exp_rows.shape} and {row_sums.shape}")
    return Spec(logits.shape, logits.dtype)


@cross_entropy_grad.grad
def _(logits, target, weight, dloss, ddlogits, *, ignore_index, reduction, label_smoothing, needs_input_grad):
    # exp_rows and row_sums (the forward's arrays, given only in a first-order eager backward) get no gradient:
    # a backward pass that is differentiated again is recorded with create_graph, where they are never given.
    # dlogits = s·(Q·p − q) per sample, with p = softmax(logits) and q, Q, s as in the kernel. It is linear in dloss
    # and depends on the logits through p only: d logits = softmax_grad(p, s·Q·ddx), and d dloss = Σ_c ddx·(Q·p − q)
    # per sample, summed for "sum" and "mean" (÷ Σ w[target] there).
    axis = _class_axis(logits.ndim)
    classes = logits.shape[axis]
    eps = label_smoothing

    def counted():  # per sample: 1, or 0 where its target is ignored
        return F.cast(target != ignore_index, dtype=logits.dtype)

    def one_hot():  # w[target] at the target class, 0 elsewhere and in ignored samples: nll_loss_grad of −1 each
        return -F.nll_loss_grad(F.ones_like(target, dtype=logits.dtype), target, weight, num_classes=classes,
                                ignore_index=ignore_index, reduction="none")

    if weight is None and not eps:
        # q is the one-hot target: its sum over the classes is `counted` and its sum over all is Σ counted, the
        # same values (sums of ones) without making q (a scatter, a negation and a sum over the logits' size)
        q, weights = None, counted()
        big_q = F.unsqueeze(weights, axis=axis)
    else:
        hot = q = one_hot()
        if eps:
            spread = F.unsqueeze(counted(), axis=axis) * (eps / classes)
            if weight is not None:
                spread = spread * F.reshape(weight.detach(), shape=[classes, *[1] * (logits.ndim - axis - 1)])
            q = hot * (1 - eps) + spread
        big_q, weights = F.sum(q, axis=[axis], keepdim=True), hot
    s = dloss
    if reduction == "none":
        s = F.unsqueeze(dloss, axis=axis)
    elif reduction == "mean":
        total = F.sum(weights)
        none_counted = total == 0
        total = F.where(none_counted, 1.0, total)  # every target ignored: the gradient is 0, not 0/0
        s = dloss / total
    p = F.softmax(logits, axis=axis)
    dlogits = F.softmax_grad(p, ddlogits * (s * big_q), axis=axis) if needs_input_grad[0] else None
    ddloss = None
    if needs_input_grad[2]:
        ddloss = F.sum(ddlogits * (big_q * p - (one_hot() if q is None else q)), axis=[axis])
        if reduction != "none":
            ddloss = F.sum(ddloss) if reduction == "sum" else F.sum(ddloss) / total
        if reduction == "mean":  # every target ignored: nan, as torch's (and as 0/0), with derivatives 0
            ddloss = F.where(none_counted, math.nan, ddloss)
    return dlogits, None, ddloss, None, None, None


def _class_target(rng, shape, num_classes, ignore=0):
    """Random class indices, the first ``ignore`` of them (in flat order) set to -100."""
    target = rng.integers(0, num_classes, shape).astype(np.int64)
    target.reshape(-1)[:ignore] = -100
    return target


def _probabilities(rng, *shape):
    return _log_softmax_np(rng.standard_normal(shape), (_class_axis(len(shape)),))


@nll_loss.samples
def _(rng):
    yield Sample.of(_probabilities(rng, 4, 5), _class_target(rng, 4, 5))
    yield Sample.of(_probabilities(rng, 4, 5), _class_target(rng, 4, 5, ignore=1), reduction="sum")
    yield Sample.of(_probabilities(rng, 2, 3, 4), _class_target(rng, (2, 4), 3, ignore=2), reduction="none")
    yield Sample.of(_probabilities(rng, 2, 3, 2, 2), _class_target(rng, (2, 2, 2), 3), ignore_index=1)
    yield Sample.of(_probabilities(rng, 5), _class_target(rng, (), 5))
    yield Sample.of(_probabilities(rng, 4, 3), _class_target(rng, 4, 3, ignore=1), rng.uniform(0.5, 2, 3))
    yield Sample.of(_probabilities(rng, 2, 3, 2), _class_target(rng, (2, 2), 3), rng.uniform(0.5, 2, 3),
                    reduction="none")


@nll_loss_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal(()), _class_target(rng, 4, 5, ignore=1), num_classes=5)
    yield Sample.of(rng.standard_normal((2, 4)), _class_target(rng, (2, 4), 3, ignore=2), num_classes=3,
                    reduction="none")
    yield Sample.of(rng.standard_normal(()), _class_target(rng, (), 5), num_classes=5, reduction="sum")
    yield Sample.of(rng.standard_normal(()), _class_target(rng, 4, 3, ignore=1), rng.uniform(0.5, 2, 3),
                    num_classes=3)


@cross_entropy.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 5)), _class_target(rng, 4, 5))
    yield Sample.of(rng.standard_normal((4, 5)), _class_target(rng, 4, 5, ignore=1), reduction="sum",
                    label_smoothing=0.2)
    yield Sample.of(rng.standard_normal((2, 3, 4)), _class_target(rng, (2, 4), 3, ignore=2), reduction="none")
    yield Sample.of(rng.standard_normal((2, 3, 2, 2)), _class_target(rng, (2, 2, 2), 3, ignore=1),
                    label_smoothing=0.1)
    yield Sample.of(rng.standard_normal(5), _class_target(rng, (), 5), label_smoothing=0.3)
    yield Sample.of(rng.standard_normal((4, 3)), _class_target(rng, 4, 3, ignore=1), rng.uniform(0.5, 2, 3),
                    label_smoothing=0.2)
    yield Sample.of(rng.standard_normal((3, 4)), np.exp(_probabilities(rng, 3, 4)))
    yield Sample.of(rng.standard_normal((2, 3, 2)), np.exp(_probabilities(rng, 2, 3, 2)), rng.uniform(0.5, 2, 3),
                    reduction="none", label_smoothing=0.2)


@cross_entropy_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 5)), _class_target(rng, 4, 5), rng.standard_normal(()))
    yield Sample.of(rng.standard_normal((4, 5)), _class_target(rng, 4, 5, ignore=1), rng.standard_normal(()),
                    reduction="sum", label_smoothing=0.2)
    yield Sample.of(rng.standard_normal((2, 3, 4)), _class_target(rng, (2, 4), 3, ignore=2),
                    rng.standard_normal((2, 4)), reduction="none")
    yield Sample.of(rng.standard_normal(5), _class_target(rng, (), 5), rng.standard_normal(()), label_smoothing=0.3)
    yield Sample.of(rng.standard_normal((4, 3)), _class_target(rng, 4, 3, ignore=1), rng.standard_normal(()),
                    rng.uniform(0.5, 2, 3), label_smoothing=0.2)


# -- regression losses -----------------------------------------------------------------------------------------


@op("mse_loss(Tensor<floating> x, Tensor<floating> target, *, str reduction=\"mean\") -> Tensor loss",
    infer=_elementwise_loss_spec("mse_loss"))
def mse_loss(x, target, *, reduction):
    """(x − target)², elementwise (shapes broadcast), then reduced."""
    d = x - target
    return _reduce(d * d, reduction)


@mse_loss.sbp
def _(x, target, *, reduction):
    if x.shape == target.shape:
        for k in range(len(x.shape)):
            yield (S(k), S(k)), {"mean": P("mean"), "sum": P, "none": S(k)}[reduction]


@mse_loss.onnx
def _(g, x, target, *, reduction):
    dtype = g.outputs[0].dtype
    d = g.op("Sub", g.cast(x, dtype), g.cast(target, dtype))
    d = g.op("Mul", d, d)
    return d if reduction == "none" else g.reduce("ReduceMean" if reduction == "mean" else "ReduceSum", d, None, False)


mse_loss.check(_check_reduction_attr)


@mse_loss.grad
def _(x, target, dloss, *, reduction):
    g = (x - target) * (_spread(dloss, reduction, _loss_shape(x, target)) * 2.0)
    return g, -g  # the engine sums each down to its input's shape


@op("l1_loss(Tensor<floating> x, Tensor<floating> target, *, str reduction=\"mean\") -> Tensor loss",
    infer=_elementwise_loss_spec("l1_loss"))
def l1_loss(x, target, *, reduction):
    """|x − target|, elementwise (shapes broadcast), then reduced."""
    return _reduce(np.abs(x - target), reduction)


l1_loss.check(_check_reduction_attr)


@l1_loss.grad
def _(x, target, dloss, *, reduction):
    g = F.sign(x - target) * _spread(dloss, reduction, _loss_shape(x, target))  # 0 where x = target, as torch
    return g, -g


@op("huber_loss(Tensor<floating> x, Tensor<floating> target, str reduction=\"mean\", float delta=1.0) -> "
    "Tensor loss", infer=_elementwise_loss_spec("huber_loss"))
def huber_loss(x, target, *, reduction, delta):
    """½·d² where |d| < delta, else delta·(|d| − ½·delta), with d = x − target elementwise (shapes broadcast); then
    reduced."""
    d = np.abs(x - target)
    return _reduce(np.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


@huber_loss.check
def _(*, reduction, delta):
    _check_reduction(reduction)
    if not delta > 0:
        raise ValueError(f"argument 'delta' must be > 0, got {delta}")


@huber_loss.grad
def _(x, target, dloss, *, reduction, delta):
    # d where |d| < delta, else ±delta: written with where rather than clip so that the second derivative is 0 at
    # |d| = delta, as torch's.
    d = x - target
    g = F.where(F.abs(d) < delta, d, F.sign(d) * delta) * _spread(dloss, reduction, _loss_shape(x, target))
    return g, -g


def _regression_samples(rng):
    yield Sample.of(rng.standard_normal((3, 4)) * 2, rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((3, 4)) * 2, rng.standard_normal(4), reduction="sum")
    yield Sample.of(rng.standard_normal((2, 3)) * 2, rng.standard_normal((2, 3)), reduction="none")
    yield Sample.of(rng.standard_normal(()), rng.standard_normal(()))


mse_loss.samples(_regression_samples)
l1_loss.samples(_regression_samples)


@huber_loss.samples
def _(rng):
    yield from _regression_samples(rng)
    yield Sample.of(rng.standard_normal((2, 5)) * 2, rng.standard_normal((2, 5)), reduction="none", delta=0.5)


@function
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """``torch.nn.functional.smooth_l1_loss``: ½·d²/beta where |d| < beta, else |d| − ½·beta, with d = input −
    target; then reduced. It is huber_loss with delta = beta, divided by beta (l1_loss when beta is 0). The legacy
    ``size_average``/``reduce`` are refused: pass ``reduction``."""
    if size_average is not None or reduce is not None:
        raise ArgumentError("smooth_l1_loss(): size_average= and reduce= (deprecated in torch) are not supported; "
                            "use reduction='mean', 'sum' or 'none'")
    if not isinstance(beta, (int, float)) or isinstance(beta, bool) or beta < 0:
        raise ArgumentError(f"smooth_l1_loss(): argument 'beta' must be a number >= 0, got {beta!r}")
    if beta == 0:
        return F.l1_loss(input, target, reduction=reduction)
    return F.huber_loss(input, target, reduction, float(beta)) / float(beta)


@op("smooth_l1(Tensor<floating> x, *, float sigma=1.0) -> Tensor y", traits=["elementwise"])
def smooth_l1(x, *, sigma):
    """MXNet's smooth L1: 0.5·(σx)² where |x| < 1/σ², else |x| − 0.5/σ²."""
    s2 = sigma * sigma
    return np.where(np.abs(x) < 1 / s2, 0.5 * s2 * x * x, np.abs(x) - 0.5 / s2).astype(x.dtype)


@smooth_l1.onnx
def _(g, x, *, sigma):
    s2 = sigma * sigma
    a = g.op("Abs", x)
    quadratic = g.op("Mul", g.op("Mul", x, x), g.scalar(0.5 * s2, x))
    return g.op("Where", g.op("Less", a, g.scalar(1 / s2, x)), quadratic, g.op("Sub", a, g.scalar(0.5 / s2, x)))


@smooth_l1.check
def _(*, sigma):
    if not sigma > 0:
        raise ValueError(f"argument 'sigma' must be > 0, got {sigma}")


@smooth_l1.grad
def _(x, dy, *, sigma):
    return F.smooth_l1_grad(x, dy, sigma=sigma)  # x and dy only, as MXNet's SimpleOp declares


@smooth_l1.samples
def _(rng):
    yield Sample.of(rng.uniform(-3, 3, (3, 4)))
    yield Sample.of(rng.uniform(-3, 3, 6), sigma=2.0)
    yield Sample.of(np.array(0.3), sigma=0.5)


@op("smooth_l1_grad(Tensor<floating> x, Tensor dy, *, float sigma) -> Tensor dx", traits=["elementwise"])
def smooth_l1_grad(x, dy, *, sigma):
    """Gradient of smooth_l1: dx = dy·σ²x where |x| < 1/σ², else dy·sign(x)."""
    s2 = sigma * sigma
    return (dy * np.where(np.abs(x) < 1 / s2, s2 * x, np.sign(x))).astype(dy.dtype)


@smooth_l1_grad.grad
def _(x, dy, ddx, *, sigma):
    s2 = sigma * sigma
    inside = F.abs(x) < 1 / s2
    second = F.where(inside, ddx * dy * s2, 0)
    return F.where(F.isnan(x), x, second), F.smooth_l1_grad(x, ddx, sigma=sigma)  # NaN at a NaN x


@smooth_l1_grad.samples
def _(rng):
    yield Sample.of(rng.uniform(-3, 3, (3, 4)), rng.standard_normal((3, 4)), sigma=1.0)
    yield Sample.of(rng.uniform(-1, 1, 5), rng.standard_normal(5), sigma=2.0)


# -- probabilistic losses --------------------------------------------------------------------------------------


@op("kl_div(Tensor<floating> x, Tensor<floating> target, *, str reduction=\"mean\", bool log_target=False) -> "
    "Tensor loss", infer=_elementwise_loss_spec("kl_div", (*_REDUCTIONS, "batchmean")))
def kl_div(x, target, *, reduction, log_target):
    """The KL divergence of the distribution ``target`` from log-probabilities ``x``, elementwise (shapes broadcast):
    target·(log target − x), 0 where target is 0 — or exp(target)·(target − x) with ``log_target``. Reduced by
    "mean" (over every element, as torch), "batchmean" (the sum over x's first dim: the divergence per sample),
    "sum" or "none"."""
    if log_target:
        losses = np.exp(target) * (target - x)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):  # xlogy(t, t): 0 at t = 0, nan below
            losses = np.where(target == 0, 0, target * np.log(target)) - target * x
    if reduction != "batchmean":
        return _reduce(losses, reduction)
    return np.sum(losses) / (x.shape[0] if x.ndim else 1)  # (a NumPy scalar on the host: dispatch's)


@kl_div.check
def _(*, reduction, **_):
    _check_reduction(reduction, (*_REDUCTIONS, "batchmean"))


@kl_div.grad
def _(x, target, dloss, *, reduction, log_target, needs_input_grad):
    shape = _loss_shape(x, target)
    s = _spread(dloss, reduction, shape, x.shape[:1])
    # ∂/∂x is −target (−exp(target)): where target is the larger of the two, spread it over the losses' shape so
    # that the engine can sum it down to x's.
    p = F.exp(target) if log_target else target
    dx = None
    if needs_input_grad[0]:
        dx = -p * s
        if tuple(dx.shape) != tuple(shape):
            dx = F.broadcast_to(dx, shape=list(shape))
    if log_target:
        return dx, p * (target - x + 1.0) * s if needs_input_grad[1] else None
    # target/target is 1, and nan at target = 0, where torch's derivative of xlogy(t, t) is nan too.
    return dx, (F.log(target) + target / target - x) * s if needs_input_grad[1] else None


@kl_div.samples
def _(rng):
    yield Sample.of(_probabilities(rng, 3, 4), np.exp(_probabilities(rng, 3, 4)), reduction="batchmean")
    yield Sample.of(_probabilities(rng, 3, 4), rng.uniform(0.1, 1, 4))
    yield Sample.of(_probabilities(rng, 2, 3), _probabilities(rng, 2, 3), reduction="none", log_target=True)
    yield Sample.of(_probabilities(rng, 2, 3), rng.standard_normal((2, 3)), reduction="sum", log_target=True)
    yield Sample.of(rng.standard_normal(()), rng.uniform(0.1, 1, ()), reduction="batchmean")


def _bce_spec(op_name: str):
    def infer(x, target, weight, pos_weight=None, *, reduction):
        if not _same_dims(x.shape, target.shape):
            raise ShapeError(f"{op_name}(): target must have the shape of the input {x.shape}, got {target.shape}")
        for name, t in (("weight", weight), ("pos_weight", pos_weight)):
            if t is not None and not _broadcasts_to(t.shape, x.shape):
                raise ShapeError(f"{op_name}(): {name} of shape {t.shape} must broadcast to the shape of the input "
                                 f"{x.shape}")
        return Spec(x.shape if reduction == "none" else (), x.dtype)

    return infer


_CLAMP = -100.0  # torch clamps each log of binary_cross_entropy to ≥ −100: probabilities of 0 and 1 give finite losses


@op("binary_cross_entropy(Tensor<floating> probs, Tensor<floating> target, Tensor<floating>? weight=None, *, "
    "str reduction=\"mean\") -> Tensor loss", infer=_bce_spec("binary_cross_entropy"))
def binary_cross_entropy(probs, target, weight, *, reduction):
    """−weight·(target·log(probs) + (1 − target)·log(1 − probs)), each log clamped to ≥ −100 as torch; then
    reduced. ``probs`` must lie in [0, 1]. ``weight`` (broadcast to the input) gets a gradient too."""
    _validate(binary_cross_entropy, probs, target, weight, reduction=reduction)
    if probs.size and not (probs.min() >= 0 and probs.max() <= 1):  # nan fails too
        raise ArgumentError("binary_cross_entropy(): every element of probs must be in [0, 1] (probabilities); "
                            "for scores, use binary_cross_entropy_with_logits")
    with np.errstate(divide="ignore"):
        losses = -(target * np.maximum(np.log(probs), _CLAMP) + (1 - target) * np.maximum(np.log1p(-probs), _CLAMP))
    return _reduce(losses if weight is None else losses * weight, reduction).astype(probs.dtype, copy=False)


binary_cross_entropy.check(_check_reduction_attr)


@binary_cross_entropy.grad
def _(probs, target, weight, dloss, *, reduction, needs_input_grad):
    s = _spread(dloss, reduction, probs.shape)
    ws = s if weight is None else s * weight
    dp = dt = dw = None
    if needs_input_grad[0]:  # (p − y)/(p·(1 − p)), the denominator clamped to ≥ 1e-12 as torch's
        dp = ws * (probs - target) / F.maximum(probs * (1.0 - probs), 1e-12)
    if needs_input_grad[1]:  # −logit(p), unclamped as torch's
        dt = ws * (F.log1p(-probs) - F.log(probs))
    if needs_input_grad[2]:
        dw = -s * (target * F.maximum(F.log(probs), _CLAMP) + (1.0 - target) * F.maximum(F.log1p(-probs), _CLAMP))
    return dp, dt, dw


@binary_cross_entropy.samples
def _(rng):
    yield Sample.of(rng.uniform(0.05, 0.95, (3, 4)), rng.uniform(0, 1, (3, 4)))
    yield Sample.of(rng.uniform(0.05, 0.95, (3, 4)), rng.uniform(0, 1, (3, 4)), rng.uniform(0.5, 2, 4),
                    reduction="sum")
    yield Sample.of(rng.uniform(0.05, 0.95, (2, 3)), rng.uniform(0, 1, (2, 3)), reduction="none")
    yield Sample.of(rng.uniform(0.05, 0.95, ()), rng.uniform(0, 1, ()), rng.uniform(0.5, 2, ()))


@op("binary_cross_entropy_with_logits(Tensor<floating> logits, Tensor<floating> target, "
    "Tensor<floating>? weight=None, *, Tensor<floating>? pos_weight=None, str reduction=\"mean\") -> Tensor loss",
    infer=_bce_spec("binary_cross_entropy_with_logits"))
def binary_cross_entropy_with_logits(logits, target, weight, pos_weight, *, reduction):
    """−weight·[pos_weight·y·log σ(x) + (1 − y)·log(1 − σ(x))] (pos_weight and weight 1 if absent, each broadcast
    to the input), computed without overflow as (1 − y)·x + (1 + (pos_weight − 1)·y)·softplus(−x),
    softplus(z) = log(1 + eᶻ); then reduced. Both weights get gradients too."""
    _validate(binary_cross_entropy_with_logits, logits, target, weight, pos_weight, reduction=reduction)
    sp = np.logaddexp(0, -logits)  # softplus(−x) = −log σ(x)
    coef = 1 + (pos_weight - 1) * target if pos_weight is not None else 1
    losses = (1 - target) * logits + coef * sp
    if weight is not None:
        losses = losses * weight
    return _reduce(losses.astype(logits.dtype, copy=False), reduction)


@binary_cross_entropy_with_logits.onnx
def _(g, logits, target, weight, pos_weight, *, reduction):
    x, y = logits, g.cast(target, logits.dtype)
    # softplus(−x) = max(−x, 0) + ln(1 + e^−|x|): no overflow
    sp = g.op("Add", g.op("Relu", g.op("Neg", x)), g.call("log1p", g.op("Exp", g.op("Neg", g.op("Abs", x)))))
    coef = sp if pos_weight is None else g.op("Mul", sp, g.op("Add", g.scalar(1, x), g.op(
        "Mul", g.op("Sub", g.cast(pos_weight, x.dtype), g.scalar(1, x)), y)))
    losses = g.op("Add", g.op("Mul", g.op("Sub", g.scalar(1, x), y), x), coef)
    if weight is not None:
        losses = g.op("Mul", losses, g.cast(weight, x.dtype))
    if reduction == "none":
        return losses
    return g.reduce("ReduceMean" if reduction == "mean" else "ReduceSum", losses, None, False)


binary_cross_entropy_with_logits.check(_check_reduction_attr)


@binary_cross_entropy_with_logits.grad
def _(logits, target, weight, pos_weight, dloss, *, reduction, needs_input_grad):
    # ∂/∂x = (1 − y) + (1 + (w − 1)·y)·(σ(x) − 1), which is σ(x) − y when w = pos_weight = 1;
    # ∂/∂y = −x + (w − 1)·softplus(−x);  ∂/∂w = y·softplus(−x); ∂/∂weight = the unweighted loss.
    s = _spread(dloss, reduction, logits.shape)
    ws = s if weight is None else s * weight
    dx = dy = dw = dpw = None
    # softplus(−x), exact (no linear piece past a threshold, unlike torch's default): its derivative is σ(x) − 1.
    sp = F.softplus(-logits, threshold=math.inf) if pos_weight is not None or needs_input_grad[2] else None
    if pos_weight is None:
        dx = (F.sigmoid(logits) - target) * ws if needs_input_grad[0] else None
        dy = -logits * ws if needs_input_grad[1] else None
        if needs_input_grad[2]:
            dw = ((1.0 - target) * logits + sp) * s
        return dx, dy, dw, None
    coef = (pos_weight - 1.0) * target + 1.0
    dx = ((F.sigmoid(logits) - 1.0) * coef - target + 1.0) * ws if needs_input_grad[0] else None
    dy = ((pos_weight - 1.0) * sp - logits) * ws if needs_input_grad[1] else None
    dw = ((1.0 - target) * logits + coef * sp) * s if needs_input_grad[2] else None
    dpw = target * sp * ws if needs_input_grad[3] else None
    return dx, dy, dw, dpw


@binary_cross_entropy_with_logits.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)) * 3, rng.uniform(0, 1, (3, 4)))
    yield Sample.of(rng.standard_normal((3, 4)), rng.uniform(0, 1, (3, 4)), None, rng.uniform(0.5, 2, 4),
                    reduction="sum")
    yield Sample.of(rng.standard_normal((2, 3)), rng.uniform(0, 1, (2, 3)), reduction="none")
    yield Sample.of(rng.standard_normal(()), rng.uniform(0, 1, ()), None, rng.uniform(0.5, 2, ()))
    yield Sample.of(rng.standard_normal((3, 4)), rng.uniform(0, 1, (3, 4)), rng.uniform(0.5, 2, (3, 1)),
                    rng.uniform(0.5, 2, 4))
    yield Sample.of(rng.standard_normal((2, 3)), rng.uniform(0, 1, (2, 3)), rng.uniform(0.5, 2, 3), reduction="none")


# -- embedding and ranking losses ------------------------------------------------------------------------------
# Their hinges max(0, z) pass the gradient where z ≥ 0, ties included, as torch's clamp_min.

_COSINE_EPS = 1e-12  # torch's: added to each squared norm, so that a zero vector gives cos 0, not nan


@op("cosine_embedding_loss(Tensor<floating> x1, Tensor<floating> x2, nograd Tensor<number> target, "
    "float margin=0.0, *, str reduction=\"mean\") -> Tensor loss")
def cosine_embedding_loss(x1, x2, target, *, margin, reduction):
    """For rows x1, x2 (D,) or batches (N, D) with targets 1 (alike) or −1 (unlike): 1 − cos(x1, x2) where the
    target is 1, max(0, cos(x1, x2) − margin) where it is −1, 0 for any other target; then reduced. The cosine is
    x1·x2 / √((|x1|² + ε)(|x2|² + ε)) with ε = 1e-12, as torch."""
    _validate(cosine_embedding_loss, x1, x2, target, margin=margin, reduction=reduction)
    dot = np.sum(x1 * x2, axis=-1)
    cos = dot / np.sqrt((np.sum(x1 * x1, axis=-1) + _COSINE_EPS) * (np.sum(x2 * x2, axis=-1) + _COSINE_EPS))
    losses = np.where(target == 1, 1 - cos, np.where(target == -1, np.maximum(cos - margin, 0), 0))
    return _reduce(losses.astype(cos.dtype, copy=False), reduction)


cosine_embedding_loss.check(_check_reduction_attr)


@cosine_embedding_loss.infer
def _(x1, x2, target, *, margin, reduction):
    name = "cosine_embedding_loss()"
    if len(target.shape) > 1:
        raise ShapeError(f"{name}: the target must be 0-d or 1-D (one per pair), got shape {target.shape}")
    if not len(x1.shape) == len(x2.shape) == len(target.shape) + 1:
        raise ShapeError(f"{name}: a {len(target.shape)}-D target needs {len(target.shape) + 1}-D inputs, got "
                         f"shapes {x1.shape} and {x2.shape}")
    shape = broadcast_shapes(x1.shape, x2.shape, op="cosine_embedding_loss")
    if not _same_dims(shape[:-1], target.shape):
        raise ShapeError(f"{name}: inputs of shape {shape} need a target of shape {shape[:-1]}, got {target.shape}")
    return Spec(shape[:-1] if reduction == "none" else (), D.promote(x1.dtype, x2.dtype))


@cosine_embedding_loss.grad
def _(x1, x2, target, dloss, *, margin, reduction, needs_input_grad):
    # cos = x1·x2·r with r = 1/√(a·b), a = |x1|² + ε, b = |x2|² + ε:  ∂cos/∂x1 = x2·r − cos·x1/a (x2 alike).
    a = F.sum(x1 * x1, axis=[-1], keepdim=True) + _COSINE_EPS
    b = F.sum(x2 * x2, axis=[-1], keepdim=True) + _COSINE_EPS
    r = F.rsqrt(a * b)
    cos = F.sum(x1 * x2, axis=[-1], keepdim=True) * r
    t = F.unsqueeze(target, axis=-1)
    counts = F.where(t == 1, -1.0, F.where(F.logical_and(t == -1, cos >= margin), 1.0, 0.0))
    counts = F.cast(counts, dtype=cos.dtype)  # numbers next to a bool take float32: a 0-d dloss would not upcast
    s = _spread(dloss, reduction, _loss_shape(x1, x2)[:-1])
    g = counts * (F.unsqueeze(s, axis=-1) if s.ndim else s)
    return (g * (x2 * r - x1 * (cos / a)) if needs_input_grad[0] else None,
            g * (x1 * r - x2 * (cos / b)) if needs_input_grad[1] else None, None)


@cosine_embedding_loss.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 3)), rng.standard_normal((4, 3)), np.array([1, -1, 1, -1]))
    yield Sample.of(rng.standard_normal((4, 3)), rng.standard_normal((4, 3)), np.array([1.0, -1.0, -1.0, 1.0]),
                    margin=-0.5, reduction="none")
    yield Sample.of(rng.standard_normal((3, 5)), rng.standard_normal((1, 5)), np.array([-1, 1, -1]), margin=-0.9,
                    reduction="sum")
    yield Sample.of(rng.standard_normal(4), rng.standard_normal(4), np.array(1))


@op("margin_ranking_loss(Tensor<floating> x1, Tensor<floating> x2, Tensor<number> target, float margin=0.0, *, "
    "str reduction=\"mean\") -> Tensor loss")
def margin_ranking_loss(x1, x2, target, *, margin, reduction):
    """max(0, −target·(x1 − x2) + margin), elementwise (shapes broadcast; the three must have the same number of
    dims, as in torch): target 1 asks x1 to rank above x2 by ``margin``, −1 below. Then reduced."""
    _validate(margin_ranking_loss, x1, x2, target, margin=margin, reduction=reduction)
    dtype = np.result_type(x1, x2)
    z = -target.astype(dtype, copy=False) * (x1 - x2) + margin
    return _reduce(np.maximum(z, 0).astype(dtype, copy=False), reduction)


margin_ranking_loss.check(_check_reduction_attr)


@margin_ranking_loss.infer
def _(x1, x2, target, *, margin, reduction):
    if not len(x1.shape) == len(x2.shape) == len(target.shape):
        raise ShapeError(f"margin_ranking_loss(): x1, x2 and target must have the same number of dims, got shapes "
                         f"{x1.shape}, {x2.shape} and {target.shape}")
    shape = broadcast_shapes(x1.shape, x2.shape, target.shape, op="margin_ranking_loss")
    return Spec(shape if reduction == "none" else (), D.promote(x1.dtype, x2.dtype))


@margin_ranking_loss.grad
def _(x1, x2, target, dloss, *, margin, reduction, needs_input_grad):
    t = target if D.is_floating(target.dtype) else F.cast(target, dtype=D.promote(x1.dtype, x2.dtype))
    d = x1 - x2
    g = F.where(-t * d + margin >= 0, _spread(dloss, reduction, _loss_shape(x1, x2, target)), 0.0)
    return (-t * g if needs_input_grad[0] else None, t * g if needs_input_grad[1] else None,
            -d * g if needs_input_grad[2] else None)


@margin_ranking_loss.samples
def _(rng):
    yield Sample.of(rng.standard_normal(5), rng.standard_normal(5), rng.choice([-1.0, 1.0], 5))
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 1)), rng.choice([-1.0, 1.0], (2, 3)),
                    margin=0.3, reduction="none")
    yield Sample.of(rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4), margin=0.5,
                    reduction="sum")
    yield Sample.of(rng.standard_normal(()), rng.standard_normal(()), np.array(-1), margin=2.0)


def _pairwise_distance(u, v, p, eps):
    """pairwise_distance(u, v) and the difference u − v + eps whose norm it is."""
    return u - v + eps, F.pairwise_distance(u, v, p=p, eps=eps)


@op("triplet_margin_loss(Tensor<floating> anchor, Tensor<floating> positive, Tensor<floating> negative, "
    "float margin=1.0, float p=2.0, float eps=1e-6, bool swap=False, *, str reduction=\"mean\") -> Tensor loss")
def triplet_margin_loss(anchor, positive, negative, *, margin, p, eps, swap, reduction):
    """max(0, margin + d(anchor, positive) − d(anchor, negative)) per sample, with d(u, v) = ‖u − v + eps‖_p over
    the last axis (pairwise_distance); ``swap`` uses min(d(a, n), d(p, n)) for the negative distance. The
    three inputs have the same number of dims and broadcast. Then reduced."""
    _validate(triplet_margin_loss, anchor, positive, negative, margin=margin, p=p, eps=eps, swap=swap,
              reduction=reduction)

    def distance(u, v):  # pairwise_distance's: the norm op's kernel over the last axis
        w = u - v + eps
        return vector_norm(w, p, (w.ndim - 1,), False)

    d_neg = distance(anchor, negative)
    if swap:
        d_neg = np.minimum(d_neg, distance(positive, negative))
    losses = np.maximum(margin + distance(anchor, positive) - d_neg, 0)
    return _reduce(losses.astype(np.result_type(anchor, positive, negative), copy=False), reduction)


@triplet_margin_loss.check
def _(*, margin, p, reduction, **_):
    _check_reduction(reduction)
    if not margin > 0:
        raise ValueError(f"argument 'margin' must be > 0, got {margin}")
    if not p > 0:
        raise ValueError(f"argument 'p' must be > 0 (a norm), got {p}")


@triplet_margin_loss.infer
def _(anchor, positive, negative, *, reduction, **_):
    if not len(anchor.shape) == len(positive.shape) == len(negative.shape) >= 1:
        raise ShapeError(f"triplet_margin_loss(): anchor, positive and negative must have the same number of dims "
                         f"(at least 1), got shapes {anchor.shape}, {positive.shape} and {negative.shape}")
    shape = broadcast_shapes(anchor.shape, positive.shape, negative.shape, op="triplet_margin_loss")
    return Spec(shape[:-1] if reduction == "none" else (), D.promote(anchor.dtype, positive.dtype, negative.dtype))


@triplet_margin_loss.grad
def _(anchor, positive, negative, dloss, *, margin, p, eps, swap, reduction):
    # Through the hinge, then each distance by the norm op's own gradient rule (and minimum's, for swap).
    norm_vjp, min_vjp = norm_grad_rule, F.minimum.opdef.grad_rule.fn
    w_ap, d_ap = _pairwise_distance(anchor, positive, p, eps)
    w_an, d_an = _pairwise_distance(anchor, negative, p, eps)
    d_neg = d_an
    if swap:
        w_pn, d_pn = _pairwise_distance(positive, negative, p, eps)
        d_neg = F.minimum(d_an, d_pn)
    s = _spread(dloss, reduction, _loss_shape(anchor, positive, negative)[:-1])
    g = F.where(margin + d_ap - d_neg >= 0, s, 0.0)
    g_an = -g
    if swap:
        g_an, g_pn = min_vjp(x=d_an, y=d_pn, dout=-g)
        g_pn = norm_vjp(x=w_pn, y=d_pn, dy=g_pn, p=p, axis=[-1], keepdim=False)
    g_ap = norm_vjp(x=w_ap, y=d_ap, dy=g, p=p, axis=[-1], keepdim=False)
    g_an = norm_vjp(x=w_an, y=d_an, dy=g_an, p=p, axis=[-1], keepdim=False)
    if swap:
        return g_ap + g_an, g_pn - g_ap, -g_an - g_pn
    return g_ap + g_an, -g_ap, -g_an


@triplet_margin_loss.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 3)))
    yield Sample.of(rng.standard_normal((4, 3)), rng.standard_normal((4, 3)), rng.standard_normal((1, 3)),
                    margin=2.0, swap=True, reduction="none")
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), p=1.0,
                    margin=3.0, reduction="sum")
    yield Sample.of(rng.standard_normal(5), rng.standard_normal(5), rng.standard_normal(5), p=3.0, margin=1.5,
                    eps=0.0)


# -- ONNX export of the losses above that had none: the kernels' formulas ------------------------------------------


def _onnx_reduce(g, losses, reduction):
    if reduction == "none":
        return losses
    return g.reduce("ReduceMean" if reduction == "mean" else "ReduceSum", losses, None, False, spec=g.outputs[0])


def _onnx_operands(g, *xs):
    return [g.cast(x, g.outputs[0].dtype) for x in xs]


@l1_loss.onnx
def _(g, x, target, *, reduction):
    x, target = _onnx_operands(g, x, target)
    return _onnx_reduce(g, g.op("Abs", g.op("Sub", x, target)), reduction)


@huber_loss.onnx
def _(g, x, target, *, reduction, delta):
    x, target = _onnx_operands(g, x, target)
    d = g.op("Abs", g.op("Sub", x, target))
    quadratic = g.op("Mul", g.op("Mul", d, d), g.scalar(0.5, x))
    linear = g.op("Mul", g.op("Sub", d, g.scalar(0.5 * delta, x)), g.scalar(delta, x))
    return _onnx_reduce(g, g.op("Where", g.op("Less", d, g.scalar(delta, x)), quadratic, linear), reduction)


@kl_div.onnx
def _(g, x, target, *, reduction, log_target):
    x, target = _onnx_operands(g, x, target)
    if log_target:
        losses = g.op("Mul", g.op("Exp", target), g.op("Sub", target, x))
    else:  # xlogy(t, t): 0 at t = 0
        zero = g.scalar(0, x)
        t_log_t = g.op("Where", g.op("Equal", target, zero), zero, g.op("Mul", target, g.op("Log", target)))
        losses = g.op("Sub", t_log_t, g.op("Mul", target, x))
    if reduction != "batchmean":
        return _onnx_reduce(g, losses, reduction)
    total = g.reduce("ReduceSum", losses, None, False)
    rows = g.cast(g.op("Shape", x, start=0, end=1), x.dtype) if x.ndim else g.scalar(1, x)
    return g.op("Div", total, g.op("Reshape", rows, g.ints([])), spec=g.outputs[0])


@binary_cross_entropy.onnx
def _(g, probs, target, weight, *, reduction):
    dtype = probs.dtype
    target = g.cast(target, dtype)
    clamp = g.scalar(_CLAMP, probs)
    log_p = g.op("Max", g.op("Log", probs), clamp)
    log_q = g.op("Max", g.call("log1p", g.op("Neg", probs)), clamp)
    losses = g.op("Neg", g.op("Add", g.op("Mul", target, log_p),
                              g.op("Mul", g.op("Sub", g.scalar(1, probs), target), log_q)))
    if weight is not None:
        losses = g.op("Mul", losses, g.cast(weight, dtype))
    return _onnx_reduce(g, losses, reduction)


@cosine_embedding_loss.onnx
def _(g, x1, x2, target, *, margin, reduction):
    x1, x2 = _onnx_operands(g, x1, x2)
    last = [max(x1.ndim, x2.ndim) - 1]

    def total(v):
        return g.reduce("ReduceSum", v, last, False)

    eps = g.scalar(_COSINE_EPS, x1)
    norms = g.op("Mul", g.op("Add", total(g.op("Mul", x1, x1)), eps), g.op("Add", total(g.op("Mul", x2, x2)), eps))
    cos = g.op("Div", total(g.op("Mul", x1, x2)), g.op("Sqrt", norms))
    zero, one = g.scalar(0, x1), g.scalar(1, x1)
    unlike = g.op("Where", g.op("Equal", target, g.scalar(-1, target)),
                  g.op("Max", g.op("Sub", cos, g.scalar(margin, x1)), zero), zero)
    losses = g.op("Where", g.op("Equal", target, g.scalar(1, target)), g.op("Sub", one, cos), unlike)
    return _onnx_reduce(g, losses, reduction)


@margin_ranking_loss.onnx
def _(g, x1, x2, target, *, margin, reduction):
    x1, x2, target = _onnx_operands(g, x1, x2, target)
    z = g.op("Add", g.op("Mul", g.op("Neg", target), g.op("Sub", x1, x2)), g.scalar(margin, x1))
    return _onnx_reduce(g, g.op("Max", z, g.scalar(0, x1)), reduction)


@triplet_margin_loss.onnx
def _(g, anchor, positive, negative, *, margin, p, eps, swap, reduction):
    anchor, positive, negative = _onnx_operands(g, anchor, positive, negative)
    last = [anchor.ndim - 1]

    def distance(u, v):  # pairwise_distance's
        return g.call("norm", g.op("Add", g.op("Sub", u, v), g.scalar(eps, u)), p=p, axis=last, keepdim=False)

    d_neg = distance(anchor, negative)
    if swap:
        d_neg = g.op("Min", d_neg, distance(positive, negative))
    z = g.op("Sub", g.op("Add", distance(anchor, positive), g.scalar(margin, anchor)), d_neg)
    return _onnx_reduce(g, g.op("Max", z, g.scalar(0, anchor)), reduction)
