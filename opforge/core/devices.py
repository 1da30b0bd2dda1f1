"""Devices: where arrays live and kernels run (Chainer's ``Device.xp``, made the one place that knows).

A ``Device`` is an object, not a name: its array module (``xp``: ``numpy`` for "cpu"), how a kernel's result becomes
an array of the device (``array``), how arrays move on and off it (``from_host``, ``to_host``), and its seeded random
generator. A Tensor carries its device; dispatch, autograd and the executor ask the device, never NumPy, about data.

Kernels are registered per device name. A kernel that names an ``xp`` parameter is handed its device's array module,
so one body written against the array API serves every device; a device-specific kernel wins over it. A device
whose arrays *are* host arrays of another device (``kernels_of="cpu"``) may run that device's kernels where it has
none of its own.

"cpu" is built in; "cuda" (CuPy's arrays on a GPU, ``core/cuda.py``) is registered on first use;
``register_device`` adds more (a plug-in, or a test's second device that is NumPy under another name). ``Device``
compares equal to its name, so ``t.device == "cpu"`` reads as it should.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading

import numpy as np

from .errors import ArgumentError, describe


class Device:
    __slots__ = ("_streams", "array_type", "kernels_of", "name", "xp")

    def __init__(self, name: str, xp=np, *, array_type=None, kernels_of: str | None = None):
        self.name = name
        self.xp = xp  # the array module kernels written against ``xp`` use here
        self.array_type = np.ndarray if array_type is None else array_type  # the arrays this device holds
        self.kernels_of = kernels_of  # a device whose kernels also serve this one (same kind of arrays)
        self._streams = _Streams()

    # -- arrays -------------------------------------------------------------------------------------------------

    def array(self, value):
        """A kernel's result as an array of this device: the one place a 0-d result (a NumPy scalar) or a list
        becomes an array."""
        return value if type(value) is self.array_type else self.xp.asarray(value)

    @property
    def type(self) -> str:
        """The device's name, as ``torch.device``'s ``type`` (``"cpu"``)."""
        return self.name

    @property
    def host(self) -> bool:
        """Whether this device's arrays are NumPy arrays in host memory."""
        return self.array_type is np.ndarray

    def from_host(self, array: np.ndarray, copy: bool = False):
        """A host (NumPy) array on this device: shared where the device holds host arrays, unless ``copy``."""
        if self.host:
            return np.array(array, copy=True) if copy else array
        return self.xp.asarray(array)

    def to_host(self, array) -> np.ndarray:
        """An array of this device as a NumPy array (no copy where it already is one)."""
        if self.host:
            return array
        return self.xp.asnumpy(array)

    def copy_into(self, target, value) -> None:
        """Write ``value`` into the array ``target`` of this device, in place (casting within a kind)."""
        self.xp.copyto(target, value, casting="same_kind")

    # -- generated kernels ----------------------------------------------------------------------------------------

    @property
    def makes_elementwise_kernels(self) -> bool:
        """Whether ``elementwise_kernel`` makes kernels here (the executor then runs each fused group of pointwise
        ops as one generated kernel): where the array module has CuPy's ``ElementwiseKernel``."""
        return hasattr(self.xp, "ElementwiseKernel")

    def elementwise_kernel(self, in_params: str, out_params: str, operation: str, name: str, preamble: str = "",
                           options: tuple = ()):
        """A kernel computing ``operation`` (C statements) at each element of its broadcast inputs: CuPy's
        ``ElementwiseKernel(in_params, out_params, operation, name, preamble=..., options=...)``, called as
        ``kernel(*inputs)`` or ``kernel(*inputs, *outputs)``, returning its output(s)."""
        if not self.makes_elementwise_kernels:
            raise ArgumentError(f"device '{self.name}' makes no generated elementwise kernels (its array module "
                                f"{getattr(self.xp, '__name__', self.xp)!r} has no ElementwiseKernel)")
        return self.xp.ElementwiseKernel(in_params, out_params, operation, name, preamble=preamble, options=options)

    # -- randomness ---------------------------------------------------------------------------------------------

    def generator(self):
        """This thread's generator for the device, seeded by ``manual_seed`` (NumPy's ``Generator`` on the host)."""
        return self._streams.get(self)

    @contextlib.contextmanager
    def drawing_from(self, generator):
        """Random kernels on this device, in this thread, draw from ``generator`` inside the ``with`` block."""
        saved = self._streams.generator
        self._streams.generator = generator
        try:
            yield generator
        finally:
            self._streams.generator = saved

    def new_generator(self, seed: int):
        return (np if self.host else self.xp).random.default_rng(seed)

    # -- identity -----------------------------------------------------------------------------------------------

    def __eq__(self, other) -> bool:
        if isinstance(other, Device):
            return other is self
        return isinstance(other, str) and other == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"device({self.name!r})"


class _Streams(threading.local):
    """A device's random generator in each thread: seeded 0 until ``manual_seed`` in that thread says otherwise."""

    generator = None

    def get(self, device: Device):
        if self.generator is None:  # a device registered after manual_seed (cuda, on first use) takes its seed
            self.generator = device.new_generator(getattr(_seeded, "seed", 0))
        return self.generator


_seeded = threading.local()  # the last manual_seed in this thread


CPU = Device("cpu")
_DEVICES: dict[str, Device] = {"cpu": CPU}
# a device registered when first asked for (its library imported only then): name -> (the name asked, "cuda:0") -> it
_ON_FIRST_USE: dict = {}


def manual_seed(seed: int) -> None:
    """Seed every device's generator in this thread: the same seed gives the same numbers, op for op."""
    seed = _seeded.seed = int(seed)
    for device in _DEVICES.values():
        device._streams.generator = device.new_generator(seed)


def register_device(name: str, xp=np, *, kernels_of: str | None = None, array_type=None, cls=Device) -> Device:
    """Add a device: ``xp`` its array module; ``kernels_of`` a device whose kernels serve it where it has none;
    ``cls`` a subclass of ``Device`` where the device's arrays need their own moves on and off the host."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ArgumentError(f"register_device(): argument 'name' expected an identifier, got {describe(name)}")
    if kernels_of is not None and kernels_of not in _DEVICES:
        raise ArgumentError(f"register_device(): kernels_of={kernels_of!r} is not a known device "
                            f"({sorted(_DEVICES)})")
    known = _DEVICES.get(name)
    if known is not None:
        if known.xp is not xp or known.kernels_of != kernels_of:
            raise ArgumentError(f"register_device(): a device named {name!r} exists already with another "
                                "array module or kernel source")
        return known
    device = _DEVICES[name] = cls(name, xp, array_type=array_type, kernels_of=kernels_of)
    return device


def array_module(array):
    """The array module of the device holding ``array`` (``numpy`` for a host array, CuPy for a CuPy array): for a
    kernel that takes no ``xp`` and must call what NumPy's dispatch does not forward (``xp.add.at``)."""
    if type(array) is not np.ndarray:
        for device in _DEVICES.values():
            if type(array) is device.array_type:
                return device.xp
    return np


def get_device(device, where: str = "device") -> Device:
    """``device`` (a name or a Device) as the registered Device; an unknown one is an error naming ``where``."""
    if isinstance(device, Device):
        return device
    found = _DEVICES.get(device) if isinstance(device, str) else None
    if found is None and isinstance(device, str):
        first_use = _ON_FIRST_USE.get(device.partition(":")[0])
        if first_use is not None:  # "cuda", "cuda:0": registered now, its library imported now
            return first_use(device)
    if found is None:
        raise ArgumentError(f"{where}: unknown device {device!r}; known devices are {sorted(_DEVICES)}")
    return found


# The device ops with no tensor input (zeros, normal, arange ...) run on: "cpu" unless ``using_device`` says
# otherwise in this thread or task.
_default = contextvars.ContextVar("opforge.default_device", default=CPU)


def default_device() -> Device:
    return _default.get()


class using_device:
    """``with using_device("sim"): ...`` makes ops that have no tensor input run on that device."""

    def __init__(self, device):
        self.device = get_device(device, "using_device()")

    def __enter__(self) -> Device:
        self._token = _default.set(self.device)
        return self.device

    def __exit__(self, *exc) -> None:
        _default.reset(self._token)
