"""opforge.data: batching, seeded shuffling (a new permutation per epoch, reproducible), drop_last, errors."""

from __future__ import annotations

import numpy as np
import pytest

import opforge as of
from opforge.data import DataLoader, TensorDataset


def data(n=10):
    return np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n)


def epoch(loader):
    return [tuple(t.numpy() for t in batch) for batch in loader]


def test_batches_in_order_with_a_smaller_last_batch():
    x, y = data()
    loader = DataLoader(x, y, batch_size=4)
    batches = epoch(loader)
    assert len(loader) == len(batches) == 3
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(batches[1][0], x[4:8])
    for xb, yb in loader:
        assert isinstance(xb, of.Tensor) and isinstance(yb, of.Tensor)
        assert xb.dtype == np.float32 and yb.dtype == np.int64 and not xb.requires_grad


def test_drop_last():
    x, y = data()
    loader = DataLoader(x, y, batch_size=4, drop_last=True)
    assert len(loader) == 2
    assert [b[1].tolist() for b in epoch(loader)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(DataLoader(x, batch_size=5, drop_last=True)) == 2
    assert len(DataLoader(x, batch_size=11, drop_last=True)) == 0
    assert len(DataLoader(x, batch_size=11)) == 1


def test_shuffling_is_a_new_permutation_each_epoch_and_keeps_rows_together():
    x, y = data(50)
    loader = DataLoader(x, y, batch_size=8, shuffle=True, seed=0)
    orders = []
    for _ in range(3):
        batches = epoch(loader)
        order = np.concatenate([b[1] for b in batches])
        assert sorted(order.tolist()) == list(range(50))  # every sample once per epoch
        for xb, yb in batches:
            np.testing.assert_array_equal(xb, x[yb])  # x and y rows stay paired
        orders.append(order.tolist())
    assert orders[0] != orders[1] != orders[2] and orders[0] != list(range(50))


def test_the_same_seed_gives_the_same_epochs():
    x, y = data(30)

    def run(**kw):
        loader = DataLoader(x, y, batch_size=7, shuffle=True, **kw)
        return [[b[1].tolist() for b in epoch(loader)] for _ in range(3)]

    assert run(seed=5) == run(seed=5)
    assert run(seed=5) != run(seed=6)
    of.manual_seed(1)  # without a seed, opforge's generator seeds the loader
    first = run()
    of.manual_seed(1)
    assert run() == first


def test_a_loader_that_does_not_shuffle_leaves_opforges_generator_alone():
    of.manual_seed(2)
    expected = of.rand(3).numpy()
    of.manual_seed(2)
    DataLoader(*data(), batch_size=2)
    np.testing.assert_array_equal(of.rand(3).numpy(), expected)


def test_tensors_and_datasets_are_accepted_and_batches_are_copies():
    x, y = data()
    loader = DataLoader(of.tensor(x), of.tensor(y), batch_size=3)
    np.testing.assert_array_equal(epoch(loader)[0][0], x[:3])
    ds = TensorDataset(x, y)
    assert len(ds) == 10 and ds[2][1] == 2
    (xb, _), *_ = DataLoader(ds, batch_size=2)
    xb.numpy()[:] = -1
    assert x.min() == 0  # changing a batch does not change the data
    (only,) = next(iter(DataLoader(x, batch_size=2)))  # one array: 1-tuples
    assert only.shape == (2, 2)


def test_errors_name_the_arrays():
    x, y = data()
    with pytest.raises(of.ArgumentError, match=r"array 0 has 10 \(shape \(10, 2\)\), array 1 has 9 \(shape \(9,\)\)"):
        DataLoader(x, y[:9], batch_size=2)
    with pytest.raises(of.ArgumentError, match=r"TensorDataset.*same number of samples"):
        TensorDataset(x, y[:3])
    with pytest.raises(of.ArgumentError, match="argument 'array 1': dtype uint8 is not supported"):
        DataLoader(x, y.astype(np.uint8))
    with pytest.raises(of.ArgumentError, match="array 0 is 0-d"):
        DataLoader(np.float32(1.0))
    with pytest.raises(of.ArgumentError, match="at least one array"):
        DataLoader(batch_size=2)
    for bad in (0, 2.0, True):
        with pytest.raises(of.ArgumentError, match="batch_size must be an int >= 1"):
            DataLoader(x, batch_size=bad)


def test_a_sampler_gives_the_indices_as_torchs_dataloader_takes_them():
    """DataLoader(dataset, sampler=...): the sampler's indices in order, batched (drop_last too), as torch's; torch's
    SequentialSampler and a list of indices give torch's very batches; RandomSampler a permutation per pass, or with
    replacement num_samples draws made as they are read (minGPT asks for 1e10), from opforge's generator."""
    import torch

    from opforge.data import RandomSampler, SequentialSampler

    x = np.arange(10)
    ours, theirs = TensorDataset(x), torch.utils.data.TensorDataset(torch.tensor(x))
    for make_ours, make_theirs, settings in [
        (SequentialSampler(ours), torch.utils.data.SequentialSampler(theirs), {"batch_size": 4}),
        ([9, 1, 2, 2, 7], [9, 1, 2, 2, 7], {"batch_size": 2, "drop_last": True}),
    ]:
        got = [b[0].tolist() for b in DataLoader(ours, sampler=make_ours, **settings)]
        want = [b[0].tolist() for b in torch.utils.data.DataLoader(theirs, sampler=make_theirs, **settings)]
        assert got == want
    assert len(DataLoader(ours, 4, False, [1, 2, 3])) == 1  # torch's positions: batch_size, shuffle, sampler
    of.manual_seed(0)
    passes = [[b[0].tolist() for b in DataLoader(ours, batch_size=10, sampler=RandomSampler(ours))] for _ in range(2)]
    assert sorted(passes[0][0]) == sorted(passes[1][0]) == list(range(10)) and passes[0] != passes[1]
    loader = DataLoader(ours, batch_size=8, sampler=RandomSampler(ours, replacement=True, num_samples=int(1e10)))
    assert len(loader) == 1250000000
    batches = iter(loader)
    draws = np.concatenate([next(batches)[0].numpy() for _ in range(50)])
    assert draws.min() >= 0 and draws.max() <= 9 and len(set(draws.tolist())) == 10
    of.manual_seed(3)
    first = [b[0].tolist() for b in DataLoader(ours, batch_size=3, sampler=RandomSampler(ours, num_samples=13))]
    of.manual_seed(3)
    assert [b[0].tolist() for b in DataLoader(ours, batch_size=3, sampler=RandomSampler(ours, num_samples=13))] == first
    assert sum(len(b) for b in first) == 13
    with pytest.raises(of.ArgumentError, match=r"DataLoader\(\): sampler= and shuffle=True exclude each other"):
        DataLoader(ours, shuffle=True, sampler=[0])
    with pytest.raises(of.ArgumentError, match=r"RandomSampler\(\): num_samples must be a positive int"):
        RandomSampler(ours, num_samples=0)


def test_module_zero_grad_takes_set_to_none():
    layer = of.nn.Linear(3, 2)
    layer(of.ones(1, 3)).sum().backward()
    grad = layer.weight.grad
    layer.zero_grad(set_to_none=False)  # zeros written into the gradient (torch's older default)
    assert layer.weight.grad is grad and not grad.numpy().any()
    layer.zero_grad()
    assert layer.weight.grad is None
