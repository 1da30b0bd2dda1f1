"""The dedicated CUDA kernels (opforge/ops/cuda_kernels.py) against the CPU's kernels, on a GPU (skipped elsewhere:
conftest.py): each op's result on "cuda" is compared with the same call on the CPU (float32 and float64, rows of 1,
rows of 1000+, a 2^20-element tensor), also written in place where the op takes ``out=``; the calls a kernel does
not cover are checked to run the generic kernel and give the same; a compiled training step runs them through the
executor. ``check_op`` of each op on "cuda" is test_cuda_device.py's (every op). Without a GPU,
tests/test_cuda_kernel_sources.py checks what can be: registration, fallbacks, the sources compiled with NVRTC.
A failure says which op, shape, dtype and attrs, how many elements differ and the worst one.
"""

import functools

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.core.opdef import registry
from opforge.ops import cuda_kernels as CK

DEVICE = "cuda"


# -- on a GPU: the CUDA kernels against the CPU ------------------------------------------------------------------

RTOL = {np.float32: 1e-5, np.float64: 1e-12}


def assert_close(what: str, got, want, *, exact: bool = False, scale: bool = False, terms: int = 1,
                 magnitude: float | None = None) -> None:
    """``got`` (cuda) against ``want`` (cpu): exactly (selects), else within rtol 1e-5 (float32) or 1e-12 (float64),
    widened for sums of many terms (``terms``: two orders of n float32 terms differ by ~√n ulps), and with
    ``scale`` an atol of rtol·max|want| (a result that is a difference, such as dy − Σ dy·y, loses digits to the
    size of its terms, not its own), or rtol·``magnitude`` where the terms' size is known and max|want| is not it."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: cuda gave {got.dtype} {got.shape}, the cpu {want.dtype} {want.shape}"
    if exact:
        differ = ~((got == want) | (np.isnan(got) & np.isnan(want)))
        if differ.any():
            at = tuple(int(i) for i in np.argwhere(differ)[0])
            pytest.fail(f"{what}: {int(differ.sum())} of {want.size} elements differ (exact expected); first at "
                        f"{at}: cuda {got[at]!r}, cpu {want[at]!r}")
        return
    rtol = RTOL[want.dtype.type]
    if want.dtype == np.float32:
        rtol = max(rtol, 4 * np.sqrt(terms) * float(np.finfo(np.float32).eps))
    finite = want[np.isfinite(want)]
    atol = rtol * float(np.abs(finite).max()) if scale and finite.size else 0.0
    if magnitude is not None:
        atol = max(atol, rtol * magnitude)
    differ = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if differ.any():
        error = np.where(differ, np.abs(got.astype(np.float64) - want), 0)
        at = np.unravel_index(int(np.nanargmax(error)), want.shape) if want.ndim else ()
        pytest.fail(f"{what}: {int(differ.sum())} of {want.size} elements differ beyond rtol={rtol:.3g} "
                    f"atol={atol:.3g}; worst at {at}: cuda {got[at]!r}, cpu {want[at]!r}")


def on(device, *arrays):
    return [None if a is None else of.tensor(a, device=device) for a in arrays]


def both(fn, *arrays):
    """fn on tensors of the arrays on cuda and on the CPU: the two results as NumPy arrays (tuples for several)."""
    results = []
    for device in (DEVICE, "cpu"):
        out = fn(*on(device, *arrays))
        results.append(tuple(o.cpu().numpy() for o in out) if isinstance(out, tuple) else out.cpu().numpy())
    return results


@pytest.fixture
def generic_calls(monkeypatch):
    """The names of the ops whose cuda kernel handed the call to the generic kernel."""
    calls = []
    original = CK._generic

    def spy(opdef, dtype):
        calls.append(opdef.name)
        return original(opdef, dtype)

    monkeypatch.setattr(CK, "_generic", spy)
    return calls


def _rng(*key):
    return np.random.default_rng(abs(hash(key)) % (1 << 32))


DTYPES = [np.float32, np.float64]
ELEMENTWISE_SHAPES = [(), (1,), (7,), (1000, 3), (1 << 20,)]
ROW_SHAPES = [(5, 1), (1, 7), (3, 1000), (64, 1025), (1024, 1024), (2, 3, 17)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES)
def test_activations(dtype, shape, generic_calls):
    rng = _rng("activations", shape)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    for alpha in (0.01, 1.5, float("nan")):
        got, want = both(lambda t, a=alpha: F.leaky_relu(t, alpha=a), x)
        assert_close(f"leaky_relu{shape} {dtype.__name__} alpha={alpha}", got, want, exact=True)
        got, want = both(lambda t, d, a=alpha: F.leaky_relu_grad(t, d, alpha=a), x, dy)
        assert_close(f"leaky_relu_grad{shape} {dtype.__name__} alpha={alpha}", got, want, exact=True)
    for approximate in ("none", "tanh"):
        got, want = both(lambda t, a=approximate: F.gelu(t, approximate=a), x)
        assert_close(f"gelu{shape} {dtype.__name__} {approximate}", got, want, scale=True)
        got, want = both(lambda t, d, a=approximate: F.gelu_grad(t, d, approximate=a), x, dy)
        assert_close(f"gelu_grad{shape} {dtype.__name__} {approximate}", got, want, scale=True)
    assert generic_calls == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_activations_at_special_values(dtype):
    # (a float32 subnormal is zero to every CuPy kernel, which CuPy compiles with -ftz=true: see the next test)
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45 if dtype == np.float64 else 1.0, -3.0, 40.0], dtype)
    dy = np.ones_like(x)
    for alpha in (0.01, 1.5, float("nan")):
        got, want = both(lambda t, a=alpha: F.leaky_relu(t, alpha=a), x)
        assert_close(f"leaky_relu(special) {dtype.__name__} alpha={alpha}", got, want, exact=True)
        got, want = both(lambda t, d, a=alpha: F.leaky_relu_grad(t, d, alpha=a), x, dy)
        assert_close(f"leaky_relu_grad(special) {dtype.__name__} alpha={alpha}", got, want, exact=True)
    for approximate in ("none", "tanh"):
        got, want = both(lambda t, a=approximate: F.gelu(t, approximate=a), x)
        assert_close(f"gelu(special) {dtype.__name__} {approximate}", got, want, scale=True)


def test_a_float32_subnormal_is_zero_on_the_gpu(cupy):
    """CuPy compiles every kernel, its own ufuncs included, with -ftz=true (cupy/cuda/compiler.py): a float32
    subnormal reads as zero on the GPU, where the CPU (and torch's CUDA kernels) keep it. Documented (README, "On a
    GPU"); this test says so, and fails if that changes."""
    x = of.tensor(np.array([1e-45, -1e-45], np.float32), device="cuda")
    got = F.leaky_relu_grad(x, of.ones_like(x), alpha=0.5).cpu().numpy()
    np.testing.assert_array_equal(got, [0.5, 0.5])  # x > 0 is false for a flushed 1e-45


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_grad_broadcasts(dtype, generic_calls):
    rng = _rng("gelu_grad broadcast")
    x, dy = rng.standard_normal((4, 1, 5)).astype(dtype), rng.standard_normal((3, 5)).astype(dtype)
    got, want = both(lambda t, d: F.gelu_grad(t, d), x, dy)
    assert_close(f"gelu_grad broadcast {dtype.__name__}", got, want, scale=True)
    assert generic_calls == []


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_softmax_rows(dtype, shape, generic_calls):
    rng = _rng("softmax", shape)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    n = shape[-1]
    for name in ("softmax", "log_softmax"):
        got, want = both(functools.partial(getattr(F, name), axis=-1), x)
        # (log_softmax's log Σ exp near 0 has an error of an ulp of the sum: scale)
        assert_close(f"{name}{shape} {dtype.__name__}", got, want, scale=name == "log_softmax", terms=n)
        y = want
        got, want = both(functools.partial(getattr(F, f"{name}_grad"), axis=-1), y, dy)
        assert_close(f"{name}_grad{shape} {dtype.__name__}", got, want, scale=True, terms=n)
    assert generic_calls == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_special_rows(dtype):
    """Rows with an infinity, a NaN, all −inf, huge values: the same NaN and 0 pattern as the CPU's."""
    x = np.array([[1.0, np.inf, 2.0], [np.nan, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [1e30, 1e30, -1e30],
                  [-1e4, -1e4 + 1, -1e4 + 2]], dtype)
    for name in ("softmax", "log_softmax"):
        got, want = both(functools.partial(getattr(F, name), axis=-1), x)
        assert_close(f"{name}(special rows) {dtype.__name__}", got, want, scale=name == "log_softmax", terms=3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_other_layouts_run_the_generic_kernel(dtype, generic_calls):
    rng = _rng("softmax fallback")
    x = rng.standard_normal((4, 6, 5)).astype(dtype)
    dy = rng.standard_normal((4, 6, 5)).astype(dtype)
    for name in ("softmax", "log_softmax"):
        for axis in (0, 1):
            got, want = both(functools.partial(getattr(F, name), axis=axis), x)
            assert_close(f"{name} axis={axis} {dtype.__name__}", got, want, scale=True)
            got, want = both(functools.partial(getattr(F, f"{name}_grad"), axis=axis), want, dy)
            assert_close(f"{name}_grad axis={axis} {dtype.__name__}", got, want, scale=True)
        softmax_like = getattr(F, name)
        got, want = both(lambda t, f=softmax_like: f(t.transpose(0, 2), -1), x)  # a strided view
        assert_close(f"{name} of a transposed view {dtype.__name__}", got, want, scale=True)
    assert set(generic_calls) == {"softmax", "log_softmax", "softmax_grad", "log_softmax_grad"}


def _inplace(op, dtype, arrays: dict, attrs: dict, target: str):
    """The op's cuda kernel called with out= the input ``target`` itself: its result (that array) as NumPy."""
    import cupy

    kernel = registry.get(op).find_kernel(DEVICE, np.dtype(dtype)).fn
    inputs = {k: None if v is None else cupy.asarray(v) for k, v in arrays.items()}
    result = kernel(*inputs.values(), **attrs, out=inputs[target])
    assert result is inputs[target], f"{op}: out= was not the array written"
    return cupy.asnumpy(result)


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_kernels_in_place(dtype):
    rng = _rng("inplace rows")
    x = rng.standard_normal((33, 1000)).astype(dtype)
    dy = rng.standard_normal((33, 1000)).astype(dtype)
    for name in ("softmax", "log_softmax"):
        want = getattr(F, name)(of.tensor(x), -1).numpy()
        got = _inplace(name, dtype, {"x": x}, {"axis": -1}, "x")
        assert_close(f"{name} into x {dtype.__name__}", got, want, scale=name == "log_softmax", terms=1000)
        grad = f"{name}_grad"
        want_grad = getattr(F, grad)(of.tensor(want), of.tensor(dy), axis=-1).numpy()
        target = "dy" if name == "softmax" else "y"  # the declared inplace input
        got = _inplace(grad, dtype, {"y": want, "dy": dy}, {"axis": -1}, target)
        assert_close(f"{grad} into {target} {dtype.__name__}", got, want_grad, scale=True, terms=1000)


CE_CASES = [((5, 1), None), ((1, 7), None), ((64, 10), None), ((3, 1000), None), ((1024, 1024), None),
            ((200, 33), "ignored"), ((50, 20), "all ignored")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape,targets", CE_CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_rows(dtype, index_dtype, shape, targets, reduction, generic_calls):
    rng = _rng("cross_entropy", shape, targets)
    rows, classes = shape
    logits = (rng.standard_normal(shape) * 3).astype(dtype)
    target = rng.integers(0, classes, rows).astype(index_dtype)
    ignore_index = -100
    if targets == "ignored":
        target[::3] = ignore_index
    elif targets == "all ignored":
        ignore_index = 2
        target[:] = 2
    attrs = {"ignore_index": ignore_index, "reduction": reduction}
    what = f"cross_entropy{shape} {dtype.__name__} {np.dtype(index_dtype).name} {targets or ''} {reduction}"
    got, want = both(lambda x, t: F.cross_entropy(x, t, **attrs), logits, target)
    assert_close(what, got, want, scale=True, terms=max(classes, rows))  # (log Σ exp near 0, as log_softmax)
    dloss = rng.standard_normal(rows if reduction == "none" else ()).astype(dtype)
    got, want = both(lambda x, t, d: F.cross_entropy_grad(x, t, d, **attrs), logits, target, dloss)
    # each row's gradient is s·softmax − s at the target (s = dloss, ÷ the count for "mean"): differences of terms of
    # size |s|, 0 in a row of one class
    counted = int(np.sum(target != ignore_index))
    s = float(np.abs(dloss).max()) / (max(counted, 1) if reduction == "mean" else 1)
    assert_close(what.replace("cross_entropy", "cross_entropy_grad"), got, want, scale=True, terms=classes,
                 magnitude=s)
    assert generic_calls == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_backward_through_autograd(dtype):
    rng = _rng("cross_entropy autograd")
    logits = (rng.standard_normal((128, 50)) * 2).astype(dtype)
    target = rng.integers(0, 50, 128)
    grads = {}
    for device in (DEVICE, "cpu"):
        x = of.tensor(logits, device=device, requires_grad=True)
        loss = F.cross_entropy(x, of.tensor(target, device=device))
        loss.backward()
        grads[device] = (loss.cpu().numpy(), x.grad.cpu().numpy())
    assert_close(f"cross_entropy loss {dtype.__name__}", grads[DEVICE][0], grads["cpu"][0], scale=True, terms=128)
    assert_close(f"cross_entropy d logits {dtype.__name__}", grads[DEVICE][1], grads["cpu"][1], scale=True, terms=50)


def test_cross_entropy_target_out_of_range_is_the_cpu_error():
    logits = np.zeros((4, 3), np.float32)
    target = np.array([0, 1, 7, 2])
    messages = []
    for device in (DEVICE, "cpu"):
        with pytest.raises(of.ArgumentError) as e:
            F.cross_entropy(*on(device, logits, target))
        messages.append(str(e.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_grad_in_place(dtype):
    rng = _rng("ce inplace")
    logits = rng.standard_normal((100, 37)).astype(dtype)
    target = rng.integers(0, 37, 100)
    dloss = np.array(1.5, dtype)
    attrs = {"ignore_index": -100, "reduction": "mean", "label_smoothing": 0.0}
    want = F.cross_entropy_grad(of.tensor(logits), of.tensor(target), of.tensor(dloss)).numpy()
    got = _inplace("cross_entropy_grad", dtype, {"logits": logits, "target": target, "dloss": dloss, "weight": None,
                                                 "exp_rows": None, "row_sums": None}, attrs, "logits")
    assert_close(f"cross_entropy_grad into logits {dtype.__name__}", got, want, scale=True, terms=37)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_other_calls_run_the_generic_kernel(dtype, generic_calls):
    rng = _rng("ce fallback")
    logits = rng.standard_normal((6, 4)).astype(dtype)
    target = rng.integers(0, 4, 6)
    weight = rng.uniform(0.5, 2, 4).astype(dtype)
    cases = {
        "weight": lambda x, t: F.cross_entropy(x, t, of.tensor(weight, device=x.device)),
        "label_smoothing": lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
        "(N, C, d) logits": lambda x, t: F.cross_entropy(x.reshape(3, 4, 2), t.reshape(3, 2)),
        "probabilities": lambda x, t: F.cross_entropy(x, F.softmax(x * 0.5, -1)),
    }
    for what, fn in cases.items():
        generic_calls.clear()
        got, want = both(fn, logits, target)
        assert_close(f"cross_entropy with {what} {dtype.__name__}", got, want, scale=True)
        assert "cross_entropy" in generic_calls, f"cross_entropy with {what} did not run the generic kernel"
        grads = []
        for device in (DEVICE, "cpu"):
            x = of.tensor(logits, device=device, requires_grad=True)
            grads.append(of.grad(fn(x, of.tensor(target, device=device)), [x])[0].cpu().numpy())
        assert_close(f"d cross_entropy with {what} {dtype.__name__}", *grads, scale=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,normalized", [((5, 1), [1]), ((1, 7), [7]), ((64, 1000), [1000]),
                                              ((2, 3, 4, 5), [4, 5]), ((1024, 1024), [1024])])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_rows(dtype, shape, normalized, affine, generic_calls):
    rng = _rng("layer_norm", shape, affine)
    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    w = rng.standard_normal(normalized).astype(dtype) if affine else None
    b = rng.standard_normal(normalized).astype(dtype) if affine else None
    n = int(np.prod(normalized))
    what = f"layer_norm{shape} over {normalized} {dtype.__name__} {'affine' if affine else ''}"
    got, want = both(lambda t, wt, bt: F.layer_norm(t, normalized, wt, bt), x, w, b)
    assert_close(what, got, want, scale=True, terms=n)
    g = rng.standard_normal(shape).astype(dtype)
    axes = list(range(len(shape) - len(normalized), len(shape)))
    for center in (True, False):
        (got_dx, got_xhat), (want_dx, want_xhat) = both(
            lambda t, gt, c=center: F.normalize_grad(t, gt, axes=axes, eps=1e-5, center=c), x, g)
        # dx = (g − x̂·mean(g·x̂) [− mean g]) / σ is a difference of terms of size |g|/σ: a row of one element
        # cancels them almost wholly (1 − x̂² = eps/σ²), so the digits lost are those of the terms (seen on a GPU)
        xc = x.astype(np.float64) - (x.mean(axis=tuple(axes), keepdims=True) if center else 0)
        sigma = np.sqrt((xc * xc).mean(axis=tuple(axes), keepdims=True) + 1e-5)
        assert_close(f"normalize_grad{shape} axes={axes} center={center} dx {dtype.__name__}", got_dx, want_dx,
                     scale=True, terms=n, magnitude=float(np.abs(g / sigma).max()))
        assert_close(f"normalize_grad{shape} axes={axes} center={center} xhat {dtype.__name__}", got_xhat,
                     want_xhat, scale=True, terms=n)
    assert generic_calls == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_special_rows(dtype):
    """A constant row of a large value (the CPU re-centres it: 0, not ±1), a row whose variance overflows (the CPU
    scales it by max |x|), a row with an infinity: as the CPU's."""
    big = 1e20 if dtype == np.float32 else 1e160
    x = np.array([[4e7] * 4, [big, -big, big * 0.5, 0.0], [1.0, np.inf, 0.0, 2.0], [1.0, 2.0, 3.0, 4.0]], dtype)
    g = np.array([[1.0, -2.0, 0.5, 3.0]] * 4, dtype)
    got, want = both(lambda t: F.layer_norm(t, [4]), x)
    assert_close(f"layer_norm(special rows) {dtype.__name__}", got, want, scale=True, terms=4)
    (got_dx, got_xhat), (want_dx, want_xhat) = both(lambda t, gt: F.normalize_grad(t, gt, axes=[1], eps=1e-5), x, g)
    for row in range(4):  # each row on its own scale (the overflowed row's dx is tiny)
        assert_close(f"normalize_grad(special rows) row {row} xhat {dtype.__name__}", got_xhat[row], want_xhat[row],
                     scale=True, terms=4)
        assert_close(f"normalize_grad(special rows) row {row} dx {dtype.__name__}", got_dx[row], want_dx[row],
                     scale=True, terms=4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_backward_and_other_layouts(dtype, generic_calls):
    rng = _rng("layer_norm autograd")
    x = rng.standard_normal((16, 3, 40)).astype(dtype)
    w, b = rng.standard_normal(40).astype(dtype), rng.standard_normal(40).astype(dtype)
    results = {}
    for device in (DEVICE, "cpu"):
        xt, wt, bt = (of.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
        y = F.layer_norm(xt, [40], wt, bt)
        (y * y).sum().backward()
        results[device] = [a.cpu().numpy() for a in (y, xt.grad, wt.grad, bt.grad)]
    for what, got, want in zip(("y", "dx", "dweight", "dbias"), results[DEVICE], results["cpu"]):
        assert_close(f"layer_norm backward {what} {dtype.__name__}", got, want, scale=True, terms=40 * 48)
    assert not generic_calls
    g = rng.standard_normal(x.shape).astype(dtype)
    (got, _), (want, _) = both(lambda t, gt: F.normalize_grad(t, gt, axes=[0, 2], eps=1e-5), x, g)
    assert_close(f"normalize_grad over axes [0, 2] {dtype.__name__}", got, want, scale=True)
    got, want = both(lambda t: F.layer_norm(t.transpose(0, 2), [16]), x)  # strided rows
    assert_close(f"layer_norm of a transposed view {dtype.__name__}", got, want, scale=True)
    assert set(generic_calls) == {"normalize_grad", "layer_norm"}


def _optim_cases(dtype, shape, rng):
    param, grad, buf = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    exp_avg = (rng.standard_normal(shape) * 0.1).astype(dtype)
    exp_avg_sq = rng.uniform(0.01, 1, shape).astype(dtype)
    lr = np.array(0.01, np.float64)  # the optimizers' 0-d hyper-parameters may be of another float type
    momentum, beta1 = np.array(0.9, np.float32), np.array(0.85, np.float64)
    step = np.array(7)
    yield "sgd_update", {"param": param, "grad": grad, "lr": lr, "momentum_buffer": None, "momentum": None}, \
        {"weight_decay": 0.0, "nesterov": False}, "param"
    yield "sgd_update", {"param": param, "grad": grad, "lr": lr, "momentum_buffer": None, "momentum": None}, \
        {"weight_decay": 0.01, "nesterov": False}, "param"
    yield "sgd_update", {"param": param, "grad": grad, "lr": lr, "momentum_buffer": buf, "momentum": momentum}, \
        {"weight_decay": 0.01, "nesterov": False}, "param"
    for wd in (0.0, 0.02):
        yield "sgd_update", {"param": param, "grad": grad, "lr": lr, "momentum_buffer": buf, "momentum": momentum}, \
            {"weight_decay": wd, "nesterov": True}, "param"
        for b1 in (beta1, np.array(0.3, np.float64)):  # torch's lerp from either end
            yield "adam_exp_avg", {"exp_avg": exp_avg, "grad": grad, "param": param, "beta1": b1}, \
                {"weight_decay": wd}, "exp_avg"
        yield "adam_exp_avg_sq", {"exp_avg_sq": exp_avg_sq, "grad": grad, "param": param}, \
            {"beta2": 0.999, "weight_decay": wd}, "exp_avg_sq"
        for decoupled in (False, True):
            yield "adam_update", {"param": param, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "step": step, "lr": lr,
                                  "beta1": beta1}, {"beta2": 0.999, "eps": 1e-8, "weight_decay": wd,
                                                    "decoupled": decoupled}, "param"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (1000, 3), (1 << 20,)])
def test_optimizer_updates(dtype, shape, generic_calls):
    """Each update on cuda against the CPU, as a call and written in place into the state's own array."""
    rng = _rng("optim", shape)
    for name, arrays, attrs, target in _optim_cases(dtype, shape, rng):
        what = f"{name}{shape} {dtype.__name__} {attrs}"
        got, want = both(lambda *ts, n=name, a=attrs: getattr(F, n)(*ts, **a), *arrays.values())
        assert_close(what, got, want, scale=True)
        got = _inplace(name, dtype, arrays, attrs, target)
        assert_close(f"{what} into {target}", got, want, scale=True)
    assert generic_calls == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_adam_training_steps(dtype):
    """A few Adam steps of a small model on cuda and on the CPU: the same parameters (the optimizer's 0-d state read
    on the device, no host copy per step)."""
    rng = _rng("adam steps")
    x, y = rng.standard_normal((64, 10)).astype(dtype), rng.integers(0, 3, 64)
    w0 = (rng.standard_normal((10, 3)) * 0.3).astype(dtype)
    final = {}
    for device in (DEVICE, "cpu"):
        w = of.tensor(w0, device=device, requires_grad=True)
        opt = of.optim.AdamW([w], lr=0.01, weight_decay=0.01)
        xt, yt = of.tensor(x, device=device), of.tensor(y, device=device)
        for _ in range(5):
            opt.zero_grad()
            F.cross_entropy(xt @ w, yt).backward()
            opt.step()
        final[device] = w.detach().cpu().numpy()
    assert_close(f"AdamW after 5 steps {dtype.__name__}", final[DEVICE], final["cpu"], scale=True, terms=64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_shape,num,width,padding_idx", [((6,), 4, 1, None), ((3, 1000), 50, 16, 3),
                                                               ((1 << 14,), 1000, 64, -1), ((2, 5), 7, 3, None)])
def test_embedding_grad(dtype, index_shape, num, width, padding_idx, generic_calls):
    rng = _rng("embedding_grad", index_shape)
    index = rng.integers(0, num, index_shape)
    dy = rng.standard_normal((*index_shape, width)).astype(dtype)
    for index_dtype in (np.int32, np.int64):
        got, want = both(lambda d, i: F.embedding_grad(d, i, num_embeddings=num, padding_idx=padding_idx), dy,
                         index.astype(index_dtype))
        assert_close(f"embedding_grad{index_shape} {dtype.__name__} padding_idx={padding_idx}", got, want,
                     scale=True, terms=max(1, index.size // num))
    assert generic_calls == []


def test_embedding_grad_index_out_of_range_is_the_cpu_error():
    messages = []
    for device in (DEVICE, "cpu"):
        with pytest.raises(of.ArgumentError) as e:
            F.embedding_grad(*on(device, np.ones((3, 2), np.float32), np.array([0, 5, 1])), num_embeddings=4)
        messages.append(str(e.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_compiled_training_step(optimizer):
    """A compiled step (linear, layer_norm, gelu, leaky_relu, cross_entropy, the optimizer's updates written in place
    by the executor's out= buffers) on cuda against the same on the CPU, float64."""
    rng = _rng("compiled training")
    x = rng.standard_normal((96, 12))
    y = rng.integers(0, 5, 96)
    results = {}
    for device in (DEVICE, "cpu"):
        of.manual_seed(0)
        model = of.nn.Sequential(of.nn.Linear(12, 32), of.nn.LayerNorm(32), of.nn.GELU(approximate="tanh"),
                                 of.nn.Linear(32, 16), of.nn.LeakyReLU(0.1), of.nn.Linear(16, 5)).double()
        model.to(device)
        if optimizer == "sgd":
            opt = of.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
        else:
            opt = of.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)

        def step(xb, yb, model=model, opt=opt):
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        compiled = of.compile(step)
        losses = [compiled(of.tensor(x[i::4], device=device), of.tensor(y[i::4], device=device)).cpu().numpy()
                  for i in range(4)]
        results[device] = (np.array(losses), [p.detach().cpu().numpy() for p in model.parameters()])
    assert_close(f"compiled {optimizer} step losses", results[DEVICE][0], results["cpu"][0], scale=True)
    for k, (got, want) in enumerate(zip(results[DEVICE][1], results["cpu"][1])):
        assert_close(f"compiled {optimizer} step: parameter {k} after 4 steps", got, want, scale=True)

