"""The bottom layer: dtypes, Spec, signature parsing, OpDef and the registry, devices, errors, grad mode."""

from . import cuda, dtypes, floating_point  # cuda: the device "cuda", registered when first asked for
from .devices import CPU, Device, default_device, get_device, manual_seed, register_device, using_device
from .errors import (
    AnomalyError,
    ArgumentError,
    DispatchError,
    DivisionByZeroError,
    GradientError,
    OpforgeError,
    OutOfMemoryError,
    SchemaError,
    ShapeError,
)
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .opdef import TRAITS, OpDef, Sample, registry
from .schema import Schema, parse_signature
from .spec import Spec, broadcast_shapes

__all__ = [
    "CPU", "TRAITS", "AnomalyError", "ArgumentError", "Device", "DispatchError", "DivisionByZeroError",
    "GradientError", "OpDef",
    "OpforgeError", "OutOfMemoryError", "Sample", "Schema", "SchemaError", "ShapeError", "Spec", "broadcast_shapes",
    "cuda", "default_device", "dtypes", "enable_grad", "floating_point", "get_device", "is_grad_enabled", "manual_seed",
    "no_grad", "parse_signature", "register_device", "registry", "set_grad_enabled", "using_device",
]
