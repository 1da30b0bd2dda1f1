"""Device names that kernels can be registered for. Tensors always hold NumPy arrays in host memory;
a device name selects the kernel. "cpu" is built in; a plug-in (or a test) may add more."""

from .errors import ArgumentError, describe

KNOWN = {"cpu"}


def register_device(name: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ArgumentError(f"register_device(): argument 'name' expected an identifier, got {describe(name)}")
    KNOWN.add(name)


def check_device(device, where: str = "device") -> str:
    if device not in KNOWN:
        raise ArgumentError(f"{where}: unknown device {device!r}; known devices are {sorted(KNOWN)}")
    return device
