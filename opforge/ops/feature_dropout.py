"""Channel-wise dropout: dropout1d, dropout2d, dropout3d zero whole channels (``torch.nn.functional``'s). As
``dropout_with_mask``, each op (``dropout2d_with_mask``...) returns the mask it drew (one bool per channel, shaped to
broadcast against ``x``), so that the backward pass uses the forward pass's draw and nothing else; ``F.dropout2d``
returns ``y`` alone, as torch's does."""

from opforge import ops as F

from ._common import D, Sample, ShapeError, Spec, array_module, function, np, op
from .nn import _dropout_scale, functional_dropout

# op -> (the ranks it takes, the rank of an input without a batch dim)
_RANKS = {"dropout1d_with_mask": ((2, 3), 2), "dropout2d_with_mask": ((3, 4), None),
          "dropout3d_with_mask": ((4, 5), 4)}


def _mask_shape(op_name, shape):
    """One entry per channel (per sample and channel, when batched), 1 along the other dims."""
    ranks, unbatched = _RANKS[op_name]
    if len(shape) not in ranks:
        raise ShapeError(f"{op_name}(): expects an input of rank {' or '.join(map(str, ranks))}, "
                         f"(N, C, ...) or (C, ...), got shape {tuple(shape)}")
    kept = 1 if len(shape) == unbatched else 2
    return (*shape[:kept], *(1,) * (len(shape) - kept))


def _drop_channels(op_name, x, p, training, rng):
    shape = _mask_shape(op_name, x.shape)
    if not training or p == 0.0:
        return x.copy(), array_module(x).ones(shape, np.bool_)
    keep = rng.random(shape) >= p
    return np.where(keep, x * _dropout_scale(p, training), 0).astype(x.dtype, copy=False), keep


@op("dropout1d_with_mask(Tensor<floating> x, *, float p=0.5, bool training=True) -> (Tensor y, Tensor<bool> mask)",
    traits=["random"])
def dropout1d_with_mask(x, *, p, training, rng):
    """Zeroes each channel of x (N, C, L) or (C, L) with probability ``p`` and scales the kept ones by 1/(1 − p)
    (the identity when not ``training``); also returns the mask of kept channels."""
    return _drop_channels("dropout1d_with_mask", x, p, training, rng)


@op("dropout2d_with_mask(Tensor<floating> x, *, float p=0.5, bool training=True) -> (Tensor y, Tensor<bool> mask)",
    traits=["random"])
def dropout2d_with_mask(x, *, p, training, rng):
    """Zeroes each channel of x (N, C, H, W) with probability ``p`` and scales the kept ones by 1/(1 − p) (the
    identity when not ``training``); also returns the mask of kept channels. A 3-D input is read as (N, C, L), as
    PyTorch reads it now (it warns that it will read (C, H, W) in a future release)."""
    return _drop_channels("dropout2d_with_mask", x, p, training, rng)


@op("dropout3d_with_mask(Tensor<floating> x, *, float p=0.5, bool training=True) -> (Tensor y, Tensor<bool> mask)",
    traits=["random"])
def dropout3d_with_mask(x, *, p, training, rng):
    """Zeroes each channel of x (N, C, D, H, W) or (C, D, H, W) with probability ``p`` and scales the kept ones by
    1/(1 − p) (the identity when not ``training``); also returns the mask of kept channels."""
    return _drop_channels("dropout3d_with_mask", x, p, training, rng)


def _check(*, p, training):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"argument 'p' must be a probability in [0, 1], got {p}")


def _infer(op_name):
    def infer(x, *, p, training):
        return Spec(x.shape, x.dtype), Spec(_mask_shape(op_name, x.shape), D.bool_)

    return infer


def _grad(mask, dy, *, p, training):
    return F.where(mask, dy * _dropout_scale(p, training), 0.0)


def _samples(low_rank):
    # Numeric checks call the op again and again: only calls that draw nothing give them one mask.
    # tests/test_oracle_misc.py checks p > 0: whole channels dropped, scaled, the same mask in backward.
    def samples(rng):
        yield Sample.of(rng.standard_normal((2, 3, 4, 2, 2)[:low_rank + 1]), p=0.5, training=False)
        yield Sample.of(rng.standard_normal((3, 4, 2, 2)[:low_rank]), p=0.0)

    return samples


def _onnx(op_name):
    def mapping(g, x, *, p, training):
        # one uniform draw per channel (per sample and channel when batched), as the kernel: kept where it is ≥ p
        unbatched = _RANKS[op_name][1]
        kept = 1 if x.ndim == unbatched else 2
        shape = g.op("Concat", g.op("Shape", x, start=0, end=kept), g.ints([1] * (x.ndim - kept)), axis=0)
        if not training or p == 0.0:
            return g.op("Identity", x), g.filled(shape, True, D.bool_)
        draws = g.op("RandomUniformLike", g.filled(shape, 0, x.dtype))
        mask = g.op("GreaterOrEqual", draws, g.scalar(p, x), spec=g.outputs[1])
        scaled = g.op("Mul", x, g.scalar(_dropout_scale(p, training), x))
        return g.op("Where", mask, scaled, g.scalar(0, x), spec=g.outputs[0]), mask

    return mapping


for _op in (dropout1d_with_mask, dropout2d_with_mask, dropout3d_with_mask):
    _op.check(_check)
    _op.onnx(_onnx(_op.name))
    _op.infer(_infer(_op.name))
    _op.grad(_grad)
    _op.samples(_samples(_RANKS[_op.name][0][0]))


dropout1d, dropout2d, dropout3d = (function(functional_dropout(op, __name__)) for op in (
    dropout1d_with_mask, dropout2d_with_mask, dropout3d_with_mask))
