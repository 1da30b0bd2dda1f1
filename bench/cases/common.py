"""What the case modules share: the Variant record, loading each framework with the thread count the runner chose,
moving the same NumPy inputs into each framework, and the check values that show every framework computed the same
numbers."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class Variant:
    """One timed thing: ``fn()`` does the work once (and waits for it: JAX dispatches asynchronously)."""

    name: str
    fn: Callable[[], object]
    per: int = 1  # the time of one call is divided by this (e.g. ops in a chain)
    check: Callable[[], dict] | None = None  # run once before timing, on fresh state: {label: float}


def threads() -> int:
    return int(os.environ.get("BENCH_THREADS", "1"))


@functools.cache  # once per process: steps call it per call, and setting the thread counts again costs ~20 µs
def load_torch():
    import torch

    torch.set_num_threads(threads())
    with contextlib.suppress(RuntimeError):  # set already: possible only once per process
        torch.set_num_interop_threads(1)
    return torch


def load_torch_compile():
    """torch, with Inductor compiling in this process (no pool of compile workers: one core each)."""
    torch = load_torch()
    import torch._inductor.config as inductor

    inductor.compile_threads = 1
    return torch


def step_check(step, params):
    """The check of a training step, run once from the initial weights: the loss it returns (taken before the update)
    and the update it made, Σ (after − before)² in float64, so that a step which leaves the parameters as they were
    gives 0 and fails the comparison (a real SGD step moves them by ~5e-5 relative: too little to see in Σ after²)."""

    def check():
        before = [to_numpy(p).astype(np.float64) for p in params()]
        loss = scalar(step())
        after = [to_numpy(p).astype(np.float64) for p in params()]
        return {"loss": loss, "update²": float(sum(np.square(a - b).sum() for a, b in zip(after, before)))}

    return check


@functools.cache  # once per process, as load_torch: eager JAX steps call it per call (a jitted one when traced)
def load_jax():
    import jax

    jax.config.update("jax_platforms", "cpu")
    return jax


def to_numpy(value) -> np.ndarray:
    """A framework's array (opforge Tensor, torch tensor, JAX array, NumPy) as a NumPy array."""
    if hasattr(value, "detach"):  # torch
        return value.detach().numpy()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # opforge Tensor
        return value.numpy()
    return np.asarray(value)


def scalar(value) -> float:
    return float(to_numpy(value))


def sq(values) -> float:
    """The sum of squares of one array or a list of arrays, in float64: a check value with no cancellation."""
    values = values if isinstance(values, (list, tuple)) else [values]
    return float(sum(np.square(to_numpy(v).astype(np.float64)).sum() for v in values))


def opforge_tensors(arrays, requires_grad: bool = False) -> list:
    import opforge as of

    return [of.tensor(a.copy(), requires_grad=requires_grad) for a in arrays]


def torch_tensors(arrays, requires_grad: bool = False) -> list:
    torch = load_torch()
    return [torch.from_numpy(a.copy()).requires_grad_(requires_grad) for a in arrays]


def jax_arrays(arrays) -> list:
    jnp = load_jax().numpy
    return [jnp.asarray(a) for a in arrays]


def unknown(framework: str, group: str):
    return ValueError(f"{group}: no variant for framework '{framework}'")


def torch_compiled_sgd_step(loss, params, x, y, lr: float):
    """The whole SGD step as one torch.compile graph: torch.func's gradient of ``loss(params, x, y)`` (AOTAutograd
    traces forward and backward together), then the update in place. Returns a call of one step."""
    torch = load_torch_compile()

    def step(x, y):
        grads, value = torch.func.grad_and_value(lambda ps: loss(ps, x, y))(params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(lr * g)
        return value

    fn = torch.compile(step)
    return lambda: fn(x, y)
