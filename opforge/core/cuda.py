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


# -- elementwise kernels that read and write 16 bytes at a time ---------------------------------------------------

_VECTOR = {"float": ("float4", 4), "double": ("double2", 2)}
_LANES = ("x", "y", "z", "w")
_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


class Elementwise:
    """An elementwise kernel from a C body over named inputs, outputs and scalars (``y = x > 0 ? x : alpha * x;``),
    for CuPy arrays. Where every array is C-contiguous, 16-byte aligned, of one size and one dtype (float32 or
    float64), it runs as a RawKernel whose threads load and store 16 bytes at a time (float4/double2), a grid-stride
    loop over the vectors then the tail: CuPy's ElementwiseKernel reads one element per thread, which on an H200
    moved 1.7 TB/s for leaky_relu over 2^26 float32 against torch's 4.1. Any other call (broadcasting, strides,
    other dtypes) runs the same body as a ``cupy.ElementwiseKernel``. Compiled once per dtype; CuPy caches the
    binaries on disk."""

    def __init__(self, name: str, inputs, outputs, body: str, scalars=()):
        self.name, self.inputs, self.outputs, self.body = name, list(inputs), list(outputs), body
        self.scalars = list(scalars)
        self._raw: dict = {}
        self._general = None

    def source(self, ctype: str) -> str:
        """The RawKernel's CUDA source for ``ctype`` ("float" or "double")."""
        vtype, width = _VECTOR[ctype]
        params = [f"const {ctype}* __restrict__ in_{n}" for n in self.inputs]
        params += [f"{ctype}* __restrict__ out_{n}" for n in self.outputs]
        params += [f"const {ctype} {n}" for n in self.scalars] + ["const long long n"]
        lanes = []
        for lane in _LANES[:width]:
            lanes.append("    {")
            lanes += [f"      const {ctype} {n} = v_{n}.{lane};" for n in self.inputs]
            lanes += [f"      {ctype} {n};" for n in self.outputs]
            lanes.append(f"      {self.body}")
            lanes += [f"      r_{n}.{lane} = {n};" for n in self.outputs]
            lanes.append("    }")
        return "\n".join([
            f'extern "C" __global__ void {self.name}({", ".join(params)}) {{',
            "  const long long start = blockIdx.x * (long long)blockDim.x + threadIdx.x;",
            "  const long long step = (long long)gridDim.x * blockDim.x;",
            f"  const long long vectors = n / {width};",
            "  for (long long v = start; v < vectors; v += step) {",
            *[f"    const {vtype} v_{n} = reinterpret_cast<const {vtype}*>(in_{n})[v];" for n in self.inputs],
            *[f"    {vtype} r_{n};" for n in self.outputs],
            *lanes,
            *[f"    reinterpret_cast<{vtype}*>(out_{n})[v] = r_{n};" for n in self.outputs],
            "  }",
            f"  for (long long i = vectors * {width} + start; i < n; i += step) {{",
            *[f"    const {ctype} {n} = in_{n}[i];" for n in self.inputs],
            *[f"    {ctype} {n};" for n in self.outputs],
            f"    {self.body}",
            *[f"    out_{n}[i] = {n};" for n in self.outputs],
            "  }",
            "}",
        ])

    def __call__(self, *arrays, out=None, **scalars):
        cupy = device().xp
        outs = None if out is None else (out if isinstance(out, tuple) else (out,))
        first = arrays[0]
        ctype = _CTYPE.get(first.dtype)
        if ctype is not None and all(a.dtype == first.dtype and a.size == first.size and a.flags.c_contiguous
                                     and a.data.ptr % 16 == 0 for a in (*arrays, *(outs or ()))):
            if outs is None:
                outs = tuple(cupy.empty(first.shape, first.dtype) for _ in self.outputs)
            kernel = self._raw.get(ctype)
            if kernel is None:
                kernel = self._raw[ctype] = cupy.RawKernel(self.source(ctype), self.name)
            width = _VECTOR[ctype][1]
            blocks = max(1, min((first.size // width + 255) // 256, 32 * _multiprocessors(cupy)))
            values = [first.dtype.type(scalars[n]) for n in self.scalars]
            kernel((blocks,), (256,), (*arrays, *outs, *values, np.int64(first.size)))
            return outs[0] if len(outs) == 1 else outs
        if first.dtype.kind == "f" and first.dtype.itemsize == 2:  # halves: in float32, rounded once (ops/half.py)
            wide = self(*(a.astype(np.float32) for a in arrays), **scalars)
            wide = wide if isinstance(wide, tuple) else (wide,)
            if outs is None:
                outs = tuple(w.astype(first.dtype) for w in wide)
            else:
                for o, w in zip(outs, wide):
                    cupy.copyto(o, w, casting="same_kind")
            return outs[0] if len(outs) == 1 else outs
        if self._general is None:
            self._general = cupy.ElementwiseKernel(
                ", ".join([*(f"T {n}" for n in self.inputs), *(f"T {n}" for n in self.scalars)]),
                ", ".join(f"T {n}" for n in self.outputs), self.body, self.name + "_general")
        values = [first.dtype.type(scalars[n]) for n in self.scalars]
        return self._general(*arrays, *values, *(outs or ()))


@functools.cache
def _multiprocessors(cupy) -> int:
    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])
