"""Defining an op: the signature parser, kernels and dispatch, binding and attr checks, inference, of.ops."""

import inspect
import threading

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.core.schema import parse_signature

FULL = ('name(Tensor x, Tensor? bias, Tensor[] xs, *, int axis=-1, float alpha=0.01, bool keepdim=False, '
        'str mode="sum", int[] dims=[], dtype dtype=None) -> (Tensor y, Tensor idx)')


# -- signatures ----------------------------------------------------------------------------------------------


def test_full_signature_parses_into_a_schema():
    s = parse_signature(FULL)
    assert s.name == "name"
    assert [p.name for p in s.inputs] == ["x", "bias", "xs"]
    assert [(p.type, p.is_list, p.optional) for p in s.inputs] == [
        ("Tensor", False, False), ("Tensor", False, True), ("Tensor", True, False)]
    attrs = {p.name: p for p in s.attrs}
    assert attrs["axis"].default == -1 and attrs["alpha"].default == 0.01 and attrs["keepdim"].default is False
    assert attrs["mode"].default == "sum" and attrs["dims"].default == () and attrs["dtype"].default is None
    assert all(p.keyword_only for p in s.attrs)
    assert [o.name for o in s.outputs] == ["y", "idx"]
    assert parse_signature(str(s)) == s  # the text form parses back to the same schema


def test_signature_marks_dtypes_and_non_differentiable_inputs():
    s = parse_signature("gather(Tensor<floating> x, nograd Tensor<int32|int64> index) -> Tensor y")
    x, index = s.inputs
    assert x.dtypes == (of.float16, of.bfloat16, of.float32, of.float64) and x.differentiable
    assert index.dtypes == (of.int32, of.int64) and not index.differentiable


def test_an_attr_may_take_a_string_too():
    s = parse_signature('pad2(Tensor x, *, int[]|str padding=[0], float|str? gain=None) -> Tensor y')
    padding, gain = s.attrs
    assert padding.is_list and padding.or_str and gain.or_str and gain.optional
    assert str(s) == 'pad2(Tensor x, *, int[]|str padding=[0], float|str? gain=None) -> Tensor y'
    assert parse_signature(str(s)) == s
    from opforge.core.schema import check_attr
    assert check_attr(padding, "same", "pad2") == "same" and check_attr(padding, 2, "pad2") == (2,)
    with pytest.raises(of.ArgumentError, match=r"pad2\(\): argument 'padding' expected int\[\]\|str, got float"):
        check_attr(padding, 1.5, "pad2")
    with pytest.raises(of.SchemaError, match="expected 'str'"):
        parse_signature("bad(Tensor x, *, int|float a) -> Tensor y")


@pytest.mark.parametrize("text, message, column", [
    ("foo(Tensor x, = 3) -> Tensor y", "expected a type", 14),
    ("foo(Tensr x) -> Tensor y", "unknown type 'Tensr'", 4),
    ("foo(Tensor<int33> x) -> Tensor y", "unknown dtype 'int33'", 11),
    ("foo(int a=1.5) -> Tensor y", "default of 'a'", 10),
    ("foo(Tensor x) Tensor y", "expected '->'", 14),
    ("foo(Tensor x, Tensor x) -> Tensor y", "given twice", 21),
    ("foo(Tensor x, int a=1, Tensor y) -> Tensor z", "without a default", 30),
    ("foo(Tensor x) -> Tensor y $", "unexpected character", 26),
])
def test_parse_errors_point_at_the_offending_text(text, message, column):
    with pytest.raises(of.SchemaError) as info:
        parse_signature(text)
    lines = str(info.value).splitlines()
    assert message in lines[0]
    assert lines[1].strip() == text
    assert lines[2].index("^") - 2 == column  # the caret sits under the fault


def test_duplicate_op_names_are_refused_unless_replaced(scratch_ops):
    scratch_ops.append("dup_op")

    @of.op("dup_op(Tensor x) -> Tensor y", traits=["elementwise", "no_grad"])
    def first(x):
        return x + 1

    with pytest.raises(of.SchemaError, match="already defined"):
        @of.op("dup_op(Tensor x) -> Tensor y", traits=["elementwise", "no_grad"])
        def second(x):
            return x + 2

    @of.op("dup_op(Tensor x) -> Tensor y", traits=["elementwise", "no_grad"], replace=True)
    def third(x):
        return x + 3

    assert F.dup_op(of.tensor([1.0])).item() == 4.0


def test_kernel_must_take_the_schema_arguments():
    with pytest.raises(of.SchemaError, match="must take the inputs"):
        @of.op("bad_kernel(Tensor x, *, float a) -> Tensor y", traits=["elementwise"])
        def bad_kernel(x, b):
            return x


def test_gradient_rule_parameters_must_name_something():
    with pytest.raises(of.SchemaError, match="parameter 'z' is none of"):
        @F.exp.opdef.grad
        def _(z):
            return z


def test_unknown_traits_are_refused():
    with pytest.raises(of.SchemaError, match="unknown trait"):
        @of.op("odd(Tensor x) -> Tensor y", traits=["elementwize"])
        def odd(x):
            return x


# -- residuals: what a kernel saves for its gradient rule ------------------------------------------------------


def _define_cube(scratch_ops, seen: list):
    """cube(x) = x³, whose kernel saves x² for the rule (3·x²·dy); ``seen`` logs each kernel call's save= and
    each rule call's residual."""
    scratch_ops.append("cube_saving")

    @of.op("cube_saving(Tensor<floating> x) -> Tensor y", traits=["elementwise"], saves=("square",))
    def cube(x, save=None):
        seen.append(("kernel", save is not None))
        square = x * x
        if save is not None:
            save["square"] = square
        return square * x

    @cube.grad
    def _(x, dy, square):
        seen.append(("rule", square is not None))
        return dy * 3 * (square if square is not None else x * x)

    return F.cube_saving


def test_a_recorded_call_keeps_what_its_kernel_saved_for_a_first_order_backward(scratch_ops):
    seen = []
    cube = _define_cube(scratch_ops, seen)
    x0 = np.array([1.0, -2.0, 0.5])
    x = of.tensor(x0, requires_grad=True)
    y = cube(x)
    assert seen == [("kernel", True)] and set(y._node.residuals) == {"square"}
    (g,) = of.grad(F.sum(y), [x], retain_graph=True)
    (again,) = of.grad(F.sum(y), [x])  # kept with the graph: a second backward pass reads it again
    np.testing.assert_allclose(g.numpy(), 3 * x0 ** 2)
    np.testing.assert_array_equal(again.numpy(), g.numpy())
    assert y._node.residuals is None  # freed with the graph
    assert [s for s in seen if s[0] == "rule"] == [("rule", True), ("rule", True)]
    for _ in range(3):  # replayed on arrays from the second call on: the residual is read there too
        (h,) = of.grad(F.sum(cube(x)), [x])
        np.testing.assert_array_equal(h.numpy(), g.numpy())


def test_residuals_are_not_made_unrecorded_nor_used_where_the_backward_is_differentiated_or_compiled(scratch_ops):
    seen = []
    cube = _define_cube(scratch_ops, seen)
    x0 = np.array([1.0, -2.0, 0.5])
    cube(of.tensor(x0))
    with of.no_grad():
        cube(of.tensor(x0, requires_grad=True))
    assert seen == [("kernel", False), ("kernel", False)]
    seen.clear()
    x = of.tensor(x0, requires_grad=True)
    (g,) = of.grad(F.sum(cube(x)), [x], create_graph=True)  # the rule computes from x, so g has a history
    (gg,) = of.grad(F.sum(g), [x])
    np.testing.assert_allclose(gg.numpy(), 6 * x0)
    assert ("rule", True) not in seen
    seen.clear()
    step = of.compile(lambda x: of.grad(F.sum(cube(x)), [x])[0])
    np.testing.assert_allclose(step(of.tensor(x0)).numpy(), 3 * x0 ** 2)
    assert ("rule", True) not in seen and ("kernel", True) not in seen


def test_saves_must_be_new_names_and_every_kernel_must_take_save(scratch_ops):
    with pytest.raises(of.SchemaError, match="must be new names"):
        @of.op("saves_clash(Tensor x) -> Tensor y", traits=["elementwise"], saves=("x",))
        def clash(x, save=None):
            return x
    with pytest.raises(of.SchemaError, match="must take save="):
        @of.op("saves_no_kw(Tensor x) -> Tensor y", traits=["elementwise"], saves=("s",))
        def no_kw(x):
            return x
    assert "saves_clash" not in of.registry and "saves_no_kw" not in of.registry


# -- kernels and dispatch ------------------------------------------------------------------------------------


def test_dispatch_picks_the_kernel_by_device_and_dtype(scratch_ops):
    scratch_ops.append("which_kernel")
    of.register_device("sim")

    @of.op("which_kernel(Tensor x) -> Tensor y", traits=["elementwise", "no_grad"])
    def which_kernel(x):
        return np.full_like(x, 0)

    @which_kernel.kernel(dtypes=["float64"])
    def _(x):
        return np.full_like(x, 1)

    @which_kernel.kernel(device="sim", dtypes=["float32"])
    def _(x):
        return np.full_like(x, 2)

    assert F.which_kernel(of.tensor([1.0])).item() == 0  # float32 on cpu: the default kernel
    assert F.which_kernel(of.tensor(np.array([1.0]))).item() == 1  # float64 on cpu
    assert F.which_kernel(of.tensor([1.0], device="sim")).item() == 2
    with pytest.raises(of.DispatchError) as info:
        F.which_kernel(of.tensor(np.array([1.0]), device="sim"))
    text = str(info.value)
    assert "which_kernel" in text and "'sim'" in text and "float64" in text
    assert "sim/float32" in text and "cpu/any dtype" in text and "cpu/float64" in text


def test_inputs_on_different_devices_are_refused():
    of.register_device("sim")
    with pytest.raises(of.ArgumentError, match="different devices"):
        F.add(of.tensor([1.0]), of.tensor([1.0], device="sim"))


def test_restricted_dtype_is_refused_at_the_call():
    with pytest.raises(of.ArgumentError) as info:
        F.sqrt(of.tensor([1, 2]))
    assert str(info.value) == "sqrt(): argument 'x' expected dtype float16 or bfloat16 or float32 or float64, got int64"


# -- binding and attributes ----------------------------------------------------------------------------------


def test_calls_bind_exactly_as_the_schema_says():
    x = of.tensor([-1.0, 2.0])
    assert F.leaky_relu(x).numpy().tolist() == pytest.approx([-0.01, 2.0])
    assert F.leaky_relu(x=x, alpha=0.5).numpy().tolist() == [-0.5, 2.0]
    assert F.leaky_relu(x, 0.5).numpy().tolist() == [-0.5, 2.0]  # positional, as torch's negative_slope
    assert F.leaky_relu(x, negative_slope=0.5).numpy().tolist() == [-0.5, 2.0]  # torch's name: a second spelling
    with pytest.raises(TypeError, match="gelu\\(\\) takes 1 positional argument"):
        F.gelu(x, "tanh")  # after '*' in the signature: keyword-only (as torch's approximate=)
    with pytest.raises(TypeError, match="leaky_relu\\(\\) got an unexpected keyword argument 'beta'"):
        F.leaky_relu(x, beta=0.5)
    with pytest.raises(TypeError, match="leaky_relu\\(\\) missing 1 required positional argument: 'x'"):
        F.leaky_relu()


@pytest.mark.parametrize("call, message", [
    (lambda x: F.leaky_relu(x, alpha="big"), "leaky_relu(): argument 'alpha' expected float, got str 'big'"),
    (lambda x: F.leaky_relu(x, alpha=True), "leaky_relu(): argument 'alpha' expected float, got bool True"),
    (lambda x: F.sum(x, axis=1.5), "sum(): argument 'axis' expected int[]?, got float 1.5"),
    (lambda x: F.sum(x, keepdim=1), "sum(): argument 'keepdim' expected bool, got int 1"),
    (lambda x: F.cast(x, dtype="complex64"), "cast(): argument 'dtype': dtype complex64 is not supported"),
    (lambda x: F.reshape(x, shape=["a"]), "reshape(): argument 'shape' expected int[], got list ['a']"),
    (lambda x: F.add(x, "text"), "add(): argument 'y' expected Tensor, got str 'text'"),
    (lambda x: F.smooth_l1(x, sigma=0.0), "smooth_l1(): argument 'sigma' must be > 0, got 0.0"),
])
def test_bad_arguments_name_the_op_the_argument_what_was_expected_and_what_came(call, message):
    with pytest.raises(of.ArgumentError) as info:
        call(of.tensor([1.0, 2.0]))
    assert str(info.value).startswith(message)


def test_attrs_are_normalised():
    x = of.tensor(np.ones((2, 3, 4)))
    assert F.sum(x, axis=np.int64(1)).shape == (2, 4)  # a NumPy integer is an int; one int is a list of one
    assert F.transpose(x, perm=np.array([2, 0, 1])).shape == (4, 2, 3)
    assert F.leaky_relu(of.tensor([-2.0]), alpha=1).item() == -2.0  # an int is a fine float


def test_shape_errors_are_raised_by_the_op_not_deep_in_numpy():
    with pytest.raises(of.ShapeError, match=r"matmul\(\): shapes \(2, 3\) and \(4, 5\) do not fit"):
        F.matmul(of.ones(2, 3), of.ones(4, 5))
    with pytest.raises(of.ShapeError, match=r"sum\(\): axis 3 is out of range for a tensor of rank 2"):
        F.sum(of.ones(2, 3), axis=3)
    with pytest.raises(of.ShapeError, match=r"add\(\): shapes \(2, 3\) and \(4,\) do not broadcast"):
        F.add(of.ones(2, 3), of.ones(4))


# -- inference -----------------------------------------------------------------------------------------------


def test_trait_inference_with_unknown_dims():
    spec = of.Spec
    add, exp, matmul = F.add.opdef, F.exp.opdef, F.matmul.opdef
    assert exp.infer_specs([spec((None, 3), of.float32)], {}) == (spec((None, 3), of.float32),)
    (out,) = add.infer_specs([spec((None, 1), of.float32), spec((4,), of.float64)], {})
    assert out == spec((None, 4), of.float64)
    (out,) = matmul.infer_specs([spec((None, 5), of.float32), spec((5, 2), of.float32)], {})
    assert out == spec((None, 2), of.float32)


@pytest.mark.parametrize("a, b, expected", [
    ("bool", "int32", "int32"), ("int32", "int64", "int64"), ("int32", "float32", "float32"),
    ("int64", "float32", "float32"), ("float32", "float64", "float64"), ("bool", "float32", "float32"),
])
def test_broadcast_promotes_dtypes_by_torchs_rules(a, b, expected):
    (out,) = F.add.opdef.infer_specs([of.Spec((2,), np.dtype(a)), of.Spec((2,), np.dtype(b))], {})
    assert out.dtype == np.dtype(expected)
    real = F.add(of.tensor(np.ones(2, a)), of.tensor(np.ones(2, b)))
    assert real.dtype == np.dtype(expected)


def test_an_op_without_a_shape_rule_says_so(scratch_ops):
    scratch_ops.append("no_rule")

    @of.op("no_rule(Tensor x) -> Tensor y")
    def no_rule(x):
        return x

    with pytest.raises(of.SchemaError, match=r"op 'no_rule' .* has no shape/dtype rule.*@no_rule\.infer"):
        F.no_rule(of.tensor([1.0]))

    @no_rule.infer
    def _(x):
        return x

    assert F.no_rule(of.tensor([1.0])).item() == 1.0


# -- the functional API --------------------------------------------------------------------------------------


def test_user_op_appears_in_of_ops_with_signature_and_docstring(scratch_ops):
    scratch_ops.append("softsign_test")

    @of.op("softsign_test(Tensor x, *, float k=1.0) -> Tensor y", traits=["elementwise"])
    def softsign_test(x, *, k):
        """x / (k + |x|)."""
        return x / (k + np.abs(x))

    assert F.softsign_test is softsign_test.fn
    sig = inspect.signature(F.softsign_test)
    assert list(sig.parameters) == ["x", "k"]
    assert sig.parameters["k"].kind is inspect.Parameter.KEYWORD_ONLY and sig.parameters["k"].default == 1.0
    assert F.softsign_test.__doc__.startswith("softsign_test(Tensor x, *, float k=1.0) -> Tensor y")
    assert "x / (k + |x|)." in F.softsign_test.__doc__
    assert softsign_test(of.tensor([1.0]), k=3.0).item() == 0.25  # the OpDef is callable too
    of.registry.remove("softsign_test")
    assert not hasattr(F, "softsign_test")


def test_every_library_op_has_a_real_signature():
    for opdef in of.registry:
        params = inspect.signature(opdef.fn).parameters
        assert list(params) == [p.name for p in opdef.schema.params] + \
            [p.alias for p in opdef.schema.params if p.alias]  # second spellings (dim= for axis=) by keyword


def test_grad_mode_is_per_thread():
    seen = {}

    def worker():
        seen["enabled"] = of.is_grad_enabled()

    with of.no_grad():
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert not of.is_grad_enabled()
    assert seen["enabled"] is True and of.is_grad_enabled()
