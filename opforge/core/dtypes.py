"""The dtypes opforge supports and how they combine.

Dtypes are plain ``numpy.dtype`` objects, so kernels and users see exactly what NumPy sees. ``bfloat16`` is
``ml_dtypes``' (the package JAX uses): a NumPy dtype of kind "V", so ask ``is_floating``, never ``dtype.kind``.

Promotion follows PyTorch (``torch.result_type``), not NumPy: tensors with dims promote by category first (bool <
integer < floating: the higher category's dtype wins, so int64 with float32 is float32, where NumPy says float64),
then by width (float16 with bfloat16 gives float32). 0-d tensors, and the Python and NumPy numbers an op meets, take
part only by category: they change the result only where their category is higher than the dimensioned tensors'
(a float32 tensor times a 0-d float64 tensor stays float32; an int32 tensor times one becomes float64). A number is
*weak*: it takes the dtype of the tensors it meets where its category is theirs, else the default dtype of its own
(a Python float meeting an integer or bool tensor is float32, an int meeting a bool tensor int64).
"""

import ml_dtypes
import numpy as np

from .errors import ArgumentError, describe

bool_ = np.dtype(np.bool_)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)

SUPPORTED = (bool_, int32, int64, float16, bfloat16, float32, float64)
FLOATING = (float16, bfloat16, float32, float64)
HALF = (float16, bfloat16)
INTEGER = (int32, int64)
DEFAULT_FLOAT = float32
DEFAULT_INT = int64

# Names usable in signatures (``Tensor<float32|float64> x``) and in ``dtype=`` arguments.
GROUPS = {
    "bool": (bool_,),
    "int32": (int32,),
    "int64": (int64,),
    "float16": (float16,),
    "bfloat16": (bfloat16,),
    "float32": (float32,),
    "float64": (float64,),
    "floating": FLOATING,
    "half": HALF,
    "integer": INTEGER,
    "number": (*INTEGER, *FLOATING),
    "all": SUPPORTED,
}

# Relative rounding error (machine epsilon) per floating dtype: what tolerances are scaled by.
EPS = {dt: float(ml_dtypes.finfo(dt).eps) for dt in FLOATING}


def as_dtype(value, *, op: str = "", arg: str = "dtype") -> np.dtype:
    """Normalise ``'float32'``, ``np.float32`` or ``np.dtype('float32')`` to a supported ``np.dtype``."""
    where = f"{op}(): argument '{arg}'" if op else f"argument '{arg}'"
    if isinstance(value, str) and value == "bool":
        value = np.bool_
    try:
        dt = np.dtype(value)
    except (TypeError, ValueError):  # ValueError: a string NumPy half parses, such as "(-1,)f8"
        raise ArgumentError(
            f"{where} expected a dtype such as 'float32', got {describe(value)}"
        ) from None
    if dt not in SUPPORTED:
        raise ArgumentError(
            f"{where}: dtype {dt} is not supported; supported are {', '.join(map(str, SUPPORTED))}"
            " (convert first, e.g. with .astype(np.float32))"
        )
    return dt


def is_floating(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt is bfloat16  # ml_dtypes' dtype objects are singletons


def category(dt: np.dtype) -> int:
    """0 for bool, 1 for the integers, 2 for the floating dtypes: PyTorch's order of promotion."""
    return 2 if is_floating(dt) else 0 if dt == bool_ else 1


def promote(*dtypes: np.dtype) -> np.dtype:
    """The dtype of an op that combines tensors (with dims) of these dtypes: ``torch.promote_types``. The highest
    category wins; within it the widest dtype, and float16 with bfloat16 gives float32 (neither holds the other)."""
    first = dtypes[0]
    if all(d is first for d in dtypes):
        return first
    top = max(map(category, dtypes))
    within = {d for d in dtypes if category(d) == top}
    if len(within) == 1:
        return within.pop()
    if top < 2:
        return np.result_type(*within)  # int32 with int64: int64
    return float64 if float64 in within else float32  # float16 with bfloat16, or a half with float32


def result_type(*operands) -> np.dtype:
    """``torch.result_type`` of ``operands`` (arrays or Specs: anything with a ``shape`` and a ``dtype``; a number
    meets an op as a 0-d array of the dtype ``scalar_dtype`` gives it). The operands with dims promote together; the
    0-d ones count only where their category is higher than those dims' result."""
    dims = [o.dtype for o in operands if len(o.shape)]
    zero = [o.dtype for o in operands if not len(o.shape)]
    if not dims or not zero:
        return promote(*(dims or zero))
    high, low = promote(*dims), promote(*zero)
    return promote(high, low) if category(low) > category(high) else high


def scalar_dtype(value, peer: np.dtype | None) -> np.dtype:
    """The dtype a Python number takes when it meets a tensor of dtype ``peer`` (None: no tensor): the peer's where
    the number's category is the peer's or lower, else the default dtype of its own category (as in PyTorch)."""
    if isinstance(value, np.generic):
        value = value.item()  # a NumPy number counts as the Python number it holds, as in PyTorch
    if isinstance(value, bool):
        return peer if peer is not None else bool_
    if isinstance(value, int):
        return peer if peer is not None and peer != bool_ else DEFAULT_INT
    # a Python float (or complex, refused later)
    return peer if peer is not None and is_floating(peer) else DEFAULT_FLOAT
