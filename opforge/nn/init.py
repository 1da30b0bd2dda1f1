"""Initialisations that overwrite a tensor's values in place, as ``torch.nn.init`` does.

Every draw comes from opforge's seeded generator (``of.manual_seed``), the same one ``of.randn``/``of.rand``
draw from, so the same seed builds the same model. Each function returns the tensor it filled.

Kaiming (He et al. 2015) keeps the variance of activations through a layer: std = gain/√fan, where fan is the
layer's fan_in (forward pass) or fan_out (backward pass). Xavier (Glorot & Bengio 2010) balances both:
std = gain·√(2/(fan_in + fan_out)). A uniform U(−b, b) has std b/√3, so the uniform variants use b = √3·std.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.devices import CPU
from ..core.errors import ArgumentError, describe
from ..tensor import Tensor, note_write


def _fill(tensor: Tensor, values) -> Tensor:
    """Write ``values`` into the tensor's own array (so programs sharing it see the change), as an in-place write."""
    if not isinstance(tensor, Tensor):
        raise ArgumentError(f"nn.init: expected an eager Tensor, got {describe(tensor)}")
    values = np.asarray(values, dtype=tensor.dtype)  # draws are float64; the tensor keeps its dtype
    tensor._device.copy_into(tensor._data, tensor._device.from_host(values))
    note_write(tensor._data, "nn.init")
    return tensor


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The factor by which a nonlinearity shrinks the std of its input, to undo in the init: 1 for linear layers
    and sigmoid, 5/3 for tanh, √2 for relu, √(2/(1 + a²)) for leaky_relu of slope a (default 0.01), 3/4 for selu."""
    if nonlinearity in ("linear", "identity", "sigmoid") or nonlinearity.startswith("conv"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1.0 + slope * slope))
    if nonlinearity == "selu":
        return 0.75
    raise ArgumentError(f"calculate_gain(): unknown nonlinearity {nonlinearity!r} (expected linear, conv1d, conv2d, "
                        "sigmoid, tanh, relu, leaky_relu or selu)")


def fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight laid out as torch's: (out, in) for Linear, (out, in/groups, kH, kW) for
    Conv2d; the receptive field (kH·kW) multiplies both."""
    if tensor.ndim < 2:
        raise ArgumentError(f"nn.init: fan in and fan out need a tensor of at least 2 dims, got shape {tensor.shape}")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ArgumentError(f"nn.init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with samples of U[a, b)."""
    return _fill(tensor, CPU.generator().uniform(a, b, tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with samples of N(mean, std²)."""
    return _fill(tensor, mean + std * CPU.generator().standard_normal(tensor.shape))


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _fill(tensor, val)


def zeros_(tensor: Tensor) -> Tensor:
    return _fill(tensor, 0)


def ones_(tensor: Tensor) -> Tensor:
    return _fill(tensor, 1)


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu") -> Tensor:
    """Fill with U(−b, b), b = gain·√(3/fan); ``a`` is the negative slope for leaky_relu's gain."""
    if tensor.size == 0:
        return tensor
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """Fill with N(0, std²), std = gain/√fan."""
    if tensor.size == 0:
        return tensor
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Fill with U(−b, b), b = gain·√(6/(fan_in + fan_out))."""
    if tensor.size == 0:
        return tensor
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Fill with N(0, std²), std = gain·√(2/(fan_in + fan_out))."""
    if tensor.size == 0:
        return tensor
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


__all__ = ["calculate_gain", "constant_", "fan_in_and_fan_out", "kaiming_normal_", "kaiming_uniform_", "normal_",
           "ones_", "uniform_", "xavier_normal_", "xavier_uniform_", "zeros_"]
