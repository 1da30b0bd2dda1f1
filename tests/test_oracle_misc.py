"""PyTorch as the oracle for sort, argsort, topk, normalize, cosine_similarity, pairwise_distance, embedding_bag and
the channel-wise dropouts, and for their layers (nn.CosineSimilarity, nn.PairwiseDistance, nn.EmbeddingBag,
nn.Dropout1d/2d/3d).

``MISC_ORACLE`` maps each op to its torch counterpart as the other oracle tables do, and the same runners compare
values, VJPs and HVPs in float64 on the op's own samples plus the extras here. Ops with several outputs (values and
indices) are compared as one tensor, the outputs flattened and concatenated in the same way on both sides. The
dropouts draw at random: their tests check what a draw must look like (whole channels, scaled, the same mask in
backward) rather than values.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from test_torch_oracle import (
    OPFORGE,
    TORCH,
    Oracle,
    _declared_samples,
    assert_same,
    check_forward,
    check_hvp,
    check_vjp,
    forward,
    hvp,
    program_matches_eager,
    randn,
    uniform,
    vjp,
)

import opforge as of
from opforge import Sample, nn
from opforge import ops as F
from opforge.testing import call_op

TF = torch.nn.functional


def torch_embedding_bag(index, weight, offsets=None, per_sample_weights=None, *, mode, include_last_offset,
                        padding_idx):
    return TF.embedding_bag(index.long(), weight, None if offsets is None else offsets.long(), mode=mode,
                            per_sample_weights=per_sample_weights, include_last_offset=include_last_offset,
                            padding_idx=padding_idx)


def torch_embedding_bag_by_hand(index, weight, offsets=None, per_sample_weights=None, *, mode, include_last_offset,
                                padding_idx):
    """embedding_bag from ops torch can differentiate twice (its own backward cannot be): for the HVPs. Checked
    against torch's embedding_bag by ``test_embedding_bag_by_hand_is_torchs``."""
    index = index.long()
    if index.dim() == 2:
        count, flat = index.shape[0], index.reshape(-1)
        bag = torch.arange(count).repeat_interleave(index.shape[1])
    else:
        offsets, flat = offsets.long(), index
        count = len(offsets) - include_last_offset
        bag = torch.searchsorted(offsets[:count], torch.arange(len(flat)), right=True) - 1
    used = torch.ones(len(flat), dtype=torch.bool)
    if padding_idx is not None:
        used &= flat != padding_idx % weight.shape[0]
    rows, bag = weight[flat[used]], bag[used]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1)[used, None]
    y = torch.zeros(count, weight.shape[1], dtype=weight.dtype)
    if mode == "max":  # ties share the gradient here (embedding_bag gives it to the first): compare without ties
        return y.scatter_reduce(0, bag[:, None].expand_as(rows), rows, "amax", include_self=False)
    y = y.index_add(0, bag, rows)
    return y / torch.bincount(bag, minlength=count).clamp(min=1)[:, None] if mode == "mean" else y


def apart(*shape):
    return np.asarray(uniform(0.3, 1.5, *shape) * np.random.default_rng(11).choice([-1, 1], shape))


_W = randn(7, 3)

MISC_ORACLE: dict[str, Oracle] = {
    # -- sorting ----------------------------------------------------------------------------------------------------
    "sort": Oracle(lambda x, axis, descending, stable: torch.sort(x, dim=axis, descending=descending, stable=True),
                   extra=(
        Sample.of(np.array([3.0, np.nan, 1.0, 3.0, -np.inf, 1.0]), descending=True),  # NaN is the largest
        Sample.of(np.array([3.0, np.nan, 1.0, 3.0, -np.inf, 1.0])),
        Sample.of(np.array([[True, False, True], [False, False, True]]), axis=0, descending=True),
        Sample.of(randn(3, 0), axis=1),
    )),
    "argsort": Oracle(lambda x, axis, descending, stable: torch.argsort(x, dim=axis, descending=descending,
                                                                           stable=True), extra=(
        Sample.of(np.array([2, 1, 2, 0, 1, 2], np.int32), descending=True),
    )),
    "topk": Oracle(lambda x, k, axis, largest, sorted: torch.topk(x, k, dim=axis, largest=largest, sorted=True),
                   extra=(
        Sample.of(randn(4, 6), k=6, axis=-1, largest=False),
        Sample.of(np.array([1.0, np.nan, 3.0, 2.0]), k=2),
        Sample.of(randn(2, 5), k=3, sorted=False),  # sorted all the same
    )),
    # -- norms put to use -------------------------------------------------------------------------------------------
    "normalize": Oracle(lambda x, p, axis, eps: TF.normalize(x, p=p, dim=axis, eps=eps), extra=(
        Sample.of(randn(2, 3, 4), p=1.5, axis=1),
        Sample.of(apart(3, 4), p=math.inf, axis=0),  # distinct values: no ties for the largest
        Sample.of(randn(), axis=0),
        Sample.of(np.zeros((2, 3)), axis=1),  # the zero vector: 0, with the gradient 1/eps
    )),
    "cosine_similarity": Oracle(lambda x1, x2, axis, eps: TF.cosine_similarity(x1, x2, dim=axis, eps=eps), extra=(
        Sample.of(randn(2, 3, 4), randn(2, 1, 4), axis=-1),
        Sample.of(randn(5), randn(5), axis=0),
        Sample.of(randn(2, 3) * 1e-4, randn(2, 3) * 1e4),
    )),
    "pairwise_distance": Oracle(lambda x1, x2, p, eps, keepdim: TF.pairwise_distance(x1, x2, p=p, eps=eps,
                                                                                      keepdim=keepdim), extra=(
        Sample.of(randn(2, 3, 4), randn(3, 4)),
        Sample.of(randn(3), randn(3), keepdim=True),
        Sample.of(randn(4, 3), randn(4, 3), p=0.5),
    )),
    # -- bags of embeddings -----------------------------------------------------------------------------------------
    "embedding_bag": Oracle(torch_embedding_bag, extra=(
        Sample.of(np.array([[0, 6], [6, 6]], np.int32), _W, mode="sum", padding_idx=6),  # a bag of padding only
        Sample.of(np.array([1, 4, 4, 0, 2, 5]), _W, np.array([0, 0, 2, 6]), mode="max"),  # empty bag first
        Sample.of(np.array([1, 4, 4, 0, 2]), _W, np.array([0, 2, 2, 5], np.int32), randn(5), mode="sum",
                  include_last_offset=True),
        Sample.of(np.array([1, 4, 3, 0, 2]), _W, np.array([0, 2, 2]), mode="mean", padding_idx=-3),
        Sample.of(np.array([[1, 4], [0, 2]]), _W.astype(np.float32)),
    )),
}


# Cases compared on values only. Where a norm is below eps, cosine_similarity's gradient is its derivative (the
# clamped norm is a constant there); torch's treats the clamped norm as if it were the norm.
FORWARD_ONLY = {
    "cosine_similarity": (Sample.of(np.array([[1e-3, 2e-3], [0.5, 1.5]]), randn(2, 2), axis=1, eps=0.1),),
}

# torch cannot differentiate its embedding_bag twice: the HVPs compare against the same thing built from ops.
HVP_TORCH_FN = {"embedding_bag": torch_embedding_bag_by_hand}


def _values_differ_by_convention(name: str, sample: Sample) -> bool:
    """Gradients that differ from torch's by choice, not by mistake (see FORWARD_ONLY)."""
    if name == "cosine_similarity":
        x1, x2 = np.broadcast_arrays(*sample.args[:2])
        axis = sample.kwargs.get("axis", 1)
        eps = sample.kwargs.get("eps", 1e-8)
        return bool(np.any(np.linalg.norm(x1, axis=axis) < eps) or np.any(np.linalg.norm(x2, axis=axis) < eps))
    return name == "embedding_bag" and sample.kwargs.get("mode") == "max"  # repeated rows in a bag: by-hand ties


def _ties(sample: Sample) -> bool:
    x = sample.args[0]
    return x.size != np.unique(x).size


def _joined(result, cat, flat):
    return cat([flat(r) for r in result]) if isinstance(result, tuple) else result


def _pair(name: str, sample: Sample, torch_fn=None):
    """(opforge function, torch function), attrs bound. topk's tie order is torch's own choice: with ties, the
    values only are compared."""
    opdef = of.registry.get(name)
    attrs = {**{p.name: p.default for p in opdef.attrs if p.has_default}, **sample.kwargs}
    torch_fn = torch_fn or MISC_ORACLE[name].torch_fn
    values_only = name == "topk" and _ties(sample)

    def of_fn(*xs):
        out = call_op(opdef, xs, sample.kwargs)
        out = out[0] if values_only else out
        return _joined(tuple(out) if isinstance(out, tuple) else out, F.concat, lambda t: F.reshape(t, shape=[-1]))

    def t_fn(*xs):
        out = torch_fn(*xs, **attrs)
        out = out[0] if values_only else out
        return _joined(tuple(out) if isinstance(out, tuple) else out, torch.cat, lambda t: t.reshape(-1))

    return of_fn, t_fn


def _case_id(name: str, i: int, sample: Sample) -> str:
    shapes = "x".join(str(a.shape).replace(" ", "") for a in sample.args)
    attrs = "".join(f",{k}={v}" for k, v in sample.kwargs.items()).replace(" ", "")
    return f"{name}-{i}[{shapes}{attrs}]"


def _params(gradients: bool) -> list:
    params = []
    for name, oracle in MISC_ORACLE.items():
        cases = [*_declared_samples(name), *oracle.extra, *([] if gradients else FORWARD_ONLY.get(name, ()))]
        for i, case in enumerate(cases):
            floats = [a for a in case.args if a.dtype.kind == "f"]
            if gradients and (name == "argsort" or not floats or any(a.dtype != np.float64 for a in floats)
                              or any(a.size == 0 for a in floats) or _values_differ_by_convention(name, case)
                              or (name == "topk" and case.kwargs.get("k") == 0)):
                continue
            params.append(pytest.param(name, case, id=_case_id(name, i, case)))
    return params


@pytest.mark.parametrize(("name", "sample"), _params(gradients=False))
def test_forward(name, sample):
    with np.errstate(invalid="ignore", divide="ignore"):
        check_forward(*_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params(gradients=True))
def test_vjp(name, sample):
    check_vjp(*_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params(gradients=True))
def test_hvp(name, sample):
    of_fn, t_fn = _pair(name, sample, HVP_TORCH_FN.get(name))
    if name == "normalize" and not np.all(sample.args[0]):
        # At the zero vector torch's double backward meets 0·∞ in the norm's rule and gives NaN; the function is
        # x/eps there, whose second derivatives are 0.
        rng = np.random.default_rng(2)
        u = rng.standard_normal(sample.args[0].shape)
        vs = [rng.standard_normal(sample.args[0].shape)]
        got, want = hvp(OPFORGE, of_fn, sample.args, u, vs), hvp(TORCH, t_fn, sample.args, u, vs)
        for g, w in zip(got, want):
            assert_same(g, np.where(np.isnan(w), 0.0, w), "hvp (torch's NaN read as 0)")
        return
    check_hvp(of_fn, t_fn, sample.args)


_BAG_CASES = [*_declared_samples("embedding_bag"), *MISC_ORACLE["embedding_bag"].extra]


@pytest.mark.parametrize("sample", [s for s in _BAG_CASES if s.kwargs.get("mode") != "max" or not _ties(s)])
def test_embedding_bag_by_hand_is_torchs(sample):
    arrays = sample.args
    attrs = {"mode": "mean", "include_last_offset": False, "padding_idx": None, **sample.kwargs}
    by_hand = lambda *xs: torch_embedding_bag_by_hand(*xs, **attrs)  # noqa: E731
    own = lambda *xs: torch_embedding_bag(*xs, **attrs)  # noqa: E731
    assert_same(forward(TORCH, by_hand, arrays), forward(TORCH, own, arrays), "by hand")
    if all(a.dtype == np.float64 for a in arrays if a.dtype.kind == "f"):
        u = np.random.default_rng(1).standard_normal(forward(TORCH, own, arrays).shape)
        for g, w in zip(vjp(TORCH, by_hand, arrays, u), vjp(TORCH, own, arrays, u)):
            assert_same(g, w, "vjp by hand")


def test_table_covers_the_ops():
    required = {"sort", "argsort", "topk", "normalize", "cosine_similarity", "pairwise_distance", "embedding_bag"}
    assert required <= set(MISC_ORACLE), f"no oracle for {sorted(required - set(MISC_ORACLE))}"


# -- sorting details -------------------------------------------------------------------------------------------------


def test_sort_is_stable_in_both_directions():
    x = np.array([2, 1, 2, 0, 1, 2])
    assert F.argsort(of.tensor(x)).tolist() == [3, 1, 4, 0, 2, 5]
    assert F.argsort(of.tensor(x), descending=True).tolist() == [0, 2, 5, 1, 4, 3]


def test_sorted_values_get_the_gradient_where_they_came_from():
    x = of.tensor([3.0, 1.0, 2.0], requires_grad=True)
    values, _ = F.topk(x, k=2)
    (values * of.tensor([10.0, 1.0])).sum().backward()
    assert x.grad.tolist() == [10.0, 0.0, 1.0]


# -- channel-wise dropout --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "shape", "channels"), [
    ("dropout1d", (4, 6, 5), (4, 6)), ("dropout1d", (6, 5), (6,)),
    ("dropout2d", (4, 6, 3, 3), (4, 6)), ("dropout2d", (4, 6, 5), (4, 6)),  # 3-D: (N, C, L), as torch now
    ("dropout3d", (2, 6, 2, 2, 2), (2, 6)), ("dropout3d", (6, 2, 2, 2), (6,)),
])
def test_channel_dropout_drops_whole_channels_and_scales_the_rest(name, shape, channels):
    of.manual_seed(3)
    x = of.tensor(np.random.default_rng(0).uniform(1, 2, shape), requires_grad=True)
    y, mask = getattr(F, name + "_with_mask")(x, p=0.4)
    per_channel = y.numpy().reshape(*channels, -1)
    dropped = np.all(per_channel == 0, axis=-1)
    assert mask.shape == (*channels, *(1,) * (len(shape) - len(channels)))
    assert np.array_equal(~dropped, mask.numpy().reshape(channels))
    assert 0 < dropped.sum() < dropped.size
    np.testing.assert_allclose(per_channel[~dropped], (x.numpy().reshape(*channels, -1) / 0.6)[~dropped])
    (y * y).sum().backward()  # the gradient uses the same mask
    np.testing.assert_allclose(x.grad.numpy(), np.where(mask.numpy(), 2 * y.numpy() / 0.6, 0.0))
    # torch drops about as many channels (and warns that it will read a 3-D input differently one day)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = getattr(TF, name)(torch.ones((200, *shape[1:]) if len(channels) == 2 else (2000, *shape[1:])), p=0.4)
    assert abs(float((t == 0).double().mean()) - 0.4) < 0.05


def test_channel_dropout_is_reproducible_and_the_identity_in_eval():
    x = of.randn(2, 3, 4, 4)
    of.manual_seed(7)
    a = F.dropout2d(x)
    of.manual_seed(7)
    assert np.array_equal(a.numpy(), F.dropout2d(x).numpy())
    assert np.array_equal(F.dropout2d(x, training=False).numpy(), x.numpy())
    layer = nn.Dropout2d(0.5).eval()
    assert layer(x) is x


# -- layers against torch's ------------------------------------------------------------------------------------------


def test_similarity_layers_match_torch():
    a, b = randn(4, 5), randn(4, 5)
    np.testing.assert_allclose(nn.CosineSimilarity(dim=0)(of.tensor(a), of.tensor(b)).numpy(),
                               torch.nn.CosineSimilarity(dim=0)(torch.tensor(a), torch.tensor(b)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(nn.PairwiseDistance(p=3.0, keepdim=True)(of.tensor(a), of.tensor(b)).numpy(),
                               torch.nn.PairwiseDistance(p=3.0, keepdim=True)(torch.tensor(a), torch.tensor(b)).numpy(),
                               rtol=1e-12)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_layer_matches_torch_and_trains(mode):
    ours = nn.EmbeddingBag(10, 4, mode=mode, padding_idx=0, dtype="float64")
    theirs = torch.nn.EmbeddingBag(10, 4, mode=mode, padding_idx=0, dtype=torch.float64)
    assert np.all(ours.weight.numpy()[0] == 0)
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(ours.weight.numpy()))
    index, offsets = np.array([1, 0, 3, 9, 9, 2, 0]), np.array([0, 3, 3, 5])  # row 9 twice in a bag
    y = ours(of.tensor(index), of.tensor(offsets))
    want = theirs(torch.from_numpy(index), torch.from_numpy(offsets))
    np.testing.assert_allclose(y.numpy(), want.detach().numpy(), rtol=1e-12)
    (y * y).sum().backward()
    (want * want).sum().backward()
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-12)
    assert "EmbeddingBag(10, 4, mode=" in repr(ours)


def test_embedding_bag_in_a_compiled_step():
    bag = nn.EmbeddingBag(6, 3, mode="mean", dtype="float64")
    index, offsets = of.tensor(np.array([0, 2, 5, 1, 1])), of.tensor(np.array([0, 2]))

    @of.compile
    def step(index, offsets):
        loss = F.sum(bag(index, offsets) ** 2)
        return (loss, *of.grad(loss, [bag.weight]))

    _, g = step(index, offsets)
    eager = F.sum(bag(index, offsets) ** 2)
    (want,) = of.grad(eager, [bag.weight])
    np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-12)


# -- programs --------------------------------------------------------------------------------------------------------

PROGRAM_CASES = {
    "normalize": lambda x: F.normalize(x, axis=1),
    "cosine_similarity": lambda x: F.cosine_similarity(x, x * x + 1.0, axis=2),
    "cosine_similarity-broadcast": lambda x: F.cosine_similarity(x, F.sum(x, axis=0), axis=1),
    "pairwise_distance": lambda x: F.pairwise_distance(x, x * 2.0 + 1.0, p=3.0),
    "sort": lambda x: F.sort(x, axis=1, descending=True).values,
    "topk": lambda x: F.topk(x, k=2, axis=0).values,  # along the dim of unknown size
    "embedding_bag": lambda x: F.embedding_bag(of.tensor(np.array([0, 1, 1, 2])), F.sum(x, axis=0),
                                               of.tensor(np.array([0, 1, 1])), mode="mean"),
    "embedding_bag-max": lambda x: F.embedding_bag(of.tensor(np.array([[0, 1], [2, 2]])), F.sum(x, axis=0),
                                                   mode="max"),
}


@pytest.mark.parametrize("name", PROGRAM_CASES)
def test_rules_build_programs_with_unknown_dims(name):
    rng = np.random.default_rng(7)
    program_matches_eager(PROGRAM_CASES[name], rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4)),
                           (None, 3, 4))


# -- wrong calls -----------------------------------------------------------------------------------------------------


def _z(*shape):
    return of.tensor(np.zeros(shape))


_I = of.tensor(np.array([0, 1, 2]))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.sort(_z(2, 3), axis=2), r"sort\(\): axis 2 is out of range"),
    (lambda: F.topk(_z(2, 3), k=4), r"topk\(\): k=4 is more than the 3 elements"),
    (lambda: F.topk(_z(2, 3), k=-1), r"topk\(\): argument 'k'"),
    (lambda: F.topk(_z(), k=2), r"topk\(\): a 0-d tensor holds one element"),
    (lambda: F.normalize(_z(3)), r"normalize\(\): axis 1 is out of range"),
    (lambda: F.cosine_similarity(_z(2, 3), _z(2, 4)), r"cosine_similarity\(\): shapes"),
    (lambda: F.pairwise_distance(_z(3), _z(3), p=math.nan), r"pairwise_distance\(\): argument 'p'"),
    (lambda: F.embedding_bag(_I, _z(3, 2)), r"embedding_bag\(\): a 1-D index needs 1-D offsets"),
    (lambda: F.embedding_bag(of.tensor([[0]]), _z(3, 2), _I), r"embedding_bag\(\): a 2-D index .* give no offsets"),
    (lambda: F.embedding_bag(_I, _z(3, 2), of.tensor([1])), r"embedding_bag\(\): offsets must start at 0"),
    (lambda: F.embedding_bag(_I, _z(3, 2), of.tensor([0, 2, 1])), r"embedding_bag\(\): offsets must .* never"),
    (lambda: F.embedding_bag(_I, _z(3, 2), of.tensor([0, 2]), include_last_offset=True),
     r"embedding_bag\(\): with include_last_offset, the last offset .* must be 3"),
    (lambda: F.embedding_bag(of.tensor([[3]]), _z(3, 2)), r"embedding_bag\(\): index holds 3, outside \[0, 3\)"),
    (lambda: F.embedding_bag(of.tensor([[0]]), _z(3, 2), None, per_sample_weights=_z(1, 1)),
     r"embedding_bag\(\): per_sample_weights are for mode 'sum' only"),
    (lambda: F.embedding_bag(of.tensor([[0]]), _z(3, 2), mode="min"), r"embedding_bag\(\): argument 'mode'"),
    (lambda: F.dropout2d(_z(2, 3)), r"dropout2d\(\): expects an input of rank 3 or 4"),
    (lambda: F.dropout1d(_z(2, 3, 4, 5)), r"dropout1d\(\): expects an input of rank 2 or 3"),
    (lambda: F.dropout3d(_z(2, 3, 4), p=1.5), r"dropout3d\(\): argument 'p'"),
    (lambda: nn.EmbeddingBag(3, 2, mode="min"), r"EmbeddingBag\(\): mode must be"),
])
def test_errors_name_the_op(call, message):
    with pytest.raises(of.OpforgeError, match=message):
        call()
