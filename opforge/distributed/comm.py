"""The communication engines behind ``opforge.core.comm``'s interface: MPI through mpi4py (host arrays), and
``ThreadCommunicator``, ranks as threads of one process (for tests, and for trying a sharded program without MPI).

The interface, the one-rank ``SelfCommunicator`` and the current communicator that collective kernels ask for live
in core (``opforge.core.comm``), so the op library needs nothing of this package; this module re-exports them.
"""

from __future__ import annotations

import atexit
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


HEARTBEAT_S = 0.25  # how often each rank tells the others it is alive
HEARTBEAT_TAG = 7243


class Heartbeat:
    """Signs of life between the ranks of an MPI world: a daemon thread sends every other rank a byte every
    ``HEARTBEAT_S`` seconds, on a communicator of its own, and notes when it last heard from each. A rank waiting in
    a collective asks it which ranks have been silent for longer than the timeout: those are dead (they ended,
    crashed, or hang with the interpreter stopped) and the wait gives up; the others are alive, only slow (a long
    checkpoint write, a long step), and are waited for, however long. Runs where MPI allows threads to call it
    (``MPI_THREAD_MULTIPLE``, mpi4py's default); the thread stops before MPI finalises."""

    def __init__(self, comm, MPI):
        self.MPI, self.comm = MPI, comm.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)  # a peer that has gone must not abort this rank's heartbeat
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.heard = np.full(self.size, time.monotonic())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="opforge heartbeat", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # (after mpi4py's own atexit: this runs first, before MPI_Finalize)

    def _beat(self) -> None:
        byte, inbox, status = np.zeros(1, np.uint8), np.zeros(1, np.uint8), self.MPI.Status()
        pending = {r: [] for r in range(self.size) if r != self.rank}
        while not self._stop.is_set():
            self.heard[self.rank] = time.monotonic()
            try:
                while self.comm.Iprobe(self.MPI.ANY_SOURCE, HEARTBEAT_TAG, status):
                    self.comm.Recv(inbox, status.Get_source(), HEARTBEAT_TAG)
                    self.heard[status.Get_source()] = time.monotonic()
            except self.MPI.Exception:
                pass
            for r, sends in pending.items():
                try:
                    sends[:] = [q for q in sends if not q.Test()]
                    if len(sends) < 4:  # a peer that reads none (gone) gets no more
                        sends.append(self.comm.Isend(byte, r, HEARTBEAT_TAG))
                except self.MPI.Exception:  # a peer that has gone: it stays silent
                    pending[r] = [None] * 4
            self._stop.wait(HEARTBEAT_S)

    def silent(self, seconds: float) -> set:
        """World ranks not heard from for more than ``seconds``."""
        now = time.monotonic()
        return {r for r in range(self.size) if now - self.heard[r] > seconds}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class MPICommunicator(Communicator):
    """MPI through mpi4py, on host (NumPy) arrays; ``comm`` is an ``mpi4py.MPI.Comm`` (the world by default).

    ``timeout``: how long a rank may be silent (no heartbeat, see ``Heartbeat``) before a collective waiting for it
    gives up — the one timeout, for a rank that is dead. A rank that is alive is waited for as long as it takes.
    ``heartbeat``: the world's (``init()`` starts it; split groups share it); without one, waits give up after
    ``timeout`` seconds whatever the reason."""

    name = "mpi"

    def __init__(self, comm=None, verify: bool = True, timeout: float | None = None, heartbeat=None):
        super().__init__(verify, timeout)
        MPI = mpi()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._ops = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX}
        self.heartbeat = heartbeat
        if heartbeat is not None:  # this group's ranks as the heartbeat's (the world's) ranks
            self._world_ranks = MPI.Group.Translate_ranks(self.comm.Get_group(), list(range(self.size)),
                                                          heartbeat.comm.Get_group())

    def _host(self, x):
        if type(x) is not np.ndarray:
            raise ArgumentError(f"the MPI communicator works on host (NumPy) arrays, got {type(x).__name__}; "
                                "a device array needs its device's communicator (NCCL for CuPy)")
        return x

    def _wait(self, request) -> None:
        """Wait for a non-blocking call, giving the CPU back while it is not done (the ranks may share cores).
        Past ``timeout`` seconds, give up if a rank of the group is dead (silent for that long: it will never
        arrive), and go on waiting for ranks that are alive, however slow."""
        began = time.perf_counter()
        while not request.Test():  # MPI moves a collective on inside calls like this one: poll closely at first
            waited = time.perf_counter() - began
            if waited > self.timeout:
                self._give_up_if_dead(waited)
            if waited < 0.1:
                os.sched_yield()  # let a rank sharing this core run, and come straight back
            else:
                time.sleep(1e-3)  # a long wait (another rank is far behind, or gone): stop spinning

    def _give_up_if_dead(self, waited: float) -> None:
        if self.heartbeat is None:  # nothing tells a dead rank from a slow one: the timeout decides
            raise CollectiveMismatchError(
                f"rank {self.rank} waited {waited:.0f} s for the other ranks at collective #{self.sequence}: "
                "one of them never called it (it stopped, or its program took another path); "
                "OPFORGE_COLLECTIVE_TIMEOUT sets the limit")
        silent = self.heartbeat.silent(self.timeout)
        dead = [r for r, w in enumerate(self._world_ranks) if w in silent]
        if dead:
            raise CollectiveMismatchError(
                f"rank {self.rank} waited {waited:.0f} s at collective #{self.sequence} for rank(s) {dead}, silent "
                f"for over {self.timeout:g} s: they ended, crashed or hang, and will not arrive. (A rank that is "
                "alive is waited for however long it takes; OPFORGE_COLLECTIVE_TIMEOUT sets how long a silent "
                "rank counts as dead)")

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

    def split(self, color: int, key: int) -> MPICommunicator:
        return MPICommunicator(self.comm.Split(int(color), int(key)), self.verify, self.timeout, self.heartbeat)


class ThreadCommunicator(Communicator):
    """Rank ``rank`` of a group of threads in one process (``ThreadCommunicator.group(size)`` makes the group):
    the collectives exchange arrays through shared memory, every rank reducing in rank order, so all ranks get
    the same bits. What MPI ranks would compute, without MPI: ``run_threads(fn, size)`` runs ``fn`` once per rank.
    """

    name = "threads"

    def __init__(self, hub: _Hub, rank: int, verify: bool = True, timeout: float | None = None):
        super().__init__(verify, timeout)  # (no timeout applies: a thread that fails or returns is known at once)
        self.hub, self.rank, self.size = hub, rank, hub.size
        self._children: list = []  # the groups split from this one: they learn of a failure or a return too

    @classmethod
    def group(cls, size: int, verify: bool = True, timeout: float | None = None) -> list:
        """One communicator per rank of a new group of ``size`` threads."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ArgumentError(f"ThreadCommunicator.group(): size must be an int >= 1, got {size!r}")
        hub = _Hub(size)
        return [cls(hub, r, verify, timeout) for r in range(size)]

    def _everyone(self, value) -> list:
        """Every rank's ``value``, in rank order (a rendezvous of the group's threads). A rank that failed or
        returned (it will never arrive) ends the wait at once; one that is only slow is waited for."""
        began = time.perf_counter()
        try:
            return self.hub.meet(self.rank, value, self.sequence)
        finally:
            self.stats.wait_s += time.perf_counter() - began

    def abort(self) -> None:
        """Release every rank waiting in a collective (with an error): a rank failed."""
        self.hub.abort()
        for child in self._children:
            child.abort()

    def finished(self) -> None:
        """This rank has returned: a rank still waiting for it in a collective gives up."""
        self.hub.finished(self.rank)
        for child in self._children:
            child.finished()

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

    def split(self, color: int, key: int) -> ThreadCommunicator:
        everyone = self._everyone((int(color), int(key), self.rank))
        members = sorted((k, r) for c, k, r in everyone if c == color)
        leader = members[0][1]  # the group's lowest rank makes its hub; the others take it
        hubs = self._everyone(_Hub(len(members)) if self.rank == leader else None)
        child = ThreadCommunicator(hubs[leader], [r for _, r in members].index(self.rank), self.verify, self.timeout)
        self._children.append(child)
        return child


class _Hub:
    """Where a group of threads meets: each collective is a generation; when the last rank arrives, every rank takes
    the values of that generation."""

    def __init__(self, size: int):
        self.size = size
        self.slots: list = [None] * size
        self.arrived: set = set()
        self.result: list = []
        self.generation = 0
        self.gone: set = set()  # ranks that returned
        self.broken = False
        self.cond = threading.Condition()

    def meet(self, rank: int, value, sequence: int) -> list:
        with self.cond:
            generation = self.generation
            self.slots[rank] = value
            self.arrived.add(rank)
            if len(self.arrived) == self.size:
                self.result, self.arrived = list(self.slots), set()
                self.generation += 1
                self.cond.notify_all()
                return self.result
            while self.generation == generation:  # (the next one cannot end before this rank arrives there)
                missing = self.gone - self.arrived
                if self.broken or missing:
                    what = f"rank(s) {sorted(missing)} returned without calling it" if missing and not self.broken \
                        else "one of them failed"
                    raise CollectiveMismatchError(f"rank {rank} waited for the other threads of its group at "
                                                  f"collective #{sequence}: {what}")
                self.cond.wait(0.5)
            return self.result

    def abort(self) -> None:
        with self.cond:
            self.broken = True
            self.cond.notify_all()

    def finished(self, rank: int) -> None:
        with self.cond:
            self.gone.add(rank)
            self.cond.notify_all()


def run_threads(fn, size: int) -> list:
    """``fn(comm)`` on ``size`` threads, each rank of one ``ThreadCommunicator`` group and using it (collective
    kernels, ``Mesh()`` and ``DistributedDataParallel`` see it); returns the ranks' results in rank order. An
    error on any rank releases the others and is raised here; so does a rank returning while another waits for it
    in a collective. There is no timeout: a rank that is only slow is waited for."""
    comms = ThreadCommunicator.group(size)
    results, errors = [None] * size, [None] * size

    def run(comm) -> None:
        try:
            with using_communicator(comm):
                results[comm.rank] = fn(comm)
            comm.finished()
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
