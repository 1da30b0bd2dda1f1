"""opforge.program.fastcall: native steps and GEMMs called with the arrays themselves, not ``.ctypes.data``: the same
C functions get the same pointers (bits equal to the ctypes path), and what the C side cannot take is refused loudly
or handed back to the Python path, never read wrongly."""

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.program import fastcall, gemm, native

pytestmark = pytest.mark.skipif(native.compiler() is None or fastcall.module() is None,
                                reason="no C compiler or no Python headers: native steps keep ctypes")


def _sgemm():
    chosen = gemm.blas()
    if chosen.addresses is None:
        pytest.skip("no CBLAS ?gemm with 64-bit ints found")
    return chosen


def _ctypes_product(c, alpha, a, b, beta):
    """The same product through the library's ctypes function, as add_product called it before fastcall."""
    fn = gemm.blas().gemm[c.dtype]
    (ta, lda), (tb, ldb) = gemm._row_major(a), gemm._row_major(b)
    (m, k), n = a.shape, b.shape[1]
    fn(gemm.ROW_MAJOR, ta, tb, m, n, k, alpha, a.ctypes.data, lda, b.ctypes.data, ldb, beta, c.ctypes.data, n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt", "strided rows"])
def test_gemm_gives_the_ctypes_calls_bits_for_every_layout_blas_reads(dtype, layout):
    chosen = _sgemm()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 45)).astype(dtype)
    b = rng.standard_normal((45, 29)).astype(dtype)
    if "t" in layout[:1]:
        a = np.asfortranarray(a)
    if layout[1:2] == "t":
        b = np.asfortranarray(b)
    if layout == "strided rows":  # every other row of a larger array: lda = 2·k
        a = rng.standard_normal((74, 45)).astype(dtype)[::2]
    c0 = rng.standard_normal((37, 29)).astype(dtype)
    fast, slow = c0.copy(), c0.copy()
    assert fastcall.module().gemm(*chosen.addresses, fast, 0.5, a, b, 1.0) is True
    _ctypes_product(slow, 0.5, a, b, 1.0)
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_allclose(fast, c0 + 0.5 * (a.astype(np.float64) @ b),
                               rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-5 if dtype == np.float32 else 1e-12)


def test_gemm_hands_back_an_operand_blas_cannot_read_and_add_product_copies_it():
    chosen = _sgemm()
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 12)).astype(np.float32)[:, ::2]  # neither dim contiguous
    b = rng.standard_normal((6, 5)).astype(np.float32)
    c = np.zeros((8, 5), np.float32)
    assert fastcall.module().gemm(*chosen.addresses, c, 1.0, a, b, 0.0) is False
    assert not c.any()  # nothing written
    gemm.add_product(c, 1.0, a, b, beta=0.0)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)


def test_gemm_refuses_what_it_must_not_read():
    chosen, fast = _sgemm(), fastcall.module()
    a, b, c = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32), np.zeros((4, 2), np.float32)
    with pytest.raises(TypeError, match="one dtype"):
        fast.gemm(*chosen.addresses, c, 1.0, a.astype(np.float64), b, 0.0)
    with pytest.raises(TypeError, match="2-D"):
        fast.gemm(*chosen.addresses, c, 1.0, a.reshape(12), b, 0.0)
    with pytest.raises(TypeError, match="NumPy arrays"):
        fast.gemm(*chosen.addresses, c, 1.0, a.tolist(), b, 0.0)
    with pytest.raises(ValueError, match=r"shapes \(4, 3\) @ \(3, 2\) into \(2, 4\)"):
        fast.gemm(*chosen.addresses, np.zeros((2, 4), np.float32), 1.0, a, b, 0.0)
    swapped = a.astype(">f4")
    with pytest.raises(TypeError):
        fast.gemm(*chosen.addresses, c, 1.0, swapped, b, 0.0)
    with pytest.raises(TypeError, match="bias"):
        fast.gemm(*chosen.addresses, c, 1.0, a, b, 0.0, np.ones(3, np.float32))
    assert not c.any()


def test_gemm_declines_an_output_its_python_path_must_take_and_writes_nothing():
    """False (the plan's step then runs its Python lines, which copy or allocate) for an output in another layout,
    read-only, or sharing memory with an operand or the bias; nothing written."""
    chosen, fast = _sgemm(), fastcall.module()
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    frozen = np.zeros((4, 4), np.float32)
    frozen.flags.writeable = False
    square = rng.standard_normal((4, 4)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    for c, a_, b_, extra in [(np.zeros((4, 4), np.float32).T, a, b, ()), (frozen, a, b, ()),
                             (square, square, b.T @ b, ()), (square, a @ b, square[:, ::-1], ()),
                             (np.zeros((4, 4), np.float32), a, b, (bias[::2],))]:
        before = c.copy()
        assert fast.gemm(*chosen.addresses, c, 1.0, a_, b_, 0.0, *extra) is False
        np.testing.assert_array_equal(c, before)
    both = np.zeros(20, np.float32)
    assert fast.gemm(*chosen.addresses, both[:16].reshape(4, 4), 1.0, a, b, 0.0, both[12:16]) is False  # inside c
    assert not both.any()
    assert fast.gemm(*chosen.addresses, both[4:].reshape(4, 4), 1.0, a, b, 0.0, both[:4]) is True  # beside it


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_with_a_bias_starts_each_row_from_it_as_linear_does(dtype):
    chosen = _sgemm()
    rng = np.random.default_rng(4)
    x, w, bias = (rng.standard_normal(s).astype(dtype) for s in [(9, 33), (17, 33), (17,)])
    c = np.full((9, 17), np.nan, dtype)  # (beta is 1 after the bias is copied in: nothing of c's old values is read)
    assert fastcall.module().gemm(*chosen.addresses, c, 1.0, x, w.T, 0.0, bias) is True
    slow = np.empty_like(c)
    np.copyto(slow, bias)
    _ctypes_product(slow, 1.0, x, w.T, 1.0)
    np.testing.assert_array_equal(c, slow)


def test_call_passes_each_arrays_data_and_each_int_as_an_address():
    libc = ctypes.CDLL(None)
    memcpy = fastcall.address(libc.memcpy)
    src = np.arange(6, dtype=np.float64)[::-1].copy()
    dst = np.zeros(6)
    fastcall.module().call(memcpy, dst, src, 48)  # memcpy(dst, src, n): an int goes as it is (here the size)
    np.testing.assert_array_equal(dst, src)


def test_call_refuses_what_is_not_an_array_or_an_address():
    libc = ctypes.CDLL(None)
    memcpy, call = fastcall.address(libc.memcpy), fastcall.module().call
    dst = np.zeros(2)
    with pytest.raises(TypeError, match="argument 2 is list, not a NumPy array or an address"):
        call(memcpy, dst, [1.0, 2.0], 16)
    with pytest.raises(TypeError, match=r"argument 1 is numpy\.float64"):  # a NumPy scalar: not an array
        call(memcpy, np.float64(1.0), dst, 8)
    with pytest.raises(TypeError, match="arguments"):
        call(memcpy, *([dst] * (fastcall.MAX_ARGUMENTS + 1)))
    with pytest.raises(ValueError, match="null function address"):
        call(0, dst)


PROGRAM = """
rng = np.random.default_rng(2)
x, w = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((128, 96)).astype(np.float32)
program = of.trace(lambda x, w: {"out": F.softmax(F.tanh(F.linear(x, w)) * 2.0 + 0.5, axis=-1)},
                   x=of.Spec(x.shape, x.dtype), w=of.Spec(w.shape, w.dtype))
"""


def test_a_plans_native_steps_go_through_call_and_give_the_ctypes_paths_bits(tmp_path):
    space = {"np": np, "of": of, "F": F}
    exec(PROGRAM, space)
    program, x, w = space["program"], space["x"], space["w"]
    plan = of.Executor(program, native=True).plan(x=x, w=w)
    assert "_call(" in plan.source and ".ctypes.data" not in plan.source
    out = of.Executor(program, native=True).run(x=x, w=w)["out"]
    script = textwrap.dedent("""
        import sys, numpy as np
        sys.path.insert(0, sys.argv[1])
        import opforge as of
        from opforge import ops as F
        exec(sys.argv[3])
        exe = of.Executor(program, native=True)
        source = exe.plan(x=x, w=w).source
        assert "_call(" not in source and ".ctypes.data" in source, source
        np.save(sys.argv[2], exe.run(x=x, w=w)["out"])
    """)
    root = Path(of.__file__).parent.parent
    env = dict(os.environ, OPFORGE_FASTCALL="0")
    subprocess.run([sys.executable, "-c", script, str(root), str(tmp_path / "out.npy"), PROGRAM], env=env, check=True)
    np.testing.assert_array_equal(out, np.load(tmp_path / "out.npy"))


def test_a_gemm_product_step_given_an_out_it_must_not_write_directly_takes_its_python_lines(blas_library):
    """The step's one C call declines an ``out`` in another layout, read-only, or sharing memory with an operand;
    the lines after it then compute into a buffer of their own and copy (the same numbers either way)."""
    blas_library("mkl")  # (a plan's products become GemmProduct steps with MKL only)
    rng = np.random.default_rng(5)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in [(64, 64), (64, 64), (64,)])
    program = of.trace(lambda x, w, b: {"out": F.linear(x, w, b)},
                       x=of.Spec(x.shape, x.dtype), w=of.Spec(w.shape, w.dtype), b=of.Spec(bias.shape, bias.dtype))
    plan = of.Executor(program, native=True).plan(x=x, w=w, b=bias)
    (step,) = [line.split("(")[0][4:] for line in plan.source.splitlines()
               if line.startswith("def k") and "gemm_product" in line]
    assert "_gemm(_gemm_s, _gemm_d, dst, 1.0, a, b.T, 0.0, c)" in plan.source
    fn = plan.fn.__globals__[step]
    want = fn(x, w, bias, None)
    np.testing.assert_allclose(want, x.astype(np.float64) @ w.T + bias, rtol=1e-4, atol=1e-4)
    frozen = np.zeros((64, 64), np.float32)
    frozen.flags.writeable = False
    x_again, w_again = x.copy(), w.copy()
    cases = [(x, w, np.zeros((64, 64), np.float32)),  # the C call writes it
             (x, w, np.zeros((64, 64), np.float32).T),  # another layout
             (x_again, w, x_again), (x, w_again, w_again)]  # the output's buffer is an operand's
    for a, b, out in cases:
        got = fn(a, b, bias, None, out=out)
        assert got is out
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="read-only"):
        fn(x, w, bias, None, out=frozen)


def test_planned_says_yes_only_for_the_plans_shapes_and_dtypes_in_c_order():
    planned = fastcall.module().planned
    specs = fastcall.plan_specs([((2, 3), np.float32), ((), np.float64), ((None, 3), np.float32)])
    a, s = np.zeros((2, 3), np.float32), np.array(1.0)
    assert planned(specs, a, s) is True
    assert planned(specs, a) is True  # the first arrays only
    for wrong in [np.zeros((3, 2), np.float32), np.zeros((2, 3), np.float64), np.zeros((2, 3, 1), np.float32),
                  np.zeros((2, 3), ">f4"), np.zeros((3, 2), np.float32).T, np.zeros((2, 6), np.float32)[:, ::2],
                  [[0.0] * 3] * 2, np.float32(0)]:
        assert planned(specs, wrong, s) is False, wrong
    assert planned(specs, a, np.float64(1.0)) is False  # a NumPy scalar is not an array
    assert planned(specs, a, s, np.zeros((2, 3), np.float32)) is False  # a dim known at run time only: never
    with pytest.raises(TypeError, match="one per array"):
        planned(specs[:1], a, s)
    with pytest.raises(TypeError, match="shape tuple, dtype"):
        planned((((2, 3), "float32"),), a)


def test_into_allows_the_output_to_be_an_input_itself_and_nothing_else_sharing_its_memory():
    into = fastcall.module().into
    x, y = np.zeros((4, 4)), np.ones((4, 4))
    assert into(x, x, y) is True  # written in place over an input read at the same element first
    assert into(x, x.T, y) is False  # the same memory in another layout
    assert into(x, x[1:], y) is False
    assert into(x.T, y) is False  # not C-ordered
    frozen = np.zeros((4, 4))
    frozen.flags.writeable = False
    assert into(frozen, y) is False
    assert into(x, y, 3.0, None) is True  # (what is not an array shares nothing)
    assert into([0.0], y) is False


@pytest.mark.parametrize("library", ["mkl", "openblas"])
@pytest.mark.parametrize("out_case", ["given", "none", "another layout", "an operand's memory", "a strided bias"])
def test_a_gemm_sum_step_gives_the_same_numbers_whatever_out_it_is_handed(blas_library, out_case, library):
    blas_library(library)
    rng = np.random.default_rng(6)
    a, b, c, d = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(4))  # (LARGE)
    bias = rng.standard_normal(256).astype(np.float32)
    program = of.trace(lambda a, b, c, d, bias: {"out": F.add_n([a @ b, c @ d.T, F.broadcast_to(bias, [256, 256])])},
                       **{k: of.Spec(v.shape, v.dtype) for k, v in dict(a=a, b=b, c=c, d=d, bias=bias).items()})
    plan = of.Executor(program, native=True).plan(a=a, b=b, c=c, d=d, bias=bias)
    (step,) = [line.split("(")[0][4:] for line in plan.source.splitlines()
               if line.startswith("def k") and "gemm_sum" in line]
    assert "_disjoint(dst, " in plan.source
    assert "_gemm(_gemm_s, _gemm_d, dst, 1.0, a0, b0, 0.0, o0)" in plan.source  # the bias rows copied by the GEMM
    fn = plan.fn.__globals__[step]
    assert f"def {step}(o0, a0, b0, a1, b1, W, out=None)" in plan.source  # bias, then each product's operands
    args = [bias, a, b, c, d.T]  # (d's transpose is a step of its own before)
    want = fn(*args, None)
    np.testing.assert_allclose(want, a.astype(np.float64) @ b + c.astype(np.float64) @ d.T + bias, rtol=1e-4,
                               atol=1e-4)
    if out_case == "none":
        return
    a_again = a.copy()
    out = {"given": np.zeros((256, 256), np.float32), "another layout": np.zeros((256, 256), np.float32).T,
           "an operand's memory": a_again, "a strided bias": np.zeros((256, 256), np.float32)}[out_case]
    if out_case == "an operand's memory":
        args = [bias, a_again, b, c, d.T]
    if out_case == "a strided bias":  # the C call declines it: the other term summed first, as accumulate does
        args = [np.repeat(bias, 2)[::2], a, b, c, d.T]
    got = fn(*args, None, out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)


def test_without_python_headers_or_switched_off_there_is_no_extension_and_plans_keep_ctypes(monkeypatch, tmp_path):
    import sysconfig

    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(tmp_path)})  # no Python.h there
    assert fastcall.module.__wrapped__() is None
    monkeypatch.undo()
    monkeypatch.setenv("OPFORGE_FASTCALL", "0")
    assert fastcall.module.__wrapped__() is None
    monkeypatch.setattr(fastcall, "module", lambda: None)
    env = {"k0_n": object()}
    assert fastcall.pointer_call("k0_n", ["i0", "dst"], env) == "k0_n(i0.ctypes.data, dst.ctypes.data)"
    assert fastcall.checks(env) is False and "_call" not in env


def test_a_compiler_that_fails_on_the_extension_is_said_once_and_plans_keep_ctypes(monkeypatch, tmp_path):
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: error: no' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setattr(fastcall, "compiler", lambda: str(broken))
    monkeypatch.setattr(fastcall, "toolchain", lambda: "a broken compiler")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.warns(RuntimeWarning, match="did not build"):
        assert fastcall.module.__wrapped__() is None
    assert not list((tmp_path / "cache").rglob("*.so"))
