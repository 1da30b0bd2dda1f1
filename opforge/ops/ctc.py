"""Connectionist temporal classification: the op ``ctc_nll`` (the loss per sample) with its gradient op, and
torch's ``F.ctc_loss`` reducing it.

The kernels run the forward (α) and backward (β) recursions of Graves et al. in log space, over the whole batch at
once per time step, on the target extended with blanks (blank, l₁, blank, l₂, …, blank). The loss of a sample is
−log p(target | log_probs); its gradient with respect to log_probs[t, c] is −exp(log Σ_{s: l'ₛ = c} αₜ(s)βₜ(s) −
log_probs[t, c] + loss), the true derivative. torch's kernel returns exp(log_probs[t, c]) plus that — the gradient
through a log_softmax folded in — which differs at log_probs but not at the logits a log_softmax made them from
(where ctc_loss's inputs come from): docs/pytorch.md says so.
"""

from opforge import ops as F

from ..core.errors import ArgumentError, GradientError
from ..core.grad_mode import is_grad_enabled
from ._common import D, Sample, ShapeError, Spec, function, np, op

_NEG = -np.inf


def _largest(a, empty):
    """``a.max(initial=empty)`` as an int (CuPy's max has no ``initial``): a read of the device."""
    return int(a.max()) if a.size else empty


def _padded(targets, target_lengths, batch: int, name: str, xp):
    """Targets as (N, S_max): the padded form as it is, the concatenated 1-D form split by the lengths."""
    if targets.ndim == 2:
        return targets
    total = int(target_lengths.sum())
    if total > targets.size:
        raise ShapeError(f"{name}(): the target lengths add up to {total}, the concatenated targets hold "
                         f"{targets.size}")
    width = _largest(target_lengths, 0)
    if not total:
        return xp.zeros((batch, width), np.int64)
    places = xp.arange(width)[None]
    starts = (np.cumsum(target_lengths) - target_lengths)[:, None]  # sample n's targets start there
    taken = targets[xp.minimum(starts + places, targets.size - 1)]
    return xp.where(places < target_lengths[:, None], taken, 0).astype(np.int64)


def _recursions(log_probs, targets, input_lengths, target_lengths, blank, name, xp):
    """(α, β, loss, extended targets) for log_probs (T, N, C) in float64; α and β are (T, N, 2·S_max + 1)."""
    steps, batch, classes = log_probs.shape
    if not 0 <= blank < classes:
        raise ShapeError(f"{name}(): blank {blank} is not a class of the {classes} classes")
    lengths, tl = input_lengths.astype(np.int64), target_lengths.astype(np.int64)
    if -_largest(-lengths, -1) < 0 or _largest(lengths, 0) > steps:
        raise ShapeError(f"{name}(): input_lengths must lie in [0, {steps}] (log_probs' time steps), got "
                         f"{lengths.tolist()}")
    targets = _padded(targets, tl, batch, name, xp)
    if -_largest(-tl, 0) < 0 or _largest(tl, 0) > targets.shape[1]:
        raise ShapeError(f"{name}(): target_lengths must lie in [0, {targets.shape[1]}], got {tl.tolist()}")
    width = 2 * targets.shape[1] + 1
    ext = xp.full((batch, width), blank, np.int64)
    ext[:, 1::2] = targets
    s = xp.arange(width)
    used = s[None] < (2 * tl + 1)[:, None]
    bad = used & ((ext < 0) | (ext >= classes))
    if bad.any():
        raise ArgumentError(f"{name}(): targets hold class {int(ext[bad][0])}, outside [0, {classes})")
    ext = np.where(used, ext, blank)
    skip = (s >= 2)[None] & (ext != blank) & (ext != np.roll(ext, 2, axis=1))
    lp = np.take_along_axis(log_probs.astype(np.float64), np.broadcast_to(ext[None], (steps, batch, width)), axis=2)
    lp = np.where(used[None], lp, _NEG)

    def shift(a, k):  # a[..., s − k], −inf where s < k
        out = np.full_like(a, _NEG)
        out[..., k:] = a[..., :-k]
        return out

    alpha = xp.full((steps, batch, width), _NEG)
    if steps:
        alpha[0, :, 0] = lp[0, :, 0]
        if width > 1:  # (every target empty: the blank alone)
            alpha[0, :, 1] = np.where(tl > 0, lp[0, :, 1], _NEG)
    for t in range(1, steps):
        a = alpha[t - 1]
        alpha[t] = np.logaddexp(np.logaddexp(a, shift(a, 1)), np.where(skip, shift(a, 2), _NEG)) + lp[t]
    beta = xp.full((steps, batch, width), _NEG)
    last, end = lengths - 1, 2 * tl
    rows = xp.arange(batch)
    for t in reversed(range(steps)):
        init = xp.full((batch, width), _NEG)
        init[rows, end] = lp[t, rows, end]
        init[rows, np.maximum(end - 1, 0)] = np.where(tl > 0, lp[t, rows, np.maximum(end - 1, 0)], init[rows, 0])
        if t + 1 < steps:
            b = beta[t + 1]
            nxt = np.full_like(b, _NEG)
            nxt[:, :-1] = b[:, 1:]
            nxt2 = np.full_like(b, _NEG)
            nxt2[:, :-2] = np.where(skip[:, 2:], b[:, 2:], _NEG)
            rec = np.logaddexp(np.logaddexp(b, nxt), nxt2) + lp[t]
        else:
            rec = xp.full((batch, width), _NEG)
        beta[t] = np.where((t == last)[:, None], init, np.where((t < last)[:, None], rec, _NEG))
    t_end = np.maximum(last, 0)
    final = np.logaddexp(alpha[t_end, rows, end], np.where(tl > 0, alpha[t_end, rows, np.maximum(end - 1, 0)], _NEG))
    loss = np.where(lengths > 0, -final, np.where(tl == 0, 0.0, np.inf))  # no steps: only an empty target fits
    return alpha, beta, loss, ext


def _batched(log_probs, targets, input_lengths, target_lengths):
    """An unbatched call ((T, C), (S,), 0-d lengths) as a batch of one."""
    if log_probs.ndim == 2:
        return log_probs[:, None], targets.reshape(1, -1), input_lengths.reshape(1), target_lengths.reshape(1)
    return log_probs, targets, input_lengths.reshape(-1), target_lengths.reshape(-1)


_CTC_INPUTS = ("Tensor<floating> log_probs, nograd Tensor<int32|int64> targets, nograd Tensor<int32|int64> "
               "input_lengths, nograd Tensor<int32|int64> target_lengths")


@op(f"ctc_nll({_CTC_INPUTS}, *, int blank=0, bool zero_infinity=False) -> Tensor loss")
def ctc_nll(log_probs, targets, input_lengths, target_lengths, *, blank, zero_infinity, xp=np):
    """CTC's −log p(target | log_probs) per sample: log_probs (T, N, C) — or (T, C) — of which sample n uses the first
    input_lengths[n] steps; targets (N, S) padded, or 1-D concatenated, of target_lengths[n] classes each (none the
    ``blank``). (N,) losses, 0-d unbatched; an impossible alignment is inf, or 0 with ``zero_infinity``.
    ``F.ctc_loss`` reduces them as torch's."""
    lp, tg, il, tl = _batched(log_probs, targets, input_lengths, target_lengths)
    loss = _recursions(lp, tg, il, tl, blank, "ctc_nll", xp)[2]
    if zero_infinity:
        loss = np.where(np.isinf(loss), 0.0, loss)
    return loss.astype(log_probs.dtype).reshape(() if log_probs.ndim == 2 else -1)


def _ctc_spec(log_probs, targets, input_lengths, target_lengths, *, blank, name="ctc_nll", **_):
    if len(log_probs.shape) not in (2, 3):
        raise ShapeError(f"{name}(): log_probs must be (T, N, C) or (T, C), got shape {log_probs.shape}")
    batched = len(log_probs.shape) == 3
    if len(targets.shape) > 2 or (not batched and len(targets.shape) != 1):
        raise ShapeError(f"{name}(): targets must be (N, S) or 1-D (concatenated; (S,) unbatched), got shape "
                         f"{targets.shape}")
    samples = log_probs.shape[1:2] if batched else ()
    for what, t in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        fits = (len(t.shape) == 1 and t.shape[0] in (None, samples[0])) if batched else \
            tuple(t.shape) in ((), (1,), (None,))
        if not fits:
            raise ShapeError(f"{name}(): {what} must hold one length per sample ({samples or 'one'}), got shape "
                             f"{t.shape}")
    if batched and len(targets.shape) == 2 and targets.shape[0] not in (None, samples[0]):
        raise ShapeError(f"{name}(): padded targets need one row per sample ({samples[0]}), got shape {targets.shape}")
    classes = log_probs.shape[-1]
    if classes is not None and not 0 <= blank < classes:
        raise ShapeError(f"{name}(): blank {blank} is not a class of the {classes} classes")
    return samples


ctc_nll.infer(lambda *a, **k: Spec(_ctc_spec(*a, **k), a[0].dtype))


@ctc_nll.grad
def _(log_probs, targets, input_lengths, target_lengths, dloss, *, blank, zero_infinity):
    if is_grad_enabled() and getattr(log_probs, "requires_grad", False):  # recorded for a second derivative
        raise GradientError("ctc_nll(): its gradient op ctc_nll_grad has no gradient rule for log_probs, so no "
                            "second derivative (as in torch): differentiate it once, or detach log_probs")
    return F.ctc_nll_grad(log_probs, targets, input_lengths, target_lengths, dloss, blank=blank,
                           zero_infinity=zero_infinity), None, None, None


@op(f"ctc_nll_grad(nograd {_CTC_INPUTS}, Tensor<floating> dloss, *, int blank=0, bool zero_infinity=False) -> "
    "Tensor dlog_probs")
def ctc_nll_grad(log_probs, targets, input_lengths, target_lengths, dloss, *, blank, zero_infinity, xp=np):
    """Gradient of ctc_nll: −dloss[n]·exp(log Σ_{s: l'ₛ = c} αₜ(s)βₜ(s) − log_probs[t, n, c] + loss[n]) at steps
    t < input_lengths[n], 0 beyond and for an infinite loss under ``zero_infinity``."""
    lp, tg, il, tl = _batched(log_probs, targets, input_lengths, target_lengths)
    alpha, beta, loss, ext = _recursions(lp, tg, il, tl, blank, "ctc_nll_grad", xp)
    steps, classes = lp.shape[0], lp.shape[2]
    through = _log_sum_per_class(alpha + beta, ext, classes, xp)
    with np.errstate(invalid="ignore", over="ignore"):
        grad = -np.exp(through - lp.astype(np.float64) + loss[None, :, None])
    grad = np.where((xp.arange(steps)[:, None] < il.reshape(-1)[None, :])[..., None], grad, 0.0)
    if zero_infinity:
        grad = np.where(np.isinf(loss)[None, :, None], 0.0, grad)
    grad = np.nan_to_num(grad, nan=0.0) if zero_infinity else grad
    grad = grad * dloss.reshape(1, -1, 1).astype(np.float64)
    return grad.astype(log_probs.dtype).reshape(log_probs.shape)


def _log_sum_per_class(terms, ext, classes, xp):
    """(T, N, C): log Σ exp(terms[t, n, s]) over the extended positions s whose class ext[n, s] is c."""
    steps, batch, width = terms.shape
    t_idx, n_idx = (i[..., None] for i in xp.meshgrid(xp.arange(steps), xp.arange(batch), indexing="ij"))
    if xp is np:  # NumPy's logaddexp.at, position after position
        through = np.full((steps, batch, classes), _NEG)
        for s in range(width):
            np.logaddexp.at(through, (t_idx[..., 0], n_idx[..., 0], np.broadcast_to(ext[:, s], (steps, batch))),
                            terms[:, :, s])
        return through
    # CuPy's ufuncs have no logaddexp.at: each class's largest term (maximum.at), then the sum of the terms' exps
    # relative to it (add.at), as a logsumexp
    where = (t_idx, n_idx, xp.broadcast_to(ext[None], terms.shape))
    peak = xp.full((steps, batch, classes), _NEG)
    xp.maximum.at(peak, where, terms)
    peak = xp.where(xp.isfinite(peak), peak, 0.0)  # a class no position holds: log 0 = −inf below
    total = xp.zeros((steps, batch, classes))
    xp.add.at(total, where, np.exp(terms - peak[where]))
    with np.errstate(divide="ignore"):
        return np.log(total) + peak


@ctc_nll_grad.infer
def _(log_probs, targets, input_lengths, target_lengths, dloss, *, blank, zero_infinity):
    want = _ctc_spec(log_probs, targets, input_lengths, target_lengths, blank=blank, name="ctc_nll_grad")
    if tuple(dloss.shape) != tuple(want):
        raise ShapeError(f"ctc_nll_grad(): dloss must have shape {want} (one per sample), got {dloss.shape}")
    return Spec(log_probs.shape, log_probs.dtype)


@ctc_nll_grad.grad
def _(log_probs, targets, input_lengths, target_lengths, ddlog_probs, *, blank, zero_infinity):
    # Linear in dloss: its adjoint sums ddx against the gradient for a dloss of ones. (log_probs is nograd here:
    # ctc_nll's rule refuses to be recorded where that derivative would be needed.)
    batched = len(log_probs.shape) == 3
    ones = F.ones_like(F.sum(log_probs, axis=[0, 2]) if batched else F.sum(log_probs))
    per_step = ddlog_probs * F.ctc_nll_grad(log_probs, targets, input_lengths, target_lengths, ones, blank=blank,
                                           zero_infinity=zero_infinity)
    return None, None, None, None, F.sum(per_step, axis=[0, 2]) if batched else F.sum(per_step)


def _ctc_samples(rng):
    def log_softmax(x):
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    yield Sample.of(log_softmax(rng.standard_normal((6, 2, 4))), np.array([[1, 2, 2], [3, 1, 0]]), np.array([6, 5]),
                    np.array([3, 2]))
    yield Sample.of(log_softmax(rng.standard_normal((5, 3))), np.array([2, 1]), np.array(5), np.array(2), blank=0)
    yield Sample.of(log_softmax(rng.standard_normal((4, 2, 3))), np.array([1, 2, 2]), np.array([4, 3]),
                    np.array([1, 2]), blank=0, zero_infinity=True)


ctc_nll.samples(_ctc_samples)


def _onnx_logaddexp(g, x, y):
    """log(eˣ + eʸ) of float64 Values, −inf where both are (the logaddexp op's own mapping computes in the dtype of
    the op being lowered, float32 for a float32 loss; the recursion runs in float64, as the kernel's)."""
    m = g.op("Max", x, y)
    safe = g.op("Where", g.op("Equal", m, g.scalar(_NEG, m)), g.scalar(0.0, m), m)
    total = g.op("Add", g.op("Exp", g.op("Sub", x, safe)), g.op("Exp", g.op("Sub", y, safe)))
    return g.op("Add", safe, g.op("Log", total))


@ctc_nll.onnx
def _(g, log_probs, targets, input_lengths, target_lengths, *, blank, zero_infinity):
    # ONNX has no CTC op: the kernel's α recursion written out one time step after another, in float64, over the
    # target extended with blanks; each sample's α is read at its last step, input_lengths[n] − 1
    batched = log_probs.ndim == 3
    steps, classes = log_probs.shape[0], log_probs.shape[-1]
    if steps is None or None in targets.shape[(1 if batched and targets.ndim == 2 else 0):]:
        raise g.unsupported("ctc_nll over a number of time steps or a target width known only at run time (the "
                            "recursion is written out one step after another)")
    f64, i64 = D.float64, D.int64
    lp = g.cast(log_probs, f64)
    if not batched:
        lp = g.op("Unsqueeze", lp, g.ints([1]), spec=Spec((steps, 1, classes), f64))
    il, tl = (g.op("Reshape", g.cast(v, i64), g.ints([-1]), spec=Spec((None,), i64))
              for v in (input_lengths, target_lengths))
    tg = g.cast(targets, i64)
    width = targets.shape[-1]
    if not batched:
        tg = g.op("Reshape", tg, g.ints([1, -1]), spec=Spec((1, width), i64))
    elif targets.ndim == 1 and width:  # concatenated: row n is targets[offset[n] + j], j < target_lengths[n]
        offsets = g.op("Sub", g.op("CumSum", tl, g.const(np.array(0, np.int64))), tl)
        places = g.op("Add", g.op("Unsqueeze", offsets, g.ints([1])), g.const(np.arange(width, dtype=np.int64)))
        tg = g.op("Gather", tg, g.op("Min", places, g.const(np.array(width - 1, np.int64))), axis=0,
                  spec=Spec((None, width), i64))
    s = np.arange(2 * width + 1)
    blank_id = g.const(np.array(blank, np.int64))
    neg = g.const(np.array(_NEG))

    def shifted(a, k):  # a[:, s − k], −inf where s < k
        moved = g.op("Gather", a, g.const(np.maximum(s - k, 0)), axis=1)
        return g.op("Where", g.const(s >= k), moved, neg if a.dtype == f64 else blank_id)

    ext = blank_id
    if width:
        ext = g.op("Where", g.const(s % 2 == 1), g.op("Gather", tg, g.const(np.maximum((s - 1) // 2, 0)), axis=1),
                   blank_id, spec=Spec((None, len(s)), i64))
    bounds = g.op("Add", g.op("Mul", tl, g.const(np.array(2, np.int64))), g.const(np.array(1, np.int64)))
    used = g.op("Less", g.const(s), g.op("Unsqueeze", bounds, g.ints([1])))  # (N, W)
    ext = g.op("Where", used, ext, blank_id, spec=Spec((None, len(s)), i64))
    skip = g.op("And", g.op("Not", g.op("Equal", ext, blank_id)), g.op("Not", g.op("Equal", ext, shifted(ext, 2))))
    skip = g.op("And", g.const(s >= 2), skip)
    index = g.op("Expand", g.op("Unsqueeze", ext, g.ints([0])),
                 g.op("Concat", g.op("Shape", lp, end=2), g.ints([len(s)]), axis=0))
    lpe = g.op("Where", g.op("Unsqueeze", used, g.ints([0])), g.op("GatherElements", lp, index, axis=2), neg,
               spec=Spec((steps, None, len(s)), f64))
    nonempty = g.op("Unsqueeze", g.op("Greater", tl, g.const(np.array(0, np.int64))), g.ints([1]))
    first = g.op("Or", g.const(s == 0), g.op("And", g.const(s == 1), nonempty))
    alpha = chosen = g.op("Where", first, g.op("Gather", lpe, g.const(np.array(0, np.int64)), axis=0), neg)
    last = g.op("Unsqueeze", g.op("Sub", il, g.const(np.array(1, np.int64))), g.ints([1]))
    for t in range(1, steps):
        step = _onnx_logaddexp(g, _onnx_logaddexp(g, alpha, shifted(alpha, 1)),
                               g.op("Where", skip, shifted(alpha, 2), neg))
        alpha = g.op("Add", step, g.op("Gather", lpe, g.const(np.array(t, np.int64)), axis=0))
        chosen = g.op("Where", g.op("Equal", last, g.const(np.array(t, np.int64))), alpha, chosen)
    end = g.op("Unsqueeze", g.op("Mul", tl, g.const(np.array(2, np.int64))), g.ints([1]))
    before = g.op("Max", g.op("Sub", end, g.const(np.array(1, np.int64))), g.const(np.array(0, np.int64)))
    final = _onnx_logaddexp(g, g.op("GatherElements", chosen, end, axis=1),
                            g.op("Where", nonempty, g.op("GatherElements", chosen, before, axis=1), neg))
    final = g.op("Reshape", final, g.ints([-1]))
    impossible = g.op("Where", g.op("Equal", tl, g.const(np.array(0, np.int64))), g.const(np.array(0.0)),
                      g.const(np.array(np.inf)))  # no steps: only an empty target fits
    loss = g.op("Where", g.op("Greater", il, g.const(np.array(0, np.int64))), g.op("Neg", final), impossible)
    if zero_infinity:
        loss = g.op("Where", g.op("IsInf", loss), g.const(np.array(0.0)), loss)
    loss = g.cast(g.op("Reshape", loss, g.ints([-1] if batched else []), spec=Spec((None,), f64)), log_probs.dtype)
    return g.op("Identity", loss, spec=g.outputs[0])


@ctc_nll_grad.samples
def _(rng):
    for s in _ctc_samples(rng):
        shape = s.args[0].shape[1:2] if s.args[0].ndim == 3 else ()
        yield Sample.of(*s.args, rng.standard_normal(shape), **s.kwargs)


@function
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
                     zero_infinity=False):
    """``torch.nn.functional.ctc_loss``: ``ctc_nll``'s per-sample losses reduced — "mean": each divided by its
    target length (at least 1), then averaged; "sum"; "none". The lengths may be tensors or lists of ints."""
    if reduction not in ("mean", "sum", "none"):
        raise ArgumentError(f"ctc_loss(): argument 'reduction' must be 'mean', 'sum' or 'none', got {reduction!r}")
    lengths = [t if hasattr(t, "shape") else np.asarray(t, np.int64) for t in (input_lengths, target_lengths)]
    losses = F.ctc_nll(log_probs, targets, *lengths, blank=blank, zero_infinity=zero_infinity)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return F.sum(losses)
    return F.mean(losses / F.cast(F.clip(lengths[1], 1), dtype=losses.dtype))
