"""Shapes known only at run time: the idioms PyTorch's exporter writes with dynamic axes (``x.size(0)`` → Shape →
Gather → Concat → Reshape/Expand/Range/ConstantOfShape/Slice/Pad/Tile …) import, run at other sizes than the
export's and match torch, values and gradients: eagerly (``load_module``), in a program traced with unknown dims
(one plan per feed shape, the shapes computed from shapes when the plan is made) and through ``onnx.load``."""

import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

import opforge as of  # noqa: E402

nn = torch.nn
tF = torch.nn.functional


class Flatten(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1)


class Heads(nn.Module):  # a heads split, (B, L, D) -> (B, heads, L, D / heads), and x.reshape(B, -1, H)
    def forward(self, x):
        b = x.size(0)
        return x.reshape(b, x.size(1), 2, -1).transpose(1, 2).reshape(b, -1, 2) * 2


class Positions(nn.Module):
    def forward(self, x):
        return x + torch.arange(x.size(1)).to(x.dtype)[None, :, None]


class Zeros(nn.Module):
    def forward(self, x):
        return torch.cat([x, x.new_zeros(x.size(0), 3), torch.zeros(x.size(0), 2)], 1)


class ClsToken(nn.Module):
    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 4))

    def forward(self, x):
        return torch.cat([self.cls.expand(x.size(0), -1, -1), x], 1)


class HalfSlice(nn.Module):
    def forward(self, x):
        return x[:, : x.size(1) // 2] * 3


class PadByComputedCount(nn.Module):  # pads the last dim by half its size
    def forward(self, x):
        return tF.pad(x, (1, x.size(-1) // 2)) + 1


class RepeatCount(nn.Module):
    def forward(self, x):
        return x.repeat(1, x.size(0), 1)


class LengthMask(nn.Module):
    def forward(self, x, lengths):
        mask = torch.arange(x.size(1))[None] < lengths[:, None]
        return x * mask[..., None].to(x.dtype)


class CausalMask(nn.Module):
    def forward(self, x):
        n = x.size(1)
        scores = x @ x.transpose(1, 2)
        mask = torch.triu(torch.ones(n, n), diagonal=1).bool()
        return torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ x


class ScaledAttention(nn.Module):
    def forward(self, x):
        return torch.softmax(x @ x.transpose(1, 2) / x.size(-1) ** 0.5, -1) @ x


class CatOnes(nn.Module):
    def forward(self, x):
        return torch.cat([x, x.new_ones(x.size(0), 1)], 1) * 2


class MeanOverCount(nn.Module):
    def forward(self, x):
        return x.sum(1) / x.size(1)


# (module, input shapes at export, the same at run, dynamic axes per input); an int64 input is lengths. Export and
# run sizes differ, so that a size the import would have fixed at the export's shows.
BLD = {0: "b", 1: "l", 2: "d"}
IDIOMS = {
    "flatten": (Flatten, [(2, 3, 4)], [(5, 3, 4)], [{0: "b"}]),
    "heads": (Heads, [(2, 3, 4)], [(3, 5, 4)], [{0: "b", 1: "l"}]),
    "positions": (Positions, [(2, 3, 4)], [(3, 5, 4)], [{0: "b", 1: "l"}]),
    "zeros": (Zeros, [(2, 4)], [(5, 4)], [{0: "b"}]),
    "cls_token": (ClsToken, [(2, 3, 4)], [(5, 6, 4)], [{0: "b", 1: "l"}]),
    "half_slice": (HalfSlice, [(2, 6, 3)], [(3, 9, 3)], [{0: "b", 1: "l"}]),
    "pad": (PadByComputedCount, [(2, 3, 5)], [(3, 2, 7)], [BLD]),
    "repeat": (RepeatCount, [(2, 3, 4)], [(3, 2, 4)], [BLD]),
    "length_mask": (LengthMask, [(2, 4, 3), (2,)], [(3, 6, 3), (3,)], [{0: "b", 1: "l"}, {0: "b"}]),
    "causal_mask": (CausalMask, [(2, 4, 3)], [(3, 6, 3)], [{0: "b", 1: "l"}]),
    "scaled_attention": (ScaledAttention, [(2, 4, 3)], [(3, 5, 6)], [BLD]),
    "cat_ones": (CatOnes, [(2, 4)], [(5, 4)], [{0: "b"}]),
    "mean_over_count": (MeanOverCount, [(2, 4, 3)], [(3, 7, 3)], [{0: "b", 1: "l"}]),
}


def _inputs(shapes, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, shapes[0][1] + 1, s).astype(np.int64) if i and len(s) == 1 else
            rng.standard_normal(s) for i, s in enumerate(shapes)]


def _torch_export(*args, **kwargs):
    """torch.onnx.export with dynamo=False (TorchScript's exporter, opset 17); its notes on its own legacy exporter
    and constant folding are not ours to show."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(*args, dynamo=False, opset_version=17, **kwargs)


def dynamo_export(module, example, dynamic: list, **kwargs):
    """The ModelProto torch.onnx.export(dynamo=True) writes (torch.export's graph, onnxscript's decompositions, opset
    18+ as torch chooses), with the dims ``dynamic`` lists per input left for torch.export to find symbolic (a
    ``Dim.DYNAMIC`` each). Its logs and warnings are torch's own."""
    pytest.importorskip("onnxscript")
    shapes = tuple({d: torch.export.Dim.DYNAMIC for d in axes} for axes in dynamic)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, example, dynamo=True, dynamic_shapes=shapes, verbose=False,
                                    report=False, **kwargs)
    return program.model_proto


EXPORTERS = ["torchscript", "dynamo"]
_EXPORTS: dict = {}  # (idiom, exporter) -> (module, model bytes): the dynamo exporter takes seconds a model


def _export(name, exporter="torchscript"):
    if (name, exporter) in _EXPORTS:
        return _EXPORTS[name, exporter]
    cls, shapes, _, axes = IDIOMS[name]
    torch.manual_seed(0)
    module = cls().double().eval()  # float64 throughout: values and gradients to 1e-10
    names = [f"in{i}" for i in range(len(shapes))]
    example = tuple(torch.tensor(a) for a in _inputs(shapes, 0))
    if exporter == "dynamo":
        proto = dynamo_export(module, example, axes, input_names=names, output_names=["y"]).SerializeToString()
    else:
        f = io.BytesIO()
        _torch_export(module, example, f, input_names=names, output_names=["y"],
                      dynamic_axes={n: a for n, a in zip(names, axes)} | {"y": {0: "b"}})
        proto = f.getvalue()
    _EXPORTS[name, exporter] = module, proto
    return module, proto


def _torch_run(module, arrays, weight):
    xs = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    params = list(module.parameters())
    y = module(*xs)
    (y * torch.tensor(weight)).sum().backward()
    return y.detach().numpy(), [x.grad.numpy() for x in xs if x.grad is not None], [p.grad.numpy() for p in params]


# torch's exporter writes x.size(-1) ** 0.5 as Cast(to=float32) → Pow: the model itself rounds the scale to float32
# (ONNX Runtime gives the same), so it matches torch to float32's precision only, and ONNX Runtime to 1e-10.
TOLERANCE = {"scaled_attention": (1e-6, 1e-7)}


def _backward_of(net, weight):
    def step(*inputs):
        y = net(*inputs)
        (y * of.tensor(weight)).sum().backward()
        return y

    return step


def _weighted_sum(net, weight):
    def loss(**inputs):
        y = net(*inputs.values())
        return {"y": y, "loss": (y * of.tensor(weight)).sum()}

    return loss


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(IDIOMS))
def test_dynamic_shape_idioms_match_torch(name, exporter):
    ort = pytest.importorskip("onnxruntime")
    module, proto = _export(name, exporter)
    rtol, atol = TOLERANCE.get(name, (1e-10, 1e-12))
    session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
    floats = [i for i, s in enumerate(IDIOMS[name][1]) if not (i and len(s) == 1)]
    program = of.onnx.load(proto)
    assert any(d is None for d in program.block.vars["in0"].spec.shape)  # the dynamic axes stay unknown
    net = of.onnx.load_module(proto)
    exe = of.Executor(program)
    for shapes in (IDIOMS[name][2], IDIOMS[name][1]):  # another size than the export's, then the export's
        arrays = _inputs(shapes, 1)
        with torch.no_grad():
            shape = module(*[torch.tensor(a) for a in arrays]).shape
        weight = np.random.default_rng(2).standard_normal(tuple(shape))
        module.zero_grad()
        want, want_dx, want_dp = _torch_run(module, arrays, weight)
        # onnx.load: the program the model is
        feed = {f"in{i}": a for i, a in enumerate(arrays)}
        got = exe.run(feed)["y"]
        np.testing.assert_allclose(got, session.run(None, feed)[0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
        # eagerly
        xs = [of.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
        net.zero_grad()
        y = net(*xs)
        (y * of.tensor(weight)).sum().backward()
        np.testing.assert_allclose(y.numpy(), got, rtol=1e-12, atol=1e-14)
        for i, g in zip(floats, want_dx):
            np.testing.assert_allclose(xs[i].grad.numpy(), g, rtol=rtol, atol=atol)
        for p, g in zip(net.parameters(), want_dp):
            np.testing.assert_allclose(p.grad.numpy(), g, rtol=rtol, atol=atol)
        # of.compile (a program per input shape) means what eager code means
        xs = [of.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
        net.zero_grad()
        y = of.compile(_backward_of(net, weight))(*xs)
        np.testing.assert_allclose(y.numpy(), got, rtol=1e-12, atol=1e-14)
        for i, g in zip(floats, want_dx):
            np.testing.assert_allclose(xs[i].grad.numpy(), g, rtol=rtol, atol=atol)
        for p, g in zip(net.parameters(), want_dp):
            np.testing.assert_allclose(p.grad.numpy(), g, rtol=rtol, atol=atol)
        # a program traced with the dynamic dims unknown, differentiated by append_backward
        specs = {f"in{i}": of.Spec(tuple(None if d in IDIOMS[name][3][i] else s for d, s in enumerate(shape)),
                                   a.dtype) for i, (shape, a) in enumerate(zip(shapes, arrays))}

        traced = of.trace(_weighted_sum(net, weight), **specs)
        grads = of.append_backward(traced, traced.outputs["loss"], wrt=[f"in{i}" for i in floats])
        out = of.Executor(traced).run(feed)
        np.testing.assert_allclose(out["y"], got, rtol=1e-12, atol=1e-14)
        for i, g in zip(floats, want_dx):
            np.testing.assert_allclose(out[f"in{i}@GRAD"], g, rtol=rtol, atol=atol)
        assert set(grads) >= {f"in{i}@GRAD" for i in floats}


@pytest.mark.parametrize("name", ["flatten", "heads", "zeros", "cls_token", "repeat", "causal_mask",
                                  "scaled_attention", "cat_ones", "mean_over_count", "positions", "half_slice", "pad",
                                  "length_mask"])
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_an_imported_program_with_computed_sizes_exports_again(name, exporter):
    ort = pytest.importorskip("onnxruntime")
    _, proto = _export(name, exporter)
    program = of.onnx.load(proto)
    # the sizes it computes from shapes are computed in the model too: it runs at another size than the export's
    again = ort.InferenceSession(of.onnx.export(program, None).SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {f"in{i}": a for i, a in enumerate(_inputs(IDIOMS[name][2], 3))}
    want = ort.InferenceSession(proto, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(again.run(None, feed)[0], want, rtol=1e-10, atol=1e-12)


class ReflectPad(nn.Module):
    def forward(self, x):
        return tF.pad(x, (1, 2, 0, 1), mode="reflect")


def test_torch_pad_chains_fold_at_import_within_the_constant_limit():
    torch.manual_seed(0)
    module = ReflectPad().double()
    f = io.BytesIO()
    _torch_export(module, (torch.randn(2, 3, 5, dtype=torch.float64),), f, input_names=["x"], output_names=["y"],
                  dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
    proto = onnx.load_from_string(f.getvalue())
    chain = [n.op_type for n in proto.graph.node if n.op_type != "Constant"]
    assert chain == ["ConstantOfShape", "Concat", "Reshape", "Slice", "Transpose", "Reshape", "Cast", "Pad"]
    program = of.onnx.load(proto)
    assert [op.type for op in program.block.ops] == ["pad"]  # the pads were computed at import
    x = np.random.default_rng(0).standard_normal((4, 3, 5))
    np.testing.assert_allclose(of.Executor(program).run(x=x)["y"], module(torch.tensor(x)).numpy(), rtol=1e-12)
    # what the chain computes counts against max_constant_bytes, checked before it is made
    with pytest.raises(of.onnx.OnnxImportError, match="max_constant_bytes"):
        of.onnx.load(proto, max_constant_bytes=8)


def _half_program():
    """x[:, :x.size(1) // 2] in a program whose dims are unknown: the end is computed from x's shape."""
    from opforge import ops as F
    from opforge.core.spec import Elem

    def half(x):
        end = F.floor_divide(F.shape_as_tensor(x), 2)
        return {"y": F.slice(x, axes=[1], starts=[0], ends=[Elem(end.name, 1)], steps=[1]) * 3.0}

    return of.trace(half, x=of.Spec((None, None), "float64"))


def test_a_program_computing_sizes_from_shapes_runs_saves_and_differentiates(tmp_path):
    program = _half_program()
    of.append_backward(program, program.outputs["y"], wrt=["x"])  # (of a non-scalar: dy is ones)
    path = tmp_path / "half.json"
    program.save(path)
    again = of.Program.load(path)
    assert str(again) == str(program)  # the computed size is kept as such, not read as a dim of a shape
    for shape in ((2, 5), (3, 8), (1, 1)):
        x = np.random.default_rng(0).standard_normal(shape)
        xt = torch.tensor(x, requires_grad=True)
        want = xt[:, : xt.size(1) // 2] * 3.0
        want.sum().backward()
        for p in (program, again):
            out = of.Executor(p).run(x=x)
            np.testing.assert_array_equal(out["y"], want.detach().numpy())
            np.testing.assert_array_equal(out["x@GRAD"], xt.grad.numpy())


def test_a_size_read_from_the_values_of_a_feed_is_refused_naming_it():
    from opforge import ops as F
    from opforge.core.spec import Elem

    def bad(x, n):
        return {"y": F.slice(x, axes=[0], starts=[0], ends=[Elem(F.abs(n).name, 0)], steps=[1])}

    program = of.trace(bad, x=of.Spec((None,), "float64"), n=of.Spec((1,), "int64"))
    with pytest.raises(of.ShapeError, match=r"'n'.*not on shapes alone"):
        of.Executor(program).run(x=np.ones(4), n=np.array([2]))


SLICES = {"x[:, 1:]": lambda x: x[:, 1:], "x[:, :-1]": lambda x: x[:, :-1], "x[:, ::-1]": lambda x: x[:, ::-1],
          "x[:, -3:-1]": lambda x: x[:, -3:-1], "x[:, 0]": lambda x: x[:, 0], "x[:, -1]": lambda x: x[:, -1],
          "x[:, 4:0:-2]": lambda x: x[:, 4:0:-2], "x[:, :-9]": lambda x: x[:, :-9],
          "x[:, -1:-9:-1]": lambda x: x[:, -1:-9:-1], "x[None, ..., 2:]": lambda x: x[None, ..., 2:],
          # bounds computed from sizes known at run time: + - * // % on x.shape[i] are ops of the program
          "x[:, :x.shape[1] // 2]": lambda x: x[:, : x.shape[1] // 2],
          "x[:, x.shape[1] // 2:]": lambda x: x[:, x.shape[1] // 2:],
          "x[:, :x.shape[1] - x.shape[0]]": lambda x: x[:, : x.shape[1] - x.shape[0]],
          "x[:, :-x.shape[0]]": lambda x: x[:, : -x.shape[0]],
          "x[:x.shape[0] % 2 + 1, ::-1]": lambda x: x[: x.shape[0] % 2 + 1, ::-1],
          "x.reshape(x.shape[0] * x.shape[1])": lambda x: x.reshape(x.shape[0] * x.shape[1])}


@pytest.mark.parametrize("name", list(SLICES))
def test_slicing_dims_known_only_at_run_time_in_a_program(name):  # as NumPy slices (torch has no negative steps)
    index = SLICES[name]
    program = of.trace(lambda x: {"y": index(x)}, x=of.Spec((None, None), "float64"))
    of.append_backward(program, program.outputs["y"], wrt=["x"])
    exe = of.Executor(program)
    for shape in ((2, 5), (3, 1), (1, 7)):
        x = np.random.default_rng(0).standard_normal(shape)
        grad = np.zeros(shape)
        index(grad)[...] = 1.0  # d sum(x[index]) / dx: 1 where the index reads (NumPy: basic indexing is a view)
        out = exe.run(x=x)
        np.testing.assert_array_equal(out["y"], index(x))
        np.testing.assert_array_equal(out["x@GRAD"], grad)


@pytest.mark.parametrize("f", [lambda x: x[: int(x.shape[0])], lambda x: x / x.shape[0] ** 0.5,
                               lambda x: x * (x.shape[0] / 2), lambda x: x[:2] if x.shape[0] > 2 else x])
def test_a_size_known_at_run_time_is_no_python_number_in_a_program(f):
    with pytest.raises(of.ShapeError, match=r"x.shape\[0\] is only known at run time.*\+, -, \*, // and %"):
        of.trace(lambda x: {"y": f(x)}, x=of.Spec((None,), "float64"))


SIZES_AS_NUMBERS = {"x.sum(1) / x.shape[1]": lambda x: x.sum(1) / x.shape[1],
                    "x.shape[1] * x - x.shape[0]": lambda x: x.shape[1] * x - x.shape[0],
                    "x / (x.shape[0] * x.shape[1] // 2 + 1)": lambda x: x / (x.shape[0] * x.shape[1] // 2 + 1)}


@pytest.mark.parametrize("name", list(SIZES_AS_NUMBERS))
@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_sizes_known_at_run_time_as_numbers_in_a_program_match_torch(name, dtype):
    f = SIZES_AS_NUMBERS[name]
    program = of.trace(lambda x: {"y": f(x)}, x=of.Spec((None, None), dtype))
    if dtype == "float64":
        of.append_backward(program, program.outputs["y"], wrt=["x"])
    exe = of.Executor(program)
    for shape in ((2, 5), (3, 1), (4, 7)):
        x = (np.random.default_rng(0).standard_normal(shape) * 10).astype(dtype)
        xt = torch.tensor(x, requires_grad=dtype == "float64")
        want = f(xt)  # (torch takes x.shape[i] as a Python int: its dtype is x's where x's category holds it)
        out = exe.run(x=x)
        assert out["y"].dtype == np.dtype(str(want.dtype).removeprefix("torch."))
        np.testing.assert_allclose(out["y"], want.detach().numpy(), rtol=1e-12)
        if dtype == "float64":
            want.sum().backward()
            np.testing.assert_allclose(out["x@GRAD"], xt.grad.numpy(), rtol=1e-12)


def test_arange_of_a_size_known_at_run_time_in_a_program_and_its_export():
    ort = pytest.importorskip("onnxruntime")

    def f(x, lengths):  # positions, and a mask of the first lengths[i] positions, as torch code writes them
        positions = x + of.arange(x.shape[1]).to(x.dtype)[None, :]
        mask = of.arange(x.shape[1])[None] < lengths[:, None]
        return {"y": positions * mask.to(x.dtype), "mask": mask}

    program = of.trace(f, x=of.Spec((None, None), "float64"), lengths=of.Spec((None,), "int64"))
    of.append_backward(program, program.outputs["y"], wrt=["x"])
    session = ort.InferenceSession(of.onnx.export(program, None).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    exe = of.Executor(program)
    for shape in ((2, 5), (3, 1), (1, 7)):
        rng = np.random.default_rng(0)
        x, lengths = rng.standard_normal(shape), rng.integers(0, shape[1] + 1, shape[0])
        xt = torch.tensor(x, requires_grad=True)
        mask = torch.arange(xt.size(1))[None] < torch.tensor(lengths)[:, None]
        want = (xt + torch.arange(xt.size(1)).to(xt.dtype)[None, :]) * mask.to(xt.dtype)
        want.sum().backward()
        out = exe.run(x=x, lengths=lengths)
        np.testing.assert_array_equal(out["mask"], mask.numpy())
        np.testing.assert_allclose(out["y"], want.detach().numpy(), rtol=1e-15)
        np.testing.assert_allclose(out["x@GRAD"], xt.grad.numpy(), rtol=1e-15)
        y, m = session.run(["y", "mask"], {"x": x, "lengths": lengths})
        np.testing.assert_allclose(y, out["y"], rtol=1e-15)
        np.testing.assert_array_equal(m, out["mask"])


def test_computed_shapes_keep_onnx_meanings_of_0_in_reshape_and_1_in_expand():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    def ints(name, values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [  # n = x.shape[1] // 2; Reshape(x, [0, n, -1]) keeps dim 0; Expand(w, [1, n, 1]) keeps w's dims
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["d1"], axis=0),
        helper.make_node("Div", ["d1", "two"], ["n"]),
        helper.make_node("Concat", ["zero", "n", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Concat", ["one_v", "n", "one_v"], ["eshape"], axis=0),
        helper.make_node("Expand", ["w", "eshape"], ["e"]),
        helper.make_node("Mul", ["r", "e"], ["y"]),
    ]
    inits = [ints("one", 1), ints("two", [2]), ints("zero", [0]), ints("minus_one", [-1]), ints("one_v", [1]),
             numpy_helper.from_array(np.full((1, 1, 1), 1.5), "w")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["b", "l"])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    exe = of.Executor(of.onnx.load(model))
    for shape in ((2, 8), (3, 4), (1, 6)):
        x = np.random.default_rng(0).standard_normal(shape)
        np.testing.assert_array_equal(exe.run(x=x)["y"], session.run(None, {"x": x})[0])
