"""Run by tests/test_distributed.py as `mpiexec -n 2 python tests/distributed/ranks_failures.py MODE`: what happens
when the ranks do not agree. MODE is one of:
  raise     rank 1 raises while rank 0 waits in a collective: the job must end, the error printed;
  mismatch  the ranks' programs call different collectives: every rank must raise CollectiveMismatchError;
  shape     the same collective on different shapes (another batch size): likewise;
  early     rank 1 ends without the last collective: rank 0 must give up after OPFORGE_COLLECTIVE_TIMEOUT.
"""

import sys

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
print(f"rank {world.rank} got past every collective", flush=True)
