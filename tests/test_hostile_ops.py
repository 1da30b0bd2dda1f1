"""Bad calls the issue and the op fuzzing (``test_fuzz_ops.py``) found, each pinned as a regression test."""

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.testing import gradcheck


def eager_and_traced(call, *arrays):
    """``call`` on Tensors, and traced on program variables of the same Specs."""
    yield lambda: call(*(of.tensor(a) for a in arrays))
    yield lambda: of.trace(call, *(of.Spec(a.shape, a.dtype) for a in arrays))


@pytest.mark.parametrize("name", ["zeros", "ones", "normal", "uniform", "full"])
def test_creation_ops_with_a_negative_shape_name_the_op(name):
    kwargs = {"fill_value": 1.0} if name == "full" else {}
    with pytest.raises(of.ShapeError, match=f"{name}\\(\\): argument 'shape' \\[2, -1\\] has a negative size"):
        getattr(F, name)(shape=[2, -1], **kwargs)
    with pytest.raises(of.ShapeError, match=f"{name}\\(\\): argument 'shape'"):
        of.trace(lambda x: x + getattr(F, name)(shape=[-3], **kwargs), of.Spec((3,), "float32"))


@pytest.mark.parametrize("name", ["less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
                                  "logical_and", "logical_or"])
def test_comparison_and_logical_ops_on_shapes_that_do_not_broadcast_name_the_op(name):
    for call in eager_and_traced(getattr(F, name), np.ones((2, 3)), np.ones((3, 2))):
        with pytest.raises(of.ShapeError, match=f"{name}\\(\\): shapes \\(2, 3\\) and \\(3, 2\\) do not broadcast"):
            call()


@pytest.mark.parametrize("call", [lambda: F.scale(of.tensor([1.0]), scale=10**400),
                                  lambda: F.full(shape=[2], fill_value=10**400),
                                  lambda: F.leaky_relu(of.tensor([1.0]), alpha=-(10**400)),
                                  lambda: of.trace(lambda x: F.scale(x, scale=10**400), of.Spec((2,), "float32"))])
def test_a_float_attr_given_an_int_no_float_holds_is_an_argument_error(call):
    with pytest.raises(of.ArgumentError, match="expected float, got an int too large for a float"):
        call()


def test_an_int_past_pythons_digit_limit_is_described_not_a_raw_value_error():
    with pytest.raises(of.ArgumentError, match="argument 'reduction' expected str, got int"):
        F.mse_loss(of.tensor([1.0]), of.tensor([1.0]), reduction=10**5000)


def test_a_dtype_string_numpy_half_parses_is_an_argument_error():
    with pytest.raises(of.ArgumentError, match="ones\\(\\): argument 'dtype' expected a dtype such as 'float32'"):
        F.ones(shape=[2], dtype="(-1,)f8")


def test_pow_of_an_int_base_differentiates_in_its_exponent():
    x = of.tensor(np.array([[1, 2], [3, 0]]))
    y = of.tensor(np.random.default_rng(0).standard_normal((2, 2)), requires_grad=True)
    gradcheck(lambda y: F.pow(x, y), [y])


def test_sum_to_refuses_a_shape_it_would_only_reshape_to():
    with pytest.raises(of.ShapeError, match="sum_to\\(\\): cannot sum a tensor of shape \\(3, 2\\) to shape"):
        F.sum_to(of.tensor(np.ones((3, 2))), shape=[2, 3])


def test_linear_with_an_empty_weight_has_empty_gradients():
    x = of.tensor(np.ones((4, 0)), requires_grad=True)
    w = of.tensor(np.ones((5, 0)), requires_grad=True)
    F.linear(x, w).sum().backward()
    assert x.grad.shape == (4, 0) and w.grad.shape == (5, 0)


def test_attention_differentiates_when_v_has_batch_dims_q_and_k_lack():
    rng = np.random.default_rng(0)
    q, k, v = (of.tensor(rng.standard_normal(s), requires_grad=True) for s in [(2, 3, 4), (2, 5, 4), (2, 2, 5, 2)])
    gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), [q, k, v])


@pytest.mark.parametrize("name", ["var", "std"])
def test_var_and_std_refuse_a_correction_no_float_holds(name):
    with pytest.raises(of.ArgumentError, match=f"{name}\\(\\): argument 'correction' expected float"):
        getattr(F, name)(of.tensor(np.ones(3), requires_grad=True), correction=10**400)


def test_linalg_solve_refuses_a_0d_b_when_traced():
    with pytest.raises(of.ShapeError, match="linalg_solve\\(\\): b must be a vector or a matrix"):
        of.trace(F.linalg_solve, of.Spec((3, 3), "float64"), of.Spec((), "float64"))


def test_slice_grad_refuses_a_negative_shape_when_traced():
    with pytest.raises(of.ShapeError, match="slice_grad\\(\\): argument 'shape' \\[-1\\] has a negative size"):
        of.trace(lambda dy: F.slice_grad(dy, shape=[-1], axes=[0], starts=[0], ends=[1], steps=[1]),
                 of.Spec((1,), "float64"))


def test_prelu_refuses_a_2d_weight_eagerly_as_its_shape_rule_does():
    # (a 0-d weight is one slope, as torch's: tests/test_oracle_missing2.py)
    with pytest.raises(of.ShapeError, match="prelu\\(\\): weight must have shape \\(\\), \\(1,\\) or \\(3,\\)"):
        F.prelu(of.tensor(np.ones((2, 3)), requires_grad=True), of.tensor(np.ones((1, 3)), requires_grad=True))


def test_glu_differentiates_over_an_empty_axis():
    x = of.tensor(np.ones((3, 0)), requires_grad=True)
    F.sum(F.glu(x)).backward()
    assert x.grad.shape == (3, 0)


def test_rms_norm_names_itself_in_its_shape_errors():
    with pytest.raises(of.ShapeError, match="rms_norm\\(\\): weight must have shape normalized_shape"):
        F.rms_norm(of.tensor(np.ones((2, 6))), [6], of.tensor(np.ones((2, 6))))


def test_repeat_interleave_refuses_counts_numpy_would_crash_on():
    """np.repeat(np.ones(4), 2**62) overflows NumPy's size computation and segfaults (NumPy 2.4)."""
    with pytest.raises(of.ShapeError, match="repeat_interleave\\(\\): these repeats would give 18446744073709551616"):
        F.repeat_interleave(of.tensor(np.ones((2, 2))), repeats=[2**62])


def test_round_of_ints_to_a_huge_negative_number_of_decimals_ends():
    """10 ** 2**62 as a Python int would never finish."""
    assert F.round(of.tensor(np.array([123, -5])), decimals=-(2**62)).numpy().tolist() == [0, 0]


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_linalg_svd_refuses_a_non_finite_matrix_instead_of_hanging(bad):
    """np.linalg.svd of a 3x3 matrix holding -inf never returns (NumPy 2.4 with OpenBLAS)."""
    a = np.ones((3, 3))
    a[0, 0] = -bad
    with pytest.raises(of.ArgumentError, match="linalg_svd\\(\\): a holds inf or NaN"):
        F.linalg_svd(of.tensor(a))


# -- allocations no machine can make (issue 30) ------------------------------------------------------------------

_HUGE = 10**13  # elements: tens of terabytes, refused by any machine (and by memory_ceiling first)


@pytest.mark.parametrize(("call", "name", "output"), [
    (lambda: F.zeros(shape=[_HUGE]), "zeros", f"'y' ({_HUGE},) float32: {4 * _HUGE} bytes (36.38 TiB)"),
    (lambda: of.ones(_HUGE, dtype="float64"), "ones", f"'y' ({_HUGE},) float64: {8 * _HUGE} bytes"),
    (lambda: of.arange(_HUGE), "arange", f"'y' ({_HUGE},) int64"),
    (lambda: of.randn(_HUGE), "normal", f"'y' ({_HUGE},) float32"),
    (lambda: F.tile(of.tensor([1.0, 2.0]), reps=[_HUGE]), "tile", f"'y' ({2 * _HUGE},) float32"),
    (lambda: F.one_hot(of.tensor([1, 2]), num_classes=_HUGE), "one_hot", f"'y' (2, {_HUGE}) int64"),
    (lambda: F.pad(of.tensor([1.0]), pad=[_HUGE, 0]), "pad", f"'y' ({_HUGE + 1},) float32"),
    (lambda: F.broadcast_to(of.tensor([1.0]), shape=[_HUGE]) * 2, "mul", f"'out' ({_HUGE},) float32"),
    (lambda: F.outer(of.zeros(10**7), of.zeros(10**7)), "outer", "'out' (10000000, 10000000) float32"),
])
def test_an_allocation_no_machine_can_make_is_an_out_of_memory_error_naming_the_op(call, name, output):
    from fuzzing import memory_ceiling

    with memory_ceiling(), pytest.raises(of.OutOfMemoryError) as caught:
        call()
    assert isinstance(caught.value, MemoryError) and isinstance(caught.value, of.OpforgeError)
    message = str(caught.value)
    assert message.startswith(f"{name}(): out of memory: output {output}"), message
    assert "inputs: " in message and "(MemoryError: " in message


def test_a_compiled_allocation_no_machine_can_make_names_the_op_of_the_program():
    from fuzzing import memory_ceiling

    tile = of.compile(lambda x, n: F.tile(x, reps=[n]))
    ones = of.compile(lambda x: F.sum(F.ones_like(F.broadcast_to(x, shape=[_HUGE, 2]))))  # folded at plan time
    for run, expected in [
        (lambda: tile(of.tensor([1.0, 2.0]), _HUGE),
         rf"^Executor\.run\(\): op #0 tile -> \S+: tile\(\): out of memory: output 'y' \({2 * _HUGE},\) float32"),
        (lambda: ones(of.tensor([1.0, 2.0])),
         rf"^Executor \(folding constants\): ones_like\(\): out of memory: output 'y' \({_HUGE}, 2\) float32"),
    ]:
        with memory_ceiling(), pytest.raises(of.OutOfMemoryError, match=expected):
            run()


def test_a_reshape_to_a_run_time_size_and_minus_one_leaves_the_minus_one_unknown():
    """x.view(x.size(0), -1) traced with a dynamic batch gave the Spec (None, -1): the next op read -1 as a size
    (matmul: 'contracted dims have sizes -1 and 6'). Found by the ONNX fuzzing's seed (PyTorch's flatten idiom)."""
    w = of.tensor(np.ones((6, 4), np.float32))
    prog = of.trace(lambda x: F.reshape(x, shape=[x.shape[0], -1]) @ w, x=of.Spec((None, 2, 3), "float32"))
    assert prog.block.vars[prog.block.ops[0].output_names()[0]].spec.shape == (None, None)
    x = np.arange(30, dtype=np.float32).reshape(5, 2, 3)
    np.testing.assert_array_equal(of.Executor(prog).run(x=x)["out"], x.reshape(5, 6) @ np.ones((6, 4), np.float32))


@pytest.mark.parametrize(("value", "dtype"), [(4.1317336e7, np.float32), (1e30, np.float32), (0.1, np.float64),
                                              (3.98e300, np.float64)])
def test_layer_norm_of_a_constant_row_is_zero_and_its_gradient_that_of_sigma_zero(value, dtype):
    """The mean of a constant row, rounded, is a few ulps off the value: x − μ was that remainder, σ² its square, and
    the row normalised to ±1 (4e7 in float32; torch: 0). Past the overflow of the squares (1e30 in float32) the row
    was redone on x / max|x|, where ε/s² underflows: 0·∞, NaN. Found by test_fuzz_semantics's extremes."""
    import torch

    x = of.tensor(np.full((2, 6), value, dtype), requires_grad=True)
    g = np.linspace(-1.0, 1.0, 12).reshape(2, 6).astype(dtype)
    y = F.layer_norm(x, normalized_shape=[6])
    y.backward(of.tensor(g))
    assert np.array_equal(y.numpy(), np.zeros((2, 6), dtype))
    if value < 1e19:  # (past it torch's are NaN)
        assert np.array_equal(y.numpy(), torch.nn.functional.layer_norm(torch.tensor(x.numpy()), (6,)).numpy())
    want = (g - g.mean(-1, keepdims=True)) / np.sqrt(1e-5)  # dx = r·(g − mean g) with r = 1/√ε where σ = 0
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_cross_entropy_whose_probability_ratio_overflows_is_finite():
    """−log softmax at the target was log(Σ e / e[t]): e[t] = exp(−74) is a normal float32, Σ e = exp(60), and the
    ratio overflowed to inf (torch: 134). Found by test_fuzz_semantics's extremes."""
    import torch

    logits = np.array([[-74.0, 60.0, 1.0], [0.5, -0.5, 2.0]], np.float32)
    target = np.array([0, 2])
    got = F.cross_entropy(of.tensor(logits), of.tensor(target), reduction="none").numpy()
    want = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(target), reduction="none").numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_folding_a_constant_past_any_size_names_the_op():
    """NumPy refuses a size past 2**63 bytes with a ValueError ('array is too big'), not a MemoryError: the
    executor's constant folding let it out raw. Found by the ONNX fuzzing (Tile of an EyeLike by 2**62)."""
    c = of.tensor(np.ones((2, 3)))
    c.numpy().flags.writeable = False  # a constant of the program (as the ONNX importer makes them): folded
    prog = of.trace(lambda x: x + F.sum(F.tile(c, reps=[2**62, 1])), x=of.Spec((), "float64"))
    with pytest.raises(of.OpforgeError, match=r"^Executor \(folding constants\): op tile -> \S+ failed: ValueError"):
        of.Executor(prog).run(x=np.array(1.0))


def test_planning_a_fused_group_over_more_rows_than_memory_holds_is_an_out_of_memory_error_at_the_run():
    """The plan of a fused pointwise group listed one slice per block of rows: 2**53 rows made a list no memory
    holds, a raw MemoryError while planning. Found by the ONNX fuzzing (Pad by 2**53)."""
    from fuzzing import memory_ceiling

    prog = of.trace(lambda x: F.tanh(F.pad(x, pad=[0, 0, 0, 2**53]) * 2.0) + 1.0, x=of.Spec((2, 3), "float32"))
    with memory_ceiling(), pytest.raises(of.OutOfMemoryError, match=r"^Executor\.run\(\): op #\d+ pad"):
        of.Executor(prog).run(x=np.ones((2, 3), np.float32))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_leaky_relu_with_a_nan_slope_keeps_the_positive_values_as_torch(dtype):
    """max(x, α·x) with α NaN was NaN everywhere; torch (and ONNX Runtime's LeakyRelu) keep x where x > 0. Found by
    the ONNX fuzzing against onnxruntime (an attribute set to NaN)."""
    import torch

    x = np.array([1.0, -2.0, 3.0, 0.0], dtype)
    want = torch.nn.functional.leaky_relu(torch.tensor(x), float("nan")).numpy()
    np.testing.assert_array_equal(F.leaky_relu(of.tensor(x), alpha=float("nan")).numpy(), want)
    prog = of.trace(lambda x: F.leaky_relu(x * 1.0, alpha=float("nan")) + 0.0, x=of.Spec(x.shape, x.dtype))
    np.testing.assert_array_equal(of.Executor(prog).run(x=x)["out"], want)  # fused
