"""``torch.linalg``'s names for opforge's linear-algebra ops: ``of.linalg.inv(a)`` is ``F.linalg_inv(a)``, and so on.

The ops are defined once, in ``opforge/ops/linalg.py``, under the names PyTorch's own operator registry gives them
(``linalg_inv``, ``linalg_det``, ...: also what ``docs/ops.md``, programs and checkpoints show). This module only
adds the short names, so that code written against ``torch.linalg`` reads the same.
"""

from .ops import linalg_cholesky as cholesky
from .ops import linalg_det as det
from .ops import linalg_inv as inv
from .ops import linalg_qr as qr
from .ops import linalg_solve as solve
from .ops import linalg_svd as svd

__all__ = ["cholesky", "det", "inv", "qr", "solve", "svd"]
