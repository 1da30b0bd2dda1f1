"""Learning-rate schedules. Each writes its optimizer's learning-rate tensors in place (``group["lr"] = ...``), so
a compiled training step, which reads those tensors, follows the schedule without being traced again.

``StepLR``, ``CosineAnnealingLR``, ``LambdaLR`` and ``LinearLR`` (linear warm-up) are stepped once per epoch (or per
step, for warm-up); ``ReduceLROnPlateau`` is stepped with the metric it watches: ``sched.step(val_loss)``."""

from __future__ import annotations

import math

from ..core.errors import ArgumentError, describe
from .optimizer import Optimizer


class _Schedule:
    """What every schedule has: its optimizer, the learning rates it set last, and a state dict (all its own
    attributes but the optimizer)."""

    def __init__(self, optimizer: Optimizer):
        if not isinstance(optimizer, Optimizer):
            raise ArgumentError(f"{type(self).__name__}(): expected an Optimizer, got {describe(optimizer)}")
        self.optimizer = optimizer

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        unknown = set(state_dict) - set(self.state_dict())
        if unknown:
            raise ArgumentError(f"{type(self).__name__}.load_state_dict(): unexpected entries {sorted(unknown)}")
        vars(self).update({k: list(v) if isinstance(v, tuple) else v for k, v in state_dict.items()})


class LRScheduler(_Schedule):
    """Base class: ``step()`` once per epoch (after the optimizer's steps), as in ``torch.optim.lr_scheduler``.
    A subclass gives ``get_lr()``, the learning rates for epoch ``last_epoch``."""

    def __init__(self, optimizer: Optimizer):
        super().__init__(optimizer)
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.last_epoch = -1
        self.step()  # epoch 0: the base learning rates

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr  # in place, into the tensor compiled steps read
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class StepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every ``step_size`` epochs: lr = base_lr · gamma^⌊epoch/step_size⌋
    (computed as torch does, one multiplication at each ``step_size``-th epoch)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        if not isinstance(step_size, int) or step_size < 1:
            raise ArgumentError(f"StepLR(): step_size must be a positive int, got {step_size!r}")
        self.step_size, self.gamma = step_size, float(gamma)
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0 or self.last_epoch % self.step_size:
            return [group["lr"] for group in groups]
        return [group["lr"] * self.gamma for group in groups]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from each base learning rate down to ``eta_min`` over ``T_max`` epochs:
    lr = eta_min + (base_lr − eta_min)·(1 + cos(π·epoch/T_max))/2 (and back up after T_max, as torch's does).
    Computed in closed form, so it does not drift as torch's recursive form can."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):
        if not isinstance(T_max, int) or T_max < 1:
            raise ArgumentError(f"CosineAnnealingLR(): T_max must be a positive int, got {T_max!r}")
        self.T_max, self.eta_min = T_max, float(eta_min)
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        cosine = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
        return [self.eta_min + (base - self.eta_min) * cosine for base in self.base_lrs]


class LambdaLR(LRScheduler):
    """lr = base_lr · ``lr_lambda(epoch)`` (one function, or one per parameter group), as torch's ``LambdaLR``:
    ``LambdaLR(opt, lambda epoch: min(1.0, (epoch + 1) / 100))`` warms up over 100 steps."""

    def __init__(self, optimizer: Optimizer, lr_lambda):
        groups = len(optimizer.param_groups) if isinstance(optimizer, Optimizer) else 0
        lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * groups
        if len(lambdas) != groups or not all(callable(f) for f in lambdas):
            raise ArgumentError(f"LambdaLR(): lr_lambda must be a function or one per parameter group ({groups}), "
                                f"got {describe(lr_lambda)}")
        self.lr_lambdas = lambdas
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return [base * float(f(self.last_epoch)) for base, f in zip(self.base_lrs, self.lr_lambdas)]

    def state_dict(self) -> dict:
        return {k: v for k, v in super().state_dict().items() if k != "lr_lambdas"}  # functions are not state


class LinearLR(LRScheduler):
    """Linear warm-up (or decay): the factor on each base lr goes from ``start_factor`` to ``end_factor`` over
    ``total_iters`` steps, then stays — torch's ``LinearLR`` (in closed form)."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1 / 3, end_factor: float = 1.0,
                 total_iters: int = 5):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ArgumentError(f"LinearLR(): start_factor must be in (0, 1] and end_factor in [0, 1], got "
                                f"{start_factor} and {end_factor}")
        if not isinstance(total_iters, int) or total_iters < 1:
            raise ArgumentError(f"LinearLR(): total_iters must be a positive int, got {total_iters!r}")
        self.start_factor, self.end_factor, self.total_iters = float(start_factor), float(end_factor), total_iters
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        t = min(self.last_epoch, self.total_iters) / self.total_iters
        factor = self.start_factor + (self.end_factor - self.start_factor) * t
        return [base * factor for base in self.base_lrs]


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
