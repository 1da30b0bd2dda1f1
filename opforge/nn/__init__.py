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
    BCELoss,
    BCEWithLogitsLoss,
    Conv2d,
    CosineEmbeddingLoss,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    HuberLoss,
    Identity,
    KLDivLoss,
    L1Loss,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    MarginRankingLoss,
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
    TripletMarginLoss,
)
from .module import IncompatibleKeys, Module, ModuleList, Parameter, Sequential, StateDictError

__all__ = [
    "ELU", "GELU", "SELU", "AdaptiveAvgPool2d", "AvgPool2d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d",
    "BatchNorm2d", "Conv2d", "CosineEmbeddingLoss", "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "HuberLoss",
    "Identity", "IncompatibleKeys", "KLDivLoss", "L1Loss", "LayerNorm", "LeakyReLU", "Linear", "LogSoftmax", "MSELoss",
    "MarginRankingLoss", "MaxPool2d", "Module", "ModuleList", "MultiheadAttention", "NLLLoss", "Parameter", "ReLU",
    "Sequential", "SiLU", "Sigmoid", "Softmax", "Softplus", "StateDictError", "Tanh", "TripletMarginLoss", "init",
]
