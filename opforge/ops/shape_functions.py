"""torch's shape functions that ``shape.py`` lacks, each written with its shape ops (so their gradients and
tracing are those ops'): tensor_split, hstack/vstack/dstack, atleast_1d/2d/3d, meshgrid, rot90, diag, diag_embed,
diagflat, broadcast_tensors, cartesian_prod, combinations, vander, and ``unfold_windows`` (``Tensor.unfold``:
torch's sliding windows along one dim, not ``F.unfold``'s im2col).
"""

import itertools

from opforge import ops as F

from ..core.errors import ArgumentError, ShapeError
from ._common import D, broadcast_shapes, function, np


def _dim(name: str, dim, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise ArgumentError(f"{name}(): argument 'dim' must be an int, got {dim!r}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ShapeError(f"{name}(): dim {dim} is out of range for a tensor of rank {ndim}")
    return int(dim) % max(ndim, 1)


def _tensors(name: str, tensors) -> tuple:
    """torch's ``f(a, b, c)`` and ``f([a, b, c])`` alike."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if not tensors:
        raise ArgumentError(f"{name}(): needs at least one tensor")
    return tuple(tensors)


@function
def tensor_split(input, indices_or_sections, dim=0):
    """``torch.tensor_split``: views of ``input`` along ``dim`` — ``n`` pieces (the first size % n one longer),
    or the pieces between the given split indices (clamped to the size, so some may be empty). A tuple."""
    d = _dim("tensor_split", dim, len(input.shape))
    size = input.shape[d]
    if hasattr(indices_or_sections, "shape"):  # a tensor: 0-d sections or 1-D indices, as torch reads it
        indices_or_sections = indices_or_sections.numpy().tolist()
    if isinstance(indices_or_sections, (int, np.integer)) and not isinstance(indices_or_sections, bool):
        n = int(indices_or_sections)
        if n < 1:
            raise ArgumentError(f"tensor_split(): the number of sections must be >= 1, got {n}")
        bounds = [i * (size // n) + min(i, size % n) for i in range(n + 1)]
    elif isinstance(indices_or_sections, (list, tuple)):
        bounds = [0, *(min(max(int(i) + size if i < 0 else int(i), 0), size) for i in indices_or_sections), size]
    else:
        raise ArgumentError(f"tensor_split(): indices_or_sections must be an int or a sequence of ints, got "
                            f"{indices_or_sections!r}")
    return tuple(F.slice(input, axes=[d], starts=[a], ends=[max(a, b)], steps=[1])
                 for a, b in itertools.pairwise(bounds))


@function
def atleast_1d(*tensors):
    """``torch.atleast_1d``: a 0-d tensor as (1,), the others as they are; one tensor for one, else a tuple."""
    single = len(tensors) == 1 and not isinstance(tensors[0], (list, tuple))
    out = tuple(F.reshape(t, shape=[1]) if not t.shape else t for t in _tensors("atleast_1d", tensors))
    return out[0] if single else out


@function
def atleast_2d(*tensors):
    """``torch.atleast_2d``: 0-d as (1, 1), (n,) as (1, n), the others as they are."""
    single = len(tensors) == 1 and not isinstance(tensors[0], (list, tuple))
    out = tuple(F.reshape(t, shape=[1, *t.shape]) if len(t.shape) == 1 else F.reshape(t, shape=[1, 1])
                if not t.shape else t for t in _tensors("atleast_2d", tensors))
    return out[0] if single else out


@function
def atleast_3d(*tensors):
    """``torch.atleast_3d``: 0-d as (1, 1, 1), (n,) as (1, n, 1), (m, n) as (m, n, 1), the others as they are."""
    def fit(t):
        shape = list(t.shape)
        if len(shape) >= 3:
            return t
        return F.reshape(t, shape={0: [1, 1, 1], 1: [1, *shape, 1], 2: [*shape, 1]}[len(shape)])

    single = len(tensors) == 1 and not isinstance(tensors[0], (list, tuple))
    out = tuple(fit(t) for t in _tensors("atleast_3d", tensors))
    return out[0] if single else out


@function
def hstack(tensors):
    """``torch.hstack``: concatenated along dim 1 (dim 0 for 1-D tensors), after atleast_1d."""
    parts = atleast_1d(list(tensors))
    return F.concat(list(parts), 0 if len(parts[0].shape) == 1 else 1)


@function
def vstack(tensors):
    """``torch.vstack`` (``row_stack``): concatenated along dim 0, after atleast_2d."""
    return F.concat(list(atleast_2d(list(tensors))), 0)


@function
def dstack(tensors):
    """``torch.dstack``: concatenated along dim 2, after atleast_3d."""
    return F.concat(list(atleast_3d(list(tensors))), 2)


@function
def broadcast_tensors(*tensors):
    """``torch.broadcast_tensors``: each tensor broadcast to the shape they broadcast to together. A tuple."""
    tensors = _tensors("broadcast_tensors", tensors)
    shape = list(broadcast_shapes(*(tuple(t.shape) for t in tensors), op="broadcast_tensors"))
    return tuple(t if list(t.shape) == shape else F.broadcast_to(t, shape=shape) for t in tensors)


@function
def meshgrid(*tensors, indexing=None):
    """``torch.meshgrid``: for 1-D (or 0-d) tensors of sizes n₁ … n_k, k tensors of shape (n₁, …, n_k), the i-th
    varying along dim i ("ij", torch's default) — or with indexing="xy" the first two dims swapped (NumPy's
    default). A tuple."""
    tensors = _tensors("meshgrid", tensors)
    indexing = "ij" if indexing is None else indexing
    if indexing not in ("ij", "xy"):
        raise ArgumentError(f"meshgrid(): indexing must be 'ij' or 'xy', got {indexing!r}")
    if any(len(t.shape) > 1 for t in tensors):
        raise ShapeError(f"meshgrid(): expects 0-d or 1-D tensors, got shapes {[tuple(t.shape) for t in tensors]}")
    flat = [F.reshape(t, shape=[-1]) if not t.shape else t for t in tensors]
    swap = indexing == "xy" and len(flat) >= 2
    if swap:
        flat[0], flat[1] = flat[1], flat[0]
    shape = [t.shape[0] for t in flat]
    grids = [F.broadcast_to(F.reshape(t, shape=[1] * i + [-1] + [1] * (len(flat) - i - 1)), shape=shape)
             for i, t in enumerate(flat)]
    if swap:  # (n₂, n₁, …) grids, the first varying along dim 1: NumPy's "xy"
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def _swap(x, a: int, b: int):
    perm = list(range(len(x.shape)))
    perm[a], perm[b] = perm[b], perm[a]
    return F.transpose(x, perm=perm)


@function
def rot90(input, k=1, dims=(0, 1)):
    """``torch.rot90``: ``input`` turned by k·90° in the plane of ``dims``, from the first dim towards the second
    (k may be negative)."""
    ndim = len(input.shape)
    if len(dims) != 2 or ndim < 2:
        raise ShapeError(f"rot90(): needs two dims of a tensor of rank >= 2, got dims {list(dims)} and shape "
                         f"{tuple(input.shape)}")
    a, b = _dim("rot90", dims[0], ndim), _dim("rot90", dims[1], ndim)
    if a == b:
        raise ShapeError(f"rot90(): the two dims must differ, got {list(dims)}")
    k = int(k) % 4
    if k == 0:
        return F.identity(input)
    if k == 2:
        return F.flip(input, [a, b])
    return _swap(F.flip(input, [b if k == 1 else a]), a, b)


@function
def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """``torch.diag_embed``: a tensor with one dim more whose (``dim1``, ``dim2``) planes hold the last dim of
    ``input`` on their diagonal ``offset``, zeros elsewhere (diagonal's adjoint: ``diagonal_grad``)."""
    shape = list(input.shape)
    if not shape:
        raise ShapeError("diag_embed(): the input must have at least one dim, got a 0-d tensor")
    ndim = len(shape) + 1
    a, b = _dim("diag_embed", dim1, ndim), _dim("diag_embed", dim2, ndim)
    if a == b:
        raise ShapeError(f"diag_embed(): dim1 and dim2 must differ, got {dim1} and {dim2}")
    n = shape[-1] + abs(offset)
    out, rest = [], iter(shape[:-1])
    for i in range(ndim):
        out.append(n if i in (a, b) else next(rest))
    return F.diagonal_grad(input, shape=out, offset=offset, axis1=a, axis2=b)


@function
def diag(input, diagonal=0):
    """``torch.diag``: of a 1-D tensor, the square matrix with it on diagonal ``diagonal``; of a 2-D one, that
    diagonal."""
    if len(input.shape) == 1:
        return diag_embed(input, diagonal)
    if len(input.shape) == 2:
        return F.diagonal(input, diagonal)
    raise ShapeError(f"diag(): expects a 1-D or 2-D tensor, got shape {tuple(input.shape)}")


@function
def diagflat(input, offset=0):
    """``torch.diagflat``: the square matrix with the flattened input on diagonal ``offset``."""
    return diag_embed(F.reshape(input, shape=[-1]), offset)


@function
def unfold_windows(input, dimension, size, step):
    """``Tensor.unfold(dimension, size, step)`` (torch's, not ``F.unfold``'s im2col): the windows of ``size``
    elements every ``step`` along ``dimension``, that dim becoming the number of windows and a last dim of
    ``size`` added. The windows may overlap; their gradients add up (``take``'s)."""
    ndim = len(input.shape)
    d = _dim("unfold", dimension, ndim) if ndim else 0
    length = input.shape[d] if ndim else 1
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 0 <= size <= length:
        raise ShapeError(f"unfold(): size {size!r} must be an int in [0, {length}] (the size of dim {dimension})")
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ArgumentError(f"unfold(): step must be an int >= 1, got {step!r}")
    if not ndim:  # torch: a 0-d tensor as one element
        return F.reshape(input, shape=[size])
    count = (length - size) // step + 1
    index = F.unsqueeze(F.arange(start=0, stop=count * step, step=step, dtype="int64"), axis=1) + F.arange(
        start=0, stop=size, dtype="int64")  # (windows, size): the positions each window reads
    windows = F.take(input, index, axis=d)  # (..., windows, size, ...) at d
    perm = [*range(d + 1), *range(d + 2, ndim + 1), d + 1]
    return F.transpose(windows, perm=perm)


@function
def cartesian_prod(*tensors):
    """``torch.cartesian_prod``: the rows of every combination of one element from each 1-D tensor, the last
    varying fastest, as a (n₁·…·n_k, k) tensor (one tensor: that tensor itself). The tensors must have one
    dtype, as torch's meshgrid requires."""
    tensors = _tensors("cartesian_prod", tensors)
    for t in tensors:
        if len(t.shape) != 1:
            raise ShapeError(f"cartesian_prod(): expects 1-D tensors, got shape {tuple(t.shape)}")
    if len({t.dtype for t in tensors}) > 1:
        raise ArgumentError(f"cartesian_prod(): the tensors must have one dtype (as in torch), got "
                            f"{[str(t.dtype) for t in tensors]}")
    if len(tensors) == 1:
        return tensors[0]
    return F.stack([F.reshape(g, shape=[-1]) for g in meshgrid(*tensors, indexing="ij")], axis=1)


@function
def combinations(input, r=2, with_replacement=False):
    """``torch.combinations``: the combinations of ``r`` elements of the 1-D ``input`` (itertools' combinations,
    or combinations_with_replacement), in lexicographic order of positions, as a (count, r) tensor; r=0 gives an
    empty 1-D tensor, as torch's."""
    if len(input.shape) != 1:
        raise ShapeError(f"combinations(): expects a 1-D tensor, got shape {tuple(input.shape)}")
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        raise ArgumentError(f"combinations(): argument 'r' must be an int >= 0, got {r!r}")
    n = input.shape[0]
    if r == 0 or n == 0:
        return F.reshape(input, shape=[0, r]) if r else F.narrow(input, 0, 0, 0)
    ordered = (lambda p: all(a <= b for a, b in itertools.pairwise(p))) if with_replacement else \
        (lambda p: all(a < b for a, b in itertools.pairwise(p)))
    # the positions of the r-tuples kept, among all n^r in lexicographic order: indices made with ops (no array
    # constant), so the same code traces into a program
    keep = [int(ordered(p)) for p in itertools.product(range(n), repeat=r)]
    flat = F.repeat_interleave(F.arange(start=0, stop=n ** r, dtype="int64"), repeats=keep, axis=0)
    return F.take(input, F.stack([(flat // n ** (r - 1 - j)) % n for j in range(r)], axis=1), axis=0)


@function
def vander(x, N=None, increasing=False):
    """``torch.vander``: the Vandermonde matrix of the 1-D ``x``, ``N`` columns (len(x) by default) of the powers
    x⁰ … x^(N−1), decreasing unless ``increasing``; integers and bools in int64, as torch's (the powers are
    running products: torch's cumprod)."""
    if len(x.shape) != 1:
        raise ShapeError(f"vander(): x must be a one-dimensional tensor, got shape {tuple(x.shape)}")
    n = x.shape[0] if N is None else N
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ArgumentError(f"vander(): argument 'N' must be an int >= 0 or None, got {N!r}")
    column = F.unsqueeze(F.cast(x, dtype=D.promote(x.dtype, D.int64)), axis=1)
    if n == 0:
        return F.narrow(column, 1, 0, 0)
    powers = F.ones_like(column)
    if n > 1:
        powers = F.concat([powers, F.cumprod(F.broadcast_to(column, shape=[x.shape[0], n - 1]), axis=1)], axis=1)
    return powers if increasing else F.flip(powers, [1])
