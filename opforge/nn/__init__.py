"""Layers and models: ``Module`` (parameters, buffers and submodules found by attribute, state dicts, train/eval)
and PyTorch-style layers built on registered ops, so that a model runs eagerly and inside ``of.compile`` alike.

    from opforge import nn
    import opforge.nn.functional as F      # the same module as opforge.ops
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
"""

import sys

from .. import ops as functional
from . import init, utils  # utils: clipping, parameters as a vector, nn.utils.rnn
from .activations_losses import (
    CTCLoss,
    GaussianNLLLoss,
    Hardshrink,
    HingeEmbeddingLoss,
    MultiLabelMarginLoss,
    MultiLabelSoftMarginLoss,
    MultiMarginLoss,
    PoissonNLLLoss,
    RReLU,
    SoftMarginLoss,
    Softshrink,
    Softsign,
    Tanhshrink,
    Threshold,
)
from .layers import (
    CELU,
    ELU,
    GELU,
    GLU,
    SELU,
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    BatchNorm1d,
    BatchNorm2d,
    BCELoss,
    BCEWithLogitsLoss,
    Bilinear,
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    CosineEmbeddingLoss,
    CosineSimilarity,
    CrossEntropyLoss,
    Dropout,
    Dropout1d,
    Dropout2d,
    Dropout3d,
    Embedding,
    EmbeddingBag,
    Flatten,
    Fold,
    GroupNorm,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    HuberLoss,
    Identity,
    InstanceNorm1d,
    InstanceNorm2d,
    KLDivLoss,
    L1Loss,
    LayerNorm,
    LeakyReLU,
    Linear,
    LocalResponseNorm,
    LogSigmoid,
    LogSoftmax,
    MarginRankingLoss,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    MaxUnpool1d,
    MaxUnpool2d,
    MaxUnpool3d,
    Mish,
    MSELoss,
    MultiheadAttention,
    NLLLoss,
    PairwiseDistance,
    PixelShuffle,
    PixelUnshuffle,
    PReLU,
    ReLU,
    ReLU6,
    RMSNorm,
    Sigmoid,
    SiLU,
    SmoothL1Loss,
    Softmax,
    Softmin,
    Softplus,
    Tanh,
    TripletMarginLoss,
    Unflatten,
    Unfold,
    Upsample,
)
from .module import IncompatibleKeys, Module, ModuleDict, ModuleList, Parameter, Sequential, StateDictError
from .padding import (
    ChannelShuffle,
    CircularPad1d,
    CircularPad2d,
    CircularPad3d,
    ConstantPad1d,
    ConstantPad2d,
    ConstantPad3d,
    ReflectionPad1d,
    ReflectionPad2d,
    ReflectionPad3d,
    ReplicationPad1d,
    ReplicationPad2d,
    ReplicationPad3d,
    ZeroPad1d,
    ZeroPad2d,
    ZeroPad3d,
)
from .recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .transformer import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

sys.modules[__name__ + ".functional"] = functional  # `import opforge.nn.functional as F`, PyTorch's spelling

__all__ = [
    "CELU", "ELU", "GELU", "GLU", "SELU", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
    "AdaptiveMaxPool2d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d",
    "BatchNorm2d", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "CosineEmbeddingLoss", "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "Fold", "GroupNorm",
    "Hardsigmoid", "Hardswish", "Hardtanh", "HuberLoss", "Identity", "IncompatibleKeys", "InstanceNorm1d",
    "InstanceNorm2d", "KLDivLoss", "L1Loss", "LayerNorm", "LeakyReLU", "Linear", "LogSigmoid", "LogSoftmax",
    "MSELoss", "MarginRankingLoss", "MaxPool1d", "MaxPool2d", "MaxPool3d", "Mish", "Module", "ModuleDict",
    "ModuleList", "MultiheadAttention", "NLLLoss", "PReLU", "Parameter", "PixelShuffle", "PixelUnshuffle",
    "RMSNorm", "ReLU", "ReLU6", "Sequential", "SiLU", "Sigmoid", "Softmax", "Softmin", "Softplus", "StateDictError",
    "Tanh", "TripletMarginLoss", "Unfold", "Upsample", "functional", "init",
]
__all__ += ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNBase", "RNNCell", "RNNCellBase"]
__all__ += ["CosineSimilarity", "Dropout1d", "Dropout2d", "Dropout3d", "EmbeddingBag", "PairwiseDistance"]
__all__ += ["Transformer", "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder",
            "TransformerEncoderLayer"]
__all__ += ["Bilinear", "Unflatten", "utils"]
__all__ += ["ChannelShuffle", "CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d",
            "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d",
            "ReplicationPad2d", "ReplicationPad3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d"]
__all__ += ["SmoothL1Loss"]
__all__ += ["GaussianNLLLoss", "Hardshrink", "HingeEmbeddingLoss", "MultiLabelMarginLoss", "MultiLabelSoftMarginLoss",
            "MultiMarginLoss", "PoissonNLLLoss", "RReLU", "SoftMarginLoss", "Softshrink", "Softsign", "Tanhshrink",
            "Threshold"]
__all__ += ["AdaptiveMaxPool1d", "AdaptiveMaxPool3d", "CTCLoss", "LocalResponseNorm", "MaxUnpool1d", "MaxUnpool2d",
            "MaxUnpool3d"]
