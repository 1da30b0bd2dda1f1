"""Issue 32 (c): a compiled Adam step with each parameter's update as one native loop (``native.AdamStep``) against
the same compiled step with the three Adam ops (``native.adam_steps`` off, everything else native), in one process
pinned to one core with one thread, the two alternating call by call; CPU-time medians (``time.process_time``).

    python bench/native_adam.py [--repeats 200]

Cases: bench/cases/mlp.py's MLP 784-512-512-10 (ReLU, cross-entropy) at batch 64 with ``of.optim.Adam`` instead of
its SGD step, and bench/cases/transformer.py's encoder (2 layers, d_model 64, causal, 16 × 32 tokens) with
``of.optim.AdamW`` (bench/run.py has no Adam variant of either)."""

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

sys.path.insert(0, str(Path(__file__).parent))
from cases import common, mlp, transformer  # noqa: E402

import opforge as of  # noqa: E402
from opforge import ops as F  # noqa: E402
from opforge.program import native  # noqa: E402


def mlp_step():
    arrays, x, y = mlp.init(64)
    params = [of.tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = of.optim.Adam(params, lr=1e-3)
    x, y = of.tensor(x), of.tensor(y)

    def step(x, y):
        opt.zero_grad()
        loss = mlp.opforge_loss(params, x, y)
        loss.backward()
        opt.step()
        return loss

    fn = of.compile(step)
    return lambda: fn(x, y)


def transformer_step():
    model = transformer.opforge_encoder()
    opt = of.optim.AdamW(model.parameters(), lr=1e-3)
    x = of.tensor(transformer.inputs()[0])

    def step(x):
        opt.zero_grad()
        loss = F.mean(F.square(model(x, is_causal=True)))
        loss.backward()
        opt.step()
        return loss

    fn = of.compile(step)
    return lambda: fn(x)


def torch_mlp_step():
    """The same MLP step in PyTorch eager (torch.optim.Adam, its default foreach update), for reference."""
    torch = common.load_torch()
    arrays, x, y = mlp.init(64)
    params = [torch.tensor(a, requires_grad=True) for a in arrays]
    opt = torch.optim.Adam(params, lr=1e-3)
    x, y = torch.tensor(x), torch.tensor(y)

    def step():
        opt.zero_grad()
        loss = mlp.torch_loss(params, x, y)
        loss.backward()
        opt.step()
        return loss

    return step


def build(make, fused: bool):
    real = native.adam_steps
    if not fused:
        native.adam_steps = lambda ops, kernels, specs, updates: (ops, kernels)
    try:
        step = make()
        step()  # trace, plan and compile now
    finally:
        native.adam_steps = real
    return step


def measure(make, repeats: int, reference=None) -> dict:
    steps = {"native Adam loop": build(make, True), "Adam ops": build(make, False)}
    if reference is not None:
        steps["torch eager"] = reference()
    times = {k: [] for k in steps}
    for _ in range(5):
        for step in steps.values():
            step()
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.process_time()
            step()
            times[name].append(time.process_time() - start)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    print(f"pinned to core {sorted(os.sched_getaffinity(0))}, native backend {'on' if native.enabled() else 'OFF'}")
    for label, make, reference in [
            ("MLP 784-512-512-10, batch 64, Adam", mlp_step, torch_mlp_step),
            ("Transformer encoder (2 × d_model 64, causal, 16 × 32), AdamW", transformer_step, None)]:
        r = measure(make, args.repeats, reference)
        fused, ops = r["native Adam loop"], r["Adam ops"]
        torch = f", torch eager {r['torch eager']:.3f} ms" if reference else ""
        print(f"{label}: Adam ops {ops:.3f} ms, native Adam loop {fused:.3f} ms ({ops / fused:.2f}×){torch}, "
              f"CPU medians of {args.repeats}")


if __name__ == "__main__":
    main()
