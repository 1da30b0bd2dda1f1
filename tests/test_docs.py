"""The generated reference (docs/ops.md) and stubs (opforge/ops/__init__.pyi) stay current and true to the
registry; the `opforge` command works; and the conformance checks added for the library find what they are for.
"""

import ast
import inspect
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge as of
from opforge import docgen
from opforge import ops as F
from opforge.cli import main
from opforge.core.devices import CPU
from opforge.testing.conformance import ConformanceError, check_all, check_op

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "python -m opforge.cli docs"


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "opforge.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


# -- the generated files ------------------------------------------------------------------------------------------

def test_generated_reference_and_stubs_are_current():
    # In a fresh process, so that ops other tests define cannot leak in.
    done = run("docs", "--check")
    assert done.returncode == 0, (
        f"{done.stdout}{done.stderr}\n"
        f"docs/ops.md or opforge/ops/__init__.pyi no longer matches the op registry: run `{REGENERATE}` "
        "from the repository root and keep the rewritten files."
    )


def test_docs_check_names_the_stale_file_and_docs_rewrites_it(tmp_path, capsys):
    assert main(["docs", "--root", str(tmp_path)]) == 0
    assert main(["docs", "--check", "--root", str(tmp_path)]) == 0
    reference = tmp_path / "docs" / "ops.md"
    reference.write_text(reference.read_text().replace("### leaky_relu\n", "### leaky_relu (edited)\n"))
    capsys.readouterr()
    assert main(["docs", "--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "ops.md is stale" in out and "__init__.pyi is stale" not in out
    assert "+### leaky_relu\n" in out and REGENERATE in out
    assert main(["docs", "--root", str(tmp_path)]) == 0
    assert main(["docs", "--check", "--root", str(tmp_path)]) == 0
    assert not list(tmp_path.rglob("*.tmp"))  # written through a temporary file, which is gone


def test_reference_documents_every_library_op():
    text = docgen.render_markdown()
    for op in docgen.library_ops():
        section = text.split(f"\n### {op.name}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
        assert str(op.schema) in section
        if op.doc:
            assert op.doc in section
        assert "**Kernels:** `cpu`" in section or "**Kernels:** `every device (takes xp)`" in section
        assert "**Devices:** " in section
        if "no_grad" in op.traits:
            assert "**Differentiable:** no — trait `no_grad`" in section
    assert "### leaky_relu\n" in text and "to any order; its backward records `leaky_relu_grad`" in text


def test_every_differentiable_library_op_is_at_least_twice_differentiable_by_its_rules():
    # What tests/test_conformance.py checks numerically, derived here from the rules alone.
    orders = docgen.differentiation_orders(docgen.library_ops())
    low = {name: order for name, (order, _) in orders.items()
           if of.registry.get(name).differentiable and order is not None and order < 2}
    assert not low


def _stub_functions(text: str) -> dict:
    return {node.name: node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef)}


def test_stubs_match_the_generated_functions():
    from opforge import ops as package

    functions = _stub_functions(docgen.render_stub(docgen.ops_of_module(package)))
    for op in docgen.library_ops():
        stub, real = functions[op.name], inspect.signature(getattr(F, op.name))
        args = stub.args
        kinds = [(n, p.kind) for n, p in real.parameters.items()]
        assert [a.arg for a in args.args] == [n for n, k in kinds if k == inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert [a.arg for a in args.kwonlyargs] == [n for n, k in kinds if k == inspect.Parameter.KEYWORD_ONLY]
        defaults = dict(zip([a.arg for a in args.args][len(args.args) - len(args.defaults):], args.defaults))
        defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
        for name, p in real.parameters.items():
            assert (name in defaults) == (p.default is not p.empty), (op.name, name)
            if name in defaults and not (isinstance(defaults[name], ast.Constant) and defaults[name].value is ...):
                assert ast.literal_eval(defaults[name]) == p.default, (op.name, name)
        doc = ast.get_docstring(stub)
        assert doc and doc.split()[:3] == (op.doc or str(op.schema)).split()[:3]


def test_stub_spells_builtins_that_an_op_name_shadows():
    text = docgen.render_stub([("float", of.registry.get("cast")), ("leaky_relu", of.registry.get("leaky_relu"))],
                              module="mine")
    assert "import builtins\n" in text
    assert ("def leaky_relu(x: _TensorLike, alpha: builtins.float = 0.01, *, negative_slope: builtins.float | None = "
            "None) -> Tensor:") in text
    assert "def float(x: _TensorLike, *, dtype: _DTypeLike) -> Tensor:" in text
    ast.parse(text)


USER_MODULE = '''
"""A user's ops, for `opforge stubs`."""
import numpy as np
import opforge as of
from opforge import ops as F


def helper(x):
    return x


@of.op("user_scaled_sum(Tensor[] xs, Tensor? w=None, *, float[] weights=[1.0], str how=\\"sum\\", dtype dtype=None)"
       " -> Tensor y")
def user_scaled_sum(xs, w, *, weights, how, dtype):
    """Weighted sum of ``xs``.

    More words.
    """
    return sum(x * k for x, k in zip(xs, weights))


@user_scaled_sum.infer
def _(xs, w, *, weights, how, dtype):
    return xs[0]


@of.op("user_split2(Tensor x) -> (Tensor a, Tensor b)", traits=["no_grad"])
def halves(x):
    """Two halves."""
    return x[: len(x) // 2], x[len(x) // 2:]


@halves.infer
def _(x):
    return of.Spec((x.shape[0] // 2,), x.dtype), of.Spec((x.shape[0] - x.shape[0] // 2,), x.dtype)


@halves.samples
def _(rng):
    yield of.Sample.of(rng.standard_normal(4))
'''


def test_stubs_for_a_users_module(tmp_path):
    (tmp_path / "user_ops_for_stubs.py").write_text(USER_MODULE)
    done = run("stubs", "--module", "user_ops_for_stubs", "-o", "user_ops_for_stubs.pyi", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "user_ops_for_stubs.pyi").read_text()
    functions = _stub_functions(text)
    assert set(functions) == {"user_scaled_sum", "halves", "__getattr__"}  # its ops, not the library's
    assert ("def user_scaled_sum(\n    xs: Sequence[_TensorLike],\n    w: _TensorLike | None = None,\n    *,\n"
            "    weights: Sequence[float] | float = [1.0],\n    how: str = 'sum',\n"
            "    dtype: _DTypeLike | None = None,\n) -> Tensor:\n    \"\"\"Weighted sum of ``xs``.\"\"\"") in text
    assert "class _halves_result(NamedTuple):\n    a: Tensor\n    b: Tensor" in text
    assert "def halves(x: _TensorLike) -> _halves_result:" in text
    assert "opforge stubs --module user_ops_for_stubs" in text
    assert run("stubs", "--module", "no_such_module_here", cwd=tmp_path).returncode != 0


def test_check_command(tmp_path):
    done = run("check", "leaky_relu", "scale", "-v")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "leaky_relu: 3 sample(s)" in done.stdout and "2 of 2 op(s) conform" in done.stdout
    assert run("check", "no_such_op").returncode == 1


# -- differentiability orders, derived from the rules ------------------------------------------------------------

def test_orders_follow_the_ops_each_backward_records(scratch_ops):
    scratch_ops += ["order_leaf_grad", "order_once", "order_twice", "order_linear"]
    leaf_grad = of.op("order_leaf_grad(Tensor x, Tensor dy) -> Tensor dx", traits=["elementwise"])(
        lambda x, dy: dy * 2 * x)  # no rule: not differentiable
    once = of.op("order_once(Tensor x) -> Tensor y", traits=["elementwise"])(lambda x: x * x)
    once.grad(lambda x, dy: F.order_leaf_grad(x, dy))
    twice = of.op("order_twice(Tensor x) -> Tensor y", traits=["elementwise"])(lambda x: x * x * x / 3)
    twice.grad(lambda x, dy: dy * F.order_once(x))
    linear = of.op("order_linear(Tensor x) -> Tensor y", traits=["elementwise"])(lambda x: 3 * x)
    linear.grad(lambda dy: dy * 3)
    orders = docgen.differentiation_orders([leaf_grad, once, twice, linear, of.registry.get("tanh")])
    assert orders["order_leaf_grad"] == (0, None)
    assert orders["order_once"] == (1, {"order_leaf_grad"})
    assert orders["order_twice"] == (2, {"order_once", "mul"})
    assert orders["order_linear"][0] == math.inf and orders["tanh"][0] == math.inf


# -- the conformance checks added to check_op ----------------------------------------------------------------------

def _define(scratch_ops, signature, kernel, *, traits=("no_grad",), infer=None, check=None, samples=None, rule=None):
    scratch_ops.append(signature.split("(")[0])
    op = of.op(signature, traits=list(traits))(kernel)
    for method, fn in ((op.infer, infer), (op.check, check), (op.samples, samples), (op.grad, rule)):
        if fn is not None:
            method(fn)
    return op


def test_float32_forward_must_agree_with_float64(scratch_ops):
    half = _define(scratch_ops, "half_exp(Tensor x) -> Tensor y", np.exp, traits=["elementwise"],
                   rule=lambda y, dy: dy * y)
    half.kernel(dtypes=["float32"])(lambda x: np.exp(x.astype(np.float16)).astype(np.float32))  # a sloppy kernel
    with pytest.raises(ConformanceError, match=r"output 'y' in float32 differs from float64 at index"):
        check_op(half)
    fine = _define(scratch_ops, "double_it(Tensor x) -> Tensor y", lambda x: x * 2, traits=["elementwise"],
                   rule=lambda dy: dy * 2)
    report = check_op(fine)
    assert 0 <= report.float32_error < 1e-2 and "float32 outputs agree with float64" in str(report)


def test_random_ops_are_compared_with_the_same_draws_and_the_generator_is_restored(scratch_ops):
    noisy = _define(scratch_ops, "noisy(Tensor x) -> Tensor y",
                    lambda x, rng: x + rng.standard_normal(x.shape).astype(x.dtype), traits=["elementwise", "random"],
                    rule=lambda dy: dy)
    before = CPU.generator()
    assert check_op(noisy).float32_error < 1
    assert CPU.generator() is before


def test_wrong_rank_the_kernel_refuses_must_be_refused_by_the_infer_rule(scratch_ops):
    lax = _define(scratch_ops, "lax_transpose(Tensor x) -> Tensor y", lambda x: np.einsum("ij->ji", x),
                  infer=lambda x: of.Spec(tuple(reversed(x.shape)), x.dtype),
                  samples=lambda rng: [of.Sample.of(rng.standard_normal((2, 3)))])
    with pytest.raises(ConformanceError, match=r"wrong rank \('x' of shape \(2, 2, 3\).*the kernel fails but the "
                                               r"infer rule accepts"):
        check_op(lax)

    def crashing(x):
        return of.Spec((x.shape[1], x.shape[0]), x.dtype)  # IndexError on a 1-d x

    crash = _define(scratch_ops, "crash_transpose(Tensor x) -> Tensor y", lambda x: np.einsum("ij->ji", x),
                    infer=crashing, samples=lambda rng: [of.Sample.of(rng.standard_normal((2, 3)))])
    with pytest.raises(ConformanceError, match=r"the infer rule crashed with IndexError"):
        check_op(crash)


def test_any_rank_ops_pass_and_eager_infer_disagreements_are_warnings(scratch_ops):
    assert not check_op("tanh").warnings and not check_op("sum").warnings  # accept any rank, infer agrees
    # y is broadcast by the kernel, but the shape rule copies x's Spec (eager mode runs the kernel alone).
    loose = _define(scratch_ops, "loose_mul(Tensor x, Tensor y) -> Tensor z", np.multiply, traits=[],
                    infer=lambda x, y: x,
                    rule=lambda x, y, dz: (dz * y, dz * x),
                    samples=lambda rng: [of.Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)))])
    report = check_op(loose)
    assert not report.failures and any("inferred Spec((3,), float64), kernel gave Spec((2, 3)" in w
                                       for w in report.warnings)
    assert "  warn wrong rank" in str(report)
    with pytest.raises(ConformanceError, match="wrong rank"):
        check_op(loose, strict=True)


def test_str_attrs_are_refused_by_a_check_not_by_the_kernel(scratch_ops):
    def reduce_kernel(x, *, how):
        return np.asarray({"sum": np.sum, "max": np.max}[how](x))

    def spec(x, *, how):
        return of.Spec((), x.dtype)

    def samples(rng):
        yield of.Sample.of(rng.standard_normal(3), how="max")

    unchecked = _define(scratch_ops, "reduce_how(Tensor x, *, str how=\"sum\") -> Tensor y", reduce_kernel,
                        infer=spec, samples=samples)
    with pytest.raises(ConformanceError, match=r"attr how='__no_such_value__': only the kernel refused it"):
        check_op(unchecked)

    def check(*, how):
        if how not in ("sum", "max"):
            raise ValueError(f"argument 'how' must be 'sum' or 'max', got {how!r}")

    checked = _define(scratch_ops, "reduce_how_checked(Tensor x, *, str how=\"sum\") -> Tensor y", reduce_kernel,
                      infer=spec, samples=samples, check=check)
    check_op(checked)


def test_values_the_check_refuses_must_be_refused_naming_the_argument(scratch_ops):
    def vague(*, alpha):
        if not alpha > 0:
            raise ValueError("must be positive")

    op = _define(scratch_ops, "vague_scale(Tensor x, *, float alpha=1.0) -> Tensor y", lambda x, *, alpha: x * alpha,
                 traits=["elementwise", "no_grad"], check=vague)
    with pytest.raises(ConformanceError, match=r"attr alpha=-1.0: raised ArgumentError without naming"):
        check_op(op)
    assert not check_op("smooth_l1").failures  # sigma ≤ 0 and nan: refused, naming 'sigma'


def test_check_all_reports_without_raising(scratch_ops):
    _define(scratch_ops, "no_samples_op(Tensor x, *, int n) -> Tensor y", lambda x, *, n: x * n,
            traits=["elementwise", "no_grad"])
    reports = check_all(["leaky_relu", "no_samples_op"])
    assert [r.op for r in reports] == ["leaky_relu", "no_samples_op"]
    assert not reports[0].failures and reports[0].order == 2
    assert "@no_samples_op.samples" in reports[1].failures[0]
    with pytest.raises(KeyError, match="no op named 'no_such_op'"):
        check_all(["no_such_op"])

