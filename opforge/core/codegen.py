"""Generated code that can be debugged: every Python source opforge writes goes through ``define``.

opforge writes Python for what runs often: each op's function (``opforge.ops.<name>``, ``.source`` shows it), the
attach that records a call for autograd, the replay tapes of gradient rules, and each executor plan with its fused
groups. ``define`` compiles such a source under a file name that says what it is and whose it is —
``<opforge.ops.relu>``, ``<opforge.replay.tanh.3>``, ``<opforge.plan.step.1>`` — and registers its lines with
``linecache``, so a traceback through it shows the generated line and names the op or plan, as one through a file
would. A source that lives as long as what it was made for (a tape, a plan) is forgotten with it.
"""

from __future__ import annotations

import itertools
import linecache
import weakref

_serial = itertools.count(1)


def define(source: str, kind: str, name: str, env: dict, function: str, *, owner=None, unique: bool = False):
    """Compile ``source`` and return the function ``function`` it defines, with ``env`` as its globals.

    The file name is ``<opforge.{kind}.{name}>`` (with a serial number after it when ``unique``: many sources of
    one kind and name). The lines stay registered while ``owner`` lives (the function itself when ``owner`` is
    None and ``unique``; else for good). The function gets ``.source``."""
    filename = f"<opforge.{kind}.{name}{f'.{next(_serial)}' if unique else ''}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), env)
    fn = env[function]
    fn.source = source
    if owner is None and unique:
        owner = fn
    if owner is not None:
        weakref.finalize(owner, linecache.cache.pop, filename, None)
    return fn


def filename_of(fn) -> str:
    """The file name ``define`` gave the code of ``fn``."""
    return fn.__code__.co_filename


__all__ = ["define", "filename_of"]
