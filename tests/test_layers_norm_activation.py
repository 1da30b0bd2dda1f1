"""The normalisation and activation layers added with issue 15 against torch.nn's: forward, input and parameter
gradients (float64), state-dict keys, running statistics, and the same output compiled."""

import numpy as np
import pytest
import torch
from test_nn import F64, TNN, close, randn, to_torch

import opforge as of
from opforge import nn
from opforge import ops as F

LAYERS = {
    "group_norm": (lambda: nn.GroupNorm(2, 6, dtype=F64), lambda: TNN.GroupNorm(2, 6), (3, 6, 4)),
    "group_norm_no_affine": (lambda: nn.GroupNorm(3, 3, affine=False, dtype=F64),
                             lambda: TNN.GroupNorm(3, 3, affine=False), (2, 3, 2, 2)),
    "instance_norm_2d": (lambda: nn.InstanceNorm2d(3, affine=True, dtype=F64),
                         lambda: TNN.InstanceNorm2d(3, affine=True), (2, 3, 4, 5)),
    "instance_norm_1d": (lambda: nn.InstanceNorm1d(3, dtype=F64), lambda: TNN.InstanceNorm1d(3), (2, 3, 6)),
    "rms_norm": (lambda: nn.RMSNorm(6, dtype=F64), lambda: TNN.RMSNorm(6), (3, 4, 6)),
    "rms_norm_eps": (lambda: nn.RMSNorm((4, 6), eps=1e-3, dtype=F64), lambda: TNN.RMSNorm((4, 6), eps=1e-3),
                     (3, 4, 6)),
    "prelu": (lambda: nn.PReLU(dtype=F64), TNN.PReLU, (3, 4)),
    "prelu_channels": (lambda: nn.PReLU(3, init=0.1, dtype=F64), lambda: TNN.PReLU(3, init=0.1), (2, 3, 4)),
    "hardtanh": (lambda: nn.Hardtanh(-0.5, 0.75), lambda: TNN.Hardtanh(-0.5, 0.75), (3, 4)),
    "relu6": (nn.ReLU6, TNN.ReLU6, (3, 4)),
    "hardsigmoid": (nn.Hardsigmoid, TNN.Hardsigmoid, (3, 4)),
    "hardswish": (nn.Hardswish, TNN.Hardswish, (3, 4)),
    "mish": (nn.Mish, TNN.Mish, (3, 4)),
    "logsigmoid": (nn.LogSigmoid, TNN.LogSigmoid, (3, 4)),
    "celu": (lambda: nn.CELU(0.5), lambda: TNN.CELU(0.5), (3, 4)),
    "softmin": (lambda: nn.Softmin(dim=0), lambda: TNN.Softmin(dim=0), (3, 4)),
    "glu": (lambda: nn.GLU(dim=1), lambda: TNN.GLU(dim=1), (3, 4)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_forward_and_gradients_match_torch(name):
    make_ours, make_theirs, shape = LAYERS[name]
    ours = make_ours()
    theirs = to_torch(ours, make_theirs())
    x = randn(*shape) * 4
    xo, xt = of.tensor(x, requires_grad=True), torch.from_numpy(x.copy()).requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    assert yo.shape == tuple(yt.shape) and yo.dtype == np.float64
    close(yo, yt, rtol=1e-7)  # torch's hardsigmoid and hardswish compute with a single-precision 1/6
    u = randn(*yo.shape, seed=1)
    F.sum(yo * of.tensor(u)).backward()
    (yt * torch.from_numpy(u)).sum().backward()
    close(xo.grad, xt.grad, rtol=1e-7)
    grads = dict(theirs.named_parameters())
    for n, p in ours.named_parameters():
        close(p.grad, grads[n].grad)


@pytest.mark.parametrize(("ours", "theirs"), [
    (lambda: nn.InstanceNorm2d(3, affine=True, track_running_stats=True, momentum=0.3, dtype=F64),
     lambda: TNN.InstanceNorm2d(3, affine=True, track_running_stats=True, momentum=0.3)),
    (lambda: nn.InstanceNorm1d(3, track_running_stats=True, dtype=F64),
     lambda: TNN.InstanceNorm1d(3, track_running_stats=True)),
])
def test_instance_norm_running_statistics_follow_torch(ours, theirs):
    ours = ours()
    theirs = to_torch(ours, theirs())
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    shape = (4, 3, 5, 2) if isinstance(ours, nn.InstanceNorm2d) else (4, 3, 5)
    for step in range(2):  # two training steps update the statistics, then eval normalises with them
        x = randn(*shape, seed=step) * 3 + 1
        close(ours(of.tensor(x)), theirs(torch.from_numpy(x)))
    close(ours.running_mean, theirs.running_mean)
    close(ours.running_var, theirs.running_var)
    ours.eval(), theirs.eval()
    x = randn(*shape, seed=5)
    close(ours(of.tensor(x)), theirs(torch.from_numpy(x)))


@pytest.mark.parametrize("make", [
    lambda: nn.GroupNorm(2, 4), lambda: nn.InstanceNorm2d(4, affine=True), lambda: nn.RMSNorm(3),
    lambda: nn.PReLU(4), nn.Hardswish, nn.Mish,
])
def test_a_layer_compiled_gives_the_eager_output(make):
    layer = make()
    x = of.randn(2, 4, 3, 3)
    step = of.compile(lambda x: layer(x))
    np.testing.assert_allclose(step(x).numpy(), layer(x).numpy(), rtol=1e-6)


def test_layer_arguments_are_checked():
    with pytest.raises(of.ArgumentError, match=r"GroupNorm\(\): num_channels \(6\) must be divisible"):
        nn.GroupNorm(4, 6)
    with pytest.raises(of.ShapeError, match="InstanceNorm2d: expected a 4-D"):
        nn.InstanceNorm2d(3)(of.zeros((2, 3, 4)))
    with pytest.raises(of.ArgumentError, match=r"PReLU\(\): argument 'num_parameters'"):
        nn.PReLU(0)
