"""Half precision: float16 and bfloat16 kernels that compute in float32 and round once, as PyTorch does on CPU.

NumPy's float16 loops convert every element to float32 and back, one at a time (an add is ~60 times slower than
in float32, a 256×256 matmul ~250 times), and ml_dtypes' bfloat16 loops do the same; reductions would accumulate
in the narrow type. So an op whose CPU kernel serves every dtype gets, for the half dtypes, that same kernel
called on float32 copies of its half inputs, each output rounded to the dtype the op's shape rule gives it:
reductions accumulate in float32, matmul runs float32 BLAS, and an elementwise op rounds its result once.
A kernel an op registers for a half dtype itself (``@op.kernel(dtypes=["float16"])``) replaces this one.

Dispatch picks a kernel by the first input's dtype; for an op with the ``broadcast`` trait an integer or bool
first input may meet a half second one (``int_tensor * half_tensor`` is float16, as in PyTorch), so those ops
get the same treatment for integer and bool first inputs whenever a half input takes part.
"""

from ..core import dtypes as D
from ..core.opdef import registry
from ..core.spec import Spec
from ._common import np


def _widened(value, xp):
    if isinstance(value, xp.ndarray) and value.dtype in D.HALF:
        return value.astype(D.float32)
    if isinstance(value, list):
        return [_widened(v, xp) for v in value]
    return value


def _spec(value):
    if isinstance(value, list):
        return [Spec(v.shape, v.dtype) for v in value]
    return None if value is None else Spec(value.shape, value.dtype)


def _rounded(out, spec, xp):
    """Each output as the dtype its Spec says (a float32 result of a half op becomes half), an array of the
    kernel's device (``xp``: a 0-d result may be a NumPy scalar on the host)."""
    if isinstance(out, tuple):
        return tuple(_rounded(o, s, xp) for o, s in zip(out, spec))
    if isinstance(out, list):
        return [_rounded(o, s, xp) for o, s in zip(out, spec)]
    out = xp.asarray(out)
    return out if out.dtype == spec.dtype else out.astype(spec.dtype)


def _half_kernel(opdef, *, only_if_half: bool):
    """The op's generic CPU kernel on float32 copies of the half inputs, its outputs rounded as inferred. It takes
    ``xp``: it serves the devices that run the CPU's kernels too, on their arrays."""

    def run(inputs, attrs, extra, xp):
        if "save" in attrs:  # the dict for the kernel's residuals (OpDef.saves): the kernel's, not the shape rule's
            extra = {**extra, "save": attrs.pop("save")}
        base = _generic(opdef, xp)  # looked up per call: a kernel replaced later is followed
        if base.takes_xp:
            extra = {**extra, "xp": xp}
        base = base.fn
        if only_if_half and not any(isinstance(a, xp.ndarray) and a.dtype in D.HALF for a in inputs):
            return base(*inputs, **attrs, **extra)
        out = base(*(_widened(a, xp) for a in inputs), **attrs, **extra)
        specs = opdef.infer_specs([_spec(a) for a in inputs], attrs)
        return _rounded(out, specs[0] if len(specs) == 1 else specs, xp)

    if "random" in opdef.traits:
        def kernel(*inputs, rng, xp=np, **attrs):
            return run(inputs, attrs, {"rng": rng}, xp)
    else:
        def kernel(*inputs, xp=np, **attrs):
            return run(inputs, attrs, {}, xp)
    kernel.__doc__ = "Computes in float32 and rounds to the half dtype (see opforge.ops.half)."
    return kernel


def _generic(opdef, xp=np):
    """The op's kernel for every dtype on the CPU (``xp`` NumPy: a CPU one, or one for every device, which takes
    ``xp``), or on another device (the one for every device, else the CPU's, which such a device may run)."""
    cpu, every = opdef.kernels.get(("cpu", None)), opdef.kernels.get((None, None))
    return (cpu or every) if xp is np else (every or cpu)


def add_half_kernels(opdef, removed: bool = False) -> None:
    """Give ``opdef`` its half-precision CPU kernels (a registry listener: every op, the library's and yours)."""
    if removed or _generic(opdef) is None or not opdef.inputs:
        return
    first = opdef.inputs[0]
    # on the CPU, and, for an op with a kernel for every device, on every device: a device runs its dtype's kernel
    # for "every device" before that kernel for any dtype, and must widen as the CPU does (not an op that moves
    # data: its result is another device's array, not one the input's device can round)
    every_device = (None, None) in opdef.kernels and opdef.out_device is None
    for device in ("cpu", None) if every_device else ("cpu",):
        if first.dtypes is None or any(d in D.HALF for d in first.dtypes):
            for dt in D.HALF:
                if (device, dt) not in opdef.kernels:
                    opdef.add_kernel(_half_kernel(opdef, only_if_half=False), device, (dt,))
        if "broadcast" in opdef.traits and len(opdef.inputs) > 1:
            for dt in (D.bool_, *D.INTEGER):
                if (first.dtypes is None or dt in first.dtypes) and (device, dt) not in opdef.kernels:
                    opdef.add_kernel(_half_kernel(opdef, only_if_half=True), device, (dt,))


registry.listeners.append(add_half_kernels)
for _op in registry:
    add_half_kernels(_op)
