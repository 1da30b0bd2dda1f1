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

Then the same MLP with Adam (whose two moments per parameter are what ZeRO shards), as programs ``shard()`` makes
from one traced training step, each against its own 1-rank program: data parallel (``zero=0``), ZeRO-1, -2 and -3
(``zero=1|2|3``: optimizer state; and gradients; and parameters, sharded), and 2-way tensor parallel (the first
layer column-parallel, the second row-parallel, the batch whole on both ranks); with the no-communication ceiling
and PyTorch DDP (gloo), both with Adam. For the programs, the memory each rank holds: persistent bytes (parameters
and optimizer state, measured from the program's values) and the executor's planned peak of live intermediates
(activations and gradients).

Scaling is (samples/s on 2 ranks) / (samples/s on 1 rank) — 2.0 is perfect (every variant processes BATCH samples
per rank per step: tensor parallelism, whose ranks share one batch, gets a batch twice as large on 2 ranks).
"Sent" is what each rank hands the engine to send, by the algorithms' usual counts (ring all-reduce: 2(n−1)/n of
the buffer, which is the buffer itself at n = 2); "wait" is the time a rank spends blocked in collectives per
step. Writes
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
           "--steps", str(args.steps), "--rounds", str(args.rounds), *(["--sgd-only"] if args.sgd_only else [])]
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
    adam = []
    for name, r in run["variants"].items():
        if "memory" in r:
            adam.append((name, r["memory"]))
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
    if adam:
        lines += ["", "Memory per rank of the Adam programs (MB): parameters and optimizer state it keeps, and the "
                  "planned peak of live intermediates in a step",
                  "", "| variant | kept, 1 rank | kept, 2 ranks | peak live, 1 rank | peak live, 2 ranks |",
                  "|---|---|---|---|---|"]
        lines += [f"| {name} | {m['kept'][0] / 1e6:.2f} | {m['kept'][1] / 1e6:.2f} | {m['peak'][0] / 1e6:.2f} | "
                  f"{m['peak'][1] / 1e6:.2f} |" for name, m in adam]
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

    def sharded(zero=0, tensor=False, memory=None):
        """A shard()ed Adam training step over ``comm``: data parallel (each rank BATCH rows of a global batch of
        BATCH·ranks) at ZeRO stage ``zero``, or tensor parallel (the global batch whole on every rank)."""
        def make(comm):
            model = mlp()
            params = list(model.parameters())
            opt = of.optim.Adam(params, lr=1e-3)

            def train_step(x, y):
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                return loss

            rows = BATCH * comm.size
            program = of.trace(train_step, x=of.Spec((rows, SIZES[0]), "float32"), y=of.Spec((rows,), "int64"))
            split = "B" if tensor else of.distributed.S(0)
            layouts = {params[0]: of.distributed.S(0), params[1]: of.distributed.S(0),
                       params[2]: of.distributed.S(1)} if tensor else {}
            program = of.distributed.shard(program, of.distributed.Mesh(comm), feeds={"x": split, "y": split},
                                           params=layouts, zero=zero)
            feed = {"x": np.concatenate([x] * comm.size) if tensor else x,
                    "y": np.concatenate([y] * comm.size) if tensor else y}
            exe = of.Executor(program)
            if memory is not None:  # what this rank keeps between steps, and the plan's peak of the rest
                kept = sum(np.asarray(v).nbytes for k, v in program.values.items()
                           if program.block.vars[k].persistable)
                with of.distributed.using_communicator(comm):  # (collectives' shape rules ask for the group)
                    memory[comm.size > 1] = (kept, exe.plan(**feed).peak_live_bytes)

            def step():
                with of.distributed.using_communicator(comm):
                    exe.run(**feed)

            return step

        return make

    def with_memory(make) -> dict:
        memory = {}
        out = measure(make(memory))
        kept = [memory.get(False, (0, 0)), memory[True]]
        kept[0] = tuple(int(v) for v in world.broadcast(np.array(kept[0], np.int64), 0))  # rank 0's 1-rank program
        most = world.all_reduce(np.array(kept[1], np.int64), "max")  # the most any rank keeps
        return out | {"memory": {"kept": [kept[0][0], int(most[0])], "peak": [kept[0][1], int(most[1])]}}

    def no_communication_adam(comm):
        model = mlp()
        opt = of.optim.Adam(model.parameters(), lr=1e-3)
        xt, yt = of.tensor(x), of.tensor(y)

        def step():
            F.cross_entropy(model(xt), yt).backward()
            opt.step()
            opt.zero_grad()

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
    if not args.sgd_only:
        variants |= {
            "Adam: opforge shard(), data parallel": with_memory(lambda m: sharded(0, memory=m)),
            "Adam: opforge shard(zero=1)": with_memory(lambda m: sharded(1, memory=m)),
            "Adam: opforge shard(zero=2)": with_memory(lambda m: sharded(2, memory=m)),
            "Adam: opforge shard(zero=3), FSDP": with_memory(lambda m: sharded(3, memory=m)),
            "Adam: opforge shard(), 2-way tensor parallel": with_memory(lambda m: sharded(tensor=True, memory=m)),
            "Adam: opforge eager, no communication (the ceiling)": measure(no_communication_adam),
            "Adam: PyTorch DDP (gloo)": torch_ddp(args, world, x, y, measure, adam=True, port=args.port + 1),
        }
    if world.rank == 0:
        print(json.dumps({"ranks": world.size, "steps": args.steps, "rounds": args.rounds,
                          "gradient_bytes": sum(p.numpy().nbytes for p in mlp().parameters()),
                          "variants": variants}))


def torch_ddp(args, world, x, y, measure, adam=False, port=None) -> dict:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        return {"error": f"torch not installed ({e})"}
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port or args.port}", rank=world.rank,
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
        opt = torch.optim.Adam(model.parameters(), lr=1e-3) if adam else torch.optim.SGD(model.parameters(), lr=0.01)

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
    parser.add_argument("--sgd-only", action="store_true", help="leave out the Adam variants (ZeRO, tensor parallel)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 2, 2
    if args.worker:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
