"""Data-parallel scaling from 1 to 2 ranks: throughput, bytes sent per step, time waiting in all-reduce.

    python bench/distributed.py                 # launches `mpiexec -n 2` of itself
    python bench/distributed.py --quick         # a few steps (what a test could run)

MLP 784-512-512-10 (float32), 512 samples per rank per step, SGD, one thread per rank (OMP/BLAS threads = 1). Each
variant runs ``--rounds`` rounds of ``--steps`` steps on 1 rank (rank 0 alone, rank 1 asleep) and on 2, taking
turns, so that both see the same machine (this shared one drifts by tens of percent within a minute); a 2-rank
round's time is the slower rank's, and the table gives medians over rounds. Variants:

* opforge eager, ``DistributedDataParallel`` as it comes: 25 MiB buckets (PyTorch's default), so one bucket here,
  all-reduced as soon as the last gradient is final;
* opforge eager, 1 MiB buckets (four here), each all-reduce started during backward (overlap);
* opforge eager, the same buckets all-reduced after backward (no overlap);
* opforge eager, 1 MiB buckets with overlap, without the call-order check (``init(verify=False)``), whose
  fingerprint exchange before each bucket's all-reduce is a rendezvous with the other rank in mid-backward;
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
    with socket.socket() as s:  # a free loopback port for torch's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(mpiexec), "-n", "2", sys.executable, __file__, "--worker", "--port", str(port),
           "--steps", str(args.steps), "--rounds", str(args.rounds)]
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        print(done.stdout + done.stderr)
        return 1
    run = json.loads(done.stdout.strip().splitlines()[-1])
    table = report(run)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "distributed.json").write_text(json.dumps(run, indent=1))
    (RESULTS / "distributed.md").write_text(table + "\n")
    return 0


def report(run: dict) -> str:
    grad_bytes = run["gradient_bytes"]
    lines = [
        f"MLP {'-'.join(map(str, SIZES))}, float32, {BATCH} samples per rank per step, 1 thread per rank; "
        f"gradients: {grad_bytes:,} bytes; medians of {run['rounds']} rounds of {run['steps']} steps, 1-rank and "
        "2-rank rounds taking turns",
        "",
        "| variant | ms/step, 1 rank | ms/step, 2 ranks | samples/s, 1 rank | samples/s, 2 ranks | scaling "
        "| bytes sent per rank per step | = gradient bytes | wait in collectives, ms/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in run["variants"].items():
        if "error" in r:
            lines.append(f"| {name} | {r['error']} |||||||")
            continue
        rate1, rate2 = BATCH / r["solo_s"], 2 * BATCH / r["duo_s"]
        sent, wait = r.get("bytes_per_step"), r.get("wait_s")
        same = "" if sent is None else "yes" if sent == grad_bytes else f"{sent / grad_bytes:.3f}x"
        lines.append(
            f"| {name} | {r['solo_s'] * 1e3:.1f} | {r['duo_s'] * 1e3:.1f} | {rate1:,.0f} | {rate2:,.0f} | "
            f"{rate2 / rate1:.2f}x | {'' if sent is None else f'{sent:,.0f}'} | {same} | "
            f"{'' if wait is None else f'{wait * 1e3:.2f}'} |")
    return "\n".join(lines)


# -- the ranks -----------------------------------------------------------------------------------------------------


def worker(args) -> None:
    """Both ranks run this. Each variant alternates rounds: rank 0 alone (rank 1 sleeping in a barrier: one
    process training), then both ranks. Taking turns, the two see the same machine, whatever else runs on it."""
    import numpy as np

    import opforge as of
    from opforge import nn
    from opforge import ops as F

    world = of.distributed.init()
    alone = of.distributed.SELF
    rng = np.random.default_rng(world.rank)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH)

    def mlp():
        of.manual_seed(0)
        layers = []
        for a, b in itertools.pairwise(SIZES):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers[:-1])

    def timed(step) -> float:
        began = time.perf_counter()
        for _ in range(args.steps):
            step()
        return (time.perf_counter() - began) / args.steps

    def measure(make_step, counted=True) -> dict:
        """``make_step(comm)``: a training step over ``comm`` (``alone`` for rank 0's solo rounds, or the world)."""
        solo = make_step(alone) if world.rank == 0 else None
        duo = make_step(world)
        for _ in range(3):  # warm up (and trace, for the compiled steps)
            if solo is not None:
                solo()
            duo()
        solo_s, duo_s, sent, waited = [], [], [], []
        for _ in range(args.rounds):
            world.barrier()
            if solo is not None:
                solo_s.append(timed(solo))
            world.barrier()  # rank 1 waits here while rank 0 trains alone (the wait sleeps after 0.1 s)
            world.stats.reset()
            elapsed = timed(duo)
            sent.append(world.stats.bytes_sent / args.steps)  # read before the all-reduces below add to them
            waited.append(world.stats.wait_s / args.steps)
            duo_s.append(float(world.all_reduce(np.array(elapsed), "max")))
        out = {"solo_s": float(world.broadcast(np.array(statistics.median(solo_s or [0.0])), 0)),
               "duo_s": statistics.median(duo_s)}
        if counted:  # the most any rank sent and waited
            out |= {"bytes_per_step": float(world.all_reduce(np.array(statistics.median(sent)), "max")),
                    "wait_s": float(world.all_reduce(np.array(statistics.median(waited)), "max"))}
        return out

    def eager(overlap, bucket_bytes=1 << 20):
        def make(comm):
            model = of.distributed.DistributedDataParallel(mlp(), comm=comm, overlap=overlap,
                                                           bucket_bytes=bucket_bytes)
            opt = of.optim.SGD(model.parameters(), lr=0.01)
            xt, yt = of.tensor(x), of.tensor(y)

            def step():
                F.cross_entropy(model(xt), yt).backward()
                opt.step()
                opt.zero_grad()

            return step

        return make

    def no_communication(comm):
        model = mlp()
        opt = of.optim.SGD(model.parameters(), lr=0.01)
        xt, yt = of.tensor(x), of.tensor(y)

        def step():
            F.cross_entropy(model(xt), yt).backward()
            opt.step()
            opt.zero_grad()

        return step

    def compiled(comm):
        model = mlp()
        opt = of.optim.SGD(model.parameters(), lr=0.01)

        def train_step(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        fn, mesh = of.compile(train_step), of.distributed.Mesh(comm)
        xt, yt = of.tensor(x), of.tensor(y)

        def step():
            with mesh:
                fn(xt, yt)

        return step

    variants = {
        "opforge eager DDP, default buckets (one here)": measure(eager(True, 25 << 20)),
        "opforge eager, 1 MiB buckets, overlap": measure(eager(True)),
        "opforge eager, 1 MiB buckets, no overlap": measure(eager(False)),
    }
    world.verify = False  # no fingerprint exchange before each collective: no rendezvous in mid-backward
    variants["opforge eager, 1 MiB buckets, overlap, unchecked order"] = measure(eager(True))
    world.verify = True
    variants |= {
        "opforge compiled under a Mesh": measure(compiled),
        "opforge eager, no communication (the ceiling)": measure(no_communication),
        "PyTorch DDP (gloo)": torch_ddp(args, world, x, y, measure),
    }
    if world.rank == 0:
        print(json.dumps({"ranks": world.size, "steps": args.steps, "rounds": args.rounds,
                          "gradient_bytes": sum(p.numpy().nbytes for p in mlp().parameters()),
                          "variants": variants}))


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
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def make(comm):
        torch.manual_seed(0)
        layers = []
        for a, b in itertools.pairwise(SIZES):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1])
        if comm is world:  # alone, one process trains the plain model
            model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            torch.nn.functional.cross_entropy(model(xt), yt).backward()
            opt.step()
            opt.zero_grad()

        return step

    result = measure(make, counted=False)
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
