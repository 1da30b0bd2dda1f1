"""Issue 32 (b): compiled programs with ``softmax``, ``log_softmax``, their gradients and ``cross_entropy_grad`` as
native row loops (``native.SoftmaxRowStep``, ``CrossEntropyGradStep``) against the same programs with the ops' NumPy
kernels (``native.softmax_rows`` off, everything else native), in one process pinned to one core with one thread,
the two alternating call by call (which one first alternates too); CPU-time medians (``time.process_time``).

    python bench/native_softmax.py [--repeats 300]

Cases: bench/cases/hvp.py's compiled Hessian-vector product (batch 64 × 10 classes: its softmax and softmax_grad),
bench/cases/mlp.py's compiled SGD step at batch 64 and 512 (its cross_entropy_grad), and softmax, log_softmax and
cross_entropy of 64×1000 and 128×10 float32, forward and backward (loss sum(f(x)·c) for a constant c, gradient in x;
cross_entropy's mean loss and gradient)."""

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

import opforge as of  # noqa: E402
from opforge import ops as F  # noqa: E402
from opforge.program import native  # noqa: E402


def hvp_case() -> dict:
    return {"H·v of the MLP loss, batch 64 (softmax 64×10)": hvp.build("opforge.compiled")}


def mlp_cases() -> dict:
    return {f"MLP SGD step, batch {b}": mlp.build("opforge.compiled", b)[0]
            for b in mlp.BATCHES}


def _forward_backward(loss_of):
    def both(x):
        loss = loss_of(x)
        return (loss, *of.grad(loss, [x]))

    return of.compile(both)


def row_cases() -> dict:
    rng = np.random.default_rng(0)
    cases = {}
    for rows, classes in ((64, 1000), (128, 10)):
        x = of.tensor(rng.standard_normal((rows, classes)).astype(np.float32), requires_grad=True)
        c = of.tensor(rng.standard_normal((rows, classes)).astype(np.float32))
        t = of.tensor(rng.integers(0, classes, rows))
        steps = {"softmax": _forward_backward(lambda x, c=c: F.sum(F.softmax(x, axis=-1) * c)),
                 "log_softmax": _forward_backward(lambda x, c=c: F.sum(F.log_softmax(x, axis=-1) * c)),
                 "cross_entropy": _forward_backward(lambda x, t=t: F.cross_entropy(x, t))}
        for name, step in steps.items():
            cases[f"{name} {rows}×{classes} float32, forward and backward"] = lambda step=step, x=x: step(x)
    return cases


def build(make, rows: bool) -> dict:
    real = native.softmax_rows
    if not rows:
        native.softmax_rows = lambda ops, kernels, specs: (ops, kernels)
    try:
        steps = make()
        for step in steps.values():
            step()  # trace, plan and compile now
    finally:
        native.softmax_rows = real
    return steps


def _arrays(result) -> list:
    result = result if isinstance(result, (tuple, list)) else (result,)
    return [r.numpy() for r in result]


def measure(make, repeats: int, check: bool) -> dict:
    on, off = build(make, True), build(make, False)
    for name in on if check else ():  # the same values either way (up to the row sums' order), before any timing
        for a, b in zip(_arrays(on[name]()), _arrays(off[name]()), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=name)
    times = {(name, k): [] for name in on for k in ("loop", "kernel")}
    for _ in range(5):
        for name in on:
            on[name](), off[name]()
    for r in range(repeats):
        for name in on:
            pair = (("loop", on[name]), ("kernel", off[name]))
            for k, step in pair[::-1] if r % 2 else pair:  # (which runs first alternates: no bias from the order)
                start = time.process_time()
                step()
                times[name, k].append(time.process_time() - start)
    return {key: statistics.median(v) * 1e3 for key, v in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    print(f"pinned to core {sorted(os.sched_getaffinity(0))}, native backend {'on' if native.enabled() else 'OFF'}")
    print("| case | softmax kernels (ms) | native row loops (ms) | speed-up |")
    print("|---|---|---|---|")
    for make, check in ((row_cases, True), (hvp_case, True), (mlp_cases, False)):  # (an SGD step moves its params)
        r = measure(make, args.repeats, check)
        for name in dict.fromkeys(n for n, _ in r):
            off, on = r[name, "kernel"], r[name, "loop"]
            print(f"| {name} | {off:.3f} | {on:.3f} | {off / on:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
