"""PyTorch as the oracle for the shape, indexing and linear-algebra ops: squeeze ... pad, roll, repeat_interleave,
diagonal, take/gather/scatter_add/index_select/index_add/masked_fill/one_hot, advanced ``Tensor`` indexing, linear,
outer and einsum.

``SHAPE_ORACLE`` maps each op to its torch counterpart, as ``ORACLE`` in test_torch_oracle.py does, and the same
runners compare forward values, VJPs and HVPs in float64 on the op's own samples plus the extras listed. Two things
differ from that file's table, so this file has its own adapters:

* Integer index inputs (``gather``'s ``index``, ...) are fine for the runners (they differentiate the float inputs
  only), but the gradient cases are picked by ``_gradient_case``, which lets int64 index arrays through.
* ``Tensor[]`` inputs (concat, stack, einsum) are flattened into the runners' list of arrays and rebuilt into a list
  for the call; a ``Tensor[]`` output (split) is joined into one tensor, the pieces flattened and concatenated the
  same way in both frameworks, so every piece's gradient is compared.

torch refuses negative indices where opforge counts them from the end (take, gather, scatter_add, index_select):
the torch side wraps them first (``idx % n``).
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
    forward,
    program_matches_eager,
    randn,
)

import opforge as of
from opforge import Sample
from opforge import ops as F
from opforge.core.opdef import split_by_layout
from opforge.testing import call_op

TF = torch.nn.functional


def _ix(t):
    """An index array as torch wants it: int64."""
    return t.long()


def _wrap(index, n):
    """Negative indices counted from the end, for torch ops that refuse them."""
    return _ix(index) % n


def torch_vjp_at_zeros(fn):
    """The counterpart of a dedicated gradient op ``op_grad(dy, [index,] shape=..., **attrs)`` of a linear op:
    torch's VJP of ``fn``, taken at zeros of ``shape`` and with create_graph=True (so it can be differentiated
    again)."""

    def vjp(dy, *index, shape, **attrs):
        x = torch.zeros(tuple(shape), dtype=dy.dtype, requires_grad=True)
        (dx,) = torch.autograd.grad(fn(x, *index, **attrs), x, dy, create_graph=True)
        return dx

    return vjp


def torch_take(x, index, axis=None):
    """``np.take``: along ``axis`` the dim is replaced by the index's shape; ``axis=None`` is torch.take."""
    if axis is None:
        return torch.take(x, _wrap(index, x.numel()))
    a = axis % x.dim()
    picked = torch.index_select(x, a, _wrap(index, x.shape[a]).reshape(-1))
    return picked.reshape(*x.shape[:a], *index.shape, *x.shape[a + 1:])


def torch_scatter_add(x, index, src, axis):
    """torch.scatter_add, with ``src`` cut to the index's shape first: the elements beyond it are not used, and
    torch's backward fails when ``src`` is larger than ``index`` (it returns a gradient of the index's shape)."""
    return torch.scatter_add(x, axis, _wrap(index, x.shape[axis]), src[tuple(slice(0, n) for n in index.shape)])


def torch_split(x, sections, axis):
    return torch.split(x, list(sections) if len(sections) > 1 else sections[0], dim=axis)


def torch_squeeze(x, axis):
    return torch.squeeze(x) if axis is None else torch.squeeze(x, dim=tuple(axis))


def torch_repeat_interleave(x, repeats, axis):
    counts = repeats[0] if len(repeats) == 1 else torch.tensor(repeats)
    return torch.repeat_interleave(x, counts, dim=axis)


def torch_roll(x, shifts, axis):
    return torch.roll(x, shifts[0]) if axis is None else torch.roll(x, tuple(shifts), tuple(axis))


def torch_diagonal(x, offset, axis1, axis2):
    return torch.diagonal(x, offset, axis1, axis2)


def torch_index_add(x, index, source, axis, alpha):
    return torch.index_add(x, axis, _wrap(index, x.shape[axis] if x.dim() else 1), source, alpha=alpha)


SHAPE_ORACLE: dict[str, Oracle] = {
    # -- dims ---------------------------------------------------------------------------------------------------------
    "squeeze": Oracle(torch_squeeze, extra=(
        Sample.of(randn(1, 1), axis=None),
        Sample.of(randn(3, 1, 2), axis=[-2, 0]),
    )),
    "unsqueeze": Oracle(lambda x, axis: torch.unsqueeze(x, axis), extra=(
        Sample.of(randn(2, 3), axis=-3),
        Sample.of(randn(2, 3), axis=2),
    )),
    "permute": Oracle(lambda x, dims: x.permute(tuple(dims)), extra=(
        Sample.of(randn(2, 3, 4, 5), dims=[3, -3, 0, 2]),
    )),
    "transpose": Oracle(lambda x, perm: x.permute(tuple(reversed(range(x.dim())))) if perm is None
                        else x.permute(tuple(perm))),
    "roll": Oracle(torch_roll, extra=(
        Sample.of(randn(2, 3, 4), shifts=[-7], axis=[1]),
        Sample.of(randn(2, 3), shifts=[1, 1], axis=[1, 1]),  # one axis twice: the shifts add up
        Sample.of(randn(5), shifts=[0]),
    )),
    "diagonal": Oracle(torch_diagonal, extra=(
        Sample.of(randn(3, 4, 5), offset=2, axis1=2, axis2=0),
        Sample.of(randn(4, 3), offset=-3),
        Sample.of(randn(2, 2, 3, 3), offset=-1, axis1=-2, axis2=-1),
    )),
    "diagonal_grad": Oracle(torch_vjp_at_zeros(torch_diagonal), extra=(
        Sample.of(randn(2, 2, 2), shape=[2, 2, 3, 3], offset=1, axis1=-2, axis2=-1),
    )),
    "flip": Oracle(lambda x, axis: torch.flip(x, tuple(axis)), extra=(
        Sample.of(randn(2, 3, 4), axis=[1]),
        Sample.of(randn(2, 3), axis=[]),
    )),
    # -- joining and splitting (Tensor[] in or out) -------------------------------------------------------------------
    "concat": Oracle(lambda xs, axis: torch.cat(xs, dim=axis), extra=(
        Sample.of([randn(2, 0, 3), randn(2, 2, 3)], axis=1),  # an empty piece
        Sample.of([randn(1, 2), randn(1, 2).astype(np.float32)], axis=0),  # promotes to float64
    )),
    "stack": Oracle(lambda xs, axis: torch.stack(xs, dim=axis), extra=(
        Sample.of([randn(2, 3), randn(2, 3)], axis=1),
        Sample.of([randn(4)], axis=-2),
    )),
    "split": Oracle(torch_split, extra=(
        Sample.of(randn(3, 5), sections=[2], axis=-1),  # 2, 2, 1
        Sample.of(randn(6, 2), sections=[6], axis=0),  # one piece
        Sample.of(randn(2, 3, 4), sections=[1, 1, 1], axis=1),
    )),
    # -- repeating, masking, padding ----------------------------------------------------------------------------------
    "repeat_interleave": Oracle(torch_repeat_interleave, extra=(
        Sample.of(randn(2, 3, 2), repeats=[3], axis=-2),
        Sample.of(randn(2, 3), repeats=[0, 2, 1, 1, 0, 3]),
        Sample.of(randn(4), repeats=[2, 2, 2, 2], axis=0),
    )),
    "repeat_interleave_grad": Oracle(torch_vjp_at_zeros(torch_repeat_interleave), extra=(
        Sample.of(randn(6), shape=[2, 3], repeats=[0, 2, 1, 1, 0, 2]),
    )),
    "tile": Oracle(lambda x, reps: torch.tile(x, tuple(reps)), extra=(
        Sample.of(randn(2, 3), reps=[]),
    )),
    "tril": Oracle(lambda x, diagonal: torch.tril(x, diagonal), extra=(
        Sample.of(randn(2, 2, 3, 4), diagonal=3),
        Sample.of(randn(3, 5), diagonal=-5),
    )),
    "triu": Oracle(lambda x, diagonal: torch.triu(x, diagonal), extra=(
        Sample.of(randn(2, 2, 3, 4), diagonal=-1),
        Sample.of(randn(3, 5), diagonal=7),
    )),
    "pad": Oracle(lambda x, pad, mode, value: TF.pad(x, tuple(pad), mode=mode, value=value), extra=(
        Sample.of(randn(2, 3, 4), pad=[1, 1, 0, 2, 2, 0], value=-2.0),
        Sample.of(randn(3, 4), pad=[-1, -2]),  # crops
        Sample.of(randn(2, 3, 4), pad=[3, 3], mode="reflect"),
        Sample.of(randn(2, 3, 4, 5), pad=[2, 0, 1, 3], mode="reflect"),
        Sample.of(randn(1, 3, 4), pad=[0, 5], mode="replicate"),
        Sample.of(randn(2, 3, 4), pad=[4, 1, 3, 3], mode="circular"),
        # negative pads crop, in every mode
        Sample.of(randn(2, 3, 5), pad=[-2, 4], mode="reflect"),
        Sample.of(randn(2, 3, 5), pad=[3, -4], mode="reflect"),  # reads the mirror image of what is cropped
        Sample.of(randn(2, 4, 5), pad=[1, -1, -2, 3], mode="reflect"),
        Sample.of(randn(2, 3, 5), pad=[6, -3], mode="replicate"),
        Sample.of(randn(1, 2, 4, 3), pad=[-1, -1, 2, -3], mode="replicate"),
        Sample.of(randn(2, 3, 5), pad=[-2, 3], mode="circular"),
        Sample.of(randn(2, 3, 5), pad=[2, -3], mode="circular"),
        Sample.of(randn(0, 3, 4), pad=[2, 1], mode="reflect"),  # an empty batch
        Sample.of(randn(0, 3, 4), pad=[1, 2], mode="circular"),
    )),
    "pad_grad": Oracle(torch_vjp_at_zeros(lambda x, pad, mode: TF.pad(x, tuple(pad), mode=mode)), extra=(
        Sample.of(randn(2, 7, 10), shape=[2, 3, 4], pad=[3, 3, 2, 2], mode="reflect"),
        Sample.of(randn(1, 3, 9), shape=[1, 3, 4], pad=[4, 1], mode="circular"),
        Sample.of(randn(2, 3, 4), shape=[2, 3, 5], pad=[2, -3], mode="reflect"),
        Sample.of(randn(2, 3, 6), shape=[2, 3, 5], pad=[-2, 3], mode="circular"),
        Sample.of(randn(2, 3, 7), shape=[2, 3, 5], pad=[5, -3], mode="replicate"),
    )),
    # -- indexing with integer tensors --------------------------------------------------------------------------------
    "take": Oracle(torch_take, extra=(
        Sample.of(randn(3, 4, 2), np.array([[0, 3], [3, 3], [-4, 1]]), axis=1),
        Sample.of(randn(3, 4), np.zeros((0,), np.int64), axis=0),  # no positions
        Sample.of(randn(2, 3), np.array([[-1, 0], [2, 2]], np.int32)),
    )),
    "take_grad": Oracle(torch_vjp_at_zeros(torch_take), extra=(
        Sample.of(randn(3, 2, 2, 2), np.array([[0, 3], [3, 3]]), shape=[3, 4, 2], axis=1),
    )),
    "gather": Oracle(lambda x, index, axis: torch.gather(x, axis, _wrap(index, x.shape[axis])), extra=(
        Sample.of(randn(4, 3), np.array([[0, 1, 2], [3, 3, 3], [0, 0, 0]], np.int32), axis=0),
        Sample.of(randn(2, 3, 4), np.array([[[3, 0, 1, 1], [2, 2, 2, 2]]]), axis=2),
    )),
    "gather_grad": Oracle(torch_vjp_at_zeros(lambda x, index, axis: torch.gather(x, axis, _wrap(index,
                                                                                          x.shape[axis]))), extra=(
        Sample.of(randn(1, 3), np.array([[2, 2, 2]]), shape=[4, 3], axis=0),
    )),
    "scatter_add": Oracle(torch_scatter_add, extra=(
        Sample.of(randn(2, 5), np.array([[4, 4, 4], [0, 1, 0]]), randn(2, 3), axis=1),
        Sample.of(randn(3, 2, 2), np.array([[[2, 0], [1, 1]]]), randn(2, 2, 3), axis=0),  # src larger than index
    )),
    "index_select": Oracle(lambda x, index, axis: torch.index_select(x, axis, _wrap(index.reshape(-1),
                                                                                      x.shape[axis])), extra=(
        Sample.of(randn(4, 3), np.array([1, 1, 1, 1, 1], np.int32), axis=0),
        Sample.of(randn(4, 3), np.zeros((0,), np.int64), axis=1),
    )),
    "one_hot": Oracle(lambda index, num_classes: TF.one_hot(_ix(index), num_classes), extra=(
        Sample.of(np.array([[0], [3]]), num_classes=4),
        Sample.of(np.zeros((0, 2), np.int64), num_classes=3),
        Sample.of(np.array([[0, 4], [2, 2]]), num_classes=-1),  # one more than the largest index
        Sample.of(np.array(0)),
    )),
    "index_add": Oracle(torch_index_add, extra=(
        Sample.of(randn(3, 4), np.array([3, 3, 0], np.int32), randn(3, 3), axis=1, alpha=3.0),
        Sample.of(randn(5), np.zeros(0, np.int64), randn(0), axis=0),
        Sample.of(np.arange(6).reshape(3, 2), np.array([2, 0]), np.ones((2, 2), np.int64), axis=0, alpha=-2.0),
    )),
    "masked_fill": Oracle(lambda x, mask, value: torch.masked_fill(x, mask, value), extra=(
        Sample.of(randn(2, 3), randn(3) > 0, randn()),  # the mask broadcasts
        Sample.of(randn(), np.array(True), randn()),
    )),
    # -- linear algebra -----------------------------------------------------------------------------------------------
    "linear": Oracle(lambda x, weight, bias=None: TF.linear(x, weight, bias), extra=(
        Sample.of(randn(2, 3, 4), randn(5, 4), randn(5)),
        Sample.of(randn(4), randn(1, 4)),
        Sample.of(randn(3, 4), randn(2, 4), randn(3, 2)),  # a bias of the output's full shape
    )),
    "outer": Oracle(torch.outer, extra=(
        Sample.of(randn(4), randn(1)),
    )),
    "einsum": Oracle(lambda operands, equation: torch.einsum(equation, *operands), extra=(
        Sample.of([randn(2, 3, 4), randn(2, 4, 5)], equation="bij,bjk->bik"),
        Sample.of([randn(3, 4), randn(4, 5), randn(5, 2)], equation="ij,jk,kl->il"),  # three operands: optimized
        Sample.of([randn(2, 1, 3, 4), randn(5, 4, 2)], equation="...ij,...jk->...ik"),  # ellipsis broadcast
        Sample.of([randn(2, 1), randn(3, 4)], equation="ij,jk->ik"),  # size-1 j broadcasts against 3
        Sample.of([randn(2, 3), randn(3, 4)], equation="Ab,bc"),  # implicit: uppercase sorts first
        Sample.of([randn(3, 3)], equation="ii"),  # trace
        Sample.of([randn(3, 3)], equation="ii->i"),  # diagonal
        Sample.of([randn(2, 2, 2)], equation="iii->"),
        Sample.of([randn(4, 3, 4), randn(3)], equation="iji,j->j"),
        Sample.of([randn(2, 3)], equation="ij->"),
        Sample.of([randn(2, 3), randn(4)], equation="ij,k->kji"),  # no contraction: an outer product
        Sample.of([randn(2, 3), randn(2, 3)], equation=" ij , ij -> i "),  # spaces are ignored
    )),
}


# -- adapters: lists of tensors in and out -------------------------------------------------------------------------


def _flatten(args) -> tuple[list, list]:
    """Sample args -> (flat list of arrays, layout: -1 for a tensor, n for a list of n)."""
    flat, layout = [], []
    for a in args:
        if isinstance(a, list):
            flat += a
            layout.append(len(a))
        else:
            flat.append(a)
            layout.append(-1)
    return flat, layout


def _joined(result, cat, flat):
    """A list output as one tensor: every piece flattened, then concatenated (in the same way on both sides)."""
    if isinstance(result, (list, tuple)):
        return cat([flat(p) for p in result])
    return result


def _pair(name: str, sample: Sample):
    """(opforge function, torch function, flat arrays) for one case; attrs bound, torch gets the defaults too."""
    opdef = of.registry.get(name)
    attrs = {**{p.name: p.default for p in opdef.attrs if p.has_default}, **sample.kwargs}
    arrays, layout = _flatten(sample.args)
    torch_fn = SHAPE_ORACLE[name].torch_fn

    def of_fn(*xs):
        return _joined(call_op(opdef, split_by_layout(xs, layout), sample.kwargs), lambda ps: F.concat(ps),
                       lambda p: F.reshape(p, shape=[-1]))

    def t_fn(*xs):
        return _joined(torch_fn(*split_by_layout(xs, layout), **attrs), torch.cat, lambda p: p.reshape(-1))

    return of_fn, t_fn, arrays


# Cases compared on values only: torch cannot differentiate twice through an empty output, nor at all through an
# integer one.
FORWARD_ONLY = {
    "tile": (Sample.of(randn(2, 3), reps=[2, 0]),),
    "masked_fill": (Sample.of(np.arange(4), np.array([True, False, False, True]), np.array(1.7)),),  # cast to int
}


def _gradient_case(arrays, sample: Sample) -> bool:
    """Gradients are compared where every float tensor is float64 (index tensors may be int) and there is one."""
    floats = [a for a in arrays if a.dtype.kind == "f"]
    return bool(floats) and all(a.dtype == np.float64 for a in floats) and all(
        a.dtype.kind in "fiub" for a in arrays)


def _case_id(name: str, i: int, sample: Sample) -> str:
    shapes = "x".join(str(a.shape).replace(" ", "") for a in _flatten(sample.args)[0])
    attrs = "".join(f",{k}={v}" for k, v in sample.kwargs.items()).replace(" ", "")
    return f"{name}-{i}[{shapes}{attrs}]"


def _params(gradients: bool) -> list:
    params = []
    for name in SHAPE_ORACLE:
        cases = [*_declared_samples(name), *SHAPE_ORACLE[name].extra]
        for i, case in enumerate([*cases, *([] if gradients else FORWARD_ONLY.get(name, ()))]):
            arrays, _ = _flatten(case.args)
            assert all(isinstance(a, np.ndarray) for a in arrays), f"{name}: tensor args must be arrays"
            if gradients and ("no_grad" in of.registry.get(name).traits or not _gradient_case(arrays, case)):
                continue
            params.append(pytest.param(name, case, id=_case_id(name, i, case)))
    return params


@pytest.mark.parametrize(("name", "sample"), _params(gradients=False))
def test_forward(name, sample):
    of_fn, t_fn, arrays = _pair(name, sample)
    check_forward(of_fn, t_fn, arrays)


@pytest.mark.parametrize(("name", "sample"), _params(gradients=True))
def test_vjp(name, sample):
    check_vjp(*_pair(name, sample))


@pytest.mark.parametrize(("name", "sample"), _params(gradients=True))
def test_hvp(name, sample):
    check_hvp(*_pair(name, sample))


def test_table_covers_the_ops():
    required = {"squeeze", "unsqueeze", "permute", "concat", "stack", "split", "flip", "tile", "tril", "triu", "pad",
                "pad_grad", "take", "take_grad", "gather", "gather_grad", "scatter_add", "index_select", "one_hot",
                "linear", "einsum", "outer", "roll", "repeat_interleave", "repeat_interleave_grad", "diagonal",
                "diagonal_grad", "index_add", "masked_fill"}
    assert required <= set(SHAPE_ORACLE), f"no oracle for {sorted(required - set(SHAPE_ORACLE))}"


# -- Tensor indexing with arrays (advanced indexing) ---------------------------------------------------------------


class _Index:
    def __getitem__(self, index):
        return index


ix = _Index()
_M = np.random.default_rng(6).standard_normal((3, 4, 5)) > 0  # a bool mask over a (3, 4, 5) tensor

ADVANCED = [
    ((4, 5), ix[[0, 2]]),
    ((4, 5), ix[[3, 3, -1, 0]]),  # repeats: their gradients add up
    ((4, 5), ix[:, [1, -1]]),
    ((4, 5), ix[np.array([[0, 1], [2, 3]])]),  # a 2-D index array
    ((4, 5), ix[[]]),
    ((3, 4, 5), ix[[0, 1], :, [1, 2]]),  # arrays separated by a slice: the picked dim goes first
    ((3, 4, 5), ix[:, [0, 1], [1, 2]]),  # adjacent arrays: the picked dim stays in place
    ((3, 4, 5), ix[[[0], [2]], [1, 3, 3]]),  # arrays broadcast together
    ((3, 4, 5), ix[0, :, [1, 2]]),  # an int is basic indexing (torch; NumPy would put the 2 first)
    ((3, 4, 5), ix[[0, 2], 1]),
    ((3, 4, 5), ix[..., [0, 0, 4]]),
    ((3, 4, 5), ix[None, [1], 1:3, [0, 4]]),
    ((3, 4, 5), ix[1:, [2, 0], ::2]),
    ((3, 4, 5), ix[_M]),  # a mask over every dim
    ((3, 4, 5), ix[1, _M[0]]),  # a mask over the two last dims
    ((3, 4, 5), ix[_M[:, 0, 0]]),  # a mask over the first dim
    ((3, 4, 5), ix[:, _M[0, :, 0], [0, 1, 2, 3][:int(_M[0, :, 0].sum())]]),
]


def _show(index) -> str:
    def one(item):
        if isinstance(item, slice):
            return ":".join("" if v is None else str(v) for v in (item.start, item.stop, item.step)).removesuffix(":")
        if isinstance(item, np.ndarray):
            return f"{'mask' if item.dtype == bool else 'array'}{list(item.shape)}"
        return "..." if item is Ellipsis else str(item).replace(" ", "")

    return ",".join(one(item) for item in (index if isinstance(index, tuple) else (index,)))


def _torch_index(index):
    """The same index for torch: NumPy arrays become torch tensors."""
    items = index if isinstance(index, tuple) else (index,)
    return tuple(torch.from_numpy(item) if isinstance(item, np.ndarray) else item for item in items)


def _of_index(index):
    """The same index for opforge, with arrays as opforge Tensors (NumPy arrays and lists work as well)."""
    items = index if isinstance(index, tuple) else (index,)
    return tuple(of.tensor(item) if isinstance(item, np.ndarray) else item for item in items)


@pytest.mark.parametrize("as_tensors", [False, True], ids=["arrays", "tensors"])
@pytest.mark.parametrize(("shape", "index"),
                         [pytest.param(s, i, id=f"{s}[{_show(i)}]".replace(" ", "")) for s, i in ADVANCED])
def test_advanced_indexing(shape, index, as_tensors):
    x = np.random.default_rng(7).standard_normal(shape)
    of_index = _of_index(index) if as_tensors else index
    of_fn, torch_fn = (lambda t: t[of_index]), (lambda t: t[_torch_index(index)])
    check_forward(of_fn, torch_fn, [x])
    check_vjp(of_fn, torch_fn, [x])
    check_hvp(of_fn, torch_fn, [x])


def test_advanced_indexing_is_a_take_op_with_a_scatter_add_gradient():
    x = of.tensor(np.arange(6.0), requires_grad=True)
    y = x[[1, 1, 5]]
    assert y.grad_fn.op.name == "take"
    (g,) = of.grad((y * y).sum(), [x], create_graph=True)  # 2·xᵢ per time xᵢ is picked
    assert g.tolist() == [0.0, 4.0, 0.0, 0.0, 0.0, 10.0]
    (h,) = of.grad(g.sum(), [x])
    assert h.tolist() == [0.0, 4.0, 0.0, 0.0, 0.0, 2.0]


@pytest.mark.parametrize(("index", "message"), [
    (ix[[0.5]], "integers or bools"),
    (ix[np.ones((2, 2), bool)], "does not match"),
    (ix[[4]], "out of range"),
    (ix[[0, 1], [0, 1, 2]], "do not broadcast"),
    (ix[[0], [9]], "out of range"),
    (ix[[0], [0], [0]], "too many indices"),
    (ix[np.array(True)], "at least one dim"),
])
def test_advanced_indexing_errors(index, message):
    x = of.tensor(np.zeros((4, 3)))
    with pytest.raises(of.OpforgeError, match=message):
        x[index]


# -- errors name the op and what is wrong ----------------------------------------------------------------------------


def _z(*shape):
    return of.tensor(np.zeros(shape))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.concat([_z(2, 3), _z(2, 4)]), r"concat\(\): .* differ in dim 1"),
    (lambda: F.concat([]), r"concat\(\): needs at least one tensor"),
    (lambda: F.concat([_z(), _z()]), r"concat\(\): .*use stack"),
    (lambda: F.stack([_z(2), _z(3)]), r"stack\(\): .* one shape"),
    (lambda: F.split(_z(5), sections=[2, 2]), r"split\(\): sections \[2, 2\] add up to 4"),
    (lambda: F.split(_z(5), sections=[0]), r"split\(\): argument 'sections'"),
    (lambda: F.squeeze(_z(2, 1), axis=[2]), r"squeeze\(\): axis 2 is out of range"),
    (lambda: F.permute(_z(2, 3), dims=[0, 0]), r"permute\(\): \[0, 0\] is not a permutation"),
    (lambda: F.transpose(_z(2, 3), perm=[0, 5]), r"transpose\(\): \[0, 5\] is not a permutation"),
    (lambda: F.tile(_z(2), reps=[-1]), r"tile\(\): argument 'reps'"),
    (lambda: F.tril(_z(3)), r"tril\(\): needs a tensor of rank >= 2"),
    (lambda: F.pad(_z(3), pad=[1]), r"pad\(\): argument 'pad'"),
    (lambda: F.pad(_z(3), pad=[3, 0], mode="reflect"), r"pad\(\): padding dim 0 of size 3 .* needs pads <= 2"),
    (lambda: F.pad(_z(3), pad=[1, 1], mode="wrap"), r"pad\(\): argument 'mode'"),
    (lambda: F.pad(_z(2, 4), pad=[2, -3], mode="circular"), r"pad\(\): .* needs pads <= 1, the size left after"),
    (lambda: F.pad(_z(2, 0), pad=[1, 0], mode="replicate"), r"pad\(\): .* an empty dim has nothing to repeat"),
    (lambda: F.pad(_z(3), pad=[-2, -2], mode="reflect"), r"pad\(\): pads \(-2, -2\) crop more"),
    (lambda: F.broadcast_to(_z(3), shape=[-1, 3]), r"broadcast_to\(\): .* -1 at dim 0, a new leading dim"),
    (lambda: F.broadcast_to(_z(3), shape=[-2]), r"broadcast_to\(\): .* -2 at dim 0, a negative size"),
    (lambda: F.roll(_z(2, 3), shifts=[1, 2]), r"roll\(\): without axis, shifts must hold one number"),
    (lambda: F.roll(_z(2, 3), shifts=[1, 2], axis=[0]), r"roll\(\): shifts \[1, 2\] and axis \[0\]"),
    (lambda: F.roll(_z(2, 3), shifts=[1], axis=[2]), r"roll\(\): axis 2 is out of range"),
    (lambda: F.repeat_interleave(_z(2, 3), repeats=[1, 2], axis=1), r"repeat_interleave\(\): repeats holds 2"),
    (lambda: F.repeat_interleave(_z(2), repeats=[-1]), r"repeat_interleave\(\): argument 'repeats'"),
    (lambda: F.repeat_interleave(_z(), repeats=[2], axis=0), r"repeat_interleave\(\): a 0-d tensor has no axis"),
    (lambda: F.diagonal(_z(3)), r"diagonal\(\): needs a tensor of rank >= 2"),
    (lambda: F.diagonal(_z(3, 3), axis1=1, axis2=-1), r"diagonal\(\): axis1 and axis2 must be two different"),
    (lambda: F.index_add(_z(3, 2), 0, of.tensor([0, 1]), _z(3, 2)), r"index_add\(\): source must have shape"),
    (lambda: F.index_add(_z(3), 0, of.tensor([3]), _z(1)), r"index_add\(\): argument 'index' holds 3"),
    (lambda: F.index_add(of.tensor([1, 2]), 0, of.tensor([0]), of.tensor([1]), alpha=0.5),
     r"index_add\(\): argument 'alpha' must be a whole number"),
    (lambda: F.masked_fill(_z(3), of.tensor([True, False, True]), _z(3)), r"masked_fill\(\): value must be 0-d"),
    (lambda: F.masked_fill(_z(3), of.tensor([True, False]), 1.0), r"masked_fill\(\): shapes"),
    (lambda: F.one_hot(of.tensor(np.zeros(0, np.int64))), r"one_hot\(\): num_classes=-1 .* index is empty"),
    (lambda: F.one_hot(of.tensor([1]), num_classes=-2), r"one_hot\(\): argument 'num_classes'"),
    (lambda: F.pad(_z(3), pad=[-2, -2]), r"pad\(\): pads \(-2, -2\) crop more"),
    (lambda: F.gather(_z(2, 3), 1, of.tensor([[3]])), r"gather\(\): argument 'index' holds 3"),
    (lambda: F.gather(_z(2, 3), 1, of.tensor([0])), r"gather\(\): x, index must have one rank"),
    (lambda: F.gather(_z(2, 3), 0, of.tensor([[0, 0, 0, 0]])), r"gather\(\): index has shape \(1, 4\)"),
    (lambda: F.scatter_add(_z(2, 3), 0, of.tensor([[0, 1]]), _z(1, 1)), r"scatter_add\(\): .* in src"),
    (lambda: F.index_select(_z(2, 3), 0, of.tensor([[0]])), r"index_select\(\): index must be 1-D"),
    (lambda: F.take(_z(2, 3), of.tensor([6])), r"take\(\): argument 'index' holds 6"),
    (lambda: F.one_hot(of.tensor([3]), num_classes=3), r"one_hot\(\): argument 'index' holds 3"),
    (lambda: F.one_hot(of.tensor([-1]), num_classes=3), r"one_hot\(\): argument 'index' holds -1"),
    (lambda: F.one_hot(of.tensor([0]), num_classes=0), r"one_hot\(\): argument 'num_classes'"),
    (lambda: F.linear(_z(2, 3), _z(3, 2)), r"linear\(\): x has 3 features .* weight is \(out_features"),
    (lambda: F.linear(_z(2, 3), _z(4, 3), _z(3)), r"linear\(\): bias of shape \(3,\) does not broadcast"),
    (lambda: F.outer(_z(2, 2), _z(2)), r"outer\(\): needs two vectors"),
    (lambda: F.einsum([_z(2, 3)], equation="ij->jj"), r"einsum\(\): argument 'equation' .* repeats in the output"),
    (lambda: F.einsum([_z(2, 3)], equation="ij->k"), r"einsum\(\): argument 'equation' .* no operand has"),
    (lambda: F.einsum([_z(2, 3)], equation="i1"), r"einsum\(\): argument 'equation' .* subscripts are letters"),
    (lambda: F.einsum([_z(2, 3)], equation="ijk"), r"einsum\(\): subscripts 'ijk' do not fit"),
    (lambda: F.einsum([_z(2, 3), _z(2, 3)], equation="ij"), r"einsum\(\): .* subscripts for 1 operand"),
    (lambda: F.einsum([_z(2, 3), _z(4, 3)], equation="ij,ij"), r"einsum\(\): subscript 'i' .* has sizes \[2, 4\]"),
    (lambda: F.einsum([_z(2, 3)], equation="ii"), r"einsum\(\): subscript 'i' of 'ii' has sizes \[2, 3\]"),
    (lambda: F.einsum([_z(1, 3)], equation="ii"), r"einsum\(\): subscript '.' repeats in 'ii' over dims of diff"),
])
def test_errors_name_the_op(call, message):
    with pytest.raises(of.OpforgeError, match=message):
        call()


# -- details ---------------------------------------------------------------------------------------------------------


def test_split_accepts_a_chunk_size_as_torch_does():
    x = np.arange(7.0)
    for sections in (3, [3], [7], [2, 5], [0, 7]):
        got = [p.numpy() for p in F.split(of.tensor(x), sections=sections)]
        want = [p.numpy() for p in torch_split(torch.from_numpy(x), np.atleast_1d(sections).tolist(), 0)]
        assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))


def test_split_gradient_reaches_every_piece():
    x = of.tensor(np.arange(5.0), requires_grad=True)
    _, b, _ = F.split(x, sections=[2])
    (b * 3.0).sum().backward()  # a and c get no gradient: the engine fills in zeros for them
    assert x.grad.tolist() == [0.0, 0.0, 3.0, 3.0, 0.0]


def test_int_and_float32_inputs_keep_their_dtypes():
    ints = of.tensor(np.arange(6).reshape(2, 3))
    assert F.pad(ints, pad=[1, 1], value=7.0).numpy()[0].tolist() == [7, 0, 1, 2, 7]
    assert F.gather(ints, 1, of.tensor([[2, 0]])).dtype == np.int64
    assert F.one_hot(of.tensor(np.array([1], np.int32)), num_classes=2).dtype == np.int64
    f32 = of.tensor(np.ones((2, 3), np.float32))
    for y in (F.concat([f32, f32]), F.stack([f32, f32]), F.tile(f32, reps=[2]), F.pad(f32, pad=[1, 1], mode="reflect"),
              F.einsum([f32, f32], equation="ij,kj->ik"), F.linear(f32, f32, f32[0, :2]), F.scatter_add(
                  f32, 0, of.tensor([[0]]), f32), F.take(f32, of.tensor([1]), axis=1), f32[[0, 1], [2, 2]]):
        assert y.dtype == np.float32


def test_linear_is_matmul_with_the_transposed_weight_and_a_bias():
    rng = np.random.default_rng(8)
    x, w, b = rng.standard_normal((2, 4)), rng.standard_normal((3, 4)), rng.standard_normal(3)
    np.testing.assert_allclose(F.linear(of.tensor(x), of.tensor(w), of.tensor(b)).numpy(), x @ w.T + b)


@pytest.mark.parametrize(("x_shape", "bias"), [((64, 784), True), ((2, 4, 784), True), ((33, 784), False)],
                         ids=["64-rows", "8-rows-in-a-batch", "33-rows-no-bias"])
def test_linear_with_few_float32_rows_computes_the_transposed_product(x_shape, bias, blas_library):
    # OpenBLAS's float32 x·Wᵀ is slow for a row-major result of few rows: linear computes W·xᵀ and copies it out
    # with the bias added. The result is that product's, bit for bit, eager and compiled alike (compiled GEMMs in
    # NumPy's OpenBLAS: in MKL, tests/test_blas.py), and as accurate.
    from opforge.ops import linalg

    blas_library("openblas")

    rng = np.random.default_rng(11)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal((512, 784)) / 28).astype(np.float32)
    b = rng.standard_normal(512).astype(np.float32) if bias else None
    assert linalg._few_rows(x, w, b, None)
    rows = x.reshape(-1, 784)
    by_hand = np.matmul(w, rows.T).T + (0 if b is None else b)
    args = [of.tensor(a) for a in (x, w, b) if a is not None]
    eager = F.linear(*args).numpy()
    np.testing.assert_array_equal(eager.reshape(-1, 512), by_hand)
    assert eager.shape == (*x_shape[:-1], 512) and eager.flags.c_contiguous
    exact = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if b is None else b)
    np.testing.assert_allclose(eager, exact, rtol=0, atol=2e-5)
    t_args = [torch.from_numpy(a) for a in (x, w, b) if a is not None]
    np.testing.assert_allclose(eager, torch.nn.functional.linear(*t_args).numpy(), rtol=0, atol=2e-5)
    feeds = {"x": x, "w": w} if b is None else {"x": x, "w": w, "b": b}
    # relu after it: linear's result is then the plan's own, written into a buffer of its workspace (out=)
    fn = (lambda x, w: {"y": F.relu(F.linear(x, w))}) if b is None else \
        (lambda x, w, b: {"y": F.relu(F.linear(x, w, b))})
    executor = of.Executor(of.trace(fn, **{n: of.Spec(a.shape, a.dtype) for n, a in feeds.items()}))
    for _ in range(2):
        np.testing.assert_array_equal(executor.run(**feeds)["y"], np.maximum(eager, 0))


def test_linear_takes_the_transposed_product_only_where_it_was_measured_faster():
    from opforge.ops import linalg

    def few(rows, features=512, inputs=784, dtype=np.float32, **kw):
        x = np.zeros((rows, inputs), dtype)
        return linalg._few_rows(x, np.zeros((features, inputs), dtype), kw.get("bias"), kw.get("out"))

    assert few(8) and few(64) and few(8, features=256, inputs=256)
    assert not few(7) and not few(65) and not few(64, dtype=np.float64)
    assert not few(64, features=255) and not few(64, inputs=255)
    assert not few(64, bias=np.zeros(512, np.float64))  # a float64 bias promotes: the plain path
    assert not few(64, bias=np.zeros((64, 512), np.float32))  # a bias per row and feature (it broadcasts)
    assert not few(64, out=np.zeros((512, 64), np.float32).T)  # an out= that is not C-ordered


def test_einsum_third_derivative_through_a_diagonal():
    # y = Σᵢ a_ii³ (via einsum "ii,ii,ii->"): the gradient einsums and diagonal masks are themselves differentiable.
    a = np.random.default_rng(9).standard_normal((3, 3))
    w = [np.random.default_rng(10 + k).standard_normal((3, 3)) for k in range(2)]

    def run(fw, fn):
        x = fw.tensor(a, requires_grad=True)
        (g,) = fw.grad([fn(x)], [x], create_graph=True)
        (g,) = fw.grad([g], [x], grad_outputs=[fw.tensor(w[0])], create_graph=True)
        (g,) = fw.grad([g], [x], grad_outputs=[fw.tensor(w[1])])
        return fw.numpy(g)

    got = run(OPFORGE, lambda x: F.einsum([x, x, x], equation="ii,ii,ii->"))
    want = run(TORCH, lambda x: torch.einsum("ii,ii,ii->", x, x, x))
    assert_same(got, want, "third derivative")


def test_forward_matches_numpy_for_take_along_axis():
    x, idx = randn(3, 4), np.array([[0, 3], [1, 1], [2, 0]])
    got = forward(OPFORGE, lambda t, i: F.gather(t, 1, i), [x, idx])
    np.testing.assert_array_equal(got, np.take_along_axis(x, idx, axis=1))


def test_one_hot_with_num_classes_minus_one_is_eager_only():
    index = of.tensor([[0, 4], [2, 2]])
    assert F.one_hot(index).shape == (2, 2, 5)
    with pytest.raises(of.ShapeError, match=r"one_hot\(\): num_classes=-1 .* pass num_classes"):
        of.trace(lambda i: {"y": F.one_hot(i)}, i=of.Spec((2, 2), "int64"))
    prog = of.trace(lambda i: {"y": F.one_hot(i, num_classes=5)}, i=of.Spec((None, 2), "int64"))
    assert of.Executor(prog).run(i=index.numpy())["y"].shape == (2, 2, 5)


def test_pad_with_negative_pads_is_crop_then_pad():
    # Reflect and replicate read the uncropped tensor (position p − before, mirrored or clamped), as PyTorch does;
    # circular wraps around what is left after cropping.
    x = of.tensor(np.arange(5.0).reshape(1, 5))
    assert F.pad(x, pad=[-1, 2], mode="reflect").tolist() == [[1.0, 2.0, 3.0, 4.0, 3.0, 2.0]]
    assert F.pad(x, pad=[3, -4], mode="reflect").tolist() == [[3.0, 2.0, 1.0, 0.0]]
    assert F.pad(x, pad=[2, -3], mode="replicate").tolist() == [[0.0, 0.0, 0.0, 1.0]]
    assert F.pad(x, pad=[-2, 2], mode="circular").tolist() == [[2.0, 3.0, 4.0, 2.0, 3.0]]
    assert F.pad(x, pad=[-5, 0], mode="replicate").shape == (1, 0)


def test_broadcast_to_keeps_dims_given_as_minus_one_in_programs():
    prog = of.trace(lambda x: {"y": F.broadcast_to(x, shape=[2, -1, 4])}, x=of.Spec((None, 1), "float64"))
    assert of.Executor(prog).run(x=np.ones((3, 1)))["y"].shape == (2, 3, 4)


PROGRAM_CASES = {
    "roll": lambda x: F.roll(x, shifts=[1, -1], axis=[0, 2]),
    "repeat_interleave": lambda x: F.repeat_interleave(x, repeats=[2], axis=0),
    "repeat_interleave-counts": lambda x: F.repeat_interleave(x, repeats=[1, 0, 2], axis=1),
    "diagonal": lambda x: F.diagonal(x, offset=1, axis1=1, axis2=2),
    "masked_fill": lambda x: F.masked_fill(x, x > 0.5, 0.25),
    "index_add": lambda x: F.index_add(x, 2, of.tensor([0, 2, 0]), x[:, :, :3] * x[:, :, :3], alpha=0.5),
    "pad-reflect": lambda x: F.pad(x, pad=[-1, 2], mode="reflect"),
    "broadcast_to": lambda x: F.broadcast_to(F.sum(x, axis=2, keepdim=True), shape=[2, -1, -1, 4]),
}


@pytest.mark.parametrize("name", PROGRAM_CASES)
def test_rules_build_programs_with_unknown_dims(name):
    # The rules emit the backward ops of a program whose leading dim is known only at run time: first and second
    # order gradients equal eager ones.
    rng = np.random.default_rng(7)
    x, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    fn = PROGRAM_CASES[name]
    program_matches_eager(fn, x, v, (None, 3, 4))
