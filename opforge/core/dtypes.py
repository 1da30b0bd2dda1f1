"""The dtypes opforge supports and how they combine.

Dtypes are plain ``numpy.dtype`` objects, so kernels and users see exactly what NumPy sees. ``bfloat16`` is
``ml_dtypes``' (the package JAX uses): a NumPy dtype of kind "V", so ask ``is_floating``, never ``dtype.kind``.

Promotion between tensors follows NumPy 2 (``np.result_type`` on dtypes, never on values) among bool, the
integers, float32 and float64. Where a half-precision dtype (float16, bfloat16) takes part it follows PyTorch:
the result is the widest floating dtype present, integers and bools adopt it, and float16 with bfloat16 gives
float32 (neither holds the other). A Python scalar is *weak*: it takes the dtype of the tensor it meets, except
that a Python float meeting an integer or bool tensor becomes the default float, float32 (as in PyTorch).
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


def promote(*dtypes: np.dtype) -> np.dtype:
    """The dtype of an op that combines tensors of these dtypes (NumPy 2 rules; PyTorch's with a half dtype)."""
    first = dtypes[0]
    if all(d is first for d in dtypes):
        return first
    if not any(d in HALF for d in dtypes):
        return np.result_type(*dtypes)
    floats = {d for d in dtypes if is_floating(d)}
    if len(floats) == 1:
        return floats.pop()  # integers and bools adopt the (half) floating dtype, as in PyTorch
    return float64 if float64 in floats else float32  # float16 with bfloat16, or a half with float32


def scalar_dtype(value, peer: np.dtype | None) -> np.dtype:
    """The dtype a Python scalar takes when it meets a tensor of dtype ``peer`` (None: no tensor)."""
    if isinstance(value, bool):
        return peer if peer is not None else bool_
    if isinstance(value, int):
        return peer if peer is not None and peer != bool_ else DEFAULT_INT
    # a Python float (or complex, refused later)
    return peer if peer is not None and is_floating(peer) else DEFAULT_FLOAT
