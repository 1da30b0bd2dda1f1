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
    **{f"test_training_dropout{k}": "random draws: opforge's generator draws other numbers than the reference's"
       for k in ("", "_default", "_default_mask", "_mask")},
    "test_celu_bfloat16_expanded": "values differ beyond the tolerance (bfloat16 rounding in the expansion's steps; "
                                   "not investigated further)",
    **{f"test_affine_grid_{k}_expanded": "the expansion computes the grid's sizes from the values of its `size` "
                                         "input, a graph input: program mode reads such sizes from shapes only"
       for k in ("2d", "2d_align_corners", "3d", "3d_align_corners")},
    "test_col2im_5d": "Col2Im of a 3-d image (fold is 2-d, as PyTorch's)",
    **{f"test_attention_{k}_expanded": "values differ beyond the tolerance: the expansion rounds each step in "
                                         "float16 or bfloat16" for k in (
        "3d_causal_bf16", "4d_attn_mask_causal_bf16", "4d_causal_bf16", "4d_causal_fp16", "4d_causal_padded_kv_bf16",
        "4d_padded_kv_bf16")},
    **{f"test_attention_{k}": "values differ beyond the tolerance: ONNX's reference rounds each step in float16 or "
                              "bfloat16, ours softmaxes more precisely (ONNX Runtime fails these too)" for k in (
        "3d_causal_bf16", "4d_attn_mask_causal_bf16", "4d_causal_bf16", "4d_causal_fp16", "4d_causal_padded_kv_bf16",
        "4d_padded_kv_bf16")},
}


# The model tests shipped in the onnx wheel (PyTorch-exported models and small "simple" graphs): the ones that fail,
# by a pattern of their names, and why.
MODEL_KINDS = ("pytorch-converted", "pytorch-operator", "simple")
KNOWN_FAILING_MODELS = {
    r"sequence_model8": "SplitToSequence of a dim known only at run time (a sequence's length is known at load)",
    r"strnorm": "strings",
    r"gradient_of": "the preview training domain's Gradient op",
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


def _array(v):
    """A node test's value as NumPy: a tensor, or a list of them (a sequence), or None (an empty optional)."""
    from onnx import numpy_helper

    if isinstance(v, list):
        return [_array(x) for x in v]
    return numpy_helper.to_array(v) if hasattr(v, "data_type") else v if v is None else np.asarray(v)


def _differs(g, e, case) -> str | None:
    """Why output ``g`` is not ``e`` as ONNX's harness compares them (shape, dtype, then values within the case's
    rtol and atol), or None."""
    if isinstance(e, list) or e is None:
        if not isinstance(g, list) if e is not None else g is not None:
            return f"output {type(g).__name__}, expected {type(e).__name__}"
        if e is None:
            return None
        if len(g) != len(e):
            return f"a sequence of {len(g)}, expected {len(e)}"
        return next((why for gi, ei in zip(g, e) if (why := _differs(np.asarray(gi), ei, case))), None)
    if g.shape != e.shape or g.dtype != e.dtype:
        return f"output {g.dtype}{list(g.shape)}, expected {e.dtype}{list(e.shape)}"
    if e.dtype.kind in "OSU":
        return None if np.array_equal(g, e) else "values differ"
    if not np.allclose(g, e, rtol=case.rtol, atol=case.atol, equal_nan=True):
        return "values differ"
    return None


class _OnnxRuntimeRep:
    """onnxruntime's CPU session over a node test's model, run as ONNX's harness runs a backend."""

    def __init__(self, model):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # errors only
        self.session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                                    providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def run(self, inputs):
        return self.session.run(None, dict(zip(self.inputs, inputs)))


def run_case(case, backend: str = "opforge") -> tuple[str, str]:
    """("pass" | "fail", message) for one node test on ``backend`` ("opforge" or "onnxruntime"), compared as ONNX's
    harness compares."""
    from .backend import OpforgeBackend

    try:
        rep = OpforgeBackend.prepare(case.model) if backend == "opforge" else _OnnxRuntimeRep(case.model)
        for inputs, expected in case.data_sets:
            got = rep.run([_array(v) for v in inputs])
            expected = [_array(v) for v in expected]
            if len(got) != len(expected):
                return "fail", f"{len(got)} outputs, expected {len(expected)}"
            for g, e in zip(got, expected):
                why = _differs(g, e, case)
                if why:
                    return "fail", why
    except OpforgeError as e:
        return "fail", f"{type(e).__name__}: {e}"
    except Exception as e:  # a raw exception is a bug of ours (for opforge): reported as such
        return "fail", f"raw {type(e).__name__}: {e}"
    return "pass", ""


# What the whole-suite count leaves out: the node tests whose expected outputs are one draw of a random generator
# (no backend reproduces them but by sharing NumPy's generator and seed), with why.
RANDOM = {
    **{f"test_bernoulli{k}": "Bernoulli draws random numbers" for k in (
        "", "_double", "_double_expanded", "_expanded", "_seed", "_seed_expanded")},
    **{f"test_training_dropout{k}": "Dropout in training mode draws a random mask" for k in (
        "", "_default", "_default_mask", "_mask")},
}


def suite(cases=None, backends=("opforge", "onnxruntime")) -> dict:
    """Every node test on disk (but ``RANDOM``), run on each backend: backend -> {test name: (status, message)}."""
    cases = node_cases() if cases is None else cases
    return {b: {c.name: run_case(c, b) for c in cases if c.name not in RANDOM} for b in backends}


def suite_line(counts: dict) -> str:
    """The sentence of docs/onnx.md that gives the whole suite's pass counts."""
    import onnx
    import onnxruntime

    total = len(next(iter(counts.values())))
    passed = {b: sum(s == "pass" for s, _ in r.values()) for b, r in counts.items()}
    return (f"The whole suite (`python -m opforge.onnx.conformance --suite`), every one of ONNX {onnx.__version__}'s "
            f"{total} node tests but the {len(RANDOM)} whose outputs are random draws (`conformance.RANDOM`): "
            f"**opforge passes {passed['opforge']}, ONNX Runtime {onnxruntime.__version__} {passed['onnxruntime']}** "
            "(on the CPU, compared as ONNX's harness compares).")


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
             f"lacks (uint64, float8e8m0, strings, ...): {sum(skipped.values())}.", "",
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
    """Replace the table between the conformance markers of ``path`` by a fresh one, and the whole suite's counts
    for opforge and ONNX Runtime between the suite markers (those the tests do not check: they take both backends
    over every node test, and depend on the onnxruntime installed)."""
    from pathlib import Path

    cases = node_cases()
    text = Path(path).read_text()
    for name, fresh in (("conformance", lambda: render(cases)), ("suite", lambda: suite_line(suite(cases)) + "\n")):
        begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
        head, rest = text.split(begin)
        _, tail = rest.split(end)
        text = f"{head}{begin}\n{fresh()}{end}{tail}"
    Path(path).write_text(text)


def _print_suite() -> None:
    """Each backend's count over the whole suite, and the tests where they differ, by ONNX op."""
    cases = node_cases()
    ops = op_types(cases)
    counts = suite(cases)
    print(suite_line(counts))
    by_op: dict = {}
    for name, (status, message) in counts["opforge"].items():
        other = counts["onnxruntime"][name][0]
        if status != other:
            by_op.setdefault(ops[name], []).append(f"{name} opforge {status} ({message[:120]}), onnxruntime {other}")
    for op in sorted(by_op, key=lambda o: -len(by_op[o])):
        print(f"{op} ({len(by_op[op])}):", *by_op[op], sep="\n  ")


if __name__ == "__main__":
    if "--suite" in sys.argv:
        _print_suite()
    elif "--write" in sys.argv:
        write()
    else:
        sys.stdout.write(render())
