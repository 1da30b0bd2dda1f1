"""A brand-new op in a dozen lines: isru(x) = x / √(1 + x²), the inverse square root unit, a smooth, tanh-like
activation (the library has no such op: softsign, tanh and the like are its own).

One definition gives argument checking, shape inference, eager autograd to any order and a
conformance check (run this file to see it: ``python examples/custom_op.py``).
"""

import numpy as np

import opforge as of
from opforge import ops as F


@of.op("isru(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
def isru(x):
    """y = x / √(1 + x²)."""                   # the CPU kernel: NumPy in, NumPy out
    return x / np.sqrt(1 + x * x)


@isru.grad
def _(x, dy):                                  # needs x and dy only, so y is not kept alive for backward
    r = F.rsqrt(1 + F.square(x))               # written with ops, so it can be differentiated again
    return dy * r * r * r                      # (1 + x²)^(−3/2)


@isru.onnx
def _(g, x):                                   # its ONNX mapping, for of.onnx.export: four ONNX ops
    return g.op("Div", x, g.op("Sqrt", g.op("Add", g.scalar(1, x), g.op("Mul", x, x))))


@isru.samples
def _(rng):                                    # the calls check_op tries
    yield of.Sample.of(rng.uniform(-3.0, 3.0, (3, 4)))
    yield of.Sample.of(np.array(-0.7))


if __name__ == "__main__":
    print(of.testing.check_op(isru))
