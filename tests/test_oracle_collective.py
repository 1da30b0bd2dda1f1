"""PyTorch as the oracle for the collectives, on 2 ranks: values and gradients.

``ORACLE`` maps each collective to a torch function of *every* rank's input (a list, in rank order) and the op's
attrs, returning every rank's output. Gradients are those of the program as a whole, Σ_r <u_r, y_r> for each rank's
output gradient u_r, which torch computes by autograd through that one function.
``tests/distributed/ranks_collectives.py``, run here once under ``mpiexec -n 2``, calls each op on its own samples
and on ``CASES`` (listed for it in a file), checks each gradient against central differences of Σ_r <u_r, y_r>
taken across the ranks (a perturbation on one rank moves every rank's output), and saves what each rank saw; the
test compares that with torch.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import opforge as of

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = Path(sys.executable).with_name("mpiexec")


def _reduce(xs, op):
    stacked = torch.stack(xs)
    if op == "max":
        return torch.amax(stacked, 0)  # ties share the gradient, as all_reduce(max)'s rule does
    return stacked.sum(0) if op == "sum" else stacked.mean(0)


def _all_to_all(xs, split_axis, concat_axis):
    n = len(xs)
    return [torch.cat([x.chunk(n, split_axis)[r] for x in xs], concat_axis) for r in range(n)]


ORACLE = {
    "all_reduce": lambda xs, op="sum": [_reduce(xs, op)] * len(xs),
    "all_gather": lambda xs, axis=0: [torch.cat(xs, axis)] * len(xs),
    "reduce_scatter": lambda xs, axis=0, op="sum": list(_reduce(xs, op).chunk(len(xs), axis)),
    "broadcast": lambda xs, root=0: [xs[root]] * len(xs),
    "reduce": lambda xs, root=0, op="sum": [_reduce(xs, op) if r == root else torch.zeros_like(xs[r])
                                            for r in range(len(xs))],
    "all_to_all": lambda xs, split_axis=0, concat_axis=0: _all_to_all(xs, split_axis, concat_axis),
}

# Beyond each op's samples: the other reductions, another root, ties for max.
CASES = {
    "all_reduce": [((3, 2), {"op": "mean"}), ((2, 2), {"op": "max", "ties": True})],
    "broadcast": [((2, 3), {"root": 1})],
    "reduce": [((2, 3), {"root": 1, "op": "mean"})],
    "reduce_scatter": [((4, 2), {"op": "mean"})],
    "all_gather": [((1, 2, 3), {"axis": 2})],
    "all_to_all": [((2, 4), {"split_axis": 1, "concat_axis": 0})],
}


def cases(name, size=2):
    """The op's own samples (made for a group of ``size``), then CASES."""
    from opforge.distributed import using_communicator

    class Group(of.distributed.SelfCommunicator):
        pass

    Group.size = size
    with using_communicator(Group()):
        samples = list(of.registry.get(name).samples_fn(np.random.default_rng(0)))
    return [(s.args[0].shape, dict(s.kwargs)) for s in samples] + CASES[name]


def test_every_collective_matches_torch_and_central_differences_on_two_ranks(tmp_path):
    """One launch for every collective (under pytest-xdist a module fixture would launch once per worker)."""
    if not MPIEXEC.exists():
        pytest.skip("mpiexec is not installed (pip install 'opforge[distributed]')")
    index = [[name, list(shape), attrs] for name in sorted(ORACLE) for shape, attrs in cases(name)]
    (tmp_path / "cases.json").write_text(json.dumps(index))
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "tests/distributed/ranks_collectives.py",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OPFORGE_COLLECTIVE_TIMEOUT": "60"})
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for i, (name, shape, attrs) in enumerate(index):
        case = f"{name} {tuple(shape)} {attrs}"
        assert f"ok {i} {name}: " in done.stdout, case  # its gradient matched central differences across ranks
        attrs = {k: v for k, v in attrs.items() if k != "ties"}
        xs = [torch.tensor(r[f"{i}.x"], requires_grad=True) for r in ranks]
        ys = ORACLE[name](xs, **attrs)
        objective = sum((y * torch.tensor(r[f"{i}.u"])).sum() for y, r in zip(ys, ranks))
        grads = torch.autograd.grad(objective, xs, allow_unused=True)
        for rank, (r, y, g, x) in enumerate(zip(ranks, ys, grads, xs)):
            np.testing.assert_allclose(r[f"{i}.y"], y.detach().numpy(), rtol=1e-12, atol=1e-12,
                                       err_msg=f"{case}, rank {rank}: value")
            want = torch.zeros_like(x) if g is None else g
            np.testing.assert_allclose(r[f"{i}.grad"], want.numpy(), rtol=1e-10, atol=1e-12,
                                       err_msg=f"{case}, rank {rank}: gradient")
    assert {name for name, _, _ in index} == set(ORACLE)


def test_table_covers_the_collectives():
    defined = {op.name for op in of.registry if op.defined_at.replace("\\", "/").split(":")[0]
               .endswith("ops/collective.py")}
    assert defined == set(ORACLE) == set(CASES)
