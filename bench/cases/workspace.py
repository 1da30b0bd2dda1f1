"""8. The executor's workspace: the compiled AdamW step of examples/char_transformer.py (batch 32 × 64 characters),
with the workspace and without it. With it, a buffer an ``out=`` kernel wrote is kept for the next op or run that
needs one like it; without it, every such buffer is freed when its variable dies, and glibc hands large freed blocks
back to the OS, so each step faults them in again (issue 6: ``MALLOC_TOP_PAD_=64MB`` halved this step). Kernels
without ``out=`` allocate in both variants."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import Variant, scalar, unknown

TITLE = "8. Executor workspace: char-transformer AdamW step, compiled"
UNIT = "ms"
FRAMEWORKS = ("opforge.compiled",)
REFERENCES = ()


def step(workspace: bool):
    """A compiled training step of the example's model (fresh, seeded), prepared with or without the workspace."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import char_transformer as ct
    import numpy as np

    import opforge as of
    from opforge.program import executor

    text = ct.load_text()
    vocab = ct.Vocab(text)
    of.manual_seed(0)
    model = ct.make_model(len(vocab))
    opt = of.optim.AdamW(model.parameters(), lr=ct.LR, weight_decay=ct.WEIGHT_DECAY)
    train = of.compile(ct.make_train_step(model, opt))
    x, y = next(ct.batches(vocab.encode(text), ct.BATCH, ct.BLOCK, np.random.default_rng(0)))
    saved = executor.WORKSPACE_MIN_BYTES
    if not workspace:
        executor.WORKSPACE_MIN_BYTES = float("inf")  # read when the plan is made, at the first call
    try:
        first = scalar(train(x, y))
    finally:
        executor.WORKSPACE_MIN_BYTES = saved
    return (lambda: train(x, y)), first


def variants(framework: str, quick: bool) -> list[Variant]:
    if framework != "opforge.compiled":
        raise unknown(framework, "workspace")
    out = []
    for name, workspace in (("with the workspace", True), ("without it", False)):
        fn, first = step(workspace)
        out.append(Variant(name, fn, check=(lambda v: lambda: {"first loss": v})(first)))
    return out
