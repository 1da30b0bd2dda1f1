"""Sparse COO matrices against torch.sparse: of.sparse_coo_tensor (size inference, duplicates, coalesce, to_dense,
t), of.sparse.mm forward and gradients (dense operand, sparse values, .grad), a two-layer GCN trained eagerly,
compiled and in torch, and the clear errors for what is not supported."""

import numpy as np
import pytest
import torch

import opforge as of
from opforge import nn
from opforge import ops as F

pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")  # torch's

INDICES = np.array([[0, 2, 1, 2, 0, 4], [1, 0, 3, 0, 1, 2]])  # (2, 0) and (0, 1) twice; row 3 empty
VALUES = np.array([1.0, 2.0, -3.0, 4.0, 0.5, 1.5])


def _pair(dtype=np.float64, requires_grad=False, size=(5, 4)):
    ours = of.sparse_coo_tensor(INDICES, VALUES.astype(dtype), size, requires_grad=requires_grad)
    theirs = torch.sparse_coo_tensor(torch.tensor(INDICES), torch.tensor(VALUES.astype(dtype)), size,
                                     requires_grad=requires_grad)
    return ours, theirs


def test_construction_to_dense_and_coalesce_match_torch():
    ours, theirs = _pair()
    assert ours.shape == tuple(theirs.shape) and ours.is_sparse and not ours.is_coalesced()
    np.testing.assert_array_equal(ours.to_dense().numpy(), theirs.to_dense().numpy())
    c, tc = ours.coalesce(), theirs.coalesce()
    assert c.is_coalesced() and c._nnz() == tc._nnz() == 4
    np.testing.assert_array_equal(ours._indices().numpy(), theirs._indices().numpy())  # as stored, repeats too
    np.testing.assert_array_equal(ours._values().numpy(), theirs._values().numpy())
    np.testing.assert_array_equal(c.indices().numpy(), tc.indices().numpy())
    np.testing.assert_array_equal(c.values().numpy(), tc.values().numpy())
    inferred = of.sparse_coo_tensor(INDICES, VALUES)  # the size that holds every index, float32 as torch's default
    assert inferred.shape == tuple(torch.sparse_coo_tensor(torch.tensor(INDICES), torch.tensor(VALUES)).shape)
    np.testing.assert_array_equal(ours.t().to_dense().numpy(), theirs.t().to_dense().numpy())
    assert of.sparse_coo_tensor(INDICES, [1, 2, 3, 4, 5, 6]).dtype == np.float32  # ints become the default float
    three = of.sparse_coo_tensor([[0, 1], [2, 0], [1, 1]], [1.0, 2.0], (2, 3, 2))
    np.testing.assert_array_equal(three.to_dense().numpy(), torch.sparse_coo_tensor(
        [[0, 1], [2, 0], [1, 1]], [1.0, 2.0], (2, 3, 2)).to_dense().numpy())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mm_forward_and_gradients_match_torch(dtype):
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(dtype)
    values = of.tensor(VALUES.astype(dtype), requires_grad=True)
    tvalues = torch.tensor(VALUES.astype(dtype), requires_grad=True)
    a = of.sparse_coo_tensor(INDICES, values, (5, 4))
    ta = torch.sparse_coo_tensor(torch.tensor(INDICES), tvalues, (5, 4))
    dense, tdense = of.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, ty = of.sparse.mm(a, dense), torch.sparse.mm(ta, tdense)
    tol = {"rtol": 1e-13} if dtype == np.float64 else {"rtol": 1e-5, "atol": 1e-6}
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **tol)
    assert y.dtype == dtype
    (F.tanh(y) * 3).sum().backward()
    (torch.tanh(ty) * 3).sum().backward()
    np.testing.assert_allclose(dense.grad.numpy(), tdense.grad.numpy(), **tol)
    np.testing.assert_allclose(values.grad.numpy(), tvalues.grad.numpy(), **tol)  # per entry, duplicates too
    np.testing.assert_allclose((a @ dense).numpy(), y.numpy())


def test_the_gradient_of_a_sparse_leaf_is_torchs_sparse_grad():
    ours, theirs = _pair(requires_grad=True)
    x = np.random.default_rng(1).standard_normal((4, 2))
    (of.sparse.mm(ours, of.tensor(x)) ** 2).sum().backward()
    (torch.sparse.mm(theirs, torch.tensor(x)) ** 2).sum().backward()
    g, tg = ours.grad, theirs.grad.coalesce()
    assert g.is_coalesced()
    np.testing.assert_array_equal(g.indices().numpy(), tg.indices().numpy())
    np.testing.assert_allclose(g.values().numpy(), tg.values().numpy(), rtol=1e-13)


def test_second_order_gradients_through_mm_match_torch():
    x = np.random.default_rng(2).standard_normal((4, 3))
    values = of.tensor(VALUES, requires_grad=True)
    dense = of.tensor(x, requires_grad=True)
    tvalues, tdense = torch.tensor(VALUES, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = F.sum(F.tanh(of.sparse.mm(of.sparse_coo_tensor(INDICES, values, (5, 4)), dense)))
    ty = torch.sum(torch.tanh(torch.sparse.mm(torch.sparse_coo_tensor(torch.tensor(INDICES), tvalues, (5, 4)),
                                              tdense)))
    (gd,) = of.grad(y, [dense], create_graph=True)
    (tgd,) = torch.autograd.grad(ty, [tdense], create_graph=True)
    (gd * gd).sum().backward()
    (tgd * tgd).sum().backward()
    np.testing.assert_allclose(values.grad.numpy(), tvalues.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(dense.grad.numpy(), tdense.grad.numpy(), rtol=1e-12)


def _graph(n=12, seed=0):
    """A ring with chords, self-loops, symmetric normalisation D^-1/2 (A + I) D^-1/2: a GCN's adjacency."""
    rng = np.random.default_rng(seed)
    edges = {(i, (i + 1) % n) for i in range(n)} | {(i, (i + 5) % n) for i in range(0, n, 3)}
    edges |= {(j, i) for i, j in edges} | {(i, i) for i in range(n)}
    rows, cols = np.array(sorted(edges)).T
    degree = np.bincount(rows, minlength=n).astype(np.float64)
    values = 1 / np.sqrt(degree[rows] * degree[cols])
    return np.stack([rows, cols]), values, rng.standard_normal((n, 5)), rng.integers(0, 3, n)


class GCN(nn.Module):
    def __init__(self, adjacency):
        super().__init__()
        self.adjacency = adjacency
        self.fc1, self.fc2 = nn.Linear(5, 8, dtype="float64"), nn.Linear(8, 3, dtype="float64")

    def forward(self, x):
        h = F.relu(of.sparse.mm(self.adjacency, self.fc1(x)))
        return of.sparse.mm(self.adjacency, self.fc2(h))


@pytest.mark.parametrize("native", [True, False])
def test_a_gcn_trains_eagerly_compiled_and_as_torch(native, monkeypatch):
    """Compiled with OPFORGE_NATIVE=0, eager's bits; with native code on, the loss's gradient is a row loop that sums
    each row in another order (opforge.program.native): eager's values within float64 rounding over 15 Adam steps."""
    monkeypatch.setenv("OPFORGE_NATIVE", "1" if native else "0")
    indices, values, features, labels = _graph()
    adjacency = of.sparse_coo_tensor(indices, values, (12, 12))
    models = [GCN(adjacency) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    tadj = torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(values), (12, 12))
    tfc1, tfc2 = torch.nn.Linear(5, 8, dtype=torch.float64), torch.nn.Linear(8, 3, dtype=torch.float64)
    with torch.no_grad():
        for t, o in [(tfc1, models[0].fc1), (tfc2, models[0].fc2)]:
            t.weight.copy_(torch.tensor(o.weight.numpy()))
            t.bias.copy_(torch.tensor(o.bias.numpy()))
    opts = [of.optim.Adam(m.parameters(), lr=0.05) for m in models]
    topt = torch.optim.Adam([*tfc1.parameters(), *tfc2.parameters()], lr=0.05)

    def step_for(model, opt):
        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step

    eager, compiled = step_for(models[0], opts[0]), of.compile(step_for(models[1], opts[1]))
    x, y = of.tensor(features), of.tensor(labels)
    losses = []
    for _ in range(15):
        le, lc = eager(x, y), compiled(x, y)
        if native:
            np.testing.assert_allclose(lc.item(), le.item(), rtol=1e-13)
        else:
            assert le.item() == lc.item()
        tloss = torch.nn.functional.cross_entropy(
            torch.sparse.mm(tadj, tfc2(torch.relu(torch.sparse.mm(tadj, tfc1(torch.tensor(features)))))),
            torch.tensor(labels))
        tloss.backward()
        topt.step()
        topt.zero_grad()
        np.testing.assert_allclose(le.item(), tloss.item(), rtol=1e-12)
        losses.append(le.item())
    assert losses[-1] < 0.85 * losses[0]  # it learns
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        if native:
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-11, atol=1e-14)
        else:
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_learnable_edge_weights_compiled_equal_eager():
    indices, values, features, _ = _graph()
    w0 = np.random.default_rng(3).standard_normal((5, 2))

    def setup():
        edge = of.tensor(values, requires_grad=True)
        w = of.tensor(w0, requires_grad=True)
        adjacency = of.sparse_coo_tensor(indices, edge, (12, 12))
        opt = of.optim.SGD([edge, w], lr=0.1)

        def step(x):
            loss = F.sum(F.square(of.sparse.mm(adjacency, x @ w)))
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return edge, step

    (edge_e, eager), (edge_c, step) = setup(), setup()
    compiled = of.compile(step)
    for _ in range(4):
        assert eager(of.tensor(features)).item() == compiled(of.tensor(features)).item()
    np.testing.assert_array_equal(edge_c.numpy(), edge_e.numpy())
    assert not np.array_equal(edge_e.numpy(), values)


def test_what_is_not_supported_is_refused_clearly():
    ours, _ = _pair()
    dense = of.tensor(np.ones((4, 2)))
    cases = [
        (lambda: of.sparse.mm(ours, ours.t()), r"sparse × sparse is not supported"),
        (lambda: of.sparse.mm(dense, ours), r"sparse.mm\(\): mat1 must be a sparse COO matrix, got Tensor"),
        (lambda: ours + 1, r"arithmetic is not supported: call .to_dense\(\) first"),
        (lambda: 2 * ours, r"arithmetic is not supported"),
        (lambda: np.asarray(ours), r"NumPy conversion .* is not supported"),
        (lambda: F.relu(ours), r"relu\(\): argument 'x' expected Tensor, got SparseTensor"),
        (lambda: ours.indices(), r"not coalesced .* call .coalesce\(\) first"),
        (lambda: of.sparse_coo_tensor(INDICES, VALUES[:5]), r"6 indices but 5 values"),
        (lambda: of.sparse_coo_tensor(INDICES, np.ones((6, 2))), r"hybrid sparse tensors .* are not supported"),
        (lambda: of.sparse_coo_tensor(INDICES, VALUES, (3, 4)), r"an index in dim 0 is 4, out of range for size"),
        (lambda: of.sparse_coo_tensor(INDICES, VALUES, (5, 4), is_coalesced=True), r"not sorted and unique"),
        (lambda: of.sparse_coo_tensor(-INDICES, VALUES), r"indices must be >= 0"),
        (lambda: of.compile(lambda a: of.sparse.mm(a, dense))(ours), r"argument 'a' is SparseTensor .* Close over"),
        (lambda: F.sparse_mm(of.tensor(INDICES), of.tensor(VALUES), dense, size=[3, 4]),
         r"sparse_mm\(\): a row index is 4, out of range for a sparse matrix of size \(3, 4\)"),
    ]
    for make, message in cases:
        with pytest.raises((of.ArgumentError, of.ShapeError), match=message):
            make()
    with pytest.raises(of.ShapeError, match=r"multiplies a dense matrix of 4 rows, got shape \(3, 2\)"):
        of.sparse.mm(ours, of.tensor(np.ones((3, 2))))
    with pytest.raises(of.ArgumentError, match=r"values are float64 and the dense matrix float32"):
        of.sparse.mm(ours, of.tensor(np.ones((4, 2), np.float32)))
