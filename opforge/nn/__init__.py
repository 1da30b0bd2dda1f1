"""Layers and models: ``Module`` (parameters, buffers and submodules found by attribute, state dicts, train/eval)
and PyTorch-style layers built on registered ops, so that a model runs eagerly and inside ``of.compile`` alike.

    from opforge import nn
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
"""

from . import init
from .layers import (
    CELU,
    ELU,
    GELU,
    GLU,
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
    GroupNorm,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    Identity,
    InstanceNorm1d,
    InstanceNorm2d,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSigmoid,
    LogSoftmax,
    MaxPool2d,
    Mish,
    MSELoss,
    MultiheadAttention,
    NLLLoss,
    PairwiseDistance,
    PReLU,
    ReLU,
    ReLU6,
    RMSNorm,
    Sigmoid,
    SiLU,
    Softmax,
    Softmin,
    Softplus,
    Tanh,
)
from .module import IncompatibleKeys, Module, ModuleList, Parameter, Sequential, StateDictError

__all__ = [
    "CELU", "ELU", "GELU", "GLU", "SELU", "AdaptiveAvgPool2d", "AvgPool2d", "BCEWithLogitsLoss", "BatchNorm1d",
    "BatchNorm2d", "Conv2d", "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "GroupNorm", "Hardsigmoid",
    "Hardswish", "Hardtanh", "Identity", "IncompatibleKeys", "InstanceNorm1d", "InstanceNorm2d", "LayerNorm",
    "LeakyReLU", "Linear", "LogSigmoid", "LogSoftmax", "MSELoss", "MaxPool2d", "Mish", "Module", "ModuleList",
    "MultiheadAttention", "NLLLoss", "PReLU", "Parameter", "RMSNorm", "ReLU", "ReLU6", "Sequential", "SiLU",
    "Sigmoid", "Softmax", "Softmin", "Softplus", "StateDictError", "Tanh", "init",
]
__all__ += ["CosineSimilarity", "Dropout1d", "Dropout2d", "Dropout3d", "EmbeddingBag", "PairwiseDistance"]
