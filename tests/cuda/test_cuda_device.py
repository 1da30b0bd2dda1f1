"""The device "cuda" on a real GPU (CuPy): every op conforms there and computes what it computes on the CPU, to the
second derivative; training runs to the CPU's numbers; tensors move on and off the GPU, and through DLPack without a
copy. Skipped where CuPy sees no GPU (conftest.py); ``make test-cuda`` runs these files."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.core.opdef import registry
from opforge.testing.devices import compare_with_cpu

ALL_OPS = sorted(op.name for op in registry)

# The ops whose results are defined up to a choice the two libraries make differently (LAPACK on the host, cuSOLVER
# on the GPU): each eigenvector's or singular vector's sign or phase, an ordering of equal values. check_op still
# checks them on the GPU (their gradients numerically, their shapes); the CPU comparison does not apply.
UP_TO_A_CHOICE = {"linalg_svd"}

# float64 on both devices; the GPU's transcendental functions and reduction orders are not NumPy's: relative
# differences of a few ulp, grown by the ops' conditioning through two derivatives
RTOL, ATOL = 1e-9, 1e-10


@pytest.mark.parametrize("name", ALL_OPS)
def test_every_registered_op_conforms_on_cuda(name):
    report = of.testing.check_op(name, device="cuda", raise_on_failure=False)
    assert report.samples > 0
    assert not report.failures, f"op '{name}' on cuda:\n" + "\n".join(report.failures[:4])


@pytest.mark.parametrize("name", [n for n in ALL_OPS if n not in UP_TO_A_CHOICE])
def test_every_op_computes_on_cuda_what_it_computes_on_the_cpu_to_the_second_derivative(name):
    differences = compare_with_cpu(name, "cuda", order=2, rtol=RTOL, atol=ATOL)
    assert not differences, "\n".join(differences[:6])


# -- tensors on the GPU --------------------------------------------------------------------------------------------


def test_tensors_move_to_the_gpu_and_back(cupy):
    x = of.tensor([[1.0, 2.0], [3.0, 4.0]], device="cuda")
    assert x.device == "cuda" and x.is_cuda and isinstance(x._data, cupy.ndarray)
    assert "device='cuda'" in repr(x)
    with pytest.raises(of.ArgumentError, match="cpu"):
        x.numpy()
    np.testing.assert_array_equal(x.cpu().numpy(), [[1.0, 2.0], [3.0, 4.0]])
    y = of.ones(2, 3, device="cuda:0")
    assert y.device == "cuda" and of.zeros_like(y).device == "cuda"
    z = of.tensor(np.arange(3.0)).to("cuda")
    assert z.device == "cuda" and z.cuda() is z and z.cpu().device == "cpu"
    assert of.tensor(cupy.arange(3.0), device="cuda").device == "cuda"  # a CuPy array, copied on the GPU
    w = of.tensor([1.0, 2.0], requires_grad=True)
    (w.to("cuda") * 3).sum().backward()  # the move is differentiable: the gradient comes back to the host
    assert w.grad.device == "cpu"
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 3.0])


def test_dlpack_shares_memory_with_torch_and_cupy_both_ways(cupy):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.arange(6, dtype=torch.float32, device="cuda")
    x = of.from_dlpack(t)
    assert x.device == "cuda" and x._data.data.ptr == t.data_ptr()
    back = torch.from_dlpack(x)
    assert back.data_ptr() == t.data_ptr()
    c = cupy.from_dlpack(x)
    c[0] = 42.0
    assert t[0].item() == 42.0  # one memory
    assert of.from_dlpack(cupy.ones(3)).device == "cuda"
    assert of.from_dlpack(torch.ones(2)).device == "cpu"


def test_random_ops_draw_on_the_gpu_repeatably(cupy):
    of.manual_seed(3)
    a = of.randn(4, 5, device="cuda")
    d = F.dropout(of.ones(1000, device="cuda"), p=0.5, training=True)
    of.manual_seed(3)
    b = of.randn(4, 5, device="cuda")
    e = F.dropout(of.ones(1000, device="cuda"), p=0.5, training=True)
    assert isinstance(a._data, cupy.ndarray)
    np.testing.assert_array_equal(a.cpu().numpy(), b.cpu().numpy())
    np.testing.assert_array_equal(d.cpu().numpy(), e.cpu().numpy())
    kept = float((d.cpu().numpy() != 0).mean())
    assert 0.4 < kept < 0.6


def test_a_users_cuda_kernel_wins_on_the_gpu(cupy, scratch_ops):
    scratch_ops.append("softsign_cuda_test")

    @of.op("softsign_cuda_test(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
    def softsign(x):
        return x / (1 + np.abs(x))

    kernel = cupy.ElementwiseKernel("T x", "T y", "y = x / (1 + abs(x))", "softsign_cuda_test")
    calls = []

    @softsign.kernel(device="cuda")
    def _(x):
        calls.append(1)
        return kernel(x)

    @softsign.grad
    def _(x, dy):
        return dy / (1 + F.abs(x)) ** 2

    x = np.linspace(-3, 3, 11)
    got = F.softsign_cuda_test(of.tensor(x, device="cuda")).cpu().numpy()
    assert calls == [1]
    np.testing.assert_allclose(got, x / (1 + np.abs(x)), rtol=1e-15)
    assert compare_with_cpu("softsign_cuda_test", "cuda", order=2, rtol=RTOL, atol=ATOL) == []


# -- training on the GPU ----------------------------------------------------------------------------------------------

DIGITS = load_digits()
X = (DIGITS.images / 16.0)[:256, None]
Y = DIGITS.target[:256].astype(np.int64)


def _model(kind, dtype):
    of.manual_seed(0)
    if kind == "cnn":  # the demo's digits CNN
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(16 * 2 * 2, 10, dtype=dtype))
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64, dtype=dtype), nn.GELU(), nn.LayerNorm(64, dtype=dtype),
                         nn.Linear(64, 10, dtype=dtype))


def _train(kind, optimizer, device, compiled, dtype="float64", steps=8):
    model = _model(kind, dtype).to(device)
    opt = (of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
           if optimizer == "sgd" else of.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2))

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    run = of.compile(step) if compiled else step
    losses = []
    for i in range(steps):
        s = slice(32 * (i % 8), 32 * (i % 8 + 1))
        losses.append(run(of.tensor(X[s], dtype=dtype, device=device), of.tensor(Y[s], device=device)))
    assert all(p.device == device for p in model.parameters())
    assert all(v.device == device for s in opt.state_dict()["state"].values() for v in s.values()
               if isinstance(v, of.Tensor))
    return [loss.item() for loss in losses], {k: v.cpu().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("kind, optimizer", [("mlp", "sgd"), ("mlp", "adamw"), ("cnn", "sgd"), ("cnn", "adamw")])
def test_training_on_cuda_equals_the_cpu_run(kind, optimizer, compiled):
    cpu_losses, cpu_params = _train(kind, optimizer, "cpu", compiled)
    gpu_losses, gpu_params = _train(kind, optimizer, "cuda", compiled)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-9)
    for name, want in cpu_params.items():
        np.testing.assert_allclose(gpu_params[name], want, rtol=1e-8, atol=1e-10, err_msg=name)


def test_float32_training_on_cuda_follows_the_cpu_and_compiled_follows_eager():
    eager, _ = _train("cnn", "adamw", "cuda", False, "float32", steps=16)
    compiled, _ = _train("cnn", "adamw", "cuda", True, "float32", steps=16)
    cpu, _ = _train("cnn", "adamw", "cpu", False, "float32", steps=16)
    np.testing.assert_allclose(compiled, eager, rtol=1e-4)
    np.testing.assert_allclose(eager, cpu, rtol=1e-3)
    assert eager[-1] < eager[0]


def test_a_model_moved_to_cuda_keeps_its_optimizer_state():
    model = _model("mlp", "float64")
    opt = of.optim.Adam(model.parameters(), lr=1e-3)
    x, y = of.tensor(X[:32]), of.tensor(Y[:32])
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    model.to("cuda")
    loss = F.cross_entropy(model(x.to("cuda")), y.to("cuda"))
    loss.backward()
    opt.step()
    assert all(v.device == "cuda" for s in opt.state_dict()["state"].values() for v in s.values()
               if isinstance(v, of.Tensor) and v.ndim > 0)


def test_the_char_transformer_example_trains_on_cuda(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "examples" / "char_transformer.py"), "--device", "cuda",
                           "--steps", "150", "--sample", "40"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_the_readmes_cuda_kernel_runs_and_agrees_with_the_cpu():
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = "\n".join(re.findall(r"```python\n(.*?)```", (root / "README.md").read_text(), re.S))
    code += """
import numpy as np
from opforge.testing import compare_with_cpu
assert my_leaky_relu.find_kernel("cuda", np.dtype("float32")).device == "cuda"
assert compare_with_cpu("my_leaky_relu", "cuda", order=2, rtol=1e-12, atol=1e-12) == []
print("cuda kernel ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0 and "cuda kernel ok" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
