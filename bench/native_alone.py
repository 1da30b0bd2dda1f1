"""Issue 32: a lone relu_grad / leaky_relu_grad as a native loop of its own (``fusion.ALONE``) against its NumPy kernel
(the executor's ``ALONE`` emptied), in one process pinned to one core with one thread, the variants alternating round
by round; CPU-time medians (``time.process_time``). Each pair is checked bit-equal first.

    python bench/native_alone.py [--rounds 21]

Cases: a compiled program of the op alone (64 × 512 and 512 × 512, float32 and float64), and bench/cases/mlp.py's
compiled SGD step (batch 64 and 512) and bench/cases/hvp.py's compiled Hessian-vector product (batch 64), whose
backward passes hold lone relu_grads."""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"
os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from cases import hvp, mlp  # noqa: E402
from cases.common import opforge_tensors  # noqa: E402

import opforge as of  # noqa: E402
from opforge import ops as F  # noqa: E402
from opforge.program import executor, fusion  # noqa: E402

OPS = {"relu_grad": F.relu_grad, "leaky_relu_grad": lambda y, dy: F.leaky_relu_grad(y, dy, alpha=0.2)}


def op_alone(name, dtype, rows):
    rng = np.random.default_rng(0)
    y, dy = rng.standard_normal((2, rows, 512)).astype(dtype)
    y, dy = of.tensor(np.maximum(y, 0) if name == "relu_grad" else y), of.tensor(dy)
    fn = of.compile((lambda op: lambda y, dy: op(y, dy))(OPS[name]))
    return lambda: fn(y, dy)


def mlp_step(batch):
    return mlp.build("opforge.compiled", batch)[0]


def hvp_product():
    arrays, v, x, y = hvp.init()
    params, vs = opforge_tensors(arrays, requires_grad=True), opforge_tensors(v)

    def product(x, y):
        grads = of.grad(mlp.opforge_loss(params, x, y), params, create_graph=True)
        return of.grad(sum((g * d).sum() for g, d in zip(grads, vs)), params)

    fn, x, y = of.compile(product), of.tensor(x), of.tensor(y)
    return lambda: fn(x, y)


def built(make, alone):
    """make()'s callable, its plan made (first call) with ``alone`` as the executor's ALONE, and its first result."""
    executor.ALONE = alone
    try:
        call = make()
        result = call()
    finally:
        executor.ALONE = fusion.ALONE
    results = result if isinstance(result, (list, tuple)) else [result]
    return call, [r.numpy().copy() for r in results]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    cases = [(f"{name} alone, {np.dtype(dtype).name} {rows}×512", (lambda n, d, r: lambda: op_alone(n, d, r))(
        name, dtype, rows), 100) for name in OPS for dtype in (np.float32, np.float64) for rows in (64, 512)]
    cases += [("MLP SGD step, batch 64", lambda: mlp_step(64), 10),
              ("MLP SGD step, batch 512", lambda: mlp_step(512), 3), ("H·v, batch 64", hvp_product, 10)]
    print("| case | NumPy kernel (µs) | native loop (µs) | speed-up |\n|---|---:|---:|---:|")
    for label, make, calls in cases:
        (numpy_call, want), (native_call, got) = built(make, frozenset()), built(make, fusion.ALONE)
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(want, got)), f"{label}: the bits differ"
        times = {numpy_call: [], native_call: []}
        for _ in range(args.rounds):
            for call, samples in times.items():
                start = time.process_time()
                for _ in range(calls):
                    call()
                samples.append((time.process_time() - start) / calls * 1e6)
        a, b = statistics.median(times[numpy_call]), statistics.median(times[native_call])
        print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f}× |")


if __name__ == "__main__":
    main()
