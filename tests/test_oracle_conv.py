"""PyTorch as the oracle for convolution and pooling: values, first and second derivatives, in float64.

``ORACLE`` maps each op of ``opforge/ops/conv.py`` to its torch counterpart, called with the op's tensor arguments
(``None`` for a missing bias) and its attrs (signature defaults filled in). The dedicated gradient ops are compared
with torch's own backward of the forward op, taken with ``create_graph=True`` so it can be differentiated again.
Every op's declared samples plus the extra cases below go through the runners of ``test_torch_oracle.py``
(forward, VJP and HVP); the adapter here only drops a ``None`` bias from the differentiated arrays.

Then: third derivatives (through the grad ops' own gradients), PyTorch's tie rule for max_pool2d (the first maximum
of a window gets the gradient), float32 at benchmark-like sizes, errors at call time, program mode against eager,
and a smoke run of ``bench/conv_softmax.py --quick``.
"""

from __future__ import annotations

import subprocess
import sys
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
from opforge import Sample
from opforge import ops as F
from opforge.ops import conv as conv_module

TF = torch.nn.functional

_rng = np.random.default_rng(20240602)


def randn(*shape) -> np.ndarray:
    return _rng.standard_normal(shape)


def distinct(*shape) -> np.ndarray:
    """All values different, so that max pooling has no ties (numeric gradients are then well defined)."""
    size = int(np.prod(shape))
    return (_rng.permutation(size).reshape(shape) + _rng.uniform(0.1, 0.9, shape)) * (4.0 / size) - 2.0


def n_list(value, n: int) -> list:
    """An int[] attr as n ints, as opforge reads it (a lone int or a 1-list repeats)."""
    values = [value] if isinstance(value, int) else list(value)
    return values * n if len(values) == 1 else values


# -- torch counterparts ----------------------------------------------------------------------------------------------


def torch_conv2d(x, weight, bias=None, *, stride, padding, dilation, groups):
    return TF.conv2d(x, weight, bias, stride=n_list(stride, 2), padding=n_list(padding, 2),
                     dilation=n_list(dilation, 2), groups=groups)


def torch_conv1d(x, weight, bias=None, *, stride, padding, dilation, groups):
    return TF.conv1d(x, weight, bias, stride=n_list(stride, 1), padding=n_list(padding, 1),
                     dilation=n_list(dilation, 1), groups=groups)


def torch_conv2d_grad_input(dy, weight, *, input_size, **geometry):
    """torch's backward of conv2d with respect to the input (linear in it, so taken at zeros)."""
    groups = geometry["groups"]
    x = torch.zeros((dy.shape[0], weight.shape[1] * groups, *n_list(input_size, 2)), dtype=dy.dtype,
                    requires_grad=True)
    (dx,) = torch.autograd.grad(torch_conv2d(x, weight, **geometry), x, dy, create_graph=True)
    return dx


def torch_conv2d_grad_weight(x, dy, *, kernel_size, **geometry):
    """torch's backward of conv2d with respect to the weight (linear in it, so taken at zeros)."""
    w = torch.zeros((dy.shape[1], x.shape[1] // geometry["groups"], *n_list(kernel_size, 2)), dtype=dy.dtype,
                    requires_grad=True)
    (dw,) = torch.autograd.grad(torch_conv2d(x, w, **geometry), w, dy, create_graph=True)
    return dw


def torch_max_pool2d(x, *, kernel_size, stride, padding):
    return TF.max_pool2d(x, n_list(kernel_size, 2), None if stride is None else n_list(stride, 2),
                         n_list(padding, 2))


def torch_max_pool2d_grad_grad(x, ddx, **pooling):
    """The derivative of torch's max_pool2d backward with respect to its output gradient, in direction ddx."""
    dy = torch.zeros(torch_max_pool2d(x.detach(), **pooling).shape, dtype=ddx.dtype, requires_grad=True)
    dx = torch_vjp(torch_max_pool2d)(x, dy, **pooling)
    (ddy,) = torch.autograd.grad(dx, dy, ddx, create_graph=True)
    return ddy


def torch_avg_pool2d(x, *, kernel_size, stride, padding):
    return TF.avg_pool2d(x, n_list(kernel_size, 2), None if stride is None else n_list(stride, 2),
                         n_list(padding, 2), count_include_pad=True)


def torch_avg_pool2d_grad(dy, *, input_size, **pooling):
    x = torch.zeros((*dy.shape[:2], *n_list(input_size, 2)), dtype=dy.dtype, requires_grad=True)
    (dx,) = torch.autograd.grad(torch_avg_pool2d(x, **pooling), x, dy, create_graph=True)
    return dx


# -- the table: op -> (torch counterpart, extra cases) ---------------------------------------------------------------


ORACLE = {
    "conv2d": (torch_conv2d, (
        Sample.of(randn(1, 6, 9, 11), randn(6, 2, 3, 2), randn(6), stride=[3, 2], padding=[2, 0], dilation=[2, 3],
                  groups=3),
        Sample.of(randn(2, 3, 5, 5), randn(6, 1, 3, 3), None, padding=1, groups=3),  # depthwise, multiplier 2
        Sample.of(randn(2, 4, 4, 3), randn(2, 4, 1, 1), randn(2)),  # 1×1
        Sample.of(randn(2, 2, 5, 6), randn(3, 2, 5, 6), randn(3)),  # the kernel covers the image: 1×1 output
    )),
    "conv2d_grad_input": (torch_conv2d_grad_input, (
        Sample.of(randn(1, 6, 3, 4), randn(6, 2, 3, 2), input_size=[9, 11], stride=[3, 2], padding=[2, 0],
                  dilation=[2, 3], groups=3),
        Sample.of(randn(2, 4, 3, 2), randn(4, 2, 2, 2), input_size=[6, 5], stride=2),  # floor: last row/col unread
    )),
    "conv2d_grad_weight": (torch_conv2d_grad_weight, (
        Sample.of(randn(1, 6, 9, 11), randn(1, 6, 3, 4), kernel_size=[3, 2], stride=[3, 2], padding=[2, 0],
                  dilation=[2, 3], groups=3),
        Sample.of(randn(2, 2, 6, 5), randn(2, 4, 3, 2), kernel_size=2, stride=2),
    )),
    "conv1d": (torch_conv1d, (
        Sample.of(randn(2, 3, 11), randn(2, 3, 3), randn(2), stride=3, padding=2, dilation=2),
        Sample.of(randn(1, 4, 6), randn(8, 1, 3), None, groups=4),
    )),
    "max_pool2d": (torch_max_pool2d, (
        Sample.of(distinct(2, 3, 7, 8), kernel_size=[2, 3], stride=[3, 1], padding=[1, 1]),
        Sample.of(distinct(1, 2, 5, 5), kernel_size=5),  # one window: the global max
    )),
    "max_pool2d_grad": (torch_vjp(torch_max_pool2d), (
        Sample.of(distinct(2, 3, 7, 8), randn(2, 3, 3, 8), kernel_size=[2, 3], stride=[3, 1], padding=[1, 1]),
        Sample.of(distinct(2, 2, 5, 5), randn(2, 2, 4, 4), kernel_size=2, stride=1),  # overlapping windows
    )),
    "max_pool2d_grad_grad": (torch_max_pool2d_grad_grad, (
        Sample.of(distinct(2, 2, 5, 5), randn(2, 2, 5, 5), kernel_size=2, stride=1),
    )),
    "avg_pool2d": (torch_avg_pool2d, (
        Sample.of(randn(2, 3, 7, 8), kernel_size=[2, 3], stride=[3, 1], padding=[1, 1]),
    )),
    "avg_pool2d_grad": (torch_avg_pool2d_grad, (
        Sample.of(randn(2, 3, 3, 8), input_size=[7, 8], kernel_size=[2, 3], stride=[3, 1], padding=[1, 1]),
        Sample.of(randn(2, 2, 4, 4), input_size=[5, 5], kernel_size=2, stride=1),
    )),
}


def _case_id(name: str, i: int, sample: Sample) -> str:
    shapes = "x".join("None" if a is None else str(a.shape).replace(" ", "") for a in sample.args)
    attrs = "".join(f",{k}={v}" for k, v in sample.kwargs.items()).replace(" ", "")
    return f"{name}-{i}[{shapes}{attrs}]"


CASES = [pytest.param(name, case, id=_case_id(name, i, case))
         for name in ORACLE for i, case in enumerate([*_declared_samples(name), *ORACLE[name][1]])]


def adapt(name: str, sample: Sample):
    """(opforge fn, torch fn, arrays): both functions take the sample's arrays, a None argument (no bias) left out."""
    present = [i for i, a in enumerate(sample.args) if a is not None]

    def full(xs):
        args = [None] * len(sample.args)
        for i, x in zip(present, xs):
            args[i] = x
        return args

    opdef = of.registry.get(name)
    attrs = {**{p.name: p.default for p in opdef.attrs if p.has_default}, **sample.kwargs}
    of_fn = lambda *xs: getattr(F, name)(*full(xs), **sample.kwargs)  # noqa: E731
    torch_fn = lambda *xs: ORACLE[name][0](*full(xs), **attrs)  # noqa: E731
    return of_fn, torch_fn, [sample.args[i] for i in present]


@pytest.mark.parametrize(("name", "sample"), CASES)
def test_forward(name, sample):
    check_forward(*adapt(name, sample))


@pytest.mark.parametrize(("name", "sample"), CASES)
def test_vjp(name, sample):
    check_vjp(*adapt(name, sample))


@pytest.mark.parametrize(("name", "sample"), CASES)
def test_hvp(name, sample):
    check_hvp(*adapt(name, sample))


def test_table_covers_every_op_of_the_family():
    family = {"conv1d", "conv2d", "conv2d_grad_input", "conv2d_grad_weight", "max_pool2d", "max_pool2d_grad",
              "max_pool2d_grad_grad", "avg_pool2d", "avg_pool2d_grad"}
    defined = {op.name for op in of.registry if op.defined_at.replace("\\", "/").split(":")[0].endswith("ops/conv.py")}
    assert defined == family == set(ORACLE)


# -- ties: the first maximum of a window takes the gradient, as in torch ---------------------------------------------


@pytest.mark.parametrize(("kernel_size", "stride", "padding"), [(2, None, 0), (3, 1, 1), ([3, 2], [2, 1], [1, 0])])
def test_max_pool2d_ties_follow_torch(kernel_size, stride, padding):
    x = np.random.default_rng(7).integers(0, 3, (2, 3, 6, 7)).astype(np.float64)  # windows full of ties
    pooling = {"kernel_size": kernel_size, "stride": stride, "padding": padding}
    of_fn, torch_fn = (lambda t: F.max_pool2d(t, **pooling)), (lambda t: torch_max_pool2d(t, **pooling))
    check_forward(of_fn, torch_fn, [x])
    check_vjp(of_fn, torch_fn, [x])
    check_hvp(of_fn, torch_fn, [x])


# -- higher orders: every grad op's gradient is an op with a gradient ------------------------------------------------


def _third_order_cases():
    x, w, b, w1 = randn(2, 4, 6, 5), randn(4, 2, 3, 3), randn(4), randn(3, 3, 2)
    geometry = {"stride": [2, 1], "padding": 1, "dilation": [1, 2], "groups": 2}
    full = {"stride": [2, 1], "padding": [1, 1], "dilation": [1, 2], "groups": 2}
    pool = {"kernel_size": 3, "stride": 2, "padding": 1}
    tw, tb, tx = torch.from_numpy(w), torch.from_numpy(b), torch.from_numpy(x)
    return [
        pytest.param(x, lambda t: F.tanh(F.conv2d(t, of.tensor(w), of.tensor(b), **geometry)),
                     lambda t: torch.tanh(torch_conv2d(t, tw, tb, **full)), id="conv2d-in-x"),
        pytest.param(w, lambda t: F.tanh(F.conv2d(of.tensor(x), t, **geometry)),
                     lambda t: torch.tanh(torch_conv2d(tx, t, **full)), id="conv2d-in-weight"),
        pytest.param(randn(2, 3, 9), lambda t: F.tanh(F.conv1d(t, of.tensor(w1), padding=1, stride=2)),
                     lambda t: torch.tanh(TF.conv1d(t, torch.from_numpy(w1), padding=1, stride=2)), id="conv1d-in-x"),
        pytest.param(distinct(2, 2, 7, 6), lambda t: F.tanh(F.max_pool2d(t, **pool)),
                     lambda t: torch.tanh(torch_max_pool2d(t, **pool)), id="max_pool2d"),
        pytest.param(x, lambda t: F.tanh(F.avg_pool2d(t, **pool)),
                     lambda t: torch.tanh(torch_avg_pool2d(t, **pool)), id="avg_pool2d"),
    ]


@pytest.mark.parametrize(("array", "of_fn", "torch_fn"), _third_order_cases())
def test_third_derivatives_match_torch(array, of_fn, torch_fn):
    # g₁ = w₁·∂f/∂x, g₂ = w₂·∂g₁/∂x, g₃ = w₃·∂g₂/∂x: through conv2d_grad_input / conv2d_grad_weight (or the pooling
    # grad ops) and then through their own gradients, in both frameworks.
    out = forward(OPFORGE, of_fn, [array])
    rng = np.random.default_rng(9)
    cotangents = [rng.standard_normal(out.shape), rng.standard_normal(array.shape), rng.standard_normal(array.shape)]
    for order in (1, 2, 3):
        got = directional_derivative(OPFORGE, of_fn, array, cotangents[:order])
        assert_same(got, directional_derivative(TORCH, torch_fn, array, cotangents[:order]), f"order {order}")


# -- float32, sizes like the benchmark's -----------------------------------------------------------------------------


@pytest.mark.parametrize(("x_shape", "w_shape", "geometry"), [
    ((8, 3, 16, 16), (16, 3, 3, 3), {}),
    ((16, 1, 8, 8), (16, 1, 3, 3), {"padding": 1}),
    ((4, 8, 12, 10), (8, 2, 3, 3), {"stride": 2, "padding": 1, "dilation": 2, "groups": 4}),
])
@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["whole-batch", "one-sample-chunks"])
def test_conv2d_float32_gradients_match_torch(x_shape, w_shape, geometry, chunk_bytes, monkeypatch):
    if chunk_bytes is not None:  # im2col one sample at a time
        monkeypatch.setattr(conv_module, "_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (x_shape, w_shape, w_shape[:1])]
    defaults = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}
    ours = [of.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.from_numpy(a).requires_grad_() for a in arrays]
    y, ty = F.conv2d(*ours, **geometry), torch_conv2d(*theirs, **{**defaults, **geometry})
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    got = of.grad(y, ours, grad_outputs=of.tensor(dy))
    want = torch.autograd.grad(ty, theirs, torch.from_numpy(dy))
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-3)


def test_a_lone_int_means_the_same_on_both_dims():
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
    (lambda: F.conv2d(_t(3, 5, 5), _t(4, 3, 3, 3)), r"conv2d\(\): input must have rank 4"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3)), r"conv2d\(\): weight must have rank 4"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 2, 3, 3)), r"conv2d\(\): the input has 3 channels"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 1, 3, 3), groups=2), r"conv2d\(\): the input's 3 channels"),
    (lambda: F.conv2d(_t(2, 4, 5, 5), _t(3, 2, 3, 3), groups=2), r"conv2d\(\): the weight's 3 output channels"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), _t(3)), r"conv2d\(\): bias must have shape \(4,\)"),
    (lambda: F.conv2d(_t(2, 3, 2, 5), _t(4, 3, 3, 3)), r"conv2d\(\): .* the output would be empty"),
    (lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 3, 3, 3), dilation=3), r"conv2d\(\): .* the output would be empty"),
    (lambda: F.conv1d(_t(2, 3, 5, 5), _t(4, 3, 3)), r"conv1d\(\): input must have rank 3"),
    (lambda: F.conv1d(_t(2, 3, 5), _t(4, 3, 0)), r"conv1d\(\): the weight of shape \(4, 3, 0\) has an empty kernel"),
    (lambda: F.conv1d(_t(2, 3, 2), _t(4, 3, 3)), r"conv1d\(\): .* the output would be empty"),
    (lambda: F.conv2d_grad_input(_t(2, 4, 3, 3), _t(4, 3, 3, 3), input_size=[6, 6]),
     r"conv2d_grad_input\(\): dy has shape \(2, 4, 3, 3\), the forward op's output has \(2, 4, 4, 4\)"),
    (lambda: F.conv2d_grad_weight(_t(2, 3, 5, 5), _t(2, 4, 3, 3), kernel_size=[2, 2]),
     r"conv2d_grad_weight\(\): dy has shape"),
    (lambda: F.max_pool2d(_t(3, 5, 5), kernel_size=2), r"max_pool2d\(\): input must have rank 4"),
    (lambda: F.max_pool2d(_t(1, 1, 5, 5), kernel_size=2, padding=2), r"max_pool2d\(\): padding \[2, 2\] must be"),
    (lambda: F.avg_pool2d(_t(1, 1, 2, 5), kernel_size=3), r"avg_pool2d\(\): .* the output would be empty"),
    (lambda: F.max_pool2d_grad(_t(1, 1, 4, 4), _t(1, 1, 3, 3), kernel_size=2),
     r"max_pool2d_grad\(\): dy has shape"),
    (lambda: F.avg_pool2d_grad(_t(1, 1, 3, 3), input_size=[4, 4], kernel_size=2),
     r"avg_pool2d_grad\(\): dy has shape"),
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
    (lambda: F.conv1d(_t(2, 3, 5), _t(4, 3, 3), stride=[1, 1]), r"conv1d\(\): argument 'stride' must hold 1 int"),
    (lambda: F.max_pool2d(_t(1, 1, 4, 4), kernel_size=0), r"max_pool2d\(\): argument 'kernel_size' must be >= 1"),
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

    def f(x, s):
        h = F.conv2d(x, w, b, padding=1, stride=2)
        h = F.max_pool2d(F.tanh(h), kernel_size=2) + F.avg_pool2d(h, kernel_size=2)
        return {"loss": F.sum(h * h) + F.sum(F.conv1d(s, w1, padding=1) ** 2)}

    prog = of.trace(f, x=of.Spec(x_shape, "float64"), s=of.Spec((None, 2, 7), "float64"))
    of.append_backward(prog, prog.outputs["loss"])
    exe = of.Executor(prog)
    for batch, hw in ((2, 9), (3, 9) if x_shape[2] else (3, 12)):  # sizes unknown when tracing
        x, s = rng.standard_normal((batch, 2, hw, hw)), rng.standard_normal((batch, 2, 7))
        out = exe.run(x=x, s=s)
        loss = f(of.tensor(x), of.tensor(s))["loss"]
        np.testing.assert_allclose(out["loss"], loss.numpy(), rtol=1e-12)
        for name, g in zip(prog.parameters(), of.grad(loss, [w, b, w1])):
            np.testing.assert_allclose(out[f"{name}@GRAD"], g.numpy(), rtol=1e-12, atol=1e-14)


# -- the benchmark runs ----------------------------------------------------------------------------------------------


def test_bench_conv_softmax_quick_runs():
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "bench" / "conv_softmax.py"), "--quick"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "| conv2d 128×1×8×8" in done.stdout and "opforge / numpy" in done.stdout
