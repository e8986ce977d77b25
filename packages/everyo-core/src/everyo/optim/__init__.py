"""Optimizers, learning-rate schedules (``everyo.optim.lr_scheduler``) and gradient clipping.

Write your own optimizer by subclassing :class:`Optimizer` and overriding its
``update``; :mod:`everyo.optim.hyper` holds the hyperparameter checks."""

from everyo.optim import hyper, lr_scheduler
from everyo.optim.adadelta import Adadelta
from everyo.optim.adagrad import Adagrad
from everyo.optim.adam import Adam, AdamW
from everyo.optim.clip import clip_grad_norm
from everyo.optim.nadam import NAdam
from everyo.optim.optimizer import Optimizer
from everyo.optim.rmsprop import RMSprop
from everyo.optim.sgd import SGD

__all__ = [
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "Adadelta",
    "Adagrad",
    "NAdam",
    "clip_grad_norm",
    "lr_scheduler",
    "hyper",
]
