"""torch.nn.functional's margin and likelihood losses that ``loss.py`` lacks: soft_margin_loss,
hinge_embedding_loss, multi_margin_loss, multilabel_margin_loss, multilabel_soft_margin_loss, poisson_nll_loss and
gaussian_nll_loss.

Each is written with ops, as torch composes it (or, for the two whose torch kernels are native, as those kernels
compute: the same hinges with the same ties), so its gradients of every order are its ops' and its values are
torch's, edges included. Torch's call forms hold: arguments in torch's positional order, the legacy
``size_average``/``reduce`` refused with a message (pass ``reduction``), and a ``reduction`` other than "mean",
"sum" or "none" is an error naming the function.
"""

import math

from opforge import ops as F

from ..core.errors import ArgumentError, ShapeError
from ._common import D, function


def _checked(name: str, size_average, reduce, reduction: str) -> None:
    if size_average is not None or reduce is not None:
        raise ArgumentError(f"{name}(): size_average= and reduce= (deprecated in torch) are not supported; use "
                            "reduction='mean', 'sum' or 'none'")
    if reduction not in ("mean", "sum", "none"):
        raise ArgumentError(f"{name}(): argument 'reduction' must be 'mean', 'sum' or 'none', got {reduction!r}")


def _reduced(losses, reduction: str):
    if reduction == "none":
        return losses
    return F.mean(losses) if reduction == "mean" else F.sum(losses)


def _hinge(z):
    """max(0, z), passing the gradient where z ≥ 0 (torch's clamp_min: ties included)."""
    return F.where(z >= 0, z, 0.0)


@function
def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """``torch.nn.functional.soft_margin_loss``: log(1 + exp(−target·input)), elementwise, then reduced. Computed
    as softplus(−target·input) without overflow (torch's log1p(exp(·)) gives inf past exp's range, where this gives
    the loss: a documented difference)."""
    _checked("soft_margin_loss", size_average, reduce, reduction)
    return _reduced(F.softplus(-(target * input), threshold=math.inf), reduction)


@function
def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    """``torch.nn.functional.hinge_embedding_loss``: input where target is 1, max(0, margin − input) where it is
    −1 (torch's composition: the first term where target ≠ −1, the second where target ≠ 1), then reduced."""
    _checked("hinge_embedding_loss", size_average, reduce, reduction)
    losses = F.where(target != 1, _hinge(margin - input), 0.0) + F.where(target != -1, input, 0.0)
    return _reduced(losses, reduction)


def _rows(name: str, input, target, target_shape: str):
    """input (C,) or (N, C) as (N, C) (a 0-d one as (1, 1), as torch), and the target as its rows; a wrong shape is
    an error naming the function."""
    if input.ndim > 2:
        raise ShapeError(f"{name}(): input must be (C,) or (N, C), got shape {tuple(input.shape)}")
    want = {"samples": tuple(input.shape[:-1]), "classes": tuple(input.shape)}[target_shape]
    if tuple(target.shape) != want and not (target_shape == "samples" and input.ndim < 2 and target.shape == (1,)):
        raise ShapeError(f"{name}(): an input of shape {tuple(input.shape)} needs a target of shape {want}, got "
                         f"{tuple(target.shape)}")
    if input.ndim == 2:
        return input, target
    return F.reshape(input, shape=[1, -1]), F.reshape(target, shape=[1, -1] if target_shape == "classes" else [1])


def _per_sample(losses, shape):
    """The (N,) losses of _rows' (N, C) rows in ``shape``: (N,), or for an input of fewer dims 0-d (or (1,) where
    torch's multi_margin_loss was given a target of that shape)."""
    return losses if tuple(losses.shape) == tuple(shape) else F.reshape(losses, shape=list(shape))


@function
def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                      reduction="mean"):
    """``torch.nn.functional.multi_margin_loss``: for scores x (C,) or (N, C) and class indices y, per sample
    Σ_{i ≠ y} w[y]·max(0, margin − x[y] + x[i])^p / C, then reduced; p is 1 or 2. The hinge passes no gradient
    at 0 (torch's kernel: z > 0), and ``weight`` (one value per class) gets none, as torch's."""
    _checked("multi_margin_loss", size_average, reduce, reduction)
    if p not in (1, 2):
        raise ArgumentError(f"multi_margin_loss(): argument 'p' must be 1 or 2, got {p!r}")
    x, t = _rows("multi_margin_loss", input, target, "samples")
    classes = x.shape[1]
    if weight is not None and tuple(weight.shape) != (classes,):
        raise ShapeError(f"multi_margin_loss(): weight must hold one value per class, shape ({classes},), got "
                         f"{tuple(weight.shape)}")
    column = F.unsqueeze(t, axis=1)
    z = (x - F.gather(x, 1, column)) + margin
    counted = F.logical_and(z > 0, F.one_hot(t, num_classes=classes) == 0)  # the target's own class adds nothing
    h = F.where(counted, z, 0.0)
    if p == 2:
        h = h * h
    if weight is not None:
        h = h * F.unsqueeze(F.take(weight.detach(), t), axis=1)
    losses = F.sum(h, axis=[1]) / classes
    return _reduced(_per_sample(losses, target.shape), reduction)


@function
def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """``torch.nn.functional.multilabel_margin_loss``: scores x (C,) or (N, C); each target row holds class
    indices, ended by the first −1. Per sample Σ_{j targets} Σ_{i not a target} max(0, 1 − (x[j] − x[i])) / C,
    then reduced (a class listed twice counts twice, as in torch). The hinge passes no gradient at 0 (z > 0)."""
    _checked("multilabel_margin_loss", size_average, reduce, reduction)
    x, t = _rows("multilabel_margin_loss", input, target, "classes")
    classes = x.shape[1]
    listed = F.cumprod(F.cast(t != -1, dtype=D.int64), dim=1) > 0  # (N, K): the slots before the first −1
    slots = F.where(listed, t, 0)
    is_target = F.sum(F.where(F.unsqueeze(listed, axis=2), F.one_hot(slots, num_classes=classes), 0), axis=[1]) > 0
    z = 1.0 - F.unsqueeze(F.gather(x, 1, slots), axis=2) + F.unsqueeze(x, axis=1)  # (N, K, C): slot k, class i
    counted = F.logical_and(F.logical_and(F.unsqueeze(listed, axis=2), F.unsqueeze(~is_target, axis=1)), z > 0)
    losses = F.sum(F.where(counted, z, 0.0), axis=[1, 2]) / classes
    return _reduced(_per_sample(losses, input.shape[:-1]), reduction)


@function
def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """``torch.nn.functional.multilabel_soft_margin_loss``: per sample the mean over the classes (the last dim) of
    −w·(y·log σ(x) + (1 − y)·log σ(−x)), then reduced."""
    _checked("multilabel_soft_margin_loss", size_average, reduce, reduction)
    losses = -(target * F.logsigmoid(input) + (1 - target) * F.logsigmoid(-input))
    if weight is not None:
        losses = losses * weight
    return _reduced(F.sum(losses, axis=[-1]) / input.shape[-1], reduction)


@function
def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    """``torch.nn.functional.poisson_nll_loss``: exp(input) − target·input (``log_input``), else input −
    target·log(input + eps); with ``full``, Stirling's target·log(target) − target + ½·log(2π·target) is added
    where target > 1. Then reduced."""
    _checked("poisson_nll_loss", size_average, reduce, reduction)
    losses = F.exp(input) - target * input if log_input else input - target * F.log(input + eps)
    if full:
        stirling = target * F.log(target) - target + 0.5 * F.log(target * (2 * math.pi))
        losses = losses + F.masked_fill(stirling, target <= 1, 0.0)
    return _reduced(losses, reduction)


@function
def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """``torch.nn.functional.gaussian_nll_loss``: ½·(log v + (input − target)²/v), plus ½·log 2π with ``full``,
    where v is ``var`` clamped to ≥ eps (the clamp passes the gradient unchanged, as torch's clamp under no_grad);
    then reduced. ``var`` has the input's shape, or one dim fewer (one variance per row), or a size-1 dim where
    the input has another; a number is a variance for every element. A negative variance is an error, checked
    eagerly (in a compiled program the values are unknown when it is traced: there it is clamped)."""
    _checked("gaussian_nll_loss", None, None, reduction)
    if isinstance(var, (int, float)):
        if var < 0:
            raise ArgumentError("gaussian_nll_loss(): var has negative entry/entries")
        var = F.ones_like(input) * float(var)
    elif getattr(var, "interpreter", None) is None and bool((var < 0).numpy().any()):
        raise ArgumentError("gaussian_nll_loss(): var has negative entry/entries")
    shape, var_shape = tuple(input.shape), tuple(var.shape)
    if var_shape != shape:
        if var_shape == shape[:-1]:
            var = F.unsqueeze(var, axis=-1)
        elif not (len(var_shape) == len(shape) and sum(v for d, v in zip(shape, var_shape) if d != v) == 1):
            raise ShapeError(f"gaussian_nll_loss(): var of shape {var_shape} fits no input of shape {shape} (the "
                             "same shape, one dim fewer, or a size-1 dim where the input has another)")
    kept = var.detach()
    var = F.clip(kept, eps) + (var - kept)  # the clamped value; the gradient of var itself
    losses = 0.5 * (F.log(var) + F.square(input - target) / var)
    if full:
        losses = losses + 0.5 * math.log(2 * math.pi)
    return _reduced(losses, reduction)
