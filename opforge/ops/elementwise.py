"""Elementwise ops of one tensor. Each gradient rule is written with ops, so it can be differentiated again."""

from opforge import ops as F

from ._common import Sample, Spec, np, op

# -- the seed designs' examples --------------------------------------------------------------------------------


@op("identity(Tensor x) -> Tensor y", traits=["elementwise"])
def identity(x):
    """Returns its input unchanged (a new tensor sharing the data)."""
    return x


@identity.grad
def _(dy):
    return F.identity(dy)


@op("scale(Tensor<floating> x, *, float scale) -> Tensor y", traits=["elementwise"])
def scale(x, *, scale):
    """Multiplies by a constant: y = scale · x."""
    return x * scale  # a Python float keeps the array's dtype (NumPy 2 promotion)


@scale.grad
def _(dy, *, scale):
    return F.scale(dy, scale=scale)


@scale.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), scale=-1.5)
    yield Sample.of(rng.standard_normal(()), scale=2.0)


@op("square(Tensor x) -> Tensor y", traits=["elementwise"])
def square(x):
    """y = x²."""
    return np.square(x)


@square.grad
def _(x, dy):
    return dy * 2 * x  # a composition: no dedicated grad op needed


@op("sqrt(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
def sqrt(x):
    """y = √x."""
    return np.sqrt(x)


@sqrt.grad
def _(y, dy):
    return F.sqrt_grad(y, dy)  # needs only the output, as TensorFlow's SqrtGrad


@sqrt.samples
def _(rng):
    yield Sample.of(rng.uniform(0.5, 2.0, (2, 3)))
    yield Sample.of(rng.uniform(0.5, 2.0, ()))


@op("sqrt_grad(Tensor<floating> y, Tensor dy) -> Tensor dx", traits=["elementwise"])
def sqrt_grad(y, dy):
    """Gradient of sqrt from its output: dx = dy / (2·y)."""
    return dy * 0.5 / y


@sqrt_grad.grad
def _(y, dx, ddx):
    # dx = ½·dy/y, so ∂dx/∂y = −dx/y and ∂dx/∂dy = ½/y (TensorFlow's SqrtGradGrad).
    return -ddx * dx / y, ddx * 0.5 / y


@sqrt_grad.samples
def _(rng):
    yield Sample.of(rng.uniform(0.5, 2.0, (2, 3)), rng.standard_normal((2, 3)))


@op("leaky_relu(Tensor<floating> x, *, float alpha=0.01) -> Tensor y", traits=["elementwise"])
def leaky_relu(x, *, alpha):
    """y = x where x > 0, else alpha · x."""
    # max(x, αx) is x for x > 0 and αx for x < 0 whenever α ≤ 1 (min when α > 1): two ufuncs, no np.where,
    # which costs more than the arithmetic on small tensors.
    scaled = x * alpha
    return np.maximum(x, scaled) if alpha <= 1 else np.minimum(x, scaled)


@leaky_relu.grad
def _(x, dy, *, alpha):
    return F.leaky_relu_grad(x, dy, alpha=alpha)  # names x and dy only: y is not kept for backward


@leaky_relu.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), alpha=0.2)
    yield Sample.of(rng.standard_normal(5))
    yield Sample.of(rng.standard_normal(()), alpha=1.5)


@op("leaky_relu_grad(Tensor<floating> x, Tensor<floating> dy, *, float alpha) -> Tensor dx", traits=["elementwise"])
def leaky_relu_grad(x, dy, *, alpha):
    """Gradient of leaky_relu: dx = dy where x > 0, else alpha · dy."""
    return np.where(x > 0, dy, dy * alpha)


@leaky_relu_grad.grad
def _(x, ddx, *, alpha):
    return {"x": None, "dy": F.leaky_relu_grad(x, ddx, alpha=alpha)}  # piecewise linear in x


@leaky_relu_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), alpha=0.2)


# -- the base set --------------------------------------------------------------------------------------------


@op("neg(Tensor x) -> Tensor y", traits=["elementwise"])
def neg(x):
    """y = −x."""
    return np.negative(x)


@neg.grad
def _(dy):
    return F.neg(dy)


@op("exp(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
def exp(x):
    """y = eˣ."""
    return np.exp(x)


@exp.grad
def _(y, dy):
    return dy * y


@op("log(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
def log(x):
    """Natural logarithm."""
    return np.log(x)


@log.grad
def _(x, dy):
    return dy / x


@log.samples
def _(rng):
    yield Sample.of(rng.uniform(0.5, 3.0, (2, 3)))
    yield Sample.of(rng.uniform(0.5, 3.0, ()))


@op("tanh(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
def tanh(x):
    """Hyperbolic tangent."""
    return np.tanh(x)


@tanh.grad
def _(y, dy):
    return dy * (1 - y * y)


@op("sigmoid(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
def sigmoid(x):
    """y = 1 / (1 + e⁻ˣ), computed without overflow for large |x|."""
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z))


@sigmoid.grad
def _(y, dy):
    return dy * y * (1 - y)


@op("relu(Tensor x) -> Tensor y", traits=["elementwise"])
def relu(x):
    """y = max(x, 0)."""
    return np.maximum(x, 0)


@relu.grad
def _(y, dy):
    return F.where(y > 0, dy, 0)


@op("abs(Tensor x) -> Tensor y", traits=["elementwise"])
def abs(x):
    """|x|."""
    return np.abs(x)


@abs.grad
def _(x, dy):
    return F.where(x > 0, dy, F.where(x < 0, -dy, 0))  # 0 at x = 0, as PyTorch


@op("cast(Tensor x, *, dtype dtype) -> Tensor y")
def cast(x, *, dtype):
    """Converts to ``dtype`` (a copy, even when the dtype is unchanged)."""
    return x.astype(dtype)


@cast.infer
def _(x, *, dtype):
    return Spec(x.shape, dtype)


@cast.grad
def _(dy, x_spec):
    return F.cast(dy, dtype=x_spec.dtype) if x_spec.dtype.kind == "f" else None


@cast.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), dtype="float32")
    yield Sample.of(rng.standard_normal(3), dtype="float64")
    yield Sample.of(rng.standard_normal(3), dtype="int64")


def _like_spec(x, *, dtype=None):
    return Spec(x.shape, dtype if dtype is not None else x.dtype)


@op("zeros_like(Tensor x, *, dtype dtype=None) -> Tensor y", traits=["no_grad"], infer=_like_spec)
def zeros_like(x, *, dtype):
    """Zeros of the shape (and, unless ``dtype`` is given, the dtype) of ``x``."""
    return np.zeros(x.shape, dtype or x.dtype)


@op("ones_like(Tensor x, *, dtype dtype=None) -> Tensor y", traits=["no_grad"], infer=_like_spec)
def ones_like(x, *, dtype):
    """Ones of the shape (and, unless ``dtype`` is given, the dtype) of ``x``."""
    return np.ones(x.shape, dtype or x.dtype)


@zeros_like.samples
@ones_like.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal(()), dtype="int32")
