"""The bottom layer: dtypes, Spec, signature parsing, OpDef and the registry, errors, grad mode."""

from . import dtypes
from .devices import register_device
from .errors import ArgumentError, DispatchError, GradientError, OpforgeError, SchemaError, ShapeError
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .opdef import TRAITS, OpDef, Sample, registry
from .random import manual_seed
from .schema import Schema, parse_signature
from .spec import Spec, broadcast_shapes

__all__ = [
    "TRAITS", "ArgumentError", "DispatchError", "GradientError", "OpDef", "OpforgeError", "Sample",
    "Schema", "SchemaError", "ShapeError", "Spec", "broadcast_shapes", "dtypes", "enable_grad",
    "is_grad_enabled", "manual_seed", "no_grad", "parse_signature", "register_device", "registry",
    "set_grad_enabled",
]
