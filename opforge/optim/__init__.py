"""``opforge.optim``: optimizers, learning-rate schedules and gradient clipping that run eagerly and inside a
compiled training step alike.

    opt = of.optim.AdamW(params, lr=1e-3)
    sched = of.optim.CosineAnnealingLR(opt, T_max=epochs)

    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()            # eager: p.grad; traced: backward ops appended to the program
        of.optim.clip_grad_norm_(params, 1.0)
        opt.step()                 # eager: update ops run, results written in place; traced: recorded
        opt.zero_grad()
        return loss

    step = of.compile(train_step)  # parameters and optimizer state are updated in place by each call
    ...
    sched.step()                   # writes the learning-rate tensor the compiled step reads

SGD, Adam and AdamW update with the ops of ``opforge.ops.optim`` (``sgd_momentum_buffer``, ``sgd_update``,
``adam_exp_avg``, ``adam_exp_avg_sq``, ``adam_update``); Adagrad, Adadelta, RMSprop, Adamax, NAdam and RAdam write
their update rules with ops (``_math``: torch's tensor methods in torch's order of evaluation). Either way one
definition serves eager and compiled steps, with PyTorch's formulas, defaults and state names. LBFGS, which calls
its closure several times per step and decides on the values it gets, runs eagerly only.
"""

from ..ops import optim as _update_ops  # noqa: F401  (registers the update ops)
from .adam import Adam, Adamax, AdamW, NAdam, RAdam
from .clip import clip_grad_norm_
from .lbfgs import LBFGS
from .lr_scheduler import (
    ChainedScheduler,
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CyclicLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    OneCycleLR,
    PolynomialLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)
from .optimizer import Optimizer, ParamGroup, grad_of, live, set_grad
from .rmsprop import Adadelta, Adagrad, RMSprop
from .sgd import SGD

__all__ = ["LBFGS", "SGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "ChainedScheduler", "ConstantLR",
           "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR", "ExponentialLR", "LRScheduler", "LambdaLR",
           "LinearLR", "MultiStepLR", "MultiplicativeLR", "NAdam", "OneCycleLR", "Optimizer", "ParamGroup",
           "PolynomialLR", "RAdam", "RMSprop", "ReduceLROnPlateau", "SequentialLR", "StepLR", "clip_grad_norm_",
           "grad_of", "live", "set_grad"]
