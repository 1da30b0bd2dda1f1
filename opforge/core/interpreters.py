"""The interpreter stack: what an op call *means* (JAX's ``Trace.process_primitive``).

Each op call is given its meaning by the innermost interpreter of the running thread (or asyncio task): a
``contextvars`` stack whose bottom is ``EAGER`` (run the kernel now, link results that require grad into the
autograd graph). Tracing pushes one that appends the call to a program instead (``opforge.program.trace``); anomaly
detection, replay recording and sharding push theirs. Each answers ``apply(op, inputs, attrs)``, and the few
questions layers and optimizers ask about state (``live``, ``assign``, ``grad_of``, ``set_grad``), so ``nn`` and
``optim`` read the same eagerly and compiled.

The stack lives here, beside grad mode, so that every layer can ask it without importing the layers that give
calls their meaning: ``EAGER``'s two actions need Tensors and kernels, and ``opforge.dispatch`` binds them when it
loads (``opforge/__init__.py`` states the order).
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

from .errors import GradientError


class Interpreter:
    """One meaning of op calls. Subclasses answer ``apply``; the state questions default to eager answers."""

    symbolic = False  # whether op calls give symbolic values (program variables) rather than eager Tensors

    def apply(self, op, inputs: tuple, attrs: dict):
        """Give the call ``op(*inputs, **attrs)`` its meaning; ``inputs`` has one entry per schema input."""
        raise NotImplementedError

    def live(self, tensor):
        """``tensor`` as ops should read it: itself eagerly; under a tracer, the program's persistable variable for
        it, read afresh at each run (a buffer, a learning rate)."""
        return tensor

    def assign(self, target, value) -> None:
        """Make ``value`` the new content of ``target`` (eagerly: now, in place)."""
        EAGER.assign(target, value)

    def grad_of(self, param):
        """The gradient of ``param`` that an optimizer step reads (eagerly: ``param.grad``)."""
        return param.grad

    def set_grad(self, param, grad) -> None:
        """Make ``grad`` the gradient of ``param`` from here on (eagerly: ``param.grad``)."""
        param.grad = grad

    def differentiate(self, outputs, inputs, grad_outputs, allow_unused: bool):
        """``of.grad`` on values this interpreter owns (eager Tensors are differentiated by the autograd engine)."""
        raise GradientError(f"grad(): {type(self).__name__} cannot differentiate its values")

    def enter_module(self, module) -> None:
        """A module (``nn.Module``) is called: Python state it holds (its mode, its attributes) may decide what ops
        run. Eagerly nothing to do; a tracer guards the program on that state."""

    def guard(self, owner) -> None:
        """Ops about to run depend on Python state ``owner`` holds (an optimizer's hyper-parameters), which its
        ``_trace_state()`` describes. Eagerly nothing to do; a tracer guards the program on it."""


class EagerInterpreter(Interpreter):
    """Runs the kernel now; outputs of a call on inputs that require grad are linked to a new autograd Node.

    Its two actions are given by ``opforge.dispatch`` (``bind``): running a call eagerly and writing a value into a
    tensor need Tensors and kernels, which are built on this module."""

    def __init__(self):
        self._apply = self._assign = None

    def bind(self, apply, assign) -> None:
        self._apply, self._assign = apply, assign

    def apply(self, op, inputs: tuple, attrs: dict):
        return self._apply(op, inputs, attrs)

    def assign(self, target, value) -> None:
        self._assign(target, value)

    def __repr__(self) -> str:
        return "EAGER"


EAGER = EagerInterpreter()  # the bottom of every stack; the generated fast path tests for it by identity
_innermost = contextvars.ContextVar("opforge.interpreter", default=EAGER)
current_interpreter = _innermost.get


@contextmanager
def interpreting(interpreter: Interpreter):
    """Make ``interpreter`` the innermost one in this thread (or task) for the ``with`` block."""
    token = _innermost.set(interpreter)
    try:
        yield interpreter
    finally:
        _innermost.reset(token)


__all__ = ["EAGER", "EagerInterpreter", "Interpreter", "current_interpreter", "interpreting"]
