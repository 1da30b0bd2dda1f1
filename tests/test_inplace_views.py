"""In-place writes through views while autograd records, against PyTorch: a recorded write gives a tensor a new
value with history (its old memory stays for whatever saved it), and its base and every view of that base take the
value too, as torch's views see their base's writes (``opforge.tensor.note_view``). Each case was silently
different before: the base kept its old values and its gradient missed the written value."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opforge as of
from opforge import ops as F


def _pair(array, requires_grad=False):
    return (of.tensor(np.array(array, dtype=np.float64), requires_grad=requires_grad),
            torch.tensor(np.array(array, dtype=np.float64), requires_grad=requires_grad))


def _same(ours, theirs):
    np.testing.assert_allclose(np.asarray(ours.detach().numpy()), theirs.detach().numpy(), rtol=1e-12, atol=1e-12)


A = np.arange(12.0).reshape(3, 4) - 5.0
W = np.array([0.5, -1.5, 2.0, 3.0])


def _reshape(lib, x, shape):
    return F.reshape(x, shape) if lib is of else x.view(*shape)


CASES = {
    # name: fn(lib, base, w) -> tensors to compare (values and, through the loss, gradients)
    "write through a row": lambda lib, b, w: (b[1].add_(w * 3), b),
    "write through a column (strided)": lambda lib, b, w: (b[:, 2].mul_(w[:3]), b),
    "write through a transposed view": lambda lib, b, w: (b.T[1:3].sub_(w[:3] * w[:3]), b),
    "write through a view of a view": lambda lib, b, w: (b[1:][0][1:3].add_(w[1:3]), b),
    "a sibling view sees the write": lambda lib, b, w: (lambda u, v: (v.add_(w * 2), u, b))(
        _reshape(lib, b, [12]), b[2]),
    "the base's write reaches its views": lambda lib, b, w: (lambda v, u: (b.mul_(w), v, u, b))(
        b[0], _reshape(lib, b, [2, 6])),
    "item assignment into a view": lambda lib, b, w: (lambda v: (v.__setitem__(slice(1, 3), w[:2] * 5), v, b))(b[1]),
    "item assignment into the base reaches a view": lambda lib, b, w: (lambda v: (b.__setitem__(
        (slice(None), 0), w[:3]), v, b))(b[:, :2]),
    "two writes through two views": lambda lib, b, w: (b[0].add_(w), b[:, 1].mul_(w[:3]), b),
    # torch refuses in-place writes to the pieces of a multi-view op (split, chunk, unbind) under autograd; opforge
    # writes them as any view: the same as torch's narrow
    "a split piece": lambda lib, b, w: ((b.split(2, 1)[1] if lib is of else b.narrow(1, 2, 2)).add_(w[:2]), b),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_recorded_write_through_a_view_is_torchs(case):
    values = {}
    for lib in (of, torch):
        a = (of.tensor if lib is of else torch.tensor)(A.copy(), requires_grad=True)
        w = (of.tensor if lib is of else torch.tensor)(W.copy(), requires_grad=True)
        b = a * 1.0
        outs = [o for o in CASES[case](lib, b, w) if o is not None]
        loss = sum(((o * o).sum() * (k + 1)) for k, o in enumerate(outs))
        loss.backward()
        values[lib] = [*outs, a.grad, w.grad]
    for ours, theirs in zip(values[of], values[torch]):
        _same(ours, theirs)


def test_a_write_of_a_recorded_value_into_a_plain_buffer_gives_the_buffer_its_history():
    # buf does not require grad; writing w's value through its view makes it depend on w, as in torch
    grads = []
    for lib in (of, torch):
        buf, w = (lib.zeros((2, 3), dtype=lib.float64),
                  (of.tensor if lib is of else torch.tensor)(np.array([1.0, 2.0, 3.0]), requires_grad=True))
        buf[1].copy_(w * w)
        assert buf.requires_grad
        (buf.sum() * 2).backward()
        grads.append((buf, w.grad))
    _same(grads[0][0], grads[1][0])
    _same(grads[0][1], grads[1][1])


def test_detach_shares_memory_with_the_recorded_value_it_was_cut_from():
    for lib in (of, torch):
        a = (of.tensor if lib is of else torch.tensor)(A.copy(), requires_grad=True)
        b = a * 2.0
        d = b.detach()
        b.add_(a)
        np.testing.assert_allclose(np.asarray(d.numpy()), 3 * A)
        assert not d.requires_grad


def test_a_view_of_a_leaf_that_requires_grad_is_refused_as_in_torch():
    a = of.tensor(A.copy(), requires_grad=True)
    with pytest.raises(of.GradientError, match="view of a leaf tensor that requires grad"):
        a[0].add_(of.tensor(W, requires_grad=True))
    with pytest.raises(RuntimeError, match="view of a leaf Variable that requires grad"):
        torch.tensor(A.copy(), requires_grad=True)[0].add_(torch.tensor(W))
    with of.no_grad():  # as optimizers write: memory, seen by the leaf
        a[0].add_(1.0)
    np.testing.assert_allclose(a.numpy()[0], A[0] + 1)


def test_compiled_code_writes_through_views_as_eager_code_does():
    def step(a, w):
        b = a * 1.0
        v = b[1]
        v.add_(w * 3)
        return (b * b).sum()

    a, w = of.tensor(A.copy()), of.tensor(W.copy())
    eager = step(a, w)
    np.testing.assert_allclose(of.compile(step)(a, w).numpy(), eager.numpy())
    t = torch.tensor(A.copy())
    tb = t * 1.0
    tb[1].add_(torch.tensor(W) * 3)
    np.testing.assert_allclose(eager.numpy(), (tb * tb).sum().numpy())
