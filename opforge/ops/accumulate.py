"""Summing many tensors at once: what a backward pass uses where a gradient arrives more than once."""

from opforge import ops as F  # noqa: F401

from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, np, op


@op("add_n(Tensor[] xs) -> Tensor y")
def add_n(xs):
    """x₀ + x₁ + … in one op (all of one shape, or broadcasting together)."""
    total = np.add(xs[0], xs[1]) if len(xs) > 1 else xs[0].copy()
    for x in xs[2:]:
        if np.result_type(total, x) == total.dtype and np.broadcast_shapes(total.shape, x.shape) == total.shape:
            np.add(total, x, out=total)  # total is our own fresh array: accumulate into it
        else:
            total = total + x
    return total


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
