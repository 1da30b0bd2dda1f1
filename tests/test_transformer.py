"""nn.MultiheadAttention (every torch option) and the Transformer family against torch.nn, in float64: torch's
modules load our state_dict (strict: the same names, shapes and order), then outputs, the returned weights, the
inputs' and every parameter's gradients must agree; eagerly and inside ``of.compile``. Dropout is 0 (or the modules
are in eval mode) wherever values are compared."""

from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import pytest
import torch

import opforge as of
from opforge import nn
from opforge import ops as F

F64 = of.float64
TNN = torch.nn
# torch warns about a bool padding mask beside a float mask, nested tensors and its fast paths: not our concern here
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")


def load_into(ours: nn.Module, theirs: torch.nn.Module) -> torch.nn.Module:
    """``theirs`` in float64 holding our state (strict), after checking that the keys come in torch's order."""
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs = theirs.double()
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    return theirs


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def close(ours, theirs, rtol=1e-10, atol=1e-12, msg=""):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    np.testing.assert_allclose(ours.numpy() if isinstance(ours, of.Tensor) else ours, theirs, rtol=rtol, atol=atol,
                               err_msg=msg)


def both(value):
    """(ours, torch's) of a NumPy value; anything else twice."""
    if isinstance(value, np.ndarray):
        return of.tensor(value), torch.from_numpy(value.copy())
    return value, value


def compare(ours, theirs, inputs: dict, kwargs: dict, theirs_kwargs: dict | None = None, rtol=1e-10, atol=1e-12):
    """``ours(**inputs, **kwargs)`` and ``theirs(...)`` with the same values (``theirs_kwargs`` replacing or adding
    some of torch's), the inputs requiring grad: the outputs (all of a tuple), the inputs' gradients and every
    parameter's gradient must agree."""
    ins = {k: (of.tensor(v, requires_grad=True), torch.from_numpy(v.copy()).requires_grad_())
           for k, v in inputs.items()}
    kw = {k: both(v) for k, v in kwargs.items()}
    kw_t = {**{k: v[1] for k, v in kw.items()}, **{k: both(v)[1] for k, v in (theirs_kwargs or {}).items()}}
    out_o = ours(**{k: v[0] for k, v in ins.items()}, **{k: v[0] for k, v in kw.items()})
    out_t = theirs(**{k: v[1] for k, v in ins.items()}, **kw_t)
    out_o, out_t = (o if isinstance(o, tuple) else (o,) for o in (out_o, out_t))
    assert len(out_o) == len(out_t)
    for a, b in zip(out_o, out_t):
        assert (a is None) == (b is None)
        if a is not None:
            close(a, b, rtol, atol)
    u = randn(*out_o[0].shape, seed=9)  # a random cotangent: every output element matters
    F.sum(out_o[0] * of.tensor(u)).backward()
    (out_t[0] * torch.from_numpy(u)).sum().backward()
    for k, (a, b) in ins.items():
        close(a.grad, b.grad, rtol, atol, msg=f"d{k}")
    grads = dict(theirs.named_parameters())
    for n, p in ours.named_parameters():
        close(p.grad, grads[n].grad, rtol, atol, msg=n)


def causal(n, s=None):
    return np.triu(np.ones((n, n if s is None else s), bool), 1)


# -- MultiheadAttention ----------------------------------------------------------------------------------------

MHA_CONFIGS = {
    "packed": {},
    "kdim_vdim": {"kdim": 5, "vdim": 3},  # separate q/k/v projection weights
    "bias_kv": {"add_bias_kv": True},
    "zero_attn": {"add_zero_attn": True},
    "all": {"add_bias_kv": True, "add_zero_attn": True, "kdim": 5, "vdim": 3, "bias": False},
}
L, S, N, E, H = 4, 6, 2, 8, 2
PADDING = np.array([[False] * S, [False] * 4 + [True] * 2])
MHA_MASKS = {  # (ours, what torch needs besides)
    "none": ({}, None),
    "padding_bool": ({"key_padding_mask": PADDING}, None),
    "padding_float": ({"key_padding_mask": np.where(PADDING, -np.inf, 0.0)}, None),
    "attn_2d_bool": ({"attn_mask": causal(L, S)}, None),
    "attn_2d_float": ({"attn_mask": randn(L, S, seed=3)}, None),
    "attn_3d_bool": ({"attn_mask": randn(N * H, L, S, seed=4) > 1.0}, None),
    "attn_3d_float": ({"attn_mask": randn(N * H, L, S, seed=5)}, None),
    "padding_and_float_attn": ({"key_padding_mask": PADDING, "attn_mask": randn(L, S, seed=6)}, None),
    # torch takes is_causal as a hint beside the causal mask; we apply it with or without the mask
    "causal": ({"is_causal": True}, {"is_causal": True, "attn_mask": causal(L, S)}),
    "causal_and_padding": ({"is_causal": True, "key_padding_mask": PADDING},
                           {"is_causal": True, "attn_mask": causal(L, S), "key_padding_mask": PADDING}),
}


def mha_pair(config, batch_first=False, seed=0):
    of.manual_seed(seed)
    ours = nn.MultiheadAttention(E, H, batch_first=batch_first, dtype=F64, **config)
    return ours, load_into(ours, TNN.MultiheadAttention(E, H, batch_first=batch_first, **config))


def mha_inputs(config, batched=True, batch_first=False):
    kdim, vdim = config.get("kdim", E), config.get("vdim", E)

    def shape(length, dim):
        return ((N, length, dim) if batch_first else (length, N, dim)) if batched else (length, dim)

    return {"query": randn(*shape(L, E), seed=0), "key": randn(*shape(S, kdim), seed=1),
            "value": randn(*shape(S, vdim), seed=2)}


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("masks", list(MHA_MASKS))
@pytest.mark.parametrize("config", list(MHA_CONFIGS))
def test_multihead_attention_matches_torch(config, masks, need_weights):
    ours, theirs = mha_pair(MHA_CONFIGS[config])
    ours_kw, theirs_kw = MHA_MASKS[masks]
    if "is_causal" in ours_kw and ("add_bias_kv" in MHA_CONFIGS[config] or "add_zero_attn" in MHA_CONFIGS[config]):
        # torch attends to the appended keys or not depending on need_weights: refused, not guessed
        with pytest.raises(of.ArgumentError, match="is_causal=True with add_bias_kv or add_zero_attn is refused"):
            ours(**{k: of.tensor(v) for k, v in mha_inputs(MHA_CONFIGS[config]).items()}, **ours_kw)
        return
    compare(ours, theirs, mha_inputs(MHA_CONFIGS[config]), {"need_weights": need_weights, **ours_kw}, theirs_kw)


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("config", ["packed", "all"])
def test_multihead_attention_batch_first_and_unbatched_match_torch(config, average):
    cfg = MHA_CONFIGS[config]
    ours, theirs = mha_pair(cfg, batch_first=True)
    compare(ours, theirs, mha_inputs(cfg, batch_first=True),
            {"key_padding_mask": PADDING, "average_attn_weights": average})
    ours, theirs = mha_pair(cfg)  # one sequence: (L, E); the padding mask (S,), a 3-D mask (heads, L, S)
    compare(ours, theirs, mha_inputs(cfg, batched=False),
            {"key_padding_mask": PADDING[1], "attn_mask": randn(H, L, S, seed=7) > 1.0,
             "average_attn_weights": average})


def test_multihead_attention_parameters_and_initialisation_are_torchs():
    mha = nn.MultiheadAttention(16, 4, kdim=6, vdim=10, add_bias_kv=True)
    assert mha.in_proj_weight is None and not mha._qkv_same_embed_dim
    assert {n: tuple(p.shape) for n, p in mha.named_parameters()} == {
        "q_proj_weight": (16, 16), "k_proj_weight": (16, 6), "v_proj_weight": (16, 10), "in_proj_bias": (48,),
        "bias_k": (1, 1, 16), "bias_v": (1, 1, 16), "out_proj.weight": (16, 16), "out_proj.bias": (16,)}
    for name, fan_in in (("q_proj_weight", 16), ("k_proj_weight", 6), ("v_proj_weight", 10)):  # Xavier uniform
        w = getattr(mha, name).numpy()
        assert 0.8 * math.sqrt(6 / (16 + fan_in)) < np.abs(w).max() <= math.sqrt(6 / (16 + fan_in))
    biases = np.concatenate([mha.bias_k.numpy().ravel(), mha.bias_v.numpy().ravel()])  # Xavier normal: std √(2/32)
    assert biases.std() > 0 and np.abs(biases).max() < 6 * math.sqrt(2 / 32)
    assert not mha.in_proj_bias.numpy().any() and not mha.out_proj.bias.numpy().any()
    assert nn.MultiheadAttention(8, 2, kdim=8, vdim=8)._qkv_same_embed_dim  # kdim = embed_dim: packed, as torch
    assert "kdim=6, vdim=10, add_bias_kv=True" in repr(mha)


def test_multihead_attention_mask_and_shape_errors_name_the_argument():
    mha = nn.MultiheadAttention(8, 2)
    x = of.randn(4, 2, 8)
    with pytest.raises(of.ShapeError, match=r"key_padding_mask must be \(N, S\) = \(2, 4\), got shape \(4, 2\)"):
        mha(x, x, x, key_padding_mask=of.zeros(4, 2, dtype="bool"))
    with pytest.raises(of.ShapeError, match=r"key_padding_mask must be \(S,\) = \(4,\) for unbatched"):
        mha(x[:, 0], x[:, 0], x[:, 0], key_padding_mask=of.zeros(1, 4, dtype="bool"))
    with pytest.raises(of.ShapeError, match=r"attn_mask must be \(L, S\) = \(4, 4\) or \(N·num_heads, L, S\) = "
                                            r"\(4, 4, 4\), got shape \(2, 4, 4\)"):
        mha(x, x, x, attn_mask=of.zeros(2, 4, 4, dtype="bool"))
    with pytest.raises(of.ArgumentError, match=r"attn_mask must be bool or floating, got .*int64"):
        mha(x, x, x, attn_mask=of.zeros(4, 4, dtype="int64"))
    with pytest.raises(of.ShapeError, match=r"key and value must have the same length and batch"):
        mha(x, x, of.randn(5, 2, 8))
    with pytest.raises(of.ShapeError, match=r"key must be .* with E = kdim = 3; got shape \(4, 2, 8\)"):
        nn.MultiheadAttention(8, 2, kdim=3)(x, x, of.randn(4, 2, 8))
    with pytest.raises(of.ArgumentError, match="'kdim' must be an int >= 1"):
        nn.MultiheadAttention(8, 2, kdim=0)


def test_multihead_attention_options_compiled_give_the_eager_values_and_gradients():
    of.manual_seed(1)
    mha = nn.MultiheadAttention(E, H, add_bias_kv=True, add_zero_attn=True, kdim=5, dtype=F64)
    inputs = {k: of.tensor(v) for k, v in mha_inputs({"kdim": 5}).items()}
    padding, causal_mask = of.tensor(PADDING), of.tensor(causal(L, S))

    def step(query, key, value, padding):
        out, weights = mha(query, key, value, key_padding_mask=padding, attn_mask=causal_mask)
        loss = F.sum(out * out) + F.sum(weights)
        return (loss, *of.grad(loss, list(mha.parameters())))

    eager = step(**inputs, padding=padding)
    compiled = of.compile(step)(**inputs, padding=padding)
    for a, b in zip(compiled, eager):
        close(a, b.numpy())


ATTENTION_MASKS = {"none": {}, "causal": {"is_causal": True},
                   "bool_with_a_row_of_nothing": {"attn_mask": np.array([[True, False, True], [False] * 3] * 2)},
                   "float": {"attn_mask": randn(4, 3, seed=1)}}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mask", list(ATTENTION_MASKS))
def test_attention_backward_from_the_forward_weights_is_the_recomputed_one(mask, dtype):
    """A recorded scaled_dot_product_attention keeps its softmax weights for the backward pass (first order,
    eagerly); compiled programs and create_graph compute them again with ops: the same bits. A query that may
    attend to nothing gets zeros, without a warning."""
    rng = np.random.default_rng(2)
    q, k, v = (of.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)
               for shape in ((2, 4, 5), (2, 3, 5), (2, 3, 2)))
    kwargs = {n: of.tensor(a.astype(dtype) if a.dtype.kind == "f" else a) if isinstance(a, np.ndarray) else a
              for n, a in ATTENTION_MASKS[mask].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        assert set(out._node.residuals) == {"probs"}
        u = of.tensor(rng.standard_normal(out.shape).astype(dtype))
        kept = of.grad(F.sum(out * u), [q, k, v])
        again = of.grad(F.sum(F.scaled_dot_product_attention(q, k, v, **kwargs) * u), [q, k, v], create_graph=True)
    for a, b in zip(kept, again):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    if mask == "bool_with_a_row_of_nothing":
        assert not out.numpy()[:, 1].any() and np.isfinite(kept[0].numpy()).all()


# -- the Transformer layers ------------------------------------------------------------------------------------

D_MODEL, NHEAD, FF = 8, 2, 16
ACTIVATIONS = {"relu": ("relu", "relu"), "gelu": ("gelu", "gelu"),
               "module": (lambda: nn.GELU(approximate="tanh"), lambda: TNN.GELU(approximate="tanh")),
               "function": (lambda: F.silu, lambda: TNN.functional.silu)}


def activation(name):
    ours, theirs = ACTIVATIONS[name]
    return (ours() if callable(ours) else ours), (theirs() if callable(theirs) else theirs)


def layer_pair(kind, act="relu", seed=0, **kw):
    ours_act, theirs_act = activation(act)
    of.manual_seed(seed)
    ours = getattr(nn, kind)(D_MODEL, NHEAD, FF, dropout=0.0, activation=ours_act, dtype=F64, **kw)
    return ours, load_into(ours, getattr(TNN, kind)(D_MODEL, NHEAD, FF, dropout=0.0, activation=theirs_act, **kw))


def seq(length, batch_first=False, batched=True, seed=0):
    shape = ((N, length, D_MODEL) if batch_first else (length, N, D_MODEL)) if batched else (length, D_MODEL)
    return randn(*shape, seed=seed)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch(norm_first, act, batch_first):
    ours, theirs = layer_pair("TransformerEncoderLayer", act, norm_first=norm_first, batch_first=batch_first)
    compare(ours, theirs, {"src": seq(S, batch_first)}, {"src_key_padding_mask": PADDING})
    compare(ours, theirs, {"src": seq(S, batch_first)}, {"src_mask": randn(S, S, seed=2), "is_causal": False})
    compare(ours, theirs, {"src": seq(S, batched=False)}, {"src_mask": causal(S)})  # unbatched (S, E)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("act", ["relu", "gelu", "module"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first, act, batch_first):
    ours, theirs = layer_pair("TransformerDecoderLayer", act, norm_first=norm_first, batch_first=batch_first)
    mask = nn.Transformer.generate_square_subsequent_mask(L, dtype=F64).numpy()
    compare(ours, theirs, {"tgt": seq(L, batch_first), "memory": seq(S, batch_first, seed=1)},
            {"tgt_mask": mask, "tgt_is_causal": True, "memory_key_padding_mask": PADDING,
             "tgt_key_padding_mask": np.array([[False] * L, [False] * (L - 1) + [True]])})
    compare(ours, theirs, {"tgt": seq(L, batch_first), "memory": seq(S, batch_first, seed=1)},
            {"memory_mask": randn(N * NHEAD, L, S, seed=3) > 1.5})


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_and_decoder_stacks_match_torch(norm_first):
    of.manual_seed(2)
    layer = nn.TransformerEncoderLayer(D_MODEL, NHEAD, FF, dropout=0.0, norm_first=norm_first, dtype=F64)
    ours = nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(D_MODEL, dtype=F64))
    theirs = TNN.TransformerEncoder(TNN.TransformerEncoderLayer(D_MODEL, NHEAD, FF, dropout=0.0,
                                                                norm_first=norm_first), 3, norm=TNN.LayerNorm(D_MODEL),
                                    enable_nested_tensor=False)
    for i, block in enumerate(ours.layers):  # distinct weights per layer, so that a mix-up would show
        nn.init.normal_(block.linear1.weight, std=0.3 + 0.1 * i)
    theirs = load_into(ours, theirs)
    compare(ours, theirs, {"src": seq(S)}, {"mask": causal(S), "src_key_padding_mask": PADDING})
    compare(ours, theirs, {"src": seq(S)}, {"is_causal": True}, {"mask": causal(S)})

    of.manual_seed(3)
    layer = nn.TransformerDecoderLayer(D_MODEL, NHEAD, FF, dropout=0.0, norm_first=norm_first, dtype=F64)
    ours = nn.TransformerDecoder(layer, 2)
    theirs = load_into(ours, TNN.TransformerDecoder(TNN.TransformerDecoderLayer(D_MODEL, NHEAD, FF, dropout=0.0,
                                                                                 norm_first=norm_first), 2))
    compare(ours, theirs, {"tgt": seq(L), "memory": seq(S, seed=1)},
            {"tgt_mask": causal(L), "memory_key_padding_mask": PADDING})


def test_stacks_copy_the_layer_given():
    layer = nn.TransformerEncoderLayer(D_MODEL, NHEAD, FF)
    stack = nn.TransformerEncoder(layer, 2)
    assert stack.num_layers == 2 and all(block is not layer for block in stack.layers)
    a, b = stack.layers[0].linear1.weight, stack.layers[1].linear1.weight
    assert a is not b and a is not layer.linear1.weight
    np.testing.assert_array_equal(a.numpy(), layer.linear1.weight.numpy())  # copies: torch's _get_clones
    nn.init.zeros_(a)
    assert b.numpy().any() and layer.linear1.weight.numpy().any()
    assert len(list(stack.parameters())) == 2 * len(list(layer.parameters()))


@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_matches_torch(batch_first):
    of.manual_seed(4)
    ours = nn.Transformer(D_MODEL, NHEAD, 2, 2, FF, dropout=0.0, batch_first=batch_first, dtype=F64)
    theirs = load_into(ours, TNN.Transformer(D_MODEL, NHEAD, 2, 2, FF, dropout=0.0, batch_first=batch_first))
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(L, dtype=F64).numpy()
    compare(ours, theirs, {"src": seq(S, batch_first), "tgt": seq(L, batch_first, seed=1)},
            {"tgt_mask": tgt_mask, "src_key_padding_mask": PADDING, "memory_key_padding_mask": PADDING,
             "memory_mask": randn(L, S, seed=4), "src_mask": causal(S).T.copy()})
    compare(ours, theirs, {"src": seq(S, batch_first), "tgt": seq(L, batch_first, seed=1)},
            {"tgt_mask": tgt_mask, "tgt_is_causal": True})



@pytest.mark.parametrize("compiled", [False, True])
def test_twenty_training_steps_follow_torchs_trajectory(compiled):
    """nn.Transformer trained 20 steps by SGD with momentum, a new batch each step (masks and padding given), from
    torch's start: the loss and every parameter after each step are torch's, eagerly and compiled."""
    of.manual_seed(6)
    ours = nn.Transformer(D_MODEL, NHEAD, 1, 1, FF, dropout=0.0, dtype=F64)
    theirs = load_into(ours, TNN.Transformer(D_MODEL, NHEAD, 1, 1, FF, dropout=0.0))
    opt_o = of.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    opt_t = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(L, dtype=F64).numpy()
    kw_o = {"tgt_mask": of.tensor(tgt_mask), "src_key_padding_mask": of.tensor(PADDING)}
    kw_t = {"tgt_mask": torch.from_numpy(tgt_mask), "src_key_padding_mask": torch.from_numpy(PADDING)}

    def step(src, tgt):
        loss = F.mean(ours(src, tgt, **kw_o) ** 2)
        loss.backward()
        opt_o.step()
        opt_o.zero_grad()
        return loss

    run = of.compile(step) if compiled else step
    for k in range(20):
        src, tgt = seq(S, seed=10 + k), seq(L, seed=40 + k)
        loss_t = (theirs(torch.from_numpy(src), torch.from_numpy(tgt), **kw_t) ** 2).mean()
        loss_t.backward()
        opt_t.step()
        opt_t.zero_grad()
        close(run(of.tensor(src), of.tensor(tgt)), loss_t, rtol=1e-9, msg=f"loss at step {k}")
        for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
            close(a, b, rtol=1e-9, atol=1e-11, msg=f"{name} after step {k}")

@pytest.mark.parametrize("config", [{}, {"kdim": 5, "vdim": 7, "add_bias_kv": True}])
@pytest.mark.parametrize("compiled", [False, True])
def test_multihead_attention_trained_twenty_steps_follows_torchs_trajectory(config, compiled):
    """nn.MultiheadAttention alone (key padding given, weights returned) trained 20 steps by SGD with momentum, a new
    batch each step, from torch's start: the loss and every parameter after each step are torch's."""
    ours, theirs = mha_pair(config, seed=3)
    opt_o = of.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    opt_t = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)

    def step(q, k, v):
        out, weights = ours(q, k, v, key_padding_mask=of.tensor(PADDING))
        loss = F.mean(out ** 2) + F.mean(weights ** 2)
        loss.backward()
        opt_o.step()
        opt_o.zero_grad()
        return loss

    run = of.compile(step) if compiled else step
    kdim, vdim = config.get("kdim", E), config.get("vdim", E)
    for k in range(20):
        q, key, v = randn(L, N, E, seed=70 + k), randn(S, N, kdim, seed=90 + k), randn(S, N, vdim, seed=110 + k)
        out_t, weights_t = theirs(*map(torch.from_numpy, (q, key, v)), key_padding_mask=torch.from_numpy(PADDING))
        loss_t = (out_t ** 2).mean() + (weights_t ** 2).mean()
        loss_t.backward()
        opt_t.step()
        opt_t.zero_grad()
        close(run(of.tensor(q), of.tensor(key), of.tensor(v)), loss_t, rtol=1e-9, msg=f"loss at step {k}")
        for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
            close(a, b, rtol=1e-9, atol=1e-11, msg=f"{name} after step {k}")


def test_transformer_options_and_initialisation_are_torchs():
    of.manual_seed(5)
    ours = nn.Transformer(D_MODEL, NHEAD, 1, 1, FF, dropout=0.0, activation="gelu", norm_first=True, bias=False,
                          layer_norm_eps=1e-3, dtype=F64)
    theirs = load_into(ours, TNN.Transformer(D_MODEL, NHEAD, 1, 1, FF, dropout=0.0, activation="gelu",
                                             norm_first=True, bias=False, layer_norm_eps=1e-3))
    assert ours.encoder.norm.eps == 1e-3 and ours.encoder.norm.bias is None
    compare(ours, theirs, {"src": seq(S), "tgt": seq(L, seed=1)}, {"tgt_is_causal": True}, {"tgt_mask": causal(L)})
    # _reset_parameters: Xavier uniform on every parameter of 2 dims or more, after the layers' own init
    big = nn.Transformer(64, 4, 1, 1, 128)
    w = big.encoder.layers[0].linear1.weight.numpy()
    bound = math.sqrt(6 / (64 + 128))
    assert 0.95 * bound < np.abs(w).max() <= bound


@pytest.mark.parametrize("name", ["Transformer", "TransformerEncoderLayer", "TransformerDecoderLayer",
                                  "TransformerEncoder", "TransformerDecoder", "MultiheadAttention"])
def test_constructor_and_forward_signatures_are_torchs(name):
    """The same parameters in the same order with the same defaults (torch's activation default is its F.relu,
    ours ours; MultiheadAttention's key and value default to the query; device= is taken by keyword, after dtype=)."""
    for method in ("__init__", "forward"):
        ours = dict(inspect.signature(getattr(getattr(nn, name), method)).parameters)
        theirs = dict(inspect.signature(getattr(getattr(TNN, name), method)).parameters)
        assert ("device" in ours) == ("device" in theirs)
        ours.pop("device", None)
        theirs.pop("device", None)
        assert list(ours) == list(theirs)
        for p, q in zip(ours.values(), theirs.values()):
            assert (p.default == q.default or (p.default, q.default) == (F.relu, TNN.functional.relu)
                    or (name, p.name) in (("MultiheadAttention", "key"), ("MultiheadAttention", "value"))), p.name


def test_custom_encoder_and_decoder():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D_MODEL, NHEAD, FF, dropout=0.0), 1)
    dec = nn.Identity()
    model = nn.Transformer(D_MODEL, NHEAD, custom_encoder=enc, custom_decoder=dec)
    assert model.encoder is enc and model.decoder is dec


def test_generate_square_subsequent_mask_is_torchs():
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    assert mask.dtype == of.float32
    np.testing.assert_array_equal(mask.numpy(), TNN.Transformer.generate_square_subsequent_mask(4).numpy())
    assert nn.Transformer.generate_square_subsequent_mask(3, dtype=F64).dtype == F64


def test_eval_mode_matches_torchs_inference_fast_path():
    """torch's eval mode under no_grad takes its fused encoder path (nested tensors with a padding mask): the same
    values at every position that is not padding; torch returns 0 there, we compute them (see docs/pytorch.md)."""
    of.manual_seed(6)
    layer = nn.TransformerEncoderLayer(D_MODEL, NHEAD, FF, dropout=0.3, batch_first=True, dtype=F64)
    ours = nn.TransformerEncoder(layer, 2).eval()
    theirs = load_into(ours, TNN.TransformerEncoder(TNN.TransformerEncoderLayer(D_MODEL, NHEAD, FF, dropout=0.3,
                                                                                batch_first=True), 2)).eval()
    x = seq(S, batch_first=True)
    with torch.no_grad():
        expected = theirs(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(PADDING)).numpy()
    got = ours(of.tensor(x), src_key_padding_mask=of.tensor(PADDING)).numpy()
    close(got[~PADDING], expected[~PADDING], rtol=1e-9, atol=1e-10)
    assert not expected[PADDING].any()  # torch's zeros: the documented difference


def test_dropout_is_active_in_training_only():
    of.manual_seed(7)
    model = nn.TransformerEncoderLayer(D_MODEL, NHEAD, FF, dropout=0.5, dtype=F64)
    x = of.tensor(seq(S))
    a, b = model(x).numpy(), model(x).numpy()
    assert not np.allclose(a, b)  # each call draws its own masks
    model.eval()
    np.testing.assert_array_equal(model(x).numpy(), model(x).numpy())
    model.dropout.p = model.dropout1.p = model.dropout2.p = model.self_attn.dropout = 0.0
    model.train()
    np.testing.assert_array_equal(model(x).numpy(), model.eval()(x).numpy())


def test_transformer_errors():
    with pytest.raises(of.ArgumentError, match=r"TransformerEncoderLayer\(\): activation should be relu/gelu, not "
                                                r"tanh"):
        nn.TransformerEncoderLayer(8, 2, activation="tanh")
    with pytest.raises(of.ArgumentError, match=r"TransformerDecoderLayer\(\): activation must be 'relu', 'gelu' or "
                                                r"a callable"):
        nn.TransformerDecoderLayer(8, 2, activation=3)
    with pytest.raises(of.ArgumentError, match=r"TransformerEncoderLayer\(\): dropout must be a probability"):
        nn.TransformerEncoderLayer(8, 2, dropout=1.5)
    with pytest.raises(of.ArgumentError, match="divisible by num_heads"):
        nn.TransformerEncoderLayer(8, 3)
    with pytest.raises(of.ArgumentError, match=r"TransformerEncoder\(\): argument 'num_layers' must be an int >= 1"):
        nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 0)
    with pytest.raises(of.ArgumentError, match=r"TransformerDecoder\(\): expected a layer"):
        nn.TransformerDecoder("layer", 2)
    model = nn.Transformer(8, 2, 1, 1, 16)
    with pytest.raises(of.ShapeError, match="the batch number of src and tgt must be equal"):
        model(of.randn(5, 2, 8), of.randn(4, 3, 8))
    with pytest.raises(of.ShapeError, match=r"feature number of src and tgt must be equal to d_model \(8\)"):
        model(of.randn(5, 2, 8), of.randn(4, 2, 6))


# -- compiled ----------------------------------------------------------------------------------------------------


class Seq2Seq(nn.Module):
    """A tiny translation model around nn.Transformer: embeddings in, a vocabulary out."""

    def __init__(self, vocab=11):
        super().__init__()
        self.embed = nn.Embedding(vocab, D_MODEL, dtype=F64)
        self.transformer = nn.Transformer(D_MODEL, NHEAD, 2, 2, FF, dropout=0.0, batch_first=True, dtype=F64)
        self.out = nn.Linear(D_MODEL, vocab, dtype=F64)

    def forward(self, src, tgt, padding):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=F64)
        h = self.transformer(self.embed(src), self.embed(tgt), tgt_mask=mask, src_key_padding_mask=padding,
                             memory_key_padding_mask=padding, tgt_is_causal=True)
        return self.out(h)


@pytest.mark.parametrize("native", [True, False])
def test_a_compiled_training_step_equals_eager(native, monkeypatch):
    """With native code off (OPFORGE_NATIVE=0) the compiled steps give eager's bits; with it on, eager's values within
    the rounding of the native loops' other summation order (opforge.program.native)."""
    monkeypatch.setenv("OPFORGE_NATIVE", "1" if native else "0")
    models, steps = [], []
    for compiled in (False, True):
        of.manual_seed(8)
        model = Seq2Seq()
        opt = of.optim.Adam(model.parameters(), lr=1e-2)

        def step(src, tgt, padding, model=model, opt=opt):
            logits = model(src, tgt[:, :-1], padding)
            loss = F.cross_entropy(F.reshape(logits, shape=[-1, 11]), F.reshape(tgt[:, 1:], shape=[-1]))
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        models.append(model)
        steps.append(of.compile(step) if compiled else step)
    rng = np.random.default_rng(0)
    src, tgt = of.tensor(rng.integers(0, 11, (N, S))), of.tensor(rng.integers(0, 11, (N, L + 1)))
    padding = of.tensor(PADDING)
    losses = [[], []]
    for _ in range(4):  # the same batch: the loss must go down
        for i, step in enumerate(steps):
            losses[i].append(step(src, tgt, padding).item())
    assert losses[0][-1] < losses[0][0]
    if not native:
        assert losses[1] == losses[0]
        for (name, a), b in zip(models[0].state_dict().items(), models[1].state_dict().values()):
            np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=name)
        return
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-10)
    for (name, a), b in zip(models[0].state_dict().items(), models[1].state_dict().values()):
        a, b = a.numpy(), b.numpy()
        if name.endswith("in_proj_bias"):
            # The key bias (the middle third) starts at 0 and its gradient is 0 in exact arithmetic (it adds q·b_k to
            # a whole row of scores, which softmax ignores): rounding noise, which Adam's g/(√v + eps) turns into
            # steps of ~lr·g/eps (~1e-11 here) whose sign follows the noise. Compiled, the softmax rows sum in another
            # order than the eager kernels: there the two agree within that noise's size, not relatively.
            d = len(a) // 3
            close(b[d:2 * d], a[d:2 * d], rtol=0, atol=1e-10, msg=name)
            a, b = a[np.r_[:d, 2 * d:3 * d]], b[np.r_[:d, 2 * d:3 * d]]
        close(b, a, rtol=1e-9, atol=1e-12, msg=name)


def test_transformer_exports_to_onnx_and_runs_in_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    of.manual_seed(9)
    model = nn.Transformer(D_MODEL, NHEAD, 1, 1, FF, batch_first=True).eval()  # dropout off
    src, tgt = (randn(N, n, D_MODEL, seed=n).astype(np.float32) for n in (S, L))
    padding = PADDING

    def translate(src, tgt, padding):
        mask = nn.Transformer.generate_square_subsequent_mask(L)
        return model(src, tgt, tgt_mask=mask, src_key_padding_mask=padding, memory_key_padding_mask=padding)

    proto = of.onnx.export(translate, None, (of.tensor(src), of.tensor(tgt), of.tensor(padding)))
    session = ort.InferenceSession(proto.SerializeToString())
    (got,) = session.run(None, dict(zip([i.name for i in session.get_inputs()], (src, tgt, padding))))
    close(got, translate(of.tensor(src), of.tensor(tgt), of.tensor(padding)).numpy(), rtol=1e-5, atol=1e-5)
