"""opforge: define a deep-learning op once — signature, kernels, shape rule, gradient rule — and get
argument checking, dispatch, eager autograd to any order and gradient checks from that one definition.

    import opforge as of
    from opforge import ops as F
"""

from . import data, distributed, linalg, nn, onnx, ops, optim, testing  # onnx: onnx, onnxruntime load on use
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
from .creation import arange, cat, full, ones, ones_like, rand, randn, stack, tensor, zeros, zeros_like
from .dispatch import op, set_debug
from .program import Executor, Program, Variable, append_backward, compile, trace
from .tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "AnomalyError", "ArgumentError", "Device", "DispatchError", "Executor", "GradientError", "OpforgeError",
    "Program", "Sample", "SchemaError", "ShapeError", "Spec", "Tensor", "Variable", "append_backward", "arange",
    "backward", "bfloat16", "bool_", "cat", "compile", "data", "default_device", "detect_anomaly", "distributed",
    "enable_grad", "float16", "float32", "float64", "full", "get_device", "grad", "int32", "int64",
    "is_grad_enabled", "linalg", "load", "manual_seed", "nn", "no_grad", "ones", "ones_like", "onnx", "op", "ops",
    "optim", "rand", "randn", "register_device", "registry", "save", "set_debug", "set_grad_enabled", "stack",
    "tensor", "testing", "trace", "using_device", "zeros", "zeros_like",
]
