"""Initialisations that overwrite a tensor's values in place, as ``torch.nn.init`` does: every function of
``torch.nn.init`` (``uniform_``, ``normal_``, ``trunc_normal_``, ``constant_``, ``ones_``, ``zeros_``, ``eye_``,
``dirac_``, ``xavier_*``, ``kaiming_*``, ``orthogonal_``, ``sparse_``, ``calculate_gain``, and the deprecated names
without ``_``, with torch's warning).

Every draw comes from opforge's seeded generator (``of.manual_seed``), the same one ``of.randn``/``of.rand``
draw from, so the same seed builds the same model; ``generator=`` takes a ``numpy.random.Generator`` to draw from
instead (opforge draws with NumPy: a ``torch.Generator`` is refused). The same seed gives other numbers than torch's
(another generator): the distributions are torch's. Each function returns the tensor it filled.

Kaiming (He et al. 2015) keeps the variance of activations through a layer: std = gain/√fan, where fan is the
layer's fan_in (forward pass) or fan_out (backward pass). Xavier (Glorot & Bengio 2010) balances both:
std = gain·√(2/(fan_in + fan_out)). A uniform U(−b, b) has std b/√3, so the uniform variants use b = √3·std.
"""

from __future__ import annotations

import math
import warnings

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


def _rng(generator) -> np.random.Generator:
    if generator is None:
        return CPU.generator()
    if not isinstance(generator, np.random.Generator):
        raise ArgumentError(f"nn.init: generator must be None or a numpy.random.Generator (opforge draws with NumPy), "
                            f"got {describe(generator)}")
    return generator


def _dims(tensor: Tensor, allowed, name: str) -> None:
    if not isinstance(tensor, Tensor):
        raise ArgumentError(f"nn.init.{name}: expected an eager Tensor, got {describe(tensor)}")
    if tensor.ndim not in allowed:
        raise ArgumentError(f"nn.init.{name}: only tensors with {' or '.join(map(str, allowed))} dims are supported, "
                            f"got shape {tensor.shape}")


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator=None) -> Tensor:
    """Fill with samples of U[a, b)."""
    return _fill(tensor, _rng(generator).uniform(a, b, tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> Tensor:
    """Fill with samples of N(mean, std²)."""
    return _fill(tensor, mean + std * _rng(generator).standard_normal(tensor.shape))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator=None) -> Tensor:
    """Fill with samples of N(mean, std²) truncated to [a, b], by rejection as torch's: normal draws redrawn
    outside [a, b] when that keeps more than 30% of them, else uniform draws on [a, b] accepted with probability
    density/peak density. (Torch warns when mean is more than 2 std outside [a, b]; so do we.)"""
    if not std > 0 or not a <= b:
        raise ArgumentError(f"nn.init.trunc_normal_: needs std > 0 and a <= b, got std={std}, a={a}, b={b}")
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. The distribution of values may "
                      "be incorrect.", stacklevel=2)
    rng, n = _rng(generator), tensor.size

    def cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    if cdf((b - mean) / std) - cdf((a - mean) / std) > 0.3:
        x = mean + std * rng.standard_normal(n)
        out = (x < a) | (x > b)
        while out.any():
            x[out] = mean + std * rng.standard_normal(int(out.sum()))
            out = (x < a) | (x > b)
    else:
        log_peak = -0.5 * ((max(a, min(mean, b)) - mean) / std) ** 2

        def rejected(values):
            return np.log(rng.uniform(size=values.shape)) > -0.5 * ((values - mean) / std) ** 2 - log_peak

        x = rng.uniform(a, b, n)
        pending = rejected(x)
        while pending.any():
            x[pending] = rng.uniform(a, b, int(pending.sum()))
            pending[pending] = rejected(x[pending])
    return _fill(tensor, x.reshape(tensor.shape))


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _fill(tensor, val)


def zeros_(tensor: Tensor) -> Tensor:
    return _fill(tensor, 0)


def ones_(tensor: Tensor) -> Tensor:
    return _fill(tensor, 1)


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-d tensor with the identity (ones on the diagonal of a rectangular one): Linear layers that pass
    their input through."""
    _dims(tensor, (2,), "eye_")
    return _fill(tensor, np.eye(*tensor.shape))


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """Fill a 3-, 4- or 5-d convolution weight (out, in, *kernel) with the Dirac delta: each output channel of each
    of ``groups`` groups copies one input channel (at the kernel's centre), as far as there are channels."""
    _dims(tensor, (3, 4, 5), "dirac_")
    out = tensor.shape[0]
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or out % groups:
        raise ArgumentError(f"nn.init.dirac_: dim 0 ({out}) must be divisible by groups, got groups={groups!r}")
    per_group = out // groups
    values = np.zeros(tensor.shape)
    centre = tuple(k // 2 for k in tensor.shape[2:])
    for g in range(groups):
        for d in range(min(per_group, tensor.shape[1])):
            values[(g * per_group + d, d, *centre)] = 1
    return _fill(tensor, values)


def orthogonal_(tensor: Tensor, gain: float = 1, generator=None) -> Tensor:
    """Fill with a (semi-)orthogonal matrix, times ``gain`` (Saxe et al. 2013): the Q of the QR decomposition of a
    normal (rows, numel/rows) matrix, its signs fixed by R's diagonal, as torch's; more than 2 dims are flattened."""
    _dims(tensor, range(2, 64), "orthogonal_")
    if tensor.size == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.size // rows
    flat = _rng(generator).standard_normal((rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _fill(tensor, (q * gain).reshape(tensor.shape))


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01, generator=None) -> Tensor:
    """Fill a 2-d tensor with N(0, std²) and zero ⌈sparsity·rows⌉ random rows of each column (Martens 2010)."""
    _dims(tensor, (2,), "sparse_")
    if not 0 <= sparsity <= 1:
        raise ArgumentError(f"nn.init.sparse_: sparsity must be in [0, 1], got {sparsity}")
    rng = _rng(generator)
    rows, cols = tensor.shape
    values = std * rng.standard_normal((rows, cols))
    zeros = math.ceil(sparsity * rows)
    for col in range(cols):
        values[rng.permutation(rows)[:zeros], col] = 0
    return _fill(tensor, values)


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator=None) -> Tensor:
    """Fill with U(−b, b), b = gain·√(3/fan); ``a`` is the negative slope for leaky_relu's gain."""
    if tensor.size == 0:
        return tensor
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator=None) -> Tensor:
    """Fill with N(0, std²), std = gain/√fan."""
    if tensor.size == 0:
        return tensor
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)), generator)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    """Fill with U(−b, b), b = gain·√(6/(fan_in + fan_out))."""
    if tensor.size == 0:
        return tensor
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    """Fill with N(0, std²), std = gain·√(2/(fan_in + fan_out))."""
    if tensor.size == 0:
        return tensor
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def _deprecated(fn):
    """torch's old name (without ``_``) of an init function: the same function, with torch's FutureWarning."""
    def deprecated(*args, **kwargs):
        warnings.warn(f"`nn.init.{fn.__name__[:-1]}` is now deprecated in favor of `nn.init.{fn.__name__}`.",
                      FutureWarning, stacklevel=2)
        return fn(*args, **kwargs)

    deprecated.__name__ = deprecated.__qualname__ = fn.__name__[:-1]
    deprecated.__doc__ = f"Deprecated (as in torch): use ``{fn.__name__}``."
    return deprecated


uniform, normal, constant, eye, dirac, xavier_uniform, xavier_normal, kaiming_uniform, kaiming_normal, orthogonal, \
    sparse = map(_deprecated, (uniform_, normal_, constant_, eye_, dirac_, xavier_uniform_, xavier_normal_,
                               kaiming_uniform_, kaiming_normal_, orthogonal_, sparse_))

__all__ = ["calculate_gain", "constant", "constant_", "dirac", "dirac_", "eye", "eye_", "fan_in_and_fan_out",
           "kaiming_normal", "kaiming_normal_", "kaiming_uniform", "kaiming_uniform_", "normal", "normal_", "ones_",
           "orthogonal", "orthogonal_", "sparse", "sparse_", "trunc_normal_", "uniform", "uniform_", "xavier_normal",
           "xavier_normal_", "xavier_uniform", "xavier_uniform_", "zeros_"]
