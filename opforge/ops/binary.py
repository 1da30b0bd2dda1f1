"""Binary ops with NumPy broadcasting. The engine sums each gradient back to its input's shape,
so rules here are written as if nothing were broadcast."""

from opforge import ops as F

from ._common import B, D, P, Sample, Spec, _add, _divide, _multiply, _subtract, broadcast_shapes, np, op, promoted


@op("add(Tensor x, Tensor y) -> Tensor out", traits=["broadcast", "pointwise", "commutative"], inplace={"out": "x"})
def add(x, y, out=None):
    """x + y."""
    if x.dtype is not y.dtype:  # NumPy would promote otherwise than PyTorch
        x, y = promoted(x, y)
    return _add(x, y) if out is None else _add(x, y, out=out)


add.scalar("x + y")


def _onnx_binary(onnx_type):
    """The mapping of an arithmetic op: both inputs in the result's dtype (ONNX does not promote), then the node."""

    def mapping(g, x, y):
        dtype = g.outputs[0].dtype
        work = D.int32 if dtype == D.bool_ else dtype  # bool + bool is "or", bool · bool "and": as int, then bool
        return g.cast(g.op(onnx_type, g.cast(x, work), g.cast(y, work), spec=Spec(g.outputs[0].shape, work)), dtype)

    return mapping


add.onnx(_onnx_binary("Add"))


@add.grad
def _(dout):
    return dout, dout


@op("sub(Tensor x, Tensor y) -> Tensor out", traits=["broadcast", "pointwise"], inplace={"out": "x"})
def sub(x, y, out=None):
    """x − y."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return _subtract(x, y) if out is None else _subtract(x, y, out=out)


sub.scalar("x - y")


sub.onnx(_onnx_binary("Sub"))


@sub.grad
def _(dout):
    return dout, F.neg(dout)


def _partial_sbp(x, y):
    """Sums of partial values are partial values of the sum."""
    yield (P, P), P
    yield (P("mean"), P("mean")), P("mean")


add.sbp(_partial_sbp)
sub.sbp(_partial_sbp)


@op("minus(Tensor x, Tensor y) -> Tensor out", traits=["broadcast", "pointwise"])
def minus(x, y):
    """x − y, with the gradient of PaddlePaddle's design example: identity and scale(−1)."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.subtract(x, y)


minus.scalar("x - y")


minus.onnx(_onnx_binary("Sub"))


@minus.grad
def _(dout):
    return F.identity(dout), F.scale(dout, scale=-1.0)


@op("mul(Tensor x, Tensor y) -> Tensor out", traits=["broadcast", "pointwise", "commutative"], inplace={"out": "x"})
def mul(x, y, out=None):
    """x · y."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return _multiply(x, y) if out is None else _multiply(x, y, out=out)


mul.scalar("x * y")


mul.onnx(_onnx_binary("Mul"))


@mul.sbp
def _(x, y):
    # a partial value times a whole one is a partial value of the product (linear in the partial one)
    for reduce in (P, P("mean")):
        yield (reduce, B), reduce
        yield (B, reduce), reduce


@mul.grad
def _(x, y, dout, needs_input_grad):
    # Skipping the unneeded product matters for x * constant, the commonest use.
    return dout * y if needs_input_grad[0] else None, dout * x if needs_input_grad[1] else None


@op("div(Tensor x, Tensor y) -> Tensor out", traits=["broadcast", "pointwise"], inplace={"out": "x"})
def div(x, y, out=None):
    """x / y: true division, as ``torch.div``; integers and bools give the default float dtype, float32."""
    if x.dtype is not y.dtype or x.dtype.kind in "biu":
        dtype = _div_dtype(x, y)
        x, y = x.astype(dtype, copy=False), y.astype(dtype, copy=False)
    return _divide(x, y) if out is None else _divide(x, y, out=out)


div.scalar("x / y")


div.onnx(_onnx_binary("Div"))


def _div_dtype(x, y):
    dtype = D.result_type(x, y)
    return dtype if D.is_floating(dtype) else D.DEFAULT_FLOAT


def _on_gpu(opdef, ufunc_name: str, promote):
    """``opdef``'s kernel on "cuda": CuPy's ufunc called directly, after the CPU kernel's dtype rule (``promote``).
    The CPU kernel would reach it too, through NumPy's override protocol (``np.add`` on CuPy arrays calls
    ``__array_ufunc__``), which costs about a microsecond of the ten an eager add of a few elements takes on a GPU."""

    @opdef.kernel(device="cuda")
    def kernel(x, y, out=None, xp=None):
        if x.dtype is not y.dtype or (promote is _div_dtype and x.dtype.kind in "biu"):
            dtype = promote(x, y)
            x, y = x.astype(dtype, copy=False), y.astype(dtype, copy=False)
        ufunc = getattr(xp, ufunc_name)
        return ufunc(x, y) if out is None else ufunc(x, y, out=out)  # (CuPy parses keywords slowly)


@div.infer
def _(x, y):
    return Spec(broadcast_shapes(x.shape, y.shape, op="div"), _div_dtype(x, y))


@div.grad
def _(y, out, dout):
    return dout / y, -dout * out / y


@div.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.uniform(0.5, 2.0, (2, 3)))
    yield Sample.of(rng.standard_normal((2, 3)), rng.uniform(-2.0, -0.5, (3,)))
    yield Sample.of(rng.standard_normal(()), rng.uniform(0.5, 2.0, (2, 1)))


@op("pow(Tensor x, Tensor y) -> Tensor out", traits=["broadcast", "pointwise"])
def pow(x, y):
    """xʸ."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.power(x, y)




pow.onnx(_onnx_binary("Pow"))


@pow.grad
def _(x, y, out, dout, needs_input_grad):
    # d/dx xʸ = y·xʸ⁻¹; 0 where y = 0 (xʸ is constant there, even at x = 0 where xʸ⁻¹ is inf), as PyTorch.
    dx = F.where(y == 0, 0, dout * y * F.pow(x, y - 1)) if needs_input_grad[0] else None
    dy = None
    if needs_input_grad[1]:
        # d/dy xʸ = xʸ·ln x; 0 where x = 0 (as PyTorch), NaN where x < 0.
        base = x if x.dtype.kind == "f" else F.cast(x, dtype=out.dtype)  # an int or bool base: ln in floats
        dy = F.where(x == 0, 0, dout * out * F.log(F.where(x == 0, 1, base)))
    return dx, dy


@pow.samples
def _(rng):
    yield Sample.of(rng.uniform(0.5, 2.0, (2, 3)), rng.uniform(-2.0, 2.0, (2, 3)))
    yield Sample.of(rng.uniform(0.5, 2.0, (3,)), rng.uniform(-2.0, 2.0, ()))
    yield Sample.of(rng.uniform(0.5, 2.0, (2, 3)), np.array(2.0))


@op("maximum(Tensor x, Tensor y) -> Tensor out", traits=["broadcast", "pointwise"])
def maximum(x, y):
    """The larger of x and y, elementwise."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.maximum(x, y)


maximum.scalar("maximum(x, y)")


maximum.onnx(_onnx_binary("Max"))


def _winner_grads(x, y, dout, x_loses, y_loses):
    """Gradients of maximum/minimum: dout goes to the winner, ties share it equally (as in PyTorch, which
    also gives all of it to both sides where a NaN makes neither lose)."""
    shared = F.where(x == y, dout * 0.5, dout)
    return F.where(x_loses, 0, shared), F.where(y_loses, 0, shared)


@maximum.grad
def _(x, y, dout):
    return _winner_grads(x, y, dout, x < y, y < x)


@op("minimum(Tensor x, Tensor y) -> Tensor out", traits=["broadcast", "pointwise"])
def minimum(x, y):
    """The smaller of x and y, elementwise."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.minimum(x, y)


minimum.scalar("minimum(x, y)")


minimum.onnx(_onnx_binary("Min"))


@minimum.grad
def _(x, y, dout):
    return _winner_grads(x, y, dout, x > y, y > x)


@maximum.samples
@minimum.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal(3))
    # Ties (x == y) are tested against PyTorch in tests/: the derivative jumps there, so central
    # differences of the second order would not mean anything.


def _where_spec(condition, x, y):
    return Spec(broadcast_shapes(condition.shape, x.shape, y.shape, op="where"), D.result_type(x, y))


@op("where(nograd Tensor<bool> condition, Tensor x, Tensor y) -> Tensor out", infer=_where_spec, traits=["pointwise"])
def where(condition, x, y):
    """x where condition holds, else y."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    out = np.where(condition, x, y)
    return out if out.dtype == x.dtype else out.astype(x.dtype)  # CuPy's where makes bfloat16 float32 (exact back)


where.scalar("x if condition else y")


@where.onnx
def _(g, condition, x, y):
    dtype = g.outputs[0].dtype
    return g.op("Where", condition, g.cast(x, dtype), g.cast(y, dtype), spec=g.outputs[0])


@where.grad
def _(condition, dout):
    return None, F.where(condition, dout, 0), F.where(condition, 0, dout)


@where.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)) > 0, rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))
    yield Sample.of(rng.standard_normal(3) > 0, rng.standard_normal((2, 3)), rng.standard_normal(()))


# -- comparisons: bool results, no gradient ----------------------------------------------------------------


def _compare_spec(name: str):
    """The shape rule of comparison or logical op ``name``: its inputs broadcast, the result is bool."""
    return lambda x, y: Spec(broadcast_shapes(x.shape, y.shape, op=name), D.bool_)


def _compare_samples(rng):
    x = rng.standard_normal((2, 3))
    yield Sample.of(x, np.where(rng.standard_normal((2, 3)) > 0, x, rng.standard_normal((2, 3))))
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal(3))


@op("less(Tensor x, Tensor y) -> Tensor<bool> out", traits=["no_grad", "pointwise"], infer=_compare_spec("less"))
def less(x, y):
    """x < y."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.less(x, y)


less.scalar("x < y")


@op("less_equal(Tensor x, Tensor y) -> Tensor<bool> out",
    traits=["no_grad", "pointwise"], infer=_compare_spec("less_equal"))
def less_equal(x, y):
    """x ≤ y."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.less_equal(x, y)


less_equal.scalar("x <= y")


@op("greater(Tensor x, Tensor y) -> Tensor<bool> out", traits=["no_grad", "pointwise"], infer=_compare_spec("greater"))
def greater(x, y):
    """x > y."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.greater(x, y)


greater.scalar("x > y")


@op("greater_equal(Tensor x, Tensor y) -> Tensor<bool> out",
    traits=["no_grad", "pointwise"], infer=_compare_spec("greater_equal"))
def greater_equal(x, y):
    """x ≥ y."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.greater_equal(x, y)


greater_equal.scalar("x >= y")


@op("equal(Tensor x, Tensor y) -> Tensor<bool> out", traits=["no_grad", "pointwise"], infer=_compare_spec("equal"))
def equal(x, y):
    """x == y."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.equal(x, y)


equal.scalar("x == y")


@op("not_equal(Tensor x, Tensor y) -> Tensor<bool> out",
    traits=["no_grad", "pointwise"], infer=_compare_spec("not_equal"))
def not_equal(x, y):
    """x ≠ y."""
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.not_equal(x, y)


not_equal.scalar("x != y")


def _onnx_compare(onnx_type, negate=False):
    def mapping(g, x, y):
        dtype = D.result_type(x, y)  # what the kernel compares in
        if dtype == D.bool_ and onnx_type != "Equal":
            dtype = D.int32  # ONNX orders numbers only
        out = g.op(onnx_type, g.cast(x, dtype), g.cast(y, dtype), spec=g.outputs[0])
        return g.op("Not", out) if negate else out

    return mapping


for _compare, _onnx_type in ((less, "Less"), (less_equal, "LessOrEqual"), (greater, "Greater"),
                             (greater_equal, "GreaterOrEqual"), (equal, "Equal")):
    _compare.onnx(_onnx_compare(_onnx_type))
not_equal.onnx(_onnx_compare("Equal", negate=True))


for _compare in (less, less_equal, greater, greater_equal, equal, not_equal):
    _compare.samples(_compare_samples)


# -- logical ops: bool results, no gradient -------------------------------------------------------------------


@op("logical_and(Tensor x, Tensor y) -> Tensor<bool> out",
    traits=["no_grad", "pointwise"], infer=_compare_spec("logical_and"))
def logical_and(x, y):
    """True where both x and y are nonzero (True)."""
    return np.logical_and(x, y)


logical_and.scalar("x != 0 and y != 0")


@op("logical_or(Tensor x, Tensor y) -> Tensor<bool> out",
    traits=["no_grad", "pointwise"], infer=_compare_spec("logical_or"))
def logical_or(x, y):
    """True where x or y is nonzero (True)."""
    return np.logical_or(x, y)


logical_or.scalar("x != 0 or y != 0")


logical_and.onnx(lambda g, x, y: g.op("And", g.cast(x, D.bool_), g.cast(y, D.bool_), spec=g.outputs[0]))
logical_or.onnx(lambda g, x, y: g.op("Or", g.cast(x, D.bool_), g.cast(y, D.bool_), spec=g.outputs[0]))


@logical_and.samples
@logical_or.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)) > 0, rng.standard_normal((2, 3)) > 0)
    yield Sample.of(rng.standard_normal((2, 3)) > 0, rng.standard_normal(3) > 0)
    yield Sample.of(rng.integers(-1, 2, (4, 1)), rng.standard_normal((1, 3)).round())  # numbers: nonzero is True
    yield Sample.of(np.array(True), rng.standard_normal((2, 1)) > 0)


for _opdef, _ufunc, _promote in ((add, "add", D.result_type), (sub, "subtract", D.result_type),
                                 (mul, "multiply", D.result_type), (div, "true_divide", _div_dtype)):
    _on_gpu(_opdef, _ufunc, _promote)
