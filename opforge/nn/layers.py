"""Layers: PyTorch's layouts, parameter names and default initialisations, each a thin Module over registered ops.

The same layer runs eagerly and inside ``of.trace``/``of.compile``: forward only calls ops. State a layer updates
(BatchNorm's running statistics) goes through ``opforge.program.assign``, which the innermost interpreter answers:
eagerly it writes in place, while tracing it records the update.
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np

from .. import ops as F
from ..core import dtypes as D
from ..core.errors import ArgumentError, ShapeError, describe
from ..core.grad_mode import no_grad
from ..ops.normalization import instance_stats
from ..program import assign, live
from ..tensor import Tensor, written_into
from . import init
from .module import Module

# -- helpers ---------------------------------------------------------------------------------------------------


def _dtype(dtype):
    dtype = D.DEFAULT_FLOAT if dtype is None else D.as_dtype(dtype, arg="dtype")
    if not D.is_floating(dtype):
        raise ArgumentError(f"layers hold floating-point parameters, got dtype={dtype}")
    return dtype


def _on_device(init):
    """A layer's ``__init__`` that takes torch's ``device=`` (its ``dtype=`` it takes itself): the parameters and
    buffers it made are moved there (``Module.to``)."""

    @functools.wraps(init)
    def with_device(self, *args, device=None, **kwargs):
        init(self, *args, **kwargs)
        if device is not None:
            self.to(device)

    signature = inspect.signature(init)
    with_device.__signature__ = signature.replace(parameters=[
        *signature.parameters.values(), inspect.Parameter("device", inspect.Parameter.KEYWORD_ONLY, default=None)])
    return with_device


def _torch_defaults(layer: str, **given) -> None:
    """Refuse a setting of torch's that opforge does not implement unless it has torch's default: ``name=(value,
    default)``."""
    for name, (value, default) in given.items():
        if value is not default and value != default:
            raise ArgumentError(f"{layer}(): {name}={value!r} is not supported (only torch's default, {default!r})")


def _param(*shape, dtype) -> Tensor:
    """A zero parameter of this shape; ``reset_parameters`` gives it its initial values."""
    return Tensor(np.zeros(shape, _dtype(dtype)), requires_grad=True)


def _count(value, name: str, layer: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ArgumentError(f"{layer}(): argument '{name}' must be an int >= {minimum}, got {value!r}")
    return int(value)


def _pair(value, name: str, layer: str, minimum: int = 0) -> tuple[int, int]:
    """An int or a pair of ints as a pair (kernel sizes, strides, paddings)."""
    pair = (value, value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ArgumentError(f"{layer}(): argument '{name}' must be an int or a pair of ints, got {value!r}")
    return tuple(_count(v, name, layer, minimum) for v in pair)


def _live(t: Tensor | None):
    """A buffer as the op should read it (see ``opforge.program.live``); None stays None."""
    return None if t is None else live(t)


# -- linear and convolution ------------------------------------------------------------------------------------


class Linear(Module):
    """y = x·Wᵀ + b over the last dim of x; W is (out_features, in_features), b is (out_features,)."""

    @_on_device
    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=None):
        super().__init__()
        self.in_features = _count(in_features, "in_features", "Linear", 0)
        self.out_features = _count(out_features, "out_features", "Linear", 0)
        self.weight = _param(out_features, in_features, dtype=dtype)
        self.bias = _param(out_features, dtype=dtype) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # PyTorch's default: kaiming_uniform with a = √5, i.e. U(±1/√fan_in), and the bias U(±1/√fan_in).
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_features
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bilinear(Module):
    """y = x₁ᵀ·A·x₂ + b over the last dims of x₁ and x₂; A is (out_features, in1_features, in2_features), b is
    (out_features,), both initialised U(±1/√in1_features), as torch's."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True, dtype=None):
        super().__init__()
        self.in1_features = _count(in1_features, "in1_features", "Bilinear")
        self.in2_features = _count(in2_features, "in2_features", "Bilinear")
        self.out_features = _count(out_features, "out_features", "Bilinear")
        self.weight = _param(out_features, in1_features, in2_features, dtype=dtype)
        self.bias = _param(out_features, dtype=dtype) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.in1_features)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


def _ntuple(value, n: int, name: str, layer: str, minimum: int = 0) -> tuple:
    """An int or n ints as an n-tuple (kernel sizes, strides, paddings of an n-d layer)."""
    values = (value,) * n if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    if not isinstance(values, (tuple, list)) or len(values) != n:
        what = "an int or a pair of ints" if n == 2 else f"an int or {n} ints"
        raise ArgumentError(f"{layer}(): argument '{name}' must be {what}, got {value!r}")
    return tuple(_count(v, name, layer, minimum) for v in values)


class _ConvNd(Module):
    """What Conv1d/2d/3d and ConvTranspose1d/2d/3d share: channels, geometry, the weight, PyTorch's initialisation."""

    _nd = 2
    _transposed = False

    @_on_device
    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", dtype=None, output_padding=0):
        super().__init__()
        name, nd = type(self).__name__, self._nd
        modes = ("zeros",) if self._transposed else ("zeros", "reflect", "replicate", "circular")
        if padding_mode not in modes:
            raise ArgumentError(f"{name}(): padding_mode must be one of {modes}, got {padding_mode!r}")
        self.padding_mode = padding_mode
        self.in_channels = _count(in_channels, "in_channels", name)
        self.out_channels = _count(out_channels, "out_channels", name)
        self.groups = _count(groups, "groups", name)
        if in_channels % groups or out_channels % groups:
            raise ArgumentError(f"{name}(): in_channels ({in_channels}) and out_channels ({out_channels}) must both "
                                f"be divisible by groups ({groups})")
        self.kernel_size = _ntuple(kernel_size, nd, "kernel_size", name, 1)
        self.stride = _ntuple(stride, nd, "stride", name, 1)
        self.dilation = _ntuple(dilation, nd, "dilation", name, 1)
        if padding in ("same", "valid") and not self._transposed:
            if padding == "same" and self.stride != (1,) * nd:
                raise ArgumentError(f"{name}(): padding='same' needs stride 1, got stride {self.stride}")
            self.padding = padding
        else:
            self.padding = _ntuple(padding, nd, "padding", name, 0)
        if self._transposed:
            self.output_padding = _ntuple(output_padding, nd, "output_padding", name, 0)
            if any(p >= s for p, s in zip(self.output_padding, self.stride)):
                raise ArgumentError(f"{name}(): output_padding {self.output_padding} must be smaller than the "
                                    f"stride {self.stride}")
        weight = (in_channels, out_channels // groups) if self._transposed else (out_channels, in_channels // groups)
        self.weight = _param(*weight, *self.kernel_size, dtype=dtype)
        self.bias = _param(out_channels, dtype=dtype) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # U(±1/√fan_in), fan_in = weight.shape[1]·∏kernel
        if self.bias is not None:
            fan_in, _ = init.fan_in_and_fan_out(self.weight)
            init.uniform_(self.bias, -1.0 / math.sqrt(fan_in), 1.0 / math.sqrt(fan_in))

    def forward(self, x):
        geometry = {"stride": self.stride, "padding": self.padding, "dilation": self.dilation, "groups": self.groups}
        if self.padding_mode != "zeros":  # as torch: the input padded by that mode, then no padding in the conv
            x, geometry["padding"] = F.pad(x, self._pads(), self.padding_mode), 0
        if self._transposed:
            geometry["output_padding"] = self.output_padding
        op = getattr(F, f"conv{'_transpose' if self._transposed else ''}{self._nd}d")
        return op(x, self.weight, self.bias, **geometry)

    def _pads(self) -> list:
        """F.pad's pads (last dim first) that padding 'same', 'valid' or numbers make: what torch pads by
        padding_mode."""
        pairs = []
        for i in range(self._nd):
            total = self.dilation[i] * (self.kernel_size[i] - 1)
            pairs.append((total // 2, total - total // 2) if self.padding == "same" else (0, 0)
                         if self.padding == "valid" else (self.padding[i], self.padding[i]))
        return [p for pair in reversed(pairs) for p in pair]

    def extra_repr(self) -> str:
        nd = self._nd
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * nd:
            text += f", padding={self.padding}"
        if self._transposed and self.output_padding != (0,) * nd:
            text += f", output_padding={self.output_padding}"
        if self.dilation != (1,) * nd:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.bias is not None else ", bias=False")


class Conv1d(_ConvNd):
    """1-D convolution (cross-correlation, as PyTorch) of an (N, C_in, L) — or (C_in, L) — input with a weight of
    shape (out_channels, in_channels/groups, k). ``padding`` is an int, "valid" (0) or "same" (stride 1)."""

    _nd = 1


class Conv2d(_ConvNd):
    """2-D convolution (cross-correlation, as PyTorch) of an (N, C_in, H, W) — or (C_in, H, W) — input with a weight
    of shape (out_channels, in_channels/groups, kH, kW). ``padding`` is an int, a pair, "valid" (0) or "same"
    (stride 1; an odd total padding puts the extra row or column behind, as PyTorch)."""


class Conv3d(_ConvNd):
    """3-D convolution (cross-correlation, as PyTorch) of an (N, C_in, D, H, W) — or (C_in, D, H, W) — input with a
    weight of shape (out_channels, in_channels/groups, kD, kH, kW). ``padding`` is ints, "valid" or "same"."""

    _nd = 3


class _ConvTransposeNd(_ConvNd):
    _transposed = True

    @_on_device
    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, dtype, output_padding)


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution (the gradient of Conv1d with respect to its input, plus a bias) of an
    (N, C_in, L) — or (C_in, L) — input, weight (in_channels, out_channels/groups, k), as PyTorch's."""

    _nd = 1


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution (the gradient of Conv2d with respect to its input, plus a bias) of an
    (N, C_in, H, W) — or (C_in, H, W) — input, weight (in_channels, out_channels/groups, kH, kW), as PyTorch's."""

    _nd = 2


class ConvTranspose3d(_ConvTransposeNd):
    """3-D transposed convolution (the gradient of Conv3d with respect to its input, plus a bias) of an
    (N, C_in, D, H, W) — or (C_in, D, H, W) — input, weight (in_channels, out_channels/groups, kD, kH, kW)."""

    _nd = 3


# -- normalisation ---------------------------------------------------------------------------------------------


class _BatchNorm(Module):
    """Normalise each channel C of an (N, C, ...) input with its batch statistics (training) or with running
    statistics (eval), then scale by ``weight`` and shift by ``bias`` (when ``affine``).

    In training the running statistics become (1 − momentum)·running + momentum·batch (the variance unbiased),
    as in PyTorch; ``num_batches_tracked`` counts the updates (kept so that state dicts match PyTorch's keys).
    """

    _dims: tuple = ()
    _layout = ""

    @_on_device
    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True, dtype=None):
        super().__init__()
        name = type(self).__name__
        self.num_features = _count(num_features, "num_features", name)
        self.eps = float(eps)
        if momentum is None or not 0.0 <= momentum <= 1.0:
            raise ArgumentError(f"{name}(): momentum must be a float in [0, 1], got {momentum!r} (the cumulative "
                                "average of momentum=None is not supported)")
        self.momentum = float(momentum)
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        dt = _dtype(dtype)
        self.weight = Tensor(np.ones(num_features, dt), requires_grad=True) if affine else None
        self.bias = Tensor(np.zeros(num_features, dt), requires_grad=True) if affine else None
        if self.track_running_stats:
            self.register_buffer("running_mean", Tensor(np.zeros(num_features, dt)))
            self.register_buffer("running_var", Tensor(np.ones(num_features, dt)))
            self.register_buffer("num_batches_tracked", Tensor(np.array(0, np.int64)))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            init.zeros_(self.running_mean), init.ones_(self.running_var), init.zeros_(self.num_batches_tracked)

    def forward(self, x):
        if len(x.shape) not in self._dims:
            raise ShapeError(f"{type(self).__name__}: expected a {self._layout} input, got shape {tuple(x.shape)}")
        update = self.training and self.track_running_stats
        y, mean, var = F.batch_norm_with_stats(x, _live(self.running_mean), _live(self.running_var), self.weight,
                                               self.bias, training=self.training or not self.track_running_stats,
                                               momentum=self.momentum, eps=self.eps)
        if update:
            with no_grad():
                assign(self.running_mean, mean)
                assign(self.running_var, var)
                assign(self.num_batches_tracked, _live(self.num_batches_tracked) + 1)
        return y

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    __doc__ = _BatchNorm.__doc__
    _dims = (2, 3)
    _layout = "2-D (N, C) or 3-D (N, C, L)"


class BatchNorm2d(_BatchNorm):
    __doc__ = _BatchNorm.__doc__
    _dims = (4,)
    _layout = "4-D (N, C, H, W)"


class LayerNorm(Module):
    """Normalise over the last dims (``normalized_shape``) of each sample, then y = x̂·weight + bias."""

    @_on_device
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 dtype=None):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else normalized_shape
        self.normalized_shape = tuple(_count(d, "normalized_shape", "LayerNorm") for d in shape)
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        dt = _dtype(dtype)
        affine = self.elementwise_affine
        self.weight = Tensor(np.ones(self.normalized_shape, dt), requires_grad=True) if affine else None
        self.bias = Tensor(np.zeros(self.normalized_shape, dt), requires_grad=True) if affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    """Normalise over the last dims (``normalized_shape``) by their root mean square, then y = x̂·weight; ``eps``
    None takes the machine epsilon of the input's dtype, as PyTorch."""

    @_on_device
    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, dtype=None):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else normalized_shape
        self.normalized_shape = tuple(_count(d, "normalized_shape", "RMSNorm") for d in shape)
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        dt = _dtype(dtype)
        self.weight = Tensor(np.ones(self.normalized_shape, dt), requires_grad=True) if elementwise_affine else None

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LocalResponseNorm(Module):
    """Each channel divided by (k + alpha·the mean of x² over ``size`` neighbouring channels)^beta."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, float(alpha), float(beta), float(k)

    def forward(self, x):
        return F.local_response_norm(x, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class GroupNorm(Module):
    """Normalise each of ``num_groups`` groups of channels of an (N, C, ...) input over the group's channels and
    the other dims, then y = x̂·weight + bias per channel (when ``affine``)."""

    @_on_device
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, dtype=None):
        super().__init__()
        self.num_groups = _count(num_groups, "num_groups", "GroupNorm")
        self.num_channels = _count(num_channels, "num_channels", "GroupNorm")
        if self.num_channels % self.num_groups:
            raise ArgumentError(f"GroupNorm(): num_channels ({num_channels}) must be divisible by num_groups "
                                f"({num_groups})")
        self.eps, self.affine = float(eps), bool(affine)
        dt = _dtype(dtype)
        self.weight = Tensor(np.ones(num_channels, dt), requires_grad=True) if affine else None
        self.bias = Tensor(np.zeros(num_channels, dt), requires_grad=True) if affine else None

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _InstanceNorm(_BatchNorm):
    """Normalise each channel of each sample over its other dims, then y = x̂·weight + bias (when ``affine``).

    With ``track_running_stats`` training also keeps running averages of the per-sample statistics
    ((1 − momentum)·running + momentum·the batch's mean of them, the variance unbiased), which eval mode then
    normalises with, as PyTorch. Defaults as PyTorch's: no affine, no running statistics."""

    @_on_device
    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = False,
                 track_running_stats: bool = False, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, dtype)

    def forward(self, x):
        if len(x.shape) not in self._dims:
            raise ShapeError(f"{type(self).__name__}: expected a {self._layout} input, got shape {tuple(x.shape)}")
        if not self.training and self.track_running_stats:  # the running statistics normalise, as batch_norm's
            return F.batch_norm_with_stats(x, _live(self.running_mean), _live(self.running_var), self.weight,
                                           self.bias, eps=self.eps).y
        if self.training and self.track_running_stats:
            with no_grad():
                m = self.momentum
                mean, var = instance_stats(x)
                assign(self.running_mean, _live(self.running_mean) * (1 - m) + mean * m)
                assign(self.running_var, _live(self.running_var) * (1 - m) + var * m)
                assign(self.num_batches_tracked, _live(self.num_batches_tracked) + 1)
        return F.instance_norm_affine(x, self.weight, self.bias, eps=self.eps)


class InstanceNorm1d(_InstanceNorm):
    __doc__ = _InstanceNorm.__doc__
    _dims = (3,)
    _layout = "3-D (N, C, L)"


class InstanceNorm2d(_InstanceNorm):
    __doc__ = _InstanceNorm.__doc__
    _dims = (4,)
    _layout = "4-D (N, C, H, W)"


# -- dropout and embedding -------------------------------------------------------------------------------------


class Dropout(Module):
    """Zero each element with probability p and scale the rest by 1/(1 − p) in training; the identity in eval.
    Draws come from the generator ``of.manual_seed`` seeds."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ArgumentError(f"Dropout(): p must be a probability in [0, 1], got {p!r}")
        self.p, self.inplace = float(p), bool(inplace)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(x, p=self.p, training=True, inplace=self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}" + (", inplace=True" if self.inplace else "")


class Embedding(Module):
    """A lookup table: row ``i`` of ``weight`` (num_embeddings, embedding_dim) for each index i. Initialised from
    N(0, 1); the row ``padding_idx`` (if given) starts at 0 and gets no gradient."""

    @_on_device
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, max_norm=None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False, *, dtype=None):
        _torch_defaults("Embedding", max_norm=(max_norm, None), norm_type=(norm_type, 2.0),
                        scale_grad_by_freq=(scale_grad_by_freq, False), sparse=(sparse, False))
        super().__init__()
        self.num_embeddings = _count(num_embeddings, "num_embeddings", "Embedding")
        self.embedding_dim = _count(embedding_dim, "embedding_dim", "Embedding")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ArgumentError(f"Embedding(): padding_idx {padding_idx} is out of range for {num_embeddings} "
                                    "embeddings")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        self.weight = _param(num_embeddings, embedding_dim, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.numpy()[self.padding_idx] = 0

    def forward(self, index):
        return F.embedding(index, self.weight, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


# -- attention -------------------------------------------------------------------------------------------------


class MultiheadAttention(Module):
    """Multi-head attention with PyTorch's signature, defaults and parameters: ``in_proj_weight`` (3E, E) and
    ``in_proj_bias`` (3E,) project the query, key and value, ``out_proj`` the result. With a ``kdim`` or ``vdim``
    other than ``embed_dim`` the projections are separate, as PyTorch's: ``q_proj_weight`` (E, E),
    ``k_proj_weight`` (E, kdim), ``v_proj_weight`` (E, vdim) (``in_proj_weight`` is then None). Inputs are
    (L, N, E), as PyTorch's default ``batch_first=False``; (N, L, E) with ``batch_first=True``; (L, E) for one
    unbatched sequence.

    ``mha(query, key, value, ...)`` returns ``(output, weights)`` as PyTorch does: with ``need_weights=True`` (the
    default) the attention weights (N, L, S), averaged over the heads unless ``average_attn_weights=False``
    (N, heads, L, S); with ``need_weights=False`` ``None``, and the output comes from
    ``F.scaled_dot_product_attention`` (its ``dropout_p`` the layer's ``dropout`` in training). Key and value
    default to the query (self-attention). Masks follow PyTorch's:
    a boolean ``attn_mask`` (L, S) or (N·heads, L, S) or ``key_padding_mask`` (N, S) is True where attending is
    *not* allowed; a float mask is added to the scores. ``is_causal=True`` lets position i attend to positions
    j <= i (PyTorch takes it only as a hint beside the causal ``attn_mask``; here it also works alone).
    ``dropout`` drops attention weights in training. ``add_bias_kv`` appends a learned key and value (``bias_k``,
    ``bias_v``, (1, 1, E)) and ``add_zero_attn`` a key and value of zeros, which every query may attend to (the
    masks are extended to allow them, as PyTorch does); with them ``is_causal`` is refused, as PyTorch's result
    then depends on ``need_weights``.
    """

    @_on_device
    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, dtype=None):
        super().__init__()
        self.embed_dim = _count(embed_dim, "embed_dim", "MultiheadAttention")
        self.num_heads = _count(num_heads, "num_heads", "MultiheadAttention")
        if embed_dim % num_heads:
            raise ArgumentError(f"MultiheadAttention(): embed_dim ({embed_dim}) must be divisible by num_heads "
                                f"({num_heads})")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout <= 1.0:
            raise ArgumentError(f"MultiheadAttention(): dropout must be a probability in [0, 1], got {dropout!r}")
        self.kdim = embed_dim if kdim is None else _count(kdim, "kdim", "MultiheadAttention")
        self.vdim = embed_dim if vdim is None else _count(vdim, "vdim", "MultiheadAttention")
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim  # PyTorch's name
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        self.add_zero_attn = bool(add_zero_attn)
        self.head_dim = embed_dim // num_heads
        separate = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
        if self._qkv_same_embed_dim:
            self.in_proj_weight = _param(3 * embed_dim, embed_dim, dtype=dtype)
            for name in separate:
                self.register_parameter(name, None)
        else:
            for name, dim in zip(separate, (embed_dim, self.kdim, self.vdim)):
                self.register_parameter(name, _param(embed_dim, dim, dtype=dtype))
            self.register_parameter("in_proj_weight", None)
        self.in_proj_bias = _param(3 * embed_dim, dtype=dtype) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        if add_bias_kv:
            self.bias_k, self.bias_v = _param(1, 1, embed_dim, dtype=dtype), _param(1, 1, embed_dim, dtype=dtype)
        else:
            self.bias_k = self.bias_v = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # As PyTorch: Xavier for the input projections and bias_k/v, zero biases; out_proj keeps Linear's init.
        for w in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if w is not None:
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    def _heads(self, t, n, length):
        """(N, L, E) -> (N, heads, L, head_dim)."""
        return F.permute(F.reshape(t, shape=[n, length, self.num_heads, self.head_dim]), dims=[0, 2, 1, 3])

    def _mask(self, attn_mask, key_padding_mask, is_causal, n, length, source, spell_causal):
        """One mask for the scores (True or 0 where attending is allowed), or None; the causal mask is spelled
        out where ``spell_causal`` or another mask is given, else left to ``scaled_dot_product_attention``."""
        allowed, added = [], []
        for mask, name in ((attn_mask, "attn_mask"), (key_padding_mask, "key_padding_mask")):
            if mask is None:
                continue
            if name == "key_padding_mask":
                mask = F.reshape(mask, shape=[n, 1, 1, source])
            elif len(mask.shape) == 3:
                mask = F.reshape(mask, shape=[n, self.num_heads, length, source])
            if mask.dtype == D.bool_:
                allowed.append(F.logical_not(mask))
            elif D.is_floating(mask.dtype):
                added.append(mask)
            else:
                raise ArgumentError(f"MultiheadAttention: {name} must be bool or floating, got {describe(mask)}")
        if is_causal and (allowed or added or spell_causal):  # the op takes is_causal alone: spell the mask out
            rows = F.reshape(F.arange(start=0, stop=length, dtype="int64"), shape=[length, 1])
            allowed.append(rows >= F.arange(start=0, stop=source, dtype="int64"))
        for extra in allowed[1:]:
            allowed[0] = F.logical_and(allowed[0], extra)
        if not added:
            return allowed[0] if allowed else None
        total = added[0]
        for extra in added[1:]:
            total = total + extra
        return total if not allowed else total + F.where(allowed[0], 0.0, -math.inf)

    def _check_masks(self, attn_mask, key_padding_mask, n, length, source, batched):
        """PyTorch's mask shapes, refused in its terms (a wrong one could otherwise broadcast or reshape)."""
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != ((n, source) if batched else (source,)):
            want = f"(N, S) = ({n}, {source})" if batched else f"(S,) = ({source},) for unbatched input"
            raise ShapeError(f"MultiheadAttention: key_padding_mask must be {want}, got shape "
                             f"{tuple(key_padding_mask.shape)}")
        if attn_mask is not None and tuple(attn_mask.shape) not in ((length, source),
                                                                     (n * self.num_heads, length, source)):
            raise ShapeError(f"MultiheadAttention: attn_mask must be (L, S) = ({length}, {source}) or "
                             f"(N·num_heads, L, S) = ({n * self.num_heads}, {length}, {source}), got shape "
                             f"{tuple(attn_mask.shape)}")

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        self_attention = (key is None or key is query) and (value is None or value is query)
        key = query if key is None else key
        value = key if value is None else value
        batched = len(query.shape) == 3
        layout = "(N, L, E)" if self.batch_first else "(L, N, E)"
        for name, t, dim in (("query", query, "embed_dim"), ("key", key, "kdim"), ("value", value, "vdim")):
            if len(t.shape) not in (2, 3) or len(t.shape) != len(query.shape) or t.shape[-1] != getattr(self, dim):
                raise ShapeError(f"MultiheadAttention: {name} must be {layout} (batch_first={self.batch_first}) or "
                                 f"(L, E) unbatched, of the query's rank, with E = {dim} = {getattr(self, dim)}; "
                                 f"got shape {tuple(t.shape)}")
        if is_causal and (self.bias_k is not None or self.add_zero_attn):
            raise ArgumentError("MultiheadAttention: is_causal=True with add_bias_kv or add_zero_attn is refused: "
                                "PyTorch then attends to the appended keys or not depending on need_weights and "
                                "key_padding_mask; give the causal attn_mask alone")
        batch = 0 if self.batch_first else 1
        if tuple(key.shape[:-1]) != tuple(value.shape[:-1]) or (batched and key.shape[batch] != query.shape[batch]):
            raise ShapeError(f"MultiheadAttention: key and value must have the same length and batch, and the "
                             f"query's batch; got shapes {tuple(query.shape)}, {tuple(key.shape)}, "
                             f"{tuple(value.shape)} (batch_first={self.batch_first})")
        if not batched:  # one sequence: a batch of one
            query, key, value = (F.unsqueeze(t, axis=0) for t in (query, key, value))
        elif not self.batch_first:  # (L, N, E) -> (N, L, E)
            query, key, value = (F.transpose(t, perm=[1, 0, 2]) for t in (query, key, value))
        n, length, source, e = query.shape[0], query.shape[1], key.shape[1], self.embed_dim
        self._check_masks(attn_mask, key_padding_mask, n, length, source, batched)
        if key_padding_mask is not None and not batched:
            key_padding_mask = F.unsqueeze(key_padding_mask, axis=0)
        if self_attention and self.in_proj_weight is not None:  # one projection for all three
            q, k, v = F.split(F.linear(query, self.in_proj_weight, self.in_proj_bias), sections=[e, e, e], axis=-1)
        else:
            ws = ((self.q_proj_weight, self.k_proj_weight, self.v_proj_weight) if self.in_proj_weight is None
                  else F.split(self.in_proj_weight, sections=[e, e, e], axis=0))
            bs = F.split(self.in_proj_bias, sections=[e, e, e]) if self.in_proj_bias is not None else [None] * 3
            q, k, v = (F.linear(t, w, b) for t, w, b in zip((query, key, value), ws, bs))
        extra = 0  # keys and values appended after the source's: every query may attend to them
        if self.bias_k is not None:
            k, v = (F.concat([t, F.broadcast_to(b, shape=[n, 1, e])], axis=1) for t, b in ((k, self.bias_k),
                                                                                           (v, self.bias_v)))
            extra += 1
        q, k, v = self._heads(q, n, length), self._heads(k, n, source + extra), self._heads(v, n, source + extra)
        if self.add_zero_attn:  # a key and a value of zeros, after the others (the sequence dim is -2)
            k, v = F.pad(k, pad=[0, 0, 0, 1]), F.pad(v, pad=[0, 0, 0, 1])
            extra += 1
        dropout = self.dropout if self.training else 0.0
        explicit = need_weights  # the weights themselves are returned: computed here, not inside the attention op
        mask = self._mask(attn_mask, key_padding_mask, is_causal, n, length, source, explicit or extra > 0)
        if mask is not None and extra:  # the masks cover the source: the appended keys are allowed
            mask = F.pad(mask, pad=[0, extra], value=1.0 if mask.dtype == D.bool_ else 0.0)
        weights = None
        if explicit:
            scores = F.matmul(q, F.transpose(k, perm=[0, 1, 3, 2])) * (1.0 / math.sqrt(self.head_dim))
            if mask is not None:
                scores = F.where(mask, scores, -math.inf) if mask.dtype == D.bool_ else scores + mask
            weights = F.softmax(scores, axis=-1)
            if dropout > 0.0:
                weights = F.dropout(weights, p=dropout)
            out = F.matmul(weights, v)
            if need_weights:
                weights = F.mean(weights, axis=[1]) if average_attn_weights else weights
            else:
                weights = None
        else:
            out = F.scaled_dot_product_attention(q, k, v, mask, dropout, is_causal=is_causal and mask is None)
        out = self.out_proj(F.reshape(F.permute(out, dims=[0, 2, 1, 3]), shape=[n, length, e]))
        if not batched:
            out = F.squeeze(out, axis=[0])
            weights = None if weights is None else F.squeeze(weights, axis=[0])
        elif not self.batch_first:
            out = F.transpose(out, perm=[1, 0, 2])
        return out, weights

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
                + (f", dropout={self.dropout}" if self.dropout else "") + f", batch_first={self.batch_first}"
                + ("" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}")
                + (", add_bias_kv=True" if self.bias_k is not None else "")
                + (", add_zero_attn=True" if self.add_zero_attn else ""))


# -- shape and pooling -----------------------------------------------------------------------------------------


class Flatten(Module):
    """Merge dims ``start_dim`` .. ``end_dim`` into one: (N, C, H, W) -> (N, C·H·W) by default."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        shape = list(x.shape)
        if not shape:
            return F.reshape(x, shape=[1])
        start, end = self.start_dim % len(shape), self.end_dim % len(shape)
        merged = shape[start:end + 1]
        size = math.prod(merged) if all(isinstance(d, int) for d in merged) else -1  # -1: a size known at run time
        return F.reshape(x, shape=[*shape[:start], size, *shape[end + 1:]])

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class _MaxPoolNd(Module):
    """The maximum of each window of an (N, C, *spatial) — or (C, *spatial) — input; ``stride`` defaults to the
    kernel size. With ``return_indices`` the layer returns (y, indices), the flat spatial index of each maximum."""

    _nd = 2

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False):
        super().__init__()
        name, nd = type(self).__name__, self._nd
        self.kernel_size = _ntuple(kernel_size, nd, "kernel_size", name, 1)
        self.stride = self.kernel_size if stride is None else _ntuple(stride, nd, "stride", name, 1)
        self.padding = _ntuple(padding, nd, "padding", name, 0)
        self.dilation = _ntuple(dilation, nd, "dilation", name, 1)
        self.return_indices, self.ceil_mode = bool(return_indices), bool(ceil_mode)

    def forward(self, x):
        out = getattr(F, f"max_pool{self._nd}d")(x, self.kernel_size, self.stride, self.padding, self.dilation,
                                                 self.ceil_mode, self.return_indices)
        return tuple(out) if self.return_indices else out

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd):
    _nd = 1


class MaxPool2d(_MaxPoolNd):
    _nd = 2


class MaxPool3d(_MaxPoolNd):
    _nd = 3


class _AvgPoolNd(Module):
    """The mean of each window of an (N, C, *spatial) — or (C, *spatial) — input; ``stride`` defaults to the kernel
    size; zero padding counts in the mean unless ``count_include_pad`` is False; ``divisor_override`` replaces the
    window size."""

    _nd = 2

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None):
        super().__init__()
        name, nd = type(self).__name__, self._nd
        self.kernel_size = _ntuple(kernel_size, nd, "kernel_size", name, 1)
        self.stride = self.kernel_size if stride is None else _ntuple(stride, nd, "stride", name, 1)
        self.padding = _ntuple(padding, nd, "padding", name, 0)
        self.ceil_mode, self.count_include_pad = bool(ceil_mode), bool(count_include_pad)
        self.divisor_override = None if divisor_override is None else _count(divisor_override, "divisor_override",
                                                                             name)

    def forward(self, x):
        return getattr(F, f"avg_pool{self._nd}d")(
            x, kernel_size=self.kernel_size, stride=self.stride, padding=self.padding, ceil_mode=self.ceil_mode,
            count_include_pad=self.count_include_pad, divisor_override=self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    _nd = 1


class AvgPool2d(_AvgPoolNd):
    _nd = 2


class AvgPool3d(_AvgPoolNd):
    _nd = 3


class _AdaptivePoolNd(Module):
    """Pool an (N, C, *spatial) — or (C, *spatial) — input to (..., *output_size) over PyTorch's adaptive windows;
    a None in output_size keeps that dim's size."""

    _nd = 2
    _kind = "avg"

    def __init__(self, output_size, return_indices: bool = False):
        super().__init__()
        name, nd = type(self).__name__, self._nd
        sizes = (output_size,) * nd if isinstance(output_size, (int, np.integer)) else output_size
        if not isinstance(sizes, (tuple, list)) or len(sizes) != nd or (nd == 1 and None in sizes):
            keep = " (None: keep the input's size)" if nd > 1 else ""  # torch's 1-D pooling takes no None
            raise ArgumentError(f"{name}(): argument 'output_size' must be an int or {nd} ints{keep}, got "
                                f"{output_size!r}")
        self.output_size = tuple(None if v is None else _count(v, "output_size", name) for v in sizes)
        self.return_indices = bool(return_indices)

    def forward(self, x):
        if self._kind == "avg":
            return getattr(F, f"adaptive_avg_pool{self._nd}d")(x, self.output_size)
        out = getattr(F, f"adaptive_max_pool{self._nd}d")(x, self.output_size, self.return_indices)
        return tuple(out) if self.return_indices else out

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptivePoolNd):
    _nd = 1

    def __init__(self, output_size):
        super().__init__(output_size)


class AdaptiveAvgPool2d(AdaptiveAvgPool1d):
    """Average an input down (or up) to (..., *output_size): output_size 1 is global average pooling."""

    _nd = 2


class AdaptiveAvgPool3d(AdaptiveAvgPool1d):
    _nd = 3


class AdaptiveMaxPool2d(_AdaptivePoolNd):
    _nd = 2
    _kind = "max"


class _MaxUnpoolNd(Module):
    """``forward(input, indices, output_size=None)``: max_unpool{nd}d with the layer's kernel_size, stride and
    padding (the max pooling's whose indices it takes)."""

    _nd = 2

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, kernel_size if stride is None else stride, padding

    def forward(self, input, indices, output_size=None):
        unpool = getattr(F, f"max_unpool{self._nd}d")
        return unpool(input, indices, self.kernel_size, self.stride, self.padding, output_size)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    _nd = 1


class MaxUnpool2d(_MaxUnpoolNd):
    _nd = 2


class MaxUnpool3d(_MaxUnpoolNd):
    _nd = 3


class AdaptiveMaxPool1d(AdaptiveMaxPool2d):
    _nd = 1


class AdaptiveMaxPool3d(AdaptiveMaxPool2d):
    _nd = 3


class Unflatten(Module):
    """Split dim ``dim`` into ``unflattened_size`` (one entry may be −1): (N, 12) -> (N, 3, 4) with
    ``Unflatten(1, (3, 4))`` — the inverse of Flatten, as torch's."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise ArgumentError(f"Unflatten(): dim must be an int, got {describe(dim)}")
        sizes = tuple(unflattened_size) if isinstance(unflattened_size, (tuple, list)) else None
        if not sizes or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and (n >= 0 or n == -1)
                                for n in sizes) or sizes.count(-1) > 1:
            raise ArgumentError(f"Unflatten(): unflattened_size must be a tuple of ints (one may be -1), got "
                                f"{unflattened_size!r}")
        self.dim, self.unflattened_size = int(dim), tuple(int(n) for n in sizes)

    def forward(self, x):
        shape = list(x.shape)
        if not -len(shape) <= self.dim < len(shape):
            raise ShapeError(f"Unflatten: dim {self.dim} is out of range for an input of shape {tuple(shape)}")
        d = self.dim % len(shape)
        sizes = list(self.unflattened_size)
        known = math.prod(n for n in sizes if n != -1)
        if shape[d] is not None:
            if -1 in sizes and known and shape[d] % known == 0:
                sizes[sizes.index(-1)] = shape[d] // known
            if math.prod(sizes) != shape[d] or (-1 in sizes):
                raise ShapeError(f"Unflatten: sizes {self.unflattened_size} do not multiply to the size of dim {d} "
                                 f"({shape[d]}) of an input of shape {tuple(shape)}")
        new = [*shape[:d], *sizes, *shape[d + 1:]]
        if None in new and -1 not in new and new.count(None) == 1:
            new[new.index(None)] = -1  # a size known at run time only (the batch)
        return F.reshape(x, shape=new)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


# -- resizing and rearranging images -------------------------------------------------------------------------------


class Upsample(Module):
    """Resize an (N, C, *spatial) input to ``size`` or by ``scale_factor``: F.interpolate as a layer."""

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None,
                 recompute_scale_factor: bool | None = None):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, x):
        return F.interpolate(x, size=self.size, scale_factor=self.scale_factor, mode=self.mode,
                             align_corners=self.align_corners, recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"


class Unfold(Module):
    """The sliding windows of an (N, C, H, W) input as columns (N, C·kH·kW, L): F.unfold as a layer."""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.geometry = {"kernel_size": _ntuple(kernel_size, 2, "kernel_size", "Unfold", 1),
                         "dilation": _ntuple(dilation, 2, "dilation", "Unfold", 1),
                         "padding": _ntuple(padding, 2, "padding", "Unfold", 0),
                         "stride": _ntuple(stride, 2, "stride", "Unfold", 1)}

    def forward(self, x):
        return F.unfold(x, **self.geometry)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.geometry.items())


class Fold(Unfold):
    """Columns (N, C·kH·kW, L) added back into an image (N, C, *output_size): F.fold as a layer."""

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__(kernel_size, dilation, padding, stride)
        self.output_size = _ntuple(output_size, 2, "output_size", "Fold", 1)

    def forward(self, x):
        return F.fold(x, output_size=self.output_size, **self.geometry)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}, " + super().extra_repr()


class PixelShuffle(Module):
    """(*, C·r², H, W) -> (*, C, H·r, W·r), r = upscale_factor."""

    def __init__(self, upscale_factor: int):
        super().__init__()
        self.upscale_factor = _count(upscale_factor, "upscale_factor", "PixelShuffle")

    def forward(self, x):
        return F.pixel_shuffle(x, upscale_factor=self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """(*, C, H·r, W·r) -> (*, C·r², H, W), r = downscale_factor: the inverse of PixelShuffle."""

    def __init__(self, downscale_factor: int):
        super().__init__()
        self.downscale_factor = _count(downscale_factor, "downscale_factor", "PixelUnshuffle")

    def forward(self, x):
        return F.pixel_unshuffle(x, downscale_factor=self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


# -- activations -----------------------------------------------------------------------------------------------


class _Activation(Module):
    """An elementwise op as a module; its keyword attributes are the op's attrs."""

    _op = None
    _attrs: tuple = ()
    inplace = False  # torch's inplace=True, for the classes that take it (_InPlaceActivation)

    def forward(self, x):
        attrs = {a: getattr(self, a) for a in self._attrs}
        if self.inplace:  # the result written into x (autograd records it as torch does)
            return written_into(x, lambda value: type(self)._op(value, **attrs))
        return type(self)._op(x, **attrs)

    def extra_repr(self) -> str:
        return ", ".join([f"{a}={getattr(self, a)!r}" for a in self._attrs] + ["inplace=True"] * self.inplace)


class _InPlaceActivation(_Activation):
    """An activation whose torch module takes ``inplace``: the result written into the input and returned."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = bool(inplace)


class Identity(Module):
    def __init__(self, *args, **kwargs):  # accepts and ignores arguments, as PyTorch's
        super().__init__()

    def forward(self, x):
        return x


class ReLU(_InPlaceActivation):
    _op = F.relu


class Tanh(_Activation):
    _op = F.tanh


class Sigmoid(_Activation):
    _op = F.sigmoid


class SiLU(_InPlaceActivation):
    _op = F.silu


class SELU(_InPlaceActivation):
    _op = F.selu


class LeakyReLU(_InPlaceActivation):
    _op, _attrs = F.leaky_relu, ("alpha",)

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__(inplace)
        self.alpha = float(negative_slope)


class ELU(_InPlaceActivation):
    _op, _attrs = F.elu, ("alpha",)

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__(inplace)
        self.alpha = float(alpha)


class GELU(_Activation):
    _op, _attrs = F.gelu, ("approximate",)

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate


class Softplus(_Activation):
    _op, _attrs = F.softplus, ("beta", "threshold")

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)


class Softmax(_Activation):
    _op, _attrs = F.softmax, ("axis",)

    def __init__(self, dim: int = -1):
        super().__init__()
        self.axis = dim


class LogSoftmax(Softmax):
    _op = F.log_softmax


class Softmin(Softmax):
    _op = F.softmin


class GLU(Softmax):
    _op = F.glu


class Hardtanh(_InPlaceActivation):
    _op, _attrs = F.hardtanh, ("min_val", "max_val")

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__(inplace)
        self.min_val, self.max_val = float(min_val), float(max_val)


class ReLU6(_InPlaceActivation):
    _op = F.relu6


class Hardsigmoid(_InPlaceActivation):
    _op = F.hardsigmoid


class Hardswish(_InPlaceActivation):
    _op = F.hardswish


class Mish(_InPlaceActivation):
    _op = F.mish


class LogSigmoid(_Activation):
    _op = F.logsigmoid


class CELU(_InPlaceActivation):
    _op, _attrs = F.celu, ("alpha",)

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__(inplace)
        self.alpha = float(alpha)


class PReLU(Module):
    """y = x where x > 0, else weight·x, with a learnable ``weight`` of ``num_parameters`` (1, or the channels of
    dim 1), each starting at ``init``."""

    @_on_device
    def __init__(self, num_parameters: int = 1, init: float = 0.25, dtype=None):
        super().__init__()
        self.num_parameters = _count(num_parameters, "num_parameters", "PReLU")
        self.init = float(init)
        self.weight = Tensor(np.full(self.num_parameters, self.init, _dtype(dtype)), requires_grad=True)

    def forward(self, x):
        return F.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


# -- losses ----------------------------------------------------------------------------------------------------


class _Loss(Module):
    """A loss as a layer: ``forward(*inputs)`` calls the op on the inputs, then the layer's weight buffers (named in
    ``_weights``, read live while tracing), with the layer's settings (``_attrs``) as keywords."""

    _op = None
    _attrs: tuple = ("reduction",)
    _weights: tuple = ()

    def __init__(self, reduction: str = "mean", **weights):
        super().__init__()
        self.reduction = reduction
        for name, w in weights.items():  # buffers, as torch's: in the state dict, moved with the module
            self.register_buffer(name, w if w is None or isinstance(w, Tensor) else Tensor(w))

    def forward(self, *inputs):
        return type(self)._op(*inputs, **{w: _live(getattr(self, w)) for w in self._weights},
                              **{a: getattr(self, a) for a in self._attrs})

    def extra_repr(self) -> str:
        return ", ".join(f"{a}={getattr(self, a)!r}" for a in self._attrs)


class MSELoss(_Loss):
    """Mean squared error (input − target)², reduced."""

    _op = F.mse_loss


class L1Loss(_Loss):
    """Mean absolute error |input − target|, reduced."""

    _op = F.l1_loss


class HuberLoss(_Loss):
    """½·d² where |d| < delta, else delta·(|d| − ½·delta), with d = input − target; reduced."""

    _op, _attrs = F.huber_loss, ("reduction", "delta")

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction)
        self.delta = float(delta)


class SmoothL1Loss(_Loss):
    """``F.smooth_l1_loss``: ½·d²/beta where |d| < beta, else |d| − ½·beta, reduced."""

    _op, _attrs = F.smooth_l1_loss, ("reduction", "beta")

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0):
        _torch_defaults("SmoothL1Loss", size_average=(size_average, None), reduce=(reduce, None))
        super().__init__(reduction)
        self.beta = float(beta)


class KLDivLoss(_Loss):
    """KL divergence of ``target`` (probabilities, or log-probabilities with ``log_target``) from log-probabilities
    ``input``; "batchmean" gives the divergence per sample."""

    _op, _attrs = F.kl_div, ("reduction", "log_target")

    def __init__(self, reduction: str = "mean", log_target: bool = False):
        super().__init__(reduction)
        self.log_target = bool(log_target)


class BCELoss(_Loss):
    """Binary cross entropy of probabilities ``input`` against ``target``, times ``weight`` if given."""

    _op, _weights = F.binary_cross_entropy, ("weight",)

    def __init__(self, weight=None, reduction: str = "mean"):
        super().__init__(reduction, weight=weight)


class BCEWithLogitsLoss(_Loss):
    """Binary cross entropy of logits ``input`` against ``target``, times ``weight``, positives times
    ``pos_weight`` (each if given)."""

    _op, _weights = F.binary_cross_entropy_with_logits, ("weight", "pos_weight")

    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
        super().__init__(reduction, weight=weight, pos_weight=pos_weight)


class CrossEntropyLoss(_Loss):
    """Cross entropy of logits (N, C, ...) against class indices (N, ...) or class probabilities (N, C, ...), with
    class weights, ignore_index and label smoothing as torch's."""

    _op, _attrs, _weights = F.cross_entropy, ("ignore_index", "reduction", "label_smoothing"), ("weight",)

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__(reduction, weight=weight)
        self.ignore_index, self.label_smoothing = int(ignore_index), float(label_smoothing)


class NLLLoss(_Loss):
    """Negative log-likelihood of log-probabilities (N, C, ...) against class indices (N, ...)."""

    _op, _attrs, _weights = F.nll_loss, ("ignore_index", "reduction"), ("weight",)

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(reduction, weight=weight)
        self.ignore_index = int(ignore_index)


class CosineEmbeddingLoss(_Loss):
    """``forward(input1, input2, target)``: 1 − cos where target is 1, max(0, cos − margin) where it is −1."""

    _op, _attrs = F.cosine_embedding_loss, ("margin", "reduction")

    def __init__(self, margin: float = 0.0, reduction: str = "mean"):
        super().__init__(reduction)
        self.margin = float(margin)


class MarginRankingLoss(_Loss):
    """``forward(input1, input2, target)``: max(0, −target·(input1 − input2) + margin)."""

    _op, _attrs = F.margin_ranking_loss, ("margin", "reduction")

    def __init__(self, margin: float = 0.0, reduction: str = "mean"):
        super().__init__(reduction)
        self.margin = float(margin)


class TripletMarginLoss(_Loss):
    """``forward(anchor, positive, negative)``: max(0, margin + d(anchor, positive) − d(anchor, negative)), d the
    p-norm distance (``swap``: the smaller of d(anchor, negative) and d(positive, negative))."""

    _op, _attrs = F.triplet_margin_loss, ("margin", "p", "eps", "swap", "reduction")

    def __init__(self, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6, swap: bool = False,
                 reduction: str = "mean"):
        super().__init__(reduction)
        self.margin, self.p, self.eps, self.swap = float(margin), float(p), float(eps), bool(swap)


__all__ = [
    "ELU",
    "GELU",
    "SELU",
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "BCELoss",
    "BCEWithLogitsLoss",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv2d",
    "CosineEmbeddingLoss",
    "CrossEntropyLoss",
    "Dropout",
    "Embedding",
    "Flatten",
    "HuberLoss",
    "Identity",
    "KLDivLoss",
    "L1Loss",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "LogSoftmax",
    "MSELoss",
    "MarginRankingLoss",
    "MaxPool2d",
    "MultiheadAttention",
    "NLLLoss",
    "ReLU",
    "SiLU",
    "Sigmoid",
    "SmoothL1Loss",
    "Softmax",
    "Softplus",
    "Tanh",
    "TripletMarginLoss",
]


# -- similarity, bags of embeddings, channel-wise dropout ------------------------------------------------------


class CosineSimilarity(Module):
    """Cosine similarity of x1 and x2 along ``dim`` (see ``F.cosine_similarity``)."""

    def __init__(self, dim: int = 1, eps: float = 1e-8):
        super().__init__()
        self.dim, self.eps = int(dim), float(eps)

    def forward(self, x1, x2):
        return F.cosine_similarity(x1, x2, axis=self.dim, eps=self.eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"


class PairwiseDistance(Module):
    """The p-norm of x1 − x2 + eps over the last dim (see ``F.pairwise_distance``)."""

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
        super().__init__()
        self.norm, self.eps, self.keepdim = float(p), float(eps), bool(keepdim)

    def forward(self, x1, x2):
        return F.pairwise_distance(x1, x2, p=self.norm, eps=self.eps, keepdim=self.keepdim)

    def extra_repr(self) -> str:
        return f"p={self.norm}, eps={self.eps}, keepdim={self.keepdim}"


class EmbeddingBag(Module):
    """Sums, means or maxima of bags of embedding rows (see ``F.embedding_bag``): ``bag(index, offsets=None,
    per_sample_weights=None)``. ``weight`` (num_embeddings, embedding_dim) is initialised from N(0, 1), its row
    ``padding_idx`` (if given) at 0."""

    @_on_device
    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm=None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False, _weight=None,
                 include_last_offset: bool = False, padding_idx: int | None = None, *, dtype=None):
        _torch_defaults("EmbeddingBag", max_norm=(max_norm, None), norm_type=(norm_type, 2.0),
                        scale_grad_by_freq=(scale_grad_by_freq, False), sparse=(sparse, False), _weight=(_weight, None))
        super().__init__()
        self.num_embeddings = _count(num_embeddings, "num_embeddings", "EmbeddingBag")
        self.embedding_dim = _count(embedding_dim, "embedding_dim", "EmbeddingBag")
        if mode not in ("sum", "mean", "max"):
            raise ArgumentError(f"EmbeddingBag(): mode must be 'sum', 'mean' or 'max', got {mode!r}")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ArgumentError(f"EmbeddingBag(): padding_idx {padding_idx} is out of range for {num_embeddings} "
                                    "embeddings")
            padding_idx %= num_embeddings
        self.mode, self.include_last_offset, self.padding_idx = mode, bool(include_last_offset), padding_idx
        self.weight = _param(num_embeddings, embedding_dim, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.numpy()[self.padding_idx] = 0

    def forward(self, index, offsets=None, per_sample_weights=None):
        return F.embedding_bag(index, self.weight, offsets, per_sample_weights=per_sample_weights, mode=self.mode,
                               include_last_offset=self.include_last_offset, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}{pad}"


class _ChannelDropout(Dropout):
    _op = None

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return type(self)._op(x, p=self.p, training=True, inplace=self.inplace)


class Dropout1d(_ChannelDropout):
    """Zero each channel of (N, C, L) or (C, L) inputs with probability p in training (see ``F.dropout1d``)."""

    _op = F.dropout1d


class Dropout2d(_ChannelDropout):
    """Zero each channel of (N, C, H, W) inputs with probability p in training (see ``F.dropout2d``)."""

    _op = F.dropout2d


class Dropout3d(_ChannelDropout):
    """Zero each channel of (N, C, D, H, W) or (C, D, H, W) inputs with probability p in training (see
    ``F.dropout3d``)."""

    _op = F.dropout3d


__all__ += ["CosineSimilarity", "Dropout1d", "Dropout2d", "Dropout3d", "EmbeddingBag", "PairwiseDistance"]
