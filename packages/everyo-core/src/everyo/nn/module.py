"""Module: the stateful container (parameters, buffers, random state, hooks,
train/eval, state dicts).

Parameters and submodules are registered by assignment, as in PyTorch;
``forward`` calls functional code that holds the math. Calling a module runs
its forward pre-hooks, casts floating inputs wider than its parameters down
to their dtype (Keras's rule, see :func:`cast_inputs`), runs ``forward``,
then its forward hooks.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from everyo import random as _random
from everyo.autograd import RemovableHandle
from everyo.casting import is_floating
from everyo.errors import EveryODTypeError, EveryOShapeError, EveryOStateDictError
from everyo.half import as_dtype
from everyo.tensor import Parameter, Tensor

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
    from typing import ParamSpec, Protocol, TypeVar

    from typing_extensions import Self

    from everyo._typing import Array, DType, TensorLike

    _P = ParamSpec("_P")
    _R = TypeVar("_R")
    _R_co = TypeVar("_R_co", covariant=True)

    class _Forward(Protocol[_P, _R_co]):
        """What calling a module runs: its ``forward``, with its own parameters."""

        def forward(self, *args: _P.args, **kwargs: _P.kwargs) -> _R_co: ...


def key_problems(
    missing: Sequence[str], unexpected: Sequence[str], mismatched: Sequence[str], strict: bool
) -> list[str]:
    """The parts of a state-dict loading error: missing and unexpected keys
    (only when ``strict``) and shape mismatches (always). Shared by
    :meth:`Module.load_state_dict` and :func:`everyo.io.load_torch_state_dict`."""
    problems = []
    if missing and strict:
        problems.append(f"missing keys {missing}")
    if unexpected and strict:
        problems.append(f"unexpected keys {unexpected}")
    if mismatched:
        problems.append("shape mismatch for " + "; ".join(mismatched))
    return problems


# Moves whenever any Module's parameters, buffers or submodules may have been registered,
# replaced or removed (every attribute assignment and register_* call), so a reader that
# caches a model's tensors (eo.onnx.compile) can tell in one comparison that none was.
_registry_clock = itertools.count(1)
registry_version = 0


def _moved_registry() -> None:
    global registry_version
    registry_version = next(_registry_clock)


class Module:
    """Base class of every layer and model.

    Examples:
        >>> class Net(eo.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.hidden = eo.Linear(8, 16, seed=0)   # registered by assignment
        ...         self.out = eo.Linear(16, 1, seed=1)
        ...     def forward(self, x):
        ...         return self.out(self.hidden(x).relu())
        >>> [name for name, _ in Net().named_parameters()]
        ['hidden.weight', 'hidden.bias', 'out.weight', 'out.bias']
    """

    # Set in __init__ through object.__setattr__ (declared here for type checkers).
    training: bool
    _parameters: OrderedDict[str, Parameter | None]
    _buffers: OrderedDict[str, Tensor | None]
    _modules: OrderedDict[str, Module | None]
    _generators: OrderedDict[str, np.random.Generator]
    _forward_pre_hooks: list[tuple[Callable[..., Any], bool]]
    _forward_hooks: list[tuple[Callable[..., Any], bool]]

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_generators", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", [])
        object.__setattr__(self, "_forward_hooks", [])
        object.__setattr__(self, "training", True)

    # --- registration -------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        _moved_registry()
        if "_parameters" not in self.__dict__:
            raise RuntimeError(
                f"{type(self).__name__}.__init__ must call super().__init__() before assigning attributes"
            )
        if value is None and (name in self._parameters or name in self._modules):
            # PyTorch: a registered slot set to None stays registered (and is skipped).
            registry: OrderedDict[str, Any] = self._parameters if name in self._parameters else self._modules
            registry[name] = None
            object.__setattr__(self, name, None)
            return
        if (
            name in self._buffers
            and not isinstance(value, Parameter)
            and (value is None or isinstance(value, (Tensor, np.ndarray)))
        ):
            # PyTorch: a Tensor (or None) assigned to a registered buffer's name replaces the
            # buffer and stays registered (saved in state_dict); dropping it silently would
            # lose the state at the next save.
            self.register_buffer(name, value)
            return
        if name in self._generators and isinstance(value, np.random.Generator):
            self.register_generator(name, value)  # a new stream in a registered slot stays saved
            return
        if isinstance(value, (list, tuple, dict)):
            _refuse_plain_container(self, name, value)
        # Only the other registries lose the name: a Parameter or Module assigned over one of
        # its own kind keeps its place (PyTorch), so named_parameters(), state_dict() and the
        # optimizer's parameter order do not silently change when a layer is replaced.
        home = (
            self._parameters if isinstance(value, Parameter) else self._modules if isinstance(value, Module) else None
        )
        for registry in (self._parameters, self._buffers, self._modules, self._generators):
            if registry is not home:
                registry.pop(name, None)
        if home is not None:
            home[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        # ``del model.fc`` unregisters it too (PyTorch); otherwise its parameters would
        # still be listed, saved and stepped after the attribute is gone.
        _moved_registry()
        for registry in (self._parameters, self._buffers, self._modules, self._generators):
            if name in registry:
                del registry[name]
        object.__delattr__(self, name)

    def _check_new_name(self, name, what):
        if not isinstance(name, str):
            raise TypeError(f"{type(self).__name__}.{what}: the name must be a string, got {type(name).__name__}")
        if not name or "." in name:
            raise KeyError(f"{type(self).__name__}.{what}: the name must be non-empty and contain no '.', got {name!r}")
        known = name in self._parameters or name in self._modules or name in self._buffers
        if hasattr(self, name) and not known:
            raise KeyError(
                f"{type(self).__name__}.{what}: attribute {name!r} already exists and is not a "
                f"parameter, buffer or submodule; pick another name"
            )

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` (a :class:`Parameter`, or None for an absent one) as ``name``."""
        _moved_registry()
        self._check_new_name(name, "register_parameter")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"{type(self).__name__}.register_parameter({name!r}): expected an eo.Parameter "
                f"or None, got {type(param).__name__} (wrap arrays as eo.Parameter(array))"
            )
        for registry in (self._buffers, self._modules, self._generators):
            registry.pop(name, None)
        self._parameters[name] = param
        object.__setattr__(self, name, param)

    def register_module(self, name: str, module: Module | None) -> None:
        """Register ``module`` (a :class:`Module`, or None) as the submodule ``name``."""
        _moved_registry()
        self._check_new_name(name, "register_module")
        if module is not None and not isinstance(module, Module):
            raise TypeError(
                f"{type(self).__name__}.register_module({name!r}): expected a Module or None, "
                f"got {type(module).__name__}"
            )
        for registry in (self._parameters, self._buffers, self._generators):
            registry.pop(name, None)
        self._modules[name] = module
        object.__setattr__(self, name, module)

    add_module = register_module

    def register_generator(self, name: str, generator: np.random.Generator) -> None:
        """Register a ``numpy.random.Generator`` (e.g. Dropout's mask stream) as
        ``name``: its state goes into ``state_dict`` as a uint64 array and
        ``load_state_dict`` restores it, so a resumed run draws the same numbers."""
        if name not in self._generators:
            self._check_new_name(name, "register_generator")
        if not isinstance(generator, np.random.Generator):
            raise TypeError(
                f"{type(self).__name__}.register_generator({name!r}): expected a "
                f"numpy.random.Generator, got {type(generator).__name__}"
            )
        _random.generator_state(generator, f"{type(self).__name__}.register_generator({name!r})")
        self._generators[name] = generator
        object.__setattr__(self, name, generator)

    def register_buffer(self, name: str, value: TensorLike | None) -> None:
        """Register non-trainable state (e.g. running statistics) saved in state_dict."""
        _moved_registry()
        value = value if isinstance(value, Tensor) or value is None else Tensor(value)
        object.__setattr__(self, name, value)
        self._buffers[name] = value

    # --- hooks --------------------------------------------------------------
    def register_forward_pre_hook(
        self, hook: Callable[..., Any], *, prepend: bool = False, with_kwargs: bool = False
    ) -> RemovableHandle:
        """Call ``hook(module, args)`` before every ``forward``; a return value other
        than None replaces the positional arguments (a non-tuple is wrapped in one).
        With ``with_kwargs=True`` it is ``hook(module, args, kwargs)`` and may return
        ``(args, kwargs)``. Returns a handle whose ``remove()`` unregisters it."""
        return _add_hook(self._forward_pre_hooks, (hook, bool(with_kwargs)), prepend)

    def register_forward_hook(
        self, hook: Callable[..., Any], *, prepend: bool = False, with_kwargs: bool = False
    ) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after every ``forward`` (``args`` as
        ``forward`` received them); a return value other than None replaces the
        output. With ``with_kwargs=True`` it is ``hook(module, args, kwargs, output)``.
        Returns a handle whose ``remove()`` unregisters it."""
        return _add_hook(self._forward_hooks, (hook, bool(with_kwargs)), prepend)

    # --- traversal ----------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        """(name, module) for each direct submodule."""
        for name, child in self._modules.items():
            if child is not None:
                yield name, child

    def children(self) -> list[Module]:
        return [m for _, m in self.named_children()]

    def named_modules(self, prefix: str = "", memo: set[int] | None = None) -> Iterator[tuple[str, Module]]:
        """(dotted name, module) for this module and every submodule, each once."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> list[Module]:
        return [m for _, m in self.named_modules()]

    def apply(self, fn: Callable[[Module], object]) -> Self:
        """Call ``fn(module)`` on every submodule (children first) and then on self;
        returns self. Example: ``model.apply(init_weights)``."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, p in module._parameters.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{module_prefix}.{name}" if module_prefix else name), p

    def parameters(self, recurse: bool = True) -> list[Parameter]:
        return [p for _, p in self.named_parameters(recurse=recurse)]

    def named_buffers(self) -> Iterator[tuple[str, Tensor]]:
        for prefix, module in self.named_modules():
            for name, b in module._buffers.items():
                if b is not None:
                    yield (f"{prefix}.{name}" if prefix else name), b

    def buffers(self) -> list[Tensor]:
        return [b for _, b in self.named_buffers()]

    def named_generators(self) -> Iterator[tuple[str, np.random.Generator]]:
        """(dotted name, numpy Generator) for every registered random stream (e.g. Dropout's)."""
        for prefix, module in self.named_modules():
            for name, g in module._generators.items():
                yield (f"{prefix}.{name}" if prefix else name), g

    # --- modes ------------------------------------------------------------
    def train(self, mode: bool = True) -> Self:
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Self:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient: drop it (``set_to_none=True``, the
        default, as in PyTorch) or fill it with zeros in place."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            elif p.grad.flags.writeable:
                p.grad[...] = 0
            else:
                p.grad = np.zeros_like(p.grad)

    def to(self, dtype: DType) -> Self:
        """Cast every floating parameter and buffer to ``dtype`` in place."""
        dtype = as_dtype(dtype)
        for t in self.parameters() + self.buffers():
            if np.issubdtype(t.data.dtype, np.floating):
                t.data = t.data.astype(dtype)
                t.grad = None
        return self

    # --- state --------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, Array]:
        """An ordered mapping of every parameter, buffer and random-stream name to a
        copy of its array (a generator's state is a uint64 array, see
        :func:`everyo.random.generator_state`), so a resumed run draws the same
        Dropout masks."""
        state = OrderedDict()
        for name, p in self.named_parameters():
            state[name] = p.data.copy()
        for name, b in self.named_buffers():
            state[name] = b.data.copy()
        for name, g in self.named_generators():
            state[name] = _random.generator_state(g, f"{type(self).__name__}.state_dict: {name}")
        return state

    def load_state_dict(self, state_dict: Mapping[str, TensorLike], strict: bool = True) -> Self:
        """Copy arrays into parameters and buffers, and restore random streams.
        Everything is validated first, so a bad state dict leaves the model untouched.

        A missing random-stream key is not an error even when ``strict``: state
        dicts saved by 0.1 have none, and the stream then simply continues."""
        targets = OrderedDict(list(self.named_parameters()) + list(self.named_buffers()))
        generators = OrderedDict(self.named_generators())
        given = {k: (v.data if isinstance(v, Tensor) else np.asarray(v)) for k, v in state_dict.items()}
        missing = [k for k in targets if k not in given]
        unexpected = [k for k in given if k not in targets and k not in generators]
        mismatched = [
            f"{k}: model has {targets[k].data.shape}, state dict has {given[k].shape}"
            for k in targets
            if k in given and given[k].shape != targets[k].data.shape
        ]
        problems = key_problems(missing, unexpected, mismatched, strict)
        for k in generators:
            if k in given:
                try:
                    _random.check_generator_state(given[k], k)
                except EveryOStateDictError as exc:
                    problems.append(str(exc))
        if problems:
            raise EveryOStateDictError(
                f"cannot load state dict into {type(self).__name__}: "
                + "; ".join(problems)
                + ". Was it saved from a model with the same architecture?"
            )
        for k, t in targets.items():
            if k in given:
                t.data = np.array(given[k], dtype=t.data.dtype, copy=True)
        for k, g in generators.items():
            if k in given:
                _random.set_generator_state(g, given[k], k)
        return self

    # --- calling ----------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def _call_impl(self, *args: Any, **kwargs: Any) -> Any:
        if self._forward_pre_hooks:
            args, kwargs = self._run_pre_hooks(args, kwargs)
        dtype = self._parameter_dtype()
        if dtype is not None:
            args = tuple([cast_inputs(a, dtype) for a in args])
            if kwargs:
                kwargs = {k: cast_inputs(v, dtype) for k, v in kwargs.items()}
        output = self.forward(*args, **kwargs)
        if self._forward_hooks:
            for hook, with_kwargs in tuple(self._forward_hooks):
                result = hook(self, args, kwargs, output) if with_kwargs else hook(self, args, output)
                if result is not None:
                    output = result
        return output

    if TYPE_CHECKING:
        # A call type-checks as a call of the subclass's own ``forward`` (its
        # parameters and its return type), as ``model(x)`` is used. A forward
        # hook that replaces the output with another type is beyond this.
        def __call__(self: _Forward[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R: ...
    else:
        __call__ = _call_impl

    def _run_pre_hooks(self, args, kwargs):
        for hook, with_kwargs in tuple(self._forward_pre_hooks):  # a hook may remove itself
            if with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    args, kwargs = result
                    args = args if isinstance(args, tuple) else (args,)
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        return args, kwargs

    def _parameter_dtype(self):
        """The dtype of this module's own first floating parameter (None without one)."""
        for p in self._parameters.values():
            if p is not None and p.data.dtype.kind == "f":
                return p.data.dtype
        return None

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        if not self._modules:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"  ({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
        extra = self.extra_repr()
        head = f"{type(self).__name__}({extra}" + ("," if extra else "")
        return head + "\n" + "\n".join(lines) + "\n)"


def cast_inputs(value: Any, dtype: np.dtype[Any], _nested: bool = False) -> Any:
    """Keras's rule at the layer boundary: a floating Tensor or array *wider* than
    the layer's parameters (``dtype``) is cast down to it, so float64 data never
    turns a float32 model float64. Narrower floats pass unchanged: under
    ``eo.autocast()`` float16 activations flow between layers as the precision
    policy decided, and integers (ids, lengths) are never touched. Tuples and
    lists (e.g. an LSTM's ``(h0, c0)``) are cast item by item, one level deep."""
    if isinstance(value, (Tensor, np.ndarray)):
        given = value.data.dtype if isinstance(value, Tensor) else value.dtype
        if given.kind == "f" and given.itemsize > dtype.itemsize:
            return value.astype(dtype)  # a Tensor's cast is differentiable
        return value
    if not _nested and type(value) in (tuple, list):
        return type(value)(cast_inputs(v, dtype, _nested=True) for v in value)
    return value


def _add_hook(hooks, entry, prepend):
    if not callable(entry[0]):
        raise TypeError(f"a hook must be callable, got {type(entry[0]).__name__}")
    if prepend:
        hooks.insert(0, entry)
    else:
        hooks.append(entry)
    return RemovableHandle(hooks, entry)


def _refuse_plain_container(module, name, value):
    """A plain list/tuple/dict holding Modules would register nothing (no
    parameters, no state_dict entries): refuse it and name the container to use."""
    items = value.values() if isinstance(value, dict) else value
    if any(isinstance(v, Module) for v in items):
        container = "eo.ModuleDict" if isinstance(value, dict) else "eo.ModuleList"
        raise TypeError(
            f"{type(module).__name__}.{name}: a plain {type(value).__name__} of Modules registers none of "
            f"their parameters; wrap it: self.{name} = {container}(...)"
        )


def as_input(
    layer: Module,
    x: TensorLike,
    ndim: int | Iterable[int] | None = None,
    last_dim: int | None = None,
    what: str = "input",
) -> Tensor:
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

    Examples:
        >>> model = eo.Sequential(eo.Linear(8, 4, seed=0), eo.ReLU(), eo.Linear(4, 1, seed=1))
        >>> model(eo.ones(3, 8)).shape
        (3, 1)
    """

    def __init__(self, *layers: Module | Sequence[Module]) -> None:
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential item {i} is {type(layer).__name__}, not a Module")
            setattr(self, str(i), layer)

    @property
    def layers(self) -> list[Module]:
        # Sequential registers Modules only (a slot set to None later would fail in forward too).
        return list(self._modules.values())  # type: ignore[arg-type]

    @overload
    def __getitem__(self, index: int) -> Module: ...
    @overload
    def __getitem__(self, index: slice) -> Sequential: ...
    def __getitem__(self, index: int | slice) -> Module | Sequential:
        if isinstance(index, slice):
            return Sequential(*self.layers[index])
        return self.layers[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self.layers)

    def append(self, layer: Module) -> Self:
        setattr(self, str(len(self)), layer)
        return self

    def forward(self, x: Any) -> Any:
        for i, layer in enumerate(self.layers):
            try:
                x = layer(x)
            except (EveryOShapeError, EveryODTypeError) as exc:
                # Name the layer's position; nested Sequentials build a path like [1][0].
                path = getattr(exc, "layer_path", "")
                detail = getattr(exc, "detail", str(exc))
                new: Any = type(exc)(f"layer [{i}]{path} of Sequential: {detail}")
                new.layer_path = f"[{i}]{path}"
                new.detail = detail
                raise new from None
        return x
