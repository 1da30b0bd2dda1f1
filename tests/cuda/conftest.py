"""The GPU tests (``make test-cuda``): they run where CuPy sees a GPU, and skip, saying why, everywhere else (CI
has no GPU)."""

import pytest

import opforge as of


def pytest_collection_modifyitems(config, items):
    if of.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"no GPU: {of.cuda.why_unavailable()}")
    for item in items:
        if "tests/cuda/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture
def cupy():
    """CuPy, where the device "cuda" is available (the tests are skipped otherwise)."""
    of.cuda.device()
    import cupy

    return cupy


def pytest_runtest_logreport(report):
    """With OPFORGE_FAILURE_LOG=path, each failure is appended there as it happens: a GPU run cut short by its time
    limit still tells what failed so far (run_on_gpu.sh sets it)."""
    import os

    path = os.environ.get("OPFORGE_FAILURE_LOG")
    if path and report.failed and "tests/cuda/" in report.nodeid.replace("\\", "/"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")
