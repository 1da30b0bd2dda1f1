"""The BLAS a compiled program's GEMMs call (``opforge.program.gemm.blas``): how it is chosen, and MKL's products,
sums and updates against NumPy's matmul (eager mode's library) and exact float64 products."""

from __future__ import annotations

import numpy as np
import pytest
from test_native import _sums_of_products

import opforge as of
from opforge import ops as F
from opforge.core.errors import ArgumentError
from opforge.program import gemm


def _products(x, w, y, b):
    return {"xw": F.matmul(x, F.transpose(w)),  # x·wᵀ, w read transposed
            "wx": F.matmul(w, F.transpose(x)),
            "xty": F.matmul(F.transpose(x), y),  # xᵀ·y
            "lin": F.linear(x, w, b),  # the bias broadcast into the result, then the GEMM adds with beta = 1
            "lin0": F.linear(F.transpose(y), F.transpose(x)),  # yᵀ·x, both operands read transposed
            "relu": F.relu(F.linear(x, w) + b)}  # the bias in relu's loop: the product alone is the GEMM


def _feeds(dtype, rows=64, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((rows, 96)), "w": rng.standard_normal((80, 96)),
             "y": rng.standard_normal((rows, 72)), "b": rng.standard_normal(80)}
    return {k: a.astype(dtype) for k, a in feeds.items()}


def _exact(feeds):
    return {k: v.numpy() for k, v in _products(*(of.tensor(feeds[n].astype(np.float64)) for n in "xwyb")).items()}


def _program(feeds):
    return of.trace(_products, **{k: of.Spec(a.shape, a.dtype) for k, a in feeds.items()})


def test_the_choice_follows_opforge_blas(blas_library, monkeypatch):
    assert blas_library("openblas").name == "openblas"
    monkeypatch.setenv("OPFORGE_BLAS", "atlas")
    gemm.blas.cache_clear()
    with pytest.raises(ArgumentError, match=r"OPFORGE_BLAS='atlas': expected one of auto, mkl, openblas"):
        gemm.blas()
    monkeypatch.setattr(gemm, "_mkl", lambda: None)
    monkeypatch.setenv("OPFORGE_BLAS", "mkl")
    gemm.blas.cache_clear()
    with pytest.raises(ArgumentError, match=r"MKL is not installed.*pip install 'opforge\[mkl\]'"):
        gemm.blas()
    monkeypatch.setenv("OPFORGE_BLAS", "auto")
    monkeypatch.setattr(gemm, "_numpy_blas_threads", lambda: 1)
    monkeypatch.setattr(gemm, "_intel_cpu", lambda: True)
    gemm.blas.cache_clear()
    chosen = gemm.blas()
    assert (chosen.name, chosen.why) == ("openblas", "MKL is not installed")


@pytest.mark.parametrize("threads, intel, expected", [(1, True, "mkl"), (2, True, "openblas"),
                                                      (1, False, "openblas")])
def test_auto_takes_mkl_on_one_thread_of_an_intel_cpu(blas_library, monkeypatch, threads, intel, expected):
    blas_library("mkl")  # (skips without MKL)
    monkeypatch.setattr(gemm, "_numpy_blas_threads", lambda: threads)
    monkeypatch.setattr(gemm, "_intel_cpu", lambda: intel)
    chosen = blas_library("auto")
    assert chosen.name == expected, chosen
    if expected == "openblas":
        assert chosen.why == ("not an Intel CPU" if not intel else "NumPy's BLAS runs on 2 threads")
    else:
        assert "Math Kernel Library" in chosen.version


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_in_mkl_equal_exact_ones_within_rounding(blas_library, dtype):
    blas_library("mkl")
    feeds = _feeds(dtype)
    feeds["x"][3, 5] = np.nan  # row 3 of every product of x's rows is NaN, as in NumPy's matmul
    feeds["w"][7, 2] = np.inf
    fused, unfused = of.Executor(_program(feeds), native=True), of.Executor(_program(feeds), native=False)
    source = fused.plan(feeds).source
    assert source.count("gemm_product(") == 6, source
    assert "gemm_product(" not in unfused.plan(feeds).source
    with np.errstate(invalid="ignore"):
        got, want, exact = fused.run(feeds), unfused.run(feeds), _exact(feeds)
        again = fused.run(feeds)  # the workspace's buffers hold the last run's values now: beta = 0 ignores them
    eps = np.finfo(dtype).eps
    for k in want:
        np.testing.assert_array_equal(np.isnan(got[k]), np.isnan(want[k]), err_msg=k)
        np.testing.assert_array_equal(got[k], again[k], err_msg=k)  # a plan gives the same bits at every run
        finite = np.isfinite(exact[k])
        scale = np.abs(exact[k][finite]).max()
        # another summation order than OpenBLAS's: a few ulp of the terms' size (96 terms of a unit normal's size)
        np.testing.assert_allclose(got[k][finite], exact[k][finite], rtol=0, atol=64 * eps * scale, err_msg=k)
        np.testing.assert_allclose(got[k][finite], want[k][finite], rtol=0, atol=64 * eps * scale, err_msg=k)


def test_mkl_results_do_not_depend_on_the_operands_alignment(blas_library):
    """MKL may pick kernels by alignment; with one thread its GEMM gives the same bits at any offset (NumPy aligns
    large arrays to 16 bytes, a view may start anywhere)."""
    blas_library("mkl")
    feeds = _feeds(np.float32, rows=128, seed=1)
    exe = of.Executor(_program(feeds))
    first = exe.run(feeds)
    for offset in range(1, 8):
        shifted = {}
        for k, a in feeds.items():
            buffer = np.empty(a.size + 8, a.dtype)[offset:offset + a.size]
            buffer[...] = a.reshape(-1)
            shifted[k] = buffer.reshape(a.shape)
        got = exe.run(shifted)
        for k in first:
            np.testing.assert_array_equal(got[k], first[k], err_msg=f"{k}, offset {offset}")


def test_small_products_keep_numpys_matmul(blas_library):
    blas_library("mkl")
    rng = np.random.default_rng(2)
    feeds = {"h": rng.standard_normal((64, 512)).astype(np.float32),
             "w": rng.standard_normal((10, 512)).astype(np.float32)}
    program = of.trace(lambda h, w: F.matmul(h, F.transpose(w)), **{k: of.Spec(a.shape, a.dtype)
                                                                    for k, a in feeds.items()})
    exe = of.Executor(program)
    assert "gemm_product(" not in exe.plan(feeds).source  # 64 × 512 by 512 × 10: MKL's call costs more
    (got,) = exe.run(feeds).values()
    np.testing.assert_array_equal(got, feeds["h"] @ feeds["w"].T)


def test_native_off_keeps_eagers_bits_with_mkl_chosen(blas_library):
    blas_library("mkl")
    feeds = _feeds(np.float32)
    exe = of.Executor(_program(feeds), native=False)
    got = exe.run(feeds)
    eager = {k: v.numpy() for k, v in _products(*(of.tensor(feeds[n]) for n in "xwyb")).items()}
    for k in eager:
        np.testing.assert_array_equal(got[k], eager[k], err_msg=k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sums_of_products_in_mkl_equal_the_unfused_sum_within_rounding(blas_library, dtype):
    blas_library("mkl")
    rng = np.random.default_rng(10)
    feeds = {"x": rng.standard_normal((32, 300)), "w": rng.standard_normal((512, 300)),
             "v": rng.standard_normal((512, 300)), "c": rng.standard_normal(512), "h": rng.standard_normal((32, 512))}
    feeds = {k: a.astype(dtype) for k, a in feeds.items()}
    program = of.trace(_sums_of_products, **{k: of.Spec(a.shape, a.dtype) for k, a in feeds.items()})
    fused, unfused = of.Executor(program, native=True), of.Executor(program, native=False)
    source = fused.plan(feeds).source
    assert "gemm_sum(" in source and ", True)" not in source  # (MKL needs no transposed few-rows sum)
    got, want = fused.run(feeds), unfused.run(feeds)
    exact = {k: _sums_of_products(*(of.tensor(feeds[n].astype(np.float64)) for n in "xwvch"))[k].numpy()
             for k in want}
    eps = np.finfo(dtype).eps
    for k in want:
        scale = np.abs(exact[k]).max()
        np.testing.assert_allclose(got[k], exact[k], rtol=0, atol=512 * eps * scale, err_msg=k)
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=512 * eps * scale, err_msg=k)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-11), (np.float32, 2e-4)])
def test_compiled_sgd_training_in_mkl_follows_eager(blas_library, dtype, rtol):
    """An MLP trained with SGD (its weight updates are GEMMs adding into the parameters, its forward and backward
    products GemmProducts) stays with eager training (NumPy's OpenBLAS) within rounding over 5 steps."""
    blas_library("mkl")

    def train(compiled: bool):
        rng = np.random.default_rng(3)
        of.manual_seed(3)
        model = of.nn.Sequential(of.nn.Linear(100, 128), of.nn.ReLU(), of.nn.Linear(128, 96), of.nn.ReLU(),
                                 of.nn.Linear(96, 10))
        model.to(dtype=dtype)
        opt = of.optim.SGD(model.parameters(), lr=0.1)
        x = of.tensor(rng.standard_normal((64, 100)).astype(dtype))
        y = of.tensor(rng.integers(0, 10, 64))

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()  # (no gradient outlives the step: each weight's update is one GEMM into it)
            return loss

        fn = of.compile(step) if compiled else step
        losses = [float(fn(x, y).numpy()) for _ in range(5)]
        return losses, [p.numpy().copy() for p in model.parameters()], fn

    (compiled_losses, compiled_params, fn), (eager_losses, eager_params, _) = train(True), train(False)
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=rtol)
    for got, want in zip(compiled_params, eager_params):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
    sources = "".join(p.source for entry in fn.cache.values() for e in entry for p in e.exe._plans.values())
    assert "gemm_product(" in sources and "gemm_update(" in sources
