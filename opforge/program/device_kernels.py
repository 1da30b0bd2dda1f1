"""Fused groups as generated kernels of a device: on a device that makes them (``Device.makes_elementwise_kernels``,
CuPy's ``ElementwiseKernel`` on "cuda"), each group of pointwise ops that the fusion pass makes runs as one kernel
launch instead of one launch per op.

The groups are the host's: chains with one result (``fusion.fuse``, here with only the ops that declare a scalar
expression, so an op without one keeps its own kernel and its neighbours still fuse) and regions that hand several
results to the rest of the plan (``native.several_results``). A group's kernel body is its C statements at one element
from the ops' scalar expressions, ``native.element_lines``: the one translation, which the host's C loops use too; its
helper functions (NumPy's maximum, minimum, sign) go into the preamble as ``__device__`` functions. The kernel
broadcasts its inputs itself (no strides are planned) and takes any layout. A group that cannot be translated (an
infinite constant, a dtype other than float32, float64 and bool) runs its members' own kernels, one after another.

What changes against the members' kernels run one by one (each a CuPy ufunc launch), and only that:
* arithmetic, comparisons and selects give their bits: each op rounds to its dtype as the ufuncs do, and the kernel is
  compiled with ``--fmad=false`` so that NVRTC does not contract a·b + c into one FMA (the host loop's
  ``-ffp-contract=off``);
* a transcendental function is CUDA's (expf, tanhf, erff ...), the one CuPy's ufunc calls, but where an op's own
  kernel computes its value by another formula (sigmoid as exp, add and reciprocal; a gradient from its parts), or
  where CUDA's libdevice code is compiled without FMA contraction, the last bits may differ: CUDA documents at most
  2 ulp for expf, tanhf and erff; tests/cuda/test_cuda_fusion.py bounds the difference at 2 ulp a call against the
  ops run one by one on the GPU, and at 4 against the CPU.

Intermediates between steps are the device's arrays (CuPy's memory pool): the plan drops each right after its last
reader, and a group's one output may be written into a dying input of its Spec (each element is read before it is
written, by the same thread), unless another input views that memory in another layout (then a new array).
Kernels are cached by their source (``_KERNELS``); CuPy caches the compiled binaries on disk too. ``OPFORGE_NATIVE=0``
(or ``Executor(native=False)``) keeps one kernel per op.
"""

from __future__ import annotations

from ..core.opdef import Kernel
from . import native
from .fusion import FusedOp, fuse

# NVRTC's options for every generated kernel: no contraction into FMA (see the module's docstring)
OPTIONS = ("--fmad=false",)
# The most bytes of parameters a CUDA kernel takes (32764 since CUDA 12.1 on Volta and later; CuPy 14 needs CUDA 12
# or 13). CuPy passes each array as its pointer, size, shape and strides (16 + 16·ndim bytes) and an indexer (8 +
# 16·ndim): a region handing hundreds of results to the plan would not launch, and runs its members instead.
PARAMETER_BYTES = 32764
PREAMBLE = native.helpers("__device__ inline")
_KERNELS: dict = {}  # (device name, params, body, name) -> the device's kernel, made once per source


class KernelGroup(FusedOp):
    """A fused group (``FusedOp`` or ``native.NativeGroup``: ``members``, ``inputs``, outputs) run as one generated
    kernel of the device (``kernel``, its body ``body``)."""

    type = "kernel_group"

    def __init__(self, group: FusedOp, kernel, in_params: str, out_params: str, body: str):
        self.members, self.inputs, self.specs, self.spec = group.members, group.inputs, group.specs, group.spec
        self.outputs = group.output_names()
        self.output = self.outputs[0]
        self.kernel, self.in_params, self.out_params, self.body = kernel, in_params, out_params, body
        self.scratch, self.donated, self.native = [], set(), None
        # one output: it may go to any input of its Spec (a dying one, or the parameter an update writes into)
        self.inplace_inputs = [n for n in self.inputs if self.specs[n] == self.spec] if len(self.outputs) == 1 else []

    def output_names(self) -> list:
        return list(self.outputs)

    def prepare(self, out_input) -> None:
        pass  # no scratch buffers: the kernel keeps every intermediate in registers

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        """``def <name>(inputs..., W, out=None)``: one launch. With several outputs, new arrays; with one, ``out``
        unless it shares memory with an input in another layout (a view of it: a thread would read an element
        another one wrote)."""
        args = "".join(f"i{k}, " for k in range(len(self.inputs)))
        env[f"{name}_n"] = self.kernel
        lines = [f"def {name}({args}W, out=None):  # {self!r}, device kernel"]
        if len(self.outputs) == 1:
            xp = env["_device"].xp
            env.setdefault("_shares", lambda out, inputs: any(x is not out and xp.may_share_memory(x, out)
                                                              for x in inputs))
            lines += [f"    if out is None or _shares(out, ({args})):",
                      f"        return {name}_n({args.rstrip(', ')})",
                      f"    return {name}_n({args}out)"]
        else:
            lines.append(f"    return {name}_n({args.rstrip(', ')})")
        return lines, {len(lines) - 1: " -> ".join(op.type for op, _, _ in self.members[:8])}


def kernel_text(group: FusedOp) -> tuple[str, str, str]:
    """A group's kernel as CuPy's ``ElementwiseKernel`` takes it: (in_params, out_params, body); ``native.Unsupported``
    if it cannot be translated."""
    specs, outputs = group.specs, group.output_names()
    native.check_dtypes(group)
    ndim = len(group.spec.shape)
    if (len(group.inputs) + len(outputs)) * (16 + 16 * ndim) + 8 + 16 * ndim > PARAMETER_BYTES:
        raise native.Unsupported(f"{len(group.inputs)} inputs and {len(outputs)} outputs of {ndim} dims: more "
                                 f"than {PARAMETER_BYTES} bytes of kernel parameters")
    in_params = ", ".join(f"{specs[n].dtype.name} in{k}" for k, n in enumerate(group.inputs))
    out_params = ", ".join(f"{specs[n].dtype.name} out{k}" for k, n in enumerate(outputs))
    body = native.element_lines(group, [f"in{k}" for k in range(len(group.inputs))],
                                [f"out{k}" for k in range(len(outputs))], "")
    return in_params, out_params, "\n".join(body)


def _kernel(device, in_params: str, out_params: str, body: str, name: str):
    key = (device.name, in_params, out_params, body, name)
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = device.elementwise_kernel(in_params, out_params, body, name, PREAMBLE, OPTIONS)
    return kernel


def fuse_groups(ops: list, kernels: list, specs: dict, roots: set, updates: set, device) -> tuple[list, list]:
    """The fusion pass on ``device``: regions with several results, then chains, each group one kernel of the device
    (``KernelGroup``); a group that cannot be translated gives back its members, in order, at its place."""
    ops, kernels = native.several_results(ops, kernels, specs, roots, updates)
    ops, kernels = fuse(ops, kernels, specs, roots, member=lambda op: native.translatable(op, specs))
    new_ops, new_kernels = [], []
    for (op, attrs), kernel in zip(ops, kernels):
        if not isinstance(op, FusedOp):
            new_ops.append((op, attrs))
            new_kernels.append(kernel)
            continue
        try:
            in_params, out_params, body = kernel_text(op)
        except native.Unsupported:
            new_ops += [(member, member_attrs) for member, member_attrs, _ in op.members]
            new_kernels += [member_kernel for _, _, member_kernel in op.members]
            continue
        name = "opforge_" + "_".join(member.type for member, _, _ in op.members[:4])  # (what a profiler shows)
        group = KernelGroup(op, _kernel(device, in_params, out_params, body, name), in_params, out_params, body)
        new_ops.append((group, {}))
        new_kernels.append(Kernel(None, None, None, len(group.outputs) == 1, False, False))
    return new_ops, new_kernels
