"""PyTorch as the oracle for the normalisation ops of opforge/ops/normalization.py that test_oracle_nn.py does not
cover (layer_norm and batch_norm stay there): rms_norm, group_norm, instance_norm and their shared backward,
normalize_grad. Values, first and second derivatives in float64, through the runners of test_torch_oracle.py;
absent optional inputs (None) are bound here, and normalize_grad's two outputs are compared one at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from test_torch_oracle import OPFORGE as OPFORGE_FW
from test_torch_oracle import TORCH as TORCH_FW
from test_torch_oracle import check_forward, check_hvp, check_vjp, directional_derivative, randn, uniform

import opforge as of
from opforge import Sample
from opforge import ops as F
from opforge.testing import call_op

TF = torch.nn.functional


def _ones_for_missing_weight(weight, bias, shape, like):
    """torch's double backward fails with a bias but no weight: a weight of ones is the same function."""
    return torch.ones(shape, dtype=like.dtype) if weight is None and bias is not None else weight


def torch_normalize_grad(x, g, axes, eps, center):
    """(dx, x̂): torch's VJP of x ↦ x̂ (the normalisation over ``axes``) for the cotangent g, with create_graph."""
    x = x if x.requires_grad else x.detach().requires_grad_()
    xc = x - x.mean(dim=axes, keepdim=True) if center else x
    xhat = xc / torch.sqrt((xc * xc).mean(dim=axes, keepdim=True) + eps)
    (dx,) = torch.autograd.grad(xhat, x, g, create_graph=True)
    return dx, xhat


def torch_group_norm(x, weight, bias, num_groups, eps):
    return TF.group_norm(x, num_groups, _ones_for_missing_weight(weight, bias, x.shape[1], x), bias, eps)


def torch_instance_norm(x, weight, bias, eps):
    return TF.instance_norm(x, weight=_ones_for_missing_weight(weight, bias, x.shape[1], x), bias=bias, eps=eps)


@dataclass(frozen=True)
class Oracle:
    torch_fn: Callable
    extra: tuple = ()
    outputs: int = 1


ORACLE: dict[str, Oracle] = {
    "normalize_grad": Oracle(torch_normalize_grad, outputs=2, extra=(
        Sample.of(randn(2, 3, 4) * 5 + 3, randn(2, 3, 4), axes=[1, 2], eps=1e-5),
        Sample.of(randn(4, 3), randn(4, 3), axes=[0], eps=0.0, center=False),
    )),
    "rms_norm": Oracle(lambda x, w, normalized_shape, eps: TF.rms_norm(x, normalized_shape, w, eps), extra=(
        Sample.of(randn(3, 5) * 10, uniform(0.5, 2, 5), normalized_shape=[5], eps=1e-3),
        Sample.of(randn(2, 2, 3), None, normalized_shape=[2, 3]),  # eps: float64's machine epsilon
    )),
    "group_norm": Oracle(torch_group_norm, extra=(
        Sample.of(randn(2, 6, 3, 2) * 4 + 1, randn(6), randn(6), num_groups=2, eps=1e-3),
        Sample.of(randn(3, 4, 5), None, None, num_groups=4),
        Sample.of(randn(2, 4), randn(4), randn(4), num_groups=2),
    )),
    "instance_norm_affine": Oracle(torch_instance_norm, extra=(
        Sample.of(randn(2, 3, 4, 2) * 3 - 1, randn(3), randn(3), eps=1e-3),
        Sample.of(randn(1, 2, 3, 2, 2), None, randn(2)),
    )),
}


def _declared_samples(name: str) -> list:
    return list(of.registry.get(name).samples_fn(np.random.default_rng(0)))


def _bind(name: str, sample: Sample, output: int):
    """(opforge fn, torch fn, arrays): present tensors positionally, absent ones (None) put back, attrs bound
    (torch gets the signature's defaults too), one output compared."""
    opdef = of.registry.get(name)
    attrs = {**{p.name: p.default for p in opdef.attrs if p.has_default}, **sample.kwargs}
    given = [*sample.args, *[None] * (len(opdef.inputs) - len(sample.args))]
    present = [i for i, a in enumerate(given) if a is not None]
    several = ORACLE[name].outputs > 1

    def call(fn, kwargs):
        def bound(*xs):
            args = list(given)
            for i, x in zip(present, xs):
                args[i] = x
            out = call_op(opdef, args, kwargs) if fn is opdef.fn else fn(*args, **kwargs)
            return out[output] if several else out

        return bound

    return call(getattr(F, name), sample.kwargs), call(ORACLE[name].torch_fn, attrs), [given[i] for i in present]


CASES = [pytest.param(name, case, k, id=f"{name}-{i}.out{k}")
         for name, oracle in ORACLE.items()
         for i, case in enumerate([*_declared_samples(name), *oracle.extra])
         for k in range(oracle.outputs)]


@pytest.mark.parametrize(("name", "sample", "output"), CASES)
def test_forward(name, sample, output):
    check_forward(*_bind(name, sample, output))


@pytest.mark.parametrize(("name", "sample", "output"), CASES)
def test_vjp(name, sample, output):
    check_vjp(*_bind(name, sample, output))


@pytest.mark.parametrize(("name", "sample", "output"), CASES)
def test_hvp(name, sample, output):
    check_hvp(*_bind(name, sample, output))


def test_table_covers_the_normalisation_ops():
    ours = {op.name for op in of.registry
            if op.defined_at.replace("\\", "/").split(":")[0].endswith("normalization.py")}
    assert ours - {"layer_norm", "batch_norm_with_stats"} <= set(ORACLE)  # those two: test_oracle_nn.py


def _torch_normalized(x, axes, center=True, eps=1e-5):
    """The normalisation written with torch's elementary ops, which torch differentiates to any order."""
    xc = x - x.mean(dim=axes, keepdim=True) if center else x
    return xc / torch.sqrt((xc * xc).mean(dim=axes, keepdim=True) + eps)


@pytest.mark.parametrize(("of_fn", "torch_fn"), [
    pytest.param(lambda x: F.layer_norm(x, normalized_shape=[4]), lambda x: _torch_normalized(x, [2]),
                 id="layer_norm"),
    pytest.param(lambda x: F.rms_norm(x, normalized_shape=[4], eps=1e-5),
                 lambda x: _torch_normalized(x, [2], center=False), id="rms_norm"),
    pytest.param(lambda x: F.group_norm(x, num_groups=1), lambda x: _torch_normalized(x, [1, 2]), id="group_norm"),
    pytest.param(lambda x: F.instance_norm(x), lambda x: _torch_normalized(x, [2]), id="instance_norm"),
])
def test_third_derivative(of_fn, torch_fn):
    # op -> normalize_grad -> its rule (normalize_grad again, and ops) -> differentiated once more. torch's own
    # layer_norm and instance_norm are not the oracle here: their third derivatives disagree with central differences
    # of their second (by ~6 on this input), while the same formula written with torch's elementary ops agrees.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4))
    cotangents = [rng.standard_normal((2, 3, 4)) for _ in range(3)]
    for order in (1, 2, 3):
        got = directional_derivative(OPFORGE_FW, of_fn, x, cotangents[:order])
        want = directional_derivative(TORCH_FW, torch_fn, x, cotangents[:order])
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9, err_msg=f"derivative of order {order}")


def test_backward_is_one_normalize_grad():
    # The dedicated op carries the whole backward pass of x: a program's backward holds it, and no statistics ops.
    prog = of.trace(lambda x: {"loss": F.sum(F.layer_norm(x, normalized_shape=[4]) * 2.0)},
                    x=of.Spec((None, 4), "float64"))
    of.append_backward(prog, prog.outputs["loss"], wrt=["x"])
    types = [op.type for op in prog.block.ops]
    assert "normalize_grad" in types and "mean" not in types, types


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.group_norm(of.zeros((2, 6)), num_groups=4), r"group_norm\(\): 6 channels .* do not split"),
    (lambda: F.group_norm(of.zeros(6), num_groups=2), r"group_norm\(\): the input must be \(N, C, \.\.\.\)"),
    (lambda: F.group_norm(of.zeros((2, 6)), 2, of.zeros(3)), r"weight must have shape \(6,\)"),
    (lambda: F.group_norm(of.zeros((2, 6)), num_groups=0), r"argument 'num_groups' must be >= 1"),
    (lambda: F.instance_norm(of.zeros((2, 3))), r"instance_norm\(\): the input must be \(N, C, L, \.\.\.\)"),
    (lambda: F.rms_norm(of.zeros((2, 3)), normalized_shape=[2]), r"normalized_shape \[2\] must be the last dims"),
    (lambda: F.rms_norm(of.zeros((2, 3)), normalized_shape=[3], eps=-1.0), r"argument 'eps' must be >= 0"),
    (lambda: F.normalize_grad(of.zeros((2, 3)), of.zeros(3), axes=[1], eps=0.0), r"g must have the shape of x"),
])
def test_wrong_calls_name_the_op(call, message):
    with pytest.raises(of.OpforgeError, match=message):
        call()
