"""Training end to end: eager and compiled steps agree, PyTorch agrees, checkpoints resume exactly."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import opforge as of
from opforge import nn
from opforge import ops as F

DIGITS = load_digits()
X = (DIGITS.images / 16.0)[:256]
Y = DIGITS.target[:256].astype(np.int64)


def cnn(dtype="float64"):
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 2 * 2, 10, dtype=dtype),
    )


def mlp(dtype="float64"):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32, dtype=dtype), nn.Tanh(), nn.Linear(32, 10, dtype=dtype))


def torch_twin(model, kind):
    if kind == "cnn":
        twin = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(64, 10))
    else:
        twin = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.Tanh(),
                                   torch.nn.Linear(32, 10))
    twin = twin.double()
    twin.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
    return twin


def batches(n=8, size=32):
    for i in range(n):
        yield X[i * size:(i + 1) * size, None], Y[i * size:(i + 1) * size]


def make(kind, optimizer):
    of.manual_seed(0)
    model = cnn() if kind == "cnn" else mlp()
    if optimizer == "sgd":
        opt = of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    else:
        opt = of.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return model, opt, step


@pytest.mark.parametrize("kind, optimizer", [("mlp", "sgd"), ("cnn", "adam")])
def test_eager_and_compiled_training_give_the_same_numbers(kind, optimizer):
    model_e, _, step_e = make(kind, optimizer)
    model_c, _, step_c = make(kind, optimizer)
    compiled = of.compile(step_c)
    eager_losses, compiled_losses = [], []
    for x, y in batches():
        eager_losses.append(step_e(of.tensor(x), of.tensor(y)).item())
        compiled_losses.append(compiled(of.tensor(x), of.tensor(y)).item())
    assert eager_losses[-1] < eager_losses[0]
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-10)
    for (name, a), (_, b) in zip(model_e.state_dict().items(), model_c.state_dict().items()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("kind, optimizer", [("mlp", "sgd"), ("cnn", "adam")])
def test_pytorch_with_the_same_start_gives_the_same_loss_curve(kind, optimizer):
    model, _, step = make(kind, optimizer)
    twin = torch_twin(model, kind)
    if optimizer == "sgd":
        topt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    else:
        topt = torch.optim.Adam(twin.parameters(), lr=3e-3, weight_decay=1e-4)
    compiled = of.compile(step)
    ours, theirs = [], []
    for x, y in batches():
        ours.append(compiled(of.tensor(x), of.tensor(y)).item())
        loss = torch.nn.functional.cross_entropy(twin(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        topt.step()
        topt.zero_grad()
        theirs.append(loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)


def test_a_checkpoint_resumes_training_exactly(tmp_path):
    model, opt, step = make("cnn", "adam")
    data = list(batches())
    for x, y in data[:4]:
        step(of.tensor(x), of.tensor(y))
    of.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt")
    continued = [step(of.tensor(x), of.tensor(y)).item() for x, y in data[4:]]

    model2, opt2, step2 = make("cnn", "adam")
    state = of.load(tmp_path / "ckpt")
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optimizer"])
    resumed = [step2(of.tensor(x), of.tensor(y)).item() for x, y in data[4:]]
    np.testing.assert_allclose(resumed, continued, rtol=1e-12)
