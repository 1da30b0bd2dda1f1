"""Never silently different from PyTorch (issue 27): a call written as PyTorch writes it means what it means there,
or fails naming the difference. PyTorch is the oracle; docs/pytorch.md lists what was checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opforge as of
from opforge import ops as F


def same(ours, theirs, rtol=1e-6):
    """Equal values and dtypes (a torch dtype compares by name)."""
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
    ours = ours.numpy() if isinstance(ours, of.Tensor) else np.asarray(ours)
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    np.testing.assert_allclose(ours, theirs, rtol=rtol)


# -- transpose swaps two dims ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, dims", [((2, 3), (0, 1)), ((2, 3), (1, 0)), ((2, 3, 4), (0, 1)),
                                         ((2, 3, 4), (-1, 0)), ((2, 3, 4, 5), (1, 3)), ((3,), (0, 0))])
def test_transpose_swaps_two_dims_as_torch(shape, dims):
    array = np.random.default_rng(0).standard_normal(shape)
    x = of.tensor(array, requires_grad=True)
    t = torch.tensor(array, requires_grad=True)
    y, u = x.transpose(*dims), t.transpose(*dims)
    same(y, u)
    same(x.transpose(dim0=dims[0], dim1=dims[1]), t.transpose(dim0=dims[0], dim1=dims[1]))
    weights = np.random.default_rng(1).standard_normal(u.shape)
    (y * of.tensor(weights)).sum().backward()
    (u * torch.tensor(weights)).sum().backward()
    same(x.grad, t.grad)


def test_transpose_keeps_numpys_forms_that_torch_lacks_and_refuses_the_rest():
    x = of.randn(2, 3, 4)
    assert x.transpose().shape == (4, 3, 2)  # no argument: reversed (NumPy, and .T)
    assert x.transpose((2, 0, 1)).shape == (4, 2, 3)  # one tuple of all axes: NumPy's permutation
    same(x.permute(2, 0, 1), torch.tensor(x.numpy()).permute(2, 0, 1))
    same(x.permute((2, 0, 1)), torch.tensor(x.numpy()).permute((2, 0, 1)))
    with pytest.raises(of.ArgumentError, match=r"transpose\(\): takes two dims to swap.*permute"):
        x.transpose(2, 0, 1)
    with pytest.raises(of.ShapeError, match=r"transpose\(\): dim 3 is out of range for a tensor of rank 3"):
        x.transpose(0, 3)


# -- max(dim) and min(dim) give (values, indices) ----------------------------------------------------------------

_TIES = np.array([[1.0, 3.0, 3.0, -2.0], [np.nan, 0.5, np.nan, 7.0], [4.0, 4.0, 4.0, 4.0]])


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("dim, keepdim", [(0, False), (1, False), (-1, True), (0, True)])
def test_max_and_min_along_a_dim_give_values_and_indices_as_torch(name, dim, keepdim):
    x = of.tensor(_TIES, requires_grad=True)
    t = torch.tensor(_TIES, requires_grad=True)
    ours, theirs = getattr(x, name)(dim, keepdim), getattr(t, name)(dim, keepdim)
    same(ours.values, theirs.values)
    same(ours.indices, theirs.indices)
    same(ours[1], theirs[1])  # output.max(1)[1]: the indices, by position too
    values, indices = getattr(x, name)(dim=dim, keepdim=keepdim)  # unpacks as torch's
    same(values, theirs.values)
    same(indices, theirs.indices)
    for ours_f, theirs_f in ((getattr(F, name)(x, dim, keepdim), getattr(torch, name)(t, dim, keepdim)),
                             (getattr(F, name)(x, axis=dim, keepdim=keepdim),  # torch's alias of dim=
                              getattr(torch, name)(t, axis=dim, keepdim=keepdim))):
        same(ours_f.values, theirs_f.values)
        same(ours_f.indices, theirs_f.indices)
    weights = np.arange(1.0, 1.0 + theirs.values.numel()).reshape(theirs.values.shape)
    (ours.values * of.tensor(weights)).sum().backward()  # the gradient goes to the chosen index only
    (theirs.values * torch.tensor(weights)).sum().backward()
    same(x.grad, t.grad)


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_and_min_other_forms_as_torch(name):
    x, t = of.tensor(_TIES, requires_grad=True), torch.tensor(_TIES, requires_grad=True)
    same(getattr(x, name)(), getattr(t, name)())  # no dim: the value, a 0-d tensor
    finite = np.nan_to_num(_TIES)
    x, t = of.tensor(finite, requires_grad=True), torch.tensor(finite, requires_grad=True)
    getattr(x, name)().backward()
    getattr(t, name)().backward()
    same(x.grad, t.grad)  # ties share the gradient evenly
    other = np.full(4, 2.0)
    same(getattr(x, name)(of.tensor(other)), getattr(t, name)(torch.tensor(other)))  # elementwise
    ints = np.array([[3, 1], [2, 9]])
    same(getattr(of.tensor(ints), name)(1).indices, getattr(torch.tensor(ints), name)(1).indices)
    zero_d = getattr(of.tensor(2.5), name)(0)
    same(zero_d.values, getattr(torch.tensor(2.5), name)(0).values)
    same(zero_d.indices, getattr(torch.tensor(2.5), name)(0).indices)
    same(getattr(x, "a" + name)(axis=(0, 1)), getattr(t, "a" + name)(dim=(0, 1)))
    with pytest.raises(of.ArgumentError, match=rf"{name}\(\): dim must be one int.*a{name}"):
        getattr(x, name)((0, 1))


def test_sort_and_topk_give_named_values_and_indices_as_torch():
    x, t = of.tensor(_TIES), torch.tensor(_TIES)
    distinct = np.random.default_rng(0).standard_normal((3, 5))  # torch leaves the order of topk's ties open
    for ours, theirs in ((F.sort(x, axis=1), t.sort(dim=1, stable=True)),
                         (F.sort(x, axis=0, descending=True), t.sort(dim=0, descending=True, stable=True)),
                         (F.topk(of.tensor(distinct), k=2), torch.tensor(distinct).topk(2))):
        same(ours.values, theirs.values)
        same(ours.indices, theirs.indices)


# -- F.dropout returns a Tensor ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, shape", [("dropout", (40, 50)), ("dropout1d", (8, 30, 5)),
                                         ("dropout2d", (8, 30, 2, 2)), ("dropout3d", (8, 30, 2, 1, 2))])
def test_functional_dropouts_return_a_tensor_as_torch(name, shape):
    array = np.random.default_rng(0).uniform(1, 2, shape)
    x = of.tensor(array, requires_grad=True)
    of.manual_seed(0)
    y = getattr(F, name)(x, 0.3)  # torch's positional form: (input, p, training=True)
    u = getattr(torch.nn.functional, name)(torch.tensor(array), 0.3)
    assert type(y) is of.Tensor and type(u) is torch.Tensor and y.shape == tuple(u.shape) and y.dtype == x.dtype
    kept = y.numpy() != 0
    assert abs(kept.mean() - 0.7) < 0.1
    np.testing.assert_allclose(y.numpy()[kept], array[kept] / 0.7)
    y.sum().backward()  # backward uses the forward's draw
    np.testing.assert_allclose(x.grad.numpy(), np.where(kept, 1 / 0.7, 0.0))
    same(getattr(F, name)(of.tensor(array), 0.3, False), getattr(torch.nn.functional, name)(torch.tensor(array), 0.3,
                                                                                              False))
    z = of.tensor(array)
    assert getattr(F, name)(z, p=0.5, inplace=True) is z and (z.numpy() == 0).any()  # written into z, as torch


def test_dropout_layers_and_compiled_dropout_give_tensors():
    x = of.randn(4, 6, 3, 3)
    for layer in (of.nn.Dropout(0.5), of.nn.Dropout2d(0.5), of.nn.Dropout(0.5, inplace=True)):
        assert type(layer(of.randn(4, 6, 3, 3))) is of.Tensor
        assert layer.eval()(x) is x
    step = of.compile(lambda t: F.dropout(t, 0.5) * 2)
    assert type(step(x)) is of.Tensor and step(x).shape == x.shape


# -- type promotion: torch's result_type ---------------------------------------------------------------------------

DTYPES = ["bool", "int32", "int64", "float16", "float32", "float64"]
_VALUES = {"b": [True, False, True], "i": [3, 1, 2], "f": [0.5, 1.5, 2.5]}  # no zero: x / y is finite
_PYTHON = {"b": True, "i": 2, "f": 2.5}
FORMS = ["tensor", "0-d tensor", "Python number", "NumPy number"]


def _operand(form, dtype, lib):
    """An operand in ``form`` of ``dtype``, for opforge (lib=of) or torch."""
    kind = np.dtype(dtype).kind
    if form == "tensor":
        return lib.tensor(np.array(_VALUES[kind], dtype))
    if form == "0-d tensor":
        return lib.tensor(np.array(_VALUES[kind][0], dtype))
    if form == "Python number":
        return _PYTHON[kind]
    return np.dtype(dtype).type(_PYTHON[kind])


_CONDITION = np.array([True, False, False])
BINARY = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "sub": lambda a, b: a - b,
    "div": lambda a, b: a / b,
    "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "less": lambda a, b: a < b,
    "equal": lambda a, b: a == b,
    "where": lambda a, b: (F.where(of.tensor(_CONDITION), a, b) if isinstance(a, of.Tensor) or isinstance(b, of.Tensor)
                           else torch.where(torch.tensor(_CONDITION), a, b)),
    "clamp": lambda a, b: a.clamp(min=b),
}


def _compare_with_torch(op, a, b, form_a, form_b):
    fn = BINARY[op]
    try:
        theirs = fn(_operand(form_a, a, torch), _operand(form_b, b, torch))
    except (RuntimeError, TypeError):
        return None  # torch refuses (bool - bool, ...): nothing to mean differently
    try:
        with np.errstate(divide="ignore", invalid="ignore"):
            ours = fn(_operand(form_a, a, of), _operand(form_b, b, of))
    except of.ArgumentError as e:  # a loud refusal is allowed: remainder, // and clamp take no bool tensor
        assert "expected dtype" in str(e) and "got bool" in str(e), str(e)
        return None
    want = str(theirs.dtype).removeprefix("torch.")
    assert str(ours.dtype) == want, f"{op}({a} {form_a}, {b} {form_b}): {ours.dtype}, torch {want}"
    rtol = 1e-3 if "float16" in (a, b) else 1e-6
    np.testing.assert_allclose(ours.numpy().astype(np.float64), theirs.numpy().astype(np.float64), rtol=rtol,
                               err_msg=f"{op}({a} {form_a}, {b} {form_b})")
    return want


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("form", FORMS)
def test_binary_ops_promote_as_torch(op, form):
    """Each dtype pair, a tensor with dims meeting a tensor, a 0-d tensor, a Python number or a NumPy number of the
    other dtype, on either side: the dtype (and the values) torch gives."""
    compared = 0
    for a in DTYPES:
        for b in DTYPES:
            if form == "NumPy number" and b == "bool":
                continue  # torch reads np.bool_ as a float (a quirk); opforge as a bool, like True: see docs
            compared += _compare_with_torch(op, a, b, "tensor", form) is not None
            if op != "clamp" and form != "NumPy number":  # a NumPy number on the left is NumPy's own operator
                compared += _compare_with_torch(op, b, a, form, "tensor") is not None
    assert compared >= 20  # most pairs compared (torch refuses a few, bool - bool...)


def test_result_type_is_torchs():
    from opforge.core import dtypes as D

    for a in DTYPES:
        for b in DTYPES:
            for shape_a, shape_b in (((2,), (2,)), ((2,), ()), ((), (2,)), ((), ())):
                x, y = np.zeros(shape_a, a), np.zeros(shape_b, b)
                want = str(torch.result_type(torch.tensor(x), torch.tensor(y))).removeprefix("torch.")
                assert str(D.result_type(x, y)) == want, (a, shape_a, b, shape_b)
    for value in (True, 2, 2.5):
        for a in DTYPES:
            x = np.zeros(2, a)
            want = str(torch.result_type(torch.tensor(x), value)).removeprefix("torch.")
            assert str((of.tensor(x) + value).dtype if a != "bool" or value is not True else
                       F.logical_or(of.tensor(x), value).dtype) == want


def test_tensor_creation_dtypes_are_torchs():
    for data in ([0.5, 0.5], np.array([0.5]), np.float64(2.0), np.float32(2), [1, 2], [True, 2], [1, 2.5], True,
                 np.array([1, 2], np.int32), np.int32(3), [[1, 2], [3, 4.0]], 7, 2.5):
        assert str(of.tensor(data).dtype) == str(torch.tensor(data).dtype).removeprefix("torch."), data


def test_the_reported_promotions():
    assert (of.tensor(np.array([1, 2])) + of.tensor([0.5, 0.5])).dtype == of.float32
    assert (of.tensor([1.0, 2.0]) * np.float64(2)).dtype == of.float32
    assert (np.float64(2) * of.tensor([1.0, 2.0])).dtype == of.float32
    assert (of.tensor([1.0, 2.0]) * np.int64(2)).dtype == of.float32
    assert (of.tensor([1, 2]) / 2).dtype == of.float32  # true division of integers: the default float dtype
    x = of.tensor([1.0, 2.0], requires_grad=True)
    scale = of.tensor(3.0, dtype="float64", requires_grad=True)
    y = x * scale  # a 0-d float64 tensor does not upcast a float32 one ...
    assert y.dtype == of.float32
    y.sum().backward()  # ... and each gradient has its input's dtype
    assert x.grad.dtype == of.float32 and scale.grad.dtype == of.float64 and scale.grad.item() == 3.0


def test_compiled_code_promotes_as_eager_code():
    ints, floats = of.tensor(np.array([1, 2, 3], np.int32)), of.tensor([0.5, 1.5, 2.5])
    zero_d = of.tensor(2.0, dtype="float64")

    def fn(i, f, z):
        return i + f, f * z, i * z, i / 2, f * np.float64(3), i * 2.5, F.where(i > 1, i, 0.5)

    eager, compiled = fn(ints, floats, zero_d), of.compile(fn)(ints, floats, zero_d)
    assert [str(t.dtype) for t in eager] == ["float32", "float32", "float64", "float32", "float32", "float32",
                                            "float32"]
    for ours, again in zip(eager, compiled):
        same(again, ours.numpy())


# -- F.batch_norm and F.instance_norm: y, the running statistics updated in place ---------------------------------


@pytest.mark.parametrize("training", [True, False])
def test_functional_batch_norm_returns_y_and_updates_the_statistics_in_place(training):
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((4, 3, 2)), rng.standard_normal(3), rng.standard_normal(3)
    stats = rng.standard_normal(3), rng.uniform(0.5, 2, 3)
    rm, rv = of.tensor(stats[0]), of.tensor(stats[1])
    trm, trv = torch.tensor(stats[0]), torch.tensor(stats[1])
    y = F.batch_norm(of.tensor(x), rm, rv, of.tensor(w), of.tensor(b), training, 0.3)  # torch's positional order
    u = torch.nn.functional.batch_norm(torch.tensor(x), trm, trv, torch.tensor(w), torch.tensor(b), training, 0.3)
    assert type(y) is of.Tensor
    same(y, u)
    same(rm, trm)  # updated in place when training, as torch's
    same(rv, trv)


@pytest.mark.parametrize("use_input_stats", [True, False])
def test_functional_instance_norm_takes_torchs_positional_order(use_input_stats):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 3, 5)), rng.standard_normal(3), rng.standard_normal(3)
    stats = rng.standard_normal(3), rng.uniform(0.5, 2, 3)
    rm, rv = of.tensor(stats[0]), of.tensor(stats[1])
    trm, trv = torch.tensor(stats[0]), torch.tensor(stats[1])
    # (x, running_mean, running_var, weight, bias, use_input_stats, momentum, eps): the statistics come first
    y = F.instance_norm(of.tensor(x), rm, rv, of.tensor(w), of.tensor(b), use_input_stats, 0.2)
    u = torch.nn.functional.instance_norm(torch.tensor(x), trm, trv, torch.tensor(w), torch.tensor(b),
                                          use_input_stats, 0.2)
    same(y, u)
    same(rm, trm)
    same(rv, trv)
    same(F.instance_norm(of.tensor(x), weight=of.tensor(w)), torch.nn.functional.instance_norm(
        torch.tensor(x), weight=torch.tensor(w)))


# -- the audit: call forms torch shares with opforge that were already the same (a guard) ------------------------

_A = np.array([[-7.0, 2.5, 0.5], [1.5, -2.5, 7.0]])
_I = np.array([[-7, 2, 0], [1, -2, 7]], np.int32)
AUDITED = {
    "squeeze(dim) of a dim that is not 1": (lambda x: x.squeeze(0), lambda t: t.squeeze(0), _A),
    "sum(dim, keepdim)": (lambda x: x.sum(1, True), lambda t: t.sum(1, True), _A),
    "sum of int32": (lambda x: x.sum(), lambda t: t.sum(), _I),
    "sum of bool": (lambda x: (x > 0).sum(), lambda t: (t > 0).sum(), _I),
    "std: unbiased": (lambda x: F.std(x), lambda t: t.std(), _A),
    "var along a dim": (lambda x: F.var(x, axis=1), lambda t: t.var(1), _A),
    "norm": (lambda x: F.norm(x), lambda t: t.norm(), _A),
    "split(2): chunks of 2": (lambda x: F.split(x, sections=2, axis=1)[1], lambda t: t.split(2, 1)[1], _A),
    "split([1, 2]): sizes": (lambda x: F.split(x, sections=[1, 2], axis=1)[1], lambda t: t.split([1, 2], 1)[1], _A),
    "cumsum of int32": (lambda x: F.cumsum(x, axis=1), lambda t: t.cumsum(1), _I),
    "round: half to even": (lambda x: F.round(x), lambda t: t.round(), _A),
    "round(decimals)": (lambda x: F.round(x * 0.1, decimals=1), lambda t: (t * 0.1).round(decimals=1), _A),
    "// on floats": (lambda x: x // 2.0, lambda t: t // 2.0, _A),
    "// on ints": (lambda x: x // -3, lambda t: t // -3, _I),
    "% on floats": (lambda x: x % -2.0, lambda t: t % -2.0, _A),
    "% on ints": (lambda x: x % 3, lambda t: t % 3, _I),
    "argmax(dim)": (lambda x: x.argmax(1), lambda t: t.argmax(1), np.array([[1, 3, 3], [2, 2, 0]])),
    "argmax()": (lambda x: x.argmax(), lambda t: t.argmax(), _A),
    "view(-1)": (lambda x: x.view(-1), lambda t: t.view(-1), _A),
    "clamp(min, max)": (lambda x: x.clamp(-1, 2), lambda t: t.clamp(-1, 2), _A),
    "T": (lambda x: x.T, lambda t: t.T, _A),
    "unsqueeze(-1)": (lambda x: x.unsqueeze(-1), lambda t: t.unsqueeze(-1), _A),
    "F.pad: the last dim first": (lambda x: F.pad(x, pad=[1, 0, 0, 2]), lambda t: torch.nn.functional.pad(
        t, (1, 0, 0, 2)), _A),
    "F.gather": (lambda x: F.gather(x, 1, of.tensor([[2, 0], [1, 1]])),
                 lambda t: torch.gather(t, 1, torch.tensor([[2, 0], [1, 1]])), _A),
}


@pytest.mark.parametrize("case", list(AUDITED))
def test_call_forms_torch_shares_mean_the_same(case):
    ours, theirs, data = AUDITED[case]
    same(ours(of.tensor(data)), theirs(torch.tensor(data)))


def test_numpy_functions_keep_numpys_meaning():
    x = of.tensor(_A)
    same(np.std(x), np.std(_A))  # ddof=0, where torch's std is unbiased
    same(np.max(x, axis=0), np.max(_A, axis=0))  # values, where torch's max(dim) gives (values, indices)
    same(np.sum(of.tensor(_I)), torch.tensor(_I).sum())  # int32 sums to int64 in both


def test_flip_returns_a_copy_as_torch():
    # NumPy's flip is a view: writing the result in place changed the input, where torch's flip copies
    x, t = of.tensor(_A.copy()), torch.tensor(_A.copy())
    x.flip(0).add_(1)
    t.flip(0).add_(1)
    same(x, t)


# -- an empty dim list: torch reduces every dim, NumPy none ------------------------------------------------------

_EMPTY_DIMS = {
    "sum": lambda x, d: F.sum(x, dim=d), "mean": lambda x, d: F.mean(x, dim=d), "prod": lambda x, d: F.prod(x, dim=d),
    "amax": lambda x, d: F.amax(x, dim=d), "amin": lambda x, d: F.amin(x, dim=d), "var": lambda x, d: F.var(x, dim=d),
    "std": lambda x, d: F.std(x, dim=d), "logsumexp": lambda x, d: F.logsumexp(x, dim=d),
    "norm": lambda x, d: F.norm(x, dim=d), "all": lambda x, d: F.all(x, dim=d), "any": lambda x, d: F.any(x, dim=d),
    "nansum": lambda x, d: F.nansum(x, dim=d), "nanmean": lambda x, d: F.nanmean(x, dim=d),
    "count_nonzero": lambda x, d: F.count_nonzero(x, dim=d), "var_mean": lambda x, d: F.var_mean(x, dim=d),
    "Tensor.sum": lambda x, d: x.sum(dim=d), "Tensor.mean": lambda x, d: x.mean(d),
}


@pytest.mark.parametrize("name", list(_EMPTY_DIMS))
@pytest.mark.parametrize("dims", [(), []])
def test_an_empty_dim_list_is_refused_naming_the_two_readings(name, dims):
    # torch.sum(x, dim=()) sums every element; np.sum(x, axis=()) none. opforge's sum once summed none, silently
    # unlike torch (and its nansum every one): now every reduction refuses the empty list, in eager and compiled code.
    x = of.tensor(_A)
    with pytest.raises(of.ArgumentError, match=r"dim=\(\).*ambiguous.*PyTorch reduces every dim, NumPy none"):
        _EMPTY_DIMS[name](x, dims)
    with pytest.raises(of.ArgumentError, match="ambiguous"):
        of.compile(lambda t: _EMPTY_DIMS[name](t, dims))(x)
    # dim=None reduces every dim, as torch's explicit list of every dim does
    t = torch.tensor(_A)
    ours = _EMPTY_DIMS[name](x, None)
    theirs = t.prod() if name == "prod" else getattr(torch, name.removeprefix("Tensor."))(t, dim=(0, 1))
    same(*((ours[0], theirs[0]) if name == "var_mean" else (ours, theirs)))


def test_numpy_reductions_over_no_axis_keep_numpys_meaning():
    x = of.tensor(_A)
    same(np.sum(x, axis=()), np.sum(_A, axis=()))  # NumPy computes these: axis=() reduces nothing there
    same(np.mean(x, axis=()), _A)
    same(np.std(x, axis=()), np.zeros_like(_A))
