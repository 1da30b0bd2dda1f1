"""Elementwise fusion and the executor's workspace (opforge.program.fusion, opforge.program.executor), on the NumPy path
(native code off: tests/test_native.py tests that): a fused result is the unfused one to the last bit, for every op
declared fusable; buffers are kept across runs without ever being shared with what a run returns, another run or
another thread."""

from __future__ import annotations

import re
import threading
import tracemalloc

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.core import dtypes as D
from opforge.program import assign, executor, fusion
from opforge.testing.conformance import default_samples

FUSABLE = sorted(op.name for op in of.registry if "pointwise" in op.traits)


@pytest.fixture(autouse=True)
def _numpy_blocks(monkeypatch):
    """These tests are about the NumPy path, bit for bit: native code (tests/test_native.py) stays off."""
    monkeypatch.setenv("OPFORGE_NATIVE", "0")


def _samples(opdef):
    rng = np.random.default_rng(0)
    return list(opdef.samples_fn(rng) if opdef.samples_fn is not None else default_samples(opdef, rng))


def _stacked(values: dict, rows: int) -> dict:
    """Each array of the highest rank stacked ``rows`` times along a new leading axis (the others still broadcast
    against them), so that the fused group spans several row blocks."""
    top = max((v.ndim for v in values.values()), default=0)
    return {k: np.stack([v] * rows) if v.ndim == top else v for k, v in values.items()}


def _program(opdef, sample, dtype, rows: int):
    """feeds, and a program computing post(op(pre(inputs))): pre multiplies each float input by 1 (exact), post is
    neg (logical_not for bools), so that the op sits inside a fused group; only post's result is fetched."""
    names = [p.name for p in opdef.inputs]
    values = {n: a for n, a in zip(names, sample.args) if isinstance(a, np.ndarray)}
    values |= {k: v for k, v in sample.kwargs.items() if isinstance(v, np.ndarray)}
    values = {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in values.items()}
    feeds = _stacked(values, rows)
    attrs = {k: v for k, v in sample.kwargs.items() if not isinstance(v, np.ndarray)}

    def fn(**tensors):
        pre = {k: t * 1.0 if D.is_floating(t.dtype) else t for k, t in tensors.items()}
        args = {n: pre.get(n) for n in names[:len(sample.args)]}  # by name: an attr may come first (polygamma)
        y = opdef.fn(**args, **{k: pre[k] for k in sample.kwargs if k in pre}, **attrs)
        return F.logical_not(y) if y.dtype == D.bool_ else -y

    specs = {k: of.Spec(v.shape, v.dtype) for k, v in feeds.items()}
    return feeds, of.trace(fn, **specs)


@pytest.mark.parametrize("name", FUSABLE)
def test_a_fused_op_gives_the_bits_of_its_unfused_kernel(name, monkeypatch):
    opdef = of.registry.get(name)
    fused_any = False
    for blocked in (False, True):
        if blocked:
            monkeypatch.setattr(fusion, "BLOCK", 4)  # rows of a few elements: many blocks and a short last one
        for sample in _samples(opdef):
            for dtype in (np.float64, np.float32):
                feeds, program = _program(opdef, sample, dtype, rows=7 if blocked else 1)
                fused = of.Executor(program)
                got, want = fused.run(feeds)["out"], of.Executor(program, optimize=False).run(feeds)["out"]
                assert got.dtype == want.dtype and got.shape == want.shape
                assert np.array_equal(got, want, equal_nan=True), (name, sample, dtype, blocked)
                assert np.array_equal(fused.run(feeds)["out"], want, equal_nan=True)  # again, from the workspace
                fused_any |= fused.plan(feeds).removed["fused"] > 0
    assert fused_any, f"{name} never joined a fused group"


def test_ten_ops_over_a_million_elements_run_as_one_step():
    def chain(x, y):
        a = x * y + 1.0
        b = a * x - y
        c = b * b * 0.5 + x
        return -(c * y - 1.0)

    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(1_000_000).astype(np.float32) for _ in range(2))
    program = of.trace(chain, x=of.Spec(x.shape, x.dtype), y=of.Spec(y.shape, y.dtype))
    exe = of.Executor(program)
    plan = exe.plan(x=x, y=y)
    assert plan.steps == 1 and plan.removed["fused"] == 9
    assert plan.source.count(" for r in ") == 1  # in blocks
    want = chain(x, y)  # NumPy eagerly, op for op: the same kernels, the same bits
    assert np.array_equal(exe.run(x=x, y=y)["out"], want)
    assert plan.peak_live_bytes < 2 * x.nbytes  # the output and a few block-sized scratch buffers


def test_a_value_read_outside_the_group_is_computed_for_its_readers():
    def fn(x):
        t = F.exp(x * 0.5)
        return {"t": t, "u": F.tanh(t + 1.0) * 2.0, "s": F.sum(t)}

    x = np.linspace(-2, 2, 5000)
    program = of.trace(fn, x=of.Spec(x.shape, x.dtype))
    got, want = of.Executor(program).run(x=x), of.Executor(program, optimize=False).run(x=x)
    for k in want:
        assert np.array_equal(got[k], want[k])
    assert of.Executor(program).plan(x=x).removed["fused"] == 3  # (mul, exp) and (add, tanh, mul)


def test_a_parameter_update_is_fused_and_written_in_place(monkeypatch):
    monkeypatch.setattr(fusion, "BLOCK", 64)
    rng = np.random.default_rng(2)
    w = of.tensor(rng.standard_normal((40, 30)).astype(np.float32), requires_grad=True)
    array = w.numpy()

    @of.compile
    def step(x):
        loss = F.sum(F.tanh(x @ w))
        (g,) = of.grad(loss, [w])
        with of.no_grad():
            assign(w, w - 0.1 * g)  # lr * grad: mul(0.1, g), then sub
        return loss

    x = rng.standard_normal((8, 40)).astype(np.float32)
    w_ref = array.copy()
    step(of.tensor(x))
    ((entry,),) = step.cache.values()
    program, exe = entry.program, entry.exe
    plan = exe.plan(x=x)
    fused_call = next(line for line in plan.source.splitlines() if re.search(r"= k\d+\(.*W, out=", line))
    slot = dict(re.findall(r"(v\d+) = scope\['([^']+)'\]", plan.source))
    assert fused_call.endswith(f"out={next(v for v in slot)})")  # into the parameter's own array: no copy
    assert "_copy_into" not in plan.source and w.numpy() is array
    # the same step unfused, on a copy of the starting weights
    g_ref = of.Executor(program, optimize=False)
    g_ref.scope[next(iter(g_ref.scope))] = w_ref
    g_ref.run(x=x)
    assert np.array_equal(w_ref, array)


def test_an_update_that_reads_a_view_of_its_parameter(monkeypatch):
    monkeypatch.setattr(fusion, "BLOCK", 16)  # blocks of rows: a transposed view would see rows already written
    w = of.tensor(np.arange(64.0).reshape(8, 8))

    def fn():
        assign(w, (w - 0.5 * F.transpose(w)) * 2.0)
        return F.sum(w)

    program = of.trace(fn)
    fused, plain = of.Executor(program), of.Executor(program, optimize=False)
    start = w.numpy().copy()
    fused.run()
    plain.scope[next(iter(plain.scope))] = start
    plain.run()
    assert np.array_equal(w.numpy(), start)
    assert fused.plan().removed["fused"] == 2


def _mlp_program(out: int = 64, view: bool = True):
    rng = np.random.default_rng(3)
    w1 = of.tensor(rng.standard_normal((64, 256)).astype(np.float32))
    w2 = of.tensor(rng.standard_normal((256, out)).astype(np.float32))

    def fn(x):
        h = F.relu(x @ w1 + 1.0)
        y = h @ w2
        return {"y": F.reshape(y, shape=[-1]), "loss": F.sum(y * y)} if view else F.sum(y * y)

    return of.trace(fn, x=of.Spec((None, 64), "float32"))


def test_later_runs_never_write_into_what_earlier_runs_returned():
    exe = of.Executor(_mlp_program())
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((128, 64)).astype(np.float32) for _ in range(3)]
    first = exe.run(x=xs[0])
    kept = {k: v.copy() for k, v in first.items()}
    for x in xs[1:]:
        exe.run(x=x)
    for k in kept:  # "y" is a view of a buffer the workspace would otherwise have taken back
        assert np.array_equal(first[k], kept[k])
    want = of.Executor(_mlp_program(), optimize=False).run(x=xs[2])
    got = exe.run(x=xs[2])
    for k in want:
        assert np.array_equal(got[k], want[k])


def test_steady_runs_allocate_no_intermediate(monkeypatch):
    x = np.random.default_rng(5).standard_normal((512, 64)).astype(np.float32)
    intermediate = 512 * 256 * 4

    def peak_of_third_run(min_bytes):
        monkeypatch.setattr(executor, "WORKSPACE_MIN_BYTES", min_bytes)
        exe = of.Executor(_mlp_program(out=256, view=False))  # every intermediate 512 × 256
        exe.run(x=x)
        exe.run(x=x)
        tracemalloc.start()
        try:
            exe.run(x=x)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    plan = of.Executor(_mlp_program(out=256, view=False)).plan(x=x)
    assert plan.workspace_bytes == plan.peak_live_bytes == 2 * intermediate  # h and y, then y and y * y
    with_workspace = peak_of_third_run(executor.WORKSPACE_MIN_BYTES)
    without = peak_of_third_run(float("inf"))
    assert without >= 2 * intermediate
    assert with_workspace < intermediate // 8  # no intermediate is allocated: each goes into a kept buffer


def test_inputs_in_another_order_are_not_handed_a_c_ordered_workspace_buffer():
    # A transposed (or batch-last) input written into a C-ordered buffer is walked against the grain, and forces C
    # order on the ops after it: 3-4x slower on the digits CNN's relu, max-pool and their gradients. Such a call
    # makes its output in its inputs' order instead, and that output never joins the workspace (relu(y) of a
    # C-ordered y still takes its buffer from it).
    def fn(x, y):
        return F.sum(F.relu(F.transpose(x)), axis=[1]) + F.sum(F.relu(y), axis=[1])

    program = of.trace(fn, x=of.Spec((512, 256), "float32"), y=of.Spec((256, 512), "float32"))
    exe = of.Executor(program)
    rng = np.random.default_rng(8)
    feeds = {"x": rng.standard_normal((512, 256)).astype(np.float32),
             "y": rng.standard_normal((256, 512)).astype(np.float32)}
    want = of.Executor(program, optimize=False).run(**feeds)
    for _ in range(3):
        got = exe.run(**feeds)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    plan = exe.plan(**feeds)
    assert re.search(r"c(\d+) = v\d+\.flags\.c_contiguous\n.*out=\(\(p\d+\.pop\(\) if p\d+ else _e\d+\(\)\) if c\1 "
                     r"else None\)", plan.source)

    def pooled():
        return sum(len(pool) for ws in plan.workspaces for pool in ws)

    assert pooled() == 1  # relu(y)'s buffer, back after each run
    for _ in range(5):
        exe.run(**feeds)
    assert pooled() == 1  # relu(transpose(x))'s own output did not join it: the pool does not grow run by run


def test_threads_running_one_executor_get_their_own_workspace():
    exe = of.Executor(_mlp_program())
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((128, 64)).astype(np.float32) for _ in range(4)]
    want = [of.Executor(_mlp_program(), optimize=False).run(x=x)["loss"] for x in xs]
    failures = []

    def work(k):
        for _ in range(30):
            if not np.array_equal(exe.run(x=xs[k])["loss"], want[k]):
                failures.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_a_plan_for_other_shapes_lets_the_last_one_s_workspace_go():
    exe = of.Executor(_mlp_program())
    a, b = np.zeros((128, 64), np.float32), np.zeros((256, 64), np.float32)
    exe.run(x=a)
    assert exe.plan(x=a).workspaces
    exe.run(x=b)
    assert not exe.plan(x=a).workspaces and exe.plan(x=b).workspaces


def test_a_kernel_failing_inside_a_fused_group_is_named(scratch_ops):
    scratch_ops.append("picky")

    @of.op("picky(Tensor x) -> Tensor y", traits=["elementwise", "pointwise"])
    def picky(x):
        if (x < 0).any():
            raise ValueError("no negative values, please")
        return np.sqrt(x)

    program = of.trace(lambda x: F.picky(x * 2.0) + 1.0, x=of.Spec((10,), "float64"))
    exe = of.Executor(program)
    assert exe.plan(x=np.ones(10)).removed["fused"] == 2
    with pytest.raises(of.OpforgeError, match=r"fused\(.*picky -> picky\.\d+ failed.*no negative values"):
        exe.run(x=-np.ones(10))


def test_sgd_update_blocks_give_the_bits_of_param_minus_lr_times_grad():
    rng = np.random.default_rng(7)
    for shape in [(700, 600), (300_000,), (5,)]:
        p, g = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
        lr = np.array(0.03, np.float32)
        got = F.sgd_update(of.tensor(p), of.tensor(g), of.tensor(lr)).numpy()
        assert np.array_equal(got, p - lr.item() * g)


# -- add_n reads a broadcast before it was broadcast (fusion.broadcast_summands) ---------------------------------------


def _add_n_plan(fn, **feeds):
    program = of.trace(fn, **{k: of.Spec(v.shape, v.dtype) for k, v in feeds.items()})
    exe = of.Executor(program)
    steps = " ".join(exe.plan(**feeds).line_ops.values())  # "op #i <type> -> <outputs>" per step
    return steps, exe.run(**feeds), of.Executor(program, optimize=False).run(**feeds)


def test_an_add_n_sums_a_broadcast_it_alone_reads_without_the_broadcast_step():
    rng = np.random.default_rng(0)
    x, y, b = rng.standard_normal((6, 5)), rng.standard_normal((6, 5)), rng.standard_normal(5)
    source, got, want = _add_n_plan(lambda x, y, b: {"out": F.add_n([F.broadcast_to(b, [6, 5]), x, y])}, x=x, y=y, b=b)
    assert " broadcast_to " not in source and " add_n " in source
    np.testing.assert_array_equal(got["out"], want["out"])  # the same sums in the same order
    np.testing.assert_array_equal(got["out"], (b + x) + y)
    assert got["out"].shape == (6, 5)


def test_a_broadcast_read_elsewhere_or_every_summand_broadcast_keeps_its_step():
    rng = np.random.default_rng(1)
    x, b, c = rng.standard_normal((4, 3)), rng.standard_normal(3), rng.standard_normal((4, 1))

    def shared(x, b):
        wide = F.broadcast_to(b, [4, 3])
        return {"out": F.add_n([wide, x]), "wide": wide * 2.0}

    source, got, want = _add_n_plan(shared, x=x, b=b)
    assert " broadcast_to " in source
    np.testing.assert_array_equal(got["out"], want["out"])
    def both_broadcast(b, c):
        return {"out": F.add_n([F.broadcast_to(b, [4, 3]), F.broadcast_to(c, [4, 3])])}

    source, got, want = _add_n_plan(both_broadcast, b=b, c=c)
    assert source.count(" broadcast_to ") == 1  # one kept: the sum still has the whole shape
    assert got["out"].shape == (4, 3)
    np.testing.assert_array_equal(got["out"], want["out"])
