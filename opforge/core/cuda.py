"""The device "cuda": CuPy's arrays on an NVIDIA GPU (what NumPy is for "cpu"; Chainer's pairing).

Registered on first use, not at import: ``import opforge`` neither needs nor imports CuPy. ``get_device("cuda")``
(and so ``of.tensor(x, device="cuda")``, ``t.to("cuda")``, ``model.to("cuda")``) imports CuPy, checks that it sees a
GPU and registers the device; where it cannot, the error says what is missing and how to install it.

The device's kernels: an op's own kernel for "cuda" (``@op.kernel(device="cuda")``: the fused ones in
``opforge/ops/cuda_kernels.py``, a user's ``cupy.ElementwiseKernel``) wins; else its kernel for every device, handed
``xp=cupy``; else its CPU kernel (``kernels_of="cpu"``), which runs on CuPy arrays through NumPy's dispatch protocols
(``__array_function__``, ``__array_ufunc__``): every op of the library computes that way on the strict test device
(``opforge.testing.strict``, CuPy's rules with NumPy behind them), without reading the GPU back.

One GPU per process: "cuda" and "cuda:0" name the current CuPy device (``CUDA_VISIBLE_DEVICES`` picks which).
"""

from __future__ import annotations

import functools

import numpy as np

from .devices import _DEVICES, _ON_FIRST_USE, Device, register_device
from .errors import ArgumentError

INSTALL = "pip install 'opforge[cuda]' (it brings cupy-cuda13x==14.2.0, for CUDA 13 drivers)"


class CudaUnavailableError(ArgumentError):
    """The device "cuda" was asked for where CuPy or a GPU is missing: the message says which and what to do."""


@functools.cache
def _probe():
    """(cupy or None, why not): imported and asked for a GPU once per process."""
    try:
        import cupy
    except ImportError as e:
        return None, f"CuPy is not installed ({e}); {INSTALL}"
    except Exception as e:  # a broken install (a CUDA library missing) fails in many ways
        return None, f"CuPy failed to import: {type(e).__name__}: {e}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver: CUDARuntimeError
        return None, f"CuPy {cupy.__version__} finds no usable GPU: {type(e).__name__}: {e}"
    if count < 1:
        return None, f"CuPy {cupy.__version__} finds no GPU"
    return cupy, ""


def is_available() -> bool:
    """Whether the device "cuda" can be used here: CuPy imports and sees at least one GPU (as ``torch.cuda``'s)."""
    return _probe()[0] is not None


def device_count() -> int:
    return 1 if is_available() else 0  # one GPU per process (the module docstring says why)


def why_unavailable() -> str:
    """The reason ``is_available()`` is false ("" where it is true)."""
    return _probe()[1]


class CudaDevice(Device):
    """The device "cuda": ``xp`` is CuPy, arrays are ``cupy.ndarray``, moves to and from the host are copies."""

    __slots__ = ()

    def array(self, value):
        if type(value) is self.array_type:
            return value
        # A NumPy scalar (a CPU kernel's 0-d result under NumPy's rules), a Python number or a user's host result:
        # copied onto the GPU, as cupy.asarray does (the library's own kernels return device arrays: the strict
        # test device checks that).
        return self.xp.asarray(value)

    def from_host(self, array, copy: bool = False):
        return self.xp.asarray(array)  # always a copy onto the GPU

    def to_host(self, array) -> np.ndarray:
        return self.xp.asnumpy(array)

    def copy_into(self, target, value) -> None:
        if isinstance(value, np.ndarray):  # CuPy's copyto takes device arrays and scalars only
            value = self.xp.asarray(value)
        self.xp.copyto(target, value, casting="same_kind")

    def new_generator(self, seed: int):
        return self.xp.random.default_rng(seed)  # drawn on the GPU; the same seed draws the same numbers

    def synchronize(self) -> None:
        """Wait until the GPU has finished the work queued so far (timings need it; results never do)."""
        self.xp.cuda.runtime.deviceSynchronize()


def device() -> Device:
    """The device "cuda", registered on first use; ``CudaUnavailableError`` naming what is missing."""
    known = _DEVICES.get("cuda")
    if known is not None:
        return known
    cupy, why = _probe()
    if cupy is None:
        raise CudaUnavailableError(f'device "cuda" is not available: {why}')
    return register_device("cuda", cupy, kernels_of="cpu", array_type=cupy.ndarray, cls=CudaDevice)


def parse(name: str) -> Device:
    """"cuda" or "cuda:0" as the device; another index is refused (one GPU per process)."""
    if name != "cuda":
        index = name[len("cuda:"):]
        if not index.isdigit() or int(index) != 0:
            raise ArgumentError(f"unknown device {name!r}: opforge uses one GPU per process, \"cuda\" or \"cuda:0\" "
                                "(pick the GPU with CUDA_VISIBLE_DEVICES)")
    return device()


_ON_FIRST_USE["cuda"] = parse
