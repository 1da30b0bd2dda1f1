"""Losses."""

from opforge import ops as F

from ._common import Sample, np, op


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
