"""The communication engines behind ``opforge.core.comm``'s interface: MPI through mpi4py (host arrays), and
``ThreadCommunicator``, ranks as threads of one process (for tests, and for trying a sharded program without MPI).

The interface, the one-rank ``SelfCommunicator`` and the current communicator that collective kernels ask for live
in core (``opforge.core.comm``), so the op library needs nothing of this package; this module re-exports them.
"""

from __future__ import annotations

import functools
import os
import threading
import time

import numpy as np

from ..core.comm import (
    REDUCE_OPS,
    SELF,
    CollectiveMismatchError,
    Communicator,
    Request,
    SelfCommunicator,
    Stats,
    _world,
    current_communicator,
    set_world,
    using_communicator,
)
from ..core.errors import ArgumentError, OpforgeError

INSTALL = "pip install 'opforge[distributed]'  (or: pip install mpi4py mpich)"


class MPICommunicator(Communicator):
    """MPI through mpi4py, on host (NumPy) arrays; ``comm`` is an ``mpi4py.MPI.Comm`` (the world by default)."""

    name = "mpi"

    def __init__(self, comm=None, verify: bool = True, timeout: float | None = None):
        super().__init__(verify, timeout)
        MPI = mpi()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._ops = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX}

    def _host(self, x):
        if type(x) is not np.ndarray:
            raise ArgumentError(f"the MPI communicator works on host (NumPy) arrays, got {type(x).__name__}; "
                                "a device array needs its device's communicator (NCCL for CuPy)")
        return x

    def _wait(self, request) -> None:
        """Wait for a non-blocking call, giving the CPU back while it is not done (the ranks may share cores),
        and give up after ``timeout`` seconds: a rank that never arrives must not hang the others for ever."""
        began = time.perf_counter()
        while not request.Test():  # MPI moves a collective on inside calls like this one: poll closely at first
            waited = time.perf_counter() - began
            if waited > self.timeout:
                raise CollectiveMismatchError(
                    f"rank {self.rank} waited {waited:.0f} s for the other ranks at collective #{self.sequence}: "
                    "one of them never called it (it stopped, or its program took another path); "
                    "OPFORGE_COLLECTIVE_TIMEOUT sets the limit")
            if waited < 0.1:
                os.sched_yield()  # let a rank sharing this core run, and come straight back
            else:
                time.sleep(1e-3)  # a long wait (another rank is far behind, or gone): stop spinning

    def _exchange(self, mine, described):
        everyone = np.empty((self.size, mine.size), dtype=mine.dtype)
        self._wait(self.comm.Iallgather(mine, everyone))
        return everyone

    def _descriptions(self, described):
        return self.comm.allgather(described)

    def _finish(self, out, op):
        if op == "mean":
            out /= self.size
        return out

    def _run(self, request) -> None:
        """Wait for a started collective (non-blocking calls waited on by ``_wait``: blocking ones spin)."""
        began = time.perf_counter()
        self._wait(request)
        self.stats.wait_s += time.perf_counter() - began

    def _all_reduce(self, x, op):
        out = np.empty_like(self._host(x))
        self._run(self.comm.Iallreduce(x, out, op=self._ops[op]))
        return self._finish(out, op)

    def _all_gather(self, x):
        out = np.empty((self.size, *x.shape), dtype=self._host(x).dtype)
        self._run(self.comm.Iallgather(x, out))
        return out

    def _reduce_scatter(self, blocks, op):
        out = np.empty(blocks.shape[1:], dtype=self._host(blocks).dtype)
        self._run(self.comm.Ireduce_scatter_block(blocks, out, op=self._ops[op]))
        return self._finish(out, op)

    def _broadcast(self, x, root):
        self._run(self.comm.Ibcast(self._host(x), root=root))
        return x

    def _reduce(self, x, root, op):
        out = np.zeros_like(self._host(x))
        self._run(self.comm.Ireduce(x, out if self.rank == root else None, op=self._ops[op], root=root))
        return self._finish(out, op) if self.rank == root else out

    def _all_to_all(self, blocks):
        out = np.empty_like(self._host(blocks))
        self._run(self.comm.Ialltoall(blocks, out))
        return out

    def _start_all_reduce(self, buffer, op) -> Request:
        handle = self.comm.Iallreduce(self.MPI.IN_PLACE, self._host(buffer), op=self._ops[op])
        return Request(self, buffer, (lambda b: self._finish(b, op)), handle)


class ThreadCommunicator(Communicator):
    """Rank ``rank`` of a group of threads in one process (``ThreadCommunicator.group(size)`` makes the group):
    the collectives exchange arrays through shared memory, every rank reducing in rank order, so all ranks get
    the same bits. What MPI ranks would compute, without MPI: ``run_threads(fn, size)`` runs ``fn`` once per rank.
    """

    name = "threads"

    def __init__(self, hub: _Hub, rank: int, verify: bool = True, timeout: float | None = None):
        super().__init__(verify, timeout)
        self.hub, self.rank, self.size = hub, rank, hub.size

    @classmethod
    def group(cls, size: int, verify: bool = True, timeout: float | None = None) -> list:
        """One communicator per rank of a new group of ``size`` threads."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ArgumentError(f"ThreadCommunicator.group(): size must be an int >= 1, got {size!r}")
        hub = _Hub(size)
        return [cls(hub, r, verify, timeout) for r in range(size)]

    def _everyone(self, value) -> list:
        """Every rank's ``value``, in rank order (a rendezvous of the group's threads)."""
        hub = self.hub
        hub.slots[self.rank] = value
        began = time.perf_counter()
        try:
            hub.barrier.wait(self.timeout)  # every rank's value is in
            everyone = list(hub.slots)
            hub.barrier.wait(self.timeout)  # every rank has read them: the slots may be reused
        except threading.BrokenBarrierError:
            raise CollectiveMismatchError(
                f"rank {self.rank} waited for the other threads of its group at collective #{self.sequence}: one "
                "of them failed, or never called it") from None
        finally:
            self.stats.wait_s += time.perf_counter() - began
        return everyone

    def abort(self) -> None:
        """Release every rank waiting in a collective (with an error): a rank failed."""
        self.hub.barrier.abort()

    def _exchange(self, mine, described):
        return np.stack(self._everyone(mine))

    def _descriptions(self, described):
        return self._everyone(described)

    def _reduced(self, parts: list, op: str):
        out = functools.reduce(np.maximum if op == "max" else np.add, parts[1:], parts[0].copy())
        if op == "mean":
            out /= self.size
        return out

    def _all_reduce(self, x, op):
        return self._reduced(self._everyone(x.copy()), op)

    def _all_gather(self, x):
        return np.stack(self._everyone(x.copy()))

    def _reduce_scatter(self, blocks, op):
        return self._reduced([b[self.rank] for b in self._everyone(blocks)], op)

    def _broadcast(self, x, root):
        return self._everyone(x.copy())[root].copy()

    def _reduce(self, x, root, op):
        out = self._reduced(self._everyone(x.copy()), op)
        return out if self.rank == root else np.zeros_like(x)

    def _all_to_all(self, blocks):
        return np.stack([b[self.rank] for b in self._everyone(blocks)])

    def _start_all_reduce(self, buffer, op) -> Request:
        buffer[...] = self._all_reduce(buffer, op)  # at once: the other threads are running too
        return Request(self, buffer)


class _Hub:
    def __init__(self, size: int):
        self.size = size
        self.slots: list = [None] * size
        self.barrier = threading.Barrier(size)


def run_threads(fn, size: int, timeout: float | None = 60.0) -> list:
    """``fn(comm)`` on ``size`` threads, each rank of one ``ThreadCommunicator`` group and using it (collective
    kernels, ``Mesh()`` and ``DistributedDataParallel`` see it); returns the ranks' results in rank order. An
    error on any rank releases the others and is raised here."""
    comms = ThreadCommunicator.group(size, timeout=timeout)
    results, errors = [None] * size, [None] * size

    def run(comm) -> None:
        try:
            with using_communicator(comm):
                results[comm.rank] = fn(comm)
        except BaseException as e:  # raised again below, in the caller's thread
            errors[comm.rank] = e
            comm.abort()

    threads = [threading.Thread(target=run, args=(c,), name=f"rank {c.rank}") for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, CollectiveMismatchError)),
                 next((e for e in errors if e is not None), None))
    if first is not None:
        raise first
    return results


def mpi():
    """The ``mpi4py.MPI`` module, or an error saying how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise OpforgeError(f"opforge.distributed needs mpi4py and an MPI library: {INSTALL}; then run "
                           f"`mpiexec -n 2 python your_script.py` ({e})") from None
    return MPI


__all__ = ["INSTALL", "REDUCE_OPS", "SELF", "CollectiveMismatchError", "Communicator", "MPICommunicator", "Request",
           "SelfCommunicator", "Stats", "ThreadCommunicator", "_world", "current_communicator", "mpi", "run_threads",
           "set_world", "using_communicator"]
