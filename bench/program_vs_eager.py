"""Program mode against eager mode (and PyTorch eager), in the same run.

    python bench/program_vs_eager.py            # 7 rounds, medians reported
    python bench/program_vs_eager.py --quick    # a smoke test

1. A 20-layer MLP (width 256, batch 64, tanh, mean-square loss), forward + backward: time per step, and the peak
   bytes of live intermediates — counted by the executor's plan, and cross-checked with tracemalloc for both modes.
2. A chain of 100 tiny elementwise ops (16 float32 elements): compiled per-op time against PyTorch eager per op.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

import opforge as of
from opforge import ops as F

try:
    import torch
except ImportError:
    torch = None


def mlp(layers=20, width=256, batch=64, seed=0):
    rng = np.random.default_rng(seed)
    params = []
    for _ in range(layers):
        params.append(of.tensor((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
                                requires_grad=True))
        params.append(of.tensor(np.zeros(width, np.float32), requires_grad=True))
    x = of.tensor(rng.standard_normal((batch, width)).astype(np.float32))

    def step(x):
        h = x
        for w, b in zip(params[0::2], params[1::2]):
            h = F.tanh(h @ w + b)
        loss = F.mean(F.square(h))
        return (loss, *of.grad(loss, params))

    return step, x, params


def chain(n=100, size=16):
    x = of.tensor(np.linspace(-1, 1, size, dtype=np.float32))

    def f(x):
        h = x
        for _ in range(n // 2):
            h = F.tanh(h) * 1.01
        return h

    return f, x


def timed(fn, *args, repeat=5) -> float:
    fn(*args)
    best = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        best.append(time.perf_counter() - start)
    return min(best)


def traced_peak(fn, *args) -> int:
    fn(*args)  # warm: caches, plans
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    result = fn(*args)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del result
    return peak


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    layers = 3 if args.quick else 20

    step, x, params = mlp(layers=layers)
    compiled = of.compile(step)
    chain_f, cx = chain()
    chain_c = of.compile(chain_f)
    samples = {k: [] for k in ["eager step", "compiled step", "torch step", "chain compiled", "chain torch",
                                "chain eager"]}
    if torch is not None:
        torch.set_num_threads(1)
        tparams = [torch.tensor(p.numpy(), requires_grad=True) for p in params]
        tx = torch.tensor(x.numpy())

        def torch_step(xx):
            h = xx
            for w, b in zip(tparams[0::2], tparams[1::2]):
                h = torch.tanh(h @ w + b)
            loss = torch.mean(torch.square(h))
            return (loss, *torch.autograd.grad(loss, tparams))

        tcx = torch.tensor(cx.numpy())

        def torch_chain(xx):
            h = xx
            for _ in range(50):
                h = torch.tanh(h) * 1.01
            return h
    for _ in range(rounds):
        samples["eager step"].append(timed(step, x, repeat=1 if args.quick else 3))
        samples["compiled step"].append(timed(compiled, x, repeat=1 if args.quick else 3))
        samples["chain compiled"].append(timed(chain_c, cx, repeat=20) / 100)
        samples["chain eager"].append(timed(chain_f, cx, repeat=20) / 100)
        if torch is not None:
            samples["torch step"].append(timed(torch_step, tx, repeat=1 if args.quick else 3))
            samples["chain torch"].append(timed(torch_chain, tcx, repeat=20) / 100)
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    rng = {k: (min(v), max(v)) for k, v in samples.items() if v}

    plan = compiled.cache[next(iter(compiled.cache))][0].exe.plan(x=x.numpy())
    eager_peak = traced_peak(step, x)
    compiled_peak = traced_peak(compiled, x)
    print(f"median of {rounds} rounds (min–max)\n")
    print(f"## {layers}-layer MLP, width 256, batch 64, float32: forward + backward\n")
    print("| mode | ms per step | vs eager |")
    print("|---|---|---|")
    for k in ["eager step", "compiled step", "torch step"]:
        if k in med:
            print(f"| {k.split()[0]} | {med[k] * 1e3:.2f} ({rng[k][0] * 1e3:.2f}–{rng[k][1] * 1e3:.2f}) "
                  f"| {med[k] / med['eager step']:.2f}× |")
    print("\n| peak bytes of live intermediates | MB |")
    print("|---|---|")
    print(f"| compiled, counted by the executor's plan | {plan.peak_live_bytes / 1e6:.2f} |")
    print(f"| compiled, tracemalloc | {compiled_peak / 1e6:.2f} |")
    print(f"| eager, tracemalloc | {eager_peak / 1e6:.2f} |")
    print(f"\n(plan: {plan.steps} ops after DCE/CSE/folding; removed {plan.removed})\n")
    print("## chain of 100 tiny elementwise ops (tanh, * 1.01; 16 float32)\n")
    print("| mode | µs per op |")
    print("|---|---|")
    for k in ["chain compiled", "chain eager", "chain torch"]:
        if k in med:
            print(f"| {k.split()[1]} | {med[k] * 1e6:.2f} ({rng[k][0] * 1e6:.2f}–{rng[k][1] * 1e6:.2f}) |")
    if "chain torch" in med:
        print(f"\ncompiled / torch eager per op: {med['chain compiled'] / med['chain torch']:.2f}×")


if __name__ == "__main__":
    main()
