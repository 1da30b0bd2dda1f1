import numpy as np
import pytest

import opforge as of


@pytest.fixture
def scratch_ops():
    """Names of ops a test defines; they are removed from the registry (and opforge.ops) afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        if name in of.registry:
            of.registry.remove(name)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def blas_library(monkeypatch):
    """``blas_library("openblas" | "mkl")``: the BLAS compiled programs' GEMMs call during one test (``OPFORGE_BLAS``;
    the choice is made once per process, so it is made again before and after). MKL's test skips where the PyPI
    package ``mkl`` (``opforge[mkl]``, part of the test extra) is not installed."""
    from opforge.program import gemm

    def choose(name: str):
        if name == "mkl" and gemm._mkl() is None:
            pytest.skip("MKL is not installed: pip install 'opforge[mkl]'")
        monkeypatch.setenv("OPFORGE_BLAS", name)
        gemm.blas.cache_clear()
        return gemm.blas()

    yield choose
    gemm.blas.cache_clear()
