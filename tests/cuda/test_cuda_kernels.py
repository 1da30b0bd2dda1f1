"""The dedicated CUDA kernels (opforge/ops/cuda_kernels.py) against the CPU's kernels.

On a GPU: each op's result on "cuda" is compared with the same call on the CPU (float32 and float64, rows of 1,
rows of 1000+, a 2^20-element tensor), in place where the op writes into ``out=``; the calls a kernel does not
cover are checked to run the generic kernel and give the same; ``check_op(name, device="cuda")`` for each op.
Without a GPU those are skipped; what runs anywhere: the kernels are registered for "cuda" without importing CuPy,
``import opforge`` works with CuPy absent, each kernel's fallback is the op's generic kernel, and — where CuPy is
importable — every kernel source compiles with NVRTC for float and double (NVRTC needs no GPU).
"""

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.core.opdef import registry
from opforge.ops import cuda_kernels as CK

ROOT = Path(__file__).resolve().parents[2]
DEVICE = "cuda"
KERNEL_OPS = ("leaky_relu", "leaky_relu_grad", "gelu", "gelu_grad", "softmax", "log_softmax", "softmax_grad",
              "log_softmax_grad", "cross_entropy", "cross_entropy_grad", "layer_norm", "normalize_grad", "sgd_update",
              "adam_exp_avg", "adam_exp_avg_sq", "adam_update", "embedding_grad")


def _no_gpu() -> str | None:
    cuda = getattr(of, "cuda", None)
    if cuda is None:
        return "opforge.cuda is not there"
    if not cuda.is_available():
        return "no GPU: opforge.cuda.is_available() is false"
    return None


gpu = pytest.mark.skipif(_no_gpu() is not None, reason=str(_no_gpu()))


# -- anywhere ----------------------------------------------------------------------------------------------------


def test_every_op_has_its_cuda_kernel_for_float32_and_float64():
    for name in KERNEL_OPS:
        op = registry.get(name)
        for dtype in CK.FLOATS:
            kernel = op.kernels.get(("cuda", dtype))
            assert kernel is not None and kernel.fn.__module__ == CK.__name__, f"{name}: no cuda kernel for {dtype}"


def test_the_op_reference_lists_the_cuda_kernels_dtypes():
    from opforge import docgen

    text = docgen._kernels_text(registry.get("softmax"))
    assert text.endswith("`cuda`: float32, float64"), text  # (no "others": float16 runs the generic kernel there)


def test_the_fallback_is_the_generic_kernel_not_the_cuda_one():
    for name in KERNEL_OPS:
        op = registry.get(name)
        for dtype in CK.FLOATS:
            generic = CK._generic(op, dtype)
            assert generic is op.find_kernel("cpu", dtype).fn, name
            assert generic is not op.kernels[("cuda", dtype)].fn, name


def test_row_calls_are_told_from_the_others():
    rows = np.zeros((3, 5), np.float32)
    assert CK._rows_of(rows, -1) == 5 and CK._rows_of(rows, 1) == 5
    assert not CK._rows_of(rows, 0)  # another axis
    assert not CK._rows_of(rows.T, -1)  # not contiguous
    assert not CK._rows_of(np.zeros((), np.float32), -1) and not CK._rows_of(np.zeros((0, 4), np.float32), -1)
    target = np.zeros(3, np.int64)
    assert CK._class_rows(rows, target, None, 0.0)
    assert CK._class_rows(rows, target.astype(np.int32), None, 0.0)
    assert not CK._class_rows(rows, target, np.ones(5, np.float32), 0.0)  # a class weight
    assert not CK._class_rows(rows, target, None, 0.1)  # label smoothing
    assert not CK._class_rows(rows, rows, None, 0.0)  # probability targets
    assert not CK._class_rows(np.zeros((3, 5, 2), np.float32), np.zeros((3, 2), np.int64), None, 0.0)  # (N, C, d)
    assert not CK._class_rows(np.zeros(5, np.float32), np.zeros((), np.int64), None, 0.0)  # one sample
    assert [CK._block(n) for n in (1, 128, 129, 1000, 4096, 1 << 20)] == [32, 32, 64, 256, 1024, 1024]


def test_an_index_out_of_range_is_the_same_error_on_a_cupy_like_device():
    """embedding's and embedding_grad's check of the indices (which the cuda kernel runs too) on the strict device."""
    from opforge.testing import strict  # noqa: F401  (registers the device "strict")

    for fn in (lambda d, i: F.embedding_grad(d, i, num_embeddings=4), lambda d, i: F.embedding(i, d)):
        messages = []
        for device in ("strict", "cpu"):
            with pytest.raises(of.ArgumentError) as e:
                fn(*on(device, np.ones((3, 2), np.float32), np.array([0, 5, 1])))
            messages.append(str(e.value))
        assert messages[0] == messages[1]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_import_opforge_with_cupy_absent_registers_the_cuda_kernels():
    done = _python(f"""
        import sys
        sys.modules["cupy"] = None  # import cupy raises ImportError, as where it is not installed
        import opforge
        from opforge.core.opdef import registry
        missing = [n for n in {KERNEL_OPS!r} if ("cuda", opforge.float32) not in registry.get(n).kernels]
        assert not missing, missing
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_import_opforge_does_not_import_cupy():
    done = _python("""
        import sys
        import opforge
        assert "cupy" not in sys.modules, "import opforge imported cupy"
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# -- the sources, compiled with NVRTC (no GPU needed) --------------------------------------------------------------


def _nvrtc_compile(source: str, what: str) -> None:
    cupy = pytest.importorskip("cupy")
    from cupy_backends.cuda.libs import nvrtc

    include = Path(cupy.__file__).parent / "_core" / "include"
    try:
        program = nvrtc.createProgram(source, f"{what}.cu", [], [])
    except Exception as e:  # no libnvrtc where CuPy is
        pytest.skip(f"NVRTC is not usable here: {e}")
    try:
        nvrtc.compileProgram(program, ["-arch=compute_90", f"-I{include}"])
    except nvrtc.NVRTCError:
        pytest.fail(f"{what} does not compile:\n{nvrtc.getProgramLog(program)}\n--- source ---\n{source}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_row_kernels_compile(dtype):
    _nvrtc_compile(CK.rows_source(getattr(of, dtype)), f"rows_{dtype}")


@pytest.mark.parametrize("name", sorted(CK.ELEMENTWISE))
def test_elementwise_kernels_compile(name):
    """The code CuPy generates for each ElementwiseKernel (its own generator, for float and double parameters, 0-d
    raw hyper-parameters of another float type), compiled."""
    cupy = pytest.importorskip("cupy")
    from cupy._core import _carray
    from cupy._core import _kernel as K

    in_params, out_params, operation, loop_prep = CK.ELEMENTWISE[name]
    kernel = cupy.ElementwiseKernel(in_params, out_params, operation, f"opforge_{name}", preamble=CK._MATH,
                                    loop_prep=loop_prep)
    ndarray, indexer, scalar = 1, 2, 3  # CuPy 14's _ArgKind values
    for t in (np.float32, np.float64):
        other = np.float64 if t == np.float32 else np.float32
        types = {"T": t, "L": other, "M": other, "B": other, "S": np.int64}
        infos = []
        for p in kernel.params[:-1]:
            dtype = p.dtype or types[p.ctype]
            if p.raw:
                infos.append(K._ArgInfo(ndarray, cupy.ndarray, dtype, 0, True, True))
            elif p in kernel.in_params and p.name in {"alpha", "wd", "beta2", "one_minus_beta2", "eps", "mode",
                                                         "shrink"}:
                infos.append(K._ArgInfo(scalar, cupy._core._scalar.CScalar, dtype, 0, True, True))
            else:
                infos.append(K._ArgInfo(ndarray, cupy.ndarray, dtype, 1, True, True))
        infos.append(K._ArgInfo(indexer, _carray.Indexer, None, 1, True, True))
        used = {p.ctype for p in kernel.params[:-1] if p.dtype is None}
        type_map = K._TypeMap(tuple(sorted((c, types[c]) for c in used)))
        code = K._get_elementwise_kernel_code(tuple(infos), type_map, kernel.params, operation, kernel.name,
                                              kernel.preamble, loop_prep, "")
        _nvrtc_compile("#include <cupy/carray.cuh>\n" + code, f"{name}_{np.dtype(t).name}")


# -- on a GPU: the CUDA kernels against the CPU ------------------------------------------------------------------

RTOL = {np.float32: 1e-5, np.float64: 1e-12}


def assert_close(what: str, got, want, *, exact: bool = False, scale: bool = False, terms: int = 1) -> None:
    """``got`` (cuda) against ``want`` (cpu): exactly (selects), else within rtol 1e-5 (float32) or 1e-12 (float64),
    widened for sums of many terms (``terms``: two orders of n float32 terms differ by ~√n ulps), and with
    ``scale`` an atol of rtol·max|want| (a result that is a difference, such as dy − Σ dy·y, loses digits to the
    size of its terms, not its own)."""
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


@gpu
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


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_activations_at_special_values(dtype):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.0, 40.0], dtype)
    dy = np.ones_like(x)
    for alpha in (0.01, 1.5, float("nan")):
        got, want = both(lambda t, a=alpha: F.leaky_relu(t, alpha=a), x)
        assert_close(f"leaky_relu(special) {dtype.__name__} alpha={alpha}", got, want, exact=True)
        got, want = both(lambda t, d, a=alpha: F.leaky_relu_grad(t, d, alpha=a), x, dy)
        assert_close(f"leaky_relu_grad(special) {dtype.__name__} alpha={alpha}", got, want, exact=True)
    for approximate in ("none", "tanh"):
        got, want = both(lambda t, a=approximate: F.gelu(t, approximate=a), x)
        assert_close(f"gelu(special) {dtype.__name__} {approximate}", got, want, scale=True)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_grad_broadcasts(dtype, generic_calls):
    rng = _rng("gelu_grad broadcast")
    x, dy = rng.standard_normal((4, 1, 5)).astype(dtype), rng.standard_normal((3, 5)).astype(dtype)
    got, want = both(lambda t, d: F.gelu_grad(t, d), x, dy)
    assert_close(f"gelu_grad broadcast {dtype.__name__}", got, want, scale=True)
    assert generic_calls == []


@gpu
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


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_special_rows(dtype):
    """Rows with an infinity, a NaN, all −inf, huge values: the same NaN and 0 pattern as the CPU's."""
    x = np.array([[1.0, np.inf, 2.0], [np.nan, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [1e30, 1e30, -1e30],
                  [-1e4, -1e4 + 1, -1e4 + 2]], dtype)
    for name in ("softmax", "log_softmax"):
        got, want = both(functools.partial(getattr(F, name), axis=-1), x)
        assert_close(f"{name}(special rows) {dtype.__name__}", got, want, scale=name == "log_softmax", terms=3)


@gpu
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
    cupy = pytest.importorskip("cupy")
    kernel = registry.get(op).find_kernel(DEVICE, np.dtype(dtype)).fn
    inputs = {k: None if v is None else cupy.asarray(v) for k, v in arrays.items()}
    result = kernel(*inputs.values(), **attrs, out=inputs[target])
    assert result is inputs[target], f"{op}: out= was not the array written"
    return cupy.asnumpy(result)


@gpu
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


@gpu
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
    assert_close(what.replace("cross_entropy", "cross_entropy_grad"), got, want, scale=True, terms=classes)
    assert generic_calls == []


@gpu
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


@gpu
def test_cross_entropy_target_out_of_range_is_the_cpu_error():
    logits = np.zeros((4, 3), np.float32)
    target = np.array([0, 1, 7, 2])
    messages = []
    for device in (DEVICE, "cpu"):
        with pytest.raises(of.ArgumentError) as e:
            F.cross_entropy(*on(device, logits, target))
        messages.append(str(e.value))
    assert messages[0] == messages[1]


@gpu
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


@gpu
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


@gpu
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
        assert_close(f"normalize_grad{shape} axes={axes} center={center} dx {dtype.__name__}", got_dx, want_dx,
                     scale=True, terms=n)
        assert_close(f"normalize_grad{shape} axes={axes} center={center} xhat {dtype.__name__}", got_xhat,
                     want_xhat, scale=True, terms=n)
    assert generic_calls == []


@gpu
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


@gpu
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


@gpu
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


@gpu
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


@gpu
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


@gpu
def test_embedding_grad_index_out_of_range_is_the_cpu_error():
    messages = []
    for device in (DEVICE, "cpu"):
        with pytest.raises(of.ArgumentError) as e:
            F.embedding_grad(*on(device, np.ones((3, 2), np.float32), np.array([0, 5, 1])), num_embeddings=4)
        messages.append(str(e.value))
    assert messages[0] == messages[1]


@gpu
@pytest.mark.parametrize("name", KERNEL_OPS)
def test_check_op_on_cuda(name):
    report = of.testing.check_op(name, device=DEVICE, raise_on_failure=False)
    assert not report.failures, f"check_op({name!r}, device={DEVICE!r}):\n" + "\n".join(report.failures)


@gpu
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
