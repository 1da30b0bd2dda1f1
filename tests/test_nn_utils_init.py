"""nn.utils (clip_grad_value_, clip_grad_norm_'s torch arguments, parameters_to_vector, vector_to_parameters), the
nn.init functions torch has (values where deterministic, distributions by statistics where random), nn.Unflatten,
nn.Bilinear (F.bilinear) and nn.Upsample's modes, against torch."""

import math
import warnings

import numpy as np
import pytest
import torch

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.nn import init

TNN = torch.nn


def _grads(seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(3, 4), (5,), ()]
    starts = [rng.standard_normal(s) for s in shapes]
    grads = [rng.standard_normal(s) * 3 for s in shapes]
    params = [of.tensor(a, requires_grad=True) for a in starts]
    tparams = [torch.tensor(a, requires_grad=True) for a in starts]
    for p, tp, g in zip(params, tparams, grads):
        p.grad, tp.grad = of.tensor(g), torch.tensor(g)
    return params, tparams, grads


# -- nn.utils ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("clip_value", [0.0, 0.5, 2, 100.0])
def test_clip_grad_value_matches_torch_and_leaves_the_old_gradients_alone(clip_value):
    params, tparams, grads = _grads()
    params[1].grad = tparams[1].grad = None  # skipped
    before = [p.grad for p in params]
    assert nn.utils.clip_grad_value_(params, clip_value) is None
    TNN.utils.clip_grad_value_(tparams, clip_value)
    for p, tp in zip(params, tparams):
        if tp.grad is None:
            assert p.grad is None
        else:
            np.testing.assert_array_equal(p.grad.numpy(), tp.grad.numpy())
    np.testing.assert_array_equal(before[0].numpy(), grads[0])  # a new gradient tensor (arrays may be shared)


def test_clip_grad_value_in_a_compiled_step_equals_eager():
    rng = np.random.default_rng(1)
    w0, x, y = rng.standard_normal((3, 2)), rng.standard_normal((8, 3)), rng.standard_normal((8, 2))

    def setup():
        w = of.tensor(w0, requires_grad=True)
        opt = of.optim.SGD([w], lr=0.1)

        def step(x, y):
            loss = F.sum(F.square(x @ w - y))
            loss.backward()
            nn.utils.clip_grad_value_([w], 0.3)
            opt.step()
            opt.zero_grad()
            return loss

        return w, step

    (w_e, eager), (w_c, step) = setup(), setup()
    compiled = of.compile(step)
    for _ in range(3):
        assert eager(of.tensor(x), of.tensor(y)).item() == compiled(of.tensor(x), of.tensor(y)).item()
    np.testing.assert_array_equal(w_c.numpy(), w_e.numpy())
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    for _ in range(3):
        torch.sum(torch.square(torch.tensor(x) @ tw - torch.tensor(y))).backward()
        TNN.utils.clip_grad_value_([tw], 0.3)
        topt.step()
        topt.zero_grad()
    np.testing.assert_allclose(w_e.numpy(), tw.detach().numpy(), rtol=1e-14)


def test_clip_grad_norm_error_if_nonfinite_is_torchs():
    params, tparams, _ = _grads()
    params[0].grad = of.tensor(np.full((3, 4), np.inf))
    tparams[0].grad = torch.full((3, 4), np.inf, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="non-finite"):
        TNN.utils.clip_grad_norm_(tparams, 1.0, error_if_nonfinite=True)
    with pytest.raises(of.GradientError, match=r"clip_grad_norm_\(\): the total norm of order 2.0 .* is inf"):
        nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    assert nn.utils.clip_grad_norm_ is of.optim.clip_grad_norm_
    with np.errstate(invalid="ignore"):  # inf·0 in the scaling: NaN gradients, as torch's
        total = nn.utils.clip_grad_norm_(params, 1.0, foreach=True)  # foreach changes nothing; no error by default
    assert math.isinf(total.item())
    with pytest.raises(of.ArgumentError, match=r"error_if_nonfinite=True reads the norm's value"):
        of.compile(lambda x: nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True) * x)(of.tensor(1.0))


def test_parameters_to_vector_and_back_match_torch():
    params, tparams, _ = _grads()
    vec, tvec = nn.utils.parameters_to_vector(params), TNN.utils.parameters_to_vector(tparams)
    np.testing.assert_array_equal(vec.numpy(), tvec.detach().numpy())
    (vec * of.tensor(np.arange(18.0))).sum().backward()  # differentiable, as torch's
    (tvec * torch.arange(18.0, dtype=torch.float64)).sum().backward()
    for p, tp in zip(params, tparams):
        np.testing.assert_array_equal(p.grad.numpy(), tp.grad.numpy())
    arrays = [p.numpy() for p in params]
    new = np.linspace(-1, 1, 18)
    nn.utils.vector_to_parameters(of.tensor(new), params)
    TNN.utils.vector_to_parameters(torch.tensor(new), tparams)
    for p, tp, a in zip(params, tparams, arrays):
        np.testing.assert_array_equal(p.numpy(), tp.detach().numpy())
        assert p.numpy() is a  # written in place: optimizers and compiled functions holding it see the values
    with pytest.raises(of.ArgumentError, match=r"vector_to_parameters\(\): vec must be a Tensor, got ndarray"):
        nn.utils.vector_to_parameters(new, params)
    with pytest.raises(of.ShapeError, match=r"vec must be a vector of 18 values .*, got shape \(19,\)"):
        nn.utils.vector_to_parameters(of.tensor(np.zeros(19)), params)
    with pytest.raises(of.ArgumentError, match=r"vec is float32, parameter 0 is float64"):
        nn.utils.vector_to_parameters(of.tensor(np.zeros(18, np.float32)), params)
    with pytest.raises(of.ArgumentError, match=r"clip_value must be a number >= 0, got float -1.0"):
        nn.utils.clip_grad_value_(params, -1.0)


# -- nn.init -----------------------------------------------------------------------------------------------------------

def test_calculate_gain_is_torchs():
    for name in ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                 "sigmoid", "tanh", "relu", "leaky_relu", "selu"]:
        assert init.calculate_gain(name) == TNN.init.calculate_gain(name), name
    assert init.calculate_gain("leaky_relu", 0.2) == TNN.init.calculate_gain("leaky_relu", 0.2)


@pytest.mark.parametrize(("shape", "groups"), [((4, 3, 5), 1), ((6, 2, 3, 3), 2), ((4, 4, 3, 2, 5), 1),
                                               ((6, 5, 3, 3), 3), ((2, 5, 3), 1)])
def test_dirac_matches_torch(shape, groups):
    w, tw = of.tensor(np.ones(shape), requires_grad=True), torch.ones(shape)
    assert init.dirac_(w, groups) is w
    TNN.init.dirac_(tw, groups)
    np.testing.assert_array_equal(w.numpy(), tw.numpy())
    x = np.random.default_rng(0).standard_normal((1, shape[1] * groups, *([7] * (len(shape) - 2))))
    if groups == 1 and shape[0] == shape[1] and len(shape) == 4:  # a convolution with it passes its input through
        np.testing.assert_allclose(F.conv2d(of.tensor(x), w, padding=1).numpy(), x, atol=1e-15)


def test_eye_matches_torch_and_bad_shapes_are_refused():
    for shape in [(3, 3), (2, 5), (5, 2)]:
        w, tw = of.tensor(np.zeros(shape, np.float32)), torch.zeros(shape)
        np.testing.assert_array_equal(init.eye_(w).numpy(), TNN.init.eye_(tw).numpy())
    cases = [(lambda: init.eye_(of.tensor(np.zeros(3))), r"nn.init.eye_: only tensors with 2 dims"),
             (lambda: init.dirac_(of.tensor(np.zeros((3, 3)))), r"dirac_: only tensors with 3 or 4 or 5 dims"),
             (lambda: init.dirac_(of.tensor(np.zeros((3, 3, 3))), groups=2), r"dim 0 \(3\) must be divisible by"),
             (lambda: init.orthogonal_(of.tensor(np.zeros(3))), r"orthogonal_: only tensors with 2"),
             (lambda: init.sparse_(of.tensor(np.zeros((3, 3, 3))), 0.1), r"sparse_: only tensors with 2 dims"),
             (lambda: init.trunc_normal_(of.tensor(np.zeros(3)), a=2, b=1), r"needs std > 0 and a <= b"),
             (lambda: init.normal_(of.tensor(np.zeros(3)), generator=torch.Generator()),
              r"generator must be None or a numpy.random.Generator")]
    for make, message in cases:
        with pytest.raises(of.ArgumentError, match=message):
            make()


@pytest.mark.parametrize(("shape", "gain"), [((6, 6), 1.0), ((4, 9), 2.0), ((10, 3), 0.5), ((4, 2, 3, 3), 1.0)])
def test_orthogonal_is_orthogonal_with_torchs_gain_and_sign_convention(shape, gain):
    of.manual_seed(0)
    w = init.orthogonal_(of.tensor(np.zeros(shape)), gain=gain)
    flat = w.numpy().reshape(shape[0], -1)
    rows, cols = flat.shape
    gram = flat @ flat.T if rows <= cols else flat.T @ flat
    np.testing.assert_allclose(gram, gain ** 2 * np.eye(min(rows, cols)), atol=1e-12)
    tw = TNN.init.orthogonal_(torch.zeros(shape, dtype=torch.float64), gain=gain)
    tflat = tw.numpy().reshape(rows, cols)
    tgram = tflat @ tflat.T if rows <= cols else tflat.T @ tflat
    np.testing.assert_allclose(gram, tgram, atol=1e-12)  # the same property, the same scale as torch's


def test_orthogonal_matrices_are_spread_as_torchs():
    # Haar-distributed: each entry of a random n×n orthogonal matrix has mean 0 and variance 1/n
    of.manual_seed(1)
    torch.manual_seed(1)
    ours = np.stack([init.orthogonal_(of.tensor(np.zeros((8, 8)))).numpy() for _ in range(100)])
    theirs = np.stack([TNN.init.orthogonal_(torch.zeros(8, 8, dtype=torch.float64)).numpy() for _ in range(40)])
    for sample in (ours, theirs):  # within 4 standard errors
        n = sample.size
        assert abs(sample.mean()) < 4 * math.sqrt(1 / 8 / n) and abs(sample.var() - 1 / 8) < 4 / 8 * math.sqrt(2 / n)
        assert abs(np.mean(sample[:, 0, 0])) < 4 * math.sqrt(1 / 8 / len(sample))  # no sign bias on the diagonal


@pytest.mark.parametrize(("shape", "sparsity"), [((10, 20), 0.3), ((7, 50), 0.5), ((5, 4), 0.0), ((6, 6), 1.0)])
def test_sparse_zeroes_as_many_rows_per_column_as_torch(shape, sparsity):
    of.manual_seed(2)
    w = init.sparse_(of.tensor(np.zeros(shape)), sparsity, std=0.5)
    tw = TNN.init.sparse_(torch.zeros(shape, dtype=torch.float64), sparsity, std=0.5)
    np.testing.assert_array_equal((w.numpy() == 0).sum(axis=0), (tw.numpy() == 0).sum(axis=0))
    kept = w.numpy()[w.numpy() != 0]
    if kept.size > 100:
        assert abs(kept.std() - 0.5) < 0.1 and abs(kept.mean()) < 0.1


def _truncated_normal_moments(mean, std, a, b):
    """The mean and standard deviation of N(mean, std²) truncated to [a, b]."""
    alpha, beta = (a - mean) / std, (b - mean) / std
    pdf = [math.exp(-z * z / 2) / math.sqrt(2 * math.pi) for z in (alpha, beta)]
    mass = (math.erf(beta / math.sqrt(2)) - math.erf(alpha / math.sqrt(2))) / 2
    shift = (pdf[0] - pdf[1]) / mass
    var = 1 + (alpha * pdf[0] - beta * pdf[1]) / mass - shift ** 2
    return mean + std * shift, std * math.sqrt(var)


def _ks_statistic(x, y):
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    points = np.sort(np.concatenate([x, y]))
    return np.max(np.abs(np.searchsorted(np.sort(x), points, "right") / len(x)
                         - np.searchsorted(np.sort(y), points, "right") / len(y)))


@pytest.mark.parametrize(("mean", "std", "a", "b"), [(0.0, 1.0, -2.0, 2.0), (1.0, 0.5, 0.0, 3.0),
                                                      (0.0, 1.0, 1.0, 3.0), (0.0, 0.02, -0.04, 0.04)])
def test_trunc_normal_has_torchs_distribution(mean, std, a, b):
    # both of torch's methods: (0, 1, 1, 3) keeps 16% of normal draws, so uniform draws are accepted by density
    of.manual_seed(3)
    torch.manual_seed(3)
    n, m = 40000, 4000  # torch's density-ratio sampler is slow: fewer of its draws
    ours = init.trunc_normal_(of.tensor(np.zeros(n)), mean, std, a, b).numpy()
    theirs = TNN.init.trunc_normal_(torch.zeros(m, dtype=torch.float64), mean, std, a, b).numpy()
    assert ours.min() >= a and ours.max() <= b
    exact_mean, exact_std = _truncated_normal_moments(mean, std, a, b)
    for sample in (ours, theirs):
        assert abs(sample.mean() - exact_mean) < 4 * exact_std / math.sqrt(len(sample))
        assert abs(sample.std() - exact_std) < 0.05 * exact_std
    assert _ks_statistic(ours, theirs) < 1.95 * math.sqrt((n + m) / (n * m))  # the same law (KS test at 0.1%)


def test_random_inits_take_a_generator_and_deprecated_names_warn_as_torch():
    a = init.xavier_uniform_(of.tensor(np.zeros((4, 5))), generator=np.random.default_rng(7)).numpy()
    b = init.xavier_uniform_(of.tensor(np.zeros((4, 5))), generator=np.random.default_rng(7)).numpy()
    np.testing.assert_array_equal(a, b)
    for name in ["uniform", "normal", "xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal",
                 "orthogonal"]:
        with pytest.warns(FutureWarning, match=f"`nn.init.{name}` is now deprecated in favor of `nn.init.{name}_`"):
            getattr(init, name)(of.tensor(np.zeros((3, 3))))
    with pytest.warns(FutureWarning):
        init.constant(of.tensor(np.zeros(3)), 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        init.trunc_normal_(of.tensor(np.zeros(3)))  # no warning for torch's defaults
    with pytest.warns(UserWarning, match="mean is more than 2 std from"):
        init.trunc_normal_(of.tensor(np.zeros(3)), mean=5.0, a=-1, b=1)


# -- layers ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("dim", "sizes", "shape"), [(1, (3, 4), (2, 12)), (-1, (2, -1), (2, 3, 8)),
                                                     (0, (1, 2, 3), (6, 2)), (1, [5], (2, 5))])
def test_unflatten_matches_torch(dim, sizes, shape):
    x = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    ours, theirs = nn.Unflatten(dim, sizes), TNN.Unflatten(dim, sizes)
    np.testing.assert_array_equal(ours(of.tensor(x)).numpy(), theirs(torch.tensor(x)).numpy())
    assert repr(ours) == repr(theirs).replace("[5]", "(5,)")


def test_unflatten_compiled_with_a_batch_known_at_run_time_and_refusals():
    model = nn.Sequential(nn.Linear(6, 12), nn.Unflatten(1, (3, 4)))
    prog = of.trace(lambda x: {"y": model(x)}, x=of.Spec((None, 6), "float32"))
    out = of.Executor(prog).run(x=np.ones((5, 6), np.float32))["y"]
    assert out.shape == (5, 3, 4)
    with pytest.raises(of.ShapeError, match=r"Unflatten: sizes \(5, 2\) do not multiply to the size of dim 1 \(12\)"):
        nn.Unflatten(1, (5, 2))(of.tensor(np.ones((2, 12))))
    with pytest.raises(of.ArgumentError, match=r"unflattened_size must be a tuple of ints \(one may be -1\)"):
        nn.Unflatten(1, (-1, -1))


def test_bilinear_matches_torch_forward_gradients_and_state_dict():
    torch.manual_seed(0)
    theirs = TNN.Bilinear(3, 4, 5, dtype=torch.float64)
    ours = nn.Bilinear(3, 4, 5, dtype="float64")
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal((2, 6, 3)), rng.standard_normal((2, 6, 4))
    a, b = of.tensor(x1, requires_grad=True), of.tensor(x2, requires_grad=True)
    ta, tb = torch.tensor(x1, requires_grad=True), torch.tensor(x2, requires_grad=True)
    y, ty = ours(a, b), theirs(ta, tb)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-13, atol=1e-14)
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    for o, t in [(a, ta), (b, tb), (ours.weight, theirs.weight), (ours.bias, theirs.bias)]:
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-13)
    compiled = of.compile(ours)
    np.testing.assert_array_equal(compiled(of.tensor(x1), of.tensor(x2)).numpy(), y.numpy())
    assert repr(ours) == repr(theirs)
    nobias = nn.Bilinear(3, 4, 5, bias=False)
    assert nobias.bias is None and nobias(of.tensor(x1[0], dtype="float32"),
                                          of.tensor(x2[0], dtype="float32")).shape == (6, 5)
    with pytest.raises(of.ShapeError, match=r"bilinear\(\): the inputs' leading dims differ"):
        ours(a, of.tensor(x2[:, :5]))


def test_bilinear_default_init_is_torchs_distribution():
    of.manual_seed(0)
    w = nn.Bilinear(16, 8, 200).weight.numpy()
    bound = 1 / math.sqrt(16)  # U(±1/√in1_features), as torch's
    assert w.min() >= -bound and w.max() <= bound and abs(w.std() - bound / math.sqrt(3)) < 0.01


@pytest.mark.parametrize(("kw", "shape"), [
    ({"size": (5, 7)}, (1, 2, 3, 4)),
    ({"scale_factor": 3}, (2, 1, 2, 3)),
    ({"scale_factor": 2, "mode": "bilinear", "align_corners": True}, (1, 2, 3, 4)),
    ({"size": 9, "mode": "linear"}, (2, 3, 4)),
    ({"scale_factor": (2, 1, 3), "mode": "trilinear"}, (1, 1, 2, 3, 2)),
    ({"scale_factor": 1.7, "mode": "nearest-exact"}, (1, 2, 5, 4)),
])
def test_upsample_modes_match_torch(kw, shape):
    x = np.random.default_rng(0).standard_normal(shape)
    np.testing.assert_allclose(nn.Upsample(**kw)(of.tensor(x)).numpy(), TNN.Upsample(**kw)(torch.tensor(x)).numpy(),
                               rtol=1e-13, atol=1e-14)


def test_pixel_shuffle_round_trip_and_identity_as_torch():
    x = np.random.default_rng(0).standard_normal((2, 18, 2, 3))
    shuffled = nn.PixelShuffle(3)(of.tensor(x))
    np.testing.assert_array_equal(shuffled.numpy(), TNN.PixelShuffle(3)(torch.tensor(x)).numpy())
    np.testing.assert_array_equal(nn.PixelUnshuffle(3)(shuffled).numpy(), x)
    assert nn.Identity(54, unused="argument")(shuffled) is shuffled
