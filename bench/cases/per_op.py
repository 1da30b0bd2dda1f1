"""1. Per-op cost: add, mul by a scalar and relu on 16 and on 1,000,000 float32 elements, with and without gradient
recording (leaky_relu on 16 as well, folded in from the old bench/eager_overhead.py). Frameworks without a tape
(NumPy, JAX, compiled programs) have no "recording" variant."""

from __future__ import annotations

import numpy as np

from .common import Variant, jax_arrays, load_jax, load_torch, opforge_tensors, sq, torch_tensors, unknown

TITLE = "1. Per-op cost (float32)"
UNIT = "µs"
FRAMEWORKS = ("numpy", "opforge", "opforge.compiled", "torch", "jax", "jax.jit")
REFERENCES = ("numpy", "torch")

SIZES = (16, 1_000_000)
OPS = ("add", "mul by scalar", "relu")
TAPE = ("opforge", "torch")  # frameworks that record for autograd


def cases():
    """(name, op, n, recording) in report order."""
    out = []
    for n in SIZES:
        for op in OPS + (("leaky_relu",) if n == 16 else ()):
            for rec in (False, True):
                out.append((f"{op}, {n:,}{', recording' if rec else ''}", op, n, rec))
    return out


def inputs(n: int):
    rng = np.random.default_rng(n)
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


def functions(framework: str) -> dict:
    """op -> f(x, y) written as a user of that framework would write it."""
    if framework == "numpy":
        return {"add": lambda x, y: x + y, "mul by scalar": lambda x, y: x * 2.0,
                "relu": lambda x, y: np.maximum(x, 0), "leaky_relu": lambda x, y: np.where(x > 0, x, x * 0.01)}
    if framework.startswith("opforge"):
        from opforge import ops as F

        return {"add": lambda x, y: x + y, "mul by scalar": lambda x, y: x * 2.0,
                "relu": lambda x, y: F.relu(x), "leaky_relu": lambda x, y: F.leaky_relu(x, alpha=0.01)}
    if framework == "torch":
        torch = load_torch()
        return {"add": lambda x, y: x + y, "mul by scalar": lambda x, y: x * 2.0,
                "relu": lambda x, y: torch.relu(x),
                "leaky_relu": lambda x, y: torch.nn.functional.leaky_relu(x, 0.01)}
    if framework.startswith("jax"):
        jax = load_jax()
        return {"add": lambda x, y: x + y, "mul by scalar": lambda x, y: x * 2.0,
                "relu": lambda x, y: jax.nn.relu(x), "leaky_relu": lambda x, y: jax.nn.leaky_relu(x, 0.01)}
    raise unknown(framework, "per_op")


def bind(f, *args):
    """A zero-argument call of f(*args) (a fresh scope per variant: no late binding of loop variables)."""
    return lambda: f(*args)


def blocking(f, *args):
    return lambda: f(*args).block_until_ready()  # JAX dispatches asynchronously


def output_check(call):
    return lambda: {"out²": sq(call())}


def variants(framework: str, quick: bool) -> list[Variant]:
    fns = functions(framework)
    out = []
    for name, op, n, rec in cases():
        if rec and framework not in TAPE:
            continue
        arrays, f = inputs(n), fns[op]
        if framework == "numpy":
            call = bind(f, *arrays)
        elif framework == "opforge":
            call = bind(f, *opforge_tensors(arrays[:1], requires_grad=rec), *opforge_tensors(arrays[1:]))
        elif framework == "opforge.compiled":
            import opforge as of

            call = bind(of.compile(f), *opforge_tensors(arrays))
        elif framework == "torch":
            call = bind(f, *torch_tensors(arrays[:1], requires_grad=rec), *torch_tensors(arrays[1:]))
        else:  # jax, jax.jit
            jax = load_jax()
            call = blocking(jax.jit(f) if framework == "jax.jit" else f, *jax_arrays(arrays))
        out.append(Variant(name, call, check=output_check(call)))
    return out
