"""A second device that is NumPy under another name ("twin"): what works on "cpu" must work there — the whole
conformance suite, backward, create_graph, program mode — and nothing may fall back to "cpu" on the way."""

import types

import numpy as np
import pytest

import opforge as of
from opforge import nn
from opforge import ops as F

TWIN = of.register_device("twin", kernels_of="cpu")  # host arrays: the CPU kernels serve it
ALL_OPS = sorted(op.name for op in of.registry)


def twin(data, **kw):
    return of.tensor(data, device="twin", **kw)


@pytest.mark.parametrize("name", ALL_OPS)
def test_every_registered_op_conforms_on_a_second_device(name):
    report = of.testing.check_op(name, device="twin")
    assert report.samples > 0 and not report.failures


def test_a_tensor_carries_its_device_and_results_stay_on_it():
    x = twin([1.0, -2.0])
    assert x.device is TWIN and x.device == "twin" and str(x.device) == "twin"
    for y in (x + 1, 2.0 * x, F.exp(x), x[0], x[np.array([1, 0])], F.sum(x), F.split(F.reshape(x, shape=(2, 1)),
                                                                                         sections=2)[0]):
        assert y.device is TWIN
    assert "device='twin'" in repr(x)
    assert of.tensor([1.0]).device == "cpu"


def test_inputs_on_different_devices_are_refused_naming_the_op_and_both():
    with pytest.raises(of.ArgumentError, match=r"add\(\).*'x' is on 'cpu'.*'y' on 'twin'"):
        F.add(of.tensor([1.0]), twin([1.0]))
    with pytest.raises(of.ArgumentError, match=r"concat\(\).*different devices"):
        F.concat([of.tensor([1.0]), twin([1.0])])


def test_ops_without_inputs_run_on_the_default_or_the_given_device():
    assert of.zeros(2, device="twin").device is TWIN
    with of.using_device("twin"):
        assert of.randn(3).device is TWIN and of.arange(3).device is TWIN
    assert of.ones(2).device == "cpu"
    for make in (of.tril_indices, of.triu_indices):  # torch's device= (they are ops: the op's kernel serves twin)
        assert make(4, 3, -1, device="twin").device is TWIN
        np.testing.assert_array_equal(make(4, 3, -1, device="twin").numpy(), make(4, 3, -1).numpy())
    of.manual_seed(7)
    a = of.randn(4, device="twin").numpy().copy()
    of.manual_seed(7)
    b = of.randn(4, device="twin").numpy()
    assert np.array_equal(a, b)


def _mlp_loss(device):
    of.manual_seed(0)
    rng = np.random.default_rng(0)
    w1 = of.tensor(rng.standard_normal((3, 4)), device=device, requires_grad=True)
    w2 = of.tensor(rng.standard_normal((4, 2)), device=device, requires_grad=True)
    x = of.tensor(rng.standard_normal((5, 3)), device=device)
    h, _ = F.split(F.tanh(x @ w1), sections=[3, 1], axis=1)  # the second output gets no gradient: zeros
    loss = F.sum(F.square(F.concat([h, h[:, :1]], axis=1) @ w2))
    return loss, [w1, w2]


def test_backward_on_a_second_device_matches_the_cpu():
    loss, params = _mlp_loss("twin")
    loss.backward()
    ref_loss, ref_params = _mlp_loss("cpu")
    ref_loss.backward()
    for p, r in zip(params, ref_params):
        assert p.grad.device is TWIN
        np.testing.assert_array_equal(p.grad.numpy(), r.grad.numpy())


def test_higher_order_gradients_on_a_second_device():
    x = twin([0.5, -1.0, 2.0], dtype="float64", requires_grad=True)
    (g1,) = of.grad(F.tanh(x).sum(), [x], create_graph=True)
    (g2,) = of.grad(g1.sum(), [x], create_graph=True)
    (g3,) = of.grad(g2.sum(), [x])
    t = np.tanh([0.5, -1.0, 2.0])
    assert g3.device is TWIN
    np.testing.assert_allclose(g3.numpy(), -2 * (1 - t**2) ** 2 + 4 * t**2 * (1 - t**2), rtol=1e-12)


def test_compiled_training_on_a_second_device_equals_eager_on_the_cpu():
    def run(device, compiled):
        of.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
        if device != "cpu":  # parameters made on the host, placed on the device (no .to() yet: the issue of CUDA)
            for p in model.parameters():
                p._data, p._device = of.get_device(device).from_host(p._data, copy=True), of.get_device(device)
        opt = of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            loss = F.mean(F.square(model(x) - y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        step = of.compile(step) if compiled else step
        rng = np.random.default_rng(1)
        losses = []
        for _ in range(4):
            x, y = rng.standard_normal((6, 3)).astype("float32"), rng.standard_normal((6, 1)).astype("float32")
            out = step(of.tensor(x, device=device), of.tensor(y, device=device))
            assert out.device == device
            losses.append(out.item())
        return losses, [p.numpy().copy() for p in model.parameters()]

    cpu_losses, cpu_params = run("cpu", compiled=False)
    for compiled in (False, True):
        losses, params = run("twin", compiled)
        np.testing.assert_allclose(losses, cpu_losses, rtol=1e-6)
        for p, r in zip(params, cpu_params):
            np.testing.assert_allclose(p, r, rtol=1e-5, atol=1e-7)


def test_a_program_refuses_a_tensor_of_another_device():
    w = of.tensor([1.0, 2.0], requires_grad=True)  # on "cpu"
    with pytest.raises(of.ArgumentError, match="program for device 'twin' cannot read a tensor on device 'cpu'"):
        of.trace(lambda x: x * w, x=of.Spec((2,), "float32"), device="twin")


def test_a_kernel_that_names_xp_is_handed_its_devices_module(scratch_ops):
    calls = []

    def exp(a):
        calls.append("exp")
        return np.exp(a)

    module = types.SimpleNamespace(exp=exp, asarray=np.asarray, copyto=np.copyto, random=np.random)
    of.register_device("traced_xp", xp=module)  # a device of its own, with no CPU kernels to borrow
    scratch_ops.append("generic_exp")

    @of.op("generic_exp(Tensor x) -> Tensor y", traits=["elementwise"])
    def generic_exp(x, *, xp):
        return xp.exp(x)

    y = F.generic_exp(of.tensor([0.0, 1.0], device="traced_xp"))
    assert calls == ["exp"] and y.device == "traced_xp"
    np.testing.assert_allclose(y.numpy(), [1.0, np.e], rtol=1e-6)
    assert F.generic_exp(of.tensor([0.0])).numpy()[0] == 1.0  # on the CPU, xp is NumPy itself
    with pytest.raises(of.DispatchError, match=r"op 'relu' has no kernel for device 'traced_xp'.*cpu/any dtype"):
        F.relu(of.tensor([1.0], device="traced_xp"))


def test_a_kernel_for_a_device_wins_over_one_for_every_device(scratch_ops):
    scratch_ops.append("which_device")

    @of.op("which_device(Tensor x) -> Tensor y", traits=["elementwise"])
    def which_device(x, *, xp):
        return xp.zeros_like(x)

    @which_device.kernel(device="twin")
    def _(x):
        return np.ones_like(x)

    assert F.which_device(of.tensor([5.0])).item() == 0.0
    assert F.which_device(twin([5.0])).item() == 1.0


def test_compare_with_cpu_reads_second_derivatives_and_catches_a_wrong_device_kernel(scratch_ops):
    """``testing.compare_with_cpu`` (what tests/cuda runs for every op) compares outputs, gradients and second-order
    gradients: a device kernel whose gradient of gradient is wrong is found, one that agrees is not."""
    from opforge.testing.devices import compare_with_cpu

    assert compare_with_cpu("tanh", "twin", order=2) == []
    scratch_ops.append("cube_test")

    @of.op("cube_test(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
    def cube_test(x):
        return x * x * x

    @cube_test.kernel(device="twin")
    def _(x):
        return x * x * x + 1e-3  # off on the device only

    @cube_test.grad
    def _(x, dy):
        return dy * 3 * x * x

    differences = compare_with_cpu("cube_test", "twin", order=2)
    assert differences and "output 0" in differences[0]
