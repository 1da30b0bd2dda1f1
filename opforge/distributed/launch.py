"""``init()``: join the MPI world, and make an uncaught error on any rank end the whole job.

Without the second part, a rank that raises exits while the others wait in their next collective for ever. So
``init`` replaces ``sys.excepthook`` (and ``threading.excepthook``): the error is printed with its rank, then
``MPI_Abort`` has ``mpiexec`` stop every rank at once.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

from .comm import Heartbeat, MPICommunicator, _world, current_communicator, mpi, set_world


def init(verify: bool = True, timeout: float | None = None) -> MPICommunicator:
    """Join the MPI world (once; later calls return it) and return its communicator (``.rank``, ``.size``).

    ``verify`` checks before each collective that every rank calls the same one (see ``comm``); ``timeout``
    (seconds; default ``$OPFORGE_COLLECTIVE_TIMEOUT`` or 60) is how long a rank may be silent before a collective
    waiting for it counts it dead and gives up: every rank sends the others a heartbeat four times a second, so a
    rank that is alive but slow (a long checkpoint write) is waited for, however long.
    """
    world = _world[0]
    if isinstance(world, MPICommunicator):
        return world
    MPI = mpi()
    # signs of life, so that a wait tells a dead rank (silent) from a slow one (see Heartbeat); a thread may call
    # MPI only at MPI_THREAD_MULTIPLE (mpi4py's default): without it, waits give up after the timeout
    beating = MPI.COMM_WORLD.Get_size() > 1 and MPI.Query_thread() == MPI.THREAD_MULTIPLE
    heartbeat = Heartbeat(MPI.COMM_WORLD, MPI) if beating else None
    world = MPICommunicator(MPI.COMM_WORLD, verify=verify, timeout=timeout, heartbeat=heartbeat)
    set_world(world)
    if world.size > 1:
        _abort_on_uncaught_errors(world)
    return world


def is_initialized() -> bool:
    return isinstance(_world[0], MPICommunicator)


def get_rank() -> int:
    return current_communicator().rank


def get_world_size() -> int:
    return current_communicator().size


def _abort_on_uncaught_errors(world: MPICommunicator) -> None:
    def abort(kind, error, tb, where="") -> None:
        text = "".join(traceback.format_exception(kind, error, tb))
        sys.stderr.write(f"[rank {world.rank}{where}] uncaught {kind.__name__}: aborting the job\n{text}")
        sys.stderr.flush()
        # Abort tears the job down at once, and mpiexec forwards a rank's stderr on its own time: on a loaded
        # machine the message was lost. A moment's wait lets it through; the job is ending anyway.
        time.sleep(0.5)
        world.comm.Abort(1)

    def in_thread(args) -> None:
        if args.exc_type is SystemExit:
            return
        abort(args.exc_type, args.exc_value, args.exc_traceback, f", thread {args.thread.name}")

    sys.excepthook = abort
    threading.excepthook = in_thread


__all__ = ["get_rank", "get_world_size", "init", "is_initialized"]
