"""Where a compiled program's time goes, step by step: each step (``k<i>``) of the plan's generated function wrapped
in a process-CPU timer, the program run N times in one process pinned to one core with one BLAS thread. Steps that
follow large GEMMs run with cold caches there, so they cost more than the same kernel called alone
(bench/small_row_kernels.py).

    python bench/plan_steps.py CASE [N]

CASE: ``hvp`` (bench/cases/hvp.py's H·v, batch 64), ``mlp64`` / ``mlp512`` (bench/cases/mlp.py's SGD step) or
``ce_hvp`` (H·v of cross_entropy alone, 64×10 float32 logits: the second backward pass's tail by itself). The timer
adds ~0.3 µs per step; the total is the unwrapped program's time per call."""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"
os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})

import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import hvp, mlp  # noqa: E402
from cases.common import opforge_tensors  # noqa: E402

import opforge as of  # noqa: E402
from opforge import ops as F  # noqa: E402
from opforge.program import assign  # noqa: E402


def case(name: str):
    """(compiled function, its arguments)."""
    if name == "hvp":
        arrays, v, x, y = hvp.init()
        params, vs = opforge_tensors(arrays, requires_grad=True), opforge_tensors(v)

        def fn(x, y):
            grads = of.grad(mlp.opforge_loss(params, x, y), params, create_graph=True)
            return of.grad(sum((g * d).sum() for g, d in zip(grads, vs)), params)

        return of.compile(fn), (of.tensor(x), of.tensor(y))
    if name in ("mlp64", "mlp512"):
        arrays, x, y = mlp.init(int(name[3:]))
        params = opforge_tensors(arrays, requires_grad=True)

        def step(x, y):
            loss = mlp.opforge_loss(params, x, y)
            grads = of.grad(loss, params)
            with of.no_grad():
                for p, g in zip(params, grads):
                    assign(p, p - mlp.LR * g)
            return loss

        return of.compile(step), (of.tensor(x), of.tensor(y))
    if name == "ce_hvp":
        rng = np.random.default_rng(0)
        x, v = (rng.standard_normal((64, 10)).astype(np.float32) for _ in range(2))

        def ce_hvp(x, t, v):
            (g,) = of.grad(F.cross_entropy(x, t), [x], create_graph=True)
            return of.grad(F.sum(g * v), [x])[0]

        return of.compile(ce_hvp), (of.tensor(x, requires_grad=True), of.tensor(rng.integers(0, 10, 64)), of.tensor(v))
    raise SystemExit(f"unknown case {name!r}: hvp, mlp64, mlp512 or ce_hvp")


def main():
    name, calls = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300
    fn, args = case(name)
    fn(*args)
    ((entry,),) = fn.cache.values()
    (plan,) = entry.exe._plans.values()
    for _ in range(20):
        fn(*args)
    start = time.process_time()
    for _ in range(calls):
        fn(*args)
    total = (time.process_time() - start) / calls
    lines = plan.source.splitlines()
    labels = {}
    for i, text in plan.line_ops.items():  # an op's own call: "op #i <type> -> <outputs>"
        m = re.search(r"\b(k\d+)\(", lines[i - 1]) if 0 < i <= len(lines) else None
        if m:
            labels[m.group(1)] = text
    for line in lines:  # a fused step's definition names its members
        m = re.match(r"def (k\d+)\(.*# (.*)", line)
        if m:
            labels[m.group(1)] = m.group(2)
    env, spent = plan.fn.__globals__, {}

    def timed(step, f):
        def call(*a, **k):
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                spent[step] = spent.get(step, 0.0) + time.process_time() - t
        return call

    for step in [k for k in env if re.fullmatch(r"k\d+", k)]:
        env[step] = timed(step, env[step])
    for _ in range(20):
        fn(*args)
    spent.clear()
    for _ in range(calls):
        fn(*args)
    print(f"{name}: {total * 1e6:.0f} µs per call (process CPU time, {calls} calls, unwrapped)")
    for step, t in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"{t / calls * 1e6:8.1f} µs  {step:4s} {labels.get(step, '')[:90]}")


if __name__ == "__main__":
    main()
