"""The benchmark suite keeps running: ``bench/run.py --quick`` (every case once, each in its own worker process)
writes its JSON, Markdown and PNG, every installed framework's workers succeed and agree on the check values.
No time is asserted. Frameworks that are not installed (JAX, unless the bench extras are) are skipped by the suite
itself and reported as such."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # --keep-blas-env: tests never change OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (the full bench unsets them)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--keep-blas-env",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    return done, out


def test_quick_suite_exits_cleanly(quick_run):
    done, _ = quick_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def test_writes_json_markdown_and_chart(quick_run):
    done, out = quick_run
    report = json.loads((out / "latest.json").read_text())
    md = (out / "latest.md").read_text()
    assert md in done.stdout  # the table is printed too
    assert "## Targets" in md and "--quick run" in md
    for g in report["groups"]:
        assert f"## {g['title']}" in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_group_and_installed_framework_reported(quick_run):
    _, out = quick_run
    report = json.loads((out / "latest.json").read_text())
    assert [g["id"] for g in report["groups"]] == ["per_op", "chain", "mlp", "cnn", "hvp", "memory", "conv_softmax",
                                                   "fusion", "workspace", "transformer", "rnn"]
    assert report["problems"] == []
    for g in report["groups"]:
        assert g["cases"], g["id"]
        for fw, worker in g["workers"].items():
            if worker.get("status", "").startswith("skipped"):
                assert fw.startswith("jax") or fw == "torch", worker  # only optional frameworks may be missing
                continue
            assert "error" not in worker, worker
            assert all(fw in case["results"] for case in g["cases"] if not case["name"].endswith("recording")
                       or fw in ("opforge", "torch")), (g["id"], fw)
    assert [t["target"] for t in report["targets"]] and all("measured" in t for t in report["targets"])
