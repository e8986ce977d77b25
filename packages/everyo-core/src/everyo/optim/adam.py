
import numpy as np

from everyo.optim.optimizer import Optimizer


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; ``weight_decay`` is L2 added to the gradient."""

    _hyper = ("lr", "betas", "eps", "weight_decay")
    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        if lr < 0 or eps < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"{type(self).__name__}: invalid lr={lr}, betas={betas} or eps={eps}")
        super().__init__(params, lr=lr, betas=tuple(float(b) for b in betas), eps=eps, weight_decay=weight_decay)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.betas = tuple(float(b) for b in np.asarray(self.betas).reshape(-1))

    def step(self):
        b1, b2 = self.betas
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            if self.weight_decay and self._decoupled:
                p.data *= 1 - self.lr * self.weight_decay
            elif self.weight_decay:
                g = g + self.weight_decay * p.data
            state = self.state.setdefault(i, {})
            if not state:
                state["step"] = 0
                state["exp_avg"] = np.zeros_like(p.data)
                state["exp_avg_sq"] = np.zeros_like(p.data)
            state["step"] = int(state["step"]) + 1
            t = state["step"]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * (g * g)
            step_size = self.lr / (1 - b1 ** t)
            denom = np.sqrt(v / (1 - b2 ** t)) + self.eps
            p.data -= (step_size * m / denom).astype(p.data.dtype, copy=False)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): ``p *= 1 - lr * wd`` each step."""

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


