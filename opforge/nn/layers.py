"""Layers: PyTorch's layouts, parameter names and default initialisations, each a thin Module over registered ops.

The same layer runs eagerly and inside ``of.trace``/``of.compile``: forward only calls ops. State a layer updates
(BatchNorm's running statistics) goes through ``opforge.program.assign``, which the innermost interpreter answers:
eagerly it writes in place, while tracing it records the update.
"""

from __future__ import annotations

import math

import numpy as np

from .. import ops as F
from ..core import dtypes as D
from ..core.errors import ArgumentError, ShapeError, describe
from ..core.grad_mode import no_grad
from ..program import assign, live
from ..tensor import Tensor
from . import init
from .module import Module

# -- helpers ---------------------------------------------------------------------------------------------------


def _dtype(dtype):
    dtype = D.DEFAULT_FLOAT if dtype is None else D.as_dtype(dtype, arg="dtype")
    if not D.is_floating(dtype):
        raise ArgumentError(f"layers hold floating-point parameters, got dtype={dtype}")
    return dtype


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


class Conv2d(Module):
    """2-D convolution (cross-correlation, as PyTorch) of an (N, C_in, H, W) input with a weight of shape
    (out_channels, in_channels/groups, kH, kW). ``padding`` is an int, a pair, "valid" (0) or "same" (stride 1,
    where dilation·(kernel − 1) is even)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, dtype=None):
        super().__init__()
        self.in_channels = _count(in_channels, "in_channels", "Conv2d")
        self.out_channels = _count(out_channels, "out_channels", "Conv2d")
        self.groups = _count(groups, "groups", "Conv2d")
        if in_channels % groups or out_channels % groups:
            raise ArgumentError(f"Conv2d(): in_channels ({in_channels}) and out_channels ({out_channels}) must both "
                                f"be divisible by groups ({groups})")
        self.kernel_size = _pair(kernel_size, "kernel_size", "Conv2d", 1)
        self.stride = _pair(stride, "stride", "Conv2d", 1)
        self.dilation = _pair(dilation, "dilation", "Conv2d", 1)
        self.padding = self._padding(padding)
        self.weight = _param(out_channels, in_channels // groups, *self.kernel_size, dtype=dtype)
        self.bias = _param(out_channels, dtype=dtype) if bias else None
        self.reset_parameters()

    def _padding(self, padding) -> tuple[int, int]:
        if padding == "valid":
            return (0, 0)
        if padding != "same":
            return _pair(padding, "padding", "Conv2d", 0)
        totals = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)]
        if self.stride != (1, 1) or any(t % 2 for t in totals):
            raise ArgumentError(f"Conv2d(): padding='same' needs stride 1 and an even dilation·(kernel_size − 1) "
                                f"(symmetric padding), got stride {self.stride}, kernel_size {self.kernel_size}, "
                                f"dilation {self.dilation}")
        return tuple(t // 2 for t in totals)

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # U(±1/√fan_in), fan_in = C_in/groups·kH·kW
        if self.bias is not None:
            fan_in, _ = init.fan_in_and_fan_out(self.weight)
            init.uniform_(self.bias, -1.0 / math.sqrt(fan_in), 1.0 / math.sqrt(fan_in))

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                        dilation=self.dilation, groups=self.groups)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.bias is not None else ", bias=False")


# -- normalisation ---------------------------------------------------------------------------------------------


class _BatchNorm(Module):
    """Normalise each channel C of an (N, C, ...) input with its batch statistics (training) or with running
    statistics (eval), then scale by ``weight`` and shift by ``bias`` (when ``affine``).

    In training the running statistics become (1 − momentum)·running + momentum·batch (the variance unbiased),
    as in PyTorch; ``num_batches_tracked`` counts the updates (kept so that state dicts match PyTorch's keys).
    """

    _dims: tuple = ()
    _layout = ""

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
        y, mean, var = F.batch_norm(x, _live(self.running_mean), _live(self.running_var), self.weight, self.bias,
                                    training=self.training or not self.track_running_stats,
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
        return F.layer_norm(x, self.weight, self.bias, normalized_shape=self.normalized_shape, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    """Normalise over the last dims (``normalized_shape``) by their root mean square, then y = x̂·weight; ``eps``
    None takes the machine epsilon of the input's dtype, as PyTorch."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, dtype=None):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else normalized_shape
        self.normalized_shape = tuple(_count(d, "normalized_shape", "RMSNorm") for d in shape)
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        dt = _dtype(dtype)
        self.weight = Tensor(np.ones(self.normalized_shape, dt), requires_grad=True) if elementwise_affine else None

    def forward(self, x):
        return F.rms_norm(x, self.weight, normalized_shape=self.normalized_shape, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    """Normalise each of ``num_groups`` groups of channels of an (N, C, ...) input over the group's channels and
    the other dims, then y = x̂·weight + bias per channel (when ``affine``)."""

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
        return F.group_norm(x, self.weight, self.bias, num_groups=self.num_groups, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _InstanceNorm(_BatchNorm):
    """Normalise each channel of each sample over its other dims, then y = x̂·weight + bias (when ``affine``).

    With ``track_running_stats`` training also keeps running averages of the per-sample statistics
    ((1 − momentum)·running + momentum·the batch's mean of them, the variance unbiased), which eval mode then
    normalises with, as PyTorch. Defaults as PyTorch's: no affine, no running statistics."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = False,
                 track_running_stats: bool = False, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, dtype)

    def forward(self, x):
        if len(x.shape) not in self._dims:
            raise ShapeError(f"{type(self).__name__}: expected a {self._layout} input, got shape {tuple(x.shape)}")
        if not self.training and self.track_running_stats:  # the running statistics normalise, as batch_norm's
            return F.batch_norm(x, _live(self.running_mean), _live(self.running_var), self.weight, self.bias,
                                eps=self.eps).y
        if self.training and self.track_running_stats:
            with no_grad():
                spatial = list(range(2, len(x.shape)))
                m = self.momentum
                mean = F.mean(x, axis=[0, *spatial])
                var = F.mean(F.var(x, axis=spatial, correction=1), axis=[0])
                assign(self.running_mean, _live(self.running_mean) * (1 - m) + mean * m)
                assign(self.running_var, _live(self.running_var) * (1 - m) + var * m)
                assign(self.num_batches_tracked, _live(self.num_batches_tracked) + 1)
        return F.instance_norm(x, self.weight, self.bias, eps=self.eps)


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

    def __init__(self, p: float = 0.5):
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ArgumentError(f"Dropout(): p must be a probability in [0, 1], got {p!r}")
        self.p = float(p)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(x, p=self.p, training=True)[0]

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Embedding(Module):
    """A lookup table: row ``i`` of ``weight`` (num_embeddings, embedding_dim) for each index i. Initialised from
    N(0, 1); the row ``padding_idx`` (if given) starts at 0 and gets no gradient."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, dtype=None):
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
    """Multi-head attention over (N, L, E) inputs (PyTorch's ``batch_first=True``), with PyTorch's parameters:
    ``in_proj_weight`` (3E, E) and ``in_proj_bias`` (3E,) project the query, key and value, ``out_proj`` the result.

    ``mha(query, key=None, value=None, ...)`` returns ``(output, None)`` as PyTorch does with need_weights=False
    (key and value default to the query: self-attention). Masks follow PyTorch's MultiheadAttention: a boolean
    ``attn_mask`` (L, S) or (N·heads, L, S) or ``key_padding_mask`` (N, S) is True where attending is *not*
    allowed; a float mask is added to the scores. ``is_causal=True`` lets position i attend to positions j <= i
    (no mask needed).
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, batch_first: bool = True, dtype=None):
        super().__init__()
        self.embed_dim = _count(embed_dim, "embed_dim", "MultiheadAttention")
        self.num_heads = _count(num_heads, "num_heads", "MultiheadAttention")
        if embed_dim % num_heads:
            raise ArgumentError(f"MultiheadAttention(): embed_dim ({embed_dim}) must be divisible by num_heads "
                                f"({num_heads})")
        if not batch_first:
            raise ArgumentError("MultiheadAttention(): only batch_first=True, (N, L, E) inputs, is supported")
        self.head_dim = embed_dim // num_heads
        self.in_proj_weight = _param(3 * embed_dim, embed_dim, dtype=dtype)
        self.in_proj_bias = _param(3 * embed_dim, dtype=dtype) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # As PyTorch: Xavier for the input projection, zero biases; out_proj keeps Linear's weight init.
        init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def _heads(self, t, n, length):
        """(N, L, E) -> (N, heads, L, head_dim)."""
        return F.permute(F.reshape(t, shape=[n, length, self.num_heads, self.head_dim]), dims=[0, 2, 1, 3])

    def _mask(self, attn_mask, key_padding_mask, is_causal, n, length, source):
        """One mask for scaled_dot_product_attention (True or 0 where attending is allowed), or None."""
        allowed, added = [], []
        for mask, name in ((attn_mask, "attn_mask"), (key_padding_mask, "key_padding_mask")):
            if mask is None:
                continue
            if name == "key_padding_mask":
                mask = F.reshape(mask, shape=[n, 1, 1, source])
            elif len(mask.shape) == 3:
                mask = F.reshape(mask, shape=[n, self.num_heads, length, source])
            elif len(mask.shape) != 2:
                raise ShapeError(f"MultiheadAttention: attn_mask must be (L, S) or (N·num_heads, L, S), got shape "
                                 f"{tuple(mask.shape)}")
            if mask.dtype == D.bool_:
                allowed.append(F.logical_not(mask))
            elif D.is_floating(mask.dtype):
                added.append(mask)
            else:
                raise ArgumentError(f"MultiheadAttention: {name} must be bool or floating, got {describe(mask)}")
        if is_causal and (allowed or added):  # the op takes is_causal alone: spell the causal mask out
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

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights: bool = False,
                attn_mask=None, is_causal: bool = False):
        if need_weights:
            raise ArgumentError("MultiheadAttention: need_weights=True is not supported (the attention weights are "
                                "not returned by scaled_dot_product_attention)")
        self_attention = key is None and value is None
        key = query if key is None else key
        value = key if value is None else value
        for name, t in (("query", query), ("key", key), ("value", value)):
            if len(t.shape) != 3 or t.shape[-1] != self.embed_dim:
                raise ShapeError(f"MultiheadAttention: {name} must be (N, L, {self.embed_dim}), got shape "
                                 f"{tuple(t.shape)}")
        n, length, source, e = query.shape[0], query.shape[1], key.shape[1], self.embed_dim
        if self_attention:  # one projection for all three
            q, k, v = F.split(F.linear(query, self.in_proj_weight, self.in_proj_bias), sections=[e, e, e], axis=-1)
        else:
            ws = F.split(self.in_proj_weight, sections=[e, e, e], axis=0)
            bs = F.split(self.in_proj_bias, sections=[e, e, e]) if self.in_proj_bias is not None else [None] * 3
            q, k, v = (F.linear(t, w, b) for t, w, b in zip((query, key, value), ws, bs))
        mask = self._mask(attn_mask, key_padding_mask, is_causal, n, length, source)
        out = F.scaled_dot_product_attention(self._heads(q, n, length), self._heads(k, n, source),
                                             self._heads(v, n, source), mask, is_causal=is_causal and mask is None)
        out = F.reshape(F.permute(out, dims=[0, 2, 1, 3]), shape=[n, length, e])
        return self.out_proj(out), None

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"


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


class MaxPool2d(Module):
    """The maximum of each window of an (N, C, H, W) input; ``stride`` defaults to the kernel size."""

    _op = staticmethod(F.max_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        name = type(self).__name__
        self.kernel_size = _pair(kernel_size, "kernel_size", name, 1)
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride", name, 1)
        self.padding = _pair(padding, "padding", name, 0)

    def forward(self, x):
        return self._op(x, kernel_size=self.kernel_size, stride=self.stride, padding=self.padding)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(MaxPool2d):
    """The mean of each window of an (N, C, H, W) input (zero padding counts, as PyTorch's default)."""

    _op = staticmethod(F.avg_pool2d)


class AdaptiveAvgPool2d(Module):
    """Average an (N, C, H, W) input down to (N, C, *output_size): output_size 1 is global average pooling; other
    sizes must divide H and W (equal windows)."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = _pair(output_size, "output_size", "AdaptiveAvgPool2d", 1)

    def forward(self, x):
        if self.output_size == (1, 1):
            return F.mean(x, axis=[-2, -1], keepdim=True)
        h, w = x.shape[-2:]
        oh, ow = self.output_size
        if h % oh or w % ow:
            raise ShapeError(f"AdaptiveAvgPool2d: output size {self.output_size} must divide the input's (H, W) = "
                             f"{(h, w)}")
        return F.avg_pool2d(x, kernel_size=[h // oh, w // ow])

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


# -- activations -----------------------------------------------------------------------------------------------


class _Activation(Module):
    """An elementwise op as a module; its keyword attributes are the op's attrs."""

    _op = None
    _attrs: tuple = ()

    def forward(self, x):
        return type(self)._op(x, **{a: getattr(self, a) for a in self._attrs})

    def extra_repr(self) -> str:
        return ", ".join(f"{a}={getattr(self, a)!r}" for a in self._attrs)


class Identity(Module):
    def __init__(self, *args, **kwargs):  # accepts and ignores arguments, as PyTorch's
        super().__init__()

    def forward(self, x):
        return x


class ReLU(_Activation):
    _op = F.relu


class Tanh(_Activation):
    _op = F.tanh


class Sigmoid(_Activation):
    _op = F.sigmoid


class SiLU(_Activation):
    _op = F.silu


class SELU(_Activation):
    _op = F.selu


class LeakyReLU(_Activation):
    _op, _attrs = F.leaky_relu, ("alpha",)

    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.alpha = float(negative_slope)


class ELU(_Activation):
    _op, _attrs = F.elu, ("alpha",)

    def __init__(self, alpha: float = 1.0):
        super().__init__()
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


class Hardtanh(_Activation):
    _op, _attrs = F.hardtanh, ("min_val", "max_val")

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0):
        super().__init__()
        self.min_val, self.max_val = float(min_val), float(max_val)


class ReLU6(_Activation):
    _op = F.relu6


class Hardsigmoid(_Activation):
    _op = F.hardsigmoid


class Hardswish(_Activation):
    _op = F.hardswish


class Mish(_Activation):
    _op = F.mish


class LogSigmoid(_Activation):
    _op = F.logsigmoid


class CELU(_Activation):
    _op, _attrs = F.celu, ("alpha",)

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = float(alpha)


class PReLU(Module):
    """y = x where x > 0, else weight·x, with a learnable ``weight`` of ``num_parameters`` (1, or the channels of
    dim 1), each starting at ``init``."""

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
    _op = None
    _attrs: tuple = ("reduction",)

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return type(self)._op(input, target, **{a: getattr(self, a) for a in self._attrs})

    def extra_repr(self) -> str:
        return ", ".join(f"{a}={getattr(self, a)!r}" for a in self._attrs)


class MSELoss(_Loss):
    _op = F.mse_loss


class CrossEntropyLoss(_Loss):
    """Cross entropy of logits (N, C, ...) against class indices (N, ...)."""

    _op, _attrs = F.cross_entropy, ("ignore_index", "reduction", "label_smoothing")

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__(reduction)
        self.ignore_index, self.label_smoothing = int(ignore_index), float(label_smoothing)


class NLLLoss(_Loss):
    _op, _attrs = F.nll_loss, ("ignore_index", "reduction")

    def __init__(self, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(reduction)
        self.ignore_index = int(ignore_index)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, reduction: str = "mean", pos_weight=None):
        super().__init__(reduction)
        self.pos_weight = pos_weight

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, self.pos_weight, reduction=self.reduction)


__all__ = ["ELU", "GELU", "SELU", "AdaptiveAvgPool2d", "AvgPool2d", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d",
           "Conv2d", "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "Identity", "LayerNorm", "LeakyReLU",
           "Linear", "LogSoftmax", "MSELoss", "MaxPool2d", "MultiheadAttention", "NLLLoss", "ReLU", "SiLU",
           "Sigmoid", "Softmax", "Softplus", "Tanh"]


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

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "mean", include_last_offset: bool = False,
                 padding_idx: int | None = None, dtype=None):
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
        return F.embedding_bag(index, self.weight, offsets, per_sample_weights, mode=self.mode,
                               include_last_offset=self.include_last_offset, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}{pad}"


class _ChannelDropout(Dropout):
    _op = None

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return type(self)._op(x, p=self.p, training=True)[0]


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
