"""Run by tests/test_distributed.py as `mpiexec -n 2 python tests/distributed/ranks_failures.py MODE`: what happens
when the ranks do not agree. MODE is one of:
  raise     rank 1 raises while rank 0 waits in a collective: the job must end, the error printed;
  mismatch  the ranks' programs call different collectives: every rank must raise CollectiveMismatchError;
  shape     the same collective on different shapes (another batch size): likewise;
  early     rank 1 ends without the last collective: rank 0 must give up once rank 1 has been silent (no
            heartbeat) for OPFORGE_COLLECTIVE_TIMEOUT seconds;
  slow      rank 0 takes 4 s to write a checkpoint, then rank 1 computes for 3 s, each while the other waits in a
            collective, with OPFORGE_COLLECTIVE_TIMEOUT=2: both are alive, so both get past every collective.
"""

import sys
import time

import numpy as np

import opforge as of
from opforge import ops as F

world = of.distributed.init()
mode = sys.argv[1]
x = of.tensor(np.ones((4, 2)))
F.all_reduce(x)  # a first collective every rank agrees on

if mode == "raise":
    if world.rank == 1:
        raise ValueError("rank 1 fails on purpose")
    F.all_reduce(x)  # rank 0 would wait here for ever
elif mode == "mismatch":
    if world.rank == 0:
        F.all_reduce(x)
    else:
        F.all_gather(x, axis=0)
elif mode == "shape":
    F.all_reduce(x[: 2 + world.rank])
elif mode == "early" and world.rank == 0:
    F.all_reduce(x)
elif mode == "slow":
    import opforge.checkpoint

    write = opforge.checkpoint.write_npz

    def slow_write(f, arrays):  # a checkpoint on a slow file system
        write(f, arrays)
        time.sleep(4)

    opforge.checkpoint.write_npz = slow_write
    began = time.perf_counter()
    of.distributed.save({"x": x}, sys.argv[2])  # rank 1 waits for rank 0's write in a broadcast
    assert time.perf_counter() - began > 3.5
    if world.rank == 1:  # now rank 0 waits, while rank 1 computes in Python (holding the interpreter's lock)
        end = time.perf_counter() + 3
        while time.perf_counter() < end:
            sum(range(1000))
    F.all_reduce(x)
print(f"rank {world.rank} got past every collective", flush=True)
