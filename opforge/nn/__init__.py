"""Layers and models: ``Module`` (parameters, buffers and submodules found by attribute, state dicts, train/eval)
and PyTorch-style layers built on registered ops, so that a model runs eagerly and inside ``of.compile`` alike.

    from opforge import nn
    import opforge.nn.functional as F      # the same module as opforge.ops
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
"""

import sys

from .. import ops as functional
from . import init
from .layers import (
    ELU,
    GELU,
    SELU,
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    BCEWithLogitsLoss,
    Conv2d,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    Identity,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    MaxPool2d,
    MSELoss,
    MultiheadAttention,
    NLLLoss,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
)
from .module import IncompatibleKeys, Module, ModuleDict, ModuleList, Parameter, Sequential, StateDictError

sys.modules[__name__ + ".functional"] = functional  # `import opforge.nn.functional as F`, PyTorch's spelling

__all__ = [
    "ELU", "GELU", "SELU", "AdaptiveAvgPool2d", "AvgPool2d", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d",
    "Conv2d", "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "Identity", "IncompatibleKeys", "LayerNorm",
    "LeakyReLU", "Linear", "LogSoftmax", "MSELoss", "MaxPool2d", "Module", "ModuleDict", "ModuleList",
    "MultiheadAttention", "NLLLoss", "Parameter", "ReLU", "Sequential", "SiLU", "Sigmoid", "Softmax", "Softplus",
    "StateDictError", "Tanh", "functional", "init",
]
