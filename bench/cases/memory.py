"""6. Peak resident memory (``ru_maxrss``) of a fresh process: after importing the framework alone, and after 20 SGD
steps of the MLP of case 3 at batch 512. Nothing but the standard library is imported before the framework, so
"import" is the interpreter plus that framework (and whatever it pulls in, NumPy included)."""

from __future__ import annotations

import importlib
import resource

TITLE = "6. Peak resident memory (ru_maxrss of a fresh process)"
UNIT = "MB"
FRAMEWORKS = ("numpy", "opforge", "opforge.compiled", "torch", "jax", "jax.jit")
REFERENCES = ("numpy", "torch")

STEPS = 20
BATCH = 512
IMPORTS = {"numpy": ["numpy"], "opforge": ["opforge"], "torch": ["torch"], "jax": ["jax", "jax.numpy"]}


def max_rss() -> int:
    """Peak resident set size of this process so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(framework: str, quick: bool) -> dict:
    bare = max_rss()
    for name in IMPORTS[framework.split(".")[0]]:
        importlib.import_module(name)
    after_import = max_rss()
    from . import mlp
    from .common import scalar

    step, _ = mlp.build(framework, BATCH)
    losses = [scalar(step()) for _ in range(STEPS)]
    return {"cases": {"after import": after_import, f"after {STEPS} MLP steps, batch {BATCH}": max_rss()},
            "bare interpreter": bare, "checks": {"loss at step 20": losses[-1]}}
