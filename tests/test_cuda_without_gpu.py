"""The device "cuda" where there is no GPU (CI): everything that does not need one. ``import opforge`` does not import
CuPy; asking for "cuda" says what is missing and how to install it; DLPack works on the host; the torch mock says no
GPU. (tests/cuda holds what needs one.)"""

import subprocess
import sys

import numpy as np
import pytest
import torch

import opforge as of

pytestmark = pytest.mark.skipif(of.cuda.is_available(), reason="a GPU is here: tests/cuda runs instead")


def test_import_opforge_does_not_import_cupy():
    code = "import sys, opforge as of; of.cuda.is_available(); print('cupy' in sys.modules and 'imported')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # is_available() may try to import CuPy (that is its question); import opforge itself must not
    code = "import sys, opforge; print('cupy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


@pytest.mark.parametrize("ask", [
    lambda: of.tensor([1.0], device="cuda"),
    lambda: of.zeros(2, device="cuda:0"),
    lambda: of.tensor([1.0]).to("cuda"),
    lambda: of.tensor([1.0]).cuda(),
    lambda: of.nn.Linear(2, 2).to("cuda"),
    lambda: of.get_device("cuda"),
    lambda: of.cuda.current_device(),
])
def test_asking_for_cuda_says_what_is_missing_and_how_to_install_it(ask):
    with pytest.raises(of.cuda.CudaUnavailableError, match=r"opforge\[cuda\]|no usable GPU|finds no GPU") as e:
        ask()
    assert 'device "cuda" is not available' in str(e.value)
    assert isinstance(e.value, of.ArgumentError)  # (as every wrong argument: an OpforgeError and a TypeError)


def test_another_gpu_index_is_refused_by_name():
    with pytest.raises(of.ArgumentError, match=r"one GPU per process.*CUDA_VISIBLE_DEVICES"):
        of.tensor([1.0], device="cuda:1")


def test_the_questions_torch_cuda_answers():
    assert of.cuda.is_available() is False and of.cuda.device_count() == 0
    assert of.cuda.why_unavailable()
    of.cuda.synchronize()  # nothing to wait for: no error, as torch's on a machine without CUDA
    of.cuda.manual_seed(1)
    of.cuda.empty_cache()
    assert of.cuda.memory_allocated() == 0


def test_the_torch_mock_says_no_gpu():
    from opforge import mock_torch

    with mock_torch.enable():
        import torch as mocked

        assert mocked.cuda.is_available() is False and mocked.cuda.device_count() == 0
        assert mocked.accelerator.is_available() is False and mocked.accelerator.current_accelerator() is None
        assert mocked.backends.cuda.is_built() is False
        device = "cuda" if mocked.cuda.is_available() else "cpu"
        assert mocked.ones(2).to(device).device == "cpu"


def test_from_dlpack_shares_host_memory_with_torch_and_numpy():
    t = torch.arange(6, dtype=torch.float32)
    x = of.from_dlpack(t)
    assert x.device == "cpu" and x.dtype == of.float32
    t[0] = 42.0
    assert x.numpy()[0] == 42.0  # one memory
    back = torch.from_dlpack(of.tensor([1.0, 2.0]))
    assert back.tolist() == [1.0, 2.0]
    a = np.arange(3.0)
    assert np.shares_memory(of.from_dlpack(a).numpy(), a)
    with pytest.raises(of.ArgumentError, match=r"from_dlpack.*__dlpack__"):
        of.from_dlpack([1.0, 2.0])
    with pytest.raises(of.ArgumentError, match=r"from_dlpack.*dtype"):
        of.from_dlpack(torch.zeros(2, dtype=torch.complex64))

