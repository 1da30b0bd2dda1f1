"""PyTorch as the oracle for ``torch.linalg``'s ops: linalg_inv, linalg_det, linalg_solve, linalg_cholesky, linalg_qr
and linalg_svd, and the ``of.linalg`` names for them.

``LINALG_ORACLE`` maps each op to its torch counterpart as the other oracle tables do; the same runners compare
values, VJPs and HVPs (double backward, with respect to the inputs and the cotangent) in float64, on the op's own
samples plus the extras here. Ops with several outputs (q and r; u, s and vh) are compared as one tensor: every
output flattened and concatenated, in the same way on both sides, so each output's cotangent is random.

The decompositions are compared where they are unique and smooth: full-rank inputs for QR, distinct nonzero
singular values for the SVD. Each singular vector pair's sign is LAPACK's choice, which NumPy and torch make
differently for wide matrices: both sides flip each pair so that the largest entry of its u column is positive
(signs read from the values, so the function compared stays smooth). Where the decompositions are not unique (the
columns of a full u beyond min(m, n), QR in mode "complete" of a tall matrix), dedicated tests check torch's
conventions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_torch_oracle import (
    OPFORGE,
    TORCH,
    Oracle,
    _declared_samples,
    assert_same,
    check_forward,
    check_hvp,
    check_vjp,
    directional_derivative,
    program_matches_eager,
    randn,
    vjp,
)

import opforge as of
from opforge import Sample
from opforge import ops as F

_rng = np.random.default_rng(20240920)


def well_conditioned(*shape) -> np.ndarray:
    return np.asarray(_rng.standard_normal(shape) + shape[-1] * np.eye(shape[-1]))


def positive_definite(*shape) -> np.ndarray:
    m = _rng.standard_normal(shape)
    return np.asarray(m @ np.swapaxes(m, -1, -2) + shape[-1] * np.eye(shape[-1]))


def torch_cholesky(a, upper):
    # opforge reads a through its symmetric part (as JAX does); torch reads its lower triangle. Both agree on
    # symmetric inputs, and there torch's gradient is the symmetric one opforge's rule gives: so torch gets the
    # symmetric part too, which makes the two the same function of every input.
    return torch.linalg.cholesky((a + a.mT) / 2, upper=upper)


LINALG_ORACLE: dict[str, Oracle] = {
    "linalg_inv": Oracle(torch.linalg.inv, extra=(
        Sample.of(well_conditioned(3, 2, 2)),
        Sample.of(randn(4, 4)),
    )),
    "linalg_det": Oracle(torch.linalg.det, extra=(
        Sample.of(randn(4, 4)),
        Sample.of(randn(2, 3, 3, 3)),
    )),
    "linalg_solve": Oracle(lambda a, b, left: torch.linalg.solve(a, b, left=left), extra=(
        Sample.of(well_conditioned(2, 3, 3), randn(3)),  # a 1-D b against a batch
        Sample.of(well_conditioned(3, 3), randn(3, 3)),  # 2-D: matrices (a 2-D vector batch needs a 3-D a)
        Sample.of(well_conditioned(2, 3, 3), randn(2, 4, 3), left=False),
    )),
    "linalg_cholesky": Oracle(torch_cholesky, extra=(
        Sample.of(positive_definite(4, 4), upper=True),
        Sample.of(positive_definite(2, 2, 3, 3)),
    )),
    "linalg_qr": Oracle(lambda a, mode: torch.linalg.qr(a, mode=mode), extra=(
        Sample.of(randn(2, 5, 3)),
        Sample.of(randn(3, 6), mode="complete"),
        Sample.of(randn(1, 1)),
    )),
    "linalg_svd": Oracle(lambda a, full_matrices: torch.linalg.svd(a, full_matrices=full_matrices), extra=(
        Sample.of(randn(5, 3), full_matrices=False),
        Sample.of(randn(2, 3, 3)),
        Sample.of(randn(3, 5), full_matrices=False),
    )),
}


def _joined(result, cat, flat):
    return cat([flat(r) for r in result]) if isinstance(result, tuple) else result


def _pair_signs(u, k):
    """+1 or −1 per singular vector pair: the sign of the largest entry (in size) of each of u's first k columns."""
    cols = u[..., :, :k]
    rows = np.argmax(np.abs(cols), axis=-2)[..., None, :]
    return np.sign(np.take_along_axis(cols, rows, axis=-2))  # (..., 1, k)


def _fixed_signs(u, s, vh, tensor, numpy):
    """The SVD with each pair's sign fixed (see the module docstring); columns past k keep theirs."""
    k = s.shape[-1]
    signs = _pair_signs(numpy(u), k)
    pad = np.ones((*signs.shape[:-1], u.shape[-1] - k))
    u_signs = tensor(np.concatenate([signs, pad], axis=-1))
    vh_signs = tensor(np.swapaxes(np.concatenate([signs, np.ones((*signs.shape[:-1], vh.shape[-2] - k))], -1), -1, -2))
    return u * u_signs, s, vh * vh_signs


def _pair(name: str, sample: Sample):
    opdef = of.registry.get(name)
    attrs = {**{p.name: p.default for p in opdef.attrs if p.has_default}, **sample.kwargs}
    op_fn, torch_fn = getattr(F, name), LINALG_ORACLE[name].torch_fn

    def of_fn(*xs):
        out = op_fn(*xs, **sample.kwargs)
        if name == "linalg_svd":
            out = _fixed_signs(*out, of.tensor, lambda t: t.numpy())
        return _joined(tuple(out) if isinstance(out, tuple) else out, F.concat, lambda t: F.reshape(t, shape=[-1]))

    def t_fn(*xs):
        out = torch_fn(*xs, **attrs)
        if name == "linalg_svd":
            out = _fixed_signs(*out, torch.tensor, lambda t: t.detach().numpy())
        return _joined(tuple(out) if name in ("linalg_qr", "linalg_svd") else out, torch.cat,
                       lambda t: t.reshape(-1))

    return of_fn, t_fn


def _params() -> list:
    params = []
    for name, oracle in LINALG_ORACLE.items():
        for i, case in enumerate([*_declared_samples(name), *oracle.extra]):
            shapes = "x".join(str(a.shape).replace(" ", "") for a in case.args)
            attrs = "".join(f",{k}={v}" for k, v in case.kwargs.items())
            params.append(pytest.param(name, case, id=f"{name}-{i}[{shapes}{attrs}]"))
    return params


@pytest.mark.parametrize(("name", "sample"), _params())
def test_forward(name, sample):
    check_forward(*_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params())
def test_vjp(name, sample):
    check_vjp(*_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params())
def test_hvp(name, sample):
    check_hvp(*_pair(name, sample), sample.args)


def test_table_covers_the_ops():
    required = {"linalg_inv", "linalg_det", "linalg_solve", "linalg_cholesky", "linalg_qr", "linalg_svd"}
    assert required <= set(LINALG_ORACLE), f"no oracle for {sorted(required - set(LINALG_ORACLE))}"


# -- where the decompositions are not unique ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 2), (2, 5)])
def test_svd_full_matrices_ignores_the_undetermined_columns(shape):
    # u (m, m) or vh (n, n) hold columns that a does not determine; their cotangents are dropped, as in torch.
    a = randn(*shape)
    of_fn, t_fn = _pair("linalg_svd", Sample.of(a, full_matrices=True))
    check_forward(of_fn, t_fn, [a])
    check_vjp(of_fn, t_fn, [a])


def test_qr_complete_of_a_tall_matrix_is_not_differentiable():
    a = of.tensor(randn(4, 2), requires_grad=True)
    q, r = F.linalg_qr(a, mode="complete")
    assert q.shape == (4, 4) and r.shape == (4, 2)
    with pytest.raises(of.ArgumentError, match=r"linalg_qr\(\): mode 'complete' with more rows .* use mode 'reduced'"):
        F.sum(q).backward()


def test_cholesky_of_a_symmetric_matrix_is_torchs_and_reads_the_symmetric_part():
    a = positive_definite(3, 3)
    np.testing.assert_allclose(F.linalg_cholesky(of.tensor(a)).numpy(), torch.linalg.cholesky(torch.tensor(a)).numpy(),
                               rtol=1e-12)
    skew = np.triu(randn(3, 3), 1) * 0.1
    np.testing.assert_allclose(F.linalg_cholesky(of.tensor(a + skew - skew.T)).numpy(),
                               F.linalg_cholesky(of.tensor(a)).numpy(), rtol=1e-12)
    # The gradient is symmetric: torch's along symmetric directions.
    (g,) = vjp(OPFORGE, F.linalg_cholesky, [a], randn(3, 3))
    assert_same(g, g.T.copy(), "symmetric gradient")


def test_of_linalg_names_are_the_ops():
    assert of.linalg.inv is F.linalg_inv and of.linalg.svd is F.linalg_svd and of.linalg.solve is F.linalg_solve
    a = well_conditioned(3, 3)
    np.testing.assert_allclose(of.linalg.det(of.tensor(a)).item(), np.linalg.det(a), rtol=1e-12)


def test_third_derivative_of_the_inverse():
    # inv -> its rule (matmuls of the output) -> their rules: derivatives of any order, against torch's.
    a, ws = well_conditioned(3, 3), [randn(3, 3) for _ in range(3)]
    got = directional_derivative(OPFORGE, F.linalg_inv, a, ws)
    assert_same(got, directional_derivative(TORCH, torch.linalg.inv, a, ws), "third derivative")


# -- programs --------------------------------------------------------------------------------------------------------

_EYE = np.eye(3) * 3

PROGRAM_CASES = {
    "linalg_inv": lambda x: F.linalg_inv(x + of.tensor(_EYE)),
    "linalg_det": lambda x: F.linalg_det(x),
    "linalg_solve": lambda x: F.linalg_solve(x + of.tensor(_EYE), F.sum(x, axis=2)),  # a batch of vectors
    "linalg_solve-left=False": lambda x: F.linalg_solve(x + of.tensor(_EYE), x * x, left=False),
    "linalg_cholesky": lambda x: F.linalg_cholesky(F.matmul(x, F.transpose(x, perm=[0, 2, 1])) + of.tensor(_EYE)),
    "linalg_qr": lambda x: F.linalg_qr(x).q,
    "linalg_svd": lambda x: F.linalg_svd(x, full_matrices=False).s,
}


@pytest.mark.parametrize("name", PROGRAM_CASES)
def test_rules_build_programs_with_unknown_batch_dims(name):
    rng = np.random.default_rng(7)
    program_matches_eager(PROGRAM_CASES[name], rng.standard_normal((2, 3, 3)), rng.standard_normal((2, 3, 3)),
                           (None, 3, 3))


# -- wrong calls -----------------------------------------------------------------------------------------------------


def _z(*shape):
    return of.tensor(np.zeros(shape))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.linalg_inv(_z(2, 3)), r"linalg_inv\(\): a must be a square matrix"),
    (lambda: F.linalg_inv(_z(2, 2)), r"linalg_inv\(\): a matrix of a is singular"),
    (lambda: F.linalg_det(_z(3)), r"linalg_det\(\): a must be a square matrix"),
    (lambda: F.linalg_solve(of.tensor(np.eye(3)), _z(2)), r"linalg_solve\(\): b of shape \(2,\) does not fit"),
    (lambda: F.linalg_solve(of.tensor(np.eye(3)), _z(2, 3)), r"linalg_solve\(\): b of shape \(2, 3\) does not fit"),
    (lambda: F.linalg_solve(_z(3, 3), _z(3)), r"linalg_solve\(\): a matrix of a is singular"),
    (lambda: F.linalg_solve(of.tensor(np.eye(3)), _z(3), left=False), r"linalg_solve\(\): with left=False, b must"),
    (lambda: F.linalg_cholesky(of.tensor(-np.eye(2))), r"linalg_cholesky\(\): a matrix of a is not positive-def"),
    (lambda: F.linalg_qr(_z(3)), r"linalg_qr\(\): a must be a matrix"),
    (lambda: F.linalg_qr(_z(3, 3), mode="r"), r"linalg_qr\(\): argument 'mode'"),
    (lambda: F.linalg_svd(_z(3)), r"linalg_svd\(\): a must be a matrix"),
])
def test_errors_name_the_op(call, message):
    with pytest.raises(of.OpforgeError, match=message):
        call()
