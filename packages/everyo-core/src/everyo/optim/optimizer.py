"""Optimizer base: the parameter list, zero_grad and a checkpointable state."""
import numpy as np

from everyo.errors import EveryOStateDictError


class Optimizer:
    """Base class. ``state`` maps a parameter's index to its per-parameter state
    (NumPy arrays and numbers), so it saves with ``eo.save`` without pickle."""

    _hyper = ()

    def __init__(self, params, **hyper):
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        for name, value in hyper.items():
            setattr(self, name, value)
        self.state = {}

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        raise NotImplementedError

    def state_dict(self):
        return {
            "hyper": {name: getattr(self, name) for name in self._hyper},
            "state": {str(i): {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
                      for i, s in self.state.items()},
        }

    def load_state_dict(self, state_dict):
        """Restore hyperparameters and per-parameter state; validated before anything changes."""
        try:
            hyper, state = state_dict["hyper"], state_dict["state"]
        except (KeyError, TypeError):
            raise EveryOStateDictError(
                f"{type(self).__name__}.load_state_dict needs a dict with 'hyper' and 'state' "
                f"(as returned by state_dict()), got keys {list(getattr(state_dict, 'keys', lambda: [])())}"
            ) from None
        new_state = {}
        for key, entry in state.items():
            i = int(key)
            if not 0 <= i < len(self.params):
                raise EveryOStateDictError(
                    f"{type(self).__name__} state refers to parameter {i}, but the optimizer has "
                    f"{len(self.params)} parameters"
                )
            shape = self.params[i].data.shape
            for name, value in entry.items():
                if isinstance(value, np.ndarray) and value.ndim and value.shape != shape:
                    raise EveryOStateDictError(
                        f"{type(self).__name__} state {name!r} for parameter {i} has shape "
                        f"{value.shape}, the parameter has {shape}"
                    )
            new_state[i] = {k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in entry.items()}
        for name in self._hyper:
            if name in hyper:
                value = hyper[name]
                setattr(self, name, value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value)
        self.state = new_state
