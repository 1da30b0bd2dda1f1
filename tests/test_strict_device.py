"""The library on a device whose arrays are not host arrays: ``opforge.testing.strict``, which follows CuPy 14's
rules at the host boundary (no GPU needed). Every registered op must pass ``check_op`` there and compute what it
computes on the CPU, forward and backward; training, checkpoints and the DataLoader must stay on the device and
read it back at most twice per steady training step.

An op that fails here names its leak in the failure: the conformance report's first lines carry the error the
strict device raised (``StrictHostError``: a host array met a device one, or a kernel returned a host array;
``TypeError: Implicit conversion to a NumPy array``: ``np.asarray`` on a device array; ``NotImplementedError``:
something CuPy does not have). ``strict.NOT_YET_CLEAN`` lists the ops known to leak, and where (each test of such
an op fails, strictly, until the op is fixed and its line deleted)."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.core.opdef import registry
from opforge.testing import strict
from opforge.testing.devices import compare_with_cpu

STRICT = strict.DEVICE

NOT_YET_CLEAN = strict.NOT_YET_CLEAN


def _marked(names, eager=False):
    """The names, those of NOT_YET_CLEAN marked to fail (for the eager test, not those failing check_op alone)."""
    leaks = {n: r for n, r in NOT_YET_CLEAN.items() if not (eager and r.startswith("check_op:"))}
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=leaks[n])) if n in leaks else n
            for n in names]


ALL_OPS = sorted(op.name for op in registry)


@pytest.mark.parametrize("name", _marked(ALL_OPS))
def test_every_registered_op_conforms_on_the_strict_device(name):
    report = of.testing.check_op(name, device="strict", raise_on_failure=False)
    assert report.samples > 0
    assert not report.failures, f"op '{name}' on the strict device:\n" + "\n".join(report.failures[:4])


# -- every op, eagerly, forward and backward, against the CPU --------------------------------------------------------

@pytest.mark.parametrize("name", _marked(ALL_OPS, eager=True))
def test_every_op_computes_on_the_strict_device_what_it_computes_on_the_cpu(name):
    differences = compare_with_cpu(name, "strict", order=1, rtol=1e-12, atol=1e-12)
    assert not differences, "\n".join(differences[:6])


# -- training on the device --------------------------------------------------------------------------------------------

DIGITS = load_digits()
X = (DIGITS.images / 16.0)[:128, None]
Y = DIGITS.target[:128].astype(np.int64)


def _model(kind):
    of.manual_seed(0)
    if kind == "cnn":  # the demo's digits CNN (its layers with ReLU: the demo's Softsign is an example's op)
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, dtype="float64"), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1, dtype="float64"), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(16 * 2 * 2, 10, dtype="float64"))
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32, dtype="float64"), nn.Tanh(),
                         nn.Linear(32, 10, dtype="float64"))


def _training(kind, optimizer, device, compiled):
    model = _model(kind).to(device)
    if optimizer == "sgd":
        opt = of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    else:
        opt = of.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return model, opt, of.compile(step) if compiled else step


def _batches(device, n=3, size=32):
    return [(of.tensor(X[i * size:(i + 1) * size], device=device), of.tensor(Y[i * size:(i + 1) * size],
                                                                               device=device)) for i in range(n)]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("kind, optimizer", [("mlp", "sgd"), ("mlp", "adam"), ("cnn", "sgd"), ("cnn", "adam")])
def test_training_on_the_strict_device_equals_the_cpu_run(kind, optimizer, compiled):
    runs = {}
    for device in ("cpu", "strict"):
        model, _, step = _training(kind, optimizer, device, compiled)
        losses = [step(x, y) for x, y in _batches(device)]
        assert all(loss.device == device for loss in losses)
        assert all(p.device == device for p in model.parameters())
        runs[device] = [loss.item() for loss in losses], {k: v.cpu().numpy() for k, v in model.state_dict().items()}
    np.testing.assert_allclose(runs["strict"][0], runs["cpu"][0], rtol=0, atol=1e-10)
    for name, want in runs["cpu"][1].items():
        np.testing.assert_allclose(runs["strict"][1][name], want, rtol=0, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("kind, optimizer", [("mlp", "sgd"), ("mlp", "adam"), ("cnn", "sgd"), ("cnn", "adam")])
def test_a_steady_training_step_reads_the_device_at_most_twice(kind, optimizer, compiled):
    _, _, step = _training(kind, optimizer, "strict", compiled)
    batches = _batches("strict", n=4)
    for x, y in batches[:3]:  # warm: optimizer state made, the program traced
        step(x, y)
    with strict.SYNCS as syncs:
        before = syncs.count
        step(*batches[3]).item()  # the loss the user asks for is one read
        reads = syncs.count - before
        assert reads <= 2, f"a steady step read the device {reads} times: {syncs.recording}"


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_an_optimizers_state_dict_round_trip_on_the_strict_device(optimizer):
    """Saved after two steps and loaded into a fresh optimizer, the third step is the one the first would take."""
    model, opt, step = _training("mlp", optimizer, "strict", compiled=False)
    batches = _batches("strict")
    for x, y in batches[:2]:
        step(x, y)
    saved = opt.state_dict()
    assert all(v.device == "strict" for s in saved["state"].values() for v in s.values())
    params = {k: v.cpu().numpy() for k, v in model.state_dict().items()}
    want = step(*batches[2]).item()
    model2, opt2, step2 = _training("mlp", optimizer, "strict", compiled=False)
    model2.load_state_dict({k: of.tensor(v, device="strict") for k, v in params.items()})
    opt2.load_state_dict(saved)
    assert step2(*batches[2]).item() == want
    for (name, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        np.testing.assert_array_equal(b.cpu().numpy(), a.cpu().numpy(), err_msg=name)


def test_a_checkpoint_of_device_tensors_saves_and_loads(tmp_path):
    model, opt, step = _training("cnn", "adam", "strict", compiled=False)
    step(*_batches("strict")[0])
    of.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.npz")
    back = of.load(tmp_path / "ckpt.npz", map_location="strict")
    for name, value in model.state_dict().items():
        assert back["model"][name].device == "strict"
        np.testing.assert_array_equal(back["model"][name].cpu().numpy(), value.cpu().numpy())
    model2, opt2, _ = _training("cnn", "adam", "strict", compiled=False)
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["opt"])
    assert all(p.device == "strict" for p in model2.parameters())


def test_a_dataloader_over_device_tensors_yields_device_batches():
    x, y = of.tensor(X[:10], device="strict"), of.tensor(Y[:10], device="strict")
    before = strict.SYNCS.count
    loader = of.data.DataLoader(of.data.TensorDataset(x, y), batch_size=4, shuffle=True, seed=0)
    batches = list(loader)
    assert strict.SYNCS.count == before  # no read on the way
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    assert all(t.device == "strict" for b in batches for t in b)
    order = np.concatenate([b[1].cpu().numpy() for b in batches])
    assert sorted(order.tolist()) == sorted(Y[:10].tolist())
    # a dataset's samples, collated by default_collate, stay there too
    collated = list(of.data.DataLoader(of.data.Subset(of.data.TensorDataset(x, y), range(6)), batch_size=3))
    assert all(t.device == "strict" for b in collated for t in b)
    np.testing.assert_array_equal(collated[1][0].cpu().numpy(), X[3:6])


@pytest.mark.parametrize("requires_grad", [False, True], ids=["plain", "recorded"])
def test_a_kernel_that_computes_on_the_host_is_refused_not_wrapped(scratch_ops, requires_grad):
    """Dispatch makes a kernel's result an array of the call's device: a host array there is a leak, refused,
    not kept inside a device tensor (dispatch once tested for np.ndarray, the host's type, and let it through)."""
    scratch_ops.append("host_leak_test")

    @of.op("host_leak_test(Tensor x) -> Tensor y", traits=["elementwise"])
    def host_leak_test(x):
        return np.zeros(x.shape, x.dtype)  # on the host, whatever x's device

    @host_leak_test.grad
    def _(dy):
        return dy

    x = of.tensor([1.0, 2.0], device="strict", requires_grad=requires_grad)
    with pytest.raises(strict.StrictHostError, match=r"returned a host numpy\.ndarray"):
        F.host_leak_test(x)


def test_a_kernel_for_every_device_widens_half_inputs_there_as_on_the_cpu():
    """Half inputs are computed in float32 and rounded once (ops/half.py) on every device, not only the CPU: a
    device looks up its dtype's kernel for every device before that kernel for any dtype, so an op whose kernel
    takes ``xp`` got none of it there (scatter_reduce's mean, in bfloat16, floor-divided: ml_dtypes' kind is 'V')."""
    rng = np.random.default_rng(0)
    x, src = rng.uniform(0.5, 2, (3, 4)), rng.uniform(0.5, 2, (2, 4))
    index = np.array([[0, 2, 2, 1], [2, 0, 2, 1]])
    for dtype in ("bfloat16", "float16"):
        got = {device: F.scatter_reduce(of.tensor(x, dtype=dtype, device=device), 0, of.tensor(index, device=device),
                                        of.tensor(src, dtype=dtype, device=device), "mean").cpu().numpy()
               for device in ("cpu", "strict")}
        np.testing.assert_array_equal(got["strict"].astype(np.float64), got["cpu"].astype(np.float64),
                                      err_msg=dtype)


@pytest.mark.parametrize("case", ["lu singular", "lu tall batch", "lu wide", "exp scaled batch", "exp large"])
def test_the_device_kernels_of_lu_and_matrix_exp_equal_the_cpus_on_hard_inputs(case):
    """The device's LU (partial pivoting in xp, column by column) and matrix exponential (scaling and squaring, Padé
    13, a scale per matrix) against the CPU's (SciPy's getrf and expm): zero pivots, batches whose norms need
    different numbers of squarings. Compared normwise (e^a of a large norm is as accurate as its largest entry),
    and e^a against mpmath's at 50 digits too: there SciPy's is off by 9e-12 of the largest entry on the matrix of
    norm ~100, the device's by 1e-14."""
    rng = np.random.default_rng(3)
    a = {"lu singular": lambda: np.array([[0.0, 1, 2], [0, 3, 4], [0, 5, 6]]),
         "lu tall batch": lambda: rng.standard_normal((3, 6, 4)), "lu wide": lambda: rng.standard_normal((2, 3, 5)),
         "exp scaled batch": lambda: rng.standard_normal((4, 5, 5)) * np.array([0.01, 1, 10, 40])[:, None, None],
         "exp large": lambda: rng.standard_normal((3, 3)) * 20}[case]()
    op = F.linalg_lu_factor if case.startswith("lu") else F.linalg_matrix_exp
    want, got = (op(of.tensor(a, device=device)) for device in ("cpu", "strict"))
    if case.startswith("exp"):
        mpmath = pytest.importorskip("mpmath")
        with mpmath.workdps(50):
            exact = np.array([np.array(mpmath.expm(mpmath.matrix(m.tolist())).tolist(), float)
                              for m in a.reshape(-1, *a.shape[-2:])]).reshape(a.shape)
        for g, e in zip(got.cpu().numpy().reshape(-1, *a.shape[-2:]), exact.reshape(-1, *a.shape[-2:])):
            assert np.abs(g - e).max() <= 1e-13 * np.abs(e).max()
    for w, g in zip(*((t if isinstance(t, tuple) else (t,)) for t in (want, got))):
        assert g.device == "strict"
        g, w = g.cpu().numpy(), w.numpy()
        assert np.abs(g - w).max() <= (1e-12 if case.startswith("lu") else 2e-11) * max(1.0, np.abs(w).max())


def test_max_unpool_keeps_the_later_of_repeated_places_on_the_device_too():
    """NumPy's assignment keeps the last of repeated places (torch's CPU kernel too); CuPy's leaves their order open,
    so the device's kernel picks, per place, the latest position sent there."""
    rng = np.random.default_rng(0)
    x, indices = rng.standard_normal((2, 3, 8)), rng.integers(0, 4, (2, 3, 8))  # 8 values into 4 places
    want, got = (F.max_unpool(of.tensor(x, device=d), of.tensor(indices, device=d), output_size=[4]).cpu().numpy()
                 for d in ("cpu", "strict"))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", [1, 32, 128])
def test_linear_on_the_device_takes_no_host_only_path(rows):
    """linear's few-rows path (float32, 8 to 64 rows, 256+ features: an OpenBLAS layout trick) allocated its result
    on the host and failed on CuPy's arrays (seen on a GPU): on a device it is the plain product, same values."""
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((rows, 512), (256, 512), (256,)))
    want = F.linear(of.tensor(x), of.tensor(w), of.tensor(b)).numpy()
    got = F.linear(*(of.tensor(a, device="strict") for a in (x, w, b))).cpu().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_cuda_kernels_written_against_xp_run_on_cupy_like_arrays():
    """The kernels registered for "cuda" that use only the array module (binary.py's arithmetic, calling CuPy's
    ufuncs directly), run where "cuda" is the strict device under that name: every dtype check_op tries, and the
    CPU's values. In a subprocess: "cuda" registered here would stand for a GPU in the other tests."""
    import subprocess
    import sys

    code = """
import numpy as np, opforge as of
from opforge.core.devices import register_device
from opforge.testing import strict
from opforge.testing.devices import compare_with_cpu
register_device("cuda", strict.xp, kernels_of="cpu", array_type=strict.StrictArray, cls=strict.StrictDevice)
for name in ("add", "sub", "mul", "div"):
    assert of.registry.get(name).find_kernel("cuda", np.dtype("float32")).device == "cuda", name
    report = of.testing.check_op(name, device="cuda", raise_on_failure=False)
    assert not report.failures, (name, report.failures[:3])
    assert compare_with_cpu(name, "cuda", order=2) == [], name
x = of.tensor([1, 2, 3], device="cuda")
assert (x / 2).dtype == of.float32 and (x / 2).cpu().tolist() == [0.5, 1.0, 1.5]
assert (x + of.tensor([0.5], device="cuda")).cpu().tolist() == [1.5, 2.5, 3.5]
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
