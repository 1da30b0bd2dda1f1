"""Does an op compute on another device what it computes on the CPU? Its outputs and derivatives, sample by sample.

``compare_with_cpu("gelu", "cuda")`` runs each of the op's samples in float64 on the CPU and on the device, eagerly,
and compares the outputs, the gradients of a fixed weighted sum of them, and (``order=2``) the gradients of a
weighted sum of those gradients: a kernel written for one device (a fused CUDA kernel, a user's) is checked
against the CPU's, forward and backward, by one call. It returns the differences found (empty: none).
"""

from __future__ import annotations

import numpy as np

from .. import ops as F
from ..autodiff import grad
from ..core.devices import get_device, manual_seed, using_device
from ..core.errors import OpforgeError
from ..core.opdef import registry
from ..creation import arange
from ..tensor import Tensor
from .conformance import _materialize, call_op, default_samples


def samples_of(opdef) -> list:
    rng = np.random.default_rng(0)
    return list(opdef.samples_fn(rng)) if opdef.samples_fn else list(default_samples(opdef, rng))


def _weighted_sum(values: list):
    """A fixed weighted sum of float tensors: each element weighed differently, so a misplaced one shows."""
    return sum(F.sum(v * (1.0 + arange(v.size, dtype=v.dtype).reshape(v.shape) / 7)) for v in values)


def run_sample(opdef, k: int, device, order: int = 1) -> list:
    """The op on its sample ``k`` in float64 on ``device``: [outputs, gradients, second-order gradients] (up to
    ``order``), each a list of host arrays or None, read back once at the end."""
    device = get_device(device, "run_sample()")
    manual_seed(0)
    with using_device(device):
        sample = samples_of(opdef)[k]
        differentiable = "no_grad" not in opdef.traits
        args, kwargs = _materialize(opdef, sample, np.float64, requires_grad=differentiable)
        out = call_op(opdef, args, kwargs)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, Tensor)]
        for o in outs:
            if o.device != device:
                raise AssertionError(f"{opdef.name}: an output is on '{o.device}', its inputs on '{device}'")
        leaves = [t for t in (*args, *kwargs.values()) for t in (t if isinstance(t, list) else [t])
                  if isinstance(t, Tensor) and t.requires_grad]
        weighted = [o for o in outs if o.dtype.kind == "f" and o.requires_grad]
        found = [outs]
        if order >= 1 and weighted and leaves:
            grads = grad(_weighted_sum(weighted), leaves, allow_unused=True, create_graph=order >= 2)
            found.append(list(grads))
            if order >= 2:
                again = [g for g in grads if g is not None and g.requires_grad]
                found.append(list(grad(_weighted_sum(again), leaves, allow_unused=True)) if again else [])
    return [[None if t is None else t.cpu().numpy() for t in ts] for ts in found]


def compare_with_cpu(op, device, *, order: int = 1, rtol: float = 1e-12, atol: float = 1e-12) -> list[str]:
    """The differences between the op on ``device`` and on the CPU, over its samples (float64): outputs, first and
    (``order=2``) second derivatives. A sample the op refuses in float64 on the CPU (an integer-only op) is skipped;
    one that fails on the device only is a difference. ``atol`` is scaled by the largest value compared."""
    opdef = registry.get(op) if isinstance(op, str) else op
    differences = []
    # a random op draws from each device's own generator: the same seed draws other numbers on the GPU (CuPy's
    # XORWOW) than on the host (NumPy's PCG64; the strict test device draws NumPy's), so there only what the results
    # are (shapes, dtypes) is compared
    random = any(kernel.takes_rng for kernel in opdef.kernels.values())
    for k in range(len(samples_of(opdef))):
        try:
            want = run_sample(opdef, k, "cpu", order)
        except OpforgeError:
            continue
        try:
            got = run_sample(opdef, k, device, order)
        except Exception as e:  # reported, with its type
            differences.append(f"{opdef.name} sample {k}: fails on '{device}' only: {type(e).__name__}: {e}")
            continue
        for kind, w, g in zip(("output", "gradient", "second-order gradient"), want, got):
            if len(w) != len(g):
                differences.append(f"{opdef.name} sample {k}: {len(w)} {kind}s on the CPU, {len(g)} on '{device}'")
                continue
            for i, (a, b) in enumerate(zip(w, g)):
                if a is None or b is None:
                    if not (a is None and b is None):
                        differences.append(f"{opdef.name} sample {k}: {kind} {i} is None on one device only")
                    continue
                if a.shape != b.shape or a.dtype != b.dtype:
                    differences.append(f"{opdef.name} sample {k}: {kind} {i} is {b.dtype}{list(b.shape)} on "
                                       f"'{device}', {a.dtype}{list(a.shape)} on the CPU")
                    continue
                if random and get_device(device).name == "cuda":
                    continue
                scale = max(1.0, float(np.nanmax(np.abs(a), initial=0.0))) if a.dtype.kind == "f" else 1.0
                try:
                    np.testing.assert_allclose(b, a, rtol=rtol, atol=atol * scale, equal_nan=True)
                except AssertionError as e:
                    differences.append(f"{opdef.name} sample {k}: {kind} {i}: {str(e).strip()}")
    return differences
