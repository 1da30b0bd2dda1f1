"""opforge: define a deep-learning op once — signature, kernels, shape rule, gradient rule — and get
argument checking, dispatch, eager autograd to any order and gradient checks from that one definition.

    import opforge as of
    from opforge import ops as F
"""

from . import data, linalg, nn, onnx, ops, optim, testing  # onnx: the packages onnx and onnxruntime load on first use
from .autodiff import backward, detect_anomaly, grad
from .checkpoint import load, save
from .core import (
    AnomalyError,
    ArgumentError,
    Device,
    DispatchError,
    GradientError,
    OpforgeError,
    Sample,
    SchemaError,
    ShapeError,
    Spec,
    default_device,
    enable_grad,
    get_device,
    is_grad_enabled,
    manual_seed,
    no_grad,
    register_device,
    registry,
    set_grad_enabled,
    using_device,
)
from .core.dtypes import bfloat16, bool_, float16, float32, float64, int32, int64
from .creation import arange, full, ones, rand, randn, tensor, zeros
from .dispatch import op
from .program import Executor, Program, Variable, append_backward, compile, trace
from .tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "AnomalyError", "ArgumentError", "Device", "DispatchError", "Executor", "GradientError", "OpforgeError",
    "Program", "Sample", "SchemaError", "ShapeError", "Spec", "Tensor", "Variable", "append_backward", "arange",
    "backward", "bfloat16", "bool_", "compile", "data", "default_device", "detect_anomaly", "enable_grad",
    "float16", "float32", "float64", "full", "get_device", "grad", "int32", "int64", "is_grad_enabled",
    "linalg", "load", "manual_seed", "nn", "no_grad", "ones", "onnx", "op", "ops", "optim", "rand", "randn",
    "register_device", "registry", "save", "set_grad_enabled", "tensor", "testing", "trace", "using_device",
    "zeros",
]
