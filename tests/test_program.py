"""Program mode: tracing, append_backward, the executor's passes, save/load, compile — against eager mode."""

import itertools
import json

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.program.serialize import ProgramFormatError


def params(seed=0, sizes=(3, 5, 4)):
    rng = np.random.default_rng(seed)
    out = []
    for a, b in itertools.pairwise(sizes):
        out += [of.tensor(rng.standard_normal((a, b)) * 0.5, requires_grad=True),
                of.tensor(rng.standard_normal(b) * 0.1, requires_grad=True)]
    return out


def mlp_loss(ps):
    w1, b1, w2, b2 = ps

    def f(x):
        h = F.tanh(x @ w1 + b1)  # broadcasting: b1 is added to every row
        y = h @ w2 + b2 + h[:, :1] * 0.5  # fan-out: h is read twice
        return {"loss": F.sum(y * y) * 0.1, "y": y}

    return f


def eager_grads(f, x, ps):
    out = f(of.tensor(x))
    return out, of.grad(out["loss"], ps)


def build(f, spec=None):
    prog = of.trace(f, x=spec or of.Spec((None, 3), "float64"))
    of.append_backward(prog, prog.outputs["loss"])
    return prog


def test_mlp_forward_and_gradients_equal_eager_for_two_batch_sizes():
    ps = params()
    f = mlp_loss(ps)
    prog = build(f)
    exe = of.Executor(prog)
    names = prog.parameters()
    assert len(names) == 4
    for batch in (5, 11):
        x = np.random.default_rng(batch).standard_normal((batch, 3))
        out = exe.run(x=x)
        eager, grads = eager_grads(f, x, ps)
        np.testing.assert_allclose(out["loss"], eager["loss"].numpy(), rtol=1e-12)
        np.testing.assert_allclose(out["y"], eager["y"].numpy(), rtol=1e-12)
        for name, g in zip(names, grads):
            np.testing.assert_allclose(out[f"{name}@GRAD"], g.numpy(), rtol=1e-12, atol=1e-14)
    assert len(exe._plans) == 2  # one prepared plan per feed shape


def test_program_text_is_one_op_per_line_with_shapes_and_dtypes():
    prog = build(mlp_loss(params()))
    text = str(prog)
    lines = text.splitlines()
    assert lines[0].startswith(f"program (format 1): {len(prog.block.ops)} ops")
    assert "feeds:  x: float64[?, 3]" in text
    op_lines = [ln for ln in lines if " = " in ln]
    assert len(op_lines) == len(prog.block.ops)
    assert any("= matmul(x=x: float64[?, 3], y=param." in ln for ln in op_lines)
    assert any(ln.endswith("# backward") for ln in op_lines)


def test_user_defined_op_and_multi_output_op_in_a_program(scratch_ops):
    scratch_ops += ["cubic", "halves"]

    @of.op("cubic(Tensor x) -> Tensor y", traits=["elementwise"])
    def cubic(x):
        return x ** 3

    @cubic.grad
    def _(x, dy):
        return dy * 3 * x * x

    @of.op("halves(Tensor x) -> (Tensor lo, Tensor hi)")
    def halves(x):
        n = x.shape[-1] // 2
        return x[..., :n].copy(), x[..., n:].copy()

    @halves.infer
    def _(x):
        n = x.shape[-1] // 2
        return of.Spec((*x.shape[:-1], n), x.dtype), of.Spec((*x.shape[:-1], x.shape[-1] - n), x.dtype)

    @halves.grad
    def _(x_spec, dlo, dhi):
        n = x_spec.shape[-1]
        return (F.slice_grad(dlo, shape=x_spec.shape, axes=[1], starts=[0], ends=[n // 2], steps=[1])
                + F.slice_grad(dhi, shape=x_spec.shape, axes=[1], starts=[n // 2], ends=[n], steps=[1]))

    w = of.tensor(np.random.default_rng(1).standard_normal((3, 4)), requires_grad=True)

    def f(x):
        lo, _ = F.halves(F.cubic(x @ w))  # `hi` gets no gradient
        return {"loss": F.sum(lo)}

    prog = build(f)
    x = np.random.default_rng(2).standard_normal((6, 3))
    out = of.Executor(prog).run(x=x)
    loss = f(of.tensor(x))["loss"]
    (gw,) = of.grad(loss, [w])
    np.testing.assert_allclose(out["loss"], loss.numpy(), rtol=1e-12)
    np.testing.assert_allclose(out[f"{prog.parameters()[0]}@GRAD"], gw.numpy(), rtol=1e-12)


def test_no_grad_branches_stop_gradient_and_the_no_grad_set():
    w = of.tensor(np.array([[1.0, -2.0], [0.5, 3.0]]), requires_grad=True)
    v = of.tensor(np.array([0.3, 0.7]), requires_grad=True)

    def f(x):
        h = x @ w
        mask = h > 0  # a no_grad op: no gradient flows through the comparison
        return {"loss": F.sum(F.where(mask, h, h * 0.1) * v)}

    prog = of.trace(f, x=of.Spec((None, 2), "float64"))
    w_name, v_name = prog.parameters()
    grads = of.append_backward(prog, prog.outputs["loss"], no_grad=[v_name])
    assert set(grads) == {f"{w_name}@GRAD"}  # the names Executor.run returns them under
    x = np.array([[1.0, 2.0], [-1.0, 0.5]])
    out = of.Executor(prog).run(x=x)
    eager = f(of.tensor(x))["loss"]
    (gw,) = of.grad(eager, [w])
    np.testing.assert_allclose(out[f"{w_name}@GRAD"], gw.numpy(), rtol=1e-12)
    assert f"{v_name}@GRAD" not in out


def test_missing_gradient_rule_names_the_op_and_the_path(scratch_ops):
    scratch_ops.append("opaque2")

    @of.op("opaque2(Tensor x) -> Tensor y", traits=["elementwise"])
    def opaque2(x):
        return x * 2

    w = of.tensor(np.ones((2, 2)), requires_grad=True)
    prog = of.trace(lambda x: {"loss": F.sum(F.exp(F.opaque2(x @ w)))}, x=of.Spec((2, 2), "float64"))
    with pytest.raises(of.GradientError) as info:
        of.append_backward(prog, prog.outputs["loss"])
    assert "op 'opaque2' has no gradient rule" in str(info.value)
    assert "opaque2 -> exp -> sum -> sum." in str(info.value)


def test_second_order_gradients_equal_eager_create_graph():
    w = of.tensor(np.random.default_rng(3).standard_normal((3, 2)), requires_grad=True)
    v = np.random.default_rng(4).standard_normal((3, 2))

    def loss_of(x, w_):
        return F.sum(F.tanh(x @ w_) ** 3)

    x = np.random.default_rng(5).standard_normal((4, 3))
    prog = of.trace(lambda x: {"loss": loss_of(x, w)}, x=of.Spec((None, 3), "float64"))
    (w_name,) = prog.parameters()
    grads = of.append_backward(prog, prog.outputs["loss"])
    gv = F.sum(grads[f"{w_name}@GRAD"] * of.tensor(v))  # the directional derivative, recorded into the program
    hv = of.append_backward(prog, gv, wrt=[w_name])  # second order: Hessian-vector product
    exe = of.Executor(prog, fetch={"hv": hv[f"{w_name}@GRAD"], "g": grads[f"{w_name}@GRAD"]})
    out = exe.run(x=x)
    (g,) = of.grad(loss_of(of.tensor(x), w), [w], create_graph=True)
    (h,) = of.grad(F.sum(g * of.tensor(v)), [w])
    np.testing.assert_allclose(out["g"], g.numpy(), rtol=1e-12)
    np.testing.assert_allclose(out["hv"], h.numpy(), rtol=1e-10)


def test_feed_mismatches_are_reported_with_names():
    prog = build(mlp_loss(params()))
    exe = of.Executor(prog)
    with pytest.raises(of.ShapeError, match=r"feed 'x' has Spec\(\(4, 2\), float64\), the program declares"):
        exe.run(x=np.zeros((4, 2)))
    with pytest.raises(of.ArgumentError, match="missing feed 'x'"):
        exe.run()
    with pytest.raises(of.ArgumentError, match=r"\['z'\] are not feeds"):
        exe.run(x=np.zeros((4, 3)), z=1)


def test_shape_errors_at_trace_time_name_the_op():
    with pytest.raises(of.ShapeError, match=r"matmul\(\): shapes \(\?, 3\)|matmul\(\): shapes \(None, 3\)"):
        of.trace(lambda x: x @ of.tensor(np.ones((4, 2))), x=of.Spec((None, 3), "float64"))


def test_dead_code_and_duplicates_are_removed_but_random_ops_are_not_merged():
    w = of.tensor(np.ones((3, 3)), requires_grad=True)

    def f(x):
        F.exp(x) * 3  # dead: nothing fetched reads it
        a = F.tanh(x @ w)
        b = F.tanh(x @ w)  # identical to a: merged
        n1 = F.normal(shape=[3], std=1e-3)
        n2 = F.normal(shape=[3], std=1e-3)  # identical call, but random: never merged
        return {"loss": F.sum(a + b + n1 + n2), "unused_free": F.sum(x) * 0 + 1}

    prog = of.trace(f, x=of.Spec((2, 3), "float64"))
    exe = of.Executor(prog, fetch={"loss": prog.outputs["loss"]})
    plan = exe.plan(x=np.ones((2, 3)))
    assert plan.removed["merged"] == 2  # the matmul and the tanh
    assert plan.removed["dead"] >= 2  # exp and the mul after it (and the unfetched output)
    assert plan.source.count("rng=_rng()") == 2


def test_a_reshape_to_the_shape_it_has_is_its_input():
    # A rule's reshape(-1, n) of a 2-D gradient changes nothing: the plan reads the input, with the same results,
    # also where the input is a feed fetched back, a dying buffer written in place, or the batch size changes.
    def f(x):
        y = F.reshape(F.exp(x), shape=[-1, 3]) * 2.0
        return {"y": y, "x": F.reshape(x, shape=[-1, 3]), "t": F.reshape(F.tanh(x), shape=[3, -1])}

    prog = of.trace(f, x=of.Spec((None, 3), "float64"))
    exe = of.Executor(prog)
    for rows in (2, 3):
        x = np.arange(rows * 3.0).reshape(rows, 3) / 10
        plan = exe.plan(x=x)
        assert plan.removed["identity"] == (2 if rows == 2 else 3)  # (3, 3) -> [3, -1] is one too
        got = exe.run(x=x)
        # exp(x) · 2 is a fused group: as native code its exp is libmvec's, within 4 ulp of NumPy's (program/native.py)
        np.testing.assert_allclose(got["y"], np.exp(x) * 2.0, rtol=4 * np.finfo(np.float64).eps, atol=0)
        np.testing.assert_array_equal(got["x"], x)
        np.testing.assert_array_equal(got["t"], np.tanh(x).reshape(3, -1))


def test_ops_of_the_shapes_alone_are_computed_once_per_plan():
    # The seed of a loss's backward pass (ones_like) depends on the loss's shape, not its value: the plan makes it
    # once. It stays the plan's own constant (nothing writes into it) and every run gives the eager gradient.
    w = of.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)

    def f(x):
        loss = F.sum(F.tanh(x * w))
        return {"loss": loss, "dw": of.grad(loss, [w])[0], "zeros": F.zeros_like(x) + x}

    prog = of.trace(f, x=of.Spec((3,), "float64"))
    exe = of.Executor(prog)
    plan = exe.plan(x=np.ones(3))
    assert plan.removed["folded"] >= 2
    assert not [label for label in plan.line_ops.values() if "ones_like ->" in label or "zeros_like ->" in label]
    for x in (np.ones(3), np.array([0.1, 0.2, -3.0]), np.ones(3)):
        got = exe.run(x=x)
        ox = of.tensor(x)
        (dw,) = of.grad(F.sum(F.tanh(ox * w)), [w])
        np.testing.assert_array_equal(got["dw"], dw.numpy())
        np.testing.assert_array_equal(got["zeros"], x)


def test_a_hessian_vector_product_computes_no_first_order_gradient_it_does_not_need():
    """The second pass of H·v = d<g, v>/dθ is seeded by ones_like(<g, v>), which reads only a shape: once the plan
    folds the seed, the first-order gradients g (three weight-gradient matmuls and the dot) are dead. The plan runs
    the 18 matrix products of Pearlmutter's R-operator for a 3-layer MLP (forward 3, the first backward's d3·W3,
    the R-forward 5, the R-backward 4, the results 5), as XLA's program does; it ran 22."""
    rng = np.random.default_rng(0)
    sizes = [(5, 6), (4, 5), (3, 4)]
    params = [of.tensor(rng.standard_normal(s), requires_grad=True) for s in sizes]
    params += [of.tensor(rng.standard_normal(s[0]), requires_grad=True) for s in sizes]
    vs = [of.tensor(rng.standard_normal(p.shape)) for p in params]

    def loss_of(x, y):
        h = x
        for i, (w, b) in enumerate(zip(params[:3], params[3:])):
            h = F.linear(h, w, b)
            h = F.relu(h) if i < 2 else h
        return F.cross_entropy(h, y)

    def hvp(x, y):
        grads = of.grad(loss_of(x, y), params, create_graph=True)
        return of.grad(sum((g * d).sum() for g, d in zip(grads, vs)), params)

    x, y = of.tensor(rng.standard_normal((8, 6))), of.tensor(rng.integers(0, 3, 8))
    compiled = of.compile(hvp)
    for got, want in zip(compiled(x, y), hvp(x, y)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
    plan = next(iter(compiled.cache.values()))[0].exe._warm
    products = [label for label in plan.line_ops.values() if label.split()[2] in ("matmul", "linear")]
    # (and those a sum adds by GEMM: counted once each, on the line that calls the sum's step)
    products += [term for label in plan.line_ops.values() if label.split()[2].startswith("gemm_sum(")
                 and ") -> " in label for term in label.split(" @ ")[1:]]
    assert len(products) == 18, products
    # the second pass's seeds, ones broadcast to each parameter's shape times its direction, are the directions
    # themselves: no pass over the parameters' size multiplies by one
    ones = [n for n, v in plan.fn.__globals__["_folded"].items() if np.all(v == 1) and v.size > 1]
    assert ones and not any(n in line for n in ones for line in plan.source.splitlines() if " = k" in line)


def test_a_product_with_ones_is_its_other_input_unless_that_changes_what_comes_out():
    def f(x):
        ones = F.ones_like(x)  # folded: a constant of the plan
        return {"same": F.tanh(x * ones), "wider": F.tanh(x[0] * ones), "fetched": ones * x}

    x = np.array([[1.5, -0.0, np.nan], [np.inf, -2.0, 3.0]], np.float32)
    prog = of.trace(f, x=of.Spec(x.shape, x.dtype))
    plan = of.Executor(prog).plan(x=x)
    assert plan.removed["identity"] == 1  # x · ones, read by tanh; x[0] · ones broadcasts, the fetched one stays
    got, want = of.Executor(prog, native=False).run(x=x), of.Executor(prog, optimize=False).run(x=x)
    for k in want:
        assert np.array_equal(got[k], want[k], equal_nan=True) and not np.shares_memory(got[k], x)


def test_intermediates_are_freed_after_their_last_reader():
    prog = build(mlp_loss(params(sizes=(3, 64, 64))))
    plan = of.Executor(prog).plan(x=np.zeros((256, 3)))
    total = sum(int(np.prod(s.shape)) * s.dtype.itemsize for n, s in plan.specs.items()
                if n not in prog.feeds and n not in prog.values)
    assert plan.source.count("del ") > 10
    assert plan.peak_live_bytes < total / 2


def test_save_load_run_gives_identical_results(tmp_path):
    ps = params()
    prog = build(mlp_loss(ps))
    prog.save(tmp_path / "mlp.json")
    loaded = of.Program.load(tmp_path / "mlp.json")
    assert str(loaded) == str(prog)
    x = np.random.default_rng(7).standard_normal((6, 3))
    a, b = of.Executor(prog).run(x=x), of.Executor(loaded).run(x=x)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temporary files


def _tamper(tmp_path, change):
    prog = build(mlp_loss(params()))
    prog.save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    change(doc)
    (tmp_path / "q.json").write_text(json.dumps(doc))  # naming p.json's values file
    return tmp_path / "q.json"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["ops"][0].update(type="no_such_op"), "op #0 has unknown type 'no_such_op'"),
    (lambda d: d["ops"][1]["attrs"].update(bogus=1), "unknown attrs \\['bogus'\\]"),
    (lambda d: next(op for op in d["ops"] if op["type"] == "transpose")["attrs"].update(perm="x"),
     "argument 'perm' expected int\\[\\]\\?, got str"),
    (lambda d: d["ops"][0]["inputs"].update(x=["ghost"]), "refers to undeclared variable 'ghost'"),
    (lambda d: d.update(version=99), "format version 99 is newer"),
    (lambda d: d.update(format="pickle"), "not an opforge program"),
])
def test_loading_a_tampered_program_fails_clearly(tmp_path, change, message):
    path = _tamper(tmp_path, change)
    with pytest.raises(ProgramFormatError, match=message):
        of.Program.load(path)


def test_compile_caches_per_signature_and_matches_eager():
    ps = params()
    f = mlp_loss(ps)
    calls = []

    @of.compile
    def step(x):
        calls.append(1)
        out = f(x)
        grads = of.grad(out["loss"], ps)
        return (out["loss"], *grads)

    for batch in (4, 4, 9):
        x = of.tensor(np.random.default_rng(batch).standard_normal((batch, 3)))
        loss, *grads = step(x)
        eager, eager_grads_ = eager_grads(f, x.numpy(), ps)
        assert isinstance(loss, of.Tensor)
        np.testing.assert_allclose(loss.numpy(), eager["loss"].numpy(), rtol=1e-12)
        for g, e in zip(grads, eager_grads_):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12, atol=1e-14)
    assert len(calls) == 2  # traced once per input signature


def test_updates_of_persistable_variables_happen_in_place_and_match_eager(tmp_path):
    from opforge.program import assign

    x = of.tensor(np.random.default_rng(8).standard_normal((4, 3)))
    start = np.random.default_rng(9).standard_normal((3, 2))

    def step(w):
        def fn(x):
            loss = F.sum(F.square(x @ w))
            (g,) = of.grad(loss, [w])
            with of.no_grad():
                assign(w, w - 0.01 * g)
            return loss
        return fn

    w_eager, w_comp = of.tensor(start, requires_grad=True), of.tensor(start, requires_grad=True)
    eager, compiled = step(w_eager), of.compile(step(w_comp))
    buffer = w_comp.numpy()
    for _ in range(3):
        assert eager(x).item() == pytest.approx(compiled(x).item(), rel=1e-12)
    assert w_comp.numpy() is buffer  # the parameter's own array was updated
    np.testing.assert_allclose(w_comp.numpy(), w_eager.numpy(), rtol=1e-12)
    prog = compiled.program(x)
    assert "updates: param." in str(prog)
    prog.save(tmp_path / "step.json")
    assert of.Program.load(tmp_path / "step.json").updates == prog.updates


def test_closed_over_arrays_are_read_at_each_run_and_literals_are_folded():
    w = of.ones(2, 2)  # no grad: a buffer or frozen weight, which the caller may change between runs
    f = of.compile(lambda x: x @ (w * 2))
    x = of.ones(1, 2)
    assert f(x).numpy().tolist() == [[4.0, 4.0]]
    w.numpy()[:] = 5
    assert f(x).numpy().tolist() == [[20.0, 20.0]]
    plan = next(iter(f.cache.values()))[0].exe.plan(x=x.numpy())
    assert "scope[" in plan.source  # w is state, read at each run


def test_compile_cache_key_adds_python_state():
    mode = {"scale": 2.0}
    f = of.compile(lambda x: x * mode["scale"], cache_key=lambda: mode["scale"])
    x = of.ones(2)
    assert f(x).numpy().tolist() == [2.0, 2.0]
    mode["scale"] = 3.0
    assert f(x).numpy().tolist() == [3.0, 3.0]
    assert len(f.cache) == 2


def test_kernels_write_into_dying_buffers_and_results_do_not_change():
    prog = build(mlp_loss(params(sizes=(3, 16, 16))))
    x = np.random.default_rng(11).standard_normal((8, 3))
    lean, plain = of.Executor(prog), of.Executor(prog, optimize=False)
    assert "out=" in lean.plan(x=x).source  # in-place and add-to requests are planned
    a, b = lean.run(x=x), plain.run(x=x)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-15)


def test_no_intermediate_outlives_its_last_reader():
    import re

    prog = build(mlp_loss(params(sizes=(3, 16, 16))))
    plan = of.Executor(prog).plan(x=np.zeros((8, 3)))
    assigned = set(re.findall(r"^\s+(v\d+)(?:, v\d+)*,? = ", plan.source, re.M))
    deleted = set(re.findall(r"del (v\d+)", plan.source))
    returned = set(re.findall(r"(v\d+)", plan.source.strip().splitlines()[-1]))
    given = set(re.findall(r"^\s+(v\d+) = (?:feed|scope|consts|_folded)\[", plan.source, re.M))
    assert assigned - deleted - returned - given == set()  # in-place writes included


def test_a_backward_request_keeps_its_gradients_and_older_files_without_them_load(tmp_path):
    prog = build(mlp_loss(params()))
    ((loss, wrt, blocked, grads),) = prog.backward_requests
    assert set(grads) == set(wrt) and all(g in prog.block.vars for g in grads.values())
    prog.save(tmp_path / "p.json")
    assert of.Program.load(tmp_path / "p.json").backward_requests == prog.backward_requests
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["backward_requests"] = [r[:3] for r in doc["backward_requests"]]  # as files written before
    (tmp_path / "q.json").write_text(json.dumps(doc))
    assert of.Program.load(tmp_path / "q.json").backward_requests == [(loss, wrt, blocked, {})]


_VIEWS = {"identity": F.identity, "transpose": F.transpose, "reshape": lambda t: F.reshape(t, shape=[16]),
          "slice": lambda t: F.slice(t, axes=[0], starts=[0], ends=[4], steps=[1]),
          "broadcast_to": lambda t: F.broadcast_to(t, shape=[2, 4, 4]), "unsqueeze": lambda t: F.unsqueeze(t, axis=0),
          "permute": lambda t: F.permute(t, dims=[1, 0]), "flip": lambda t: F.flip(t, axis=[0])}


@pytest.mark.parametrize("view", sorted(_VIEWS))
@pytest.mark.parametrize("where", ["planned", "compiled", "unoptimized"])
def test_a_view_of_a_buffer_written_in_place_keeps_its_value(view, where):
    """An op writes its result into a dying input's buffer: a view of that input (or the input itself, from
    identity) still to be read changed with the write."""
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)

    def f(x):
        t = F.softmax(x, axis=-1)  # written with out=: a buffer of its own
        v = _VIEWS[view](t)
        s = F.softmax(t, axis=-1)  # t dies here: s is written into its buffer
        return s * F.sum(F.square(F.reshape(v, shape=[-1])))

    want = f(of.tensor(x)).numpy()
    if where == "compiled":
        got = of.compile(f)(of.tensor(x)).numpy()
    else:
        got = of.Executor(of.trace(f, x=of.Spec(x.shape, x.dtype)), optimize=where != "unoptimized").run(x=x)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_identity_inside_a_fused_group_keeps_its_value():
    """identity returns its input: in a fused group, tanh's scratch buffer was handed to the next member (it had
    died at identity) while identity's result, that very buffer, was still to be read."""
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)

    def f(x):
        i = F.identity(F.tanh(x * 3.0))
        return (x * 0.5) * i  # (x * 0.5 computed after identity: into the scratch buffer tanh wrote)

    exe = of.Executor(of.trace(f, x=of.Spec(x.shape, x.dtype)))
    assert "fused(" in exe.plan(x=x).source
    want = f(of.tensor(x)).numpy()
    np.testing.assert_allclose(exe.run(x=x)["out"], want, rtol=1e-6)
    np.testing.assert_allclose(of.compile(f)(of.tensor(x)).numpy(), want, rtol=1e-6)


def test_an_op_of_the_shape_alone_over_a_size_only_the_run_knows_is_not_folded_ahead():
    """zeros_like of unique's values: their count is known when unique runs, not when the plan is made (the
    constant folding made an array of the shape (None,) and failed)."""
    x = np.array([2, 1, 1, 3, 4, 3], np.float32)

    def f(x):
        return F.zeros_like(F.unique_all(x)[0]) + 1.0

    out = of.Executor(of.trace(f, x=of.Spec(x.shape, x.dtype))).run(x=x)["out"]
    np.testing.assert_array_equal(out, f(of.tensor(x)).numpy())
    assert out.shape == (4,)


def test_a_program_saved_before_an_op_was_renamed_loads_under_its_present_name(tmp_path):
    """Ops that became torch's functions were renamed (max_pool2d -> max_pool2d_values, adaptive_avg_pool2d ->
    adaptive_avg_pool2d_sized, scaled_dot_product_attention -> dot_product_attention, dropout -> dropout_with_mask,
    ...): a program file that names them the old way must still load and run to the same values (nothing a user
    saved is lost); an old attr the new op dropped loads only with the value that means the same."""
    def f(x, q):
        return (F.max_pool2d(x, 2).sum() + F.adaptive_avg_pool2d(x, [2, 2]).sum()
                + F.scaled_dot_product_attention(q, q, q).sum())

    rng = np.random.default_rng(0)
    x, q = rng.standard_normal((1, 2, 4, 4)).astype(np.float32), rng.standard_normal((2, 3, 4)).astype(np.float32)
    prog = of.compile(f).program(of.tensor(x), of.tensor(q))
    prog.save(tmp_path / "new.json")
    doc = json.loads((tmp_path / "new.json").read_text())
    old_names = {"max_pool2d_values": "max_pool2d", "adaptive_avg_pool2d_sized": "adaptive_avg_pool2d",
                 "dot_product_attention": "scaled_dot_product_attention"}
    for op in doc["ops"]:
        if op["type"] == "dot_product_attention":
            op["attrs"]["dropout_p"] = 0.0
        op["type"] = old_names.get(op["type"], op["type"])
    assert {op["type"] for op in doc["ops"]} >= set(old_names.values())
    values = sorted(tmp_path.glob("new.*.npz"))
    (tmp_path / "old.json").write_text(json.dumps(doc))
    for v in values:
        (tmp_path / v.name.replace("new.", "old.", 1)).write_bytes(v.read_bytes())
    loaded = of.Program.load(tmp_path / "old.json")
    assert str(loaded) == str(prog)
    feeds = dict(zip(prog.feeds, (x, q)))
    np.testing.assert_array_equal(of.Executor(loaded).run(feeds)["out"], of.Executor(prog).run(feeds)["out"])
    for op in doc["ops"]:
        if op["type"] == "scaled_dot_product_attention":
            op["attrs"]["dropout_p"] = 0.1
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with pytest.raises(ProgramFormatError, match=r"scaled_dot_product_attention, now dot_product_attention\) has "
                                                 r"dropout_p=0.1, which dot_product_attention no longer takes"):
        of.Program.load(tmp_path / "old.json")
