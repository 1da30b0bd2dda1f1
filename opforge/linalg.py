"""``torch.linalg``'s names for opforge's linear-algebra ops: ``of.linalg.inv(a)`` is ``F.linalg_inv(a)``, and so on.

The ops are defined once, in ``opforge/ops/linalg.py``, under the names PyTorch's own operator registry gives them
(``linalg_inv``, ``linalg_det``, ...: also what ``docs/ops.md``, programs and checkpoints show). This module only
adds the short names, so that code written against ``torch.linalg`` reads the same.
"""

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

__all__ = ["cholesky", "cross", "det", "eigh", "eigvalsh", "inv", "lstsq", "lu", "lu_factor", "lu_solve", "matrix_exp",
           "matrix_power", "matrix_rank", "multi_dot", "pinv", "qr", "slogdet", "solve", "solve_triangular", "svd"]
