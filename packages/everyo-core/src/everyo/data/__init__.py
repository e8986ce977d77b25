"""Data: datasets, the DataLoader and padding of variable-length sequences."""

from everyo.data.dataset import Dataset, TensorDataset
from everyo.data.loader import DataLoader, default_collate
from everyo.data.sequences import pad_sequences

__all__ = ["Dataset", "TensorDataset", "DataLoader", "default_collate", "pad_sequences"]
