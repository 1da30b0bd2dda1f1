"""Ops that make tensors from attributes alone. ``random`` ones draw from the seeded generator."""

from ..core.errors import ArgumentError
from ..core.spec import Dim
from ._common import D, Sample, ShapeError, Spec, np, op


def _shape_spec(name: str):
    """The shape rule of creation op ``name``: its ``shape`` attr, which must hold no negative size."""

    def infer(*, shape, dtype=None, **_):
        if any(d is not None and d < 0 for d in shape):
            raise ShapeError(f"{name}(): argument 'shape' {list(shape)} has a negative size")
        return Spec(tuple(shape), dtype or D.DEFAULT_FLOAT)

    return infer


def _shape_samples(rng):
    yield Sample.of(shape=[2, 3])
    yield Sample.of(shape=[], dtype="float64")
    yield Sample.of(shape=[4], dtype="int64")


@op("zeros(*, int[] shape, dtype dtype=None) -> Tensor y", traits=["no_grad"], infer=_shape_spec("zeros"))
def zeros(*, shape, dtype, xp=np):
    """A tensor of zeros (float32 unless ``dtype`` says otherwise)."""
    return xp.zeros(shape, dtype or D.DEFAULT_FLOAT)


zeros.onnx(lambda g, *, shape, dtype: g.filled(g.ints(shape), 0, dtype or D.DEFAULT_FLOAT))


@op("ones(*, int[] shape, dtype dtype=None) -> Tensor y", traits=["no_grad"], infer=_shape_spec("ones"))
def ones(*, shape, dtype, xp=np):
    """A tensor of ones (float32 unless ``dtype`` says otherwise)."""
    return xp.ones(shape, dtype or D.DEFAULT_FLOAT)


ones.onnx(lambda g, *, shape, dtype: g.filled(g.ints(shape), 1, dtype or D.DEFAULT_FLOAT))


@op("full(*, int[] shape, float fill_value, dtype dtype=None) -> Tensor y", traits=["no_grad"],
    infer=_shape_spec("full"))
def full(*, shape, fill_value, dtype, xp=np):
    """A tensor filled with ``fill_value``."""
    return xp.full(shape, fill_value, dtype or D.DEFAULT_FLOAT)


full.onnx(lambda g, *, shape, fill_value, dtype: g.filled(g.ints(shape), fill_value, dtype or D.DEFAULT_FLOAT))


@op("normal(*, int[] shape, float mean=0.0, float std=1.0, dtype dtype=None) -> Tensor y",
    traits=["no_grad", "random"], infer=_shape_spec("normal"))
def normal(*, shape, mean, std, dtype, rng):
    """Samples of N(mean, std²)."""
    return (mean + std * rng.standard_normal(shape)).astype(dtype or D.DEFAULT_FLOAT)


@normal.onnx
def _(g, *, shape, mean, std, dtype):
    return _onnx_random(g, "RandomNormalLike", shape, dtype, mean=mean, scale=std)


def _onnx_random(g, onnx_type, shape, dtype, **attrs):
    # *Like: the shape may be known at run time only; ONNX draws floats only: integers are drawn, then cast
    dtype = dtype or D.DEFAULT_FLOAT
    draws = g.op(onnx_type, g.filled(g.ints(shape), 0, dtype if dtype.kind == "f" else D.float64), **attrs)
    return g.cast(draws, dtype)


@op("uniform(*, int[] shape, float low=0.0, float high=1.0, dtype dtype=None) -> Tensor y",
    traits=["no_grad", "random"], infer=_shape_spec("uniform"))
def uniform(*, shape, low, high, dtype, rng):
    """Samples of U[low, high)."""
    return rng.uniform(low, high, shape).astype(dtype or D.DEFAULT_FLOAT)


@uniform.onnx
def _(g, *, shape, low, high, dtype):
    return _onnx_random(g, "RandomUniformLike", shape, dtype, low=low, high=high)


@op("arange(*, float start, float stop, float step=1.0, dtype dtype=None) -> Tensor y", traits=["no_grad"])
def arange(*, start, stop, step, dtype, xp=np):
    """Evenly spaced values in [start, stop)."""
    return xp.arange(start, stop, step).astype(dtype or D.DEFAULT_FLOAT)


@arange.onnx
def _(g, *, start, stop, step, dtype):
    if not any(isinstance(v, Dim) for v in (start, stop, step)):  # every element fixed by the attrs
        return g.const(np.asarray(arange.fn(start=start, stop=stop, step=step, dtype=dtype).numpy()))
    dtype = dtype or D.DEFAULT_FLOAT

    def scalar(v):  # a size known only at run time is read from its variable's shape
        if isinstance(v, Dim):
            return g.cast(g.op("Squeeze", g.ints([v]), g.ints([0]), spec=Spec((), D.int64)), dtype)
        return g.const(np.asarray(v, dtype))

    return g.op("Range", scalar(start), scalar(stop), scalar(step), spec=Spec((None,), dtype))


@arange.check
def _(*, start, stop, step, dtype):
    if step == 0:
        raise ValueError("argument 'step' must not be 0")


@arange.infer
def _(*, start, stop, step, dtype):
    if None in (start, stop, step):  # a size known only at run time (in a program)
        return Spec((None,), dtype or D.DEFAULT_FLOAT)
    return Spec((max(0, int(np.ceil((stop - start) / step))),), dtype or D.DEFAULT_FLOAT)


for _op in (zeros, ones, normal, uniform):
    _op.samples(_shape_samples)


@full.samples
def _(rng):
    yield Sample.of(shape=[2, 3], fill_value=1.5)
    yield Sample.of(shape=[2], fill_value=3, dtype="int32")


@arange.samples
def _(rng):
    yield Sample.of(start=0, stop=5)
    yield Sample.of(start=1, stop=2, step=0.25, dtype="float64")
    yield Sample.of(start=5, stop=0, step=-1, dtype="int64")


@op("eye(int n, int m=None, *, dtype dtype=None) -> Tensor y", traits=["no_grad"])
def eye(*, n, m, dtype, xp=np):
    """The n×m identity matrix (m defaults to n)."""
    return xp.eye(n, m, dtype=dtype or D.DEFAULT_FLOAT)


eye.onnx(lambda g, **attrs: g.const(np.asarray(eye.fn(**attrs).numpy())))


@eye.check
def _(*, n, m, dtype):
    if n < 0 or (m is not None and m < 0):
        raise ValueError(f"arguments 'n' and 'm' must be >= 0, got n={n}, m={m}")


@eye.infer
def _(*, n, m, dtype):
    return Spec((n, n if m is None else m), dtype or D.DEFAULT_FLOAT)


@eye.samples
def _(rng):
    yield Sample.of(n=3)
    yield Sample.of(n=2, m=4, dtype="int64")


@op("bernoulli(Tensor<floating> p) -> Tensor y", traits=["no_grad", "random", "elementwise"])
def bernoulli(p, *, rng):
    """Draws 1 with probability ``p`` (elementwise), else 0, in ``p``'s dtype, from the seeded generator."""
    return (rng.random(p.shape) < p).astype(p.dtype)


bernoulli.onnx(lambda g, p: g.op("Bernoulli", p))


@bernoulli.samples
def _(rng):
    yield Sample.of(rng.uniform(0, 1, (3, 4)))
    yield Sample.of(np.array(0.5))


@op("multinomial(Tensor<floating> input, int num_samples, bool replacement=False) -> Tensor<int64> y",
    traits=["no_grad", "random"])
def multinomial(input, *, num_samples, replacement, rng):
    """``torch.multinomial``: for each row of ``input`` (1-D: one row; 2-D: one per row) of non-negative weights,
    which need not sum to 1, ``num_samples`` category indices drawn with probabilities proportional to the weights.
    Without ``replacement`` an index is drawn at most once (each draw among the categories not drawn yet: the
    exponential race, keys E/w with E ~ Exp(1), smallest first). The draws are the seeded generator's, not
    torch's."""
    _multinomial_spec(Spec(input.shape, input.dtype), num_samples, replacement)
    if input.size and not (np.isfinite(input).all() and (input >= 0).all()):
        raise ArgumentError("multinomial(): argument 'input' holds inf, nan or a negative weight (torch refuses them "
                            "too)")
    rows = input.reshape(-1, input.shape[-1]).astype(np.float64)
    totals = rows.sum(axis=1)
    if (totals <= 0).any():
        raise ArgumentError("multinomial(): a row of argument 'input' has no positive weight: nothing to draw from")
    if not replacement and ((rows > 0).sum(axis=1) < num_samples).any():
        raise ArgumentError(f"multinomial(): without replacement, {num_samples} samples need as many categories of "
                            "positive weight in every row, and a row has fewer")
    if replacement:
        cdf = np.cumsum(rows, axis=1)
        u = rng.random((len(rows), num_samples)) * cdf[:, -1:]
        drawn = np.stack([np.searchsorted(c, v, side="right") for c, v in zip(cdf, u)])
    else:
        with np.errstate(divide="ignore"):
            keys = rng.exponential(size=rows.shape) / rows  # weight 0: never drawn (key inf)
        drawn = np.argsort(keys, axis=1, kind="stable")[:, :num_samples]
    return drawn.reshape(*input.shape[:-1], num_samples).astype(np.int64)


@multinomial.check
def _(*, num_samples, replacement):
    if num_samples <= 0:
        raise ValueError(f"argument 'num_samples' must be positive, got {num_samples}")


@multinomial.infer
def _multinomial_spec(input, num_samples, replacement):
    if len(input.shape) not in (1, 2):
        raise ShapeError(f"multinomial(): input must be 1-D or 2-D (categories last), got shape {input.shape}")
    if not replacement and input.shape[-1] is not None and num_samples > input.shape[-1]:
        raise ShapeError(f"multinomial(): without replacement, num_samples ({num_samples}) cannot exceed the "
                         f"number of categories ({input.shape[-1]})")
    return Spec((*input.shape[:-1], num_samples), D.int64)


@multinomial.samples
def _(rng):
    yield Sample.of(rng.uniform(0.1, 1, (3, 5)), num_samples=2)
    yield Sample.of(rng.uniform(0.1, 1, 4), num_samples=6, replacement=True)
