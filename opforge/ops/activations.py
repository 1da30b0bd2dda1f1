"""torch.nn.functional's shrinking and thresholding activations: hardshrink, softshrink, threshold, rrelu, and the
compositions softsign and tanhshrink.

Each follows torch at its kinks and at NaN values: the comparisons are torch's (a NaN input is neither inside nor
below the bound, so it comes out as NaN). Their gradients at a NaN input are NaN, the library's rule for
elementwise ops (tests/test_oracle_activations.py; torch gives 0 or dy there). softsign and
tanhshrink are compositions in torch (x / (1 + |x|), x − tanh x), and are here too, so that their gradients are
the same at every point, infinities included.
"""

from opforge import ops as F

from ._common import Sample, Spec, function, np, op
from .elementwise import _away_from, _carry_nan


def _check_lambd(*, lambd):
    if not lambd >= 0:  # torch's softshrink refuses it too
        raise ValueError(f"argument 'lambd' must be >= 0, got {lambd}")


def _inside(x, lambd):
    """Where −lambd ≤ x ≤ lambd: what the shrinks set to 0 (False at NaN, as torch's comparisons)."""
    return np.logical_and(x >= -lambd, x <= lambd)


@op("hardshrink(Tensor<floating> x, float lambd=0.5) -> Tensor y", traits=["elementwise", "pointwise"])
def hardshrink(x, *, lambd):
    """y = 0 where −lambd ≤ x ≤ lambd, else x."""
    return np.where(_inside(x, lambd), 0, x).astype(x.dtype, copy=False)


@hardshrink.grad
def _(x, dy, *, lambd):
    return F.shrink_grad(x, dy, lambd=lambd)


@op("softshrink(Tensor<floating> x, float lambd=0.5) -> Tensor y", traits=["elementwise", "pointwise"])
def softshrink(x, *, lambd):
    """y = x − lambd above lambd, x + lambd below −lambd, 0 between (NaN stays NaN)."""
    return np.where(_inside(x, lambd), 0, x - np.sign(x) * x.dtype.type(lambd)).astype(x.dtype, copy=False)


@softshrink.grad
def _(x, dy, *, lambd):
    return F.shrink_grad(x, dy, lambd=lambd)


@op("shrink_grad(Tensor<floating> x, Tensor<floating> dy, *, float lambd=0.5) -> Tensor dx",
    traits=["elementwise", "pointwise"])
def shrink_grad(x, dy, *, lambd):
    """Gradient of hardshrink and softshrink: dy where x < −lambd or x > lambd, else 0; NaN where x is NaN (the
    library's rule for elementwise gradients; torch gives 0 there)."""
    return _carry_nan(x, np.where(np.logical_or(x < -lambd, x > lambd), dy, 0).astype(dy.dtype, copy=False))


@shrink_grad.grad
def _(x, ddx, *, lambd):
    return {"x": None, "dy": F.shrink_grad(x, ddx, lambd=lambd)}  # piecewise constant in x


softshrink.check(_check_lambd)  # (torch's hardshrink takes any lambd: below 0 it is the identity)


def _shrink_samples(rng):
    yield Sample.of(_away_from([-0.5, 0.5], rng, (3, 4), -2, 2))
    yield Sample.of(_away_from([-1.5, 1.5], rng, 6, -3, 3), lambd=1.5)
    yield Sample.of(_away_from([0], rng, (2, 3), -2, 2), lambd=0.0)
    yield Sample.of(_away_from([-0.5, 0.5], rng, (), -2, 2))


hardshrink.samples(_shrink_samples)
softshrink.samples(_shrink_samples)


@shrink_grad.samples
def _(rng):
    yield Sample.of(_away_from([-0.5, 0.5], rng, (3, 4), -2, 2), rng.standard_normal((3, 4)))
    yield Sample.of(_away_from([-1, 1], rng, 5, -3, 3), rng.standard_normal(5), lambd=1.0)


@op("threshold(Tensor<floating> x, float threshold, float value) -> Tensor y", traits=["elementwise", "pointwise"])
def threshold(x, *, threshold, value):
    """y = value where x ≤ threshold, else x (NaN stays NaN)."""
    return np.where(x <= threshold, x.dtype.type(value), x)


@threshold.grad
def _(x, dy, *, threshold, value):
    return F.threshold_grad(x, dy, threshold=threshold)


@threshold.samples
def _(rng):
    yield Sample.of(_away_from([0.5], rng, (3, 4), -2, 2), threshold=0.5, value=7.0)
    yield Sample.of(_away_from([0], rng, 5, -2, 2), threshold=0.0, value=-1.0)
    yield Sample.of(_away_from([0], rng, (), -2, 2), threshold=0.0, value=0.0)


@op("threshold_grad(Tensor<floating> x, Tensor<floating> dy, *, float threshold) -> Tensor dx",
    traits=["elementwise", "pointwise"])
def threshold_grad(x, dy, *, threshold):
    """Gradient of threshold: 0 where x ≤ threshold, else dy; NaN where x is NaN (torch gives dy there)."""
    return _carry_nan(x, np.where(x <= threshold, 0, dy).astype(dy.dtype, copy=False))


@threshold_grad.grad
def _(x, ddx, *, threshold):
    return {"x": None, "dy": F.threshold_grad(x, ddx, threshold=threshold)}


@threshold_grad.samples
def _(rng):
    yield Sample.of(_away_from([0.5], rng, (3, 4), -2, 2), rng.standard_normal((3, 4)), threshold=0.5)


# -- rrelu --------------------------------------------------------------------------------------------------------


@op("rrelu_with_noise(Tensor<floating> x, *, float lower=0.125, float upper=0.3333333333333333, bool training=False) "
    "-> (Tensor y, Tensor noise)", traits=["random"])
def rrelu_with_noise(x, *, lower, upper, training, rng):
    """Randomized leaky ReLU (torch's ``rrelu_with_noise``): y = x·noise, where ``noise`` is 1 for x > 0 and, for
    x ≤ 0, a slope drawn uniformly from [lower, upper] per element while ``training``, else (lower + upper)/2 (then
    it is leaky_relu with that slope). The slopes are an output so that backward uses the ones the forward pass
    drew (dx = dy·noise); draws come from the seeded generator."""
    if training:
        slopes = rng.uniform(lower, upper, x.shape).astype(x.dtype, copy=False)
        noise = np.where(x <= 0, slopes, 1).astype(x.dtype, copy=False)
    else:
        noise = np.where(x > 0, 1, x.dtype.type((lower + upper) / 2)).astype(x.dtype, copy=False)
    return x * noise, noise


@rrelu_with_noise.check
def _(*, lower, upper, training):
    if not lower <= upper:
        raise ValueError(f"argument 'lower' must not exceed 'upper', got {lower} > {upper}")


@rrelu_with_noise.infer
def _(x, *, lower, upper, training):
    return Spec(x.shape, x.dtype), Spec(x.shape, x.dtype)


@rrelu_with_noise.grad
def _(noise, dy, *, lower, upper, training):
    return dy * noise


@rrelu_with_noise.samples
def _(rng):
    # Numeric gradient checks call the op again and again: training draws new slopes at each call, so the samples
    # run it in evaluation (tests/test_oracle_missing2.py checks training: slopes in range, used by backward).
    yield Sample.of(_away_from([0], rng, (3, 4), -2, 2))
    yield Sample.of(_away_from([0], rng, 5, -2, 2), lower=0.2, upper=0.5)
    yield Sample.of(_away_from([0], rng, (), -2, 2), lower=0.3, upper=0.3, training=True)


@function
def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    """``torch.nn.functional.rrelu``: ``rrelu_with_noise``'s output ``y`` (the slopes kept inside the op for
    backward); ``inplace=True`` writes it into ``input``."""
    y = F.rrelu_with_noise(input, lower=float(lower), upper=float(upper), training=bool(training))[0]
    return input.copy_(y) if inplace else y


@function
def softsign(input):
    """``torch.nn.functional.softsign``: x / (1 + |x|), as torch composes it (NaN at ±inf, its gradient too)."""
    return input / (F.abs(input) + 1)


@function
def tanhshrink(input):
    """``torch.nn.functional.tanhshrink``: x − tanh(x), as torch composes it."""
    return input - F.tanh(input)




# -- ONNX export: the kernels' comparisons with Where (ONNX's Shrink takes float32 attributes) ---------------------


def _onnx_inside(g, x, lambd):
    return g.op("And", g.op("GreaterOrEqual", x, g.scalar(-lambd, x)), g.op("LessOrEqual", x, g.scalar(lambd, x)))


hardshrink.onnx(lambda g, x, *, lambd: g.op("Where", _onnx_inside(g, x, lambd), g.scalar(0, x), x))


@softshrink.onnx
def _(g, x, *, lambd):
    moved = g.op("Sub", x, g.op("Mul", g.op("Sign", x), g.scalar(lambd, x)))
    return g.op("Where", _onnx_inside(g, x, lambd), g.scalar(0, x), moved)


threshold.onnx(lambda g, x, *, threshold, value: g.op(
    "Where", g.op("LessOrEqual", x, g.scalar(threshold, x)), g.scalar(value, x), x))


@rrelu_with_noise.onnx
def _(g, x, *, lower, upper, training):
    if training:  # a slope per element drawn in [lower, upper) (ONNX Runtime's draws), where x ≤ 0
        slopes = g.op("RandomUniformLike", x, low=float(lower), high=float(upper))
        noise = g.op("Where", g.op("LessOrEqual", x, g.scalar(0, x)), slopes, g.scalar(1, x))
    else:
        noise = g.op("Where", g.op("Greater", x, g.scalar(0, x)), g.scalar(1, x), g.scalar((lower + upper) / 2, x))
    return g.op("Mul", x, noise), noise
