"""Sparse COO matrices for the graph case: ``of.sparse_coo_tensor`` (``torch.sparse_coo_tensor``) and
``of.sparse.mm`` (``torch.sparse.mm``: sparse × dense), differentiable in the dense matrix and in the sparse
values, eagerly and compiled — enough for a graph convolution, ``relu(of.sparse.mm(adjacency, x @ w))``.

A ``SparseTensor`` holds its ``indices`` (sparse_dim, nnz) and ``values`` (nnz,) as ordinary Tensors and its size;
``of.sparse.mm`` is the op ``sparse_mm`` on those parts (``opforge/ops/sparse.py``), so autograd and programs need
nothing new. It has what a GCN needs — ``@`` with a dense right operand, ``to_dense()``, ``coalesce()``, ``t()``,
``indices()``/``values()`` — and nothing else: any other use (arithmetic, an op of ``opforge.ops``, NumPy) is an
error that says so and names ``to_dense()``. As in torch, positions stored more than once are summed; ``.grad``
is the gradient of the values as a coalesced sparse tensor.
"""

from __future__ import annotations

import math

import numpy as np

from . import ops as F
from .core import dtypes as D
from .core.errors import ArgumentError, ShapeError, describe
from .creation import tensor, zeros
from .tensor import Tensor

_SUPPORTED = ("of.sparse.mm(sparse, dense) (or sparse @ dense), .to_dense(), .coalesce(), .t(), .indices(), "
              ".values()")


def _unsupported(what: str):
    return ArgumentError(f"sparse COO tensors support {_SUPPORTED}; {what} is not supported: call .to_dense() "
                         "first")


class SparseTensor:
    """A sparse COO tensor: ``values[e]`` at position ``indices[:, e]`` of a tensor of ``shape`` (positions stored
    twice add up). Made by ``of.sparse_coo_tensor``; its values may require grad."""

    is_sparse = True
    layout = "sparse_coo"

    def __init__(self, indices: Tensor, values: Tensor, shape: tuple, coalesced: bool = False):
        self._idx, self._vals, self.shape, self._coalesced = indices, values, tuple(shape), coalesced

    # -- what it is ---------------------------------------------------------------------------------------------

    @property
    def dtype(self):
        return self._vals.dtype

    @property
    def device(self):
        return self._vals.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self.shape)

    def sparse_dim(self) -> int:
        return len(self.shape)

    def dense_dim(self) -> int:
        return 0

    def _nnz(self) -> int:
        return self._vals.shape[0]

    @property
    def requires_grad(self) -> bool:
        return self._vals.requires_grad

    @property
    def grad(self):
        """The gradient at the stored positions, as a coalesced sparse tensor of this shape (torch's ``.grad``): a
        position stored twice has one gradient, which each of its values got (``values.grad`` holds it per entry)."""
        g = self._vals.grad
        if g is None:
            return None
        unique, first = np.unique(self._flat(), return_index=True)
        return SparseTensor(self._coalesced_indices(unique), F.index_select(g, 0, tensor(first.astype(np.int64))),
                            self.shape, coalesced=True)

    def is_coalesced(self) -> bool:
        return self._coalesced

    def _indices(self) -> Tensor:
        """The indices as stored (torch's ``_indices()``): positions may repeat, unsorted."""
        return self._idx

    def _values(self) -> Tensor:
        """The values as stored (torch's ``_values()``)."""
        return self._vals

    def indices(self) -> Tensor:
        """The indices, (sparse_dim, nnz): of a coalesced tensor only, as torch's (``_indices()`` for any)."""
        if not self._coalesced:
            raise ArgumentError("SparseTensor.indices(): the tensor is not coalesced (positions may repeat and are "
                                "unsorted); call .coalesce() first, as torch requires")
        return self._idx

    def values(self) -> Tensor:
        """The values, (nnz,): of a coalesced tensor only, as torch's (``_values()`` for any)."""
        if not self._coalesced:
            raise ArgumentError("SparseTensor.values(): the tensor is not coalesced; call .coalesce() first, as torch "
                                "requires")
        return self._vals

    # -- what it does ---------------------------------------------------------------------------------------------

    def _flat(self) -> np.ndarray:
        """Each entry's position in the flattened dense tensor (host ints: the indices are data, never traced)."""
        index = self._idx._device.to_host(self._idx._data)
        return np.ravel_multi_index(tuple(index), self.shape) if index.size else np.zeros(0, np.int64)

    def coalesce(self) -> SparseTensor:
        """The same tensor with each position once (values stored twice summed), positions in row-major order —
        differentiable in the values (an ``index_add``)."""
        if self._coalesced:
            return self
        unique, inverse = np.unique(self._flat(), return_inverse=True)
        summed = F.index_add(zeros(len(unique), dtype=self.dtype, device=self.device), 0,
                             tensor(inverse.reshape(-1).astype(np.int64), device=self.device), self._vals)
        return SparseTensor(self._coalesced_indices(unique), summed, self.shape, coalesced=True)

    def _coalesced_indices(self, unique: np.ndarray) -> Tensor:
        """The indices of sorted unique flat positions."""
        return tensor(np.stack(np.unravel_index(unique, self.shape)).astype(np.int64).reshape(self.ndim, -1),
                      device=self.device)

    def to_dense(self) -> Tensor:
        """The dense tensor (differentiable in the values: an ``index_add`` into zeros)."""
        flat = tensor(self._flat().astype(np.int64), device=self.device)
        dense = F.index_add(zeros(math.prod(self.shape), dtype=self.dtype, device=self.device), 0, flat, self._vals)
        return F.reshape(dense, shape=list(self.shape))

    def t(self) -> SparseTensor:
        """The transpose of a sparse matrix (its rows and columns swapped)."""
        if self.ndim != 2:
            raise ArgumentError(f"SparseTensor.t(): a sparse matrix (2 dims) only, got {self.ndim} dims")
        return SparseTensor(F.flip(self._idx, axis=[0]), self._vals, self.shape[::-1])

    def __matmul__(self, other):
        return mm(self, other)

    def __repr__(self) -> str:
        return (f"SparseTensor(size={self.shape}, nnz={self._nnz()}, dtype={self.dtype}, layout=sparse_coo"
                + (", requires_grad=True" if self.requires_grad else "") + ")")

    # -- everything else: a clear error -------------------------------------------------------------------------

    def __array__(self, *args, **kwargs):
        raise _unsupported("NumPy conversion (or an op of opforge.ops, which converts it)")

    def _refuse(self, *args, **kwargs):
        raise _unsupported("arithmetic")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __pow__ = \
        __neg__ = __rmatmul__ = __getitem__ = __iter__ = __len__ = _refuse


def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None, requires_grad: bool = False,
                      check_invariants=None, is_coalesced: bool | None = None) -> SparseTensor:
    """``torch.sparse_coo_tensor``: ``values[e]`` at position ``indices[:, e]`` (indices (sparse_dim, nnz), values
    (nnz,)); ``size`` defaults to the smallest that holds every index. ``values`` given as a Tensor is used as it
    is (its gradient flows, as in torch); data is copied into a new Tensor (``requires_grad``, ``dtype``,
    ``device`` as ``of.tensor``). Indices are always checked (``check_invariants`` is accepted); ``is_coalesced=True``
    promises sorted unique positions, and is checked too. Hybrid tensors (values with dense dims) are refused."""
    name = "sparse_coo_tensor()"
    index = indices._device.to_host(indices._data) if isinstance(indices, Tensor) else np.asarray(indices)
    if index.dtype.kind not in "iu" and index.size:
        raise ArgumentError(f"{name}: indices must be integers, got {describe(indices)}")
    if index.ndim != 2:
        raise ShapeError(f"{name}: indices must have shape (sparse_dim, nnz), got shape {index.shape}")
    index = index.astype(np.int64)
    if isinstance(values, Tensor):
        if dtype is not None and values.dtype != D.as_dtype(dtype):
            values = F.cast(values, dtype=D.as_dtype(dtype))
        if requires_grad:
            raise ArgumentError(f"{name}: requires_grad=True is for values given as data; this Tensor's "
                                "requires_grad is its own")
    else:
        array = np.asarray(values)
        values = tensor(array, dtype=dtype if dtype is not None else (None if array.dtype.kind == "f" else
                                                                      D.DEFAULT_FLOAT),
                        device=device, requires_grad=requires_grad)
    if values.ndim != 1:
        raise ShapeError(f"{name}: values must have shape (nnz,) — hybrid sparse tensors (values with dense dims) "
                         f"are not supported — got shape {tuple(values.shape)}")
    if values.shape[0] != index.shape[1]:
        raise ShapeError(f"{name}: {index.shape[1]} indices but {values.shape[0]} values")
    if not D.is_floating(values.dtype):
        raise ArgumentError(f"{name}: values must be floating point (what sparse.mm multiplies), got {values.dtype}")
    if index.size and index.min() < 0:
        raise ArgumentError(f"{name}: indices must be >= 0, got {index.min()}")
    if size is None:
        size = tuple(int(n) + 1 for n in index.max(axis=1)) if index.size else (0,) * index.shape[0]
    size = tuple(int(n) for n in size)
    if len(size) != index.shape[0]:
        raise ShapeError(f"{name}: size {size} has {len(size)} dims, the indices {index.shape[0]} (sparse dims); "
                         "hybrid sparse tensors are not supported")
    if index.size and np.any(index.max(axis=1) >= np.array(size)):
        dim = int(np.argmax(index.max(axis=1) >= np.array(size)))
        raise ArgumentError(f"{name}: an index in dim {dim} is {index[dim].max()}, out of range for size {size}")
    result = SparseTensor(tensor(index, device=values.device), values, size)
    if is_coalesced:
        flat = result._flat()
        if np.any(np.diff(flat) <= 0):
            raise ArgumentError(f"{name}: is_coalesced=True, but the positions are not sorted and unique")
        result._coalesced = True
    return result


def mm(mat1, mat2) -> Tensor:
    """``torch.sparse.mm``: a sparse COO matrix (n, m) times a dense matrix (m, p), a dense (n, p) — differentiable
    in ``mat2`` and in the sparse values, eagerly and compiled (the op ``sparse_mm``). A sparse second operand, or
    a dense first one, is refused."""
    if not isinstance(mat1, SparseTensor):
        raise ArgumentError(f"sparse.mm(): mat1 must be a sparse COO matrix, got {describe(mat1)} (for dense × dense "
                            "use @)")
    if isinstance(mat2, SparseTensor):
        raise ArgumentError("sparse.mm(): sparse × sparse is not supported; mat2 must be dense (call .to_dense())")
    if mat1.ndim != 2:
        raise ShapeError(f"sparse.mm(): mat1 must be a sparse matrix (2 dims), got size {mat1.shape}")
    return F.sparse_mm(mat1._idx, mat1._vals, mat2, size=list(mat1.shape))


__all__ = ["SparseTensor", "mm", "sparse_coo_tensor"]
