"""Matrix products."""

import string

from opforge import ops as F

from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, np, op


@op("matmul(Tensor<number> x, Tensor<number> y) -> Tensor out")
def matmul(x, y):
    """Matrix product with NumPy's rules: 1-D operands are vectors, leading dims broadcast (batches)."""
    import numpy as np

    return np.matmul(x, y)


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
    return np.multiply.outer(x, y)


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
    dtypes = [x.dtype, weight.dtype]
    if bias is not None:
        try:
            ok = broadcast_shapes(shape, bias.shape) == shape
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(f"linear(): bias of shape {bias.shape} does not broadcast to the output shape {shape}")
        dtypes.append(bias.dtype)
    return Spec(shape, D.promote(*dtypes))


@op("linear(Tensor<number> x, Tensor<number> weight, Tensor<number>? bias=None) -> Tensor y")
def linear(x, weight, bias):
    """``torch.nn.functional.linear``: ``y = x @ weightᵀ + bias``, weight of shape (out_features, in_features),
    over the last dim of ``x`` (any leading dims are a batch)."""
    _linear_spec(x, weight, bias)
    y = np.matmul(x, weight.T)
    return y if bias is None else y + bias


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


@linear.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 4, 3)), rng.standard_normal((5, 3)))  # first: its last input is required
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
        ellipsis = "".join(next(fresh) for _ in range(max(ranks)))
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
    return np.einsum(f"{','.join(terms)}->{out}", *operands, optimize=len(operands) > 2)


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
