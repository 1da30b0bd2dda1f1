"""Run by tests/test_oracle_collective.py as `mpiexec -n 2 python tests/distributed/ranks_collectives.py DIR`: calls
each collective on the cases listed in DIR/cases.json, checks each gradient against central differences taken
across the ranks, and writes what each rank saw (input, output gradient, output, gradient) to DIR/rank<r>.npz,
where the test compares them with torch (importing torch here would cost each rank seconds)."""

import json
import sys
from pathlib import Path

import numpy as np

import opforge as of
from opforge import ops as F

world = of.distributed.init()
RANK, SIZE = world.rank, world.size
H = 1e-6


def run(name, shape, attrs):
    attrs = dict(attrs)
    ties = attrs.pop("ties", False)
    rng = np.random.default_rng([RANK, len(shape)])
    x = rng.standard_normal(shape)
    if ties:  # every other element equal on all ranks: the max's gradient is shared among them
        x = np.round(np.random.default_rng(7).standard_normal(shape))
        x.flat[::2] += 0.5 * RANK
    op = getattr(F, name)
    xt = of.tensor(x, dtype="float64", requires_grad=True)
    y = op(xt, **attrs)
    u = rng.standard_normal(y.shape)
    (y * of.tensor(u)).sum().backward()  # the gradient of Σ_r <u_r, y_r> w.r.t. this rank's x
    grad = xt.grad.numpy()
    # central differences of Σ_r <u_r, y_r>: rank s moves one element, every rank evaluates its own term; the
    # terms are summed over the ranks at the end, in one all-reduce
    terms = np.zeros((SIZE, x.size, 2))
    for s in range(SIZE):
        for i in range(x.size):
            for k, sign in enumerate((1, -1)):
                moved = x.copy()
                if s == RANK:
                    moved.flat[i] += sign * H
                terms[s, i, k] = np.sum(op(of.tensor(moved), **attrs).numpy() * u)
    f = world.all_reduce(terms)
    numeric = ((f[RANK, :, 0] - f[RANK, :, 1]) / (2 * H)).reshape(x.shape)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7, err_msg=f"{name} {shape} {attrs}")
    return {"x": x, "u": u, "y": y.numpy(), "grad": grad}


DIR = Path(sys.argv[1])
saved = {}
for i, (name, shape, attrs) in enumerate(json.loads((DIR / "cases.json").read_text())):
    for key, value in run(name, tuple(shape), attrs).items():
        saved[f"{i}.{key}"] = value
    if RANK == 0:
        print(f"ok {i} {name}: gradient vs central differences across ranks", flush=True)
np.savez(DIR / f"rank{RANK}.npz", **saved)
