"""A brand-new op in a dozen lines: softsign(x) = x / (1 + |x|), a smooth, tanh-like activation.

One definition gives argument checking, shape inference, eager autograd to any order and a
conformance check (run this file to see it: ``python examples/custom_op.py``).
"""

import numpy as np

import opforge as of
from opforge import ops as F


@of.op("softsign(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
def softsign(x):
    """y = x / (1 + |x|)."""                  # the CPU kernel: NumPy in, NumPy out
    return x / (1 + np.abs(x))


@softsign.grad
def _(x, dy):                                  # needs x and dy only, so y is not kept alive for backward
    return dy / F.square(1 + F.abs(x))         # written with ops, so it can be differentiated again


@softsign.onnx
def _(g, x):                                   # its ONNX mapping, for of.onnx.export: ONNX has this one
    return g.op("Softsign", x)


@softsign.samples
def _(rng):                                    # the calls check_op tries (|x| ≥ 0.1: f'' jumps at 0)
    x = rng.uniform(0.1, 3.0, (3, 4)) * rng.choice([-1, 1], (3, 4))
    yield of.Sample.of(x)
    yield of.Sample.of(np.array(-0.7))


if __name__ == "__main__":
    print(of.testing.check_op(softsign))
