"""Every registered op passes check_op; check_op and gradcheck catch what they are for and say where."""

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.testing import ConformanceError, GradcheckError, check_op, gradcheck, gradgradcheck

ALL_OPS = sorted(op.name for op in of.registry)  # collected at import: ops that tests define are not in it
ONCE = {"ctc_nll"}  # differentiable once, as torch's (its second derivative is refused, naming the op)


@pytest.mark.parametrize("name", ALL_OPS)
def test_every_registered_op_conforms(name):
    report = check_op(name)
    assert report.samples > 0 and not report.failures
    opdef = of.registry.get(name)
    if "no_grad" not in opdef.traits:
        assert report.order == (1 if name in ONCE else 2), f"{name} should be twice differentiable: {report}"


def test_the_suite_covers_the_seed_designs_examples():
    for name in ["identity", "scale", "minus", "smooth_l1", "smooth_l1_grad", "leaky_relu", "leaky_relu_grad",
                 "square", "sqrt", "sqrt_grad"]:
        assert name in ALL_OPS


def _define(scratch_ops, name, kernel, rule=None, infer=None, traits=("elementwise",)):
    scratch_ops.append(name)
    opdef = of.op(f"{name}(Tensor x) -> Tensor y", traits=list(traits))(kernel)
    if rule is not None:
        opdef.grad(rule)
    if infer is not None:
        opdef.infer(infer)
    return opdef


def test_check_op_catches_a_wrong_gradient(scratch_ops):
    op = _define(scratch_ops, "cube_wrong", lambda x: x ** 3, rule=lambda x, dy: dy * 2 * x * x)
    with pytest.raises(ConformanceError) as info:
        check_op(op)
    text = str(info.value)
    assert "FAIL" in text and "first derivatives" in text and "input x" in text and "worst at index" in text


def test_check_op_catches_a_wrong_second_derivative(scratch_ops):
    # The first derivative is right, but it is computed from a detached x, so its own gradient is lost.
    op = _define(scratch_ops, "cube_detached", lambda x: x ** 3, rule=lambda x, dy: dy * 3 * x.detach() ** 2)
    with pytest.raises(ConformanceError, match="second derivatives"):
        check_op(op)


def test_check_op_catches_inference_that_disagrees_with_the_kernel(scratch_ops):
    op = _define(scratch_ops, "grows", lambda x: np.concatenate([x.reshape(-1), x.reshape(-1)]),
                 rule=lambda dy: dy, traits=())
    op.infer(lambda x: x)
    op.samples(lambda rng: [of.Sample.of(rng.standard_normal((2, 3)))])
    with pytest.raises(ConformanceError, match=r"output 'y' inferred Spec\(\(2, 3\), float64\), kernel gave"):
        check_op(op)


def test_check_op_catches_a_missing_rule(scratch_ops):
    op = _define(scratch_ops, "no_grad_rule", lambda x: x * 2)
    with pytest.raises(ConformanceError, match="no gradient rule and no 'no_grad' trait"):
        check_op(op)


def test_check_op_reports_what_it_verified(scratch_ops):
    op = _define(scratch_ops, "cube", lambda x: x ** 3, rule=lambda x, dy: dy * 3 * x * x)
    report = check_op(op)
    text = str(report)
    assert text.startswith("cube: 3 sample(s), gradients checked to order 2")
    assert "inferred Specs equal the kernel's outputs" in text and "wrong calls raise errors" in text


def test_op_without_samples_or_traits_is_told_to_declare_them(scratch_ops):
    scratch_ops.append("needs_samples")

    @of.op("needs_samples(Tensor x, *, int n) -> Tensor y", traits=["elementwise"])
    def needs_samples(x, *, n):
        return x * n

    with pytest.raises(ConformanceError, match=r"@needs_samples\.samples"):
        check_op(needs_samples)


def test_gradcheck_report_names_input_error_and_place():
    def wrong(x, y):
        return F.mul(x, y) + x.detach() * y  # the second term's gradient w.r.t. x is lost

    x = of.tensor(np.array([[1.0, 2.0], [3.0, 4.0]]), requires_grad=True)
    y = of.tensor(np.array([[0.5, -1.0], [2.0, 1.0]]), requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        gradcheck(wrong, [x, y], names=["x", "y"])
    text = str(info.value)
    assert "input x (2, 2)" in text and "input y (2, 2)" in text and "worst at index (1, 0)" in text
    assert "worst at index" in text and "analytic" in text and "numeric" in text
    result = gradcheck(wrong, [x, y], names=["x", "y"], raise_exception=False)
    assert not result.ok and not result.inputs[0].ok and result.inputs[1].ok
    assert result.inputs[0].numeric == pytest.approx(2 * result.inputs[0].analytic)


def test_gradcheck_passes_and_gradgradcheck_too():
    x = of.tensor(np.array([0.3, 1.7]), requires_grad=True)
    assert gradcheck(lambda v: F.tanh(v) * v, [x]).ok
    assert gradgradcheck(lambda v: F.tanh(v) * v, [x]).ok


def test_gradcheck_refuses_float32():
    with pytest.raises(of.ArgumentError, match="need float64"):
        gradcheck(F.exp, [of.tensor([1.0], requires_grad=True)])


def test_check_op_checks_every_sbp_signature_numerically(scratch_ops):
    # a row normalisation needs whole rows: split along rows it is right, split along columns each rank would
    # normalise its own part of every row
    scratch_ops.append("row_share")
    op = of.op("row_share(Tensor x) -> Tensor y", traits=["no_grad"])(lambda x: x / x.sum(axis=1, keepdims=True))

    @op.infer
    def _(x):
        if len(x.shape) != 2:
            raise of.ShapeError(f"row_share(): x must be 2-D, got shape {x.shape}")
        return x

    op.samples(lambda rng: [of.Sample.of(rng.uniform(1, 2, (6, 4)))])
    S = of.distributed.S
    op.sbp(lambda x: [((S(0),), S(0))])
    assert "1 SBP signature(s) compute the blocks" in str(check_op(op))
    op.sbp(lambda x: [((S(0),), S(0)), ((S(1),), S(1))])
    with pytest.raises(ConformanceError, match=r"SBP signature \(S\(1\),\) -> \(S\(1\),\) .* on 2 simulated ranks: "
                                               r"output 0, put together from the ranks' S\(1\) blocks: differs"):
        check_op(op)
    # a signature that no sample splits is not taken on trust
    op.samples(lambda rng: [of.Sample.of(rng.uniform(1, 2, (6, 5)))])
    with pytest.raises(ConformanceError, match=r"\['\(S\(1\),\) -> \(S\(1\),\)'\] could not be checked on any "
                                               "sample"):
        check_op(op)
