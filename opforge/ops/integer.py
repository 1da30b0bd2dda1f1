"""The operators ``%``, ``//``, ``&``, ``|`` and ``~``: remainder and floor division (rounding down, as Python and
PyTorch do), and bitwise logic on integer and bool tensors (on bools, the logical and, or and not)."""

from opforge import ops as F

from ..core.errors import DivisionByZeroError
from ._common import D, Sample, np, op, promoted


def _no_integer_zero(op_name: str, x, y) -> None:
    """Integers divided by 0: NumPy gives 0 (and a warning); Python and torch raise, and so does opforge."""
    if y.dtype.kind in "iub" and x.dtype.kind in "iub" and x.size and not y.all():
        at = tuple(int(i) for i in np.argwhere(y == 0)[0])
        raise DivisionByZeroError(f"{op_name}(): integer division by zero: argument 'y' ({y.dtype}) is 0"
                                  f"{f' at index {at}' if at else ''}; divide floats to get inf or NaN there")


@op("remainder(Tensor<number> x, Tensor<number> y) -> Tensor out", traits=["broadcast"])
def remainder(x, y):
    """x mod y with the sign of y (Python's ``%``, ``torch.remainder``): x − floor(x / y)·y. Integers divided by 0
    raise ``DivisionByZeroError``, as Python and torch do."""
    _no_integer_zero("remainder", x, y)
    if x.dtype is not y.dtype:  # NumPy would promote otherwise than PyTorch
        x, y = promoted(x, y)
    return np.remainder(x, y)


@remainder.grad
def _(x, y, dout, needs_input_grad):
    # d/dx = 1 and d/dy = −floor(x / y) wherever x / y is not an integer (torch's convention at the jumps too)
    return dout, -dout * F.floor_divide(x, y) if needs_input_grad[1] else None


@op("floor_divide(Tensor<number> x, Tensor<number> y) -> Tensor out", traits=["broadcast"])
def floor_divide(x, y):
    """floor(x / y) (Python's ``//``; integers stay integers, and raise ``DivisionByZeroError`` divided by 0)."""
    _no_integer_zero("floor_divide", x, y)
    if x.dtype is not y.dtype:  # NumPy would promote otherwise than PyTorch
        x, y = promoted(x, y)
    return np.floor_divide(x, y)


@floor_divide.grad
def _(dout):
    # Piecewise constant: the gradient is 0 wherever it exists (torch has none; floor's convention here).
    return F.zeros_like(dout), F.zeros_like(dout)


def _off_the_jumps(rng, x_shape, y_shape):
    """x and y (broadcasting to x's shape) whose quotient is 0.2 or more away from an integer: remainder and
    floor_divide are smooth there."""
    y = rng.uniform(0.5, 2.0, y_shape) * rng.choice([-1, 1], y_shape)
    return (rng.integers(-3, 3, x_shape) + rng.uniform(0.2, 0.8, x_shape)) * y, y


@remainder.samples
@floor_divide.samples
def _(rng):
    yield Sample.of(*_off_the_jumps(rng, (2, 3), (2, 3)))
    yield Sample.of(*_off_the_jumps(rng, (2, 3), (3,)))
    yield Sample.of(*_off_the_jumps(rng, (), ()))
    yield Sample.of(np.array([7, -7, 7, -7]), np.array([3, 3, -3, -3]))  # integers: Python's signs


@op("bitwise_and(Tensor<integer|bool> x, Tensor<integer|bool> y) -> Tensor out", traits=["broadcast", "no_grad"])
def bitwise_and(x, y):
    """x & y, bit by bit (the logical and of bools)."""
    if x.dtype is not y.dtype:  # NumPy would promote otherwise than PyTorch
        x, y = promoted(x, y)
    return np.bitwise_and(x, y)


@op("bitwise_or(Tensor<integer|bool> x, Tensor<integer|bool> y) -> Tensor out", traits=["broadcast", "no_grad"])
def bitwise_or(x, y):
    """x | y, bit by bit (the logical or of bools)."""
    if x.dtype is not y.dtype:  # NumPy would promote otherwise than PyTorch
        x, y = promoted(x, y)
    return np.bitwise_or(x, y)


@bitwise_and.samples
@bitwise_or.samples
def _(rng):
    yield Sample.of(rng.integers(-8, 8, (2, 3)), rng.integers(-8, 8, (2, 3)))
    yield Sample.of(rng.standard_normal((2, 3)) > 0, rng.standard_normal(3) > 0)
    yield Sample.of(rng.integers(0, 16, (4,)).astype(np.int32), np.array(True))


@op("bitwise_not(Tensor<integer|bool> x) -> Tensor y", traits=["elementwise", "no_grad"])
def bitwise_not(x):
    """~x, bit by bit (−x − 1 for integers; the logical not of bools)."""
    return np.invert(x)


@bitwise_not.samples
def _(rng):
    yield Sample.of(rng.integers(-8, 8, (2, 3)))
    yield Sample.of(rng.standard_normal(4) > 0)
    yield Sample.of(np.array(5, dtype=np.int32))


# -- ONNX export -------------------------------------------------------------------------------------------------


def _onnx_operands(g, x, y):
    dtype = g.outputs[0].dtype
    return g.cast(x, dtype), g.cast(y, dtype)


def _onnx_float_mod(g, x, y):
    """NumPy's float remainder: fmod (exact), moved into y's sign where it is nonzero and the signs differ."""
    m = g.op("Mod", x, y, fmod=1)
    zero = g.scalar(0, x)
    off = g.op("And", g.op("Not", g.op("Equal", m, zero)),
               g.op("Xor", g.op("Less", m, zero), g.op("Less", y, zero)))
    return m, off


def _onnx_sign_bit(g, v):
    """v < 0, or v = −0.0 (whose reciprocal is −inf)."""
    zero = g.scalar(0, v)
    return g.op("Or", g.op("Less", v, zero), g.op("Less", g.op("Reciprocal", v), zero))


def _onnx_signed(g, v, negative):
    """|v| with the sign ``negative`` says, a zero's too: |v|·(±1), since ONNX Runtime's Where turns a −0.0 it picks
    into +0.0."""
    sign = g.op("Where", negative, g.scalar(-1, v), g.scalar(1, v))
    return g.op("Mul", g.op("Abs", v), sign, spec=g.outputs[0])


@remainder.onnx
def _(g, x, y):
    x, y = _onnx_operands(g, x, y)
    if x.dtype.kind != "f":
        return g.op("Mod", x, y, fmod=0, spec=g.outputs[0])  # integers: the divisor's sign, as Python
    m, off = _onnx_float_mod(g, x, y)
    r = g.op("Where", off, g.op("Add", m, y), m)
    return _onnx_signed(g, r, _onnx_sign_bit(g, y))  # y's sign, a zero's too (NumPy's)


@floor_divide.onnx
def _(g, x, y):
    x, y = _onnx_operands(g, x, y)
    if x.dtype.kind != "f":  # x − (x mod y) is a multiple of y: ONNX's truncating Div is exact on it
        return g.op("Div", g.op("Sub", x, g.op("Mod", x, y, fmod=0)), y, spec=g.outputs[0])
    # NumPy's float floor division: (x − fmod(x, y)) / y, one less where the remainder moved, rounded to the nearest
    # integer (the quotient is within rounding of one)
    m, off = _onnx_float_mod(g, x, y)
    q = g.op("Div", g.op("Sub", x, m), y)
    q = g.op("Where", off, g.op("Sub", q, g.scalar(1, x)), q)
    low = g.op("Floor", q)
    q = g.op("Where", g.op("Greater", g.op("Sub", q, low), g.scalar(0.5, x)), g.op("Add", low, g.scalar(1, x)), low)
    q = g.op("Where", g.op("Equal", y, g.scalar(0, x)), g.op("Div", x, y), q)  # x/0: ±inf or NaN
    # the sign of x/y, a zero's too (NumPy's)
    return _onnx_signed(g, q, g.op("Xor", _onnx_sign_bit(g, x), _onnx_sign_bit(g, y)))


def _onnx_bitwise(logical: str, bitwise: str):
    def mapping(g, *operands):
        operands = [g.cast(v, g.outputs[0].dtype) for v in operands]
        if g.outputs[0].dtype == D.bool_:
            return g.op(logical, *operands, spec=g.outputs[0])
        if g.opset < 18:
            raise g.unsupported(f"{bitwise} on integers needs opset 18")
        return g.op(bitwise, *operands, spec=g.outputs[0])
    return mapping


bitwise_and.onnx(_onnx_bitwise("And", "BitwiseAnd"))
bitwise_or.onnx(_onnx_bitwise("Or", "BitwiseOr"))
bitwise_not.onnx(_onnx_bitwise("Not", "BitwiseNot"))
