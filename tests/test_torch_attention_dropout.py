"""``F.scaled_dot_product_attention(..., dropout_p > 0)`` and ``nn.MultiheadAttention(dropout=p)`` in training:
attention weights dropped from opforge's seeded generator (F.dropout's), so values cannot be torch's: what is
checked is that each weight is torch's (no-dropout) weight scaled by 1/(1 − p) or 0, that about p of them are 0
and the output is unbiased, that the gradient for a fixed mask is right (numerically in float64, and against
torch given the same mask), that ``of.manual_seed`` repeats a draw, eagerly and compiled alike, and that
``dropout_p=0`` and eval mode are exactly torch's."""

import numpy as np
import pytest
import torch

import opforge as of
from opforge import nn
from opforge import ops as F

TF = torch.nn.functional
RNG = np.random.default_rng(0)


def _qkv(*lead, length=6, source=5, e=4):
    return [RNG.standard_normal((*lead, n, e)) for n in (length, source)] + [RNG.standard_normal((*lead, source, 3))]


def _torch_weights(q, k, **kwargs):
    """torch's attention weights (no dropout): its output for v = I."""
    eye = torch.eye(k.shape[-2], dtype=torch.float64).expand(*k.shape[:-2], -1, -1)
    return TF.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), eye, **kwargs).numpy()


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"scale": 0.7},
                                    {"attn_mask": np.tril(np.ones((6, 5), bool), 1)}], ids=["plain", "causal",
                                                                                               "scale", "bool mask"])
def test_each_weight_is_torchs_scaled_or_dropped(kwargs):
    q, k, _ = _qkv(2, 3)
    p = 0.3
    want = _torch_weights(q, k, **{n: torch.tensor(a) if isinstance(a, np.ndarray) else a for n, a in kwargs.items()})
    eye = of.tensor(np.broadcast_to(np.eye(5), (2, 3, 5, 5)).copy())
    got = F.scaled_dot_product_attention(of.tensor(q), of.tensor(k), eye, dropout_p=p,
                                         **{n: of.tensor(a) if isinstance(a, np.ndarray) else a
                                            for n, a in kwargs.items()}).numpy()
    kept = got != 0
    np.testing.assert_allclose(got[kept], want[kept] / (1 - p), rtol=1e-12)
    candidates = want != 0  # weights that can be dropped (a masked one is 0 anyway)
    dropped = np.count_nonzero(~kept & candidates) / np.count_nonzero(candidates)
    assert 0.15 < dropped < 0.45, dropped  # p = 0.3 of ~150 weights: 4 standard deviations either side


def test_dropped_weights_are_unbiased_and_dropped_at_rate_p():
    q, k, v = _qkv(4, 2, length=8, source=8)
    want = TF.scaled_dot_product_attention(*(torch.tensor(t) for t in (q, k, v))).numpy()
    p, draws = 0.4, 400
    eye = of.tensor(np.broadcast_to(np.eye(8), (4, 2, 8, 8)).copy())
    of.manual_seed(1)
    outs = np.stack([F.scaled_dot_product_attention(of.tensor(q), of.tensor(k), of.tensor(v), None, p).numpy()
                     for _ in range(draws)])
    sd = outs.std(axis=0) / np.sqrt(draws)
    assert (np.abs(outs.mean(axis=0) - want) < 5 * sd + 1e-12).all()  # E[out] = the output without dropout
    weights = F.scaled_dot_product_attention(of.tensor(q), of.tensor(k), eye, None, p).numpy()
    zeros = np.count_nonzero(weights == 0) / weights.size  # 512 weights, none 0 but those dropped
    assert abs(zeros - p) < 4 * np.sqrt(p * (1 - p) / weights.size), zeros


def _mask_drawn(seed, shape, p):
    """The keep-mask F.scaled_dot_product_attention draws after of.manual_seed(seed) (F.dropout's first draw)."""
    of.manual_seed(seed)
    return F.dropout_with_mask(of.tensor(np.ones(shape)), p=p).mask.numpy()


def test_gradient_for_a_fixed_mask_numerically_and_as_torch():
    q, k, v = _qkv(2, length=4, source=5)
    p, seed = 0.25, 7
    mask = np.tril(RNG.standard_normal((4, 5)) > -1.0, 1)  # a boolean mask too

    def attention(q, k, v):
        of.manual_seed(seed)  # every evaluation draws the same mask
        return F.scaled_dot_product_attention(q, k, v, of.tensor(mask), p)

    inputs = [of.tensor(t, requires_grad=True) for t in (q, k, v)]
    of.testing.gradcheck(attention, inputs)
    keep = _mask_drawn(seed, (2, 4, 5), p)
    tq, tk, tv = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    weights = TF.scaled_dot_product_attention(tq, tk, torch.eye(5, dtype=torch.float64).expand(2, 5, 5),
                                              attn_mask=torch.tensor(mask))
    want = (weights * torch.tensor(keep) / (1 - p)) @ tv  # torch's computation with our mask
    got = attention(*inputs)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-14)
    u = RNG.standard_normal(got.shape)
    wants = torch.autograd.grad(want, (tq, tk, tv), torch.tensor(u))
    gots = of.grad(got, inputs, grad_outputs=of.tensor(u))
    for g, w in zip(gots, wants):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("native", [True, False])
def test_manual_seed_repeats_the_draw_eagerly_and_compiled(native, monkeypatch):
    monkeypatch.setenv("OPFORGE_NATIVE", "1" if native else "0")
    q, k, v = (of.tensor(t.astype(np.float32), requires_grad=True) for t in _qkv(3, 2))

    def step(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, None, 0.5, True)
        return (out, *of.grad(F.sum(out * out), [q, k, v]))

    of.manual_seed(3)
    eager = step(q, k, v)
    of.manual_seed(3)
    again = step(q, k, v)
    compiled = of.compile(step)
    of.manual_seed(3)
    first = compiled(q, k, v)
    of.manual_seed(3)
    second = compiled(q, k, v)
    for a, b, c, d in zip(eager, again, first, second):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_array_equal(c.numpy(), d.numpy())
        if native:  # the softmax rows as native loops: another summation order (opforge.program.native), a few ulp
            np.testing.assert_allclose(c.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)  # (another mask: O(1) apart)
        else:  # OPFORGE_NATIVE=0: eager's bits
            np.testing.assert_array_equal(a.numpy(), c.numpy())
    of.manual_seed(4)
    assert not np.array_equal(step(q, k, v)[0].numpy(), eager[0].numpy())  # another seed, another mask


def test_dropout_p_zero_is_torchs():
    q, k, v = _qkv(2, 2)
    want = TF.scaled_dot_product_attention(*(torch.tensor(t) for t in (q, k, v)), dropout_p=0.0, is_causal=True)
    got = F.scaled_dot_product_attention(*(of.tensor(t) for t in (q, k, v)), dropout_p=0.0, is_causal=True)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-15)  # (rounding: another BLAS)


@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_dropout_in_training_and_eval(need_weights):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2, dropout=0.5, dtype=torch.float64)
    ours = nn.MultiheadAttention(8, 2, dropout=0.5, dtype="float64")
    ours.load_state_dict({n: of.tensor(t.detach().numpy()) for n, t in theirs.state_dict().items()})
    x = RNG.standard_normal((5, 3, 8))  # (L, N, E)
    theirs.eval()
    ours.eval()  # no dropout: torch's output
    want = theirs(*(torch.tensor(x),) * 3, need_weights=need_weights)[0].detach().numpy()
    np.testing.assert_allclose(ours(*(of.tensor(x),) * 3, need_weights=need_weights)[0].numpy(), want, rtol=1e-12,
                               atol=1e-14)
    ours.train()  # dropout of the weights: each draw its own, of.manual_seed repeats it, and either path agrees
    outs = []
    for weights in (need_weights, not need_weights):
        of.manual_seed(9)
        outs.append(ours(*(of.tensor(x),) * 3, need_weights=weights)[0].numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-12, atol=1e-14)
    assert not np.allclose(outs[0], want)
    of.manual_seed(10)
    assert not np.allclose(ours(*(of.tensor(x),) * 3, need_weights=need_weights)[0].numpy(), outs[0])


def test_wrong_calls_with_dropout_name_the_op():
    q, k, v = (of.tensor(t) for t in _qkv(2))
    with pytest.raises(of.ShapeError, match=r"dot_product_attention\(\): q \(\.\.\., L, E\), k \(\.\.\., S, E\) and v"):
        F.scaled_dot_product_attention(q, of.tensor(np.ones((2, 5, 3))), v, None, 0.5)
    with pytest.raises(of.ArgumentError, match=r"dot_product_attention\(\): give attn_mask or is_causal=True"):
        F.scaled_dot_product_attention(q, k, v, of.tensor(np.ones((6, 5), bool)), 0.5, True)
    with pytest.raises(of.ArgumentError, match=r"scaled_dot_product_attention\(\): argument 'dropout_p' must be a "
                                               r"probability in \[0, 1\], got -0.1"):
        F.scaled_dot_product_attention(q, k, v, None, -0.1)
