"""Whether autograd records ops: a per-thread switch, like PyTorch's."""

import threading
from contextlib import contextmanager


class _GradMode(threading.local):
    enabled = True


state = _GradMode()


def is_grad_enabled() -> bool:
    return state.enabled


@contextmanager
def set_grad_enabled(mode: bool):
    previous = state.enabled
    state.enabled = bool(mode)
    try:
        yield
    finally:
        state.enabled = previous


def no_grad():
    """Context manager (and decorator) in which no op is recorded for autograd."""
    return set_grad_enabled(False)


def enable_grad():
    return set_grad_enabled(True)
