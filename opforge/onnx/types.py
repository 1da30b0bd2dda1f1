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


def _type_name(elem_type: int) -> str:
    from onnx import TensorProto

    return TensorProto.DataType.Name(elem_type).lower() if elem_type in TensorProto.DataType.values() \
        else f"type {elem_type}"


def dtype_of(elem_type: int, what: str) -> np.dtype:
    if elem_type not in _DTYPES:
        raise OnnxImportError(f"{what}: element type {_type_name(elem_type)} is not supported "
                              f"(opforge has {', '.join(map(str, _DTYPES.values()))})")
    return _DTYPES[elem_type]
