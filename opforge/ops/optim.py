"""Optimizer update ops: one SGD or Adam step for one parameter, with PyTorch's formulas (``torch.optim``).

They are ops like any other, so the optimizers in ``opforge.optim`` run them eagerly (under ``no_grad``, then
``assign`` the results into the parameter and state arrays) and record them while tracing a compiled training
step. None of them is differentiable (trait ``no_grad``).

Why one op per updated tensor, not one ``adam_update -> (param, m, v, step)``: the executor hands ``out=`` (a
buffer to write into) only to single-output ops. So each tensor that a step rewrites is the output of its own op,
whose kernel takes ``out=`` and declares ``inplace={"<out>": "<input>"}``: in a compiled step the new moment is
written straight into the old moment's array and the new parameter into the parameter's array, with no copy. An op
that reads a state tensor's new value (the parameter update reads the new moments) is recorded after the op that
makes it; the executor writes in place only once the old value has no reader left. The step counter is advanced
with an ordinary ``add`` (a 0-d copy per step, nothing to save there).

The learning rate, the step count, SGD's momentum and Adam's beta1 are 0-d tensor *inputs*, not attrs: a schedule
changes them between steps (``OneCycleLR`` cycles the momentum or beta1 with the learning rate), and an attr would
be frozen into the compiled program, which would be traced again at every step. On the host, kernels read them with
``.item()`` and compute with Python floats, so a float32 parameter stays float32 (Python scalars do not promote NumPy
arrays). On another device a read would stall it at every parameter of every step: there they stay 0-d arrays of the
device, the factors made from them are cast to the parameter's dtype (what NumPy does to the Python float on the
host, so the values are the same), and the first-step choice of SGD's buffer is a ``where``.
Kernels never change their inputs, except that the executor may pass an ``out=`` that *is* the declared inplace
input: every kernel below reads what it needs from that input before writing ``out``.
"""

import math

from ..core.errors import ArgumentError
from ._common import B, S, Sample, ShapeError, Spec, np, op


def _same_dims(a: tuple, b: tuple) -> bool:
    """Shapes equal where both dims are known (None is unknown)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _like_param(op_name: str, param: Spec, **others) -> Spec:
    """The output Spec of an update: the parameter's. Every other tensor given must have its shape and dtype."""
    for name, s in others.items():
        if s is None:
            continue
        if not _same_dims(s.shape, param.shape):
            raise ShapeError(f"{op_name}(): '{name}' has shape {s.shape}, the parameter has shape {param.shape}")
        if s.dtype != param.dtype:
            raise ShapeError(f"{op_name}(): '{name}' is {s.dtype}, the parameter is {param.dtype}")
    return Spec(param.shape, param.dtype)


def _scalar_input(op_name: str, name: str, spec: Spec) -> None:
    if len(spec.shape) != 0:
        raise ShapeError(f"{op_name}(): '{name}' must be a 0-d tensor, got shape {spec.shape}")


def _validate(opdef, *arrays, **attrs) -> None:
    """Run the op's infer rule on the kernel's arrays: eager calls run kernels without it, and NumPy would
    broadcast a parameter and a gradient of different shapes silently."""
    opdef.infer_fn(*(None if a is None else Spec(a.shape, a.dtype) for a in arrays), **attrs)


def _blockwise(*inputs, **_):
    """SBP signatures of an update: it is elementwise over its parameter-shaped tensors (the 0-d ones, lr and step,
    are whole), so it runs on any block of them, and the state of a split parameter stays split as it is."""
    shape = inputs[0].shape
    for k in range(len(shape)):
        yield tuple(None if s is None else S(k) if s.shape else B for s in inputs), S(k)


def _check_nonnegative(**values) -> None:
    for name, v in values.items():
        if not v >= 0:  # also refuses NaN
            raise ValueError(f"argument '{name}' must be >= 0, got {v}")


def _check_beta(name: str, beta: float) -> None:
    if not 0 <= beta < 1:
        raise ValueError(f"argument '{name}' must be in [0, 1), got {beta}")


def _hyper(op_name: str, name: str, value, dtype):
    """A hyper-parameter given as a 0-d tensor (a schedule may change it), read as a Python float and checked as
    its attr was: a momentum >= 0, a beta in [0, 1). On another device it is not read (see the module docstring):
    a 0-d array of the device in the parameter's ``dtype``, unchecked."""
    if type(value) is not np.ndarray:
        return value.astype(dtype)
    value = value.item()
    try:
        if name.startswith("beta"):
            _check_beta(name, value)
        else:
            _check_nonnegative(**{name: value})
    except ValueError as e:
        raise ArgumentError(f"{op_name}(): {e}") from None
    return value


def _target(out, like):
    """Where a kernel writes its result: the executor's ``out=`` buffer, else a new array (0-d ones too: NumPy
    returns scalars, not arrays, from 0-d arithmetic without ``out``)."""
    return out if out is not None else np.empty_like(like)


# Elements per block where an update adds a scaled tensor: the product stays in cache (as in the executor's fusion).
_BLOCK = 32768


def _add_scaled(base, scale: float, d, out):
    """base + scale·d written into ``out`` (which may be ``base``), block by block: the product scale·d never takes
    an array of the parameter's size (SGD's lr·grad, issue 6). The same bits as ``base + scale * d``; with
    scale = −lr also as ``base − lr * d`` (negation is exact)."""
    if base.ndim == 0 or base.size <= _BLOCK or type(base) is not np.ndarray:  # (a GPU: one launch, not 2 a block)
        return np.add(base, d * scale, out=out)
    rows = max(1, _BLOCK // (base.size // base.shape[0]))
    product = np.empty((rows, *base.shape[1:]), np.result_type(d, scale), like=base)
    for start in range(0, base.shape[0], rows):
        r = slice(start, start + rows)
        block = d[r]
        np.add(base[r], np.multiply(block, scale, out=product[:len(block)]), out=out[r])
    return out


def _decayed(grad, param, weight_decay: float):
    """PyTorch's L2 weight decay, folded into the gradient: g + λ·p (no new array when λ = 0)."""
    return grad + weight_decay * param if weight_decay else grad


# -- SGD ------------------------------------------------------------------------------------------------------------
# torch.optim.SGD, per parameter:   d = g + λ·p
#   momentum μ ≠ 0:   b ← d on the first step, else μ·b + (1 − τ)·d          (τ: dampening)
#                     d ← d + μ·b (Nesterov) or d ← b
#   p ← p − lr·d


@op("sgd_momentum_buffer(Tensor<floating> buf, Tensor<floating> grad, Tensor<floating> param, "
    "Tensor<integer> step, Tensor<floating> momentum, *, float dampening=0.0, float weight_decay=0.0) "
    "-> Tensor buf_out", traits=["no_grad"], inplace={"buf_out": "buf"})
def sgd_momentum_buffer(buf, grad, param, step, momentum, *, dampening, weight_decay, out=None):
    """SGD's new momentum buffer: d = grad + weight_decay·param; d itself on the first step (``step`` = 0, the
    number of steps taken so far), else momentum·buf + (1 − dampening)·d — as ``torch.optim.SGD``. ``momentum``
    is a 0-d tensor (a schedule may cycle it)."""
    _validate(sgd_momentum_buffer, buf, grad, param, step, momentum, dampening=dampening, weight_decay=weight_decay)
    momentum = _hyper("sgd_momentum_buffer", "momentum", momentum, buf.dtype)
    d = _decayed(grad, param, weight_decay)
    if type(step) is not np.ndarray:  # a device's 0-d array: no read (see the module docstring)
        new = np.where(step == 0, d, np.multiply(buf, momentum) + d * (1 - dampening))
        out = _target(out, buf)
        np.copyto(out, new)
        return out
    if step.item() == 0:  # PyTorch starts the buffer as a copy of d (so dampening does not touch the first step)
        out = _target(out, buf)
        np.copyto(out, d)
        return out
    out = np.multiply(buf, momentum, out=_target(out, buf))  # elementwise: each buf value is read, then written
    return _add_scaled(out, 1 - dampening, d, out)


@sgd_momentum_buffer.infer
def _(buf, grad, param, step, momentum, *, dampening, weight_decay):
    _scalar_input("sgd_momentum_buffer", "step", step)
    _scalar_input("sgd_momentum_buffer", "momentum", momentum)
    return _like_param("sgd_momentum_buffer", param, buf=buf, grad=grad)


@sgd_momentum_buffer.check
def _(*, dampening, weight_decay):
    _check_nonnegative(weight_decay=weight_decay)
    if math.isnan(dampening):
        raise ValueError("argument 'dampening' must not be NaN")


sgd_momentum_buffer.sbp(_blockwise)


@sgd_momentum_buffer.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4)),
                    np.array(2), np.array(0.9), dampening=0.1, weight_decay=0.01)
    yield Sample.of(rng.standard_normal(5), rng.standard_normal(5), rng.standard_normal(5), np.array(0),
                    np.array(0.5), dampening=0.3)  # the first step: the buffer becomes d
    yield Sample.of(rng.standard_normal(()), rng.standard_normal(()), rng.standard_normal(()), np.array(7),
                    np.array(0.99), weight_decay=0.1)


@op("sgd_update(Tensor<floating> param, Tensor<floating> grad, Tensor<floating> lr, "
    "Tensor<floating>? momentum_buffer=None, Tensor<floating>? momentum=None, *, float weight_decay=0.0, "
    "bool nesterov=False) -> Tensor param_out", traits=["no_grad"], inplace={"param_out": "param"})
def sgd_update(param, grad, lr, momentum_buffer, momentum, *, weight_decay, nesterov, out=None):
    """SGD's new parameter: param − lr·d, with d = grad + weight_decay·param, then, given the step's new
    ``momentum_buffer`` b (from sgd_momentum_buffer), d + momentum·b (``nesterov``) or b — as ``torch.optim.SGD``.
    ``momentum`` (a 0-d tensor) is used by Nesterov's look-ahead only."""
    _validate(sgd_update, param, grad, lr, momentum_buffer, momentum, weight_decay=weight_decay, nesterov=nesterov)
    d = _decayed(grad, param, weight_decay)
    if momentum_buffer is not None and nesterov:
        if momentum is None:
            raise ShapeError("sgd_update(): nesterov=True needs the momentum")
        d = d + _hyper("sgd_update", "momentum", momentum, param.dtype) * momentum_buffer
    elif momentum_buffer is not None:
        d = momentum_buffer
    scale = -lr.item() if type(lr) is np.ndarray else (-lr).astype(param.dtype)  # (see the module docstring)
    return _add_scaled(param, scale, d, _target(out, param))  # param − lr·d, in place when out is param


@sgd_update.infer
def _(param, grad, lr, momentum_buffer, momentum, *, weight_decay, nesterov):
    _scalar_input("sgd_update", "lr", lr)
    if momentum is not None:
        _scalar_input("sgd_update", "momentum", momentum)
    return _like_param("sgd_update", param, grad=grad, momentum_buffer=momentum_buffer)


@sgd_update.check
def _(*, weight_decay, nesterov):
    _check_nonnegative(weight_decay=weight_decay)


sgd_update.sbp(_blockwise)


@sgd_update.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), np.array(0.1))
    yield Sample.of(rng.standard_normal(6), rng.standard_normal(6), np.array(0.05), rng.standard_normal(6),
                    np.array(0.9), weight_decay=0.01)
    yield Sample.of(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), np.array(0.3),
                    rng.standard_normal((2, 3)), np.array(0.8), nesterov=True)
    yield Sample.of(rng.standard_normal(()), rng.standard_normal(()), np.array(1.0), weight_decay=0.5)


# -- Adam and AdamW -------------------------------------------------------------------------------------------------
# torch.optim.Adam / AdamW, per parameter, at step t (counted from 1):
#   g ← g + λ·p (Adam's L2 decay; AdamW instead shrinks p ← p·(1 − lr·λ) before the update)
#   m ← m + (1 − β₁)·(g − m)            (torch's lerp; β₁ ≥ 0.5 is the usual case, see _lerp)
#   v ← β₂·v + (1 − β₂)·g²
#   p ← p − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)


def _lerp(start, end, weight: float, out=None):
    """start + weight·(end − start), as ``torch.lerp``: from the nearer end, so weight 1 gives ``end`` exactly."""
    diff = end - start  # read start before out (which may be start) is written
    if not isinstance(weight, float):  # a device's 0-d array: choose without reading it (see the module docstring)
        out = _target(out, start)
        np.copyto(out, np.where(abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight)))
        return out
    if abs(weight) < 0.5:
        return np.add(start, weight * diff, out=_target(out, start))
    return np.subtract(end, diff * (1 - weight), out=_target(out, start))


@op("adam_exp_avg(Tensor<floating> exp_avg, Tensor<floating> grad, Tensor<floating> param, "
    "Tensor<floating> beta1, *, float weight_decay=0.0) -> Tensor exp_avg_out", traits=["no_grad"],
    inplace={"exp_avg_out": "exp_avg"})
def adam_exp_avg(exp_avg, grad, param, beta1, *, weight_decay, out=None):
    """Adam's new first moment: exp_avg + (1 − beta1)·(g − exp_avg) with g = grad + weight_decay·param (Adam's L2
    decay; pass 0 for AdamW) — ``exp_avg.lerp_(g, 1 − beta1)`` in ``torch.optim.Adam``. ``beta1`` is a 0-d tensor
    (a schedule may cycle it)."""
    _validate(adam_exp_avg, exp_avg, grad, param, beta1, weight_decay=weight_decay)
    beta1 = _hyper("adam_exp_avg", "beta1", beta1, exp_avg.dtype)
    return _lerp(exp_avg, _decayed(grad, param, weight_decay), 1 - beta1, out=out)


@adam_exp_avg.infer
def _(exp_avg, grad, param, beta1, *, weight_decay):
    _scalar_input("adam_exp_avg", "beta1", beta1)
    return _like_param("adam_exp_avg", param, exp_avg=exp_avg, grad=grad)


@adam_exp_avg.check
def _(*, weight_decay):
    _check_nonnegative(weight_decay=weight_decay)


adam_exp_avg.sbp(_blockwise)


@adam_exp_avg.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4)),
                    np.array(0.9))
    yield Sample.of(rng.standard_normal(5), rng.standard_normal(5), rng.standard_normal(5), np.array(0.3),
                    weight_decay=0.1)  # a small beta1: torch's lerp takes its other branch
    yield Sample.of(rng.standard_normal(()), rng.standard_normal(()), rng.standard_normal(()), np.array(0.0))


@op("adam_exp_avg_sq(Tensor<floating> exp_avg_sq, Tensor<floating> grad, Tensor<floating> param, *, float beta2, "
    "float weight_decay=0.0) -> Tensor exp_avg_sq_out", traits=["no_grad"], inplace={"exp_avg_sq_out": "exp_avg_sq"})
def adam_exp_avg_sq(exp_avg_sq, grad, param, *, beta2, weight_decay, out=None):
    """Adam's new second moment: beta2·exp_avg_sq + (1 − beta2)·g² with g = grad + weight_decay·param (Adam's L2
    decay; pass 0 for AdamW) — ``exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 − beta2)`` in torch."""
    _validate(adam_exp_avg_sq, exp_avg_sq, grad, param, beta2=beta2, weight_decay=weight_decay)
    g = _decayed(grad, param, weight_decay)
    g2 = (1 - beta2) * g * g
    out = np.multiply(exp_avg_sq, beta2, out=_target(out, exp_avg_sq))
    return np.add(out, g2, out=out)


@adam_exp_avg_sq.infer
def _(exp_avg_sq, grad, param, *, beta2, weight_decay):
    return _like_param("adam_exp_avg_sq", param, exp_avg_sq=exp_avg_sq, grad=grad)


@adam_exp_avg_sq.check
def _(*, beta2, weight_decay):
    _check_beta("beta2", beta2)
    _check_nonnegative(weight_decay=weight_decay)


adam_exp_avg_sq.sbp(_blockwise)


@adam_exp_avg_sq.samples
def _(rng):
    yield Sample.of(rng.uniform(0.1, 1, (3, 4)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4)),
                    beta2=0.999)
    yield Sample.of(rng.uniform(0.1, 1, 5), rng.standard_normal(5), rng.standard_normal(5), beta2=0.9,
                    weight_decay=0.1)
    yield Sample.of(rng.uniform(0.1, 1, ()), rng.standard_normal(()), rng.standard_normal(()), beta2=0.0)


@op("adam_update(Tensor<floating> param, Tensor<floating> exp_avg, Tensor<floating> exp_avg_sq, "
    "Tensor<integer> step, Tensor<floating> lr, Tensor<floating> beta1, *, float beta2, float eps=1e-8, "
    "float weight_decay=0.0, bool decoupled=False) -> Tensor param_out",
    traits=["no_grad"], inplace={"param_out": "param"})
def adam_update(param, exp_avg, exp_avg_sq, step, lr, beta1, *, beta2, eps, weight_decay, decoupled, out=None):
    """Adam's new parameter from the step's new moments and step count t ≥ 1: p − lr/(1 − beta1ᵗ) · exp_avg /
    (√exp_avg_sq / √(1 − beta2ᵗ) + eps), where p is param, or param·(1 − lr·weight_decay) when ``decoupled``
    (AdamW; Adam's L2 decay is in the moments) — as ``torch.optim.Adam``/``AdamW``."""
    _validate(adam_update, param, exp_avg, exp_avg_sq, step, lr, beta1, beta2=beta2, eps=eps,
              weight_decay=weight_decay, decoupled=decoupled)
    if type(step) is np.ndarray:
        typed = float
    else:  # a device's 0-d arrays, not read (see the module docstring)

        def typed(factor):
            return factor.astype(param.dtype)
    step_size, bias_correction2_sqrt, decay = adam_factors(step, lr, beta1, beta2=beta2, weight_decay=weight_decay)
    change = exp_avg / (np.sqrt(exp_avg_sq) / typed(bias_correction2_sqrt) + eps)
    change = change * typed(-step_size)
    out = _target(out, param)
    base = np.multiply(param, typed(decay), out=out) if decoupled and weight_decay else param
    return np.add(base, change, out=out)


def adam_factors(step, lr, beta1, *, beta2: float, weight_decay: float) -> tuple:
    """adam_update's scalars of a step, from its 0-d ``step`` (t), ``lr`` and ``beta1``: lr/(1 − beta1ᵗ),
    √(1 − beta2ᵗ) and AdamW's 1 − lr·weight_decay — Python floats (double) from host arrays, whose step must be >= 1;
    0-d arrays from a device's, not read (see the module docstring; a step < 1 is not checked there: the bias
    corrections divide by 0 and the parameter becomes inf or NaN). Also the native Adam step's
    (``opforge.program.native.AdamStep``), so that the two compute them alike."""
    t = step
    if type(step) is np.ndarray:
        t, lr, beta1 = step.item(), lr.item(), _hyper("adam_update", "beta1", beta1, None)
        if t < 1:
            raise ShapeError(f"adam_update(): 'step' counts the steps taken including this one, so it must be >= 1, "
                             f"got {t}")
    return lr / (1 - beta1 ** t), (1 - beta2 ** t) ** 0.5, 1 - lr * weight_decay


@adam_update.infer
def _(param, exp_avg, exp_avg_sq, step, lr, beta1, *, beta2, eps, weight_decay, decoupled):
    _scalar_input("adam_update", "step", step)
    _scalar_input("adam_update", "lr", lr)
    _scalar_input("adam_update", "beta1", beta1)
    return _like_param("adam_update", param, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)


@adam_update.check
def _(*, beta2, eps, weight_decay, decoupled):
    _check_beta("beta2", beta2)
    _check_nonnegative(eps=eps, weight_decay=weight_decay)


adam_update.sbp(_blockwise)
adam_update.step_factors = adam_factors  # (read by the native Adam step: one definition)


@adam_update.samples
def _(rng):
    def moments(shape):
        return rng.standard_normal(shape), rng.standard_normal(shape) * 0.1, rng.uniform(0.01, 1, shape)

    yield Sample.of(*moments((3, 4)), np.array(1), np.array(1e-3), np.array(0.9), beta2=0.999)
    yield Sample.of(*moments(5), np.array(10), np.array(0.01), np.array(0.8), beta2=0.99, eps=1e-6, weight_decay=0.1)
    yield Sample.of(*moments((2, 3)), np.array(3), np.array(0.1), np.array(0.9), beta2=0.999, weight_decay=0.01,
                    decoupled=True)
    yield Sample.of(*moments(()), np.array(2), np.array(0.5), np.array(0.0), beta2=0.5)

