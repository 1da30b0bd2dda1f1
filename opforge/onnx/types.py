"""ONNX element types as opforge's dtypes, and the error an import raises (``importer`` and ``importers`` share
them)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..core import dtypes as D
from ..core.errors import OpforgeError


class OnnxImportError(OpforgeError, ValueError):
    """An ONNX model that cannot be loaded: malformed, or using an op, attribute or type opforge does not map."""


class NeedsConstant(OnnxImportError):
    """An input our ops take as an attribute (axes, a shape, pads) that the model computes or feeds at run time.
    ``load(model, bind={name: value})`` specialises the model on given values of such graph inputs."""

    def __init__(self, message: str, input_name: str):
        super().__init__(message)
        self.input_name = input_name


class Seq(list):
    """An ONNX sequence at import: a list of values (Variables, arrays) whose length is known at load. (An optional
    is its value, or None when empty.) A graph input of either kind is bound at load; a sequence graph output
    becomes one program output per element, ``name[k]``."""


def value_kind(type_proto) -> str:
    """"tensor", "sequence" or "optional" (of a tensor or of a sequence of tensors): the kinds of value opforge
    imports; "" for others (maps, sequences of sequences, ...)."""
    kind = type_proto.WhichOneof("value")
    if kind in (None, "tensor_type"):
        return "tensor"
    if kind == "sequence_type":
        return "sequence" if type_proto.sequence_type.elem_type.WhichOneof("value") == "tensor_type" else ""
    if kind == "optional_type":
        return "optional" if value_kind(type_proto.optional_type.elem_type) in ("tensor", "sequence") else ""
    return ""


# ONNX TensorProto element types opforge has (the others are named in the error).
_DTYPES = {1: D.float32, 11: D.float64, 10: D.float16, 16: D.bfloat16, 6: D.int32, 7: D.int64, 9: D.bool_}
_TYPE_NAMES = {D.float32: "float", D.float64: "double", D.float16: "float16", D.bfloat16: "bfloat16", D.int32: "int32",
               D.int64: "int64", D.bool_: "bool"}  # as ONNX's schemas name them: tensor(float)


# ONNX's narrow integer types, which opforge holds as int64 (each value exactly), wrapping every result that may
# leave the type's range back into it as ONNX's arithmetic does (modulo 2**bits: the same in int64, whose modulus
# 2**64 they divide). uint64 is not among them: int64 does not hold its values past 2**63.
NARROW = {3: np.dtype(np.int8), 2: np.dtype(np.uint8), 5: np.dtype(np.int16), 4: np.dtype(np.uint16),
          12: np.dtype(np.uint32), 22: np.dtype(ml_dtypes.int4), 21: np.dtype(ml_dtypes.uint4),
          26: np.dtype(ml_dtypes.int2), 25: np.dtype(ml_dtypes.uint2)}  # (the 4- and 2-bit ones: ml_dtypes')
_DTYPES.update(dict.fromkeys(NARROW, D.int64))

# ONNX's 8- and 4-bit float types (ml_dtypes' dtypes, as ONNX's reference holds them), which opforge holds as
# float32 (each value exactly), rounding every result that is not one of their values already (a Cast, a CastLike,
# a QuantizeLinear) to the nearest one as ONNX does (``round_to``). FLOAT8E8M0 (exponents only, rounded up by
# default) is not among them.
LOW_FLOATS = {17: np.dtype(ml_dtypes.float8_e4m3fn), 18: np.dtype(ml_dtypes.float8_e4m3fnuz),
              19: np.dtype(ml_dtypes.float8_e5m2), 20: np.dtype(ml_dtypes.float8_e5m2fnuz),
              23: np.dtype(ml_dtypes.float4_e2m1fn)}
_DTYPES.update(dict.fromkeys(LOW_FLOATS, D.float32))
HELD = NARROW | LOW_FLOATS  # ONNX type -> its own dtype, for the types opforge holds in a wider one of its own


def stored_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype of an ONNX type as a file or a caller holds it (uint8 for uint8; opforge's dtype otherwise)."""
    return HELD.get(elem_type, _DTYPES.get(elem_type))


def wrap(value, elem_type: int, ops=None):
    """``value`` (int64, on ops or as an array) wrapped into the range of narrow ONNX type ``elem_type``."""
    info = ml_dtypes.iinfo(NARROW[elem_type])
    span = 1 << info.bits
    if isinstance(value, np.ndarray):
        return (value.astype(np.int64) - info.min) % span + info.min
    return ops.remainder(value - info.min, span) + info.min


def round_to(value, elem_type: int, ops=None, saturate: bool = True):
    """``value`` (a float tensor on ops, or an array) rounded to the nearest value of low-precision float type
    ``elem_type`` (``LOW_FLOATS``), halves to even, as float32: what ONNX's Cast to that type gives. Past the type's
    largest value: that value when ``saturate`` (and always for FLOAT4E2M1, which has no inf nor NaN), else inf
    where the type has it (E5M2) and NaN where it does not; NaN stays NaN (but for FLOAT4E2M1: a zero, as ml_dtypes
    gives); the "fnuz" types have no -0.

    Computed with our ops as ml_dtypes (ONNX's reference) computes it: the value's binary exponent e (at least the
    type's smallest normal one: subnormals share its spacing), then x rounded to a multiple of 2^(e - mantissa
    bits). (log2 may round a value just under 2^k up to k: such a value is within 2^-20 of 2^k, and rounds to 2^k
    at either spacing.)"""
    fmt = LOW_FLOATS[elem_type]
    info = ml_dtypes.finfo(fmt)
    top = float(info.max)
    saturate = saturate or not info.bits > 4  # (FLOAT4E2M1 saturates: it has no value for an overflow)
    has_inf = fmt == np.dtype(ml_dtypes.float8_e5m2)
    unsigned_zero = fmt.name.endswith("fnuz")
    if isinstance(value, np.ndarray):
        x = value.astype(np.float64)
        if saturate:
            x = np.clip(x, -top, top)
        return x.astype(fmt).astype(np.float32)
    x = value if value.dtype == D.float64 else ops.cast(value, dtype=D.float32)
    if saturate:
        x = ops.clip(x, min=-top, max=top)  # (NaN stays NaN; inf becomes the largest value)
    exponent = ops.floor(ops.log2(ops.maximum(ops.abs(x), float(info.smallest_normal))))
    step = ops.exp2(exponent - info.nmant)
    y = ops.round(x / step) * step
    if not saturate:  # an overflow, and inf: inf (E5M2) or NaN
        over = ops.where(x < 0, -np.inf, np.inf) if has_inf else np.nan
        y = ops.where(ops.logical_or(ops.abs(y) <= top, ops.isnan(x)), y, over)
    if unsigned_zero:
        y = y + 0.0  # (-0 + 0 is +0)
    if info.bits <= 4:  # FLOAT4E2M1 has no NaN, and ONNX says nothing of one cast to it: as its reference, a zero
        negative = ops.copysign(ops.ones_like(x), x) < 0  # of the other sign than the NaN's (ml_dtypes' bits)
        y = ops.where(ops.isnan(x), ops.where(negative, 0.0, -0.0), y)
    return y if y.dtype == D.float32 else ops.cast(y, dtype=D.float32)


def type_name(elem_type: int) -> str:
    from onnx import TensorProto

    return TensorProto.DataType.Name(elem_type).lower() if elem_type in TensorProto.DataType.values() \
        else f"type {elem_type}"


def dtype_of(elem_type: int, what: str) -> np.dtype:
    if elem_type not in _DTYPES:
        raise OnnxImportError(f"{what}: element type {type_name(elem_type)} is not supported "
                              f"(opforge has {', '.join(map(str, dict.fromkeys(_DTYPES.values())))}, and holds "
                              f"{', '.join(map(str, NARROW.values()))} as int64, and "
                              f"{', '.join(map(str, LOW_FLOATS.values()))} as float32)")
    return _DTYPES[elem_type]
