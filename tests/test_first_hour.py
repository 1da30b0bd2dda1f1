"""The first hour of a PyTorch user (issue 14): the methods, operators, helpers, containers, schedules and devices
they reach for at once behave as their PyTorch namesakes (PyTorch is the oracle where it has them)."""

from __future__ import annotations

import inspect
import pydoc
import types

import numpy as np
import pytest
import torch

import opforge as of
from opforge import nn
from opforge import ops as F

TWIN = of.register_device("twin", kernels_of="cpu")  # NumPy under another name: a second device for the tests


def pair(values, dtype=None, requires_grad=False):
    """The same values as an opforge and a torch tensor."""
    array = np.asarray(values) if dtype is None else np.asarray(values, dtype=dtype)
    return (of.tensor(array, requires_grad=requires_grad),
            torch.tensor(array, requires_grad=requires_grad))


def same(ours, theirs):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
    assert np.asarray(ours).dtype == theirs.dtype
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-12)


def test_tensor_methods_as_in_pytorch():
    x, t = pair(np.arange(12.0).reshape(3, 4) - 5)
    same(x.view(4, 3), t.view(4, 3))
    same(x.view(-1), t.view(-1))
    same(x.unsqueeze(1), t.unsqueeze(1))
    same(x.argmax(), t.argmax())
    same(x.argmax(axis=1), t.argmax(dim=1))
    same(x.max(), t.max())
    same(x.min(dim=0).values, t.min(dim=0).values)  # min(dim) and max(dim) give (values, indices), as in torch
    same(x.max(1)[1], t.max(1)[1])
    same(x.amin(axis=0), t.amin(dim=0))  # the values alone
    same(x.clamp(-2, 3), t.clamp(-2, 3))
    same(x.clamp(min=0), t.clamp(min=0))
    same(x.long(), t.long())
    same(x.float(), t.float())
    same(x.double(), t.double())
    same(x.to(of.float32), t.to(torch.float32))
    assert x.numel() == t.numel() == 12 and x.size() == tuple(t.size()) and x.size(1) == t.size(1) == 4
    assert x.size == 12 and x.size * 2 == 24  # NumPy's reading of size still holds
    assert x.item() if x.numel() == 1 else True
    assert of.tensor([2.5]).item() == 2.5
    clone = x.clone()
    clone.add_(1)
    assert x.numpy()[0, 0] == -5 and clone.numpy()[0, 0] == -4  # a copy
    assert x.to(x.dtype) is x and x.cpu() is x  # nothing to change: the same tensor, as in PyTorch


def test_operators_as_in_pytorch():
    a, ta = pair([7, -7, 5, -5])
    b, tb = pair([3, 3, -2, -2])
    same(a % b, ta % tb)
    same(a // b, ta // tb)
    same(a & b, ta & tb)
    same(a | b, ta | tb)
    same(~a, ~ta)
    same(a % 4, ta % 4)
    same(10 // b, 10 // tb)
    m, tm = pair([True, False, True])
    n, tn = pair([True, True, False])
    same(m & n, tm & tn), same(m | n, tm | tn), same(~m, ~tm)
    x, tx = pair([5.5, -5.5], requires_grad=True)
    (x % 2.0).sum().backward()
    (tx % 2.0).sum().backward()
    same(x.grad, tx.grad)


def test_format_a_0d_tensor():
    loss = of.tensor(0.123456)
    assert f"{loss:.4f}" == "0.1235" and format(loss, ".2e") == "1.23e-01"
    assert f"{loss}" == str(loss)
    with pytest.raises(TypeError, match="only 0-d tensors format as numbers"):
        format(of.ones(2), ".4f")


def test_cat_stack_and_likes():
    a, b = of.ones(2, 3), of.zeros(2, 3)
    assert of.cat([a, b]).shape == (4, 3) and of.cat([a, b], axis=1).shape == (2, 6)
    assert of.stack([a, b]).shape == (2, 2, 3)
    assert of.zeros_like(a).numpy().tolist() == [[0.0] * 3] * 2 and of.ones_like(b, dtype="int64").dtype == of.int64
    a.requires_grad_()
    F.sum(of.cat([a, a]) * 2).backward()
    assert a.grad.numpy().tolist() == [[4.0] * 3] * 2


def test_dim_is_axis_where_torch_has_it_and_refused_with_the_name_to_use_elsewhere():
    x = of.ones(2, 3)
    assert x.sum(dim=1).shape == (2,) and F.mean(x, dim=0).shape == (3,) and of.cat([x, x], dim=1).shape == (2, 6)
    assert x.argmax(dim=1).shape == (2,) and x.unsqueeze(dim=0).shape == (1, 2, 3)
    assert F.sum(x, axis=0, keepdims=True).shape == (1, 3)  # torch takes NumPy's keepdims= too
    with pytest.raises(of.ArgumentError, match=r"all_gather\(\): no argument 'dim'.*axis="):
        F.all_gather(x, dim=0)  # a collective: torch.distributed has no dim= there


def test_grad_assignment_is_checked():
    w = of.ones(2, 3, requires_grad=True)
    w.grad = of.zeros(2, 3)
    for bad in (of.zeros(3, 2), of.zeros(2, 3, dtype="float64"), of.zeros(2, 3, device="twin"), np.zeros((2, 3))):
        with pytest.raises(of.ArgumentError, match=r"assigning \.grad: a tensor of shape \(2, 3\)"):
            w.grad = bad
    w.grad = None


def test_retain_grad_and_hooks():
    x, tx = pair([1.0, -2.0, 3.0], requires_grad=True)
    results = []
    for t in (x, tx):
        h = t * 2
        h.retain_grad()
        seen = []
        h.register_hook(lambda g, seen=seen: seen.append(g) or g * 10)  # replaces the gradient flowing on
        t.register_hook(lambda g: g + 1)  # a leaf's hook: before .grad takes it
        y = (h * h).sum()
        y.backward()
        results.append((h.grad, t.grad, seen[0]))
    for ours, theirs in zip(*results):
        same(ours, theirs)


def _to_double(g):
    return g.double()


@pytest.mark.parametrize(("hook", "torch_says"), [
    (lambda g: g.sum(), "changed the size of value"),
    (_to_double, "changed the type of value"),
    (lambda g: g.numpy(), "expected Variable, but hook returned"),
], ids=["shape", "dtype", "array"])
@pytest.mark.parametrize("where", ["leaf", "non-leaf", "leaf, of.grad"])
def test_a_hook_that_changes_the_gradients_shape_or_dtype_is_refused_naming_it(hook, torch_says, where):
    # It left a () .grad on a (3,) tensor (issue 30); torch refuses, naming the hook.
    results = []
    for t in pair([1.0, -2.0, 3.0], dtype=np.float32, requires_grad=True):
        h = t if where.startswith("leaf") else t * 2
        h.register_hook(hook)
        y = (h * h).sum()
        try:
            of.grad(y, [t]) if where == "leaf, of.grad" and isinstance(t, of.Tensor) else y.backward()
        except Exception as e:  # both frameworks' errors are compared below
            results.append(e)
    ours, theirs = results
    assert torch_says in str(theirs)
    name = hook.__qualname__
    assert isinstance(ours, of.GradientError) and f"hook {name!r} (defined at {__file__}:" in str(ours)
    assert "a hook returns None (keep the gradient) or a Tensor of the gradient's shape, dtype and device" in str(ours)


def test_module_dict_and_functional():
    import opforge.nn.functional as nnF

    from opforge.nn import functional

    assert nnF is F is functional
    heads = nn.ModuleDict({"a": nn.Linear(2, 3), "b": nn.Linear(2, 1)})
    heads["c"] = nn.Identity()
    assert list(heads) == ["a", "b", "c"] and len(heads) == 3 and "b" in heads
    assert [n for n, _ in heads.named_parameters()] == ["a.weight", "a.bias", "b.weight", "b.bias"]
    del heads["b"]
    assert list(heads.keys()) == ["a", "c"]


def test_schedulers_follow_torch():
    def run(make_ours, make_theirs, metrics=None):
        p, tp = of.tensor([1.0], requires_grad=True), torch.tensor([1.0], requires_grad=True)
        opt, topt = of.optim.SGD([p], lr=0.5), torch.optim.SGD([tp], lr=0.5)
        ours, theirs = make_ours(opt), make_theirs(topt)
        for epoch in range(12):
            assert opt.param_groups[0]["lr"] == pytest.approx(topt.param_groups[0]["lr"], rel=1e-12), epoch
            topt.step()
            if metrics is None:
                ours.step(), theirs.step()
            else:
                ours.step(metrics[epoch]), theirs.step(metrics[epoch])

    run(lambda o: of.optim.LambdaLR(o, lambda e: 0.9 ** e),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.9 ** e))
    run(lambda o: of.optim.LinearLR(o, start_factor=0.1, total_iters=5),
        lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=5))
    losses = [1.0, 0.9, 0.95, 0.96, 0.97, 0.8, 0.81, 0.82, 0.83, 0.84, 0.85, 0.86]
    for kw in ({"patience": 2}, {"patience": 1, "cooldown": 2, "factor": 0.5, "min_lr": 0.1},
               {"mode": "max", "patience": 0, "threshold_mode": "abs", "threshold": 0.05}):
        run(lambda o, kw=kw: of.optim.ReduceLROnPlateau(o, **kw),
            lambda o, kw=kw: torch.optim.lr_scheduler.ReduceLROnPlateau(o, **kw), losses)


def test_optimizers_skip_frozen_parameters():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    model[0].requires_grad_(False)  # frozen, yet handed to the optimizer, as PyTorch allows
    opt = of.optim.Adam(model.parameters(), lr=0.1)
    frozen, head = model[0].weight.numpy().copy(), model[1].weight.numpy().copy()

    def step(x):
        loss = F.sum(model(x))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for fn in (step, of.compile(step)):
        fn(of.ones(2, 3))
        assert np.array_equal(model[0].weight.numpy(), frozen) and model[0].weight.grad is None
        assert not np.array_equal(model[1].weight.numpy(), head)
        head = model[1].weight.numpy().copy()


@of.op("documented_scale(Tensor<floating> x, *, float factor=2.0) -> Tensor y", traits=["elementwise"])
def documented_scale(x, *, factor):
    """x times ``factor``."""
    return x * factor


@documented_scale.grad
def _(dy, *, factor):
    return dy * factor


def test_help_and_signature_of_an_op_show_the_op():
    sig = inspect.signature(documented_scale)
    assert list(sig.parameters) == ["x", "factor"] and sig.parameters["factor"].default == 2.0
    text = pydoc.render_doc(documented_scale, renderer=pydoc.plaintext)
    assert "documented_scale(x: 'Tensor', *, factor: 'float' = 2.0)" in text and "x times ``factor``" in text

    class Holder:
        act = documented_scale  # an op kept on a class is called as it is, with no self

    assert Holder().act(of.ones(2)).numpy().tolist() == [2.0, 2.0]


def test_programs_name_parameters_by_module_path():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    model.add_module("head", nn.Linear(4, 1))
    opt = of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x):
        loss = F.sum(model(x))
        loss.backward()
        opt.step()
        return loss

    text = str(of.compile(step).program(of.ones(2, 3)))
    for name in ("0.weight", "0.bias", "head.weight", "head.bias", "head.weight.momentum_buffer", "lr"):
        assert f"{name}: float" in text, name
    prog = of.trace(lambda x: {"loss": F.sum(model(x))}, x=of.Spec((None, 3), "float32"))
    grads = of.append_backward(prog, prog.outputs["loss"])
    out = of.Executor(prog).run(x=np.ones((2, 3), np.float32))
    assert set(grads) == {"0.weight@GRAD", "0.bias@GRAD", "head.weight@GRAD", "head.bias@GRAD"} <= set(out)


# -- devices (groundwork for CUDA, tested with a second device) --------------------------------------------------


def test_to_device_is_an_op_with_a_gradient():
    x = of.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x.to("twin")
    assert y.device is TWIN and y.grad_fn.op.name == "to_device" and not np.shares_memory(y.numpy(), x.numpy())
    F.sum(F.square(y)).cpu().backward()  # and back: the gradient is the copy back
    assert x.grad.device == "cpu" and x.grad.numpy().tolist() == [2.0, 4.0]
    (g,) = of.grad(F.sum(F.square(x.to(TWIN))), [x], create_graph=True)
    (h,) = of.grad(F.sum(g), [x])
    assert h.numpy().tolist() == [2.0, 2.0]
    with pytest.raises(of.ArgumentError, match="unknown device 'nowhere'"):
        x.to("nowhere") if False else F.to_device(x, device="nowhere")


def test_module_to_moves_in_place_and_the_optimizer_follows():
    def run(device, compiled):
        of.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 1))
        opt = of.optim.Adam(model.parameters(), lr=0.01)
        params = list(model.parameters())

        def step(x, y):
            loss = F.mean(F.square(model(x) - y))
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        fn = of.compile(step) if compiled else step
        rng = np.random.default_rng(0)
        data = [(rng.standard_normal((6, 3)).astype("float32"), rng.standard_normal((6, 1)).astype("float32"))
                for _ in range(4)]
        losses = [fn(of.tensor(x), of.tensor(y)).item() for x, y in data[:2]]  # two steps on the CPU
        model.to(device)  # then move, with an optimizer that holds state already
        assert list(model.parameters()) == params and all(p.device == device for p in params)
        assert all(b.device == device for b in model.buffers())
        losses += [fn(of.tensor(x, device=device), of.tensor(y, device=device)).item() for x, y in data[2:]]
        assert all(t.device == device for p in params for t in opt.state[p].values())
        return losses, [p.cpu().numpy() for p in params]

    reference = run("cpu", compiled=False)
    for compiled in (False, True):
        losses, values = run("twin", compiled)
        np.testing.assert_allclose(losses, reference[0], rtol=1e-5)
        for a, b in zip(values, reference[1]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


class Far(np.ndarray):
    """Arrays of a device that is not host memory (for the test: NumPy arrays of another type)."""


def test_numpy_on_a_device_that_is_not_the_host_says_to_call_cpu():
    xp = types.SimpleNamespace(asarray=lambda a, dtype=None: np.asarray(a, dtype).view(Far),
                               asnumpy=lambda a: np.asarray(a).view(np.ndarray).copy(), copyto=np.copyto,
                               random=np.random)
    of.register_device("far", xp=xp, array_type=Far, kernels_of="cpu")
    x = of.tensor([1.0, 2.0], device="far")
    with pytest.raises(of.ArgumentError, match=r"on device 'far', not in host memory; call \.cpu\(\) first"):
        x.numpy()
    assert x.cpu().numpy().tolist() == [1.0, 2.0] and (x * 2).tolist() == [2.0, 4.0]
