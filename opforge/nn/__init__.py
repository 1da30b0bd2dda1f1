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
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool2d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    BatchNorm1d,
    BatchNorm2d,
    BCEWithLogitsLoss,
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    Fold,
    Identity,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    MSELoss,
    MultiheadAttention,
    NLLLoss,
    PixelShuffle,
    PixelUnshuffle,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
    Unfold,
    Upsample,
)
from .module import IncompatibleKeys, Module, ModuleList, Parameter, Sequential, StateDictError

__all__ = [
    "ELU", "GELU", "SELU", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool2d",
    "AvgPool1d", "AvgPool2d", "AvgPool3d", "BCEWithLogitsLoss", "BatchNorm1d", "BatchNorm2d", "Conv1d", "Conv2d",
    "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "CrossEntropyLoss", "Dropout", "Embedding",
    "Flatten", "Fold", "Identity", "IncompatibleKeys", "LayerNorm", "LeakyReLU", "Linear", "LogSoftmax", "MSELoss",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "Module", "ModuleList", "MultiheadAttention", "NLLLoss", "Parameter",
    "PixelShuffle", "PixelUnshuffle", "ReLU", "Sequential", "SiLU", "Sigmoid", "Softmax", "Softplus",
    "StateDictError", "Tanh", "Unfold", "Upsample", "init",
]
