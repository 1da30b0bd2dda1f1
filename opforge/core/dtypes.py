"""The dtypes opforge supports and how they combine.

Dtypes are plain ``numpy.dtype`` objects, so kernels and users see exactly what NumPy sees.
Promotion between tensors follows NumPy 2 (``np.result_type`` on dtypes, never on values).
A Python scalar is *weak*: it takes the dtype of the tensor it meets, except that a Python
float meeting an integer or bool tensor becomes the default float, float32 (as in PyTorch).
"""

import numpy as np

from .errors import ArgumentError, describe

bool_ = np.dtype(np.bool_)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)

SUPPORTED = (bool_, int32, int64, float32, float64)
FLOATING = (float32, float64)
INTEGER = (int32, int64)
DEFAULT_FLOAT = float32
DEFAULT_INT = int64

# Names usable in signatures (``Tensor<float32|float64> x``) and in ``dtype=`` arguments.
GROUPS = {
    "bool": (bool_,),
    "int32": (int32,),
    "int64": (int64,),
    "float32": (float32,),
    "float64": (float64,),
    "floating": FLOATING,
    "integer": INTEGER,
    "number": (*INTEGER, *FLOATING),
    "all": SUPPORTED,
}


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
    return dt.kind == "f"


def promote(*dtypes: np.dtype) -> np.dtype:
    """The dtype of an op that combines tensors of these dtypes (NumPy 2 rules)."""
    return np.result_type(*dtypes)


def scalar_dtype(value, peer: np.dtype | None) -> np.dtype:
    """The dtype a Python scalar takes when it meets a tensor of dtype ``peer`` (None: no tensor)."""
    if isinstance(value, bool):
        return peer if peer is not None else bool_
    if isinstance(value, int):
        return peer if peer is not None and peer != bool_ else DEFAULT_INT
    # a Python float (or complex, refused later)
    return peer if peer is not None and is_floating(peer) else DEFAULT_FLOAT
