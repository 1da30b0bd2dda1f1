"""The layering the README's Layout section states, checked on the import graph of opforge/ (module-level and
function-level imports alike), and the pieces that keep it: op declaration in core, late binding, one kernel
choice, one input rule, one recorded-call interface, generated code that tracebacks can show."""

from __future__ import annotations

import ast
import linecache
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

import opforge as of
from opforge import ops as F

PACKAGE = Path(of.__file__).parent


def _modules() -> dict:
    """Module name -> (path, whether it is a package's __init__)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph() -> dict:
    """Module -> the opforge modules it imports anywhere in its code (a function's body included)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, (path, is_package) in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module
                names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
            else:
                continue
            edges |= {r for r in map(resolve, names) if r is not None and r != module}
        graph[module] = edges
    return graph


def circles(graph: dict) -> list:
    """The import circles: strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_circles_are_the_two_the_readme_names():
    found = sorted(sorted(c) for c in circles(import_graph()))
    assert found == [["opforge.program.backward", "opforge.program.trace"],
                     ["opforge.program.desc", "opforge.program.serialize"]], found


def test_the_op_library_imports_core_alone():
    graph = import_graph()
    families = [m for m in graph if m.startswith("opforge.ops.")]
    assert len(families) > 20
    for module in [*families, "opforge.ops"]:
        above = {m for m in graph[module] if not m.startswith(("opforge.core", "opforge.ops"))}
        assert not above, f"{module} imports {sorted(above)}, above core"


def test_core_imports_nothing_above_it():
    graph = import_graph()
    for module in (m for m in graph if m.startswith("opforge.core")):
        above = {m for m in graph[module] if not m.startswith("opforge.core")}
        assert not above, f"{module} imports {sorted(above)}"


def test_the_graph_sees_function_level_imports(tmp_path, monkeypatch):
    """The checker itself: an import inside a function body is an edge (else a circle could hide there)."""
    graph = import_graph()
    assert "opforge.program.backward" in graph["opforge.program.trace"]  # imported inside Tracer's methods only


# -- declaring an op before anything can give it a function ---------------------------------------------------------

def test_ops_declared_before_the_function_maker_get_functions_when_it_binds(monkeypatch):
    from opforge.core import declare

    maker = declare._function_maker
    monkeypatch.setattr(declare, "_function_maker", None)
    try:
        @of.op("early_square(Tensor x) -> Tensor y", traits=["elementwise"])
        def early_square(x):
            return x * x

        assert early_square.fn is None  # declared, not callable yet: core alone cannot run it
        declare.give_functions(maker)
        x = of.tensor([1.0, -3.0], requires_grad=True)
        np.testing.assert_array_equal(F.early_square(x).numpy(), [1.0, 9.0])
        np.testing.assert_array_equal(early_square(x).numpy(), [1.0, 9.0])
    finally:
        declare._function_maker = maker
        of.registry.remove("early_square")
    assert not hasattr(F, "early_square")


# -- one kernel choice, one input rule -------------------------------------------------------------------------------

def test_eager_replay_and_compiled_calls_pick_the_same_kernel():
    picked = []

    @of.op("picky_copy(Tensor x) -> Tensor y", traits=["elementwise"])
    def picky_copy(x):
        picked.append("any")
        return x.copy()

    @picky_copy.kernel(dtypes=["float64"])
    def _(x):
        picked.append("float64")
        return x.copy()

    try:
        x = of.tensor(np.ones(3), dtype="float64")
        F.picky_copy(x)  # the fast path
        F.picky_copy(x.numpy())  # the general eager path: an array lifted as a tensor
        of.compile(lambda t: F.picky_copy(t) * 2)(x)
        assert picked == ["float64"] * 3
    finally:
        of.registry.remove("picky_copy")


def test_a_python_number_beside_a_list_input_takes_its_dtype_eagerly_and_compiled():
    y = of.tensor(np.array([1.0, 2.0]), dtype="float64")
    eager = F.add_n([5.576, y])
    np.testing.assert_array_equal(eager.numpy(), (5.576 + y).numpy())  # not 5.576 rounded to float32 first
    compiled = of.compile(lambda t: F.add_n([5.576, t]))(y)
    np.testing.assert_array_equal(compiled.numpy(), eager.numpy())


def test_nested_lists_of_numbers_are_inputs_eagerly_and_compiled():
    x = of.tensor([1.0, 2.0])
    eager = F.mul(x, [3.0, 4.0])
    np.testing.assert_array_equal(of.compile(lambda t: F.mul(t, [3.0, 4.0]))(x).numpy(), eager.numpy())
    with pytest.raises(of.ArgumentError, match=r"mul\(\): argument 'y' expected Tensor, got a list holding"):
        of.compile(lambda t: F.mul(t, [t, t]))(x)
    with pytest.raises(of.ArgumentError, match=r"mul\(\): argument 'y' expected Tensor, got a list holding"):
        F.mul(x, [x, x])


# -- the recorded-call interface ---------------------------------------------------------------------------------------

def test_every_kind_of_recorded_call_provides_the_whole_interface():
    from opforge.autodiff.replay import _Recorder, _View
    from opforge.autodiff.rules import RecordedCall
    from opforge.program.backward import _OpCall

    x = of.tensor([0.5, 2.0], requires_grad=True)
    y = F.tanh(x)
    node = y._node
    program = of.trace(lambda t: F.tanh(t), t=of.Spec((2,), "float32"))
    desc = program.block.ops[0]
    calls = {"eager Node": node, "replay view": _View(node, _Recorder(), [of.ones_like(y)]),
             "program op": _OpCall(program, desc, of.registry.get(desc.type), [True])}
    for kind, call in calls.items():
        assert isinstance(call, RecordedCall), kind


# -- generated code that tracebacks show -------------------------------------------------------------------------------

def _frames(error: BaseException) -> list:
    return [(frame.filename, frame.line) for frame in traceback.extract_tb(error.__traceback__)]


def test_an_op_function_is_named_after_its_op_in_a_traceback():
    @of.op("fragile(Tensor x) -> Tensor y", traits=["elementwise"])
    def fragile(x):
        raise NotImplementedError("fragile has no kernel body yet")

    try:
        with pytest.raises(NotImplementedError) as info:
            F.fragile(of.tensor([1.0]))
        files = [f for f, _ in _frames(info.value)]
        assert "<opforge.ops.fragile>" in files
        line = next(text for f, text in _frames(info.value) if f == "<opforge.ops.fragile>")
        assert "def fragile(" in F.fragile.source
        assert line and line in F.fragile.source  # the generated line itself, from linecache
    finally:
        of.registry.remove("fragile")


def test_plans_and_replay_tapes_have_names_of_their_own():
    def step(t):
        return F.sum(F.tanh(t))

    compiled = of.compile(step)
    compiled(of.tensor([1.0, 2.0]))
    plan = next(iter(compiled.cache.values()))[0].exe._warm
    name = plan.fn.__code__.co_filename
    assert name.startswith("<opforge.plan.step.")
    assert linecache.getline(name, 1).startswith("def ") or linecache.getlines(name)

    from opforge.autodiff import replay

    replay._tapes.clear()
    x = of.tensor([0.3, 0.4], requires_grad=True)
    for _ in range(2):  # a key is recorded the second time it is met
        F.tanh(x).sum().backward()
    tapes = [t for t in replay._tapes.values() if callable(t)]
    names = {t.__code__.co_filename for t in tapes}
    assert any(n.startswith("<opforge.replay.tanh.") for n in names), names
    assert all(linecache.getlines(n) for n in names)
    replay._tapes.clear()
    del tapes
    import gc

    gc.collect()
    assert not any(linecache.getlines(n) for n in names)  # forgotten with their tapes


def test_a_failing_op_inside_a_plan_is_named():
    @of.op("fragile_plan(Tensor x) -> Tensor y", traits=["elementwise"])
    def fragile_plan(x):
        if (x > 5).any():
            raise ValueError("too big")
        return x

    try:
        compiled = of.compile(lambda t: F.fragile_plan(t) + 1)
        compiled(of.tensor([1.0]))
        with pytest.raises(of.OpforgeError, match=r"fragile_plan.*too big"):
            compiled(of.tensor([9.0]))
    finally:
        of.registry.remove("fragile_plan")


# -- the private NumPy handle is optional ------------------------------------------------------------------------------

def test_kernels_run_the_same_without_numpys_private_settings_handle(monkeypatch):
    from opforge.ops import _common

    rng = np.random.default_rng(0)
    wide = of.tensor(rng.standard_normal((64, 1000)).astype(np.float32))  # row_buffers' range
    huge = of.tensor(np.array([[1000.0, 0.0], [-1000.0, 3.0]], np.float32))  # softmax's overflow probe
    expected = [F.softmax(wide, axis=-1).numpy(), F.softmax(huge, axis=-1).numpy(),
                F.cross_entropy(huge, of.tensor(np.array([0, 1]))).numpy()]
    settings = (np.getbufsize(), np.geterr())
    monkeypatch.setattr(_common, "_extobj_contextvar", None)
    monkeypatch.setattr(_common, "_make_extobj", None)
    got = [F.softmax(wide, axis=-1).numpy(), F.softmax(huge, axis=-1).numpy(),
           F.cross_entropy(huge, of.tensor(np.array([0, 1]))).numpy()]
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    assert (np.getbufsize(), np.geterr()) == settings  # each block put the settings back


def test_the_late_bindings_are_made_at_import():
    """opforge/__init__.py's two bindings: every op has its function, and Tensor.backward runs the engine."""
    assert all(op.fn is not None for op in of.registry)
    assert sys.modules["opforge.tensor"]._engine.backward is of.autodiff.backward
