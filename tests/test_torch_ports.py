"""PyTorch programs run through ``opforge.mock_torch`` with no edits (issue 27, "Must hold").

Each program below is written as PyTorch's public programs write these things — the tutorials' quickstart (a
Flatten/Linear/ReLU classifier trained with SGD through a DataLoader, saved and loaded), the text classification
tutorial (EmbeddingBag over a flat batch with offsets, clip_grad_norm_, StepLR), a minGPT/nanoGPT-style GPT (causal
self-attention with a registered tril mask, weight decay groups, AdamW, greedy generation) and d2l's chapters
(linear and softmax regression from scratch) — in the same idioms, but with data made here (nothing can be
downloaded: sklearn's digits stand in for FashionMNIST, a made-up corpus for AG_NEWS), no shuffling and no dropout
where step-by-step equality needs the same order and no randomness.

Each program is plain PyTorch source, split into cells by ``# %%`` lines. The harness runs every cell twice: with the
real torch, and with ``import torch`` giving opforge (``mock_torch.enable()``). After a cell it copies what torch
drew at random (initial weights, random data) into the opforge run, so that both runs start from the same state;
then the losses the programs print must agree step by step.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import opforge as of
from opforge import mock_torch


def _cells(source: str) -> list[str]:
    return [textwrap.dedent(c) for c in re.split(r"^# %%.*$", textwrap.dedent(source), flags=re.M) if c.strip()]


def _sync(theirs: dict, ours: dict, names) -> None:
    """Give the opforge run what torch drew at random: tensors by value, modules by state dict."""
    for name in names:
        value = theirs[name]
        if isinstance(value, torch.nn.Module):
            ours[name].load_state_dict({k: of.tensor(v.detach().numpy()) for k, v in value.state_dict().items()})
        else:
            ours[name] = of.tensor(value.detach().numpy(), requires_grad=value.requires_grad)


def run_both(source: str, sync: dict, tmp_path, monkeypatch) -> tuple[str, str]:
    """The program's output with torch and with opforge through the mock; ``sync`` maps a cell's number to the
    names to copy after it."""
    monkeypatch.chdir(tmp_path)
    outputs = []
    theirs, ours = {"__name__": "__main__"}, {"__name__": "__main__"}
    out_theirs, out_ours = io.StringIO(), io.StringIO()
    for i, cell in enumerate(_cells(source)):
        code = compile(cell, f"<cell {i}>", "exec")
        with contextlib.redirect_stdout(out_theirs):
            exec(code, theirs)
        with mock_torch.enable(), contextlib.redirect_stdout(out_ours):
            exec(code, ours)
        _sync(theirs, ours, sync.get(i, ()))
    outputs = out_theirs.getvalue(), out_ours.getvalue()
    assert ours["torch"] is not torch and ours["torch"].Tensor is of.Tensor  # the program ran on opforge
    return outputs


def _numbers(text: str, label: str) -> list[float]:
    return [float(v) for v in re.findall(rf"{label}\s*[:=]?\s*(-?[0-9.]+(?:e-?\d+)?)", text)]


def assert_same_losses(theirs: str, ours: str, label: str = "loss", rtol: float = 2e-6) -> None:
    want, got = _numbers(theirs, label), _numbers(ours, label)
    assert want and len(got) == len(want), (theirs, ours)
    np.testing.assert_allclose(got, want, rtol=rtol)


# -- the tutorials' quickstart -----------------------------------------------------------------------------------------

QUICKSTART = '''
# %% data: sklearn's digits, made 28x28, stand in for torchvision's FashionMNIST
import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset


class DigitImages(Dataset):
    def __init__(self, train):
        digits = load_digits()
        images = np.pad(np.kron(digits.images / 16.0, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
        keep = slice(0, 1400) if train else slice(1400, None)
        self.images, self.labels = images[keep].astype(np.float32), digits.target[keep]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        return torch.from_numpy(self.images[idx][None]), int(self.labels[idx])


training_data, test_data = DigitImages(train=True), DigitImages(train=False)

# %% the model
batch_size = 64

train_dataloader = DataLoader(training_data, batch_size=batch_size)
test_dataloader = DataLoader(test_data, batch_size=batch_size)

for X, y in test_dataloader:
    print(f"Shape of X [N, C, H, W]: {tuple(X.shape)}")
    print(f"Shape of y: {tuple(y.shape)} {str(y.dtype).replace('torch.', '')}")
    break

device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
print(f"Using {device} device")


class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28*28, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10)
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits


model = NeuralNetwork().to(device)

# %% training
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)


def train(dataloader, model, loss_fn, optimizer):
    size = len(dataloader.dataset)
    model.train()
    for batch, (X, y) in enumerate(dataloader):
        X, y = X.to(device), y.to(device)

        pred = model(X)
        loss = loss_fn(pred, y)

        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

        if batch % 5 == 0:
            loss, current = loss.item(), (batch + 1) * len(X)
            print(f"loss: {loss:>.9f}  [{current:>5d}/{size:>5d}]")


def test(dataloader, model, loss_fn):
    size = len(dataloader.dataset)
    num_batches = len(dataloader)
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for X, y in dataloader:
            X, y = X.to(device), y.to(device)
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    test_loss /= num_batches
    correct /= size
    print(f"Test Error: \\n Accuracy: {(100*correct):>0.1f}%, Avg loss: {test_loss:>.9f} \\n")


epochs = 3
for t in range(epochs):
    print(f"Epoch {t+1}\\n-------------------------------")
    train(train_dataloader, model, loss_fn, optimizer)
    test(test_dataloader, model, loss_fn)
print("Done!")

torch.save(model.state_dict(), "model.pth")
model = NeuralNetwork().to(device)
model.load_state_dict(torch.load("model.pth", weights_only=True))

classes = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
model.eval()
x, y = test_data[0][0], test_data[0][1]
with torch.no_grad():
    x = x.to(device)
    pred = model(x)
    predicted, actual = classes[pred[0].argmax(0)], classes[y]
    print(f'Predicted: "{predicted}", Actual: "{actual}"')
'''


def test_the_quickstart_runs_unchanged_and_trains_as_torch(tmp_path, monkeypatch):
    torch.manual_seed(0)  # the program draws its initial weights unseeded: 3 epochs end anywhere in 40-75% accuracy
    theirs, ours = run_both(QUICKSTART, {1: ["model"]}, tmp_path, monkeypatch)
    assert_same_losses(theirs, ours, "loss")
    assert_same_losses(theirs, ours, "Avg loss")
    for line in ("Shape of X [N, C, H, W]: (64, 1, 28, 28)", "Shape of y: (64,) int64", "Using cpu device",
                 "Accuracy:", "Predicted:"):
        assert line in theirs and line in ours, line
    assert _numbers(ours, "Accuracy") == _numbers(theirs, "Accuracy")
    losses = _numbers(ours, "Avg loss")
    assert losses[-1] < losses[0]  # it learned
    assert re.findall(r"Predicted.*", ours) == re.findall(r"Predicted.*", theirs)


# -- text classification with EmbeddingBag ------------------------------------------------------------------------

TEXT_CLASSIFICATION = '''
# %% a made-up corpus stands in for AG_NEWS; a tokenizer and a vocabulary as torchtext's
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

topics = [["match", "team", "goal", "season"], ["market", "shares", "bank", "profit"],
          ["chip", "software", "phone", "data"], ["election", "minister", "vote", "law"]]
filler = ["the", "a", "of", "in", "new", "after", "says", "report"]
rng = np.random.default_rng(0)
train_iter = [(int(c) + 1, " ".join(rng.choice(topics[c] * 2 + filler, size=rng.integers(4, 12))))
              for c in rng.integers(0, 4, size=640)]


def tokenizer(line):
    return line.lower().split()


class Vocab:
    def __init__(self, texts, specials=("<unk>",)):
        self.itos = list(specials) + sorted({w for t in texts for w in tokenizer(t)})
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def __call__(self, tokens):
        return [self.stoi.get(t, 0) for t in tokens]

    def __len__(self):
        return len(self.itos)


vocab = Vocab([text for _, text in train_iter])
text_pipeline = lambda x: vocab(tokenizer(x))
label_pipeline = lambda x: int(x) - 1

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def collate_batch(batch):
    label_list, text_list, offsets = [], [], [0]
    for _label, _text in batch:
        label_list.append(label_pipeline(_label))
        processed_text = torch.tensor(text_pipeline(_text), dtype=torch.int64)
        text_list.append(processed_text)
        offsets.append(processed_text.size(0))
    label_list = torch.tensor(label_list, dtype=torch.int64)
    offsets = torch.tensor(offsets[:-1]).cumsum(dim=0)
    text_list = torch.cat(text_list)
    return label_list.to(device), text_list.to(device), offsets.to(device)


class TextClassificationModel(nn.Module):
    def __init__(self, vocab_size, embed_dim, num_class):
        super(TextClassificationModel, self).__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, sparse=False)
        self.fc = nn.Linear(embed_dim, num_class)
        self.init_weights()

    def init_weights(self):
        initrange = 0.5
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.fc.weight.data.uniform_(-initrange, initrange)
        self.fc.bias.data.zero_()

    def forward(self, text, offsets):
        embedded = self.embedding(text, offsets)
        return self.fc(embedded)


num_class = len(set([label for (label, text) in train_iter]))
vocab_size = len(vocab)
emsize = 16
model = TextClassificationModel(vocab_size, emsize, num_class).to(device)

# %% training
def train(dataloader):
    model.train()
    total_acc, total_count = 0, 0
    log_interval = 5
    start_time = time.time()

    for idx, (label, text, offsets) in enumerate(dataloader):
        optimizer.zero_grad()
        predicted_label = model(text, offsets)
        loss = criterion(predicted_label, label)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        total_acc += (predicted_label.argmax(1) == label).sum().item()
        total_count += label.size(0)
        print(f"loss {loss.item():.9f}")
        if idx % log_interval == 0 and idx > 0:
            elapsed = time.time() - start_time
            print("| epoch {:3d} | {:5d}/{:5d} batches | accuracy {:8.3f}".format(
                epoch, idx, len(dataloader), total_acc / total_count))
            total_acc, total_count = 0, 0
            start_time = time.time()


def evaluate(dataloader):
    model.eval()
    total_acc, total_count = 0, 0

    with torch.no_grad():
        for idx, (label, text, offsets) in enumerate(dataloader):
            predicted_label = model(text, offsets)
            loss = criterion(predicted_label, label)
            total_acc += (predicted_label.argmax(1) == label).sum().item()
            total_count += label.size(0)
    return total_acc / total_count


EPOCHS = 4
LR = 5
BATCH_SIZE = 64

total_accu = None
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=LR)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.1)
train_dataloader = DataLoader(train_iter[:512], batch_size=BATCH_SIZE, shuffle=False, collate_fn=collate_batch)
valid_dataloader = DataLoader(train_iter[512:], batch_size=BATCH_SIZE, shuffle=False, collate_fn=collate_batch)

for epoch in range(1, EPOCHS + 1):
    epoch_start_time = time.time()
    train(train_dataloader)
    accu_val = evaluate(valid_dataloader)
    if total_accu is not None and total_accu > accu_val:
        scheduler.step()
    else:
        total_accu = accu_val
    print("| end of epoch {:3d} | valid accuracy {:8.3f} ".format(epoch, accu_val))
'''


def test_text_classification_with_embedding_bag_runs_unchanged_and_trains_as_torch(tmp_path, monkeypatch):
    theirs, ours = run_both(TEXT_CLASSIFICATION, {0: ["model"]}, tmp_path, monkeypatch)
    assert_same_losses(theirs, ours, "loss")
    assert _numbers(ours, "valid accuracy") == _numbers(theirs, "valid accuracy")
    assert _numbers(ours, "valid accuracy")[-1] > 0.9


# -- a GPT as minGPT and nanoGPT write it ----------------------------------------------------------------------------

GPT = '''
# %% the model
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class LayerNorm(nn.Module):
    """ LayerNorm with an optional bias """

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                                    .view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return y


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = NewGELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 16
    dropout: float = 0.0
    bias: bool = True


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        print("number of parameters: %.2fM" % (self.get_num_params() / 1e6,))

    def get_num_params(self, non_embedding=True):
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}"
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        param_dict = {pn: p for pn, p in self.named_parameters()}
        param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {'params': decay_params, 'weight_decay': weight_decay},
            {'params': nodecay_params, 'weight_decay': 0.0}
        ]
        num_decay_params = sum(p.numel() for p in decay_params)
        num_nodecay_params = sum(p.numel() for p in nodecay_params)
        print(f"num decayed parameter tensors: {len(decay_params)}, with {num_decay_params:,} parameters")
        print(f"num non-decayed parameter tensors: {len(nodecay_params)}, with {num_nodecay_params:,} parameters")
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('Inf')
            probs = F.softmax(logits, dim=-1)
            _, idx_next = torch.topk(probs, k=1, dim=-1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


torch.manual_seed(1337)
model = GPT(GPTConfig())

# %% data: a repeating pattern the model can learn
import numpy as np

data = torch.tensor(np.tile(np.arange(32) * 7 % 32, 40), dtype=torch.long)


def get_batch(i, batch_size=8, block_size=16):
    ix = torch.arange(batch_size) * 37 + i * 11
    x = torch.stack([data[j:j + block_size] for j in ix.tolist()])
    y = torch.stack([data[j + 1:j + 1 + block_size] for j in ix.tolist()])
    return x, y


optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95))
model.train()
for it in range(25):
    X, Y = get_batch(it)
    logits, loss = model(X, Y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    print(f"iter {it}: loss {loss.item():.9f}")

model.eval()
start = data[:5].view(1, -1)
print("generated:", model.generate(start, 10, top_k=5)[0].tolist())
'''


def test_a_gpt_written_as_mingpt_and_nanogpt_write_it_trains_as_torch(tmp_path, monkeypatch):
    theirs, ours = run_both(GPT, {0: ["model"]}, tmp_path, monkeypatch)
    assert_same_losses(theirs, ours, "loss")
    for label in ("number of parameters", "num decayed parameter tensors", "num non-decayed parameter tensors"):
        assert _numbers(ours, label) == _numbers(theirs, label), label
    assert re.findall(r"generated.*", ours) == re.findall(r"generated.*", theirs)


# -- d2l's chapters: linear and softmax regression from scratch ------------------------------------------------------

D2L_LINEAR = '''
# %% synthetic data and the parameters (torch draws them; the harness gives opforge the same)
import random

import torch


def synthetic_data(w, b, num_examples):
    """Generate y = Xw + b + noise."""
    X = torch.normal(0, 1, (num_examples, len(w)))
    y = torch.matmul(X, w) + b
    y += torch.normal(0, 0.01, y.shape)
    return X, y.reshape((-1, 1))


true_w = torch.tensor([2, -3.4])
true_b = 4.2
features, labels = synthetic_data(true_w, true_b, 1000)
w = torch.normal(0, 0.01, size=(2, 1), requires_grad=True)
b = torch.zeros(1, requires_grad=True)

# %% training
def data_iter(batch_size, features, labels):
    num_examples = len(features)
    indices = list(range(num_examples))
    random.shuffle(indices)
    for i in range(0, num_examples, batch_size):
        batch_indices = torch.tensor(indices[i: min(i + batch_size, num_examples)])
        yield features[batch_indices], labels[batch_indices]


def linreg(X, w, b):
    """The linear regression model."""
    return torch.matmul(X, w) + b


def squared_loss(y_hat, y):
    """Squared loss."""
    return (y_hat - y.reshape(y_hat.shape)) ** 2 / 2


def sgd(params, lr, batch_size):
    """Minibatch stochastic gradient descent."""
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


random.seed(0)
lr, num_epochs, batch_size = 0.03, 3, 10
net, loss = linreg, squared_loss
for epoch in range(num_epochs):
    for X, y in data_iter(batch_size, features, labels):
        l = loss(net(X, w, b), y)
        l.sum().backward()
        sgd([w, b], lr, batch_size)
    with torch.no_grad():
        train_l = loss(net(features, w, b), labels)
        print(f'epoch {epoch + 1}, loss {float(train_l.mean()):.9f}')
print(f'error in estimating w: {(true_w - w.reshape(true_w.shape)).abs().max().item():.6f}')
print(f'error in estimating b: {abs(true_b - b.item()):.6f}')
'''

D2L_SOFTMAX = '''
# %% data (sklearn's digits stand in for Fashion-MNIST) and the parameters
import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.utils import data

digits = load_digits()
images = torch.tensor(digits.images[:1200] / 16.0, dtype=torch.float32)
targets = torch.tensor(digits.target[:1200])
train_iter = data.DataLoader(data.TensorDataset(images, targets), 100, shuffle=False)

num_inputs, num_outputs = 64, 10
W = torch.normal(0, 0.01, size=(num_inputs, num_outputs), requires_grad=True)
b = torch.zeros(num_outputs, requires_grad=True)

# %% training
def softmax(X):
    X_exp = torch.exp(X)
    partition = X_exp.sum(1, keepdim=True)
    return X_exp / partition


def net(X):
    return softmax(torch.matmul(X.reshape((-1, W.shape[0])), W) + b)


def cross_entropy(y_hat, y):
    return - torch.log(y_hat[range(len(y_hat)), y])


def accuracy(y_hat, y):
    """Compute the number of correct predictions."""
    if len(y_hat.shape) > 1 and y_hat.shape[1] > 1:
        y_hat = y_hat.argmax(axis=1)
    cmp = y_hat.type(y.dtype) == y
    return float(cmp.type(y.dtype).sum())


def updater(batch_size, lr=0.1):
    with torch.no_grad():
        for param in [W, b]:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


for epoch in range(3):
    total_loss, total_correct, count = 0.0, 0.0, 0
    for X, y in train_iter:
        y_hat = net(X)
        l = cross_entropy(y_hat, y)
        l.sum().backward()
        updater(X.shape[0])
        total_loss += float(l.sum())
        total_correct += accuracy(y_hat, y)
        count += y.numel()
    print(f"epoch {epoch + 1}, loss {total_loss / count:.9f}, train acc {total_correct / count:.6f}")
'''


@pytest.mark.parametrize("program, sync", [(D2L_LINEAR, {0: ["features", "labels", "w", "b"]}),
                                           (D2L_SOFTMAX, {0: ["W", "b"]})], ids=["linear", "softmax"])
def test_d2l_chapters_run_unchanged_and_train_as_torch(program, sync, tmp_path, monkeypatch):
    theirs, ours = run_both(program, sync, tmp_path, monkeypatch)
    assert_same_losses(theirs, ours, "loss")
    for label in ("train acc", "error in estimating w", "error in estimating b"):
        np.testing.assert_allclose(_numbers(ours, label), _numbers(theirs, label), atol=2e-6)


# -- the mock itself ------------------------------------------------------------------------------------------------

def test_the_mock_resolves_torch_and_puts_the_real_one_back():
    real = sys.modules["torch"]
    with mock_torch.enable():
        import torch as mocked
        import torch.nn.functional as F
        import torch.optim.lr_scheduler as sched
        from torch.utils.data import DataLoader

        assert mocked is not real and mocked.nn.functional is F and F.softmax is of.ops.softmax
        assert DataLoader is of.data.DataLoader and sched.StepLR is of.optim.StepLR
        assert mocked.Tensor is of.Tensor and mocked.nn.Linear is of.nn.Linear and mocked.optim.Adam is of.optim.Adam
        assert not mocked.cuda.is_available() and not mocked.backends.mps.is_available()
        with pytest.raises(AttributeError, match=r"module 'torch' has no attribute 'histc': "
                                                 r"opforge.mock_torch: torch.histc is PyTorch's"):
            mocked.histc
        with pytest.raises(AttributeError, match=r"torch.nn.AdaptiveLogSoftmaxWithLoss is PyTorch's, and opforge does "
                                                 r"not have it"):
            mocked.nn.AdaptiveLogSoftmaxWithLoss
        # torch.trace sums a diagonal (F.trace), never of.trace, which traces programs
        assert mocked.trace is of.ops.trace and mocked.trace(mocked.tensor([[1.0, 2.0], [3.0, 4.0]])).item() == 5.0
        with pytest.raises(AttributeError, match=r"has no attribute 'Program'"):
            mocked.Program  # opforge's own names are not torch's
        with pytest.raises(ModuleNotFoundError, match=r"No module named 'torch.distributed': opforge.mock_torch "
                                                      r"has no counterpart"):
            importlib.import_module("torch.distributed")
    assert sys.modules["torch"] is real and sys.modules["torch.nn.functional"] is torch.nn.functional


def test_lazy_names_fail_when_used():
    with mock_torch.enable(lazy=True):
        from torch.nn import AdaptiveLogSoftmaxWithLoss  # read, never used: the program goes on

        with pytest.raises(AttributeError, match=r"torch.nn.AdaptiveLogSoftmaxWithLoss is PyTorch's, and opforge does "
                                                 r"not have it"):
            AdaptiveLogSoftmaxWithLoss()


def test_python_m_opforge_mock_torch_runs_a_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import sys
        import torch
        from torch import nn

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        x = torch.randn(64, 3)
        y = x.sum(dim=1, keepdim=True)
        for step in range(100):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(sys.argv[1:], type(torch.ones(1)).__module__, round(loss.item(), 2) < 0.1)
    '''))
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(of.__file__))}  # this checkout's opforge
    done = subprocess.run([sys.executable, "-m", "opforge.mock_torch", str(script), "--epochs", "1"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['--epochs', '1'] opforge.tensor True"
