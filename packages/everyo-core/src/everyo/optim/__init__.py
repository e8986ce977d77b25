"""Optimizers, learning-rate schedules (``everyo.optim.lr_scheduler``) and gradient clipping."""

from everyo.optim import lr_scheduler
from everyo.optim.adam import Adam, AdamW
from everyo.optim.clip import clip_grad_norm
from everyo.optim.optimizer import Optimizer
from everyo.optim.rmsprop import RMSprop
from everyo.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "clip_grad_norm", "lr_scheduler"]
