"""Recurrent layers against torch.nn: RNN, LSTM, GRU and their cells with torch's weights (its state dict loaded into
ours, strict) on the same data, in float64: outputs, final states and the gradients of the input, the initial states
and every parameter; second derivatives where torch's CPU layers have them; variable-length batches through
PackedSequence; torch's constructor, defaults, initialisation and errors; dropout between layers; and a compiled
training step that computes what the eager one does. The sequence ops themselves go through check_op in
tests/test_conformance.py (every registered op does)."""

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
from opforge.nn.utils import rnn as R

TNN = torch.nn
TR = torch.nn.utils.rnn


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a.numpy() if isinstance(a, of.Tensor) else a))


def close(ours, theirs, rtol=1e-10, atol=1e-12, msg=""):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    np.testing.assert_allclose(ours.numpy() if isinstance(ours, of.Tensor) else ours, theirs, rtol=rtol, atol=atol,
                               err_msg=msg)


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def pair(cls, *args, **kwargs):
    """Our layer in float64 and torch's with our weights (strict load: the same parameter names and shapes)."""
    of.manual_seed(0)
    ours = getattr(nn, cls)(*args, **kwargs, dtype=of.float64)
    theirs = getattr(TNN, cls)(*args, **kwargs).double()
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    return ours, theirs


def leaves(*arrays):
    return [of.tensor(a, requires_grad=True) for a in arrays], [t(a).requires_grad_() for a in arrays]


def flat(out):
    """The tensors of a layer's result, in order: output, then the states (None dropped)."""
    if isinstance(out, (tuple, list)):
        return [x for o in out for x in flat(o)]
    return [] if out is None else [out]


def compare(ours, theirs, xo, xt, states_o=(), states_t=(), seed=1):
    """Outputs equal, then the gradients of a random weighting of every output (input, states, parameters)."""
    outs_o, outs_t = flat(ours), flat(theirs)
    assert len(outs_o) == len(outs_t)
    for k, (a, b) in enumerate(zip(outs_o, outs_t)):
        assert a.shape == tuple(b.shape), (k, a.shape, b.shape)
        close(a, b, msg=f"output {k}")
    weights = [randn(*a.shape, seed=seed + k) for k, a in enumerate(outs_o)]
    F.add_n([F.sum(a * of.tensor(w)) for a, w in zip(outs_o, weights)]).backward()
    sum((b * t(w)).sum() for b, w in zip(outs_t, weights)).backward()
    for k, (a, b) in enumerate(zip([xo, *states_o], [xt, *states_t])):
        close(a.grad, b.grad, msg=f"input {k}'s gradient")


def compare_params(ours, theirs):
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        close(p.grad, grads[name].grad, msg=name)


# -- the layers against torch ----------------------------------------------------------------------------------------

LAYERS = {
    "lstm": ("LSTM", (5, 4), {}),
    "lstm_2_layers_bidirectional": ("LSTM", (5, 4, 2), {"bidirectional": True}),
    "lstm_batch_first_no_bias": ("LSTM", (5, 4), {"batch_first": True, "bias": False}),
    "lstm_proj": ("LSTM", (5, 4, 2), {"proj_size": 3, "bidirectional": True}),
    "gru": ("GRU", (5, 4), {}),
    "gru_2_layers_bidirectional_batch_first": ("GRU", (5, 4, 2), {"bidirectional": True, "batch_first": True}),
    "gru_no_bias": ("GRU", (5, 3), {"bias": False}),
    "rnn_tanh": ("RNN", (5, 4, 2), {"bidirectional": True}),
    "rnn_relu": ("RNN", (5, 4), {"nonlinearity": "relu", "batch_first": True}),
    "rnn_relu_positional_no_bias": ("RNN", (5, 4, 1, "relu", False), {}),
}


def _states(ours, batch, seed, unbatched=False):
    directions = 2 if ours.bidirectional else 1
    shape_h = (ours.num_layers * directions, *(() if unbatched else (batch,)), ours.proj_size or ours.hidden_size)
    shape_c = (*shape_h[:-1], ours.hidden_size)
    h = randn(*shape_h, seed=seed)
    return [h, randn(*shape_c, seed=seed + 1)] if ours.mode == "LSTM" else [h]


def _hx(ours, states):
    return tuple(states) if ours.mode == "LSTM" else states[0]


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("with_states", [False, True])
def test_layer_matches_torch(name, with_states):
    cls, args, kwargs = LAYERS[name]
    ours, theirs = pair(cls, *args, **kwargs)
    steps, batch = 6, 3
    shape = (batch, steps, args[0]) if kwargs.get("batch_first") else (steps, batch, args[0])
    (xo,), (xt,) = leaves(randn(*shape))
    if with_states:
        so, st = leaves(*_states(ours, batch, seed=5))
        out_o, out_t = ours(xo, _hx(ours, so)), theirs(xt, _hx(ours, st))
    else:
        so = st = ()
        out_o, out_t = ours(xo), theirs(xt)
    compare(out_o, out_t, xo, xt, so, st)
    compare_params(ours, theirs)


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
def test_unbatched_input(cls):
    ours, theirs = pair(cls, 3, 4, 2, bidirectional=True)
    (xo,), (xt,) = leaves(randn(5, 3))
    so, st = leaves(*_states(ours, None, seed=2, unbatched=True))
    out_o, out_t = ours(xo, _hx(ours, so)), theirs(xt, _hx(ours, st))
    assert flat(out_o)[0].shape == (5, 8)
    compare(out_o, out_t, xo, xt, so, st)
    compare_params(ours, theirs)


@pytest.mark.parametrize("cls, kwargs", [("LSTM", {}), ("GRU", {"bidirectional": True}), ("RNN", {}),
                                         ("LSTM", {"proj_size": 2})])
def test_second_derivatives_match_torch(cls, kwargs):
    """torch's CPU layers have double backward: a Hessian-vector product through the whole layer."""
    ours, theirs = pair(cls, 3, 4, 2, **kwargs)
    (xo,), (xt,) = leaves(randn(4, 2, 3))
    yo, yt = flat(ours(xo))[0], flat(theirs(xt))[0]
    w = randn(*yo.shape, seed=3)
    po, pt = list(ours.parameters()), list(theirs.parameters())
    go = of.grad(F.sum(F.tanh(yo) * of.tensor(w)), [xo, *po], create_graph=True)
    gt = torch.autograd.grad((torch.tanh(yt) * t(w)).sum(), [xt, *pt], create_graph=True)
    vs = [randn(*g.shape, seed=10 + k) for k, g in enumerate(go)]
    hvp_o = of.grad(F.add_n([F.sum(g * of.tensor(v)) for g, v in zip(go, vs)]), [xo, *po])
    hvp_t = torch.autograd.grad(sum((g * t(v)).sum() for g, v in zip(gt, vs)), [xt, *pt])
    for k, (a, b) in enumerate(zip(hvp_o, hvp_t)):
        close(a, b, rtol=1e-9, atol=1e-11, msg=f"H·v, input {k}")


@pytest.mark.parametrize("cls, kwargs", [("LSTM", {}), ("LSTM", {"bidirectional": True}), ("GRU", {})])
@pytest.mark.parametrize("used", [0, 1, 2])
@pytest.mark.parametrize("compiled", [False, True])
def test_gradients_from_one_output_alone_match_torch(cls, kwargs, used, compiled):
    """A loss of the output alone, of h_n alone or of c_n alone: the sequence ops' rules then get no gradient
    (None) for some of their outputs (the cell states, the gates, and with c_n alone even y), eagerly, replayed
    (the second and third passes) and compiled."""
    if cls == "GRU" and used == 2:
        pytest.skip("a GRU has no c_n")
    ours, theirs = pair(cls, 3, 4, 2, **kwargs)
    po, pt = list(ours.parameters()), list(theirs.parameters())
    x = randn(5, 2, 3)
    w = randn(*flat(theirs(t(x)))[used].shape, seed=7)

    def grads(x):
        xo = x if compiled else of.tensor(x.numpy(), requires_grad=True)
        loss = F.sum(flat(ours(xo))[used] * of.tensor(w))
        return of.grad(loss, [xo, *po])

    xt = t(x).requires_grad_()
    want = torch.autograd.grad((flat(theirs(xt))[used] * t(w)).sum(), [xt, *pt])
    run = of.compile(grads) if compiled else grads
    for _ in range(3):
        for k, (a, b) in enumerate(zip(run(of.tensor(x)), want)):
            close(a, b, msg=f"input {k}")



@pytest.mark.parametrize("cls, kwargs", [("LSTM", {"num_layers": 2}), ("GRU", {"bidirectional": True}),
                                         ("RNN", {"num_layers": 2, "nonlinearity": "relu"}),
                                         ("LSTM", {"proj_size": 2, "batch_first": True})])
@pytest.mark.parametrize("compiled", [False, True])
def test_twenty_training_steps_follow_torchs_trajectory(cls, kwargs, compiled):
    """The layer trained 20 steps by SGD with momentum, a new batch each step, from torch's start: the loss and
    every parameter after each step are torch's, eagerly and compiled."""
    follows_torch(*pair(cls, 3, 4, **kwargs), lambda layer, x: (layer(x)[0] ** 2).mean(),
                  [randn(5, 2, 3, seed=20 + k) for k in range(20)], compiled)


def follows_torch(ours, theirs, loss_of, batches, compiled):
    """Train ``ours`` and ``theirs`` (torch's, with the same start) by SGD with momentum on ``batches``, one step
    each, ``loss_of(layer, x)`` their loss: the loss and every parameter after each step are torch's."""
    opt_o = of.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    opt_t = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)

    def step(x):
        loss = loss_of(ours, x)
        loss.backward()
        opt_o.step()
        opt_o.zero_grad()
        return loss

    run = of.compile(step) if compiled else step
    for k, x in enumerate(batches):
        loss_t = loss_of(theirs, t(x))
        loss_t.backward()
        opt_t.step()
        opt_t.zero_grad()
        close(run(of.tensor(x)), loss_t, rtol=1e-9, msg=f"loss at step {k}")
        for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
            close(a, b, rtol=1e-9, atol=1e-11, msg=f"{name} after step {k}")


# -- cells -----------------------------------------------------------------------------------------------------------

CELLS = [("LSTMCell", (4, 3), {}), ("GRUCell", (4, 3), {}), ("RNNCell", (4, 3), {}),
         ("RNNCell", (4, 3), {"nonlinearity": "relu", "bias": False}), ("LSTMCell", (4, 3), {"bias": False})]


@pytest.mark.parametrize("cls, args, kwargs", CELLS)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_states", [False, True])
def test_cell_matches_torch(cls, args, kwargs, batched, with_states):
    ours, theirs = pair(cls, *args, **kwargs)
    batch = (2,) if batched else ()
    (xo,), (xt,) = leaves(randn(*batch, 4))
    lstm = cls == "LSTMCell"
    if with_states:
        so, st = leaves(*[randn(*batch, 3, seed=k + 3) for k in range(2 if lstm else 1)])
        hx_o, hx_t = (tuple(so), tuple(st)) if lstm else (so[0], st[0])
        out_o, out_t = ours(xo, hx_o), theirs(xt, hx_t)
    else:
        so = st = ()
        out_o, out_t = ours(xo), theirs(xt)
    compare(out_o, out_t, xo, xt, so, st)
    compare_params(ours, theirs)


@pytest.mark.parametrize("cls", ["LSTMCell", "GRUCell", "RNNCell"])
@pytest.mark.parametrize("compiled", [False, True])
def test_a_cell_trained_twenty_steps_follows_torchs_trajectory(cls, compiled):
    """The cell unrolled over 4 steps and trained 20 steps by SGD with momentum, a new batch each step, from torch's
    start: the loss and every parameter after each step are torch's, eagerly and compiled."""
    def loss_of(cell, xs):
        state, total = None, 0.0
        for k in range(4):
            state = cell(xs[k], state)
            total = total + (state[0] if isinstance(state, tuple) else state) ** 2
        return total.mean()

    follows_torch(*pair(cls, 3, 4), loss_of, [randn(4, 2, 3, seed=60 + k) for k in range(20)], compiled)


def test_a_cell_unrolled_by_hand_trains_like_torchs():
    ours, theirs = pair("LSTMCell", 3, 4)
    (xo,), (xt,) = leaves(randn(5, 2, 3))
    ho = co = None
    hx_t = None
    outs_o, outs_t = [], []
    for k in range(5):
        ho, co = ours(xo[k], None if ho is None else (ho, co))
        hx_t = theirs(xt[k], hx_t)
        outs_o.append(ho)
        outs_t.append(hx_t[0])
    compare(outs_o, outs_t, xo, xt)
    compare_params(ours, theirs)


# -- variable lengths: PackedSequence ------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, kwargs", [("LSTM", {"num_layers": 2, "bidirectional": True}),
                                         ("GRU", {"bidirectional": True}), ("RNN", {"num_layers": 2}),
                                         ("LSTM", {"proj_size": 2, "bidirectional": True})])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_packed_sequences_match_torch(cls, kwargs, enforce_sorted):
    ours, theirs = pair(cls, 3, 4, **kwargs)
    lengths = [5, 3, 3, 1] if enforce_sorted else [3, 5, 1, 3]
    (xo,), (xt,) = leaves(randn(5, 4, 3))
    po = R.pack_padded_sequence(xo, lengths, enforce_sorted=enforce_sorted)
    pt = TR.pack_padded_sequence(xt, torch.tensor(lengths), enforce_sorted=enforce_sorted)
    close(po.data, pt.data)
    np.testing.assert_array_equal(po.batch_sizes.numpy(), pt.batch_sizes.numpy())
    for a, b in ((po.sorted_indices, pt.sorted_indices), (po.unsorted_indices, pt.unsorted_indices)):
        assert (a is None and b is None) or np.array_equal(a.numpy(), b.numpy())
    so, st = leaves(*_states(ours, 4, seed=7))
    out_o, out_t = ours(po, _hx(ours, so)), theirs(pt, _hx(ours, st))
    assert isinstance(out_o[0], R.PackedSequence)
    padded_o, len_o = R.pad_packed_sequence(out_o[0], batch_first=True, padding_value=-1.0)
    padded_t, len_t = TR.pad_packed_sequence(out_t[0], batch_first=True, padding_value=-1.0)
    np.testing.assert_array_equal(len_o.numpy(), len_t.numpy())
    compare([padded_o, out_o[1]], [padded_t, out_t[1]], xo, xt, so, st)  # the final states: at each own last step
    compare_params(ours, theirs)


def test_pack_and_pad_helpers_match_torch():
    seqs = [randn(4, 2, seed=1), randn(2, 2, seed=2), randn(5, 2, seed=3)]
    for batch_first in (False, True):
        for side in ("right", "left"):
            close(R.pad_sequence([of.tensor(s) for s in seqs], batch_first=batch_first, padding_value=9.0,
                                 padding_side=side),
                  TR.pad_sequence([t(s) for s in seqs], batch_first=batch_first, padding_value=9.0,
                                  padding_side=side))
    po = R.pack_sequence([of.tensor(s) for s in seqs], enforce_sorted=False)
    pt = TR.pack_sequence([t(s) for s in seqs], enforce_sorted=False)
    close(po.data, pt.data)
    for a, b in zip(R.unpack_sequence(po), TR.unpack_sequence(pt)):
        close(a, b)
    padded, lengths = R.pad_packed_sequence(po, total_length=7)
    want, want_lengths = TR.pad_packed_sequence(pt, total_length=7)
    close(padded, want)
    np.testing.assert_array_equal(lengths.numpy(), want_lengths.numpy())
    for a, b in zip(R.unpad_sequence(padded, lengths), TR.unpad_sequence(want, want_lengths)):
        close(a, b)
    np.testing.assert_array_equal(R.invert_permutation(of.tensor(np.array([2, 0, 1]))).numpy(),
                                  TR.invert_permutation(torch.tensor([2, 0, 1])).numpy())


def test_packing_passes_gradients_back():
    (xo,), (xt,) = leaves(randn(4, 3, 2))
    po = R.pack_padded_sequence(xo, [2, 4, 1], enforce_sorted=False)
    pt = TR.pack_padded_sequence(xt, [2, 4, 1], enforce_sorted=False)
    padded_o, _ = R.pad_packed_sequence(po)
    padded_t, _ = TR.pad_packed_sequence(pt)
    compare([po.data, padded_o], [pt.data, padded_t], xo, xt)


def test_packing_errors_say_what_is_wrong():
    x = of.zeros(4, 3, 2)
    with pytest.raises(of.ArgumentError, match="sorted in decreasing order"):
        R.pack_padded_sequence(x, [3, 4, 2])
    with pytest.raises(of.ShapeError, match=r"len\(lengths\) to be equal to batch_size, but got 2"):
        R.pack_padded_sequence(x, [4, 3])
    with pytest.raises(of.ArgumentError, match="greater than 0"):
        R.pack_padded_sequence(x, [4, 2, 0])
    with pytest.raises(of.ShapeError, match="more than the 4 steps"):
        R.pack_padded_sequence(x, [5, 3, 2])
    with pytest.raises(of.ArgumentError, match="total_length"):
        R.pad_packed_sequence(R.pack_padded_sequence(x, [4, 3, 2]), total_length=3)


# -- constructor, parameters, initialisation, errors ----------------------------------------------------------------


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell"])
def test_parameters_and_repr_are_torchs(cls):
    kwargs = {"num_layers": 2, "bidirectional": True, "batch_first": True, "dropout": 0.25} \
        if not cls.endswith("Cell") else {"bias": False}
    ours, theirs = getattr(nn, cls)(3, 5, **kwargs), getattr(TNN, cls)(3, 5, **kwargs)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]
    assert repr(ours) == repr(theirs)
    bound = 1 / math.sqrt(5)
    for p in ours.parameters():
        values = p.numpy()
        assert values.dtype == np.float32 and np.all(np.abs(values) <= bound)
    # uniform on ±bound: its standard deviation is bound/√3 (0.58·bound); over all the parameters together (a bias of
    # 5 values alone can fall far below it by chance)
    every = np.concatenate([p.numpy().ravel() for p in ours.parameters()])
    assert 0.45 * bound < every.std() < 0.7 * bound


@pytest.mark.parametrize("cls, args, kwargs", [("RNN", (3, 5), {"nonlinearity": "relu"}),
                                               ("RNNCell", (3, 5), {"nonlinearity": "relu"}),
                                               ("LSTM", (3, 5, 2), {"proj_size": 2, "bias": False, "dropout": 0.5})])
def test_more_reprs_are_torchs(cls, args, kwargs):
    assert repr(getattr(nn, cls)(*args, **kwargs)) == repr(getattr(TNN, cls)(*args, **kwargs))


def test_constructor_signatures_follow_torch():
    for cls in ("LSTMCell", "GRUCell", "RNNCell"):
        ours, theirs = inspect.signature(getattr(nn, cls)), inspect.signature(getattr(TNN, cls))
        assert [(p.name, p.default) for p in ours.parameters.values()] == \
            [(p.name, p.default) for p in theirs.parameters.values()]
    ours = nn.LSTM(3, 5, 2, False, True, 0.0, True, 2)  # torch's positional order: ..., proj_size
    assert (ours.num_layers, ours.bias, ours.batch_first, ours.bidirectional, ours.proj_size) == (2, False, True,
                                                                                                    True, 2)
    assert nn.RNN(3, 5, 1, "relu").nonlinearity == "relu"
    lstm = nn.LSTM(3, 5)
    assert lstm.all_weights == [[lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0]]
    lstm.flatten_parameters()


def test_constructor_errors_are_torchs():
    with pytest.raises(of.ArgumentError, match="proj_size has to be smaller than hidden_size"):
        nn.LSTM(3, 4, proj_size=4)
    with pytest.raises(of.ArgumentError, match="only supported for LSTM"):
        nn.GRU(3, 4, proj_size=2)
    with pytest.raises(of.ArgumentError, match="Unknown nonlinearity 'gelu'"):
        nn.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(of.ArgumentError, match="dropout should be a number in range"):
        nn.LSTM(3, 4, dropout=1.5)
    with pytest.raises(of.ArgumentError, match="hidden_size must be greater than zero"):
        nn.GRU(3, 0)
    with pytest.raises(of.ArgumentError, match="bias should be of type bool"):
        nn.LSTM(3, 4, bias=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nn.LSTM(3, 4, dropout=0.5)
    assert any("non-zero dropout expects num_layers greater than 1" in str(w.message) for w in caught)


def test_forward_errors_name_the_mistake():
    lstm = nn.LSTM(3, 4, 2)
    with pytest.raises(of.ShapeError, match=r"input.size\(-1\) must be equal to input_size. Expected 3, got 5"):
        lstm(of.zeros(2, 1, 5))
    with pytest.raises(of.ShapeError, match="Expected input to be 2D or 3D, got 4D"):
        lstm(of.zeros(2, 1, 3, 1))
    with pytest.raises(of.ShapeError, match=r"hidden\[0\] of size \(2, 1, 4\), got \(1, 1, 4\)"):
        lstm(of.zeros(2, 1, 3), (of.zeros(1, 1, 4), of.zeros(2, 1, 4)))
    with pytest.raises(of.ShapeError, match="should also be 3-D"):
        lstm(of.zeros(2, 1, 3), (of.zeros(2, 4), of.zeros(2, 4)))
    with pytest.raises(of.ArgumentError, match="does not match weight dtype"):
        lstm(of.zeros(2, 1, 3, dtype=of.float64))
    with pytest.raises(of.ShapeError, match="Expected input to be 1D or 2D"):
        nn.GRUCell(3, 4)(of.zeros(1, 2, 3))
    with pytest.raises(of.ShapeError, match=r"expected hidden of size \(2, 4\)"):
        nn.GRUCell(3, 4)(of.zeros(2, 3), of.zeros(3, 4))


# -- dropout between layers, training --------------------------------------------------------------------------------


def test_dropout_acts_between_layers_in_training_only():
    ours, theirs = pair("LSTM", 3, 4, 3, dropout=0.5)
    x = of.tensor(randn(5, 2, 3))
    ours.eval()
    close(ours(x)[0], theirs.eval()(t(x))[0])  # eval: no dropout, torch's values
    ours.train()
    of.manual_seed(3)
    a = ours(x)[0].numpy()
    of.manual_seed(3)
    np.testing.assert_array_equal(ours(x)[0].numpy(), a)  # seeded
    assert not np.allclose(a, ours.eval()(x)[0].numpy())  # training dropped something
    single = nn.GRU(3, 4, 1, dropout=0.0)
    single.train()
    close(single(x.float())[0], single.eval()(x.float())[0])  # one layer: nothing to drop


def _lm(seed=0):
    of.manual_seed(seed)
    return nn.ModuleDict({"emb": nn.Embedding(11, 6), "rnn": nn.LSTM(6, 8, 2, dropout=0.0),
                          "gru": nn.GRU(8, 8, batch_first=False), "head": nn.Linear(8, 11)})


def _lm_step(model, opt):
    def step(x, y):
        h, _ = model["rnn"](model["emb"](x))
        h, _ = model["gru"](h)
        logits = model["head"](h)
        loss = F.cross_entropy(logits.reshape(-1, 11), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@pytest.mark.parametrize("steps", [1, 3])
def test_compiled_training_step_equals_eager(steps):
    models = _lm(), _lm()
    opts = [of.optim.Adam(m.parameters(), lr=1e-2) for m in models]
    eager, compiled = _lm_step(models[0], opts[0]), of.compile(_lm_step(models[1], opts[1]))
    rng = np.random.default_rng(0)
    for _ in range(steps):
        data = rng.integers(0, 11, (7, 4))
        x, y = of.tensor(data[:-1]), of.tensor(data[1:])
        le, lc = eager(x, y), compiled(x, y)
        np.testing.assert_allclose(lc.numpy(), le.numpy(), rtol=1e-5)
    for (name, pe), (_, pc) in zip(models[0].named_parameters(), models[1].named_parameters()):
        np.testing.assert_allclose(pc.numpy(), pe.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
    start = _lm()
    assert all(not np.allclose(p.numpy(), s.numpy()) for p, s in zip(models[1].parameters(), start.parameters()))


def test_compiled_forward_with_states_and_reverse():
    ours, theirs = pair("LSTM", 3, 4, 2, bidirectional=True, batch_first=True)
    x, h, c = randn(2, 5, 3), randn(4, 2, 4, seed=1), randn(4, 2, 4, seed=2)
    run = of.compile(lambda x, h, c: ours(x, (h, c)))
    out, (h_n, c_n) = run(of.tensor(x), of.tensor(h), of.tensor(c))
    want, (h_t, c_t) = theirs(t(x), (t(h), t(c)))
    for a, b in ((out, want), (h_n, h_t), (c_n, c_t)):
        close(a, b)


def test_training_an_lstm_lowers_the_loss():
    model = _lm()
    opt = of.optim.Adam(model.parameters(), lr=2e-2)
    step = of.compile(_lm_step(model, opt))
    data = np.tile(np.arange(11), 4)[:40].reshape(10, 4)  # a cycle: the next token is predictable
    x, y = of.tensor(data[:-1]), of.tensor(data[1:])
    first = step(x, y).item()
    for _ in range(40):
        last = step(x, y).item()
    assert last < first / 3


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN", "LSTMCell"])
def test_device_argument_puts_parameters_there(cls):
    twin = of.register_device("twin", kernels_of="cpu")  # NumPy under another name (as tests/test_devices.py)
    of.manual_seed(0)
    here = getattr(nn, cls)(3, 4, dtype=of.float64)
    of.manual_seed(0)
    there = getattr(nn, cls)(3, 4, device="twin", dtype=of.float64)
    assert all(p.device is twin for p in there.parameters())
    x = randn(5, 3) if cls.endswith("Cell") else randn(5, 2, 3)
    outs = [flat(m(of.tensor(x, device=d)))[0] for m, d in ((here, "cpu"), (there, "twin"))]
    assert outs[1].device is twin
    close(outs[1].cpu(), outs[0])
    for o in outs:
        F.sum(o).backward()
    for a, b in zip(here.parameters(), there.parameters()):
        close(b.grad.cpu(), a.grad)


# -- float32: the step products run as stacks of column blocks ---------------------------------------------------


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_float32_layers_whose_step_products_run_in_blocks_match_torch(cls):
    from opforge.ops.recurrent import _StepProduct

    hidden, batch = 128, 6  # 4·128 or 3·128 columns in blocks forwards, 128 in blocks backwards
    gates = {"LSTM": 4, "GRU": 3}[cls] * hidden
    assert _StepProduct(np.zeros((hidden, gates), np.float32), batch, _StepProduct.FORWARD).blocks is not None
    assert _StepProduct(np.zeros((gates, hidden), np.float32), batch, _StepProduct.BACKWARD).blocks is not None
    of.manual_seed(0)
    ours = getattr(nn, cls)(8, hidden, 2, bidirectional=True)
    theirs = getattr(TNN, cls)(8, hidden, 2, bidirectional=True)
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    x = randn(7, batch, 8).astype(np.float32)
    (xo,), (xt,) = leaves(x)
    so, st = leaves(*[s.astype(np.float32) for s in _states(ours, batch, seed=3)])
    # packed: every row in the first step, fewer later (the blocks' products on the first rows only)
    lengths = [7, 6, 6, 4, 2, 1]
    xo_in, xt_in = R.pack_padded_sequence(xo, lengths), TR.pack_padded_sequence(xt, torch.tensor(lengths))
    out_o, out_t = ours(xo_in, _hx(ours, so)), theirs(xt_in, _hx(ours, st))
    out_o = [R.pad_packed_sequence(out_o[0])[0], out_o[1]]
    out_t = [TR.pad_packed_sequence(out_t[0])[0], out_t[1]]
    outs_o, outs_t = flat(out_o), flat(out_t)
    for a, b in zip(outs_o, outs_t):
        close(a, b, rtol=1e-4, atol=1e-5)
    weights = [randn(*a.shape, seed=k).astype(np.float32) for k, a in enumerate(outs_o)]
    F.add_n([F.sum(a * of.tensor(w)) for a, w in zip(outs_o, weights)]).backward()
    sum((b * t(w)).sum() for b, w in zip(outs_t, weights)).backward()
    for a, b in zip([xo, *so], [xt, *st]):
        close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-5, msg=name)


def test_a_step_product_in_blocks_equals_one_product():
    from opforge.ops.recurrent import _StepProduct

    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 1024)).astype(np.float32)
    product = _StepProduct(w, 20, _StepProduct.FORWARD)
    assert product.blocks is not None
    for rows in (20, 13, 1):  # all rows, and the first rows of a packed batch
        a, add = rng.standard_normal((rows, 256)).astype(np.float32), rng.standard_normal((rows, 1024)).astype(
            np.float32)
        out = np.empty((rows, 1024), np.float32)
        np.testing.assert_allclose(product(a, out), a @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(product(a, out, add=add), a @ w + add, rtol=1e-5, atol=1e-5)
