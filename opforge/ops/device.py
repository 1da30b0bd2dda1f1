"""Moving data between devices. ``to_device`` is an op like any other — recorded by autograd, its gradient the copy
back (tinygrad's idea) — so ``Tensor.to(device)`` and ``Tensor.cpu()`` differentiate through a move."""

from opforge import ops as F

from ..core.devices import default_device, get_device
from ._common import Sample, np, op


def _destination(attrs: dict):
    return get_device(attrs["device"], "to_device()")


@op("to_device(Tensor x, *, str device) -> Tensor y", traits=["elementwise"], out_device=_destination)
def to_device(x, *, device, xp=np):
    """A copy of x on ``device`` (the name of a registered device). ``xp`` is the array module of x's device: one
    with memory of its own (CuPy's) has ``asnumpy``, which reads x back to the host."""
    target = get_device(device)
    if type(x) is target.array_type:  # the same kind of arrays: copied there, never through the host
        return target.xp.array(x, copy=True)
    return target.from_host(xp.asnumpy(x) if hasattr(xp, "asnumpy") else x, copy=True)


@to_device.check
def _(*, device):
    get_device(device, "to_device()")  # an unknown device is refused at the call, naming the known ones


to_device.onnx(lambda g, x, *, device: g.op("Identity", x))  # an ONNX model has no devices: its runtime places values


@to_device.grad
def _(x, dy, *, device):
    return F.to_device(dy, device=x.device.name)


@to_device.samples
def _(rng):
    # A copy onto the device the samples live on (the one check_op runs on): a program runs on one device, so a
    # move elsewhere could not be traced. Moves between devices are tested with a second device.
    here = default_device().name
    yield Sample.of(rng.standard_normal((2, 3)), device=here)
    yield Sample.of(rng.standard_normal(()), device=here)
