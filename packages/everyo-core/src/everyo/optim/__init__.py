"""Optimizers and gradient clipping."""
from everyo.optim.optimizer import Optimizer
from everyo.optim.sgd import SGD
from everyo.optim.adam import Adam, AdamW
from everyo.optim.clip import clip_grad_norm

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "clip_grad_norm"]
