"""The digits CNN of examples/demo.py, trained data-parallel on 2 ranks (processes) over MPI.

    mpiexec -n 2 .venv/bin/python examples/data_parallel.py      (or: make demo-distributed)

Each rank holds a copy of the model and trains on its half of every batch of 64 (``DistributedSampler``): the first
epoch eagerly, with ``DistributedDataParallel`` averaging the gradients in buckets while backward runs; the rest
compiled under a ``Mesh``, whose program is the one-process step with the gradients' all-reduces inserted (printed
below). Rank 0 writes the checkpoint; every rank reloads it. Exits non-zero below 97% held-out accuracy.
"""

import sys
import time
from pathlib import Path

import numpy as np
from custom_op import isru  # the demo's new op
from sklearn.datasets import load_digits

import opforge as of
from opforge import nn
from opforge import ops as F

OUT = Path(__file__).resolve().parents[1] / "out"
EPOCHS, BATCH, SEED = 12, 64, 0  # BATCH is the global batch, as in examples/demo.py


class Softsign(nn.Module):
    def forward(self, x):
        return isru(x)


def make_model():
    of.manual_seed(SEED)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), Softsign(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), Softsign(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, 10),
    )


def accuracy(model, x, y) -> float:
    model.eval()
    with of.no_grad():
        predicted = F.argmax(model(of.tensor(x)), axis=1).numpy()
    model.train()
    return float((predicted == y).mean())


def main() -> int:
    world = of.distributed.init()
    say = print if world.rank == 0 else (lambda *a, **k: None)
    start = time.perf_counter()
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(labels))
    test, train = order[:360], order[360:]
    sampler = of.distributed.DistributedSampler(len(train), batch_size=BATCH // world.size, seed=SEED)
    model = of.distributed.DistributedDataParallel(make_model())
    opt = of.optim.Adam(model.parameters(), lr=5e-3)
    say(f"{world.size} ranks, {BATCH // world.size} images per rank per step, {len(sampler)} steps per epoch")

    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    mesh = of.distributed.Mesh()
    compiled_step = of.compile(train_step)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        mode = "eager" if epoch == 0 else "compiled"
        began, losses = time.perf_counter(), []
        for index in sampler:
            x, y = of.tensor(images[train[index]]), of.tensor(labels[train[index]])
            if mode == "eager":
                losses.append(train_step(x, y).item())
            else:
                with mesh:
                    losses.append(compiled_step(x, y).item())
        loss = float(world.all_reduce(np.array(np.mean(losses)), "mean"))
        say(f"epoch {epoch + 1:2d} ({mode:8s}): loss {loss:.4f}, held-out accuracy "
            f"{accuracy(model, images[test], labels[test]):.2%}, {len(losses) / (time.perf_counter() - began):5.0f} "
            "steps/s", flush=True)
        if epoch == 1:
            with mesh:
                program = compiled_step.program(x, y)  # the one traced for these arguments (nothing runs)
            kinds = [op.type for op in program.block.ops]
            say(f"   the compiled step: {len(kinds)} ops, {kinds.count('all_reduce')} of them all_reduce "
                f"(the gradients of {len(list(model.parameters()))} parameters, flattened into one buffer)")
    final = accuracy(model, images[test], labels[test])

    OUT.mkdir(exist_ok=True)
    of.distributed.save({"model": model.module.state_dict()}, OUT / "digits_data_parallel.ckpt")
    restored = make_model()
    restored.load_state_dict(of.distributed.load(OUT / "digits_data_parallel.ckpt")["model"])
    reloaded = accuracy(restored, images[test], labels[test])
    same = all(np.array_equal(a, world.broadcast(a, 0)) for a in (p.numpy() for p in model.parameters()))
    say(f"saved by rank 0, reloaded on every rank: held-out accuracy {reloaded:.2%}; ranks hold identical "
        f"parameters: {same}")
    say(f"held-out accuracy {final:.2%} (target 97%), {time.perf_counter() - start:.0f} s in all; this rank sent "
        f"{world.stats.bytes_sent / 1e6:.1f} MB in {world.stats.calls} collectives")
    ok = final >= 0.97 and reloaded == final and same
    if not ok:
        say("FAILED: accuracy below 97%, a reload that changed it, or ranks that drifted apart")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
