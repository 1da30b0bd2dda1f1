"""torch's call forms that are not an op's own signature (opforge/torch_forms.py, torch_functions.py, linalg.py,
the nn activations' ``inplace``): each call is written as a PyTorch program writes it, run through the mock and in
torch, and compared (values, dtypes, gradients), or must fail where torch fails."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opforge as of
from opforge import mock_torch

RNG = np.random.default_rng(7)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((2, 3, 4)).astype(np.float32)
SQ = RNG.standard_normal((2, 3, 3))
INTS = np.arange(-7, 8).reshape(3, 5)


def _value(v):
    if isinstance(v, (tuple, list)):
        return [_value(x) for x in v]
    if hasattr(v, "detach"):
        return np.asarray(v.detach().numpy())
    if "dtype" in type(v).__name__.lower() or str(v).startswith(("torch.", "opforge.")):
        return str(v).split(".")[-1]
    return v


def _same(ours, theirs, rtol=1e-6, atol=1e-7):
    if isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _same(a, b, rtol, atol)
    elif isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), ours
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), ((ours.dtype, ours.shape),
                                                                           (theirs.dtype, theirs.shape))
        np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol)
    else:
        assert ours == theirs


def _both(expression: str, **arrays):
    """The expression's value with torch, and with opforge through the mock (``torch``, ``F`` and the arrays as
    tensors in both)."""
    def run(lib, functional):
        env = {"torch": lib, "F": functional, "math": math}
        env.update({k: lib.tensor(v) for k, v in arrays.items()})
        return _value(eval(expression, env))

    theirs = run(torch, TF)
    with mock_torch.enable() as mocked:
        import torch.nn.functional as mocked_functional  # (the mock's, inside the block)

        ours = run(mocked, mocked_functional)
    return ours, theirs


FORMS = [
    # std/var: (dim, unbiased, keepdim), unbiased=, a lone unbiased, correction=
    "a.std(0, True)", "a.std(1, False, True)", "a.std(False)", "a.var(dim=1, unbiased=False)", "a.var(0, keepdim=True)",
    "torch.std(a, 1, True, True)", "torch.var(a, (0, 1), correction=0)", "a.std(unbiased=False)",
    # dtype= on reductions: the input cast first
    "a.sum(dtype=torch.float64)", "torch.sum(i, dtype=torch.float32)", "i.mean(dtype=torch.float64)",
    "a.prod(1, dtype=torch.float64)", "torch.cumsum(i, 0, dtype=torch.float32)",
    "a.cumprod(dim=1, dtype=torch.float64)", "a.nansum(dtype=torch.float64)",
    # norm: 'fro' (the default), numbers, 'nuc'
    "a.norm()", "a.norm(1)", "a.norm(dim=1)", "a.norm(p=2, dim=0, keepdim=True)", "torch.norm(a, p='fro')",
    "torch.norm(a, 'fro', (0, 1))", "a.norm(float('inf'), 1)", "a.norm('nuc')", "torch.norm(b, 'nuc', (1, 2))",
    "torch.norm(b, 'nuc', (2, 0), keepdim=True)", "a.norm(3, dtype=torch.float64)",
    # div's rounding modes
    "torch.div(i, 4, rounding_mode='floor')", "torch.div(i, 4, rounding_mode='trunc')",
    "i.div(-3, rounding_mode='trunc')",
    "torch.div(i, i[0].abs() + 1, rounding_mode='trunc')", "torch.div(a * 10, 3, rounding_mode='trunc')",
    "torch.div(a * 10, -3, rounding_mode='floor')", "torch.divide(i, 4)", "i.divide(4, rounding_mode='floor')",
    "torch.div(7, i[0].abs() + 1, rounding_mode='trunc')",
    # dot, clone, where(condition), allclose
    "torch.dot(a[0], a[1])", "a[0].dot(a[2])", "torch.clone(a)", "torch.where(a > 0)", "torch.where(i < 0, i, 0)",
    "torch.allclose(a, a + 1e-9)", "torch.allclose(a, a + 1)", "torch.allclose(a, a + 1, atol=2)",
    # repeat_interleave with a tensor of repeats; its one-argument form
    "a.repeat_interleave(torch.tensor([1, 2, 0]), dim=0)", "torch.repeat_interleave(a, torch.tensor(2))",
    "torch.repeat_interleave(torch.tensor([2, 0, 3]))", "a.repeat_interleave(2, 1, output_size=8)",
    # clamp_min/max, fliplr/flipud, movedim, swapaxes
    "torch.clamp_min(a, 0)", "a.clamp_max(0.1)", "torch.fliplr(a)", "torch.flipud(b)", "torch.movedim(b, 0, -1)",
    "b.movedim((0, 1), (2, 0))", "torch.moveaxis(b, [0, 2], [1, 0])", "b.swapaxes(0, 2)", "b.swapdims(-1, 1)",
    # dtype utilities
    "torch.result_type(i, 1.0)", "torch.result_type(a, i)", "torch.result_type(i, 2)", "torch.result_type(3.0, i)",
    "torch.promote_types(torch.int32, torch.float16)", "torch.promote_types(torch.bool, torch.int64)",
    "torch.can_cast(torch.float64, torch.int32)", "torch.can_cast(torch.int32, torch.float16)",
    "torch.can_cast(torch.bool, torch.int64)", "torch.can_cast(torch.int64, torch.bool)",
    # linspace / logspace (integers exactly; floats within rounding, see test_linspace...)
    "torch.linspace(0, 10, 5, dtype=torch.int64)", "torch.linspace(-7, 7, 6, dtype=torch.int64)",
    "torch.linspace(0, 1, 5)", "torch.linspace(2, 2, 1)", "torch.linspace(0, 1, 0)", "torch.logspace(0, 2, 3)",
    "torch.logspace(0, 3, 4, base=2.0)",
    # torch.linalg's norms and svdvals
    "torch.linalg.norm(a)", "torch.linalg.norm(a, 2)", "torch.linalg.norm(a[0], 3)", "torch.linalg.norm(a, 'nuc')",
    "torch.linalg.norm(b, dim=(1, 2))", "torch.linalg.norm(b, float('inf'), dim=2)", "torch.linalg.norm(a, -1)",
    "torch.linalg.norm(a, float('-inf'))", "torch.linalg.norm(a, dim=1, keepdim=True)",
    "torch.linalg.vector_norm(a, 2)", "torch.linalg.vector_norm(b, float('inf'), (0, 2))",
    "torch.linalg.vector_norm(a, 0)", "torch.linalg.vector_norm(a, 1, dim=0, dtype=torch.float64)",
    "torch.linalg.matrix_norm(sq)", "torch.linalg.matrix_norm(sq, 'nuc')", "torch.linalg.matrix_norm(sq, 2)",
    "torch.linalg.matrix_norm(sq, -2, keepdim=True)", "torch.linalg.matrix_norm(sq, 1)",
    "torch.linalg.matrix_norm(sq, float('-inf'))", "torch.linalg.matrix_norm(b, 1, dim=(0, 2))",
    "torch.linalg.svdvals(sq)",
    # torch.special's names for our ops
    "torch.special.expit(a)", "torch.special.logit(torch.sigmoid(a))", "torch.special.gammaln(a.abs() + 0.5)",
    "torch.special.psi(a.abs() + 0.5)", "torch.special.erfinv(a / 4)", "torch.special.xlogy(a.abs(), a.abs())",
    "torch.special.log_softmax(a, 1)", "torch.special.i0(a)",
    # the functional activations' inplace, positional or by name, and their _ forms
    "F.relu(a.clone(), inplace=True)", "F.relu(a.clone(), True)", "F.leaky_relu(a.clone(), 0.2, True)",
    "F.elu(a.clone(), 0.5, inplace=True)", "F.hardtanh(a.clone(), -0.5, 0.5, True)",
    "F.threshold(a.clone(), 0.1, 20.0, True)", "F.relu6(a * 5, inplace=False)", "F.silu(a.clone(), True)",
    "F.relu_(a.clone())", "F.leaky_relu_(a.clone(), 0.3)", "F.hardtanh_(a.clone(), 0.0, 0.2)",
]


@pytest.mark.parametrize("expression", FORMS)
def test_torchs_call_forms_mean_what_they_mean_in_torch(expression):
    ours, theirs = _both(expression, a=A, b=B, i=INTS, sq=SQ)
    _same(ours, theirs, rtol=2e-6, atol=1e-6)


REFUSED = [
    "torch.dot(a, a)",  # torch's dot takes 1-D tensors only (matmul takes the rest)
    "torch.dot(a[0], i[0, :4])",  # one dtype
    "torch.dot(a[0], a[0, :3])",
    "a.std(0, True, unbiased=False)",
    "torch.var(a, 0, True, correction=0)",
    "torch.div(a, 2, rounding_mode='round')",
    "torch.norm(a, 'max')",
    "torch.norm(b, 'nuc')",
    "torch.linalg.norm(b, 2)",
    "torch.linalg.matrix_norm(a, 3)",
    "torch.linalg.vector_norm(a, 'fro')",
    "torch.fliplr(a[0])",
    "torch.movedim(b, (0, 1), 2)",
    "torch.repeat_interleave(a, torch.tensor([1.5, 2.0, 1.0]), 0)",
    "torch.allclose(a, a.double())",
    "torch.where(a > 0, a)",
]


@pytest.mark.parametrize("expression", REFUSED)
def test_what_torch_refuses_is_refused(expression):
    with pytest.raises((RuntimeError, TypeError, ValueError, IndexError)):
        _both(expression, a=A, b=B, i=INTS)  # torch first: this checks that torch refuses it too
    with mock_torch.enable() as mocked:
        env = {"torch": mocked, "a": mocked.tensor(A), "b": mocked.tensor(B), "i": mocked.tensor(INTS)}
        with pytest.raises(of.OpforgeError):
            eval(expression, env)


def test_linspace_is_torchs_within_rounding_and_exact_at_both_ends():
    """torch's vectorised kernel rounds the inner points differently at vector boundaries; ours computes each in
    float64 (counted from the nearer end, as torch's scalar loop) and rounds once."""
    for start, end, steps in [(0, 1, 7), (-3.3, 7.1, 100), (1e-3, 1e3, 11), (5, -5, 13), (0.1, 0.7, 1000)]:
        for dtype in (torch.float32, torch.float64):
            theirs = torch.linspace(start, end, steps, dtype=dtype).numpy()
            ours = of.linspace(start, end, steps, dtype=of.float32 if dtype is torch.float32 else of.float64).numpy()
            assert ours.dtype == theirs.dtype and ours[0] == theirs[0] and ours[-1] == theirs[-1]
            np.testing.assert_allclose(ours, theirs, rtol=2 * np.finfo(ours.dtype).eps,
                                       atol=4 * np.finfo(ours.dtype).eps * max(abs(start), abs(end)))


@pytest.mark.parametrize("expression", [
    "torch.linalg.norm(w)", "torch.linalg.norm(w, 'nuc')", "torch.linalg.matrix_norm(w, 2)",
    "torch.linalg.matrix_norm(w, 1)", "torch.linalg.matrix_norm(w, float('inf'))", "torch.linalg.vector_norm(w, 3)",
    "w.norm('nuc')", "w.norm(dim=1).sum()", "w.std(0, True).sum()", "w.var(1, False).sum()",
    "torch.linalg.svdvals(w).sum()", "torch.div(w, 3, rounding_mode='trunc').sum() + w.sum()",
    "F.relu(w * 1, inplace=True).sum()", "F.leaky_relu(w * 2, 0.1, True).pow(2).sum()",
])
def test_gradients_through_the_forms_are_torchs(expression):
    w0 = RNG.standard_normal((4, 3))
    grads = []
    for lib, functional in ((torch, TF), (None, None)):
        if lib is None:
            with mock_torch.enable() as lib:
                import torch.nn.functional as functional

                w = lib.tensor(w0, requires_grad=True)
                lib_value = eval(expression, {"torch": lib, "F": functional, "w": w})
                lib_value.backward()
                grads.append((np.asarray(lib_value.detach().numpy()), w.grad.numpy()))
        else:
            w = lib.tensor(w0, requires_grad=True)
            value = eval(expression, {"torch": lib, "F": functional, "w": w})
            value.backward()
            grads.append((value.detach().numpy(), w.grad.numpy()))
    (v_ours, g_ours), (v_theirs, g_theirs) = grads[1], grads[0]
    np.testing.assert_allclose(v_ours, v_theirs, rtol=1e-10)
    np.testing.assert_allclose(g_ours, g_theirs, rtol=1e-9, atol=1e-12)


def test_in_place_activation_modules_write_into_their_input_and_train_as_torchs():
    """nn.ReLU(inplace=True) and kin (torchvision's models are full of them): the input holds the result, the module
    returns it, and a network using them trains to torch's numbers."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(inplace=True), torch.nn.Linear(8, 8),
                              torch.nn.LeakyReLU(0.1, inplace=True), torch.nn.Linear(8, 8),
                              torch.nn.Hardtanh(-0.5, 0.5, inplace=True), torch.nn.Linear(8, 3))
    state = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    x, y = RNG.standard_normal((16, 4)).astype(np.float32), RNG.integers(0, 3, 16)
    losses = []
    for lib in (torch, None):
        if lib is None:
            ctx = mock_torch.enable()
            lib = ctx.__enter__()
            model = lib.nn.Sequential(lib.nn.Linear(4, 8), lib.nn.ReLU(inplace=True), lib.nn.Linear(8, 8),
                                      lib.nn.LeakyReLU(0.1, inplace=True), lib.nn.Linear(8, 8),
                                      lib.nn.Hardtanh(-0.5, 0.5, inplace=True), lib.nn.Linear(8, 3))
            model.load_state_dict({k: lib.tensor(v) for k, v in state.items()})
        else:
            ctx, model = None, net
        try:
            opt = lib.optim.SGD(model.parameters(), lr=0.1)
            run = []
            for _ in range(5):
                opt.zero_grad()
                loss = lib.nn.functional.cross_entropy(model(lib.tensor(x)), lib.tensor(y))
                loss.backward()
                opt.step()
                run.append(float(loss.item()))
            losses.append(run)
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    relu = of.nn.ReLU(inplace=True)
    t = of.tensor([-1.0, 2.0])
    assert relu(t) is t and t.tolist() == [0.0, 2.0] and "inplace=True" in repr(relu)
    with pytest.raises(TypeError):
        of.nn.Tanh(inplace=True)  # torch's Tanh takes no inplace either


@pytest.mark.parametrize("expression", [
    "F.affine_grid(t2, (2, 3, 4, 5), align_corners=False)", "F.affine_grid(t2, (2, 1, 1, 3), align_corners=True)",
    "F.affine_grid(t3, (2, 1, 2, 3, 4), align_corners=False)", "F.affine_grid(t3, [2, 2, 3, 1, 2], align_corners=True)",
    "F.grid_sample(img, F.affine_grid(t2, (2, 3, 4, 5), align_corners=False), align_corners=False)",
    "F.pdist(m)", "F.pdist(m, 1.0)", "F.pdist(m, float('inf'))", "F.channel_shuffle(img, 3)",
    "torch.nn.ChannelShuffle(3)(img)", "torch.nn.ZeroPad2d(1)(img)", "torch.nn.ZeroPad2d((1, 0, 2, 3))(img)",
    "torch.nn.ConstantPad1d((1, 2), 3.5)(img[0])", "torch.nn.ConstantPad3d(1, -1.0)(img[None])",
    "torch.nn.ReflectionPad1d(2)(img[0])", "torch.nn.ReflectionPad2d((1, 2, 0, 1))(img)",
    "torch.nn.ReplicationPad2d(2)(img)", "torch.nn.ReplicationPad3d(1)(img[None])", "torch.nn.CircularPad1d(1)(img[0])",
    "torch.nn.CircularPad2d((1, 1, 2, 0))(img)", "m[:3, :3].inverse()", "m[:3, :3].det()",
])
@pytest.mark.filterwarnings("ignore:Since version 1.3.0, affine_grid")  # torch's note on unit-size grids
def test_functional_forms_and_layers_added_for_torch_programs(expression):
    rng = np.random.default_rng(3)
    arrays = {"t2": rng.standard_normal((2, 2, 3)), "t3": rng.standard_normal((2, 3, 4)),
              "img": rng.standard_normal((2, 6, 4, 5)), "m": rng.standard_normal((5, 3))}
    ours, theirs = _both(expression, **arrays)
    _same(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("expression", [
    "F.affine_grid(w, (2, 1, 3, 4), align_corners=False).pow(2).sum()",
    "F.grid_sample(img, F.affine_grid(w, (2, 3, 3, 4), align_corners=True), align_corners=True).sum()",
    "F.pdist(img[0, 0]).sum()", "F.pdist(img[0, 0], 3.0).sum()", "(F.channel_shuffle(img, 3) * img).sum()",
])
def test_gradients_of_the_functional_forms_are_torchs(expression):
    rng = np.random.default_rng(4)
    theta, image = rng.standard_normal((2, 2, 3)), rng.standard_normal((2, 6, 4, 5))
    results = []
    for mocked in (False, True):
        ctx = mock_torch.enable() if mocked else None
        lib = ctx.__enter__() if mocked else torch
        try:
            functional = lib.nn.functional
            w, img = lib.tensor(theta, requires_grad=True), lib.tensor(image, requires_grad=True)
            value = eval(expression, {"torch": lib, "F": functional, "w": w, "img": img})
            value.backward()
            results.append([value.detach().numpy(), *(np.zeros_like(a) if t.grad is None else t.grad.numpy()
                                                     for t, a in ((w, theta), (img, image)))])
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
    for ours, theirs in zip(results[1], results[0]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)


def test_padding_layers_and_functional_forms_refuse_bad_input_by_name():
    with pytest.raises(of.ArgumentError, match=r"ZeroPad2d\(\): padding must be an int or 4 ints"):
        of.nn.ZeroPad2d((1, 2))
    with pytest.raises(of.ShapeError, match=r"ReflectionPad2d: expects a 3-D or 4-D input"):
        of.nn.ReflectionPad2d(1)(of.zeros(2, 3))
    with pytest.raises(of.ShapeError, match=r"affine_grid\(\): theta must be a floating tensor of shape \(2, 2, 3\)"):
        of.ops.affine_grid(of.zeros(2, 3, 4), (2, 1, 3, 3))
    with pytest.raises(of.ShapeError, match=r"channel_shuffle\(\): expects \(N, C, \*\) with C divisible by groups=4"):
        of.ops.channel_shuffle(of.zeros(1, 6, 2), 4)
    with pytest.raises(of.ShapeError, match=r"pdist\(\): expects a 2-D input"):
        of.ops.pdist(of.zeros(3))
