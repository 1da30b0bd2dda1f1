"""A PyTorch program run through the torch mock on a GPU is the same script: the tutorials' quickstart (as
tests/test_torch_ports.py runs it) asks ``torch.accelerator`` for a device, gets "cuda" here, and trains to the
numbers its CPU run prints (float32: to a few ulp per step)."""

import contextlib
import io
import sys
from pathlib import Path

import numpy as np

import opforge as of
from opforge import mock_torch
from opforge.core import cuda as core_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the ported programs
from test_torch_ports import QUICKSTART, _cells, _numbers


def _run(tmp_path, monkeypatch, gpu: bool) -> str:
    monkeypatch.chdir(tmp_path)
    if not gpu:  # the same process, with the GPU hidden from the program
        monkeypatch.setattr(core_cuda, "_probe", lambda: (None, "hidden by the test"))
    of.manual_seed(0)
    out, namespace = io.StringIO(), {"__name__": "__main__"}
    with mock_torch.enable(), contextlib.redirect_stdout(out):
        for cell in _cells(QUICKSTART):
            exec(compile(cell, "<quickstart>", "exec"), namespace)
    monkeypatch.undo()
    return out.getvalue()


def test_the_quickstart_through_the_mock_trains_on_the_gpu_as_on_the_cpu(tmp_path, monkeypatch):
    gpu = _run(tmp_path, monkeypatch, gpu=True)
    cpu = _run(tmp_path, monkeypatch, gpu=False)
    assert "Using cuda device" in gpu and "Using cpu device" in cpu
    for label in ("loss", "Avg loss", "Accuracy"):
        want, got = _numbers(cpu, label), _numbers(gpu, label)
        assert want and len(got) == len(want), (cpu[-2000:], gpu[-2000:])
        np.testing.assert_allclose(got, want, rtol=1e-3, err_msg=label)
