"""Learning-rate schedules. Each writes its optimizer's learning-rate tensors in place (``group["lr"] = ...``), so
a compiled training step, which reads those tensors, follows the schedule without being traced again."""

from __future__ import annotations

import math

from ..core.errors import ArgumentError, describe
from .optimizer import Optimizer


class LRScheduler:
    """Base class: ``step()`` once per epoch (after the optimizer's steps), as in ``torch.optim.lr_scheduler``.
    A subclass gives ``get_lr()``, the learning rates for epoch ``last_epoch``."""

    def __init__(self, optimizer: Optimizer):
        if not isinstance(optimizer, Optimizer):
            raise ArgumentError(f"{type(self).__name__}(): expected an Optimizer, got {describe(optimizer)}")
        self.optimizer = optimizer
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

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        unknown = set(state_dict) - set(self.state_dict())
        if unknown:
            raise ArgumentError(f"{type(self).__name__}.load_state_dict(): unexpected entries {sorted(unknown)}")
        vars(self).update({k: list(v) if isinstance(v, tuple) else v for k, v in state_dict.items()})


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
