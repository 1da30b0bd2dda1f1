"""torch's elementwise maths beyond the basics of ``elementwise.py`` and ``binary.py``: the trigonometric and
hyperbolic functions and their inverses, logarithms and powers of 2 and 10, logit, xlogy, trunc and frac, fmod,
copysign, signbit, heaviside, fmax/fmin, lerp, the tests for infinities, isclose, nan_to_num, xor and the shifts.

Each means what its torch namesake means, values, dtypes and the gradient's convention at edges (where torch's
derivative formula gives NaN, say at hypot(0, 0), so does ours). The floating functions refuse integer tensors as
the library's others do (torch would compute in float32): convert first. Gradient rules are written with ops, so
they differentiate again.
"""

import math

import ml_dtypes

from opforge import ops as F

from ..core.errors import ArgumentError, describe
from ._common import D, Sample, Spec, function, np, op, promoted
from .binary import _compare_spec
from .integer import _no_integer_zero, _onnx_sign_bit, _onnx_signed


def _floating(name: str, doc: str, kernel, rule, samples=None):
    """A unary floating op ``name(x) -> y`` with NumPy's ``kernel`` and the gradient ``rule``."""
    opdef = op(f"{name}(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])(_kernel(kernel, doc))
    opdef.grad(rule)
    if samples is not None:
        opdef.samples(samples)
    return opdef


def _kernel(ufunc, doc):
    def kernel(x):
        return ufunc(x)

    kernel.__doc__ = doc
    return kernel


def _uniform(low, high):
    def samples(rng):
        yield Sample.of(rng.uniform(low, high, (2, 3)))
        yield Sample.of(rng.uniform(low, high, (5,)))
        yield Sample.of(rng.uniform(low, high, ()))
    return samples


_LN2, _LN10 = math.log(2.0), math.log(10.0)

# The rules are torch's formulas (derivatives.yaml), so values at the edges of the domain agree too.
tan = _floating("tan", "Tangent.", np.tan, lambda y, dy: dy * (1 + y * y), _uniform(-1.2, 1.2))
sinh = _floating("sinh", "Hyperbolic sine.", np.sinh, lambda x, dy: dy * F.cosh(x))
cosh = _floating("cosh", "Hyperbolic cosine.", np.cosh, lambda x, dy: dy * F.sinh(x))
asin = _floating("asin", "Inverse sine (NaN outside [−1, 1]).", np.arcsin,
                 lambda x, dy: dy * F.rsqrt(1 - x * x), _uniform(-0.9, 0.9))
acos = _floating("acos", "Inverse cosine (NaN outside [−1, 1]).", np.arccos,
                 lambda x, dy: -dy * F.rsqrt(1 - x * x), _uniform(-0.9, 0.9))
atan = _floating("atan", "Inverse tangent.", np.arctan, lambda x, dy: dy / (x * x + 1))
asinh = _floating("asinh", "Inverse hyperbolic sine.", np.arcsinh, lambda x, dy: dy * F.rsqrt(x * x + 1))
acosh = _floating("acosh", "Inverse hyperbolic cosine (NaN below 1).", np.arccosh,
                  lambda x, dy: dy * F.rsqrt(x * x - 1), _uniform(1.2, 3.0))
atanh = _floating("atanh", "Inverse hyperbolic tangent (±inf at ±1, NaN beyond).", np.arctanh,
                  lambda x, dy: dy / (1 - x * x), _uniform(-0.9, 0.9))
log2 = _floating("log2", "Logarithm to base 2.", np.log2, lambda x, dy: dy / (x * _LN2), _uniform(0.3, 3.0))
log10 = _floating("log10", "Logarithm to base 10.", np.log10, lambda x, dy: dy / (x * _LN10), _uniform(0.3, 3.0))
exp2 = _floating("exp2", "2ˣ.", np.exp2, lambda y, dy: dy * y * _LN2)
frac = _floating("frac", "The fractional part, x − trunc(x), with the sign of x (torch's frac: floating only).",
                 lambda x: x - np.trunc(x), lambda dy: dy)

for _opdef, _onnx in ((tan, "Tan"), (sinh, "Sinh"), (cosh, "Cosh"), (asin, "Asin"), (acos, "Acos"), (atan, "Atan"),
                      (asinh, "Asinh"), (acosh, "Acosh"), (atanh, "Atanh")):
    _opdef.onnx(lambda g, x, _t=_onnx: g.op(_t, x))


@frac.samples
def _(rng):  # away from the integers, where frac jumps
    yield Sample.of(np.floor(rng.uniform(-4, 4, (2, 3))) + rng.uniform(0.1, 0.9, (2, 3)))
    yield Sample.of(np.array(-2.25))


@op("trunc(Tensor<number> x) -> Tensor y", traits=["elementwise", "pointwise"])
def trunc(x):
    """x rounded towards 0 (integer tensors are returned unchanged)."""
    return np.trunc(x) if D.is_floating(x.dtype) else x.copy()


@trunc.grad
def _(dy):
    return F.zeros_like(dy)  # piecewise constant: 0, at the jumps too (as torch)


@trunc.samples
def _(rng):
    yield Sample.of(np.floor(rng.uniform(-4, 4, (2, 3))) + rng.uniform(0.1, 0.9, (2, 3)))
    yield Sample.of(np.array(-2.5))
    yield Sample.of(rng.integers(-5, 5, (4,)))


@op("logit(Tensor<floating> x, float? eps=None) -> Tensor y", traits=["elementwise", "pointwise"])
def logit(x, *, eps):
    """ln(z / (1 − z)) with z = x, or x clamped to [eps, 1 − eps] when ``eps`` is given (NaN outside [0, 1]
    without it)."""
    if eps is not None:
        x = np.clip(x, eps, 1 - eps)
    with np.errstate(divide="ignore", invalid="ignore"):  # ±inf at 0 and 1, NaN outside: as torch
        return np.log(x / (1 - x))


@logit.grad
def _(x, dy, *, eps):
    # torch's: 1/(x(1 − x)); 0 where eps clamps x (outside [eps, 1 − eps]), NaN outside [0, 1] without eps
    g = dy / (x * (1 - x))
    if eps is None:
        return F.where((x < 0) | (x > 1), math.nan, g)
    return F.where((x < eps) | (x > 1 - eps), 0, g)


@logit.samples
def _(rng):
    yield Sample.of(rng.uniform(0.1, 0.9, (2, 3)))
    yield Sample.of(rng.uniform(0.1, 0.9, ()))
    yield Sample.of(np.array([0.05, 0.3, 0.6, 0.97]), eps=0.2)  # clamped at both ends, away from the bounds


# -- tests of values: bool results -----------------------------------------------------------------------------------


def _bool_spec(x):
    return Spec(x.shape, D.bool_)


def _special_samples(rng):
    yield Sample.of(np.array([[0.0, -1.5, np.nan], [np.inf, -np.inf, 2.0]]))
    yield Sample.of(rng.integers(-2, 2, (4,)))
    yield Sample.of(rng.standard_normal(3) > 0)


def _value_test(name: str, doc: str, test):
    def kernel(x, xp=np):
        return test(x) if D.is_floating(x.dtype) else xp.zeros(x.shape, bool)

    kernel.__doc__ = doc
    opdef = op(f"{name}(Tensor x) -> Tensor<bool> y", traits=["no_grad", "pointwise"], infer=_bool_spec)(kernel)
    opdef.samples(_special_samples)
    return opdef


isinf = _value_test("isinf", "True where x is +inf or −inf (never for integers and bools).", np.isinf)
isposinf = _value_test("isposinf", "True where x is +inf.", np.isposinf)
isneginf = _value_test("isneginf", "True where x is −inf.", np.isneginf)


def _nan_to_num(x, *, nan, posinf, neginf):
    """NaN, +inf and −inf replaced by ``nan``, ``posinf`` and ``neginf`` (by default the largest and the smallest
    finite value of x's dtype); integers and bools unchanged."""
    if not D.is_floating(x.dtype):
        return x.copy()
    info, scalar = ml_dtypes.finfo(x.dtype), x.dtype.type  # NumPy scalars of x's dtype: a device takes them
    y = np.where(np.isnan(x), scalar(nan), x)
    y = np.where(np.isposinf(x), scalar(info.max if posinf is None else posinf), y)
    # (CuPy's where makes bfloat16 float32: a select is exact in x's dtype, so it is cast back)
    return np.where(np.isneginf(x), scalar(info.min if neginf is None else neginf), y).astype(x.dtype, copy=False)


nan_to_num = op("nan_to_num(Tensor x, float nan=0.0, float? posinf=None, float? neginf=None) -> Tensor y",
                traits=["pointwise"], infer=lambda x, **_: x)(_nan_to_num)
nan_to_num.kernel(dtypes=list(D.HALF))(_nan_to_num)  # in the half dtype itself: its own largest value, not float32's


@nan_to_num.grad
def _(x, dy):
    # torch's: the gradient passes where x is finite, 0 where it was replaced (a NaN there is a constant, not NaN)
    return F.where(F.isfinite(x), dy, 0)


@nan_to_num.samples
def _(rng):
    # the default replacements of ±inf are the dtype's extremes, which no other dtype and no numeric derivative
    # can follow: tests/test_oracle_opinfo.py compares them with torch's
    yield Sample.of(np.array([[np.inf, np.nan, -np.inf], [0.5, -1.5, 2.0]]), nan=1.5, posinf=7.0, neginf=-7.0)
    yield Sample.of(rng.standard_normal(()))
    yield Sample.of(rng.integers(-2, 2, (4,)))


# -- two tensors, broadcast and promoted as torch does -------------------------------------------------------------


def _binary(name: str, inputs: str, doc: str, kernel, rule=None, samples=None, traits=()):
    """A broadcasting op ``name(x, y)`` whose ``kernel`` gets both arrays in their promoted dtype."""
    def run(x, y):
        if x.dtype is not y.dtype:  # NumPy would promote otherwise than torch
            x, y = promoted(x, y)
        return kernel(x, y)

    run.__doc__ = doc
    opdef = op(f"{name}({inputs}) -> Tensor out", traits=["broadcast", "pointwise", *traits])(run)
    if rule is not None:
        opdef.grad(rule)
    if samples is not None:
        opdef.samples(samples)
    return opdef


_FLOATS = "Tensor<floating> x, Tensor<floating> y"
_NUMBERS = "Tensor<number> x, Tensor<number> y"


def _atan2_grad(x, y, dout):
    # torch's: 1/(x² + y²) taken as 0 where it overflows, so the gradient at (0, 0) is 0 (its own derivative NaN)
    r = F.reciprocal(x * x + y * y)
    r = F.where(F.isinf(r), 0, r)
    return dout * y * r, dout * -x * r


def _hypot_grad(x, y, out, dout):
    return dout * x / out, dout * y / out  # torch's: NaN at (0, 0)


def _logaddexp_grad(x, y, dout):
    return dout / (1 + F.exp(y - x)), dout / (1 + F.exp(x - y))


atan2 = _binary("atan2", _FLOATS, "The angle of the point (y=x, x=y) in (−π, π]: ``torch.atan2(input, other)`` is "
                "atan(input / other) in the right quadrant.", np.arctan2, _atan2_grad)
hypot = _binary("hypot", _FLOATS, "√(x² + y²), without overflow.", np.hypot, _hypot_grad)
logaddexp = _binary("logaddexp", _FLOATS, "ln(eˣ + eʸ), without overflow.", np.logaddexp, _logaddexp_grad)


def _xlogy(x, y):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isnan(y), np.nan, np.where(x == 0, 0, x * np.log(y))).astype(x.dtype)


def _xlogy_grad(x, y, dout):
    # torch's: d/dx = ln y (as xlogy(dout, y)), 0 where x = 0 and y ≤ 0; d/dy = x / y
    return F.where((x == 0) & (y <= 0), 0, F.xlogy(dout, y)), dout * x / y


xlogy = _binary("xlogy", _FLOATS, "x·ln(y), 0 where x = 0 (unless y is NaN), as ``torch.xlogy``.", _xlogy,
                _xlogy_grad)


@atan2.samples
@hypot.samples
@logaddexp.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal(3))
    yield Sample.of(rng.standard_normal(()), rng.standard_normal((2, 1)))


@xlogy.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.uniform(0.5, 2.0, (2, 3)))
    yield Sample.of(rng.standard_normal(()), rng.uniform(0.5, 2.0, (3,)))


def _fmod(x, y):
    _no_integer_zero("fmod", x, y)
    return np.fmod(x, y)


def _fmod_grad(x, y, dout, needs_input_grad):
    # torch's: d/dx = 1, d/dy = −trunc(x / y) (wherever x / y is not an integer; the same expression at the jumps)
    return dout, -dout * F.trunc(x / y) if needs_input_grad[1] else None


fmod = _binary("fmod", _NUMBERS, "The remainder of x / y rounded towards 0, with the sign of x (C's fmod; "
               "``remainder`` takes the sign of y). Integers divided by 0 raise ``DivisionByZeroError``, as torch.",
               _fmod, _fmod_grad)


@fmod.samples
def _(rng):
    def off_the_jumps(x_shape, y_shape):
        y = rng.uniform(0.5, 2.0, y_shape) * rng.choice([-1, 1], y_shape)
        return (rng.integers(-3, 3, x_shape) + rng.uniform(0.2, 0.8, x_shape)) * y, y

    yield Sample.of(*off_the_jumps((2, 3), (2, 3)))
    yield Sample.of(*off_the_jumps((2, 3), (3,)))
    yield Sample.of(np.array([7, -7, 7, -7]), np.array([3, 3, -3, -3]))


def _copysign_grad(x, out, dout):
    # torch's: out / x (±1 as the sign changes or not), 0 where x = 0; nothing for y (only its sign bit counts)
    return dout * F.where(x == 0, 0, out / x), None


copysign = _binary("copysign", _FLOATS, "|x| with the sign of y (the sign bit: −0.0 counts as negative).",
                   np.copysign, _copysign_grad)


@copysign.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal((2, 3)), np.array([-0.5, 0.5, 2.0]))  # ±0.0: in the torch oracle


def _nan_ignoring_grad(x_wins):
    def rule(x, y, dout):
        # torch's: the gradient goes to x where it is kept (ties included) or y is NaN, else to y
        to_x = x_wins(x, y) | F.isnan(y)
        return F.where(to_x, dout, 0), F.where(to_x, 0, dout)
    return rule


fmax = _binary("fmax", _NUMBERS, "The larger of x and y, ignoring a NaN (NaN where both are).", np.fmax,
               _nan_ignoring_grad(lambda x, y: x >= y))
fmin = _binary("fmin", _NUMBERS, "The smaller of x and y, ignoring a NaN (NaN where both are).", np.fmin,
               _nan_ignoring_grad(lambda x, y: x <= y))


@fmax.samples
@fmin.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))  # NaNs: in the torch oracle
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal(3))
    yield Sample.of(rng.integers(-3, 3, (4,)), np.array(1, np.int32))


# -- bits and truth values -----------------------------------------------------------------------------------------

_INTEGERS = "Tensor<integer|bool> x, Tensor<integer|bool> y"


bitwise_xor = _binary("bitwise_xor", _INTEGERS, "x ^ y, bit by bit (the logical xor of bools).", np.bitwise_xor,
                      traits=("no_grad",))


def _shift(left: bool):
    def kernel(x, y):
        # torch's: a shift by a negative count or by the width or more gives 0 (-1 for a negative x shifted right)
        bits = x.dtype.itemsize * 8
        fits = (y >= 0) & (y < bits)
        count = np.where(fits, y, 0).astype(x.dtype)
        if left:
            return np.where(fits, np.left_shift(x, count), 0).astype(x.dtype)
        return np.where(fits, np.right_shift(x, count), np.where(x < 0, -1, 0)).astype(x.dtype)
    return kernel


bitwise_left_shift = _binary("bitwise_left_shift", "Tensor<integer> x, Tensor<integer> y",
                             "x << y: x·2ʸ, wrapping around; 0 for shifts by a negative count or by the width or more.",
                             _shift(True), traits=("no_grad",))
bitwise_right_shift = _binary("bitwise_right_shift", "Tensor<integer> x, Tensor<integer> y",
                              "x >> y: floor(x / 2ʸ); shifts by a negative count or by the width or more give 0 "
                              "(−1 for a negative x).", _shift(False), traits=("no_grad",))


@bitwise_left_shift.samples
@bitwise_right_shift.samples
def _(rng):
    yield Sample.of(rng.integers(-8, 8, (2, 3)), rng.integers(-1, 66, (2, 3)))
    yield Sample.of(rng.integers(-8, 8, (4,)).astype(np.int32), np.array(3, np.int32))


@bitwise_xor.samples
def _(rng):
    yield Sample.of(rng.integers(-8, 8, (2, 3)), rng.integers(-8, 8, (2, 3)))
    yield Sample.of(rng.standard_normal((2, 3)) > 0, rng.standard_normal(3) > 0)
    yield Sample.of(rng.integers(0, 16, (4,)).astype(np.int32), np.array(True))


@op("logical_xor(Tensor x, Tensor y) -> Tensor<bool> out", traits=["no_grad", "pointwise"],
    infer=_compare_spec("logical_xor"))
def logical_xor(x, y):
    """True where exactly one of x and y is nonzero (True)."""
    return np.logical_xor(x, y)


@logical_xor.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)) > 0, rng.standard_normal((2, 3)) > 0)
    yield Sample.of(rng.integers(-1, 2, (4, 1)), rng.standard_normal((1, 3)).round())


@op("isclose(Tensor x, Tensor y, float rtol=1e-05, float atol=1e-08, bool equal_nan=False) -> Tensor<bool> out",
    traits=["no_grad", "pointwise"], infer=lambda x, y, **_: _compare_spec("isclose")(x, y))
def isclose(x, y, *, rtol, atol, equal_nan):
    """|x − y| ≤ atol + |rtol·y| elementwise, as torch's: equal values (infinities included) are close, NaN is
    close to NaN only with ``equal_nan``. Integers and bools compare their differences in float32, as torch."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    close = x == y
    if equal_nan and D.is_floating(x.dtype):
        close |= np.isnan(x) & np.isnan(y)
    if x.dtype == D.bool_:
        x, y = x.astype(D.float32), y.astype(D.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        actual = np.abs(x - y)
        allowed = atol + np.abs(rtol * (y if D.is_floating(y.dtype) else y.astype(D.float32)))
        return close | (np.isfinite(actual) & (actual <= allowed))


@isclose.samples
def _(rng):
    x = rng.standard_normal((2, 3))
    yield Sample.of(x, x + np.array([0.0, 1e-9, 1e-3]))
    yield Sample.of(np.array([np.nan, np.inf, -np.inf, 1.0]), np.array([np.nan, np.inf, np.inf, 1.0 + 1e-6]),
                    equal_nan=True)
    yield Sample.of(np.array([100, 101, 5]), np.array([100, 100, 6]), rtol=0.01, atol=0.0)


# -- three tensors ----------------------------------------------------------------------------------------------------


@op("lerp(Tensor<floating> x, Tensor<floating> end, Tensor<floating> weight) -> Tensor out",
    traits=["broadcast", "pointwise"])
def lerp(x, end, weight):
    """x + weight·(end − x), computed as torch does: from the nearer end (end − (end − x)·(1 − weight) where
    |weight| ≥ ½), so that a weight of 1 gives ``end`` exactly."""
    x, end, weight = promoted(x, end, weight)
    diff = end - x
    return np.where(np.abs(weight) < 0.5, x + weight * diff, end - diff * (1 - weight))


@lerp.grad
def _(x, end, weight, dout, needs_input_grad):
    return (dout * (1 - weight) if needs_input_grad[0] else None, dout * weight if needs_input_grad[1] else None,
            dout * (end - x) if needs_input_grad[2] else None)


@lerp.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), rng.uniform(-0.5, 1.5, (2, 3)))
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal(3), np.array(0.75))
    yield Sample.of(rng.standard_normal(()), rng.standard_normal((2, 1)), rng.uniform(0, 1, (1, 3)))


def _in_result_type(*tensors) -> list:
    """The tensors in their common dtype (torch.result_type), as torch's fused kernels take them: the product or
    quotient is computed in that dtype too, not in the dtype of the two factors."""
    dtype = D.result_type(*(t for t in tensors if hasattr(t, "dtype")))
    return [F.cast(t, dtype=dtype) if hasattr(t, "dtype") and t.dtype != dtype else t for t in tensors]


@function
def addcmul(input, tensor1, tensor2, *, value=1):
    """``torch.addcmul``: input + value·tensor1·tensor2 (broadcast, promoted as torch does); a float ``value``
    with integer tensors is refused, as torch refuses it."""
    if isinstance(value, float) and not any(D.is_floating(getattr(t, "dtype", D.int64))
                                            for t in (input, tensor1, tensor2)):
        raise ArgumentError(f"addcmul(): value={value!r} is a float and the tensors are integers: torch refuses it "
                            "too (give an int value, or floating tensors)")
    input, tensor1, tensor2 = _in_result_type(input, tensor1, tensor2)
    return input + (tensor1 * tensor2 if value == 1 else value * tensor1 * tensor2)


@function
def addcdiv(input, tensor1, tensor2, *, value=1):
    """``torch.addcdiv``: input + value·tensor1/tensor2. Integer tensor1 and tensor2 are refused, as torch refuses
    them (its integer division here was removed)."""
    if not (D.is_floating(getattr(tensor1, "dtype", D.float32)) or D.is_floating(getattr(tensor2, "dtype", D.float32))):
        raise ArgumentError("addcdiv(): integer division of tensor1 by tensor2 is not supported, as in torch: "
                            "divide floating tensors (or use (tensor1 // tensor2) for a floor division)")
    input, tensor1, tensor2 = _in_result_type(input, tensor1, tensor2)
    return input + (tensor1 / tensor2 if value == 1 else value * tensor1 / tensor2)


@function
def signbit(input):
    """``torch.signbit``: whether each element's sign bit is set — True for -0.0 and for a NaN with its sign bit
    (floats), for a negative integer, never for a bool. A bool tensor, not differentiable."""
    if D.is_floating(input.dtype):  # copysign reads the sign bit (input < 0 would miss -0.0 and -NaN)
        return F.less(F.copysign(F.ones_like(input), input), 0)
    if input.dtype == D.bool_:
        return F.zeros_like(input)
    return F.less(input, 0)


@function
def heaviside(input, values):
    """``torch.heaviside``: 0 where ``input`` < 0, ``values`` where it is 0, 1 where it is > 0 (and 0 where it is
    NaN, as torch's kernel gives), broadcast; ``input`` and ``values`` must have one dtype, as torch requires.
    Differentiable in ``values`` (torch's raises: it has no derivative for heaviside)."""
    if not hasattr(values, "dtype"):
        raise ArgumentError(f"heaviside(): argument 'values' must be a tensor, got {describe(values)}")
    if input.dtype != values.dtype:
        raise ArgumentError(f"heaviside(): input and values must have one dtype (torch: not implemented for "
                            f"tensors with different dtypes), got {input.dtype} and {values.dtype}")
    return F.where(F.equal(input, F.zeros_like(input)), values, F.cast(F.greater(input, F.zeros_like(input)),
                                                                        dtype=input.dtype))


# -- ONNX export of the ops above ONNX has no node for: the kernels' formulas --------------------------------------


def _onnx_operands(g, *xs):
    return [g.cast(x, g.outputs[0].dtype) for x in xs]


def _onnx_trunc(g, x):
    return g.op("Where", g.op("Less", x, g.scalar(0, x)), g.op("Ceil", x), g.op("Floor", x))


log2.onnx(lambda g, x: g.op("Div", g.op("Log", x), g.scalar(_LN2, x)))
log10.onnx(lambda g, x: g.op("Div", g.op("Log", x), g.scalar(_LN10, x)))
exp2.onnx(lambda g, x: g.op("Pow", g.scalar(2, x), x, spec=g.outputs[0]))
frac.onnx(lambda g, x: g.op("Sub", x, _onnx_trunc(g, x)))
trunc.onnx(lambda g, x: _onnx_trunc(g, x) if D.is_floating(x.dtype) else g.op("Identity", x))


@logit.onnx
def _(g, x, *, eps):
    if eps is not None:
        x = g.op("Clip", x, g.scalar(eps, x), g.scalar(1 - eps, x))
    return g.op("Log", g.op("Div", x, g.op("Sub", g.scalar(1, x), x)))


def _onnx_value_test(positive: bool, negative: bool):
    def mapping(g, x):
        if not D.is_floating(x.dtype):
            return g.filled(g.op("Shape", x), False, D.bool_)
        return g.op("IsInf", x, detect_positive=positive, detect_negative=negative, spec=g.outputs[0])
    return mapping


isinf.onnx(_onnx_value_test(True, True))
isposinf.onnx(_onnx_value_test(True, False))
isneginf.onnx(_onnx_value_test(False, True))


@nan_to_num.onnx
def _(g, x, *, nan, posinf, neginf):
    if not D.is_floating(x.dtype):
        return g.op("Identity", x)
    info = ml_dtypes.finfo(x.dtype)
    y = g.op("Where", g.op("IsNaN", x), g.scalar(nan, x), x)
    y = g.op("Where", g.op("IsInf", x, detect_negative=0), g.scalar(info.max if posinf is None else posinf, x), y)
    return g.op("Where", g.op("IsInf", x, detect_positive=0), g.scalar(info.min if neginf is None else neginf, x), y)


@atan2.onnx
def _(g, x, y):
    # C's atan2(x, y) (x, y are torch's input and other: the angle of the point (y, x)), its special cases
    # included: the angle's size from |x| and |y|, its half-plane from y's sign bit, its sign from x's
    x, y = _onnx_operands(g, x, y)
    zero = g.scalar(0, x)
    ax, ay, y_negative = g.op("Abs", x), g.op("Abs", y), _onnx_sign_bit(g, y)
    t = g.op("Atan", g.op("Div", ax, ay))  # ay = 0 gives π/2, ax = inf π/2, ay = inf 0
    size = g.op("Where", y_negative, g.op("Sub", g.scalar(math.pi, x), t), t)
    both_inf = g.op("And", g.op("IsInf", x), g.op("IsInf", y))
    size = g.op("Where", both_inf, g.op("Where", y_negative, g.scalar(3 * math.pi / 4, x), g.scalar(math.pi / 4, x)),
                size)
    size = g.op("Where", g.op("Equal", x, zero), g.op("Where", y_negative, g.scalar(math.pi, x), zero), size)
    angle = _onnx_signed(g, size, _onnx_sign_bit(g, x))
    return g.op("Where", g.op("Or", g.op("IsNaN", x), g.op("IsNaN", y)), g.scalar(math.nan, x), angle,
                spec=g.outputs[0])


@hypot.onnx
def _(g, x, y):
    # the larger magnitude times √(1 + r²), r the ratio of the smaller: no overflow (0 where both are 0)
    x, y = (g.op("Abs", v) for v in _onnx_operands(g, x, y))
    big, small = g.op("Max", x, y), g.op("Min", x, y)
    zero = g.scalar(0, x)
    ratio = g.op("Div", small, g.op("Where", g.op("Equal", big, zero), g.scalar(1, x), big))
    length = g.op("Mul", big, g.op("Sqrt", g.op("Add", g.scalar(1, x), g.op("Mul", ratio, ratio))))
    infinite = g.op("Or", g.op("IsInf", x), g.op("IsInf", y))  # inf, even beside a NaN (C's hypot)
    return g.op("Where", infinite, g.scalar(math.inf, x), length, spec=g.outputs[0])


@logaddexp.onnx
def _(g, x, y):
    # max + ln(1 + e^−|x − y|); equal arguments (infinities too) give x + ln 2
    x, y = _onnx_operands(g, x, y)
    spread = g.call("log1p", g.op("Exp", g.op("Neg", g.op("Abs", g.op("Sub", x, y)))))
    return g.op("Where", g.op("Equal", x, y), g.op("Add", x, g.scalar(_LN2, x)),
                g.op("Add", g.op("Max", x, y), spread), spec=g.outputs[0])


@xlogy.onnx
def _(g, x, y):
    x, y = _onnx_operands(g, x, y)
    product = g.op("Where", g.op("Equal", x, g.scalar(0, x)), g.scalar(0, x), g.op("Mul", x, g.op("Log", y)))
    return g.op("Where", g.op("IsNaN", y), g.scalar(math.nan, x), product, spec=g.outputs[0])


fmod.onnx(lambda g, x, y: g.op("Mod", *_onnx_operands(g, x, y), fmod=1, spec=g.outputs[0]))


@copysign.onnx
def _(g, x, y):
    x, y = _onnx_operands(g, x, y)
    return _onnx_signed(g, g.op("Abs", x), _onnx_sign_bit(g, y))


def _onnx_nan_ignoring(extreme: str):
    def mapping(g, x, y):
        x, y = _onnx_operands(g, x, y)
        if not D.is_floating(x.dtype):
            return g.op(extreme, x, y, spec=g.outputs[0])
        kept = g.op("Where", g.op("IsNaN", y), x, g.op(extreme, x, y))
        return g.op("Where", g.op("IsNaN", x), y, kept, spec=g.outputs[0])
    return mapping


fmax.onnx(_onnx_nan_ignoring("Max"))
fmin.onnx(_onnx_nan_ignoring("Min"))


@bitwise_xor.onnx
def _(g, x, y):
    x, y = _onnx_operands(g, x, y)
    if x.dtype == D.bool_:
        return g.op("Xor", x, y, spec=g.outputs[0])
    if g.opset < 18:
        raise g.unsupported("BitwiseXor on integers needs opset 18")
    return g.op("BitwiseXor", x, y, spec=g.outputs[0])


def _onnx_shift(left: bool):
    def mapping(g, x, y):
        # ONNX's BitShift takes unsigned integers: the bits of x as such (a Cast wraps modulo 2ⁿ), shifted, and
        # back; a right shift of a negative x is ~((~x) >> y), which fills with ones. Counts outside [0, n) give
        # 0 (−1 for a negative x shifted right), as the kernel.
        x, y = _onnx_operands(g, x, y)
        bits = x.dtype.itemsize * 8
        unsigned = np.dtype(f"uint{bits}")
        zero, minus_one = g.scalar(0, x), g.scalar(-1, x)
        fits = g.op("And", g.op("GreaterOrEqual", y, zero), g.op("Less", y, g.scalar(bits, x)))
        count = g.cast(g.op("Where", fits, y, zero), unsigned)

        def shifted(v):
            return g.cast(g.op("BitShift", g.cast(v, unsigned), count, direction="LEFT" if left else "RIGHT",
                               spec=Spec(g.outputs[0].shape, unsigned)), x.dtype)

        if left:
            return g.op("Where", fits, shifted(x), zero, spec=g.outputs[0])
        negative = g.op("Less", x, zero)
        flipped = g.op("Sub", minus_one, shifted(g.op("Sub", minus_one, x)))  # ~v is −1 − v
        inside = g.op("Where", negative, flipped, shifted(x))
        return g.op("Where", fits, inside, g.op("Where", negative, minus_one, zero), spec=g.outputs[0])
    return mapping


bitwise_left_shift.onnx(_onnx_shift(True))
bitwise_right_shift.onnx(_onnx_shift(False))
logical_xor.onnx(lambda g, x, y: g.op("Xor", g.cast(x, D.bool_), g.cast(y, D.bool_), spec=g.outputs[0]))


@isclose.onnx
def _(g, x, y, *, rtol, atol, equal_nan):
    dtype = D.promote(x.dtype, y.dtype)
    x, y = g.cast(x, dtype), g.cast(y, dtype)
    close = g.op("Equal", x, y)
    if equal_nan and D.is_floating(dtype):
        close = g.op("Or", close, g.op("And", g.op("IsNaN", x), g.op("IsNaN", y)))
    if dtype == D.bool_:
        x, y = g.cast(x, D.float32), g.cast(y, D.float32)
    # as the kernel's NumPy: a float dtype compares in it; integer differences against float32 bounds in float64
    exact = D.is_floating(x.dtype)
    bound_type = x.dtype if exact else D.float32
    actual = g.op("Abs", g.op("Sub", x, y))
    allowed = g.op("Add", g.const(np.asarray(atol, bound_type)), g.op("Abs", g.op(
        "Mul", g.const(np.asarray(rtol, bound_type)), g.cast(y, bound_type))))
    if not exact:
        actual, allowed = g.cast(actual, D.float64), g.cast(allowed, D.float64)
    finite = g.op("Not", g.op("Or", g.op("IsInf", actual), g.op("IsNaN", actual))) if exact else None
    within = g.op("LessOrEqual", actual, allowed)
    return g.op("Or", close, within if finite is None else g.op("And", finite, within), spec=g.outputs[0])


@lerp.onnx
def _(g, x, end, weight):
    x, end, weight = _onnx_operands(g, x, end, weight)
    diff = g.op("Sub", end, x)
    near_x = g.op("Add", x, g.op("Mul", weight, diff))
    near_end = g.op("Sub", end, g.op("Mul", diff, g.op("Sub", g.scalar(1, x), weight)))
    return g.op("Where", g.op("Less", g.op("Abs", weight), g.scalar(0.5, x)), near_x, near_end, spec=g.outputs[0])
