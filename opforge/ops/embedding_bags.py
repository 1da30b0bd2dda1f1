"""``embedding_bag``: sums, means or maxima of bags of embedding rows, without making the rows of every bag first
(``torch.nn.functional.embedding_bag``). The gradient rule is written with ``embedding``, ``embedding_grad``, ``take``
and ``scatter_add``, so it can be differentiated again."""

import builtins

from opforge import ops as F

from ..core.errors import ArgumentError
from ._common import D, Sample, ShapeError, Spec, array_module, np, op, reduce_at

_MODES = ("sum", "mean", "max")


def _bag_count(index, offsets, include_last_offset):
    """How many bags: the rows of a 2-D index, else one per offset (less the closing one)."""
    if len(index.shape) == 2:
        return index.shape[0]
    return None if offsets.shape[0] is None else builtins.max(offsets.shape[0] - include_last_offset, 0)


def _bag_spec(index, weight, offsets, per_sample_weights, mode, include_last_offset, padding_idx):
    name = "embedding_bag()"
    if len(weight.shape) != 2:
        raise ShapeError(f"{name}: weight must be 2-D (num_embeddings, embedding_dim), got shape {weight.shape}")
    if len(index.shape) == 2:
        if offsets is not None:
            raise ShapeError(f"{name}: a 2-D index is a batch of bags of one length already: give no offsets")
    elif len(index.shape) == 1:
        if offsets is None or len(offsets.shape) != 1:
            raise ShapeError(f"{name}: a 1-D index needs 1-D offsets (where each bag starts), got "
                             f"{None if offsets is None else offsets.shape}")
    else:
        raise ShapeError(f"{name}: index must be 1-D (with offsets) or 2-D (one bag per row), got shape "
                         f"{index.shape}")
    if per_sample_weights is not None:
        if mode != "sum":
            raise ArgumentError(f"{name}: per_sample_weights are for mode 'sum' only, got mode {mode!r}")
        if tuple(per_sample_weights.shape) != tuple(index.shape):
            raise ShapeError(f"{name}: per_sample_weights must have the shape of index, {index.shape}, got "
                             f"{per_sample_weights.shape}")
    n = weight.shape[0]
    if padding_idx is not None and n is not None and not -n <= padding_idx < n:
        raise ShapeError(f"{name}: padding_idx {padding_idx} is out of range for {n} embeddings")
    dtypes = [weight.dtype] + ([] if per_sample_weights is None else [per_sample_weights.dtype])
    return Spec((_bag_count(index, offsets, include_last_offset), weight.shape[1]), D.promote(*dtypes))


def _bags_np(index, offsets, include_last_offset):
    """(the flat index, the bag of each entry, the number of bags) from the kernel's arrays."""
    if index.ndim == 2:
        return index.reshape(-1), np.repeat(np.arange(index.shape[0], like=index), index.shape[1]), index.shape[0]
    count = builtins.max(len(offsets) - include_last_offset, 0)
    if len(offsets) and (offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] > len(index)):
        raise ArgumentError(f"embedding_bag(): offsets must start at 0, never decrease and not pass the "
                            f"{len(index)} entries of index, got {offsets.tolist()}")
    if include_last_offset and (not len(offsets) or offsets[-1] != len(index)):
        # PyTorch's documented form; past it, its results depend on the mode and the dtype
        raise ArgumentError(f"embedding_bag(): with include_last_offset, the last offset closes the last bag: it "
                            f"must be {len(index)}, the number of entries, got offsets {offsets.tolist()}")
    bag = np.searchsorted(offsets[:count], np.arange(len(index), like=index), side="right") - 1
    return index, bag, count


@op('embedding_bag(nograd Tensor<int32|int64> index, Tensor<floating> weight, nograd Tensor<int32|int64>? '
    'offsets=None, *, Tensor<floating>? per_sample_weights=None, str mode="mean", bool include_last_offset=False, '
    'int? padding_idx=None) -> Tensor y')
def embedding_bag(index, weight, offsets, per_sample_weights, *, mode, include_last_offset, padding_idx):
    """``torch.nn.functional.embedding_bag``: for each bag of indices, the sum, mean or max (per feature, ``mode``)
    of the rows of ``weight`` they pick, (bags, embedding_dim). A 2-D index holds one bag per row; a 1-D index is
    cut into bags at ``offsets`` (which starts at 0; with ``include_last_offset`` its last entry, len(index),
    closes the last bag). ``per_sample_weights`` (mode "sum") scales each row first. Entries equal to
    ``padding_idx`` are left out (a mean divides by the others' count); an empty bag gives zeros. A max's gradient
    goes to the first entry of the bag that holds it. Not offered: max_norm (it rewrites the weight),
    scale_grad_by_freq, sparse."""
    spec = _bag_spec(index, weight, offsets, per_sample_weights, mode, include_last_offset, padding_idx)
    flat, bag, count = _bags_np(index, offsets, include_last_offset)
    if flat.size and (flat.min() < 0 or flat.max() >= weight.shape[0]):
        bad = flat[(flat < 0) | (flat >= weight.shape[0])][0]
        raise ArgumentError(f"embedding_bag(): index holds {int(bad)}, outside [0, {weight.shape[0]}) (the rows of "
                            f"the weight)")
    used = array_module(flat).ones(len(flat), bool)
    if padding_idx is not None:
        used &= flat != padding_idx % weight.shape[0]
    rows = weight[flat[used]]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1)[used, None]
    # (CuPy's add.at has no bfloat16: on a device the halves add up in float32, rounded once at the end)
    dtype = np.float32 if spec.dtype in D.HALF and type(weight) is not np.ndarray else spec.dtype
    rows = rows.astype(dtype, copy=False)
    y = np.zeros((count, weight.shape[1]), dtype, like=weight)
    if mode == "max":
        y.fill(-np.inf)
        reduce_at(np.maximum, y, bag[used], rows)
        y[np.isneginf(y)] = 0  # empty bags (a row of −inf would mean -inf itself, which is not a bag's max)
        return y.astype(spec.dtype, copy=False)
    array_module(y).add.at(y, bag[used], rows)
    if mode == "mean":
        y /= np.maximum(np.bincount(bag[used], minlength=count), 1)[:, None]
    return y.astype(spec.dtype, copy=False)


@embedding_bag.check
def _(*, mode, include_last_offset, padding_idx):
    if mode not in _MODES:
        raise ValueError(f"argument 'mode' must be 'sum', 'mean' or 'max', got {mode!r}")


@embedding_bag.infer
def _(index, weight, offsets, per_sample_weights, *, mode, include_last_offset, padding_idx):
    return _bag_spec(index, weight, offsets, per_sample_weights, mode, include_last_offset, padding_idx)


def _bags(index, offsets):
    """(the flat index, the bag of each entry as an int64 tensor) with ops, whatever sizes are known only at run
    time: the bag of entry i is the number of offsets at or before i, less one (a closing offset is never)."""
    if index.ndim == 2:
        row = F.cumsum(F.ones_like(index, dtype="int64"), axis=0) - 1
        return F.reshape(index, shape=[-1]), F.reshape(row, shape=[-1])
    position = F.cumsum(F.ones_like(index, dtype="int64"), axis=0) - 1
    starting = F.scatter_add(F.pad(F.zeros_like(index, dtype="int64"), pad=[0, 1]), 0, offsets,
                             F.ones_like(offsets, dtype="int64"))  # how many bags start at each position
    return index, F.take(F.cumsum(starting, axis=0), position, axis=0) - 1


@embedding_bag.grad
def _(index, weight, offsets, per_sample_weights, y, dy, *, mode, padding_idx, needs_input_grad):
    # Each entry i adds (a multiple of) row index[i] to its bag's result: its row gets back dy of its bag times
    # that multiple; per_sample_weights get the dot product of dy with the row. For max, the entry that is the
    # maximum of its bag (per feature) gets the bag's dy.
    flat, bag = _bags(index, offsets)
    used = F.ones_like(flat, dtype=dy.dtype)
    if padding_idx is not None:
        used = F.cast(flat != padding_idx % weight.shape[0], dtype=dy.dtype)
    dy_of_entry = F.take(dy, bag, axis=0)
    if mode == "max":  # the first entry of its bag equal to the bag's max gets it (per feature), as in PyTorch
        rows = F.embedding(flat, weight)
        hit = F.cast(F.logical_and(F.reshape(used, shape=[-1, 1]) > 0, rows == F.take(y, bag, axis=0)), dtype="int64")
        # A bag's entries are consecutive: the hits before entry i in its bag are the hits before i, less those
        # of the bags before it.
        per_bag = F.scatter_add(F.zeros_like(dy, dtype="int64"), 0, F.broadcast_to(F.reshape(bag, shape=[-1, 1]),
                                                                              shape=[-1, dy.shape[1]]), hit)
        before_bag = F.cumsum(per_bag, axis=0) - per_bag
        first = F.logical_and(hit > 0, F.cumsum(hit, axis=0) - hit == F.take(before_bag, bag, axis=0))
        return None, F.embedding_grad(F.where(first, dy_of_entry, 0), flat, num_embeddings=weight.shape[0]), None, None
    share = used
    if mode == "mean":
        counts = F.scatter_add(F.zeros_like(F.sum(dy, axis=1)), 0, bag, used)
        share = used / F.take(F.clip(counts, min=1), bag, axis=0)
    dweight = dpsw = None
    if per_sample_weights is not None:
        psw = F.reshape(per_sample_weights, shape=[-1])
        if needs_input_grad[3]:
            rows = F.embedding(flat, weight)
            dpsw = F.reshape(F.sum(dy_of_entry * rows, axis=1) * share, shape=per_sample_weights.shape)
        share = share * psw
    if needs_input_grad[1]:
        dweight = F.embedding_grad(dy_of_entry * F.reshape(share, shape=[-1, 1]), flat,
                                   num_embeddings=weight.shape[0])
    return None, dweight, None, dpsw


@embedding_bag.samples
def _(rng):
    weight = rng.standard_normal((6, 3))
    yield Sample.of(np.array([[0, 2, 5], [1, 1, 4]]), weight)
    yield Sample.of(np.array([0, 2, 5, 1, 1, 4, 3]), weight, np.array([0, 3, 3, 5]), mode="sum")  # an empty bag
    yield Sample.of(np.array([0, 2, 5, 1, 4]), weight, np.array([0, 2]), rng.standard_normal(5), mode="sum")
    yield Sample.of(np.array([[0, 2, 5], [1, 3, 1]]), weight, mode="max")  # row 1 twice in a bag: once counts
    yield Sample.of(np.array([3, 2, 5, 1, 3, 4]), weight, np.array([0, 1, 4, 6]), mode="max", include_last_offset=True)
    yield Sample.of(np.array([0, 2, 2, 1, 2]), weight, np.array([0, 3]), padding_idx=2)


# -- ONNX export: each entry's row gathered, then added (or maxed) into its bag with ScatterElements -------------


@embedding_bag.onnx
def _(g, index, weight, offsets, per_sample_weights, *, mode, include_last_offset, padding_idx):
    i64 = np.dtype(np.int64)
    dtype = g.outputs[0].dtype
    weight = g.cast(weight, dtype)
    zero, one = g.const(np.array(0, np.int64)), g.const(np.array(1, np.int64))
    if index.ndim == 2:  # bag b holds row b of the index
        flat = g.op("Reshape", g.cast(index, i64), g.ints([-1]), spec=Spec((None,), i64))
        count = g.op("Shape", index, start=0, end=1, spec=Spec((1,), i64))
        bags = g.op("Range", zero, g.op("Squeeze", count, g.ints([0])), one, spec=Spec((None,), i64))
        bag = g.op("Reshape", g.op("Expand", g.op("Unsqueeze", bags, g.ints([1])), g.op("Shape", index)),
                   g.ints([-1]), spec=Spec((None,), i64))
    else:  # the bag of entry i: how many of the bags' offsets are at or before i, less one (the kernel's searchsorted)
        flat = g.cast(index, i64)
        starts = g.cast(offsets, i64)
        if include_last_offset:
            starts = g.op("Slice", starts, g.ints([0]), g.ints([-1]), g.ints([0]), spec=Spec((None,), i64))
        count = g.op("Shape", starts, spec=Spec((1,), i64))
        positions = g.op("Range", zero, g.op("Squeeze", g.op("Shape", flat), g.ints([0])), one, spec=Spec((None,), i64))
        started = g.op("LessOrEqual", g.op("Unsqueeze", starts, g.ints([0])), g.op("Unsqueeze", positions, g.ints([1])),
                       spec=Spec((None, None), D.bool_))  # (entries, bags)
        bag = g.op("Sub", g.reduce("ReduceSum", g.cast(started, i64), [1], False, spec=Spec((None,), i64)), one)
    rows = g.op("Gather", weight, flat, axis=0, spec=Spec((None, weight.shape[1]), dtype))
    if per_sample_weights is not None:
        scale = g.op("Reshape", g.cast(per_sample_weights, dtype), g.ints([-1, 1]))
        rows = g.op("Mul", rows, scale, spec=rows.spec)
    used = None
    if padding_idx is not None:  # entries of the padding row are left out (of a mean's count too)
        n = weight.shape[0] if weight.shape[0] is not None else g.unsupported("padding_idx with a run-time table size")
        used = g.op("Unsqueeze", g.op("Not", g.op("Equal", flat, g.const(np.array(padding_idx % n, np.int64)))),
                    g.ints([1]))
    shape = g.op("Concat", count, g.op("Shape", weight, start=1, end=2), axis=0)
    targets = g.op("Expand", g.op("Unsqueeze", bag, g.ints([1])), g.op("Shape", rows))
    if mode == "max":
        low = g.scalar(-np.inf, rows)
        if used is not None:
            rows = g.op("Where", used, rows, low, spec=rows.spec)
        if g.opset >= 18:
            y = g.op("ScatterElements", g.filled(shape, -np.inf, dtype), targets, rows, axis=0, reduction="max")
        else:  # no ScatterElements 'max' before 18: each bag's max over a (bags, entries, dim) table of its rows
            bags = g.op("Range", zero, g.op("Squeeze", count, g.ints([0])), one, spec=Spec((None,), i64))
            member = g.op("Equal", g.op("Unsqueeze", bag, g.ints([0])), g.op("Unsqueeze", bags, g.ints([1])))
            table = g.op("Where", g.op("Unsqueeze", member, g.ints([2])), g.op("Unsqueeze", rows, g.ints([0])), low,
                         spec=Spec((None, None, weight.shape[1]), dtype))
            y = g.reduce("ReduceMax", table, [1], False, spec=g.outputs[0])
        return g.op("Where", g.op("IsInf", y, detect_positive=0), g.scalar(0, rows), y, spec=g.outputs[0])
    if used is not None:
        rows = g.op("Where", used, rows, g.scalar(0, rows), spec=rows.spec)
    y = g.op("ScatterElements", g.filled(shape, 0, dtype), targets, rows, axis=0, reduction="add", spec=g.outputs[0])
    if mode == "sum":
        return y
    counted = g.filled(g.op("Shape", bag), 1, dtype) if used is None else g.cast(g.op("Squeeze", used, g.ints([1])),
                                                                                  dtype)
    counts = g.op("ScatterElements", g.filled(count, 0, dtype), bag, counted, axis=0, reduction="add")
    return g.op("Div", y, g.op("Unsqueeze", g.op("Max", counts, g.scalar(1, rows)), g.ints([1])), spec=g.outputs[0])
