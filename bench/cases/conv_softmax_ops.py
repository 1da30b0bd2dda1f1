"""Extra: the cases of ``bench/conv_softmax.py`` (conv2d, softmax, cross_entropy, forward + backward), run here one
framework per process like every other group. That script builds every framework's callable in one table; each
worker times only its own column, and the NumPy worker runs the script's own agreement check."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import Variant, load_torch, unknown

TITLE = "Extra: conv2d / softmax / cross_entropy forward + backward (from bench/conv_softmax.py)"
UNIT = "µs"
FRAMEWORKS = ("numpy", "opforge", "torch")
REFERENCES = ("numpy", "torch")


def variants(framework: str, quick: bool) -> list[Variant]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import conv_softmax

    if conv_softmax.torch is not None:  # it imports torch whenever it can: give it the same thread count
        load_torch()
    table, _notes = conv_softmax.cases()
    if framework not in ("numpy", "opforge", "torch"):
        raise unknown(framework, "conv_softmax")
    out = []
    for name, fns in table.items():
        if framework in fns:
            out.append(Variant(name, fns[framework]))
    if framework == "numpy" and conv_softmax.torch is not None:
        conv_softmax.check_agreement(table)  # raises if any framework's gradients differ from NumPy's
    return out
