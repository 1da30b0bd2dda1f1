"""``opforge.cuda``: torch.cuda's questions about the GPU, answered for the device "cuda" (``core/cuda.py``).

Nothing here imports CuPy until it is asked: ``is_available()`` is false, and says nothing, where CuPy or a GPU is
missing; ``why_unavailable()`` says which.
"""

from __future__ import annotations

from .core import cuda as _cuda

is_available = _cuda.is_available
device_count = _cuda.device_count
why_unavailable = _cuda.why_unavailable
CudaUnavailableError = _cuda.CudaUnavailableError


def device():
    """The device "cuda" (registered on first use), or ``CudaUnavailableError`` naming what is missing."""
    return _cuda.device()


def current_device() -> int:
    device()
    return 0  # one GPU per process


def get_device_name(index: int = 0) -> str:
    cupy = device().xp
    return cupy.cuda.runtime.getDeviceProperties(index)["name"].decode()


def synchronize(device_=None) -> None:
    """Wait for the GPU's queued work (for timing: results never need it); nothing where there is no GPU."""
    if is_available():
        device().synchronize()


def manual_seed(seed: int) -> None:
    """Seed the GPU's generator alone in this thread, as ``torch.cuda.manual_seed`` (``of.manual_seed`` seeds every
    device); nothing where there is no GPU, as torch's."""
    if is_available():
        dev = device()
        dev._streams.generator = dev.new_generator(int(seed))


manual_seed_all = manual_seed


def empty_cache() -> None:
    """Give CuPy's cached, unused GPU memory back to the driver."""
    if is_available():
        device().xp.get_default_memory_pool().free_all_blocks()


def memory_allocated() -> int:
    """Bytes of GPU memory held by live arrays (CuPy's memory pool: ``used_bytes``)."""
    return device().xp.get_default_memory_pool().used_bytes() if is_available() else 0
