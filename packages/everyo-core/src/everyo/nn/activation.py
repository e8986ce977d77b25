from everyo import functional as F
from everyo.nn.module import Module, as_input


class ReLU(Module):
    def forward(self, x):
        return F.relu(as_input(self, x))


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(as_input(self, x))


class Tanh(Module):
    def forward(self, x):
        return F.tanh(as_input(self, x))


class Softmax(Module):
    """Softmax along ``axis`` (default: the last, the feature/channel axis)."""

    def __init__(self, axis=-1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        return F.softmax(as_input(self, x), axis=self.axis)

    def extra_repr(self):
        return f"axis={self.axis}"


class LogSoftmax(Softmax):
    def forward(self, x):
        return F.log_softmax(as_input(self, x), axis=self.axis)


class Flatten(Module):
    """Flatten every axis but the batch axis (NHWC order is kept)."""

    def forward(self, x):
        x = as_input(self, x, ndim=tuple(range(1, 33)))
        return F.reshape(x, (x.data.shape[0], -1))


class Dropout(Module):
    """Inverted dropout: active in train mode, identity in eval mode.

    The mask stream ``generator`` (seeded by ``seed=``, else from the global
    state, see ``eo.manual_seed``) is saved in ``state_dict``."""

    def __init__(self, p=0.5, *, seed=None):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"Dropout probability must be in [0, 1), got {p}")
        from everyo.random import generator_for

        self.p = float(p)
        self.register_generator("generator", generator_for(seed))

    def forward(self, x):
        return F.dropout(as_input(self, x), self.p, self.training, self.generator)

    def extra_repr(self):
        return f"p={self.p}"
