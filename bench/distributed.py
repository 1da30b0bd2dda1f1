"""Data-parallel scaling from 1 to 2 ranks: throughput, bytes sent per step, time waiting in all-reduce.

    python bench/distributed.py                 # launches `mpiexec -n 1` and `mpiexec -n 2` of itself
    python bench/distributed.py --quick         # a few steps (what a test could run)

MLP 784-512-512-10 (float32), 512 samples per rank per step, SGD, one thread per rank (OMP/BLAS threads = 1). Each
variant trains from the same start for ``--rounds`` rounds of ``--steps`` steps; a round's time is the slowest
rank's, and the tables give medians over rounds (this shared machine drifts). Variants:

* opforge eager, ``DistributedDataParallel`` with bucketed all-reduces started during backward (overlap);
* opforge eager, the same buckets all-reduced after backward (no overlap);
* opforge compiled under a ``Mesh`` (the program's bucketed all_reduce, after backward);
* PyTorch ``DistributedDataParallel`` over gloo (loopback TCP), 1 MiB buckets, for comparison;
* the ceiling: each rank trains on its own, no communication — how much the machine itself lets 2 ranks scale
  (on a 2-core machine shared with other work, less than 2x).

Scaling is (samples/s on 2 ranks) / (samples/s on 1 rank) — 2.0 is perfect. "Sent" is what each rank hands the
engine to send, by the algorithms' usual counts (ring all-reduce: 2(n−1)/n of the buffer, which is the buffer
itself at n = 2); "wait" is the time a rank spends blocked in collectives per step. Writes
bench/results/distributed.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SIZES = (784, 512, 512, 10)
BATCH = 512


def launch(args) -> int:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    env = {**os.environ, **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
    runs = {}
    for n in (1, 2):
        with socket.socket() as s:  # a free loopback port for torch's rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [str(mpiexec), "-n", str(n), sys.executable, __file__, "--worker", "--port", str(port),
               "--steps", str(args.steps), "--rounds", str(args.rounds)]
        print("$", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            print(done.stdout + done.stderr)
            return 1
        runs[n] = json.loads(done.stdout.strip().splitlines()[-1])
    table = report(runs)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "distributed.json").write_text(json.dumps(runs, indent=1))
    (RESULTS / "distributed.md").write_text(table + "\n")
    return 0


def report(runs: dict) -> str:
    one, two = runs[1], runs[2]
    grad_bytes = two["gradient_bytes"]
    lines = [
        f"MLP {'-'.join(map(str, SIZES))}, float32, {BATCH} samples per rank per step, 1 thread per rank; "
        f"gradients: {grad_bytes:,} bytes; medians of {two['rounds']} rounds of {two['steps']} steps",
        "",
        "| variant | ms/step, 1 rank | ms/step, 2 ranks | samples/s, 1 rank | samples/s, 2 ranks | scaling "
        "| bytes sent per rank per step (2 ranks) | = gradient bytes | wait in collectives, ms/step (2 ranks) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r2 in two["variants"].items():
        r1 = one["variants"].get(name)
        if r1 is None or "error" in r1 or "error" in r2:
            lines.append(f"| {name} | {(r1 or {}).get('error', '')} {r2.get('error', '')} |||||||")
            continue
        rate1, rate2 = BATCH / r1["step_s"], 2 * BATCH / r2["step_s"]
        sent, wait = r2.get("bytes_per_step"), r2.get("wait_s")
        same = "" if sent is None else "yes" if sent == grad_bytes else f"{sent / grad_bytes:.3f}x"
        lines.append(
            f"| {name} | {r1['step_s'] * 1e3:.1f} | {r2['step_s'] * 1e3:.1f} | {rate1:,.0f} | {rate2:,.0f} | "
            f"{rate2 / rate1:.2f}x | {'' if sent is None else f'{sent:,.0f}'} | {same} | "
            f"{'' if wait is None else f'{wait * 1e3:.2f}'} |")
    return "\n".join(lines)


# -- one rank ---------------------------------------------------------------------------------------------------


def worker(args) -> None:
    import numpy as np

    import opforge as of
    from opforge import nn
    from opforge import ops as F

    world = of.distributed.init()
    rng = np.random.default_rng(world.rank)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH)

    def mlp():
        of.manual_seed(0)
        layers = []
        for a, b in itertools.pairwise(SIZES):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers[:-1])

    def measure(step, reset=lambda: None, stats=None):
        for _ in range(3):  # warm up (and trace, for the compiled step)
            step()
        times, sent, waited = [], [], []
        for _ in range(args.rounds):
            world.barrier()
            if stats is not None:
                stats.reset()
            began = time.perf_counter()
            for _ in range(args.steps):
                step()
            elapsed = time.perf_counter() - began
            if stats is not None:  # read before the all-reduces below add to them
                sent.append(stats.bytes_sent / args.steps)
                waited.append(stats.wait_s / args.steps)
            times.append(float(world.all_reduce(np.array(elapsed), "max")) / args.steps)
        out = {"step_s": statistics.median(times)}
        if stats is not None:  # the most any rank sent and waited
            out |= {"bytes_per_step": float(world.all_reduce(np.array(statistics.median(sent)), "max")),
                    "wait_s": float(world.all_reduce(np.array(statistics.median(waited)), "max"))}
        return out

    def eager_step(overlap):
        model = of.distributed.DistributedDataParallel(mlp(), overlap=overlap)
        opt = of.optim.SGD(model.parameters(), lr=0.01)
        xt, yt = of.tensor(x), of.tensor(y)

        def step():
            F.cross_entropy(model(xt), yt).backward()
            opt.step()
            opt.zero_grad()

        return step

    variants = {name: measure(eager_step(overlap), stats=world.stats)
                for name, overlap in (("opforge eager, bucketed overlap", True), ("opforge eager, no overlap", False))}
    alone = mlp()
    opt_alone = of.optim.SGD(alone.parameters(), lr=0.01)
    xt, yt = of.tensor(x), of.tensor(y)

    def alone_step():
        F.cross_entropy(alone(xt), yt).backward()
        opt_alone.step()
        opt_alone.zero_grad()

    variants["opforge eager, no communication (the ceiling)"] = measure(alone_step, stats=world.stats)
    grad_bytes = sum(p.numpy().nbytes for p in mlp().parameters())

    model = mlp()
    opt = of.optim.SGD(model.parameters(), lr=0.01)

    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    compiled = of.compile(train_step)
    mesh = of.distributed.Mesh()
    xt, yt = of.tensor(x), of.tensor(y)

    def compiled_step():
        with mesh:
            compiled(xt, yt)

    variants["opforge compiled under a Mesh"] = measure(compiled_step, stats=world.stats)
    variants["PyTorch DDP (gloo)"] = torch_ddp(args, world, x, y, measure)
    if world.rank == 0:
        print(json.dumps({"ranks": world.size, "steps": args.steps, "rounds": args.rounds,
                          "gradient_bytes": grad_bytes, "variants": variants}))


def torch_ddp(args, world, x, y, measure) -> dict:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        return {"error": f"torch not installed ({e})"}
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=world.rank,
                                world_size=world.size)
    except Exception as e:  # no gloo in this build, say
        return {"error": f"gloo unavailable ({type(e).__name__})"}
    torch.manual_seed(0)
    layers = []
    for a, b in itertools.pairwise(SIZES):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers[:-1]), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
        opt.zero_grad()

    result = measure(step)
    dist.destroy_process_group()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=29500, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per variant (the median is reported)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 steps")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 2, 2
    if args.worker:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
