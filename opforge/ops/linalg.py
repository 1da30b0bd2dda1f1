"""Matrix products (matmul, outer, linear, einsum), and ``torch.linalg``'s inverse, determinant, solve and the
Cholesky, QR and singular-value decompositions. These are named as PyTorch's own ops are (``linalg_inv``, ...);
``of.linalg`` gives them ``torch.linalg``'s short names (``of.linalg.inv``). Their gradient rules are written
with ops (matmul, linalg_solve, ...), so they can be differentiated again."""

import string

from opforge import ops as F

from ..core.errors import ArgumentError
from ._common import B, D, P, S, Sample, ShapeError, Spec, broadcast_shapes, function, np, op, promoted


@op("matmul(Tensor<number> x, Tensor<number> y) -> Tensor out", traits=["same_dtype"])
def matmul(x, y, out=None):
    """Matrix product with NumPy's rules: 1-D operands are vectors, leading dims broadcast (batches)."""
    if x.dtype is not y.dtype:  # an integer with a floating operand (the trait refuses two float dtypes)
        x, y = promoted(x, y)
    if x.ndim > 2 and y.ndim == 2:
        return _stacked_rows(x, y, out)
    return np.matmul(x, y, out=out)  # out=: the executor's workspace buffer, written by BLAS directly


def _stacked_rows(x, y, out):
    """x (..., K) · y (K, N) as ONE product of x's rows: NumPy runs a stack of x against a 2-D y as one BLAS call
    per matrix of the stack (measured, float32, one thread: (35, 20, 256)·(256, 1024) 11.6 ms that way against
    2.4 ms as (700, 256)·(256, 1024); a linear layer over (T, N, E) or (N, T, E) inputs is this product)."""
    rows = x.reshape(-1, x.shape[-1])  # a view where x's leading dims merge (C-contiguous), else one copy
    if out is not None and not out.flags.c_contiguous:
        return np.matmul(x, y, out=out)
    y2 = np.matmul(rows, y, out=None if out is None else out.reshape(-1, y.shape[1]))
    return y2.reshape(*x.shape[:-1], y.shape[1]) if out is None else out


@matmul.onnx
def _(g, x, y):
    dtype = g.outputs[0].dtype
    return g.op("MatMul", g.cast(x, dtype), g.cast(y, dtype), spec=g.outputs[0])


@matmul.infer
def _(x, y):
    if not x.shape or not y.shape:
        raise ShapeError(f"matmul(): operands must have at least one dim, got shapes {x.shape} and {y.shape}")
    xs = (1, *x.shape) if len(x.shape) == 1 else x.shape
    ys = (*y.shape, 1) if len(y.shape) == 1 else y.shape
    k1, k2 = xs[-1], ys[-2]
    if k1 is not None and k2 is not None and k1 != k2:
        raise ShapeError(f"matmul(): shapes {x.shape} and {y.shape} do not fit: "
                         f"contracted dims have sizes {k1} and {k2}")
    batch = broadcast_shapes(xs[:-2], ys[:-2], op="matmul")
    shape = (*batch, xs[-2], ys[-1])
    if len(x.shape) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(y.shape) == 1:
        shape = shape[:-1]
    return Spec(shape, D.promote(x.dtype, y.dtype))


def _swap_last(t):
    n = t.ndim
    return F.transpose(t, perm=[*range(n - 2), n - 1, n - 2])


@matmul.grad
def _(x, y, dout):
    # Treat vectors as matrices (x: 1×k, y: k×1), then dx = dout·yᵀ and dy = xᵀ·dout; the engine sums
    # any broadcast batch dims back down to the operands' shapes.
    x2 = F.reshape(x, shape=[1, x.shape[0]]) if x.ndim == 1 else x
    y2 = F.reshape(y, shape=[y.shape[0], 1]) if y.ndim == 1 else y
    d2 = dout
    if x.ndim == 1:
        d2 = F.reshape(d2, shape=[*dout.shape[:-1], 1, dout.shape[-1]] if y.ndim > 1 else [1, 1])
    if y.ndim == 1:
        d2 = F.reshape(d2, shape=[*d2.shape, 1]) if x.ndim > 1 else d2
    dx = F.matmul(d2, _swap_last(y2))
    dy = F.matmul(_swap_last(x2), d2)
    if x.ndim == 1:
        dx = F.reshape(dx, shape=[*dx.shape[:-2], dx.shape[-1]])
        dx = F.sum_to(dx, shape=x.shape)
    if y.ndim == 1:
        dy = F.reshape(dy, shape=dy.shape[:-1])
        dy = F.sum_to(dy, shape=y.shape)
    return dx, dy


@matmul.sbp
def _(x, y):
    if len(x.shape) < 2 or len(y.shape) != 2:
        return
    last = len(x.shape) - 1
    for a in range(last):
        yield (S(a), B), S(a)  # rows (and batches) of x
    yield (B, S(1)), S(last)  # columns of y
    yield (S(last), S(0)), P  # the contracted dim: each rank's product is a partial sum


@matmul.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((2, 2, 3)), rng.standard_normal((3, 2)))  # batch broadcast
    yield Sample.of(rng.standard_normal((1, 2, 3)), rng.standard_normal((2, 3, 2)))
    yield Sample.of(rng.standard_normal(3), rng.standard_normal((3, 2)))  # vector @ matrix
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal(3))  # matrix @ vector
    yield Sample.of(rng.standard_normal(3), rng.standard_normal(3))  # dot product
    yield Sample.of(rng.standard_normal((2, 4, 3)), rng.standard_normal(3))


@op("outer(Tensor<number> x, Tensor<number> y) -> Tensor out")
def outer(x, y):
    """The outer product of two vectors: ``out[i, j] = x[i]·y[j]``."""
    _outer_check(x.shape, y.shape)
    if x.dtype is not y.dtype:
        x, y = promoted(x, y)
    return np.multiply.outer(x, y)


@outer.onnx
def _(g, x, y):
    dtype = g.outputs[0].dtype
    column = g.op("Unsqueeze", g.cast(x, dtype), g.ints([1]))
    return g.op("Mul", column, g.op("Unsqueeze", g.cast(y, dtype), g.ints([0])))


def _outer_check(xs, ys):
    if len(xs) != 1 or len(ys) != 1:
        raise ShapeError(f"outer(): needs two vectors (1-D), got shapes {xs} and {ys}")


@outer.infer
def _(x, y):
    _outer_check(x.shape, y.shape)
    return Spec((x.shape[0], y.shape[0]), D.promote(x.dtype, y.dtype))


@outer.grad
def _(x, y, dout):
    return F.matmul(dout, y), F.matmul(x, dout)  # dx_i = Σ_j dout_ij·y_j, dy_j = Σ_i x_i·dout_ij


@outer.samples
def _(rng):
    yield Sample.of(rng.standard_normal(3), rng.standard_normal(4))
    yield Sample.of(rng.standard_normal(1), rng.standard_normal(2))


# -- linear ------------------------------------------------------------------------------------------------------


def _linear_spec(x, weight, bias):
    if not x.shape or len(weight.shape) != 2:
        raise ShapeError(f"linear(): needs x of rank >= 1 and a weight matrix (out, in), got shapes {x.shape} "
                         f"and {weight.shape}")
    k1, (n, k2) = x.shape[-1], weight.shape
    if k1 is not None and k2 is not None and k1 != k2:
        raise ShapeError(f"linear(): x has {k1} features (last dim of {x.shape}), weight {weight.shape} "
                         f"takes {k2}: weight is (out_features, in_features)")
    shape = (*x.shape[:-1], n)
    if bias is not None:
        try:
            ok = broadcast_shapes(shape, bias.shape) == shape
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(f"linear(): bias of shape {bias.shape} does not broadcast to the output shape {shape}")
    return Spec(shape, D.result_type(*(s for s in (x, weight, bias) if s is not None)))


@op("linear(Tensor<number> x, Tensor<number> weight, Tensor<number>? bias=None) -> Tensor y",
    traits=["same_dtype"])
def linear(x, weight, bias, out=None):
    """``torch.nn.functional.linear``: ``y = x @ weightᵀ + bias``, weight of shape (out_features, in_features),
    over the last dim of ``x`` (any leading dims are a batch)."""
    # Eager calls run no shape rule: a cheap look, and the rule itself (for its error) only when that fails. A 1-D
    # bias broadcasts over the rows of the right width; anything else takes the rule.
    if (not x.ndim or weight.ndim != 2 or x.shape[-1] != weight.shape[1]
            or (bias is not None and bias.shape != weight.shape[:1])):
        _linear_spec(x, weight, bias)
    if x.dtype is not weight.dtype or (bias is not None and bias.dtype is not x.dtype):
        x, weight, bias = (*promoted(*(a for a in (x, weight, bias) if a is not None)), None)[:3]
    if _few_rows(x, weight, bias, out):
        return _few_rows_linear(x, weight, bias, out)
    y = _stacked_rows(x, weight.T, out) if x.ndim > 2 else np.matmul(x, weight.T, out=out)
    if bias is None:
        return y
    # the bias added in place where it has y's dtype (the same bits as y + bias, one array fewer)
    return np.add(y, bias, out=y) if bias.dtype == y.dtype else y + bias


# Columns per block of the transposing copy in _few_rows_linear: a block of yᵀ (128 rows of at most 64) stays in L1
# while it is written out; NumPy's copy of the whole transpose at once is 1.6x slower (17 against 10.7 µs, 64×512).
_COPY_BLOCK = 128


def _few_rows(x, weight, bias, out) -> bool:
    """Whether linear takes _few_rows_linear: host arrays (it works around OpenBLAS; a GPU's BLAS has no such
    need), float32, 8 to 64 rows, in and out features both >= 256 (where the measured gain holds), x and out
    C-contiguous, and no bias or one float32 value per feature."""
    return (type(x) is np.ndarray and x.dtype == weight.dtype == np.float32 and min(weight.shape) >= 256
            and 8 * weight.shape[1] <= x.size <= 64 * weight.shape[1] and x.flags.c_contiguous
            and (bias is None or (bias.dtype == np.float32 and bias.shape == weight.shape[:1]))
            and (out is None or out.flags.c_contiguous))


def _few_rows_linear(x, weight, bias, out):
    """x·Wᵀ + b for a few rows of float32, as the product's transpose W·xᵀ, copied out block by block with the
    bias added on the way (the same bits as y + b).

    OpenBLAS runs float32 x·Wᵀ with a row-major result of few rows far below its speed. Measured for 784 → 512
    features, one thread (``bench/cases/mlp.py``'s first layer), x·Wᵀ against W·xᵀ with this copy: with the
    AVX-512 kernel (SkylakeX) 342 against 252 µs for 64 rows, 181 against 81 for 8; with the AVX2 kernel
    (Haswell) 437 against 433 and 95 against 84. float64 is slower this way (1.0-1.9x): not taken.
    Both are the same dot products, but BLAS may order a dot product's sums differently in the two layouts, so a
    result can differ in the last bit from x·Wᵀ. The choice depends on shapes, dtypes and layouts alone: a call
    gives the same bits every time, eager or compiled."""
    features = weight.shape[0]
    rows = x.reshape(-1, weight.shape[1])
    product = np.matmul(weight, rows.T)  # (features, rows), C-ordered
    y = np.empty((*x.shape[:-1], features), np.float32) if out is None else out
    y_rows = y.reshape(len(rows), features)
    for j in range(0, features, _COPY_BLOCK):
        block = slice(j, j + _COPY_BLOCK)
        if bias is None:
            np.copyto(y_rows[:, block], product[block].T)
        else:
            np.add(product[block].T, bias[block], out=y_rows[:, block])
    return y


@linear.onnx
def _(g, x, weight, bias):
    dtype = g.outputs[0].dtype
    x, weight = g.cast(x, dtype), g.cast(weight, dtype)
    bias = None if bias is None else g.cast(bias, dtype)
    if x.ndim == 2 and weight.ndim == 2 and dtype.kind == "f":
        return g.op("Gemm", x, weight, bias, transB=1, spec=g.outputs[0])
    y = g.op("MatMul", x, g.op("Transpose", weight) if weight.ndim == 2 else weight, spec=g.outputs[0])
    return y if bias is None else g.op("Add", y, bias)


@linear.infer
def _(x, weight, bias):
    return _linear_spec(x, weight, bias)


@linear.grad
def _(x, weight, dy, needs_input_grad):
    # y = x·Wᵀ + b over the rows of x: dx = dy·W, dW = Σ_rows dyᵀ·x, db = dy (summed to the bias by the engine).
    dx = F.matmul(dy, weight) if needs_input_grad[0] else None
    dw = None
    if needs_input_grad[1] and 0 in weight.shape:  # no rows to reshape to (-1, 0): an empty weight, empty dw
        dw = F.zeros_like(weight)
    elif needs_input_grad[1]:
        rows_dy = F.reshape(dy, shape=[-1, weight.shape[0]])
        rows_x = F.reshape(x, shape=[-1, weight.shape[1]])
        dw = F.matmul(F.transpose(rows_dy), rows_x)
    return dx, dw, dy if needs_input_grad[2] else None


@linear.sbp
def _(x, weight, bias):
    if not x.shape or len(weight.shape) != 2:
        return
    last = len(x.shape) - 1
    b = (lambda layout: None) if bias is None else (lambda layout: layout)
    for a in range(last):
        yield (S(a), B, b(B)), S(a)  # data parallel: rows of x
    yield (B, S(0), b(S(0))), S(last)  # column parallel: rows of the weight, the output's features
    yield (S(last), S(1), b(P)), P  # row parallel: partial sums, the bias added by one rank only


@linear.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 4, 3)), rng.standard_normal((6, 3)))  # first: its last input is required
    yield Sample.of(rng.standard_normal((4, 3)), rng.standard_normal((2, 3)), rng.standard_normal(2))
    yield Sample.of(rng.standard_normal(3), rng.standard_normal((2, 3)), rng.standard_normal(2))
    yield Sample.of(rng.standard_normal((4, 3)), rng.standard_normal((2, 3)), rng.standard_normal(()))


# -- einsum ------------------------------------------------------------------------------------------------------


def _einsum_terms(equation):
    """The subscripts of ``equation``, checked for syntax: (one term per operand, the output term or None)."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    for term in [*terms, out]:
        if any(c not in string.ascii_letters for c in term.replace("...", "", 1)):
            raise ValueError(f"argument 'equation' {equation!r}: subscripts are letters (a-z, A-Z) with at most "
                             "one '...' per operand, operands separated by ',', then optionally '->' and the output")
    if arrow:
        letters = out.replace("...", "")
        if len(set(letters)) != len(letters):
            raise ValueError(f"argument 'equation' {equation!r}: a subscript repeats in the output")
        missing = set(letters) - set(lhs)
        if missing or ("..." in out and "..." not in lhs):
            raise ValueError(f"argument 'equation' {equation!r}: the output names "
                             f"{sorted(missing) or '...'} that no operand has")
    return terms, (out if arrow else None)


def _einsum_explicit(equation, shapes):
    """``equation`` for operands of these shapes with one letter per dim: '...' spelled out in fresh letters, and
    a dim of size 1 that broadcasts against a larger dim of the same letter given a fresh letter of its own
    (summing over a size-1 dim and broadcasting it give the same result). Returns (terms, output term, and the
    size of each letter in each operand)."""
    terms, out = _einsum_terms(equation)
    if len(terms) != len(shapes):
        raise ShapeError(f"einsum(): equation {equation!r} has subscripts for {len(terms)} operand(s), "
                         f"got {len(shapes)}")
    fresh = (c for c in string.ascii_letters if c not in equation)
    ranks = []
    for term, shape in zip(terms, shapes):
        named = len(term.replace("...", ""))
        if named > len(shape) or ("..." not in term and named != len(shape)):
            raise ShapeError(f"einsum(): subscripts {term!r} do not fit an operand of shape {shape}")
        ranks.append(len(shape) - named)
    try:
        # (a list, not a generator: in a generator, next()'s StopIteration would become a RuntimeError)
        ellipsis = "".join([next(fresh) for _ in range(max(ranks))])
        if out is None:  # implicit output: the '...' dims, then the letters used once, in alphabetical order
            once = sorted(c for c in set("".join(terms).replace(".", "")) if "".join(terms).count(c) == 1)
            out = ("..." if ellipsis else "") + "".join(once)
        terms = [t.replace("...", ellipsis[len(ellipsis) - r:]) for t, r in zip(terms, ranks)]
        out = out.replace("...", ellipsis)
        size = {}  # letter -> its size where it is not broadcast
        for c in set("".join(terms)):
            dims = {s[i] for t, s in zip(terms, shapes) for i, ch in enumerate(t) if ch == c}
            known = {d for d in dims if d is not None and d != 1}
            if len(known) > 1:
                raise ShapeError(f"einsum(): subscript {c!r} of {equation!r} has sizes {sorted(known)} in operands "
                                 f"of shapes {list(shapes)}")
            size[c] = known.pop() if known else (None if None in dims else 1)
        explicit, sizes = [], []
        for term, shape in zip(terms, shapes):
            rename = {}
            for c, d in zip(term, shape):
                if d == 1 and size[c] not in (1, None) and c not in rename:
                    rename[c] = next(fresh)
            new = "".join(rename.get(c, c) for c in term)
            mine = {}
            for c, d in zip(new, shape):
                if mine.setdefault(c, d) != d and None not in (d, mine[c]):
                    raise ShapeError(f"einsum(): subscript {c!r} repeats in {term!r} over dims of different sizes "
                                     f"in an operand of shape {shape}")
            explicit.append(new)
            sizes.append(mine)
    except StopIteration:
        raise ShapeError(f"einsum(): {equation!r} needs more than the 52 letters to name every dim") from None
    return explicit, out, sizes


@op("einsum(Tensor<number>[] operands, *, str equation) -> Tensor y")
def einsum(operands, *, equation):
    """Einstein summation, as ``torch.einsum(equation, *operands)`` (note the order of the arguments): ``"ij,jk->ik"``
    multiplies matrices; a letter left out of the output is summed over; without ``->`` the output is the letters
    used once, in alphabetical order. ``...`` stands for the broadcast leading dims, a size-1 dim broadcasts, and a
    letter repeated in one operand takes its diagonal (``"ii->i"``, ``"ii->"`` is the trace)."""
    terms, out, _ = _einsum_explicit(equation, [a.shape for a in operands])
    operands = promoted(*operands, dtype=D.promote(*(a.dtype for a in operands)))
    return np.einsum(f"{','.join(terms)}->{out}", *operands, optimize=len(operands) > 2)


@einsum.onnx
def _(g, operands, *, equation):
    terms, out, _ = _einsum_explicit(equation, [a.shape for a in operands])
    dtype = g.outputs[0].dtype
    return g.op("Einsum", *(g.cast(a, dtype) for a in operands), equation=f"{','.join(terms)}->{out}",
                spec=g.outputs[0])


@einsum.check
def _(*, equation):
    _einsum_terms(equation)


@einsum.infer
def _(operands, *, equation):
    if not operands:
        raise ShapeError("einsum(): needs at least one operand")
    _, out, sizes = _einsum_explicit(equation, [s.shape for s in operands])
    size = {c: d for mine in sizes for c, d in mine.items() if d is not None}
    return Spec(tuple(size.get(c) for c in out), D.promote(*(s.dtype for s in operands)))


@einsum.grad
def _(operands, dy, *, equation):
    # y = Σ a·b·c over the letters not in the output. Its derivative in a, contracted with dy, is the sum of
    # dy·b·c over every letter a does not have: the einsum "out,B,C->A". Two cases make A differ from a plain
    # output term: letters only a has (summed in y, so dy·b·c is the same along them: broadcast), and letters
    # a repeats (y reads a's diagonal there, so the gradient lives on that diagonal: zero elsewhere).
    terms, out, sizes = _einsum_explicit(equation, [t.shape for t in operands])
    grads = []
    for k, (a, term, size) in enumerate(zip(operands, terms, sizes)):
        if not D.is_floating(a.dtype):
            grads.append(None)
            continue
        others = [t for j, t in enumerate(terms) if j != k]
        letters = "".join(dict.fromkeys(term))
        elsewhere = set(out).union(*others)
        kept = "".join(c for c in letters if c in elsewhere)
        rest = [t for j, t in enumerate(operands) if j != k]
        g = F.einsum([dy, *rest], equation=f"{','.join([out, *others])}->{kept}")
        if kept != letters:
            g = F.reshape(g, shape=[size[c] if c in elsewhere else 1 for c in letters])
            g = F.broadcast_to(g, shape=[size[c] for c in letters])
        if letters != term:
            g = _on_diagonals(g, term, a.shape)
        grads.append(g)
    return grads


def _on_diagonals(g, term, shape):
    """``g`` (one dim per distinct letter of ``term``) spread to ``shape``, zero off the diagonals where ``term``
    repeats a letter: out[i, j] = g[i]·[i = j] for term "ii"."""
    first = {c: term.index(c) for c in term}
    g = F.reshape(g, shape=[d if first[c] == i else 1 for i, (c, d) in enumerate(zip(term, shape))])
    g = F.broadcast_to(g, shape=list(shape))

    def position(n, axis):  # 0, 1, ..., n-1 along ``axis``
        along = [n if i == axis else 1 for i in range(len(shape))]
        return F.reshape(F.arange(start=0, stop=n, dtype="int64"), shape=along)

    for i, c in enumerate(term):
        if first[c] != i:
            g = F.where(position(shape[i], first[c]) == position(shape[i], i), g, 0)
    return g


@einsum.samples
def _(rng):
    yield Sample.of([rng.standard_normal((2, 3)), rng.standard_normal((3, 4))], equation="ij,jk->ik")
    yield Sample.of([rng.standard_normal((2, 3, 4))], equation="bij->jb")  # sums over i
    yield Sample.of([rng.standard_normal((2, 1, 3)), rng.standard_normal((4, 3))], equation="...ij,kj")  # implicit
    yield Sample.of([rng.standard_normal((3, 3)), rng.standard_normal(3)], equation="ii,i->i")  # a diagonal
    yield Sample.of([rng.standard_normal((3, 2, 3))], equation="iji")  # traces of the (i, i) slices
    yield Sample.of([rng.standard_normal(3), rng.standard_normal(2), rng.standard_normal(())], equation="i,j,->ij")



# -- bilinear: an einsum -------------------------------------------------------------------------------------------


@function
def bilinear(input1, input2, weight, bias=None):
    """``torch.nn.functional.bilinear``: y = x₁ᵀ·A·x₂ + b over the last dims, for inputs (*, in1) and (*, in2) with
    the same leading dims, weight (out, in1, in2) and bias (out): the einsum ``...i,oij,...j->...o``."""
    if tuple(input1.shape[:-1]) != tuple(input2.shape[:-1]):
        raise ShapeError(f"bilinear(): the inputs' leading dims differ: {tuple(input1.shape)} and "
                         f"{tuple(input2.shape)} (they must be equal, as in torch)")
    if len(weight.shape) != 3 or (weight.shape[1], weight.shape[2]) != (input1.shape[-1], input2.shape[-1]):
        raise ShapeError(f"bilinear(): weight must have shape (out, {input1.shape[-1]}, {input2.shape[-1]}), got "
                         f"{tuple(weight.shape)}")
    y = F.einsum([input1, weight, input2], equation="...i,oij,...j->...o")
    return y if bias is None else y + bias


# -- torch.linalg: inverse, determinant, solve -------------------------------------------------------------------


def _square(op_name, shape, name="a"):
    """Checks that ``shape`` is a (batch of) square matrices; returns n."""
    if len(shape) < 2 or (shape[-1] is not None and shape[-2] is not None and shape[-1] != shape[-2]):
        raise ShapeError(f"{op_name}(): {name} must be a square matrix or a batch of them (..., n, n), "
                         f"got shape {tuple(shape)}")
    return shape[-1] if shape[-1] is not None else shape[-2]


def _lapack(op_name, what, fn, *args):
    """Runs a NumPy linear-algebra routine; its LinAlgError becomes an error naming the op and the input."""
    try:
        return fn(*args)
    except np.linalg.LinAlgError:
        raise ArgumentError(f"{op_name}(): {what}") from None


def _well_conditioned(rng, *shape):
    """Random matrices far from singular: I·n plus noise."""
    n = shape[-1]
    return np.asarray(rng.standard_normal(shape) + n * np.eye(n))


@op("linalg_inv(Tensor<floating> a) -> Tensor y")
def linalg_inv(a):
    """``torch.linalg.inv``: the inverse of each square matrix of ``a`` (..., n, n). A singular matrix is an error."""
    _square("linalg_inv", a.shape)
    return _lapack("linalg_inv", "a matrix of a is singular (not invertible)", np.linalg.inv, a)


@linalg_inv.infer
def _(a):
    _square("linalg_inv", a.shape)
    return a


@linalg_inv.grad
def _(y, dy):
    return -F.matmul(F.matmul(_swap_last(y), dy), _swap_last(y))  # d(A⁻¹) = −A⁻¹·dA·A⁻¹


@linalg_inv.samples
def _(rng):
    yield Sample.of(_well_conditioned(rng, 3, 3))
    yield Sample.of(_well_conditioned(rng, 2, 4, 4))
    yield Sample.of(rng.uniform(1, 2, (1, 1)))


@op("linalg_det(Tensor<floating> a) -> Tensor y")
def linalg_det(a):
    """``torch.linalg.det``: the determinant of each square matrix of ``a`` (..., n, n) -> (...)."""
    _square("linalg_det", a.shape)
    return np.linalg.det(a)  # (a NumPy scalar for one matrix on the host: dispatch makes it an array)


@linalg_det.infer
def _(a):
    _square("linalg_det", a.shape)
    return Spec(tuple(a.shape[:-2]), a.dtype)


@linalg_det.grad
def _(a, y, dy):
    # ∂det(A)/∂A = det(A)·A⁻ᵀ (the cofactors). At a singular matrix this needs the adjugate without A⁻¹, which is
    # not done here: linalg_inv refuses the matrix.
    scale = F.unsqueeze(F.unsqueeze(dy * y, axis=-1), axis=-1)
    return scale * _swap_last(F.linalg_inv(a))


linalg_det.onnx(lambda g, a: g.op("Det", a, spec=g.outputs[0]))


@linalg_det.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 3)))
    yield Sample.of(rng.standard_normal((2, 2, 2)))
    yield Sample.of(rng.standard_normal((1, 1)))


def _solve_kind(a_shape, b_shape):
    """PyTorch's reading of B: a batch of vectors when 1-D, or when its shape is A's without the last dim."""
    if len(b_shape) == 1:
        return True
    return len(b_shape) == len(a_shape) - 1 and all(
        x is None or y is None or x == y for x, y in zip(b_shape, a_shape[:-1]))


def _solve_spec(a, b, left):
    n = _square("linalg_solve", a.shape)
    vector = _solve_kind(a.shape, b.shape)
    if vector and not left:  # as PyTorch, which would read it as a column
        raise ShapeError(f"linalg_solve(): with left=False, b must be a (batch of) matrices (..., k, n), got shape "
                         f"{b.shape}; a row vector is (..., 1, n)")
    if not vector and len(b.shape) < 2:
        raise ShapeError(f"linalg_solve(): b must be a vector or a matrix (or a batch of them), got shape {b.shape}")
    rows = b.shape[-1] if vector or not left else b.shape[-2]
    if n is not None and rows is not None and rows != n:
        side = "its last dim" if vector or not left else "its second to last dim"
        raise ShapeError(f"linalg_solve(): b of shape {b.shape} does not fit a of shape {a.shape}: {side} must be "
                         f"{n}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-1] if vector else b.shape[:-2], op="linalg_solve")
    shape = (*batch, n) if vector else (*batch, *b.shape[-2:])
    return Spec(shape, D.promote(a.dtype, b.dtype)), vector


@op("linalg_solve(Tensor<floating> a, Tensor<floating> b, *, bool left=True) -> Tensor x")
def linalg_solve(a, b, *, left):
    """``torch.linalg.solve``: x with a·x = b (``left=False``: x·a = b) for square a (..., n, n) and b a batch of
    vectors (..., n), when it is 1-D or has a's shape without the last dim, else of matrices (..., n, k)
    (``left=False``: matrices (..., k, n) only); batch dims broadcast. A singular a is an error."""
    spec, vector = _solve_spec(a, b, left)
    if not left:  # x·a = b  <=>  aᵀ·xᵀ = bᵀ
        a, b = np.swapaxes(a, -1, -2), np.swapaxes(b, -1, -2)
    b = b[..., None] if vector else b
    batch = spec.shape[:-1] if vector else spec.shape[:-2]  # broadcast here: CuPy's solve does not broadcast
    x = _lapack("linalg_solve", "a matrix of a is singular (not invertible)", np.linalg.solve,
                np.broadcast_to(a, (*batch, *a.shape[-2:])), np.broadcast_to(b, (*batch, *b.shape[-2:])))
    x = x[..., 0] if vector else (x if left else np.swapaxes(x, -1, -2))
    return np.broadcast_to(x, spec.shape).astype(spec.dtype, copy=False)


@linalg_solve.infer
def _(a, b, *, left):
    return _solve_spec(a, b, left)[0]


@linalg_solve.grad
def _(a, x, dx, *, left, needs_input_grad):
    # a·x = b: db = a⁻ᵀ·dx (solve with aᵀ), da = −db·xᵀ; for x·a = b: db = dx·a⁻ᵀ, da = −xᵀ·db. Vectors are taken
    # as one-column matrices, so that each solve is a matrix solve; the engine sums broadcast dims back down.
    vector = x.ndim < a.ndim  # (x has a's rank less one for vectors: decided by ranks, as sizes may be unknown)
    if vector:
        x, dx = F.unsqueeze(x, axis=-1), F.unsqueeze(dx, axis=-1)
    db = F.linalg_solve(_swap_last(a), dx, left=left)
    da = None
    if needs_input_grad[0]:
        da = -F.matmul(db, _swap_last(x)) if left else -F.matmul(_swap_last(x), db)
    if vector:
        db = F.squeeze(db, axis=[-1])
    return da, db if needs_input_grad[1] else None


@linalg_solve.samples
def _(rng):
    yield Sample.of(_well_conditioned(rng, 3, 3), rng.standard_normal((3, 2)))
    yield Sample.of(_well_conditioned(rng, 3, 3), rng.standard_normal(3))  # a vector
    yield Sample.of(_well_conditioned(rng, 2, 3, 3), rng.standard_normal((2, 3)))  # a batch of vectors
    yield Sample.of(_well_conditioned(rng, 2, 1, 3, 3), rng.standard_normal((4, 3, 2)))  # batch dims broadcast
    yield Sample.of(_well_conditioned(rng, 3, 3), rng.standard_normal((2, 3)), left=False)
    yield Sample.of(_well_conditioned(rng, 2, 2), rng.standard_normal((1, 2)), left=False)  # a row vector


# -- torch.linalg: Cholesky, QR and singular-value decompositions ----------------------------------------------


def _positive_definite(rng, *shape):
    m = rng.standard_normal(shape)
    return np.asarray(m @ np.swapaxes(m, -1, -2) + shape[-1] * np.eye(shape[-1]))


@op("linalg_cholesky(Tensor<floating> a, *, bool upper=False) -> Tensor l")
def linalg_cholesky(a, *, upper):
    """``torch.linalg.cholesky``: the lower triangular l with l·lᵀ = a (``upper``: the upper u = lᵀ, a = uᵀ·u), for
    a symmetric positive-definite (..., n, n). a is read through its symmetric part (a + aᵀ)/2, as
    ``jax.numpy.linalg.cholesky`` does (PyTorch reads the lower triangle): the same for a symmetric a, values and
    gradients, and the gradient is then the derivative for any a. Not positive-definite is an error."""
    _square("linalg_cholesky", a.shape)
    l_ = _lapack("linalg_cholesky", "a matrix of a is not positive-definite", np.linalg.cholesky,
                 (a + np.swapaxes(a, -1, -2)) / 2)
    return np.swapaxes(l_, -1, -2).copy() if upper else l_


@linalg_cholesky.infer
def _(a, *, upper):
    _square("linalg_cholesky", a.shape)
    return a


@linalg_cholesky.grad
def _(l, dl, *, upper):
    # PyTorch's rule (Murray 2016, arXiv:1602.07527): with P = tril(lᵀ·dl), da = l⁻ᵀ·Φ·l⁻¹ where Φ = P with its
    # diagonal halved, made symmetric: Φ = (P + tril(P, −1)ᵀ)/2. Symmetric, as the derivative along symmetric da.
    if upper:
        l, dl = _swap_last(l), _swap_last(dl)
    p = F.tril(F.matmul(_swap_last(l), dl))
    phi = (p + _swap_last(F.tril(p, diagonal=-1))) * 0.5
    return F.linalg_solve(l, F.linalg_solve(_swap_last(l), phi), left=False)


@linalg_cholesky.samples
def _(rng):
    yield Sample.of(_positive_definite(rng, 3, 3))
    yield Sample.of(_positive_definite(rng, 2, 4, 4), upper=True)
    yield Sample.of(_positive_definite(rng, 3, 3) + np.triu(rng.standard_normal((3, 3)), 1) * 0.3)  # not symmetric


_QR_MODES = ("reduced", "complete")


@op('linalg_qr(Tensor<floating> a, *, str mode="reduced") -> (Tensor q, Tensor r)')
def linalg_qr(a, *, mode):
    """``torch.linalg.qr``: a = q·r for a (..., m, n), q with orthonormal columns and r upper triangular; q is
    (m, k) and r (k, n) with k = min(m, n) in mode "reduced", q (m, m) and r (m, n) in "complete". As LAPACK
    (and PyTorch) compute it, r's diagonal may be negative. Differentiable where a has full rank (mode
    "complete" only when m <= n, where it equals "reduced"). Mode "r" is not offered: take ``linalg_qr(a).r``."""
    _qr_shapes(a.shape, mode)
    q, r = np.linalg.qr(a, mode=mode)
    return q, r


@linalg_qr.check
def _(*, mode):
    if mode not in _QR_MODES:
        raise ValueError(f"argument 'mode' must be 'reduced' or 'complete', got {mode!r}")


def _qr_shapes(shape, mode):
    if len(shape) < 2:
        raise ShapeError(f"linalg_qr(): a must be a matrix or a batch of them (..., m, n), got shape {tuple(shape)}")
    *batch, m, n = shape
    k = m if mode == "complete" or None in (m, n) else min(m, n)
    return (*batch, m, k), (*batch, k, n)


@linalg_qr.infer
def _(a, *, mode):
    q, r = _qr_shapes(a.shape, mode)
    return Spec(q, a.dtype), Spec(r, a.dtype)


def _times_r_inverse_t(x, r):
    """x·r⁻ᵀ, for a square r."""
    return F.linalg_solve(_swap_last(r), x, left=False)


def _qr_grad_tall(q, r, dq, dr):
    # TensorFlow's QrGrad for m >= n (Walter and Lehmann 2018): with M = qᵀ·dq − (qᵀ·dq)ᵀ + r·drᵀ − (r·drᵀ)ᵀ,
    # da = q·(dr + tril(M)·r⁻ᵀ) + (dq − q·qᵀ·dq)·r⁻ᵀ.
    qdq = F.matmul(_swap_last(q), dq)
    rdr = F.matmul(r, _swap_last(dr))
    m = F.tril(qdq - _swap_last(qdq) + rdr - _swap_last(rdr))
    return F.matmul(q, dr + _times_r_inverse_t(m, r)) + _times_r_inverse_t(dq - F.matmul(q, qdq), r)


@linalg_qr.grad
def _(a_spec, q, r, dq, dr, *, mode):
    m, n = a_spec.shape[-2:]
    if m > n and mode == "complete":
        raise ArgumentError("linalg_qr(): mode 'complete' with more rows than columns is not differentiable (the "
                            "extra columns of q are not determined by a); use mode 'reduced'")
    if m >= n:
        return _qr_grad_tall(q, r, dq, dr)
    # m < n: a = [x | y], r = [u | v] with u square: y = q·v gives dy = q·dv, and x = q·u is the square case with
    # dq taking y·dvᵀ in too.
    ndim = len(a_spec.shape)

    def cols(t, start, end):
        return F.slice(t, axes=[ndim - 1], starts=[start], ends=[end], steps=[1])

    u, dv, du = cols(r, 0, m), cols(dr, m, n), cols(dr, 0, m)
    y = F.matmul(q, cols(r, m, n))
    dx = _qr_grad_tall(q, u, dq + F.matmul(y, _swap_last(dv)), du)
    return F.concat([dx, F.matmul(q, dv)], axis=-1)


@linalg_qr.samples
def _(rng):
    yield Sample.of(rng.standard_normal((4, 3)))
    yield Sample.of(rng.standard_normal((3, 3)))
    yield Sample.of(rng.standard_normal((2, 3, 5)))  # wide
    yield Sample.of(rng.standard_normal((2, 4)), mode="complete")  # m <= n: the same as "reduced"


@op("linalg_svd(Tensor<floating> a, *, bool full_matrices=True) -> (Tensor u, Tensor s, Tensor vh)")
def linalg_svd(a, *, full_matrices):
    """``torch.linalg.svd``: a = u·diag(s)·vh for a (..., m, n), s (..., k) descending with k = min(m, n); u is
    (m, m) and vh (n, n) with ``full_matrices``, else (m, k) and (k, n). Each singular vector's sign is LAPACK's
    choice. Differentiable where the singular values are distinct and nonzero (where m != n; at k for square
    matrices); the columns beyond k of full matrices are not determined by a, and their gradient is ignored, as
    in PyTorch."""
    _svd_shapes(a.shape, full_matrices)
    if not np.isfinite(a).all():  # LAPACK's gesdd never returns on an inf (NumPy 2.4, OpenBLAS), as torch refuses
        raise ArgumentError("linalg_svd(): a holds inf or NaN; the SVD of a non-finite matrix is not defined")
    u, s, vh = _lapack("linalg_svd", "the SVD did not converge", np.linalg.svd, a, full_matrices)
    return u, s, vh


def _svd_shapes(shape, full_matrices):
    if len(shape) < 2:
        raise ShapeError(f"linalg_svd(): a must be a matrix or a batch of them (..., m, n), got shape {tuple(shape)}")
    *batch, m, n = shape
    k = None if None in (m, n) else min(m, n)
    return (*batch, m, m if full_matrices else k), (*batch, k), (*batch, n if full_matrices else k, n)


@linalg_svd.infer
def _(a, *, full_matrices):
    return tuple(Spec(s, a.dtype) for s in _svd_shapes(a.shape, full_matrices))


@linalg_svd.grad
def _(a_spec, u, s, vh, du, ds, dvh, *, full_matrices):
    # PyTorch's svd_backward (real case). With E_jk = s_k² − s_j² (1 on the diagonal), skew(X) = X − Xᵀ:
    # da = u·[(skew(uᵀ·du)·s_k + s_j·skew(vh·dvhᵀ))/E + diag(ds)]·vh, plus for m > n (m < n) the part of du
    # (dvh) outside the span of u (of vh): (I − u·uᵀ)·du·diag(1/s)·vh (and its mirror image).
    m, n = a_spec.shape[-2:]
    k = min(m, n)
    ndim = len(a_spec.shape)
    if full_matrices and m != n:  # only the first k columns of u (rows of vh) are determined by a
        def first(t, axis):
            return F.slice(t, axes=[ndim + axis], starts=[0], ends=[k], steps=[1])

        u, du, vh, dvh = first(u, -1), first(du, -1), first(vh, -2), first(dvh, -2)
    eye = F.eye(n=k, dtype=s.dtype)
    s_row, s_col = F.unsqueeze(s, axis=-2), F.unsqueeze(s, axis=-1)
    s2 = s * s
    e = F.where(eye > 0, 1, F.unsqueeze(s2, axis=-2) - F.unsqueeze(s2, axis=-1))
    uhgu = F.matmul(_swap_last(u), du)
    vhgv = F.matmul(vh, _swap_last(dvh))
    core = ((uhgu - _swap_last(uhgu)) * s_row + s_col * (vhgv - _swap_last(vhgv))) / e + F.unsqueeze(ds, axis=-1) * eye
    if m > n:
        gu = du / s_row
        return F.matmul(F.matmul(u, core) + gu - F.matmul(u, F.matmul(_swap_last(u), gu)), vh)
    if m < n:
        gvh = dvh / s_col
        return F.matmul(u, F.matmul(core, vh) + gvh - F.matmul(F.matmul(gvh, _swap_last(vh)), vh))
    return F.matmul(F.matmul(u, core), vh)


@linalg_svd.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 3)))
    yield Sample.of(rng.standard_normal((4, 2)), full_matrices=False)
    yield Sample.of(rng.standard_normal((2, 2, 4)), full_matrices=False)


@function
def mm(x, y):
    """``torch.mm``: the product of two matrices (matmul of 2-D tensors only, as torch's: no broadcasting)."""
    if len(x.shape) != 2 or len(y.shape) != 2:
        raise ShapeError(f"mm(): takes two 2-D tensors, got shapes {tuple(x.shape)} and {tuple(y.shape)} (matmul "
                         "broadcasts batches and takes vectors)")
    return F.matmul(x, y)


@function
def bmm(x, y):
    """``torch.bmm``: batched matrix products of two 3-D tensors with the same batch size (no broadcasting)."""
    if len(x.shape) != 3 or len(y.shape) != 3 or x.shape[0] != y.shape[0]:
        raise ShapeError(f"bmm(): takes two 3-D tensors of one batch size, got shapes {tuple(x.shape)} and "
                         f"{tuple(y.shape)}")
    return F.matmul(x, y)
