"""Adagrad, Adadelta, RMSprop, Adamax, NAdam, RAdam and LBFGS against torch.optim: 20-step trajectories from the same
start with the same gradients (float64), their state, float32, parameter groups, compiled steps (equal to eager, in
place), state dicts (ours and torch's, converted to NumPy) and refusals."""

import numpy as np
import pytest
import torch

import opforge as of
import opforge.optim as optim
from opforge import ops as F
from opforge.checkpoint import StateDictError
from opforge.optim import lbfgs as lbfgs_module

RTOL, ATOL = 1e-11, 1e-14  # float64, the same formulas in the same order: rounding alone may differ
SHAPES = [(3, 4), (5,), ()]
STEPS = 20

CONFIGS = [
    ("Adagrad", {}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1, "initial_accumulator_value": 0.5, "eps": 1e-6}),
    ("Adagrad", {"lr": 0.05, "maximize": True}),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1, "maximize": True}),
    ("RMSprop", {}),
    ("RMSprop", {"lr": 0.005, "alpha": 0.9, "centered": True}),
    ("RMSprop", {"lr": 0.005, "momentum": 0.9, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.002, "momentum": 0.5, "centered": True, "eps": 1e-6, "maximize": True}),
    ("Adamax", {}),
    ("Adamax", {"lr": 0.01, "betas": (0.3, 0.9), "weight_decay": 0.1, "maximize": True}),
    ("NAdam", {}),
    ("NAdam", {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.1, "momentum_decay": 0.01}),
    ("NAdam", {"weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}),
    ("RAdam", {}),  # ρₜ passes 5 at step 6: both branches
    ("RAdam", {"lr": 0.01, "betas": (0.9, 0.9), "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("RAdam", {"lr": 0.01, "betas": (0.3, 0.99), "weight_decay": 0.05, "maximize": True}),
    ("RAdam", {"betas": (0.8, 0.5)}),  # ρ∞ = 3: never rectified
]
IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'defaults'}" for name, kw in CONFIGS]


@pytest.fixture
def torch_float64_default():
    """torch with float64 as its default dtype: NAdam's mu_product is then a float64 tensor, as ours is (with the
    float32 default torch rounds it to float32: see test_nadam_with_torchs_float32_default)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _starts(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def _grads(dtype=np.float64, seed=1, steps=STEPS):
    rng = np.random.default_rng(seed)
    grads = [[rng.standard_normal(s).astype(dtype) for s in SHAPES] for _ in range(steps)]
    grads[3][1] = None  # a parameter with no gradient is skipped by both
    return grads


def _torch_run(name, kw, starts, grads):
    tparams = [torch.tensor(a, requires_grad=True) for a in starts]
    topt = getattr(torch.optim, name)(tparams, **kw)
    for step in grads:
        for p, g in zip(tparams, step):
            p.grad = None if g is None else torch.tensor(g)
        topt.step()
    return tparams, topt


def _ours_run(name, kw, starts, grads, params=None, opt=None):
    params = params or [of.tensor(a, requires_grad=True) for a in starts]
    opt = opt or getattr(optim, name)(params, **kw)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = None if g is None else of.tensor(g)
        opt.step()
    return params, opt


def _check_state(opt, params, topt, tparams):
    for p, tp in zip(params, tparams):
        ours, theirs = opt.state[p], topt.state[tp]
        assert sorted(ours) == sorted(theirs)  # torch's names, no more, no fewer
        for key, value in ours.items():
            np.testing.assert_allclose(value.numpy(), theirs[key].detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.parametrize(("name", "kw"), CONFIGS, ids=IDS)
def test_trajectory_and_state_equal_torchs_over_20_steps(name, kw, torch_float64_default):
    starts, grads = _starts(), _grads()
    params, opt = _ours_run(name, kw, starts, grads)
    tparams, topt = _torch_run(name, kw, starts, grads)
    for p, tp, start in zip(params, tparams, starts):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=RTOL, atol=ATOL)
        assert not np.array_equal(p.numpy(), start)  # it moved
    _check_state(opt, params, topt, tparams)


def test_nadam_with_torchs_float32_default():
    # torch keeps mu_product in its default scalar dtype: float32 unless the default dtype is float64. Ours is
    # float64 always, so with torch's float32 default the trajectories differ by that rounding alone.
    starts, grads = _starts(), _grads()
    params, _ = _ours_run("NAdam", {}, starts, grads)
    tparams, topt = _torch_run("NAdam", {}, starts, grads)
    assert topt.state[tparams[0]]["mu_product"].dtype == torch.float32
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-7, atol=1e-9)


def test_defaults_and_group_entries_are_torchs():
    for name, _ in [*CONFIGS, ("LBFGS", {})]:
        params = [of.tensor(np.zeros(2), requires_grad=True)]
        ours = getattr(optim, name)(params).state_dict()["param_groups"][0]
        theirs = getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)]).state_dict()["param_groups"][0]
        assert ours == theirs, name


@pytest.mark.parametrize("name", ["Adagrad", "Adadelta", "RMSprop", "Adamax", "NAdam", "RAdam"])
def test_float32_parameters_stay_float32_and_match_torch(name):
    kw = dict(CONFIGS[[n for n, _ in CONFIGS].index(name) + 1][1])
    starts, grads = _starts(np.float32), _grads(np.float32)
    params, opt = _ours_run(name, kw, starts, grads)
    tparams, _ = _torch_run(name, kw, starts, grads)
    for p, tp in zip(params, tparams):
        assert p.dtype == np.float32
        assert all(v.dtype in (np.float32, np.int64) for k, v in opt.state[p].items() if k != "mu_product")
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=2e-5, atol=1e-6)


def test_parameter_groups_have_their_own_hyper_parameters():
    starts, grads = _starts(), _grads()
    groups = [{"idx": [0], "lr": 0.02, "momentum": 0.5, "centered": True}, {"idx": [1, 2], "alpha": 0.9}]

    def make(module, params):
        return module.RMSprop([{**{k: v for k, v in g.items() if k != "idx"}, "params": [params[i] for i in g["idx"]]}
                               for g in groups], lr=0.005, weight_decay=0.01)

    params = [of.tensor(a, requires_grad=True) for a in starts]
    tparams = [torch.tensor(a, requires_grad=True) for a in starts]
    opt, topt = make(optim, params), make(torch.optim, tparams)
    assert sorted(opt.state[params[0]]) == ["grad_avg", "momentum_buffer", "square_avg", "step"]
    assert sorted(opt.state[params[1]]) == ["square_avg", "step"]
    _ours_run(None, None, starts, grads, params, opt)
    _torch_run_with(topt, tparams, grads)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=RTOL, atol=ATOL)
    _check_state(opt, params, topt, tparams)


def _torch_run_with(topt, tparams, grads):
    for step in grads:
        for p, g in zip(tparams, step):
            p.grad = None if g is None else torch.tensor(g)
        topt.step()


def test_flags_that_do_not_change_results_are_accepted_and_differentiable_is_refused():
    starts, grads = _starts(), _grads()[:5]
    plain, _ = _ours_run("Adadelta", {}, starts, grads)
    flagged, _ = _ours_run("Adadelta", {"foreach": True, "capturable": True}, starts, grads)
    for a, b in zip(plain, flagged):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    p = [of.tensor(np.ones(2), requires_grad=True)]
    with pytest.raises(of.ArgumentError, match=r"RAdam\(\): differentiable=True .* not supported"):
        optim.RAdam(p, differentiable=True)
    with pytest.raises(of.ArgumentError, match=r"Adagrad\(\): fused=True and foreach=True cannot be set together"):
        optim.Adagrad(p, fused=True, foreach=True)
    with pytest.raises(of.ArgumentError, match=r"NAdam\(\): maximize must be a bool, got str"):
        optim.NAdam(p, maximize="yes")


def test_bad_arguments_are_refused_naming_the_class_and_the_argument():
    p = [of.tensor(np.ones(2), requires_grad=True)]
    cases = [  # what torch refuses, we refuse, at construction
        (lambda: optim.Adagrad(p, lr=-1), r"Adagrad\(\): lr must be >= 0, got -1"),
        (lambda: optim.Adagrad(p, lr_decay=-0.1), r"Adagrad\(\): lr_decay must be >= 0"),
        (lambda: optim.Adagrad(p, initial_accumulator_value=-1), r"initial_accumulator_value must be >= 0"),
        (lambda: optim.Adadelta(p, rho=1.5), r"Adadelta\(\): rho must be in \[0, 1\], got 1.5"),
        (lambda: optim.Adadelta(p, eps=-1e-6), r"Adadelta\(\): eps must be >= 0"),
        (lambda: optim.RMSprop(p, alpha=-0.1), r"RMSprop\(\): alpha must be >= 0"),
        (lambda: optim.RMSprop(p, momentum=-0.9), r"RMSprop\(\): momentum must be >= 0"),
        (lambda: optim.Adamax(p, betas=(1.0, 0.9)), r"Adamax\(\): betas must be two numbers in \[0, 1\)"),
        (lambda: optim.NAdam(p, momentum_decay=-1), r"NAdam\(\): momentum_decay must be >= 0"),
        (lambda: optim.RAdam(p, weight_decay=-1), r"RAdam\(\): weight_decay must be >= 0"),
        (lambda: optim.RAdam(p, lr=float("nan")), r"RAdam\(\): hyper-parameter lr must be a finite number"),
        (lambda: optim.LBFGS(p, line_search_fn="armijo"), r"LBFGS\(\): line_search_fn must be None or 'strong_wolfe'"),
        (lambda: optim.LBFGS(p, history_size=0), r"LBFGS\(\): history_size must be a positive int"),
        (lambda: optim.LBFGS([{"params": p}, {"params": [of.tensor(np.ones(1), requires_grad=True)]}]),
         r"LBFGS\(\): parameter groups .* not supported"),
    ]
    for make, message in cases:
        with pytest.raises(of.ArgumentError, match=message):
            make()
    # torch accepts these edges: so do we
    optim.Adadelta(p, rho=1.0)
    optim.RMSprop(p, alpha=1.5)


# -- compiled steps ---------------------------------------------------------------------------------------------------

def _model(seed=3):
    rng = np.random.default_rng(seed)
    return [of.tensor(rng.standard_normal((3, 5)) * 0.5, requires_grad=True),
            of.tensor(rng.standard_normal(5) * 0.1, requires_grad=True),
            of.tensor(rng.standard_normal((5, 2)) * 0.5, requires_grad=True)]


def _batches(n=8, seed=4):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, 3)), rng.standard_normal((8, 2))) for _ in range(n)]


def _train_step(params, opt):
    w1, b1, w2 = params

    def train_step(x, y):
        loss = F.sum(F.square(F.tanh(x @ w1 + b1) @ w2 - y)) * 0.1
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return train_step


def _torch_losses(name, kw, batches):
    tparams = [torch.tensor(p.numpy(), requires_grad=True) for p in _model()]
    w1, b1, w2 = tparams
    topt = getattr(torch.optim, name)(tparams, **kw)
    losses = []
    for x, y in batches:
        loss = torch.sum(torch.square(torch.tanh(torch.tensor(x) @ w1 + b1) @ w2 - torch.tensor(y))) * 0.1
        loss.backward()
        topt.step()
        topt.zero_grad()
        losses.append(loss.item())
    return losses, tparams


COMPILED = [CONFIGS[1], CONFIGS[4], CONFIGS[8], CONFIGS[10], CONFIGS[13], CONFIGS[15]]


@pytest.mark.parametrize(("name", "kw"), COMPILED, ids=[IDS[CONFIGS.index(c)] for c in COMPILED])
def test_compiled_step_equals_eager_and_torch_and_updates_in_place(name, kw, torch_float64_default):
    batches = _batches()
    eager_params, comp_params = _model(), _model()
    eager_opt, comp_opt = getattr(optim, name)(eager_params, **kw), getattr(optim, name)(comp_params, **kw)
    eager, compiled = _train_step(eager_params, eager_opt), of.compile(_train_step(comp_params, comp_opt))
    arrays = [p.numpy() for p in comp_params] + [s.numpy() for p in comp_params for s in comp_opt.state[p].values()]
    t_losses, t_params = _torch_losses(name, kw, batches)
    for k, (x, y) in enumerate(batches):
        le, lc = eager(of.tensor(x), of.tensor(y)), compiled(of.tensor(x), of.tensor(y))
        assert lc.item() == le.item()  # the same ops on the same values: the same numbers
        np.testing.assert_allclose(le.item(), t_losses[k], rtol=RTOL)
    assert len(compiled.cache) == 1  # traced once, the step count read at run time
    for pe, pc, tp in zip(eager_params, comp_params, t_params):
        np.testing.assert_array_equal(pc.numpy(), pe.numpy())
        np.testing.assert_allclose(pe.numpy(), tp.detach().numpy(), rtol=RTOL, atol=ATOL)
        for key, value in eager_opt.state[pe].items():
            np.testing.assert_array_equal(comp_opt.state[pc][key].numpy(), value.numpy())
    # in place: the parameters and every state tensor still own the arrays they started with
    assert all(a is b for a, b in zip(arrays, [p.numpy() for p in comp_params]
                                      + [s.numpy() for p in comp_params for s in comp_opt.state[p].values()]))
    ((entry,),) = compiled.cache.values()
    source = entry.exe.plan(x=batches[0][0], y=batches[0][1]).source
    assert source.count("_copy_into(") <= len(comp_params)  # at most the 0-d step counters are copied


# -- state dicts --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "kw"), [CONFIGS[1], CONFIGS[4], CONFIGS[8], CONFIGS[10], CONFIGS[12], CONFIGS[15]],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_state_dict_round_trip_continues_identically(name, kw, tmp_path):
    starts, grads = _starts(), _grads()
    params, opt = _ours_run(name, kw, starts, grads[:6])
    of.save({"params": [p.numpy() for p in params], "optimizer": opt.state_dict()}, tmp_path / "ckpt.npz")
    copies = [of.tensor(p.numpy(), requires_grad=True) for p in params]
    opt2 = getattr(optim, name)(copies, **{**kw, "lr": 0.5})
    arrays = [s.numpy() for p in copies for s in opt2.state[p].values()]
    loaded = of.load(tmp_path / "ckpt.npz", like={"params": [p.numpy() for p in copies],
                                                  "optimizer": opt2.state_dict()})
    opt2.load_state_dict(loaded["optimizer"])
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert all(a is b for a, b in zip(arrays, [s.numpy() for p in copies for s in opt2.state[p].values()]))
    _ours_run(name, kw, starts, grads[6:], params, opt)
    _ours_run(name, kw, starts, grads[6:], copies, opt2)
    for a, b in zip(params, copies):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def _to_numpy(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().numpy().copy()
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_numpy(v) for v in tree)
    return tree


@pytest.mark.parametrize(("name", "kw"), [CONFIGS[2], CONFIGS[4], CONFIGS[7], CONFIGS[9], CONFIGS[11], CONFIGS[14]],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_a_torch_state_dict_converted_to_numpy_loads_and_continues_as_torch(name, kw, torch_float64_default):
    starts, grads = _starts(), _grads()
    tparams, topt = _torch_run(name, kw, starts, grads[:7])
    sd = _to_numpy(topt.state_dict())
    params = [of.tensor(p.detach().numpy(), requires_grad=True) for p in tparams]
    opt = getattr(optim, name)(params, **kw)
    opt.load_state_dict(sd)
    _ours_run(name, kw, starts, grads[7:], params, opt)
    _torch_run_with(topt, tparams, grads[7:])
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=RTOL, atol=ATOL)
    _check_state(opt, params, topt, tparams)


def test_a_parameter_without_state_in_torchs_dict_starts_afresh():
    # torch makes a parameter's state at its first step: a state dict holds none for one that never had a gradient
    starts, grads = _starts(), _grads()[:4]
    for step in grads:
        step[2] = None
    tparams, topt = _torch_run("RMSprop", {"momentum": 0.9}, starts, grads)
    sd = _to_numpy(topt.state_dict())
    assert sorted(sd["state"]) == [0, 1]
    params = [of.tensor(p.detach().numpy(), requires_grad=True) for p in tparams]
    opt = optim.RMSprop(params, momentum=0.9)
    _ours_run("RMSprop", {}, starts, _grads()[:2], params, opt)  # state to be forgotten
    with of.no_grad():
        for p, tp in zip(params, tparams):
            p.copy_(of.tensor(tp.detach().numpy()))
    opt.load_state_dict(sd)
    assert opt.state[params[2]]["step"].item() == 0 and not opt.state[params[2]]["square_avg"].numpy().any()
    more = _grads(seed=5)[:5]
    _ours_run(None, None, starts, more, params, opt)
    _torch_run_with(topt, tparams, more)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=RTOL, atol=ATOL)


def test_load_state_dict_refuses_what_does_not_fit():
    params = [of.tensor(np.ones((2, 3)), requires_grad=True)]
    opt = optim.Adadelta(params)
    sd = opt.state_dict()
    sd["state"][0]["acc_delta"] = np.ones((3, 2))
    sd["state"][0]["step"] = np.array(2.5)  # not a whole count
    sd["param_groups"][0]["betas"] = (0.9, 0.99)
    del sd["param_groups"][0]["rho"]
    with pytest.raises(StateDictError) as info:
        opt.load_state_dict(sd)
    text = str(info.value)
    for line in ["state/0/acc_delta: expected shape (2, 3), got (3, 2)", "state/0/step: expected dtype int64, got "
                 "float64", "missing: param_groups/0/rho", "unexpected: param_groups/0/betas"]:
        assert line in text
    assert opt.state[params[0]]["step"].item() == 0


# -- LBFGS -------------------------------------------------------------------------------------------------------------

def _logistic(seed=0):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((30, 6)), np.sign(rng.standard_normal(30))
    return x, y, rng.standard_normal(6) * 0.5, np.array([0.3])


def _lbfgs_pair(kw, compiled=False, seed=0):
    x, y, w0, b0 = _logistic(seed)
    params = [of.tensor(w0, requires_grad=True), of.tensor(b0, requires_grad=True)]
    tparams = [torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)]
    opt, topt = optim.LBFGS(params, **kw), torch.optim.LBFGS(tparams, **kw)
    xo, yo, xt, yt = of.tensor(x), of.tensor(y), torch.tensor(x), torch.tensor(y)

    def closure():
        opt.zero_grad()
        w, b = params
        loss = F.sum(F.softplus(-yo * (xo @ w + b))) + 0.05 * F.sum(F.square(w))
        loss.backward()
        return loss

    def tclosure():
        topt.zero_grad()
        w, b = tparams
        loss = torch.sum(torch.nn.functional.softplus(-yt * (xt @ w + b))) + 0.05 * torch.sum(torch.square(w))
        loss.backward()
        return loss

    return params, opt, of.compile(closure) if compiled else closure, tparams, topt, tclosure


LBFGS_CONFIGS = [
    {"max_iter": 2},
    {"lr": 0.5, "history_size": 3, "max_iter": 3},  # the history overflows
    {"lr": 0.1, "max_iter": 4, "max_eval": 3},
    {"max_iter": 3, "line_search_fn": "strong_wolfe"},
    {"lr": 8, "history_size": 2, "max_iter": 4, "line_search_fn": "strong_wolfe"},  # overshoots: zooms
    {"lr": 0.01, "max_iter": 1, "max_eval": 10, "line_search_fn": "strong_wolfe"},  # too short: extrapolates
]


@pytest.mark.parametrize("kw", LBFGS_CONFIGS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_lbfgs_trajectory_and_state_equal_torchs(kw, monkeypatch):
    calls = []
    interpolate = lbfgs_module._cubic_interpolate
    monkeypatch.setattr(lbfgs_module, "_cubic_interpolate",
                        lambda *a, bounds=None: calls.append(bounds) or interpolate(*a, bounds=bounds))
    params, opt, closure, tparams, topt, tclosure = _lbfgs_pair(kw)
    for _ in range(STEPS):
        loss, tloss = opt.step(closure), topt.step(tclosure)
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=RTOL)
        for p, tp in zip(params, tparams):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-10, atol=1e-12)
    state, tstate = opt.state[params[0]], topt.state[tparams[0]]
    assert sorted(state) == sorted(tstate)
    for key in ("func_evals", "n_iter"):
        assert state[key] == tstate[key], key
    assert len(state["old_dirs"]) == len(tstate["old_dirs"]) <= kw.get("history_size", 100)
    for a, b in zip(state["old_dirs"] + [state["d"]], tstate["old_dirs"] + [tstate["d"]]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-10)
    if kw.get("lr") == 8:
        assert None in calls  # the line search zoomed in a bracket
    if kw.get("lr") == 0.01:
        assert any(b is not None for b in calls)  # it extrapolated to find one


def test_lbfgs_with_a_compiled_closure_equals_eager_and_refuses_to_be_compiled():
    kw = LBFGS_CONFIGS[4]
    params, opt, closure, *_ = _lbfgs_pair(kw, compiled=True)
    eager_params, eager_opt, eager_closure, *_ = _lbfgs_pair(kw)
    for _ in range(5):
        assert opt.step(closure).item() == eager_opt.step(eager_closure).item()
    for a, b in zip(params, eager_params):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert sum(len(entries) for entries in closure.cache.values()) == 1  # every evaluation runs one program
    with pytest.raises(of.ArgumentError, match=r"LBFGS.step\(\) cannot run inside a compiled function"):
        of.compile(lambda x: opt.step(closure) * x)(of.tensor(1.0))
    with pytest.raises(of.ArgumentError, match=r"LBFGS.step\(\): needs a closure"):
        opt.step()


def test_lbfgs_state_dicts_ours_and_torchs_load_and_continue():
    kw = LBFGS_CONFIGS[4]
    params, opt, closure, tparams, topt, tclosure = _lbfgs_pair(kw)
    for _ in range(3):
        opt.step(closure)
        topt.step(tclosure)
    sd, tsd = opt.state_dict(), _to_numpy(topt.state_dict())
    assert sorted(sd["state"][0]) == sorted(tsd["state"][0])
    assert sd["param_groups"] == tsd["param_groups"]
    # ours into a fresh optimizer on copies: the same steps after
    copies, opt2, closure2, *_ = _lbfgs_pair(kw)
    from_torch, opt3, closure3, *_ = _lbfgs_pair(kw)
    with of.no_grad():
        for c, p in zip(copies, params):
            c.copy_(p)
        # torch's (as NumPy) into another: continues as torch does
        for c, p in zip(from_torch, tparams):
            c.copy_(of.tensor(p.detach().numpy()))
    opt2.load_state_dict(sd)
    opt3.load_state_dict(tsd)
    for _ in range(4):
        opt.step(closure)
        opt2.step(closure2)
        opt3.step(closure3)
        topt.step(tclosure)
    for a, b, c, t in zip(params, copies, from_torch, tparams):
        np.testing.assert_array_equal(b.numpy(), a.numpy())
        np.testing.assert_allclose(c.numpy(), t.detach().numpy(), rtol=1e-10, atol=1e-12)
    bad = opt.state_dict()
    bad["state"][0]["d"] = np.ones(3)
    with pytest.raises(of.ArgumentError, match=r"state 'd' must be a vector of 7 values, got shape \(3,\)"):
        opt.load_state_dict(bad)
