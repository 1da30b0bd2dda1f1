"""Special functions, as torch's: erfc, erfinv, lgamma, digamma, polygamma, the modified Bessel functions i0 and
i1 (torch.special.i1, the op ``special_i1``). SciPy computes them, except where torch's own algorithm gives other
values at the edges (lgamma(−inf), erfinv(−0), trigamma at the poles, polygamma(n ≥ 2, +inf)): there the kernels
follow torch. Each gradient is the next function of its family, so every order exists: lgamma → digamma →
polygamma(1) → polygamma(2) ..., i0 → i1 → i0 and i1.
"""

import math

from opforge import ops as F

from ._common import D, Sample, np, op


def _scipy():
    from scipy import special  # imported on first use: SciPy takes a noticeable time to import

    return special


def _positive(rng):
    yield Sample.of(rng.uniform(0.5, 3.0, (2, 3)))
    yield Sample.of(rng.uniform(0.5, 3.0, ()))


@op("erfc(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def erfc(x):
    """The complementary error function, 1 − erf(x), without its cancellation for large x."""
    return _scipy().erfc(x)


@erfc.grad
def _(x, dy):
    return dy * (-2 / math.sqrt(math.pi)) * F.exp(-(x * x))


@op("erfinv(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def erfinv(x):
    """The inverse of erf on (−1, 1): ±inf at ±1, NaN beyond; −0 stays −0 (as torch)."""
    return np.where(x == 0, x, _scipy().erfinv(x))


@erfinv.grad
def _(y, dy):
    return dy * (math.sqrt(math.pi) / 2) * F.exp(y * y)


@erfinv.samples
def _(rng):
    yield Sample.of(rng.uniform(-0.9, 0.9, (2, 3)))
    yield Sample.of(rng.uniform(-0.9, 0.9, ()))


@op("lgamma(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def lgamma(x):
    """ln |Γ(x)|: +inf at 0, at the negative integers and at ±inf (as torch; SciPy's gammaln(−inf) is −inf)."""
    return np.where(x == -np.inf, np.inf, _scipy().gammaln(x)).astype(x.dtype)


@lgamma.grad
def _(x, dy):
    return dy * F.digamma(x)


@op("digamma(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def digamma(x):
    """ψ(x) = d/dx ln Γ(x): ∓inf at ±0, NaN at the negative integers (as torch)."""
    return _scipy().digamma(x)


@digamma.grad
def _(x, dy):
    return dy * F.polygamma(1, x)


for _fn in (lgamma, digamma):
    _fn.samples(_positive)


def _trigamma(x):
    """torch's trigamma (calc_trigamma): the reflection below ½, six steps up, then the asymptotic series; it also
    gives torch's large finite values at the poles (the negative integers), where sin(πx) is not quite 0. In x's
    dtype, as torch computes it (near a pole float32 and float64 differ in the fifth digit)."""
    low = x < 0.5
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        result = np.where(low, -(math.pi * math.pi) / np.square(np.sin(math.pi * x)), 0.0)
        x = np.where(low, 1 - x, x)
        for _ in range(6):
            result = result + 1 / (x * x)
            x = x + 1
        ixx = 1 / (x * x)
        result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
        return np.where(low, -result, result)


@op("polygamma(int n, Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def polygamma(x, *, n):
    """ψ⁽ⁿ⁾(x), the n-th derivative of digamma (``torch.polygamma(n, input)``: n first). n = 0 is digamma, n = 1
    torch's trigamma, and n ≥ 2 (−1)ⁿ⁺¹·n!·ζ(n + 1, x), NaN at +inf as torch's Hurwitz zeta gives it."""
    return _polygamma(x, n, _scipy().zeta)


def _polygamma(x, n, zeta):
    if n == 0:
        return _scipy().digamma(x)
    if n == 1:
        return _trigamma(x)
    with np.errstate(over="ignore", invalid="ignore"):
        y = (1 if n % 2 else -1) * math.exp(math.lgamma(n + 1)) * zeta(n + 1, x)
    return np.where(x == np.inf, np.nan, y).astype(x.dtype)


@polygamma.kernel(device="cuda")
def _(x, *, n):
    """CuPy's Hurwitz zeta, called by name: NumPy's dispatch hands SciPy's ``zeta`` (its ufunc ``_zeta``) to
    ``cupyx.scipy.special._zeta``, which is a module there (seen on CuPy 14.2)."""
    from cupyx.scipy import special

    wide = x.astype(D.float32) if x.dtype in D.HALF else x  # halves in float32, rounded once (ops/half.py)
    return _polygamma(wide, n, special.zeta).astype(x.dtype, copy=False)


@polygamma.check
def _(*, n):
    if n < 0:
        raise ValueError(f"argument 'n' must be >= 0, got {n}")


@polygamma.grad
def _(x, dy, *, n):
    return dy * F.polygamma(n + 1, x)


@polygamma.samples
def _(rng):
    yield Sample.of(rng.uniform(0.5, 3.0, (2, 3)), n=1)
    yield Sample.of(rng.uniform(-2.7, -2.3, (4,)), n=2)  # between the poles
    yield Sample.of(rng.uniform(0.5, 3.0, ()), n=0)
    yield Sample.of(rng.uniform(0.5, 3.0, (3,)), n=3)


@op("i0(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def i0(x):
    """The modified Bessel function of the first kind, of order 0."""
    return _scipy().i0(x)


@i0.grad
def _(x, dy):
    return dy * F.special_i1(x)


@op("special_i1(Tensor<floating> x) -> Tensor y", traits=["elementwise", "pointwise"])
def special_i1(x):
    """The modified Bessel function of the first kind, of order 1 (``torch.special.i1``)."""
    return _scipy().i1(x)


@special_i1.grad
def _(x, y, dy):
    # torch's: i0(x) − i1(x)/x, and ½ at |x| ≤ eps, where the quotient would be 0/0 (NaN at NaN, unlike torch's ½)
    eps = D.EPS[x.dtype]
    not_tiny = F.logical_not(F.abs(x) <= eps)
    safe = F.where(not_tiny, x, eps)
    return dy * F.where(not_tiny, F.i0(safe) - y / safe, 0.5)
