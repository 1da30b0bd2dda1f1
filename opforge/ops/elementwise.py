"""Elementwise ops of one tensor, and the activations. Each gradient rule is written with ops, so it can be
differentiated again.

A gradient at a NaN input is NaN. Comparisons with NaN are all false, so a rule or a grad kernel that selects
by comparing (relu, clip, the hard activations) would give a finite value there: they say so explicitly, with
``_nan_at_nan`` in rules and ``_carry_nan`` in kernels.
"""

import builtins
import math

from opforge import ops as F

from ..core.errors import ArgumentError
from ._common import (
    D,
    P,
    Sample,
    ShapeError,
    Spec,
    _maximum,
    _minimum,
    _multiply,
    _subtract,
    broadcast_shapes,
    constant_row,
    min_over,
    normalize_axes,
    np,
    op,
    overflow_ignored,
)


def _carry_nan(x, dx):
    """``dx`` (a fresh array, changed in place) with NaN wherever ``x`` is NaN. The max over ``x`` tells cheaply
    whether it holds a NaN at all (max propagates NaN; it takes 2.5 µs over 64×512 float32, the sum 5.6)."""
    if type(x) is not np.ndarray:  # a device's array: no read to choose (each read stalls the device)
        if x.dtype.kind in "fc":
            np.copyto(dx, np.nan, where=np.isnan(x))
        return dx
    if x.dtype.kind in "fc" and x.size and np.isnan(np.maximum.reduce(x, axis=None)):
        if type(dx) is not np.ndarray:  # a NumPy scalar (ufuncs of 0-d arrays give one), which cannot be written
            dx = np.asarray(dx).copy()
        np.copyto(dx, np.nan, where=np.isnan(x))
    return dx


_TYPED: dict = {}  # number -> {dtype: the number as a read-only 0-d array of that dtype}; never 0 (nor NaN, which
# finds no entry anyway): -0.0 would find 0's entry, and leaky_relu(x, alpha=-0.0) give -0.0 at x < 0, not 0.0


def _typed(number, dtype):
    """``number`` as a read-only 0-d array of ``dtype`` (a NumPy float type): a kernel's Python scalar costs NumPy
    0.2 µs of promotion per call (half of leaky_relu's kernel on 16 elements), the 0-d array of the operand's dtype
    less, with the same values (NumPy casts the Python number to that dtype either way). Hot kernels read
    ``_TYPED[number][dtype]`` first and call this on a miss."""
    per_dtype = _TYPED.get(number)
    if per_dtype is None:
        per_dtype = {}
        if number and number == number:  # not 0 nor NaN (see _TYPED)
            if len(_TYPED) > 1024:  # attrs that change at every call must not grow it without bound
                _TYPED.clear()
            _TYPED[number] = per_dtype
    a = per_dtype.get(dtype)
    if a is None:
        if dtype.kind == "f":
            a = np.full((), number, dtype)
            a.flags.writeable = False
        else:  # bfloat16 and the like: the Python number, whose promotion NumPy leaves to the dtype's own rules
            a = number
        per_dtype[dtype] = a
    return a


def _nan_at_nan(x, g):
    """The gradient ``g``, NaN where ``x`` is NaN (for a rule that selects its value by comparing x)."""
    return F.where(F.isnan(x), x, g)


# -- the seed designs' examples --------------------------------------------------------------------------------


@op("identity(Tensor x) -> Tensor y", traits=["elementwise", "pointwise", "view"])
def identity(x):
    """Returns its input unchanged (a new tensor sharing the data)."""
    return x


identity.scalar("x")


def _linear_sbp(*inputs, **_):
    """A linear map of partial values is the partial values of the map."""
    yield tuple(P for _ in inputs), P
    yield tuple(P("mean") for _ in inputs), P("mean")


identity.sbp(_linear_sbp)
identity.onnx(lambda g, x: g.op("Identity", x))


@identity.grad
def _(dy):
    return F.identity(dy)


@op("scale(Tensor<floating> x, *, float scale) -> Tensor y", traits=["elementwise", "pointwise"])
def scale(x, *, scale):
    """Multiplies by a constant: y = scale · x."""
    return x * scale  # a Python float keeps the array's dtype (NumPy 2 promotion)


scale.scalar("x * scale")


scale.onnx(lambda g, x, *, scale: g.op("Mul", x, g.scalar(scale, x)))


@scale.grad
def _(dy, *, scale):
    return F.scale(dy, scale=scale)


scale.sbp(_linear_sbp)


@scale.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), scale=-1.5)
    yield Sample.of(rng.standard_normal(()), scale=2.0)


@op("square(Tensor x) -> Tensor y", traits=["elementwise", "pointwise"], inplace={"y": "x"})
def square(x, out=None):
    """y = x²."""
    return np.square(x, out=out)


square.scalar("x * x")


square.onnx(lambda g, x: g.op("Mul", x, x))


@square.grad
def _(x, dy):
    return dy * 2 * x  # a composition: no dedicated grad op needed


@op("sqrt(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def sqrt(x):
    """y = √x."""
    return np.sqrt(x)


sqrt.scalar("sqrt(x)")


sqrt.onnx(lambda g, x: g.op("Sqrt", x))


@sqrt.grad
def _(y, dy):
    return F.sqrt_grad(y, dy)  # needs only the output, as TensorFlow's SqrtGrad


@sqrt.samples
def _(rng):
    yield Sample.of(rng.uniform(0.5, 2.0, (2, 3)))
    yield Sample.of(rng.uniform(0.5, 2.0, ()))


@op("sqrt_grad(Tensor<floating> y, Tensor dy) -> Tensor dx", traits=["elementwise", "pointwise"])
def sqrt_grad(y, dy):
    """Gradient of sqrt from its output: dx = dy / (2·y)."""
    return dy * 0.5 / y


sqrt_grad.scalar("dy * 0.5 / y")


@sqrt_grad.grad
def _(y, dx, ddx):
    # dx = ½·dy/y, so ∂dx/∂y = −dx/y and ∂dx/∂dy = ½/y (TensorFlow's SqrtGradGrad).
    return -ddx * dx / y, ddx * 0.5 / y


@sqrt_grad.samples
def _(rng):
    yield Sample.of(rng.uniform(0.5, 2.0, (2, 3)), rng.standard_normal((2, 3)))


@op("leaky_relu(Tensor<floating> x, float alpha/negative_slope=0.01) -> Tensor y", traits=["elementwise", "pointwise"])
def leaky_relu(x, *, alpha):
    """y = x where x > 0, else alpha · x."""
    # max(x, αx) is x for x > 0 and αx for x < 0 whenever α ≤ 1 (min when α > 1): two ufuncs, no np.where,
    # which costs more than the arithmetic on small tensors.
    try:
        a = _TYPED[alpha][x.dtype]
    except KeyError:
        a = _typed(alpha, x.dtype)
    if type(x) is not np.ndarray:  # a device's array takes the number (see _zero)
        a = alpha
    scaled = _multiply(x, a)
    if alpha != alpha:  # NaN: x where x > 0, NaN elsewhere, as torch (max and min spread the NaN to every element)
        return np.where(x > 0, x, scaled)
    return _maximum(x, scaled) if alpha <= 1 else _minimum(x, scaled)


leaky_relu.scalar("maximum(x, x * alpha) if alpha <= 1 else minimum(x, x * alpha)")


@leaky_relu.onnx
def _(g, x, *, alpha):
    if x.dtype == D.float32:
        return g.op("LeakyRelu", x, alpha=alpha)
    if alpha != alpha:  # (as the kernel: not Max, which spreads the NaN)
        return g.op("Where", g.op("Greater", x, g.scalar(0.0, x)), x, g.op("Mul", x, g.scalar(alpha, x)))
    return g.op("Max" if alpha <= 1 else "Min", x, g.op("Mul", x, g.scalar(alpha, x)))  # α exact in float64


@leaky_relu.grad
def _(x, dy, *, alpha):
    return F.leaky_relu_grad(x, dy, alpha=alpha)  # names x and dy only: y is not kept for backward


@leaky_relu.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), alpha=0.2)
    yield Sample.of(rng.standard_normal(5))
    yield Sample.of(rng.standard_normal(()), alpha=1.5)


@op("leaky_relu_grad(Tensor<floating> x, Tensor<floating> dy, *, float alpha) -> Tensor dx",
    traits=["elementwise", "pointwise"])
def leaky_relu_grad(x, dy, *, alpha):
    """Gradient of leaky_relu: dx = dy where x > 0, else alpha · dy (NaN where x is NaN)."""
    return _carry_nan(x, np.where(x > 0, dy, dy * alpha))


leaky_relu_grad.scalar("x if isnan(x) else (dy if x > 0 else dy * alpha)")


@leaky_relu_grad.grad
def _(x, ddx, *, alpha):
    return {"x": None, "dy": F.leaky_relu_grad(x, ddx, alpha=alpha)}  # piecewise linear in x


@leaky_relu_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), alpha=0.2)


# -- the base set --------------------------------------------------------------------------------------------


@op("neg(Tensor x) -> Tensor y", traits=["elementwise", "pointwise"], inplace={"y": "x"})
def neg(x, out=None):
    """y = −x."""
    return np.negative(x, out=out)


neg.scalar("-x")


neg.sbp(_linear_sbp)
neg.onnx(lambda g, x: g.op("Neg", x))


@neg.grad
def _(dy):
    return F.neg(dy)


@op("exp(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"], inplace={"y": "x"})
def exp(x, out=None):
    """y = eˣ."""
    return np.exp(x, out=out)


exp.scalar("exp(x)")


exp.onnx(lambda g, x: g.op("Exp", x))


@exp.grad
def _(y, dy):
    return dy * y


@op("log(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def log(x):
    """Natural logarithm."""
    return np.log(x)


log.scalar("log(x)")


log.onnx(lambda g, x: g.op("Log", x))


@log.grad
def _(x, dy):
    return dy / x


@log.samples
def _(rng):
    yield Sample.of(rng.uniform(0.5, 3.0, (2, 3)))
    yield Sample.of(rng.uniform(0.5, 3.0, ()))


# 0 and 1 as _typed gives them, one dict read away in the hottest kernels (relu, tanh_grad). Only the float dtypes:
# bool keeps the Python 0 (its relu is int64, as NumPy's).
_ZERO = {np.dtype(t): _typed(0, np.dtype(t)) for t in (np.float16, np.float32, np.float64)}
_ONE = {dtype: _typed(1, dtype) for dtype in _ZERO}


def _one(x):
    """1 for a kernel on x: the cached 0-d array of x's dtype on the host; on a device the Python 1 (CuPy takes
    numbers and NumPy scalars, not host arrays; a Python number takes the array's dtype there as here). The
    hottest kernels inline it, and its 0 (``_ZERO``)."""
    return _ONE.get(x.dtype, 1) if type(x) is np.ndarray else 1


@op("tanh(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"], inplace={"y": "x"})
def tanh(x, out=None):
    """Hyperbolic tangent."""
    return np.tanh(x, out=out)


tanh.scalar("tanh(x)")


tanh.onnx(lambda g, x: g.op("Tanh", x))


@tanh.grad
def _(y, dy):
    return F.tanh_grad(y, dy)  # one kernel instead of three ops: the backward of a tanh chain is this op


@op("tanh_grad(Tensor<floating> y, Tensor<floating> dy) -> Tensor dx", traits=["elementwise", "pointwise"],
    inplace={"dx": "dy"})
def tanh_grad(y, dy, out=None):
    """Gradient of tanh from its output: dx = dy·(1 − y²)."""
    one = _ONE.get(y.dtype, 1) if type(y) is np.ndarray else 1  # _one(y): no Python-scalar promotion
    if out is None and y.size <= 4096:  # small: fresh arrays cost less than the checks for reusing one (0.6 µs
        return _multiply(dy, _subtract(one, _multiply(y, y)))  # against 1.0 on 16 elements)
    t = _multiply(y, y)
    if type(t) is np.ndarray:  # 1 − y², then dx, in y²'s buffer
        _subtract(one, t, out=t)
        mine = out is None and t.shape == dy.shape and t.dtype == dy.dtype  # dx may take y²'s buffer too
        return _multiply(dy, t, out=t if mine else out)
    return _multiply(dy, 1 - t, out=out)  # 0-d: NumPy made a scalar


tanh_grad.scalar("dy * (1 - y * y)")


@tanh_grad.grad
def _(y, dy, ddx):
    return -2 * ddx * dy * y, F.tanh_grad(y, ddx)


@tanh_grad.samples
def _(rng):
    yield Sample.of(rng.uniform(-0.9, 0.9, (2, 3)), rng.standard_normal((2, 3)))
    yield Sample.of(np.array(0.3), np.array(-1.2))


def _sigmoid(x):
    """1 / (1 + e⁻ˣ) as PyTorch computes it: for x below about −88 (float32) e⁻ˣ overflows to inf, which is expected
    (the result is then 0, torch's value too). A select between two stable forms (np.where over the sign of x)
    gave the same values to 1 ulp above the subnormals at 12 times the cost (14.5 against 1.2 ms for 1M float32)."""
    with overflow_ignored():
        t = np.exp(-x)
    t += 1
    return np.reciprocal(t, out=t) if type(t) is np.ndarray else np.reciprocal(t)


@op("sigmoid(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def sigmoid(x):
    """y = 1 / (1 + e⁻ˣ) (PyTorch's values, at the tails too)."""
    return _sigmoid(x)


sigmoid.scalar("1 / (1 + exp(-x))")


sigmoid.onnx(lambda g, x: g.op("Sigmoid", x))


@sigmoid.grad
def _(y, dy):
    return F.sigmoid_grad(y, dy)


@op("sigmoid_grad(Tensor<floating> y, Tensor<floating> dy) -> Tensor dx", traits=["elementwise", "pointwise"])
def sigmoid_grad(y, dy):
    """Gradient of sigmoid from its output: dx = dy·y·(1 − y)."""
    return dy * y * np.subtract(_one(y), y)


sigmoid_grad.scalar("dy * y * (1 - y)")


@sigmoid_grad.grad
def _(y, dy, ddx):
    return ddx * dy * (1 - 2 * y), F.sigmoid_grad(y, ddx)


@sigmoid_grad.samples
def _(rng):
    yield Sample.of(rng.uniform(0.1, 0.9, (2, 3)), rng.standard_normal((2, 3)))
    yield Sample.of(np.array(0.3), np.array(-1.2))


_ROW = 16384  # over NumPy's ufunc buffer (8192 elements): rows that fit in it twice would be copied through it


@op("relu(Tensor x) -> Tensor y", traits=["elementwise", "pointwise"], inplace={"y": "x"})
def relu(x, out=None):
    """y = max(x, 0)."""
    n = x.size
    if n >= 4096 and type(x) is np.ndarray and x.dtype.kind == "f" and x.flags.c_contiguous and (
            out is None or out.flags.c_contiguous):
        # NumPy's maximum takes its vector loop only when no operand is a broadcast scalar: against rows of zeros
        # it is 3.5x faster on 64×512 float32 here (2.8 against 10 µs; the same comparison, element by element).
        zeros = constant_row(0, _ROW, x.dtype)
        y = np.empty_like(x) if out is None else out
        flat_x, flat_y, body = x.reshape(-1), y.reshape(-1), n - n % _ROW
        if body:
            np.maximum(flat_x[:body].reshape(-1, _ROW), zeros, out=flat_y[:body].reshape(-1, _ROW))
        np.maximum(flat_x[body:], zeros[:n - body], out=flat_y[body:])
        return y
    return np.maximum(x, _ZERO.get(x.dtype, 0) if type(x) is np.ndarray else 0, out=out)  # (see _one)


relu.scalar("maximum(x, 0)")


relu.onnx(lambda g, x: g.op("Relu", x))


@relu.grad
def _(y, dy):
    return F.relu_grad(y, dy)


@op("relu_grad(Tensor y, Tensor dy) -> Tensor dx", traits=["elementwise", "pointwise"], inplace={"dx": "dy"})
def relu_grad(y, dy, out=None):
    """Gradient of relu from its output: dx = dy where y > 0, else 0 (NaN where y is NaN).

    A dedicated op for speed: ``np.where`` on a random mask is branchy and several times slower than a
    multiply by the mask, which is the backward of every ReLU network. (A NaN in ``dy`` where y ≤ 0 stays NaN.)
    """
    return _carry_nan(y, np.multiply(dy, np.greater(y, _ZERO.get(y.dtype, 0) if type(y) is np.ndarray else 0),
                                     out=out))  # (see _one)


relu_grad.scalar("y if isnan(y) else dy * (y > 0)")


@relu_grad.grad
def _(y, ddx):
    return {"y": None, "dy": F.relu_grad(y, ddx)}  # piecewise constant in y


@relu_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))
    yield Sample.of(np.array(0.5), np.array(-1.5))


@op("abs(Tensor x) -> Tensor y", traits=["elementwise", "pointwise"])
def abs(x):
    """|x|."""
    return np.abs(x)


abs.scalar("abs(x)")


abs.onnx(lambda g, x: g.op("Abs", x))


@abs.grad
def _(x, dy):
    return _nan_at_nan(x, F.where(x > 0, dy, F.where(x < 0, -dy, 0)))  # 0 at x = 0, as PyTorch


@op("cast(Tensor x, *, dtype dtype) -> Tensor y", traits=["pointwise"])
def cast(x, *, dtype):
    """Converts to ``dtype`` (a copy, even when the dtype is unchanged)."""
    return x.astype(dtype)




@cast.onnx
def _(g, x, *, dtype):
    return g.op("Identity", x) if x.dtype == dtype else g.cast(x, dtype)


@cast.infer
def _(x, *, dtype):
    return Spec(x.shape, dtype)


@cast.grad
def _(dy, x_spec):
    return F.cast(dy, dtype=x_spec.dtype) if D.is_floating(x_spec.dtype) else None


@cast.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), dtype="float32")
    yield Sample.of(rng.standard_normal(3), dtype="float64")
    yield Sample.of(rng.standard_normal(3), dtype="int64")


def _like_spec(x, *, dtype=None):
    return Spec(x.shape, dtype if dtype is not None else x.dtype)


@op("zeros_like(Tensor x, *, dtype dtype=None) -> Tensor y", traits=["no_grad", "shape_only"], infer=_like_spec)
def zeros_like(x, *, dtype, xp=np):
    """Zeros of the shape (and, unless ``dtype`` is given, the dtype) of ``x``."""
    return xp.zeros(x.shape, dtype or x.dtype)


zeros_like.onnx(lambda g, x, *, dtype: g.filled(g.op("Shape", x), 0, dtype or x.dtype))


@op("ones_like(Tensor x, *, dtype dtype=None) -> Tensor y", traits=["no_grad", "shape_only"], infer=_like_spec)
def ones_like(x, *, dtype, xp=np):
    """Ones of the shape (and, unless ``dtype`` is given, the dtype) of ``x``."""
    return xp.ones(x.shape, dtype or x.dtype)


ones_like.onnx(lambda g, x, *, dtype: g.filled(g.op("Shape", x), 1, dtype or x.dtype))


@zeros_like.samples
@ones_like.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal(()), dtype="int32")


# -- more elementwise maths ------------------------------------------------------------------------------------


def _zero_grad(dy):
    """The gradient of a piecewise-constant op: 0 wherever it exists, and 0 at the jumps too (as PyTorch)."""
    return F.zeros_like(dy)


def _away_from_integers(rng, shape):
    """Values whose distance to the nearest multiple of ½ is at least 0.1: floor, ceil and round are flat there."""
    x = np.floor(rng.uniform(-6, 6, shape)) * 0.5 + rng.uniform(0.1, 0.4, shape) * rng.choice([-1, 1], shape)
    return np.asarray(x)


def _number_samples(rng):
    yield Sample.of(_away_from_integers(rng, (2, 3)))
    yield Sample.of(_away_from_integers(rng, ()))
    yield Sample.of(rng.integers(-5, 5, (4,)))


@op("sign(Tensor<number> x) -> Tensor y", traits=["elementwise", "pointwise"])
def sign(x):
    """−1, 0 or 1 as x is negative, zero or positive (0 for NaN, as PyTorch)."""
    return np.greater(x, 0).astype(x.dtype) - np.less(x, 0).astype(x.dtype)


sign.scalar("(x > 0) - (x < 0)")


sign.onnx(lambda g, x: g.op("Sign", x))


@op("floor(Tensor<number> x) -> Tensor y", traits=["elementwise", "pointwise"])
def floor(x):
    """The largest integer ≤ x (integer tensors are returned unchanged)."""
    return np.floor(x) if D.is_floating(x.dtype) else x.copy()


floor.scalar("floor(x)")


floor.onnx(lambda g, x: g.op("Floor" if x.dtype.kind == "f" else "Identity", x))


@op("ceil(Tensor<number> x) -> Tensor y", traits=["elementwise", "pointwise"])
def ceil(x):
    """The smallest integer ≥ x (integer tensors are returned unchanged)."""
    return np.ceil(x) if D.is_floating(x.dtype) else x.copy()


ceil.scalar("ceil(x)")


ceil.onnx(lambda g, x: g.op("Ceil" if D.is_floating(x.dtype) else "Identity", x))


@op("round(Tensor<number> x, *, int decimals=0) -> Tensor y", traits=["elementwise", "pointwise"])
def round(x, *, decimals):
    """The nearest integer, halves to the even one (round(2.5) = 2), as PyTorch; with ``decimals`` the nearest
    multiple of 10^−decimals, computed as PyTorch does: rint(x·10^d)/10^d, or rint(x/10^−d)·10^−d for d < 0
    (so 10^|d| is exact). Integer tensors: unchanged, or rounded to tens, hundreds, ... for decimals < 0 (PyTorch
    refuses integers with decimals)."""
    if not D.is_floating(x.dtype):
        if decimals >= 0:
            return x.copy()
        scale = 10 ** builtins.min(-decimals, 20)  # past 10^20 every int64 rounds to 0 (and 10^(2^62) never ends)
        return (np.rint(x / scale) * scale).astype(x.dtype)
    if decimals == 0:
        return np.round(x)
    with np.errstate(over="ignore", invalid="ignore"):  # 10^|d| beyond the dtype: inf, and NaN, as PyTorch
        scale = np.power(x.dtype.type(10.0), builtins.abs(decimals))
        return np.rint(x * scale) / scale if decimals > 0 else np.rint(x / scale) * scale




@round.onnx
def _(g, x, *, decimals):
    if not D.is_floating(x.dtype):
        if decimals >= 0:
            return g.op("Identity", x)
        wide = g.cast(x, D.float64)  # to tens, hundreds, ... in float64 (exact for these integers), then back
        scale = g.scalar(10.0 ** -decimals, wide)
        return g.cast(g.op("Mul", g.op("Round", g.op("Div", wide, scale)), scale), x.dtype)
    if decimals == 0:
        return g.op("Round", x)  # ONNX rounds halves to even too
    scale = g.scalar(10.0 ** builtins.abs(decimals), x)
    if decimals > 0:
        return g.op("Div", g.op("Round", g.op("Mul", x, scale)), scale)
    return g.op("Mul", g.op("Round", g.op("Div", x, scale)), scale)


for _step in (sign, floor, ceil, round):
    _step.grad(_zero_grad)
    _step.samples(_number_samples)


@round.samples
def _(rng):
    yield from _number_samples(rng)
    yield Sample.of(_away_from_integers(rng, (2, 3)) / 100, decimals=2)
    yield Sample.of(_away_from_integers(rng, (4,)) * 100, decimals=-2)
    yield Sample.of(rng.integers(-500, 500, (4,)), decimals=-2)


@op("expm1(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def expm1(x):
    """y = eˣ − 1, exact for small x."""
    return np.expm1(x)


expm1.scalar("expm1(x)")


@expm1.onnx
def _(g, x):
    # eˣ − 1 loses every digit for small x; there eˣ − 1 = 2t/(1 − t), t = tanh(x/2), is exact (and |t| < ¼).
    t = g.op("Tanh", g.op("Mul", x, g.scalar(0.5, x)))
    small = g.op("Div", g.op("Add", t, t), g.op("Sub", g.scalar(1, x), t))
    near_zero = g.op("Less", g.op("Abs", x), g.scalar(0.5, x), spec=Spec(x.shape, D.bool_))
    return g.op("Where", near_zero, small, g.op("Sub", g.op("Exp", x), g.scalar(1, x)))


@expm1.grad
def _(y, dy):
    return dy * (y + 1)  # d/dx (eˣ − 1) = eˣ = y + 1


@op("log1p(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def log1p(x):
    """y = ln(1 + x), exact for small x."""
    return np.log1p(x)


log1p.scalar("log1p(x)")


@log1p.onnx
def _(g, x):
    # ln(1 + x) loses the digits of x that 1 + x rounds away; u = 1 + x, ln(u)·x/(u − 1) restores them (Goldberg).
    u = g.op("Add", x, g.scalar(1, x))
    du = g.op("Sub", u, g.scalar(1, x))
    exact = g.op("Div", g.op("Mul", g.op("Log", u), x), du)
    return g.op("Where", g.op("Equal", du, g.scalar(0, x), spec=Spec(x.shape, D.bool_)), x, exact)


@log1p.grad
def _(x, dy):
    return dy / (x + 1)


@log1p.samples
def _(rng):
    yield Sample.of(rng.uniform(-0.5, 2.0, (2, 3)))
    yield Sample.of(rng.uniform(-0.5, 2.0, ()))


@op("rsqrt(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def rsqrt(x):
    """y = 1/√x."""
    return 1 / np.sqrt(x)


rsqrt.scalar("1 / sqrt(x)")


rsqrt.onnx(lambda g, x: g.op("Reciprocal", g.op("Sqrt", x)))


@rsqrt.grad
def _(y, dy):
    return dy * (-0.5) * y * y * y  # d/dx x^(−½) = −½·x^(−3/2) = −½·y³


@op("reciprocal(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def reciprocal(x):
    """y = 1/x."""
    return np.reciprocal(x)


reciprocal.scalar("1 / x")


reciprocal.onnx(lambda g, x: g.op("Reciprocal", x))


@reciprocal.grad
def _(y, dy):
    return -dy * y * y  # d/dx x⁻¹ = −x⁻² = −y²


def _positive_samples(rng):
    yield Sample.of(rng.uniform(0.5, 3.0, (2, 3)))
    yield Sample.of(rng.uniform(0.5, 3.0, ()))


rsqrt.samples(_positive_samples)


@reciprocal.samples
def _(rng):
    yield Sample.of(rng.uniform(0.5, 3.0, (2, 3)) * rng.choice([-1, 1], (2, 3)))
    yield Sample.of(rng.uniform(0.5, 3.0, ()))


@op("sin(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def sin(x):
    """Sine."""
    return np.sin(x)


sin.scalar("sin(x)")


sin.onnx(lambda g, x: g.op("Sin", x))


@sin.grad
def _(x, dy):
    return dy * F.cos(x)


@op("cos(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def cos(x):
    """Cosine."""
    return np.cos(x)


cos.scalar("cos(x)")


cos.onnx(lambda g, x: g.op("Cos", x))


@cos.grad
def _(x, dy):
    return -dy * F.sin(x)


def _erf(x):
    from scipy.special import erf  # imported on first use: SciPy takes a noticeable time to import

    return erf(x)


@op("erf(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def erf(x):
    """The error function, erf(x) = 2/√π ∫₀ˣ e^(−t²) dt."""
    return _erf(x)


erf.scalar("erf(x)")


erf.onnx(lambda g, x: g.op("Erf", x))


@erf.grad
def _(x, dy):
    return dy * (2 / math.sqrt(math.pi)) * F.exp(-F.square(x))  # a Python float keeps float32 float32


# -- activations ----------------------------------------------------------------------------------------------------


@op("softplus(Tensor<floating> x, float beta=1.0, float threshold=20.0) -> Tensor y",
    traits=["elementwise", "pointwise"])
def softplus(x, *, beta, threshold):
    """y = ln(1 + e^(βx))/β, and y = x where βx > threshold (as PyTorch, where the two agree to float precision)."""
    z = x * beta
    return np.where(z > threshold, x, np.logaddexp(0, z) / beta)  # logaddexp: no overflow, exact for z ≪ 0




@softplus.onnx
def _(g, x, *, beta, threshold):
    z = g.op("Mul", x, g.scalar(beta, x))
    # ln(1 + eᶻ) = max(z, 0) + ln(1 + e^−|z|): no overflow, and exact for z ≪ 0 (ONNX's Softplus is neither)
    soft = g.op("Add", g.op("Relu", z), g.call("log1p", g.op("Exp", g.op("Neg", g.op("Abs", z)))))
    soft = g.op("Div", soft, g.scalar(beta, x))
    return g.op("Where", g.op("Greater", z, g.scalar(threshold, x), spec=Spec(x.shape, D.bool_)), x, soft)


@softplus.check
def _(*, beta, threshold):
    if beta == 0:
        raise ValueError("argument 'beta' must not be 0")


@softplus.grad
def _(x, dy, *, beta, threshold):
    # d/dx ln(1 + e^(βx))/β = σ(βx), and 1 where βx > threshold. At βx = threshold PyTorch takes σ(βx) for the
    # first derivative and 0 for the second: σ of βx taken only where βx < threshold does both (and of a NaN z).
    z = x * beta
    return F.where(z > threshold, dy, dy * F.sigmoid(F.where(z >= threshold, threshold, z)))


@softplus.samples
def _(rng):
    yield Sample.of(rng.uniform(-4, 4, (2, 3)))
    yield Sample.of(rng.uniform(-4, 4, 5), beta=2.0, threshold=5.0)  # some βx above the threshold
    yield Sample.of(rng.uniform(-4, 4, ()), beta=0.5)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _elu(x, alpha, scale, beta=1.0):
    # scale·x for x > 0, scale·α·(e^(βx) − 1) otherwise; expm1 of min(x, 0) cannot overflow.
    low = np.minimum(x, 0)
    return np.where(x > 0, x * scale, np.expm1(low if beta == 1 else low * beta) * (alpha * scale))


def _elu_grad(x, dy, alpha, scale, beta=1.0):
    # scale for x > 0, scale·α·β·e^(βx) for x ≤ 0. At 0 PyTorch takes the second for the first derivative but gives
    # 0 as the second derivative; the exponent min(x, 0), taken from x only where x < 0, does both. It also keeps
    # e^(βx) finite where x > 0: an infinite one would turn the 0 that branch gets in double backward into NaN
    # (0·∞). A NaN x falls through both comparisons to the exponent, and so to the gradient.
    exponent = F.where(x >= 0, 0, x if beta == 1 else x * beta)
    return F.where(x > 0, dy if scale == 1 else dy * scale, dy * (alpha * scale * beta) * F.exp(exponent))


@op("elu(Tensor<floating> x, float alpha=1.0) -> Tensor y", traits=["elementwise", "pointwise"])
def elu(x, *, alpha):
    """y = x for x > 0, α·(eˣ − 1) otherwise."""
    return _elu(x, alpha, 1.0)




@elu.onnx
def _(g, x, *, alpha):
    if x.dtype == D.float32:
        return g.op("Elu", x, alpha=alpha)
    return _elu_onnx(g, x, alpha, 1.0)  # α exact in float64, where an attribute would round it to float32


def _elu_onnx(g, x, alpha, scale):
    negative = g.op("Mul", g.call("expm1", g.op("Min", x, g.scalar(0, x))), g.scalar(alpha * scale, x))
    positive = g.op("Mul", x, g.scalar(scale, x)) if scale != 1 else x
    return g.op("Where", g.op("Greater", x, g.scalar(0, x), spec=Spec(x.shape, D.bool_)), positive, negative)


@elu.grad
def _(x, dy, *, alpha):
    return _elu_grad(x, dy, alpha, 1.0)


@elu.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal(5), alpha=0.5)
    yield Sample.of(rng.standard_normal(()), alpha=2.0)


@op("selu(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def selu(x):
    """y = λ·elu(x, α) with PyTorch's constants λ ≈ 1.0507, α ≈ 1.6733 (self-normalising)."""
    return _elu(x, _SELU_ALPHA, _SELU_SCALE)




@selu.onnx
def _(g, x):
    if x.dtype == D.float32:
        return g.op("Selu", x, alpha=_SELU_ALPHA, gamma=_SELU_SCALE)
    return _elu_onnx(g, x, _SELU_ALPHA, _SELU_SCALE)


@selu.grad
def _(x, dy):
    return _elu_grad(x, dy, _SELU_ALPHA, _SELU_SCALE)


# GELU: x·Φ(x), Φ the standard normal CDF; "tanh" approximates it as ½x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715x³).
_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_TANH_K = math.sqrt(2 / math.pi)
_TANH_C = 0.044715


def _check_approximate(*, approximate):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"argument 'approximate' must be \"none\" or \"tanh\", got {approximate!r}")


@op('gelu(Tensor<floating> x, *, str approximate="none") -> Tensor y', traits=["elementwise", "pointwise"])
def gelu(x, *, approximate):
    """y = x·Φ(x) with Φ the standard normal CDF; approximate="tanh": ½x·(1 + tanh(√(2/π)·(x + 0.044715x³)))."""
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(_TANH_K * (x + _TANH_C * x * x * x)))
    return 0.5 * x * (1 + _erf(x * _SQRT_HALF))




@gelu.onnx
def _(g, x, *, approximate):
    if g.opset >= 20 and x.dtype == D.float32:
        return g.op("Gelu", x, approximate=approximate)
    if approximate == "tanh":
        u = g.op("Add", x, g.op("Mul", g.op("Mul", g.op("Mul", x, x), x), g.scalar(_TANH_C, x)))
        phi = g.op("Tanh", g.op("Mul", u, g.scalar(_TANH_K, x)))
    else:
        phi = g.op("Erf", g.op("Mul", x, g.scalar(_SQRT_HALF, x)))
    return g.op("Mul", g.op("Mul", x, g.scalar(0.5, x)), g.op("Add", phi, g.scalar(1, x)))


@gelu.grad
def _(x, dy, *, approximate):
    return F.gelu_grad(x, dy, approximate=approximate)  # one kernel instead of a dozen ops (erf, exp, ...)


@op('gelu_grad(Tensor<floating> x, Tensor<floating> dy, *, str approximate="none") -> Tensor dx',
    traits=["broadcast", "pointwise"])
def gelu_grad(x, dy, *, approximate):
    """Gradient of gelu: dx = dy·gelu′(x); gelu′ = Φ + x·φ exactly, φ the standard normal density."""
    if approximate == "tanh":
        t = np.tanh(_TANH_K * (x + _TANH_C * x * x * x))
        du = _TANH_K * (1 + 3 * _TANH_C * x * x)  # u′
        return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)
    return dy * (0.5 * (1 + _erf(x * _SQRT_HALF)) + x * _INV_SQRT_2PI * np.exp(-0.5 * x * x))




@gelu_grad.grad
def _(x, dy, ddx, *, approximate):
    # dx is linear in dy; in x, its derivative is dy·gelu″(x):
    #   exact:  gelu″ = φ·(2 − x²)
    #   "tanh": gelu″ = (1 − t²)·(u′ − x·t·u′² + ½x·u″), t = tanh(u), u′ = k(1 + 3cx²), u″ = 6kcx
    if approximate == "tanh":
        t = F.tanh((x + x * x * x * _TANH_C) * _TANH_K)
        du = (x * x * (3 * _TANH_C) + 1) * _TANH_K
        second = (1 - t * t) * (du - x * t * du * du + x * x * (3 * _TANH_K * _TANH_C))
    else:
        second = F.exp(x * x * -0.5) * _INV_SQRT_2PI * (2 - x * x)
    return ddx * dy * second, F.gelu_grad(x, ddx, approximate=approximate)


gelu.check(_check_approximate)
gelu_grad.check(_check_approximate)


@gelu.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)) * 2)
    yield Sample.of(rng.standard_normal(5) * 2, approximate="tanh")
    yield Sample.of(rng.standard_normal(()), approximate="tanh")


@gelu_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)) * 2, rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal(5) * 2, rng.standard_normal(5), approximate="tanh")


@op("silu(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def silu(x):
    """y = x·σ(x), σ the logistic sigmoid (also called swish)."""
    return x * _sigmoid(x)


silu.scalar("x * (1 / (1 + exp(-x)))")


silu.onnx(lambda g, x: g.op("Mul", x, g.op("Sigmoid", x)))


@silu.grad
def _(x, dy):
    s = F.sigmoid(x)
    return dy * s * (1 + x * (1 - s))  # d/dx x·σ(x) = σ + x·σ·(1 − σ)


# -- clip -----------------------------------------------------------------------------------------------------------


def _clip_spec(x, min, max):
    if min is None and max is None:
        raise ArgumentError("clip(): arguments 'min' and 'max' are both None: give at least one bound")
    bounds = [b for b in (min, max) if b is not None]
    return Spec(broadcast_shapes(x.shape, *(b.shape for b in bounds), op="clip"), D.result_type(x, *bounds))


@op("clip(Tensor<number> x, Tensor<number>? min=None, Tensor<number>? max=None) -> Tensor y",
    infer=_clip_spec, traits=["pointwise"])
def clip(x, min, max):
    """x limited to [min, max], as ``torch.clamp``: either bound may be None, and each is a number or a tensor that
    broadcasts with ``x`` (min > max gives max). The dtype is torch's result type too: a number, or a 0-d tensor,
    changes it only where it is of a higher kind (an integer tensor clipped at 2.5 becomes float32, at 2 stays
    integer).

    NaN, as torch: a NaN bound makes y NaN there; x gets no gradient there (y does not depend on it), nor does the
    bound (torch's rule: min gets the gradient where x < min, max where x > max, each comparison false with NaN).
    A NaN in x itself gives x a NaN gradient there, where torch gives 0: every elementwise op of opforge carries
    a NaN input into its gradient (see ``opforge/ops/elementwise.py``), and clip does not make an exception."""
    dtype = _clip_spec(x, min, max).dtype
    x, min, max = (None if a is None else a.astype(dtype, copy=False) for a in (x, min, max))
    y = x if min is None else np.maximum(x, min)
    return y if max is None else np.minimum(y, max)  # (a NumPy scalar for a 0-d x: dispatch makes it an array)




@clip.onnx
def _(g, x, min, max):
    # Max then Min, not Clip: the bounds may be tensors that broadcast (Clip takes scalars); min > max gives max.
    dtype = g.outputs[0].dtype
    y = g.cast(x, dtype)
    if min is not None:
        y = g.op("Max", y, g.cast(min, dtype))
    if max is not None:
        y = g.op("Min", y, g.cast(max, dtype))
    return y


@clip.grad
def _(x, min, max, dy, needs_input_grad):
    # torch.clamp's rule: x gets the gradient where min ≤ x ≤ max (bounds included), min where x < min, max where
    # x > max; with min > max (y = max everywhere) min gets none and max gets it all. Written as those comparisons
    # (not as "not x ≥ min"), so that a NaN bound gets none, as in torch.
    above_min = None if min is None else x >= min
    below_max = None if max is None else x <= max
    inside = F.logical_and(above_min, below_max) if min is not None and max is not None else \
        (above_min if max is None else below_max)
    dx = _nan_at_nan(x, F.where(inside, dy, 0)) if needs_input_grad[0] else None
    dmin = dmax = None
    if min is not None and needs_input_grad[1]:
        dmin = F.where(x < min if max is None else F.logical_and(x < min, min < max), dy, 0)
    if max is not None and needs_input_grad[2]:
        dmax = F.where(x > max if min is None else F.logical_or(x > max, max < min), dy, 0)
    return dx, dmin, dmax


@clip.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), min=np.array(-0.5), max=np.array(0.5))
    yield Sample.of(rng.standard_normal(6), min=np.array(0.1))
    yield Sample.of(rng.standard_normal(()), max=np.array(-0.2))
    yield Sample.of(rng.integers(-5, 5, (4,)), min=np.array(-2), max=np.array(2.5))  # promotes to floating
    yield Sample.of(rng.integers(-5, 5, (4,)), min=np.array(-2, np.int32), max=np.array(3))  # stays int64
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal(4) - 0.5, rng.standard_normal((3, 1)) + 0.5)
    yield Sample.of(rng.standard_normal(5), max=rng.standard_normal((2, 5)))  # a bound that broadcasts x
    yield Sample.of(rng.standard_normal(4), np.array([0.5, 0.5, -2.0, -2.0]), np.array([-0.5, 2.0, 2.0, -2.5]))


# -- tests of values: bool results, no gradient ---------------------------------------------------------------------


def _bool_spec(x):
    return Spec(x.shape, D.bool_)


@op("isnan(Tensor x) -> Tensor<bool> y", traits=["no_grad", "pointwise"], infer=_bool_spec)
def isnan(x):
    """True where x is NaN."""
    return np.isnan(x)


isnan.scalar("isnan(x)")


@isnan.onnx
def _(g, x):
    if x.dtype.kind != "f":
        return g.filled(g.op("Shape", x), False, D.bool_)
    return g.op("IsNaN", x, spec=Spec(x.shape, D.bool_))


@op("isfinite(Tensor x) -> Tensor<bool> y", traits=["no_grad", "pointwise"], infer=_bool_spec)
def isfinite(x):
    """True where x is neither infinite nor NaN (always, for integers and bools)."""
    return np.isfinite(x)




@isfinite.onnx
def _(g, x):
    if x.dtype.kind != "f":
        return g.filled(g.op("Shape", x), True, D.bool_)
    return g.op("Not", g.op("Or", g.op("IsNaN", x), g.op("IsInf", x)))


@op("logical_not(Tensor x) -> Tensor<bool> y", traits=["no_grad", "pointwise"], infer=_bool_spec)
def logical_not(x):
    """True where x is 0 (or False)."""
    return np.logical_not(x)


logical_not.scalar("not x")


logical_not.onnx(lambda g, x: g.op("Not", g.cast(x, D.bool_)))


def _special_value_samples(rng):
    yield Sample.of(np.array([[0.0, -1.5, np.nan], [np.inf, -np.inf, 2.0]]))
    yield Sample.of(np.array(np.nan))
    yield Sample.of(rng.integers(-2, 2, (4,)))
    yield Sample.of(rng.standard_normal(3) > 0)


for _test in (isnan, isfinite, logical_not):
    _test.samples(_special_value_samples)


# -- more activations (torch.nn.functional's) -----------------------------------------------------------------------
# The piecewise ones follow PyTorch at their kinks: hardtanh (and relu6, hardsigmoid) pass no gradient at the bounds;
# hardswish's derivative is x/3 + ½ on the open interval (−3, 3), 0 below and 1 above.


def _away_from(points, rng, shape, low=-5.0, high=5.0):
    """Uniform values at least 0.1 from every kink in ``points``: numeric derivatives are exact there."""
    x = np.asarray(rng.uniform(low, high, shape))
    for p in points:
        x = np.where(np.abs(x - p) < 0.1, p + 0.1 * np.sign(x - p + 1e-12) + 0.05, x)
    return x


def _check_bounds(*, min_val, max_val):
    if not min_val <= max_val:
        raise ValueError(f"argument 'min_val' must not exceed 'max_val', got {min_val} > {max_val}")


@op("hardtanh(Tensor<floating> x, float min_val=-1.0, float max_val=1.0) -> Tensor y",
    traits=["elementwise", "pointwise"])
def hardtanh(x, *, min_val, max_val):
    """x limited to [min_val, max_val]; the gradient is 0 at the bounds (as PyTorch), unlike clip's."""
    return np.clip(x, min_val, max_val)


hardtanh.scalar("minimum(maximum(x, min_val), max_val)")


hardtanh.onnx(lambda g, x, *, min_val, max_val: g.op("Clip", x, g.scalar(min_val, x), g.scalar(max_val, x)))


@hardtanh.grad
def _(x, dy, *, min_val, max_val):
    return F.hardtanh_grad(x, dy, min_val=min_val, max_val=max_val)


@op("hardtanh_grad(Tensor<floating> x, Tensor<floating> dy, *, float min_val=-1.0, float max_val=1.0) -> Tensor dx",
    traits=["elementwise", "pointwise"])
def hardtanh_grad(x, dy, *, min_val, max_val):
    """Gradient of hardtanh: dx = dy where min_val < x < max_val (bounds excluded), else 0; NaN where x is NaN."""
    return _carry_nan(x, np.where((x > min_val) & (x < max_val), dy, 0).astype(dy.dtype, copy=False))


hardtanh_grad.scalar("x if isnan(x) else (dy if x > min_val and x < max_val else 0)")


@hardtanh_grad.grad
def _(x, ddx, *, min_val, max_val):
    return {"x": None, "dy": F.hardtanh_grad(x, ddx, min_val=min_val, max_val=max_val)}  # piecewise constant in x


hardtanh.check(_check_bounds)
hardtanh_grad.check(_check_bounds)


@hardtanh.samples
def _(rng):
    yield Sample.of(_away_from([-1, 1], rng, (3, 4), -2, 2))
    yield Sample.of(_away_from([-0.5, 2], rng, 6, -3, 3), min_val=-0.5, max_val=2.0)
    yield Sample.of(_away_from([-1, 1], rng, (), -2, 2))


@hardtanh_grad.samples
def _(rng):
    yield Sample.of(_away_from([-1, 1], rng, (3, 4), -2, 2), rng.standard_normal((3, 4)))
    yield Sample.of(_away_from([0, 6], rng, 5, -2, 8), rng.standard_normal(5), min_val=0.0, max_val=6.0)


@op("relu6(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def relu6(x):
    """y = min(max(x, 0), 6): hardtanh on [0, 6], with its zero gradient at 0 and 6."""
    return np.clip(x, 0, 6)


relu6.scalar("minimum(maximum(x, 0), 6)")


relu6.onnx(lambda g, x: g.op("Clip", x, g.scalar(0, x), g.scalar(6, x)))


@relu6.grad
def _(x, dy):
    return F.hardtanh_grad(x, dy, min_val=0.0, max_val=6.0)


@relu6.samples
def _(rng):
    yield Sample.of(_away_from([0, 6], rng, (3, 4), -3, 9))
    yield Sample.of(_away_from([0, 6], rng, (), -3, 9))


@op("hardsigmoid(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def hardsigmoid(x):
    """y = min(max(x/6 + ½, 0), 1): 0 below −3, 1 above 3, linear between (gradient 0 at ±3, as PyTorch)."""
    return np.clip(x * (1 / 6) + 0.5, 0, 1)


hardsigmoid.scalar("minimum(maximum(x * 0.16666666666666666 + 0.5, 0), 1)")


@hardsigmoid.onnx
def _(g, x):
    if x.dtype == D.float32:
        return g.op("HardSigmoid", x, alpha=1 / 6, beta=0.5)
    return g.op("Clip", g.op("Add", g.op("Mul", x, g.scalar(1 / 6, x)), g.scalar(0.5, x)), g.scalar(0, x),
                g.scalar(1, x))


@hardsigmoid.grad
def _(x, dy):
    return F.hardtanh_grad(x, dy * (1 / 6), min_val=-3.0, max_val=3.0)


@op("hardswish(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def hardswish(x):
    """y = x·hardsigmoid(x) = x·min(max(x + 3, 0), 6)/6."""
    return x * np.clip(x * (1 / 6) + 0.5, 0, 1)


hardswish.scalar("x * minimum(maximum(x * 0.16666666666666666 + 0.5, 0), 1)")


@hardswish.onnx
def _(g, x):
    if x.dtype == D.float32:
        return g.op("HardSwish", x)
    return g.op("Mul", x, g.call("hardsigmoid", x))


@hardswish.grad
def _(x, dy):
    return F.hardswish_grad(x, dy)


@op("hardswish_grad(Tensor<floating> x, Tensor<floating> dy) -> Tensor dx", traits=["elementwise", "pointwise"])
def hardswish_grad(x, dy):
    """Gradient of hardswish: dx = dy·(x/3 + ½) for −3 < x < 3, 0 for x ≤ −3, dy for x ≥ 3 (PyTorch's values)."""
    slope = np.where(x >= 3, 1, np.where(x > -3, x * (1 / 3) + 0.5, 0)).astype(dy.dtype, copy=False)
    return _carry_nan(x, dy * slope)




@hardswish_grad.grad
def _(x, dy, ddx):
    # dx = dy·s(x): ∂/∂dy is hardswish_grad again; ∂/∂x = dy·s′(x) = dy/3 on (−3, 3), 0 outside and at ±3 (PyTorch).
    return F.hardtanh_grad(x, ddx * dy * (1 / 3), min_val=-3.0, max_val=3.0), F.hardswish_grad(x, ddx)


def _hard_samples(rng):
    yield Sample.of(_away_from([-3, 3], rng, (3, 4), -5, 5))
    yield Sample.of(_away_from([-3, 3], rng, (), -5, 5))


hardsigmoid.samples(_hard_samples)
hardswish.samples(_hard_samples)


@hardswish_grad.samples
def _(rng):
    yield Sample.of(_away_from([-3, 3], rng, (3, 4), -5, 5), rng.standard_normal((3, 4)))


def _softplus_np(x):
    return np.logaddexp(0, x)  # log(1 + eˣ) without overflow, exact for x ≪ 0


@op("mish(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def mish(x):
    """y = x·tanh(softplus(x)), softplus(x) = log(1 + eˣ)."""
    return x * np.tanh(_softplus_np(x))




mish.onnx(lambda g, x: g.op("Mul", x, g.op("Tanh", g.call("softplus", x, beta=1.0, threshold=math.inf))))


@mish.grad
def _(x, dy):
    # d/dx x·tanh(sp(x)) = t + x·(1 − t²)·σ(x), t = tanh(sp(x)), sp′ = σ. The exact softplus (no linear piece).
    t = F.tanh(F.softplus(x, threshold=math.inf))
    return dy * (t + x * (1 - t * t) * F.sigmoid(x))


@op("logsigmoid(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def logsigmoid(x):
    """y = log σ(x) = −softplus(−x), computed as min(x, 0) − log(1 + e^(−|x|)): no overflow, exact for x ≪ 0."""
    return np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))




@logsigmoid.onnx
def _(g, x):
    tail = g.call("log1p", g.op("Exp", g.op("Neg", g.op("Abs", x))))
    return g.op("Sub", g.op("Min", x, g.scalar(0, x)), tail)


@logsigmoid.grad
def _(x, dy):
    return dy * F.sigmoid(-x)  # d/dx log σ(x) = 1 − σ(x) = σ(−x), exact for large x too


@op("celu(Tensor<floating> x, float alpha=1.0) -> Tensor y", traits=["elementwise", "pointwise"])
def celu(x, *, alpha):
    """y = x for x > 0, α·(e^(x/α) − 1) otherwise (continuously differentiable elu)."""
    return _elu(x, alpha, 1.0, 1 / alpha)




@celu.onnx
def _(g, x, *, alpha):
    if x.dtype == D.float32:
        return g.op("Celu", x, alpha=alpha)
    low = g.op("Mul", g.op("Min", x, g.scalar(0, x)), g.scalar(1 / alpha, x))
    negative = g.op("Mul", g.call("expm1", low), g.scalar(alpha, x))
    return g.op("Where", g.op("Greater", x, g.scalar(0, x)), x, negative)


@celu.check
def _(*, alpha):
    if alpha == 0:
        raise ValueError("argument 'alpha' must not be 0 (celu divides by it)")


@celu.grad
def _(x, dy, *, alpha):
    return _elu_grad(x, dy, alpha, 1.0, 1 / alpha)


def _smooth_samples(rng):
    yield Sample.of(rng.uniform(-4, 4, (3, 4)))
    yield Sample.of(rng.uniform(-4, 4, ()))


mish.samples(_smooth_samples)
logsigmoid.samples(_smooth_samples)


@celu.samples
def _(rng):
    yield Sample.of(rng.uniform(-4, 4, (3, 4)))
    yield Sample.of(rng.uniform(-4, 4, 5), alpha=0.5)
    yield Sample.of(rng.uniform(-4, 4, ()), alpha=2.0)


# -- activations along an axis, and with a learnable weight ---------------------------------------------------------


@op("softmin(Tensor<floating> x, int axis/dim=-1) -> Tensor y")
def softmin(x, *, axis):
    """softmax(−x) along ``axis``: exp(−x) / Σ exp(−x), shifted by min x so nothing overflows."""
    axes = normalize_axes("softmin", [axis], x.ndim)
    e = np.exp(min_over(x, axes) - x)
    return e / np.sum(e, axis=axes, keepdims=True)


softmin.onnx(lambda g, x, *, axis: g.call("softmax", g.op("Neg", x), axis=axis))


@softmin.infer
def _(x, *, axis):
    normalize_axes("softmin", [axis], len(x.shape))
    return Spec(x.shape, x.dtype)


@softmin.grad
def _(y, dy, *, axis):
    return -F.softmax_grad(y, dy, axis=axis)  # y = softmax(−x)


@softmin.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 5)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1)
    yield Sample.of(rng.standard_normal(()))


def _glu_halves(op_name, shape, axis):
    if not shape:
        raise ShapeError(f"{op_name}(): needs at least 1 dim to halve, got a 0-d tensor")
    (a,) = normalize_axes(op_name, [axis], len(shape))
    if shape[a] is not None and shape[a] % 2:
        raise ShapeError(f"{op_name}(): dim {a} of shape {shape} must have an even size, to split in halves")
    return a


@op("glu(Tensor<floating> x, int axis/dim=-1) -> Tensor y")
def glu(x, *, axis):
    """Gated linear unit: x split in halves a, b along ``axis``, y = a·σ(b)."""
    a, b = np.split(x, 2, axis=_glu_halves("glu", x.shape, axis))
    return a * _sigmoid(b)


@glu.onnx
def _(g, x, *, axis):
    half = g.outputs[0].shape[axis]
    if half is not None:  # Split's sizes as an input: every opset from 13
        a, b = g.op("Split", x, g.ints([half, half]), axis=axis, outputs=2)
    elif g.opset >= 18:
        a, b = g.op("Split", x, axis=axis, num_outputs=2, outputs=2)
    else:
        raise g.unsupported(f"glu over dim {axis} of a size known only at run time needs opset 18 (num_outputs)")
    return g.op("Mul", a, g.op("Sigmoid", b))


@glu.infer
def _(x, *, axis):
    a = _glu_halves("glu", x.shape, axis)
    return Spec(tuple(d if i != a or d is None else d // 2 for i, d in enumerate(x.shape)), x.dtype)


@glu.grad
def _(x, dy, *, axis):
    half = x.shape[axis] // 2
    a, b = F.split(x, sections=[half, half], axis=axis)  # two halves (sizes, not a chunk size: 0 works too)
    s = F.sigmoid(b)
    return F.concat([dy * s, dy * a * s * (1 - s)], axis=axis)  # ∂/∂a = σ(b), ∂/∂b = a·σ(b)·(1 − σ(b))


@glu.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((2, 6, 3)), axis=1)
    yield Sample.of(rng.standard_normal(2), axis=0)


def _prelu_weight_shape(x_ndim, c):
    """The weight, (1,) or (C,), shaped to broadcast against x: C lies on dim 1 (an x of fewer dims has 1)."""
    return [1, c] + [1] * (x_ndim - 2) if x_ndim >= 2 else [c] * x_ndim


@op("prelu(Tensor<floating> x, Tensor<floating> weight) -> Tensor y")
def prelu(x, weight):
    """y = x where x > 0, else weight·x; ``weight`` is 0-d, (1,) or (C,), C the size of dim 1 (1 for an x of fewer
    dims), as torch's."""
    if weight.ndim > 1:
        raise ValueError("weight must be 0-d or 1-d")  # (the shape rule explains; reshape would take another)
    w = weight.reshape(_prelu_weight_shape(x.ndim, weight.size))
    return np.where(x > 0, x, w * x).astype(x.dtype, copy=False)


@prelu.onnx
def _(g, x, weight):
    w = g.op("Reshape", weight, g.ints(_prelu_weight_shape(x.ndim, -1)))
    return g.op("Where", g.op("Greater", x, g.scalar(0, x)), x, g.op("Mul", w, x))


@prelu.infer
def _(x, weight):
    channels = x.shape[1] if len(x.shape) >= 2 else 1
    if len(weight.shape) > 1 or (weight.shape and weight.shape[0] not in (1, None) and channels is not None
                                 and weight.shape[0] != channels):
        raise ShapeError(f"prelu(): weight must have shape (), (1,) or ({channels},) (the channels of x, shape "
                         f"{x.shape}), got {weight.shape}")
    return Spec(x.shape, D.promote(x.dtype, weight.dtype))


@prelu.grad
def _(x, weight, dy, *, needs_input_grad):
    n = x.ndim
    size = weight.shape[0] if weight.ndim else 1  # a 0-d weight is one slope, as (1,)
    w = F.reshape(weight, shape=_prelu_weight_shape(n, size))
    dx = _nan_at_nan(x, F.where(x > 0, dy, dy * w)) if needs_input_grad[0] else None
    dw = None
    if needs_input_grad[1]:
        g = F.where(x > 0, 0, dy * x)  # NaN where x is NaN: that branch is taken
        axes = list(range(n)) if size == 1 else [i for i in range(n) if i != 1]
        dw = F.reshape(F.sum(g, axis=axes) if axes else g, shape=list(weight.shape))  # 0-d x: nothing to sum
    return dx, dw


@prelu.samples
def _(rng):
    yield Sample.of(_away_from([0], rng, (2, 3, 4), -2, 2), rng.uniform(0.1, 0.5, 3))
    yield Sample.of(_away_from([0], rng, (4, 3), -2, 2), rng.uniform(0.1, 0.5, 1))
    yield Sample.of(_away_from([0], rng, 5, -2, 2), rng.uniform(0.1, 0.5, 1))
    yield Sample.of(_away_from([0], rng, (), -2, 2), rng.uniform(0.1, 0.5, 1))
    yield Sample.of(_away_from([0], rng, (2, 3, 4), -2, 2), rng.uniform(0.1, 0.5, ()))  # torch's 0-d weight
    yield Sample.of(_away_from([0], rng, (), -2, 2), rng.uniform(0.1, 0.5, ()))
