"""The executor's fusion on a real GPU (opforge.program.device_kernels): each fused group of pointwise ops is one
generated CuPy ``ElementwiseKernel``. Compiled programs on "cuda" are compared with the same programs run one op at a
time on "cuda" (``Executor(optimize=False)``, or eager calls: one CuPy launch per op) and with the CPU, and the plan's
steps (one kernel launch each, or more) with the unfused plan's. tests/test_device_kernels.py checks the same without
a GPU. Skipped where CuPy sees no GPU (conftest.py).

Tolerances, and why: the kernels are compiled with ``--fmad=false``, so arithmetic, comparisons and selects give the
ufuncs' bits (0 ulp); a transcendental function is CUDA's expf/tanhf/erff... in both, but CuPy compiles its ufuncs with
contraction on and an op's own kernel may compute by another formula (sigmoid as exp, add, reciprocal), so ``ULPS``
(2) per transcendental call at most against eager CUDA. Against the CPU: CUDA documents 1–2 ulp for these functions,
NumPy's SIMD ones are within 1–4 of exact, so 4 ulp per call; float32 kernels flush subnormals to zero on the GPU
(CuPy compiles with -ftz=true), so a CPU subnormal matches a GPU zero, and special values (a subnormal among them)
are compared with eager CUDA alone. Each failure prints the first differing elements with every side's value."""

from __future__ import annotations

import numpy as np
import pytest
from test_device_kernels import functional_mlp
from test_fusion import _program, _samples
from test_native import DECLARED, _special_samples, _vectorised

import opforge as of
from opforge import ops as F
from opforge.program import device_kernels

DEVICE = "cuda"
ULPS = 2  # per transcendental call, against the same program run op by op on the GPU (the module docstring says why)


def _device():
    return of.get_device(DEVICE)


def _host(value) -> np.ndarray:
    return np.asarray(_device().to_host(value))


def _ulp_distance(got: np.ndarray, want: np.ndarray, ftz: bool = False) -> np.ndarray:
    """Per element: the distance in units of the last place (0 where both are NaN; huge where one only is). ``ftz``:
    a subnormal of ``want`` is taken as the zero a flushing GPU gives."""
    got, want = np.broadcast_arrays(np.asarray(got), np.asarray(want))
    if got.dtype.kind != "f":
        return (got != want).astype(np.int64)
    if ftz:
        want = np.where(np.abs(want) < np.finfo(want.dtype).tiny, np.zeros_like(want), want)
        got = np.where(np.abs(got) < np.finfo(got.dtype).tiny, np.zeros_like(got), got)
    bits = {4: np.int32, 8: np.int64}[got.dtype.itemsize]
    a, b = got.view(bits).astype(np.int64), want.view(bits).astype(np.int64)
    a = np.where(a < 0, np.iinfo(bits).min - a, a)  # sign-magnitude to a line ordered as the floats
    b = np.where(b < 0, np.iinfo(bits).min - b, b)
    distance = np.abs(a - b)
    both_nan, one_nan = np.isnan(got) & np.isnan(want), np.isnan(got) ^ np.isnan(want)
    return np.where(both_nan, 0, np.where(one_nan, np.iinfo(np.int64).max, distance))


def _differences(what: str, got, want, ulps: int, sides: dict, ftz: bool = False, atol: float = 0.0) -> str:
    """"" where ``got`` is within ``ulps`` of ``want`` (or ``atol`` of it: a result of a cancellation) everywhere;
    else what differs: the largest distance, how many elements, and the first five with ``sides`` (name -> array:
    inputs, other results) at each."""
    if np.shape(got) != np.shape(want) or np.asarray(got).dtype != np.asarray(want).dtype:
        return f"{what}: {np.asarray(got).dtype}{list(np.shape(got))} against {np.asarray(want).dtype}" \
               f"{list(np.shape(want))}"
    distance = _ulp_distance(got, want, ftz)
    if atol:
        distance = np.where(np.abs(np.asarray(got, np.float64) - want) <= atol, 0, distance)
    bad = np.flatnonzero(distance.reshape(-1) > ulps)
    if not bad.size:
        return ""
    shape = np.shape(got)
    lines = [f"{what}: {bad.size} of {distance.size} elements beyond {ulps} ulp (largest {distance.max()} ulp)"]
    for k in bad[:5]:
        at = np.unravel_index(k, shape) if shape else ()
        values = ", ".join(f"{name}={np.broadcast_to(np.asarray(v), shape)[at]!r}" for name, v in sides.items())
        lines.append(f"  at {tuple(int(i) for i in at)}: {values}")
    return "\n".join(lines)


def _groups(plan) -> int:
    return sum(1 for line in plan.source.splitlines() if line.startswith("def k") and "device kernel" in line)


def _calls(opdef) -> int:
    """How many transcendental functions an op's expression calls (each may move the last bits)."""
    import ast

    return sum(isinstance(n, ast.Call) and n.func.id in ("exp", "log", "tanh", "expm1", "log1p", "sin", "cos", "erf")
               for n in ast.walk(ast.parse(opdef.scalar_expression, mode="eval")))


# -- every op with a scalar expression --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DECLARED)
def test_every_op_with_a_scalar_expression_computes_in_a_kernel_what_it_computes_op_by_op(name):
    """The op between two others (tests/test_fusion.py's _program: x·1 in, neg out) as one kernel, on its first
    sample and on special values (NaN, ±inf, ±0, a subnormal, exp's overflow), float64 and float32: against the same
    program run op by op on the GPU, and against the CPU."""
    opdef = of.registry.get(name)
    samples = [("sample", _samples(opdef)[0])]
    if all(isinstance(a, np.ndarray) and a.dtype.kind in "fb" for a in samples[0][1].args):
        samples.append(("special values", _special_samples(opdef)))
    calls = _calls(opdef) if _vectorised(opdef) else 0
    failures = []
    for label, sample in samples:
        for dtype in (np.float64, np.float32):
            feeds, cpu_program = _program(opdef, sample, dtype, rows=3)
            with of.using_device(DEVICE):
                _, program = _program(opdef, sample, dtype, rows=3)
            fused = of.Executor(program)
            with np.errstate(all="ignore"):
                got = _host(fused.run(feeds)["out"])
                eager = _host(of.Executor(program, optimize=False).run(feeds)["out"])
                cpu = of.Executor(cpu_program, optimize=False).run(feeds)["out"]
            if _groups(fused.plan(feeds)) != 1:
                failures.append(f"{label}, {np.dtype(dtype)}: not one kernel:\n{fused.plan(feeds).source}")
            sides = {**feeds, "compiled": got, "op_by_op_cuda": eager, "cpu": cpu}
            where = f"{name}, {label}, {np.dtype(dtype)}"
            failures.append(_differences(f"{where}: compiled cuda against op by op on cuda", got, eager,
                                         ULPS * calls, sides))
            if label == "sample" or dtype == np.float64:  # (float32 special values: the GPU flushes the subnormal)
                failures.append(_differences(f"{where}: compiled cuda against the cpu", got, cpu, 4 * calls, sides,
                                             ftz=dtype == np.float32))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)


# -- programs ----------------------------------------------------------------------------------------------------


def _eleven(x, y):
    """11 pointwise ops, a sigmoid among them."""
    a = x * 1.5 + y
    b = F.sigmoid(a) * y
    c = F.tanh(b) - x * 0.5
    return F.maximum(c, y) / (F.abs(x) + 1.0)


@pytest.mark.parametrize("size", [16, 4096, 1 << 20])
def test_an_eleven_op_expression_is_one_launch(size):
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(size).astype(np.float32), "y": rng.standard_normal(size).astype(np.float32)}
    program = of.trace(_eleven, device=DEVICE, **{k: of.Spec(v.shape, v.dtype) for k, v in feeds.items()})
    fused, unfused = of.Executor(program), of.Executor(program, native=False)
    got, eager = _host(fused.run(feeds)["out"]), _host(unfused.run(feeds)["out"])
    cpu = of.Executor(of.trace(_eleven, device="cpu", **{k: of.Spec(v.shape, v.dtype) for k, v in feeds.items()}),
                      optimize=False).run(feeds)["out"]
    plan = fused.plan(feeds)
    assert (plan.steps, _groups(plan), unfused.plan(feeds).steps) == (1, 1, 11), plan.source
    sides = {**feeds, "compiled": got, "unfused_cuda": eager, "cpu": cpu}
    # sigmoid and tanh: 2·ULPS each; tanh(b) − x/2 cancels (terms near 1, a result near 0): an ulp of its terms
    eps = float(np.finfo(np.float32).eps)
    problems = [_differences("compiled cuda against unfused cuda", got, eager, 2 * ULPS, sides, atol=2 * ULPS * eps),
                _differences("compiled cuda against the cpu", got, cpu, 8, sides, ftz=True, atol=8 * eps)]
    assert not any(problems), "\n".join(p for p in problems if p)


def _chain(x):
    h = x
    for _ in range(100):  # 200 ops
        h = F.tanh(h) * 1.01
    return h


def test_a_chain_of_200_tiny_ops_forward_and_backward_is_a_few_launches():
    """The forward chain and its backward (tanh_grad and products) as few launches. Against op by op on the GPU,
    ULPS per tanh on the way (100 of them; an ulp a tanh moves early grows by up to 1.01¹⁰⁰ ≈ 2.7 on its way out, and
    the gradient multiplies 100 factors 1 − y²): a wrong expression is off by far more."""
    x = np.linspace(-1, 1, 16, dtype=np.float32)

    def fn(x):
        y = _chain(x)
        return {"y": y, "g": of.grad(F.sum(y), [x])[0]}

    program = of.trace(fn, device=DEVICE, x=of.Spec(x.shape, x.dtype))
    fused, unfused = of.Executor(program), of.Executor(program, native=False)
    got, eager = fused.run(x=x), unfused.run(x=x)
    plan = fused.plan(x=x)
    assert _groups(plan) <= 3 and plan.steps <= 5 and unfused.plan(x=x).steps > 300, \
        (plan.steps, unfused.plan(x=x).steps, plan.source)
    cpu = of.Executor(of.trace(fn, device="cpu", x=of.Spec(x.shape, x.dtype)), optimize=False).run(x=x)
    problems = []
    for k in ("y", "g"):
        sides = {"x": x, "compiled": _host(got[k]), "unfused_cuda": _host(eager[k]), "cpu": cpu[k]}
        budget = 100 * (1 if k == "y" else 2)  # tanh calls on the way to y; to g, twice as many roundings
        problems.append(_differences(f"{k}: compiled cuda against unfused cuda", _host(got[k]), _host(eager[k]),
                                     ULPS * budget, sides))
        problems.append(_differences(f"{k}: compiled cuda against the cpu", _host(got[k]), cpu[k], 4 * budget, sides))
    assert not any(problems), "\n".join(p for p in problems if p)


def _mlp(device, dtype=np.float32):
    """test_device_kernels' hand-written MLP (gelu, which has no scalar expression; leaky_relu and tanh, each joining
    its bias add) and its SGD step, at a GPU's widths."""
    return functional_mlp(device, (128, 256, 256, 64, 10), dtype)


def test_an_mlp_training_step_is_fewer_launches_and_follows_eager_cuda():
    rng = np.random.default_rng(4)
    batches = [(rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal((64, 10)).astype(np.float32))
               for _ in range(4)]
    runs = {}
    for label, device, compiled in (("compiled_cuda", DEVICE, True), ("eager_cuda", DEVICE, False),
                                    ("eager_cpu", "cpu", False)):
        params, step = _mlp(device)
        run = of.compile(step) if compiled else step
        arrays = [p._data for p in params]
        losses = [float(run(of.tensor(x, device=device), of.tensor(y, device=device)).item()) for x, y in batches]
        if compiled:
            shares = _device().xp.shares_memory  # each update written into its parameter's array
            assert all(p._data is a or shares(p._data, a) for p, a in zip(params, arrays))
            (entry,) = [e for entry in run.cache.values() for e in entry]
            (plan,) = entry.exe._plans.values()
            unfused = of.Executor(entry.exe.program, fetch=entry.exe.fetch, native=False).plan(
                x=batches[0][0], y=batches[0][1])
            assert _groups(plan) >= 10 and plan.steps <= unfused.steps - 10, (plan.steps, unfused.steps, plan.source)
        runs[label] = losses, [p.cpu().numpy() for p in params]
    (got, got_p), (eager, eager_p), (cpu, cpu_p) = runs["compiled_cuda"], runs["eager_cuda"], runs["eager_cpu"]
    # the same cuBLAS GEMMs in both GPU runs; the elementwise ulps (the module docstring) through 4 steps
    np.testing.assert_allclose(got, eager, rtol=1e-5, err_msg="losses: compiled cuda against eager cuda")
    np.testing.assert_allclose(got, cpu, rtol=1e-4, err_msg="losses: compiled cuda against eager cpu")
    for k, (g, e, c) in enumerate(zip(got_p, eager_p, cpu_p)):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6, err_msg=f"parameter {k}: compiled against eager cuda")
        np.testing.assert_allclose(g, c, rtol=1e-3, atol=1e-5, err_msg=f"parameter {k}: compiled cuda against cpu")


def test_an_op_without_a_scalar_expression_keeps_its_own_kernel():
    x = np.linspace(-2, 2, 4096, dtype=np.float32).reshape(64, 64)

    def fn(x):
        return F.elu(x * 2.0 + 1.0) * 3.0 - 1.0  # elu: no scalar expression

    program = of.trace(fn, device=DEVICE, x=of.Spec(x.shape, x.dtype))
    fused = of.Executor(program)
    got, eager = _host(fused.run(x=x)["out"]), _host(of.Executor(program, optimize=False).run(x=x)["out"])
    plan = fused.plan(x=x)
    assert (plan.steps, _groups(plan)) == (3, 2), plan.source
    assert not _differences("compiled against op by op on cuda", got, eager, 0, {"x": x, "got": got, "eager": eager})


def test_kernels_are_made_once_per_source():
    program = of.trace(lambda x: F.tanh(x * 2.0) + 1.0, device=DEVICE, x=of.Spec((None, 8), "float32"))
    made = len(device_kernels._KERNELS)
    for rows in (3, 300):
        x = np.full((rows, 8), 0.25, np.float32)
        got = _host(of.Executor(program).run(x=x)["out"])
        assert np.allclose(got, np.tanh(np.float32(0.5)) + 1, rtol=1e-6), got
    assert len(device_kernels._KERNELS) <= made + 1


@pytest.mark.parametrize("size", [4, 512])
def test_an_output_is_not_written_into_an_input_that_another_input_views(size):
    """x·2 dies at the kernel tanh(a + aᵀ/2), which may write into it, but aᵀ (a view of it) is read there too: the
    kernel must get a new array (threads would read elements others wrote)."""
    x = np.linspace(-1, 1, size * size).reshape(size, size)

    def fn(x):
        return F.tanh(x * 2.0 + F.transpose(x * 2.0, perm=[1, 0]) * 0.5)

    program = of.trace(fn, device=DEVICE, x=of.Spec(x.shape, x.dtype))
    got, eager = _host(of.Executor(program).run(x=x)["out"]), _host(of.Executor(program, native=False).run(x=x)["out"])
    problem = _differences("compiled against unfused cuda", got, eager, 2 * ULPS, {"x": x, "got": got, "eager": eager})
    assert not problem, problem
