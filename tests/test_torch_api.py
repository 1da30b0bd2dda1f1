"""PyTorch's surface (issue 27, "Names and call forms"): torch's positional settings and dim= beside axis=, the torch
names of the opforge namespace and of Tensor methods, item assignment, nn.Parameter, save/load. PyTorch is the
oracle: each call below is written as torch writes it and compared with torch's result (values, dtypes, gradients),
or must fail where torch fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opforge as of
from opforge import ops as F


def same(ours, theirs, rtol=1e-6, atol=0.0):
    """Equal values, shapes and dtypes, through tuples and lists (a torch dtype compares by name)."""
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs), (type(ours), len(theirs))
        for a, b in zip(ours, theirs):
            same(a, b, rtol, atol)
        return
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
    ours = ours.numpy() if isinstance(ours, of.Tensor) else np.asarray(ours)
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((3, 4)), "img": rng.standard_normal((2, 4, 6, 6)),
        "w": rng.standard_normal((3, 4, 3, 3)), "b": rng.standard_normal(3), "lw": rng.standard_normal((5, 4)),
        "lb": rng.standard_normal(5), "y": np.array([0, 2, 1]), "idx": np.array([[0, 3], [2, 2], [1, 0]]),
        "i1": np.array([2, 0]), "v": rng.standard_normal(4), "emb": rng.standard_normal((6, 4)),
    }


def _of(d):
    return {k: of.tensor(v) for k, v in d.items()}


def _torch(d):
    return {k: torch.tensor(v) for k, v in d.items()}


# (ours, torch's) called with the same named data: each written as torch writes it
CALL_FORMS = {
    "sum(x, 1)": (lambda m, a: m.sum(a["x"], 1)),
    "sum(x, dim=1, keepdim=True)": (lambda m, a: m.sum(a["x"], dim=1, keepdim=True)),
    "sum(x, (0, 1))": (lambda m, a: m.sum(a["x"], (0, 1))),
    "sum(x, 0, keepdims=True)": (lambda m, a: m.sum(a["x"], 0, keepdims=True)),
    "mean(x, 1, True)": (lambda m, a: m.mean(a["x"], 1, True)),
    "prod(x, dim=0)": (lambda m, a: m.prod(a["x"], dim=0)),
    "amax(x, 1)": (lambda m, a: m.amax(a["x"], 1)),
    "argmax(x, 1)": (lambda m, a: m.argmax(a["x"], 1)),
    "argmin(x, dim=0, keepdim=True)": (lambda m, a: m.argmin(a["x"], dim=0, keepdim=True)),
    "std(x, 1)": (lambda m, a: m.std(a["x"], 1)),
    "var(x, dim=0, keepdim=True)": (lambda m, a: m.var(a["x"], dim=0, keepdim=True)),
    "logsumexp(x, 1)": (lambda m, a: m.logsumexp(a["x"], 1)),
    "norm(x, 2, 1)": (lambda m, a: m.norm(a["x"], 2, 1)),
    "cumsum(x, 1)": (lambda m, a: m.cumsum(a["x"], 1)),
    "cumprod(x, dim=0)": (lambda m, a: m.cumprod(a["x"], dim=0)),
    "softmax(x, 1)": (lambda m, a: m.softmax(a["x"], 1)),
    "log_softmax(x, dim=0)": (lambda m, a: m.log_softmax(a["x"], dim=0)),
    "cat([x, x], 1)": (lambda m, a: m.cat([a["x"], a["x"]], 1)),
    "cat([x, x], dim=0)": (lambda m, a: m.cat([a["x"], a["x"]], dim=0)),
    "stack([x, x], 1)": (lambda m, a: m.stack([a["x"], a["x"]], 1)),
    "split(x, 2, 1)": (lambda m, a: m.split(a["x"], 2, 1)),
    "split(x, [1, 3], dim=1)": (lambda m, a: m.split(a["x"], [1, 3], dim=1)),
    "unsqueeze(x, 0)": (lambda m, a: m.unsqueeze(a["x"], 0)),
    "squeeze(x, dim=0)": (lambda m, a: m.squeeze(m.unsqueeze(a["x"], 0), dim=0)),
    "flip(x, (0,))": (lambda m, a: m.flip(a["x"], (0,))),
    "flip(x, dims=[1])": (lambda m, a: m.flip(a["x"], dims=[1])),
    "roll(x, 1, 0)": (lambda m, a: m.roll(a["x"], 1, 0)),
    "tile(x, (2, 1))": (lambda m, a: m.tile(a["x"], (2, 1))),
    "tril(x, 1)": (lambda m, a: m.tril(a["x"], 1)),
    "diagonal(x, 1, 0, 1)": (lambda m, a: m.diagonal(a["x"], 1, 0, 1)),
    "diagonal(x, dim1=1, dim2=0)": (lambda m, a: m.diagonal(a["x"], dim1=1, dim2=0)),
    "repeat_interleave(x, 2, 0)": (lambda m, a: m.repeat_interleave(a["x"], 2, 0)),
    "topk(x, 2, 1)": (lambda m, a: tuple(m.topk(a["x"], 2, 1))),
    "sort(x, 1, True)": (lambda m, a: tuple(m.sort(a["x"], 1, True))),
    "argsort(x, 0, True)": (lambda m, a: m.argsort(a["x"], 0, True)),
    "gather(x, 1, idx)": (lambda m, a: m.gather(a["x"], 1, a["idx"])),
    "gather(x, dim=1, index=idx)": (lambda m, a: m.gather(a["x"], dim=1, index=a["idx"])),
    "index_select(x, 1, i1)": (lambda m, a: m.index_select(a["x"], 1, a["i1"])),
    "scatter_add(x, 1, idx, src)": (lambda m, a: m.scatter_add(a["x"], 1, a["idx"], a["x"][:, :2] * 2)),
    "index_add(x, 0, i1, src)": (lambda m, a: m.index_add(a["x"], 0, a["i1"], a["x"][:2] * 3)),
    "reshape(x, (4, 3))": (lambda m, a: m.reshape(a["x"], (4, 3))),
    "broadcast_to(v, (3, 4))": (lambda m, a: m.broadcast_to(a["v"], (3, 4))),
    "permute(img, (0, 2, 3, 1))": (lambda m, a: m.permute(a["img"], (0, 2, 3, 1))),
    "F.max_pool2d(img, 2)": (lambda m, a: m.nn.functional.max_pool2d(a["img"], 2)),
    "F.max_pool2d(img, 3, 2, 1)": (lambda m, a: m.nn.functional.max_pool2d(a["img"], 3, 2, 1)),
    "F.avg_pool2d(img, 2)": (lambda m, a: m.nn.functional.avg_pool2d(a["img"], 2)),
    "F.adaptive_avg_pool2d(img, 1)": (lambda m, a: m.nn.functional.adaptive_avg_pool2d(a["img"], 1)),
    "F.conv2d(img, w, b, 1, 1)": (lambda m, a: m.nn.functional.conv2d(a["img"], a["w"], a["b"], 1, 1)),
    "F.interpolate(img, None, 2.0)": (lambda m, a: m.nn.functional.interpolate(a["img"], None, 2.0)),
    "F.pixel_shuffle(img, 2)": (lambda m, a: m.nn.functional.pixel_shuffle(a["img"], 2)),
    "F.linear(x, w, b)": (lambda m, a: m.nn.functional.linear(a["x"], a["lw"], a["lb"])),
    "F.cross_entropy(logits, y)": (lambda m, a: m.nn.functional.cross_entropy(a["x"], a["y"])),
    "F.leaky_relu(x, 0.2)": (lambda m, a: m.nn.functional.leaky_relu(a["x"], 0.2)),
    "F.leaky_relu(x, negative_slope=0.3)": (lambda m, a: m.nn.functional.leaky_relu(a["x"], negative_slope=0.3)),
    "F.elu(x, 0.5)": (lambda m, a: m.nn.functional.elu(a["x"], 0.5)),
    "F.hardtanh(x, -0.5, 0.5)": (lambda m, a: m.nn.functional.hardtanh(a["x"], -0.5, 0.5)),
    "F.softplus(x, 2.0)": (lambda m, a: m.nn.functional.softplus(a["x"], 2.0)),
    "F.softmin(x, 1)": (lambda m, a: m.nn.functional.softmin(a["x"], 1)),
    "F.glu(x, -1)": (lambda m, a: m.nn.functional.glu(a["x"], -1)),
    "F.huber_loss(x, x * 2, 'sum', 0.5)": (lambda m, a: m.nn.functional.huber_loss(a["x"], a["x"] * 2, "sum", 0.5)),
    "F.one_hot(y, 4)": (lambda m, a: m.nn.functional.one_hot(a["y"], 4)),
    "F.layer_norm(x, (4,), v, v)": (lambda m, a: m.nn.functional.layer_norm(a["x"], (4,), a["v"], a["v"])),
    "F.group_norm(img, 2)": (lambda m, a: m.nn.functional.group_norm(a["img"], 2)),
    "F.normalize(x, 2.0, 0)": (lambda m, a: m.nn.functional.normalize(a["x"], 2.0, 0)),
    "F.cosine_similarity(x, x * 2, 0)": (lambda m, a: m.nn.functional.cosine_similarity(a["x"], a["x"] + 1, 0)),
    "F.pad(x, (1, 2), 'constant', 3.0)": (lambda m, a: m.nn.functional.pad(a["x"], (1, 2), "constant", 3.0)),
    "F.embedding(idx, emb, 0)": (lambda m, a: m.nn.functional.embedding(a["idx"], a["emb"], 0)),
}


@pytest.mark.parametrize("case", list(CALL_FORMS))
def test_torch_call_forms_give_torchs_results(case):
    call = CALL_FORMS[case]
    data = _data()
    ours = call(of, _of(data))  # the opforge namespace under torch's names; of.nn.functional is opforge.ops
    theirs = call(torch, _torch(data))
    same(ours, theirs, rtol=1e-12)


def test_a_setting_spelled_twice_or_missing_is_refused_as_torch_refuses_it():
    x, t = of.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(TypeError):
        torch.gather(t, 1)
    with pytest.raises(of.ArgumentError, match=r"gather\(\): missing required argument 'index'"):
        F.gather(x, 1)
    with pytest.raises(of.ArgumentError, match=r"gather\(\): missing required argument 'axis' \(or dim=\)"):
        F.gather(x, index=of.tensor([[0]]))
    with pytest.raises(of.ArgumentError, match=r"sum\(\): argument 'axis' is given twice, as axis= and as dim="):
        F.sum(x, 1, dim=0)
    with pytest.raises(of.ArgumentError, match=r"gather\(\): argument 'axis' is given twice"):
        F.gather(x, 1, of.tensor([[0]]), dim=1)
    with pytest.raises(TypeError):
        torch.sum(t, 1, dim=0)
    with pytest.raises(TypeError, match=r"gelu\(\) takes 1 positional argument"):  # keyword-only, as torch's
        F.gelu(x, "tanh")
    with pytest.raises(TypeError):
        TF.gelu(t, "tanh")


def test_a_second_spelling_is_one_parameter_of_the_signature():
    from opforge.core.errors import SchemaError
    from opforge.core.schema import parse_signature

    s = parse_signature("f(Tensor x, int axis/dim=-1, bool keepdim/keepdims=False) -> Tensor y")
    assert [(p.name, p.alias) for p in s.params] == [("x", None), ("axis", "dim"), ("keepdim", "keepdims")]
    assert str(s) == "f(Tensor x, int axis/dim=-1, bool keepdim/keepdims=False) -> Tensor y"
    with pytest.raises(SchemaError, match="argument 'dim' is given twice"):
        parse_signature("f(Tensor x, int dim, int axis/dim) -> Tensor y")
    assert str(of.registry.get("gather").schema).startswith("gather(Tensor x, int axis/dim, nograd Tensor")
    # kernels, rules and programs know the argument by its first name
    program = of.trace(lambda t: F.softmax(t, dim=0), t=of.Spec((2, 3), "float32"))
    assert program.block.ops[0].attrs == {"axis": 0}


def test_the_second_spellings_run_compiled_too():
    x = of.tensor(_data()["x"])
    step = of.compile(lambda t: F.sum(F.softmax(t, dim=0) * F.cumsum(t, dim=1), dim=1, keepdim=True))
    same(step(x), torch.sum(torch.softmax(torch.tensor(_data()["x"]), 0) * torch.tensor(_data()["x"]).cumsum(1),
                            dim=1, keepdim=True), rtol=1e-12)


# -- the opforge namespace carries torch's top-level functions ----------------------------------------------------

TOP_LEVEL = {
    "exp": (lambda m, a: m.exp(a["x"])),
    "sigmoid": (lambda m, a: m.sigmoid(a["x"])),
    "flatten": (lambda m, a: m.flatten(a["img"], 1)),
    "flatten(img, 1, 2)": (lambda m, a: m.flatten(a["img"], 1, 2)),
    "unflatten": (lambda m, a: m.unflatten(a["x"], 1, (2, 2))),
    "eye(3)": (lambda m, a: m.eye(3)),
    "eye(2, 3, dtype=float64)": (lambda m, a: m.eye(2, 3, dtype=m.float64)),
    "mm": (lambda m, a: m.mm(a["x"], a["lw"].T)),
    "bmm": (lambda m, a: m.bmm(a["img"][0], a["img"][1])),
    "matmul": (lambda m, a: m.matmul(a["x"], a["v"])),
    "where": (lambda m, a: m.where(a["x"] > 0, a["x"], 0.0)),
    "clamp": (lambda m, a: m.clamp(a["x"], -0.5, 0.5)),
    "clamp(max=)": (lambda m, a: m.clamp(a["x"], max=0.1)),
    "sum": (lambda m, a: m.sum(a["x"], 1)),
    "mean": (lambda m, a: m.mean(a["x"])),
    "argmax": (lambda m, a: m.argmax(a["x"], dim=1)),
    "softmax": (lambda m, a: m.softmax(a["x"], 1)),
    "max(x, 1)": (lambda m, a: tuple(m.max(a["x"], 1))),
    "cat": (lambda m, a: m.cat((a["x"], a["x"]), dim=1)),
    "concatenate": (lambda m, a: m.concatenate((a["x"], a["x"]))),
    "eq": (lambda m, a: m.eq(a["x"], a["x"] * (a["x"] > 0))),
    "lt": (lambda m, a: m.lt(a["x"], 0.0)),
    "transpose(img, 1, 3)": (lambda m, a: m.transpose(a["img"], 1, 3)),
    "swapaxes": (lambda m, a: m.swapaxes(a["img"], 0, 2)),
    "t": (lambda m, a: m.t(a["x"])),
    "einsum": (lambda m, a: m.einsum("ij,kj->ik", a["x"], a["lw"])),
    "einsum([ops])": (lambda m, a: m.einsum("ij,kj->ik", [a["x"], a["lw"]])),
    "chunk": (lambda m, a: m.chunk(a["x"], 3, 1)),
    "chunk(fewer)": (lambda m, a: m.chunk(a["x"], 4, 0)),
    "unbind": (lambda m, a: m.unbind(a["x"], 1)),
    "narrow": (lambda m, a: m.narrow(a["x"], 1, -3, 2)),
    "zeros(2, 3)": (lambda m, a: m.zeros(2, 3)),
    "ones((2,), dtype)": (lambda m, a: m.ones((2,), dtype=m.int64)),
    "full": (lambda m, a: m.full((2, 2), 1.5)),
    "full_like": (lambda m, a: m.full_like(a["x"], 7)),
    "zeros_like": (lambda m, a: m.zeros_like(a["x"])),
    "empty": (lambda m, a: m.empty(2, 3).shape),
    "empty_like": (lambda m, a: m.empty_like(a["x"]).dtype == m.float64),
    "arange": (lambda m, a: m.arange(5)),
    "tensor": (lambda m, a: m.tensor([[1, 2], [3, 4]])),
    "numel": (lambda m, a: m.numel(a["img"])),
    "is_tensor": (lambda m, a: (m.is_tensor(a["x"]), m.is_tensor(3))),
    "is_floating_point": (lambda m, a: (m.is_floating_point(a["x"]), m.is_floating_point(a["y"]))),
    "equal": (lambda m, a: (m.equal(a["x"], a["x"] + 0), m.equal(a["x"], a["x"] + 1), m.equal(a["x"], a["v"]))),
    "det": (lambda m, a: m.det(a["img"][0, 0, :3, :3])),
    "get_default_dtype": (lambda m, a: str(m.get_default_dtype()).replace("torch.", "")),
    "dtypes": (lambda m, a: [str(d).replace("torch.", "") for d in (m.float, m.double, m.long, m.int, m.bool,
                                                                    m.half, m.float32, m.int64)]),
    "Size": (lambda m, a: isinstance(a["x"].shape, m.Size)),
}


@pytest.mark.parametrize("case", list(TOP_LEVEL))
def test_the_namespace_carries_torchs_functions(case):
    call = TOP_LEVEL[case]
    data = _data()
    ours, theirs = call(of, _of(data)), call(torch, _torch(data))
    if isinstance(theirs, (bool, int, str, list, torch.Size)) or (isinstance(theirs, tuple) and isinstance(
            theirs[0], (bool, int))):
        assert (tuple(ours) if isinstance(theirs, torch.Size) else ours) == (tuple(theirs) if isinstance(
            theirs, torch.Size) else theirs)
    else:
        same(ours, theirs, rtol=1e-12)


def test_random_creation_functions_draw_what_torchs_draw():
    of.manual_seed(3)
    x = of.ones(4, 5)
    r = of.randn_like(x)
    assert r.shape == (4, 5) and r.dtype == np.float32 and float(r.std()) > 0.1
    assert of.rand_like(x, dtype=of.float64).dtype == np.float64 and float(of.rand_like(x).min()) >= 0
    p = of.randperm(50)
    assert p.dtype == np.int64 and sorted(p.tolist()) == list(range(50)) and p.tolist() != list(range(50))
    for args in ((10, (1000,)), (-3, 4, (10, 100))):
        r, t = of.randint(*args), torch.randint(*args)
        assert r.dtype == np.int64 and r.shape == tuple(t.shape)
        low, high = (0, args[0]) if len(args) == 2 else args[:2]
        assert r.min().item() == low and r.max().item() == high - 1  # every value of the range, none outside
    assert of.randint(5, (3,), dtype=of.int32).dtype == np.int32


def test_from_numpy_shares_memory_as_torchs():
    a, b = np.zeros(3, np.float32), np.zeros(3, np.float32)
    ours, theirs = of.from_numpy(a), torch.from_numpy(b)
    a[0] = b[0] = 5.0
    same(ours, theirs)
    ours.add_(1.0), theirs.add_(1.0)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(of.ArgumentError, match=r"from_numpy\(\): expected a NumPy array, got list"):
        of.from_numpy([1.0])
    assert of.as_tensor(a).numpy() is a


def test_a_torch_name_opforge_lacks_says_so_and_points_to_the_nearest():
    with pytest.raises(AttributeError, match=r"torch.histc is PyTorch's, and opforge does not have it"):
        of.histc(of.zeros(3), 4)
    with pytest.raises(AttributeError, match=r"has no attribute 'tensr'; the nearest names opforge has: tensor"):
        of.tensr([1.0])
    with pytest.raises(AttributeError, match=r"torch.cumsumm|the nearest names opforge has: cumsum"):
        of.cumsumm
    assert not hasattr(of, "embedding")  # torch.embedding(weight, input): the other order than F.embedding
    assert hasattr(torch, "embedding") and not hasattr(of, "batch_norm")
    r = of.normal(0.0, 0.01, size=(200, 2), requires_grad=True)  # torch's form, over the op normal(*, shape...)
    assert r.shape == (200, 2) and r.requires_grad and abs(float(r.std()) - 0.01) < 0.002
    assert of.normal(of.zeros(3), of.ones(3) * 1e-9).shape == (3,)


def test_set_grad_enabled_switches_when_called_as_torchs_does():
    for m in (of, torch):
        assert m.is_grad_enabled()
        m.set_grad_enabled(False)  # a call on its own switches at once
        try:
            assert not m.is_grad_enabled()
            with m.set_grad_enabled(True):
                assert m.is_grad_enabled()
            assert not m.is_grad_enabled()
        finally:
            m.set_grad_enabled(True)
        with m.no_grad():
            assert not m.is_grad_enabled()
        assert m.is_grad_enabled()

        @m.no_grad()
        def f(m=m):
            return m.is_grad_enabled()

        @m.set_grad_enabled(False)
        def g(m=m):
            return m.is_grad_enabled()

        @m.inference_mode()
        def h(m=m):
            return m.is_grad_enabled()

        assert m.is_grad_enabled() and not f() and not g() and not h() and m.is_grad_enabled()


# -- Tensor methods torch users write -----------------------------------------------------------------------------

_M = np.random.default_rng(5).standard_normal((3, 4))
METHODS = {
    "eq": lambda t: t.eq(t * (t > 0)), "ne(0.5)": lambda t: t.ne(0.5), "ge": lambda t: t.ge(t.mean()),
    "view_as": lambda t: t.view_as(t.flatten()), "reshape_as": lambda t: t.reshape_as(t.T),
    "t": lambda t: t.t(), "T": lambda t: t.T, "mT": lambda t: t.reshape(1, 3, 4).mT,
    "contiguous": lambda t: t.transpose(0, 1).contiguous(), "narrow": lambda t: t.narrow(1, 1, 2),
    "norm": lambda t: t.norm(), "norm(2, 1)": lambda t: t.norm(2, 1), "norm(dim=0)": lambda t: t.norm(dim=0),
    "split(2, 1)": lambda t: t.split(2, 1), "split([1, 2])": lambda t: t.split([1, 2]),
    "chunk(2)": lambda t: t.chunk(2), "chunk(3, dim=1)": lambda t: t.chunk(3, dim=1),
    "mm": lambda t: t.mm(t.T), "bmm": lambda t: t.reshape(1, 3, 4).bmm(t.T.reshape(1, 4, 3)),
    "flatten": lambda t: t.reshape(3, 2, 2).flatten(1), "unflatten": lambda t: t.unflatten(1, (2, -1)),
    "expand": lambda t: t[:, :1].expand(3, 5), "expand(-1)": lambda t: t.expand(2, -1, -1),
    "expand_as": lambda t: t[:1].expand_as(t),
    "repeat": lambda t: t.repeat(2, 1), "repeat(new dims)": lambda t: t.repeat(2, 1, 3),
    "masked_fill": lambda t: t.masked_fill(t > 0, 0.0),
    "masked_fill(-inf)": lambda t: t.masked_fill(t < 0, float("-inf")),
    "index_select": lambda t: t.index_select(1, _idx(t, [3, 0])),
    "type_as": lambda t: t.type_as(t.argmax(1)), "type(float)": lambda t: t.type(_mod(t).float),
    "argmax(1)": lambda t: t.argmax(1), "argmax(dim=0, keepdim=True)": lambda t: t.argmax(dim=0, keepdim=True),
    "topk": lambda t: tuple(t.topk(2)),
    "topk(2, dim=0, largest=False)": lambda t: tuple(t.topk(2, dim=0, largest=False)),
    "unbind": lambda t: t.unbind(), "unbind(1)": lambda t: t.unbind(1),
    "sort": lambda t: tuple(t.sort()), "sort(0, True)": lambda t: tuple(t.sort(0, True)),
    "argsort(descending)": lambda t: t.argsort(descending=True),
    "gather": lambda t: t.gather(1, _idx(t, [[0, 1], [2, 2], [3, 0]])),
    "scatter_add": lambda t: t.scatter_add(0, _idx(t, [[0, 1, 2, 0]]), t[:1]),
    "index_add": lambda t: t.index_add(0, _idx(t, [2, 0]), t[:2], alpha=2.0),
    "float": lambda t: t.float(), "double": lambda t: t.float().double(), "long": lambda t: (t * 3).long(),
    "int": lambda t: (t * 3).int(), "bool": lambda t: t.bool(),
    "abs": lambda t: t.abs(), "exp": lambda t: t.exp(), "log": lambda t: t.abs().log(),
    "sqrt": lambda t: t.abs().sqrt(),
    "pow(2)": lambda t: t.pow(2), "pow(t)": lambda t: t.abs().pow(t), "rsqrt": lambda t: t.abs().rsqrt(),
    "sigmoid": lambda t: t.sigmoid(), "tanh": lambda t: t.tanh(), "relu": lambda t: t.relu(),
    "softmax(1)": lambda t: t.softmax(1), "log_softmax(dim=0)": lambda t: t.log_softmax(dim=0),
    "sum(1)": lambda t: t.sum(1), "sum(dim=(0, 1))": lambda t: t.sum(dim=(0, 1)),
    "mean(0, True)": lambda t: t.mean(0, True),
    "std(1)": lambda t: t.std(1), "var(dim=0)": lambda t: t.var(dim=0), "prod(1)": lambda t: t.prod(1),
    "cumsum(1)": lambda t: t.cumsum(1), "logsumexp(1)": lambda t: t.logsumexp(1),
    "max(1)": lambda t: tuple(t.max(1)), "min()": lambda t: t.min(), "amax(dim=1)": lambda t: t.amax(dim=1),
    "clamp(min=0)": lambda t: t.clamp(min=0), "clip(-1, 1)": lambda t: t.clip(-1, 1),
    "add(alpha)": lambda t: t.add(t, alpha=2), "sub(alpha)": lambda t: t.sub(1.5, alpha=2), "mul": lambda t: t.mul(t),
    "div": lambda t: t.div(3.0), "where": lambda t: t.where(t > 0, -1.0), "maximum": lambda t: t.maximum(t.T.T * 0),
    "squeeze(0)": lambda t: t.unsqueeze(0).squeeze(0), "unsqueeze(dim=1)": lambda t: t.unsqueeze(dim=1),
    "flip(0)": lambda t: t.flip(0), "flip(0, 1)": lambda t: t.flip(0, 1), "roll(1, 1)": lambda t: t.roll(1, 1),
    "tril(1)": lambda t: t.tril(1), "diagonal()": lambda t: t.diagonal(), "view(-1, 2)": lambda t: t.view(-1, 2),
    "view((2, 6))": lambda t: t.view((2, 6)), "permute": lambda t: t.reshape(3, 2, 2).permute(2, 0, 1),
    "dim": lambda t: t.dim(), "numel": lambda t: t.numel(), "nelement": lambda t: t.nelement(),
    "element_size": lambda t: t.element_size(), "is_floating_point": lambda t: t.is_floating_point(),
    "new_zeros": lambda t: t.new_zeros(2, 3), "new_ones((2,))": lambda t: t.new_ones((2,)),
    "new_full": lambda t: t.new_full((2, 2), 3.5), "new_tensor": lambda t: t.new_tensor([1, 2]),
    "new_zeros(dtype)": lambda t: t.new_zeros(3, dtype=_mod(t).int64), "size(1)": lambda t: t.size(1),
    "item of index": lambda t: ["a", "b", "c", "d"][t.argmax(1)[0]],
}


def _mod(t):
    return torch if isinstance(t, torch.Tensor) else of


def _idx(t, values):
    return _mod(t).tensor(values)


@pytest.mark.parametrize("case", list(METHODS))
def test_tensor_methods_are_torchs(case):
    method = METHODS[case]
    ours, theirs = method(of.tensor(_M)), method(torch.tensor(_M))
    if isinstance(theirs, (bool, int, str)):
        assert ours == theirs and type(ours) is type(theirs), (ours, theirs)
    else:
        same(ours, theirs, rtol=1e-12)


@pytest.mark.parametrize("case", ["narrow", "expand", "repeat", "chunk(3, dim=1)", "unbind(1)", "mm", "flatten",
                                  "masked_fill", "gather", "index_select", "t", "mT", "norm(2, 1)", "topk"])
def test_tensor_methods_give_torchs_gradients(case):
    x, t = of.tensor(_M, requires_grad=True), torch.tensor(_M, requires_grad=True)
    ours, theirs = METHODS[case](x), METHODS[case](t)
    ours, theirs = (ours, theirs) if isinstance(theirs, (tuple, list)) else ((ours,), (theirs,))
    weights = [np.random.default_rng(i).standard_normal(tuple(u.shape)) for i, u in enumerate(theirs)]
    sum(F.sum(y * of.tensor(w)) for y, w in zip(ours, weights) if y.dtype.kind == "f").backward()
    sum((u * torch.tensor(w)).sum() for u, w in zip(theirs, weights) if u.dtype.is_floating_point).backward()
    same(x.grad, t.grad, rtol=1e-12)


IN_PLACE = {
    "exp_": lambda t: t.exp_(), "pow_(2)": lambda t: t.pow_(2), "abs_": lambda t: t.abs_(), "neg_": lambda t: t.neg_(),
    "sqrt_": lambda t: t.abs_().sqrt_(), "sigmoid_": lambda t: t.sigmoid_(), "tanh_": lambda t: t.tanh_(),
    "relu_": lambda t: t.relu_(), "floor_": lambda t: t.floor_(), "round_": lambda t: t.round_(),
    "clamp_": lambda t: t.clamp_(-0.5, 0.5), "clip_": lambda t: t.clip_(max=0.0),
    "masked_fill_": lambda t: t.masked_fill_(t > 0, 2.0),
    "index_add_": lambda t: t.index_add_(0, _idx(t, [2, 0]), t[:2] * 1.0),
    "scatter_add_": lambda t: t.scatter_add_(1, _idx(t, [[0], [1], [3]]), t[:, :1] * 1.0),
    "add_(alpha)": lambda t: t.add_(1.0, alpha=3), "mul_": lambda t: t.mul_(2), "div_": lambda t: t.div_(4),
    "zero_": lambda t: t.zero_(), "fill_": lambda t: t.fill_(1.5), "copy_": lambda t: t.copy_(t * 0 + 2),
}


@pytest.mark.parametrize("case", list(IN_PLACE))
def test_in_place_forms_write_into_the_tensor_as_torchs(case):
    x, t = of.tensor(_M), torch.tensor(_M)
    view_x, view_t = x[1], t[1]  # a view sees the write
    assert IN_PLACE[case](x) is x and IN_PLACE[case](t) is t
    same(x, t, rtol=1e-12)
    same(view_x, view_t, rtol=1e-12)


def test_in_place_forms_keep_the_history_as_torchs():
    a, b = of.tensor(_M, requires_grad=True), torch.tensor(_M, requires_grad=True)
    y, u = a * 2, b * 2
    y.masked_fill_(y > 1, 0.0).exp_().sum().backward()
    u.masked_fill_(u > 1, 0.0).exp_().sum().backward()
    same(a.grad, b.grad, rtol=1e-12)
    with pytest.raises(of.GradientError, match="a leaf tensor that requires grad"):
        a.exp_()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        b.exp_()


def test_random_in_place_forms_and_data_as_torch_init_code_uses_them():
    w = of.ones(200, 100, requires_grad=True)
    w.data.normal_(mean=0.0, std=0.02)  # torch's init idiom: .data shares memory, with no history
    assert abs(float(w.std()) - 0.02) < 0.002 and w.is_leaf and w.requires_grad
    with of.no_grad():
        w.uniform_(-0.1, 0.1)
    assert float(w.min()) >= -0.1 and float(w.max()) < 0.1
    w.data = of.zeros(3)  # torch: the tensor now holds that data
    assert w.shape == (3,) and w.requires_grad
    with pytest.raises(TypeError, match="only an integer tensor of one element converts to an index"):
        [1, 2][of.tensor(1.0)]
    with pytest.raises(TypeError):
        [1, 2][torch.tensor(1.0)]


def test_method_errors_name_the_difference():
    x, t = of.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(of.ArgumentError, match=r"repeat\(\): 1 repeat counts \(2,\) for a tensor of 2 dims"):
        x.repeat(2)
    with pytest.raises(RuntimeError):
        t.repeat(2)
    with pytest.raises(of.ShapeError, match=r"t\(\): expects a tensor of at most 2 dims"):
        of.ones(2, 2, 2).t()
    with pytest.raises(RuntimeError):
        torch.ones(2, 2, 2).t()
    with pytest.raises(of.ShapeError, match=r"mm\(\): takes two 2-D tensors"):
        x.mm(of.ones(3))
    with pytest.raises(RuntimeError):
        t.mm(torch.ones(3))
    with pytest.raises(of.ShapeError, match=r"narrow\(\): start 2 and length 2 do not fit in dim 0 of size 2"):
        x.narrow(0, 2, 2)
    with pytest.raises(RuntimeError):
        t.narrow(0, 2, 2)


def test_methods_run_compiled_as_eagerly():
    def f(t):
        a, b = t.chunk(2, 1)
        return (a.expand(2, -1, -1).flatten(1) + b.repeat(2, 1).view(2, -1)).sum(dim=1, keepdim=True).mT

    x = of.tensor(np.random.default_rng(0).standard_normal((3, 4)))
    same(of.compile(f)(x), f(x), rtol=1e-12)
    same(f(x), f(torch.tensor(x.numpy())), rtol=1e-12)


# -- item assignment -------------------------------------------------------------------------------------------------

_G = np.arange(24.0).reshape(2, 3, 4) / 7
SET_ITEMS = {  # index, value
    "t[0] = 5": ((0,), 5.0), "t[:, 1] = row": ((slice(None), 1), np.array([7.0, 8, 9, 1])),
    "t[mask] = 0": ((_G > 1,), 0.0), "t[mask] = values": ((_G[..., 0] > 1,), np.array([1.0, 2, 3, 4])),
    "t[[0, 1]] = -1": (([0, 1],), -1.0), "t[0, :, [1, 2]] = v": ((0, slice(None), [1, 2]), np.array([1.0, 2])),
    "t[..., [0, 3]] = 9": ((Ellipsis, [0, 3]), 9.0),
    "t[1, [0, 2], [1, 3]] = v": ((1, [0, 2], [1, 3]), np.array([5.0, 6])),
    "t[1:, ::2] = 3": ((slice(1, None), slice(None, None, 2)), 3.0), "t[None, 0] = int": ((None, 0), 2),
}


def _index_for(module, index):
    return tuple(module.tensor(i) if isinstance(i, (list, np.ndarray)) else i for i in index)


@pytest.mark.parametrize("case", list(SET_ITEMS))
@pytest.mark.parametrize("grad", [False, True])
def test_item_assignment_writes_as_torchs_and_differentiates(case, grad):
    index, value = SET_ITEMS[case]
    x, t = of.tensor(_G, requires_grad=grad), torch.tensor(_G, requires_grad=grad)
    vx, vt = ((of.tensor(value, requires_grad=True), torch.tensor(value, requires_grad=True))
              if isinstance(value, np.ndarray) else (value, value))
    y, u = x * 1.0, t * 1.0
    view_y = y[1]
    y[_index_for(of, index)] = vx
    u[_index_for(torch, index)] = vt
    same(y, u)
    assert y._version == 1 and u._version == 1
    if not grad and not isinstance(value, np.ndarray):
        same(view_y, u[1])  # written into the memory: a view sees it
    if grad or isinstance(value, np.ndarray):
        w = np.random.default_rng(0).standard_normal(_G.shape)
        (y * of.tensor(w)).sum().backward()
        (u * torch.tensor(w)).sum().backward()
        if grad:
            same(x.grad, t.grad)  # none to the overwritten part
        if isinstance(value, np.ndarray):
            same(vx.grad, vt.grad)


def test_item_assignment_is_refused_where_torch_refuses_it():
    w, tw = of.ones(2, 3, requires_grad=True), torch.ones(2, 3, requires_grad=True)
    with pytest.raises(of.GradientError, match=r"item assignment \(t\[index\] = value\): a leaf tensor that "
                                               r"requires grad"):
        w[0] = 1.0
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        tw[0] = 1.0
    with of.no_grad():
        w[0] = 2.0  # as torch: fine without recording
    with torch.no_grad():
        tw[0] = 2.0
    same(w, tw)
    a, ta = of.ones(3), torch.ones(3)
    y, u = w[0] * a, tw[0] * ta  # mul saved a: writing it makes backward refuse, in both
    a[0], ta[0] = 5.0, 5.0
    with pytest.raises(of.GradientError, match=r"modified in place by item assignment"):
        y.sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        u.sum().backward()
    with pytest.raises(of.ArgumentError, match=r"a float64 value cannot be written into a int64 tensor"):
        of.zeros(3, dtype="int64")[0] = 1.5  # torch truncates to 1: refused here (docs/pytorch.md)
    with pytest.raises(of.ShapeError):
        (w * 1)[0] = of.ones(4)  # does not broadcast to (3,)
    with pytest.raises(RuntimeError):
        (tw * 1)[0] = torch.ones(4)


def test_item_assignment_runs_compiled_as_eagerly():
    def f(x, v):
        y = x * 2.0
        y[y > 3.0] = 0.0  # a mask the function computes
        y[:, 0] = v
        y[[1, 0], [2, 2]] = -1.0
        return y

    x, v = of.tensor(np.arange(6.0).reshape(2, 3)), of.tensor([10.0, 20.0])
    step = of.compile(f)
    same(step(x, v), f(x, v))
    same(f(x, v), f(torch.tensor(x.numpy()), torch.tensor(v.numpy())))

    def g(x):  # an argument written in place: its memory takes the value after the run, as eagerly
        x[0] = 7.0
        return x * 1.0

    a, b = of.tensor(np.ones((2, 2))), of.tensor(np.ones((2, 2)))
    same(of.compile(g)(a), g(b))
    same(a, b)


# -- nn.Parameter, device=, smooth_l1_loss, save and load ------------------------------------------------------------

def test_parameter_is_a_class_as_torchs():
    from opforge import nn

    data = of.ones(3)
    p = nn.Parameter(data)
    assert isinstance(p, nn.Parameter) and isinstance(p, of.Tensor) and p.requires_grad and p.is_leaf
    data.add_(1.0)  # torch's Parameter shares its data's memory
    same(p, torch.nn.Parameter(torch.ones(3) + 1))
    assert not isinstance(data, nn.Parameter) and not isinstance(p * 2, nn.Parameter)
    assert not isinstance(nn.Parameter(of.ones(2), requires_grad=False), nn.Parameter)  # opforge: a leaf that
    model = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2))  # requires grad is what makes a parameter
    assert all(isinstance(q, nn.Parameter) for q in model.parameters())
    assert [isinstance(q, torch.nn.Parameter) for q in torch.nn.Linear(3, 2).parameters()] == [True, True]


def test_layers_take_device_and_dtype():
    from opforge import nn

    for layer in (nn.Linear(3, 4, device="cpu", dtype=of.float64), nn.Conv2d(2, 3, 3, device="cpu", dtype="float64"),
                  nn.LayerNorm(4, device=of.device("cpu"), dtype=of.float64), nn.Embedding(5, 2, dtype=of.float64),
                  nn.BatchNorm1d(3, device="cpu", dtype=of.float64)):
        assert all(t.dtype == np.float64 and t.device == "cpu" for t in layer.parameters())
    twin = of.register_device("twin", kernels_of="cpu") if "twin" not in of.core.devices._DEVICES else of.device(
        "twin")  # a second host device (tests/test_devices.py's)
    layer = nn.Linear(2, 2, device=twin)
    assert layer.weight.device == "twin" and layer.bias.device == "twin"


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [1, "same"])
def test_conv_padding_modes_are_torchs(mode, padding):
    from opforge import nn

    ours = nn.Conv2d(2, 3, 3, padding=padding, padding_mode=mode, dilation=1 if padding == 1 else 2, dtype="float64")
    theirs = torch.nn.Conv2d(2, 3, 3, padding=padding, padding_mode=mode, dilation=1 if padding == 1 else 2,
                             dtype=torch.float64)
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 5))
    same(ours(of.tensor(x)), theirs(torch.tensor(x)), rtol=1e-12)
    with pytest.raises(of.ArgumentError, match=r"ConvTranspose2d\(\): padding_mode must be one of \('zeros',\)"):
        nn.ConvTranspose2d(2, 3, 3, padding_mode="reflect")


@pytest.mark.parametrize("beta", [1.0, 0.25, 0.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_smooth_l1_loss_is_torchs(beta, reduction):
    from opforge import nn

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 5)) * 2, rng.standard_normal((4, 5))
    a, b = of.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ours = F.smooth_l1_loss(a, of.tensor(y), reduction=reduction, beta=beta)
    theirs = TF.smooth_l1_loss(b, torch.tensor(y), reduction=reduction, beta=beta)
    same(ours, theirs, rtol=1e-12)
    ours.sum().backward(), theirs.sum().backward()
    same(a.grad, b.grad, rtol=1e-12)
    same(nn.SmoothL1Loss(reduction=reduction, beta=beta)(a, of.tensor(y)),
         torch.nn.SmoothL1Loss(reduction=reduction, beta=beta)(b, torch.tensor(y)), rtol=1e-12)


def test_save_and_load_take_file_objects():
    import io

    from opforge import nn

    model = nn.Linear(3, 2)
    buffer = io.BytesIO()
    of.save({"model": model.state_dict(), "epoch": 3}, buffer)
    buffer.seek(0)
    loaded = of.load(buffer, weights_only=True, map_location="cpu")
    assert loaded["epoch"] == 3 and set(loaded["model"]) == {"weight", "bias"}
    same(loaded["model"]["weight"], torch.tensor(model.weight.numpy()))


def test_a_torch_state_dict_in_safetensors_loads_without_torch(tmp_path):
    import safetensors.torch

    from opforge import nn

    theirs = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2))
    safetensors.torch.save_file(theirs.state_dict(), str(tmp_path / "model.safetensors"))
    ours = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2))
    ours.load_state_dict(of.load(tmp_path / "model.safetensors"))  # found by its content, not its name
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    same(ours(of.tensor(x)), theirs(torch.tensor(x)), rtol=1e-5, atol=1e-6)
    of.save(ours.state_dict(), tmp_path / "ours.safetensors")  # and back: torch reads what we write
    back = safetensors.torch.load_file(str(tmp_path / "ours.safetensors"))
    assert set(back) == set(theirs.state_dict()) and all(torch.equal(back[k], v) for k, v in
                                                          theirs.state_dict().items())
    with open(tmp_path / "ours.safetensors", "rb") as f:
        assert set(of.load(f)) == set(back)


def test_a_pickle_checkpoint_is_refused_saying_why(tmp_path):
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "model.pth")
    with pytest.raises(of.checkpoint.CheckpointError, match=r"PyTorch pickle checkpoint \(torch.save\): reading "
                                                             r"it would run pickle"):
        of.load(tmp_path / "model.pth")
    (tmp_path / "bad.safetensors").write_bytes((12).to_bytes(8, "little") + b'{"a": 1, "b"')
    with pytest.raises(of.checkpoint.CheckpointError, match="not a readable safetensors file"):
        of.load(tmp_path / "bad.safetensors")
