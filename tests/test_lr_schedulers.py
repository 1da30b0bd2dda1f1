"""The learning-rate schedules against torch.optim.lr_scheduler: the learning rates (and cycled momentum or betas)
over enough steps to pass every phase, two parameter groups, state dicts (round trip, and torch's), resuming with
last_epoch, compositions (SequentialLR, ChainedScheduler), a compiled step following a schedule, refusals."""

import warnings

import numpy as np
import pytest
import torch

import opforge as of
import opforge.optim as optim
from opforge import ops as F

TS = torch.optim.lr_scheduler
STEPS = 45

# name -> (ours, torch's): each makes a schedule on an optimizer; the 45 steps cover every phase of each
SCHEDULES = {
    "StepLR": lambda m, o: m.StepLR(o, step_size=4, gamma=0.5),
    "MultiStepLR": lambda m, o: m.MultiStepLR(o, milestones=[3, 7, 7, 20], gamma=0.3),
    "ConstantLR": lambda m, o: m.ConstantLR(o, factor=0.25, total_iters=6),
    "LinearLR": lambda m, o: m.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=6),
    "ExponentialLR": lambda m, o: m.ExponentialLR(o, gamma=0.9),
    "PolynomialLR": lambda m, o: m.PolynomialLR(o, total_iters=20, power=2.0),
    "PolynomialLR-defaults": lambda m, o: m.PolynomialLR(o),
    "CosineAnnealingLR": lambda m, o: m.CosineAnnealingLR(o, T_max=7, eta_min=1e-3),  # past T_max: back up
    "CosineAnnealingWarmRestarts": lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=1e-3),
    "CosineAnnealingWarmRestarts-T_mult=1": lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=5),
    "LambdaLR": lambda m, o: m.LambdaLR(o, [lambda e: 0.95 ** e, lambda e: 1 / (1 + e)]),
    "MultiplicativeLR": lambda m, o: m.MultiplicativeLR(o, lambda e: 0.9 if e % 2 else 1.05),
    "CyclicLR-triangular": lambda m, o: m.CyclicLR(o, 0.01, 0.1, step_size_up=4, step_size_down=6),
    "CyclicLR-triangular2": lambda m, o: m.CyclicLR(o, [0.01, 0.02], [0.1, 0.05], step_size_up=5,
                                                    mode="triangular2", base_momentum=0.7, max_momentum=0.95),
    "CyclicLR-exp_range": lambda m, o: m.CyclicLR(o, 0.01, 0.1, step_size_up=3, mode="exp_range", gamma=0.97,
                                                  cycle_momentum=False),
    "CyclicLR-scale_fn": lambda m, o: m.CyclicLR(o, 0.01, 0.1, step_size_up=4, scale_fn=lambda x: 0.9 ** x,
                                                 scale_mode="iterations"),
    "OneCycleLR": lambda m, o: m.OneCycleLR(o, max_lr=0.5, total_steps=STEPS),
    "OneCycleLR-three_phase-linear": lambda m, o: m.OneCycleLR(
        o, max_lr=[0.5, 0.2], epochs=5, steps_per_epoch=9, pct_start=0.25, three_phase=True, anneal_strategy="linear",
        div_factor=10.0, final_div_factor=100.0, base_momentum=[0.8, 0.85], max_momentum=0.9),
    "SequentialLR": lambda m, o: m.SequentialLR(o, [m.LinearLR(o, 0.1, total_iters=5), m.ExponentialLR(o, 0.9),
                                                    m.CosineAnnealingLR(o, T_max=10)], milestones=[5, 15]),
    "SequentialLR-step-multistep": lambda m, o: m.SequentialLR(
        o, [m.ConstantLR(o, 0.5, total_iters=3), m.StepLR(o, 3), m.MultiStepLR(o, [2, 4])], milestones=[8, 20]),
    "ChainedScheduler": lambda m, o: m.ChainedScheduler([m.ConstantLR(o, 0.1, total_iters=4),
                                                         m.ExponentialLR(o, 0.9), m.CosineAnnealingLR(o, 6)]),
    "ChainedScheduler-warmup-poly": lambda m, o: m.ChainedScheduler([m.LinearLR(o, 0.2, total_iters=8),
                                                                     m.PolynomialLR(o, total_iters=30, power=0.5)],
                                                                    optimizer=o),
}


def _optimizers(kind="SGD", kw=None):
    kw = {"lr": 0.1, "momentum": 0.9} if kw is None else kw
    params = [of.tensor(np.ones(2), requires_grad=True), of.tensor(np.ones(3), requires_grad=True)]
    tparams = [torch.ones(2, dtype=torch.float64, requires_grad=True),
               torch.ones(3, dtype=torch.float64, requires_grad=True)]
    opt = getattr(optim, kind)([{"params": params[:1]}, {"params": params[1:], "lr": 0.03}], **kw)
    topt = getattr(torch.optim, kind)([{"params": tparams[:1]}, {"params": tparams[1:], "lr": 0.03}], **kw)
    return params, opt, tparams, topt


def _cycled(opt):
    return [(g.get("momentum"), g.get("betas")) for g in opt.param_groups]


def _torch_step(topt):
    with warnings.catch_warnings():  # torch warns when a schedule steps an optimizer that never stepped
        warnings.simplefilter("ignore")
        topt.step()


def _follow(sched, tsched, opt, topt, steps=STEPS):
    for k in range(steps):
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-13, abs=1e-16), k
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([g["lr"] for g in topt.param_groups],
                                                                    rel=1e-13, abs=1e-16), k
        assert _cycled(opt) == _cycled(topt), k
        _torch_step(topt)
        sched.step()
        tsched.step()


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_learning_rates_equal_torchs_over_every_phase(name):
    _, opt, _, topt = _optimizers()
    lr_arrays = [g.lr_tensor.numpy() for g in opt.param_groups]
    sched, tsched = SCHEDULES[name](optim, opt), SCHEDULES[name](TS, topt)
    _follow(sched, tsched, opt, topt)
    assert all(a is g.lr_tensor.numpy() for a, g in zip(lr_arrays, opt.param_groups))  # written in place
    assert sorted(opt.param_groups[0].hyper()) == sorted(k for k in topt.param_groups[0] if k != "params")


@pytest.mark.parametrize(("kind", "kw"), [("Adam", {}), ("NAdam", {"lr": 0.01}), ("RMSprop", {})])
def test_momentum_cycles_on_other_optimizers_as_torchs(kind, kw):
    for name in ("OneCycleLR", "CyclicLR-triangular2"):
        _, opt, _, topt = _optimizers(kind, kw)
        _follow(SCHEDULES[name](optim, opt), SCHEDULES[name](TS, topt), opt, topt)


def test_a_cyclic_schedule_turning_momentum_on_trains_as_torch():
    # SGD without momentum: CyclicLR's cycle_momentum turns it on (torch makes the buffer at the first step that
    # needs it; so do we)
    params, opt, tparams, topt = _optimizers("SGD", {"lr": 0.1})
    sched, tsched = SCHEDULES["CyclicLR-triangular"](optim, opt), SCHEDULES["CyclicLR-triangular"](TS, topt)
    rng = np.random.default_rng(0)
    for _ in range(12):
        for p, tp in zip(params, tparams):
            g = rng.standard_normal(p.shape)
            p.grad, tp.grad = of.tensor(g), torch.tensor(g)
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
    assert "momentum_buffer" in opt.state[params[0]]
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-12)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_state_dict_round_trip_continues_identically(name, tmp_path):
    _, opt, _, _ = _optimizers()
    sched = SCHEDULES[name](optim, opt)
    for _ in range(13):
        sched.step()
    of.save({"optimizer": opt.state_dict(), "sched": sched.state_dict()}, tmp_path / "ckpt.npz")
    _, opt2, _, _ = _optimizers()
    sched2 = SCHEDULES[name](optim, opt2)
    saved = of.load(tmp_path / "ckpt.npz")
    opt2.load_state_dict(saved["optimizer"])
    sched2.load_state_dict(saved["sched"])
    for _ in range(STEPS - 14):
        sched.step()
        sched2.step()
        assert sched2.get_last_lr() == sched.get_last_lr()
        assert _cycled(opt2) == _cycled(opt)


@pytest.mark.parametrize("name", ["StepLR", "ExponentialLR", "OneCycleLR", "CyclicLR-triangular2",
                                  "CosineAnnealingWarmRestarts", "SequentialLR", "ChainedScheduler"])
def test_torchs_state_dict_has_our_entries_and_loads(name):
    _, opt, _, topt = _optimizers()
    sched, tsched = SCHEDULES[name](optim, opt), SCHEDULES[name](TS, topt)
    for _ in range(11):
        _torch_step(topt)
        tsched.step()
    tsd = tsched.state_dict()
    ours = sched.state_dict()
    assert set(ours) <= set(tsd) <= set(ours) | {"_get_lr_called_within_step"}
    opt.load_state_dict({"state": {}, "param_groups": [
        {k: v for k, v in g.items()} for g in topt.state_dict()["param_groups"]]})
    sched.load_state_dict(tsd)
    _follow(sched, tsched, opt, topt, steps=STEPS - 12)


@pytest.mark.parametrize("name", ["StepLR", "ExponentialLR", "CosineAnnealingLR", "LinearLR", "PolynomialLR"])
def test_resuming_with_last_epoch_is_torchs(name):
    kw = {"StepLR": {"step_size": 3}, "ExponentialLR": {"gamma": 0.8}, "CosineAnnealingLR": {"T_max": 9},
          "LinearLR": {"total_iters": 8}, "PolynomialLR": {"total_iters": 12}}[name]
    _, opt, _, topt = _optimizers()
    sched, tsched = getattr(optim, name)(opt, **kw), getattr(TS, name)(topt, **kw)
    for _ in range(4):
        _torch_step(topt)
        sched.step()
        tsched.step()
    # a new schedule resuming at epoch 4 on the same optimizers (which hold initial_lr)
    _follow(getattr(optim, name)(opt, last_epoch=4, **kw), getattr(TS, name)(topt, last_epoch=4, **kw), opt, topt,
            steps=15)
    _, fresh, _, _ = _optimizers()
    with pytest.raises(of.ArgumentError, match=r"resuming with last_epoch=4 needs 'initial_lr' in param_groups\[0\]"):
        getattr(optim, name)(fresh, last_epoch=4, **kw)


def test_warm_restarts_with_fractional_epochs_are_torchs():
    _, opt, _, topt = _optimizers()
    sched = optim.CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=3, eta_min=0.01)
    tsched = TS.CosineAnnealingWarmRestarts(topt, T_0=2, T_mult=3, eta_min=0.01)
    for epoch in range(12):
        for i in range(4):
            _torch_step(topt)
            sched.step(epoch + i / 4)
            tsched.step(epoch + i / 4)
            assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-13)


def test_step_with_an_epoch_uses_the_closed_form_and_warns_as_torch():
    _, opt, _, topt = _optimizers()
    sched, tsched = optim.MultiStepLR(opt, [2, 5], 0.5), TS.MultiStepLR(topt, [2, 5], 0.5)
    for epoch in (3, 7, 1):
        with pytest.warns(UserWarning, match="epoch parameter in `scheduler.step\\(\\)`"):
            sched.step(epoch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tsched.step(epoch)
        assert sched.get_last_lr() == tsched.get_last_lr()


CYCLED = {  # an optimizer whose momentum or beta1 a schedule cycles: (ours, torch's), from their parameters
    "SGD": (lambda w: optim.SGD(w, lr=0.1, momentum=0.9), lambda w: torch.optim.SGD(w, lr=0.1, momentum=0.9)),
    "SGD nesterov": (lambda w: optim.SGD(w, lr=0.1, momentum=0.9, nesterov=True),
                     lambda w: torch.optim.SGD(w, lr=0.1, momentum=0.9, nesterov=True)),
    "Adam": (lambda w: optim.Adam(w, lr=0.1), lambda w: torch.optim.Adam(w, lr=0.1)),
    "AdamW": (lambda w: optim.AdamW(w, lr=0.1), lambda w: torch.optim.AdamW(w, lr=0.1)),
    "RMSprop": (lambda w: optim.RMSprop(w, lr=0.01, momentum=0.9), lambda w: torch.optim.RMSprop(w, lr=0.01,
                                                                                              momentum=0.9)),
    "Adamax": (lambda w: optim.Adamax(w, lr=0.1), lambda w: torch.optim.Adamax(w, lr=0.1)),
    "NAdam": (lambda w: optim.NAdam(w, lr=0.1), lambda w: torch.optim.NAdam(w, lr=0.1)),
    "RAdam": (lambda w: optim.RAdam(w, lr=0.1), lambda w: torch.optim.RAdam(w, lr=0.1)),
}


@pytest.mark.parametrize("schedule", ["OneCycleLR", "CyclicLR"])
@pytest.mark.parametrize("name", list(CYCLED))
def test_a_compiled_step_follows_a_cycled_momentum_as_eager_and_torch_without_tracing_again(name, schedule):
    # the learning rate, the momentum and beta1 are tensors the program reads: one trace for the whole schedule
    rng = np.random.default_rng(4)
    batches = [(rng.standard_normal((8, 3)), rng.standard_normal((8, 2))) for _ in range(8)]
    w0 = rng.standard_normal((3, 2))
    ours, theirs = CYCLED[name]

    def schedule_of(module, opt):
        if schedule == "OneCycleLR":
            return module.OneCycleLR(opt, max_lr=0.3, total_steps=len(batches))
        return module.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=3)

    def setup():
        w = of.tensor(w0, requires_grad=True)
        opt = ours([w])
        sched = schedule_of(optim, opt)

        def step(x, y):
            loss = F.sum(F.square(F.tanh(x @ w) - y))
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return w, opt, sched, step

    w_e, _, sched_e, eager = setup()
    w_c, opt_c, sched_c, step = setup()
    compiled = of.compile(step)
    tw = torch.tensor(w0, requires_grad=True)
    topt = theirs([tw])
    tsched = schedule_of(TS, topt)
    momenta = set()
    for x, y in batches:
        group = opt_c.param_groups[0]
        momenta.add(group["momentum"] if "momentum" in group else group["betas"][0])
        le, lc = eager(of.tensor(x), of.tensor(y)), compiled(of.tensor(x), of.tensor(y))
        assert lc.item() == le.item()
        loss = torch.sum(torch.square(torch.tanh(torch.tensor(x) @ tw) - torch.tensor(y)))
        loss.backward()
        topt.step()
        topt.zero_grad()
        rtol = 1e-6 if name == "NAdam" else 1e-12  # (torch's NAdam keeps its product of momenta in float32)
        np.testing.assert_allclose(le.item(), loss.item(), rtol=rtol)
        np.testing.assert_array_equal(w_c.numpy(), w_e.numpy())
        np.testing.assert_allclose(w_e.numpy(), tw.detach().numpy(), rtol=rtol)
        for s in (sched_e, sched_c, tsched):
            s.step()
    assert len(momenta) >= 5
    assert sum(len(entries) for entries in compiled.cache.values()) == 1


def test_bad_arguments_are_refused_clearly():
    _, opt, _, _ = _optimizers()
    _, adagrad, _, _ = _optimizers("Adagrad", {"lr": 0.1})
    cases = [
        (lambda: optim.StepLR(opt, step_size=0), r"StepLR\(\): step_size must be a positive number"),
        (lambda: optim.MultiStepLR(opt, [1.5]), r"MultiStepLR\(\): milestones must be ints"),
        (lambda: optim.ConstantLR(opt, factor=2), r"ConstantLR\(\): factor must be in \[0, 1\], got 2"),
        (lambda: optim.LinearLR(opt, start_factor=0), r"LinearLR\(\): start_factor must be in \(0, 1\]"),
        (lambda: optim.PolynomialLR(opt, total_iters=0), r"PolynomialLR\(\): total_iters must be a positive int"),
        (lambda: optim.CosineAnnealingWarmRestarts(opt, T_0=0), r"T_0 must be a positive int"),
        (lambda: optim.CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=1.5), r"T_mult must be a positive int"),
        (lambda: optim.CyclicLR(opt, 0.01, 0.1, mode="sawtooth"), r"CyclicLR\(\): mode must be 'triangular'"),
        (lambda: optim.CyclicLR(opt, [0.01] * 3, 0.1), r"base_lr must have one value per parameter group \(2\)"),
        (lambda: optim.CyclicLR(adagrad, 0.01, 0.1), r"CyclicLR\(\): cycle_momentum needs an optimizer with momentum"),
        (lambda: optim.OneCycleLR(opt, 0.1), r"OneCycleLR\(\): give total_steps, or epochs and steps_per_epoch"),
        (lambda: optim.OneCycleLR(opt, 0.1, total_steps=10, pct_start=1), r"pct_start must be a float in \[0, 1\]"),
        (lambda: optim.OneCycleLR(opt, 0.1, total_steps=10, anneal_strategy="exp"), r"anneal_strategy must be"),
        (lambda: optim.SequentialLR(opt, [optim.ExponentialLR(opt, 0.9)], milestones=[3]),
         r"SequentialLR\(\): expects one milestone fewer than schedulers"),
        (lambda: optim.ChainedScheduler([]), r"ChainedScheduler\(\): expects at least one scheduler"),
        (lambda: optim.ChainedScheduler([optim.ExponentialLR(opt, 0.9), optim.ReduceLROnPlateau(opt)]),
         r"scheduler 1 is a ReduceLROnPlateau"),
        (lambda: optim.SequentialLR(opt, [optim.ExponentialLR(opt, 0.9), optim.ExponentialLR(adagrad, 0.9)], [2]),
         r"SequentialLR\(\): scheduler 1 \(ExponentialLR\) has another optimizer"),
        (lambda: optim.ExponentialLR(opt, 0.9, last_epoch=-2), r"last_epoch must be an int >= -1"),
    ]
    for make, message in cases:
        with pytest.raises(of.ArgumentError, match=message):
            make()
    sched = optim.OneCycleLR(opt, 0.1, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(of.ArgumentError, match=r"OneCycleLR.step\(\): tried to step 4 times; total_steps is 3"):
        sched.step()
