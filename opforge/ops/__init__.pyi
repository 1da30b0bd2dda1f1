"""Typed stubs for ``opforge.ops``, generated from the op registry; do not edit.

Regenerate with `python -m opforge.cli docs`.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeAlias

import numpy as np

from opforge.tensor import Tensor

_TensorLike: TypeAlias = Tensor | np.ndarray | float  # dispatch turns arrays and Python numbers into Tensors
_DTypeLike: TypeAlias = str | np.dtype | type

def __getattr__(name: str) -> Any: ...  # ops defined at run time (yours) are attributes too

# -- opforge.ops.accumulate

def add_n(xs: Sequence[_TensorLike]) -> Tensor:
    """x₀ + x₁ + … in one op (all of one shape, or broadcasting together)."""

# -- opforge.ops.activations

def hardshrink(x: _TensorLike, lambd: float = 0.5) -> Tensor:
    """y = 0 where −lambd ≤ x ≤ lambd, else x."""

def softshrink(x: _TensorLike, lambd: float = 0.5) -> Tensor:
    """y = x − lambd above lambd, x + lambd below −lambd, 0 between (NaN stays NaN)."""

def shrink_grad(x: _TensorLike, dy: _TensorLike, *, lambd: float = 0.5) -> Tensor:
    """Gradient of hardshrink and softshrink: dy where x < −lambd or x > lambd, else 0; NaN where x is NaN (the
    library's rule for elementwise gradients; torch gives 0 there).
    """

def threshold(x: _TensorLike, threshold: float, value: float) -> Tensor:
    """y = value where x ≤ threshold, else x (NaN stays NaN)."""

def threshold_grad(x: _TensorLike, dy: _TensorLike, *, threshold: float) -> Tensor:
    """Gradient of threshold: 0 where x ≤ threshold, else dy; NaN where x is NaN (torch gives dy there)."""

class _rrelu_with_noise_result(NamedTuple):
    y: Tensor
    noise: Tensor

def rrelu_with_noise(
    x: _TensorLike,
    *,
    lower: float = 0.125,
    upper: float = 0.3333333333333333,
    training: bool = False,
) -> _rrelu_with_noise_result:
    """Randomized leaky ReLU (torch's ``rrelu_with_noise``): y = x·noise, where ``noise`` is 1 for x > 0 and,
    for x ≤ 0, a slope drawn uniformly from [lower, upper] per element while ``training``, else (lower +
    upper)/2 (then it is leaky_relu with that slope). The slopes are an output so that backward uses the ones
    the forward pass drew (dx = dy·noise); draws come from the seeded generator.
    """

# -- opforge.ops.binary

def add(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x + y."""

def sub(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x − y."""

def minus(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x − y, with the gradient of PaddlePaddle's design example: identity and scale(−1)."""

def mul(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x · y."""

def div(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x / y: true division, as ``torch.div``; integers and bools give the default float dtype, float32."""

def pow(x: _TensorLike, y: _TensorLike) -> Tensor:
    """xʸ."""

def maximum(x: _TensorLike, y: _TensorLike) -> Tensor:
    """The larger of x and y, elementwise."""

def minimum(x: _TensorLike, y: _TensorLike) -> Tensor:
    """The smaller of x and y, elementwise."""

def where(condition: _TensorLike, x: _TensorLike, y: _TensorLike) -> Tensor:
    """x where condition holds, else y."""

def less(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x < y."""

def less_equal(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x ≤ y."""

def greater(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x > y."""

def greater_equal(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x ≥ y."""

def equal(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x == y."""

def not_equal(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x ≠ y."""

def logical_and(x: _TensorLike, y: _TensorLike) -> Tensor:
    """True where both x and y are nonzero (True)."""

def logical_or(x: _TensorLike, y: _TensorLike) -> Tensor:
    """True where x or y is nonzero (True)."""

# -- opforge.ops.collective

def all_reduce(x: _TensorLike, *, op: str = 'sum', group: int | None = None) -> Tensor:
    """Every rank gets the elementwise sum, mean or max of ``x`` over the ranks (of the current communicator, or
    of axis ``group`` of the current n-D mesh: so for every collective).
    """

def all_gather(x: _TensorLike, *, axis: int = 0, group: int | None = None) -> Tensor:
    """Every rank gets the ranks' ``x`` concatenated along ``axis``, in rank order."""

def reduce_scatter(x: _TensorLike, *, axis: int = 0, op: str = 'sum', group: int | None = None) -> Tensor:
    """Rank r gets block r, along ``axis``, of the elementwise sum (or mean) of ``x`` over the ranks."""

def broadcast(x: _TensorLike, *, root: int = 0, group: int | None = None) -> Tensor:
    """Every rank gets rank ``root``'s ``x``."""

def reduce(x: _TensorLike, *, root: int = 0, op: str = 'sum', group: int | None = None) -> Tensor:
    """Rank ``root`` gets the elementwise sum (or mean) of ``x`` over the ranks; the other ranks get zeros."""

def all_to_all(x: _TensorLike, *, split_axis: int = 0, concat_axis: int = 0, group: int | None = None) -> Tensor:
    """``x`` is cut into one block per rank along ``split_axis``; block j goes to rank j, which concatenates the
    blocks it receives in rank order along ``concat_axis`` (resharding S(split) to S(concat)).
    """

# -- opforge.ops.conv

def conv1d(
    x: _TensorLike,
    weight: _TensorLike,
    bias: _TensorLike | None = None,
    stride: Sequence[int] | int = [1],
    padding: Sequence[int] | int | str = [0],
    dilation: Sequence[int] | int = [1],
    groups: int = 1,
) -> Tensor:
    """1-D convolution (cross-correlation, as PyTorch): x (N, C, L), weight (O, C/groups, kL), bias (O,) give y
    (N, O, OL) with y[n, o, p] = bias[o] + Σ_{c, i} weight[o, c, i] · x_pad[n, g·C/groups + c, p·s + i·d], g
    being the group of output channel o. ``padding`` is ints, "valid" (none) or "same" (stride 1).
    """

def conv2d(
    x: _TensorLike,
    weight: _TensorLike,
    bias: _TensorLike | None = None,
    stride: Sequence[int] | int = [1, 1],
    padding: Sequence[int] | int | str = [0, 0],
    dilation: Sequence[int] | int = [1, 1],
    groups: int = 1,
) -> Tensor:
    """2-D convolution (cross-correlation, as PyTorch): x (N, C, H, W), weight (O, C/groups, kH, kW), bias (O,)
    give y (N, O, OH, OW) with y[n, o, p, q] = bias[o] + Σ_{c, i, j} weight[o, c, i, j] · x_pad[n, g·C/groups +
    c, p·sH + i·dH, q·sW + j·dW], g being the group of output channel o. ``padding`` is ints, "valid" (none) or
    "same" (stride 1).
    """

def conv3d(
    x: _TensorLike,
    weight: _TensorLike,
    bias: _TensorLike | None = None,
    stride: Sequence[int] | int = [1, 1, 1],
    padding: Sequence[int] | int | str = [0, 0, 0],
    dilation: Sequence[int] | int = [1, 1, 1],
    groups: int = 1,
) -> Tensor:
    """3-D convolution (cross-correlation, as PyTorch): x (N, C, D, H, W), weight (O, C/groups, kD, kH, kW),
    bias (O,) give y (N, O, OD, OH, OW), each output the weighted sum of a dilated, strided window of the padded
    input over the channels of its group. ``padding`` is ints, "valid" (none) or "same" (stride 1).
    """

def conv_grad_input(
    dy: _TensorLike,
    weight: _TensorLike,
    *,
    input_size: Sequence[int] | int,
    stride: Sequence[int] | int = [1],
    padding: Sequence[int] | int | str = [0],
    dilation: Sequence[int] | int = [1],
    groups: int = 1,
) -> Tensor:
    """Gradient of a convolution (1-, 2- or 3-D, by the weight's rank) with respect to its input of spatial size
    ``input_size``: the transposed convolution of dy with the weight. Input positions no output read get 0.
    """

def conv_grad_weight(
    x: _TensorLike,
    dy: _TensorLike,
    *,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int = [1],
    padding: Sequence[int] | int | str = [0],
    dilation: Sequence[int] | int = [1],
    groups: int = 1,
) -> Tensor:
    """Gradient of a convolution (1-, 2- or 3-D, by the input's rank) with respect to its weight of spatial size
    ``kernel_size``: dweight[o, c, *i] = Σ_{n, *p} dy[n, o, *p] · x_pad[n, g·C/groups + c, *(p·s + i·d)].
    """

def conv_transpose1d(
    x: _TensorLike,
    weight: _TensorLike,
    bias: _TensorLike | None = None,
    *,
    stride: Sequence[int] | int = [1],
    padding: Sequence[int] | int = [0],
    output_padding: Sequence[int] | int = [0],
    groups: int = 1,
    dilation: Sequence[int] | int = [1],
) -> Tensor:
    """1-D transposed convolution (PyTorch's): x (N, C, L), weight (C, O/groups, kL), bias (O,) give y (N, O, (L
    − 1)·s − 2·p + d·(kL − 1) + output_padding + 1), the gradient of conv1d with respect to its input, plus the
    bias. ``output_padding`` (less than the stride) adds positions behind.
    """

def conv_transpose2d(
    x: _TensorLike,
    weight: _TensorLike,
    bias: _TensorLike | None = None,
    *,
    stride: Sequence[int] | int = [1, 1],
    padding: Sequence[int] | int = [0, 0],
    output_padding: Sequence[int] | int = [0, 0],
    groups: int = 1,
    dilation: Sequence[int] | int = [1, 1],
) -> Tensor:
    """2-D transposed convolution (PyTorch's): x (N, C, H, W), weight (C, O/groups, kH, kW), bias (O,) give y
    (N, O, OH, OW) with OH = (H − 1)·sH − 2·pH + dH·(kH − 1) + output_padding + 1 (and so for OW), the gradient
    of conv2d with respect to its input, plus the bias.
    """

def conv_transpose3d(
    x: _TensorLike,
    weight: _TensorLike,
    bias: _TensorLike | None = None,
    *,
    stride: Sequence[int] | int = [1, 1, 1],
    padding: Sequence[int] | int = [0, 0, 0],
    output_padding: Sequence[int] | int = [0, 0, 0],
    groups: int = 1,
    dilation: Sequence[int] | int = [1, 1, 1],
) -> Tensor:
    """3-D transposed convolution (PyTorch's): x (N, C, D, H, W), weight (C, O/groups, kD, kH, kW), bias (O,):
    the gradient of conv3d with respect to its input, plus the bias; each output size is (n − 1)·s − 2·p + d·(k
    − 1) + output_padding + 1.
    """

def unfold(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    dilation: Sequence[int] | int = [1, 1],
    padding: Sequence[int] | int = [0, 0],
    stride: Sequence[int] | int = [1, 1],
) -> Tensor:
    """im2col (PyTorch's ``F.unfold``): the sliding kH×kW windows of x (N, C, H, W) — or (C, H, W) — as columns,
    y (N, C·kH·kW, L), L the number of windows; rows run over (channel, kernel row, kernel column).
    """

def fold(
    x: _TensorLike,
    output_size: Sequence[int] | int,
    kernel_size: Sequence[int] | int,
    dilation: Sequence[int] | int = [1, 1],
    padding: Sequence[int] | int = [0, 0],
    stride: Sequence[int] | int = [1, 1],
) -> Tensor:
    """col2im (PyTorch's ``F.fold``), the transpose of unfold: the columns of x (N, C·kH·kW, L) — or (C·kH·kW,
    L) — added back into an image y (N, C, *output_size) where their windows lie; overlaps add up.
    """

# -- opforge.ops.creation

def zeros(*, shape: Sequence[int] | int, dtype: _DTypeLike | None = None) -> Tensor:
    """A tensor of zeros (float32 unless ``dtype`` says otherwise)."""

def ones(*, shape: Sequence[int] | int, dtype: _DTypeLike | None = None) -> Tensor:
    """A tensor of ones (float32 unless ``dtype`` says otherwise)."""

def full(*, shape: Sequence[int] | int, fill_value: float, dtype: _DTypeLike | None = None) -> Tensor:
    """A tensor filled with ``fill_value``."""

def normal(
    *,
    shape: Sequence[int] | int,
    mean: float = 0.0,
    std: float = 1.0,
    dtype: _DTypeLike | None = None,
) -> Tensor:
    """Samples of N(mean, std²)."""

def uniform(
    *,
    shape: Sequence[int] | int,
    low: float = 0.0,
    high: float = 1.0,
    dtype: _DTypeLike | None = None,
) -> Tensor:
    """Samples of U[low, high)."""

def arange(*, start: float, stop: float, step: float = 1.0, dtype: _DTypeLike | None = None) -> Tensor:
    """Evenly spaced values in [start, stop)."""

def eye(n: int, m: int | None = None, *, dtype: _DTypeLike | None = None) -> Tensor:
    """The n×m identity matrix (m defaults to n)."""

def bernoulli(p: _TensorLike) -> Tensor:
    """Draws 1 with probability ``p`` (elementwise), else 0, in ``p``'s dtype, from the seeded generator."""

def multinomial(input: _TensorLike, num_samples: int, replacement: bool = False) -> Tensor:
    """``torch.multinomial``: for each row of ``input`` (1-D: one row; 2-D: one per row) of non-negative
    weights, which need not sum to 1, ``num_samples`` category indices drawn with probabilities proportional to
    the weights. Without ``replacement`` an index is drawn at most once (each draw among the categories not
    drawn yet: the exponential race, keys E/w with E ~ Exp(1), smallest first). The draws are the seeded
    generator's, not torch's.
    """

# -- opforge.ops.ctc

def ctc_nll(
    log_probs: _TensorLike,
    targets: _TensorLike,
    input_lengths: _TensorLike,
    target_lengths: _TensorLike,
    *,
    blank: int = 0,
    zero_infinity: bool = False,
) -> Tensor:
    """CTC's −log p(target | log_probs) per sample: log_probs (T, N, C) — or (T, C) — of which sample n uses the
    first input_lengths[n] steps; targets (N, S) padded, or 1-D concatenated, of target_lengths[n] classes each
    (none the ``blank``). (N,) losses, 0-d unbatched; an impossible alignment is inf, or 0 with
    ``zero_infinity``. ``F.ctc_loss`` reduces them as torch's.
    """

def ctc_nll_grad(
    log_probs: _TensorLike,
    targets: _TensorLike,
    input_lengths: _TensorLike,
    target_lengths: _TensorLike,
    dloss: _TensorLike,
    *,
    blank: int = 0,
    zero_infinity: bool = False,
) -> Tensor:
    """Gradient of ctc_nll: −dloss[n]·exp(log Σ_{s: l'ₛ = c} αₜ(s)βₜ(s) − log_probs[t, n, c] + loss[n]) at steps
    t < input_lengths[n], 0 beyond and for an infinite loss under ``zero_infinity``.
    """

# -- opforge.ops.device

def to_device(x: _TensorLike, *, device: str) -> Tensor:
    """A copy of x on ``device`` (the name of a registered device). ``xp`` is the array module of x's device:
    one with memory of its own (CuPy's) has ``asnumpy``, which reads x back to the host.
    """

# -- opforge.ops.elementwise

def identity(x: _TensorLike) -> Tensor:
    """Returns its input unchanged (a new tensor sharing the data)."""

def scale(x: _TensorLike, *, scale: float) -> Tensor:
    """Multiplies by a constant: y = scale · x."""

def square(x: _TensorLike) -> Tensor:
    """y = x²."""

def sqrt(x: _TensorLike) -> Tensor:
    """y = √x."""

def sqrt_grad(y: _TensorLike, dy: _TensorLike) -> Tensor:
    """Gradient of sqrt from its output: dx = dy / (2·y)."""

def leaky_relu(x: _TensorLike, alpha: float = 0.01, *, negative_slope: float | None = None) -> Tensor:
    """y = x where x > 0, else alpha · x."""

def leaky_relu_grad(x: _TensorLike, dy: _TensorLike, *, alpha: float) -> Tensor:
    """Gradient of leaky_relu: dx = dy where x > 0, else alpha · dy (NaN where x is NaN)."""

def neg(x: _TensorLike) -> Tensor:
    """y = −x."""

def exp(x: _TensorLike) -> Tensor:
    """y = eˣ."""

def log(x: _TensorLike) -> Tensor:
    """Natural logarithm."""

def tanh(x: _TensorLike) -> Tensor:
    """Hyperbolic tangent."""

def tanh_grad(y: _TensorLike, dy: _TensorLike) -> Tensor:
    """Gradient of tanh from its output: dx = dy·(1 − y²)."""

def sigmoid(x: _TensorLike) -> Tensor:
    """y = 1 / (1 + e⁻ˣ) (PyTorch's values, at the tails too)."""

def sigmoid_grad(y: _TensorLike, dy: _TensorLike) -> Tensor:
    """Gradient of sigmoid from its output: dx = dy·y·(1 − y)."""

def relu(x: _TensorLike) -> Tensor:
    """y = max(x, 0)."""

def relu_grad(y: _TensorLike, dy: _TensorLike) -> Tensor:
    """Gradient of relu from its output: dx = dy where y > 0, else 0 (NaN where y is NaN)."""

def abs(x: _TensorLike) -> Tensor:
    """|x|."""

def cast(x: _TensorLike, *, dtype: _DTypeLike) -> Tensor:
    """Converts to ``dtype`` (a copy, even when the dtype is unchanged)."""

def zeros_like(x: _TensorLike, *, dtype: _DTypeLike | None = None) -> Tensor:
    """Zeros of the shape (and, unless ``dtype`` is given, the dtype) of ``x``."""

def ones_like(x: _TensorLike, *, dtype: _DTypeLike | None = None) -> Tensor:
    """Ones of the shape (and, unless ``dtype`` is given, the dtype) of ``x``."""

def sign(x: _TensorLike) -> Tensor:
    """−1, 0 or 1 as x is negative, zero or positive (0 for NaN, as PyTorch)."""

def floor(x: _TensorLike) -> Tensor:
    """The largest integer ≤ x (integer tensors are returned unchanged)."""

def ceil(x: _TensorLike) -> Tensor:
    """The smallest integer ≥ x (integer tensors are returned unchanged)."""

def round(x: _TensorLike, *, decimals: int = 0) -> Tensor:
    """The nearest integer, halves to the even one (round(2.5) = 2), as PyTorch; with ``decimals`` the nearest
    multiple of 10^−decimals, computed as PyTorch does: rint(x·10^d)/10^d, or rint(x/10^−d)·10^−d for d < 0 (so
    10^|d| is exact). Integer tensors: unchanged, or rounded to tens, hundreds, ... for decimals < 0 (PyTorch
    refuses integers with decimals).
    """

def expm1(x: _TensorLike) -> Tensor:
    """y = eˣ − 1, exact for small x."""

def log1p(x: _TensorLike) -> Tensor:
    """y = ln(1 + x), exact for small x."""

def rsqrt(x: _TensorLike) -> Tensor:
    """y = 1/√x."""

def reciprocal(x: _TensorLike) -> Tensor:
    """y = 1/x."""

def sin(x: _TensorLike) -> Tensor:
    """Sine."""

def cos(x: _TensorLike) -> Tensor:
    """Cosine."""

def erf(x: _TensorLike) -> Tensor:
    """The error function, erf(x) = 2/√π ∫₀ˣ e^(−t²) dt."""

def softplus(x: _TensorLike, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """y = ln(1 + e^(βx))/β, and y = x where βx > threshold (as PyTorch, where the two agree to float
    precision).
    """

def elu(x: _TensorLike, alpha: float = 1.0) -> Tensor:
    """y = x for x > 0, α·(eˣ − 1) otherwise."""

def selu(x: _TensorLike) -> Tensor:
    """y = λ·elu(x, α) with PyTorch's constants λ ≈ 1.0507, α ≈ 1.6733 (self-normalising)."""

def gelu(x: _TensorLike, *, approximate: str = 'none') -> Tensor:
    """y = x·Φ(x) with Φ the standard normal CDF; approximate="tanh": ½x·(1 + tanh(√(2/π)·(x + 0.044715x³)))."""

def gelu_grad(x: _TensorLike, dy: _TensorLike, *, approximate: str = 'none') -> Tensor:
    """Gradient of gelu: dx = dy·gelu′(x); gelu′ = Φ + x·φ exactly, φ the standard normal density."""

def silu(x: _TensorLike) -> Tensor:
    """y = x·σ(x), σ the logistic sigmoid (also called swish)."""

def clip(x: _TensorLike, min: _TensorLike | None = None, max: _TensorLike | None = None) -> Tensor:
    """x limited to [min, max], as ``torch.clamp``: either bound may be None, and each is a number or a tensor
    that broadcasts with ``x`` (min > max gives max). The dtype is torch's result type too: a number, or a 0-d
    tensor, changes it only where it is of a higher kind (an integer tensor clipped at 2.5 becomes float32, at 2
    stays integer).
    """

def isnan(x: _TensorLike) -> Tensor:
    """True where x is NaN."""

def isfinite(x: _TensorLike) -> Tensor:
    """True where x is neither infinite nor NaN (always, for integers and bools)."""

def logical_not(x: _TensorLike) -> Tensor:
    """True where x is 0 (or False)."""

def hardtanh(x: _TensorLike, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """x limited to [min_val, max_val]; the gradient is 0 at the bounds (as PyTorch), unlike clip's."""

def hardtanh_grad(x: _TensorLike, dy: _TensorLike, *, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """Gradient of hardtanh: dx = dy where min_val < x < max_val (bounds excluded), else 0; NaN where x is NaN."""

def relu6(x: _TensorLike) -> Tensor:
    """y = min(max(x, 0), 6): hardtanh on [0, 6], with its zero gradient at 0 and 6."""

def hardsigmoid(x: _TensorLike) -> Tensor:
    """y = min(max(x/6 + ½, 0), 1): 0 below −3, 1 above 3, linear between (gradient 0 at ±3, as PyTorch)."""

def hardswish(x: _TensorLike) -> Tensor:
    """y = x·hardsigmoid(x) = x·min(max(x + 3, 0), 6)/6."""

def hardswish_grad(x: _TensorLike, dy: _TensorLike) -> Tensor:
    """Gradient of hardswish: dx = dy·(x/3 + ½) for −3 < x < 3, 0 for x ≤ −3, dy for x ≥ 3 (PyTorch's values)."""

def mish(x: _TensorLike) -> Tensor:
    """y = x·tanh(softplus(x)), softplus(x) = log(1 + eˣ)."""

def logsigmoid(x: _TensorLike) -> Tensor:
    """y = log σ(x) = −softplus(−x), computed as min(x, 0) − log(1 + e^(−|x|)): no overflow, exact for x ≪ 0."""

def celu(x: _TensorLike, alpha: float = 1.0) -> Tensor:
    """y = x for x > 0, α·(e^(x/α) − 1) otherwise (continuously differentiable elu)."""

def softmin(x: _TensorLike, axis: int = -1, *, dim: int | None = None) -> Tensor:
    """softmax(−x) along ``axis``: exp(−x) / Σ exp(−x), shifted by min x so nothing overflows."""

def glu(x: _TensorLike, axis: int = -1, *, dim: int | None = None) -> Tensor:
    """Gated linear unit: x split in halves a, b along ``axis``, y = a·σ(b)."""

def prelu(x: _TensorLike, weight: _TensorLike) -> Tensor:
    """y = x where x > 0, else weight·x; ``weight`` is 0-d, (1,) or (C,), C the size of dim 1 (1 for an x of
    fewer dims), as torch's.
    """

# -- opforge.ops.elementwise_math

def acos(x: _TensorLike) -> Tensor:
    """Inverse cosine (NaN outside [−1, 1])."""

def acosh(x: _TensorLike) -> Tensor:
    """Inverse hyperbolic cosine (NaN below 1)."""

def asin(x: _TensorLike) -> Tensor:
    """Inverse sine (NaN outside [−1, 1])."""

def asinh(x: _TensorLike) -> Tensor:
    """Inverse hyperbolic sine."""

def atan(x: _TensorLike) -> Tensor:
    """Inverse tangent."""

def atanh(x: _TensorLike) -> Tensor:
    """Inverse hyperbolic tangent (±inf at ±1, NaN beyond)."""

def cosh(x: _TensorLike) -> Tensor:
    """Hyperbolic cosine."""

def exp2(x: _TensorLike) -> Tensor:
    """2ˣ."""

def frac(x: _TensorLike) -> Tensor:
    """The fractional part, x − trunc(x), with the sign of x (torch's frac: floating only)."""

def log10(x: _TensorLike) -> Tensor:
    """Logarithm to base 10."""

def log2(x: _TensorLike) -> Tensor:
    """Logarithm to base 2."""

def sinh(x: _TensorLike) -> Tensor:
    """Hyperbolic sine."""

def tan(x: _TensorLike) -> Tensor:
    """Tangent."""

def trunc(x: _TensorLike) -> Tensor:
    """x rounded towards 0 (integer tensors are returned unchanged)."""

def logit(x: _TensorLike, eps: float | None = None) -> Tensor:
    """ln(z / (1 − z)) with z = x, or x clamped to [eps, 1 − eps] when ``eps`` is given (NaN outside [0, 1]
    without it).
    """

def isinf(x: _TensorLike) -> Tensor:
    """True where x is +inf or −inf (never for integers and bools)."""

def isneginf(x: _TensorLike) -> Tensor:
    """True where x is −inf."""

def isposinf(x: _TensorLike) -> Tensor:
    """True where x is +inf."""

def nan_to_num(x: _TensorLike, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """NaN, +inf and −inf replaced by ``nan``, ``posinf`` and ``neginf`` (by default the largest and the
    smallest finite value of x's dtype); integers and bools unchanged.
    """

def atan2(x: _TensorLike, y: _TensorLike) -> Tensor:
    """The angle of the point (y=x, x=y) in (−π, π]: ``torch.atan2(input, other)`` is atan(input / other) in the
    right quadrant.
    """

def bitwise_left_shift(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x << y: x·2ʸ, wrapping around; 0 for shifts by a negative count or by the width or more."""

def bitwise_right_shift(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x >> y: floor(x / 2ʸ); shifts by a negative count or by the width or more give 0 (−1 for a negative x)."""

def bitwise_xor(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x ^ y, bit by bit (the logical xor of bools)."""

def copysign(x: _TensorLike, y: _TensorLike) -> Tensor:
    """|x| with the sign of y (the sign bit: −0.0 counts as negative)."""

def fmax(x: _TensorLike, y: _TensorLike) -> Tensor:
    """The larger of x and y, ignoring a NaN (NaN where both are)."""

def fmin(x: _TensorLike, y: _TensorLike) -> Tensor:
    """The smaller of x and y, ignoring a NaN (NaN where both are)."""

def fmod(x: _TensorLike, y: _TensorLike) -> Tensor:
    """The remainder of x / y rounded towards 0, with the sign of x (C's fmod; ``remainder`` takes the sign of
    y). Integers divided by 0 raise ``DivisionByZeroError``, as torch.
    """

def hypot(x: _TensorLike, y: _TensorLike) -> Tensor:
    """√(x² + y²), without overflow."""

def logaddexp(x: _TensorLike, y: _TensorLike) -> Tensor:
    """ln(eˣ + eʸ), without overflow."""

def xlogy(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x·ln(y), 0 where x = 0 (unless y is NaN), as ``torch.xlogy``."""

def logical_xor(x: _TensorLike, y: _TensorLike) -> Tensor:
    """True where exactly one of x and y is nonzero (True)."""

def isclose(
    x: _TensorLike,
    y: _TensorLike,
    rtol: float = 1e-05,
    atol: float = 1e-08,
    equal_nan: bool = False,
) -> Tensor:
    """|x − y| ≤ atol + |rtol·y| elementwise, as torch's: equal values (infinities included) are close, NaN is
    close to NaN only with ``equal_nan``. Integers and bools compare their differences in float32, as torch.
    """

def lerp(x: _TensorLike, end: _TensorLike, weight: _TensorLike) -> Tensor:
    """x + weight·(end − x), computed as torch does: from the nearer end (end − (end − x)·(1 − weight) where
    |weight| ≥ ½), so that a weight of 1 gives ``end`` exactly.
    """

# -- opforge.ops.embedding_bags

def embedding_bag(
    index: _TensorLike,
    weight: _TensorLike,
    offsets: _TensorLike | None = None,
    *,
    per_sample_weights: _TensorLike | None = None,
    mode: str = 'mean',
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> Tensor:
    """``torch.nn.functional.embedding_bag``: for each bag of indices, the sum, mean or max (per feature,
    ``mode``) of the rows of ``weight`` they pick, (bags, embedding_dim). A 2-D index holds one bag per row; a
    1-D index is cut into bags at ``offsets`` (which starts at 0; with ``include_last_offset`` its last entry,
    len(index), closes the last bag). ``per_sample_weights`` (mode "sum") scales each row first. Entries equal
    to ``padding_idx`` are left out (a mean divides by the others' count); an empty bag gives zeros. A max's
    gradient goes to the first entry of the bag that holds it. Not offered: max_norm (it rewrites the weight),
    scale_grad_by_freq, sparse.
    """

# -- opforge.ops.feature_dropout

class _dropout1d_with_mask_result(NamedTuple):
    y: Tensor
    mask: Tensor

def dropout1d_with_mask(x: _TensorLike, *, p: float = 0.5, training: bool = True) -> _dropout1d_with_mask_result:
    """Zeroes each channel of x (N, C, L) or (C, L) with probability ``p`` and scales the kept ones by 1/(1 − p)
    (the identity when not ``training``); also returns the mask of kept channels.
    """

class _dropout2d_with_mask_result(NamedTuple):
    y: Tensor
    mask: Tensor

def dropout2d_with_mask(x: _TensorLike, *, p: float = 0.5, training: bool = True) -> _dropout2d_with_mask_result:
    """Zeroes each channel of x (N, C, H, W) with probability ``p`` and scales the kept ones by 1/(1 − p) (the
    identity when not ``training``); also returns the mask of kept channels. A 3-D input is read as (N, C, L),
    as PyTorch reads it now (it warns that it will read (C, H, W) in a future release).
    """

class _dropout3d_with_mask_result(NamedTuple):
    y: Tensor
    mask: Tensor

def dropout3d_with_mask(x: _TensorLike, *, p: float = 0.5, training: bool = True) -> _dropout3d_with_mask_result:
    """Zeroes each channel of x (N, C, D, H, W) or (C, D, H, W) with probability ``p`` and scales the kept ones
    by 1/(1 − p) (the identity when not ``training``); also returns the mask of kept channels.
    """

# -- opforge.ops.indexing

def take(x: _TensorLike, index: _TensorLike, *, axis: int | None = None, dim: int | None = None) -> Tensor:
    """The elements of ``x`` at ``index`` along ``axis``, as ``np.take``: the result's shape is ``x.shape`` with
    dim ``axis`` replaced by ``index.shape``. With ``axis=None`` it indexes the flattened ``x``
    (``torch.take``). Negative indices count from the end. ``x[index_tensor]`` is this op.
    """

def take_grad(dy: _TensorLike, index: _TensorLike, *, shape: Sequence[int] | int, axis: int | None = None) -> Tensor:
    """Gradient of ``take``: zeros of ``shape`` with each element of ``dy`` added at the position ``take`` read
    it from (an index that repeats collects the sum).
    """

def gather(x: _TensorLike, axis: int, index: _TensorLike, *, dim: int | None = None) -> Tensor:
    """``torch.gather``: ``y[i][j][k] = x[index[i][j][k]][j][k]`` for ``axis=0`` (and so on for other axes);
    ``y`` has the shape of ``index``, which has the rank of ``x`` and may be smaller in the other dims. NumPy's
    ``take_along_axis`` is the same op where ``index`` matches ``x`` in the other dims. Negative indices count
    from the end.
    """

def gather_grad(dy: _TensorLike, index: _TensorLike, *, shape: Sequence[int] | int, axis: int) -> Tensor:
    """Gradient of ``gather``: zeros of ``shape`` with each element of ``dy`` added where ``gather`` read it
    from (``scatter_add`` into zeros, without making the zeros first).
    """

def scatter_add(x: _TensorLike, axis: int, index: _TensorLike, src: _TensorLike, *, dim: int | None = None) -> Tensor:
    """``torch.scatter_add``: a copy of ``x`` to which ``src[i][j][k]`` is added at ``[index[i][j][k]][j][k]``
    for ``axis=0`` (and so on); elements of ``src`` outside ``index.shape`` are not used. Positions that
    ``index`` names more than once get every contribution. The adjoint of ``gather``.
    """

def index_select(x: _TensorLike, axis: int, index: _TensorLike, *, dim: int | None = None) -> Tensor:
    """``torch.index_select``: the slices of ``x`` at the positions ``index`` (1-D; a 0-d index counts as one
    position) lists along ``axis``, which keeps its place with size ``len(index)``. Negative indices count from
    the end.
    """

def one_hot(index: _TensorLike, num_classes: int = -1) -> Tensor:
    """``torch.nn.functional.one_hot``: int64 of shape ``(*index.shape, num_classes)``, 1 at the class ``index``
    names and 0 elsewhere. Indices must lie in [0, num_classes). ``num_classes=-1`` takes one more than the
    largest index, as PyTorch: a size only the data knows, so only eager calls can use it (a program needs the
    number).
    """

def index_add(
    x: _TensorLike,
    axis: int,
    index: _TensorLike,
    source: _TensorLike,
    *,
    alpha: float = 1.0,
    dim: int | None = None,
) -> Tensor:
    """``torch.index_add``: a copy of ``x`` to which ``alpha·source`` is added slice by slice: the slice ``i``
    of ``source`` along ``axis`` goes to the slice ``index[i]`` of ``x`` (indices that repeat collect every
    contribution). ``source`` has the shape of ``x`` with dim ``axis`` of size ``len(index)``. The adjoint of
    ``index_select``.
    """

def masked_fill(x: _TensorLike, mask: _TensorLike, value: _TensorLike) -> Tensor:
    """``torch.masked_fill``: ``value`` where ``mask`` is True, ``x`` elsewhere (``x`` and ``mask`` broadcast).
    The result keeps ``x``'s dtype; ``value`` is a number or a 0-d tensor, and gets the gradient of the
    positions it fills.
    """

# -- opforge.ops.integer

def remainder(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x mod y with the sign of y (Python's ``%``, ``torch.remainder``): x − floor(x / y)·y. Integers divided by
    0 raise ``DivisionByZeroError``, as Python and torch do.
    """

def floor_divide(x: _TensorLike, y: _TensorLike) -> Tensor:
    """floor(x / y) (Python's ``//``; integers stay integers, and raise ``DivisionByZeroError`` divided by 0)."""

def bitwise_and(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x & y, bit by bit (the logical and of bools)."""

def bitwise_or(x: _TensorLike, y: _TensorLike) -> Tensor:
    """x | y, bit by bit (the logical or of bools)."""

def bitwise_not(x: _TensorLike) -> Tensor:
    """~x, bit by bit (−x − 1 for integers; the logical not of bools)."""

# -- opforge.ops.linalg

def matmul(x: _TensorLike, y: _TensorLike) -> Tensor:
    """Matrix product with NumPy's rules: 1-D operands are vectors, leading dims broadcast (batches)."""

def outer(x: _TensorLike, y: _TensorLike) -> Tensor:
    """The outer product of two vectors: ``out[i, j] = x[i]·y[j]``."""

def linear(x: _TensorLike, weight: _TensorLike, bias: _TensorLike | None = None) -> Tensor:
    """``torch.nn.functional.linear``: ``y = x @ weightᵀ + bias``, weight of shape (out_features, in_features),
    over the last dim of ``x`` (any leading dims are a batch).
    """

def einsum(operands: Sequence[_TensorLike], *, equation: str) -> Tensor:
    """Einstein summation, as ``torch.einsum(equation, *operands)`` (note the order of the arguments):
    ``"ij,jk->ik"`` multiplies matrices; a letter left out of the output is summed over; without ``->`` the
    output is the letters used once, in alphabetical order. ``...`` stands for the broadcast leading dims, a
    size-1 dim broadcasts, and a letter repeated in one operand takes its diagonal (``"ii->i"``, ``"ii->"`` is
    the trace).
    """

def linalg_inv(a: _TensorLike) -> Tensor:
    """``torch.linalg.inv``: the inverse of each square matrix of ``a`` (..., n, n). A singular matrix is an
    error.
    """

def linalg_det(a: _TensorLike) -> Tensor:
    """``torch.linalg.det``: the determinant of each square matrix of ``a`` (..., n, n) -> (...)."""

def linalg_solve(a: _TensorLike, b: _TensorLike, *, left: bool = True) -> Tensor:
    """``torch.linalg.solve``: x with a·x = b (``left=False``: x·a = b) for square a (..., n, n) and b a batch
    of vectors (..., n), when it is 1-D or has a's shape without the last dim, else of matrices (..., n, k)
    (``left=False``: matrices (..., k, n) only); batch dims broadcast. A singular a is an error.
    """

def linalg_cholesky(a: _TensorLike, *, upper: bool = False) -> Tensor:
    """``torch.linalg.cholesky``: the lower triangular l with l·lᵀ = a (``upper``: the upper u = lᵀ, a = uᵀ·u),
    for a symmetric positive-definite (..., n, n). a is read through its symmetric part (a + aᵀ)/2, as
    ``jax.numpy.linalg.cholesky`` does (PyTorch reads the lower triangle): the same for a symmetric a, values
    and gradients, and the gradient is then the derivative for any a. Not positive-definite is an error.
    """

class _linalg_qr_result(NamedTuple):
    q: Tensor
    r: Tensor

def linalg_qr(a: _TensorLike, *, mode: str = 'reduced') -> _linalg_qr_result:
    """``torch.linalg.qr``: a = q·r for a (..., m, n), q with orthonormal columns and r upper triangular; q is
    (m, k) and r (k, n) with k = min(m, n) in mode "reduced", q (m, m) and r (m, n) in "complete". As LAPACK
    (and PyTorch) compute it, r's diagonal may be negative. Differentiable where a has full rank (mode
    "complete" only when m <= n, where it equals "reduced"). Mode "r" is not offered: take ``linalg_qr(a).r``.
    """

class _linalg_svd_result(NamedTuple):
    u: Tensor
    s: Tensor
    vh: Tensor

def linalg_svd(a: _TensorLike, *, full_matrices: bool = True) -> _linalg_svd_result:
    """``torch.linalg.svd``: a = u·diag(s)·vh for a (..., m, n), s (..., k) descending with k = min(m, n); u is
    (m, m) and vh (n, n) with ``full_matrices``, else (m, k) and (k, n). Each singular vector's sign is LAPACK's
    choice. Differentiable where the singular values are distinct and nonzero (where m != n; at k for square
    matrices); the columns beyond k of full matrices are not determined by a, and their gradient is ignored, as
    in PyTorch.
    """

# -- opforge.ops.linalg_torch

class _linalg_eigh_result(NamedTuple):
    eigenvalues: Tensor
    eigenvectors: Tensor

def linalg_eigh(a: _TensorLike, UPLO: str = 'L') -> _linalg_eigh_result:
    """``torch.linalg.eigh``: the eigenvalues (ascending) and orthonormal eigenvectors (columns) of a symmetric
    matrix. a is read through its symmetric part (a + aᵀ)/2, as ``linalg_cholesky`` reads it (torch reads the
    triangle ``UPLO`` names): the same for a symmetric a, values and gradients (torch's formula), and the
    gradient is then the derivative for any a. Each eigenvector's sign makes its largest entry positive (torch's
    is LAPACK's choice); the gradient exists where the eigenvalues are distinct.
    """

class _linalg_slogdet_result(NamedTuple):
    sign: Tensor
    logabsdet: Tensor

def linalg_slogdet(a: _TensorLike) -> _linalg_slogdet_result:
    """``torch.linalg.slogdet``: the sign of the determinant (−1, 0 or 1) and ln |det|, without det's overflow."""

def cholesky_solve(b: _TensorLike, l: _TensorLike, upper: bool = False) -> Tensor:
    """``torch.cholesky_solve(B, L, upper=False)``: X with A·X = B for A = L·Lᵀ (``upper``: A = Uᵀ·U), given the
    Cholesky factor; batch dims broadcast. A is formed from the whole of l (torch reads one triangle only): the
    same for a triangular factor, values and gradients (torch's formula), and the gradient is then the
    derivative for any l.
    """

def linalg_matrix_exp(a: _TensorLike) -> Tensor:
    """``torch.linalg.matrix_exp``: e^a = Σ aᵏ/k! of a square matrix (a Padé approximation, in float64): SciPy's
    expm on the CPU, scaling and squaring in xp on other devices — equal within rounding (normwise 1e-12 of the
    largest entry), but for a matrix holding NaN or inf, whose every entry is NaN there (as torch's) where SciPy
    may keep a triangular matrix's zeros.
    """

def linalg_pinv(
    a: _TensorLike,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    hermitian: bool = False,
) -> Tensor:
    """``torch.linalg.pinv``: the Moore-Penrose pseudo-inverse, from the SVD, singular values at or below
    max(atol, rtol·σ₁) taken as 0; rtol is eps·max(m, n) when neither is given, 0 when only atol is. The
    gradient is torch's formula (defined where the rank does not change). ``hermitian`` says a is symmetric; the
    result is the same either way (torch then reads one triangle of a, as the gradient formula does not).
    """

class _linalg_lu_factor_result(NamedTuple):
    LU: Tensor
    pivots: Tensor

def linalg_lu_factor(A: _TensorLike, *, pivot: bool = True) -> _linalg_lu_factor_result:
    """``torch.linalg.lu_factor``: the LU decomposition with partial pivoting of A (..., m, n), packed as
    LAPACK's getrf gives it: ``(LU, pivots)``. Differentiable where A's leading k×k minors are not singular (k =
    min(m, n)).
    """

class _lu_unpack_result(NamedTuple):
    P: Tensor
    L: Tensor
    U: Tensor

def lu_unpack(
    LU: _TensorLike,
    pivots: _TensorLike,
    unpack_data: bool = True,
    unpack_pivots: bool = True,
) -> _lu_unpack_result:
    """``torch.lu_unpack``: ``(P, L, U)`` with A = P·L·U from ``linalg_lu_factor``'s packed form: P (..., m, m)
    a permutation, L (..., m, k) unit lower and U (..., k, n) upper triangular, k = min(m, n); P (without
    ``unpack_pivots``) or L and U (without ``unpack_data``) empty.
    """

# -- opforge.ops.loss

def nll_loss(
    log_probs: _TensorLike,
    target: _TensorLike,
    weight: _TensorLike | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = 'mean',
) -> Tensor:
    """Negative log-likelihood of class-index targets: −weight[target[n]]·log_probs[n, target[n]], reduced."""

def nll_loss_grad(
    dloss: _TensorLike,
    target: _TensorLike,
    weight: _TensorLike | None = None,
    *,
    num_classes: int,
    ignore_index: int = -100,
    reduction: str = 'mean',
) -> Tensor:
    """Gradient of nll_loss: −dloss·weight[target] (÷ the sum of the counted weights for "mean") at each target
    class, 0 elsewhere.
    """

def cross_entropy(
    logits: _TensorLike,
    target: _TensorLike,
    weight: _TensorLike | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = 'mean',
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross entropy of logits against class indices (integer targets) or class probabilities (floating targets
    of the logits' shape), as torch: −Σ_c w_c·q_c·log softmax(logits)_c per sample, where q is the target with
    label smoothing ε — (1 − ε)·onehot(target) + ε/C, or (1 − ε)·probs + ε/C — and w the class ``weight`` (1 if
    absent).
    """

def cross_entropy_grad(
    logits: _TensorLike,
    target: _TensorLike,
    dloss: _TensorLike,
    weight: _TensorLike | None = None,
    exp_rows: _TensorLike | None = None,
    row_sums: _TensorLike | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = 'mean',
    label_smoothing: float = 0.0,
) -> Tensor:
    """Gradient of cross_entropy with class-index targets, in one pass over the logits: per sample
    s·(Q·softmax(logits) − q), where q is the smoothed, weighted target ((1 − ε)·w[t] at class t, ε/C·w_c at
    every class c), Q = Σ_c q_c and s = dloss (÷ Σ w[target] for "mean"). The softmax is made as softmax makes
    it (exp(logits − c), c = 0 where nothing overflows, else the row's max), then one multiply by s·Q/Σ exp;
    then the target's share is subtracted.
    """

def mse_loss(x: _TensorLike, target: _TensorLike, *, reduction: str = 'mean') -> Tensor:
    """(x − target)², elementwise (shapes broadcast), then reduced."""

def l1_loss(x: _TensorLike, target: _TensorLike, *, reduction: str = 'mean') -> Tensor:
    """|x − target|, elementwise (shapes broadcast), then reduced."""

def huber_loss(x: _TensorLike, target: _TensorLike, reduction: str = 'mean', delta: float = 1.0) -> Tensor:
    """½·d² where |d| < delta, else delta·(|d| − ½·delta), with d = x − target elementwise (shapes broadcast);
    then reduced.
    """

def smooth_l1(x: _TensorLike, *, sigma: float = 1.0) -> Tensor:
    """MXNet's smooth L1: 0.5·(σx)² where |x| < 1/σ², else |x| − 0.5/σ²."""

def smooth_l1_grad(x: _TensorLike, dy: _TensorLike, *, sigma: float) -> Tensor:
    """Gradient of smooth_l1: dx = dy·σ²x where |x| < 1/σ², else dy·sign(x)."""

def kl_div(x: _TensorLike, target: _TensorLike, *, reduction: str = 'mean', log_target: bool = False) -> Tensor:
    """The KL divergence of the distribution ``target`` from log-probabilities ``x``, elementwise (shapes
    broadcast): target·(log target − x), 0 where target is 0 — or exp(target)·(target − x) with ``log_target``.
    Reduced by "mean" (over every element, as torch), "batchmean" (the sum over x's first dim: the divergence
    per sample), "sum" or "none".
    """

def binary_cross_entropy(
    probs: _TensorLike,
    target: _TensorLike,
    weight: _TensorLike | None = None,
    *,
    reduction: str = 'mean',
) -> Tensor:
    """−weight·(target·log(probs) + (1 − target)·log(1 − probs)), each log clamped to ≥ −100 as torch; then
    reduced. ``probs`` must lie in [0, 1]. ``weight`` (broadcast to the input) gets a gradient too.
    """

def binary_cross_entropy_with_logits(
    logits: _TensorLike,
    target: _TensorLike,
    weight: _TensorLike | None = None,
    *,
    pos_weight: _TensorLike | None = None,
    reduction: str = 'mean',
) -> Tensor:
    """−weight·[pos_weight·y·log σ(x) + (1 − y)·log(1 − σ(x))] (pos_weight and weight 1 if absent, each
    broadcast to the input), computed without overflow as (1 − y)·x + (1 + (pos_weight − 1)·y)·softplus(−x),
    softplus(z) = log(1 + eᶻ); then reduced. Both weights get gradients too.
    """

def cosine_embedding_loss(
    x1: _TensorLike,
    x2: _TensorLike,
    target: _TensorLike,
    margin: float = 0.0,
    *,
    reduction: str = 'mean',
) -> Tensor:
    """For rows x1, x2 (D,) or batches (N, D) with targets 1 (alike) or −1 (unlike): 1 − cos(x1, x2) where the
    target is 1, max(0, cos(x1, x2) − margin) where it is −1, 0 for any other target; then reduced. The cosine
    is x1·x2 / √((|x1|² + ε)(|x2|² + ε)) with ε = 1e-12, as torch.
    """

def margin_ranking_loss(
    x1: _TensorLike,
    x2: _TensorLike,
    target: _TensorLike,
    margin: float = 0.0,
    *,
    reduction: str = 'mean',
) -> Tensor:
    """max(0, −target·(x1 − x2) + margin), elementwise (shapes broadcast; the three must have the same number of
    dims, as in torch): target 1 asks x1 to rank above x2 by ``margin``, −1 below. Then reduced.
    """

def triplet_margin_loss(
    anchor: _TensorLike,
    positive: _TensorLike,
    negative: _TensorLike,
    margin: float = 1.0,
    p: float = 2.0,
    eps: float = 1e-06,
    swap: bool = False,
    *,
    reduction: str = 'mean',
) -> Tensor:
    """max(0, margin + d(anchor, positive) − d(anchor, negative)) per sample, with d(u, v) = ‖u − v + eps‖_p
    over the last axis (pairwise_distance); ``swap`` uses min(d(a, n), d(p, n)) for the negative distance. The
    three inputs have the same number of dims and broadcast. Then reduced.
    """

# -- opforge.ops.nn

def softmax(x: _TensorLike, axis: int = -1, *, dim: int | None = None) -> Tensor:
    """exp(x) / Σ exp(x) along ``axis``. Computed so where Σ exp(x) is finite and at least 1 (float32/64), else
    as exp(x − max x) / Σ exp(x − max x): nothing overflows, and each group's path depends on that group alone.
    """

def softmax_grad(y: _TensorLike, dy: _TensorLike, *, axis: int = -1) -> Tensor:
    """Gradient of softmax from its output y: dx = y·(dy − Σ dy·y) along ``axis``."""

def log_softmax(x: _TensorLike, axis: int = -1, *, dim: int | None = None) -> Tensor:
    """log(softmax(x)) along ``axis``, computed as (x − max x) − log Σ exp(x − max x)."""

def log_softmax_grad(y: _TensorLike, dy: _TensorLike, *, axis: int = -1) -> Tensor:
    """Gradient of log_softmax from its output y: dx = dy − exp(y)·Σ dy along ``axis``."""

class _dropout_with_mask_result(NamedTuple):
    y: Tensor
    mask: Tensor

def dropout_with_mask(x: _TensorLike, *, p: float = 0.5, training: bool = True) -> _dropout_with_mask_result:
    """Zeroes each element with probability ``p`` and scales the kept ones by 1/(1 − p) (identity when not
    ``training``). Also returns the boolean ``mask`` of kept elements (torch's ``native_dropout``);
    ``F.dropout(x, p, training)`` returns ``y`` alone, as ``torch.nn.functional.dropout`` does.
    """

def embedding(index: _TensorLike, weight: _TensorLike, padding_idx: int | None = None) -> Tensor:
    """Rows of ``weight`` (num_embeddings, D) picked by ``index``: y[..., :] = weight[index[...]]. The row
    ``padding_idx`` (if given) is looked up as any other but gets no gradient.
    """

def embedding_grad(
    dy: _TensorLike,
    index: _TensorLike,
    *,
    num_embeddings: int,
    padding_idx: int | None = None,
) -> Tensor:
    """Gradient of embedding with respect to the weight: each dy[...] is added to row index[...] (rows picked
    several times add up); the padding row stays 0.
    """

def embedding_rows(
    index: _TensorLike,
    weight: _TensorLike,
    *,
    num_embeddings: int,
    start: int = 0,
    padding_idx: int | None = None,
) -> Tensor:
    """embedding in a block of a table: ``weight`` holds rows start, start+1, ... of a table of
    ``num_embeddings`` rows, and y[...] is the row index[...] where the block holds it, zeros elsewhere (an
    index outside the whole table is an error). A table split by rows over ranks: the ranks' y add up to the
    lookup in the whole table (``embedding``'s vocabulary-parallel signature). ``padding_idx`` (a row of the
    whole table) gets no gradient.
    """

def dot_product_attention(
    q: _TensorLike,
    k: _TensorLike,
    v: _TensorLike,
    attn_mask: _TensorLike | None = None,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> Tensor:
    """softmax(q·kᵀ·scale + mask)·v for q (..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev); batch dims
    broadcast. ``scale`` defaults to 1/√E. ``attn_mask`` (broadcast to (..., L, S)) is boolean (True: may
    attend) or added to the scores; ``is_causal`` lets query i attend to keys j <= i. A query that may attend to
    nothing gets zeros, as in torch. ``F.scaled_dot_product_attention`` (torch's function, which adds dropout of
    the weights) calls it. A recorded call keeps the softmax weights for an eager first-order backward pass;
    elsewhere (compiled, ``create_graph``) the gradient rule computes them again from q, k and the mask.
    """

# -- opforge.ops.normalization

class _normalize_grad_result(NamedTuple):
    dx: Tensor
    xhat: Tensor

def normalize_grad(
    x: _TensorLike,
    g: _TensorLike,
    *,
    axes: Sequence[int] | int,
    eps: float,
    center: bool = True,
) -> _normalize_grad_result:
    """Backward of a normalisation over ``axes``: dx = r·(g − mean(g) − x̂·mean(g·x̂)) for the incoming ``g``
    (dy times the weight), and x̂ itself (the weight's gradient is Σ dy·x̂). ``center=False``: rms_norm's x̂ =
    x·r, and no mean(g) term.
    """

def layer_norm(
    x: _TensorLike,
    normalized_shape: Sequence[int] | int,
    weight: _TensorLike | None = None,
    bias: _TensorLike | None = None,
    eps: float = 1e-05,
) -> Tensor:
    """Normalises over the last len(normalized_shape) dims to mean 0 and variance 1 (biased, plus eps), then y =
    x̂·weight + bias (each of shape normalized_shape, optional).
    """

def rms_norm(
    x: _TensorLike,
    normalized_shape: Sequence[int] | int,
    weight: _TensorLike | None = None,
    eps: float | None = None,
) -> Tensor:
    """Root-mean-square normalisation over the last len(normalized_shape) dims: y = x/√(mean(x²) + eps)·weight
    (weight of shape normalized_shape, optional); eps defaults to the machine epsilon of x's dtype, as torch's.
    """

def group_norm(
    x: _TensorLike,
    num_groups: int,
    weight: _TensorLike | None = None,
    bias: _TensorLike | None = None,
    eps: float = 1e-05,
) -> Tensor:
    """Splits the C channels of an (N, C, ...) input into ``num_groups`` groups and normalises each group of
    each sample over its channels and the other dims; then y = x̂·weight + bias per channel (each (C,),
    optional).
    """

def instance_norm_affine(
    x: _TensorLike,
    weight: _TensorLike | None = None,
    bias: _TensorLike | None = None,
    *,
    eps: float = 1e-05,
) -> Tensor:
    """Normalises each channel of each sample of an (N, C, L, ...) input over its other dims (L, ...); then y =
    x̂·weight + bias per channel (each (C,), optional). ``F.instance_norm`` is torch's functional form, with
    running statistics.
    """

class _batch_norm_with_stats_result(NamedTuple):
    y: Tensor
    new_running_mean: Tensor
    new_running_var: Tensor

def batch_norm_with_stats(
    x: _TensorLike,
    running_mean: _TensorLike | None,
    running_var: _TensorLike | None,
    weight: _TensorLike | None = None,
    bias: _TensorLike | None = None,
    *,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-05,
) -> _batch_norm_with_stats_result:
    """Batch normalisation of an (N, C, ...) input per channel C, then y = x̂·weight + bias (each (C,),
    optional).
    """

# -- opforge.ops.optim

def sgd_momentum_buffer(
    buf: _TensorLike,
    grad: _TensorLike,
    param: _TensorLike,
    step: _TensorLike,
    momentum: _TensorLike,
    *,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
) -> Tensor:
    """SGD's new momentum buffer: d = grad + weight_decay·param; d itself on the first step (``step`` = 0, the
    number of steps taken so far), else momentum·buf + (1 − dampening)·d — as ``torch.optim.SGD``. ``momentum``
    is a 0-d tensor (a schedule may cycle it).
    """

def sgd_update(
    param: _TensorLike,
    grad: _TensorLike,
    lr: _TensorLike,
    momentum_buffer: _TensorLike | None = None,
    momentum: _TensorLike | None = None,
    *,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> Tensor:
    """SGD's new parameter: param − lr·d, with d = grad + weight_decay·param, then, given the step's new
    ``momentum_buffer`` b (from sgd_momentum_buffer), d + momentum·b (``nesterov``) or b — as
    ``torch.optim.SGD``. ``momentum`` (a 0-d tensor) is used by Nesterov's look-ahead only.
    """

def adam_exp_avg(
    exp_avg: _TensorLike,
    grad: _TensorLike,
    param: _TensorLike,
    beta1: _TensorLike,
    *,
    weight_decay: float = 0.0,
) -> Tensor:
    """Adam's new first moment: exp_avg + (1 − beta1)·(g − exp_avg) with g = grad + weight_decay·param (Adam's
    L2 decay; pass 0 for AdamW) — ``exp_avg.lerp_(g, 1 − beta1)`` in ``torch.optim.Adam``. ``beta1`` is a 0-d
    tensor (a schedule may cycle it).
    """

def adam_exp_avg_sq(
    exp_avg_sq: _TensorLike,
    grad: _TensorLike,
    param: _TensorLike,
    *,
    beta2: float,
    weight_decay: float = 0.0,
) -> Tensor:
    """Adam's new second moment: beta2·exp_avg_sq + (1 − beta2)·g² with g = grad + weight_decay·param (Adam's L2
    decay; pass 0 for AdamW) — ``exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 − beta2)`` in torch.
    """

def adam_update(
    param: _TensorLike,
    exp_avg: _TensorLike,
    exp_avg_sq: _TensorLike,
    step: _TensorLike,
    lr: _TensorLike,
    beta1: _TensorLike,
    *,
    beta2: float,
    eps: float = 1e-08,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> Tensor:
    """Adam's new parameter from the step's new moments and step count t ≥ 1: p − lr/(1 − beta1ᵗ) · exp_avg /
    (√exp_avg_sq / √(1 − beta2ᵗ) + eps), where p is param, or param·(1 − lr·weight_decay) when ``decoupled``
    (AdamW; Adam's L2 decay is in the moments) — as ``torch.optim.Adam``/``AdamW``.
    """

# -- opforge.ops.pool

def max_pool1d_values(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0],
    dilation: Sequence[int] | int = [1],
    ceil_mode: bool = False,
) -> Tensor:
    """The maximum of each window of x (N, C, L) — or (C, L) — windows ``stride`` apart (default: the kernel
    size), over x padded with -inf.
    """

def max_pool2d_values(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0, 0],
    dilation: Sequence[int] | int = [1, 1],
    ceil_mode: bool = False,
) -> Tensor:
    """The maximum of each kH×kW window of x (N, C, H, W) — or (C, H, W) — windows ``stride`` apart (default:
    the kernel size), over x padded with -inf.
    """

def max_pool3d_values(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0, 0, 0],
    dilation: Sequence[int] | int = [1, 1, 1],
    ceil_mode: bool = False,
) -> Tensor:
    """The maximum of each kD×kH×kW window of x (N, C, D, H, W) — or (C, D, H, W) — windows ``stride`` apart
    (default: the kernel size), over x padded with -inf.
    """

class _max_pool1d_with_indices_result(NamedTuple):
    y: Tensor
    indices: Tensor

def max_pool1d_with_indices(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0],
    dilation: Sequence[int] | int = [1],
    ceil_mode: bool = False,
) -> _max_pool1d_with_indices_result:
    """max_pool1d_values, and the index (int64, along L) of each window's maximum: PyTorch's ``max_pool1d(...,
    return_indices=True)``.
    """

class _max_pool2d_with_indices_result(NamedTuple):
    y: Tensor
    indices: Tensor

def max_pool2d_with_indices(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0, 0],
    dilation: Sequence[int] | int = [1, 1],
    ceil_mode: bool = False,
) -> _max_pool2d_with_indices_result:
    """max_pool2d_values, and the flat index h·W + w (int64) of each window's maximum: PyTorch's
    ``max_pool2d(..., return_indices=True)``.
    """

class _max_pool3d_with_indices_result(NamedTuple):
    y: Tensor
    indices: Tensor

def max_pool3d_with_indices(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0, 0, 0],
    dilation: Sequence[int] | int = [1, 1, 1],
    ceil_mode: bool = False,
) -> _max_pool3d_with_indices_result:
    """max_pool3d_values, and the flat index (d·H + h)·W + w (int64) of each window's maximum: PyTorch's
    ``max_pool3d(..., return_indices=True)``.
    """

def max_pool_grad(
    x: _TensorLike,
    dy: _TensorLike,
    *,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0],
    dilation: Sequence[int] | int = [1],
    ceil_mode: bool = False,
) -> Tensor:
    """Gradient of max pooling (1-, 2- or 3-D, by x's rank): each window's dy goes to the window's maximum of x;
    overlapping windows add up.
    """

def max_pool_grad_grad(
    x: _TensorLike,
    ddx: _TensorLike,
    *,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0],
    dilation: Sequence[int] | int = [1],
    ceil_mode: bool = False,
) -> Tensor:
    """Gradient of max_pool_grad with respect to dy (TensorFlow's MaxPoolGradGrad): ddx, an input-shaped tensor,
    read at each window's maximum of x.
    """

def pool_scatter(dy: _TensorLike, indices: _TensorLike, *, input_size: Sequence[int] | int) -> Tensor:
    """Zeros (N, C, *input_size) to which each dy value is added at the flat spatial index ``indices`` holds for
    it (as ``max_pool*_with_indices`` return them): the gradient of pooling with indices. Repeats add up.
    """

def pool_gather(x: _TensorLike, indices: _TensorLike) -> Tensor:
    """x (N, C, *spatial) read at the flat spatial indices ``indices`` (N, C, *out) holds: the transpose of
    pool_scatter.
    """

def max_unpool(x: _TensorLike, indices: _TensorLike, *, output_size: Sequence[int] | int) -> Tensor:
    """Zeros (N, C, *output_size) in which each value of x (N, C, *in) is written at the flat spatial index that
    ``indices`` (as ``max_pool*_with_indices`` return them) holds for it; of two values for one place the later
    stays, as in torch's CPU kernel. The gradient reads dy at the indices (pool_gather), as torch's.
    """

def avg_pool1d(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0],
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """The mean of each window of x (N, C, L) — or (C, L) — windows ``stride`` apart (default: the kernel size),
    over x padded with zeros that count in the mean unless ``count_include_pad`` is False; ``divisor_override``
    replaces the window size.
    """

def avg_pool2d(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0, 0],
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """The mean of each kH×kW window of x (N, C, H, W) — or (C, H, W) — windows ``stride`` apart (default: the
    kernel size), over x padded with zeros that count in the mean unless ``count_include_pad`` is False;
    ``divisor_override`` replaces the window size.
    """

def avg_pool3d(
    x: _TensorLike,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0, 0, 0],
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """The mean of each kD×kH×kW window of x (N, C, D, H, W) — or (C, D, H, W) — windows ``stride`` apart
    (default: the kernel size), over x padded with zeros that count in the mean unless ``count_include_pad`` is
    False; ``divisor_override`` replaces the window size.
    """

def avg_pool_grad(
    dy: _TensorLike,
    *,
    input_size: Sequence[int] | int,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int | None = None,
    padding: Sequence[int] | int = [0],
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """Gradient of average pooling (1-, 2- or 3-D, by dy's rank) for an input of spatial size ``input_size``:
    each window's dy divided as its sum was and spread over the window; overlapping windows add up.
    """

def adaptive_avg_pool1d_sized(x: _TensorLike, output_size: Sequence[int] | int) -> Tensor:
    """x (N, C, L) — or (C, L) — averaged down (or up) to ``output_size``: output i is the mean of inputs
    ⌊i·L/o⌋ … ⌈(i+1)·L/o⌉ − 1 (PyTorch's adaptive windows).
    """

def adaptive_avg_pool2d_sized(x: _TensorLike, output_size: Sequence[int] | int) -> Tensor:
    """x (N, C, H, W) — or (C, H, W) — averaged to ``output_size`` (OH, OW) over PyTorch's adaptive windows
    (rows ⌊i·H/OH⌋ … ⌈(i+1)·H/OH⌉ − 1, and so for columns); output_size 1 is global average pooling.
    """

def adaptive_avg_pool_grad(dy: _TensorLike, *, input_size: Sequence[int] | int) -> Tensor:
    """Gradient of adaptive average pooling (1-, 2- or 3-D, by dy's rank) for an input of spatial size
    ``input_size``: each output's dy spread evenly over its window; overlapping windows add up.
    """

def adaptive_avg_pool3d_sized(x: _TensorLike, output_size: Sequence[int] | int) -> Tensor:
    """x (N, C, D, H, W) — or (C, D, H, W) — averaged to ``output_size`` (OD, OH, OW) over PyTorch's adaptive
    windows.
    """

def adaptive_max_pool2d_values(x: _TensorLike, output_size: Sequence[int] | int) -> Tensor:
    """The maximum of each of PyTorch's adaptive windows of x (N, C, H, W) — or (C, H, W) — for ``output_size``
    (OH, OW): rows ⌊i·H/OH⌋ … ⌈(i+1)·H/OH⌉ − 1, and so for columns. ``F.adaptive_max_pool2d`` (torch's function)
    calls it, or adaptive_max_pool2d_with_indices for ``return_indices=True``.
    """

class _adaptive_max_pool2d_with_indices_result(NamedTuple):
    y: Tensor
    indices: Tensor

def adaptive_max_pool2d_with_indices(
    x: _TensorLike,
    output_size: Sequence[int] | int,
) -> _adaptive_max_pool2d_with_indices_result:
    """adaptive_max_pool2d, and the flat index h·W + w (int64) of each window's maximum: PyTorch's
    ``adaptive_max_pool2d(..., return_indices=True)``.
    """

def adaptive_max_pool1d_values(x: _TensorLike, output_size: Sequence[int] | int) -> Tensor:
    """The maximum of each of PyTorch's adaptive windows of x (N, C, L) — or (C, L) — for ``output_size``: along
    each dim of size n, output i takes inputs ⌊i·n/o⌋ … ⌈(i+1)·n/o⌉ − 1.
    """

def adaptive_max_pool3d_values(x: _TensorLike, output_size: Sequence[int] | int) -> Tensor:
    """The maximum of each of PyTorch's adaptive windows of x (N, C, D, H, W) — or (C, D, H, W) — for
    ``output_size``: along each dim of size n, output i takes inputs ⌊i·n/o⌋ … ⌈(i+1)·n/o⌉ − 1.
    """

class _adaptive_max_pool1d_with_indices_result(NamedTuple):
    y: Tensor
    indices: Tensor

def adaptive_max_pool1d_with_indices(
    x: _TensorLike,
    output_size: Sequence[int] | int,
) -> _adaptive_max_pool1d_with_indices_result:
    """adaptive_max_pool1d, and the flat index l (int64) of each window's maximum: PyTorch's
    ``adaptive_max_pool1d(..., return_indices=True)``.
    """

class _adaptive_max_pool3d_with_indices_result(NamedTuple):
    y: Tensor
    indices: Tensor

def adaptive_max_pool3d_with_indices(
    x: _TensorLike,
    output_size: Sequence[int] | int,
) -> _adaptive_max_pool3d_with_indices_result:
    """adaptive_max_pool3d, and the flat index (d·H + h)·W + w (int64) of each window's maximum: PyTorch's
    ``adaptive_max_pool3d(..., return_indices=True)``.
    """

# -- opforge.ops.recurrent

class _lstm_layer_result(NamedTuple):
    y: Tensor
    cells: Tensor
    gates: Tensor

def lstm_layer(
    gx: _TensorLike,
    h0: _TensorLike,
    c0: _TensorLike,
    w_hh: _TensorLike,
    batch_sizes: _TensorLike | None = None,
    *,
    reverse: bool = False,
) -> _lstm_layer_result:
    """One LSTM layer and direction over a sequence, torch's cell: from the input projection ``gx`` (T, N, 4H) =
    x·W_ihᵀ + b_ih + b_hh, gates i, f, g, o = σ, σ, tanh, σ of gx[t] + h·W_hhᵀ, then c = f·c + i·g, h =
    o·tanh(c). Returns y (T, N, H): h every step; ``cells`` (T, N, H): c every step; ``gates`` (T, N, 4H): the
    activated gates (what the backward pass reads). ``reverse`` runs from the last step to the first.
    ``batch_sizes`` (T,): how many rows (the first ones) take part in each step; the others keep their state
    (see the module's notes). The last state is y[-1], cells[-1] (y[0], cells[0] when reverse).
    """

class _lstm_layer_grad_result(NamedTuple):
    dpre: Tensor
    dh0: Tensor
    dc0: Tensor

def lstm_layer_grad(
    gates: _TensorLike,
    cells: _TensorLike,
    c0: _TensorLike,
    w_hh: _TensorLike,
    dy: _TensorLike | None = None,
    dcells: _TensorLike | None = None,
    dgates: _TensorLike | None = None,
    batch_sizes: _TensorLike | None = None,
    *,
    reverse: bool = False,
) -> _lstm_layer_grad_result:
    """Backpropagation through time of ``lstm_layer``, from its outputs ``gates`` and ``cells`` (and c0, w_hh):
    given the gradients of y, cells and gates (None: zero, no gradient reached that output), the gradient of the
    gates' pre-activations every step ``dpre`` (T, N, 4H) — which is gx's, and from which the layer's rule makes
    W_hh's as one product — and those of h0 and c0. One dpre·W_hh product a step.
    """

class _gru_layer_result(NamedTuple):
    y: Tensor
    gates: Tensor
    hn: Tensor

def gru_layer(
    gx: _TensorLike,
    h0: _TensorLike,
    w_hh: _TensorLike,
    b_hh: _TensorLike | None = None,
    batch_sizes: _TensorLike | None = None,
    *,
    reverse: bool = False,
) -> _gru_layer_result:
    """One GRU layer and direction over a sequence, torch's cell: from the input projection ``gx`` (T, N, 3H) =
    x·W_ihᵀ + b_ih and gh = h·W_hhᵀ + b_hh, r = σ(gx_r + gh_r), z = σ(gx_z + gh_z), n = tanh(gx_n + r·gh_n), h =
    n + z·(h − n). Returns y (T, N, H): h every step; ``gates`` (T, N, 3H): r, z, n; ``hn`` (T, N, H): gh_n
    (what the backward pass reads). ``reverse`` and ``batch_sizes`` as lstm_layer's. The last state is y[-1]
    (y[0] when reverse).
    """

class _gru_layer_grad_result(NamedTuple):
    dgx: Tensor
    dgh: Tensor
    dh0: Tensor

def gru_layer_grad(
    gates: _TensorLike,
    hn: _TensorLike,
    y: _TensorLike,
    h0: _TensorLike,
    w_hh: _TensorLike,
    dy: _TensorLike | None = None,
    dgates: _TensorLike | None = None,
    dhn: _TensorLike | None = None,
    batch_sizes: _TensorLike | None = None,
    *,
    reverse: bool = False,
) -> _gru_layer_grad_result:
    """Backpropagation through time of ``gru_layer``, from its outputs ``gates``, ``hn`` and ``y`` (and h0,
    w_hh): given the gradients of y, gates and hn (None: zero), the gradients of gx (T, N, 3H) and of gh =
    h·W_hhᵀ + b_hh every step (they differ in the n block: r·dgx_n there), from which the layer's rule makes
    W_hh's and b_hh's as one product and one sum, and h0's. One dgh·W_hh product a step.
    """

# -- opforge.ops.reduce

def sum(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
    *,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Sum over ``axis`` (all axes when None). Integer and bool tensors sum to int64."""

def mean(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
    *,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Mean over ``axis`` (all axes when None)."""

def mean_grad(
    dy: _TensorLike,
    *,
    shape: Sequence[int] | int,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
) -> Tensor:
    """Gradient of mean: dy spread evenly over the reduced elements of an input of ``shape``."""

def sum_to(x: _TensorLike, *, shape: Sequence[int] | int) -> Tensor:
    """Sums ``x`` down to ``shape``, the inverse of broadcasting ``shape`` up to ``x.shape``."""

def prod(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
    *,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Product over ``axis`` (all axes when None). Integer and bool tensors multiply in int64."""

def amax(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
    *,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Largest element over ``axis`` (all axes when None), as ``torch.amax`` and NumPy's ``max``; NaN if the
    group holds one. ``F.max(x, dim)`` gives torch's (values, indices) along one dim.
    """

def amin(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
    *,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Smallest element over ``axis`` (all axes when None), as ``torch.amin`` and NumPy's ``min``."""

def argmax(
    x: _TensorLike,
    axis: int | None = None,
    keepdim: bool = False,
    *,
    dim: int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Index of the largest element along ``axis`` (of the flattened tensor when None); the first one on ties."""

def argmin(
    x: _TensorLike,
    axis: int | None = None,
    keepdim: bool = False,
    *,
    dim: int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Index of the smallest element along ``axis`` (of the flattened tensor when None); the first one on ties."""

def var(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    *,
    correction: float = 1.0,
    keepdim: bool = False,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Variance over ``axis``: Σ(x − mean)²/(N − correction); correction=1 is the unbiased estimate, and any
    real correction works (as PyTorch's; N − correction ≤ 0 gives inf).
    """

def std(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    *,
    correction: float = 1.0,
    keepdim: bool = False,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Standard deviation over ``axis``: the square root of ``var``."""

def logsumexp(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
    *,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """ln Σ eˣ over ``axis``, computed as m + ln Σ e^(x − m) with m the group's largest element (no overflow)."""

def norm(
    x: _TensorLike,
    p: float = 2.0,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
    *,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Vector p-norm over ``axis`` (all axes when None), as ``torch.linalg.vector_norm``: (Σ|x|ᵖ)^(1/p); p = inf
    gives max |x|, p = −inf min |x|, p = 0 the number of nonzero elements.
    """

def cumsum(x: _TensorLike, axis: int, *, dim: int | None = None) -> Tensor:
    """Running sums along ``axis``: yᵢ = x₀ + … + xᵢ. Integer and bool tensors sum in int64."""

def cumprod(x: _TensorLike, axis: int, *, dim: int | None = None) -> Tensor:
    """Running products along ``axis``: yᵢ = x₀·x₁·…·xᵢ. Integer and bool tensors multiply in int64."""

# -- opforge.ops.reduce_torch

def all(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
    *,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """``torch.all``: whether every element over ``axis`` is nonzero (all axes when None; NaN counts as
    nonzero).
    """

def any(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    keepdim: bool = False,
    *,
    dim: Sequence[int] | int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """``torch.any``: whether some element over ``axis`` is nonzero (all axes when None)."""

def logcumsumexp(x: _TensorLike, axis: int, *, dim: int | None = None) -> Tensor:
    """``torch.logcumsumexp``: running ln Σ eˣ along ``axis``, yᵢ = ln(e^x₀ + … + e^xᵢ), without overflow."""

class _cummax_result(NamedTuple):
    values: Tensor
    indices: Tensor

def cummax(x: _TensorLike, axis: int, *, dim: int | None = None) -> _cummax_result:
    """``torch.cummax``: the running largest element along ``axis`` and the index of the last one equal to it."""

class _cummin_result(NamedTuple):
    values: Tensor
    indices: Tensor

def cummin(x: _TensorLike, axis: int, *, dim: int | None = None) -> _cummin_result:
    """``torch.cummin``: the running smallest element along ``axis`` and the index of the last one equal to it."""

class _kthvalue_result(NamedTuple):
    values: Tensor
    indices: Tensor

def kthvalue(
    x: _TensorLike,
    k: int,
    axis: int = -1,
    keepdim: bool = False,
    *,
    dim: int | None = None,
    keepdims: bool | None = None,
) -> _kthvalue_result:
    """``torch.kthvalue``: the k-th smallest element along ``axis`` (k from 1) and its index."""

class _median_select_result(NamedTuple):
    values: Tensor
    indices: Tensor

def median_select(
    x: _TensorLike,
    axis: int | None = None,
    keepdim: bool = False,
    *,
    ignore_nan: bool = False,
    dim: int | None = None,
    keepdims: bool | None = None,
) -> _median_select_result:
    """The lower median along ``axis`` (of all elements when None) and its index: what ``median`` and
    ``nanmedian`` return. A row holding NaN has median NaN (at its first NaN) unless ``ignore_nan``, which
    leaves NaN out (NaN only where the row is all NaN).
    """

class _mode_result(NamedTuple):
    values: Tensor
    indices: Tensor

def mode(
    x: _TensorLike,
    axis: int = -1,
    keepdim: bool = False,
    *,
    dim: int | None = None,
    keepdims: bool | None = None,
) -> _mode_result:
    """``torch.mode``: the most frequent value along ``axis`` (the smallest of equally frequent ones) and the
    index of its last occurrence. Each NaN counts as a value of its own.
    """

def bincount(x: _TensorLike, weights: _TensorLike | None = None, minlength: int = 0) -> Tensor:
    """``torch.bincount``: how often each value 0, 1, ... occurs in the 1-D non-negative ``x`` (int64), or the
    sum of the ``weights`` at each (float32 weights sum in float32, all others in float64, as torch's); at least
    ``minlength`` bins. Its length depends on the data: a program knows it at run time only.
    """

class _unique_all_result(NamedTuple):
    values: Tensor
    inverse: Tensor
    counts: Tensor

def unique_all(x: _TensorLike, *, axis: int | None = None) -> _unique_all_result:
    """The sorted distinct elements of ``x`` (along ``axis``: its distinct slices), where each element came from
    and how often each occurs: what ``unique`` returns. Each NaN is distinct, as in torch.
    """

# -- opforge.ops.resize

def interpolate(
    x: _TensorLike,
    size: Sequence[int] | int | None = None,
    scale_factor: Sequence[float] | float | None = None,
    mode: str = 'nearest',
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
) -> Tensor:
    """Resize x (N, C, *spatial) to ``size``, or by ``scale_factor`` (the output ⌊n·s⌋), as PyTorch's
    ``F.interpolate``: mode "nearest" (output i reads input ⌊i·n/o⌋), "nearest-exact" (⌊(i + ½)·n/o⌋), or
    "linear"/"bilinear"/"trilinear" for 1/2/3 spatial dims (a blend of the two nearest inputs; ``align_corners``
    maps the corner pixels' centres onto each other), "bicubic" for 2 (four inputs per dim, torch's cubic
    convolution with A = −0.75, the border repeated), or "area" (the mean over adaptive average pooling's
    windows, as torch computes it). With a scale factor the positions use it unless ``recompute_scale_factor``.
    """

def interpolate_grad(
    dy: _TensorLike,
    *,
    input_size: Sequence[int] | int,
    size: Sequence[int] | int | None = None,
    scale_factor: Sequence[float] | float | None = None,
    mode: str = 'nearest',
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
) -> Tensor:
    """Gradient of interpolate for an input of spatial size ``input_size``: each output's dy added back to the
    inputs it read, times the weights it read them with.
    """

def pixel_shuffle(x: _TensorLike, upscale_factor: int) -> Tensor:
    """x (*, C·r², H, W) rearranged to (*, C, H·r, W·r), r = upscale_factor: y[..., c, h·r + i, w·r + j] =
    x[..., c·r² + i·r + j, h, w] (sub-pixel convolution's upsampling, as PyTorch).
    """

def pixel_unshuffle(x: _TensorLike, downscale_factor: int) -> Tensor:
    """The inverse of pixel_shuffle: x (*, C, H·r, W·r) rearranged to (*, C·r², H, W), r = downscale_factor."""

# -- opforge.ops.selection

def index_fill(x: _TensorLike, axis: int, index: _TensorLike, value: _TensorLike, *, dim: int | None = None) -> Tensor:
    """``torch.index_fill``: a copy of x whose slices at the positions ``index`` (0-d or 1-D) lists along
    ``axis`` hold ``value`` (a number or a 0-d tensor, which gets the gradient of those places).
    """

def index_copy(x: _TensorLike, axis: int, index: _TensorLike, source: _TensorLike, *, dim: int | None = None) -> Tensor:
    """``torch.index_copy``: a copy of x whose slices at the positions ``index`` (1-D) lists along ``axis`` are
    the slices of ``source`` in order (of two for one place the later stays, as torch's CPU kernel).
    """

def masked_select(x: _TensorLike, mask: _TensorLike) -> Tensor:
    """``torch.masked_select``: the elements of x where ``mask`` (x and mask broadcast together) is True, in
    order, as a 1-D tensor; its length depends on the mask (unknown in a traced program's shape rule).
    """

def masked_scatter(x: _TensorLike, mask: _TensorLike, source: _TensorLike) -> Tensor:
    """``torch.masked_scatter``: a copy of x (broadcast with ``mask`` to mask's shape, as torch) in which the
    places where mask is True take the elements of ``source`` in order; source needs at least as many.
    """

def scatter(
    x: _TensorLike,
    axis: int,
    index: _TensorLike,
    src: _TensorLike,
    *,
    dim: int | None = None,
    value: _TensorLike | None = None,
) -> Tensor:
    """``torch.scatter``: a copy of x in which ``src[i][j][k]`` is written at ``[index[i][j][k]][j][k]`` for
    ``axis=0`` (and so on); elements of src outside index's shape are not used. Of two writes to one place the
    later stays, as torch's CPU kernel (torch calls it undefined). ``F.scatter(x, dim, index, value=v)`` writes
    a number (or a 0-d src: the same value at every place index names). torch's deprecated ``reduce=`` is
    ``Tensor.scatter``'s and ``of.scatter``'s (they call scatter_reduce).
    """

def argwhere(x: _TensorLike) -> Tensor:
    """``torch.argwhere`` (and ``torch.nonzero``): the index of each nonzero element of x, one row (of x's rank)
    per element in C order, int64; a 0-d x gives (0 or 1, 0). The number of rows depends on the data.
    """

def searchsorted(
    sorted_sequence: _TensorLike,
    x: _TensorLike,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str = '',
    sorter: _TensorLike | None = None,
) -> Tensor:
    """``torch.searchsorted``: for each value of x, the index where it would go into ``sorted_sequence`` (sorted
    along its last dim) to keep it sorted: the first such place, or with ``right`` (or side="right") the last. A
    1-D sequence serves every value; an N-D one holds one sequence per row of x's leading dims. ``sorter`` sorts
    an unsorted sequence (argsort's indices). int64, or int32 with ``out_int32``.
    """

def isin(
    elements: _TensorLike,
    test_elements: _TensorLike,
    *,
    assume_unique: bool = False,
    invert: bool = False,
) -> Tensor:
    """``torch.isin``: True where an element of ``elements`` is among ``test_elements`` (False with ``invert``);
    the shape of ``elements``.
    """

def tril_indices(row: int, col: int, offset: int = 0, *, dtype: _DTypeLike | None = None) -> Tensor:
    """``torch.tril_indices``: the (row, column) indices of the lower triangle of a row × col matrix, on and
    beyond the diagonal ``offset``, as a (2, N) tensor in row-major order (int64 unless ``dtype`` says).
    """

def triu_indices(row: int, col: int, offset: int = 0, *, dtype: _DTypeLike | None = None) -> Tensor:
    """``torch.triu_indices``: the (row, column) indices of the upper triangle of a row × col matrix, on and
    beyond the diagonal ``offset``, as a (2, N) tensor in row-major order (int64 unless ``dtype`` says).
    """

def scatter_reduce(
    x: _TensorLike,
    axis: int,
    index: _TensorLike,
    src: _TensorLike,
    reduce: str,
    *,
    include_self: bool = True,
    dim: int | None = None,
) -> Tensor:
    """``torch.scatter_reduce``: a copy of x in which each place that ``index`` names (as scatter's) is reduced
    with the src values sent there — "sum", "prod", "mean", "amax" or "amin" — together with x's own value, or
    without it when not ``include_self``. "mean" divides by the number of values reduced (floor division for
    integers, as torch). Places no index names keep x's value.
    """

# -- opforge.ops.shape

def reshape(x: _TensorLike, shape: Sequence[int] | int) -> Tensor:
    """The same elements in a new shape; one dim may be -1 (inferred)."""

def shape_as_tensor(x: _TensorLike) -> Tensor:
    """The shape of ``x`` as a 1-d int64 tensor (``torch._shape_as_tensor``, ONNX's Shape). In a program whose
    dims are known only at run time, sizes computed from it (``reshape(x, shape=...)`` fed by Shape → Gather →
    Concat in an imported ONNX model) are computed when the executor plans the run for the feeds' shapes.
    """

def transpose(x: _TensorLike, *, perm: Sequence[int] | int | None = None) -> Tensor:
    """Permutes the dims (reverses them when ``perm`` is None)."""

def broadcast_to(x: _TensorLike, shape: Sequence[int] | int, *, size: Sequence[int] | int | None = None) -> Tensor:
    """``x`` repeated along dims of size 1 (and new leading dims) to ``shape``. A -1 keeps the size of the dim
    of ``x`` it lines up with, as ``Tensor.expand`` (not allowed for a new leading dim).
    """

def slice(
    x: _TensorLike,
    *,
    axes: Sequence[int] | int,
    starts: Sequence[int] | int,
    ends: Sequence[int] | int,
    steps: Sequence[int] | int,
) -> Tensor:
    """Basic slicing, ``x[starts:ends:steps]`` along ``axes`` (indices already normalised by the caller)."""

def slice_grad(
    dy: _TensorLike,
    *,
    shape: Sequence[int] | int,
    axes: Sequence[int] | int,
    starts: Sequence[int] | int,
    ends: Sequence[int] | int,
    steps: Sequence[int] | int,
) -> Tensor:
    """Gradient of slice: zeros of ``shape`` with ``dy`` written where the slice took its elements."""

def squeeze(
    x: _TensorLike,
    axis: Sequence[int] | int | None = None,
    *,
    dim: Sequence[int] | int | None = None,
) -> Tensor:
    """Removes dims of size 1: every one when ``axis`` is None, else those listed (a listed dim whose size is
    not 1 is left alone, as in PyTorch).
    """

def unsqueeze(x: _TensorLike, axis: int, *, dim: int | None = None) -> Tensor:
    """Inserts a dim of size 1 at ``axis`` (in [-ndim-1, ndim], counted in the result)."""

def permute(x: _TensorLike, dims: Sequence[int] | int) -> Tensor:
    """Reorders the dims: dim i of the result is dim ``dims[i]`` of ``x`` (``torch.permute``)."""

def flip(x: _TensorLike, axis: Sequence[int] | int, *, dims: Sequence[int] | int | None = None) -> Tensor:
    """Reverses the order of the elements along each dim in ``axis``. The result is a copy, as torch's (NumPy's
    flip is a view: an in-place write to the result would change ``x``).
    """

def concat(xs: Sequence[_TensorLike], axis: int = 0, *, dim: int | None = None) -> Tensor:
    """Joins tensors along an existing dim ``axis``; the other dims must agree (``torch.cat``)."""

def stack(xs: Sequence[_TensorLike], axis: int = 0, *, dim: int | None = None) -> Tensor:
    """Joins tensors of one shape along a new dim ``axis`` (in [-ndim-1, ndim], counted in the result)."""

def split(
    x: _TensorLike,
    sections: Sequence[int] | int,
    axis: int = 0,
    *,
    split_size_or_sections: Sequence[int] | int | None = None,
    dim: int | None = None,
) -> list[Tensor]:
    """Cuts ``x`` along ``axis`` into pieces of the sizes in ``sections`` (which must add up to the dim), or,
    when ``sections`` is one number n (``split(x, sections=n)``), into pieces of n, the last one smaller: both
    as ``torch.split``. The pieces are views of ``x``.
    """

def tile(x: _TensorLike, reps: Sequence[int] | int, *, dims: Sequence[int] | int | None = None) -> Tensor:
    """``x`` repeated ``reps[i]`` times along dim i (``torch.tile``, ``np.tile``): the shorter of ``x.shape``
    and ``reps`` is padded with leading 1s.
    """

def tril(x: _TensorLike, diagonal: int = 0) -> Tensor:
    """The lower triangle of each matrix (last two dims): elements (i, j) with j - i <= ``diagonal``, others 0."""

def triu(x: _TensorLike, diagonal: int = 0) -> Tensor:
    """The upper triangle of each matrix (last two dims): elements (i, j) with j - i >= ``diagonal``, others 0."""

def roll(
    x: _TensorLike,
    shifts: Sequence[int] | int,
    axis: Sequence[int] | int | None = None,
    *,
    dims: Sequence[int] | int | None = None,
) -> Tensor:
    """``torch.roll``: the elements shifted by ``shifts[i]`` along ``axis[i]``, those pushed off one end coming
    back at the other. With ``axis=None``, the flattened tensor is rolled by the one shift and reshaped back. An
    axis may repeat (its shifts add up).
    """

def repeat_interleave(
    x: _TensorLike,
    repeats: Sequence[int] | int,
    axis: int | None = None,
    *,
    dim: int | None = None,
) -> Tensor:
    """``torch.repeat_interleave``: each element (each slice along ``axis``) repeated ``repeats[i]`` times in
    place: [a, b] with repeats [2] gives [a, a, b, b], with [1, 3] gives [a, b, b, b]. With ``axis=None`` the
    flattened tensor is repeated. ``repeats`` is a list (one count for all, or one per element), not a tensor,
    so that the result's shape is known without the data: for counts in a tensor ``r``, pass
    ``repeats=r.tolist()``.
    """

def repeat_interleave_grad(
    dy: _TensorLike,
    *,
    shape: Sequence[int] | int,
    repeats: Sequence[int] | int,
    axis: int | None = None,
) -> Tensor:
    """Gradient of ``repeat_interleave``: the copies of each element of an input of ``shape`` summed back into
    it.
    """

def diagonal(
    x: _TensorLike,
    offset: int = 0,
    axis1: int = 0,
    axis2: int = 1,
    *,
    dim1: int | None = None,
    dim2: int | None = None,
) -> Tensor:
    """``torch.diagonal`` (``np.diagonal``): the elements (i, i + offset) of the matrices spanned by ``axis1``
    and ``axis2``, in a new last dim; the other dims stay in order. ``offset`` > 0 is above the main diagonal.
    """

def diagonal_grad(
    dy: _TensorLike,
    *,
    shape: Sequence[int] | int,
    offset: int = 0,
    axis1: int = 0,
    axis2: int = 1,
) -> Tensor:
    """Gradient of ``diagonal``: zeros of ``shape`` with ``dy`` written on the diagonal ``diagonal`` reads (with
    ``axis1``, ``axis2`` = -2, -1, ``torch.diag_embed``).
    """

def pad(x: _TensorLike, pad: Sequence[int] | int, mode: str = 'constant', value: float = 0.0) -> Tensor:
    """Pads ``x`` as ``torch.nn.functional.pad``: ``pad`` lists (before, after) pairs from the last dim
    backwards. Modes: "constant" (fill with ``value``), "reflect" (mirror without repeating the edge: pads < the
    dim's size), "replicate" (repeat the edge), "circular" (wrap around, once at most). A negative pad crops, in
    every mode, as in PyTorch. Any dims can be padded (PyTorch pads only the last 1-3 dims in the modes other
    than constant).
    """

def pad_grad(dy: _TensorLike, *, shape: Sequence[int] | int, pad: Sequence[int] | int, mode: str) -> Tensor:
    """Gradient of ``pad`` in modes "reflect", "replicate" and "circular": each element of ``dy`` is added to
    the element of an input of ``shape`` that the padded position copied.
    """

# -- opforge.ops.similarity

def normalize(x: _TensorLike, p: float = 2.0, axis: int = 1, eps: float = 1e-12, *, dim: int | None = None) -> Tensor:
    """``torch.nn.functional.normalize``: ``x`` divided by its p-norm along ``axis``, or by ``eps`` where the
    norm is smaller: y = x / max(‖x‖ₚ, eps).
    """

def cosine_similarity(
    x1: _TensorLike,
    x2: _TensorLike,
    axis: int = 1,
    eps: float = 1e-08,
    *,
    dim: int | None = None,
) -> Tensor:
    """``torch.nn.functional.cosine_similarity``: ⟨x1, x2⟩/(‖x1‖·‖x2‖) along ``axis`` (x1 and x2 broadcast),
    each norm at least ``eps``, computed as PyTorch does: ⟨x1/max(‖x1‖, eps), x2/max(‖x2‖, eps)⟩, which stays in
    [−1, 1]. Where a norm is below eps, the gradient is the derivative (PyTorch's treats the clamped norm as if
    it were the norm).
    """

def pairwise_distance(
    x1: _TensorLike,
    x2: _TensorLike,
    p: float = 2.0,
    eps: float = 1e-06,
    keepdim: bool = False,
) -> Tensor:
    """``torch.nn.functional.pairwise_distance``: the p-norm of x1 − x2 + eps over the last dim (x1 and x2
    broadcast); ``eps`` keeps the norm differentiable where x1 = x2.
    """

# -- opforge.ops.sorting

class _sort_result(NamedTuple):
    values: Tensor
    indices: Tensor

def sort(
    x: _TensorLike,
    axis: int = -1,
    descending: bool = False,
    *,
    stable: bool = False,
    dim: int | None = None,
) -> _sort_result:
    """``torch.sort``: the elements along ``axis`` in ascending (``descending``: descending) order, and where
    each came from. Always stable; ``stable`` is accepted for PyTorch's signature.
    """

def argsort(
    x: _TensorLike,
    axis: int = -1,
    descending: bool = False,
    stable: bool = False,
    *,
    dim: int | None = None,
) -> Tensor:
    """``torch.argsort``: the indices that sort ``x`` along ``axis`` (``sort``'s second output)."""

class _topk_result(NamedTuple):
    values: Tensor
    indices: Tensor

def topk(
    x: _TensorLike,
    k: int,
    axis: int = -1,
    largest: bool = True,
    sorted: bool = True,
    *,
    dim: int | None = None,
) -> _topk_result:
    """``torch.topk``: the ``k`` largest (``largest=False``: smallest) elements along ``axis``, largest first
    (smallest first), and where they came from. Equal elements come in their original order; the result is
    sorted also with ``sorted=False`` (PyTorch leaves the order unspecified then).
    """

# -- opforge.ops.sparse

def sparse_mm(indices: _TensorLike, values: _TensorLike, dense: _TensorLike, *, size: Sequence[int] | int) -> Tensor:
    """The sparse matrix of ``size`` holding ``values`` at (``indices[0]``, ``indices[1]``) (repeated positions
    summed) times ``dense``: out[i] = Σₑ values[e]·dense[indices[1, e]] over the entries e of row i —
    ``torch.sparse.mm``. Its gradient for the values is a sampled product (⟨dout[row], dense[col]⟩ per entry),
    for the dense matrix the transposed sparse matrix times dout.
    """

# -- opforge.ops.special

def erfc(x: _TensorLike) -> Tensor:
    """The complementary error function, 1 − erf(x), without its cancellation for large x."""

def erfinv(x: _TensorLike) -> Tensor:
    """The inverse of erf on (−1, 1): ±inf at ±1, NaN beyond; −0 stays −0 (as torch)."""

def lgamma(x: _TensorLike) -> Tensor:
    """ln |Γ(x)|: +inf at 0, at the negative integers and at ±inf (as torch; SciPy's gammaln(−inf) is −inf)."""

def digamma(x: _TensorLike) -> Tensor:
    """ψ(x) = d/dx ln Γ(x): ∓inf at ±0, NaN at the negative integers (as torch)."""

def polygamma(n: int, x: _TensorLike) -> Tensor:
    """ψ⁽ⁿ⁾(x), the n-th derivative of digamma (``torch.polygamma(n, input)``: n first). n = 0 is digamma, n = 1
    torch's trigamma, and n ≥ 2 (−1)ⁿ⁺¹·n!·ζ(n + 1, x), NaN at +inf as torch's Hurwitz zeta gives it.
    """

def i0(x: _TensorLike) -> Tensor:
    """The modified Bessel function of the first kind, of order 0."""

def special_i1(x: _TensorLike) -> Tensor:
    """The modified Bessel function of the first kind, of order 1 (``torch.special.i1``)."""

def adaptive_avg_pool1d(input, output_size) -> Any:
    """``torch.nn.functional.adaptive_avg_pool1d(input, output_size)``: the op ``adaptive_avg_pool1d_sized``; a
    None in ``output_size`` keeps that dim's size.
    """

def adaptive_avg_pool2d(input, output_size) -> Any:
    """``torch.nn.functional.adaptive_avg_pool2d(input, output_size)``: the op ``adaptive_avg_pool2d_sized``; a
    None in ``output_size`` keeps that dim's size.
    """

def adaptive_avg_pool3d(input, output_size) -> Any:
    """``torch.nn.functional.adaptive_avg_pool3d(input, output_size)``: the op ``adaptive_avg_pool3d_sized``; a
    None in ``output_size`` keeps that dim's size.
    """

def adaptive_max_pool1d(input, output_size, return_indices=False) -> Any:
    """``torch.nn.functional.adaptive_max_pool1d(input, output_size, return_indices=False)``: the op
    ``adaptive_max_pool1d_values``, or with ``return_indices`` ``adaptive_max_pool1d_with_indices``, the named
    tuple (y, indices); a None in ``output_size`` keeps that dim's size.
    """

def adaptive_max_pool2d(input, output_size, return_indices=False) -> Any:
    """``torch.nn.functional.adaptive_max_pool2d(input, output_size, return_indices=False)``: the op
    ``adaptive_max_pool2d_values``, or with ``return_indices`` ``adaptive_max_pool2d_with_indices``, the named
    tuple (y, indices); a None in ``output_size`` keeps that dim's size.
    """

def adaptive_max_pool3d(input, output_size, return_indices=False) -> Any:
    """``torch.nn.functional.adaptive_max_pool3d(input, output_size, return_indices=False)``: the op
    ``adaptive_max_pool3d_values``, or with ``return_indices`` ``adaptive_max_pool3d_with_indices``, the named
    tuple (y, indices); a None in ``output_size`` keeps that dim's size.
    """

def addcdiv(input, tensor1, tensor2, *, value=1) -> Any:
    """``torch.addcdiv``: input + value·tensor1/tensor2. Integer tensor1 and tensor2 are refused, as torch
    refuses them (its integer division here was removed).
    """

def addcmul(input, tensor1, tensor2, *, value=1) -> Any:
    """``torch.addcmul``: input + value·tensor1·tensor2 (broadcast, promoted as torch does); a float ``value``
    with integer tensors is refused, as torch refuses it.
    """

def addmm(input, mat1, mat2, *, beta=1, alpha=1) -> Any:
    """``torch.addmm``: ``beta·input + alpha·(mat1 @ mat2)`` for matrices mat1 and mat2, input broadcasting to
    the product's shape (ignored when beta is 0).
    """

def addmv(input, mat, vec, *, beta=1, alpha=1) -> Any:
    """``torch.addmv``: ``beta·input + alpha·(mat @ vec)`` for a matrix and a vector."""

def affine_grid(theta, size, align_corners=None) -> Any:
    """``torch.nn.functional.affine_grid``: the sampling grid of the affine maps ``theta`` (N, 2, 3) for an
    output of ``size`` (N, C, H, W), (N, H, W, 2); or of ``theta`` (N, 3, 4) for (N, C, D, H, W), (N, D, H, W,
    3): each output pixel's (x, y[, z]) in [−1, 1] mapped by theta, for ``grid_sample``. ``align_corners`` None
    is False, as torch's default. The gradient flows to theta.
    """

def aminmax(input, *, dim=None, keepdim=False) -> Any:
    """``torch.aminmax``: the named tuple ``(min, max)`` over ``dim`` (all dims when None), each as ``amin`` and
    ``amax`` (the gradient shared among ties).
    """

def atleast_1d(tensors) -> Any:
    """``torch.atleast_1d``: a 0-d tensor as (1,), the others as they are; one tensor for one, else a tuple."""

def atleast_2d(tensors) -> Any:
    """``torch.atleast_2d``: 0-d as (1, 1), (n,) as (1, n), the others as they are."""

def atleast_3d(tensors) -> Any:
    """``torch.atleast_3d``: 0-d as (1, 1, 1), (n,) as (1, n, 1), (m, n) as (m, n, 1), the others as they are."""

def baddbmm(input, batch1, batch2, *, beta=1, alpha=1) -> Any:
    """``torch.baddbmm``: ``beta·input + alpha·bmm(batch1, batch2)``."""

def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-05) -> Any:
    """``torch.nn.functional.batch_norm``: ``y`` (``batch_norm_with_stats``'s); with ``training``, the running
    statistics given are updated in place to (1 − momentum)·running + momentum·the batch's statistic.
    """

def bilinear(input1, input2, weight, bias=None) -> Any:
    """``torch.nn.functional.bilinear``: y = x₁ᵀ·A·x₂ + b over the last dims, for inputs (*, in1) and (*, in2)
    with the same leading dims, weight (out, in1, in2) and bias (out): the einsum ``...i,oij,...j->...o``.
    """

def block_diag(tensors) -> Any:
    """``torch.block_diag``: the matrices (0-d as 1×1, 1-D as one row) along the diagonal of one matrix, zeros
    elsewhere, in their result dtype.
    """

def bmm(x, y) -> Any:
    """``torch.bmm``: batched matrix products of two 3-D tensors with the same batch size (no broadcasting)."""

def broadcast_tensors(tensors) -> Any:
    """``torch.broadcast_tensors``: each tensor broadcast to the shape they broadcast to together. A tuple."""

def bucketize(input, boundaries, *, out_int32=False, right=False) -> Any:
    """``torch.bucketize``: for each value the index of its bucket among the 1-D ``boundaries`` — i with
    boundaries[i−1] < x ≤ boundaries[i], or with ``right`` boundaries[i−1] ≤ x < boundaries[i].
    """

def cartesian_prod(tensors) -> Any:
    """``torch.cartesian_prod``: the rows of every combination of one element from each 1-D tensor, the last
    varying fastest, as a (n₁·…·n_k, k) tensor (one tensor: that tensor itself). The tensors must have one
    dtype, as torch's meshgrid requires.
    """

def cdist(x1, x2, p=2.0, compute_mode='use_mm_for_euclid_dist_if_necessary') -> Any:
    """``torch.cdist``: the p-norm distance between each row of x1 (..., P, M) and each row of x2 (..., R, M),
    (..., P, R); batch dims broadcast. Computed from the differences whatever ``compute_mode`` says (torch's
    matrix-product route for p = 2 is faster and less exact); the gradient is 0 where a distance is 0.
    """

def channel_shuffle(input, groups) -> Any:
    """``torch.nn.functional.channel_shuffle``: the C channels of ``input`` (N, C, *) seen as ``groups`` groups
    of C / groups and read group-interleaved (ShuffleNet's shuffle): channel g·(C/groups) + k goes to k·groups +
    g.
    """

def chunk(x, chunks, dim=0) -> Any:
    """``torch.chunk``: ``x`` cut along ``dim`` into at most ``chunks`` pieces of ceil(size / chunks) elements,
    the last one smaller (so there may be fewer pieces than asked for). A tuple, as torch's.
    """

def combinations(input, r=2, with_replacement=False) -> Any:
    """``torch.combinations``: the combinations of ``r`` elements of the 1-D ``input`` (itertools' combinations,
    or combinations_with_replacement), in lexicographic order of positions, as a (count, r) tensor; r=0 gives an
    empty 1-D tensor, as torch's.
    """

def corrcoef(input) -> Any:
    """``torch.corrcoef``: Pearson's correlation coefficients of the variables in ``input``'s rows (``cov``
    normalised by the standard deviations, clipped to [-1, 1]); for one variable c/c (1, or NaN where its
    variance is 0, NaN or inf), as torch's.
    """

def count_nonzero(input, dim=None, *, axis=None) -> Any:
    """``torch.count_nonzero``: the number of nonzero elements over ``dim`` (every dim when None), int64."""

def cov(input, *, correction=1, fweights=None, aweights=None) -> Any:
    """``torch.cov``: the covariance matrix of the variables in ``input``'s rows (its columns are the
    observations; a 1-D input is one variable), divided by observations − ``correction``, size-1 dims squeezed
    as torch squeezes them; observations weighed by the integer ``fweights`` times the float ``aweights`` (read
    eagerly: refused in a traced program). No degrees of freedom left divides by 0 (torch warns the same).
    Integers give float32.
    """

def cross(input, other, dim=None) -> Any:
    """``torch.cross``: the cross product of 3-vectors along ``dim`` (by default the first dim of size 3, as
    torch reads it); the shapes broadcast.
    """

def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction='mean', zero_infinity=False) -> Any:
    """``torch.nn.functional.ctc_loss``: ``ctc_nll``'s per-sample losses reduced — "mean": each divided by its
    target length (at least 1), then averaged; "sum"; "none". The lengths may be tensors or lists of ints.
    """

def cumulative_trapezoid(y, x=None, *, dx=None, dim=-1) -> Any:
    """``torch.cumulative_trapezoid``: the running trapezoidal rule along ``dim`` (one element fewer than y
    there), at the points ``x`` or spaced ``dx`` apart (1 by default); integers give float32.
    """

def diag(input, diagonal=0) -> Any:
    """``torch.diag``: of a 1-D tensor, the square matrix with it on diagonal ``diagonal``; of a 2-D one, that
    diagonal.
    """

def diag_embed(input, offset=0, dim1=-2, dim2=-1) -> Any:
    """``torch.diag_embed``: a tensor with one dim more whose (``dim1``, ``dim2``) planes hold the last dim of
    ``input`` on their diagonal ``offset``, zeros elsewhere (diagonal's adjoint: ``diagonal_grad``).
    """

def diagflat(input, offset=0) -> Any:
    """``torch.diagflat``: the square matrix with the flattened input on diagonal ``offset``."""

def diff(input, n=1, dim=-1, prepend=None, append=None, *, axis=None) -> Any:
    """``torch.diff``: the n-th forward difference along ``dim``, ``out[i] = x[i + 1] − x[i]`` applied ``n``
    times, after ``prepend`` and ``append`` are joined to ``input`` along ``dim``; for bool tensors ``x[i + 1]
    != x[i]``.
    """

def dropout(x, p=0.5, training=True, inplace=False) -> Any:
    """``torch.nn.functional.dropout``: ``dropout_with_mask``'s output ``y``, without the mask."""

def dropout1d(x, p=0.5, training=True, inplace=False) -> Any:
    """``torch.nn.functional.dropout1d``: ``dropout1d_with_mask``'s output ``y``, without the mask."""

def dropout2d(x, p=0.5, training=True, inplace=False) -> Any:
    """``torch.nn.functional.dropout2d``: ``dropout2d_with_mask``'s output ``y``, without the mask."""

def dropout3d(x, p=0.5, training=True, inplace=False) -> Any:
    """``torch.nn.functional.dropout3d``: ``dropout3d_with_mask``'s output ``y``, without the mask."""

def dstack(tensors) -> Any:
    """``torch.dstack``: concatenated along dim 2, after atleast_3d."""

def flatten(x, start_dim=0, end_dim=-1) -> Any:
    """``torch.flatten``: dims ``start_dim`` .. ``end_dim`` merged into one (a 0-d tensor becomes 1-d)."""

def gaussian_nll_loss(input, target, var, full=False, eps=1e-06, reduction='mean') -> Any:
    """``torch.nn.functional.gaussian_nll_loss``: ½·(log v + (input − target)²/v), plus ½·log 2π with ``full``,
    where v is ``var`` clamped to ≥ eps (the clamp passes the gradient unchanged, as torch's clamp under
    no_grad); then reduced. ``var`` has the input's shape, or one dim fewer (one variance per row), or a size-1
    dim where the input has another; a number is a variance for every element. A negative variance is an error,
    checked eagerly (in a compiled program the values are unknown when it is traced: there it is clamped).
    """

def grid_sample(input, grid, mode='bilinear', padding_mode='zeros', align_corners=None) -> Any:
    """``torch.nn.functional.grid_sample``: an input (N, C, H, W) read at a grid (N, Ho, Wo, 2) of (x, y)
    positions, or a volume (N, C, D, H, W) at a grid (N, Do, Ho, Wo, 3) of (x, y, z) positions, each in [−1, 1]
    (−1 the left/top/front edge, or the first pixel's centre with ``align_corners``): (N, C, Ho, Wo) or (N, C,
    Do, Ho, Wo). ``mode``: "bilinear" (the 2 or 2×2×2 neighbours' blend: trilinear for volumes), "nearest" (the
    nearest pixel, halves to even) or "bicubic" (4-D only, as torch: the 4×4 neighbours weighted by the cubic
    convolution kernel, A = −0.75). Positions outside read 0 ("zeros"), the edge ("border") or the image
    mirrored ("reflection"); for "bicubic", each neighbour is padded so, as torch's. ``align_corners`` None is
    False, as torch's default. With "nearest" the grid gets no gradient (None; torch's is zeros).
    """

def heaviside(input, values) -> Any:
    """``torch.heaviside``: 0 where ``input`` < 0, ``values`` where it is 0, 1 where it is > 0 (and 0 where it
    is NaN, as torch's kernel gives), broadcast; ``input`` and ``values`` must have one dtype, as torch
    requires. Differentiable in ``values`` (torch's raises: it has no derivative for heaviside).
    """

def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction='mean') -> Any:
    """``torch.nn.functional.hinge_embedding_loss``: input where target is 1, max(0, margin − input) where it is
    −1 (torch's composition: the first term where target ≠ −1, the second where target ≠ 1), then reduced.
    """

def hstack(tensors) -> Any:
    """``torch.hstack``: concatenated along dim 1 (dim 0 for 1-D tensors), after atleast_1d."""

def inner(input, other) -> Any:
    """``torch.inner``: the sum of products over the last dims (a 0-d operand multiplies)."""

def instance_norm(
    x,
    running_mean=None,
    running_var=None,
    weight=None,
    bias=None,
    use_input_stats=True,
    momentum=0.1,
    eps=1e-05,
) -> Any:
    """``torch.nn.functional.instance_norm``: each channel of each sample normalised by its own statistics
    (``instance_norm_affine``), the running statistics given updated in place with ``instance_stats``; or, with
    ``use_input_stats=False``, normalised by the running statistics.
    """

def kron(input, other) -> Any:
    """``torch.kron``: the Kronecker product; the operand of lower rank gets leading dims of size 1."""

def linalg_cross(input, other, *, dim=-1) -> Any:
    """``torch.linalg.cross``: the cross product of 3-vectors along ``dim``; the shapes broadcast."""

def linalg_eigvalsh(a, UPLO='L') -> Any:
    """``torch.linalg.eigvalsh``: the eigenvalues of a symmetric matrix, ascending (``linalg_eigh``'s first)."""

def linalg_lstsq(A, B, rcond=None, *, driver=None) -> Any:
    """``torch.linalg.lstsq``: the named tuple ``(solution, residuals, rank, singular_values)`` of min ‖A·X − B‖
    for A (..., m, n) and B (..., m, k) (or (..., m)). The solution is pinv(A)·B with singular values at or
    below rcond·σ₁ dropped (rcond by default eps·max(m, n)): the minimum-norm solution, which is LAPACK's for
    every driver where A has full rank (torch's default 'gelsy' gives another solution for a rank-deficient A).
    As torch's: residuals (the squared residual norms) for m > n with drivers other than 'gelsy' (here also for
    a rank-deficient A, where torch gives them empty), the rank for drivers other than 'gels', the singular
    values for 'gelsd' and 'gelss'; the others empty. Differentiable through the SVD.
    """

def linalg_lu(A, *, pivot=True) -> Any:
    """``torch.linalg.lu``: the named tuple ``(P, L, U)`` with A = P·L·U (``linalg_lu_factor`` unpacked)."""

def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False) -> Any:
    """``torch.linalg.lu_solve``: X with A·X = B (``left=False``: X·A = B; ``adjoint``: with Aᵀ) for A given as
    ``linalg_lu_factor``'s (LU, pivots).
    """

def linalg_matrix_power(A, n) -> Any:
    """``torch.linalg.matrix_power``: A multiplied by itself n times (the identity for n = 0; the inverse's
    power for n < 0), by repeated squaring.
    """

def linalg_matrix_rank(A, *, atol=None, rtol=None, hermitian=False) -> Any:
    """``torch.linalg.matrix_rank``: the number of singular values above max(atol, rtol·σ₁) (int64)."""

def linalg_solve_triangular(A, B, *, upper, left=True, unitriangular=False) -> Any:
    """``torch.linalg.solve_triangular``: X with A·X = B (``left=False``: X·A = B) for A upper (``upper``) or
    lower triangular, its other triangle not read (nor its diagonal, taken as ones, when ``unitriangular``). The
    gradient with respect to A lies in that triangle. A zero on the diagonal is an error (torch gives inf).
    """

def local_response_norm(input, size, alpha=0.0001, beta=0.75, k=1.0) -> Any:
    """``torch.nn.functional.local_response_norm``: x / (k + alpha·mean of x² over ``size`` neighbouring
    channels)^beta, for an (N, C, ...) input; the window is zero-padded, size//2 channels before and (size −
    1)//2 after, and the mean divides by ``size`` (torch's composition, step for step).
    """

def logdet(input) -> Any:
    """``torch.logdet``: ln det: NaN for a negative determinant, −inf for 0 (as torch)."""

def max(x, dim=None, keepdim=False, *, axis=None) -> Any:
    """``torch.max`` (and ``Tensor.max``): ``max(x)`` the largest value (the gradient shared among ties, as
    ``amax``); ``max(x, dim, keepdim=False)`` the named tuple ``(values, indices)`` along one dim, the first
    largest where values tie, NaN counting as the largest (the gradient to that index alone); ``max(x, other)``
    the elementwise ``maximum``. ``axis=`` is another spelling of ``dim=``, as in torch. Not an op of its own:
    it calls amax, argmax and gather, or maximum.
    """

def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False) -> Any:
    """``torch.nn.functional.max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
    return_indices=False)``: the op ``max_pool1d_values``, or with ``return_indices``
    ``max_pool1d_with_indices``, the named tuple (y, indices), indices flat over each (N, C) plane's positions
    as ``F.max_unpool1d`` takes them.
    """

def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False) -> Any:
    """``torch.nn.functional.max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
    return_indices=False)``: the op ``max_pool2d_values``, or with ``return_indices``
    ``max_pool2d_with_indices``, the named tuple (y, indices), indices flat over each (N, C) plane's positions
    as ``F.max_unpool2d`` takes them.
    """

def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False) -> Any:
    """``torch.nn.functional.max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
    return_indices=False)``: the op ``max_pool3d_values``, or with ``return_indices``
    ``max_pool3d_with_indices``, the named tuple (y, indices), indices flat over each (N, C) plane's positions
    as ``F.max_unpool3d`` takes them.
    """

def max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None) -> Any:
    """``torch.nn.functional.max_unpool1d``: ``max_unpool`` into the size max_pool1d's input had, (in −
    1)·stride + kernel_size − 2·padding per dim, or ``output_size`` (within a stride of it, as torch checks); an
    unbatched input (C, ...) too.
    """

def max_unpool2d(input, indices, kernel_size, stride=None, padding=0, output_size=None) -> Any:
    """``torch.nn.functional.max_unpool2d``: ``max_unpool`` into the size max_pool2d's input had, (in −
    1)·stride + kernel_size − 2·padding per dim, or ``output_size`` (within a stride of it, as torch checks); an
    unbatched input (C, ...) too.
    """

def max_unpool3d(input, indices, kernel_size, stride=None, padding=0, output_size=None) -> Any:
    """``torch.nn.functional.max_unpool3d``: ``max_unpool`` into the size max_pool3d's input had, (in −
    1)·stride + kernel_size − 2·padding per dim, or ``output_size`` (within a stride of it, as torch checks); an
    unbatched input (C, ...) too.
    """

def median(input, dim=None, keepdim=False, *, axis=None) -> Any:
    """``torch.median``: ``median(x)`` the lower median of all elements (NaN if one is NaN; the gradient shared
    among the elements equal to it), ``median(x, dim, keepdim=False)`` the named tuple ``(values, indices)``
    along ``dim`` (the gradient to the index). The lower of the two middle elements for an even count, not their
    mean.
    """

def meshgrid(tensors, *, indexing=None) -> Any:
    """``torch.meshgrid``: for 1-D (or 0-d) tensors of sizes n₁ … n_k, k tensors of shape (n₁, …, n_k), the i-th
    varying along dim i ("ij", torch's default) — or with indexing="xy" the first two dims swapped (NumPy's
    default). A tuple.
    """

def min(x, dim=None, keepdim=False, *, axis=None) -> Any:
    """``torch.min`` (and ``Tensor.min``): ``min(x)``, ``min(x, dim)`` -> ``(values, indices)``, ``min(x,
    other)`` (see ``max``).
    """

def mm(x, y) -> Any:
    """``torch.mm``: the product of two matrices (matmul of 2-D tensors only, as torch's: no broadcasting)."""

def multi_dot(tensors) -> Any:
    """``torch.linalg.multi_dot``: the product of matrices (the first may be a row vector and the last a column
    vector, 1-D), left to right.
    """

def multi_margin_loss(
    input,
    target,
    p=1,
    margin=1.0,
    weight=None,
    size_average=None,
    reduce=None,
    reduction='mean',
) -> Any:
    """``torch.nn.functional.multi_margin_loss``: for scores x (C,) or (N, C) and class indices y, per sample
    Σ_{i ≠ y} w[y]·max(0, margin − x[y] + x[i])^p / C, then reduced; p is 1 or 2. The hinge passes no gradient
    at 0 (torch's kernel: z > 0), and ``weight`` (one value per class) gets none, as torch's.
    """

def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction='mean') -> Any:
    """``torch.nn.functional.multilabel_margin_loss``: scores x (C,) or (N, C); each target row holds class
    indices, ended by the first −1. Per sample Σ_{j targets} Σ_{i not a target} max(0, 1 − (x[j] − x[i])) / C,
    then reduced (a class listed twice counts twice, as in torch). The hinge passes no gradient at 0 (z > 0).
    """

def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction='mean') -> Any:
    """``torch.nn.functional.multilabel_soft_margin_loss``: per sample the mean over the classes (the last dim)
    of −w·(y·log σ(x) + (1 − y)·log σ(−x)), then reduced.
    """

def nanmean(input, dim=None, keepdim=False, *, dtype=None, axis=None) -> Any:
    """``torch.nanmean``: the mean over ``dim`` of the elements that are not NaN (NaN where all are)."""

def nanmedian(input, dim=None, keepdim=False, *, axis=None) -> Any:
    """``torch.nanmedian``: ``median`` with NaN left out (NaN only where every element is)."""

def nanquantile(input, q, dim=None, keepdim=False, *, interpolation='linear', axis=None) -> Any:
    """``torch.nanquantile``: ``quantile`` with NaN left out (NaN only where every element is)."""

def nansum(input, dim=None, keepdim=False, *, dtype=None, axis=None) -> Any:
    """``torch.nansum``: the sum over ``dim`` with NaN counted as zero (its gradient 0 there)."""

def narrow(x, dim, start, length) -> Any:
    """``torch.narrow``: elements ``start`` .. ``start + length - 1`` along ``dim`` (``start`` may be negative)."""

def nonzero(input, *, as_tuple=False) -> Any:
    """``torch.nonzero``: ``argwhere``'s rows, or with ``as_tuple`` one 1-D tensor per dim (its column; a 0-d
    input counts as 1-D).
    """

def pdist(input, p=2.0) -> Any:
    """``torch.nn.functional.pdist``: the p-norm distance between each pair of rows i < j of ``input`` (N, M),
    in the order (0, 1), (0, 2), ..., (1, 2), ...: N·(N − 1)/2 values (``cdist``'s upper triangle).
    """

def poisson_nll_loss(
    input,
    target,
    log_input=True,
    full=False,
    size_average=None,
    eps=1e-08,
    reduce=None,
    reduction='mean',
) -> Any:
    """``torch.nn.functional.poisson_nll_loss``: exp(input) − target·input (``log_input``), else input −
    target·log(input + eps); with ``full``, Stirling's target·log(target) − target + ½·log(2π·target) is added
    where target > 1. Then reduced.
    """

def quantile(input, q, dim=None, keepdim=False, *, interpolation='linear', axis=None) -> Any:
    """``torch.quantile``: the q-th quantiles along ``dim`` (of all elements when None), q a number or a 1-D
    tensor of them in [0, 1] (then their results stacked first), between the sorted elements by
    ``interpolation`` ('linear', 'lower', 'higher', 'midpoint', 'nearest': ties to even). NaN where the row
    holds one.
    """

def rot90(input, k=1, dims=[0, 1]) -> Any:
    """``torch.rot90``: ``input`` turned by k·90° in the plane of ``dims``, from the first dim towards the
    second (k may be negative).
    """

def rrelu(input, lower=0.125, upper=0.3333333333333333, training=False, inplace=False) -> Any:
    """``torch.nn.functional.rrelu``: ``rrelu_with_noise``'s output ``y`` (the slopes kept inside the op for
    backward); ``inplace=True`` writes it into ``input``.
    """

def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    *,
    scale=None,
) -> Any:
    """``torch.nn.functional.scaled_dot_product_attention``: the op ``dot_product_attention``; with
    ``dropout_p`` > 0 its weights (computed with ops, as its gradient rule computes them) are dropped as
    ``F.dropout`` drops — from opforge's seeded generator, so ``of.manual_seed`` repeats the draw, eagerly and
    compiled alike (torch's generator draws other masks) — before they weigh the values. As torch's, it drops
    whenever ``dropout_p`` > 0: give 0 outside training.
    """

def signbit(input) -> Any:
    """``torch.signbit``: whether each element's sign bit is set — True for -0.0 and for a NaN with its sign bit
    (floats), for a negative integer, never for a bool. A bool tensor, not differentiable.
    """

def slogdet(input) -> Any:
    """``torch.slogdet`` (``torch.linalg.slogdet``): the named tuple ``(sign, logabsdet)``."""

def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction='mean', beta=1.0) -> Any:
    """``torch.nn.functional.smooth_l1_loss``: ½·d²/beta where |d| < beta, else |d| − ½·beta, with d = input −
    target; then reduced. It is huber_loss with delta = beta, divided by beta (l1_loss when beta is 0). The
    legacy ``size_average``/``reduce`` are refused: pass ``reduction``.
    """

def soft_margin_loss(input, target, size_average=None, reduce=None, reduction='mean') -> Any:
    """``torch.nn.functional.soft_margin_loss``: log(1 + exp(−target·input)), elementwise, then reduced.
    Computed as softplus(−target·input) without overflow (torch's log1p(exp(·)) gives inf past exp's range,
    where this gives the loss: a documented difference).
    """

def softsign(input) -> Any:
    """``torch.nn.functional.softsign``: x / (1 + |x|), as torch composes it (NaN at ±inf, its gradient too)."""

def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None) -> Any:
    """``torch.std_mean``: ``(std, mean)`` over ``dim``, as ``std`` and ``mean`` compute them."""

def t(x) -> Any:
    """``torch.t``: a 2-D tensor transposed; 0-D and 1-D tensors as they are."""

def take_along_dim(input, indices, dim=None) -> Any:
    """``torch.take_along_dim``: ``input`` read at ``indices`` along ``dim`` (NumPy's take_along_axis); the
    other dims broadcast between the two. Without ``dim``, both are flattened first.
    """

def tanhshrink(input) -> Any:
    """``torch.nn.functional.tanhshrink``: x − tanh(x), as torch composes it."""

def tensor_split(input, indices_or_sections, dim=0) -> Any:
    """``torch.tensor_split``: views of ``input`` along ``dim`` — ``n`` pieces (the first size % n one longer),
    or the pieces between the given split indices (clamped to the size, so some may be empty). A tuple.
    """

def tensordot(a, b, dims=2) -> Any:
    """``torch.tensordot``: the sum of products over ``dims`` dims, the last ``dims`` of a with the first
    ``dims`` of b (an int), or over the dims of a and b two lists name (``([1, 0], [0, 1])``).
    """

def trace(input) -> Any:
    """``torch.trace`` (``Tensor.trace``): the sum of a matrix's main diagonal (int64 for integer matrices). Not
    ``of.trace``, which traces a program.
    """

def trapezoid(y, x=None, *, dx=None, dim=-1) -> Any:
    """``torch.trapezoid``: the trapezoidal rule along ``dim`` — at the points ``x`` (1-D, one per sample, or a
    tensor broadcasting with y) or spaced ``dx`` apart (1 by default). No samples give 0 in y's dtype, as
    torch's; integers give float32.
    """

def trapz(y, x=None, *, dx=None, dim=-1) -> Any:
    """``torch.trapz``: ``trapezoid``, under torch's older name."""

def unbind(x, dim=0) -> Any:
    """``torch.unbind``: the slices of ``x`` along ``dim``, that dim removed, as a tuple."""

def unflatten(x, dim, sizes) -> Any:
    """``torch.unflatten``: dim ``dim`` split into dims of ``sizes`` (one of them may be -1)."""

def unfold_windows(input, dimension, size, step) -> Any:
    """``Tensor.unfold(dimension, size, step)`` (torch's, not ``F.unfold``'s im2col): the windows of ``size``
    elements every ``step`` along ``dimension``, that dim becoming the number of windows and a last dim of
    ``size`` added. The windows may overlap; their gradients add up (``take``'s).
    """

def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None) -> Any:
    """``torch.unique``: the sorted distinct elements (along ``dim``: the distinct slices), and with
    ``return_inverse`` / ``return_counts`` where each element went and how often each occurs (a tuple, as
    torch). Sorted also with ``sorted=False``, as torch's CPU kernel does.
    """

def vander(x, N=None, increasing=False) -> Any:
    """``torch.vander``: the Vandermonde matrix of the 1-D ``x``, ``N`` columns (len(x) by default) of the
    powers x⁰ … x^(N−1), decreasing unless ``increasing``; integers and bools in int64, as torch's (the powers
    are running products: torch's cumprod).
    """

def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None) -> Any:
    """``torch.var_mean``: ``(var, mean)`` over ``dim``, as ``var`` and ``mean`` compute them."""

def vstack(tensors) -> Any:
    """``torch.vstack`` (``row_stack``): concatenated along dim 0, after atleast_2d."""
