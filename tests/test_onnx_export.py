"""ONNX export: every op with a mapping, and whole models, give in ONNX Runtime what they give in opforge."""

import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import opforge as of  # noqa: E402
from opforge.core.opdef import registry  # noqa: E402
from opforge.testing.conformance import call_op, default_samples  # noqa: E402

TOLERANCE = {np.dtype("float32"): (1e-5, 1e-6), np.dtype("float64"): (1e-10, 1e-12)}


# ONNX Runtime has no float64 kernel for some ops (Conv, AveragePool, Erf, ...): a float64 model it cannot run runs in
# ONNX's reference evaluator instead. Its Erf is float32-accurate, so models with Erf are compared at float32's
# tolerance there.
FLOAT32_ACCURATE_REFERENCE = {"erf", "gelu"}


def run_onnx(model, feeds: dict) -> tuple:
    """(outputs, the runtime that gave them): ONNX Runtime, or the reference evaluator where ORT has no kernel."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        if "NOT_IMPLEMENTED" not in str(e) or not any(v.dtype == np.float64 for v in feeds.values()):
            raise
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds), "reference"
    return session.run(None, feeds), "onnxruntime"


def assert_close(got, want, what, loose=False):
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} != " \
                                                                f"{want.shape} {want.dtype}"
    rtol, atol = TOLERANCE[np.dtype("float32")] if loose else TOLERANCE.get(want.dtype, (0, 0))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def mapped_ops():
    # the library's ops only: an example imported by another test module (demo.py's isru) may have joined
    library = str(Path(of.__file__).parent)
    return sorted(op.name for op in registry if op.onnx_fn is not None and op.defined_at.startswith(library))


def _samples(opdef):
    rng = np.random.default_rng(0)
    return list(opdef.samples_fn(rng)) if opdef.samples_fn else list(default_samples(opdef, rng))


def _as(value, dtype):
    if isinstance(value, list):
        return [_as(v, dtype) for v in value]
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(dtype)
    return value


def export_sample(opdef, sample, dtype, opset=of.onnx.DEFAULT_OPSET):
    """The op on the sample's arrays, traced with every array a feed: (model, feeds, opforge's outputs)."""
    args = [_as(a, dtype) for a in sample.args]
    kwargs = {k: _as(v, dtype) for k, v in sample.kwargs.items()}
    feeds, slots = {}, []
    for i, a in enumerate(args):
        if isinstance(a, list):
            slots.append([f"a{i}_{j}" for j in range(len(a))])
            feeds.update(zip(slots[-1], a))
        elif isinstance(a, np.ndarray):
            slots.append(f"a{i}")
            feeds[f"a{i}"] = a
        else:
            slots.append(None)

    def fn(**v):
        call = [[v[n] for n in s] if isinstance(s, list) else (v[s] if s else a) for a, s in zip(args, slots)]
        result = call_op(opdef, call, kwargs)
        flat = [t for r in (result if isinstance(result, tuple) else (result,))
                for t in (r if isinstance(r, list) else [r])]
        return {f"out{k}": t for k, t in enumerate(flat)}

    program = of.trace(fn, **{n: of.Spec(a.shape, a.dtype) for n, a in feeds.items()})
    want = of.Executor(program).run(feeds)
    return of.onnx.export(program, opset=opset), feeds, [want[f"out{k}"] for k in range(len(want))]


@pytest.mark.parametrize("opset", [17, of.onnx.DEFAULT_OPSET])
@pytest.mark.parametrize("name", mapped_ops())
def test_every_mapped_op_matches_onnx_runtime(name, opset):
    opdef = registry.get(name)
    for i, sample in enumerate(_samples(opdef)):
        for dtype in ("float64", "float32"):
            try:
                model, feeds, want = export_sample(opdef, sample, dtype, opset)
            except of.onnx.OnnxExportError as e:  # a form the opset lacks is refused, naming the opset
                if opset < of.onnx.DEFAULT_OPSET and f"opset {opset}" in str(e):
                    continue
                raise
            got, runtime = run_onnx(model, feeds)
            loose = runtime == "reference" and name in FLOAT32_ACCURATE_REFERENCE
            if "random" in opdef.traits:  # other generators: only what is drawn must agree, not the draws
                for g, w in zip(got, want):
                    assert g.shape == w.shape and g.dtype == w.dtype
                continue
            for k, (g, w) in enumerate(zip(got, want)):
                assert_close(g, w, f"{name} sample {i} {dtype} output {k}", loose=loose)


IMAGES = ((None, 4, None, None), [(3, 4, 2, 4), (3, 4, 6, 2)])  # spatial sizes known only at run time
RUN_TIME_SIZES = {  # an op on sizes known only at run time (a fully convolutional net, a batch): (op, attrs, sizes)
    "adaptive_avg_pool2d": (of.ops.adaptive_avg_pool2d, {"output_size": 1}, IMAGES),  # a classifier head
    "adaptive_max_pool2d": (of.ops.adaptive_max_pool2d, {"output_size": [1, 1]}, IMAGES),
    "adaptive_max_pool3d": (of.ops.adaptive_max_pool3d, {"output_size": 1},
                            ((None, 4, None, None, 3), [(3, 4, 2, 4, 3), (1, 4, 3, 1, 3)])),
    "argwhere": (lambda x: of.ops.argwhere(x > 0), {}, ((None, None), [(3, 4), (5, 2)])),
    "masked_select": (lambda x: of.ops.masked_select(x, x > 0), {}, ((None, 3), [(3, 3), (5, 3)])),
    "interpolate nearest": (of.ops.interpolate, {"scale_factor": [2.0, 3.0]}, IMAGES),
    "interpolate nearest 3-d": (of.ops.interpolate, {"scale_factor": 2.0},
                                ((None, 4, None, None, 3), [(3, 4, 2, 4, 3), (1, 4, 3, 1, 3)])),
    "interpolate bilinear ×": (of.ops.interpolate, {"scale_factor": [1.5, 2.0], "mode": "bilinear"}, IMAGES),
    "interpolate bilinear size": (of.ops.interpolate, {"size": [5, 3], "mode": "bilinear"}, IMAGES),
    "interpolate bilinear corners": (of.ops.interpolate, {"scale_factor": 2.5, "mode": "bilinear",
                                                          "align_corners": True}, IMAGES),
    "interpolate bilinear recomputed": (of.ops.interpolate, {"scale_factor": 0.6, "mode": "bilinear",
                                                             "recompute_scale_factor": True}, IMAGES),
    "interpolate linear": (of.ops.interpolate, {"scale_factor": 1.7, "mode": "linear"},
                           ((None, 4, None), [(3, 4, 5), (1, 4, 2)])),
    "interpolate trilinear": (of.ops.interpolate, {"size": [3, 4, 2], "mode": "trilinear"},
                              ((None, 4, None, None, 3), [(3, 4, 2, 4, 3), (1, 4, 3, 1, 3)])),
    "pixel_shuffle": (of.ops.pixel_shuffle, {"upscale_factor": 2}, IMAGES),
    "pixel_unshuffle": (of.ops.pixel_unshuffle, {"downscale_factor": 2}, IMAGES),
    "unfold": (of.ops.unfold, {"kernel_size": [2, 1], "padding": 1, "stride": [1, 2]}, IMAGES),
    "fold": (of.ops.fold, {"output_size": [4, 5], "kernel_size": 2, "stride": [2, 1]}, ((None, 12, 8), [(2, 12, 8)])),
    "roll": (of.ops.roll, {"shifts": [2, -7], "axis": [0, 1]}, ((None, None), [(3, 4), (5, 2)])),
    "roll flattened": (of.ops.roll, {"shifts": [3]}, ((None, 2), [(3, 2), (1, 2)])),
    "repeat_interleave": (of.ops.repeat_interleave, {"repeats": [3], "axis": 1},
                          ((2, None, 2), [(2, 3, 2), (2, 1, 2)])),
}


@pytest.mark.parametrize("opset", [17, of.onnx.DEFAULT_OPSET])
@pytest.mark.parametrize("case", RUN_TIME_SIZES)
def test_ops_on_run_time_sizes_match_onnx_runtime_at_several_sizes(case, opset):
    fn, attrs, (spec, shapes) = RUN_TIME_SIZES[case]
    program = of.trace(lambda x: {"y": fn(x, **attrs)}, x=of.Spec(spec, "float32"))
    model = of.onnx.export(program, opset=opset)
    rng = np.random.default_rng(0)
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        (got,), _ = run_onnx(model, {"x": x})
        assert_close(got, of.Executor(program).run(x=x)["y"], f"{case} at {x.shape}")


def test_ops_refuse_what_run_time_sizes_keep_from_onnx():
    program = of.trace(lambda x: {"y": of.ops.interpolate(x, size=[3, 5], mode="bilinear")},
                       x=of.Spec((1, 2, None, None), "float64"))
    with pytest.raises(of.onnx.OnnxExportError, match=r"interpolate.*bilinear.*known only at run time"):
        of.onnx.export(program)


@pytest.mark.parametrize("op", ["dropout1d_with_mask", "dropout2d_with_mask", "dropout3d_with_mask"])
def test_channel_dropout_in_training_draws_one_mask_per_channel_in_onnx_runtime(op):
    # the draws are ONNX Runtime's own: what must agree is their layout, the scaling, and the rate (3200 channels:
    # the kept fraction's standard deviation is 0.008)
    shape = {"dropout1d_with_mask": (50, 64, 3), "dropout2d_with_mask": (50, 64, 3, 2),
             "dropout3d_with_mask": (50, 64, 2, 2, 2)}[op]
    program = of.trace(lambda x: dict(zip(("y", "mask"), getattr(of.ops, op)(x, p=0.3))),
                       x=of.Spec((None, *shape[1:]), "float32"))
    x = np.random.default_rng(0).uniform(1, 2, shape).astype(np.float32)
    (y, mask), _ = run_onnx(of.onnx.export(program), {"x": x})
    assert mask.shape == (*shape[:2], *(1,) * (len(shape) - 2)) and mask.dtype == np.bool_
    np.testing.assert_allclose(y, np.where(mask, x / np.float32(0.7), 0), rtol=1e-6)
    assert abs(mask.mean() - 0.7) < 0.05


def library_ops():
    library = str(Path(of.__file__).parent)
    return sorted(op.name for op in registry if op.defined_at.startswith(library))


def test_every_op_has_an_onnx_mapping_or_is_on_the_documented_list():
    from opforge.onnx.export import NOT_EXPORTABLE, not_exportable

    missing = [n for n in library_ops() if registry.get(n).onnx_fn is None and not not_exportable(registry.get(n))]
    assert not missing, f"ops without an ONNX mapping (give each one with @op.onnx, or say in opforge/onnx/export.py " \
                        f"NOT_EXPORTABLE and docs/onnx.md why ONNX cannot express it): {missing}"
    stale = [n for n in library_ops() if registry.get(n).onnx_fn is not None and not_exportable(registry.get(n))]
    assert not stale, f"ops with an ONNX mapping listed as not exportable: {stale}"
    documented = Path(__file__).resolve().parents[1].joinpath("docs", "onnx.md").read_text()
    listed = [n for n in NOT_EXPORTABLE if f"`{n}`" not in documented]
    assert not listed, f"ops listed as not exportable but missing from docs/onnx.md: {listed}"


@pytest.mark.parametrize("name", [n for n in library_ops() if registry.get(n).onnx_fn is None])
def test_exporting_an_op_without_an_onnx_form_says_which_and_why(name):
    from opforge.onnx.export import not_exportable

    opdef = registry.get(name)
    samples = _samples(opdef)
    if not samples:
        pytest.skip(f"{name} has no samples")
    with pytest.raises(of.onnx.OnnxExportError, match=rf"op '{name}' has no ONNX form: "
                                                      rf"{re.escape(not_exportable(opdef))}"):
        export_sample(opdef, samples[0], "float64")


def test_a_users_op_without_mapping_is_told_how_to_add_one_whatever_its_name():
    @of.op("onnx_test_scale_grad(Tensor x) -> Tensor y", traits=["elementwise"])
    def scale_grad(x):
        return x * 2

    try:  # named like a gradient op of the library, but the user's: it may have a mapping
        with pytest.raises(of.onnx.OnnxExportError, match=r"onnx_test_scale_grad.*@onnx_test_scale_grad\.onnx"):
            of.onnx.export(lambda x: {"y": scale_grad(x)}, None, of.Spec((2,), "float32"))
    finally:
        of.registry.remove("onnx_test_scale_grad")


def test_graph_where_takes_the_spec_of_its_values_not_of_its_condition():
    g = of.onnx.Graph(of.onnx.DEFAULT_OPSET, of.trace(lambda x: {"y": x}, x=of.Spec((2,), "float32")))
    condition, x = of.onnx.Value("c", of.Spec((2,), "bool")), of.onnx.Value("x", of.Spec((2,), "float32"))
    assert np.dtype(g.op("Where", condition, x, x).dtype) == np.float32


@pytest.mark.parametrize("opset", [17, of.onnx.DEFAULT_OPSET])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_over_run_time_bags_with_padding_matches_onnx_runtime(mode, opset):
    weight = np.random.default_rng(0).standard_normal((6, 3))
    program = of.trace(lambda index, offsets: {"y": of.ops.embedding_bag(index, of.tensor(weight), offsets, mode=mode,
                                                                         padding_idx=2)},
                       index=of.Spec((None,), "int64"), offsets=of.Spec((None,), "int64"))
    model = of.onnx.export(program, opset=opset)
    for index, offsets in (([0, 2, 2, 1, 2, 5], [0, 3, 3, 5]), ([2, 4], [0, 1])):  # an empty bag; only padding
        feeds = {"index": np.array(index), "offsets": np.array(offsets)}
        (got,), _ = run_onnx(model, feeds)
        assert_close(got, of.Executor(program).run(feeds)["y"], f"{mode} {feeds}")


SPECIAL_VALUES = np.array([0.0, -0.0, 1.5, -2.0, 7.0, np.inf, -np.inf, np.nan, 1e300, -1e-300])
# float ops whose mappings are compositions: IEEE's edges too
SPECIAL_BINARY = ["remainder", "floor_divide", "fmod", "atan2", "hypot", "copysign", "logaddexp", "xlogy"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", SPECIAL_BINARY)
def test_composed_binary_ops_keep_signed_zeros_infinities_and_nan_in_onnx_runtime(name, dtype):
    with np.errstate(over="ignore"):  # 1e300 is inf in float32
        x, y = (a.ravel().astype(dtype) for a in np.meshgrid(SPECIAL_VALUES, SPECIAL_VALUES))
    program = of.trace(lambda x, y: {"out": getattr(of.ops, name)(x, y)}, x=of.Spec(x.shape, dtype),
                       y=of.Spec(y.shape, dtype))
    with np.errstate(all="ignore"):  # (ONNX's reference evaluator, for float64 Atan, divides by zero too)
        want = of.Executor(program).run(x=x, y=y)["out"]
        (got,), _ = run_onnx(of.onnx.export(program), {"x": x, "y": y})
    assert_close(got, want, f"{name} {dtype}")
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]), err_msg=f"{name}: signs of zeros")


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", ["float64", "int64"])
def test_scatter_reduce_in_onnx_runtime_gives_torchs_values_for_every_reduction(dtype, include_self):
    # beyond the op's samples: without x's own values, integer means (floor division) and repeated places
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.integers(-9, 9, (4, 5)).astype(dtype)
    index = np.array([[0, 3, 3, 1, 3], [3, 0, 3, 1, 0], [0, 0, 0, 1, 3]])
    src = rng.integers(-9, 9, (3, 6)).astype(dtype)
    specs = {"x": of.Spec(x.shape, dtype), "i": of.Spec(index.shape, "int64"), "s": of.Spec(src.shape, dtype)}

    def program(reduce):
        return of.trace(lambda x, i, s: {"y": of.ops.scatter_reduce(x, 0, i, s, reduce, include_self=include_self)},
                        **specs)

    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        (got,), _ = run_onnx(of.onnx.export(program(reduce)), {"x": x, "i": index, "s": src})
        want = torch.from_numpy(x).scatter_reduce(0, torch.from_numpy(index), torch.from_numpy(src)[:, :5], reduce,
                                                  include_self=include_self).numpy()
        assert_close(got, want, f"scatter_reduce {reduce} include_self={include_self} {dtype}")
    with pytest.raises(of.onnx.OnnxExportError, match=r"scatter_reduce.*'amax'.*opset 18"):
        of.onnx.export(program("amax"), opset=17)


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("form", ["padded", "concatenated"])
def test_ctc_nll_in_onnx_runtime_gives_torchs_losses(form, zero_infinity):
    # lengths that differ per sample, an empty target, an impossible alignment (a target longer than its steps can
    # hold: inf, or 0), a repeated label (a blank between needed) and a blank other than 0
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    log_probs = torch.log_softmax(torch.from_numpy(rng.standard_normal((7, 5, 4))), -1).numpy()
    padded = np.array([[1, 1, 3], [0, 3, 1], [1, 0, 0], [3, 3, 3], [1, 3, 0]])
    input_lengths, target_lengths = np.array([7, 5, 6, 4, 7]), np.array([3, 2, 0, 3, 1])
    targets = padded if form == "padded" else np.concatenate([r[:n] for r, n in zip(padded, target_lengths)])
    program = of.trace(lambda lp, tg, il, tl: {"loss": of.ops.ctc_nll(lp, tg, il, tl, blank=2,
                                                                       zero_infinity=zero_infinity)},
                       lp=of.Spec(log_probs.shape, "float64"), tg=of.Spec(targets.shape, "int64"),
                       il=of.Spec((5,), "int64"), tl=of.Spec((5,), "int64"))
    feeds = {"lp": log_probs, "tg": targets, "il": input_lengths, "tl": target_lengths}
    (got,), _ = run_onnx(of.onnx.export(program), feeds)
    want = torch.nn.functional.ctc_loss(*(torch.from_numpy(a) for a in feeds.values()), blank=2, reduction="none",
                                        zero_infinity=zero_infinity).numpy()
    assert np.isinf(want).any() != zero_infinity  # (sample 3: 3 repeated labels need 5 steps, it has 4)
    assert_close(got, want, f"ctc_nll {form} zero_infinity={zero_infinity}")
    with pytest.raises(of.onnx.OnnxExportError, match=r"ctc_nll.*time steps .*known only at run time"):
        of.onnx.export(of.trace(lambda lp, tg, il, tl: {"loss": of.ops.ctc_nll(lp, tg, il, tl)},
                                lp=of.Spec((None, 5, 4), "float64"), tg=of.Spec(targets.shape, "int64"),
                                il=of.Spec((5,), "int64"), tl=of.Spec((5,), "int64")))
