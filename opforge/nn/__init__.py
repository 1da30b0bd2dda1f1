"""Layers and models: ``Module`` (parameters, buffers and submodules found by attribute, state dicts, train/eval)
and PyTorch-style layers built on registered ops, so that a model runs eagerly and inside ``of.compile`` alike.

    from opforge import nn
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
"""

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
    CosineSimilarity,
    CrossEntropyLoss,
    Dropout,
    Dropout1d,
    Dropout2d,
    Dropout3d,
    Embedding,
    EmbeddingBag,
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
    PairwiseDistance,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
)
from .module import IncompatibleKeys, Module, ModuleList, Parameter, Sequential, StateDictError

__all__ = [
    "ELU", "GELU", "SELU", "AdaptiveAvgPool2d", "AvgPool2d", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d",
    "Conv2d", "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "Identity", "IncompatibleKeys", "LayerNorm",
    "LeakyReLU", "Linear", "LogSoftmax", "MSELoss", "MaxPool2d", "Module", "ModuleList", "MultiheadAttention",
    "NLLLoss", "Parameter", "ReLU", "Sequential", "SiLU", "Sigmoid", "Softmax", "Softplus", "StateDictError",
    "Tanh", "init",
]
__all__ += ["CosineSimilarity", "Dropout1d", "Dropout2d", "Dropout3d", "EmbeddingBag", "PairwiseDistance"]
