"""ONNX's node tests (``onnx.backend.test``) run through our importer and Executor, counted per ONNX op; the table in
docs/onnx.md is ``render()``'s output, and a test checks it is fresh (``python -m opforge.onnx.conformance`` prints
it). Imports ``onnx``."""

from __future__ import annotations

import re
import sys

import numpy as np

from ..core.errors import OpforgeError
from .importers import IMPORTERS
from .types import _DTYPES

# Node tests of ops we import that fail, and why. The test suite runs every other selected node test through ONNX's
# own harness and checks that these still fail (docs/onnx.md lists them).
KNOWN_FAILING = {
    **{f"test_{k}": "AveragePool with dilations (avg_pool has none, as PyTorch's)" for k in (
        "averagepool_2d_dilations", "averagepool_3d_dilations_small",
        *(f"averagepool_3d_dilations_large_count_include_pad_is_{a}_ceil_mode_is_{b}"
          for a in (0, 1) for b in ("False", "True")))},
    "test_maxpool_with_argmax_2d_precomputed_pads": "MaxPool's Indices output",
    "test_maxpool_with_argmax_2d_precomputed_strides": "MaxPool's Indices output",
    "test_batchnorm_epsilon_training_mode": "BatchNormalization in training mode",
    "test_batchnorm_example_training_mode": "BatchNormalization in training mode",
    **{f"test_training_dropout{k}": "random draws: opforge's generator draws other numbers than the reference's"
       for k in ("", "_default", "_default_mask", "_mask")},
    **{f"test_range_{k}_expanded": "the expansion uses Loop (control flow)" for k in (
        "float_type_positive_delta", "int32_type_negative_delta", "float16_type_positive_delta",
        "bfloat16_type_positive_delta")},
    "test_celu_bfloat16_expanded": "values differ beyond the tolerance (bfloat16 rounding in the expansion's steps; "
                                   "not investigated further)",
    "test_reduce_max_empty_set": "reducing an empty group (amax refuses: no value)",
    "test_reduce_max_empty_set_bool": "reducing an empty group (amax refuses: no value)",
    "test_reduce_min_empty_set": "reducing an empty group (amin refuses: no value)",
    **{f"test_scatter_elements_with_reduction_{k}": f"ScatterElements reduction='{k}'" for k in ("max", "min", "mul")},
}


# The model tests shipped in the onnx wheel (PyTorch-exported models and small "simple" graphs): the ones that fail,
# by a pattern of their names, and why.
MODEL_KINDS = ("pytorch-converted", "pytorch-operator", "simple")
KNOWN_FAILING_MODELS = {
    r"sequence_model": "sequences (SequenceConstruct, SplitToSequence, ...)",
    r"strnorm": "strings",
    r"gradient_of": "the preview training domain's Gradient op",
    r"test_shrink": "Shrink",
}


def model_cases() -> list:
    """(kind, test name, directory) of every model test on disk in the onnx wheel."""
    import os

    import onnx.backend.test

    root = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data")
    return [(kind, name, os.path.join(root, kind, name)) for kind in MODEL_KINDS
            for name in sorted(os.listdir(os.path.join(root, kind)))
            if os.path.exists(os.path.join(root, kind, name, "model.onnx"))]


def model_failure(name: str) -> str | None:
    return next((why for pattern, why in KNOWN_FAILING_MODELS.items() if re.search(pattern, name)), None)


def run_model_case(directory: str) -> tuple[str, str]:
    """("pass" | "fail", message) for one model test, compared as ONNX's harness compares."""
    import glob
    import os

    import onnx
    from onnx import numpy_helper

    from .backend import OpforgeBackend

    try:
        rep = OpforgeBackend.prepare(onnx.load(os.path.join(directory, "model.onnx")))
        for data in sorted(glob.glob(os.path.join(directory, "test_data_set_*"))):
            def read(kind, data=data):
                return [numpy_helper.to_array(onnx.load_tensor(f))
                        for f in sorted(glob.glob(os.path.join(data, f"{kind}_*.pb")))]

            got, expected = rep.run(read("input")), read("output")
            for g, e in zip(got, expected):
                if g.shape != e.shape or not np.allclose(g, e, rtol=1e-3, atol=1e-7, equal_nan=True):
                    return "fail", "values differ"
    except OpforgeError as e:
        return "fail", f"{type(e).__name__}: {e}"
    except Exception as e:
        return "fail", f"raw {type(e).__name__}: {e}"
    return "pass", ""


def node_cases() -> list:
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # ONNX's case generators overflow on purpose
        warnings.simplefilter("ignore")
        return sorted(load_model_tests(kind="node"), key=lambda c: c.name)


def op_types(cases) -> dict:
    """Test name -> the ONNX op it tests (an ``_expanded`` test counts for the op it expands)."""
    single = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    out = {}
    for c in cases:
        base = re.sub(r"_expanded(_ver\d+)?$", "", c.name)
        out[c.name] = single.get(base) or single.get(c.name) or (
            c.model.graph.node[-1].op_type if c.model.graph.node else "?")
    return out


def _types_in(model) -> set:
    graph = model.graph
    types = {vi.type.tensor_type.elem_type for vi in [*graph.input, *graph.output] if vi.type.HasField("tensor_type")}
    types |= {t.data_type for t in graph.initializer}
    return types


def applicable(case) -> str | None:
    """None when opforge can run the case at all; else why not (a type opforge does not have, a non-tensor)."""
    graph = case.model.graph
    if any(not vi.type.HasField("tensor_type") for vi in [*graph.input, *graph.output]):
        return "sequences or optionals"
    missing = _types_in(case.model) - set(_DTYPES)
    if missing:
        from onnx import TensorProto

        return "element types " + ", ".join(sorted(TensorProto.DataType.Name(t).lower() for t in missing))
    return None


def selected(cases=None) -> list:
    """The node tests of the ONNX ops opforge imports, whose types opforge has: what the test suite runs."""
    cases = node_cases() if cases is None else cases
    ops = op_types(cases)
    return [c for c in cases if ops[c.name] in IMPORTERS and applicable(c) is None]


def run_case(case) -> tuple[str, str]:
    """("pass" | "fail", message) for one node test, compared as ONNX's harness compares."""
    from onnx import numpy_helper

    from .backend import OpforgeBackend

    def array(v):
        return numpy_helper.to_array(v) if hasattr(v, "data_type") else np.asarray(v)

    try:
        rep = OpforgeBackend.prepare(case.model)
        for inputs, expected in case.data_sets:
            got = rep.run([array(v) for v in inputs])
            expected = [array(v) for v in expected]
            if len(got) != len(expected):
                return "fail", f"{len(got)} outputs, expected {len(expected)}"
            for g, e in zip(got, expected):
                if g.shape != e.shape or g.dtype != e.dtype:
                    return "fail", f"output {g.dtype}{list(g.shape)}, expected {e.dtype}{list(e.shape)}"
                if not np.allclose(g, e, rtol=case.rtol, atol=case.atol, equal_nan=True):
                    return "fail", "values differ"
    except OpforgeError as e:
        return "fail", f"{type(e).__name__}: {e}"
    except Exception as e:  # a raw exception is a bug of ours: reported as such
        return "fail", f"raw {type(e).__name__}: {e}"
    return "pass", ""


def results(cases=None) -> dict:
    """ONNX op -> {"passed": [...], "failed": {name: message}} over the selected node tests."""
    cases = node_cases() if cases is None else cases
    ops = op_types(cases)
    out: dict = {}
    for case in selected(cases):
        status, message = run_case(case)
        entry = out.setdefault(ops[case.name], {"passed": [], "failed": {}})
        if status == "pass":
            entry["passed"].append(case.name)
        else:
            entry["failed"][case.name] = message
    return out


def render(cases=None) -> str:
    """The conformance section of docs/onnx.md."""
    import onnx

    cases = node_cases() if cases is None else cases
    ops = op_types(cases)
    table = results(cases)
    run = sum(len(e["passed"]) + len(e["failed"]) for e in table.values())
    passed = sum(len(e["passed"]) for e in table.values())
    skipped: dict = {}
    for c in cases:
        if ops[c.name] in IMPORTERS:
            why = applicable(c)
            if why is not None:
                skipped[ops[c.name]] = skipped.get(ops[c.name], 0) + 1
    lines = [f"ONNX {onnx.__version__} node tests of the {len(IMPORTERS)} ONNX ops opforge imports: **{passed} of "
             f"{run} pass**. Not run: the tests of those ops whose inputs or outputs have an element type opforge "
             f"lacks (uint8, int8, float8, strings, ...): {sum(skipped.values())}.", "",
             "| ONNX op | passed / run | not run (types) | failing |", "|---|---|---|---|"]
    for op in sorted(IMPORTERS):
        e = table.get(op, {"passed": [], "failed": {}})
        total = len(e["passed"]) + len(e["failed"])
        failing = "; ".join(f"`{n[5:]}` ({KNOWN_FAILING.get(n, 'unexpected')})" for n in sorted(e["failed"]))
        lines.append(f"| {op} | {len(e['passed'])} / {total} | {skipped.get(op, 0) or ''} | {failing} |")
    models = [(kind, name, run_model_case(d)[0]) for kind, name, d in model_cases()]
    lines += ["", "| model tests in the onnx wheel | passed / run | failing |", "|---|---|---|"]
    for kind in MODEL_KINDS:
        mine = [(name, status) for k, name, status in models if k == kind]
        failing = "; ".join(f"`{name[5:]}` ({model_failure(name) or 'unexpected'})" for name, status in mine
                            if status != "pass")
        lines.append(f"| {kind} | {sum(s == 'pass' for _, s in mine)} / {len(mine)} | {failing} |")
    names = sorted({o for o in ops.values()} - set(IMPORTERS))
    lines += ["", f"ONNX ops with node tests that opforge does not import ({len(names)}):", "",
              ", ".join(names) + "."]
    return "\n".join(lines) + "\n"


def write(path="docs/onnx.md") -> None:
    """Replace the table between the conformance markers of ``path`` by a fresh one."""
    from pathlib import Path

    begin, end = "<!-- conformance: begin -->", "<!-- conformance: end -->"
    text = Path(path).read_text()
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    Path(path).write_text(f"{head}{begin}\n{render()}{end}{tail}")


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    else:
        sys.stdout.write(render())
