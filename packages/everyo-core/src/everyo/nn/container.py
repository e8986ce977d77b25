"""ModuleList and ModuleDict: hold submodules so that they are registered.

A plain Python list or dict of layers assigned to a Module attribute would
register nothing (no parameters for the optimizer, nothing in state_dict), so
Module refuses it and names these two. Neither has a ``forward``: the owner
decides how the held modules are called.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, overload

from everyo.nn.module import Module

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping
    from typing import NoReturn

    from typing_extensions import Self

__all__ = ["ModuleList", "ModuleDict"]


def _held(container: Module) -> OrderedDict[str, Module]:
    """A container's submodules by name. Its setters register Modules only; the
    registry's type also allows the None that Module keeps for a slot set to None."""
    return container._modules  # type: ignore[return-value]


def _require_module(owner: str, where: str, value: object) -> Module:
    if not isinstance(value, Module):
        raise TypeError(f"{owner} {where} must be a Module, got {type(value).__name__}")
    return value


class ModuleList(Module):
    """A list of submodules, registered under their positions ``"0"``, ``"1"``, ...

    Indexing, ``len``, iteration, ``append``, ``extend``, ``insert``, ``+=``,
    slicing (a new ModuleList holding the same modules) and deletion work as on a
    list; state_dict keys read like PyTorch's (``layers.0.weight``).

    Examples:
        >>> class Stack(eo.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.layers = eo.ModuleList([eo.Linear(4, 4, seed=i) for i in range(3)])
        ...     def forward(self, x):
        ...         for layer in self.layers:
        ...             x = layer(x).relu()
        ...         return x
        >>> list(Stack().state_dict())[:2]
        ['layers.0.weight', 'layers.0.bias']
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, index):
        n = len(self._modules)
        if not isinstance(index, int):
            raise TypeError(f"ModuleList indices must be integers or slices, got {type(index).__name__}")
        if not -n <= index < n:
            raise IndexError(f"ModuleList index {index} is out of range for {n} modules")
        return index % n

    def _renumber(self, modules):
        """Re-register ``modules`` as positions 0..n-1 (after an insert or a delete)."""
        for name in list(self._modules):
            object.__delattr__(self, name)
        self._modules.clear()
        for i, module in enumerate(modules):
            self.register_module(str(i), module)

    @overload
    def __getitem__(self, index: int) -> Module: ...
    @overload
    def __getitem__(self, index: slice) -> ModuleList: ...
    def __getitem__(self, index: int | slice) -> Module | ModuleList:
        modules = list(_held(self).values())
        if isinstance(index, slice):
            return ModuleList(modules[index])
        return modules[self._index(index)]

    def __setitem__(self, index: int, module: Module) -> None:
        self.register_module(str(self._index(index)), _require_module("ModuleList", f"item {index}", module))

    def __delitem__(self, index: int | slice) -> None:
        modules = list(self._modules.values())
        if isinstance(index, slice):
            del modules[index]
        else:
            del modules[self._index(index)]
        self._renumber(modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(_held(self).values()))

    def __iadd__(self, modules: Iterable[Module]) -> Self:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList(list(self) + list(other))

    def append(self, module: Module) -> Self:
        """Add ``module`` at the end; returns self."""
        self.register_module(str(len(self)), _require_module("ModuleList", "append: the item", module))
        return self

    def extend(self, modules: Iterable[Module]) -> Self:
        """Append every module of an iterable; returns self."""
        if isinstance(modules, Module) and not hasattr(modules, "__iter__"):
            raise TypeError(
                f"ModuleList.extend takes an iterable of Modules, got a {type(modules).__name__}; use append"
            )
        items = list(modules)
        for i, module in enumerate(items):
            _require_module("ModuleList", f"extend: item {i}", module)
        for module in items:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before position ``index`` (list semantics)."""
        _require_module("ModuleList", "insert: the item", module)
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._renumber(modules)

    def forward(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError("ModuleList has no forward(); iterate over it in your Module's forward")

    def __repr__(self) -> str:
        return super().__repr__() if self._modules else "ModuleList()"


class ModuleDict(Module):
    """An ordered dict of submodules, registered under their keys.

    ``d[key]``, ``d[key] = module``, ``del d[key]``, ``in``, ``len``, iteration
    over keys, ``keys()``, ``values()``, ``items()``, ``update()``, ``pop()`` and
    ``clear()`` work as on a dict; state_dict keys are ``<attribute>.<key>.<name>``.
    A key must be a string without ``'.'`` that is not already an attribute
    (``"keys"`` or ``"training"`` would be shadowed).

    Examples:
        >>> heads = eo.ModuleDict({"cls": eo.Linear(8, 3, seed=0), "reg": eo.Linear(8, 1, seed=1)})
        >>> heads["cls"](eo.ones(2, 8)).shape
        (2, 3)
    """

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        try:
            return _held(self)[key]
        except KeyError:
            raise KeyError(f"ModuleDict has no key {key!r}; keys are {list(self._modules)}") from None

    def __setitem__(self, key: str, module: Module) -> None:
        self.register_module(key, _require_module("ModuleDict", f"item {key!r}", module))

    def __delitem__(self, key: str) -> None:
        self[key]  # the same KeyError as a lookup
        del self._modules[key]
        object.__delattr__(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def keys(self) -> list[str]:
        return list(self._modules.keys())

    def values(self) -> list[Module]:
        return list(_held(self).values())

    def items(self) -> list[tuple[str, Module]]:
        return list(_held(self).items())

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        """Add (or replace) entries from a mapping or an iterable of (key, module) pairs."""
        pairs = list(modules.items()) if hasattr(modules, "items") else list(modules)
        checked = OrderedDict()
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"ModuleDict.update takes a mapping or (key, module) pairs, got {pair!r}")
            checked[pair[0]] = _require_module("ModuleDict", f"item {pair[0]!r}", pair[1])
        for key, module in checked.items():
            self[key] = module

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def clear(self) -> None:
        for key in list(self._modules):
            del self[key]

    def forward(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError("ModuleDict has no forward(); index it in your Module's forward")

    def __repr__(self) -> str:
        return super().__repr__() if self._modules else "ModuleDict()"
