"""Whether autograd records ops: a per-thread switch, like PyTorch's."""

import threading
from contextlib import contextmanager


class _GradMode(threading.local):
    enabled = True


_mode = _GradMode()


def is_grad_enabled() -> bool:
    return _mode.enabled


@contextmanager
def set_grad_enabled(mode: bool):
    previous = _mode.enabled
    _mode.enabled = bool(mode)
    try:
        yield
    finally:
        _mode.enabled = previous


def no_grad():
    """Context manager (and decorator) in which no op is recorded for autograd."""
    return set_grad_enabled(False)


def enable_grad():
    return set_grad_enabled(True)
