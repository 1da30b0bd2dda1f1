"""Summing many tensors at once: what a backward pass uses where a gradient arrives more than once."""

from opforge import ops as F  # noqa: F401

from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, np, op, promoted


@op("add_n(Tensor[] xs) -> Tensor y", inplace={"y": "xs"})
def add_n(xs, out=None):
    """x₀ + x₁ + … in one op (all of one shape, or broadcasting together).

    Given ``out`` (a dead buffer, possibly one of the summands: MXNet's add-to request), the sum accumulates
    into it instead of allocating.
    """
    first = xs[0].dtype
    if not all(x.dtype is first for x in xs):  # NumPy would promote otherwise than PyTorch
        xs = promoted(*xs, dtype=D.promote(*(x.dtype for x in xs)))
    if out is None:
        total = np.add(xs[0], xs[1]) if len(xs) > 1 else xs[0].copy()
        if not total.ndim:  # 0-d: NumPy gives a scalar, which cannot be added into; [...] is it as a 0-d array
            total = total[...]
        rest = xs[2:]
    else:
        into = next((i for i, x in enumerate(xs) if x is out), None)
        if into is None:
            np.add(xs[0], xs[1], out=out) if len(xs) > 1 else np.copyto(out, xs[0])
            rest = xs[2:]
        else:
            rest = xs[:into] + xs[into + 1:]
        total = out
    for x in rest:  # (the common case first: NumPy's result_type and broadcast_shapes cost 10 µs or more cold)
        if (x.shape == total.shape and x.dtype == total.dtype) or (
                np.result_type(total, x) == total.dtype and np.broadcast_shapes(total.shape, x.shape) == total.shape):
            np.add(total, x, out=total)  # total is our own array: accumulate into it
        else:
            total = total + x
    return total


@add_n.onnx
def _(g, xs):
    dtype = g.outputs[0].dtype
    return g.op("Sum", *(g.cast(x, dtype) for x in xs), spec=g.outputs[0])


@add_n.infer
def _(xs):
    if not xs:
        raise ShapeError("add_n(): needs at least one tensor")
    return Spec(broadcast_shapes(*(x.shape for x in xs), op="add_n"), D.promote(*(x.dtype for x in xs)))


@add_n.grad
def _(dy):
    return dy  # the same gradient for every summand (the engine sums it down where one was broadcast)


@add_n.samples
def _(rng):
    yield Sample.of([rng.standard_normal((2, 3)) for _ in range(3)])
    yield Sample.of([rng.standard_normal((2, 3)), rng.standard_normal(3)])
    yield Sample.of([rng.standard_normal(())])
