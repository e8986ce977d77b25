"""Module: the stateful container (parameters, buffers, train/eval, state dicts).

Parameters and submodules are registered by assignment, as in PyTorch;
``forward`` calls functional code that holds the math.
"""
from collections import OrderedDict

import numpy as np

from everyo.casting import is_floating
from everyo.errors import EveryODTypeError, EveryOShapeError, EveryOStateDictError
from everyo.tensor import Parameter, Tensor


class Module:
    """Base class of every layer and model."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # --- registration -------------------------------------------------------
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() before assigning attributes")
        for registry in (self._parameters, self._buffers, self._modules):
            registry.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name, value):
        """Register non-trainable state (e.g. running statistics) saved in state_dict."""
        value = value if isinstance(value, Tensor) or value is None else Tensor(value)
        object.__setattr__(self, name, value)
        self._buffers[name] = value

    # --- traversal ----------------------------------------------------------
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        return [m for _, m in self.named_modules()]

    def children(self):
        return list(self._modules.values())

    def named_parameters(self):
        seen = set()
        for prefix, module in self.named_modules():
            for name, p in module._parameters.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{prefix}.{name}" if prefix else name), p

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        for prefix, module in self.named_modules():
            for name, b in module._buffers.items():
                if b is not None:
                    yield (f"{prefix}.{name}" if prefix else name), b

    def buffers(self):
        return [b for _, b in self.named_buffers()]

    # --- modes ------------------------------------------------------------
    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def to(self, dtype):
        """Cast every floating parameter and buffer to ``dtype`` in place."""
        dtype = np.dtype(dtype)
        for t in self.parameters() + self.buffers():
            if np.issubdtype(t.data.dtype, np.floating):
                t.data = t.data.astype(dtype)
                t.grad = None
        return self

    # --- state --------------------------------------------------------------
    def state_dict(self):
        """An ordered mapping of every parameter and buffer name to a copy of its array."""
        state = OrderedDict()
        for name, p in self.named_parameters():
            state[name] = p.data.copy()
        for name, b in self.named_buffers():
            state[name] = b.data.copy()
        return state

    def load_state_dict(self, state_dict, strict=True):
        """Copy arrays into parameters and buffers. Everything is validated first,
        so a bad state dict leaves the model untouched."""
        targets = OrderedDict(list(self.named_parameters()) + list(self.named_buffers()))
        given = {k: (v.data if isinstance(v, Tensor) else np.asarray(v)) for k, v in state_dict.items()}
        missing = [k for k in targets if k not in given]
        unexpected = [k for k in given if k not in targets]
        mismatched = [
            f"{k}: model has {targets[k].data.shape}, state dict has {given[k].shape}"
            for k in targets if k in given and given[k].shape != targets[k].data.shape
        ]
        problems = []
        if missing and strict:
            problems.append(f"missing keys {missing}")
        if unexpected and strict:
            problems.append(f"unexpected keys {unexpected}")
        if mismatched:
            problems.append("shape mismatch for " + "; ".join(mismatched))
        if problems:
            raise EveryOStateDictError(
                f"cannot load state dict into {type(self).__name__}: " + "; ".join(problems)
                + ". Was it saved from a model with the same architecture?"
            )
        for k, t in targets.items():
            if k in given:
                t.data = np.array(given[k], dtype=t.data.dtype, copy=True)
        return self

    # --- calling ----------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self):
        return ""

    def __repr__(self):
        if not self._modules:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"  ({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
        extra = self.extra_repr()
        head = f"{type(self).__name__}({extra}" + ("," if extra else "")
        return head + "\n" + "\n".join(lines) + "\n)"


def as_input(layer, x, ndim=None, last_dim=None, what="input"):
    """Validate a layer's input and wrap arrays as Tensors.

    ``ndim`` is an int or a tuple of accepted ranks; ``last_dim`` the size the
    last (feature/channel) axis must have. Errors name the layer and shapes.
    """
    if not isinstance(x, Tensor):
        x = Tensor(x)
    if not is_floating(x.data.dtype):
        raise EveryODTypeError(
            f"{layer!r} received {what} of dtype {x.data.dtype}; it needs floating-point input "
            f"(convert it, e.g. x.astype('float32'))"
        )
    if ndim is not None:
        ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.data.ndim not in ranks:
            want = " or ".join(str(r) for r in ranks)
            raise EveryOShapeError(
                f"{layer!r} expected a rank-{want} {what}, got shape {x.data.shape} (rank {x.data.ndim})"
            )
    if last_dim is not None and (x.data.ndim == 0 or x.data.shape[-1] != last_dim):
        raise EveryOShapeError(
            f"{layer!r} expected {what} with last dimension {last_dim} (shape (..., {last_dim})), "
            f"got shape {x.data.shape}"
        )
    return x


class Sequential(Module):
    """Layers applied in order. ``model[i]``, ``len(model)`` and iteration work.

    Example:
        >>> model = eo.Sequential(eo.Linear(8, 4, seed=0), eo.ReLU(), eo.Linear(4, 1, seed=1))
        >>> model(eo.ones(3, 8)).shape
        (3, 1)
    """

    def __init__(self, *layers):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential item {i} is {type(layer).__name__}, not a Module")
            setattr(self, str(i), layer)

    @property
    def layers(self):
        return list(self._modules.values())

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(*self.layers[index])
        return self.layers[index]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self.layers)

    def append(self, layer):
        setattr(self, str(len(self)), layer)
        return self

    def forward(self, x):
        for i, layer in enumerate(self._modules.values()):
            try:
                x = layer(x)
            except (EveryOShapeError, EveryODTypeError) as exc:
                # Name the layer's position; nested Sequentials build a path like [1][0].
                path = getattr(exc, "layer_path", "")
                detail = getattr(exc, "detail", str(exc))
                new = type(exc)(f"layer [{i}]{path} of Sequential: {detail}")
                new.layer_path = f"[{i}]{path}"
                new.detail = detail
                raise new from None
        return x
