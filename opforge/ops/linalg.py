"""Matrix products."""

from opforge import ops as F

from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, op


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
