"""torch.nn's modules for the shrinking activations and the margin and likelihood losses (``ops/activations.py``,
``ops/margin_losses.py``): each calls its function with the module's settings, as ``layers.py``'s activations and
losses do."""

from __future__ import annotations

from .. import ops as F
from ..ops.margin_losses import _checked
from .layers import _Activation, _Loss
from .module import Module


class Hardshrink(_Activation):
    _op, _attrs = F.hardshrink, ("lambd",)

    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = float(lambd)


class Softshrink(Hardshrink):
    _op = F.softshrink


class Softsign(_Activation):
    _op = F.softsign


class Tanhshrink(_Activation):
    _op = F.tanhshrink


class Threshold(_Activation):
    _op, _attrs = F.threshold, ("threshold", "value")

    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__()
        self.threshold, self.value, self.inplace = float(threshold), float(value), bool(inplace)


class RReLU(Module):
    """Randomized leaky ReLU: in training a slope drawn from [lower, upper] for each element x ≤ 0; in evaluation
    the slope (lower + upper)/2."""

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__()
        self.lower, self.upper, self.inplace = float(lower), float(upper), bool(inplace)

    def forward(self, x):
        return F.rrelu(x, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}" + (", inplace=True" if self.inplace else "")


class SoftMarginLoss(_Loss):
    """log(1 + exp(−target·input)), reduced."""

    _op = F.soft_margin_loss

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        _checked("SoftMarginLoss", size_average, reduce, reduction)
        super().__init__(reduction)


class HingeEmbeddingLoss(_Loss):
    """input where target is 1, max(0, margin − input) where it is −1; reduced."""

    _op, _attrs = F.hinge_embedding_loss, ("margin", "reduction")

    def __init__(self, margin: float = 1.0, size_average=None, reduce=None, reduction: str = "mean"):
        _checked("HingeEmbeddingLoss", size_average, reduce, reduction)
        super().__init__(reduction)
        self.margin = float(margin)


class MultiMarginLoss(_Loss):
    """Per sample Σ_{i ≠ y} w[y]·max(0, margin − x[y] + x[i])^p / C, reduced."""

    _op, _attrs, _weights = F.multi_margin_loss, ("p", "margin", "reduction"), ("weight",)

    def __init__(self, p: int = 1, margin: float = 1.0, weight=None, size_average=None, reduce=None,
                 reduction: str = "mean"):
        _checked("MultiMarginLoss", size_average, reduce, reduction)
        super().__init__(reduction, weight=weight)
        self.p, self.margin = p, float(margin)


class MultiLabelMarginLoss(_Loss):
    """Per sample Σ over its target classes j and the other classes i of max(0, 1 − (x[j] − x[i])) / C, reduced."""

    _op = F.multilabel_margin_loss

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        _checked("MultiLabelMarginLoss", size_average, reduce, reduction)
        super().__init__(reduction)


class MultiLabelSoftMarginLoss(_Loss):
    """Per sample the mean over the classes of −w·(y·log σ(x) + (1 − y)·log σ(−x)), reduced."""

    _op, _weights = F.multilabel_soft_margin_loss, ("weight",)

    def __init__(self, weight=None, size_average=None, reduce=None, reduction: str = "mean"):
        _checked("MultiLabelSoftMarginLoss", size_average, reduce, reduction)
        super().__init__(reduction, weight=weight)


class PoissonNLLLoss(_Loss):
    """exp(input) − target·input (``log_input``), else input − target·log(input + eps); Stirling's term with
    ``full``; reduced."""

    _op, _attrs = F.poisson_nll_loss, ("log_input", "full", "eps", "reduction")

    def __init__(self, log_input: bool = True, full: bool = False, size_average=None, eps: float = 1e-8,
                 reduce=None, reduction: str = "mean"):
        _checked("PoissonNLLLoss", size_average, reduce, reduction)
        super().__init__(reduction)
        self.log_input, self.full, self.eps = bool(log_input), bool(full), float(eps)


class CTCLoss(_Loss):
    """``forward(log_probs, targets, input_lengths, target_lengths)``: the CTC loss, reduced."""

    _op, _attrs = F.ctc_loss, ("blank", "reduction", "zero_infinity")

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False):
        super().__init__(reduction)
        self.blank, self.zero_infinity = int(blank), bool(zero_infinity)


class GaussianNLLLoss(_Loss):
    """``forward(input, target, var)``: ½·(log var + (input − target)²/var) (var clamped to ≥ eps), reduced."""

    _op, _attrs = F.gaussian_nll_loss, ("full", "eps", "reduction")

    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
        super().__init__(reduction)
        self.full, self.eps = bool(full), float(eps)


__all__ = ["CTCLoss", "GaussianNLLLoss", "Hardshrink", "HingeEmbeddingLoss", "MultiLabelMarginLoss",
           "MultiLabelSoftMarginLoss", "MultiMarginLoss", "PoissonNLLLoss", "RReLU", "SoftMarginLoss", "Softshrink",
           "Softsign", "Tanhshrink", "Threshold"]
