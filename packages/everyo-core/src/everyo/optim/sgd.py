import numpy as np

from everyo.optim.optimizer import Optimizer


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov and L2 weight decay
    (PyTorch's update rule).

    Example:
        >>> opt = eo.SGD(model.parameters(), lr=0.05, momentum=0.9)
    """

    _hyper = ("lr", "momentum", "dampening", "nesterov", "weight_decay")

    def __init__(self, params, lr=0.01, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
        if lr < 0:
            raise ValueError(f"SGD: learning rate must be >= 0, got {lr}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening == 0")
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                         weight_decay=weight_decay)

    def step(self):
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            if self.weight_decay:
                g = g + self.weight_decay * p.data
            if self.momentum:
                state = self.state.setdefault(i, {})
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = np.array(g, dtype=p.data.dtype, copy=True)
                else:
                    buf *= self.momentum
                    buf += (1 - self.dampening) * g
                state["momentum_buffer"] = buf
                g = g + self.momentum * buf if self.nesterov else buf
            p.data -= self.lr * g
