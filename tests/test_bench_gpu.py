"""bench/gpu.py keeps running where there is no GPU: its dry run on the CuPy-strict test device (opforge's path as it
is on CUDA, a host leak failing as there) checks every row against float64 and writes gpu.md and gpu.json; a failing
implementation is written into both and the other rows go on. No time is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("torch")


def test_the_dry_run_on_the_strict_device_checks_every_row_and_writes_both_files(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--out", str(tmp_path), "--device",
                           "strict", "--quick", "--small"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    md = (tmp_path / "gpu.md").read_text()
    assert report["failures"] == [] and "## Failures" not in md
    assert report["meta"]["device"] == "strict" and "strict test device" in report["meta"]["device_name"]
    assert [r["id"] for r in report["rows"]] == ["add", "leaky_relu", "softmax", "layer_norm", "mlp 8", "mlp 64"]
    for row in report["rows"]:
        names = {"opforge", "torch", "raw"} if not row["id"].startswith("mlp") else {
            "opforge", "opforge.compiled", "torch", "gemms"}
        assert set(row["values"]) == names and all(v > 0 for v in row["values"].values()), row
    assert [t["met"] is not None for t in report["targets"]] == [True] * 4  # every target measured
    for heading in ("## Targets", "## 1. Eager small op", "## 2. Large ops", "## 3. MLP", "## 4. First call"):
        assert heading in md


@pytest.fixture
def gpu_bench(monkeypatch):
    """bench/gpu.py imported here (its "run" and "cases" modules are taken out of sys.modules afterwards)."""
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    before, threads = set(sys.modules), torch.get_num_threads()
    import gpu

    yield gpu
    torch.set_num_threads(threads)  # the bench's load_torch sets 1 (BENCH_THREADS), for this whole process
    for name in set(sys.modules) - before:
        if name in ("gpu", "run", "cases") or name.startswith("cases."):
            del sys.modules[name]


def test_a_failing_implementation_is_reported_and_the_others_still_run(gpu_bench, monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this")

    monkeypatch.setattr(gpu_bench.mlp, "opforge_step", broken)
    status = gpu_bench.main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--small", "--rows", "small",
                             "mlp"])
    assert status == 1
    report = json.loads((tmp_path / "gpu.json").read_text())
    failed = {(f["row"], f["impl"]) for f in report["failures"]}
    assert failed == {(f"MLP SGD step, batch {b}", impl) for b in (8, 64) for impl in ("opforge", "opforge.compiled")}
    assert all(f["error"] == "RuntimeError: no kernel for this" for f in report["failures"])
    for row in report["rows"]:  # PyTorch, its GEMMs and the small row were measured all the same
        assert all(v > 0 for name, v in row["values"].items() if not name.startswith("opforge")
                   or row["id"] == "add"), row
    md = (tmp_path / "gpu.md").read_text()
    assert "**MLP SGD step, batch 64 / opforge compiled**: RuntimeError: no kernel for this" in md
    assert "| 64 | **failed** (below) | **failed** (below) |" in md


def test_a_wrong_result_fails_its_check_and_is_not_timed(gpu_bench, monkeypatch, tmp_path):
    from opforge import ops as F

    monkeypatch.setattr(F, "leaky_relu", lambda x, alpha: F.relu(x))  # alpha ignored: wrong for x < 0
    status = gpu_bench.main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--small", "--rows", "large"])
    assert status == 1
    report = json.loads((tmp_path / "gpu.json").read_text())
    (failure,) = report["failures"]
    assert failure["impl"] == "opforge" and failure["row"].startswith("leaky_relu")
    assert failure["error"].startswith("CheckFailed: result: ") and "values off (rtol 1e-05" in failure["error"]
    leaky = report["rows"][0]["results"]["opforge"]
    assert "median" not in leaky and "samples" not in leaky
