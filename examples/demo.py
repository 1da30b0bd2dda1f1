"""opforge in one minute: define an op (examples/custom_op.py), check it, differentiate it twice, train with it.

Run with ``make demo`` (or ``python examples/demo.py``). Exits non-zero if training does not work.
"""

import sys
import time
from itertools import pairwise

import numpy as np
from custom_op import softsign  # a new op, defined in a dozen lines next to this file

import opforge as of
from opforge import ops as F


def section(title):
    print(f"\n== {title} " + "=" * (100 - len(title)))


start = time.perf_counter()
of.manual_seed(0)

section("1. check_op: the conformance suite every op goes through, run on softsign")
print(of.testing.check_op(softsign))

section("2. Higher-order gradients: softsign''(x) from its gradient rule, differentiated again")
x0, h = 0.5, 1e-4
x = of.tensor(x0, dtype="float64", requires_grad=True)
(d1,) = of.grad(softsign(x), [x], create_graph=True)   # d1 is itself recorded...
(d2,) = of.grad(d1, [x])                                # ...so it can be differentiated again
f = [softsign(of.tensor(v, dtype="float64")).item() for v in (x0 - h, x0, x0 + h)]
fd = (f[0] - 2 * f[1] + f[2]) / h**2                     # central second difference of the op's values
print(f"softsign'({x0})  = {d1.item():+.6f}    exact 1/(1+|x|)^2 = {1 / (1 + x0) ** 2:+.6f}")
print(f"softsign''({x0}) = {d2.item():+.6f}    finite difference = {fd:+.6f}")
second_ok = abs(d2.item() - fd) < 1e-5

section("3. Training: a 1-16-16-1 softsign MLP fits sin(3x) on [-1, 1] by plain gradient descent")
xs = np.linspace(-1, 1, 64).reshape(-1, 1)
X, Y = of.tensor(xs), of.tensor(np.sin(3 * xs))          # float64, shape (64, 1)
params = []                                               # [W1, b1, W2, b2, W3, b3], leaves that require grad
for n_in, n_out in pairwise([1, 16, 16, 1]):
    W = of.randn(n_in, n_out, dtype="float64") * np.sqrt(2 / n_in)    # from the generator of.manual_seed set
    params += [W.requires_grad_(), of.zeros(n_out, dtype="float64", requires_grad=True)]


def mlp(params, x):
    *hidden, (W, b) = zip(params[0::2], params[1::2])    # (W, b) per layer
    for Wh, bh in hidden:
        x = softsign(x @ Wh + bh)
    return x @ W + b


lr, steps = 0.3, 4000
losses = []
for step in range(steps + 1):
    loss = F.mean(F.square(mlp(params, X) - Y))
    grads = of.grad(loss, params)
    with of.no_grad():                                    # the update is not recorded: new leaves
        params = [(w - lr * g).requires_grad_() for w, g in zip(params, grads)]
    losses.append(loss.item())
    if step % 500 == 0:
        print(f"step {step:5d}   mse {losses[-1]:.6f}")

section("Summary")
factor = losses[0] / losses[-1]
print(f"mse {losses[0]:.4f} -> {losses[-1]:.6f}  ({factor:.0f}x lower) in {steps} steps;"
      f" second derivative {'matches' if second_ok else 'DOES NOT MATCH'} finite differences;"
      f" {time.perf_counter() - start:.1f} s")
if factor < 20 or not second_ok:
    sys.exit("FAILED: the loss did not go down by 20x, or the second derivative is wrong")
