"""``opforge.distributed``: training over several processes (ranks) with MPI — data and tensor parallel.

Needs ``mpi4py`` and an MPI library; ``pip install 'opforge[distributed]'`` installs both (mpi4py and MPICH's
wheels, which bring ``mpiexec``). Single-process use needs neither: until ``init()`` runs, collectives see one rank.

    import opforge as of
    world = of.distributed.init()                          # reads the MPI world: world.rank, world.size
    model = of.distributed.DistributedDataParallel(net)   # gradients all-reduced in buckets during backward
    sampler = of.distributed.DistributedSampler(n, seed=0) # this rank's shard of every epoch

    # or: one program, with the collectives inserted by the SBP pass
    mesh = of.distributed.Mesh()                           # every rank of the world, one axis
    sharded = of.distributed.shard(program, mesh, feeds={"x": S(0)}, params={w: S(1)})

Run with ``mpiexec -n 2 python script.py``. See docs/distributed.md.
"""

from __future__ import annotations

from ..core import sbp  # noqa: F401  (of.distributed.sbp: the layouts and signature rules)
from ..core.sbp import B, P, S
from .checkpoint import ShardedCheckpointError, load_sharded, save_sharded
from .comm import (
    INSTALL,
    SELF,
    CollectiveMismatchError,
    Communicator,
    MPICommunicator,
    SelfCommunicator,
    Stats,
    ThreadCommunicator,
    current_communicator,
    run_threads,
    using_communicator,
)
from .data_parallel import DistributedDataParallel, DistributedSampler, load, save
from .launch import get_rank, get_world_size, init, is_initialized
from .sharding import Mesh, ShardingTracer, shard, whole_values

__all__ = [
    "INSTALL", "SELF", "B", "CollectiveMismatchError", "Communicator", "DistributedDataParallel",
    "DistributedSampler", "MPICommunicator", "Mesh", "P", "S", "SelfCommunicator", "ShardedCheckpointError",
    "ShardingTracer", "Stats", "ThreadCommunicator", "current_communicator", "get_rank", "get_world_size", "init",
    "is_initialized", "load", "load_sharded", "run_threads", "save", "save_sharded", "shard", "using_communicator",
    "whole_values",
]
