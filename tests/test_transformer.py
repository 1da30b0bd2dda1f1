"""nn.MultiheadAttention (every torch option) against torch.nn, in float64: torch's
modules load our state_dict (strict: the same names, shapes and order), then outputs, the returned weights, the
inputs' and every parameter's gradients must agree; eagerly and inside ``of.compile``. Dropout is 0 (or the modules
are in eval mode) wherever values are compared."""

from __future__ import annotations

import math

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
