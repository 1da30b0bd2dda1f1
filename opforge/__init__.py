"""opforge: define a deep-learning op once — signature, kernels, shape rule, gradient rule — and get
argument checking, dispatch, eager autograd to any order and gradient checks from that one definition.

    import opforge as of
    from opforge import ops as F
"""

# -- start-up: each layer is loaded after the layers it is built on, and imports none above it ---------------------
# At run time the layers call each other in a loop — Tensor operators are ops, ops return Tensors, gradient rules call
# ops — which is closed here by binding late, in two stated calls (Chainer's install_variable_arithmetics, JAX's
# register_jax_array_methods), not by import circles.
# isort: off
import importlib

from . import core
from . import ops  # the namespace opforge.ops (F): each declared op's function, as it gets one (imports core alone)
from . import tensor  # Tensor and the autograd Node: its operators and methods call F
from . import dispatch  # makes each op's function (fast path, eager calls, recording for autograd)

dispatch.install()  # binding 1: from here on every declared op has its function, and EAGER its meaning
core.floating_point.install_filter()  # NumPy's floating-point warnings from opforge's code: as silent as torch
# The op library: declarations (signature, kernels, shape and gradient rules) that import core alone, one module per
# family. half first: it gives every op declared after it (the library's, then yours) its half-precision kernels.
_OP_FAMILIES = ("half", "creation", "elementwise", "binary", "integer", "reduce", "shape", "linalg", "loss", "nn",
                "normalization", "conv", "accumulate", "optim", "collective", "device", "pool", "resize", "recurrent",
                "embedding_bags", "feature_dropout", "indexing", "similarity", "sorting", "sparse",
                "reduce_torch", "linalg_torch", "elementwise_math", "special", "activations", "margin_losses",
                "selection", "shape_functions", "ctc", "sampling",
                "cuda_kernels")  # last: CUDA kernels for ops of the families above (CuPy imported on first use)
for _family in _OP_FAMILIES:
    importlib.import_module(f"{__name__}.ops.{_family}")
from . import autodiff  # noqa: E402  (the eager backward pass, replay, anomaly detection)

tensor.bind_engine(autodiff.backward)  # binding 2: Tensor.backward runs the autograd engine
from . import creation, program, nn, optim, checkpoint, data, linalg, sparse, testing, distributed, onnx  # noqa: E402, F401
from . import cuda  # noqa: E402, F401  (torch.cuda's questions; CuPy is imported only when they are asked)
# isort: on

from ._version import __version__  # noqa: E402
from .autodiff import backward, detect_anomaly, grad  # noqa: E402
from .checkpoint import load, save  # noqa: E402
from .core import (  # noqa: E402
    AnomalyError,
    ArgumentError,
    Device,
    DispatchError,
    DivisionByZeroError,
    GradientError,
    OpforgeError,
    OutOfMemoryError,
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
from .core.declare import op  # noqa: E402
from .core.dtypes import bfloat16, bool_, float16, float32, float64, int32, int64  # noqa: E402
from .creation import arange, cat, from_dlpack, full, ones, ones_like, rand, randn, stack, tensor, zeros, zeros_like  # noqa: E402, F401
from .dispatch import set_debug  # noqa: E402
from .program import Executor, Program, Variable, append_backward, compile, trace  # noqa: E402
from .sparse import sparse_coo_tensor  # noqa: E402
from .tensor import Tensor  # noqa: E402
from .torch_functions import NAMES as _TORCH_NAMES  # noqa: E402
from .torch_names import TORCH as _TORCH  # noqa: E402
from .torch_names import missing as _missing  # noqa: E402

# torch's top-level functions that opforge has, under torch's names (of.exp, of.clamp, of.cat, of.transpose(x, 0, 1),
# of.eye(3), of.randperm(n)...: torch_functions.py says which and why); names opforge has already stay its own
globals().update({k: v for k, v in _TORCH_NAMES.items() if k not in globals()})


def __getattr__(name: str):
    """A name opforge lacks: the error says whether PyTorch has it, and which names opforge has near it."""
    if name.startswith("__"):
        raise AttributeError(f"module 'opforge' has no attribute '{name}'")
    public = [k for k, v in globals().items() if not isinstance(v, type(core)) or k in __all__]  # no inner modules
    raise AttributeError(_missing("opforge", name, _TORCH, public, "torch"))


__all__ = [
    "AnomalyError", "ArgumentError", "Device", "DispatchError", "DivisionByZeroError", "Executor", "GradientError",
    "OpforgeError", "OutOfMemoryError", "Program", "Sample", "SchemaError", "ShapeError", "Spec", "Tensor", "Variable",
    "__version__", "append_backward", "arange", "backward", "bfloat16", "bool_", "cat", "compile", "data",
    "default_device", "detect_anomaly", "distributed", "enable_grad", "float16", "float32", "float64", "full",
    "get_device", "grad", "int32", "int64",
    "is_grad_enabled", "linalg", "load", "manual_seed", "nn", "no_grad", "ones", "ones_like", "onnx", "op", "ops",
    "optim", "rand", "randn", "register_device", "registry", "save", "set_debug", "set_grad_enabled", "sparse",
    "sparse_coo_tensor", "stack",
    "tensor", "testing", "trace", "using_device", "zeros", "zeros_like",
]
