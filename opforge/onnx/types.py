"""ONNX element types as opforge's dtypes, and the error an import raises (``importer`` and ``importers`` share
them)."""

from __future__ import annotations

import numpy as np

from ..core import dtypes as D
from ..core.errors import OpforgeError


class OnnxImportError(OpforgeError, ValueError):
    """An ONNX model that cannot be loaded: malformed, or using an op, attribute or type opforge does not map."""


# ONNX TensorProto element types opforge has (the others are named in the error).
_DTYPES = {1: D.float32, 11: D.float64, 10: D.float16, 16: D.bfloat16, 6: D.int32, 7: D.int64, 9: D.bool_}
_TYPE_NAMES = {D.float32: "float", D.float64: "double", D.float16: "float16", D.bfloat16: "bfloat16", D.int32: "int32",
               D.int64: "int64", D.bool_: "bool"}  # as ONNX's schemas name them: tensor(float)


# ONNX's narrow integer types, which opforge holds as int64 (each value exactly), wrapping every result that may
# leave the type's range back into it as ONNX's arithmetic does (modulo 2**bits: the same in int64, whose modulus
# 2**64 they divide). uint64 is not among them: int64 does not hold its values past 2**63.
NARROW = {3: np.dtype(np.int8), 2: np.dtype(np.uint8), 5: np.dtype(np.int16), 4: np.dtype(np.uint16),
          12: np.dtype(np.uint32)}
_DTYPES.update(dict.fromkeys(NARROW, D.int64))


def stored_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype of an ONNX type as a file or a caller holds it (uint8 for uint8; opforge's dtype otherwise)."""
    return NARROW.get(elem_type, _DTYPES.get(elem_type))


def wrap(value, elem_type: int, ops=None):
    """``value`` (int64, on ops or as an array) wrapped into the range of narrow ONNX type ``elem_type``."""
    info = np.iinfo(NARROW[elem_type])
    span = 1 << info.bits
    if isinstance(value, np.ndarray):
        return (value.astype(np.int64) - info.min) % span + info.min
    return ops.remainder(value - info.min, span) + info.min


def _type_name(elem_type: int) -> str:
    from onnx import TensorProto

    return TensorProto.DataType.Name(elem_type).lower() if elem_type in TensorProto.DataType.values() \
        else f"type {elem_type}"


def dtype_of(elem_type: int, what: str) -> np.dtype:
    if elem_type not in _DTYPES:
        raise OnnxImportError(f"{what}: element type {_type_name(elem_type)} is not supported "
                              f"(opforge has {', '.join(map(str, dict.fromkeys(_DTYPES.values())))}, and holds "
                              f"{', '.join(map(str, NARROW.values()))} as int64)")
    return _DTYPES[elem_type]
