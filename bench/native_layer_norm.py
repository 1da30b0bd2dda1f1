"""Issue 32 (b): compiled programs with each ``layer_norm`` and its backward ``normalize_grad`` as native row loops
(``native.LayerNormStep``, ``NormalizeGradStep``) against the same programs with the ops' NumPy kernels
(``native.layer_norms`` off, everything else native), in one process pinned to one core with one thread, the two
alternating call by call; CPU-time medians (``time.process_time``).

    python bench/native_layer_norm.py [--repeats 300]

Cases: bench/cases/transformer.py's compiled encoder steps (loss and gradients, as bench/run.py times them), and a
bare ``layer_norm`` of 16 × 32 × 64 float32 with weight and bias, forward, and forward and backward."""

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
from cases import transformer  # noqa: E402

import opforge as of  # noqa: E402
from opforge import ops as F  # noqa: E402
from opforge.program import native  # noqa: E402


def encoder_steps() -> dict:
    return {v.name: v.fn for v in transformer.opforge_variants(compiled=True) if v.name.startswith("encoder")}


def bare_layer_norm() -> dict:
    rng = np.random.default_rng(0)
    x, w, b = (of.tensor(rng.standard_normal(s).astype(np.float32)) for s in ((16, 32, 64), 64, 64))
    xg = of.tensor(x.numpy(), requires_grad=True)

    def both(x):
        loss = F.sum(F.layer_norm(x, [64], w, b) * x)
        return (loss, *of.grad(loss, [x]))

    fn, fn_both = of.compile(lambda x, w, b: F.layer_norm(x, [64], w, b)), of.compile(both)
    return {"layer_norm 16×32×64 float32, forward": lambda: fn(x, w, b),
            "layer_norm 16×32×64 float32, forward and backward (loss sum(y·x))": lambda: fn_both(xg)}


def build(make, fused: bool) -> dict:
    real = native.layer_norms
    if not fused:
        native.layer_norms = lambda ops, kernels, specs: (ops, kernels)
    try:
        steps = make()
        for step in steps.values():
            step()  # trace, plan and compile now
    finally:
        native.layer_norms = real
    return steps


def measure(make, repeats: int) -> dict:
    on, off = build(make, True), build(make, False)
    for name in on:  # the same bits either way, before any timing
        a, b = on[name](), off[name]()
        a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
        assert all(np.array_equal(u.numpy(), v.numpy()) for u, v in zip(a, b, strict=True)), name
    times = {(name, k): [] for name in on for k in ("loop", "kernel")}
    for _ in range(5):
        for name in on:
            on[name](), off[name]()
    for _ in range(repeats):
        for name in on:
            for k, step in (("loop", on[name]), ("kernel", off[name])):
                start = time.process_time()
                step()
                times[name, k].append(time.process_time() - start)
    return {key: statistics.median(v) * 1e3 for key, v in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    print(f"pinned to core {sorted(os.sched_getaffinity(0))}, native backend {'on' if native.enabled() else 'OFF'}")
    print("| case | layer_norm kernel (ms) | native row loop (ms) | speed-up |")
    print("|---|---|---|---|")
    for make in (bare_layer_norm, encoder_steps):
        r = measure(make, args.repeats)
        for name in dict.fromkeys(n for n, _ in r):
            off, on = r[name, "kernel"], r[name, "loop"]
            print(f"| {name} | {off:.3f} | {on:.3f} | {off / on:.2f}× |")


if __name__ == "__main__":
    main()
