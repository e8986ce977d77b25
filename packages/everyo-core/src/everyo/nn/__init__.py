"""Layers (Keras names, NHWC) and losses."""

from everyo.nn.module import Module, Sequential
from everyo.tensor import Parameter
from everyo.nn.linear import Linear
from everyo.nn.conv import Conv2D, MaxPool2D, AvgPool2D
from everyo.nn.activation import ReLU, Sigmoid, Tanh, Softmax, LogSoftmax, Flatten, Dropout
from everyo.nn.normalization import BatchNorm1D, BatchNorm2D, LayerNorm
from everyo.nn.loss import MSELoss, CrossEntropyLoss, BCEWithLogitsLoss

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
]
from everyo.nn.embedding import Embedding, PositionalEncoding
from everyo.nn.recurrent import RNN, LSTM, GRU
from everyo.nn.attention import MultiHeadAttention, causal_mask
from everyo.nn.transformer import (
    TransformerEncoderLayer,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerDecoder,
)

__all__ += [
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
]
from everyo.nn.activation import GELU, SiLU, LeakyReLU, ELU, Softplus, Identity
from everyo.nn.conv import Conv1D, Conv2DTranspose
from everyo.nn.pooling import GlobalAveragePooling2D, GlobalMaxPooling2D
from everyo.nn.upsampling import UpSampling2D
from everyo.nn.normalization import GroupNorm

__all__ += [
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
]

from everyo.nn.container import ModuleList, ModuleDict

__all__ += ["ModuleList", "ModuleDict"]
