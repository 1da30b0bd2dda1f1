"""opforge.nn: Module bookkeeping (parameters, buffers, state dicts, train/eval), layers against torch.nn with the same
weights, gradients of small models against torch, initialisations, and layers inside ``of.compile``.

Weights go from opforge to torch through ``state_dict``/``load_state_dict`` with strict=True, so every layer
comparison also checks that our parameter and buffer names and shapes are PyTorch's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.nn import init

F64 = of.float64
TNN = torch.nn


def to_torch(ours: nn.Module, theirs: torch.nn.Module) -> torch.nn.Module:
    """``theirs`` in float64 holding our weights and buffers (strict: the same names and shapes)."""
    theirs = theirs.double()
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    return theirs


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a.numpy() if isinstance(a, of.Tensor) else a))


def close(ours, theirs, rtol=1e-10, atol=1e-12):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    np.testing.assert_allclose(ours.numpy() if isinstance(ours, of.Tensor) else ours, theirs, rtol=rtol, atol=atol)


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# -- Module bookkeeping ------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)
        self.gain = of.ones(4, requires_grad=True)

    def forward(self, x):
        return F.relu(self.norm(self.fc(x))) * self.gain


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Sequential(nn.Linear(4, 2), nn.Tanh())
        self.register_buffer("step", of.zeros(()))
        self.cache = None

    def forward(self, x):
        x = self.blocks[0](x)
        x = F.sum(x, axis=[1], keepdim=True) * of.ones(1, 3)  # back to 3 features for the second block
        return self.head(self.blocks[1](x))


def test_parameters_and_buffers_are_found_by_attribute_with_dotted_names():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["blocks.0.gain", "blocks.0.fc.weight", "blocks.0.fc.bias", "blocks.0.norm.weight",
                     "blocks.0.norm.bias", "blocks.1.gain", "blocks.1.fc.weight", "blocks.1.fc.bias",
                     "blocks.1.norm.weight", "blocks.1.norm.bias", "head.0.weight", "head.0.bias"]
    assert [p is net.blocks[0].fc.weight for p in net.parameters()].count(True) == 1
    assert [n for n, _ in net.named_buffers()] == [
        "step", "blocks.0.norm.running_mean", "blocks.0.norm.running_var", "blocks.0.norm.num_batches_tracked",
        "blocks.1.norm.running_mean", "blocks.1.norm.running_var", "blocks.1.norm.num_batches_tracked"]
    assert [n for n, _ in net.named_modules()][:4] == ["", "blocks", "blocks.0", "blocks.0.fc"]
    assert [n for n, _ in net.named_children()] == ["blocks", "head"]
    assert [n for n, _ in net.head.named_parameters(prefix="head")] == ["head.0.weight", "head.0.bias"]
    assert [n for n, _ in net.blocks[0].named_parameters(recurse=False)] == ["gain"]
    assert len(net.blocks) == 2 and len(net.head) == 2 and isinstance(net.head[:1], nn.Sequential)


def test_what_is_not_a_parameter():
    m = nn.Module()
    m.frozen = of.ones(2)  # no grad: a plain attribute (register_buffer makes state)
    m.computed = of.ones(2, requires_grad=True) * 2  # not a leaf: an activation someone keeps, not a parameter
    m.number = 3
    assert list(m.named_parameters()) == [] and list(m.named_buffers()) == []
    m.w = nn.Parameter(np.ones(2))
    assert [n for n, _ in m.named_parameters()] == ["w"] and m.w.requires_grad and m.w.is_leaf


def test_shared_parameters_come_once_and_are_in_the_state_dict_under_each_name():
    a = nn.Linear(2, 2)
    m = nn.Sequential(a, nn.ReLU(), a)
    assert [n for n, _ in m.named_parameters()] == ["0.weight", "0.bias"]
    assert list(m.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_reassigning_and_deleting_attributes_updates_the_registries():
    m = nn.Linear(2, 3)
    m.bias = None  # a registered parameter may become None (absent)
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    with pytest.raises(of.ArgumentError, match=r"parameter 'weight'.*leaf Tensor that requires grad"):
        m.weight = of.ones(3, 2)
    m.weight = nn.Linear(2, 2)  # a parameter name can become a submodule
    assert [n for n, _ in m.named_parameters()] == ["weight.weight", "weight.bias"]
    del m.weight
    assert list(m.named_parameters()) == [] and not hasattr(m, "weight")
    bn = nn.BatchNorm1d(2)
    with pytest.raises(of.ArgumentError, match="buffer 'running_mean'"):
        bn.running_mean = 1.0


def test_registration_errors():
    class Forgot(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)

    with pytest.raises(of.ArgumentError, match=r"call super\(\).__init__\(\)"):
        Forgot()
    m = nn.Module()
    with pytest.raises(of.ArgumentError, match="does not require grad"):
        m.register_buffer("b", of.ones(2, requires_grad=True))
    with pytest.raises(of.ArgumentError, match=r"without '\.'"):
        m.register_buffer("a.b", of.ones(2))
    m.x = 1
    with pytest.raises(of.ArgumentError, match="'x' already exists"):
        m.register_buffer("x", of.ones(2))
    with pytest.raises(of.ArgumentError, match="leaf Tensor that requires grad"):
        m.register_parameter("p", of.ones(2))
    with pytest.raises(NotImplementedError, match="Module has no forward"):
        m(1)


def test_non_persistent_buffers_are_not_in_the_state_dict():
    m = nn.Module()
    m.register_buffer("kept", of.zeros(2))
    m.register_buffer("scratch", of.zeros(2), persistent=False)
    assert [n for n, _ in m.named_buffers()] == ["kept", "scratch"]
    assert list(m.state_dict()) == ["kept"]


def test_train_and_eval_reach_every_submodule():
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.blocks.train()
    assert not net.training and all(m.training for m in net.blocks.modules())
    with pytest.raises(of.ArgumentError, match="mode must be a bool"):
        net.train("yes")


def test_zero_grad_and_requires_grad():
    m = nn.Linear(3, 2)
    F.sum(m(of.randn(4, 3))).backward()
    assert m.weight.grad is not None
    m.zero_grad()
    assert m.weight.grad is None and m.bias.grad is None
    m.requires_grad_(False)
    assert not m.weight.requires_grad
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]  # frozen parameters are still parameters


def test_repr_is_nested_like_torch():
    m = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, bias=False), nn.ReLU(), nn.Sequential(nn.Linear(4, 2)))
    assert repr(m) == (
        "Sequential(\n"
        "  (0): Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)\n"
        "  (1): ReLU()\n"
        "  (2): Sequential(\n"
        "    (0): Linear(in_features=4, out_features=2, bias=True)\n"
        "  )\n"
        ")"
    )
    assert repr(nn.LeakyReLU(0.2)) == "LeakyReLU(alpha=0.2)"


# -- state dicts -------------------------------------------------------------------------------------------------


def test_state_dict_round_trip_copies_in_place():
    of.manual_seed(1)
    a = Net()
    of.manual_seed(2)
    b = Net()
    x = of.randn(5, 3)
    a.eval(), b.eval()
    assert not np.allclose(a(x).numpy(), b(x).numpy())
    arrays = {n: p.numpy() for n, p in b.state_dict().items()}
    sd = a.state_dict()
    assert all(isinstance(v, of.Tensor) and not v.requires_grad for v in sd.values())
    assert sd["head.0.weight"].numpy() is a.head[0].weight.numpy()  # shares memory, as torch's
    result = b.load_state_dict(sd)
    assert result == (([], [])) and result.missing_keys == []
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    for n, p in b.state_dict().items():
        assert p.numpy() is arrays[n]  # the same arrays, new values: compiled programs sharing them see the load
    b.load_state_dict({n: np.array(v.numpy()) for n, v in sd.items()})  # plain arrays work too


def test_load_state_dict_reports_every_problem_and_changes_nothing():
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    before = {n: v.numpy().copy() for n, v in m.state_dict().items()}
    sd = {n: v.numpy() + 1 for n, v in m.state_dict().items()}
    del sd["0.bias"]
    sd["0.weight"] = np.ones((4, 2))
    sd["1.running_mean"] = np.ones(4, np.float32)  # fine, but nothing must be written since the load fails
    sd["1.num_batches_tracked"] = np.array(2.5)  # a float into an int buffer
    sd["2.weight"] = np.ones(3)
    with pytest.raises(nn.StateDictError) as info:
        m.load_state_dict(sd)
    message = str(info.value)
    assert "Sequential.load_state_dict(): nothing was loaded" in message
    assert "missing keys (1): 0.bias" in message
    assert "unexpected keys (1): 2.weight" in message
    assert "0.weight: expected shape (4, 3), got (4, 2)" in message
    assert "1.num_batches_tracked: expected dtype int64, got float64" in message
    for n, v in m.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[n])


def test_load_state_dict_not_strict_returns_the_keys_but_still_refuses_bad_shapes():
    m = nn.Linear(3, 2)
    result = m.load_state_dict({"weight": np.zeros((2, 3)), "extra": np.zeros(1)}, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["extra"]
    assert not m.weight.numpy().any()
    with pytest.raises(nn.StateDictError, match=r"weight: expected shape \(2, 3\), got \(3, 2\)"):
        m.load_state_dict({"weight": np.zeros((3, 2))}, strict=False)
    with pytest.raises(of.ArgumentError, match="expected a dict"):
        m.load_state_dict([1, 2])


def test_a_torch_state_dict_loads_directly():
    theirs = TNN.Sequential(TNN.Conv2d(1, 2, 3), TNN.BatchNorm2d(2), TNN.Flatten(), TNN.Linear(8, 3))
    ours = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    ours.load_state_dict(theirs.state_dict())
    x = randn(2, 1, 4, 4).astype(np.float32)
    close(ours.eval()(of.tensor(x)), theirs.eval()(t(x)), rtol=1e-5, atol=1e-6)


def test_to_converts_dtype_in_place_of_the_same_tensors():
    m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    w = m[0].weight
    m.double()
    assert m[0].weight is w and w.dtype == np.float64 and m[1].running_var.dtype == np.float64
    assert m[1].num_batches_tracked.dtype == np.int64
    assert m(of.randn(3, 2, dtype=F64)).dtype == np.float64


# -- layers against torch.nn -------------------------------------------------------------------------------------

LAYERS = {
    "linear": (lambda: nn.Linear(5, 3, dtype=F64), lambda: TNN.Linear(5, 3), (4, 5)),
    "linear_nobias_3d": (lambda: nn.Linear(5, 3, bias=False, dtype=F64), lambda: TNN.Linear(5, 3, bias=False),
                         (2, 4, 5)),
    "conv2d": (lambda: nn.Conv2d(3, 4, 3, dtype=F64), lambda: TNN.Conv2d(3, 4, 3), (2, 3, 7, 6)),
    "conv2d_stride_pad_dil": (lambda: nn.Conv2d(2, 4, (3, 2), stride=2, padding=(1, 2), dilation=(2, 1),
                                                dtype=F64),
                              lambda: TNN.Conv2d(2, 4, (3, 2), stride=2, padding=(1, 2), dilation=(2, 1)),
                              (2, 2, 9, 8)),
    "conv2d_groups_same": (lambda: nn.Conv2d(4, 6, 3, padding="same", groups=2, bias=False, dtype=F64),
                           lambda: TNN.Conv2d(4, 6, 3, padding="same", groups=2, bias=False), (1, 4, 5, 5)),
    "layer_norm": (lambda: nn.LayerNorm(6, dtype=F64), lambda: TNN.LayerNorm(6), (3, 4, 6)),
    "layer_norm_2d": (lambda: nn.LayerNorm((4, 6), eps=1e-3, dtype=F64), lambda: TNN.LayerNorm((4, 6), eps=1e-3),
                      (3, 4, 6)),
    "layer_norm_no_affine": (lambda: nn.LayerNorm(6, elementwise_affine=False, dtype=F64),
                             lambda: TNN.LayerNorm(6, elementwise_affine=False), (3, 6)),
    "max_pool": (lambda: nn.MaxPool2d(2), lambda: TNN.MaxPool2d(2), (2, 3, 6, 7)),
    "max_pool_stride_pad": (lambda: nn.MaxPool2d(3, stride=2, padding=1), lambda: TNN.MaxPool2d(3, 2, 1),
                            (2, 3, 7, 6)),
    "avg_pool": (lambda: nn.AvgPool2d((2, 3), padding=1), lambda: TNN.AvgPool2d((2, 3), padding=1), (2, 3, 6, 7)),
    "adaptive_avg_pool_1": (lambda: nn.AdaptiveAvgPool2d(1), lambda: TNN.AdaptiveAvgPool2d(1), (2, 3, 5, 4)),
    "adaptive_avg_pool_2": (lambda: nn.AdaptiveAvgPool2d((2, 3)), lambda: TNN.AdaptiveAvgPool2d((2, 3)),
                            (2, 3, 4, 6)),
    "flatten": (lambda: nn.Flatten(), lambda: TNN.Flatten(), (2, 3, 4, 5)),
    "flatten_middle": (lambda: nn.Flatten(1, 2), lambda: TNN.Flatten(1, 2), (2, 3, 4, 5)),
    "relu": (nn.ReLU, TNN.ReLU, (3, 4)),
    "leaky_relu": (lambda: nn.LeakyReLU(0.2), lambda: TNN.LeakyReLU(0.2), (3, 4)),
    "gelu": (nn.GELU, TNN.GELU, (3, 4)),
    "gelu_tanh": (lambda: nn.GELU("tanh"), lambda: TNN.GELU("tanh"), (3, 4)),
    "tanh": (nn.Tanh, TNN.Tanh, (3, 4)),
    "sigmoid": (nn.Sigmoid, TNN.Sigmoid, (3, 4)),
    "silu": (nn.SiLU, TNN.SiLU, (3, 4)),
    "elu": (lambda: nn.ELU(0.5), lambda: TNN.ELU(0.5), (3, 4)),
    "selu": (nn.SELU, TNN.SELU, (3, 4)),
    "softplus": (lambda: nn.Softplus(2.0, 5.0), lambda: TNN.Softplus(2.0, 5.0), (3, 4)),
    "softmax": (lambda: nn.Softmax(dim=0), lambda: TNN.Softmax(dim=0), (3, 4)),
    "log_softmax": (lambda: nn.LogSoftmax(dim=-1), lambda: TNN.LogSoftmax(dim=-1), (3, 4)),
    "identity": (nn.Identity, TNN.Identity, (3, 4)),
    "dropout_eval": (lambda: nn.Dropout(0.3).eval(), lambda: TNN.Dropout(0.3).eval(), (3, 4)),
    "dropout_p0": (lambda: nn.Dropout(0.0), lambda: TNN.Dropout(0.0), (3, 4)),
    "sequential": (lambda: nn.Sequential(nn.Linear(4, 8, dtype=F64), nn.GELU(), nn.Linear(8, 2, dtype=F64)),
                   lambda: TNN.Sequential(TNN.Linear(4, 8), TNN.GELU(), TNN.Linear(8, 2)), (5, 4)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_forward_and_gradients_match_torch(name):
    make_ours, make_theirs, shape = LAYERS[name]
    of.manual_seed(0)
    ours = make_ours()
    theirs = to_torch(ours, make_theirs())
    x = randn(*shape)
    xo, xt = of.tensor(x, requires_grad=True), t(x).requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    assert yo.shape == tuple(yt.shape) and yo.dtype == np.float64
    close(yo, yt)
    u = randn(*yo.shape, seed=1)
    F.sum(yo * of.tensor(u)).backward()
    (yt * t(u)).sum().backward()
    close(xo.grad, xt.grad)
    grads = dict(theirs.named_parameters())
    for n, p in ours.named_parameters():
        close(p.grad, grads[n].grad)


@pytest.mark.parametrize("cls, theirs, shape", [
    (nn.BatchNorm1d, TNN.BatchNorm1d, (6, 3)),
    (nn.BatchNorm1d, TNN.BatchNorm1d, (4, 3, 5)),
    (nn.BatchNorm2d, TNN.BatchNorm2d, (4, 3, 2, 5)),
])
def test_batch_norm_matches_torch_in_training_and_eval(cls, theirs, shape):
    ours = cls(3, momentum=0.2, dtype=F64)
    init.normal_(ours.weight), init.normal_(ours.bias)
    theirs = to_torch(ours, theirs(3, momentum=0.2))
    for step in range(3):  # training: batch statistics normalise, the running ones follow
        x = randn(*shape, seed=step) * 2 + 1
        close(ours(of.tensor(x)), theirs(t(x)))
    for n, b in theirs.named_buffers():
        close(getattr(ours, n), b)
    assert ours.num_batches_tracked.item() == 3
    ours.eval(), theirs.eval()
    x = randn(*shape, seed=9)
    close(ours(of.tensor(x)), theirs(t(x)))
    assert ours.num_batches_tracked.item() == 3  # eval updates nothing


def test_batch_norm_without_running_stats_and_affine():
    ours = nn.BatchNorm2d(3, affine=False, track_running_stats=False, dtype=F64).eval()
    theirs = TNN.BatchNorm2d(3, affine=False, track_running_stats=False).double().eval()
    assert ours.state_dict() == {} and list(theirs.state_dict()) == []
    x = randn(2, 3, 2, 2)
    close(ours(of.tensor(x)), theirs(t(x)))  # batch statistics even in eval, as torch


def test_batch_norm_checks_its_input():
    with pytest.raises(of.ShapeError, match=r"BatchNorm2d: expected a 4-D \(N, C, H, W\) input, got shape \(2, 3\)"):
        nn.BatchNorm2d(3)(of.randn(2, 3))
    with pytest.raises(of.ShapeError, match="batch_norm"):
        nn.BatchNorm1d(3)(of.randn(2, 4))
    with pytest.raises(of.ArgumentError, match="momentum"):
        nn.BatchNorm1d(3, momentum=None)


def test_embedding_matches_torch_with_padding_idx():
    ours = nn.Embedding(6, 3, padding_idx=-2, dtype=F64)
    assert ours.padding_idx == 4 and not ours.weight.numpy()[4].any()
    theirs = to_torch(ours, TNN.Embedding(6, 3, padding_idx=4))
    index = np.array([[0, 4, 5], [4, 1, 0]])
    yo, yt = ours(of.tensor(index)), theirs(t(index))
    close(yo, yt)
    u = randn(2, 3, 3)
    F.sum(yo * of.tensor(u)).backward()
    (yt * t(u)).sum().backward()
    close(ours.weight.grad, theirs.weight.grad)
    assert not ours.weight.grad.numpy()[4].any()


def _causal(n):
    return torch.triu(torch.ones(n, n, dtype=torch.bool), 1)  # torch's MHA: True = may not attend


MHA_CASES = {
    "self": ({}, {}),
    "causal": ({"is_causal": True}, {"attn_mask": _causal(5), "is_causal": True}),
    "bool_mask": ({"attn_mask": _causal(5).numpy()}, {"attn_mask": _causal(5)}),
    "float_mask": ({"attn_mask": randn(5, 5, seed=3)}, {"attn_mask": t(randn(5, 5, seed=3))}),
    "padding": ({"key_padding_mask": np.array([[False] * 5, [False, False, False, True, True]])},
                {"key_padding_mask": torch.tensor([[False] * 5, [False, False, False, True, True]])}),
    "padding_and_causal": ({"key_padding_mask": np.array([[False] * 4 + [True], [False] * 5]), "is_causal": True},
                           {"key_padding_mask": torch.tensor([[False] * 4 + [True], [False] * 5]),
                            "attn_mask": _causal(5)}),
    "per_head_mask": ({"attn_mask": randn(4, 5, 5, seed=4)}, {"attn_mask": t(randn(4, 5, 5, seed=4))}),
}


@pytest.mark.parametrize("batch_first", [False, True])  # torch's default layout (L, N, E), and (N, L, E)
@pytest.mark.parametrize("need_weights", [True, False])  # torch's default returns the weights (averaged)
@pytest.mark.parametrize("case", list(MHA_CASES))
def test_multihead_attention_matches_torch(case, need_weights, batch_first):
    ours_kw, theirs_kw = MHA_CASES[case]
    of.manual_seed(3)
    ours = nn.MultiheadAttention(8, 2, batch_first=batch_first, dtype=F64)
    theirs = to_torch(ours, TNN.MultiheadAttention(8, 2, batch_first=batch_first))
    x = randn(2, 5, 8) if batch_first else randn(5, 2, 8)
    xo, xt = of.tensor(x, requires_grad=True), t(x).requires_grad_()
    yo, wo = ours(xo, xo, xo, need_weights=need_weights, **ours_kw)
    yt, wt = theirs(xt, xt, xt, need_weights=need_weights, **theirs_kw)
    close(yo, yt)
    if need_weights:
        close(wo, wt)
    else:
        assert wo is None and wt is None
    u = randn(*x.shape, seed=1)
    F.sum(yo * of.tensor(u)).backward()
    (yt * t(u)).sum().backward()
    close(xo.grad, xt.grad)
    grads = dict(theirs.named_parameters())
    for n, p in ours.named_parameters():
        close(p.grad, grads[n].grad)


def test_multihead_attention_defaults_to_torchs_layout_and_signature():
    of.manual_seed(5)
    ours = nn.MultiheadAttention(6, 3, 0.0, False, dtype=F64)  # torch's order: dropout, then bias
    theirs = to_torch(ours, TNN.MultiheadAttention(6, 3, 0.0, False))
    x = randn(4, 2, 6)  # (L, N, E): what torch reads by default
    close(ours(of.tensor(x), of.tensor(x), of.tensor(x))[0], theirs(t(x), t(x), t(x))[0])
    single = randn(4, 6)  # one unbatched sequence (L, E)
    yo, wo = ours(of.tensor(single), of.tensor(single), of.tensor(single), average_attn_weights=False)
    yt, wt = theirs(t(single), t(single), t(single), average_attn_weights=False)
    close(yo, yt)
    close(wo, wt)


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_cross_attention_matches_torch(batch_first):
    of.manual_seed(4)
    ours = nn.MultiheadAttention(6, 3, bias=False, batch_first=batch_first, dtype=F64)
    theirs = to_torch(ours, TNN.MultiheadAttention(6, 3, bias=False, batch_first=batch_first))
    q, k, v = randn(2, 4, 6), randn(2, 7, 6, seed=1), randn(2, 7, 6, seed=2)
    if not batch_first:
        q, k, v = (a.transpose(1, 0, 2) for a in (q, k, v))
    for need_weights in (True, False):
        yo, wo = ours(of.tensor(q), of.tensor(k), of.tensor(v), need_weights=need_weights)
        yt, wt = theirs(t(q), t(k), t(v), need_weights=need_weights)
        close(yo, yt)
        assert (wo is None) == (wt is None) == (not need_weights)
        if need_weights:
            close(wo, wt)


def test_multihead_attention_dropout_drops_weights_in_training_only():
    of.manual_seed(6)
    mha = nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True)
    x = of.randn(2, 5, 8)
    _, weights = mha(x, x, x, average_attn_weights=False)
    assert (weights.numpy() == 0).any()  # dropped, and the kept ones scaled by 2 (as torch returns them)
    mha.eval()
    _, weights = mha(x, x, x)
    np.testing.assert_allclose(weights.numpy().sum(-1), 1, rtol=1e-6)


def test_multihead_attention_errors():
    with pytest.raises(of.ArgumentError, match="divisible by num_heads"):
        nn.MultiheadAttention(6, 4)
    with pytest.raises(of.ArgumentError, match="dropout must be a probability"):
        nn.MultiheadAttention(6, 2, 1.5)
    mha = nn.MultiheadAttention(6, 2)
    with pytest.raises(of.ShapeError, match=r"query must be \(L, N, E\) \(batch_first=False\) or \(L, E\) "
                                            r"unbatched, .* E = embed_dim = 6; got shape \(2, 4, 5\)"):
        mha(of.randn(2, 4, 5))
    with pytest.raises(of.ShapeError, match=r"key must be \(N, L, E\) \(batch_first=True\)"):
        nn.MultiheadAttention(6, 2, batch_first=True)(of.randn(2, 4, 6), of.randn(4, 6))


def test_dropout_in_training_zeroes_about_p_and_is_seeded():
    d = nn.Dropout(0.25)
    x = of.ones(200, 100)
    of.manual_seed(7)
    y = d(x).numpy()
    assert set(np.unique(y)) == {0.0, np.float32(1 / 0.75)}
    assert abs((y == 0).mean() - 0.25) < 0.01
    of.manual_seed(7)
    np.testing.assert_array_equal(d(x).numpy(), y)
    assert d.eval()(x) is x
    with pytest.raises(of.ArgumentError, match="probability"):
        nn.Dropout(1.5)


_CLASS_WEIGHT = np.array([0.5, 2.0, 1.5])


@pytest.mark.parametrize("ours, theirs, target", [
    (nn.CrossEntropyLoss(label_smoothing=0.1), TNN.CrossEntropyLoss(label_smoothing=0.1), np.array([0, 2, 1, 2])),
    (nn.CrossEntropyLoss(ignore_index=1, reduction="sum"), TNN.CrossEntropyLoss(ignore_index=1, reduction="sum"),
     np.array([0, 2, 1, 2])),
    (nn.CrossEntropyLoss(of.tensor(_CLASS_WEIGHT)), TNN.CrossEntropyLoss(t(_CLASS_WEIGHT)), np.array([0, 2, 1, 2])),
    (nn.CrossEntropyLoss(), TNN.CrossEntropyLoss(), np.abs(randn(4, 3, seed=3))),
    (nn.NLLLoss(), TNN.NLLLoss(), np.array([0, 2, 1, 2])),
    (nn.NLLLoss(_CLASS_WEIGHT, reduction="none"), TNN.NLLLoss(t(_CLASS_WEIGHT), reduction="none"),
     np.array([0, 2, 1, 2])),
    (nn.MSELoss(), TNN.MSELoss(), randn(4, 3, seed=2)),
    (nn.L1Loss(reduction="sum"), TNN.L1Loss(reduction="sum"), randn(4, 3, seed=2)),
    (nn.HuberLoss(delta=0.5), TNN.HuberLoss(delta=0.5), randn(4, 3, seed=2)),
    (nn.KLDivLoss(reduction="batchmean", log_target=True), TNN.KLDivLoss(reduction="batchmean", log_target=True),
     randn(4, 3, seed=2)),
    (nn.BCEWithLogitsLoss(reduction="none"), TNN.BCEWithLogitsLoss(reduction="none"), np.eye(4, 3)),
    (nn.BCEWithLogitsLoss(_CLASS_WEIGHT, pos_weight=of.tensor(_CLASS_WEIGHT[::-1].copy())),
     TNN.BCEWithLogitsLoss(t(_CLASS_WEIGHT), pos_weight=t(_CLASS_WEIGHT[::-1].copy())), np.eye(4, 3)),
])
def test_loss_modules_match_torch(ours, theirs, target):
    x = randn(4, 3)
    close(ours(of.tensor(x), of.tensor(target)), theirs(t(x), t(target)))


def test_loss_modules_of_three_inputs_and_of_probabilities_match_torch():
    a, b, c = randn(4, 3), randn(4, 3, seed=1), randn(4, 3, seed=2)
    probs, y = 1 / (1 + np.exp(-a)), np.array([1, -1, -1, 1])
    close(nn.BCELoss(_CLASS_WEIGHT)(of.tensor(probs), of.tensor(np.eye(4, 3))),
          TNN.BCELoss(t(_CLASS_WEIGHT))(t(probs), t(np.eye(4, 3))))
    close(nn.CosineEmbeddingLoss(margin=0.2)(of.tensor(a), of.tensor(b), of.tensor(y)),
          TNN.CosineEmbeddingLoss(margin=0.2)(t(a), t(b), t(y)))
    close(nn.MarginRankingLoss(0.3, reduction="none")(of.tensor(a[:, 0]), of.tensor(b[:, 0]), of.tensor(y * 1.0)),
          TNN.MarginRankingLoss(0.3, reduction="none")(t(a[:, 0]), t(b[:, 0]), t(y * 1.0)))
    close(nn.TripletMarginLoss(p=1.0, swap=True)(of.tensor(a), of.tensor(b), of.tensor(c)),
          TNN.TripletMarginLoss(p=1.0, swap=True)(t(a), t(b), t(c)))


def test_loss_weights_are_buffers():
    loss = nn.CrossEntropyLoss(of.tensor(_CLASS_WEIGHT))
    assert list(loss.state_dict()) == ["weight"] and not list(loss.parameters())
    assert list(nn.BCEWithLogitsLoss(pos_weight=of.tensor([2.0])).state_dict()) == ["pos_weight"]
    assert nn.NLLLoss().state_dict() == {}


def test_a_weighted_loss_compiles():
    # The weight buffer is read live in a program: changing it in place changes the compiled loss.
    loss_fn = nn.CrossEntropyLoss(of.tensor(_CLASS_WEIGHT))
    x, y = randn(4, 3), np.array([0, 2, 1, 2])
    step = of.compile(lambda x, y: loss_fn(x, y))
    close(step(of.tensor(x), of.tensor(y)), TNN.CrossEntropyLoss(t(_CLASS_WEIGHT))(t(x), t(y)))
    init.ones_(loss_fn.weight)
    close(step(of.tensor(x), of.tensor(y)), TNN.CrossEntropyLoss()(t(x), t(y)))


def test_layer_arguments_are_checked():
    with pytest.raises(of.ArgumentError, match=r"Linear.*in_features"):
        nn.Linear(2.5, 3)
    with pytest.raises(of.ArgumentError, match="divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(of.ArgumentError, match="kernel_size"):
        nn.Conv2d(3, 4, (3, 3, 3))
    with pytest.raises(of.ArgumentError, match="padding='same' needs stride 1"):
        nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(of.ArgumentError, match="floating"):
        nn.Linear(2, 3, dtype="int64")
    with pytest.raises(of.ArgumentError, match="padding_idx"):
        nn.Embedding(3, 2, padding_idx=3)
    with pytest.raises(of.ArgumentError, match=r"AdaptiveAvgPool2d\(\): argument 'output_size'"):
        nn.AdaptiveAvgPool2d((2, 3, 4))


# -- whole models: gradients against torch -----------------------------------------------------------------------


class CNN(nn.Module):
    def __init__(self, dtype=None):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1, dtype=dtype), nn.BatchNorm2d(4, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 6, 3, dtype=dtype), nn.GELU(), nn.AvgPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(6, 8, dtype=dtype), nn.LayerNorm(8, dtype=dtype),
                                  nn.Tanh(), nn.Dropout(0.0), nn.Linear(8, 3, dtype=dtype))

    def forward(self, x):
        return self.head(self.features(x))


def torch_cnn():
    return TNN.ModuleDict({
        "features": TNN.Sequential(TNN.Conv2d(1, 4, 3, padding=1), TNN.BatchNorm2d(4), TNN.ReLU(), TNN.MaxPool2d(2),
                                   TNN.Conv2d(4, 6, 3), TNN.GELU(), TNN.AvgPool2d(2)),
        "head": TNN.Sequential(TNN.Flatten(), TNN.Linear(6, 8), TNN.LayerNorm(8), TNN.Tanh(), TNN.Dropout(0.0),
                               TNN.Linear(8, 3)),
    })


def test_cnn_loss_and_gradients_match_torch():
    of.manual_seed(5)
    ours = CNN(F64)
    theirs = to_torch(ours, torch_cnn())
    x, y = randn(5, 1, 8, 8), np.array([0, 1, 2, 1, 0])
    loss = F.cross_entropy(ours(of.tensor(x)), of.tensor(y))
    loss.backward()
    ref = TNN.functional.cross_entropy(theirs["head"](theirs["features"](t(x))), t(y))
    ref.backward()
    close(loss, ref)
    grads = dict(theirs.named_parameters())
    assert len(grads) == len(list(ours.parameters())) == 12
    for n, p in ours.named_parameters():
        close(p.grad, grads[n].grad)
    for n, b in theirs.named_buffers():
        close(ours.state_dict()[n], b)


class TinyTransformer(nn.Module):
    def __init__(self, vocab=11, e=8, heads=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, e, dtype=F64)
        self.attn = nn.MultiheadAttention(e, heads, batch_first=True, dtype=F64)
        self.norm = nn.LayerNorm(e, dtype=F64)
        self.out = nn.Linear(e, vocab, dtype=F64)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = self.norm(h + self.attn(h, is_causal=True)[0])
        return self.out(h)


def test_transformer_block_gradients_match_torch():
    of.manual_seed(6)
    ours = TinyTransformer()
    theirs = to_torch(ours, TNN.ModuleDict({"embed": TNN.Embedding(11, 8),
                                            "attn": TNN.MultiheadAttention(8, 2, batch_first=True),
                                            "norm": TNN.LayerNorm(8), "out": TNN.Linear(8, 11)}))
    tokens = np.random.default_rng(0).integers(0, 11, (3, 6))
    logits = ours(of.tensor(tokens))
    loss = F.cross_entropy(F.reshape(logits, shape=[-1, 11]), of.tensor(tokens.reshape(-1)))
    loss.backward()
    h = theirs["embed"](t(tokens))
    h = theirs["norm"](h + theirs["attn"](h, h, h, attn_mask=_causal(6), need_weights=False)[0])
    ref = TNN.functional.cross_entropy(theirs["out"](h).reshape(-1, 11), t(tokens).reshape(-1))
    ref.backward()
    close(loss, ref)
    grads = dict(theirs.named_parameters())
    for n, p in ours.named_parameters():
        close(p.grad, grads[n].grad)


# -- initialisation ----------------------------------------------------------------------------------------------


def test_init_functions_write_in_place_with_the_expected_statistics():
    w = of.zeros(256, 512)
    array = w.numpy()
    assert init.kaiming_uniform_(w, nonlinearity="relu") is w and w.numpy() is array and w.dtype == np.float32
    bound = math.sqrt(6 / 512)
    assert np.abs(array).max() <= bound and np.abs(array).max() > 0.99 * bound
    assert abs(array.std() - bound / math.sqrt(3)) < 0.01 * bound
    init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
    assert abs(array.std() / math.sqrt(2 / 256) - 1) < 0.02 and abs(array.mean()) < 1e-3
    init.xavier_uniform_(w, gain=2.0)
    bound = 2.0 * math.sqrt(6 / (256 + 512))
    assert np.abs(array).max() <= bound and np.abs(array).max() > 0.99 * bound
    init.xavier_normal_(w)
    assert abs(array.std() / math.sqrt(2 / 768) - 1) < 0.02
    init.normal_(w, 3.0, 0.5)
    assert abs(array.mean() - 3) < 0.01 and abs(array.std() - 0.5) < 0.01
    init.uniform_(w, -2, 4)
    assert array.min() >= -2 and array.max() < 4 and abs(array.mean() - 1) < 0.02
    init.constant_(w, 0.5)
    assert (array == 0.5).all()
    init.zeros_(w)
    assert not array.any()
    assert (init.ones_(w).numpy() == 1).all()
    assert init.kaiming_uniform_(of.zeros(0, 3)).shape == (0, 3)  # an empty tensor is left as it is


def test_fans_and_gains_follow_torch():
    assert init.fan_in_and_fan_out(of.zeros(8, 4, 3, 2)) == (24, 48)
    for name, param in [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None), ("relu", None),
                        ("leaky_relu", None), ("leaky_relu", 0.2), ("selu", None)]:
        assert init.calculate_gain(name, param) == pytest.approx(TNN.init.calculate_gain(name, param))
    with pytest.raises(of.ArgumentError, match="at least 2 dims"):
        init.kaiming_uniform_(of.zeros(3))
    with pytest.raises(of.ArgumentError, match="fan_in"):
        init.kaiming_normal_(of.zeros(3, 3), mode="fan")
    with pytest.raises(of.ArgumentError, match="unknown nonlinearity"):
        init.calculate_gain("swish")


def test_default_initialisations_are_pytorchs():
    lin = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)
    for p in (lin.weight, lin.bias):
        assert np.abs(p.numpy()).max() <= bound and np.abs(p.numpy()).max() > 0.95 * bound
    conv = nn.Conv2d(8, 16, 3, groups=2)
    bound = 1 / math.sqrt(4 * 9)
    assert np.abs(conv.weight.numpy()).max() <= bound and np.abs(conv.weight.numpy()).max() > 0.95 * bound
    emb = nn.Embedding(1000, 50)
    assert abs(emb.weight.numpy().std() - 1) < 0.02
    ln, bn = nn.LayerNorm(4), nn.BatchNorm2d(4)
    assert (ln.weight.numpy() == 1).all() and not ln.bias.numpy().any()
    assert (bn.running_var.numpy() == 1).all() and not bn.running_mean.numpy().any()
    mha = nn.MultiheadAttention(8, 2)
    assert not mha.in_proj_bias.numpy().any() and not mha.out_proj.bias.numpy().any()
    assert np.abs(mha.in_proj_weight.numpy()).max() <= math.sqrt(6 / (8 + 24))


def test_the_same_seed_builds_the_same_model():
    of.manual_seed(11)
    a = CNN()
    of.manual_seed(11)
    b = CNN()
    of.manual_seed(12)
    c = CNN()
    for (n, p), q, r in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
        if n.endswith("features.0.weight"):
            assert not np.array_equal(p.numpy(), r.numpy())
    of.manual_seed(1)  # init draws from the same generator as of.rand
    drawn = init.uniform_(of.zeros(3, 4)).numpy()
    of.manual_seed(1)
    np.testing.assert_array_equal(drawn, of.rand(3, 4).numpy())


# -- inside of.compile -------------------------------------------------------------------------------------------

COMPILED = {
    "linear": (lambda: nn.Linear(5, 3), (4, 5)),
    "conv": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()),
             (2, 2, 6, 6)),
    "layer_norm": (lambda: nn.LayerNorm(6), (3, 6)),
    "batch_norm_eval": (lambda: nn.BatchNorm1d(6).eval(), (3, 6)),
    "attention": (lambda: nn.MultiheadAttention(8, 2), (2, 5, 8)),
}


@pytest.mark.parametrize("name", list(COMPILED))
def test_a_layer_compiled_gives_the_eager_output(name):
    make, shape = COMPILED[name]
    of.manual_seed(2)
    layer = make()
    call = (lambda x: layer(x, is_causal=True)[0]) if name == "attention" else layer
    step = of.compile(lambda x: call(x))
    x = of.tensor(randn(*shape).astype(np.float32))
    np.testing.assert_allclose(step(x).numpy(), call(x).numpy(), rtol=1e-6, atol=1e-6)


def test_embedding_compiled_gives_the_eager_output():
    emb = nn.Embedding(7, 3)
    step = of.compile(lambda i: emb(i))
    index = of.tensor(np.array([[1, 6], [0, 1]]))
    np.testing.assert_array_equal(step(index).numpy(), emb(index).numpy())


def test_batch_norm_running_stats_update_the_same_eagerly_and_compiled():
    of.manual_seed(3)
    eager = CNN()
    of.manual_seed(3)
    traced = CNN()
    step = of.compile(lambda x: traced(x))
    buffers = {n: b.numpy() for n, b in traced.named_buffers()}
    for i in range(3):
        x = of.tensor(randn(4, 1, 8, 8, seed=i).astype(np.float32))
        np.testing.assert_allclose(step(x).numpy(), eager(x).numpy(), rtol=1e-5, atol=1e-6)
    for (n, a), b in zip(eager.named_buffers(), traced.buffers()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7)
        assert b.numpy() is buffers[n]  # updated in place
    assert traced.features[1].num_batches_tracked.item() == 3
    prog = next(iter(step.cache.values()))[0].program
    assert len(prog.updates) == 3  # running mean, running var, batch count


def test_compiled_eval_reads_the_buffers_current_values():
    # Buffers are the program's persistable state, not constants folded once: a load after compiling is seen.
    bn = nn.BatchNorm1d(3).eval()
    step = of.compile(lambda x: bn(x))
    x = of.tensor(randn(4, 3).astype(np.float32))
    before = step(x).numpy().copy()
    bn.load_state_dict({"weight": np.ones(3), "bias": np.zeros(3), "running_mean": np.full(3, 2.0),
                        "running_var": np.full(3, 4.0), "num_batches_tracked": np.array(1)})
    after = step(x).numpy()
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, (x.numpy() - 2) / np.sqrt(4 + 1e-5), rtol=1e-6)


def test_compiled_training_gradients_match_eager():
    of.manual_seed(4)
    model = CNN()
    params = list(model.parameters())
    x = of.tensor(randn(6, 1, 8, 8).astype(np.float32))
    y = of.tensor(np.array([0, 1, 2, 0, 1, 2]))

    @of.compile
    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        return (loss, *of.grad(loss, params))

    state = {n: v.numpy().copy() for n, v in model.state_dict().items()}
    loss, *grads = step(x, y)
    model.load_state_dict(state)  # undo the compiled step's running-stat update
    eager = F.cross_entropy(model(x), y)
    eager.backward()
    np.testing.assert_allclose(loss.numpy(), eager.numpy(), rtol=1e-5)
    for g, p in zip(grads, params):
        np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_dropout_compiled_draws_like_eager():
    d = nn.Dropout(0.5)
    step = of.compile(lambda x: d(x))
    x = of.ones(8, 8)
    of.manual_seed(3)
    eager = d(x).numpy()
    of.manual_seed(3)
    np.testing.assert_array_equal(step(x).numpy(), eager)
