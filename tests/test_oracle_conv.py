"""PyTorch as the oracle for convolution, pooling and resizing: values, first and second derivatives, in float64.

``ORACLE`` maps each op of ``opforge/ops/{conv,pool,resize}.py`` to its torch counterpart, called with the op's
tensor arguments (``None`` for a missing bias) and its attrs (signature defaults filled in). The dedicated gradient
ops are compared with torch's own backward of the forward op, taken with ``create_graph=True`` so it can be
differentiated again. Every op's declared samples plus the extra cases below go through the runners of
``test_torch_oracle.py`` (forward, VJP and HVP); an op with several outputs is compared output by output (the
integer indices of max pooling in the forward test only).

Then: the nn layers against torch.nn, third derivatives, PyTorch's tie and NaN rules for max pooling, the fast
paths against straightforward NumPy (equal to the last bit where the arithmetic is the same: memory layouts,
scratch buffers, window loops), float32 at benchmark-like sizes, errors at call time, program mode with unknown
sizes against eager, and a smoke run of ``bench/conv_softmax.py --quick``.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from test_torch_oracle import (
    OPFORGE,
    TORCH,
    _declared_samples,
    assert_same,
    check_forward,
    check_hvp,
    check_vjp,
    directional_derivative,
    forward,
    torch_vjp,
)

import opforge as of
from opforge import Sample, nn
from opforge import ops as F
from opforge.ops import _window

TF = torch.nn.functional
TNN = torch.nn

_rng = np.random.default_rng(20240602)


def randn(*shape) -> np.ndarray:
    return _rng.standard_normal(shape)


def distinct(*shape) -> np.ndarray:
    """All values different, so that max pooling has no ties (numeric gradients are then well defined)."""
    size = int(np.prod(shape))
    return (_rng.permutation(size).reshape(shape) + _rng.uniform(0.1, 0.9, shape)) * (4.0 / size) - 2.0


def n_list(value, n: int):
    """An int[] attr as n ints, as opforge reads it (a lone int or a 1-list repeats); a string stays."""
    if value is None or isinstance(value, str):
        return value
    values = [value] if isinstance(value, (int, float)) else list(value)
    return values * n if len(values) == 1 else values


# -- torch counterparts ----------------------------------------------------------------------------------------------


def torch_conv(nd):
    def conv(x, weight, bias=None, *, stride, padding, dilation, groups):
        with warnings.catch_warnings():  # "padding='same' with even kernel lengths ... may require a copy"
            warnings.simplefilter("ignore", UserWarning)
            return getattr(TF, f"conv{nd}d")(x, weight, bias, stride=n_list(stride, nd), padding=n_list(padding, nd),
                                             dilation=n_list(dilation, nd), groups=groups)
    return conv


def torch_conv_grad_input(dy, weight, *, input_size, **geometry):
    """torch's backward of a convolution with respect to its input (linear in it, so taken at zeros)."""
    nd = weight.dim() - 2
    x = torch.zeros((dy.shape[0], weight.shape[1] * geometry["groups"], *n_list(input_size, nd)), dtype=dy.dtype,
                    requires_grad=True)
    (dx,) = torch.autograd.grad(torch_conv(nd)(x, weight, **geometry), x, dy, create_graph=True)
    return dx


def torch_conv_grad_weight(x, dy, *, kernel_size, **geometry):
    """torch's backward of a convolution with respect to its weight (linear in it, so taken at zeros)."""
    nd = x.dim() - 2
    w = torch.zeros((dy.shape[1], x.shape[1] // geometry["groups"], *n_list(kernel_size, nd)), dtype=dy.dtype,
                    requires_grad=True)
    (dw,) = torch.autograd.grad(torch_conv(nd)(x, w, **geometry), w, dy, create_graph=True)
    return dw


def torch_conv_transpose(nd):
    def conv_transpose(x, weight, bias=None, *, stride, padding, output_padding, groups, dilation):
        return getattr(TF, f"conv_transpose{nd}d")(x, weight, bias, stride=n_list(stride, nd),
                                                   padding=n_list(padding, nd),
                                                   output_padding=n_list(output_padding, nd), groups=groups,
                                                   dilation=n_list(dilation, nd))
    return conv_transpose


def torch_max_pool(nd, indices=False):
    def max_pool(x, *, kernel_size, stride, padding, dilation, ceil_mode):
        return getattr(TF, f"max_pool{nd}d")(x, n_list(kernel_size, nd), n_list(stride, nd), n_list(padding, nd),
                                             n_list(dilation, nd), ceil_mode=ceil_mode, return_indices=indices)
    return max_pool


def torch_max_pool_grad(x, dy, **pooling):
    return torch_vjp(torch_max_pool(x.dim() - 2))(x, dy, **pooling)


def torch_max_pool_grad_grad(x, ddx, **pooling):
    """The derivative of torch's max pooling backward with respect to its output gradient, in direction ddx."""
    pool = torch_max_pool(x.dim() - 2)
    dy = torch.zeros(pool(x.detach(), **pooling).shape, dtype=ddx.dtype, requires_grad=True)
    dx = torch_vjp(pool)(x, dy, **pooling)
    (ddy,) = torch.autograd.grad(dx, dy, ddx, create_graph=True)
    return ddy


def torch_pool_scatter(dy, indices, *, input_size):
    n, c = dy.shape[:2]
    flat = torch.zeros((n, c, int(np.prod(input_size))), dtype=dy.dtype)
    return flat.scatter_add(2, indices.reshape(n, c, -1), dy.reshape(n, c, -1)).reshape(n, c, *input_size)


def torch_pool_gather(x, indices):
    n, c = x.shape[:2]
    return torch.gather(x.reshape(n, c, -1), 2, indices.reshape(n, c, -1)).reshape(indices.shape)


def torch_avg_pool(nd):
    def avg_pool(x, *, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        if nd == 1:  # torch's avg_pool1d has no divisor_override: a 2-D pool over rows of one
            y = TF.avg_pool2d(x.unsqueeze(-2), [1, *n_list(kernel_size, 1)], [1, *n_list(stride or kernel_size, 1)],
                              [0, *n_list(padding, 1)], ceil_mode, count_include_pad, divisor_override)
            return y.squeeze(-2)
        return getattr(TF, f"avg_pool{nd}d")(x, n_list(kernel_size, nd), n_list(stride, nd), n_list(padding, nd),
                                             ceil_mode, count_include_pad, divisor_override)
    return avg_pool


def torch_avg_pool_grad(dy, *, input_size, **pooling):
    nd = dy.dim() - 2
    x = torch.zeros((*dy.shape[:2], *n_list(input_size, nd)), dtype=dy.dtype, requires_grad=True)
    (dx,) = torch.autograd.grad(torch_avg_pool(nd)(x, **pooling), x, dy, create_graph=True)
    return dx


def torch_adaptive(kind, nd, indices=False):
    def adaptive(x, *, output_size):
        fn = getattr(TF, f"adaptive_{kind}_pool{nd}d")
        return fn(x, n_list(output_size, nd), return_indices=True) if indices else fn(x, n_list(output_size, nd))
    return adaptive


def torch_max_unpool(x, indices, *, output_size):
    nd = x.dim() - 2
    unpool = getattr(TF, f"max_unpool{nd}d")
    out = n_list(output_size, nd)  # a kernel that makes torch's default output size this one (stride 1)
    return unpool(x, indices, [o - n + 1 for o, n in zip(out, x.shape[2:])], 1, output_size=out)


def torch_adaptive_avg_pool_grad(dy, *, input_size):
    nd = dy.dim() - 2
    x = torch.zeros((*dy.shape[:2], *n_list(input_size, nd)), dtype=dy.dtype, requires_grad=True)
    (dx,) = torch.autograd.grad(torch_adaptive("avg", nd)(x, output_size=list(dy.shape[2:])), x, dy,
                                create_graph=True)
    return dx


def torch_interpolate(x, *, size, scale_factor, mode, align_corners, recompute_scale_factor):
    nd = x.dim() - 2
    return TF.interpolate(x, size=n_list(size, nd), scale_factor=n_list(scale_factor, nd), mode=mode,
                          align_corners=align_corners, recompute_scale_factor=recompute_scale_factor)


def torch_interpolate_grad(dy, *, input_size, **resize):
    x = torch.zeros((*dy.shape[:2], *n_list(input_size, dy.dim() - 2)), dtype=dy.dtype, requires_grad=True)
    (dx,) = torch.autograd.grad(torch_interpolate(x, **resize), x, dy, create_graph=True)
    return dx


def torch_unfold(x, *, kernel_size, dilation, padding, stride):
    return TF.unfold(x, n_list(kernel_size, 2), n_list(dilation, 2), n_list(padding, 2), n_list(stride, 2))


def torch_fold(x, *, output_size, kernel_size, dilation, padding, stride):
    return TF.fold(x, n_list(output_size, 2), n_list(kernel_size, 2), n_list(dilation, 2), n_list(padding, 2),
                   n_list(stride, 2))


# -- the table: op -> (torch counterpart, extra cases, outputs compared) ---------------------------------------------


ORACLE = {
    "conv1d": (torch_conv(1), (
        Sample.of(randn(2, 3, 11), randn(2, 3, 3), randn(2), stride=3, padding=2, dilation=2),
        Sample.of(randn(1, 4, 6), randn(8, 1, 3), None, groups=4),
    )),
    "conv2d": (torch_conv(2), (
        Sample.of(randn(1, 6, 9, 11), randn(6, 2, 3, 2), randn(6), stride=[3, 2], padding=[2, 0], dilation=[2, 3],
                  groups=3),
        Sample.of(randn(2, 3, 5, 5), randn(6, 1, 3, 3), None, padding=1, groups=3),  # depthwise, multiplier 2
        Sample.of(randn(2, 4, 4, 3), randn(2, 4, 1, 1), randn(2)),  # 1×1
        Sample.of(randn(2, 2, 5, 6), randn(3, 2, 5, 6), randn(3)),  # the kernel covers the image: 1×1 output
        Sample.of(randn(1, 2, 5, 4), randn(2, 2, 2, 4), None, padding="same", dilation=[2, 1]),  # odd totals
        Sample.of(randn(1, 2, 5, 4), randn(2, 2, 2, 3), None, padding="valid"),
    )),
    "conv3d": (torch_conv(3), ()),
    "conv_grad_input": (torch_conv_grad_input, (
        Sample.of(randn(1, 6, 3, 4), randn(6, 2, 3, 2), input_size=[9, 11], stride=[3, 2], padding=[2, 0],
                  dilation=[2, 3], groups=3),
        Sample.of(randn(2, 4, 3, 2), randn(4, 2, 2, 2), input_size=[6, 5], stride=2),  # floor: last row/col unread
        # stride 1, no more output than input channels: a convolution of dy with the flipped weight
        Sample.of(randn(2, 4, 5, 6), randn(4, 4, 3, 3), input_size=[5, 6], padding=1),
        Sample.of(randn(1, 4, 6, 3), randn(4, 3, 3, 2), input_size=[6, 4], padding=[2, 0], dilation=[2, 1],
                  groups=2),
        Sample.of(randn(1, 2, 6, 5), randn(2, 2, 2, 3), input_size=[6, 5], padding="same", dilation=[1, 2]),
        Sample.of(randn(1, 4, 10, 4), randn(4, 3, 2, 3), input_size=[6, 4], padding=[3, 1], dilation=[2, 1],
                  groups=2),  # a padding past the dilated kernel: the transpose and col2im
    )),
    "conv_grad_weight": (torch_conv_grad_weight, (
        Sample.of(randn(1, 6, 9, 11), randn(1, 6, 3, 4), kernel_size=[3, 2], stride=[3, 2], padding=[2, 0],
                  dilation=[2, 3], groups=3),
    )),
    "conv_transpose1d": (torch_conv_transpose(1), ()),
    "conv_transpose2d": (torch_conv_transpose(2), (
        Sample.of(randn(2, 2, 3, 3), randn(2, 3, 3, 3), None, stride=2, padding=1, output_padding=1),
        Sample.of(randn(1, 2, 3, 4), randn(2, 4, 3, 3), randn(4), padding=[1, 2], dilation=2),
    )),
    "conv_transpose3d": (torch_conv_transpose(3), ()),
    "unfold": (torch_unfold, ()),
    "fold": (torch_fold, ()),
    "max_pool1d_values": (torch_max_pool(1), ()),
    "max_pool2d_values": (torch_max_pool(2), (
        Sample.of(distinct(2, 3, 7, 8), kernel_size=[2, 3], stride=[3, 1], padding=[1, 1]),
        Sample.of(distinct(1, 2, 5, 5), kernel_size=5),  # one window: the global max
        Sample.of(distinct(1, 2, 6, 5), kernel_size=2, stride=1, dilation=2, ceil_mode=True),
    )),
    "max_pool3d_values": (torch_max_pool(3), ()),
    "max_pool1d_with_indices": (torch_max_pool(1, indices=True), (), 2),
    "max_pool2d_with_indices": (torch_max_pool(2, indices=True), (), 2),
    "max_pool3d_with_indices": (torch_max_pool(3, indices=True), (), 2),
    "max_pool_grad": (torch_max_pool_grad, (
        Sample.of(distinct(2, 3, 7, 8), randn(2, 3, 3, 8), kernel_size=[2, 3], stride=[3, 1], padding=[1, 1]),
        Sample.of(distinct(2, 2, 5, 5), randn(2, 2, 4, 4), kernel_size=2, stride=1),  # overlapping windows
        Sample.of(distinct(1, 2, 3, 4, 4), randn(1, 2, 2, 2, 2), kernel_size=2, ceil_mode=True),
    )),
    "max_pool_grad_grad": (torch_max_pool_grad_grad, (
        Sample.of(distinct(2, 2, 5, 5), randn(2, 2, 5, 5), kernel_size=2, stride=1),
        Sample.of(distinct(2, 2, 7), randn(2, 2, 7), kernel_size=3, stride=2, padding=1, dilation=2),
    )),
    "pool_scatter": (torch_pool_scatter, ()),
    "pool_gather": (torch_pool_gather, ()),
    "avg_pool1d": (torch_avg_pool(1), ()),
    "avg_pool2d": (torch_avg_pool(2), (
        Sample.of(randn(2, 3, 7, 8), kernel_size=[2, 3], stride=[3, 1], padding=[1, 1]),
        Sample.of(randn(1, 2, 6, 5), kernel_size=3, stride=2, padding=1, ceil_mode=True),  # windows past the pad
    )),
    "avg_pool3d": (torch_avg_pool(3), ()),
    "avg_pool_grad": (torch_avg_pool_grad, (
        Sample.of(randn(2, 3, 3, 8), input_size=[7, 8], kernel_size=[2, 3], stride=[3, 1], padding=[1, 1]),
        Sample.of(randn(2, 2, 4, 4), input_size=[5, 5], kernel_size=2, stride=1),
    )),
    "adaptive_avg_pool1d_sized": (torch_adaptive("avg", 1), ()),
    "adaptive_avg_pool2d_sized": (torch_adaptive("avg", 2), ()),
    "adaptive_avg_pool3d_sized": (torch_adaptive("avg", 3), ()),
    "adaptive_avg_pool_grad": (torch_adaptive_avg_pool_grad, ()),
    "adaptive_max_pool2d_values": (torch_adaptive("max", 2), ()),
    "adaptive_max_pool2d_with_indices": (torch_adaptive("max", 2, indices=True), (), 2),
    "adaptive_max_pool1d_values": (torch_adaptive("max", 1), ()),
    "adaptive_max_pool1d_with_indices": (torch_adaptive("max", 1, indices=True), (), 2),
    "adaptive_max_pool3d_values": (torch_adaptive("max", 3), ()),
    "adaptive_max_pool3d_with_indices": (torch_adaptive("max", 3, indices=True), (), 2),
    "max_unpool": (torch_max_unpool, ()),
    "interpolate": (torch_interpolate, (
        Sample.of(randn(1, 2, 3, 4), scale_factor=2.0),  # nearest, exactly twice
        Sample.of(randn(1, 1, 7, 5), size=[3, 9], mode="nearest"),
        Sample.of(randn(1, 2, 3, 4), scale_factor=[1.7, 0.8], mode="nearest-exact"),
        Sample.of(randn(1, 2, 5), size=8, mode="linear", align_corners=True),
        Sample.of(randn(1, 1, 4, 4), size=[1, 3], mode="bilinear", align_corners=True),  # one output row
    )),
    "interpolate_grad": (torch_interpolate_grad, (
        Sample.of(randn(1, 2, 5, 2), input_size=[3, 4], size=[5, 2], mode="nearest"),
        Sample.of(randn(1, 2, 9), input_size=[4], scale_factor=2.3, mode="linear"),
    )),
    "pixel_shuffle": (lambda x, *, upscale_factor: TF.pixel_shuffle(x, upscale_factor), ()),
    "pixel_unshuffle": (lambda x, *, downscale_factor: TF.pixel_unshuffle(x, downscale_factor), ()),
}

FAMILY = ("ops/conv.py", "ops/pool.py", "ops/resize.py")


def _case_id(name: str, i: int, output: int, sample: Sample) -> str:
    shapes = "x".join("None" if a is None else str(a.shape).replace(" ", "") for a in sample.args)
    attrs = "".join(f",{k}={v}" for k, v in sample.kwargs.items()).replace(" ", "")
    return f"{name}-{i}{f'.out{output}' if output else ''}[{shapes}{attrs}]"


def _cases(gradients: bool) -> list:
    params = []
    for name, (_, extra, *outputs) in ORACLE.items():
        for i, case in enumerate([*_declared_samples(name), *extra]):
            for output in range(outputs[0] if outputs and not gradients else 1):  # indices: values only
                params.append(pytest.param(name, case, output, id=_case_id(name, i, output, case)))
    return params


def adapt(name: str, sample: Sample, output: int = 0):
    """(opforge fn, torch fn, arrays): both take the sample's arrays (a None argument — no bias — left out) and
    return the output compared."""
    present = [i for i, a in enumerate(sample.args) if a is not None]
    opdef = of.registry.get(name)
    several = len(opdef.outputs) > 1

    def bind(fn, kwargs):
        def bound(*xs):
            args = [None] * len(sample.args)
            for i, x in zip(present, xs):
                args[i] = x
            out = fn(*args, **kwargs)
            return out[output] if several else out
        return bound

    attrs = {**{p.name: p.default for p in opdef.attrs if p.has_default}, **sample.kwargs}
    return bind(getattr(F, name), sample.kwargs), bind(ORACLE[name][0], attrs), [sample.args[i] for i in present]


@pytest.mark.parametrize(("name", "sample", "output"), _cases(gradients=False))
def test_forward(name, sample, output):
    check_forward(*adapt(name, sample, output))


@pytest.mark.parametrize(("name", "sample", "output"), _cases(gradients=True))
def test_vjp(name, sample, output):
    check_vjp(*adapt(name, sample, output))


@pytest.mark.parametrize(("name", "sample", "output"), _cases(gradients=True))
def test_hvp(name, sample, output):
    check_hvp(*adapt(name, sample, output))


def test_table_covers_every_op_of_the_family():
    defined = {op.name for op in of.registry if op.defined_at.replace("\\", "/").split(":")[0].endswith(FAMILY)}
    assert defined == set(ORACLE)


# -- the layers against torch.nn -------------------------------------------------------------------------------------

F64 = "float64"

LAYERS = {
    "conv1d": (lambda: nn.Conv1d(2, 4, 3, padding="same", dtype=F64), lambda: TNN.Conv1d(2, 4, 3, padding="same"),
               (2, 2, 6)),
    "conv2d_unbatched": (lambda: nn.Conv2d(2, 3, (2, 3), stride=(2, 1), dtype=F64),
                         lambda: TNN.Conv2d(2, 3, (2, 3), stride=(2, 1)), (2, 5, 6)),
    "conv3d": (lambda: nn.Conv3d(2, 2, 2, padding=1, groups=2, dtype=F64),
               lambda: TNN.Conv3d(2, 2, 2, padding=1, groups=2), (1, 2, 3, 3, 2)),
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(2, 3, 3, stride=2, output_padding=1, dtype=F64),
                         lambda: TNN.ConvTranspose1d(2, 3, 3, stride=2, output_padding=1), (2, 2, 4)),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, groups=2, dilation=2, dtype=F64),
                         lambda: TNN.ConvTranspose2d(4, 2, 3, stride=2, padding=1, groups=2, dilation=2),
                         (1, 4, 3, 3)),
    "conv_transpose3d": (lambda: nn.ConvTranspose3d(2, 2, 2, bias=False, dtype=F64),
                         lambda: TNN.ConvTranspose3d(2, 2, 2, bias=False), (1, 2, 2, 2, 2)),
    "max_pool1d": (lambda: nn.MaxPool1d(3, 2, 1, ceil_mode=True), lambda: TNN.MaxPool1d(3, 2, 1, ceil_mode=True),
                   (2, 3, 8)),
    "max_pool2d_dilated": (lambda: nn.MaxPool2d(2, 1, dilation=2), lambda: TNN.MaxPool2d(2, 1, dilation=2),
                           (2, 6, 5)),
    "max_pool3d": (lambda: nn.MaxPool3d(2), lambda: TNN.MaxPool3d(2), (1, 2, 4, 4, 4)),
    "avg_pool1d": (lambda: nn.AvgPool1d(3, 2, 1, count_include_pad=False),
                   lambda: TNN.AvgPool1d(3, 2, 1, count_include_pad=False), (2, 3, 8)),
    "avg_pool2d_divisor": (lambda: nn.AvgPool2d(2, ceil_mode=True, divisor_override=3),
                           lambda: TNN.AvgPool2d(2, ceil_mode=True, divisor_override=3), (2, 3, 5, 5)),
    "avg_pool3d": (lambda: nn.AvgPool3d((1, 2, 2)), lambda: TNN.AvgPool3d((1, 2, 2)), (1, 2, 3, 4, 4)),
    "adaptive_avg_pool1d": (lambda: nn.AdaptiveAvgPool1d(4), lambda: TNN.AdaptiveAvgPool1d(4), (2, 3, 7)),
    "adaptive_avg_pool2d_none": (lambda: nn.AdaptiveAvgPool2d((None, 2)), lambda: TNN.AdaptiveAvgPool2d((None, 2)),
                                 (2, 3, 4, 5)),
    "adaptive_avg_pool3d": (lambda: nn.AdaptiveAvgPool3d(2), lambda: TNN.AdaptiveAvgPool3d(2), (1, 2, 3, 4, 5)),
    "adaptive_max_pool2d": (lambda: nn.AdaptiveMaxPool2d((3, 2)), lambda: TNN.AdaptiveMaxPool2d((3, 2)),
                            (2, 2, 5, 4)),
    "upsample": (lambda: nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                 lambda: TNN.Upsample(scale_factor=2, mode="bilinear", align_corners=False), (1, 2, 3, 4)),
    "unfold": (lambda: nn.Unfold(2, padding=1), lambda: TNN.Unfold(2, padding=1), (2, 2, 3, 4)),
    "fold": (lambda: nn.Fold((3, 4), 2), lambda: TNN.Fold((3, 4), 2), (2, 8, 6)),
    "pixel_shuffle": (lambda: nn.PixelShuffle(2), lambda: TNN.PixelShuffle(2), (1, 8, 2, 3)),
    "pixel_unshuffle": (lambda: nn.PixelUnshuffle(2), lambda: TNN.PixelUnshuffle(2), (1, 2, 4, 6)),
}


@pytest.mark.parametrize("name", LAYERS)
def test_layers_match_torch(name):
    make_ours, make_theirs, shape = LAYERS[name]
    ours, theirs = make_ours(), make_theirs().double()
    with torch.no_grad():  # the same parameters in both
        for p, q in zip(ours.parameters(), theirs.parameters()):
            assert tuple(p.shape) == tuple(q.shape), f"{name}: parameter shapes differ"
            q.copy_(torch.from_numpy(p.numpy()))
    x = distinct(*shape)
    y = ours(of.tensor(x, requires_grad=True))
    ty = theirs(torch.from_numpy(x))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-7, atol=1e-9)
    dy = randn(*ty.shape)
    got = of.grad(y, list(ours.parameters()), grad_outputs=of.tensor(dy)) if list(ours.parameters()) else []
    want = torch.autograd.grad(ty, list(theirs.parameters()), torch.from_numpy(dy)) if got else []
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-7, atol=1e-9)


def test_max_pool_layers_return_indices_as_torch():
    x = distinct(2, 3, 6, 5)
    y, i = nn.MaxPool2d(2, return_indices=True)(of.tensor(x))
    ty, ti = TNN.MaxPool2d(2, return_indices=True)(torch.from_numpy(x))
    np.testing.assert_array_equal(y.numpy(), ty.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    y, i = nn.AdaptiveMaxPool2d(3, return_indices=True)(of.tensor(x))
    np.testing.assert_array_equal(i.numpy(), TNN.AdaptiveMaxPool2d(3, return_indices=True)(torch.from_numpy(x))[1])


def test_layer_reprs_and_arguments():
    assert repr(nn.ConvTranspose2d(2, 4, 3, stride=2, output_padding=1)) == (
        "ConvTranspose2d(2, 4, kernel_size=(3, 3), stride=(2, 2), output_padding=(1, 1))")
    assert repr(nn.Conv1d(2, 4, 3, padding="same", bias=False)) == (
        "Conv1d(2, 4, kernel_size=(3,), stride=(1,), padding=same, bias=False)")
    with pytest.raises(of.ArgumentError, match=r"ConvTranspose1d\(\): output_padding \(2,\) must be smaller"):
        nn.ConvTranspose1d(2, 2, 3, stride=2, output_padding=2)
    with pytest.raises(of.ArgumentError, match=r"Conv3d\(\): argument 'kernel_size' must be an int or 3 ints"):
        nn.Conv3d(2, 2, (3, 3))
    with pytest.raises(of.ArgumentError, match=r"MaxPool1d\(\): argument 'dilation' must be an int >= 1"):
        nn.MaxPool1d(2, dilation=0)


# -- max pooling: ties and NaN go where torch sends them -------------------------------------------------------------


@pytest.mark.parametrize(("kernel_size", "stride", "padding"), [(2, None, 0), (3, 1, 1), ([3, 2], [2, 1], [1, 0])])
def test_max_pool2d_ties_follow_torch(kernel_size, stride, padding):
    x = np.random.default_rng(7).integers(0, 3, (2, 3, 6, 7)).astype(np.float64)  # windows full of ties
    pooling = {"kernel_size": kernel_size, "stride": stride, "padding": padding, "dilation": 1, "ceil_mode": False}
    of_fn, torch_fn = (lambda t: F.max_pool2d(t, **pooling)), (lambda t: torch_max_pool(2)(t, **pooling))
    check_forward(of_fn, torch_fn, [x])
    check_vjp(of_fn, torch_fn, [x])
    check_hvp(of_fn, torch_fn, [x])
    check_forward(lambda t: F.max_pool2d_with_indices(t, **pooling).indices,
                  lambda t: torch_max_pool(2, indices=True)(t, **pooling)[1], [x])


def test_adaptive_max_pool_ties_follow_torch():
    x = np.random.default_rng(8).integers(0, 2, (2, 2, 5, 7)).astype(np.float64)
    for output in (0, 1):
        check_forward(lambda t, k=output: F.adaptive_max_pool2d_with_indices(t, output_size=[3, 4])[k],
                      lambda t, k=output: TF.adaptive_max_pool2d(t, [3, 4], return_indices=True)[k], [x])
    check_vjp(lambda t: F.adaptive_max_pool2d(t, output_size=[3, 4]), lambda t: TF.adaptive_max_pool2d(t, [3, 4]),
              [x])


@pytest.mark.parametrize(("ours", "theirs"), [
    (lambda t: F.max_pool2d_with_indices(t, kernel_size=2), lambda t: TF.max_pool2d(t, 2, return_indices=True)),
    (lambda t: F.max_pool2d_with_indices(t, kernel_size=3, stride=1, padding=1),
     lambda t: TF.max_pool2d(t, 3, 1, 1, return_indices=True)),
    (lambda t: F.adaptive_max_pool2d_with_indices(t, output_size=[3, 4]),
     lambda t: TF.adaptive_max_pool2d(t, [3, 4], return_indices=True)),
], ids=["disjoint", "overlapping", "adaptive"])
def test_max_pooling_takes_the_last_nan_as_the_maximum_as_torch(ours, theirs):
    x = distinct(1, 2, 4, 6)
    x[0, 0, 1, 2] = x[0, 0, 1, 3] = x[0, 1, 3, 5] = np.nan  # two NaNs in a window: the last one wins
    ox, tx = of.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (y, i), (ty, ti) = ours(ox), theirs(tx)
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())  # NaN where torch has NaN
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    dy = randn(*ty.shape)
    (g,) = of.grad(y, [ox], grad_outputs=of.tensor(dy))
    (tg,) = torch.autograd.grad(ty, tx, torch.from_numpy(dy))
    np.testing.assert_array_equal(g.numpy(), tg.numpy())
    dy = randn(1, 2, 2, 3)  # and max_pool_grad, which finds the maxima again
    (g,) = of.grad(F.max_pool2d(ox, kernel_size=2), [ox], grad_outputs=of.tensor(dy))
    np.testing.assert_array_equal(g.numpy(), torch.autograd.grad(TF.max_pool2d(tx, 2), tx, torch.from_numpy(dy))[0])


# -- higher orders: every grad op's gradient is an op with a gradient ------------------------------------------------


def _third_order_cases():
    x, w, b, w1 = randn(2, 4, 6, 5), randn(4, 2, 3, 3), randn(4), randn(3, 3, 2)
    geometry = {"stride": [2, 1], "padding": 1, "dilation": [1, 2], "groups": 2}
    pool = {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 1, "ceil_mode": True}
    tw, tb, tx = torch.from_numpy(w), torch.from_numpy(b), torch.from_numpy(x)
    return [
        pytest.param(x, lambda t: F.tanh(F.conv2d(t, of.tensor(w), of.tensor(b), **geometry)),
                     lambda t: torch.tanh(torch_conv(2)(t, tw, tb, **geometry)), id="conv2d-in-x"),
        pytest.param(w, lambda t: F.tanh(F.conv2d(of.tensor(x), t, **geometry)),
                     lambda t: torch.tanh(torch_conv(2)(tx, t, **geometry)), id="conv2d-in-weight"),
        pytest.param(randn(2, 3, 4), lambda t: F.tanh(F.conv_transpose1d(t, of.tensor(w1), padding=1, stride=2)),
                     lambda t: torch.tanh(TF.conv_transpose1d(t, torch.from_numpy(w1), padding=1, stride=2)),
                     id="conv_transpose1d-in-x"),
        pytest.param(distinct(2, 2, 7, 6), lambda t: F.tanh(F.max_pool2d(t, **pool)),
                     lambda t: torch.tanh(torch_max_pool(2)(t, **pool)), id="max_pool2d"),
        pytest.param(x, lambda t: F.tanh(F.avg_pool2d(t, kernel_size=3, stride=2, padding=1, ceil_mode=True)),
                     lambda t: torch.tanh(TF.avg_pool2d(t, 3, 2, 1, ceil_mode=True)), id="avg_pool2d"),
        pytest.param(x, lambda t: F.tanh(F.interpolate(t, scale_factor=1.5, mode="bilinear")),
                     lambda t: torch.tanh(TF.interpolate(t, scale_factor=1.5, mode="bilinear")), id="interpolate"),
    ]


@pytest.mark.parametrize(("array", "of_fn", "torch_fn"), _third_order_cases())
def test_third_derivatives_match_torch(array, of_fn, torch_fn):
    # g₁ = w₁·∂f/∂x, g₂ = w₂·∂g₁/∂x, g₃ = w₃·∂g₂/∂x: through the grad ops and then through their own gradients
    out = forward(OPFORGE, of_fn, [array])
    rng = np.random.default_rng(9)
    cotangents = [rng.standard_normal(out.shape), rng.standard_normal(array.shape), rng.standard_normal(array.shape)]
    for order in (1, 2, 3):
        got = directional_derivative(OPFORGE, of_fn, array, cotangents[:order])
        assert_same(got, directional_derivative(TORCH, torch_fn, array, cotangents[:order]), f"order {order}")


# -- the fast paths equal straightforward NumPy to the last bit where the arithmetic is the same -------------------


def _layouts(x: np.ndarray) -> dict:
    """The same values in three memory layouts: NCHW, batch-innermost (what the kernels return), and a strided
    slice of a bigger array."""
    batch_last = np.ascontiguousarray(np.moveaxis(x, 0, -1))
    bigger = np.zeros((x.shape[0] * 2, *x.shape[1:-1], x.shape[-1] + 3), x.dtype)
    bigger[::2, ..., 1:-2] = x
    return {"nchw": np.ascontiguousarray(x), "batch_last": np.moveaxis(batch_last, -1, 0),
            "slice": bigger[::2, ..., 1:-2]}


def _conv_calls(x, w, dy):
    t = of.tensor
    geometry = {"stride": [2, 1], "padding": [1, 2], "dilation": [1, 2], "groups": 2}
    return [F.conv2d(t(x), t(w), **geometry),
            F.conv_grad_input(t(dy), t(w), input_size=x.shape[2:], **geometry),
            F.conv_grad_weight(t(x), t(dy), kernel_size=w.shape[2:], **geometry),
            F.max_pool2d(t(x), kernel_size=2, stride=1, padding=1),
            F.max_pool_grad(t(x), t(F.max_pool2d(t(x), kernel_size=3, padding=1).numpy()), kernel_size=3,
                            padding=1),
            F.avg_pool2d(t(x), kernel_size=3, padding=1, ceil_mode=True)]


@pytest.mark.parametrize(("dtype", "x_shape"), [("float32", (3, 4, 6, 7)), ("float64", (3, 4, 6, 7)),
                                                ("float32", (37, 4, 8, 9))])  # to batch-last in 32s and 5
def test_results_do_not_depend_on_memory_layout_or_scratch_buffers(dtype, x_shape, monkeypatch):
    rng = np.random.default_rng(11)
    x, w = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal((6, 2, 3, 2)).astype(dtype)
    dy = rng.standard_normal(F.conv2d(of.tensor(x), of.tensor(w), stride=[2, 1], padding=[1, 2], dilation=[1, 2],
                                      groups=2).shape).astype(dtype)
    want = [y.numpy() for y in _conv_calls(x, w, dy)]
    for name, (xl, dyl) in {k: (v, _layouts(dy)[k]) for k, v in _layouts(x).items()}.items():
        for got, expected in zip(_conv_calls(xl, w, dyl), want):
            np.testing.assert_array_equal(got.numpy(), expected, err_msg=name)
    monkeypatch.setattr(_window, "SCRATCH_LIMIT", 0)  # every temporary freshly allocated
    for got, expected in zip(_conv_calls(x, w, dy), want):
        np.testing.assert_array_equal(got.numpy(), expected)


def _windows(x, kernel, stride, dilation=(1, 1)):
    """Every window of x (N, C, H, W), looped over by hand: (N, C, OH, OW, kH·kW)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    oh, ow = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1, (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.empty((*x.shape[:2], oh, ow, kh * kw), x.dtype)
    for p in range(oh):
        for q in range(ow):
            out[:, :, p, q] = x[:, :, p * sh:p * sh + dh * (kh - 1) + 1:dh, q * sw:q * sw + dw * (kw - 1) + 1:dw] \
                .reshape(*x.shape[:2], -1)
    return out


def test_window_loops_equal_straightforward_numpy():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 2, 8, 9)).astype(np.float32)
    geometry = {"kernel_size": [3, 2], "stride": [2, 3], "dilation": [1, 2]}
    win = _windows(x, (3, 2), (2, 3), (1, 2))  # (N, C, OH, OW, 6)
    oh, ow = win.shape[2:4]
    y, indices = F.max_pool2d_with_indices(of.tensor(x), **geometry)
    np.testing.assert_array_equal(y.numpy(), win.max(axis=-1))
    first = win.argmax(axis=-1)  # the first maximum of each window, as a flat (h, w) position
    rows = np.arange(oh)[:, None] * 2 + first // 2
    cols = np.arange(ow)[None, :] * 3 + first % 2 * 2
    np.testing.assert_array_equal(indices.numpy(), rows * x.shape[3] + cols)
    plain = _windows(x, (3, 2), (2, 3))  # average pooling has no dilation
    summed = plain[..., 0].copy()
    for t in range(1, plain.shape[-1]):  # the taps added in row-major order, then divided, as the kernel does
        summed += plain[..., t]
    np.testing.assert_array_equal(F.avg_pool2d(of.tensor(x), kernel_size=[3, 2], stride=[2, 3]).numpy(),
                                  summed / np.float32(6))
    unfolded = np.moveaxis(win, -1, 2).reshape(x.shape[0], -1, oh * ow)  # rows: (channel, kernel row, column)
    np.testing.assert_array_equal(F.unfold(of.tensor(x), **geometry).numpy(), unfolded)
    # the input gradient of a convolution is fold (col2im) of wᵀ·dy
    w = rng.standard_normal((4, 2, 3, 2)).astype(np.float32)
    dy = rng.standard_normal((3, 4, oh, ow)).astype(np.float32)
    dcols = np.einsum("ok,nop->nkp", w.reshape(4, -1), dy.reshape(3, 4, -1))
    want = F.fold(of.tensor(dcols), output_size=[8, 9], **geometry).numpy()
    got = F.conv_grad_input(of.tensor(dy), of.tensor(w), input_size=[8, 9], stride=[2, 3], dilation=[1, 2]).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- float32, sizes like the benchmark's -----------------------------------------------------------------------------


@pytest.mark.parametrize(("x_shape", "w_shape", "geometry"), [
    ((8, 3, 16, 16), (16, 3, 3, 3), {}),
    ((16, 1, 8, 8), (16, 1, 3, 3), {"padding": 1}),
    ((4, 8, 12, 10), (8, 2, 3, 3), {"stride": 2, "padding": 1, "dilation": 2, "groups": 4}),
])
def test_conv2d_float32_gradients_match_torch(x_shape, w_shape, geometry):
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (x_shape, w_shape, w_shape[:1])]
    defaults = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}
    ours = [of.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.from_numpy(a).requires_grad_() for a in arrays]
    y, ty = F.conv2d(*ours, **geometry), torch_conv(2)(*theirs, **{**defaults, **geometry})
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    got = of.grad(y, ours, grad_outputs=of.tensor(dy))
    want = torch.autograd.grad(ty, theirs, torch.from_numpy(dy))
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-3)


def test_a_lone_int_means_the_same_on_every_dim():
    x, w = of.tensor(randn(2, 2, 7, 6)), of.tensor(randn(3, 2, 3, 3))
    a = F.conv2d(x, w, stride=2, padding=1, dilation=1)
    b = F.conv2d(x, w, stride=[2, 2], padding=[1], dilation=[1, 1])
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert a.shape == tuple(forward(TORCH, lambda t, u: TF.conv2d(t, u, stride=2, padding=1),
                                    [x.numpy(), w.numpy()]).shape)


# -- errors at call time, naming the op ------------------------------------------------------------------------------


def _t(*shape):
    return of.tensor(np.zeros(shape))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.conv2d(_t(5, 5), _t(4, 3, 3, 3)), r"conv2d\(\): input must have rank 3 \(C, H, W\) or rank 4"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3)), r"conv2d\(\): weight must have rank 4"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 2, 3, 3)), r"conv2d\(\): the input has 3 channels"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 1, 3, 3), groups=2), r"conv2d\(\): the input's 3 channels"),
    (lambda: F.conv2d(_t(2, 4, 5, 5), _t(3, 2, 3, 3), groups=2), r"conv2d\(\): the weight's 3 output channels"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), _t(3)), r"conv2d\(\): bias must have shape \(4,\)"),
    (lambda: F.conv2d(_t(2, 3, 2, 5), _t(4, 3, 3, 3)), r"conv2d\(\): .* the output would be empty"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), dilation=3), r"conv2d\(\): .* the output would be empty"),
    (lambda: F.conv1d(_t(2, 3, 5, 5), _t(4, 3, 3)), r"conv1d\(\): input must have rank 2 \(C, L\) or rank 3"),
    (lambda: F.conv1d(_t(2, 3, 5), _t(4, 3, 0)), r"conv1d\(\): the weight of shape \(4, 3, 0\) has an empty kernel"),
    (lambda: F.conv3d(_t(1, 2, 3, 3), _t(2, 2, 2, 2, 2)), r"conv3d\(\): the input has 1 channels"),
    (lambda: F.conv_transpose2d(_t(1, 3, 4, 4), _t(2, 2, 3, 3)), r"conv_transpose2d\(\): the input has 3 channels"),
    (lambda: F.conv_transpose1d(_t(1, 2, 1), _t(2, 2, 1), padding=1), r"conv_transpose1d\(\): the output would be "
                                                                      "empty"),
    (lambda: F.conv_grad_input(_t(2, 4, 3, 3), _t(4, 3, 3, 3), input_size=[6, 6]),
     r"conv_grad_input\(\): dy has shape \(2, 4, 3, 3\), the forward op's output has \(2, 4, 4, 4\)"),
    (lambda: F.conv_grad_input(_t(2, 4, 3, 3), _t(4, 3, 3, 3), input_size=[6, 6, 6]),
     r"conv_grad_input\(\): argument 'input_size' holds 3 values, the input has 2 spatial dims"),
    (lambda: F.conv_grad_weight(_t(2, 3, 5, 5), _t(2, 4, 3, 3), kernel_size=[2, 2]),
     r"conv_grad_weight\(\): dy has shape"),
    (lambda: F.fold(_t(2, 12, 5), output_size=[4, 5], kernel_size=[2, 3]),
     r"fold\(\): the input has 5 columns, but output_size \[4, 5\] holds 9 windows"),
    (lambda: F.max_pool2d(_t(5, 5), kernel_size=2),
     r"max_pool2d\(\): input must have rank 3 \(C, H, W\) or rank 4"),
    (lambda: F.max_pool2d(_t(1, 1, 5, 5), kernel_size=2, padding=2),
     r"max_pool2d\(\): padding \[2, 2\] must be"),
    (lambda: F.avg_pool2d(_t(1, 1, 2, 5), kernel_size=3), r"avg_pool2d\(\): .* the output would be empty"),
    (lambda: F.max_pool_grad(_t(1, 1, 4, 4), _t(1, 1, 3, 3), kernel_size=2), r"max_pool_grad\(\): dy has shape"),
    (lambda: F.avg_pool_grad(_t(1, 1, 3, 3), input_size=[4, 4], kernel_size=2), r"avg_pool_grad\(\): dy has shape"),
    (lambda: F.pool_scatter(_t(1, 1, 2), of.tensor(np.array([[[0, 5]]])), input_size=[4]),
     r"pool_scatter\(\): indices must lie in \[0, 4\)"),
    (lambda: F.interpolate(_t(1, 1, 4, 4), size=3, mode="linear"), r"interpolate\(\): mode='linear' needs an input "
                                                                     "of rank 3"),
    (lambda: F.pixel_shuffle(_t(1, 3, 2, 2), upscale_factor=2), r"pixel_shuffle\(\): the input's 3 channels"),
    (lambda: F.pixel_unshuffle(_t(1, 1, 3, 4), downscale_factor=2), r"pixel_unshuffle\(\): the input's height"),
])
def test_shape_errors_name_the_op(call, message):
    with pytest.raises(of.ShapeError, match=message):
        call()


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), stride=0), r"conv2d\(\): argument 'stride' must be >= 1"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), padding=-1), r"conv2d\(\): argument 'padding' must be >= 0"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), stride=[1, 1, 1]),
     r"conv2d\(\): argument 'stride' must hold 1 or 2 ints"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), groups=0), r"conv2d\(\): argument 'groups' must be >= 1"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), padding="full"),
     r"conv2d\(\): argument 'padding' must be 'same', 'valid' or ints, got 'full'"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), padding="same", stride=2),
     r"conv2d\(\): padding='same' needs stride 1"),
    (lambda: F.conv1d(_t(2, 3, 5), _t(4, 3, 3), stride=[1, 1]), r"conv1d\(\): argument 'stride' must hold 1 int"),
    (lambda: F.conv_transpose2d(_t(1, 2, 3, 3), _t(2, 2, 3, 3), stride=2, output_padding=2),
     r"conv_transpose2d\(\): argument 'output_padding' must be smaller than the stride"),
    (lambda: F.max_pool2d(_t(1, 1, 4, 4), kernel_size=0),
     r"max_pool2d\(\): argument 'kernel_size' must be >= 1"),
    (lambda: F.avg_pool2d(_t(1, 1, 4, 4), kernel_size=2, divisor_override=0),
     r"avg_pool2d\(\): argument 'divisor_override' must be >= 1"),
    (lambda: F.interpolate(_t(1, 1, 4), size=3, scale_factor=2.0), r"interpolate\(\): exactly one of 'size' and "
                                                                    "'scale_factor'"),
    (lambda: F.interpolate(_t(1, 1, 4), size=3, align_corners=True), r"interpolate\(\): argument 'align_corners'"),
    (lambda: F.interpolate(_t(1, 1, 4), size=3, mode="cubic"), r"interpolate\(\): argument 'mode' must be one of"),
    (lambda: F.unfold(_t(2, 3, 4), kernel_size=2, padding=[1, 1, 1]),
     r"unfold\(\): argument 'padding' must hold 1 or 2 ints"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), "w"), r"conv2d\(\): argument 'weight'"),
])
def test_argument_errors_name_the_op_and_argument(call, message):
    with pytest.raises((of.ArgumentError, ValueError), match=message):
        call()


# -- program mode ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("x_shape", [(None, 2, 9, 9), (None, 2, None, None)], ids=["batch-unknown", "hw-unknown"])
def test_program_mode_gives_eager_values_and_gradients(x_shape):
    rng = np.random.default_rng(10)
    w = of.tensor(rng.standard_normal((4, 2, 3, 3)), requires_grad=True)
    b = of.tensor(rng.standard_normal(4), requires_grad=True)
    w1 = of.tensor(rng.standard_normal((3, 2, 3)), requires_grad=True)
    wt = of.tensor(rng.standard_normal((4, 2, 2, 2)), requires_grad=True)

    def f(x, s):
        h = F.conv2d(x, w, b, padding="same", stride=1)
        h = F.max_pool2d(F.tanh(h), kernel_size=2, ceil_mode=True) + F.avg_pool2d(h, kernel_size=2, ceil_mode=True,
                                                                                  count_include_pad=False)
        h = F.conv_transpose2d(h, wt, stride=2) + F.interpolate(h[:, :2], scale_factor=2.0, mode="bilinear")
        loss = F.sum(h * h) + F.sum(F.adaptive_avg_pool2d(h, output_size=[2, 3]) ** 2)
        return {"loss": loss + F.sum(F.conv1d(s, w1, padding=1) ** 2)}

    prog = of.trace(f, x=of.Spec(x_shape, "float64"), s=of.Spec((None, 2, 7), "float64"))
    of.append_backward(prog, prog.outputs["loss"])
    exe = of.Executor(prog)
    for batch, hw in ((2, 9), (3, 9) if x_shape[2] else (3, 11)):  # sizes unknown when tracing
        x, s = rng.standard_normal((batch, 2, hw, hw)), rng.standard_normal((batch, 2, 7))
        out = exe.run(x=x, s=s)
        loss = f(of.tensor(x), of.tensor(s))["loss"]
        np.testing.assert_allclose(out["loss"], loss.numpy(), rtol=1e-12)
        for name, g in zip(prog.parameters(), of.grad(loss, [w, b, wt, w1])):  # in the order the trace met them
            np.testing.assert_allclose(out[f"{name}@GRAD"], g.numpy(), rtol=1e-12, atol=1e-14)


# -- the benchmark runs ----------------------------------------------------------------------------------------------


def test_bench_conv_softmax_quick_runs():
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "bench" / "conv_softmax.py"), "--quick"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "| conv2d 128×1×8×8" in done.stdout and "opforge / numpy" in done.stdout


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("transposed", [False, True])
def test_an_empty_batch_convolves_to_an_empty_batch_as_torch(nd, transposed):
    # the im2col reshape could not infer a dim of an empty batch: conv2d on (0, C, H, W) failed, torch gives (0, O, ..)
    name = f"conv{'_transpose' if transposed else ''}{nd}d"
    x = np.zeros((0, 4) + (6,) * nd)
    w = np.random.default_rng(0).standard_normal(((4, 3) if transposed else (6, 2)) + (3,) * nd)
    b = np.ones(6)  # 6 output channels either way (2 groups)
    ours = [of.tensor(a, requires_grad=True) for a in (x, w, b)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    y = getattr(F, name)(*ours, groups=2, padding=1)
    ty = getattr(torch.nn.functional, name)(*theirs, groups=2, padding=1)
    assert y.shape == tuple(ty.shape)
    (y.sum() + (ours[1] * ours[1]).sum()).backward()
    (ty.sum() + (theirs[1] * theirs[1]).sum()).backward()
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy())
    compiled = of.compile(lambda a, k, c: getattr(F, name)(a, k, c, groups=2, padding=1))
    assert compiled(*(of.tensor(a) for a in (x, w, b))).shape == tuple(ty.shape)
