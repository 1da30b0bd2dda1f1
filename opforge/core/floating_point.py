"""opforge's kernels are as silent as PyTorch's about floating-point exceptions: ``log(0)`` is −inf, ``0/0`` NaN,
``exp(1000)`` inf, with no NumPy ``RuntimeWarning`` ("divide by zero encountered in log") — and the user's own NumPy
settings and NumPy calls are left as they are (``np.seterr`` would change them for the whole process).

Three pieces, none of which costs a small eager op anything:

* ``install_filter``, run once as opforge loads: a ``warnings`` filter that ignores NumPy's floating-point warnings
  raised in opforge's code. NumPy attributes such a warning to the Python frame that called the ufunc, which is
  an opforge kernel (module ``opforge.ops...``) or generated code (file ``<opforge.ops.add>``...), never the
  user's: ``np.log(0)`` in a user's module still warns.
* A filter the user puts in front of ours (``warnings.simplefilter("error")``, ``pytest -W error``) or their
  ``np.errstate(all="raise")`` turns such a warning into an exception raised from the kernel. An eager op then runs
  its kernel again under ``quiet()`` (its kernels are pure functions of their inputs: running one twice gives the
  same outputs), so the call returns what it returns anywhere else; a random op's kernel, which would draw again,
  runs under ``quiet()`` from the start.
* A compiled plan runs whole under ``quiet()``: one switch per run, not per op.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

try:  # NumPy's own handle on its ufunc settings (private: the fast way to change them for a with block)
    from numpy._core.umath import _extobj_contextvar, _make_extobj
except ImportError:  # a NumPy that moved them: np.errstate sets the same settings, only slower
    _extobj_contextvar = _make_extobj = None

# NumPy's messages: "divide by zero encountered in log", "invalid value encountered in divide", "overflow
# encountered in exp", "underflow encountered in multiply"
MESSAGE = r"(divide by zero|invalid value|overflow|underflow) encountered"
MODULE = r"<?opforge\b"  # opforge's modules, and the file names of its generated code (<opforge.plan.step.1>)

# what a floating-point exception of NumPy's becomes under a user's filter or np.errstate
ERRORS = (RuntimeWarning, FloatingPointError)


def install_filter() -> None:
    """Ignore NumPy's floating-point warnings raised in opforge's code (see the module docstring)."""
    warnings.filterwarnings("ignore", message=MESSAGE, category=RuntimeWarning, module=MODULE)


if _extobj_contextvar is not None:
    # NumPy's default settings with every floating-point exception ignored, made once (making it costs as much as
    # switching to it); its other settings (the buffer size) at their defaults: a kernel that wants another buffer
    # sets it itself
    enter = functools.partial(_extobj_contextvar.set, _make_extobj(all="ignore"))  # -> the token leave takes
    leave = _extobj_contextvar.reset
else:
    def enter():
        settings = np.errstate(all="ignore")
        settings.__enter__()
        return settings

    def leave(settings) -> None:
        settings.__exit__(None, None, None)

enter.__doc__ = "Ignore NumPy's floating-point exceptions until ``leave(token)``; returns that token."


class quiet:
    """``with quiet():`` NumPy's floating-point exceptions ignored (``enter`` and ``leave`` around the block)."""

    __slots__ = ("token",)

    def __enter__(self):
        self.token = enter()
        return self

    def __exit__(self, *exc):
        leave(self.token)


__all__ = ["ERRORS", "MESSAGE", "MODULE", "enter", "install_filter", "leave", "quiet"]
