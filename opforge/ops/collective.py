"""Collectives: ops whose kernels talk to the other ranks, through the current communicator.

Each is an ordinary op — signature, kernel, shape rule, gradient rule, samples — so programs and eager code that
call them differentiate with the same machinery. The kernel asks ``opforge.distributed.current_communicator()``
(the world after ``of.distributed.init()``, one rank on its own before; the shape rules ask it for the group's
size) and hands it the arrays: the kernels are the CPU's (MPI takes host arrays); a GPU device registers the same
body for its arrays with a NCCL communicator (docs/distributed.md).

Gradients are those of the SPMD program as a whole: with every rank r holding its input x_r, output y_r and
output gradient dy_r, the gradient of x_s is that of Σ_r <dy_r, y_r>. So the gradient of a collective is its dual
collective: all_reduce(sum) ↔ all_reduce(sum), all_gather ↔ reduce_scatter, broadcast ↔ reduce, all_to_all ↔
all_to_all with its axes swapped. On one rank every collective is an identity, which the conformance suite checks;
``tests/test_oracle_collective.py`` checks them on two ranks against PyTorch, values and gradients.
"""

from opforge import ops as F

from ..core.comm import REDUCE_OPS, group_communicator
from ._common import P, S, Sample, ShapeError, Spec, op


def _size(group=None, op_name="a collective") -> int:
    return group_communicator(group, op_name).size


def _check_op(op_name: str, allowed=REDUCE_OPS) -> None:
    if op_name not in allowed:
        raise ValueError(f"argument 'op' must be one of {list(allowed)}, got {op_name!r}")


def _check_group(group) -> None:
    if group is not None and group < 0:
        raise ValueError(f"argument 'group' must be an axis of the n-D mesh (>= 0) or None, got {group}")


def _check_root(root: int, group=None) -> None:
    _check_group(group)
    size = _size() if group is None else None  # (an axis's group size is known where the collective runs)
    if size is not None and not 0 <= root < size:
        raise ValueError(f"argument 'root' must be a rank of the group (0 to {size - 1}), got {root}")


def _axis(what: str, shape: tuple, axis: int) -> int:
    if not shape:
        raise ShapeError(f"{what}(): needs a tensor of rank >= 1 to split or join along an axis, got a 0-d tensor")
    if not -len(shape) <= axis < len(shape):
        raise ShapeError(f"{what}(): axis {axis} is out of range for a tensor of rank {len(shape)}")
    return axis % len(shape)


def _scaled(shape: tuple, axis: int, factor: int, what: str, group=None) -> tuple:
    """``shape`` with dim ``axis`` multiplied (factor > 0) or divided (factor < 0) by the group size."""
    size, d = _size(group, what), shape[axis]
    if d is not None and factor < 0 and d % size:
        raise ShapeError(f"{what}(): dim {axis} of shape {tuple(shape)} does not split into {size} equal blocks "
                         "(one per rank)")
    new = None if d is None else (d * size if factor > 0 else d // size)
    return (*shape[:axis], new, *shape[axis + 1:])


def _float_samples(rng, shapes):
    for shape, attrs in shapes:
        yield Sample.of(rng.standard_normal(shape), **attrs)


# -- all_reduce -------------------------------------------------------------------------------------------------


@op("all_reduce(Tensor<number> x, *, str op=\"sum\", int? group=None) -> Tensor y")
def all_reduce(x, *, op, group):
    """Every rank gets the elementwise sum, mean or max of ``x`` over the ranks (of the current communicator, or of
    axis ``group`` of the current n-D mesh: so for every collective)."""
    return group_communicator(group, "all_reduce").all_reduce(x, op)


@all_reduce.check
def _(*, op, group):
    _check_op(op)
    _check_group(group)


def _like_x(x, **_):
    """Not the elementwise trait: a collective is no elementwise op for the SBP pass, nor for NaN checks."""
    return x


all_reduce.infer(_like_x)


@all_reduce.grad
def _(x, y, dy, *, op, group):
    if op != "max":  # sum and mean are linear: the gradient of Σ_r <dy_r, y> is the same reduction of dy
        return F.all_reduce(dy, op=op, group=group)
    # The max reaches every rank holding it, in equal shares when several do (as torch's amax).
    hit = F.cast(F.equal(x, y), dtype=dy.dtype)
    return F.all_reduce(dy, op="sum", group=group) * hit / F.all_reduce(hit, op="sum", group=group)


@all_reduce.samples
def _(rng):
    yield from _float_samples(rng, [((2, 3), {}), ((4,), {"op": "mean"}), ((), {}), ((3, 2), {"op": "max"})])


# -- all_gather and reduce_scatter ------------------------------------------------------------------------------


@op("all_gather(Tensor<number> x, *, int axis=0, int? group=None) -> Tensor y")
def all_gather(x, *, axis, group):
    """Every rank gets the ranks' ``x`` concatenated along ``axis``, in rank order."""
    return group_communicator(group, "all_gather").all_gather(x, axis)


all_gather.check(lambda *, axis, group: _check_group(group))


@all_gather.infer
def _(x, *, axis, group):
    return Spec(_scaled(x.shape, _axis("all_gather", x.shape, axis), 1, "all_gather", group), x.dtype)


@all_gather.grad
def _(dy, *, axis, group):
    return F.reduce_scatter(dy, axis=axis, op="sum", group=group)


@all_gather.samples
def _(rng):
    yield from _float_samples(rng, [((2, 3), {}), ((2, 3), {"axis": 1}), ((4,), {"axis": -1})])


@op("reduce_scatter(Tensor<number> x, *, int axis=0, str op=\"sum\", int? group=None) -> Tensor y")
def reduce_scatter(x, *, axis, op, group):
    """Rank r gets block r, along ``axis``, of the elementwise sum (or mean) of ``x`` over the ranks."""
    return group_communicator(group, "reduce_scatter").reduce_scatter(x, axis, op)


@reduce_scatter.check
def _(*, axis, op, group):
    _check_op(op, ("sum", "mean"))
    _check_group(group)


@reduce_scatter.infer
def _(x, *, axis, op, group):
    return Spec(_scaled(x.shape, _axis("reduce_scatter", x.shape, axis), -1, "reduce_scatter", group), x.dtype)


@reduce_scatter.grad
def _(dy, *, axis, op, group):
    dx = F.all_gather(dy, axis=axis, group=group)
    return dx if op == "sum" else F.scale(dx, scale=1.0 / _size(group))


@reduce_scatter.samples
def _(rng):
    size = _size()
    yield from _float_samples(rng, [((2 * size, 3), {}), ((2, 2 * size), {"axis": 1, "op": "mean"})])


# -- broadcast and reduce ---------------------------------------------------------------------------------------


@op("broadcast(Tensor<number> x, *, int root=0, int? group=None) -> Tensor y")
def broadcast(x, *, root, group):
    """Every rank gets rank ``root``'s ``x``."""
    return group_communicator(group, "broadcast").broadcast(x, root)


@broadcast.check
def _(*, root, group):
    _check_root(root, group)


broadcast.infer(_like_x)


@broadcast.grad
def _(dy, *, root, group):
    return F.reduce(dy, root=root, op="sum", group=group)


@broadcast.samples
def _(rng):
    yield from _float_samples(rng, [((2, 3), {}), ((), {})])


@op("reduce(Tensor<number> x, *, int root=0, str op=\"sum\", int? group=None) -> Tensor y")
def reduce(x, *, root, op, group):
    """Rank ``root`` gets the elementwise sum (or mean) of ``x`` over the ranks; the other ranks get zeros."""
    return group_communicator(group, "reduce").reduce(x, root, op)


@reduce.check
def _(*, root, op, group):
    _check_root(root, group)
    _check_op(op, ("sum", "mean"))


reduce.infer(_like_x)


@reduce.grad
def _(dy, *, root, op, group):
    dx = F.broadcast(dy, root=root, group=group)
    return dx if op == "sum" else F.scale(dx, scale=1.0 / _size(group))


@reduce.samples
def _(rng):
    yield from _float_samples(rng, [((2, 3), {}), ((3,), {"op": "mean"})])


# -- all_to_all -------------------------------------------------------------------------------------------------


@op("all_to_all(Tensor<number> x, *, int split_axis=0, int concat_axis=0, int? group=None) -> Tensor y")
def all_to_all(x, *, split_axis, concat_axis, group):
    """``x`` is cut into one block per rank along ``split_axis``; block j goes to rank j, which concatenates the
    blocks it receives in rank order along ``concat_axis`` (resharding S(split) to S(concat))."""
    return group_communicator(group, "all_to_all").all_to_all(x, split_axis, concat_axis)


all_to_all.check(lambda *, split_axis, concat_axis, group: _check_group(group))


@all_to_all.infer
def _(x, *, split_axis, concat_axis, group):
    split = _axis("all_to_all", x.shape, split_axis)
    concat = _axis("all_to_all", x.shape, concat_axis)
    shape = _scaled(x.shape, split, -1, "all_to_all", group)
    return Spec(_scaled(shape, concat, 1, "all_to_all", group), x.dtype)


@all_to_all.grad
def _(dy, *, split_axis, concat_axis, group):
    return F.all_to_all(dy, split_axis=concat_axis, concat_axis=split_axis, group=group)


@all_to_all.samples
def _(rng):
    size = _size()
    yield from _float_samples(rng, [((2 * size, 3), {}), ((2 * size, 3), {"split_axis": 0, "concat_axis": 1}),
                                    ((2, 2 * size, 1), {"split_axis": 1, "concat_axis": -1})])


# -- layouts over another axis of an n-D mesh ---------------------------------------------------------------------
# A collective over one axis's group, seen from another axis (whose ranks each hold a block, or a part, of its
# input): each rank of that other axis runs it on its own block, so a split along a dim the collective neither cuts
# nor joins stays split, and a linear one (sums, gathers, moves) maps parts that add up to parts that add up.


def _elsewhere(x, *, moved=(), linear=True, **_):
    for k in range(len(x.shape)):
        if k not in moved:
            yield (S(k),), S(k)
    if linear:
        yield (P,), P


all_reduce.sbp(lambda x, *, op, group: _elsewhere(x, linear=op != "max"))
all_gather.sbp(lambda x, *, axis, group: _elsewhere(x, moved={axis % max(len(x.shape), 1)}))
reduce_scatter.sbp(lambda x, *, axis, op, group: _elsewhere(x, moved={axis % max(len(x.shape), 1)}))
broadcast.sbp(lambda x, *, root, group: _elsewhere(x))
reduce.sbp(lambda x, *, root, op, group: _elsewhere(x))
all_to_all.sbp(lambda x, *, split_axis, concat_axis, group: _elsewhere(
    x, moved={split_axis % max(len(x.shape), 1), concat_axis % max(len(x.shape), 1)}))

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "reduce", "reduce_scatter"]

