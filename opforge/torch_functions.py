"""torch's top-level functions that opforge has, under torch's names: ``of.exp``, ``of.flatten``, ``of.softmax(x, 1)``,
``of.clamp``, ``of.cat``, ``of.mm``, ``of.transpose(x, 0, 1)``, ``of.randperm(n)``... ``opforge/__init__.py``
publishes ``NAMES``. Each is an op or function defined elsewhere, never a second definition:

* an op or function of ``opforge.ops`` whose namesake in ``torch`` takes the same arguments and means the same
  (most of them: the ops take torch's positional order and ``dim=``);
* one under torch's other name for it (``clamp`` is ``clip``, ``cat`` is ``concat``, ``eq`` is ``equal``...);
* torch's call form where it is not the op's: ``transpose(input, dim0, dim1)`` (the op ``transpose`` permutes all
  dims) is ``Tensor.transpose``, ``einsum(equation, *operands)`` calls the op with its operands first, ``equal``
  gives one bool (the op ``equal`` is elementwise ``eq``);
* the creation functions of ``creation.py`` (``zeros(2, 3)``, ``eye``, ``randint``, ``from_numpy``...).

A namesake that means something else in torch is left out rather than published: ``torch.embedding(weight,
input)`` and ``torch.embedding_bag`` take the weight first, ``torch.batch_norm`` and ``torch.instance_norm`` the
weight before the statistics; their ``torch.nn.functional`` forms are ``opforge.ops``'s. ``torch.normal(mean, std,
size)`` is torch's form here, over the op ``normal(*, shape, mean, std)``.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from . import creation, torch_forms
from . import ops as F
from .core import dtypes as D
from .core.devices import get_device, using_device
from .core.errors import ArgumentError
from .core.grad_mode import _Switch
from .core.opdef import registry
from .tensor import Tensor, written_into
from .torch_names import TORCH

# namesakes of ops and functions that mean something else in torch (see the module docstring)
_NOT_TORCHS = {"batch_norm", "instance_norm", "embedding", "embedding_bag", "normal", "transpose", "equal", "einsum",
               "zeros", "ones", "full", "arange", "eye", "zeros_like", "ones_like", "trace", "scatter",
               "adaptive_max_pool1d"}

# torch's other names for our ops and functions
_SYNONYMS = {"clamp": "clip", "cat": "concat", "concatenate": "concat", "eq": "equal", "ne": "not_equal",
             "lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal", "negative": "neg",
             "multiply": "mul", "divide": "div", "true_divide": "div", "subtract": "sub", "absolute": "abs",
             "det": "linalg_det", "inverse": "linalg_inv", "cholesky": "linalg_cholesky",
             "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
             "arctanh": "atanh", "arctan2": "atan2", "fix": "trunc",
             "matrix_power": "linalg_matrix_power", "matrix_exp": "linalg_matrix_exp"}


def transpose(input, dim0, dim1):
    """``torch.transpose``: ``input`` with dims ``dim0`` and ``dim1`` swapped (``Tensor.transpose``)."""
    return input.transpose(dim0, dim1)


swapaxes = swapdims = transpose


def einsum(equation, *operands):
    """``torch.einsum(equation, *operands)`` (or one list of operands): the op ``einsum`` takes them first."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = operands[0]
    return F.einsum(list(operands), equation=equation)


def equal(input, other) -> bool:
    """``torch.equal``: ``Tensor.equal``, one bool (``eq`` is elementwise)."""
    return input.equal(other)


def scatter(input, dim, index, src=None, *, value=None, reduce=None):
    """``torch.scatter``: ``Tensor.scatter`` (the op ``scatter``; with torch's deprecated ``reduce='add'`` or
    ``'multiply'``, ``scatter_reduce`` with 'sum' or 'prod', x's own value included)."""
    given = {"src": src} if value is None else {"value": value}
    return input.scatter(dim, index, **given) if reduce is None else input.scatter(dim, index, **given, reduce=reduce)


def adaptive_max_pool1d(input, output_size):
    """``torch.adaptive_max_pool1d``: the named tuple (values, indices), always (``torch.nn.functional``'s, which is
    ``F.adaptive_max_pool1d``, gives the values unless ``return_indices``)."""
    return F.adaptive_max_pool1d(input, output_size, True)


def index_put(input, indices, values, accumulate=False):
    """``torch.index_put``: ``Tensor.index_put``."""
    return input.index_put(indices, values, accumulate)


def normal(mean=0.0, std=1.0, size=None, *, dtype=None, device=None, requires_grad: bool = False):
    """``torch.normal``: samples of N(mean, std²), of ``size`` for numbers ``mean`` and ``std`` (the op ``normal``),
    else of the tensors' broadcast shape, elementwise (``mean + std·randn``)."""
    if isinstance(mean, (int, float)) and isinstance(std, (int, float)):
        if size is None:
            raise ArgumentError("normal(): with a number mean and std, give size= (torch's normal(mean, std, size))")
        with using_device(device) if device is not None else nullcontext():
            t = F.normal(shape=list(size), mean=float(mean), std=float(std), dtype=dtype)
    else:
        if size is not None:
            raise ArgumentError("normal(): size= goes with a number mean and std, not with tensors")
        like = mean if isinstance(mean, Tensor) else std
        t = mean + std * creation.randn_like(F.broadcast_to(like, list(np.broadcast_shapes(
            tuple(np.shape(mean)), tuple(np.shape(std))))))
    return t.requires_grad_(True) if requires_grad else t


def where(condition, input=None, other=None):
    """``torch.where(condition, input, other)``: ``input`` where ``condition`` holds, else ``other``;
    ``torch.where(condition)`` alone is ``nonzero(condition, as_tuple=True)``."""
    if input is None and other is None:
        return F.nonzero(condition, as_tuple=True)
    if input is None or other is None:
        raise ArgumentError("where(): give both input and other, or neither (torch.where(condition) gives the "
                            "indices where it holds)")
    return F.where(condition, input, other)


def allclose(input, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """``torch.allclose``: ``Tensor.allclose``, one bool."""
    return input.allclose(other, rtol, atol, equal_nan)


def ravel(input):
    """``torch.ravel``: ``Tensor.ravel``."""
    return input.ravel()


def clone(input, *, memory_format=None):
    """``torch.clone``: ``input.clone()``, a copy that gradients flow back through."""
    return input.clone()


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad: bool = False):
    """``torch.linspace``: ``steps`` values from ``start`` to ``end``, evenly spaced, computed as torch computes
    them (the first half counted up from ``start``, the second down from ``end``, so both ends are exact)."""
    dtype = D.DEFAULT_FLOAT if dtype is None else dtype
    return creation.tensor(_spaced("linspace", start, end, steps, dtype), dtype=dtype, device=device,
                           requires_grad=requires_grad)


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None, device=None, requires_grad: bool = False):
    """``torch.logspace``: ``base`` to the powers ``linspace(start, end, steps)``."""
    dtype = D.DEFAULT_FLOAT if dtype is None else dtype
    return creation.tensor(np.power(float(base), _spaced("logspace", start, end, steps, dtype)), dtype=dtype,
                           device=device, requires_grad=requires_grad)


def _spaced(name: str, start, end, steps, dtype) -> np.ndarray:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ArgumentError(f"{name}(): steps must be an int >= 0, got {steps!r}")
    start, end = (float(v.item() if hasattr(v, "item") else v) for v in (start, end))
    if not D.is_floating(D.as_dtype(dtype, op=name, arg="dtype")):  # torch makes start and end of an integer
        start, end = float(int(start)), float(int(end))              # dtype first: truncated toward zero
    if steps == 1:
        return np.array([start])
    step = (end - start) / max(steps - 1, 1)
    i = np.arange(steps, dtype=np.float64)
    return np.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))


def result_type(tensor, other):
    """``torch.result_type``: the dtype an op of these two operands computes in (numbers count by category only)."""
    def operand(v, peer):
        if hasattr(v, "dtype") and hasattr(v, "shape"):
            return v
        if not isinstance(v, (bool, int, float, np.number)):
            raise ArgumentError(f"result_type(): expected a tensor or a number, got {v!r}")
        return np.empty((), D.scalar_dtype(v, peer))

    if not hasattr(tensor, "dtype") and not hasattr(other, "dtype"):
        raise ArgumentError("result_type(): give at least one tensor")
    peer = (tensor if hasattr(tensor, "dtype") else other).dtype
    return D.result_type(operand(tensor, peer), operand(other, peer))


def promote_types(type1, type2):
    """``torch.promote_types``: the dtype two tensors of these dtypes promote to."""
    return D.promote(D.as_dtype(type1, op="promote_types"), D.as_dtype(type2, op="promote_types"))


def can_cast(from_, to) -> bool:
    """``torch.can_cast``: whether type promotion allows ``from_`` to become ``to`` (never to a lower category:
    floating to integer or bool, integer to bool)."""
    return D.category(D.as_dtype(from_, op="can_cast")) <= D.category(D.as_dtype(to, op="can_cast"))


def numel(input) -> int:
    return input.numel()


def is_tensor(obj) -> bool:
    return isinstance(obj, Tensor)


def is_floating_point(input) -> bool:
    return D.is_floating(input.dtype)


def get_default_dtype():
    """float32: what Python floats become (opforge's default float dtype, as torch's)."""
    return D.DEFAULT_FLOAT


def set_default_dtype(dtype) -> None:
    """Only float32, opforge's one default float dtype: another is refused rather than ignored."""
    if D.as_dtype(dtype) != D.DEFAULT_FLOAT:
        raise ArgumentError(f"set_default_dtype(): opforge's default float dtype is float32 and cannot change; got "
                            f"{dtype} (give dtype= where you make tensors, or convert models with .to(dtype))")


def inference_mode(mode: bool = True):
    """``torch.inference_mode``: here ``no_grad`` (opforge has no inference tensors to make); a context manager and
    a decorator."""
    return _Switch(not mode)


device = get_device  # torch.device("cpu"): the Device of that name (it compares equal to the name)
Size = tuple  # shapes are tuples; torch.Size is a tuple too

# torch.nn.functional's activations that take ``inplace`` (after this many settings, in torch's order), and their
# ``_`` forms: the op's value written into the input (``Tensor.copy_``: recorded for autograd as torch records it).
# The mock's torch.nn.functional offers these; opforge.ops' own functions are the ops (use ``x.relu_()`` there).
_IN_PLACE_ACTIVATIONS = {"relu": 0, "relu6": 0, "selu": 0, "silu": 0, "mish": 0, "hardswish": 0, "hardsigmoid": 0,
                         "leaky_relu": 1, "elu": 1, "celu": 1, "hardtanh": 2, "threshold": 2}


def _with_inplace(op: str, settings: int):
    def activation(input, *args, inplace=False, **kwargs):
        if len(args) > settings:
            if len(args) > settings + 1:
                raise ArgumentError(f"{op}(): takes {settings} setting(s) then inplace, got {len(args)} positional "
                                    "arguments after the input")
            inplace, args = args[settings], args[:settings]
        if inplace:
            return written_into(input, lambda x: getattr(F, op)(x, *args, **kwargs))
        return getattr(F, op)(input, *args, **kwargs)

    activation.__name__ = activation.__qualname__ = op
    activation.__doc__ = f"``torch.nn.functional.{op}``: ``F.{op}``, written into the input with ``inplace=True``."
    return activation


def _in_place(op: str):
    def activation(input, *args, **kwargs):
        return written_into(input, lambda x: getattr(F, op)(x, *args, **kwargs))

    activation.__name__ = activation.__qualname__ = f"{op}_"
    activation.__doc__ = f"``torch.nn.functional.{op}_``: ``F.{op}`` written into the input."
    return activation


FUNCTIONAL = {**{op: _with_inplace(op, n) for op, n in _IN_PLACE_ACTIVATIONS.items()},
              **{f"{op}_": _in_place(op) for op in ("relu", "elu", "leaky_relu", "hardtanh", "threshold", "selu",
                                                   "celu")}}


def _published() -> dict:
    names = {}
    ours = {op.name for op in registry} | set(registry.functions)
    for name in TORCH & ours - _NOT_TORCHS:
        names[name] = getattr(F, name)
    for name, op in _SYNONYMS.items():
        names[name] = getattr(F, op)
    for name in creation.__all__:
        if name in TORCH or name in ("tensor", "manual_seed"):
            names[name] = getattr(creation, name)
    for name in ("transpose", "swapaxes", "swapdims", "einsum", "equal", "normal", "numel", "is_tensor",
                 "is_floating_point", "get_default_dtype", "set_default_dtype", "inference_mode", "device", "Size",
                 "index_put", "scatter", "adaptive_max_pool1d", "where", "allclose", "clone", "linspace", "logspace",
                 "ravel", "result_type", "promote_types", "can_cast"):
        names[name] = globals()[name]
    for name in torch_forms.__all__:  # torch's call forms over the ops (std's unbiased, dtype=, ...)
        if name in TORCH:
            names[name] = getattr(torch_forms, name)
    # torch's dtype names (not globals here: they would hide the builtins float, int, bool)
    names.update(float=D.float32, double=D.float64, half=D.float16, long=D.int64, int=D.int32, bool=D.bool_)
    return names


NAMES = _published()

__all__ = ["FUNCTIONAL", "NAMES"]
