"""PyTorch as the oracle for the nn ops (opforge/ops/nn.py): values, first and second derivatives, in float64.

``ORACLE`` maps each op to its ``torch.nn.functional`` counterpart (or, for a dedicated grad op, torch's own
backward of the forward op, taken with create_graph=True so that it can be differentiated again). Every case — the
op's declared samples plus the ``extra`` ones — runs through the runners of tests/test_torch_oracle.py: forward,
VJP and HVP (double backward). The adapter here binds what those runners cannot pass: absent optional inputs
(``None``), integer targets and indices (they get no gradient), and ops with several outputs (compared one output
at a time).

Where torch has no derivative (``pos_weight`` of binary_cross_entropy_with_logits, running statistics of
batch_norm in eval mode, the running-statistics update itself) the oracle is the same formula written with torch
ops, and a dedicated test checks its values against the real torch function. Dedicated tests follow the table:
dropout with p > 0 (backward uses the forward's mask; ``of.manual_seed`` reproduces it), batch_norm's running
statistics against torch's in-place update, third derivatives of softmax and log_softmax, and wrong calls.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from test_torch_oracle import (
    OPFORGE,
    TORCH,
    assert_same,
    check_forward,
    check_hvp,
    check_vjp,
    directional_derivative,
    randn,
    uniform,
)
from test_torch_oracle import ORACLE as BASE_ORACLE

import opforge as of
from opforge import Sample
from opforge import ops as F
from opforge.testing import call_op

TF = torch.nn.functional

# -- torch counterparts --------------------------------------------------------------------------------------------


def _long(target):
    return target.long()  # torch's class-index losses take int64 targets only


def torch_nll_loss_grad(dloss, target, weight, num_classes, ignore_index, reduction):
    """torch's VJP of nll_loss (linear in its input, so taken at zeros of the input's shape)."""
    axis = 1 if target.dim() >= 1 else 0
    shape = (*target.shape[:axis], num_classes, *target.shape[axis:])
    x = torch.zeros(shape, dtype=dloss.dtype, requires_grad=True)
    loss = TF.nll_loss(x, _long(target), _constant(weight), ignore_index=ignore_index, reduction=reduction)
    (dx,) = torch.autograd.grad(loss, x, dloss, create_graph=True)
    return dx


def _constant(t):
    """A class weight: torch does not differentiate nll_loss and cross_entropy in it, and opforge declares it nograd."""
    return None if t is None else t.detach()


def torch_nll_loss(log_probs, target, weight, **attrs):
    return TF.nll_loss(log_probs, _long(target), _constant(weight), **attrs)


def torch_cross_entropy(logits, target, weight, **attrs):
    target = target if target.is_floating_point() else _long(target)
    return TF.cross_entropy(logits, target, _constant(weight), **attrs)


def torch_cross_entropy_grad(logits, target, dloss, weight, exp_rows=None, row_sums=None, **attrs):
    """torch's VJP of cross_entropy with respect to the logits, with create_graph=True so that it can be
    differentiated again."""
    x = logits if logits.requires_grad else logits.detach().requires_grad_()
    (dx,) = torch.autograd.grad(torch_cross_entropy(x, target, weight, **attrs), x, dloss, create_graph=True)
    return dx


def _reduced(losses, reduction):
    return {"none": losses, "sum": losses.sum(), "mean": losses.mean()}[reduction]


def _broadcast(fn):
    """torch's elementwise loss on broadcast inputs (it warns when it broadcasts them itself)."""
    return lambda x, target, **attrs: fn(*torch.broadcast_tensors(x, target), **attrs)


def torch_kl_div(x, target, **attrs):
    with warnings.catch_warnings():  # reduction="mean" is torch's default and warns that it is not "batchmean"
        warnings.simplefilter("ignore")
        return TF.kl_div(x, target, **attrs)


def torch_bce(probs, target, weight, reduction):
    """torch's function, times the weight outside it where there is one: torch does not differentiate in weight."""
    if weight is None:
        return TF.binary_cross_entropy(probs, target, reduction=reduction)
    return _reduced(weight * TF.binary_cross_entropy(probs, target, reduction="none"), reduction)


def torch_bce_with_logits(logits, target, weight, pos_weight, reduction):
    """torch's function without weights; with them, torch's formula written out (torch does not differentiate
    with respect to weight and pos_weight). test_bce_weights_formula_is_torchs checks the two agree on values."""
    if weight is None and pos_weight is None:
        return TF.binary_cross_entropy_with_logits(logits, target, reduction=reduction)
    coef = 1 if pos_weight is None else 1 + (pos_weight - 1) * target
    losses = (1 - target) * logits + coef * TF.softplus(-logits)
    return _reduced(losses if weight is None else losses * weight, reduction)


def _ones_for_missing_weight(weight, bias, shape, like):
    """torch's double backward of layer_norm and batch_norm fails with a bias but no weight ("Expected a proper
    Tensor but got None"): a weight of ones is the same function."""
    return torch.ones(shape, dtype=like.dtype) if weight is None and bias is not None else weight


def torch_layer_norm(x, weight, bias, normalized_shape, eps):
    weight = _ones_for_missing_weight(weight, bias, normalized_shape, x)
    return TF.layer_norm(x, normalized_shape, weight, bias, eps)


def _bn_axes(x):
    return [0, *range(2, x.dim())]


def _bn_channel(t, x):
    return t.reshape(1, -1, *[1] * (x.dim() - 2))


def torch_batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps):
    """(y, new_running_mean, new_running_var). y: torch's batch_norm in training mode; in eval mode its formula
    (x − rm)/√(rv + ε)·w + b, which torch does not differentiate in rm and rv. The running statistics: torch's update
    (1 − m)·running + m·batch statistic (variance unbiased) as a formula, since torch updates buffers in place.
    test_batch_norm_matches_torch_functional checks all three against torch's own call."""
    if training:
        weight = _ones_for_missing_weight(weight, bias, x.shape[1], x)
        y = TF.batch_norm(x, None, None, weight, bias, training=True, eps=eps)
        mean, var = x.mean(_bn_axes(x)), x.var(_bn_axes(x), unbiased=True)
        if running_mean is None:
            return y, mean, var
        return y, running_mean * (1 - momentum) + mean * momentum, running_var * (1 - momentum) + var * momentum
    y = (x - _bn_channel(running_mean, x)) / torch.sqrt(_bn_channel(running_var, x) + eps)
    if weight is not None:
        y = y * _bn_channel(weight, x)
    if bias is not None:
        y = y + _bn_channel(bias, x)
    return y, running_mean.clone(), running_var.clone()


def torch_embedding_rows(index, weight, num_embeddings, start, padding_idx):
    """torch's lookup in the whole table, of which ``weight`` is rows start... and every other row zeros."""
    rows, dim = weight.shape
    table = torch.cat([weight.new_zeros(start, dim), weight, weight.new_zeros(num_embeddings - start - rows, dim)])
    return TF.embedding(index, table, padding_idx=padding_idx)


def torch_embedding_grad(dy, index, num_embeddings, padding_idx):
    """torch's VJP of embedding with respect to the weight (linear: taken at zeros of the weight's shape)."""
    w = torch.zeros((num_embeddings, dy.shape[-1]), dtype=dy.dtype, requires_grad=True)
    (dw,) = torch.autograd.grad(TF.embedding(index, w, padding_idx=padding_idx), w, dy, create_graph=True)
    return dw


# -- the table -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Oracle:
    torch_fn: Callable  # (*torch tensors or None, **attrs) -> a torch tensor, or a tuple for several outputs
    extra: tuple = ()  # Samples added to the op's declared samples
    outputs: int = 1  # how many outputs to compare (each is a case of its own)


def _mask(shape, p_keep, seed):
    return np.random.default_rng(seed).uniform(size=shape) < p_keep


_NEG_INF_MASK = np.where(np.arange(12).reshape(3, 4) % 5 == 1, -np.inf, 0.0)
_NEG_INF_MASK[2] = -np.inf  # the third query attends to nothing: zeros, as torch

ORACLE: dict[str, Oracle] = {
    # -- softmax family --------------------------------------------------------------------------------------------
    "softmax": Oracle(lambda x, axis: TF.softmax(x, dim=axis), extra=(
        Sample.of(randn(3, 4) * 500, axis=1),  # exp would overflow without the max shift
        Sample.of(randn(2, 3, 4), axis=0),
        Sample.of(randn(1, 4), axis=0),
    )),
    "log_softmax": Oracle(lambda x, axis: TF.log_softmax(x, dim=axis), extra=(
        Sample.of(randn(3, 4) * 500, axis=1),
        Sample.of(randn(2, 3, 4), axis=-3),
        Sample.of(randn(1, 4), axis=0),
    )),
    "softmax_grad": Oracle(lambda y, dy, axis: torch._softmax_backward_data(dy, y, axis, y.dtype), extra=(
        Sample.of(uniform(0.1, 1.0, 2, 3, 4), randn(2, 3, 4), axis=0),  # any y: the formula, off the simplex too
        Sample.of(uniform(0.1, 1.0), randn()),
    )),
    "log_softmax_grad": Oracle(lambda y, dy, axis: torch._log_softmax_backward_data(dy, y, axis, y.dtype), extra=(
        Sample.of(randn(2, 3, 4), randn(2, 3, 4), axis=0),
        Sample.of(randn(), randn()),
    )),
    # -- losses ----------------------------------------------------------------------------------------------------
    "nll_loss": Oracle(torch_nll_loss, extra=(
        Sample.of(randn(4, 5), np.array([0, 4, 2, 4], np.int32)),
        Sample.of(randn(3, 4), np.array([1, -100, 3]), reduction="none"),
        Sample.of(randn(3, 4), np.array([1, 2, 3]), ignore_index=2, reduction="sum"),
        Sample.of(randn(3, 4), np.array([1, -100, 3]), uniform(0.5, 2, 4), reduction="sum"),
        Sample.of(randn(3, 4), np.full(3, -100), uniform(0.5, 2, 4)),  # every target ignored: nan, gradient 0
        Sample.of(randn(2, 3, 2), np.array([[0, 2], [-100, 1]]), uniform(0.5, 2, 3)),
    )),
    "nll_loss_grad": Oracle(torch_nll_loss_grad, extra=(
        Sample.of(randn(), np.array([1, -100, 3]), num_classes=4),
        Sample.of(randn(3), np.array([1, 2, 3], np.int32), num_classes=5, ignore_index=2, reduction="none"),
        Sample.of(randn(2, 2, 3), np.array([[[0, 1, 1], [2, 0, -100]], [[1, 1, 0], [2, 2, 2]]]), num_classes=3,
                  reduction="none"),
        Sample.of(randn(), np.array([1, -100, 0]), uniform(0.5, 2, 3), num_classes=3),
        Sample.of(randn(3), np.array([1, 2, 0]), uniform(0.5, 2, 3), num_classes=3, reduction="none"),
    )),
    "cross_entropy": Oracle(torch_cross_entropy, extra=(
        Sample.of(randn(4, 5) * 100, np.array([0, 4, 2, 4])),  # far from 0: the log-sum-exp must be shifted
        Sample.of(randn(4, 5), np.array([0, -100, 2, 4], np.int32), label_smoothing=1.0),
        Sample.of(randn(3, 4), np.array([1, -100, 3]), reduction="none", label_smoothing=0.25),
        Sample.of(randn(3, 4), np.array([1, 2, 3]), ignore_index=2, reduction="sum", label_smoothing=0.5),
        Sample.of(randn(2, 3, 2, 2), np.array([[[0, 1], [2, -100]], [[1, 1], [0, 2]]]), reduction="none"),
        Sample.of(randn(3, 4), np.array([1, -100, 3]), uniform(0.5, 2, 4)),
        Sample.of(randn(3, 4), np.array([1, -100, 3]), uniform(0.5, 2, 4), reduction="none", label_smoothing=0.3),
        Sample.of(randn(2, 3, 2), np.array([[0, 2], [-100, 1]]), uniform(0.5, 2, 3), label_smoothing=0.4),
        Sample.of(randn(3, 4), np.full(3, -100)),  # every target ignored: nan, gradient 0
        Sample.of(randn(3, 4), np.full(3, -100), uniform(0.5, 2, 4), label_smoothing=0.2),
        Sample.of(randn(3, 4) * 50, uniform(0, 1, 3, 4), reduction="sum"),  # probabilities need not sum to 1
        Sample.of(randn(3, 4), uniform(0, 1, 3, 4), uniform(0.5, 2, 4), label_smoothing=0.1),
        Sample.of(randn(4), uniform(0, 1, 4), reduction="none"),
        Sample.of(randn(2, 3, 2, 2), uniform(0, 1, 2, 3, 2, 2), reduction="none", label_smoothing=0.5),
    )),
    "cross_entropy_grad": Oracle(torch_cross_entropy_grad, extra=(
        Sample.of(randn(3, 4) * 30, np.array([1, 0, 3]), randn()),
        Sample.of(randn(3, 4), np.array([1, -100, 3]), randn(3), reduction="none", label_smoothing=0.25),
        Sample.of(randn(2, 3, 2), np.array([[0, 2], [-100, 1]]), randn(), uniform(0.5, 2, 3), label_smoothing=0.4),
        Sample.of(randn(3, 4), np.array([1, 2, 3]), randn(), ignore_index=2, reduction="sum", label_smoothing=1.0),
        # no weight, no smoothing (the rule's sums of the one-hot target taken from the targets that count alone)
        Sample.of(randn(4, 5), np.array([1, -100, 3, 0]), randn()),
        Sample.of(randn(2, 3, 2), np.array([[0, -100], [2, 1]]), randn(), reduction="sum"),
        Sample.of(randn(2, 3, 2), np.array([[0, -100], [2, 1]]), randn(2, 2), reduction="none"),
        Sample.of(randn(5), np.array(2), randn()),
        # (Every target ignored is cross_entropy's case above: here torch's third derivatives are nan or 0 by
        # accident of how its backward divides by 0.)
    )),
    "mse_loss": Oracle(_broadcast(TF.mse_loss), extra=(
        Sample.of(randn(3, 1), randn(1, 4)),
        Sample.of(randn(), randn(2, 3), reduction="none"),
        Sample.of(randn(2, 3), randn(), reduction="sum"),
    )),
    "l1_loss": Oracle(_broadcast(TF.l1_loss), extra=(
        Sample.of(randn(3, 1), randn(1, 4)),
        Sample.of(randn(), randn(2, 3), reduction="none"),
    )),
    "huber_loss": Oracle(_broadcast(TF.huber_loss), extra=(
        Sample.of(randn(3, 1) * 3, randn(1, 4), delta=2.0),
        Sample.of(randn(2, 3) * 3, randn(), reduction="sum", delta=0.1),
    )),
    "kl_div": Oracle(torch_kl_div, extra=(
        Sample.of(randn(3, 4), uniform(0.1, 1, 3, 4)),
        Sample.of(randn(4), uniform(0.1, 1, 2, 4), reduction="batchmean"),  # divides by x's first dim: 4
        Sample.of(randn(3, 1), randn(3, 4), reduction="none", log_target=True),
        Sample.of(randn(2, 3), np.array([0.0, 0.5, 1.0]), reduction="sum"),  # target 0: its gradient is nan
    )),
    "binary_cross_entropy": Oracle(torch_bce, extra=(
        Sample.of(uniform(0.01, 0.99, 2, 3), uniform(0, 1, 2, 3), uniform(0.5, 2, 2, 1), reduction="none"),
        Sample.of(uniform(0.01, 0.99, 4), np.array([0.0, 1.0, 1.0, 0.0])),
    )),
    "binary_cross_entropy_with_logits": Oracle(torch_bce_with_logits, extra=(
        Sample.of(np.array([-60.0, -20.0, -1.0, 0.0, 1.0, 20.0, 60.0]), uniform(0, 1, 7), reduction="none"),
        Sample.of(randn(2, 3), uniform(0, 1, 2, 3), None, uniform(0.5, 2.0, 3), reduction="none"),
        Sample.of(randn(4), np.array([0.0, 1.0, 1.0, 0.0]), None, uniform(0.5, 2.0, 4)),
        Sample.of(randn(3, 2), uniform(0, 1, 3, 2), None, uniform(0.5, 2.0, 3, 1), reduction="sum"),
        Sample.of(randn(3, 2), uniform(0, 1, 3, 2), uniform(0.5, 2.0, 2)),
        Sample.of(randn(3, 2), uniform(0, 1, 3, 2), uniform(0.5, 2.0, 3, 1), uniform(0.5, 2.0, 2), reduction="none"),
    )),
    "cosine_embedding_loss": Oracle(lambda x1, x2, t, **attrs: TF.cosine_embedding_loss(x1, x2, t, **attrs), extra=(
        Sample.of(randn(5, 3), randn(5, 3), np.array([1, -1, 0, -1, 1]), margin=-0.3),  # target 0: no loss
        Sample.of(randn(3), np.zeros(3), np.array(-1), margin=-0.5),  # a zero vector: cos 0, no nan
        Sample.of(randn(2, 4), randn(2, 4), np.array([-1, -1], np.int32), margin=0.99, reduction="none"),
    )),
    "margin_ranking_loss": Oracle(lambda x1, x2, t, **attrs: TF.margin_ranking_loss(x1, x2, t, **attrs), extra=(
        Sample.of(randn(3, 1), randn(1, 4), np.where(randn(3, 4) > 0, 1.0, -1.0), reduction="none"),
        Sample.of(randn(4), randn(4), np.array([1, -1, -1, 1]), margin=0.2),
    )),
    "triplet_margin_loss": Oracle(lambda a, pos, neg, **attrs: TF.triplet_margin_loss(a, pos, neg, **attrs), extra=(
        Sample.of(randn(4, 3), randn(4, 3), randn(4, 3), swap=True, margin=3.0, reduction="none"),
        Sample.of(randn(1, 3), randn(4, 3), randn(4, 3), p=2.5, margin=2.0, reduction="sum"),
        Sample.of(randn(2, 2, 3), randn(2, 2, 3), randn(2, 2, 3), margin=1.5),
    )),
    # -- normalisation -----------------------------------------------------------------------------------------------
    "layer_norm": Oracle(torch_layer_norm, extra=(
        Sample.of(randn(2, 2, 2, 3), randn(2, 3), None, normalized_shape=[2, 3]),
        Sample.of(randn(3, 5) * 10 + 4, randn(5), randn(5), normalized_shape=[5], eps=1e-3),
        Sample.of(randn(2, 3), None, None, normalized_shape=[2, 3]),
    )),
    "batch_norm_with_stats": Oracle(torch_batch_norm, outputs=3, extra=(
        Sample.of(randn(3, 2, 4), randn(2), uniform(0.5, 2, 2), randn(2), randn(2), training=True, momentum=0.0),
        Sample.of(randn(3, 2, 4), randn(2), uniform(0.5, 2, 2), None, randn(2), training=True, momentum=1.0),
        Sample.of(randn(2, 3, 2, 2), None, None, None, None, training=True, eps=0.01),
        Sample.of(randn(2, 3, 2, 2), randn(3), uniform(0.5, 2, 3), randn(3), None),
    )),
    "dropout_with_mask": Oracle(lambda x, p, training: TF.dropout(x, p=p, training=training), extra=(
        Sample.of(randn(2, 3), p=0.9, training=False),
    )),
    "embedding": Oracle(lambda i, w, padding_idx: TF.embedding(i, w, padding_idx=padding_idx), extra=(
        Sample.of(np.array([[1, 3], [1, 0]]), randn(4, 3), padding_idx=1),  # the padding row gets no gradient
        Sample.of(np.array([2, 0, 2], np.int32), randn(3, 2), padding_idx=-1),
        Sample.of(np.array([[0, 0, 0]]), randn(2, 2)),  # one row picked thrice: gradients add up
    )),
    "embedding_grad": Oracle(torch_embedding_grad, extra=(
        Sample.of(randn(2, 2, 3), np.array([[1, 3], [1, 0]]), num_embeddings=4, padding_idx=-3),
        Sample.of(randn(3, 2), np.array([2, 0, 2], np.int32), num_embeddings=3),
    )),
    "embedding_rows": Oracle(torch_embedding_rows, extra=(
        Sample.of(np.array([[1, 3], [6, 0]]), randn(3, 2), num_embeddings=7, start=1, padding_idx=2),  # not looked up
    )),
    # -- attention ---------------------------------------------------------------------------------------------------
    "dot_product_attention": Oracle(
        lambda q, k, v, m, is_causal, scale: TF.scaled_dot_product_attention(
            q, k, v, attn_mask=m, is_causal=is_causal, scale=scale),
        extra=(
            Sample.of(randn(2, 2, 3, 4), randn(2, 2, 5, 4), randn(2, 2, 5, 3), _mask((3, 5), 0.6, 1)),
            Sample.of(randn(3, 2), randn(4, 2), randn(4, 2), _NEG_INF_MASK),
            Sample.of(randn(2, 1, 4, 3), randn(1, 3, 2, 3), randn(1, 3, 2, 2), is_causal=True),  # L > S
            Sample.of(randn(2, 2, 3), randn(5, 3), randn(5, 2), randn(2, 1, 5), scale=2.0),
        )),
}


def test_table_covers_every_nn_op_and_loss():
    def defined_in(module):
        return {op.name for op in of.registry
                if op.defined_at.replace("\\", "/").split(":")[0].endswith(f"ops/{module}.py")}

    nn_ops = defined_in("nn") | defined_in("loss")
    nn_ops |= {"layer_norm", "batch_norm_with_stats"}  # ops/normalization.py; its others: test_oracle_normalization.py
    assert len(nn_ops) >= 25
    covered = set(ORACLE) | set(BASE_ORACLE)  # MXNet's smooth_l1 sits with the elementwise ops' table
    assert nn_ops <= covered, f"no oracle for {sorted(nn_ops - covered)}"


# -- cases ---------------------------------------------------------------------------------------------------------


def _declared_samples(name: str) -> list:
    opdef = of.registry.get(name)
    return list(opdef.samples_fn(np.random.default_rng(0)))


def _bind(name: str, sample: Sample, output: int) -> tuple[Callable, Callable, list]:
    """(opforge fn, torch fn, arrays): the fns take the sample's present tensors positionally, put back the absent
    ones (None), add the attrs (torch gets the signature's defaults too) and return the one output compared."""
    opdef = of.registry.get(name)
    attrs = {**{p.name: p.default for p in opdef.attrs if p.has_default}, **sample.kwargs}
    given = [*sample.args, *[None] * (len(opdef.inputs) - len(sample.args))]  # omitted trailing inputs: None
    present = [i for i, a in enumerate(given) if a is not None]

    def call(fn, kwargs, several):
        def bound(*xs):
            args = list(given)
            for i, x in zip(present, xs):
                args[i] = x
            out = call_op(opdef, args, kwargs) if fn is opdef.fn else fn(*args, **kwargs)
            return out[output] if several else out

        return bound

    of_fn = call(getattr(F, name), sample.kwargs, len(opdef.outputs) > 1)  # dropout's mask: a dedicated test
    torch_fn = call(ORACLE[name].torch_fn, attrs, ORACLE[name].outputs > 1)
    return of_fn, torch_fn, [given[i] for i in present]


def _case_id(name: str, i: int, output: int, sample: Sample) -> str:
    shapes = "x".join("-" if a is None else str(a.shape).replace(" ", "") for a in sample.args)
    attrs = "".join(f",{k}={v}" for k, v in sample.kwargs.items()).replace(" ", "")
    return f"{name}-{i}{f'.out{output}' if ORACLE[name].outputs > 1 else ''}[{shapes}{attrs}]"


def _params() -> list:
    params = []
    for name, oracle in ORACLE.items():
        for i, case in enumerate([*_declared_samples(name), *oracle.extra]):
            floats = [a for a in case.args if a is not None and a.dtype.kind == "f"]
            assert floats and all(a.dtype == np.float64 for a in floats), f"{name}: cases are float64"
            # kl_div's target gradient at target 0 is log(0) + 0/0 = nan, as torch's: NumPy says so, and may.
            quiet = () if name != "kl_div" else pytest.mark.filterwarnings("ignore:divide by zero", "ignore:invalid")
            for output in range(oracle.outputs):
                params.append(pytest.param(name, case, output, id=_case_id(name, i, output, case), marks=quiet))
    return params


CASES = _params()


@pytest.mark.parametrize(("name", "sample", "output"), CASES)
def test_forward(name, sample, output):
    check_forward(*_bind(name, sample, output))


@pytest.mark.parametrize(("name", "sample", "output"), CASES)
def test_vjp(name, sample, output):
    check_vjp(*_bind(name, sample, output))


@pytest.mark.parametrize(("name", "sample", "output"), CASES)
def test_hvp(name, sample, output):
    check_hvp(*_bind(name, sample, output))


# -- where the oracle is a formula: the formula against torch's own function ---------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weights", ["weight", "pos_weight", "both"])
def test_bce_weights_formula_is_torchs(reduction, weights):
    x, y = randn(3, 4) * 5, uniform(0, 1, 3, 4)
    w = uniform(0.2, 3.0, 3, 1) if weights != "pos_weight" else None
    pw = uniform(0.2, 3.0, 4) if weights != "weight" else None
    tw, tpw = (None if a is None else torch.tensor(a) for a in (w, pw))
    want = TF.binary_cross_entropy_with_logits(torch.tensor(x), torch.tensor(y), tw, pos_weight=tpw,
                                               reduction=reduction)
    formula = torch_bce_with_logits(torch.tensor(x), torch.tensor(y), tw, tpw, reduction)
    got = F.binary_cross_entropy_with_logits(of.tensor(x), of.tensor(y), w, pos_weight=pw, reduction=reduction)
    assert_same(TORCH.numpy(formula), TORCH.numpy(want), "the formula")
    assert_same(got.numpy(), TORCH.numpy(want), "opforge")


def _batch_norm_cases():
    return [c for c in [*_declared_samples("batch_norm_with_stats"), *ORACLE["batch_norm_with_stats"].extra]]


@pytest.mark.parametrize("sample", _batch_norm_cases())
def test_batch_norm_matches_torch_functional(sample):
    # torch.nn.functional.batch_norm itself: y, and the running statistics it updates in place (training), which
    # the op batch_norm_with_stats returns as new_running_mean / new_running_var instead (F.batch_norm writes them
    # in place: tests/test_torch_semantics.py). Without running statistics the op returns the batch mean and
    # unbiased variance (the update with momentum 1).
    args = [*sample.args, *[None] * (5 - len(sample.args))]
    x, rm, rv, w, b = (None if a is None else torch.tensor(a) for a in args)
    attrs = {"training": False, "momentum": 0.1, "eps": 1e-5, **sample.kwargs}
    rm_t, rv_t = (None, None) if rm is None else (rm.clone(), rv.clone())
    y = TF.batch_norm(x, rm_t, rv_t, w, b, **attrs)
    got = F.batch_norm_with_stats(*(None if a is None else of.tensor(a) for a in args), **sample.kwargs)
    assert_same(got.y.numpy(), y.numpy(), "y")
    if rm is None:
        rm_t, rv_t = x.mean(_bn_axes(x)), x.var(_bn_axes(x), unbiased=True)
    assert_same(got.new_running_mean.numpy(), rm_t.numpy(), "new_running_mean")
    assert_same(got.new_running_var.numpy(), rv_t.numpy(), "new_running_var")
    if rm is not None:
        np.testing.assert_array_equal(sample.args[1], rm.numpy())  # opforge's inputs are left alone


# -- dropout with p > 0 --------------------------------------------------------------------------------------------


def test_dropout_backward_uses_the_forward_mask():
    x = of.tensor(randn(40, 50), requires_grad=True)
    of.manual_seed(7)
    y, mask = F.dropout_with_mask(x, p=0.3)
    m = mask.numpy()
    assert m.dtype == np.bool_ and 0.6 < m.mean() < 0.8  # about 70% kept
    np.testing.assert_allclose(y.numpy(), np.where(m, x.numpy() / 0.7, 0.0), rtol=1e-15)
    of.randn(100)  # draws between forward and backward change nothing
    u = randn(40, 50)
    (g,) = of.grad([y], [x], grad_outputs=[of.tensor(u)], create_graph=True)
    np.testing.assert_allclose(g.numpy(), np.where(m, u / 0.7, 0.0), rtol=1e-15)
    # Double backward: the gradient is linear in the cotangent, through the same mask.
    ut = of.tensor(u, requires_grad=True)
    (g,) = of.grad([y], [x], grad_outputs=[ut], create_graph=True)
    w = randn(40, 50)
    (gu,) = of.grad([(g * of.tensor(w)).sum()], [ut])
    np.testing.assert_allclose(gu.numpy(), np.where(m, w / 0.7, 0.0), rtol=1e-15)


def test_dropout_is_reproduced_by_manual_seed():
    x = of.tensor(randn(8, 9))
    of.manual_seed(3)
    first = F.dropout_with_mask(x, p=0.5)
    again = F.dropout_with_mask(x, p=0.5)
    of.manual_seed(3)
    replay = F.dropout_with_mask(x, p=0.5)
    np.testing.assert_array_equal(first.mask.numpy(), replay.mask.numpy())
    np.testing.assert_array_equal(first.y.numpy(), replay.y.numpy())
    assert not np.array_equal(first.mask.numpy(), again.mask.numpy())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dropout_edge_probabilities(dtype):
    x = of.tensor(randn(5, 6).astype(dtype), requires_grad=True)
    y, mask = F.dropout_with_mask(x, p=1.0)  # torch gives zeros (not 0·inf), and a zero gradient
    assert y.dtype == dtype and not mask.numpy().any() and not y.numpy().any()
    (g,) = of.grad([y.sum()], [x])
    assert not g.numpy().any()
    for kwargs in ({"p": 0.0}, {"p": 0.7, "training": False}):  # the identity: nothing dropped, nothing scaled
        y, mask = F.dropout_with_mask(x, **kwargs)
        assert mask.numpy().all()
        np.testing.assert_array_equal(y.numpy(), x.numpy())
        np.testing.assert_array_equal(of.grad([y.sum()], [x])[0].numpy(), np.ones((5, 6), dtype))


# -- the fused and in-place kernels equal the plain computation -----------------------------------------------------


def _plain_softmax(x, axis):
    # exp(x − c)·(1/Σ): c = 0 in groups where Σ exp(x) is finite and ≥ 1, else the group's max (as the kernel)
    s = np.sum(np.exp(x), axis=axis, keepdims=True)
    c = np.where((s >= 1) & (s < np.inf), 0, np.max(x, axis=axis, keepdims=True))
    e = np.exp(x - c)
    return e * (1 / np.sum(e, axis=axis, keepdims=True))  # one reciprocal per row, as the kernel (and torch)


def _plain_log_softmax(x, axis):
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("shape", "axis"), [((64, 100), -1), ((3, 5, 4), 1), ((6,), 0)])
def test_softmax_kernels_equal_the_plain_formulas(shape, axis, dtype):
    # The kernels work in place in one buffer and sum rows with einsum or vecdot: the textbook formulas' values,
    # summed in another order (bit for bit where the axis is not the last, and np.add.reduce sums as np.sum).
    rng = np.random.default_rng(8)
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    y, logp = _plain_softmax(x, axis), _plain_log_softmax(x, axis)
    got = [F.softmax(of.tensor(x), axis=axis), F.log_softmax(of.tensor(x), axis=axis),
           F.softmax_grad(of.tensor(y), of.tensor(dy), axis=axis),
           F.log_softmax_grad(of.tensor(logp), of.tensor(dy), axis=axis)]
    want = [y, logp, y * (dy - np.sum(dy * y, axis=axis, keepdims=True)),
            dy - np.exp(logp) * np.sum(dy, axis=axis, keepdims=True)]
    for g, w in zip(got, want):
        assert g.dtype == dtype
        if axis % len(shape) != len(shape) - 1:
            np.testing.assert_array_equal(g.numpy(), w)
        # a row sum's rounding (~n·eps·max|term|) scaled by a probability: a few 1e-7 in float32 at 100 columns
        np.testing.assert_allclose(g.numpy(), w, rtol=2e-6 if dtype == np.float32 else 1e-14,
                                   atol=5e-7 if dtype == np.float32 else 1e-15)


def _hostile_logits(dtype):
    """Rows where exp(x) is safe, overflows, underflows entirely, holds −inf (a mask), is all −inf, holds nan or
    +inf, and values large enough that x − max and log Σ exp(x) − x[t] would round differently."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((10, 6)).astype(dtype)
    x[1] *= 200  # exp overflows: the row's max is subtracted
    x[2] = -120 - abs(x[2])  # every exp under the smallest normal (all 0 in float32)
    x[3, :3] = -np.inf
    x[4] = -np.inf
    x[5, 2] = np.nan
    x[6, 4] = np.inf
    x[7] += 60  # large but finite exps, one term dominating the loss
    x[8] = -10 + x[8] * 0.1  # Σ exp(x) under 1: the max is subtracted
    return x


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract")  # the all −inf row: nan, as torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_and_cross_entropy_on_hostile_rows_match_torch(dtype):
    # The kernels skip the max where Σ exp(x) is finite and ≥ 1 and subtract it in the other rows: every row gives
    # torch's value (nan where torch gives nan), each row the same alone as among the others.
    x = _hostile_logits(dtype)
    target = np.array([0, 1, 2, 4, 0, 1, 3, 5, 2, 0])
    tx = torch.from_numpy(x)
    # exp(x − max) of a rounded difference near −300 differs from torch's in the 13th digit (float64)
    tol = {"rtol": 2e-6, "atol": 1e-30} if dtype == np.float32 else {"rtol": 1e-13, "atol": 1e-300}
    np.testing.assert_allclose(F.softmax(of.tensor(x), axis=-1).numpy(), torch.softmax(tx, -1).numpy(), **tol)
    losses = F.cross_entropy(of.tensor(x), of.tensor(target), reduction="none").numpy()
    want = torch.nn.functional.cross_entropy(tx, torch.from_numpy(target), reduction="none").numpy()
    np.testing.assert_allclose(losses, want, **tol)
    ox = of.tensor(x, requires_grad=True)
    (g,) = of.grad(F.cross_entropy(ox, of.tensor(target), reduction="sum"), [ox])
    tx.requires_grad_()
    (tg,) = torch.autograd.grad(torch.nn.functional.cross_entropy(tx, torch.from_numpy(target), reduction="sum"), [tx])
    np.testing.assert_allclose(g.numpy(), tg.numpy(), **tol)
    for i in range(len(x)):  # a row alone: the same bits as among the others
        np.testing.assert_array_equal(F.softmax(of.tensor(x[i:i + 1]), axis=-1).numpy(),
                                      F.softmax(of.tensor(x), axis=-1).numpy()[i:i + 1])
        np.testing.assert_array_equal(
            F.cross_entropy(of.tensor(x[i:i + 1]), of.tensor(target[i:i + 1]), reduction="none").numpy(),
            losses[i:i + 1])


def test_softmax_without_the_max_is_as_accurate_as_torch():
    # exp(x) needs no max where nothing overflows, and is then at least as accurate as exp(x − max) of the rounded
    # difference: measured against float64, over logits of growing size.
    rng = np.random.default_rng(13)
    for scale in (1, 5, 20):
        x = (rng.standard_normal((256, 100)) * scale).astype(np.float32)
        exact = torch.softmax(torch.from_numpy(x.astype(np.float64)), -1).numpy()
        ours = np.abs(F.softmax(of.tensor(x), axis=-1).numpy() / exact - 1).max()
        theirs = np.abs(torch.softmax(torch.from_numpy(x), -1).numpy() / exact - 1).max()
        assert ours <= max(theirs, 4 * np.finfo(np.float32).eps), (scale, ours, theirs)
        # the loss at large, confident logits: log(Σ e / e[t]) keeps what log Σ e − x[t] would lose to rounding
        t = x.argmax(1)
        exact_loss = torch.nn.functional.cross_entropy(torch.from_numpy(x.astype(np.float64) + 40),
                                                       torch.from_numpy(t), reduction="none").numpy()
        loss = F.cross_entropy(of.tensor(x + 40), of.tensor(t), reduction="none").numpy()
        np.testing.assert_allclose(loss, exact_loss, rtol=1e-5, atol=2e-7)


@pytest.mark.parametrize("shape", [(128, 10), (1000, 3), (64, 1000), (40, 31), (40, 32), (8, 5), (16, 1), (4, 20, 7),
                                   (0, 5), (20, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_max_last_equals_numpys_row_max(shape, dtype):
    # max_last takes other routes than np.maximum.reduce (a transposed copy, reduceat): the same values, nan and
    # -inf included, for every layout; a strided view takes NumPy's own route.
    from opforge.ops._common import max_last

    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(dtype)
    if x.size:
        x.reshape(-1)[rng.integers(0, x.size, 3)] = [np.nan, -np.inf, np.inf]
    for a in (x, x[..., ::-1], np.asfortranarray(x)):
        got = max_last(a)
        want = np.maximum.reduce(a, axis=-1, keepdims=True, initial=-np.inf)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_row_buffers_restores_numpys_buffer_size():
    from opforge.ops._common import row_buffers

    before = np.getbufsize()
    with row_buffers(1000):
        assert np.getbufsize() == 1008  # under two rows, a multiple of 16 as NumPy asks
    assert np.getbufsize() == before
    with pytest.raises(ZeroDivisionError), row_buffers(2000):
        1 / 0
    assert np.getbufsize() == before
    with row_buffers(10):  # short rows keep NumPy's buffer (its buffering pays there)
        assert np.getbufsize() == before
    with np.errstate(divide="raise"):  # the user's other ufunc settings hold inside, and come back after
        with row_buffers(1000):
            assert np.getbufsize() == 1008 and np.geterr()["divide"] == "raise"
        assert np.getbufsize() == before and np.geterr()["divide"] == "raise"


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize(("shape", "attrs"), [
    ((128, 10), {}), ((64, 1000), {"label_smoothing": 0.1}), ((16, 7), {"reduction": "sum", "ignore_index": 2}),
    ((4, 5, 3), {"reduction": "none"}), ((20, 6), {"weighted": True, "label_smoothing": 0.2}), ((5,), {})])
def test_cross_entropy_backward_from_the_forward_residuals_is_bit_for_bit_the_recomputed_one(shape, attrs, dtype):
    # A recorded cross_entropy keeps exp(logits − max) and its row sums; its backward pass then skips max, subtract,
    # exp and sum. The same arithmetic on the same values: equal to cross_entropy_grad from the logits alone.
    rng = np.random.default_rng(5)
    attrs = dict(attrs)
    weight = of.tensor(rng.uniform(0.5, 2, shape[1 if len(shape) > 1 else 0]).astype(dtype)) \
        if attrs.pop("weighted", False) else None
    x = rng.standard_normal(shape).astype(dtype)
    samples = shape[:1] + shape[2:] if len(shape) > 1 else ()
    target = of.tensor(rng.integers(0, shape[1 if len(shape) > 1 else 0], samples))
    logits = of.tensor(x, requires_grad=True)
    loss = F.cross_entropy(logits, target, weight, **attrs)
    assert loss._node.residuals is not None and set(loss._node.residuals) == {"exp_rows", "row_sums"}
    dloss = of.tensor(rng.standard_normal(loss.shape).astype(dtype))
    (got,) = of.grad(loss, [logits], grad_outputs=dloss)
    assert loss._node.residuals is None  # freed with the graph
    want = F.cross_entropy_grad(of.tensor(x), target, dloss, weight, **attrs)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_second_derivative_without_weight_or_smoothing_makes_no_one_hot_target(reduction):
    # The Hessian-vector product's backward through cross_entropy_grad needs the one-hot target only through its
    # sums (per sample, and over all for "mean"): those come from target != ignore_index, no scatter of the classes.
    rng = np.random.default_rng(12)
    x, v, r = rng.standard_normal((6, 5)), rng.standard_normal((6, 5)), rng.standard_normal(6)
    target = np.array([1, -100, 3, 0, 4, -100])

    def hvp(x, t, v):
        loss = F.cross_entropy(x, t, reduction=reduction)
        (g,) = of.grad(F.sum(loss * of.tensor(r)) if reduction == "none" else loss, [x], create_graph=True)
        return of.grad(F.sum(g * v), [x])[0]

    compiled = of.compile(hvp)
    got = compiled(of.tensor(x, requires_grad=True), of.tensor(target), of.tensor(v)).numpy()
    ((entry,),) = compiled.cache.values()
    assert "nll_loss_grad(" not in str(entry.program), entry.program
    tx = torch.tensor(x, requires_grad=True)
    loss = TF.cross_entropy(tx, torch.tensor(target), reduction=reduction)
    (tg,) = torch.autograd.grad((loss * torch.tensor(r)).sum() if reduction == "none" else loss, tx, create_graph=True)
    (want,) = torch.autograd.grad((tg * torch.tensor(v)).sum(), tx)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-15)
    eager = hvp(of.tensor(x, requires_grad=True), of.tensor(target), of.tensor(v)).numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-13, atol=1e-16)  # (compiled: native softmax rows, another order)


def test_cross_entropy_grad_refuses_residuals_that_do_not_fit():
    x = of.tensor(np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32))
    target, dloss = of.tensor(np.array([0, 1, 2, 3])), of.tensor(np.float32(1.0))
    with pytest.raises(of.ArgumentError, match=r"exp_rows and row_sums come together.*exp_rows alone"):
        F.cross_entropy_grad(x, target, dloss, None, of.tensor(np.ones((4, 5), np.float32)))
    with pytest.raises(of.ShapeError, match=r"must have shapes \(4, 5\) and \(4,\).*got \(4, 4\) and \(4,\)"):
        F.cross_entropy_grad(x, target, dloss, None, of.tensor(np.ones((4, 4), np.float32)),
                             of.tensor(np.ones(4, np.float32)))


def _composite_cross_entropy(x, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """cross_entropy from log_softmax and nll_loss, as torch composes it: the unfused path, in ops."""
    logp = F.log_softmax(x, axis=1 if x.ndim > 1 else 0)
    nll = F.nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if not label_smoothing:
        return nll
    w = 1.0 if weight is None else F.reshape(weight, shape=[-1, *[1] * (x.ndim - 2)])
    counted = F.cast(target != ignore_index, dtype=x.dtype)
    smooth = -F.sum(logp * w, axis=[1 if x.ndim > 1 else 0]) * counted
    if reduction == "sum":
        smooth = F.sum(smooth)
    elif reduction == "mean":
        hot = F.nll_loss(F.ones_like(x), target, weight, ignore_index=ignore_index, reduction="sum")
        smooth = F.sum(smooth) / -hot
    return nll * (1 - label_smoothing) + smooth * (label_smoothing / x.shape[1 if x.ndim > 1 else 0])


_CE_CASES = [
    ({}, (64, 10)),
    ({}, (7, 1000)),
    ({"reduction": "sum"}, (5, 4, 3)),
    ({"reduction": "none", "ignore_index": 2}, (6, 5)),
    ({"label_smoothing": 0.2}, (6, 5)),
    ({"weighted": True, "label_smoothing": 0.1, "ignore": 2}, (6, 5)),
    ({"weighted": True, "reduction": "none"}, (3, 5, 2)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("attrs", "shape"), _CE_CASES, ids=[str(c) for c in _CE_CASES])
def test_fused_cross_entropy_equals_log_softmax_then_nll_loss(attrs, shape, dtype):
    rng = np.random.default_rng(9)
    attrs = dict(attrs)
    weight = of.tensor(rng.uniform(0.5, 2, shape[1]).astype(dtype)) if attrs.pop("weighted", False) else None
    target = rng.integers(0, shape[1], (shape[0], *shape[2:]))
    target.reshape(-1)[:attrs.pop("ignore", 0)] = -100
    x = of.tensor(rng.standard_normal(shape).astype(dtype) * 3, requires_grad=True)
    fused = F.cross_entropy(x, of.tensor(target), weight, **attrs)
    plain = _composite_cross_entropy(x, of.tensor(target), weight, **attrs)
    u = of.tensor(rng.standard_normal(fused.shape).astype(dtype))
    (g_fused,), (g_plain,) = of.grad(fused, [x], grad_outputs=u), of.grad(plain, [x], grad_outputs=u)
    # Without smoothing the fused loss is log(Σ e / e[t]) with e = exp(x) (no max subtracted where nothing can
    # overflow), the composite one log Σ exp(x − max) − (x[t] − max): equal up to rounding.
    rtol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(fused.numpy(), plain.numpy(), rtol=rtol, atol=rtol)
    # The gradient is s·(softmax − target) in one pass: the same value, computed in another order.
    np.testing.assert_allclose(g_fused.numpy(), g_plain.numpy(), rtol=rtol, atol=rtol * 1e-2)


def test_in_place_kernels_in_a_program_give_eager_bits():
    # Compiled, softmax writes into its dying input's buffer and cross_entropy_grad into the logits': the out= path
    # must give what the eager, allocating path gives, bit for bit. Native code off: with it on, both run as row
    # loops (opforge.program.native), which sum each row in another order (tests/test_native.py compares those).
    from opforge.program import Executor, append_backward, trace

    rng = np.random.default_rng(10)
    x, target = rng.standard_normal((16, 7)).astype(np.float32), rng.integers(0, 7, 16)
    x[0] *= 60  # rows whose exp overflows or is all tiny: the kernels subtract their max (see _exp_sums)
    x[1] = -50 - abs(x[1])

    def fn(x, t):
        logits = x * 2.0
        return {"loss": F.cross_entropy(logits, t), "probs": F.softmax(x * 3.0)}

    prog = trace(fn, x=of.Spec((16, 7), "float32"), t=of.Spec((16,), "int64"))
    grads = append_backward(prog, prog.outputs["loss"], wrt=["x"])
    exe = Executor(prog, fetch={**prog.outputs, "dx": grads["x@GRAD"]}, native=False)
    got = exe.run(x=x, t=target)
    plan = exe.plan(x=x, t=target)
    lines = plan.source.splitlines()
    in_place = {plan.line_ops[i].split()[2] for i in plan.line_ops if "out=" in lines[i - 1]}
    assert {"softmax", "cross_entropy_grad"} <= in_place, plan.source
    ox = of.tensor(x, requires_grad=True)
    loss = F.cross_entropy(ox * 2.0, of.tensor(target))
    np.testing.assert_array_equal(got["loss"], loss.numpy())
    np.testing.assert_array_equal(got["probs"], F.softmax(of.tensor(x) * 3.0).numpy())
    np.testing.assert_array_equal(got["dx"], of.grad(loss, [ox])[0].numpy())


_ROWS_OF_3 = {  # name -> (loss of (x, second input), the second input for a batch of n rows of 3)
    "mse_loss": (F.mse_loss, lambda rng, n: rng.standard_normal((n, 3))),
    "l1_loss": (F.l1_loss, lambda rng, n: rng.standard_normal((n, 3))),
    "huber_loss": (lambda x, y: F.huber_loss(x, y, delta=0.5), lambda rng, n: rng.standard_normal((n, 3))),
    "kl_div": (lambda x, y: F.kl_div(x, y, reduction="batchmean"), lambda rng, n: rng.uniform(0.1, 1, (n, 3))),
    "binary_cross_entropy_with_logits": (F.binary_cross_entropy_with_logits, lambda rng, n: rng.uniform(0, 1, (n, 3))),
    "cross_entropy (classes)": (F.cross_entropy, lambda rng, n: rng.integers(0, 3, n)),
    "cross_entropy (probabilities)": (lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1),
                                      lambda rng, n: rng.uniform(0, 1, (n, 3))),
    "triplet_margin_loss": (lambda x, y: F.triplet_margin_loss(x, y, x * 0.5),
                            lambda rng, n: rng.standard_normal((n, 3))),
    "cosine_embedding_loss": (lambda x, y: F.cosine_embedding_loss(x, x * 2.0 + 1.0, y),
                              lambda rng, n: rng.choice([-1, 1], n)),
}


@pytest.mark.parametrize("name", list(_ROWS_OF_3))
def test_mean_losses_compile_with_the_batch_size_unknown(name):
    # "mean" divides by a count that a program traced for (None, 3) learns only when it runs: the gradients must
    # still be eager mode's, for every batch size fed.
    loss_fn, second = _ROWS_OF_3[name]
    rng = np.random.default_rng(11)
    y0 = second(rng, 2)
    prog = of.trace(lambda x, y: {"loss": loss_fn(x, y)}, x=of.Spec((None, 3), "float64"),
                    y=of.Spec((None, *y0.shape[1:]), y0.dtype))
    grads = of.append_backward(prog, prog.outputs["loss"], wrt=["x"])
    exe = of.Executor(prog, fetch={"loss": prog.outputs["loss"], "dx": grads["x@GRAD"]})
    for n in (2, 5):
        x, y = rng.standard_normal((n, 3)), second(rng, n)
        got = exe.run(x=x, y=y)
        ox = of.tensor(x, requires_grad=True)
        loss = loss_fn(ox, of.tensor(y))
        np.testing.assert_allclose(got["loss"], loss.numpy(), rtol=1e-12)
        np.testing.assert_allclose(got["dx"], of.grad(loss, [ox])[0].numpy(), rtol=1e-12, atol=1e-15)


# -- higher orders and special values -------------------------------------------------------------------------------


@pytest.mark.parametrize(("of_fn", "torch_fn"), [
    pytest.param(lambda x: F.softmax(x, axis=1), lambda x: TF.softmax(x, dim=1), id="softmax"),
    pytest.param(lambda x: F.log_softmax(x, axis=1), lambda x: TF.log_softmax(x, dim=1), id="log_softmax"),
])
def test_softmax_third_derivative(of_fn, torch_fn):
    # softmax -> softmax_grad -> its own gradient (softmax_grad again and a product) -> differentiated once more.
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4))
    cotangents = [rng.standard_normal((2, 4)) for _ in range(3)]
    for order in (1, 2, 3):
        got = directional_derivative(OPFORGE, of_fn, x, cotangents[:order])
        want = directional_derivative(TORCH, torch_fn, x, cotangents[:order])
        assert_same(got, want, f"derivative of order {order}")


def test_losses_with_every_target_ignored_are_nan_as_torch():
    x, t = randn(3, 4), np.full(3, -100)
    for of_fn, torch_fn in ((F.cross_entropy, TF.cross_entropy), (F.nll_loss, TF.nll_loss)):
        got = of_fn(of.tensor(x), of.tensor(t)).numpy()
        want = torch_fn(torch.tensor(x), torch.tensor(t)).numpy()
        assert np.isnan(got) and np.isnan(want)
        assert_same(of_fn(of.tensor(x), of.tensor(t), reduction="sum").numpy(),
                    torch_fn(torch.tensor(x), torch.tensor(t), reduction="sum").numpy(), "sum")


def test_float32_stays_float32():
    x32 = randn(4, 5).astype(np.float32)
    t = np.array([0, 4, 1, 2])
    assert F.cross_entropy(of.tensor(x32), of.tensor(t), label_smoothing=0.1).dtype == np.float32
    assert F.softmax(of.tensor(x32)).dtype == np.float32
    assert F.layer_norm(of.tensor(x32), normalized_shape=[5]).dtype == np.float32
    y, rm, rv = F.batch_norm_with_stats(of.tensor(x32), None, None, training=True)
    assert y.dtype == rm.dtype == rv.dtype == np.float32
    want = TF.cross_entropy(torch.tensor(x32), torch.tensor(t), label_smoothing=0.1)
    np.testing.assert_allclose(F.cross_entropy(of.tensor(x32), of.tensor(t), label_smoothing=0.1).numpy(),
                               want.numpy(), rtol=1e-6)


# -- wrong calls: errors name the op, and come before any kernel work -----------------------------------------------


def _t(*shape, dtype=np.float64):
    return of.tensor(np.zeros(shape, dtype))


_IDX = of.tensor(np.array([0, 1, 2]))

WRONG_CALLS = [
    (lambda: F.softmax(_t(2, 3), axis=2), "softmax(): axis 2 is out of range"),
    (lambda: F.softmax_grad(_t(2, 3), _t(3), axis=-1), "softmax_grad(): y has shape (2, 3) but dy has shape (3,)"),
    (lambda: F.cross_entropy(_t(3, 4), of.tensor(np.array([0, 4, 1]))), "cross_entropy(): target holds class 4"),
    (lambda: F.cross_entropy(_t(3, 4), _IDX, reduction="avg"), "cross_entropy(): argument 'reduction' must be"),
    (lambda: F.cross_entropy(_t(3, 4), _IDX, label_smoothing=1.5), "argument 'label_smoothing' must be in [0, 1]"),
    (lambda: F.cross_entropy(_t(3, 4), of.tensor(np.array([0]))), "cross_entropy(): scores of shape (3, 4) need"),
    (lambda: F.nll_loss(_t(3, 4), of.tensor(np.array([0, -1, 1]))), "nll_loss(): target holds class -1"),
    (lambda: F.nll_loss(_t(2, 3, 4), _IDX), "need a target of shape (2, 4)"),
    (lambda: F.mse_loss(_t(3), _t(4)), "mse_loss(): shapes (3,) and (4,) do not broadcast"),
    (lambda: F.binary_cross_entropy_with_logits(_t(3, 4), _t(4)), "target must have the shape of the input"),
    (lambda: F.binary_cross_entropy_with_logits(_t(3, 4), _t(3, 4), pos_weight=_t(3)), "pos_weight of shape (3,)"),
    (lambda: F.binary_cross_entropy_with_logits(_t(3, 4), _t(3, 4), _t(3)), "weight of shape (3,) must broadcast"),
    (lambda: F.nll_loss(_t(3, 4), _IDX, _t(3)), "nll_loss(): weight must hold one value per class, shape (4,)"),
    (lambda: F.nll_loss_grad(_t(3), _IDX, num_classes=4), "nll_loss_grad(): with reduction='mean' and a target"),
    (lambda: F.nll_loss_grad(_t(3), _IDX, num_classes=4, reduction="none", weight=_t(3)),
     "nll_loss_grad(): weight must hold one value per class, shape (4,)"),
    (lambda: F.cross_entropy(_t(3, 4), _IDX, _t(4, 1)), "cross_entropy(): weight must hold one value per class"),
    (lambda: F.cross_entropy(_t(3, 4), _t(3)), "probability targets (floating) must have the shape of the scores"),
    (lambda: F.cross_entropy(_t(3, 4), _t(3, 4), ignore_index=1), "ignore_index (1) is not supported for probab"),
    (lambda: F.l1_loss(_t(3), _t(4)), "l1_loss(): shapes (3,) and (4,) do not broadcast"),
    (lambda: F.huber_loss(_t(3), _t(3), delta=0.0), "huber_loss(): argument 'delta' must be > 0"),
    (lambda: F.kl_div(_t(3), _t(3), reduction="batch"), "kl_div(): argument 'reduction' must be 'mean', 'sum', "
                                                        "'none' or 'batchmean'"),
    (lambda: F.binary_cross_entropy(_t(3) + 1.5, _t(3)), "binary_cross_entropy(): every element of probs must be"),
    (lambda: F.binary_cross_entropy(_t(3, 4), _t(4)), "binary_cross_entropy(): target must have the shape"),
    (lambda: F.cosine_embedding_loss(_t(3, 4), _t(3, 4), _IDX[:2]), "inputs of shape (3, 4) need a target of shape"),
    (lambda: F.cosine_embedding_loss(_t(4), _t(4), _IDX), "a 1-D target needs 2-D inputs"),
    (lambda: F.margin_ranking_loss(_t(3), _t(3), _t(1, 3)), "x1, x2 and target must have the same number of dims"),
    (lambda: F.triplet_margin_loss(_t(3, 2), _t(3, 2), _t(2)), "must have the same number of dims"),
    (lambda: F.triplet_margin_loss(_t(3, 2), _t(3, 2), _t(3, 2), margin=0.0), "argument 'margin' must be > 0"),
    (lambda: F.layer_norm(_t(3, 4), normalized_shape=[3]), "normalized_shape [3] must be the last dims"),
    (lambda: F.layer_norm(_t(3, 4), [4], _t(1)), "weight must have shape normalized_shape (4,)"),
    (lambda: F.layer_norm(_t(3, 4), normalized_shape=[4], eps=-1.0), "argument 'eps' must be >= 0"),
    (lambda: F.batch_norm(_t(4, 3), None, None), "running_mean and running_var are needed when training=False"),
    (lambda: F.batch_norm(_t(4, 3), _t(3), None, training=True), "give both running_mean and running_var"),
    (lambda: F.batch_norm(_t(4, 3), _t(1), _t(1)), "running_mean must have shape (3,)"),
    (lambda: F.batch_norm(_t(1, 3), None, None, training=True), "more than one value per channel"),
    (lambda: F.batch_norm(_t(4), None, None, training=True), "the input must be (N, C, ...)"),
    (lambda: F.batch_norm(_t(4, 3), _t(3), _t(3), momentum=2.0), "argument 'momentum' must be in [0, 1]"),
    (lambda: F.dropout(_t(3), p=1.5), "dropout(): argument 'p' must be a probability"),
    (lambda: F.embedding(of.tensor(np.array([0, 5])), _t(5, 2)), "embedding(): index holds 5, outside [0, 5)"),
    (lambda: F.embedding(_IDX, _t(5, 2, 2)), "embedding(): weight must be 2-D"),
    (lambda: F.embedding(_IDX, _t(5, 2), padding_idx=5), "padding_idx 5 is out of range for 5 embeddings"),
    (lambda: F.embedding(_t(3), _t(5, 2)), "embedding(): argument 'index' expected dtype int32 or int64"),
    (lambda: F.scaled_dot_product_attention(_t(3, 4), _t(5, 3), _t(5, 2)), "do not fit"),
    (lambda: F.scaled_dot_product_attention(_t(3, 4), _t(5, 4), _t(5, 2), _t(3, 5), is_causal=True),
     "give attn_mask or is_causal=True, not both"),
    (lambda: F.scaled_dot_product_attention(_t(3, 4), _t(5, 4), _t(5, 2), _t(3, 4)),
     "attn_mask of shape (3, 4) must broadcast to the scores' shape (3, 5)"),
    (lambda: F.scaled_dot_product_attention(_t(3, 4), _t(5, 4), _t(5, 2), _t(3, 5, dtype=np.int64)),
     "argument 'attn_mask' must be bool or floating"),
]


@pytest.mark.parametrize(("call", "message"), WRONG_CALLS, ids=[m[:40] for _, m in WRONG_CALLS])
def test_wrong_calls_name_the_op(call, message):
    with pytest.raises(of.OpforgeError) as info:
        call()
    assert message in str(info.value)


# -- values whose squares overflow (issue 30) ---------------------------------------------------------------------


def _rows_close(got, want, rtol):
    """Equal within ``rtol`` of each row's largest value (a row's values differ by orders of magnitude)."""
    scale = np.max(np.abs(want), axis=-1, keepdims=True)
    assert np.all(np.abs(got - want) <= rtol * scale), np.max(np.abs(got - want) / scale)


def test_layer_norm_of_float32_rows_whose_squares_overflow_is_the_float64_result():
    # |x|² overflows past ~1.8e19: computed as written the variance was inf and the row came out 0 (torch: NaN).
    # It is the float64 result, rounded; the gradients too. A row holding an infinity stays NaN.
    big = 1e20
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 6))
    x[0] *= big
    x[1] = x[1] * big + 3 * big  # a mean that is large too
    x[2, :3] *= big  # large and small values in one row
    x[3] *= big / 100  # a row that overflows nothing
    w, b, dy = rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal((5, 6))
    x = x.astype(np.float32)
    tx, tw, tb = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x, w, b))
    ty = TF.layer_norm(tx, [6], tw, tb)
    ty.backward(torch.tensor(dy))
    ox = of.tensor(x, requires_grad=True)
    ow, ob = (of.tensor(a.astype(np.float32), requires_grad=True) for a in (w, b))
    oy = F.layer_norm(ox, [6], ow, ob)
    oy.backward(of.tensor(dy.astype(np.float32)))
    _rows_close(oy.numpy().astype(np.float64), ty.detach().numpy(), 1e-5)
    for got, want in [(ox.grad, tx.grad), (ow.grad, tw.grad), (ob.grad, tb.grad)]:
        assert got.dtype == of.float32
        _rows_close(got.numpy().astype(np.float64), want.numpy(), 1e-4)
    with np.errstate(invalid="ignore"):
        x[4, 0] = np.inf
        assert np.isnan(F.layer_norm(of.tensor(x), normalized_shape=[6]).numpy()[4]).all()


def test_layer_norm_in_float64_past_1e154_is_the_scaled_result():
    # float64 squares overflow past ~1.3e154: x̂ of x is x̂ of x/s (with eps/s², here 0), which torch computes
    x = np.random.default_rng(1).standard_normal((3, 6)) * 1e200
    want = TF.layer_norm(torch.tensor(x / 1e200), [6], eps=0.0).numpy()
    np.testing.assert_allclose(F.layer_norm(of.tensor(x), normalized_shape=[6]).numpy(), want, rtol=1e-12)
