"""Run by tests/test_distributed.py as `mpiexec -n 2 python tests/distributed/ranks_training.py DIR` (and `-n 4`):
data- and tensor-parallel training on MPI ranks against one process on the whole batch, then every check of
checks.py (which the tests also run on ranks that are threads). Prints `ok <check>` per check."""

import os
import sys

import checks
import numpy as np

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.distributed import P, S

world = of.distributed.init()
RANK, SIZE = world.rank, world.size
TMP = sys.argv[1]
STEPS = 3
rng = np.random.default_rng(0)
X = rng.standard_normal((8, 5))
Y = rng.integers(0, 3, 8)
ROWS = slice(RANK * len(X) // SIZE, (RANK + 1) * len(X) // SIZE)  # this rank's half of every batch


def ok(check):
    world.barrier()  # every rank got here
    if RANK == 0:
        print(f"ok {check}", flush=True)


def float64_model():
    of.manual_seed(RANK)  # different on each rank: DistributedDataParallel must start them all as rank 0
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).double()


def optimizer(kind, params):
    return of.optim.SGD(params, lr=0.1, momentum=0.9) if kind == "sgd" else of.optim.Adam(params, lr=0.01)


def train(model, opt, x, y, compiled=False):
    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    fn = of.compile(step) if compiled else step
    for _ in range(STEPS):
        fn(of.tensor(x), of.tensor(y))
    return fn


def params(model):
    return [p.numpy().copy() for p in model.parameters()]


def assert_close(got, want, what, rtol=1e-10):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-14, err_msg=what)


for kind in ("sgd", "adam"):
    # one process, the whole batch (every rank computes it, from rank 0's start)
    reference = float64_model()
    start = [world.broadcast(p.numpy(), 0) for p in reference.parameters()]
    for p, s in zip(reference.parameters(), start):
        p.numpy()[...] = s
    train(reference, optimizer(kind, reference.parameters()), X, Y)
    want = params(reference)

    # eager: DistributedDataParallel, small buckets so that several all-reduces overlap the backward pass
    model = of.distributed.DistributedDataParallel(float64_model(), bucket_bytes=300)
    assert len(model.buckets) > 1
    train(model, optimizer(kind, model.parameters()), X[ROWS], Y[ROWS])
    eager = params(model)
    assert_close(eager, want, f"eager {kind}")
    ok(f"eager data parallel {kind} equals one process on the whole batch")

    # compiled under a mesh: the same program, all-reduces inserted. With native code on, cross_entropy_grad is a
    # row loop that sums each row in another order than the kernel (opforge.program.native): close to one process,
    # as eager is; with it off (OPFORGE_NATIVE=0), eager DistributedDataParallel's bits.
    inherited = os.environ.get("OPFORGE_NATIVE")
    for native in ("1", "0"):
        os.environ["OPFORGE_NATIVE"] = native
        model = of.distributed.DistributedDataParallel(float64_model())
        with of.distributed.Mesh():
            step = train(model, optimizer(kind, model.parameters()), X[ROWS], Y[ROWS], compiled=True)
        ((entry,),) = step.cache.values()  # the program traced under the mesh (the cache key does not hold the mesh)
        program = entry.program
        text = str(program)
        # every gradient in one bucket; the others are scalars: the loss's sum and count over every rank's rows
        reductions = [line for line in text.splitlines() if "= all_reduce(" in line]
        assert [line for line in reductions if "float64[] = " not in line] == [
            line for line in reductions if "all_reduce(x=concat" in line] and len(reductions) == 4, text
        compiled = params(model)
        assert_close(compiled, want, f"compiled {kind}, OPFORGE_NATIVE={native}")
    if inherited is None:
        del os.environ["OPFORGE_NATIVE"]
    else:
        os.environ["OPFORGE_NATIVE"] = inherited
    for c, e in zip(compiled, eager):
        assert np.array_equal(c, e), f"compiled {kind} differs from eager by {np.abs(c - e).max()}"
    ok(f"compiled data parallel {kind} equals one process, and eager data parallel bit for bit (OPFORGE_NATIVE=0)")

# tensor parallel: column-parallel Linear (weight S(0), bias S(0)), then row-parallel (weight S(1))
w1, b1, w2, b2 = (of.tensor(rng.standard_normal(shape), dtype="float64", requires_grad=True)
                  for shape in [(8, 5), (8,), (3, 8), (3,)])
T = rng.standard_normal((8, 3))


def mlp(x, t):
    out = F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)
    return {"loss": F.mse_loss(out, t), "out": out}


program = of.trace(mlp, x=of.Spec((8, 5), "float64"), t=of.Spec((8, 3), "float64"))
of.append_backward(program, program.outputs["loss"])
want = of.Executor(program).run(x=X, t=T)
sharded = of.distributed.shard(program, of.distributed.Mesh(), params={w1: S(0), b1: S(0), w2: S(1)})
assert S(1) in sharded.layouts.values() and P in sharded.layouts.values() and "all_reduce(" in str(sharded)
got = of.Executor(sharded).run(x=X, t=T)
for key, value in want.items():
    mine = got[key]
    layout = sharded.layouts.get(key[:-5]) if key.endswith("@GRAD") else None
    if layout is not None and layout.split:
        mine = world.all_gather(mine, layout.axis)
    np.testing.assert_allclose(mine, value, rtol=1e-10, atol=1e-12, err_msg=key)
ok("tensor-parallel MLP equals one process, forward and gradients")

# the sampler: the ranks' batches together are one process's batches of twice the size
sampler = of.distributed.DistributedSampler(50, batch_size=4, seed=7)
for epoch in (0, 1):
    sampler.set_epoch(epoch)
    mine = np.array(list(sampler))  # (steps, 4)
    everyone = world.all_gather(mine, 1)  # (steps, 8): rank 0's block, then rank 1's
    order = np.random.default_rng([7, epoch]).permutation(50)
    assert np.array_equal(everyone.reshape(-1), order[:everyone.size]) and len(mine) == 50 // (4 * SIZE)
ok("sampler gives each rank its part of every batch, reproducibly")

# checkpoints: written once by rank 0, read by every rank
model = of.distributed.DistributedDataParallel(float64_model())
path = f"{TMP}/ckpt.npz"
of.distributed.save({"model": model.state_dict(), "step": 3}, path)
loaded = of.distributed.load(path)
assert loaded["step"] == 3
state = model.state_dict()
assert all(np.array_equal(state[k].numpy(), loaded["model"][k].numpy()) for k in state)
ok("checkpoint written once by rank 0 and loaded by every rank")

for name in checks.CHECKS:
    getattr(checks, name)(world, TMP)
    ok(name)
