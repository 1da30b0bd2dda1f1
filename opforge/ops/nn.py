"""Neural-network ops: softmax and log_softmax, dropout, embedding, attention (losses: loss.py, normalisation:
normalization.py).

Semantics follow ``torch.nn.functional`` (``axis`` for ``dim``). Kernels compute with NumPy; every gradient rule
is written with ops, so backward passes can be differentiated again. Where a rule needs a scatter (embedding) or
where a formula pays (softmax, log_softmax), a dedicated grad op carries it, with a gradient of its own.
"""

import math

from opforge import ops as F

from ..core.errors import ArgumentError
from ..core.sbp import Decomposition, PerRank
from ._common import (
    B,
    D,
    P,
    S,
    Sample,
    ShapeError,
    Spec,
    array_module,
    broadcast_shapes,
    called_as,
    constant_row,
    function,
    max_last,
    max_over,
    normalize_axes,
    np,
    op,
    overflow_ignored,
    row_buffers,
    row_width,
)


def _same_dims(a: tuple, b: tuple) -> bool:
    """Shapes equal where both dims are known (None is unknown)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """True if ``shape`` broadcasts to ``target`` (unknown dims fit anything)."""
    if len(shape) > len(target):
        return False
    try:
        return _same_dims(broadcast_shapes(shape, target), target)
    except ShapeError:
        return False


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _validate(opdef, *arrays, **attrs) -> None:
    """Run the op's infer rule on the kernel's arrays. The eager path runs kernels without it, and NumPy would
    broadcast some wrong shapes silently: this way a kernel refuses exactly what the rule refuses, in its words."""
    opdef.infer_fn(*(None if a is None else Spec(a.shape, a.dtype) for a in arrays), **attrs)


def _swap_last(t):
    n = t.ndim
    return F.transpose(t, perm=[*range(n - 2), n - 1, n - 2])


# -- softmax and log_softmax ---------------------------------------------------------------------------------------
# A 0-d tensor accepts axis 0 or -1 and is its own (one-element) group: softmax gives 1, log_softmax 0.


def _axes(op_name: str, axis: int, ndim: int) -> tuple:
    """The one axis of a softmax as NumPy's axis tuple (() for a 0-d tensor); the usual last axis skips the checks."""
    return (ndim - 1,) if axis == -1 and ndim else normalize_axes(op_name, [axis], ndim)


# The kernels work in one buffer each (``out``, when the executor hands one). Along the last axis (the usual case)
# they take the max from max_last and broadcast within row_buffers (_common.py says why both pay).


def _sum(a, axes: tuple, b=None):
    """Σ a, or Σ a·b without making the product, over ``axes``, kept as size-1 dims. Over the last axis (the usual
    case) of float32/64, np.vecdot: a BLAS dot per row (with a row of ones for Σ a), half einsum's time for Σ a·b
    and 0.7 of it for Σ a (2.5 against 3.6 µs for 64×1000), with no larger error, and each row summed by the same
    call whatever the other rows. Other dtypes take einsum's loops, several times faster than np.add.reduce, which
    sums each contiguous row pairwise."""
    if axes == (a.ndim - 1,) and type(a) is np.ndarray:
        if a.dtype.char in "fd" and (b is None or b.dtype == a.dtype):
            return np.vecdot(a, constant_row(1, a.shape[-1], a.dtype) if b is None else b)[..., None]
        if b is None:
            return np.einsum("...i->...", a)[..., None]
        return np.einsum("...i,...i->...", a, b)[..., None]
    return np.add.reduce(a if b is None else a * b, axis=axes, keepdims=True)


def _exp_sums(x, axes, shift: bool = False):
    """(e, s, c): e = exp(x − c), a new array, and s = Σ e over ``axes`` (kept as size-1 dims), where c is the max of
    each group (reduced over ``axes``), or 0 — c is then None — in every group of a float32/float64 ``x`` whose sum
    of exp(x) lies in [1, ∞) (``shift=True`` asks for the max everywhere).

    Whatever c, e / s is the same softmax: the max is subtracted only so that no exp overflows and the largest
    term is not lost below the smallest normal number. Where Σ exp(x) is finite and at least 1, neither happened
    (a term under the smallest normal then makes a softmax value under it too), and exp(x) itself is at least as
    accurate as exp of the rounded difference x − max. That skips a max and a subtraction over the data, a third of
    a softmax. The groups that fail the test (overflow, every value very negative, −∞ or nan) are done again with
    their max; each group's values depend on that group alone."""
    if not shift and x.dtype.char in "fd" and type(x) is np.ndarray:  # (a device's array: no read to choose)
        with overflow_ignored():  # an overflow (in exp or in the sum) sends its group to the max below
            e = np.exp(x)
            s = _sum(e, axes)
        lo, hi = (np.minimum.reduce(s, axis=None), np.maximum.reduce(s, axis=None)) if s.size else (1, 1)
        if lo >= 1 and hi < np.inf:  # a nan fails both
            return e, s, None
        c = max_over(x, axes)
        np.copyto(c, 0, where=(s >= 1) & (s < np.inf))  # these groups keep exp(x) as computed above: x − 0 is x
    else:
        c = max_over(x, axes)
        e = None
    with row_buffers(row_width(x, axes)):
        e = np.subtract(x, c, out=e)
    np.exp(e, out=e)
    return e, _sum(e, axes), c


def _softmax_np(x, axes, out=None):
    # e · (1 / Σ e) with e = exp(x − c) from _exp_sums. One reciprocal per row and a multiply, as torch's kernel:
    # a divide per element costs 40% more here (6.8 against 4.8 µs for 64×1000 float32).
    if not x.ndim:  # NumPy gives scalars, not arrays, for 0-d results: one element, then back to 0-d
        return _softmax_np(x.reshape(1), (0,)).reshape(())
    e, s, _ = _exp_sums(x, axes)
    with row_buffers(row_width(x, axes)):
        return np.multiply(e, np.reciprocal(s), out=e if out is None else out)


def _log_softmax_np(x, axes, out=None):
    # log softmax(x) = (x − m) − log Σ exp(x − m) with m = max x: no exp overflows, the largest term is exp(0).
    if not x.ndim:
        return _log_softmax_np(x.reshape(1), (0,)).reshape(())
    with row_buffers(row_width(x, axes)):
        z = np.subtract(x, max_over(x, axes), out=out)
        return np.subtract(z, np.log(_sum(np.exp(z), axes)), out=z)


def _softmax_spec(op_name):
    def infer(x, *, axis):
        normalize_axes(op_name, [axis], len(x.shape))
        return Spec(x.shape, x.dtype)

    return infer


def _softmax_grad_spec(op_name):
    def infer(y, dy, *, axis):
        if not _same_dims(y.shape, dy.shape):
            raise ShapeError(f"{op_name}(): y has shape {y.shape} but dy has shape {dy.shape}")
        normalize_axes(op_name, [axis], len(y.shape))
        return Spec(y.shape, y.dtype)

    return infer


@op("softmax(Tensor<floating> x, int axis/dim=-1) -> Tensor y", infer=_softmax_spec("softmax"), inplace={"y": "x"})
def softmax(x, *, axis, out=None):
    """exp(x) / Σ exp(x) along ``axis``. Computed so where Σ exp(x) is finite and at least 1 (float32/64), else
    as exp(x − max x) / Σ exp(x − max x): nothing overflows, and each group's path depends on that group alone."""
    return _softmax_np(x, _axes("softmax", axis, x.ndim), out)


softmax.onnx(lambda g, x, *, axis: g.op("Softmax", x, axis=axis) if x.ndim else g.filled(g.op("Shape", x), 1, x.dtype))


@softmax.grad
def _(y, dy, *, axis):
    return F.softmax_grad(y, dy, axis=axis)  # from the output alone, as torch's _softmax_backward_data


@op("softmax_grad(Tensor<floating> y, Tensor<floating> dy, *, int axis=-1) -> Tensor dx",
    infer=_softmax_grad_spec("softmax_grad"), inplace={"dx": "dy"})
def softmax_grad(y, dy, *, axis, out=None):
    """Gradient of softmax from its output y: dx = y·(dy − Σ dy·y) along ``axis``."""
    if y.shape != dy.shape:
        _validate(softmax_grad, y, dy, axis=axis)
    if not y.ndim:  # one element: y·(dy − dy·y)
        return y * (dy - dy * y)  # (a NumPy scalar on the host: dispatch makes it a 0-d array)
    axes = _axes("softmax_grad", axis, y.ndim)
    with row_buffers(row_width(y, axes)):
        dx = np.subtract(dy, _sum(dy, axes, y), out=out)
    return np.multiply(dx, y, out=dx)


@softmax_grad.grad
def _(y, dy, ddx, *, axis):
    # dx = y·(dy − s), s = Σ dy·y.  For L = Σ ddx·dx:  ∂L/∂dy = y·(ddx − Σ ddx·y) (softmax_grad again) and
    # ∂L/∂y = ddx·(dy − s) − (Σ ddx·y)·dy.
    s = F.sum(dy * y, axis=[axis], keepdim=True)
    t = F.sum(ddx * y, axis=[axis], keepdim=True)
    return ddx * (dy - s) - t * dy, F.softmax_grad(y, ddx, axis=axis)


@op("log_softmax(Tensor<floating> x, int axis/dim=-1) -> Tensor y", infer=_softmax_spec("log_softmax"),
    inplace={"y": "x"})
def log_softmax(x, *, axis, out=None):
    """log(softmax(x)) along ``axis``, computed as (x − max x) − log Σ exp(x − max x)."""
    return _log_softmax_np(x, _axes("log_softmax", axis, x.ndim), out)


log_softmax.onnx(lambda g, x, *, axis: g.op("LogSoftmax", x, axis=axis) if x.ndim else
                 g.filled(g.op("Shape", x), 0, x.dtype))


@log_softmax.grad
def _(y, dy, *, axis):
    return F.log_softmax_grad(y, dy, axis=axis)


@op("log_softmax_grad(Tensor<floating> y, Tensor<floating> dy, *, int axis=-1) -> Tensor dx",
    infer=_softmax_grad_spec("log_softmax_grad"), inplace={"dx": "y"})
def log_softmax_grad(y, dy, *, axis, out=None):
    """Gradient of log_softmax from its output y: dx = dy − exp(y)·Σ dy along ``axis``."""
    if y.shape != dy.shape:
        _validate(log_softmax_grad, y, dy, axis=axis)
    if not y.ndim:  # one element: dy − exp(y)·dy
        return dy - np.exp(y) * dy  # (as softmax_grad's)
    axes = _axes("log_softmax_grad", axis, y.ndim)
    s = _sum(dy, axes)
    e = np.exp(y, out=out)  # y's own buffer, when it dies here: read before it is written, element by element
    with row_buffers(row_width(y, axes)):
        e *= s
    return np.subtract(dy, e, out=e)


@log_softmax_grad.grad
def _(y, dy, ddx, *, axis):
    # dx = dy − exp(y)·S, S = Σ dy.  For L = Σ ddx·dx:  ∂L/∂dy = ddx − Σ ddx·exp(y), ∂L/∂y = −ddx·exp(y)·S.
    p = F.exp(y)
    return (-ddx * p * F.sum(dy, axis=[axis], keepdim=True),
            ddx - F.sum(ddx * p, axis=[axis], keepdim=True))


def _softmax_samples(rng):
    yield Sample.of(rng.standard_normal((3, 5)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=1)
    yield Sample.of(rng.standard_normal((2, 3)), axis=-2)
    yield Sample.of(rng.standard_normal(4), axis=0)
    yield Sample.of(rng.standard_normal(()))


def _softmax_grad_samples(rng):
    # y need not be a real softmax output for the formula to be checked; keep it one anyway.
    for shape, axis in (((3, 5), -1), ((2, 3, 4), 1), ((), -1)):
        x = rng.standard_normal(shape)
        yield Sample.of(_softmax_np(x, normalize_axes("", [axis], x.ndim)), rng.standard_normal(shape), axis=axis)


def _log_softmax_grad_samples(rng):
    for shape, axis in (((3, 5), -1), ((2, 3, 4), 1), ((), -1)):
        x = rng.standard_normal(shape)
        yield Sample.of(_log_softmax_np(x, normalize_axes("", [axis], x.ndim)), rng.standard_normal(shape), axis=axis)


softmax.samples(_softmax_samples)
log_softmax.samples(_softmax_samples)


def _softmax_sbp(x, *, axis):
    # each group along ``axis`` is whole on one rank: split along any other axis, the rank's rows are its own
    for k in range(len(x.shape)):
        if k != axis % len(x.shape):
            yield (S(k),), S(k)


softmax.sbp(_softmax_sbp)
log_softmax.sbp(_softmax_sbp)
softmax_grad.samples(_softmax_grad_samples)
log_softmax_grad.samples(_log_softmax_grad_samples)


# -- dropout ---------------------------------------------------------------------------------------------------


def _dropout_scale(p: float, training: bool) -> float:
    if not training:
        return 1.0
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)


@op("dropout_with_mask(Tensor<floating> x, *, float p=0.5, bool training=True) -> (Tensor y, Tensor<bool> mask)",
    traits=["random"])
def dropout_with_mask(x, *, p, training, rng):
    """Zeroes each element with probability ``p`` and scales the kept ones by 1/(1 − p) (identity when not
    ``training``). Also returns the boolean ``mask`` of kept elements (torch's ``native_dropout``);
    ``F.dropout(x, p, training)`` returns ``y`` alone, as ``torch.nn.functional.dropout`` does.

    The mask is an output so that backward uses exactly the mask of the forward pass: the gradient rule reads it
    (dx = dy·mask/(1 − p)) instead of drawing again, and no hidden state ties a backward to its forward. It is
    boolean, so it never carries a gradient itself. Draws come from the seeded generator: ``of.manual_seed``
    reproduces them. Nothing is drawn when the op is the identity (not training, or p = 0).
    """
    if not training or p == 0.0:
        return x.copy(), array_module(x).ones(x.shape, np.bool_)
    keep = rng.random(x.shape) >= p
    return np.where(keep, x * _dropout_scale(p, training), 0).astype(x.dtype, copy=False), keep


@dropout_with_mask.onnx
def _(g, x, *, p, training):
    if not training or p == 0.0:
        return g.op("Identity", x), g.filled(g.op("Shape", x), True, D.bool_)
    y, mask = g.op("Dropout", x, g.scalar(p, x), g.const(np.array(True)), outputs=2)
    return y, mask


@dropout_with_mask.check
def _(*, p, training):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"argument 'p' must be a probability in [0, 1], got {p}")


@dropout_with_mask.infer
def _(x, *, p, training):
    return Spec(x.shape, x.dtype), Spec(x.shape, D.bool_)


@dropout_with_mask.grad
def _(mask, dy, *, p, training):
    return F.where(mask, dy * _dropout_scale(p, training), 0.0)


@dropout_with_mask.samples
def _(rng):
    # Numeric gradient checks call the op again and again: only calls that draw nothing give them a fixed mask.
    # tests/test_oracle_nn.py checks p > 0 (the same mask in backward, reproducibility with of.manual_seed).
    yield Sample.of(rng.standard_normal((3, 4)), p=0.5, training=False)
    yield Sample.of(rng.standard_normal(5), p=0.0)
    yield Sample.of(rng.standard_normal(()), training=False)


def functional_dropout(op, module: str = __name__):
    """torch's functional form of the dropout op ``op`` (one of the ``*_with_mask`` ops): ``y`` alone, the mask
    kept inside the op for backward; ``inplace=True`` writes ``y`` into ``x`` (an in-place op, as ``x.copy_``)."""
    name = op.name.removesuffix("_with_mask")

    def dropout(x, p=0.5, training=True, inplace=False):
        y = called_as(name, op.name, x, p=p, training=training)[0]
        return x.copy_(y) if inplace else y

    dropout.__name__ = dropout.__qualname__ = name
    dropout.__module__ = module  # where its op is defined
    dropout.__doc__ = f"``torch.nn.functional.{name}``: ``{op.name}``'s output ``y``, without the mask."
    return dropout


dropout = function(functional_dropout(dropout_with_mask))


# -- embedding -------------------------------------------------------------------------------------------------


def _check_indices(op_name, index, n):
    if index.size and (index.min() < 0 or index.max() >= n):
        bad = index[(index < 0) | (index >= n)][0]  # (a mask's selection is 1-D; CuPy's arrays have no .flat)
        raise ArgumentError(f"{op_name}(): index holds {int(bad)}, outside [0, {n}) (the rows of the weight)")


def _padding_row(op_name, padding_idx, n):
    if padding_idx is None:
        return None
    if n is not None and not -n <= padding_idx < n:
        raise ShapeError(f"{op_name}(): padding_idx {padding_idx} is out of range for {n} embeddings")
    return padding_idx % n if n else padding_idx


@op("embedding(nograd Tensor<int32|int64> index, Tensor<floating> weight, int? padding_idx=None) -> Tensor y")
def embedding(index, weight, *, padding_idx):
    """Rows of ``weight`` (num_embeddings, D) picked by ``index``: y[..., :] = weight[index[...]]. The row
    ``padding_idx`` (if given) is looked up as any other but gets no gradient."""
    _validate(embedding, index, weight, padding_idx=padding_idx)
    _check_indices("embedding", index, weight.shape[0])
    return weight[index]


embedding.onnx(lambda g, index, weight, *, padding_idx: g.op("Gather", weight, index, axis=0, spec=g.outputs[0]))


@embedding.infer
def _(index, weight, *, padding_idx):
    if len(weight.shape) != 2:
        raise ShapeError(f"embedding(): weight must be 2-D (num_embeddings, embedding_dim), got shape {weight.shape}")
    _padding_row("embedding", padding_idx, weight.shape[0])
    return Spec((*index.shape, weight.shape[1]), weight.dtype)


@embedding.grad
def _(index, dy, weight_spec, *, padding_idx):
    return None, F.embedding_grad(dy, index, num_embeddings=weight_spec.shape[0], padding_idx=padding_idx)


@op("embedding_grad(Tensor<floating> dy, nograd Tensor<int32|int64> index, *, int num_embeddings, "
    "int? padding_idx=None) -> Tensor dweight")
def embedding_grad(dy, index, *, num_embeddings, padding_idx):
    """Gradient of embedding with respect to the weight: each dy[...] is added to row index[...] (rows picked
    several times add up); the padding row stays 0."""
    _validate(embedding_grad, dy, index, num_embeddings=num_embeddings, padding_idx=padding_idx)
    _check_indices("embedding_grad", index, num_embeddings)
    dw = np.zeros((num_embeddings, dy.shape[-1]), dy.dtype, like=dy)
    array_module(dw).add.at(dw, index.reshape(-1), dy.reshape(index.size, dy.shape[-1]))  # (not -1: rows of 0 elements)
    if padding_idx is not None:
        dw[padding_idx % num_embeddings] = 0
    return dw


@embedding_grad.infer
def _(dy, index, *, num_embeddings, padding_idx):
    if len(dy.shape) != len(index.shape) + 1 or not _same_dims(dy.shape[:-1], index.shape):
        raise ShapeError(f"embedding_grad(): dy must have shape index.shape + (embedding_dim,) = "
                         f"{index.shape} + (D,), got {dy.shape}")
    if num_embeddings < 1:
        raise ShapeError(f"embedding_grad(): num_embeddings must be >= 1, got {num_embeddings}")
    _padding_row("embedding_grad", padding_idx, num_embeddings)
    return Spec((num_embeddings, dy.shape[-1]), dy.dtype)


@embedding_grad.grad
def _(index, ddweight, *, padding_idx):
    # embedding_grad is linear in dy; its adjoint looks the rows up again, except at the padding row.
    ddy = F.embedding(index, ddweight)
    if padding_idx is not None:
        pad = padding_idx % ddweight.shape[0]
        ddy = F.where(F.reshape(index != pad, shape=[*index.shape, 1]), ddy, 0.0)
    return {"dy": ddy}


@embedding.samples
def _(rng):
    # The padding row's gradient is 0 by definition, not by derivative: numeric checks can only see samples that
    # do not look it up. tests/test_oracle_nn.py checks lookups of it against torch.
    yield Sample.of(np.array([[0, 2, 0], [4, 1, 2]]), rng.standard_normal((5, 3)))
    yield Sample.of(np.array([2, 3, 2, 0]), rng.standard_normal((4, 2)), padding_idx=1)
    yield Sample.of(np.array(2), rng.standard_normal((3, 4)), padding_idx=-3)  # -3: row 0 of 3


@embedding_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 3)), np.array([[0, 2, 0], [4, 1, 2]]), num_embeddings=5)
    yield Sample.of(rng.standard_normal((4, 2)), np.array([1, 3, 1, 0]), num_embeddings=4, padding_idx=1)


@embedding.sbp
def _(index, weight, *, padding_idx):
    for k in range(len(index.shape)):  # each rank looks up its own indices (a split batch)
        yield (S(k), B), S(k)
    yield Decomposition((B, S(0)), _embedding_by_rows)  # the table split by rows (vocabulary-parallel)


def _embedding_by_rows(index, weight, *, padding_idx):
    """embedding as a lookup in a table whose rows may be split: each rank looks up the rows it holds, zeros for
    the others (a partial sum over the ranks)."""
    n = weight.shape[0]
    return F.embedding_rows(index, weight, num_embeddings=n, padding_idx=_padding_row("embedding", padding_idx, n))


@op("embedding_rows(nograd Tensor<int32|int64> index, Tensor<floating> weight, *, int num_embeddings, int start=0, "
    "int? padding_idx=None) -> Tensor y")
def embedding_rows(index, weight, *, num_embeddings, start, padding_idx):
    """embedding in a block of a table: ``weight`` holds rows start, start+1, ... of a table of ``num_embeddings``
    rows, and y[...] is the row index[...] where the block holds it, zeros elsewhere (an index outside the whole
    table is an error). A table split by rows over ranks: the ranks' y add up to the lookup in the whole table
    (``embedding``'s vocabulary-parallel signature). ``padding_idx`` (a row of the whole table) gets no gradient."""
    _validate(embedding_rows, index, weight, num_embeddings=num_embeddings, start=start, padding_idx=padding_idx)
    _check_indices("embedding_rows", index, num_embeddings)
    local = index - start
    held = (local >= 0) & (local < weight.shape[0])
    y = weight[np.where(held, local, 0)]
    y[~held] = 0
    return y


@embedding_rows.infer
def _(index, weight, *, num_embeddings, start, padding_idx):
    if len(weight.shape) != 2:
        raise ShapeError(f"embedding_rows(): weight must be 2-D (rows, embedding_dim), got shape {weight.shape}")
    if start < 0 or (weight.shape[0] is not None and start + weight.shape[0] > num_embeddings):
        raise ShapeError(f"embedding_rows(): rows [{start}, {start} + {weight.shape[0]}) are not rows of a table of "
                         f"{num_embeddings}")
    _padding_row("embedding_rows", padding_idx, num_embeddings)
    return Spec((*index.shape, weight.shape[1]), weight.dtype)


@embedding_rows.onnx
def _(g, index, weight, *, num_embeddings, start, padding_idx):
    # the rows this block holds, zeros for the others
    local = g.op("Sub", g.cast(index, np.dtype(np.int64)), g.const(np.array(start, np.int64)))
    rows = g.op("Shape", weight, start=0, end=1)
    held = g.op("And", g.op("GreaterOrEqual", local, g.const(np.array(0, np.int64))), g.op("Less", local, rows))
    picked = g.op("Gather", weight, g.op("Where", held, local, g.const(np.array(0, np.int64))), axis=0)
    return g.op("Where", g.op("Unsqueeze", held, g.ints([-1])), picked, g.scalar(0, weight), spec=g.outputs[0])


@embedding_rows.grad
def _(index, dy, weight_spec, *, num_embeddings, start, padding_idx):
    rows = weight_spec.shape[0]
    local = index - start
    held = (local >= 0) & (local < rows)
    pad = _padding_row("embedding_rows", padding_idx, num_embeddings)
    pad = pad - start if pad is not None and 0 <= pad - start < rows else None
    dy = F.where(F.reshape(held, shape=[*index.shape, 1]), dy, 0.0)
    return None, F.embedding_grad(dy, F.where(held, local, 0), num_embeddings=rows, padding_idx=pad)


@embedding_rows.sbp
def _(index, weight, *, num_embeddings, start, padding_idx, ranks):
    for k in range(len(index.shape)):
        yield (S(k), B), S(k)
    if weight.shape[0] is not None:  # rank r holds rows [start + r·block, start + (r+1)·block)
        block = weight.shape[0] // ranks
        yield (B, S(0)), P, {"start": PerRank(lambda r: start + r * block)}


@embedding_rows.samples
def _(rng):
    yield Sample.of(np.array([[0, 5, 3], [4, 1, 2]]), rng.standard_normal((6, 3)), num_embeddings=6)
    # rows 2..5 of 8: indices 0, 1, 6 and 7 are not held (zeros); the padding row 5 is never looked up
    yield Sample.of(np.array([2, 7, 4, 0, 3, 6]), rng.standard_normal((4, 2)), num_embeddings=8, start=2,
                    padding_idx=5)


# -- attention -------------------------------------------------------------------------------------------------


def _attention_scale(e, scale):
    return 1.0 / math.sqrt(e) if scale is None else scale


def _attention_np(q, k, v, attn_mask, is_causal, scale, save=None):
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    s *= scale
    if attn_mask is not None and attn_mask.dtype != np.bool_:
        s = s + attn_mask
    allowed = attn_mask if attn_mask is not None and attn_mask.dtype == np.bool_ else None
    if is_causal:
        allowed = np.tril(array_module(s).ones(s.shape[-2:], np.bool_))
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    if attn_mask is None:
        p = _softmax_np(s, (s.ndim - 1,))
    else:  # A "safe" softmax, as torch's: a query whose scores are all −inf attends to nothing and gets zeros
        with np.errstate(invalid="ignore"):  # softmax gives nan there (−inf − −inf): found and replaced below
            p = _softmax_np(s, (s.ndim - 1,))  # a new array: s is kept for the test
        if np.isnan(p[..., :1]).any():  # a nan that came from the inputs stays (its row's max is not −inf)
            np.copyto(p, 0, where=max_last(s) == -np.inf)
    if save is not None:  # what the gradient rule would compute again from q, k and the mask: the same values
        save["probs"] = p
    return np.matmul(p, v)


def _attention_probs_dtype(q, k, attn_mask):
    """The dtype of the weights _attention_probs computes: the scores', a float mask's included."""
    floating_mask = attn_mask is not None and attn_mask.dtype != D.bool_
    return D.promote(q.dtype, k.dtype, *([attn_mask.dtype] if floating_mask else []))


def _attention_probs(q, k, attn_mask, is_causal, scale):
    """The attention weights with ops, as the kernel computes them."""
    s = F.matmul(q, _swap_last(k)) * scale
    if attn_mask is not None and attn_mask.dtype != D.bool_:
        s = s + attn_mask
    if is_causal:  # row i attends to columns j <= i (top-left aligned, as torch): never a row of nothing
        rows = F.reshape(F.arange(start=0, stop=q.shape[-2], dtype="int64"), shape=[q.shape[-2], 1])
        allowed = rows >= F.arange(start=0, stop=k.shape[-2], dtype="int64")
        return F.softmax(F.where(allowed, s, -math.inf), axis=-1)
    if attn_mask is None:
        return F.softmax(s, axis=-1)
    if attn_mask.dtype == D.bool_:
        s = F.where(attn_mask, s, -math.inf)
    # Rows with no finite score get zeros; their scores are replaced by 0 before softmax so nothing is NaN, in the
    # value or in any derivative.
    alive = F.sum(F.cast(s > -math.inf, dtype=s.dtype), axis=[-1], keepdim=True) > 0
    return F.where(alive, F.softmax(F.where(alive, s, 0.0), axis=-1), 0.0)


@op("dot_product_attention(Tensor<floating> q, Tensor<floating> k, Tensor<floating> v, Tensor? attn_mask=None, "
    "bool is_causal=False, *, float? scale=None) -> Tensor out", saves=("probs",))
def dot_product_attention(q, k, v, attn_mask, *, is_causal, scale, save=None):
    """softmax(q·kᵀ·scale + mask)·v for q (..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev); batch dims
    broadcast. ``scale`` defaults to 1/√E. ``attn_mask`` (broadcast to (..., L, S)) is boolean (True: may attend)
    or added to the scores; ``is_causal`` lets query i attend to keys j <= i. A query that may attend to nothing
    gets zeros, as in torch. ``F.scaled_dot_product_attention`` (torch's function, which adds dropout of the
    weights) calls it. A recorded call keeps the softmax weights for an eager first-order backward pass; elsewhere
    (compiled, ``create_graph``) the gradient rule computes them again from q, k and the mask."""
    _validate(dot_product_attention, q, k, v, attn_mask, is_causal=is_causal, scale=scale)
    out = _attention_np(q, k, v, attn_mask, is_causal, _attention_scale(q.shape[-1], scale), save)
    return out.astype(np.result_type(q, k, v), copy=False)


@dot_product_attention.onnx
def _(g, q, k, v, attn_mask, *, is_causal, scale):
    dtype = g.outputs[0].dtype
    q, k, v = (g.cast(t, dtype) for t in (q, k, v))
    swap = [*range(k.ndim - 2), k.ndim - 1, k.ndim - 2]
    scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=swap)),
                  g.scalar(_attention_scale(q.shape[-1], scale), q))
    minus_inf = g.scalar(-np.inf, q)
    if attn_mask is not None and attn_mask.dtype == D.bool_:
        scores = g.op("Where", attn_mask, scores, minus_inf)
    elif attn_mask is not None:
        scores = g.op("Add", scores, g.cast(attn_mask, dtype))
    if is_causal:  # query i sees keys j <= i: rows (L, 1) >= columns (S,), sizes read from the shapes
        def positions(t):
            size = g.op("Squeeze", g.op("Shape", t, start=-2, end=-1), g.ints([0]))
            return g.op("Range", g.const(np.array(0, np.int64)), size, g.const(np.array(1, np.int64)))

        rows = g.op("Unsqueeze", positions(q), g.ints([1]))
        scores = g.op("Where", g.op("GreaterOrEqual", rows, positions(k)), scores, minus_inf)
    probs = g.op("Softmax", scores, axis=-1)
    probs = g.op("Where", g.op("IsNaN", probs), g.scalar(0, q), probs)  # a query that sees nothing gets zeros
    return g.op("MatMul", probs, v)


@dot_product_attention.infer
def _(q, k, v, attn_mask, *, is_causal, scale):
    name = "dot_product_attention()"
    if min(len(q.shape), len(k.shape), len(v.shape)) < 2:
        raise ShapeError(f"{name}: q, k and v need at least 2 dims (..., L, E), got shapes {q.shape}, {k.shape}, "
                         f"{v.shape}")
    if not _same_dims(q.shape[-1:], k.shape[-1:]) or not _same_dims(k.shape[-2:-1], v.shape[-2:-1]):
        raise ShapeError(f"{name}: q (..., L, E), k (..., S, E) and v (..., S, Ev) do not fit: got shapes {q.shape}, "
                         f"{k.shape}, {v.shape}")
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], op="dot_product_attention")
    scores = (*batch, q.shape[-2], k.shape[-2])
    if attn_mask is not None:
        if is_causal:
            raise ArgumentError(f"{name}: give attn_mask or is_causal=True, not both")
        if attn_mask.dtype != D.bool_ and not D.is_floating(attn_mask.dtype):
            raise ArgumentError(f"{name}: argument 'attn_mask' must be bool or floating, got {attn_mask.dtype}")
        if not _broadcasts_to(attn_mask.shape, scores):
            raise ShapeError(f"{name}: attn_mask of shape {attn_mask.shape} must broadcast to the scores' shape "
                             f"{scores}")
    return Spec((*batch, q.shape[-2], v.shape[-1]), D.promote(q.dtype, k.dtype, v.dtype))


@dot_product_attention.grad
def _(q, k, v, attn_mask, dout, probs, *, is_causal, scale, needs_input_grad):
    # out = P·v with P = softmax(S), S = q·kᵀ·scale (+ mask): dv = Pᵀ·dout, dP = dout·vᵀ, dS = softmax_grad(P, dP),
    # dq = dS·k·scale, dk = dSᵀ·q·scale, d(additive mask) = dS. The engine sums broadcast batch dims down. P is the
    # kernel's in a first-order eager backward pass, else (compiled, create_graph) computed again with ops.
    scale = _attention_scale(q.shape[-1], scale)
    p = probs if probs is not None else _attention_probs(q, k, attn_mask, is_causal, scale)
    if probs is not None and probs.dtype != q.dtype:  # a half-precision call's kernel ran in float32 (ops/half.py)
        p = F.cast(probs, dtype=_attention_probs_dtype(q, k, attn_mask))
    dp = F.matmul(dout, _swap_last(v))
    if tuple(p.shape) != tuple(dp.shape):  # v has batch dims q and k lack: P broadcasts to them in the forward
        p = F.broadcast_to(p, shape=dp.shape)
    ds = F.softmax_grad(p, dp, axis=-1)
    dq = F.matmul(ds, k) * scale if needs_input_grad[0] else None
    dk = F.matmul(_swap_last(ds), q) * scale if needs_input_grad[1] else None
    dv = F.matmul(_swap_last(p), dout) if needs_input_grad[2] else None
    return dq, dk, dv, ds if needs_input_grad[3] else None


@dot_product_attention.sbp
def _(q, k, v, attn_mask, *, is_causal, scale):
    # Each (batch, head) is an attention of its own, and each query row a softmax of its own over every key: split
    # along a batch dim (the batch, or the heads), each input split where it has that dim and whole where it
    # broadcasts along it; or split the queries, keys and values whole (not with is_causal: a row's mask depends on
    # where the row is). Every input's dims line up with the output's from the right (the mask's with the scores').
    rank = len(broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])) + 2

    def along(axis, t):
        if t is None:
            return None
        j = axis - (rank - len(t.shape))
        return S(j) if j >= 0 and t.shape[j] != 1 else B

    for axis in range(rank - 2):
        ins = tuple(along(axis, t) for t in (q, k, v, attn_mask))
        if any(layout not in (B, None) for layout in ins):
            yield ins, S(axis)
    if not is_causal and along(rank - 2, q) != B:
        yield (along(rank - 2, q), B, B, along(rank - 2, attn_mask)), S(rank - 2)


@dot_product_attention.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2)))
    yield Sample.of(rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)),
                    is_causal=True, scale=0.7)
    yield Sample.of(rng.standard_normal((2, 1, 3, 2)), rng.standard_normal((2, 2, 4, 2)),
                    rng.standard_normal((2, 4, 2)), rng.standard_normal((3, 4)))  # broadcast batch, additive mask
    mask = np.array([[True, False, True, True], [False, False, False, False], [True, True, False, True]])
    yield Sample.of(rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 3)), mask)


@function
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    """``torch.nn.functional.scaled_dot_product_attention``: the op ``dot_product_attention``; with ``dropout_p`` > 0
    its weights (computed with ops, as its gradient rule computes them) are dropped as ``F.dropout`` drops — from
    opforge's seeded generator, so ``of.manual_seed`` repeats the draw, eagerly and compiled alike (torch's
    generator draws other masks) — before they weigh the values. As torch's, it drops whenever ``dropout_p`` > 0:
    give 0 outside training."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p <= 1.0:
        raise ArgumentError(f"scaled_dot_product_attention(): argument 'dropout_p' must be a probability in [0, 1], "
                            f"got {dropout_p!r}")
    if dropout_p == 0.0:
        return called_as("scaled_dot_product_attention", "dot_product_attention", query, key, value, attn_mask,
                         is_causal, scale=scale)
    dot_product_attention.infer_fn(*(None if t is None else Spec(tuple(t.shape), t.dtype)
                                     for t in (query, key, value, attn_mask)), is_causal=is_causal, scale=scale)
    probs = _attention_probs(query, key, attn_mask, is_causal, _attention_scale(query.shape[-1], scale))
    return F.matmul(F.dropout(probs, dropout_p), value)
