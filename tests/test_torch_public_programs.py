"""Public PyTorch programs' own source, run through ``opforge.mock_torch`` with no edits (issue 27, "Must hold").

``tests/programs/`` holds the files as their repositories publish them, byte for byte (each with its licence):

* ``nanogpt/model.py``: karpathy/nanoGPT's model (GPT, its ``configure_optimizers``, ``generate``,
  ``crop_block_size``, ``estimate_mfu``);
* ``mingpt/``: karpathy/minGPT's package (``model.py``, ``trainer.py``, ``utils.py``: its CfgNode config, its
  Trainer with a RandomSampler);
* ``examples/``: pytorch/examples' ``word_language_model/model.py`` (``RNNModel`` with LSTM, GRU and the plain
  RNNs; ``TransformerModel``, a subclass of ``nn.Transformer`` with a float ``-inf`` causal mask),
  ``time_sequence_prediction/train.py`` (``Sequence``: two ``LSTMCell``s in float64, trained with LBFGS) and
  ``regression/main.py`` (a whole script: polynomial regression with ``F.smooth_l1_loss`` and ``param.data.add_``).

Each model file is imported twice: with the real torch, and with ``import torch`` giving opforge. Both models start
from torch's initial weights (its state dict, loaded into opforge's) and train on the same batches with the training
loop their repositories write (nanoGPT's train.py: AdamW groups, ``clip_grad_norm_``; word_language_model's main.py:
``repackage_hidden``, ``model.zero_grad()``, ``p.data.add_(p.grad, alpha=-lr)``; time_sequence_prediction's
``__main__``: LBFGS with a closure); the losses agree step by step. The regression script runs whole, as
``python -m opforge.mock_torch main.py`` would run it (its data is drawn at random: opforge's draws, so it is
checked for what it prints, not against torch's numbers).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import opforge as of
from opforge import mock_torch

PROGRAMS = Path(__file__).parent / "programs"


def _import(path: Path, name: str, mocked: bool):
    """The module at ``path``, imported under ``name`` with torch, or with opforge as torch."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if mocked:
        with mock_torch.enable():
            spec.loader.exec_module(module)
    else:
        spec.loader.exec_module(module)
    return module


def _same_start(theirs, ours) -> None:
    ours.load_state_dict({k: of.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})


def _close(got: list, want: list, rtol: float = 2e-6) -> None:
    assert len(got) == len(want)
    np.testing.assert_allclose(got, want, rtol=rtol)


# -- nanoGPT -----------------------------------------------------------------------------------------------------------

_CORPUS = np.tile(np.arange(32) * 7 % 32, 40)


def _gpt_batch(torch_like, it: int):
    ix = np.arange(4) * 37 + it * 11
    x = np.stack([_CORPUS[j:j + 16] for j in ix])
    y = np.stack([_CORPUS[j + 1:j + 17] for j in ix])
    return torch_like.tensor(x), torch_like.tensor(y)


def _train_gpt(model, torch_like, steps: int) -> list:
    optimizer = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cpu")
    losses = []
    for it in range(steps):
        X, Y = _gpt_batch(torch_like, it)
        _logits, loss = model(X, Y)
        loss.backward()
        torch_like.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_model_py_trains_as_torch(bias):
    """nanoGPT's model.py, unchanged: the flash path (F.scaled_dot_product_attention with torch's positional
    dropout_p and is_causal), LayerNorm with and without bias, weight tying, the decay groups and AdamW; then
    generate with top_k=1 (torch.multinomial of one-hot rows: the same tokens), crop_block_size and estimate_mfu."""
    config = dict(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=bias)
    theirs = _import(PROGRAMS / "nanogpt" / "model.py", "nanogpt_model_torch", mocked=False)
    ours = _import(PROGRAMS / "nanogpt" / "model.py", "nanogpt_model_opforge", mocked=True)
    torch.manual_seed(0)
    want_model = theirs.GPT(theirs.GPTConfig(**config))
    got_model = ours.GPT(ours.GPTConfig(**config))
    _same_start(want_model, got_model)
    assert got_model.get_num_params() == want_model.get_num_params()
    assert got_model.transformer.h[0].attn.flash  # the path through scaled_dot_product_attention
    _close(_train_gpt(got_model, of, 6), _train_gpt(want_model, torch, 6))
    want_model.eval()
    got_model.eval()
    start = _CORPUS[:5].reshape(1, -1)
    want = want_model.generate(torch.tensor(start), 8, top_k=1)
    got = got_model.generate(of.tensor(start), 8, top_k=1)
    assert got.tolist() == want.tolist()
    assert got_model.estimate_mfu(4, 1.0) == pytest.approx(want_model.estimate_mfu(4, 1.0), rel=1e-12)
    for model in (want_model, got_model):
        model.crop_block_size(8)
    X, Y = _gpt_batch(torch, 0)
    want_loss = want_model(X[:, :8].contiguous(), Y[:, :8].contiguous())[1].item()
    X, Y = _gpt_batch(of, 0)
    assert got_model(X[:, :8], Y[:, :8])[1].item() == pytest.approx(want_loss, rel=2e-6)


def test_nanogpt_with_dropout_trains_repeatably_and_evaluates_as_torch():
    """nanoGPT with dropout > 0 passes it to scaled_dot_product_attention as dropout_p in training (nn.Dropout
    elsewhere): the attention weights are dropped from opforge's generator, so of.manual_seed repeats the training
    (torch's masks differ), and in eval mode, where dropout_p is 0, the model computes torch's losses."""
    config = dict(block_size=16, vocab_size=32, n_layer=1, n_head=2, n_embd=16, dropout=0.2, bias=True)
    theirs = _import(PROGRAMS / "nanogpt" / "model.py", "nanogpt_model_torch", mocked=False)
    ours = _import(PROGRAMS / "nanogpt" / "model.py", "nanogpt_model_opforge", mocked=True)
    torch.manual_seed(0)
    want_model = theirs.GPT(theirs.GPTConfig(**config))
    runs = []
    for _ in range(2):
        got_model = ours.GPT(ours.GPTConfig(**config))
        _same_start(want_model, got_model)
        of.manual_seed(5)
        runs.append(_train_gpt(got_model, of, 3))
    assert runs[0] == runs[1] and all(np.isfinite(runs[0]))
    _same_start(want_model, got_model)
    want_model.eval()
    got_model.eval()
    X, Y = _gpt_batch(torch, 1)
    want_loss = want_model(X, Y)[1].item()
    X, Y = _gpt_batch(of, 1)
    assert got_model(X, Y)[1].item() == pytest.approx(want_loss, rel=2e-6)


# -- pytorch/examples' word language model -----------------------------------------------------------------------------

_WORDS = np.array([(i * 7 + i // 5) % 40 for i in range(20 * 12 + 1)])


def _batchify(torch_like, data, bsz):  # main.py's batchify, as written there (less its .to(device))
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    data = data.view(bsz, -1).t().contiguous()
    return data


def _train_language_model(torch_like, model, kind: str, epochs: int, lr: float = 2.0) -> list:
    """main.py's train(), with its settings as arguments: bptt 5, clip 0.25, plain SGD through p.data.add_."""
    bptt, ntokens, batch_size = 5, 40, 4
    train_data = _batchify(torch_like, torch_like.tensor(_WORDS), batch_size)
    criterion = torch_like.nn.NLLLoss()

    def repackage_hidden(h):
        if isinstance(h, torch_like.Tensor):
            return h.detach()
        else:
            return tuple(repackage_hidden(v) for v in h)

    def get_batch(source, i):
        seq_len = min(bptt, len(source) - 1 - i)
        data = source[i:i+seq_len]
        target = source[i+1:i+1+seq_len].view(-1)
        return data, target

    losses = []
    for _ in range(epochs):
        model.train()
        if kind != 'Transformer':
            hidden = model.init_hidden(batch_size)
        for _batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
            data, targets = get_batch(train_data, i)
            model.zero_grad()
            if kind == 'Transformer':
                output = model(data)
                output = output.view(-1, ntokens)
            else:
                hidden = repackage_hidden(hidden)
                output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch_like.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN_TANH", "RNN_RELU", "Transformer"])
def test_word_language_model_trains_as_torch(kind):
    """pytorch/examples' word_language_model/model.py, unchanged, trained by main.py's loop: every --model (LSTM
    and GRU with tied weights, the plain RNNs, the Transformer with its log(tril) mask and PositionalEncoding), in
    training with dropout 0 (the same numbers need no randomness: the program's own dropout is given as 0, that of
    the layers nn.Transformer makes, 0.1, is set to 0 on the modules, attention included)."""
    theirs = _import(PROGRAMS / "examples" / "word_language_model_model.py", "wlm_model_torch", mocked=False)
    ours = _import(PROGRAMS / "examples" / "word_language_model_model.py", "wlm_model_opforge", mocked=True)
    torch.manual_seed(0)

    def build(module):
        if kind == "Transformer":
            return module.TransformerModel(40, 16, 2, 32, 2, 0.0)
        return module.RNNModel(kind, 40, 16, 16, 2, 0.0, kind in ("LSTM", "GRU"))

    want_model, got_model = build(theirs), build(ours)
    _same_start(want_model, got_model)
    for model, torch_like in ((want_model, torch), (got_model, of)):  # nn.Transformer's own layers drop at 0.1
        for m in model.modules():
            if isinstance(m, torch_like.nn.Dropout):
                m.p = 0.0
            elif isinstance(m, torch_like.nn.MultiheadAttention):  # (its attention weights')
                m.dropout = 0.0
    want = _train_language_model(torch, want_model, kind, 2)
    got = _train_language_model(of, got_model, kind, 2)
    _close(got, want, rtol=1e-5)


# -- pytorch/examples' time sequence prediction ------------------------------------------------------------------------


def _sine_waves(T=20, L=16, N=5):  # generate_sine_wave.py's data, smaller
    np.random.seed(2)
    x = np.empty((N, L), 'int64')
    x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
    return np.sin(x / 1.0 / T).astype('float64')


def _train_sequence(torch_like, seq, data) -> list:
    """train.py's __main__ for one step (LBFGS's first iterations; max_iter 4 for the suite's time)."""
    input = torch_like.from_numpy(data[3:, :-1])
    target = torch_like.from_numpy(data[3:, 1:])
    test_input = torch_like.from_numpy(data[:3, :-1])
    test_target = torch_like.from_numpy(data[:3, 1:])
    seq.double()
    criterion = torch_like.nn.MSELoss()
    optimizer = torch_like.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
    losses = []

    def closure():
        optimizer.zero_grad()
        out = seq(input)
        loss = criterion(out, target)
        losses.append(loss.item())
        loss.backward()
        return loss
    optimizer.step(closure)
    with torch_like.no_grad():
        future = 10
        pred = seq(test_input, future=future)
        loss = criterion(pred[:, :-future], test_target)
        losses.append(loss.item())
    return losses


def test_time_sequence_prediction_trains_as_torch():
    """pytorch/examples' time_sequence_prediction/train.py, unchanged (its __main__ left out: it reads a pickle and
    plots), Sequence trained as its __main__ trains it: LSTMCells in float64, split(1, dim=1), LBFGS with a closure,
    then a prediction of the future under no_grad."""
    path = PROGRAMS / "examples" / "time_sequence_prediction_train.py"
    theirs, ours = _import(path, "time_sequence_torch", mocked=False), _import(path, "time_sequence_opforge", True)
    torch.manual_seed(0)
    want_seq, got_seq = theirs.Sequence(), ours.Sequence()
    _same_start(want_seq, got_seq)
    data = _sine_waves()
    _close(_train_sequence(of, got_seq, data), _train_sequence(torch, want_seq, data), rtol=1e-10)


# -- pytorch/examples' regression, the whole script --------------------------------------------------------------------


def test_regression_script_runs_whole_and_learns(tmp_path, monkeypatch):
    """regression/main.py as a script under the mock: it draws a polynomial, fits it with F.smooth_l1_loss and
    param.data.add_ until the loss is below 1e-3, and prints both polynomials (format() of 0-d tensors)."""
    monkeypatch.chdir(tmp_path)
    of.manual_seed(0)
    out = io.StringIO()
    with mock_torch.enable(), contextlib.redirect_stdout(out):
        runpy.run_path(str(PROGRAMS / "examples" / "regression_main.py"), run_name="__main__")
    text = out.getvalue()
    loss, batches = re.search(r"Loss: ([0-9.]+) after (\d+) batches", text).groups()
    assert float(loss) < 1e-3 and int(batches) > 1
    learned, actual = (np.array([float(v) for v in re.findall(r"[-+][0-9.]+", line.split("y = ")[1])])
                       for line in text.splitlines()[1:3])
    np.testing.assert_allclose(learned, actual, atol=0.5)


# -- minGPT ------------------------------------------------------------------------------------------------------------


def _import_mingpt(mocked: bool, monkeypatch) -> tuple:
    """minGPT's package (model, trainer), imported afresh: with torch, or with opforge as torch."""
    monkeypatch.syspath_prepend(str(PROGRAMS))
    for name in [k for k in sys.modules if k == "mingpt" or k.startswith("mingpt.")]:
        del sys.modules[name]
    with mock_torch.enable() if mocked else contextlib.nullcontext():
        modules = importlib.import_module("mingpt.model"), importlib.import_module("mingpt.trainer")
    for name in [k for k in sys.modules if k == "mingpt" or k.startswith("mingpt.")]:
        del sys.modules[name]
    return modules


def test_mingpt_trains_as_torch(monkeypatch):
    """karpathy/minGPT's package, unchanged: GPT from its CfgNode config, configure_optimizers from the Trainer's
    config, the Trainer's step (zero_grad(set_to_none=True), clip_grad_norm_, AdamW) on fixed batches, generate
    greedy and sampled with top_k=1; then Trainer.run itself, which draws batches through
    DataLoader(sampler=RandomSampler(replacement=True, num_samples=1e10)) imported from torch.utils.data.dataloader."""
    (want_model_mod, want_trainer), (got_model_mod, got_trainer) = (_import_mingpt(False, monkeypatch),
                                                                    _import_mingpt(True, monkeypatch))

    def config(module):
        c = module.GPT.get_default_config()
        c.model_type, c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.block_size = None, 2, 2, 16, 32, 16
        c.embd_pdrop = c.resid_pdrop = c.attn_pdrop = 0.0
        return c

    torch.manual_seed(0)
    want_model, got_model = want_model_mod.GPT(config(want_model_mod)), got_model_mod.GPT(config(got_model_mod))
    _same_start(want_model, got_model)

    def train(trainer, model, torch_like) -> list:
        train_config = trainer.Trainer.get_default_config()
        optimizer = model.configure_optimizers(train_config)
        losses = []
        for it in range(5):
            x, y = _gpt_batch(torch_like, it)
            _logits, loss = model(x, y)
            model.zero_grad(set_to_none=True)
            loss.backward()
            torch_like.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_norm_clip)
            optimizer.step()
            losses.append(loss.item())
        return losses

    _close(train(got_trainer, got_model, of), train(want_trainer, want_model, torch))
    want_model.eval()
    got_model.eval()
    for settings in ({"do_sample": False}, {"do_sample": True, "top_k": 1}):
        want = want_model.generate(torch.tensor(_CORPUS[:5]).view(1, -1), 6, **settings)
        assert got_model.generate(of.tensor(_CORPUS[:5]).view(1, -1), 6, **settings).tolist() == want.tolist()

    class Windows:  # a map-style dataset of (x, y) windows, as minGPT's projects write them
        def __len__(self):
            return 100

        def __getitem__(self, i):
            chunk = of.tensor(_CORPUS[i:i + 17])
            return chunk[:-1], chunk[1:]

    train_config = got_trainer.Trainer.get_default_config()
    train_config.max_iters, train_config.batch_size = 3, 4
    seen = []
    with mock_torch.enable():
        trainer = got_trainer.Trainer(train_config, got_model, Windows())
        trainer.set_callback("on_batch_end", lambda t: seen.append(t.loss.item()))
        trainer.run()
    assert trainer.iter_num == 3 and len(seen) == 3 and np.isfinite(seen).all()
