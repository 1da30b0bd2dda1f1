"""Sparse COO matrices times dense ones: ``sparse_mm``, the op under ``of.sparse.mm`` (``torch.sparse.mm``).

A COO matrix is given as its parts — ``indices`` (2, nnz) (row and column of each stored value), ``values`` (nnz,)
and ``size`` (rows, columns) — so the op is an ordinary one: it records into programs and autograd, and its
gradient rule is written with ops. Entries that repeat a position are summed, as torch sums an uncoalesced tensor's.
"""

from opforge import ops as F

from ..core.errors import ArgumentError
from ._common import Sample, ShapeError, Spec, np, op


def _spec(indices, values, dense, size):
    """The output Spec, after checking the parts fit (Specs or arrays)."""
    if len(size) != 2 or any(n < 0 for n in size):
        raise ShapeError(f"sparse_mm(): size must be (rows, columns) of a sparse matrix, got {list(size)}")
    if len(indices.shape) != 2 or indices.shape[0] not in (2, None):
        raise ShapeError(f"sparse_mm(): indices must have shape (2, nnz), got {tuple(indices.shape)}")
    nnz = {values.shape[0] if values.shape else None, indices.shape[1]} - {None}
    if len(values.shape) != 1 or len(nnz) > 1:
        raise ShapeError(f"sparse_mm(): values must have shape (nnz,) = ({indices.shape[1]},), got "
                         f"{tuple(values.shape)}")
    if len(dense.shape) != 2 or dense.shape[0] not in (size[1], None):
        raise ShapeError(f"sparse_mm(): a sparse matrix of size {tuple(size)} multiplies a dense matrix of "
                         f"{size[1]} rows, got shape {tuple(dense.shape)}")
    if values.dtype != dense.dtype:
        raise ArgumentError(f"sparse_mm(): values are {values.dtype} and the dense matrix {dense.dtype}; convert one "
                            "(as torch, which refuses two dtypes)")
    return Spec((size[0], dense.shape[1]), dense.dtype)


@op("sparse_mm(nograd Tensor<int32|int64> indices, Tensor<floating> values, Tensor<floating> dense, *, int[] size) "
    "-> Tensor out")
def sparse_mm(indices, values, dense, *, size, xp=np):
    """The sparse matrix of ``size`` holding ``values`` at (``indices[0]``, ``indices[1]``) (repeated positions
    summed) times ``dense``: out[i] = Σₑ values[e]·dense[indices[1, e]] over the entries e of row i —
    ``torch.sparse.mm``. Its gradient for the values is a sampled product (⟨dout[row], dense[col]⟩ per entry),
    for the dense matrix the transposed sparse matrix times dout."""
    rows, cols, wide = _checked(indices, values, dense, size)
    terms = values.astype(wide, copy=False)[:, None] * dense.astype(wide, copy=False)[cols]  # (entries, columns)
    out = xp.zeros((size[0], dense.shape[1]), wide)
    xp.add.at(out, rows, terms)  # each entry's row of terms added to its row
    return out.astype(dense.dtype, copy=False)


@sparse_mm.kernel(device="cpu")
def _(indices, values, dense, *, size):
    # SciPy's CSR product: no (entries, columns) array of terms, faster on the host
    from scipy import sparse  # imported on first use (SciPy is slow to import)

    rows, cols, wide = _checked(indices, values, dense, size)
    matrix = sparse.csr_matrix((values.astype(wide), (rows, cols)), shape=tuple(size))  # sums repeats
    return np.asarray(matrix @ dense.astype(wide), dtype=dense.dtype)


def _checked(indices, values, dense, size):
    """The row and column indices, checked in range, and the dtype to compute in (float32 for the half types,
    which SciPy lacks and which would round every sum)."""
    _spec(indices, values, dense, size)
    rows, cols = indices
    for name, index, n in (("row", rows, size[0]), ("column", cols, size[1])):
        if index.size and (index.min() < 0 or index.max() >= n):
            bad = index.min() if index.min() < 0 else index.max()
            raise ArgumentError(f"sparse_mm(): a {name} index is {bad}, out of range for a sparse matrix of size "
                                f"{tuple(size)}")
    return rows, cols, np.float32 if dense.itemsize < 4 else dense.dtype


@sparse_mm.onnx
def _(g, indices, values, dense, *, size):
    # the sparse matrix made dense (ScatterND adding repeated positions, as the kernel sums them), times dense
    positions = g.op("Transpose", g.cast(indices, np.dtype(np.int64)), perm=[1, 0])  # (entries, 2)
    matrix = g.op("ScatterND", g.filled(g.ints(size), 0, values.dtype), positions, values, reduction="add")
    return g.op("MatMul", matrix, dense, spec=g.outputs[0])


@sparse_mm.infer
def _(indices, values, dense, *, size):
    return _spec(indices, values, dense, size)


@sparse_mm.check
def _(*, size):
    if len(size) != 2 or any(n < 0 for n in size):
        raise ValueError(f"argument 'size' must be two sizes >= 0 (rows, columns), got {list(size)}")


@sparse_mm.grad
def _(indices, values, dense, dout, *, size, needs_input_grad):
    dvalues = ddense = None
    if needs_input_grad[1]:  # entry e added values[e]·dense[col] to out[row]
        rows, cols = indices[0], indices[1]
        dvalues = F.sum(F.index_select(dout, 0, rows) * F.index_select(dense, 0, cols), axis=-1)
    if needs_input_grad[2]:  # the transposed sparse matrix times dout
        ddense = F.sparse_mm(F.flip(indices, axis=[0]), values, dout, size=[size[1], size[0]])
    return None, dvalues, ddense


@sparse_mm.samples
def _(rng):
    yield Sample.of(np.array([[0, 2, 1, 2], [1, 0, 3, 0]]), rng.standard_normal(4), rng.standard_normal((4, 2)),
                    size=[3, 4])  # (2, 0) twice: summed
    yield Sample.of(np.array([[0, 0, 1], [0, 1, 1]], np.int32), rng.standard_normal(3), rng.standard_normal((2, 5)),
                    size=[2, 2])
    yield Sample.of(np.zeros((2, 0), np.int64), rng.standard_normal(0), rng.standard_normal((3, 2)), size=[4, 3])
