"""``torch.linalg``'s names for opforge's linear-algebra ops: ``of.linalg.inv(a)`` is ``F.linalg_inv(a)``, and so on.

The ops are defined once, in ``opforge/ops/linalg.py``, under the names PyTorch's own operator registry gives them
(``linalg_inv``, ``linalg_det``, ...: also what ``docs/ops.md``, programs and checkpoints show). This module only
adds the short names, so that code written against ``torch.linalg`` reads the same, and torch.linalg's norms
(``norm``, ``vector_norm``, ``matrix_norm``) and ``svdvals``, written with those ops.
"""

import math

from . import ops as _F
from .core.errors import ArgumentError as _ArgumentError
from .core.errors import ShapeError as _ShapeError
from .ops import linalg_cholesky as cholesky
from .ops import linalg_cross as cross
from .ops import linalg_det as det
from .ops import linalg_eigh as eigh
from .ops import linalg_eigvalsh as eigvalsh
from .ops import linalg_inv as inv
from .ops import linalg_lstsq as lstsq
from .ops import linalg_lu as lu
from .ops import linalg_lu_factor as lu_factor
from .ops import linalg_lu_solve as lu_solve
from .ops import linalg_matrix_exp as matrix_exp
from .ops import linalg_matrix_power as matrix_power
from .ops import linalg_matrix_rank as matrix_rank
from .ops import linalg_pinv as pinv
from .ops import linalg_qr as qr
from .ops import linalg_solve as solve
from .ops import linalg_solve_triangular as solve_triangular
from .ops import linalg_svd as svd
from .ops import multi_dot, slogdet
from .torch_forms import matrix_reduction as _matrix_reduction


def svdvals(A):
    """``torch.linalg.svdvals``: the singular values of the matrices in ``A``, in descending order."""
    return svd(A, full_matrices=False)[1]


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """``torch.linalg.vector_norm``: the ``ord``-norm of the elements over ``dim`` (all when None); ``ord`` a number,
    ``inf`` or ``-inf``; ``dtype=`` casts the input first."""
    if isinstance(ord, str):
        raise _ArgumentError(f"vector_norm(): ord must be a number, got {ord!r} (matrix_norm takes 'fro' and 'nuc')")
    if dtype is not None:
        x = _F.cast(x, dtype=dtype)
    dims = None if dim is None else [dim] if isinstance(dim, int) else list(dim)
    return _F.norm(x, float(ord), dims, keepdim)


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    """``torch.linalg.matrix_norm`` over the two dims ``dim``: ``'fro'``, ``'nuc'``, ``2``/``-2`` (the largest and
    smallest singular value), ``1``/``-1`` (the largest and smallest column sum of magnitudes), ``inf``/``-inf``
    (the same over rows)."""
    if dtype is not None:
        A = _F.cast(A, dtype=dtype)
    dims = list(dim)
    if len(dims) != 2 or len(A.shape) < 2:
        raise _ShapeError(f"matrix_norm(): needs two dims of an input of at least 2 dims, got dim={dim!r} and shape "
                          f"{tuple(A.shape)}")
    n = len(A.shape)
    rows, cols = (d % n for d in dims)
    if rows == cols:
        raise _ArgumentError(f"matrix_norm(): the two dims must differ, got dim={dim!r}")
    if ord == "fro":
        return _F.norm(A, 2.0, [rows, cols], keepdim)
    if ord == "nuc":
        return _matrix_reduction(A, [rows, cols], keepdim, _F.sum)
    if ord in (2, -2):
        return _matrix_reduction(A, [rows, cols], keepdim, _F.amax if ord == 2 else _F.amin)
    if ord in (1, -1, math.inf, -math.inf):
        summed, over = (rows, cols) if ord in (1, -1) else (cols, rows)  # column sums (1), row sums (inf)
        sums = _F.sum(_F.abs(A), axis=[summed], keepdim=True)
        y = (_F.amax if ord > 0 else _F.amin)(sums, axis=[over], keepdim=True)
        return y if keepdim else _F.squeeze(y, axis=sorted((rows, cols)))
    raise _ArgumentError(f"matrix_norm(): ord must be 'fro', 'nuc', 2, -2, 1, -1, inf or -inf, got {ord!r}")


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):
    """``torch.linalg.norm``: with ``ord`` None, the 2-norm of the elements over ``dim`` (all when None; ``'fro'``
    over two dims); otherwise a vector norm over one dim (or of a 1-D input) and a matrix norm over two dims (or of
    a 2-D input)."""
    if dim is not None:
        dims = [dim] if isinstance(dim, int) else list(dim)
        if len(dims) not in (1, 2):
            raise _ArgumentError(f"norm(): dim must be one or two dims, got {dim!r}")
    elif ord is not None:
        if len(A.shape) not in (1, 2):
            raise _ShapeError(f"norm(): with ord={ord!r} and no dim the input must be 1-D or 2-D, got shape "
                              f"{tuple(A.shape)}")
        dims = list(range(len(A.shape)))
    else:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if len(dims) == 2:
        return matrix_norm(A, "fro" if ord is None else ord, dims, keepdim, dtype=dtype)
    return vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype=dtype)


__all__ = ["cholesky", "cross", "det", "eigh", "eigvalsh", "inv", "lstsq", "lu", "lu_factor", "lu_solve", "matrix_exp",
           "matrix_norm", "matrix_power", "matrix_rank", "multi_dot", "norm", "pinv", "qr", "slogdet", "solve",
           "solve_triangular", "svd", "svdvals", "vector_norm"]
