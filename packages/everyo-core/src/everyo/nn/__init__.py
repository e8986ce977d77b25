"""Layers (Keras names, NHWC) and losses."""

from everyo.nn import init  # noqa: F401  (eo.nn.init, PyTorch's torch.nn.init)
from everyo.nn.activation import (
    ELU,
    GELU,
    Dropout,
    Flatten,
    Identity,
    LeakyReLU,
    LogSoftmax,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
)
from everyo.nn.attention import MultiHeadAttention, causal_mask
from everyo.nn.container import ModuleDict, ModuleList
from everyo.nn.conv import AvgPool2D, Conv1D, Conv2D, Conv2DTranspose, MaxPool2D
from everyo.nn.embedding import Embedding, PositionalEncoding
from everyo.nn.linear import Linear
from everyo.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from everyo.nn.module import Module, Sequential
from everyo.nn.normalization import BatchNorm1D, BatchNorm2D, GroupNorm, LayerNorm
from everyo.nn.pooling import GlobalAveragePooling2D, GlobalMaxPooling2D
from everyo.nn.recurrent import GRU, LSTM, RNN
from everyo.nn.transformer import (
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from everyo.nn.upsampling import UpSampling2D
from everyo.tensor import Parameter

__all__ = [
    "Module",
    "Sequential",
    "Parameter",
    "Linear",
    "Conv2D",
    "MaxPool2D",
    "AvgPool2D",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "Softmax",
    "LogSoftmax",
    "Flatten",
    "Dropout",
    "BatchNorm1D",
    "BatchNorm2D",
    "LayerNorm",
    "MSELoss",
    "CrossEntropyLoss",
    "BCEWithLogitsLoss",
    "NLLLoss",
    "L1Loss",
    "SmoothL1Loss",
    "HuberLoss",
    "BCELoss",
    "KLDivLoss",
    "Embedding",
    "PositionalEncoding",
    "RNN",
    "LSTM",
    "GRU",
    "MultiHeadAttention",
    "causal_mask",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "GELU",
    "SiLU",
    "LeakyReLU",
    "ELU",
    "Softplus",
    "Identity",
    "Conv1D",
    "Conv2DTranspose",
    "GlobalAveragePooling2D",
    "GlobalMaxPooling2D",
    "UpSampling2D",
    "GroupNorm",
    "ModuleList",
    "ModuleDict",
]
