"""Learning-rate schedules, torch's: each writes its optimizer's learning-rate tensors in place (``group["lr"] =
...``), so a compiled training step, which reads those tensors, follows the schedule without being traced again.

Stepped once per epoch (or per batch: ``OneCycleLR``, ``CyclicLR``) after the optimizer's steps: ``StepLR``,
``MultiStepLR``, ``ConstantLR``, ``LinearLR`` (warm-up), ``ExponentialLR``, ``PolynomialLR``, ``CosineAnnealingLR``,
``CosineAnnealingWarmRestarts``, ``LambdaLR``, ``MultiplicativeLR``, ``CyclicLR`` and ``OneCycleLR``; combined by
``SequentialLR`` (one after another, at milestones) and ``ChainedScheduler`` (all at every step).
``ReduceLROnPlateau`` is stepped with the metric it watches: ``sched.step(val_loss)``.

As torch's, ``get_lr()`` is the *chainable* form, computed from the groups' current learning rates (so schedules
sharing an optimizer compose as they do in torch), and ``_get_closed_form_lr()``, from ``base_lrs``, is what
``SequentialLR`` uses at a milestone and ``step(epoch)`` uses. A schedule sets ``initial_lr`` in each parameter
group (its base learning rate), as torch's; ``CyclicLR`` and ``OneCycleLR`` with ``cycle_momentum`` write the
groups' ``momentum`` or beta1 (the first of ``betas``) at each step, which are tensors too (see ``ParamGroup``): a
compiled step reads them at each run, and no schedule traces it again.
"""

from __future__ import annotations

import math
import types
import warnings
from bisect import bisect_right
from collections import Counter

from ..core.errors import ArgumentError, describe
from .optimizer import Optimizer

EPOCH_DEPRECATION_WARNING = (  # torch's warning, word for word
    "The epoch parameter in `scheduler.step()` was not necessary and is being deprecated where possible. Please use "
    "`scheduler.step()` to step the scheduler. During the deprecation, if epoch is different from None, the closed "
    "form is used instead of the new chainable form, where available.")


class _Schedule:
    """What every schedule has: its optimizer, the learning rates it set last, and a state dict (all its own
    attributes but the optimizer)."""

    _ignored_on_load = frozenset({"_get_lr_called_within_step"})  # torch's bookkeeping, in its state dicts

    def __init__(self, optimizer: Optimizer):
        if not isinstance(optimizer, Optimizer):
            raise ArgumentError(f"{type(self).__name__}(): expected an Optimizer, got {describe(optimizer)}")
        self.optimizer = optimizer

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = {k: v for k, v in state_dict.items() if k not in self._ignored_on_load}
        unknown = set(state_dict) - set(self.state_dict())
        if unknown:
            raise ArgumentError(f"{type(self).__name__}.load_state_dict(): unexpected entries {sorted(unknown)}")
        vars(self).update({k: list(v) if isinstance(v, tuple) else v for k, v in state_dict.items()})


def _per_group(name: str, optimizer: Optimizer, value, layer: str) -> list:
    """One value per parameter group: a list of that many, or one value for all (torch's ``_format_param``)."""
    groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ArgumentError(f"{layer}(): {name} must have one value per parameter group ({groups}), got "
                                f"{len(value)}")
        return list(value)
    return [value] * groups


def _positive_int(value, name: str, layer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{layer}(): {name} must be a positive int, got {value!r}")
    return value


class LRScheduler(_Schedule):
    """Base class, torch's: ``step()`` once per epoch, after the optimizer's steps. A subclass gives ``get_lr()``
    (the chainable form, from the groups' current learning rates) and, where torch has one,
    ``_get_closed_form_lr()`` (from ``base_lrs``). ``last_epoch`` other than -1 resumes a schedule: the groups must
    then hold ``initial_lr`` (load the optimizer's state dict first)."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        super().__init__(optimizer)
        if isinstance(last_epoch, bool) or not isinstance(last_epoch, int) or last_epoch < -1:
            raise ArgumentError(f"{type(self).__name__}(): last_epoch must be an int >= -1, got {last_epoch!r}")
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1 and "initial_lr" not in group:
                group["initial_lr"] = group["lr"]
            elif "initial_lr" not in group:
                raise ArgumentError(f"{type(self).__name__}(): resuming with last_epoch={last_epoch} needs "
                                    f"'initial_lr' in param_groups[{i}] (load the optimizer's state dict first)")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        """Count steps from 0 and take the first (epoch last_epoch + 1): torch's ``_initial_step``."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def _current(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self, epoch=None) -> None:
        """The next epoch's learning rates. ``step(epoch)`` (deprecated in torch, with its warning) jumps to that
        epoch through the closed form where there is one."""
        self._step_count += 1
        if epoch is not None:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch=None) -> None:
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            values = self._get_closed_form_lr() if hasattr(self, "_get_closed_form_lr") else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr  # in place, into the tensor compiled steps read
        self._last_lr = self._current()


class StepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every ``step_size`` epochs: base_lr · gamma^⌊epoch/step_size⌋."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        # torch takes any positive number (tutorials write StepLR(optimizer, 1.0, gamma=0.1))
        if isinstance(step_size, bool) or not isinstance(step_size, (int, float)) or not step_size > 0:
            raise ArgumentError(f"StepLR(): step_size must be a positive number, got {step_size!r}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size:
            return self._current()
        return [lr * self.gamma for lr in self._current()]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` at each epoch in ``milestones`` (by gamma^n at one listed n times)."""

    def __init__(self, optimizer: Optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
        milestones = list(milestones)
        if not all(isinstance(m, int) and not isinstance(m, bool) for m in milestones):
            raise ArgumentError(f"MultiStepLR(): milestones must be ints, got {milestones!r}")
        self.milestones, self.gamma = Counter(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch not in self.milestones:
            return self._current()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._current()]

    def _get_closed_form_lr(self) -> list[float]:
        milestones = sorted(self.milestones.elements())
        return [base * self.gamma ** bisect_right(milestones, self.last_epoch) for base in self.base_lrs]

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.milestones = Counter({int(k): v for k, v in dict(self.milestones).items()})  # a checkpoint's dict


class ConstantLR(LRScheduler):
    """Multiply the learning rate by ``factor`` for the first ``total_iters`` epochs, then restore it."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1):
        if not 0 <= factor <= 1:
            raise ArgumentError(f"ConstantLR(): factor must be in [0, 1], got {factor}")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._current()]
        if self.last_epoch != self.total_iters:
            return self._current()
        return [lr * (1.0 / self.factor) for lr in self._current()]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor))
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """Linear warm-up (or decay): the factor on each base lr goes from ``start_factor`` to ``end_factor`` over
    ``total_iters`` steps, then stays."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ArgumentError(f"LinearLR(): start_factor must be in (0, 1] and end_factor in [0, 1], got "
                                f"{start_factor} and {end_factor}")
        self.start_factor, self.end_factor = start_factor, end_factor
        self.total_iters = _positive_int(total_iters, "total_iters", "LinearLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in self._current()]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current()
        change = self.end_factor - self.start_factor
        factor = 1.0 + change / (self.total_iters * self.start_factor + (self.last_epoch - 1) * change)
        return [lr * factor for lr in self._current()]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * (self.start_factor + (self.end_factor - self.start_factor)
                        * min(self.total_iters, self.last_epoch) / self.total_iters) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial:  # resuming: the loaded lr is this epoch's already
            return self._current()
        return [lr * self.gamma for lr in self._current()]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """Decay to 0 over ``total_iters`` epochs: base_lr · (1 − epoch/total_iters)^power, then stay."""

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1):
        self.total_iters, self.power = _positive_int(total_iters, "total_iters", "PolynomialLR"), power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current()
        decay = ((1.0 - self.last_epoch / self.total_iters) / (1.0 - (self.last_epoch - 1) / self.total_iters)) \
            ** self.power
        return [lr * decay for lr in self._current()]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
                for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from each base learning rate down to ``eta_min`` over ``T_max`` epochs, then back up:
    lr ≈ eta_min + (base_lr − eta_min)·(1 + cos(π·epoch/T_max))/2, computed in torch's recursive (chainable) form."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        self.T_max, self.eta_min = _positive_int(T_max, "T_max", "CosineAnnealingLR"), eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self._is_initial:
            return self._current()
        if self._step_count == 1 and self.last_epoch > 0:  # resumed: the closed form once
            return self._get_closed_form_lr()
        if (self.last_epoch - 1 - self.T_max) % (2 * self.T_max) == 0:  # at the bottom: the cosine's minimum
            return [lr + (base - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
                    for base, lr in zip(self.base_lrs, self._current())]
        ratio = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / \
            (1 + math.cos(math.pi * (self.last_epoch - 1) / self.T_max))
        return [ratio * (lr - self.eta_min) + self.eta_min for lr in self._current()]

    def _get_closed_form_lr(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class _Lambdas(LRScheduler):
    """A function of the epoch per group (``lr_lambda``: one for all, or a list); state dicts hold the ``__dict__``
    of callable objects and None for plain functions, as torch's."""

    def __init__(self, optimizer: Optimizer, lr_lambda, last_epoch: int = -1):
        name = type(self).__name__
        groups = len(optimizer.param_groups) if isinstance(optimizer, Optimizer) else 0
        lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * groups
        if len(lambdas) != groups or not all(callable(f) for f in lambdas):
            raise ArgumentError(f"{name}(): lr_lambda must be a function or one per parameter group ({groups}), "
                                f"got {describe(lr_lambda)}")
        self.lr_lambdas = lambdas
        super().__init__(optimizer, last_epoch)

    def state_dict(self) -> dict:
        state = {k: v for k, v in super().state_dict().items() if k != "lr_lambdas"}
        state["lr_lambdas"] = [None if isinstance(f, types.FunctionType) else dict(vars(f)) for f in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("lr_lambdas", [None] * len(self.lr_lambdas))
        lambdas = self.lr_lambdas
        super().load_state_dict(state_dict)
        self.lr_lambdas = lambdas
        for f, attrs in zip(lambdas, saved):
            if attrs is not None:
                vars(f).update(attrs)


class LambdaLR(_Lambdas):
    """lr = base_lr · ``lr_lambda(epoch)``: ``LambdaLR(opt, lambda epoch: min(1.0, (epoch + 1) / 100))`` warms up
    over 100 steps."""

    def get_lr(self) -> list[float]:
        return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class MultiplicativeLR(_Lambdas):
    """lr ← lr · ``lr_lambda(epoch)`` at each epoch after the first."""

    def get_lr(self) -> list[float]:
        if self.last_epoch > 0:
            return [lr * f(self.last_epoch) for lr, f in zip(self._current(), self.lr_lambdas)]
        return self._current()


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from each base lr to ``eta_min`` over T_i epochs, restarting at the base lr; T_0 = ``T_0``,
    each next period ``T_mult`` times longer (SGDR). ``step(epoch)`` may take a fractional epoch
    (``sched.step(epoch + i / iters)`` within an epoch), as torch's."""

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0, last_epoch: int = -1):
        self.T_0 = self.T_i = _positive_int(T_0, "T_0", "CosineAnnealingWarmRestarts")
        self.T_mult = _positive_int(T_mult, "T_mult", "CosineAnnealingWarmRestarts")
        if isinstance(eta_min, bool) or not isinstance(eta_min, (int, float)):
            raise ArgumentError(f"CosineAnnealingWarmRestarts(): eta_min must be a number, got {describe(eta_min)}")
        self.eta_min, self.T_cur = eta_min, last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base in self.base_lrs]

    def step(self, epoch=None) -> None:
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:  # a restart
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ArgumentError(f"CosineAnnealingWarmRestarts.step(): epoch must be >= 0, got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:  # the n-th period holds epoch: T_0·(T_mult^n − 1)/(T_mult − 1) <= epoch
                    n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = self._current()


def _momentum_key(optimizer: Optimizer, layer: str) -> str:
    """What ``cycle_momentum`` cycles: the optimizer's ``momentum``, or its beta1 (``betas``)."""
    if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
        raise ArgumentError(f"{layer}(): cycle_momentum needs an optimizer with momentum or betas, got "
                            f"{type(optimizer).__name__} (pass cycle_momentum=False)")
    return "betas" if "betas" in optimizer.defaults else "momentum"


def _set_momentum(group, use_beta1: bool, value: float) -> None:
    if use_beta1:
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value


class CyclicLR(LRScheduler):
    """Cycle each learning rate between ``base_lr`` and ``max_lr`` (Smith's cyclical learning rates), stepped once per
    batch: up over ``step_size_up`` steps, down over ``step_size_down`` (default the same); ``mode`` "triangular",
    "triangular2" (amplitude halved each cycle) or "exp_range" (scaled by gamma^iterations), or ``scale_fn`` with
    ``scale_mode``. With ``cycle_momentum`` (default), momentum (or beta1) cycles inversely between
    ``base_momentum`` and ``max_momentum``."""

    def __init__(self, optimizer: Optimizer, base_lr, max_lr, step_size_up: int = 2000, step_size_down=None,
                 mode: str = "triangular", gamma: float = 1.0, scale_fn=None, scale_mode: str = "cycle",
                 cycle_momentum: bool = True, base_momentum=0.8, max_momentum=0.9, last_epoch: int = -1):
        _Schedule.__init__(self, optimizer)
        base_lrs = _per_group("base_lr", optimizer, base_lr, "CyclicLR")
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.max_lrs = _per_group("max_lr", optimizer, max_lr, "CyclicLR")
        step_size_up = float(step_size_up)
        step_size_down = float(step_size_down) if step_size_down is not None else step_size_up
        if not step_size_up > 0 or not step_size_down >= 0:
            raise ArgumentError(f"CyclicLR(): step_size_up must be > 0 and step_size_down >= 0, got {step_size_up} "
                                f"and {step_size_down}")
        self.total_size = step_size_up + step_size_down
        self.step_ratio = step_size_up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ArgumentError(f"CyclicLR(): mode must be 'triangular', 'triangular2' or 'exp_range' (or give "
                                f"scale_fn), got {mode!r}")
        if scale_mode not in ("cycle", "iterations"):
            raise ArgumentError(f"CyclicLR(): scale_mode must be 'cycle' or 'iterations', got {scale_mode!r}")
        self.mode, self.gamma, self._scale_fn_custom, self.scale_mode = mode, gamma, scale_fn, scale_mode
        self._init_scale_fn()
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.use_beta1 = _momentum_key(optimizer, "CyclicLR") == "betas"
            self.base_momentums = _per_group("base_momentum", optimizer, base_momentum, "CyclicLR")
            self.max_momentums = _per_group("max_momentum", optimizer, max_momentum, "CyclicLR")
            if last_epoch == -1:
                for high, low, group in zip(self.max_momentums, self.base_momentums, optimizer.param_groups):
                    _set_momentum(group, self.use_beta1, high)
                    group["max_momentum"], group["base_momentum"] = high, low
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _init_scale_fn(self) -> None:
        if self._scale_fn_custom is None:  # a built-in mode decides the scale mode, as in torch
            self.scale_mode = "iterations" if self.mode == "exp_range" else "cycle"

    def scale_fn(self, x: float) -> float:
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma ** x

    def get_lr(self) -> list[float]:
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        scale_factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        lrs = [base + (high - base) * scale_factor * scale for base, high in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:
            for low, high, group in zip(self.base_momentums, self.max_momentums, self.optimizer.param_groups):
                _set_momentum(group, self.use_beta1, high - (high - low) * scale_factor * scale)
        return lrs

    def state_dict(self) -> dict:
        state = {k: v for k, v in super().state_dict().items() if k != "_scale_fn_custom"}
        fn = self._scale_fn_custom
        state["_scale_fn_custom"] = None if fn is None or isinstance(fn, types.FunctionType) else dict(vars(fn))
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        saved, fn = state_dict.pop("_scale_fn_custom", None), self._scale_fn_custom
        super().load_state_dict(state_dict)
        self._scale_fn_custom = fn
        if saved is not None and fn is not None:
            vars(fn).update(saved)
        self._init_scale_fn()


class OneCycleLR(LRScheduler):
    """The 1cycle policy, stepped once per batch over ``total_steps`` (or ``epochs`` · ``steps_per_epoch``): the
    learning rate rises from max_lr/``div_factor`` to ``max_lr`` over the first ``pct_start`` of the steps, then
    anneals ("cos" or "linear") to initial_lr/``final_div_factor``; ``three_phase`` goes back down to the initial lr
    first, symmetrically. With ``cycle_momentum``, momentum (or beta1) moves inversely between ``max_momentum`` and
    ``base_momentum``. Stepping past ``total_steps`` is an error, as in torch."""

    def __init__(self, optimizer: Optimizer, max_lr, total_steps: int | None = None, epochs: int | None = None,
                 steps_per_epoch: int | None = None, pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum=0.85, max_momentum=0.95, div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False, last_epoch: int = -1):
        _Schedule.__init__(self, optimizer)
        if total_steps is not None:
            self.total_steps = _positive_int(total_steps, "total_steps", "OneCycleLR")
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = _positive_int(epochs, "epochs", "OneCycleLR") * \
                _positive_int(steps_per_epoch, "steps_per_epoch", "OneCycleLR")
        else:
            raise ArgumentError("OneCycleLR(): give total_steps, or epochs and steps_per_epoch")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ArgumentError(f"OneCycleLR(): pct_start must be a float in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ArgumentError(f"OneCycleLR(): anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        up = float(pct_start * self.total_steps) - 1
        if three_phase:
            self._schedule_phases = [
                {"end_step": up, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": float(2 * pct_start * self.total_steps) - 2, "start_lr": "max_lr",
                 "end_lr": "initial_lr", "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
                {"end_step": self.total_steps - 1, "start_lr": "initial_lr", "end_lr": "min_lr",
                 "start_momentum": "max_momentum", "end_momentum": "max_momentum"}]
        else:
            self._schedule_phases = [
                {"end_step": up, "start_lr": "initial_lr", "end_lr": "max_lr",
                 "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": self.total_steps - 1, "start_lr": "max_lr", "end_lr": "min_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"}]
        self._anneal_func_type = anneal_strategy
        max_lrs = _per_group("max_lr", optimizer, max_lr, "OneCycleLR")
        if last_epoch == -1:
            for high, group in zip(max_lrs, optimizer.param_groups):
                group["initial_lr"] = high / div_factor
                group["max_lr"] = high
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.use_beta1 = _momentum_key(optimizer, "OneCycleLR") == "betas"
            highs = _per_group("max_momentum", optimizer, max_momentum, "OneCycleLR")
            lows = _per_group("base_momentum", optimizer, base_momentum, "OneCycleLR")
            if last_epoch == -1:
                for high, low, group in zip(highs, lows, optimizer.param_groups):
                    _set_momentum(group, self.use_beta1, high)
                    group["max_momentum"], group["base_momentum"] = high, low
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ArgumentError(f"OneCycleLR.step(): tried to step {step_num} times; total_steps is "
                                f"{self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start_step = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end_step = phase["end_step"]
                if step_num <= end_step or i == len(self._schedule_phases) - 1:
                    pct = (step_num - start_step) / (end_step - start_step)
                    lrs.append(self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct))
                    if self.cycle_momentum:
                        _set_momentum(group, self.use_beta1, self._anneal(
                            group[phase["start_momentum"]], group[phase["end_momentum"]], pct))
                    break
                start_step = phase["end_step"]
        return lrs


def _check_schedulers(layer: str, optimizer, schedulers) -> list:
    schedulers = list(schedulers)
    if not schedulers:
        raise ArgumentError(f"{layer}(): expects at least one scheduler, got none")
    for i, s in enumerate(schedulers):
        if not isinstance(s, _Schedule):
            raise ArgumentError(f"{layer}(): scheduler {i} is not a learning-rate schedule: {describe(s)}")
        if isinstance(s, ReduceLROnPlateau):
            raise ArgumentError(f"{layer}(): scheduler {i} is a ReduceLROnPlateau, which steps with a metric: not "
                                "supported (as in torch)")
        if s.optimizer is not optimizer:
            raise ArgumentError(f"{layer}(): scheduler {i} ({type(s).__name__}) has another optimizer")
    return schedulers


class _Composite(LRScheduler):
    """A schedule of schedules: its state dict holds theirs under ``_schedulers``, as torch's."""

    def state_dict(self) -> dict:
        state = {k: v for k, v in vars(self).items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("_schedulers")
        if len(saved) != len(self._schedulers):
            raise ArgumentError(f"{type(self).__name__}.load_state_dict(): {len(saved)} schedulers' states for "
                                f"{len(self._schedulers)} schedulers")
        unknown = set(state_dict) - set(self.state_dict()) - self._ignored_on_load
        if unknown:
            raise ArgumentError(f"{type(self).__name__}.load_state_dict(): unexpected entries {sorted(unknown)}")
        vars(self).update({k: v for k, v in state_dict.items() if k not in self._ignored_on_load})
        for s, sd in zip(self._schedulers, saved):
            s.load_state_dict(sd)


class SequentialLR(_Composite):
    """``schedulers`` one after another: the k-th from epoch ``milestones[k-1]`` on, restarted there (its closed
    form at epoch 0, where it has one) — torch's ``SequentialLR``, e.g. ``SequentialLR(opt, [LinearLR(opt, 0.1,
    total_iters=5), CosineAnnealingLR(opt, T_max=95)], milestones=[5])``: warm-up, then cosine."""

    def __init__(self, optimizer: Optimizer, schedulers, milestones, last_epoch: int = -1):
        _Schedule.__init__(self, optimizer)
        self._schedulers = _check_schedulers("SequentialLR", optimizer, schedulers)
        self._milestones = list(milestones)
        if len(self._milestones) != len(self._schedulers) - 1:
            raise ArgumentError(f"SequentialLR(): expects one milestone fewer than schedulers, got "
                                f"{len(self._schedulers)} schedulers and {len(self._milestones)} milestones")
        self.last_epoch = last_epoch + 1
        for group in optimizer.param_groups:  # back to the initial learning rates ...
            group["lr"] = group["initial_lr"]
        self._recursive_undo()  # ... and each schedule before its first step
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = self._schedulers[idx].get_last_lr()

    def _recursive_undo(self, sched=None) -> None:
        for s in (self if sched is None else sched)._schedulers:
            if hasattr(s, "_schedulers"):
                self._recursive_undo(s)
            elif hasattr(s, "last_epoch"):
                s.last_epoch -= 1

    def step(self) -> None:
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)  # its start: the closed form at epoch 0
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()


class ChainedScheduler(_Composite):
    """Step all ``schedulers`` at every step, each from the learning rates the previous one set (their chainable
    forms compose): ``ChainedScheduler([ConstantLR(opt, 0.1, total_iters=2), ExponentialLR(opt, 0.9)])``."""

    def __init__(self, schedulers, optimizer: Optimizer | None = None):
        schedulers = list(schedulers)
        if not schedulers:
            raise ArgumentError("ChainedScheduler(): expects at least one scheduler, got none")
        optimizer = optimizer or getattr(schedulers[0], "optimizer", None)
        _Schedule.__init__(self, optimizer)
        self._schedulers = _check_schedulers("ChainedScheduler", optimizer, schedulers)
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    def step(self) -> None:
        for s in self._schedulers:
            s.step()
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class ReduceLROnPlateau(_Schedule):
    """Multiply the learning rates by ``factor`` when a metric has stopped improving for ``patience`` steps, as
    torch's ``ReduceLROnPlateau``: ``sched.step(val_loss)`` after each evaluation. ``mode`` "min" (a loss) or "max"
    (an accuracy); improvement beyond ``threshold`` (relative, or absolute with ``threshold_mode="abs"``); after a
    reduction, ``cooldown`` steps pass before counting again; no lr goes below ``min_lr`` (a number or one per
    group), and a change smaller than ``eps`` is not made."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0, min_lr=0.0,
                 eps: float = 1e-8):
        super().__init__(optimizer)
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ArgumentError(f"ReduceLROnPlateau(): mode must be 'min' or 'max' and threshold_mode 'rel' or "
                                f"'abs', got {mode!r} and {threshold_mode!r}")
        if not 0 <= factor < 1:
            raise ArgumentError(f"ReduceLROnPlateau(): factor must be in [0, 1), got {factor}")
        groups = len(optimizer.param_groups)
        min_lrs = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr] * groups
        if len(min_lrs) != groups:
            raise ArgumentError(f"ReduceLROnPlateau(): min_lr must be a number or one per group ({groups})")
        self.mode, self.factor, self.patience, self.threshold = mode, float(factor), int(patience), float(threshold)
        self.threshold_mode, self.cooldown, self.min_lrs, self.eps = threshold_mode, int(cooldown), min_lrs, eps
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = 0
        self.last_epoch = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    def _better(self, value: float) -> bool:
        rel = self.threshold_mode == "rel"
        if self.mode == "min":
            return value < (self.best * (1 - self.threshold) if rel else self.best - self.threshold)
        return value > (self.best * (1 + self.threshold) if rel else self.best + self.threshold)

    def step(self, metrics) -> None:
        value = float(metrics)
        self.last_epoch += 1
        if self._better(value):
            self.best, self.num_bad_epochs = value, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for group, min_lr in zip(self.optimizer.param_groups, self.min_lrs):
                old = group["lr"]
                new = max(old * self.factor, min_lr)
                if old - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]
