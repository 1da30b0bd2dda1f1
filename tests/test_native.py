"""Native code for compiled programs (opforge.program.native): every op's scalar expression against its NumPy kernel,
fused groups with broadcasting, views and in-place updates against the unfused program, the on-disk cache across
processes, and the NumPy path when the backend is off or missing."""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_fusion import _program, _samples

import opforge as of
from opforge import ops as F
from opforge.program import assign, native

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler: the backend is off")

DECLARED = sorted(op.name for op in of.registry if op.scalar_expression is not None)
# Pointwise ops that keep their NumPy kernels inside a native program: a group holding one stays on NumPy blocks.
# (cast and round depend on dtypes and rounding modes C does not share with NumPy as written; the others are not
# yet written as expressions.)
WITHOUT = {"cast", "round", "pow", "clip", "elu", "selu", "celu", "gelu", "gelu_grad", "softplus", "isfinite", "mish",
           "logsigmoid", "hardswish_grad",
           # torch's elementwise maths and special functions (ops/elementwise_math.py, ops/special.py): not yet
           # written as expressions
           "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "bitwise_left_shift", "bitwise_right_shift",
           "bitwise_xor", "copysign", "cosh", "digamma", "erfc", "erfinv", "exp2", "fmax", "fmin", "fmod", "frac",
           "hypot", "i0", "isclose", "isinf", "isneginf", "isposinf", "lerp", "lgamma", "log10", "log2", "logaddexp",
           "logical_xor", "logit", "nan_to_num", "polygamma", "sinh", "special_i1", "tan", "trunc", "xlogy",
           "hardshrink", "softshrink", "shrink_grad", "threshold", "threshold_grad"}
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3.5, 2.5, 700.0, -700.0, 0.5, 1.0])


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "native-cache"))


COST_RULE = native.worth_a_call


@pytest.fixture(autouse=True)
def _every_group_native(monkeypatch):
    """The tests here check what the loops compute on small arrays: every group they can translate runs natively,
    however little a call would save (``native.worth_a_call``, tested on its own below)."""
    monkeypatch.setattr(native, "worth_a_call", lambda fused: True)


def _vectorised(opdef) -> bool:
    """Whether the expression calls a libmvec function (results may differ from NumPy's in the last bits)."""
    tree = ast.parse(opdef.scalar_expression, mode="eval")
    return any(isinstance(n, ast.Call) and native.FUNCTIONS[n.func.id][2] for n in ast.walk(tree))


def _ulps(a, b) -> int:
    """The largest distance in units of the last place between two float arrays (NaN matching NaN)."""
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    assert np.array_equal(np.isnan(a), np.isnan(b))
    keep = ~np.isnan(a)
    a, b = a[keep], b[keep]
    bits = {4: np.int32, 8: np.int64}[a.dtype.itemsize]
    ia, ib = a.view(bits).astype(np.int64), b.view(bits).astype(np.int64)
    ia = np.where(ia < 0, np.iinfo(bits).min - ia, ia)  # sign-magnitude to a line ordered as the floats
    ib = np.where(ib < 0, np.iinfo(bits).min - ib, ib)
    return int(np.abs(ia - ib).max(initial=0))


def test_every_pointwise_op_has_a_scalar_expression_or_is_listed():
    pointwise = {op.name for op in of.registry if "pointwise" in op.traits}
    assert pointwise - set(DECLARED) == WITHOUT


def _special_samples(opdef):
    """Each float input given NaN, ±inf, ±0, a subnormal and values where exp overflows, against each other."""
    rng = np.random.default_rng(3)
    attrs = _samples(opdef)[0].kwargs
    args = []
    for k, p in enumerate(opdef.inputs):
        if p.dtypes == (np.dtype(bool),):
            args.append(rng.standard_normal(SPECIAL.shape) > 0)
        else:
            args.append(rng.permutation(SPECIAL) if k else SPECIAL.copy())
    return of.Sample.of(*args, **{k: v for k, v in attrs.items() if not isinstance(v, np.ndarray)})


@pytest.mark.parametrize("name", DECLARED)
def test_a_native_op_gives_its_kernels_values(name):
    """Bit for bit where the expression is arithmetic, compare and select; within 4 ulp (glibc's bound for libmvec)
    where it calls exp, log, tanh, ...; on the op's samples (broadcasting, 0-d) and on special values."""
    opdef = of.registry.get(name)
    samples = _samples(opdef)
    if all(isinstance(a, np.ndarray) and a.dtype.kind in "fb" for a in samples[0].args):
        samples.append(_special_samples(opdef))
    native_any = False
    for sample in samples:
        for dtype in (np.float64, np.float32):
            feeds, program = _program(opdef, sample, dtype, rows=3)
            exe = of.Executor(program, native=True)
            with np.errstate(all="ignore"):
                got, want = exe.run(feeds)["out"], of.Executor(program, optimize=False).run(feeds)["out"]
            assert got.dtype == want.dtype and got.shape == want.shape
            if want.dtype.kind == "f" and _vectorised(opdef):
                assert _ulps(got, want) <= 4, (name, sample, dtype)
            else:
                assert np.array_equal(got, want, equal_nan=True), (name, sample, dtype)
            native_any |= ", native" in exe.plan(feeds).source
    assert native_any, f"{name} never ran as native code"


def _both(fn, **feeds):
    """fn's program run as native code and on NumPy blocks, and the native plan's source."""
    program = of.trace(fn, **{k: of.Spec(v.shape, v.dtype) for k, v in feeds.items()})
    exe = of.Executor(program, native=True)
    return exe.run(feeds), of.Executor(program, native=False).run(feeds), exe.plan(feeds).source


def test_a_chain_forward_and_backward_is_one_native_call():
    def chain(x):
        h = x
        for _ in range(50):
            h = F.tanh(h) * 1.01
        return h

    x = np.linspace(-1, 1, 16, dtype=np.float32)
    got, want, source = _both(lambda x: {"g": of.grad(F.sum(chain(x)), [x])[0]}, x=x)
    assert source.count(", native") == 1 and "k0_k" not in source  # no NumPy kernel of the group is called
    for k in want:
        assert _ulps(got[k], want[k]) <= 4
    # the forward's result fetched too: still one loop, which writes both (a region with several results)
    got, want, source = _both(lambda x: {"g": of.grad(F.sum(chain(x)), [x])[0], "y": chain(x)}, x=x)
    assert source.count(", native") == 1 and "v3, v4, = k0(" in source
    for k in want:
        assert _ulps(got[k], want[k]) <= 4


def test_a_region_hands_several_results_to_readers_moved_after_it():
    """sum(a) reads a before tanh(a) + 1 joins a's region: the sum runs after the region. b * s cannot join (s
    depends on the region), and the comparison's bool result leaves the region too."""
    x = np.linspace(-2, 2, 24).reshape(4, 6).astype(np.float32)

    def fn(x):
        a = x * 2.0
        s = F.sum(a)
        b = F.tanh(a) + 1.0
        mask = b > 1.5
        return {"t": b * s, "m": F.where(mask, x, a), "k": F.logical_not(mask)}

    got, want, source = _both(fn, x=x)
    run = source.split("def run")[1]
    # one loop writes a (for the sum), b (for the product), the where's and the logical_not's results; then the sum
    assert source.count(", native") == 1 and "v4, v5, v6, v7, = k0(" in run
    assert run.index("= k0(") < run.index("= _array(k1(v4")
    for k in want:
        assert _ulps(got[k], want[k]) <= 4 if want[k].dtype.kind == "f" else np.array_equal(got[k], want[k])
    # without a working compiler the region runs its members' kernels, one after another
    program = of.trace(fn, x=of.Spec(x.shape, x.dtype))
    original = native.build
    try:
        native.build = lambda *a: (_ for _ in ()).throw(native.Unsupported("no compiler here"))
        with pytest.warns(RuntimeWarning, match="native code .* is off"):
            native._warned.clear()
            exe = of.Executor(program, native=True)
            plan = exe.plan(x=x)
        assert "several results" in plan.source
        fallback = exe.run(x=x)
    finally:
        native.build = original
        native._warned.clear()
    for k in want:
        assert np.array_equal(fallback[k], want[k])


def test_broadcast_inputs_views_and_constants():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    col = rng.standard_normal((6, 1, 1)).astype(np.float32)
    mid = rng.standard_normal((5, 1)).astype(np.float32)

    def fn(x, b, col, mid):
        return F.relu(x * col + b - mid) * 0.5 + F.where(x > 0, mid, col)

    got, want, source = _both(fn, x=x, b=b, col=col, mid=mid)
    assert ", native" in source
    assert np.array_equal(got["out"], want["out"])
    # a feed in another layout (a transposed view) is read as the values it holds
    xt = np.ascontiguousarray(x.transpose(2, 1, 0)).transpose(2, 1, 0)
    assert not xt.flags.c_contiguous
    got, want, _ = _both(fn, x=xt, b=b, col=col, mid=mid)
    assert np.array_equal(got["out"], want["out"])


def test_a_sgd_update_is_one_native_loop_written_into_the_parameter():
    rng = np.random.default_rng(2)
    w = of.tensor(rng.standard_normal((40, 30)).astype(np.float32), requires_grad=True)
    array = w.numpy()
    w0 = array.copy()

    def step(x):
        loss = F.sum(F.tanh(x @ w))
        (g,) = of.grad(loss, [w])
        with of.no_grad():
            assign(w, w - 0.1 * g)
        return loss

    x = rng.standard_normal((8, 40)).astype(np.float32)
    g = (x.T @ (1 - np.tanh(x @ w0) ** 2)).astype(np.float32)
    compiled = of.compile(step)
    compiled(of.tensor(x))
    assert w.numpy() is array or np.shares_memory(w.numpy(), array)  # written in place
    assert np.allclose(array, w0 - np.float32(0.1) * g, rtol=1e-5, atol=1e-6)
    plans = [p for entry in compiled.cache.values() for e in entry for p in e.exe._plans.values()]
    assert any(", native" in p.source for p in plans)


def test_groups_without_an_expression_or_of_other_dtypes_keep_numpy():
    x = np.linspace(-2, 2, 12).reshape(3, 4)
    got, want, source = _both(lambda x: F.elu(x * 2.0) + 1.0, x=x)  # elu has no expression
    assert ", native" not in source and np.array_equal(got["out"], want["out"])
    i = np.arange(12, dtype=np.int64).reshape(3, 4)
    got, want, source = _both(lambda i: (i * 3 + 1) * 2, i=i)  # int64: NumPy's wrapping rules
    assert ", native" not in source and np.array_equal(got["out"], want["out"])


def test_off_by_switch_or_without_a_compiler_the_numpy_path_runs(monkeypatch):
    x = np.linspace(-3, 3, 64, dtype=np.float32)

    def fn(x):
        return F.sigmoid(x * 2.0) * x

    program = of.trace(fn, x=of.Spec(x.shape, x.dtype))
    assert ", native" in of.Executor(program).plan(x=x).source  # on by default, a compiler being there
    monkeypatch.setenv("OPFORGE_NATIVE", "0")
    assert ", native" not in of.Executor(program).plan(x=x).source
    monkeypatch.setenv("OPFORGE_NATIVE", "1")
    monkeypatch.setenv("CC", "/nonexistent/cc")
    native.compiler.cache_clear()
    try:
        exe = of.Executor(program)
        assert ", native" not in exe.plan(x=x).source
        assert np.array_equal(exe.run(x=x)["out"], of.Executor(program, optimize=False).run(x=x)["out"])
    finally:
        monkeypatch.delenv("CC")
        native.compiler.cache_clear()


def test_the_compiled_library_is_cached_on_disk_for_other_processes(tmp_path):
    log = tmp_path / "cc.log"
    cc = tmp_path / "cc"
    cc.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexec {native.compiler()} \"$@\"\n")
    cc.chmod(0o755)
    script = textwrap.dedent("""
        import numpy as np, opforge as of
        from opforge import ops as F
        x = np.linspace(-1, 1, 5000, dtype=np.float32)  # large enough to be worth a native call
        program = of.trace(lambda x: F.tanh(x * 3.0) + 0.25, x=of.Spec(x.shape, x.dtype))
        exe = of.Executor(program, native=True)
        assert ", native" in exe.plan(x=x).source
        print(exe.run(x=x)["out"].tolist())
    """)
    env = dict(os.environ, CC=str(cc), OPFORGE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(of.__file__).parent.parent))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert runs[0].stdout == runs[1].stdout
    compiles = [line for line in log.read_text().splitlines() if "--version" not in line]
    loops = [line for line in compiles if "fastcall.c" not in line]
    assert len(loops) == 1  # the second process loaded the first one's library
    assert len(compiles) - len(loops) <= 1  # and the call extension (opforge.program.fastcall), built once too
    libraries = (tmp_path / "cache" / "native").glob("*.so")
    assert len([p for p in libraries if not p.name.startswith("fastcall-")]) == 1


def test_an_input_the_shape_rules_did_not_promise_fails_before_the_loop_reads_it():
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    program = of.trace(lambda x: F.tanh(x * 2.0) + 1.0, x=of.Spec(x.shape, x.dtype))
    plan = of.Executor(program, native=True).plan(x=x)
    assert "def k0(i0, i1, i2, W, out=None):  # fused(mul.2, tanh.3, add.5), native" in plan.source
    group, two, one = plan.fn.__globals__["k0"], np.array(2.0, np.float32), np.array(1.0, np.float32)
    assert _ulps(group(x, two, one, None), np.tanh(x * two) + one) <= 4
    for wrong in (np.zeros((3, 5), np.float32), np.zeros((3, 4), np.float64), np.zeros(12, np.float32)):
        with pytest.raises(of.ShapeError, match="native loop"):
            group(wrong, two, one, None)


# -- GEMM epilogues: p − s·(a @ b) as one BLAS call adding into p --------------------------------------------------


def _sgd_step(params, lr, transposed_gradient=False):
    """A two-layer tanh network's SGD step, its weight gradients matrix products read only by their updates."""
    w1, w2 = params

    def step(x):
        loss = F.sum(F.tanh(F.tanh(x @ w1) @ w2))
        grads = of.grad(loss, [w1, w2])
        with of.no_grad():
            for p, g in zip(params, grads):
                assign(p, p - lr * g)
        return loss

    return step


def _gemm_plans(compiled) -> list:
    return [p for entry in compiled.cache.values() for e in entry for p in e.exe._plans.values()]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_sgd_update_of_a_matmul_gradient_is_one_gemm_adding_into_the_parameter(dtype, monkeypatch):
    rng = np.random.default_rng(5)
    start = [rng.standard_normal((12, 9)).astype(dtype), rng.standard_normal((9, 7)).astype(dtype)]
    x = rng.standard_normal((6, 12)).astype(dtype)
    results = {}
    for native_on in (True, False):
        monkeypatch.setenv("OPFORGE_NATIVE", "1" if native_on else "0")
        params = [of.tensor(a.copy(), requires_grad=True) for a in start]
        arrays = [p.numpy() for p in params]
        step = of.compile(_sgd_step(params, 0.1))
        for _ in range(3):
            step(of.tensor(x))
        sources = [p.source for p in _gemm_plans(step)]
        assert (sum(s.count("gemm_update(") for s in sources) >= 2) == native_on
        assert all(np.shares_memory(p.numpy(), a) for p, a in zip(params, arrays))  # updated in place
        results[native_on] = [p.numpy() for p in params]
    # the unfused program rounds each gradient before scaling it: a few ulp of the update's size at most
    eps = np.finfo(dtype).eps
    for got, want, a in zip(results[True], results[False], start):
        np.testing.assert_allclose(got, want, rtol=0, atol=16 * eps * (np.abs(a).max() + 1))


def _update(p):
    def update(a, b, s):
        with of.no_grad():
            assign(p, p - s * (a @ b))
        return s * 1.0  # (p · 1 would join the update in a native region with two results)

    return update


def _self_update(p, transposed: bool):
    def update(b, s):
        with of.no_grad():
            assign(p, p - s * ((F.transpose(p, perm=[1, 0]) if transposed else p) @ b))
        return s * 1.0

    return update


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf·0, as the unfused kernels warn
@pytest.mark.parametrize("blas", ["numpy's", "scipy's"])
def test_gemm_update_values_edge_cases_and_operands_that_are_the_parameter(blas, monkeypatch):
    from opforge.program import gemm

    if blas == "scipy's":
        monkeypatch.setattr(gemm, "_numpy_cblas", lambda: {})
    rng = np.random.default_rng(6)
    p0 = rng.standard_normal((5, 5))
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 5))
    a_inf = a.copy()
    a_inf[1, 2] = np.inf
    cases = [(a, b, 0.3), (a.T.copy().T, b.T.copy().T, -2.0),  # Fortran-ordered operands
             (a_inf, b, 0.0), (a, b, np.nan), (a_inf, b, 0.5)]  # inf·0 is NaN: a zero step runs unfused
    for a_, b_, s in cases:
        p = of.tensor(p0.copy())
        fn = of.compile(_update(p))
        fn(of.tensor(a_), of.tensor(b_), of.tensor(np.array(s)))
        got = p.numpy()
        with np.errstate(invalid="ignore"):
            want = p0 - s * (a_ @ b_)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert any("gemm_update(" in plan.source for plan in _gemm_plans(fn))
    # the product reads the parameter it updates (pᵀ @ b, and p @ b with p square): no write before the read
    for transposed in (True, False):
        p = of.tensor(p0.copy())
        fn = of.compile(_self_update(p, transposed))
        b5 = rng.standard_normal((5, 5))
        fn(of.tensor(b5), of.tensor(np.array(0.25)))
        np.testing.assert_allclose(p.numpy(), p0 - 0.25 * ((p0.T if transposed else p0) @ b5), rtol=1e-13,
                                   atol=1e-13)
        assert any("gemm_update(" in plan.source for plan in _gemm_plans(fn))


def test_gemm_update_steps_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    start = [rng.standard_normal((12, 9)), rng.standard_normal((9, 7))]
    x = rng.standard_normal((6, 12))
    params = [of.tensor(a.copy(), requires_grad=True) for a in start]
    step = of.compile(_sgd_step(params, 0.05))
    theirs = [torch.tensor(a, requires_grad=True) for a in start]
    for _ in range(4):
        step(of.tensor(x))
        loss = torch.tanh(torch.tanh(torch.tensor(x) @ theirs[0]) @ theirs[1]).sum()
        grads = torch.autograd.grad(loss, theirs)
        with torch.no_grad():
            for t, g in zip(theirs, grads):
                t -= 0.05 * g
    assert any("gemm_update(" in plan.source for plan in _gemm_plans(step))
    for ours, t in zip(params, theirs):
        np.testing.assert_allclose(ours.numpy(), t.detach().numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_an_optimizer_step_without_momentum_adds_each_weight_gradient_in_its_gemm(momentum):
    from opforge import nn

    rng = np.random.default_rng(8)
    x = of.tensor(rng.standard_normal((8, 20)))
    models = []
    for compiled in (True, False):
        of.manual_seed(0)
        model = nn.Sequential(nn.Linear(20, 16), nn.Tanh(), nn.Linear(16, 4)).to(np.float64)
        opt = of.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)

        def step(x, model=None, opt=None):
            loss = F.sum(F.tanh(model(x)))
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        fn = of.compile(step) if compiled else step
        for _ in range(3):
            fn(x, model=model, opt=opt)
        if compiled:
            updates = sum(plan.source.count("gemm_update(") for plan in _gemm_plans(fn))
            assert updates == (2 if momentum == 0 else 0)  # the two weights; biases are sums, not products
        models.append(model)
    for ours, eager in zip(*(m.parameters() for m in models)):
        np.testing.assert_allclose(ours.numpy(), eager.numpy(), rtol=1e-12, atol=1e-12)


def test_a_group_runs_natively_where_one_call_costs_less_than_its_kernels(monkeypatch):
    monkeypatch.setattr(native, "worth_a_call", COST_RULE)  # the real rule, not this module's fixture

    def native_calls(fn, **feeds):
        program = of.trace(fn, **{k: of.Spec(v.shape, v.dtype) for k, v in feeds.items()})
        exe = of.Executor(program, native=True)
        got, want = exe.run(feeds)["out"], of.Executor(program, native=False).run(feeds)["out"]
        np.testing.assert_allclose(got, want, rtol=1e-6)
        return exe.plan(feeds).source.count(", native")

    small = np.linspace(-1, 1, 512, dtype=np.float32)
    s = np.array(0.1, np.float32)
    assert native_calls(lambda b, g, s: b - s * g, b=small, g=small[::-1].copy(), s=s) == 0  # a bias update
    def chain(x):
        for _ in range(4):
            x = F.tanh(x) * x
        return x

    assert native_calls(chain, x=small) == 1  # 8 ops, one array in and one out
    large = np.linspace(-1, 1, native.SMALL, dtype=np.float32)
    assert native_calls(lambda b, g, s: b - s * g, b=large, g=large[::-1].copy(), s=s) == 1


def test_without_a_compiler_or_by_switch_updates_keep_their_matmul(monkeypatch):
    rng = np.random.default_rng(9)
    start = [rng.standard_normal((12, 9)), rng.standard_normal((9, 7))]
    x = of.tensor(rng.standard_normal((6, 12)))
    results = []
    for setting in ("on", "switch", "no compiler"):
        monkeypatch.setenv("OPFORGE_NATIVE", "0" if setting == "switch" else "1")
        if setting == "no compiler":
            monkeypatch.setenv("CC", "/nonexistent/cc")
        native.compiler.cache_clear()
        try:
            params = [of.tensor(a.copy(), requires_grad=True) for a in start]
            step = of.compile(_sgd_step(params, 0.1))
            step(x)
            assert any("gemm_update(" in p.source for p in _gemm_plans(step)) == (setting == "on")
            results.append([p.numpy() for p in params])
        finally:
            monkeypatch.delenv("CC", raising=False)
            native.compiler.cache_clear()
    for a, b in zip(results[1], results[2]):
        np.testing.assert_array_equal(a, b)  # both the unfused program, bit for bit
    for a, b in zip(results[0], results[1]):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_two_regions_never_read_each_others_results():
    """A region of (3,) values and one of (2, 3) values, each with an op reading a result computed outside from the
    other region (batch norm's backward has this shape): the later op may not join, or neither region could run
    first (the plan lost the ops of both)."""

    def fn(x, v):
        c = 1.0 / F.sqrt(v + 1.0)  # region of (3,) values
        m = x * 2.0  # region of (2, 3) values
        s = F.sum(m, axis=0)  # read from the (2, 3) region
        y = m * c  # joins the (2, 3) region, reading the (3,) one's c
        d = s * c  # may not join the (3,) region: s comes from a region that reads c
        return y + 1.0, d - 1.0, c * 3.0, m - 1.0, F.sqrt(d * d)

    rng = np.random.default_rng(10)
    x, v = rng.standard_normal((2, 3)), rng.uniform(0.5, 2.0, 3)
    program = of.trace(fn, x=of.Spec(x.shape, x.dtype), v=of.Spec(v.shape, v.dtype))
    got = of.Executor(program, native=True).run(x=x, v=v)
    want = of.Executor(program, native=False).run(x=x, v=v)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12)


# -- sums of matrix products as GEMMs adding into one buffer (gemm.GemmSum) -----------------------------------------


def _sums_of_products(x, w, v, c, h):
    """Sums of the kinds a second backward pass makes: a bias plus products read transposed (x·wᵀ as (w·xᵀ)ᵀ), a
    product read by the sum alone beside one also fetched, the sum of two weight gradients (aᵀ·b + cᵀ·d)."""
    fetched = x @ F.transpose(v, perm=[1, 0])
    first = F.add_n([F.broadcast_to(c, (x.shape[0], w.shape[0])), F.transpose(w @ F.transpose(x, perm=[1, 0]),
                                                                              perm=[1, 0]), fetched])
    second = F.add_n([F.transpose(h, perm=[1, 0]) @ first, F.transpose(first, perm=[1, 0]) @ h])
    third = first @ w + F.tanh(first) @ v  # (add, not add_n)
    return {"first": first, "second": second, "third": third, "fetched": fetched}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [32, 256])  # 32 rows of float32: the products are summed transposed (few rows)
def test_a_sum_of_matrix_products_is_one_step_of_gemms_equal_to_the_unfused_sum(dtype, rows, blas_library):
    from opforge.program import gemm

    blas_library("openblas")  # (NumPy's own: the few-rows rule is OpenBLAS's; test_blas.py runs the sums in MKL)

    rng = np.random.default_rng(10)
    feeds = {"x": rng.standard_normal((rows, 300)), "w": rng.standard_normal((512, 300)),
             "v": rng.standard_normal((512, 300)), "c": rng.standard_normal(512), "h": rng.standard_normal((rows, 512))}
    feeds = {k: a.astype(dtype) for k, a in feeds.items()}
    program = of.trace(_sums_of_products, **{k: of.Spec(a.shape, a.dtype) for k, a in feeds.items()})
    fused, unfused = of.Executor(program, native=True), of.Executor(program, native=False)
    source = fused.plan(feeds).source
    few_rows = (dtype, rows) == (np.float32, 32)
    # a sum is made one step where that pays (gemm.LARGE): with 32 rows, only the 512 × 512 sum, and the first
    # (32 × 512, its product x·wᵀ) summed transposed in float32
    assert source.count("gemm_sum(") == (3 if rows == 256 else 2 if few_rows else 1)
    assert "gemm_sum" not in unfused.plan(feeds).source
    assert source.count(", True)") == few_rows
    # the bias's broadcast is no step of its own: a GEMM sum's first pass reads c broadcast, an add_n adds it
    # broadcast (fusion.broadcast_summands)
    gemm_first = rows == 256 or few_rows
    labels = fused.plan(feeds).line_ops.values()
    assert gemm_first == (" = c + " in source)
    assert not any(" broadcast_to -> " in label for label in labels)
    got, want = fused.run(feeds), unfused.run(feeds)
    exact = {k: _sums_of_products(*(of.tensor(feeds[n].astype(np.float64)) for n in "xwvch"))[k].numpy()
             for k in want}
    eps = np.finfo(dtype).eps
    np.testing.assert_array_equal(got["fetched"], want["fetched"])
    for k in want:
        # products no longer rounded before they are added, summed in another order: a few ulp of the terms' size
        scale = np.abs(exact[k]).max()
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=64 * eps * scale)
        np.testing.assert_allclose(got[k], exact[k], rtol=0, atol=512 * eps * scale)
    # the transposed sum is taken where the product reads its right operand transposed, and gives the same values
    assert gemm._few_rows(of.Spec((32, 512), np.float32), [("x", None, None)], {"x": of.Spec((32, 300), np.float32)})
    assert not gemm._few_rows(of.Spec((32, 512), np.float64), [("x", None, None)],
                              {"x": of.Spec((32, 300), np.float64)})


def test_gemm_sums_match_torch_on_a_hessian_vector_product():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    shapes = [(256, 30), (256,), (5, 256), (5,)]  # (the first layer's sums are large enough to be GEMM sums)
    start = [rng.standard_normal(s) for s in shapes]
    direction = [rng.standard_normal(s) for s in shapes]
    x, y = rng.standard_normal((256, 30)), rng.integers(0, 5, 256)
    params = [of.tensor(a, requires_grad=True) for a in start]

    def hvp(x, y):
        h = F.relu(F.linear(x, params[0], params[1]))
        grads = of.grad(F.cross_entropy(F.linear(h, params[2], params[3]), y), params, create_graph=True)
        return of.grad(sum((g * of.tensor(d)).sum() for g, d in zip(grads, direction)), params)

    fn = of.compile(hvp)
    ours = [g.numpy() for g in fn(of.tensor(x), of.tensor(y))]
    assert any("gemm_sum(" in plan.source for plan in _gemm_plans(fn))
    theirs = [torch.tensor(a, requires_grad=True) for a in start]
    h = torch.relu(torch.nn.functional.linear(torch.tensor(x), theirs[0], theirs[1]))
    loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, theirs[2], theirs[3]), torch.tensor(y))
    grads = torch.autograd.grad(loss, theirs, create_graph=True)
    want = torch.autograd.grad(sum((g * torch.tensor(d)).sum() for g, d in zip(grads, direction)), theirs)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("blas", ["numpy's", "scipy's"])
def test_gemm_sum_writes_into_a_dying_summand_not_into_an_operand_and_keeps_nan(blas, monkeypatch):
    from opforge.program import gemm

    if blas == "scipy's":
        monkeypatch.setattr(gemm, "_numpy_cblas", lambda: {})
    rng = np.random.default_rng(12)
    a, s = rng.standard_normal((256, 256)), rng.standard_normal((256, 256))
    a[2, 3] = np.inf
    b = rng.standard_normal((256, 256))
    b[0, 0] = np.nan

    def fn(a, b, s):
        t = F.tanh(s)  # dies in the sum: its buffer may receive it
        return F.add_n([t, a @ b, F.transpose(b @ t, perm=[1, 0])]) + F.add_n([a @ a, a])

    feeds = {"a": a, "b": b, "s": s}
    program = of.trace(fn, **{k: of.Spec(v.shape, v.dtype) for k, v in feeds.items()})
    exe = of.Executor(program, native=True)
    assert exe.plan(feeds).source.count("gemm_sum(") == 2
    with np.errstate(invalid="ignore"):
        got, want = exe.run(feeds)["out"], of.Executor(program, native=False).run(feeds)["out"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [8, 64, 300])  # (8 to 64 float32 rows: linear's transposed product)
def test_a_bias_after_a_gemm_joins_the_activation_loop_with_the_same_bits(dtype, rows, blas_library):
    blas_library("openblas")  # the GEMM in eager's library: the same bits (in MKL, test_blas.py: within rounding)
    rng = np.random.default_rng(13)
    feeds = {"x": rng.standard_normal((rows, 300)), "w": rng.standard_normal((256, 300)),
             "b": rng.standard_normal(256), "w2": rng.standard_normal((256, 300))}
    feeds = {k: a.astype(dtype) for k, a in feeds.items()}
    feeds["b"][:3] = [np.inf, -np.inf, np.nan]

    def fn(x, w, b, w2):
        h = F.relu(F.linear(x, w, b))  # read by relu alone: the bias joins relu's loop
        z = F.linear(x, w2, b)  # read by a sum too: stays
        return {"h": F.where(h > 1, h * 2.0, -h), "z": F.sum(z, axis=[1]) + F.relu(z).sum()}

    program = of.trace(fn, **{k: of.Spec(a.shape, a.dtype) for k, a in feeds.items()})
    fused = of.Executor(program, native=True)
    plan = fused.plan(feeds)
    linears = [label for label in plan.line_ops.values() if " linear -> " in label]
    assert len(linears) == 2 and sum("@product" in label for label in linears) == 1
    assert any(label.startswith("op #") and "fused(linear" in label for label in plan.line_ops.values())
    with np.errstate(invalid="ignore"):
        got, want = fused.run(feeds), of.Executor(program, native=False).run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])  # bit for bit, NaN and infinities included


# -- Adam's step: one native loop per parameter ----------------------------------------------------------------------


def _adam_run(dtype, optimizer, settings, steps=3, compiled=True):
    """A tanh network's parameters and optimizer state after ``steps`` steps of ``optimizer`` (compiled or eager),
    and the compiled step's plan sources."""
    rng = np.random.default_rng(17)
    params = [of.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)
              for shape in [(12, 9), (9,), (9, 7)]]
    x = of.tensor(rng.standard_normal((6, 12)).astype(dtype))
    opt = optimizer(params, **settings)

    def step(x):
        opt.zero_grad()
        loss = F.sum(F.tanh(F.tanh(x @ params[0] + params[1]) @ params[2]))
        loss.backward()
        opt.step()
        return loss

    fn = of.compile(step) if compiled else step
    arrays = [p.numpy() for p in params]
    for _ in range(steps):
        fn(x)
    if compiled:
        assert all(np.shares_memory(p.numpy(), a) for p, a in zip(params, arrays))  # updated in place
    state = [p.numpy().copy() for p in params]
    state += [opt.state[p][k].numpy().copy() for p in params for k in ("exp_avg", "exp_avg_sq")]
    return state, [plan.source for plan in _gemm_plans(fn)] if compiled else []


ADAMS = [(of.optim.Adam, {"lr": 0.01}), (of.optim.Adam, {"lr": 0.02, "weight_decay": 0.1}),
         (of.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
         (of.optim.Adam, {"lr": 0.01, "betas": (0.3, 0.9), "eps": 1e-6}),  # beta1 < 0.5: the lerp's other end
         (of.optim.AdamW, {"lr": 0.01, "maximize": True})]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("optimizer, settings", ADAMS)
def test_an_adam_step_is_one_native_loop_per_parameter_with_the_unfused_bits(dtype, optimizer, settings, monkeypatch):
    fused, sources = _adam_run(dtype, optimizer, settings)
    assert sum(s.count("# adam_step(") for s in sources) == 3
    # the three variables are written by the loop: no copy of them after it
    assert not any("_copy_into" in line and "exp_avg" in line for s in sources for line in s.splitlines())
    with monkeypatch.context() as patch:  # the same native program but the Adam ops
        patch.setattr(native, "adam_steps", lambda ops, kernels, specs, updates: (ops, kernels))
        unfused, sources = _adam_run(dtype, optimizer, settings)
        assert not any("# adam_step(" in s for s in sources)
    for got, want in zip(fused, unfused):
        np.testing.assert_array_equal(got, want)  # bit for bit: the members' arithmetic in their order
    # against NumPy's path and eager: the gradients' native tanh (libmvec) may differ in the last bits
    monkeypatch.setenv("OPFORGE_NATIVE", "0")
    numpy_path, sources = _adam_run(dtype, optimizer, settings)
    assert not any("# adam_step(" in s for s in sources)
    eager, _ = _adam_run(dtype, optimizer, settings, compiled=False)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for got, want, ours in zip(fused, numpy_path, eager):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        np.testing.assert_allclose(got, ours, rtol=tol, atol=tol)


def test_an_adam_step_without_its_library_runs_its_members_kernels(monkeypatch):
    def no_compiler(functions, opdefs):
        raise native.Unsupported("no compiler")

    monkeypatch.setattr(native, "build", no_compiler)
    monkeypatch.setattr(native, "_warned", [True])  # (warned already)
    got, sources = _adam_run(np.float64, of.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1})
    assert any("# adam_step(" in line and line.endswith(", members") for s in sources for line in s.splitlines())
    monkeypatch.setattr(native, "adam_steps", lambda ops, kernels, specs, updates: (ops, kernels))
    want, _ = _adam_run(np.float64, of.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1})
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_amsgrad_keeps_the_ops_and_their_values(monkeypatch):
    results = {}
    for native_on in (True, False):
        monkeypatch.setenv("OPFORGE_NATIVE", "1" if native_on else "0")
        results[native_on], sources = _adam_run(np.float32, of.optim.Adam, {"lr": 0.01, "amsgrad": True})
        assert not any("# adam_step(" in s for s in sources)
    for got, want in zip(results[True], results[False]):  # (the native tanh may differ in the last bits)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("optimizer, settings", ADAMS[:3])
def test_native_adam_steps_follow_torch(optimizer, settings):
    torch = pytest.importorskip("torch")
    ours, sources = _adam_run(np.float64, optimizer, settings, steps=4)
    assert any("# adam_step(" in s for s in sources)
    rng = np.random.default_rng(17)
    params = [torch.tensor(rng.standard_normal(shape), requires_grad=True) for shape in [(12, 9), (9,), (9, 7)]]
    x = torch.tensor(rng.standard_normal((6, 12)))
    opt = getattr(torch.optim, optimizer.__name__)(params, **settings)
    for _ in range(4):
        opt.zero_grad()
        torch.tanh(torch.tanh(x @ params[0] + params[1]) @ params[2]).sum().backward()
        opt.step()
    theirs = [p.detach().numpy() for p in params]
    theirs += [opt.state[p][k].numpy() for p in params for k in ("exp_avg", "exp_avg_sq")]
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)



def test_an_adam_loop_given_arrays_in_another_layout_runs_the_members_or_copies_the_grad():
    rng = np.random.default_rng(3)
    w = of.tensor(rng.standard_normal((5, 4)), requires_grad=True)
    opt = of.optim.Adam([w], lr=0.1, weight_decay=0.1)

    def step(x):
        opt.zero_grad()
        F.sum(F.tanh(x @ w)).backward()
        opt.step()

    compiled = of.compile(step)
    compiled(of.tensor(rng.standard_normal((3, 5))))
    (plan,) = _gemm_plans(compiled)
    name = next(line[4:].split("(")[0] for line in plan.source.splitlines() if "# adam_step(" in line)
    loop, members = plan.fn.__globals__[name], plan.fn.__globals__[name + "_members"]
    scalars = (np.array(3), np.array(0.1), np.array(0.9))

    def arrays():  # param, grad, exp_avg, exp_avg_sq
        r = np.random.default_rng(4)
        return [r.standard_normal((5, 4)), r.standard_normal((5, 4)), r.standard_normal((5, 4)),
                r.uniform(0.1, 1, (5, 4))]

    want = members(*arrays(), *scalars)  # (new exp_avg, exp_avg_sq, param)
    for layout in ("C", "grad transposed", "param transposed"):
        p, g, m, v = arrays()
        if layout == "grad transposed":  # copied to C order for the loop
            g = np.ascontiguousarray(g.T).T
        if layout == "param transposed":  # the loop cannot write it: the members' kernels
            p = np.ascontiguousarray(p.T).T
        got = loop(p, g, m, v, *scalars, None)
        assert got[2] is p and got[0] is m and got[1] is v
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    p, g, m, v = arrays()
    with pytest.raises(of.ShapeError, match="adam_exp_avg"):  # a shape the plan did not promise: no loop over it
        loop(p, g.reshape(4, 5), m, v, *scalars, None)


# -- layer_norm as one row loop ---------------------------------------------------------------------------------------


def _layer_norm_rows(dtype, shape):
    """Rows that exercise every branch of the kernel: random, offset far from 0 (μ's rounding: the recentring),
    constant, with a NaN, with ±inf, finite but overflowing the variance (the kernel's scaled path)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 3 + 0.5).astype(dtype)
    flat = x.reshape(-1, math.prod(shape[-1:]))
    flat[1] += 4e7
    flat[2] = 4e7
    flat[3, 0] = np.nan
    flat[4, :2] = [np.inf, -np.inf] if flat.shape[1] > 1 else [np.inf]
    return x


def _no_kernel_fallback(plan):
    """Make the row loops' fallback to the op's kernel (``k<i>_k`` in the plan's globals) fail: the rows given must
    all run through the loop, special rows included."""
    def fallback(*args, **kwargs):
        raise AssertionError("the row loop fell back to the kernel")

    names = [k for k in plan.fn.__globals__ if k.startswith("k") and k.endswith("_k")]
    assert names
    for k in names:
        plan.fn.__globals__[k] = fallback


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width,affine", [(64, "wb"), (3, "w"), (1, "b"), (200, ""), (17, "wb")])
def test_layer_norm_is_one_native_row_loop(dtype, width, affine):
    import torch

    x = _layer_norm_rows(dtype, (6, 5, width))
    rng = np.random.default_rng(1)
    w = rng.standard_normal(width).astype(dtype) if "w" in affine else None
    b = rng.standard_normal(width).astype(dtype) if "b" in affine else None
    feeds = {"x": x, **({"w": w} if w is not None else {}), **({"b": b} if b is not None else {})}
    specs = {k: of.Spec(v.shape, dtype) for k, v in feeds.items()}

    def f(x, w=None, b=None):
        return F.layer_norm(x, [width], w, b)

    program = of.trace(f, **specs)
    exe = of.Executor(program)
    source = exe.plan(**feeds).source
    assert "layer_norm_step" in source and ", native" in source  # the plan holds the native row loop
    _no_kernel_fallback(exe.plan(**feeds))
    (y,) = exe.run(feeds).values()
    (unfused,) = of.Executor(program, native=False).run(feeds).values()
    eager = f(**{k: of.tensor(v) for k, v in feeds.items()}).numpy()
    # the kernel's operations in its order and NumPy's pairwise sums: its bits, NaN rows included
    np.testing.assert_array_equal(y, eager)
    np.testing.assert_array_equal(y, unfused)
    # torch in float64 (its float32 kernel loses the row offset by 4e7: 0.6 off, where ours is within 3e-8)
    t = lambda a: None if a is None else torch.from_numpy(a.astype(np.float64))  # noqa: E731
    expected = torch.nn.functional.layer_norm(t(x), [width], t(w), t(b)).numpy()
    finite = np.isfinite(x).all(axis=-1).reshape(-1)
    tol = 1e-4 if dtype == "float32" else 1e-7  # (the row offset by 4e7: condition ~1e7)
    np.testing.assert_allclose(y.reshape(-1, width)[finite], expected.reshape(-1, width)[finite], rtol=tol, atol=tol)
    assert np.isnan(y.reshape(-1, width)[~finite]).all() == np.isnan(expected.reshape(-1, width)[~finite]).all()


def test_layer_norm_loop_takes_the_kernel_where_it_does_not_apply():
    """A row whose variance overflows (finite values of 1e20 in float32) runs the kernel's scaled path; an input in
    another layout is read by the kernel; a float32 weight on float64 x keeps the op."""
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    x[1] *= 1e20
    program = of.trace(lambda x: F.layer_norm(x, [8]), x=of.Spec((4, 8), "float32"))
    exe = of.Executor(program)
    assert ", native" in exe.plan(x=x).source
    (y,) = exe.run(x=x).values()
    np.testing.assert_array_equal(y, F.layer_norm(of.tensor(x), [8]).numpy())
    assert np.isfinite(y).all()
    xt = np.asfortranarray(x)
    (y,) = exe.run(x=xt).values()
    np.testing.assert_array_equal(y, F.layer_norm(of.tensor(xt), [8]).numpy())  # (the kernel's bits in that layout)
    mixed = of.trace(lambda x, w: F.layer_norm(x, [8], w), x=of.Spec((4, 8), "float64"), w=of.Spec((8,), "float32"))
    assert "layer_norm_step" not in of.Executor(mixed).plan(x=x.astype(np.float64), w=np.ones(8, np.float32)).source


def _flagged_cases():
    """(program, feeds that make the row loop ask for the kernel, feeds that do not, the kernel's answer to the first:
    a result, or the error it raises) for each row loop with a flag."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    big = x.copy()
    big[1] *= 1e20  # a row whose variance overflows: the kernel's scaled path
    layer_norm = of.trace(lambda x: F.layer_norm(x, [8]), x=of.Spec((4, 8), "float32"))
    yield layer_norm, {"x": big}, {"x": x}, F.layer_norm(of.tensor(big), [8]).numpy()
    t, bad = np.array([0, 1, 2, 3]), np.array([0, 1, 8, 3])  # class 8 of 8: out of range, the kernel names it
    loss = of.trace(lambda x, t: F.cross_entropy(x, t), x=of.Spec((4, 8), "float32"), t=of.Spec((4,), "int64"))
    yield loss, {"x": x, "t": bad}, {"x": x, "t": t}, of.ArgumentError
    grad = of.trace(lambda x, t, d: F.cross_entropy_grad(x, t, d), x=of.Spec((4, 8), "float32"),
                    t=of.Spec((4,), "int64"), d=of.Spec((), "float32"))
    d = np.float32(1.0)
    yield grad, {"x": x, "t": bad, "d": d}, {"x": x, "t": t, "d": d}, of.ArgumentError


@pytest.mark.parametrize("case", range(3))
def test_a_row_loop_reads_the_flag_of_its_own_call(case):
    """Threads may run one plan at once (ctypes lets go of the GIL in the loop): a run whose loop asked for the kernel
    gets the kernel's answer even when another run of the plan finishes between its loop and its look at the flag
    (with one flag per plan, that run cleared it and this one returned its unfinished array)."""
    program, flagged, plain, want = list(_flagged_cases())[case]
    exe = of.Executor(program)
    plan = exe.plan(**flagged)
    (loop,) = [k for k in plan.fn.__globals__ if k.startswith("k") and k.endswith("_n")]
    if "_call" in plan.fn.__globals__:  # the plan's one loop called through opforge.program.fastcall
        loop = "_call"
    native, calls = plan.fn.__globals__[loop], []

    def interleaved(*pointers):
        native(*pointers)
        calls.append(pointers)
        if len(calls) == 1:  # the flagged run's loop: another run of the plan comes and goes meanwhile
            exe.run(**plain)

    plan.fn.__globals__[loop] = interleaved
    if isinstance(want, type):
        with pytest.raises(want):
            exe.run(**flagged)
    else:
        (got,) = exe.run(**flagged).values()
        np.testing.assert_array_equal(got, want)
    assert len(calls) == 2


def test_layer_norm_loop_in_a_training_step():
    """Forward and backward through the loop: the loss and gradients are the unfused program's bits and torch's."""
    import torch

    rng = np.random.default_rng(3)
    x, w0, b0 = rng.standard_normal((4, 6, 16)), rng.standard_normal(16), rng.standard_normal(16)
    w, b = of.tensor(w0, requires_grad=True), of.tensor(b0, requires_grad=True)
    program = of.trace(lambda x: {"loss": (F.layer_norm(x, [16], w, b) ** 2).sum()}, x=of.Spec(x.shape, "float64"))
    grads = of.append_backward(program, program.outputs["loss"])
    fetch = {"loss": program.outputs["loss"], **{n: grads[f"{n}@GRAD"] for n in program.parameters()}}
    exe = of.Executor(program, fetch=fetch)
    source = exe.plan(x=x).source
    assert "layer_norm_step" in source and "normalize_grad_step" in source
    out, unfused = exe.run(x=x), of.Executor(program, fetch=fetch, native=False).run(x=x)
    for key in fetch:
        np.testing.assert_array_equal(out[key], unfused[key])
    tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    loss = (torch.nn.functional.layer_norm(torch.tensor(x), [16], tw, tb) ** 2).sum()
    loss.backward()
    np.testing.assert_allclose(out["loss"], loss.item(), rtol=1e-12)
    (op,) = [op for op in program.block.ops if op.type == "layer_norm"]
    np.testing.assert_allclose(out[op.inputs["weight"][0]], tw.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(out[op.inputs["bias"][0]], tb.grad.numpy(), rtol=1e-10)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [1, 3, 64, 200])
def test_layer_norm_backward_is_one_native_row_loop(dtype, width):
    """normalize_grad (layer_norm's backward: dx and x̂) as one row loop: the kernel's bits, special rows included,
    and a float64 gradient as torch's."""
    import torch

    x = _layer_norm_rows(dtype, (6, 5, width))
    g = np.random.default_rng(4).standard_normal(x.shape).astype(dtype)
    program = of.trace(lambda x, g: F.normalize_grad(x, g, axes=[-1], eps=1e-5),
                       x=of.Spec(x.shape, dtype), g=of.Spec(x.shape, dtype))
    exe = of.Executor(program)
    assert "normalize_grad_step" in exe.plan(x=x, g=g).source and ", native" in exe.plan(x=x, g=g).source
    _no_kernel_fallback(exe.plan(x=x, g=g))
    out, unfused = exe.run(x=x, g=g), of.Executor(program, native=False).run(x=x, g=g)
    eager = F.normalize_grad(of.tensor(x), of.tensor(g), axes=[-1], eps=1e-5)
    for key, e in zip(out, eager):
        np.testing.assert_array_equal(out[key], unfused[key])
        np.testing.assert_array_equal(out[key], e.numpy())
    if dtype == "float64":
        tx = torch.tensor(x, requires_grad=True)
        torch.nn.functional.layer_norm(tx, [width]).backward(torch.tensor(g))
        dx = next(iter(out.values())).reshape(-1, width)
        finite = np.isfinite(x).all(axis=-1).reshape(-1)
        np.testing.assert_allclose(dx[finite], tx.grad.numpy().reshape(-1, width)[finite], rtol=1e-6, atol=1e-6)


# -- a lone pointwise op of several passes: a loop of its own ------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_lone_relu_grad_is_one_loop_with_the_kernels_bits(dtype):
    rng = np.random.default_rng(21)
    feeds = {"y": rng.standard_normal((64, 512)).astype(dtype), "dy": rng.standard_normal((64, 512)).astype(dtype),
             "a": rng.standard_normal((64, 512)).astype(dtype)}
    feeds["y"][0, :4] = [np.nan, 0.0, -0.0, np.inf]
    feeds["dy"][1, :3] = [np.nan, np.inf, -np.inf]

    def fn(y, dy, a):
        # relu_grad alone (three passes as a kernel: compare, multiply, NaN check); an add alone (one pass) stays
        return {"g": F.relu_grad(y, dy), "gt": F.relu_grad(F.transpose(y), F.transpose(a)), "s": y + a,
                "small": F.relu_grad(y[:2, :8], dy[:2, :8])}

    program = of.trace(fn, **{k: of.Spec(a.shape, a.dtype) for k, a in feeds.items()})
    fused, unfused = of.Executor(program, native=True), of.Executor(program, native=False)
    labels = list(fused.plan(feeds).line_ops.values())
    assert sum("fused(relu_grad" in label and " -> " in label for label in labels) == 2, labels  # (16 elements: not)
    assert any(" relu_grad -> " in label for label in labels) and any(" add -> " in label for label in labels)
    got, want = fused.run(feeds), unfused.run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)  # bit for bit, NaN and infinities included
    assert native.single_loops([], [], {}) == ([], [])


def test_a_lone_op_given_inputs_in_another_order_runs_its_kernel_as_its_op_would():
    """A conv's output is a batch-last view: relu_grad over it takes no C-ordered workspace buffer (its kernel would
    walk the two orders against each other, 6x slower on the digits CNN) and writes into no input its op does not
    name."""
    rng = np.random.default_rng(22)
    feeds = {"y": rng.standard_normal((512, 64)).astype(np.float32),
             "dy": rng.standard_normal((512, 64)).astype(np.float32)}

    def fn(y, dy):
        g = F.relu_grad(F.transpose(y), F.transpose(dy))  # two (64, 512) views in Fortran order
        return F.sum(g, axis=[1])

    program = of.trace(fn, **{k: of.Spec(a.shape, a.dtype) for k, a in feeds.items()})
    exe = of.Executor(program, native=True)
    plan = exe.plan(feeds)
    (line,) = [plan.source.splitlines()[n - 1] for n, label in plan.line_ops.items()
               if "fused(relu_grad" in label and " -> " in label]
    assert " if c" in line, line  # a workspace buffer only where the inputs are C-ordered
    got, want = exe.run(feeds), of.Executor(program, native=False).run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


# -- softmax, log_softmax and their gradients as one row loop --------------------------------------------------------


def _softmax_rows(dtype, shape):
    """Rows for every path of the kernels: random (Σ exp(x) ≥ 1: no max taken), very negative (Σ exp(x) < 1) and very
    large (overflow: the max), with a NaN or +inf first or last, all −inf."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    flat = x.reshape(-1, shape[-1])
    flat[1] -= 200
    flat[2] += 1000
    flat[3, 0] = np.nan
    flat[4, 0] = np.inf
    flat[5] = -np.inf
    flat[6, -1] = np.nan  # (last: past the loop's 16 running maxima)
    flat[7, -1] = np.inf
    return x


ROW_OPS = {"softmax": (F.softmax, "softmax"), "log_softmax": (F.log_softmax, "log_softmax"),
           "softmax_grad": (F.softmax_grad, "_softmax_backward_data"),
           "log_softmax_grad": (F.log_softmax_grad, "_log_softmax_backward_data")}


def _torch_rows(kind, *arrays):
    import torch

    t = [torch.from_numpy(a) for a in arrays]
    if kind in ("softmax", "log_softmax"):
        return getattr(torch, kind)(t[0], -1).numpy()
    y, dy = t
    return getattr(torch.ops.aten, ROW_OPS[kind][1])(dy, y, -1, y.dtype).numpy()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [1, 3, 10, 37, 200])
@pytest.mark.parametrize("kind", list(ROW_OPS))
def test_softmax_family_is_one_native_row_loop(kind, dtype, width):
    """Each op of the softmax family over the last axis runs as one row loop (the plan holds it, the kernel is not
    called): the kernel's values up to the order of each row sum (a few ulp), NaN/inf rows as the kernel has them,
    and torch's values."""
    x = _softmax_rows(dtype, (8, 3, width))
    fn = ROW_OPS[kind][0]
    if kind.endswith("_grad"):  # from a real forward output y and an upstream gradient dy
        forward = F.softmax if kind == "softmax_grad" else F.log_softmax
        feeds = {"y": forward(of.tensor(x), axis=-1).numpy(),
                 "dy": np.random.default_rng(9).standard_normal(x.shape).astype(dtype)}
    else:
        feeds = {"x": x}
    program = of.trace(lambda **a: fn(*a.values(), axis=-1), **{k: of.Spec(v.shape, dtype) for k, v in feeds.items()})
    exe = of.Executor(program)
    source = exe.plan(**feeds).source
    assert f"{kind}_row_step" in source and ", native" in source  # the plan holds the native row loop
    _no_kernel_fallback(exe.plan(**feeds))
    (y,) = exe.run(feeds).values()
    (unfused,) = of.Executor(program, native=False).run(feeds).values()
    eager = fn(*map(of.tensor, feeds.values()), axis=-1).numpy()
    np.testing.assert_array_equal(unfused, eager)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(eager))  # NaN rows and elements where the kernel has them
    ulps = 8 * np.finfo(dtype).eps  # (the row sums' order: pairwise here, a BLAS dot in the kernel)
    np.testing.assert_allclose(y, eager, rtol=ulps, atol=ulps)
    expected = _torch_rows(kind, *feeds.values())
    rows = np.isfinite(expected).all(axis=-1) & np.isfinite(np.stack(list(feeds.values()))).all(axis=(0, -1))
    np.testing.assert_allclose(y[rows], expected[rows], rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-6 if dtype == "float32" else 1e-13)


def test_softmax_loop_takes_the_kernel_where_it_does_not_apply():
    """Another axis or another dtype keeps the op; an input in another layout is read by the kernel."""
    x = np.random.default_rng(10).standard_normal((4, 8)).astype(np.float32)
    other_axis = of.trace(lambda x: F.softmax(x, axis=0), x=of.Spec((4, 8), "float32"))
    assert "row_step" not in of.Executor(other_axis).plan(x=x).source
    half = of.trace(lambda x: F.softmax(x, axis=-1), x=of.Spec((4, 8), "float16"))
    assert "row_step" not in of.Executor(half).plan(x=x.astype(np.float16)).source
    program = of.trace(lambda x: F.log_softmax(x, axis=-1), x=of.Spec((4, 8), "float32"))
    exe = of.Executor(program)
    assert "log_softmax_row_step" in exe.plan(x=x).source
    xt = np.asfortranarray(x)
    (y,) = exe.run(x=xt).values()
    np.testing.assert_array_equal(y, F.log_softmax(of.tensor(xt), axis=-1).numpy())  # the kernel's bits
    assert "row_step" not in of.Executor(program, native=False).plan(x=x).source


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_loops_in_a_training_step(dtype):
    """A classifier's loss through softmax and log_softmax: the compiled loss and gradient (both row loops, forward
    and backward) against the unfused program and torch; and second order (a Hessian-vector product) in float64."""
    import torch

    rng = np.random.default_rng(11)
    x0, w0 = rng.standard_normal((16, 10)).astype(dtype), rng.standard_normal((10, 10)).astype(dtype)
    w = of.tensor(w0, requires_grad=True)

    def loss(x):
        z = F.matmul(x, w)
        return {"loss": (F.softmax(z, axis=-1) * F.log_softmax(z * 0.5, axis=-1)).sum()}

    program = of.trace(loss, x=of.Spec(x0.shape, dtype))
    grads = of.append_backward(program, program.outputs["loss"])
    (p,) = program.parameters()
    fetch = {"loss": program.outputs["loss"], "grad": grads[f"{p}@GRAD"]}
    exe = of.Executor(program, fetch=fetch)
    source = exe.plan(x=x0).source
    for kind in ROW_OPS:
        assert f"{kind}_row_step" in source
    out, unfused = exe.run(x=x0), of.Executor(program, fetch=fetch, native=False).run(x=x0)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for key in fetch:
        np.testing.assert_allclose(out[key], unfused[key], rtol=tol, atol=tol)
    tw = torch.tensor(w0, requires_grad=True)
    tz = torch.tensor(x0) @ tw
    tl = (torch.softmax(tz, -1) * torch.log_softmax(tz * 0.5, -1)).sum()
    tl.backward()
    np.testing.assert_allclose(out["loss"], tl.item(), rtol=tol * 10)
    np.testing.assert_allclose(out["grad"], tw.grad.numpy(), rtol=tol * 10, atol=tol * 10)


def test_softmax_loops_in_a_compiled_hessian_vector_product():
    """Second order through the row loops (float64): of.compile'd double backward of a softmax/log_softmax loss, whose
    plan holds the loops, against torch's double backward and the unfused program."""
    import torch

    rng = np.random.default_rng(12)
    x0, w0, v0 = rng.standard_normal((16, 10)), rng.standard_normal((10, 10)), rng.standard_normal((10, 10))
    w, v = of.tensor(w0, requires_grad=True), of.tensor(v0)

    def hvp(x):
        z = F.matmul(x, w)
        loss = (F.softmax(z, axis=-1) * F.log_softmax(z * 0.5, axis=-1)).sum()
        (g,) = of.grad(loss, [w], create_graph=True)
        return of.grad((g * v).sum(), [w])[0]

    compiled = of.compile(hvp)
    got = compiled(of.tensor(x0)).numpy()
    program = compiled.program(of.tensor(x0))
    (feed,) = program.feeds
    source = of.Executor(program).plan(**{feed: x0}).source
    for kind in ROW_OPS:  # (the double backward's softmax_grad and log_softmax_grad, and their forwards)
        assert f"{kind}_row_step" in source
    tw = torch.tensor(w0, requires_grad=True)
    tz = torch.tensor(x0) @ tw
    (tg,) = torch.autograd.grad((torch.softmax(tz, -1) * torch.log_softmax(tz * 0.5, -1)).sum(), [tw],
                                create_graph=True)
    (expected,) = torch.autograd.grad((tg * torch.tensor(v0)).sum(), [tw])
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got, hvp(of.tensor(x0)).numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reduction,smoothing,ignore", [("mean", 0.0, -100), ("mean", 0.2, 1), ("sum", 0.0, 1),
                                                        ("none", 0.1, -100), ("mean", 0.0, 1)])
@pytest.mark.parametrize("classes", [1, 10, 37])
def test_cross_entropy_grad_is_one_native_row_loop(dtype, reduction, smoothing, ignore, classes):
    """cross_entropy's backward in a compiled program is one row loop (the plan holds it, the kernel is not called):
    the kernel's values up to the row sums' order, NaN/inf rows as the kernel has them, torch's gradient; ignored
    targets, label smoothing and each reduction."""
    import torch

    x = _softmax_rows(dtype, (24, classes))
    t = np.random.default_rng(13).integers(0, classes, 24)
    t[::5] = ignore if ignore < classes else t[::5]

    def loss_and_grad(x, t):
        loss = F.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing, ignore_index=ignore)
        return (loss, *of.grad(loss.sum(), [x]))

    program = of.compile(loss_and_grad).program(of.tensor(x, requires_grad=True), of.tensor(t))
    feeds = dict(zip(program.feeds, [x, t]))
    exe = of.Executor(program)
    assert "cross_entropy_grad_row_step" in exe.plan(**feeds).source and ", native" in exe.plan(**feeds).source
    _no_kernel_fallback(exe.plan(**feeds))
    got = list(exe.run(feeds).values())[1]
    unfused = list(of.Executor(program, native=False).run(feeds).values())[1]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(unfused))
    ulps = 8 * np.finfo(dtype).eps  # (the row sums' order: pairwise here, a BLAS dot in the kernel)
    np.testing.assert_allclose(got, unfused, rtol=ulps, atol=ulps)
    finite = np.isfinite(x).all(axis=1)  # (torch in float64 on the finite rows: "mean" over those alone)
    tx = torch.tensor(x[finite].astype(np.float64), requires_grad=True)
    tl = torch.nn.functional.cross_entropy(tx, torch.tensor(t[finite]), reduction=reduction,
                                           label_smoothing=smoothing, ignore_index=ignore)
    tl.sum().backward()
    sub = of.compile(loss_and_grad).program(of.tensor(x[finite], requires_grad=True), of.tensor(t[finite]))
    sub_feeds = dict(zip(sub.feeds, [x[finite], t[finite]]))
    assert "cross_entropy_grad_row_step" in of.Executor(sub).plan(**sub_feeds).source
    got = list(of.Executor(sub).run(sub_feeds).values())[1]
    tol = 1e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore", [-100, 1])
@pytest.mark.parametrize("classes", [1, 10, 37])
def test_cross_entropy_is_one_native_row_loop(dtype, reduction, ignore, classes):
    """cross_entropy in a compiled program is one row loop (the plan holds it, the kernel is not called): the
    kernel's values up to the row sums' order and glibc's log, NaN/inf rows as the kernel has them (a NaN row's loss
    is NaN, an ignored one's 0), targets far below their row's max (log Σ − (x[t] − c) where e[t] is under the
    smallest normal number or the ratio Σ/e[t] overflows), every reduction; torch's values on the finite rows."""
    import torch

    x = _softmax_rows(dtype, (24, classes))
    t = np.random.default_rng(16).integers(0, classes, 24)
    t[::5] = ignore if ignore < classes else t[::5]
    if classes > 2:  # (target k, not the ignore_index 1)
        k = classes - 1
        x[8], x[8, 0], x[8, k], t[8] = -1e4, 0, -88 if dtype == "float32" else -709, k  # e[t] subnormal, Σ/e[t] finite
        x[9], x[9, k], t[9] = 0, -120 if dtype == "float32" else -800, k  # e[t] = 0: Σ/e[t] = inf
    program = of.trace(lambda x, t: F.cross_entropy(x, t, reduction=reduction, ignore_index=ignore),
                       x=of.Spec(x.shape, dtype), t=of.Spec(t.shape, "int64"))
    exe = of.Executor(program)
    source = exe.plan(x=x, t=t).source
    assert "cross_entropy_row_step" in source and ", native" in source
    _no_kernel_fallback(exe.plan(x=x, t=t))
    (got,) = exe.run(x=x, t=t).values()
    (unfused,) = of.Executor(program, native=False).run(x=x, t=t).values()
    assert got.shape == unfused.shape and got.dtype == unfused.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(unfused))
    ulps = 8 * np.finfo(dtype).eps  # (the row sums' order: pairwise here, a BLAS dot in the kernel; glibc's log)
    np.testing.assert_allclose(got, unfused, rtol=ulps, atol=ulps)
    finite = np.isfinite(x).all(axis=1)  # (torch in float64 on the finite rows)
    want = torch.nn.functional.cross_entropy(torch.tensor(x[finite].astype(np.float64)), torch.tensor(t[finite]),
                                             reduction=reduction, ignore_index=ignore).numpy()
    sub = of.trace(lambda x, t: F.cross_entropy(x, t, reduction=reduction, ignore_index=ignore),
                   x=of.Spec(x[finite].shape, dtype), t=of.Spec(t[finite].shape, "int64"))
    assert "cross_entropy_row_step" in of.Executor(sub).plan(x=x[finite], t=t[finite]).source
    (got,) = of.Executor(sub).run(x=x[finite], t=t[finite]).values()
    tol = 1e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_cross_entropy_loop_takes_the_kernel_where_it_does_not_apply():
    """A target out of range runs the kernel, which names it; every target ignored gives the kernel's nan for "mean";
    class weights, label smoothing, probability targets and logits of another rank keep the op."""
    x = np.random.default_rng(17).standard_normal((4, 3))
    program = of.trace(lambda x, t: F.cross_entropy(x, t), x=of.Spec((4, 3), "float64"), t=of.Spec((4,), "int64"))
    exe = of.Executor(program)
    assert "cross_entropy_row_step" in exe.plan(x=x, t=np.zeros(4, np.int64)).source
    with pytest.raises(of.ArgumentError, match=r"cross_entropy\(\): target holds class 3"):
        exe.run(x=x, t=np.array([0, 1, 3, 2]))
    with pytest.raises(of.ArgumentError, match=r"cross_entropy\(\): target holds class -2"):
        exe.run(x=x, t=np.array([0, -2, 1, 2]))
    (loss,) = exe.run(x=x, t=np.array([0, 1, 2, 2])).values()  # the loop again after a refused call
    np.testing.assert_allclose(loss, F.cross_entropy(of.tensor(x), of.tensor(np.array([0, 1, 2, 2]))).numpy(),
                               rtol=1e-15)
    (loss,) = exe.run(x=x, t=np.full(4, -100)).values()
    assert loss.shape == () and np.isnan(loss)
    int32 = of.trace(lambda x, t: F.cross_entropy(x, t, reduction="sum"), x=of.Spec((4, 3), "float64"),
                     t=of.Spec((4,), "int32"))
    t32 = np.array([2, 0, -100, 1], np.int32)
    assert "cross_entropy_row_step" in of.Executor(int32).plan(x=x, t=t32).source
    (loss,) = of.Executor(int32).run(x=x, t=t32).values()
    np.testing.assert_allclose(loss, F.cross_entropy(of.tensor(x), of.tensor(t32), reduction="sum").numpy(),
                               rtol=1e-15)
    others = {
        "weight": (lambda x, t, w: F.cross_entropy(x, t, w), {"w": (np.ones(3), of.Spec((3,), "float64"))}),
        "smoothing": (lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), {}),
    }
    for name, (fn, extra) in others.items():
        specs = {"x": of.Spec((4, 3), "float64"), "t": of.Spec((4,), "int64"), **{k: v[1] for k, v in extra.items()}}
        feeds = {"x": x, "t": np.zeros(4, np.int64), **{k: v[0] for k, v in extra.items()}}
        assert "row_step" not in of.Executor(of.trace(fn, **specs)).plan(**feeds).source, name
    probabilities = of.trace(lambda x, p: F.cross_entropy(x, p), x=of.Spec((4, 3), "float64"),
                             p=of.Spec((4, 3), "float64"))
    assert "row_step" not in of.Executor(probabilities).plan(x=x, p=np.full((4, 3), 1 / 3)).source
    three_d = of.trace(lambda x, t: F.cross_entropy(x, t), x=of.Spec((2, 3, 2), "float64"),
                       t=of.Spec((2, 2), "int64"))
    assert "row_step" not in of.Executor(three_d).plan(x=np.zeros((2, 3, 2)), t=np.zeros((2, 2), np.int64)).source


def test_cross_entropy_grad_loop_takes_the_kernel_where_it_does_not_apply():
    """A target out of range runs the kernel, which names it; class weights keep the op."""
    x = np.random.default_rng(14).standard_normal((4, 3))
    d = np.array(1.0)
    program = of.trace(lambda x, t, d: F.cross_entropy_grad(x, t, d), x=of.Spec((4, 3), "float64"),
                       t=of.Spec((4,), "int64"), d=of.Spec((), "float64"))
    exe = of.Executor(program)
    assert "cross_entropy_grad_row_step" in exe.plan(x=x, t=np.zeros(4, np.int64), d=d).source
    with pytest.raises(of.ArgumentError, match=r"cross_entropy_grad\(\): target holds class 3"):
        exe.run(x=x, t=np.array([0, 1, 3, 2]), d=d)
    weighted = of.trace(lambda x, t, d, w: F.cross_entropy_grad(x, t, d, w), x=of.Spec((4, 3), "float64"),
                        t=of.Spec((4,), "int64"), d=of.Spec((), "float64"), w=of.Spec((3,), "float64"))
    feeds = {"x": x, "t": np.zeros(4, np.int64), "d": d, "w": np.ones(3)}
    assert "row_step" not in of.Executor(weighted).plan(**feeds).source


def test_cross_entropy_loops_in_a_compiled_hessian_vector_product():
    """Second order of cross_entropy (float64): a compiled H·v of a linear classifier's loss, whose plan holds
    cross_entropy_grad's rule as row loops (its softmax and softmax_grad; the first-order gradient itself is dead
    and pruned), against torch's double backward."""
    import torch

    rng = np.random.default_rng(15)
    x0, w0, v0 = rng.standard_normal((32, 6)), rng.standard_normal((6, 10)), rng.standard_normal((6, 10))
    t0 = rng.integers(0, 10, 32)
    w, v = of.tensor(w0, requires_grad=True), of.tensor(v0)

    def hvp(x, t):
        (g,) = of.grad(F.cross_entropy(F.matmul(x, w), t, label_smoothing=0.1), [w], create_graph=True)
        return of.grad((g * v).sum(), [w])[0]

    compiled = of.compile(hvp)
    program = compiled.program(of.tensor(x0), of.tensor(t0))
    feeds = dict(zip(program.feeds, [x0, t0]))
    source = of.Executor(program).plan(**feeds).source
    assert "softmax_row_step" in source and "softmax_grad_row_step" in source and ", native" in source
    tw = torch.tensor(w0, requires_grad=True)
    tloss = torch.nn.functional.cross_entropy(torch.tensor(x0) @ tw, torch.tensor(t0), label_smoothing=0.1)
    (tg,) = torch.autograd.grad(tloss, [tw], create_graph=True)
    (expected,) = torch.autograd.grad((tg * torch.tensor(v0)).sum(), [tw])
    np.testing.assert_allclose(compiled(of.tensor(x0), of.tensor(t0)).numpy(), expected.numpy(), rtol=1e-10,
                               atol=1e-12)
