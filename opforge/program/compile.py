"""``of.compile``: trace a function once per input signature and run it with the Executor from then on."""

from __future__ import annotations

import functools
import inspect

import numpy as np

from ..core.errors import ArgumentError, describe
from ..core.spec import Spec
from ..tensor import Tensor, wrap
from .executor import Executor
from .trace import trace


class CompiledFunction:
    """A function traced into a program per input signature (shapes and dtypes) and run by an Executor."""

    def __init__(self, fn, optimize: bool = True, cache_key=None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.optimize = optimize
        self.cache_key = cache_key  # () -> hashable: Python state the trace depends on (model.training, say)
        self.params = list(inspect.signature(fn).parameters)
        self.cache: dict = {}  # signature -> (program, executor)

    def __call__(self, *args, **kwargs):
        bound = dict(zip(self.params, args)) | kwargs if kwargs or len(args) != len(self.params) else \
            dict(zip(self.params, args))
        arrays, device = {}, None
        for name, value in bound.items():
            if type(value) is Tensor:
                arrays[name] = value._data
                device = device or value._device
            elif isinstance(value, (Tensor, np.ndarray)):
                arrays[name] = value if isinstance(value, np.ndarray) else value.numpy()
            else:
                raise ArgumentError(f"{self.fn.__name__}() compiled: argument '{name}' expected a Tensor or "
                                    f"array, got {describe(value)}")
        key = self._key(arrays, device)
        entry = self.cache.get(key)
        if entry is None:
            program = trace(self.fn, device=device, **{n: Spec(a.shape, a.dtype) for n, a in arrays.items()})
            # Fetch what fn returns, nothing more: gradients the updates consume need not outlive them.
            exe = Executor(program, fetch=dict(program.outputs), optimize=self.optimize)
            keys = list(program.outputs)
            shape = "one" if keys == ["out"] else "tuple" if all(k == f"out{i}" for i, k in enumerate(keys)) \
                else "dict"
            entry = self.cache[key] = (program, exe, shape)
        program, exe, shape = entry
        out = exe.run_arrays(arrays)
        device = program.device
        if shape == "one":
            return wrap(out["out"], device)
        if shape == "tuple":
            return tuple([wrap(v, device) for v in out.values()])
        return {k: wrap(v, device) for k, v in out.items()}

    def _key(self, arrays: dict, device=None) -> tuple:
        key = tuple([(n, a.shape, a.dtype) for n, a in arrays.items()])
        if device is not None and device.name != "cpu":
            key = (key, device.name)
        return key if self.cache_key is None else (key, self.cache_key())

    def program(self, *args, **kwargs):
        """The program traced for arguments like these (traced now if needed)."""
        self(*args, **kwargs)
        bound = dict(zip(self.params, args)) | kwargs
        return self.cache[self._key({n: np.asarray(v) for n, v in bound.items()})][0]


def compile(fn=None, *, optimize: bool = True, cache_key=None):
    """Decorator: trace ``fn`` per input signature and run it as a compiled program.

        @of.compile
        def step(x, y):
            loss = F.mean(F.square(model(x) - y))
            (gw,) = of.grad(loss, [w])
            return loss, gw

    ``cache_key``, a function of no arguments, adds Python state the trace depends on to the cache key:
    ``of.compile(step, cache_key=lambda: model.training)`` traces once for training and once for evaluation.
    """
    if fn is None:
        return lambda f: CompiledFunction(f, optimize, cache_key)
    return CompiledFunction(fn, optimize, cache_key)


__all__ = ["CompiledFunction", "compile"]
