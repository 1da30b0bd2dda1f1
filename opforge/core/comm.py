"""Communicators: the small interface collective kernels call, over a real engine (the engines themselves, MPI
first, are in ``opforge.distributed.comm``).

A ``Communicator`` is a group of ranks (processes, one device each) and the collectives among them, on arrays of
its device. Every method is *collective*: each rank of the group calls it, in the same order, with arrays of the
same shape and dtype (``all_gather`` and ``all_to_all`` pieces are equal in size). Each returns a new array and
leaves its input alone, except ``start_all_reduce``, which reduces a buffer in place, without blocking, for
data-parallel buckets.

* ``SelfCommunicator``: one rank, no engine; the collectives are copies. It is what kernels see until
  ``of.distributed.init()`` runs, so single-process use needs nothing installed.
* ``MPICommunicator`` (``opforge.distributed.comm``): mpi4py over MPICH (host arrays, through the buffer
  protocol: no pickling).

A NCCL communicator for CuPy arrays fits the same interface (see docs/distributed.md): ``cupy.cuda.nccl``'s
``allReduce``/``allGather``/``reduceScatter``/``broadcast``/``reduce`` take device pointers and a stream, and
``all_to_all`` is a group of ``send``/``recv`` pairs; ``start_all_reduce`` enqueues on a side stream and its request
waits on an event.

**Checked order.** Before each collective, the ranks exchange a fingerprint (a running count and a hash of what is
called: the collective, its attrs, the shape and dtype). A rank whose program calls something else — another op
sequence, another shape — makes every rank raise ``CollectiveMismatchError`` naming what each rank called, instead
of a deadlock or a silently wrong sum. A rank that is dead (it crashed without taking the job down, or finished
early: silent for ``timeout`` seconds, as the engine tells) makes the others raise too; one that is only slow is
waited for. Each rank's bytes sent and time spent waiting
are counted in ``stats``.
"""

from __future__ import annotations

import contextvars
import os
import time
import zlib
from dataclasses import dataclass

import numpy as np

from .errors import ArgumentError, OpforgeError

REDUCE_OPS = ("sum", "mean", "max")


class CollectiveMismatchError(OpforgeError, RuntimeError):
    """The ranks of a group called different collectives (or with different shapes) at the same point."""


@dataclass
class Stats:
    """What one rank did in collectives: calls, payload bytes it sent (by the usual algorithms: ring all-reduce
    sends 2(n−1)/n of the buffer, all-gather (n−1) pieces, ...), and seconds it waited in them."""

    calls: int = 0
    bytes_sent: int = 0
    wait_s: float = 0.0

    def reset(self) -> None:
        self.calls, self.bytes_sent, self.wait_s = 0, 0, 0.0


class Request:
    """A collective started without blocking; ``wait()`` returns its buffer once the result is in it."""

    def __init__(self, comm: Communicator, buffer, finish=None, handle=None):
        self.comm, self.buffer, self.finish, self.handle = comm, buffer, finish, handle

    def poke(self) -> None:
        """Let the engine move the collective on (MPI progresses a started collective only inside MPI calls)."""
        if self.handle is not None:
            self.handle.Test()

    def wait(self):
        if self.handle is not None:
            self.comm._run(self.handle)
            self.handle = None
            if self.finish is not None:
                self.finish(self.buffer)
        return self.buffer


class Communicator:
    """The interface. Subclasses implement the ``_`` methods on contiguous arrays; this class checks arguments,
    moves axes so each engine call sees one contiguous block per rank, checks the call order, and counts."""

    rank: int = 0
    size: int = 1
    name: str = "?"

    def __init__(self, verify: bool = True, timeout: float | None = None):
        self.verify = verify
        self.timeout = float(os.environ.get("OPFORGE_COLLECTIVE_TIMEOUT", 60)) if timeout is None else timeout
        self.stats = Stats()
        self.sequence = 0  # collectives called so far: the fingerprint's running count

    # -- the collectives ----------------------------------------------------------------------------------------

    def all_reduce(self, x, op: str = "sum"):
        """Every rank gets the elementwise sum (mean, max) over ranks."""
        self._check("all_reduce", x, op=op)
        out = self._all_reduce(_contiguous(x), op)
        self._count(x.nbytes * 2 * (self.size - 1) / self.size)
        return out

    def all_gather(self, x, axis: int = 0):
        """Every rank gets the ranks' pieces concatenated along ``axis``, in rank order."""
        axis = self._axis(x, axis, "all_gather")
        self._check("all_gather", x, axis=axis)
        blocks = self._all_gather(_contiguous(x))  # (size, *x.shape)
        self._count(x.nbytes * (self.size - 1))
        return np.concatenate(list(blocks), axis=axis) if self.size > 1 else blocks[0]

    def reduce_scatter(self, x, axis: int = 0, op: str = "sum"):
        """Rank r gets block r (along ``axis``) of the elementwise sum (mean, max) over ranks."""
        axis = self._axis(x, axis, "reduce_scatter")
        self._divisible(x, axis, "reduce_scatter")
        self._check("reduce_scatter", x, axis=axis, op=op)
        blocks = _contiguous(np.stack(np.split(x, self.size, axis=axis)))
        out = self._reduce_scatter(blocks, op)
        self._count(x.nbytes * (self.size - 1) / self.size)
        return out

    def broadcast(self, x, root: int = 0):
        """Every rank gets rank ``root``'s ``x``."""
        self._root(root, "broadcast")
        self._check("broadcast", x, root=root)
        out = self._broadcast(x.copy(order="C"), root)  # (a copy on x's device)
        self._count(x.nbytes if self.rank == root else 0)
        return out

    def reduce(self, x, root: int = 0, op: str = "sum"):
        """Rank ``root`` gets the elementwise sum (mean, max) over ranks; the others get zeros."""
        self._root(root, "reduce")
        self._check("reduce", x, root=root, op=op)
        out = self._reduce(_contiguous(x), root, op)
        self._count(0 if self.rank == root else x.nbytes)
        return out

    def all_to_all(self, x, split_axis: int = 0, concat_axis: int = 0):
        """``x`` is cut into ``size`` blocks along ``split_axis``; block j goes to rank j, and each rank
        concatenates the blocks it receives, in rank order, along ``concat_axis``."""
        split_axis = self._axis(x, split_axis, "all_to_all")
        concat_axis = self._axis(x, concat_axis, "all_to_all")
        self._divisible(x, split_axis, "all_to_all")
        self._check("all_to_all", x, split_axis=split_axis, concat_axis=concat_axis)
        blocks = _contiguous(np.stack(np.split(x, self.size, axis=split_axis)))
        received = self._all_to_all(blocks)
        self._count(x.nbytes * (self.size - 1) / self.size)
        return np.concatenate(list(received), axis=concat_axis) if self.size > 1 else received[0]

    def start_all_reduce(self, buffer, op: str = "sum") -> Request:
        """Reduce ``buffer`` (contiguous) in place over ranks without blocking; ``.wait()`` on the result."""
        self._check("start_all_reduce", buffer, op=op)
        self._count(buffer.nbytes * 2 * (self.size - 1) / self.size)
        return self._start_all_reduce(buffer, op)

    def barrier(self) -> None:
        self._check("barrier", np.zeros(0))

    def split(self, color: int, key: int) -> Communicator:
        """The group of the ranks that give the same ``color``, ranked by ``key`` (``MPI_Comm_split``); every rank of
        this group calls it. An n-D mesh makes one such group per axis."""
        raise NotImplementedError

    # -- checks -------------------------------------------------------------------------------------------------

    def _axis(self, x, axis: int, what: str) -> int:
        if not -x.ndim <= axis < max(x.ndim, 1) or x.ndim == 0:
            raise ArgumentError(f"{what}(): axis {axis} is out of range for an array of shape {tuple(x.shape)}")
        return axis % x.ndim

    def _divisible(self, x, axis: int, what: str) -> None:
        if x.shape[axis] % self.size:
            raise ArgumentError(f"{what}(): axis {axis} of shape {tuple(x.shape)} does not split into "
                                f"{self.size} equal blocks (one per rank)")

    def _root(self, root: int, what: str) -> None:
        if not 0 <= root < self.size:
            raise ArgumentError(f"{what}(): root {root} is not a rank of this group of {self.size}")

    def _check(self, what: str, x, **attrs) -> None:
        """Make sure every rank is about to call the same collective on the same shape and dtype."""
        self.sequence += 1
        if self.size == 1 or not self.verify:
            return
        described = f"{what}({', '.join(f'{k}={v}' for k, v in attrs.items())}) on {x.dtype}{list(x.shape)}"
        mine = np.array([self.sequence, zlib.crc32(described.encode())], dtype=np.int64)
        began = time.perf_counter()
        everyone = self._exchange(mine, described)
        self.stats.wait_s += time.perf_counter() - began
        if (everyone != mine).any():
            calls = self._descriptions(described)
            lines = "\n".join(f"  rank {r}: {c}" for r, c in enumerate(calls))
            raise CollectiveMismatchError(
                f"the ranks' programs differ at collective #{self.sequence}: rank {self.rank} called "
                f"{described}, but\n{lines}\n(every rank must call the same collectives in the same order, "
                "on the same shapes: does one rank take another branch, or get another batch size?)")

    def _count(self, nbytes: float) -> None:
        self.stats.calls += 1
        self.stats.bytes_sent += int(nbytes)

    # -- what an engine provides ----------------------------------------------------------------------------------

    def _exchange(self, mine: np.ndarray, described: str) -> np.ndarray:
        raise NotImplementedError

    def _descriptions(self, described: str) -> list:
        raise NotImplementedError

    def _all_reduce(self, x, op):
        raise NotImplementedError

    def _all_gather(self, x):
        raise NotImplementedError

    def _reduce_scatter(self, blocks, op):
        raise NotImplementedError

    def _broadcast(self, x, root):
        raise NotImplementedError

    def _reduce(self, x, root, op):
        raise NotImplementedError

    def _all_to_all(self, blocks):
        raise NotImplementedError

    def _start_all_reduce(self, buffer, op) -> Request:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"


class SelfCommunicator(Communicator):
    """One rank: every collective is a copy (a mean or max over one rank is the value itself)."""

    name = "self"

    def _all_reduce(self, x, op):
        return x.copy()

    def _all_gather(self, x):
        return x[None].copy()

    def _reduce_scatter(self, blocks, op):
        return blocks[0].copy()

    def _broadcast(self, x, root):
        return x

    def _reduce(self, x, root, op):
        return x.copy()

    def _all_to_all(self, blocks):
        return blocks.copy()

    def _start_all_reduce(self, buffer, op) -> Request:
        return Request(self, buffer)

    def split(self, color: int, key: int) -> Communicator:
        return self


def _contiguous(x):
    """``x`` as one C-ordered block (np.ascontiguousarray would make a 0-d array 1-d)."""
    return x if x.flags.c_contiguous else x.copy(order="C")


# -- the current communicator: what collective kernels call ------------------------------------------------------

SELF = SelfCommunicator()
_world: list = [SELF]  # set by init()
_current = contextvars.ContextVar("opforge.communicator", default=None)
_groups = contextvars.ContextVar("opforge.mesh_groups", default=())  # an n-D mesh's communicator per axis


def current_communicator() -> Communicator:
    """The communicator collective kernels use here: the innermost ``with mesh:``'s, else the world's (after
    ``of.distributed.init()``), else one rank on its own."""
    comm = _current.get()
    return _world[0] if comm is None else comm


def group_communicator(group: int | None, op_name: str = "a collective") -> Communicator:
    """The communicator of a collective op's ``group``: None, the current one; k, axis k of the current n-D mesh's
    (``with mesh:`` sets them)."""
    if group is None:
        return current_communicator()
    groups = _groups.get()
    if not 0 <= group < len(groups):
        raise ArgumentError(f"{op_name}(): argument 'group' is mesh axis {group}: a collective of mesh axis {group} "
                            "runs under `with mesh:` of an n-D mesh, which gives each axis its communicator (here: "
                            f"{len(groups)} axes)")
    return groups[group]


def set_world(comm: Communicator) -> None:
    _world[0] = comm


class using_communicator:
    """``with using_communicator(comm):`` makes collective kernels in this thread (or task) use ``comm``, and those
    of an n-D mesh's axis k (``group=k``) ``groups[k]`` when given."""

    def __init__(self, comm: Communicator, groups: tuple | None = None):
        self.comm, self.groups = comm, groups

    def __enter__(self) -> Communicator:
        self._token = _current.set(self.comm)
        self._groups = None if self.groups is None else _groups.set(tuple(self.groups))
        return self.comm

    def __exit__(self, *exc) -> None:
        if self._groups is not None:
            _groups.reset(self._groups)
        _current.reset(self._token)
