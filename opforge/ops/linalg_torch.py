"""torch's linear algebra beyond ``linalg.py``'s: the products (addmm, addmv, baddbmm, inner, tensordot, kron,
multi_dot, block_diag, cdist, cross), the symmetric eigendecomposition (eigh, eigvalsh), slogdet and logdet,
triangular and Cholesky solves, matrix_power and matrix_exp, pinv, matrix_rank and lstsq.

Each means what its torch namesake means. Most are functions written with the ops of ``linalg.py`` and the shape
ops, so their gradients (and second derivatives) are those ops' own; eigh, slogdet and matrix_exp are ops whose
gradient rules are torch's formulas written with ops. ``of.linalg`` gives the ``torch.linalg`` ones their short
names.
"""

import string
from collections import namedtuple

from opforge import ops as F

from ..core.errors import ArgumentError, describe
from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, function, normalize_axes, np, op
from .linalg import _lapack, _positive_definite, _square, _swap_last, _well_conditioned

# -- products -------------------------------------------------------------------------------------------------------


def _scaled_sum(name, input, product, beta, alpha):
    """beta·input + alpha·product, as torch's addmm family: input is ignored (NaN included) when beta is 0, and an
    integer result refuses a float beta or alpha (torch's rule: no silent float result)."""
    for scale, what in ((beta, "beta"), (alpha, "alpha")):
        if not D.is_floating(product.dtype) and isinstance(scale, float):
            raise ArgumentError(f"{name}(): argument '{what}' must not be a float for integer tensors, got {scale}")
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return F.broadcast_to(F.zeros_like(input), shape=product.shape) + product
    return (input if beta == 1 else input * beta) + product


def _matrices(name, *tensors, rank=2):
    for t in tensors:
        if len(t.shape) != rank:
            raise ShapeError(f"{name}(): expects {rank}-D tensors, got shapes {[tuple(x.shape) for x in tensors]}")


@function
def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """``torch.addmm``: ``beta·input + alpha·(mat1 @ mat2)`` for matrices mat1 and mat2, input broadcasting to the
    product's shape (ignored when beta is 0)."""
    _matrices("addmm", mat1, mat2)
    return _scaled_sum("addmm", input, F.matmul(mat1, mat2), beta, alpha)


@function
def addmv(input, mat, vec, *, beta=1, alpha=1):
    """``torch.addmv``: ``beta·input + alpha·(mat @ vec)`` for a matrix and a vector."""
    _matrices("addmv", mat)
    _matrices("addmv", vec, rank=1)
    return _scaled_sum("addmv", input, F.matmul(mat, vec), beta, alpha)


@function
def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """``torch.baddbmm``: ``beta·input + alpha·bmm(batch1, batch2)``."""
    return _scaled_sum("baddbmm", input, F.bmm(batch1, batch2), beta, alpha)


@function
def tensordot(a, b, dims=2):
    """``torch.tensordot``: the sum of products over ``dims`` dims, the last ``dims`` of a with the first ``dims``
    of b (an int), or over the dims of a and b two lists name (``([1, 0], [0, 1])``)."""
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        if not 0 <= dims <= min(len(a.shape), len(b.shape)):
            raise ArgumentError(f"tensordot(): argument 'dims' must be in [0, {min(len(a.shape), len(b.shape))}], "
                                f"got {dims}")
        dims_a, dims_b = list(range(len(a.shape) - dims, len(a.shape))), list(range(dims))
    elif isinstance(dims, (list, tuple)) and len(dims) == 2:
        dims_a, dims_b = ([d] if isinstance(d, int) else list(d) for d in dims)
    else:
        raise ArgumentError(f"tensordot(): argument 'dims' must be an int or two lists of dims, got {describe(dims)}")
    if len(dims_a) != len(dims_b):
        raise ArgumentError(f"tensordot(): dims {dims_a} of a and {dims_b} of b must be as many")
    dims_a = [normalize_axes("tensordot", [d], len(a.shape))[0] for d in dims_a]
    dims_b = [normalize_axes("tensordot", [d], len(b.shape))[0] for d in dims_b]
    letters = iter(string.ascii_letters)
    term_a = [next(letters) for _ in a.shape]
    term_b = [next(letters) for _ in b.shape]
    for da, db in zip(dims_a, dims_b):
        term_b[db] = term_a[da]
    out = [c for i, c in enumerate(term_a) if i not in dims_a] + [c for i, c in enumerate(term_b) if i not in dims_b]
    return F.einsum([a, b], equation=f"{''.join(term_a)},{''.join(term_b)}->{''.join(out)}")


@function
def inner(input, other):
    """``torch.inner``: the sum of products over the last dims (a 0-d operand multiplies)."""
    if not input.shape or not other.shape:
        return input * other
    return tensordot(input, other, ([-1], [-1]))


@function
def kron(input, other):
    """``torch.kron``: the Kronecker product; the operand of lower rank gets leading dims of size 1."""
    rank = max(len(input.shape), len(other.shape))
    a = F.reshape(input, shape=[1] * (rank - len(input.shape)) + list(input.shape))
    b = F.reshape(other, shape=[1] * (rank - len(other.shape)) + list(other.shape))
    spread_a = [d for n in a.shape for d in (n, 1)]  # a's dims interleaved with b's
    spread_b = [d for n in b.shape for d in (1, n)]
    product = F.reshape(a, shape=spread_a) * F.reshape(b, shape=spread_b)
    return F.reshape(product, shape=[m * n for m, n in zip(a.shape, b.shape)])


@function
def multi_dot(tensors):
    """``torch.linalg.multi_dot``: the product of matrices (the first may be a row vector and the last a column
    vector, 1-D), left to right."""
    if len(tensors) < 2:
        raise ArgumentError(f"multi_dot(): expects at least two tensors, got {len(tensors)}")
    ranks = [len(t.shape) for t in tensors]
    if ranks[0] not in (1, 2) or ranks[-1] not in (1, 2) or any(r != 2 for r in ranks[1:-1]):
        raise ShapeError(f"multi_dot(): expects matrices, the first and last may be vectors, got shapes "
                         f"{[tuple(t.shape) for t in tensors]}")
    result = tensors[0]
    for t in tensors[1:]:
        result = F.matmul(result, t)
    return result


@function
def block_diag(*tensors):
    """``torch.block_diag``: the matrices (0-d as 1×1, 1-D as one row) along the diagonal of one matrix, zeros
    elsewhere, in their result dtype."""
    blocks = []
    for t in tensors:
        if len(t.shape) > 2:
            raise ShapeError(f"block_diag(): expects tensors of at most 2 dims, got shape {tuple(t.shape)}")
        blocks.append(F.reshape(t, shape=[1, 1] if not t.shape else [1, t.shape[0]]) if len(t.shape) < 2 else t)
    if not blocks:
        return F.zeros(shape=[1, 0])
    dtype = blocks[0].dtype
    for b in blocks[1:]:
        dtype = D.promote(dtype, b.dtype)
    width = sum(b.shape[1] for b in blocks)
    rows, left = [], 0
    for b in blocks:
        b = F.cast(b, dtype=dtype) if b.dtype != dtype else b
        rows.append(F.pad(b, pad=[left, width - left - b.shape[1]]))
        left += b.shape[1]
    return F.concat(rows, axis=0)


_CDIST_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")


@function
def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """``torch.cdist``: the p-norm distance between each row of x1 (..., P, M) and each row of x2 (..., R, M),
    (..., P, R); batch dims broadcast. Computed from the differences whatever ``compute_mode`` says (torch's
    matrix-product route for p = 2 is faster and less exact); the gradient is 0 where a distance is 0."""
    if compute_mode not in _CDIST_MODES:
        raise ArgumentError(f"cdist(): argument 'compute_mode' must be one of {', '.join(_CDIST_MODES)}, got "
                            f"{compute_mode!r}")
    if p < 0:
        raise ArgumentError(f"cdist(): argument 'p' must be >= 0, got {p}")
    if len(x1.shape) < 2 or len(x2.shape) < 2 or x1.shape[-1] != x2.shape[-1]:
        raise ShapeError(f"cdist(): expects x1 (..., P, M) and x2 (..., R, M), got shapes {tuple(x1.shape)} and "
                         f"{tuple(x2.shape)}")
    return F.norm(F.unsqueeze(x1, axis=-2) - F.unsqueeze(x2, axis=-3), float(p), axis=[-1])


@function
def pdist(input, p=2.0):
    """``torch.nn.functional.pdist``: the p-norm distance between each pair of rows i < j of ``input`` (N, M), in
    the order (0, 1), (0, 2), ..., (1, 2), ...: N·(N − 1)/2 values (``cdist``'s upper triangle)."""
    if len(input.shape) != 2:
        raise ShapeError(f"pdist(): expects a 2-D input (N, M), got shape {tuple(input.shape)}")
    if p < 0:
        raise ArgumentError(f"pdist(): argument 'p' must be >= 0, got {p}")
    n = input.shape[0]
    rows = F.arange(start=0, stop=n, step=1, dtype="int64")
    above = F.greater(F.unsqueeze(rows, axis=0), F.unsqueeze(rows, axis=1))  # column > row: i < j
    return F.masked_select(cdist(input, input, p), above)


@function
def cross(input, other, dim=None):
    """``torch.cross``: the cross product of 3-vectors along ``dim`` (by default the first dim of size 3, as torch
    reads it); the shapes broadcast."""
    if dim is None:
        shape = np.broadcast_shapes(tuple(input.shape), tuple(other.shape))
        if 3 not in shape:
            raise ShapeError(f"cross(): no dim of size 3 in shape {shape}")
        dim = shape.index(3)
    return linalg_cross(input, other, dim=dim)


@function
def linalg_cross(input, other, *, dim=-1):
    """``torch.linalg.cross``: the cross product of 3-vectors along ``dim``; the shapes broadcast."""
    shape = np.broadcast_shapes(tuple(input.shape), tuple(other.shape))
    d = normalize_axes("linalg_cross", [dim], len(shape))[0]
    if shape[d] != 3:
        raise ShapeError(f"linalg_cross(): dim {dim} must have size 3, got shapes {tuple(input.shape)} and "
                         f"{tuple(other.shape)}")
    a, b = F.broadcast_to(input, shape=list(shape)), F.broadcast_to(other, shape=list(shape))
    # (a × b)ᵢ = a₍ᵢ₊₁₎·b₍ᵢ₊₂₎ − a₍ᵢ₊₂₎·b₍ᵢ₊₁₎, indices mod 3: the vectors rolled back by one and by two
    return (F.roll(a, [-1], [d]) * F.roll(b, [-2], [d])) - (F.roll(a, [-2], [d]) * F.roll(b, [-1], [d]))


# -- eigh, eigvalsh -------------------------------------------------------------------------------------------------


_UPLO = ("L", "U")


@op('linalg_eigh(Tensor<floating> a, str UPLO="L") -> (Tensor eigenvalues, Tensor eigenvectors)')
def linalg_eigh(a, *, UPLO):
    """``torch.linalg.eigh``: the eigenvalues (ascending) and orthonormal eigenvectors (columns) of a symmetric
    matrix. a is read through its symmetric part (a + aᵀ)/2, as ``linalg_cholesky`` reads it (torch reads the
    triangle ``UPLO`` names): the same for a symmetric a, values and gradients (torch's formula), and the gradient
    is then the derivative for any a. Each eigenvector's sign makes its largest entry positive (torch's is
    LAPACK's choice); the gradient exists where the eigenvalues are distinct."""
    _square("linalg_eigh", a.shape)
    if not np.isfinite(a).all():
        raise ArgumentError("linalg_eigh(): a holds inf or NaN")
    values, vectors = _lapack("linalg_eigh", "the eigendecomposition did not converge", np.linalg.eigh,
                              (a + np.swapaxes(a, -1, -2)) / 2)
    # each eigenvector's sign made its largest entry's, so that every dtype and LAPACK build gives the same one
    if vectors.size:
        largest = np.take_along_axis(vectors, np.argmax(np.abs(vectors), axis=-2)[..., None, :], -2)
        vectors = vectors * np.where(largest < 0, -1, 1).astype(vectors.dtype)
    return values, vectors


@linalg_eigh.check
def _(*, UPLO):
    if UPLO not in _UPLO:
        raise ValueError(f"argument 'UPLO' must be 'L' or 'U', got {UPLO!r}")


@linalg_eigh.infer
def _(a, *, UPLO):
    _square("linalg_eigh", a.shape)
    return Spec(a.shape[:-1], a.dtype), Spec(a.shape, a.dtype)


@linalg_eigh.grad
def _(eigenvalues, eigenvectors, deigenvalues, deigenvectors):
    # torch's linalg_eig_backward for a symmetric a: with V the eigenvectors and L the eigenvalues,
    # da = V·(skew(Vᵀ·dV)/E + diag(dL))·Vᵀ, skew(X) = (X − Xᵀ)/2 and E_ij = L_j − L_i (the diagonal replaced).
    v, n = eigenvectors, eigenvectors.shape[-1]
    eye = F.eye(n=n, dtype=v.dtype) > 0
    vtdv = F.matmul(_swap_last(v), deigenvectors)
    gap = F.unsqueeze(eigenvalues, axis=-2) - F.unsqueeze(eigenvalues, axis=-1)
    inner_part = F.where(eye, F.unsqueeze(deigenvalues, axis=-1), (vtdv - _swap_last(vtdv)) * 0.5
                         / F.where(eye, 1, gap))
    return F.matmul(F.matmul(v, inner_part), _swap_last(v))


@linalg_eigh.samples
def _(rng):
    yield Sample.of(_positive_definite(rng, 3, 3))
    yield Sample.of(_positive_definite(rng, 2, 4, 4), UPLO="U")
    yield Sample.of(_positive_definite(rng, 3, 3) + np.triu(rng.standard_normal((3, 3)), 1) * 0.3)  # not symmetric


@function
def linalg_eigvalsh(a, UPLO="L"):
    """``torch.linalg.eigvalsh``: the eigenvalues of a symmetric matrix, ascending (``linalg_eigh``'s first)."""
    return F.linalg_eigh(a, UPLO).eigenvalues


# -- determinants ---------------------------------------------------------------------------------------------------


@op("linalg_slogdet(Tensor<floating> a) -> (Tensor sign, Tensor logabsdet)")
def linalg_slogdet(a):
    """``torch.linalg.slogdet``: the sign of the determinant (−1, 0 or 1) and ln |det|, without det's overflow."""
    _square("linalg_slogdet", a.shape)
    sign, logabsdet = np.linalg.slogdet(a)
    return sign.astype(a.dtype), logabsdet.astype(a.dtype)


@linalg_slogdet.infer
def _(a):
    _square("linalg_slogdet", a.shape)
    return Spec(a.shape[:-2], a.dtype), Spec(a.shape[:-2], a.dtype)


@linalg_slogdet.grad
def _(a, dlogabsdet):
    # d ln|det a| = tr(a⁻¹·da): the gradient a⁻ᵀ, scaled (the sign is piecewise constant)
    return _swap_last(F.linalg_inv(a)) * F.unsqueeze(F.unsqueeze(dlogabsdet, axis=-1), axis=-1)


@linalg_slogdet.samples
def _(rng):
    yield Sample.of(_well_conditioned(rng, 3, 3))
    yield Sample.of(-_well_conditioned(rng, 2, 3, 3))  # negative determinants


_SLOGDET = namedtuple("slogdet", ("sign", "logabsdet"))


@function
def slogdet(input):
    """``torch.slogdet`` (``torch.linalg.slogdet``): the named tuple ``(sign, logabsdet)``."""
    return _SLOGDET(*F.linalg_slogdet(input))


@function
def logdet(input):
    """``torch.logdet``: ln det: NaN for a negative determinant, −inf for 0 (as torch)."""
    sign, logabsdet = F.linalg_slogdet(input)
    return F.where(sign < 0, float("nan"), logabsdet)


# -- solves ---------------------------------------------------------------------------------------------------------


def _triangle(a, upper, unitriangular):
    t = F.triu(a) if upper else F.tril(a)
    if unitriangular:
        t = F.where(F.eye(n=a.shape[-1], dtype=a.dtype) > 0, 1, t)
    return t


@function
def linalg_solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    """``torch.linalg.solve_triangular``: X with A·X = B (``left=False``: X·A = B) for A upper (``upper``) or lower
    triangular, its other triangle not read (nor its diagonal, taken as ones, when ``unitriangular``). The
    gradient with respect to A lies in that triangle. A zero on the diagonal is an error (torch gives inf)."""
    if len(B.shape) < 2:
        raise ShapeError(f"linalg_solve_triangular(): B must be a matrix or a batch of them, got shape "
                         f"{tuple(B.shape)}")
    return F.linalg_solve(_triangle(A, upper, unitriangular), B, left=left)


@op("cholesky_solve(Tensor<floating> b, Tensor<floating> l, bool upper=False) -> Tensor x")
def cholesky_solve(b, l, *, upper):
    """``torch.cholesky_solve(B, L, upper=False)``: X with A·X = B for A = L·Lᵀ (``upper``: A = Uᵀ·U), given the
    Cholesky factor; batch dims broadcast. A is formed from the whole of l (torch reads one triangle only): the
    same for a triangular factor, values and gradients (torch's formula), and the gradient is then the derivative
    for any l."""
    spec = _cholesky_solve_spec(b.shape, l.shape)
    lower = np.swapaxes(l, -1, -2) if upper else l
    a = np.broadcast_to(lower @ np.swapaxes(lower, -1, -2), (*spec[:-2], *l.shape[-2:]))  # CuPy's solve: same batch
    return _lapack("cholesky_solve", "the factor is singular", np.linalg.solve, a,
                   np.broadcast_to(b, spec)).astype(D.promote(b.dtype, l.dtype), copy=False)


def _cholesky_solve_spec(b_shape, l_shape):
    n = _square("cholesky_solve", l_shape, "l")
    if len(b_shape) < 2 or (n is not None and b_shape[-2] is not None and b_shape[-2] != n):
        raise ShapeError(f"cholesky_solve(): b must be (..., {n}, k) for a factor of shape {tuple(l_shape)}, got "
                         f"shape {tuple(b_shape)}")
    return (*broadcast_shapes(b_shape[:-2], l_shape[:-2], op="cholesky_solve"), *b_shape[-2:])


@cholesky_solve.infer
def _(b, l, *, upper):
    return Spec(_cholesky_solve_spec(b.shape, l.shape), D.promote(b.dtype, l.dtype))


@cholesky_solve.grad
def _(l, x, dx, *, upper):
    # torch's cholesky_solve_backward: db = A⁻¹·dx, dl = −(C + Cᵀ)·l (upper: −u·(C + Cᵀ)) with C = db·xᵀ
    db = F.cholesky_solve(dx, l, upper)
    common = F.matmul(db, _swap_last(x))
    common = common + _swap_last(common)
    return db, -(F.matmul(l, common) if upper else F.matmul(common, l))


@cholesky_solve.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 2)), np.linalg.cholesky(_positive_definite(rng, 3, 3)))
    yield Sample.of(rng.standard_normal((2, 3, 1)), np.swapaxes(np.linalg.cholesky(_positive_definite(rng, 3, 3)),
                                                                -1, -2), upper=True)


# -- matrix functions -----------------------------------------------------------------------------------------------


@function
def linalg_matrix_power(A, n):
    """``torch.linalg.matrix_power``: A multiplied by itself n times (the identity for n = 0; the inverse's power
    for n < 0), by repeated squaring."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise ArgumentError(f"linalg_matrix_power(): argument 'n' must be an int, got {describe(n)}")
    size = _square("linalg_matrix_power", A.shape)
    if n == 0:
        return F.broadcast_to(F.eye(n=size, dtype=A.dtype), shape=list(A.shape)) + A * 0
    if n < 0:
        A, n = F.linalg_inv(A), -n
    result, power = None, A
    while n:
        if n & 1:
            result = power if result is None else F.matmul(result, power)
        n >>= 1
        if n:
            power = F.matmul(power, power)
    return result


@op("linalg_matrix_exp(Tensor<floating> a) -> Tensor y")
def linalg_matrix_exp(a, xp=np):
    """``torch.linalg.matrix_exp``: e^a = Σ aᵏ/k! of a square matrix (a Padé approximation, in float64): SciPy's
    expm on the CPU, scaling and squaring in xp on other devices — equal within rounding (normwise 1e-12 of the
    largest entry), but for a matrix holding NaN or inf, whose every entry is NaN there (as torch's) where SciPy
    may keep a triangular matrix's zeros."""
    _square("linalg_matrix_exp", a.shape)
    if not a.size:
        return a.copy()
    # Higham's scaling and squaring (2005) with the degree-13 Padé approximant, as torch's: each matrix scaled by
    # 2⁻ˢ to a 1-norm within θ₁₃, e^(a/2ˢ) from one solve, squared s times (s per matrix; the largest read once)
    x = a.astype(np.float64)  # in float64 for every dtype, as the CPU's (SciPy's float32 is off by 1e-6)
    norm = xp.abs(x).sum(axis=-2).max(axis=-1)
    s = xp.ceil(xp.log2(xp.where(norm > 0, norm, 1.0) / _THETA_13))
    s = xp.where(xp.isfinite(s), xp.maximum(s, 0.0), 0.0)  # NaN or inf entries: their NaN result, unscaled
    x = x / (2.0 ** s)[..., None, None]
    b = _PADE_13
    eye = xp.eye(a.shape[-1])
    x2 = x @ x
    x4 = x2 @ x2
    x6 = x4 @ x2
    u = x @ (x6 @ (b[13] * x6 + b[11] * x4 + b[9] * x2) + b[7] * x6 + b[5] * x4 + b[3] * x2 + b[1] * eye)
    v = x6 @ (b[12] * x6 + b[10] * x4 + b[8] * x2) + b[6] * x6 + b[4] * x4 + b[2] * x2 + b[0] * eye
    y = xp.linalg.solve(v - u, v + u)
    for i in range(int(s.max())):
        y = xp.where((s > i)[..., None, None], y @ y, y)
    return y.astype(a.dtype, copy=False)


_THETA_13 = 5.371920351148152  # the largest 1-norm for which the degree-13 approximant is exact in float64
_PADE_13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0, 129060195264000.0,
            10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0,
            1.0)


@linalg_matrix_exp.kernel(device="cpu")
def _(a):
    # SciPy's expm (Al-Mohy and Higham's, which picks a lower degree for small norms), faster on the host
    _square("linalg_matrix_exp", a.shape)
    from scipy.linalg import expm  # imported on first use: SciPy takes a noticeable time to import

    return expm(a.astype(np.float64)).astype(a.dtype) if a.size else a.copy()


@linalg_matrix_exp.infer
def _(a):
    _square("linalg_matrix_exp", a.shape)
    return Spec(a.shape, a.dtype)


@linalg_matrix_exp.grad
def _(a, dy):
    # torch's (and Mathias's): the derivative of e^a in direction G is the top-right block of
    # exp([[a, G], [0, a]]); the gradient is that with aᵀ and dy.
    at, zeros = _swap_last(a), F.zeros_like(a)
    n = a.shape[-1]
    big = F.concat([F.concat([at, dy], axis=-1), F.concat([zeros, at], axis=-1)], axis=-2)
    ndim = len(a.shape)
    return F.slice(F.linalg_matrix_exp(big), axes=[ndim - 2, ndim - 1], starts=[0, n], ends=[n, 2 * n],
                   steps=[1, 1])


@linalg_matrix_exp.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 3)) * 0.5)
    yield Sample.of(rng.standard_normal((2, 2, 2)))


# -- pinv, matrix_rank, lstsq ---------------------------------------------------------------------------------------


def _cutoff(s, atol, rtol, shape):
    """torch's threshold on the singular values ``s`` (..., k): max(atol, rtol·σ₁), atol and rtol numbers or
    tensors over the batch; rtol by default eps·max(m, n) where atol is not given or not positive, else 0."""
    def per_matrix(t):  # a tensor over the batch, as a column against s
        return F.unsqueeze(t, axis=-1) if hasattr(t, "shape") else t

    atol, rtol = per_matrix(atol), per_matrix(rtol)
    if rtol is None:
        default = float(D.EPS[s.dtype] * max(shape[-2:]))
        rtol = default if atol is None else F.where(F.zeros_like(s) + atol > 0, 0.0, default)
    bound = F.amax(s, axis=[-1], keepdim=True) * rtol
    return bound if atol is None else F.maximum(bound, F.zeros_like(bound) + atol)


def _singular_values(a, hermitian):
    if hermitian:
        return F.abs(F.linalg_eigh(a).eigenvalues)
    return F.linalg_svd(a, full_matrices=False).s


@op("linalg_pinv(Tensor<floating> a, *, float? atol=None, float? rtol=None, bool hermitian=False) -> Tensor y")
def linalg_pinv(a, *, atol, rtol, hermitian):
    """``torch.linalg.pinv``: the Moore-Penrose pseudo-inverse, from the SVD, singular values at or below
    max(atol, rtol·σ₁) taken as 0; rtol is eps·max(m, n) when neither is given, 0 when only atol is. The gradient
    is torch's formula (defined where the rank does not change). ``hermitian`` says a is symmetric; the result is
    the same either way (torch then reads one triangle of a, as the gradient formula does not)."""
    if len(a.shape) < 2:
        raise ShapeError(f"linalg_pinv(): a must be a matrix or a batch of them, got shape {a.shape}")
    if 0 in a.shape[-2:]:
        return np.zeros((*a.shape[:-2], a.shape[-1], a.shape[-2]), a.dtype)
    if rtol is None:
        rtol = np.finfo(a.dtype).eps * max(a.shape[-2:]) if atol is None or atol <= 0 else 0.0
    u, s, vh = _lapack("linalg_pinv", "the SVD did not converge", np.linalg.svd, a, False)
    cutoff = np.maximum(np.max(s, axis=-1, keepdims=True) * rtol, 0.0 if atol is None else atol)
    keep = s > cutoff
    inverse = np.where(keep, 1 / np.where(keep, s, 1), 0)
    return (np.swapaxes(vh, -1, -2) * inverse[..., None, :]) @ np.swapaxes(u, -1, -2)


@linalg_pinv.infer
def _(a, *, atol, rtol, hermitian):
    if len(a.shape) < 2:
        raise ShapeError(f"linalg_pinv(): a must be a matrix or a batch of them, got shape {a.shape}")
    return Spec((*a.shape[:-2], a.shape[-1], a.shape[-2]), a.dtype)


@linalg_pinv.grad
def _(a, y, dy, *, atol, rtol, hermitian):
    # torch's pinv_backward, arranged for the smaller of the two products
    m, n = a.shape[-2:]
    yt, dyt = _swap_last(y), _swap_last(dy)
    if m <= n:
        k = F.matmul(dyt, y)
        k_yt = F.matmul(k, yt)
        return (-_swap_last(F.matmul(y, k)) + k_yt - F.matmul(F.matmul(a, y), k_yt)
                + F.matmul(F.matmul(yt, y), dyt - F.matmul(k, a)))
    k = F.matmul(y, dyt)
    yt_k = F.matmul(yt, k)
    return (-_swap_last(F.matmul(k, y)) + F.matmul(F.matmul(dyt - F.matmul(a, k), y), yt) + yt_k
            - F.matmul(F.matmul(yt_k, y), a))


@linalg_pinv.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((2, 4, 3)))
    yield Sample.of(_positive_definite(rng, 3, 3), hermitian=True)


@function
def linalg_matrix_rank(A, *, atol=None, rtol=None, hermitian=False):
    """``torch.linalg.matrix_rank``: the number of singular values above max(atol, rtol·σ₁) (int64)."""
    if 0 in A.shape[-2:]:
        return F.zeros(shape=list(A.shape[:-2]), dtype="int64")
    s = _singular_values(A, hermitian)
    return F.sum(s > _cutoff(s, atol, rtol, A.shape), axis=[-1])


_LSTSQ = namedtuple("lstsq", ("solution", "residuals", "rank", "singular_values"))
_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


@function
def linalg_lstsq(A, B, rcond=None, *, driver=None):
    """``torch.linalg.lstsq``: the named tuple ``(solution, residuals, rank, singular_values)`` of min ‖A·X − B‖
    for A (..., m, n) and B (..., m, k) (or (..., m)). The solution is pinv(A)·B with singular values at or below
    rcond·σ₁ dropped (rcond by default eps·max(m, n)): the minimum-norm solution, which is LAPACK's for every
    driver where A has full rank (torch's default 'gelsy' gives another solution for a rank-deficient A). As
    torch's: residuals (the squared residual norms) for m > n with drivers other than 'gelsy' (here also for a
    rank-deficient A, where torch gives them empty), the rank for drivers other than 'gels', the singular values
    for 'gelsd' and 'gelss'; the others empty. Differentiable through the SVD."""
    driver = "gelsy" if driver is None else driver
    if driver not in _DRIVERS:
        raise ArgumentError(f"linalg_lstsq(): argument 'driver' must be one of {', '.join(_DRIVERS)}, got {driver!r}")
    if len(A.shape) < 2:
        raise ShapeError(f"linalg_lstsq(): A must be a matrix or a batch of them, got shape {tuple(A.shape)}")
    vector = len(B.shape) == len(A.shape) - 1
    b = F.unsqueeze(B, axis=-1) if vector else B
    m, n = A.shape[-2:]
    if len(b.shape) < 2 or b.shape[-2] != m:
        raise ShapeError(f"linalg_lstsq(): B of shape {tuple(B.shape)} does not fit A of shape {tuple(A.shape)}: "
                         f"it must have {m} rows")
    rtol = float(D.EPS[A.dtype] * max(m, n) if rcond is None or rcond < 0 else rcond)
    solution = F.matmul(F.linalg_pinv(A, rtol=rtol), b)
    empty = F.zeros(shape=[0], dtype=A.dtype)
    residuals = empty
    if m > n and driver != "gelsy" and 0 not in (m, n):
        residuals = F.sum(F.square(F.matmul(A, solution) - b), axis=[-2])
        residuals = F.squeeze(residuals, axis=[-1]) if vector else residuals
    rank = F.zeros(shape=[0], dtype="int64") if driver == "gels" else F.linalg_matrix_rank(A, rtol=rtol)
    values = empty  # not differentiable, as torch's
    if driver in ("gelsd", "gelss") and 0 not in (m, n):
        values = _singular_values(A, False).detach()
    return _LSTSQ(F.squeeze(solution, axis=[-1]) if vector else solution, residuals, rank, values)


# -- the LU family ---------------------------------------------------------------------------------------------------
# linalg_lu_factor gives LAPACK's packed form: LU holds L (unit lower, its diagonal not stored) below the diagonal
# and U on and above it; pivots (int32, from 1) the row swaps, in order. lu_unpack unpacks it into A = P·L·U.


def _lu_factor_shapes(shape):
    if len(shape) < 2:
        raise ShapeError(f"linalg_lu_factor(): A must be a matrix or a batch of them, got shape {tuple(shape)}")
    *batch, m, n = shape
    return (*batch, None if None in (m, n) else min(m, n))


@op("linalg_lu_factor(Tensor<floating> A, *, bool pivot=True) -> (Tensor LU, Tensor<int32> pivots)")
def linalg_lu_factor(A, *, pivot, xp=np):
    """``torch.linalg.lu_factor``: the LU decomposition with partial pivoting of A (..., m, n), packed as LAPACK's
    getrf gives it: ``(LU, pivots)``. Differentiable where A's leading k×k minors are not singular (k = min(m, n))."""
    _lu_factor_shapes(A.shape)
    *batch, m, n = A.shape
    k = min(m, n)
    lu = A.copy()
    pivots = xp.zeros((*batch, k), np.int32)
    rows = xp.arange(m)[:, None]  # (m, 1): against a row number per matrix, (..., 1, 1)
    for j in range(k):  # LAPACK's getf2, column by column, every matrix of the batch at once
        p = xp.argmax(xp.abs(lu[..., j:, j]), axis=-1)[..., None, None] + j  # the first largest |entry| on and below
        pivots[..., j] = p[..., 0, 0] + 1
        row_j = lu[..., j:j + 1, :]
        row_p = xp.take_along_axis(lu, xp.broadcast_to(p, (*batch, 1, n)), axis=-2)
        lu = xp.where(rows == j, row_p, xp.where(rows == p, row_j, lu))  # rows j and p swapped
        head = lu[..., j:j + 1, j:j + 1]
        singular = head == 0  # getf2 leaves a zero column as it is (the factorization is singular there)
        below = xp.where(singular, lu[..., j + 1:, j:j + 1], lu[..., j + 1:, j:j + 1] / xp.where(singular, 1, head))
        lu[..., j + 1:, j:j + 1] = below
        lu[..., j + 1:, j + 1:] -= below * lu[..., j:j + 1, j + 1:]
    return lu, pivots


@linalg_lu_factor.kernel(device="cpu")
def _(A, *, pivot):
    # SciPy's (LAPACK's getrf, blocked), faster on the host
    from scipy.linalg import lu_factor  # imported on first use: SciPy takes a noticeable time to import

    _lu_factor_shapes(A.shape)
    k = min(A.shape[-2:])
    packed = np.empty(A.shape, A.dtype)
    pivots = np.empty((*A.shape[:-2], k), np.int32)
    for i in np.ndindex(A.shape[:-2]):
        if k:
            packed[i], swaps = lu_factor(A[i], check_finite=False)
            pivots[i] = swaps + 1
    return packed, pivots


@linalg_lu_factor.check
def _(*, pivot):
    if not pivot:
        raise ValueError("argument 'pivot': LU without pivoting is not offered (torch's CPU kernel refuses it too)")


@linalg_lu_factor.infer
def _(A, *, pivot):
    return Spec(A.shape, A.dtype), Spec(_lu_factor_shapes(A.shape), D.int32)


@linalg_lu_factor.grad
def _(LU, pivots, dLU):
    p, l, u = F.lu_unpack(LU, pivots)
    k = l.shape[-1]
    ndim = len(LU.shape)
    dl = F.slice(F.tril(dLU, diagonal=-1), axes=[ndim - 1], starts=[0], ends=[k], steps=[1])
    du = F.slice(F.triu(dLU), axes=[ndim - 2], starts=[0], ends=[k], steps=[1])
    return _lu_backward(p, l, u, dl, du)


def _lu_backward(p, l, u, dl, du):
    """torch's linalg_lu_backward: the gradient of A = P·L·U from those of L (strictly lower) and U (upper)."""
    m, n = l.shape[-2], u.shape[-1]
    k = min(m, n)
    ndim = len(l.shape)

    def part(t, axis, start, end):
        return F.slice(t, axes=[ndim + axis], starts=[start], ends=[end], steps=[1])

    if m == n:  # P·L⁻ᵀ·[Lᵀ·dL ∘ strictly lower + dU·Uᵀ ∘ upper]·U⁻ᵀ
        grad = F.tril(F.matmul(_swap_last(l), dl), diagonal=-1) + F.triu(F.matmul(du, _swap_last(u)))
        grad = linalg_solve_triangular(_swap_last(u), grad, upper=False, left=False)
        grad = linalg_solve_triangular(_swap_last(l), grad, upper=True, unitriangular=True)
    elif m < n:  # wide: the first k columns as the square case, the rest P·L⁻ᵀ·dU₂
        u1 = part(u, -1, 0, k)
        grad = F.matmul(_swap_last(l), dl) - F.matmul(F.triu(du), _swap_last(u))
        grad = linalg_solve_triangular(_swap_last(u1), F.tril(grad, diagonal=-1), upper=False, left=False)
        grad = F.concat([grad + F.triu(part(du, -1, 0, k)), part(du, -1, k, n)], axis=-1)
        grad = linalg_solve_triangular(_swap_last(l), grad, upper=True, unitriangular=True)
    else:  # tall: the first k rows as the square case, the rest P·dL₂·U⁻ᵀ
        l1 = part(l, -2, 0, k)
        grad = F.matmul(du, _swap_last(u)) - F.matmul(_swap_last(l), dl)
        grad = linalg_solve_triangular(_swap_last(l1), F.triu(grad), upper=True, unitriangular=True)
        grad = F.concat([grad + F.tril(part(dl, -2, 0, k), diagonal=-1), part(dl, -2, k, m)], axis=-2)
        grad = linalg_solve_triangular(_swap_last(u), grad, upper=False, left=False)
    return F.matmul(p, grad)


def _lu_samples(rng):
    yield Sample.of(_well_conditioned(rng, 3, 3))
    yield Sample.of(rng.standard_normal((2, 3, 5)))
    yield Sample.of(rng.standard_normal((5, 3)))


linalg_lu_factor.samples(_lu_samples)


@op("lu_unpack(Tensor<floating> LU, nograd Tensor<int32|int64> pivots, bool unpack_data=True, "
    "bool unpack_pivots=True) -> (Tensor P, Tensor L, Tensor U)")
def lu_unpack(LU, pivots, *, unpack_data, unpack_pivots, xp=np):
    """``torch.lu_unpack``: ``(P, L, U)`` with A = P·L·U from ``linalg_lu_factor``'s packed form: P (..., m, m) a
    permutation, L (..., m, k) unit lower and U (..., k, n) upper triangular, k = min(m, n); P (without
    ``unpack_pivots``) or L and U (without ``unpack_data``) empty."""
    *batch, m, n = LU.shape
    k = min(m, n)
    _check_pivots(LU.shape, pivots.shape)
    if unpack_data:
        l_ = np.tril(LU[..., :, :k], -1) + xp.eye(m, k, dtype=LU.dtype)
        u = np.triu(LU[..., :k, :])
    else:
        l_ = u = xp.zeros(0, LU.dtype)
    if not unpack_pivots:
        return xp.zeros(0, LU.dtype), l_, u
    if pivots.size and (pivots.min() < 1 or pivots.max() > m):
        raise ArgumentError(f"lu_unpack(): pivots must be in [1, {m}] (LAPACK's, from 1), got values from "
                            f"{pivots.min()} to {pivots.max()}")
    # the swaps applied in order to 0..m-1, every matrix of the batch at once: row r of L·U is row order[r] of A
    places = xp.arange(m)
    order = xp.broadcast_to(places, (*batch, m))
    for j in range(pivots.shape[-1]):
        swap = pivots[..., j:j + 1].astype(np.int64) - 1
        at_j, at_swap = order[..., j:j + 1], xp.take_along_axis(order, swap, axis=-1)
        order = xp.where(places == j, at_swap, xp.where(places == swap, at_j, order))
    return (order[..., None, :] == places[:, None]).astype(LU.dtype), l_, u  # P[order[r], r] = 1


def _check_pivots(lu_shape, pivots_shape):
    if len(lu_shape) < 2:
        raise ShapeError(f"lu_unpack(): LU must be a matrix or a batch of them, got shape {tuple(lu_shape)}")
    expected = _lu_factor_shapes(lu_shape)
    if len(pivots_shape) != len(expected) or any(
            a is not None and b is not None and a != b for a, b in zip(pivots_shape, expected)):
        raise ShapeError(f"lu_unpack(): pivots of shape {tuple(pivots_shape)} do not fit LU of shape "
                         f"{tuple(lu_shape)}: expected {expected}")


@lu_unpack.infer
def _(LU, pivots, *, unpack_data, unpack_pivots):
    _check_pivots(LU.shape, pivots.shape)
    *batch, m, n = LU.shape
    k = None if None in (m, n) else min(m, n)
    empty = Spec((0,), LU.dtype)
    data = (Spec((*batch, m, k), LU.dtype), Spec((*batch, k, n), LU.dtype)) if unpack_data else (empty, empty)
    return (Spec((*batch, m, m), LU.dtype) if unpack_pivots else empty), *data


@lu_unpack.grad
def _(LU, dL, dU, *, unpack_data):
    if not unpack_data:
        return None, None
    # L is LU's strictly lower part (its first k columns), U its upper part (its first k rows)
    m, n = LU.shape[-2:]
    k = min(m, n)
    lower = F.pad(F.tril(dL, diagonal=-1), pad=[0, n - k])
    return lower + F.pad(F.triu(dU), pad=[0, 0, 0, m - k]), None


@lu_unpack.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 3)), np.array([2, 3, 3], np.int32))
    yield Sample.of(rng.standard_normal((2, 4, 3)), np.array([[4, 2, 3], [1, 3, 3]], np.int32))
    yield Sample.of(rng.standard_normal((2, 3)), np.array([1, 2], np.int32), unpack_pivots=False)


_LU = namedtuple("lu", ("P", "L", "U"))


@function
def linalg_lu(A, *, pivot=True):
    """``torch.linalg.lu``: the named tuple ``(P, L, U)`` with A = P·L·U (``linalg_lu_factor`` unpacked)."""
    return _LU(*F.lu_unpack(*F.linalg_lu_factor(A, pivot=pivot)))


@function
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    """``torch.linalg.lu_solve``: X with A·X = B (``left=False``: X·A = B; ``adjoint``: with Aᵀ) for A given as
    ``linalg_lu_factor``'s (LU, pivots)."""
    p, l, u = F.lu_unpack(LU, pivots)
    if left and not adjoint:  # P·L·U·X = B
        y = linalg_solve_triangular(l, F.matmul(_swap_last(p), B), upper=False, unitriangular=True)
        return linalg_solve_triangular(u, y, upper=True)
    if left:  # Uᵀ·Lᵀ·Pᵀ·X = B
        y = linalg_solve_triangular(_swap_last(u), B, upper=False)
        return F.matmul(p, linalg_solve_triangular(_swap_last(l), y, upper=True, unitriangular=True))
    if not adjoint:  # X·P·L·U = B
        y = linalg_solve_triangular(u, B, upper=True, left=False)
        return F.matmul(linalg_solve_triangular(l, y, upper=False, left=False, unitriangular=True), _swap_last(p))
    # X·Uᵀ·Lᵀ·Pᵀ = B
    y = linalg_solve_triangular(_swap_last(l), F.matmul(B, p), upper=True, left=False, unitriangular=True)
    return linalg_solve_triangular(_swap_last(u), y, upper=False, left=False)
