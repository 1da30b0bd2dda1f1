"""The softmax family's and the class losses' eager kernels on small rows (64×10 float32, as in the compiled H·v of
bench/cases/hvp.py), each kernel function called directly: one process pinned to one core, one thread, 3000 calls × 5,
the median's CPU time per call.

    python bench/small_row_kernels.py [kernel names...]"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"
os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})

import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from opforge.core.opdef import registry  # noqa: E402


def kernel(name: str):
    return next(iter(registry.get(name).kernels.values())).fn


def per_call_us(fn, calls: int = 3000) -> float:
    for _ in range(100):
        fn()
    times = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - start) / calls * 1e6)
    return sorted(times)[2]


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 10)).astype(np.float32)
    t = rng.integers(0, 10, 64)
    dloss = np.array(1.0, np.float32)
    loss = {"ignore_index": -100, "reduction": "mean"}
    k = {name: kernel(name) for name in ("cross_entropy_grad", "cross_entropy", "softmax", "log_softmax",
                                         "softmax_grad", "log_softmax_grad", "nll_loss_grad")}
    cases = {
        "cross_entropy_grad": lambda: k["cross_entropy_grad"](x, t, dloss, None, None, None, **loss,
                                                             label_smoothing=0.0),
        "cross_entropy": lambda: k["cross_entropy"](x, t, None, **loss, label_smoothing=0.0),
        "softmax": lambda: k["softmax"](x, axis=-1),
        "log_softmax": lambda: k["log_softmax"](x, axis=-1),
        "softmax_grad": lambda: k["softmax_grad"](x, x, axis=-1),
        "log_softmax_grad": lambda: k["log_softmax_grad"](x, x, axis=-1),
        "nll_loss_grad": lambda: k["nll_loss_grad"](dloss, t, None, num_classes=10, **loss),
    }
    for name, fn in cases.items():
        if len(sys.argv) == 1 or name in sys.argv[1:]:
            print(f"{name:20s} {per_call_us(fn):7.2f} µs per call (64×10 float32)")


if __name__ == "__main__":
    main()
