"""Optimizer base: param groups, zero_grad and a checkpointable, validated state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, overload

import numpy as np

from everyo import autograd
from everyo.errors import EveryOInPlaceError, EveryOStateDictError
from everyo.optim.hyper import checked
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import TypeVar

    _T = TypeVar("_T")


class Optimizer:
    """Base class of every optimizer, with PyTorch's param groups; subclass it
    to write your own.

    ``params`` is an iterable of Tensors, or of dicts ``{"params": [...],
    "lr": ..., ...}`` each giving a group its own hyperparameters (those it
    leaves out come from ``defaults``). ``param_groups`` is the list of these
    dicts, each holding every hyperparameter (a scheduler such as
    :class:`~everyo.optim.lr_scheduler.StepLR` changes ``group["lr"]``);
    ``params`` is the flat list of every parameter, group after group, and
    ``state`` maps a parameter's index in it to its per-parameter state (NumPy
    arrays and numbers), so it saves with ``eo.save`` without pickle
    (PyTorch keys ``state`` by the parameter itself).

    Writing an optimizer: pass the hyperparameters' defaults to
    ``super().__init__(params, defaults)`` and override :meth:`update`, which
    :meth:`step` calls for each parameter that has a gradient. Optionally
    declare ``hyperparameters = {name: check}`` with the checks of
    :mod:`everyo.optim.hyper` (``Real()``, ``Flag()``, ``Pair(Real())`` ...):
    a bad value is then refused where it is given, in the constructor, in
    ``add_param_group`` and in ``load_state_dict``; undeclared ones are kept
    as given. ``zero_grad``, ``state_dict`` and ``load_state_dict`` come with
    the base class.

    Examples:
        >>> class SignSGD(eo.optim.Optimizer):
        ...     hyperparameters = {"lr": eo.optim.hyper.Real()}
        ...     def __init__(self, params, lr=0.01):
        ...         super().__init__(params, {"lr": lr})
        ...     def update(self, param, grad, state, group):
        ...         state["step"] = state.get("step", 0) + 1
        ...         param.data -= group["lr"] * np.sign(grad)
        >>> w = eo.Parameter(np.array([1.0, -2.0]))
        >>> opt = SignSGD([w], lr=0.5)
        >>> (w * w).sum().backward()
        >>> opt.step()
        >>> w.data.tolist(), opt.param_groups[0]["lr"]
        ([0.5, -1.5], 0.5)

        Param groups with their own values:

        >>> model = eo.nn.Linear(4, 2)
        >>> decay = [p for p in model.parameters() if p.ndim > 1]
        >>> no_decay = [p for p in model.parameters() if p.ndim <= 1]
        >>> opt = eo.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
        >>> [g["weight_decay"] for g in opt.param_groups]
        [0.01, 0.0]
    """

    #: name -> check of each declared hyperparameter (see :mod:`everyo.optim.hyper`).
    hyperparameters: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    defaults: dict[str, Any]
    param_groups: list[dict[str, Any]]
    params: list[Tensor]
    state: dict[int, dict[str, Any]]

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], defaults: Mapping[str, Any]) -> None:
        name = type(self).__name__
        if not isinstance(defaults, Mapping):
            raise TypeError(f"{name}: defaults must be a dict of hyperparameters, got {type(defaults).__name__}")
        if "params" in defaults:
            raise ValueError(f"{name}: defaults may not hold 'params'")
        missing = [k for k in self.hyperparameters if k not in defaults]
        if missing:
            raise TypeError(f"{name}: defaults lack the declared hyperparameters {missing}")
        self.defaults = {**defaults, **checked(name, self.hyperparameters, defaults, "the defaults")}
        self._check_group(self.defaults, "the defaults")
        self.param_groups = []
        self.params = []
        self.state = {}
        if isinstance(params, (Tensor, dict)):
            raise TypeError(
                f"{name}: params must be an iterable of Tensors or of param-group dicts, "
                f"got a single {type(params).__name__}; wrap it in a list"
            )
        groups: list[Any] = list(params)  # Tensors or dicts, told apart below
        if all(isinstance(g, dict) for g in groups):
            for group in groups:
                self.add_param_group(group)
        elif any(isinstance(g, dict) for g in groups):
            raise TypeError(f"{name}: params mixes Tensors and param-group dicts; give one or the other")
        else:
            self.add_param_group({"params": groups})
        if not self.params:
            raise ValueError(f"{name} got an empty parameter list")

    # --- groups ----------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group: a dict with ``"params"`` and any hyperparameters to override.

        Raises ``TypeError``/``ValueError`` naming the group for a bad value, a
        non-Tensor, a non-leaf, or a parameter already in a group.
        """
        name, where = type(self).__name__, f"param group {len(self.param_groups)}"
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError(f"{name}: {where} must be a dict with a 'params' entry, got {param_group!r}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError(
                f"{name}: {where} gives its params as a set, whose order changes between runs; "
                f"use a list so checkpoints map state to the right parameter"
            )
        else:
            params = list(params)
        seen = {id(p): g for g, group in enumerate(self.param_groups) for p in group["params"]}
        for k, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"{name}: {where}, entry {k} is a {type(p).__name__}, not a Tensor")
            if not p.is_leaf:
                raise ValueError(
                    f"{name}: {where}, entry {k} (shape {p.shape}) is the result of an op, not a "
                    f"leaf; optimize the Parameter (or a detached copy) instead"
                )
            if id(p) in seen:
                other = "the same group" if seen[id(p)] == len(self.param_groups) else f"param group {seen[id(p)]}"
                raise ValueError(
                    f"{name}: the parameter of shape {p.shape} in {where} (entry {k}) is already "
                    f"in {other}; a parameter can belong to one group only, once"
                )
            seen[id(p)] = len(self.param_groups)
        values = {**self.defaults, **param_group}
        group = {**values, **checked(name, self.hyperparameters, values, where)}
        self._check_group(group, where)
        group["params"] = params
        self.param_groups.append(group)
        self.params.extend(params)

    def _check_group(self, group, where):
        """Checks that involve several hyperparameters of one group (a subclass's)."""

    # Single-group 0.1 code reads and sets ``opt.lr``; keep that meaning, and
    # refuse it where groups disagree rather than answer for one of them.
    def _hyperparameter(self, name: str) -> Any:
        groups = self.__dict__.get("param_groups")
        if groups is not None and name in type(self).hyperparameters:
            values = [g[name] for g in groups]
            if all(v == values[0] for v in values):
                return values[0]
            raise AttributeError(
                f"{type(self).__name__}.{name}: the param groups differ ({values}); "
                f"read optimizer.param_groups[i][{name!r}]"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    if not TYPE_CHECKING:
        # Hidden from type checkers, which would otherwise accept any attribute
        # name (typos included); each optimizer declares its hyperparameters.
        __getattr__ = _hyperparameter

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).hyperparameters and "param_groups" in self.__dict__:
            for i, group in enumerate(self.param_groups):
                group.update(
                    checked(type(self).__name__, {name: self.hyperparameters[name]}, {name: value}, f"param group {i}")
                )
            return
        object.__setattr__(self, name, value)

    # --- stepping ----------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient: ``None`` (default), or zeros when
        ``set_to_none=False``."""
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad = np.zeros_like(p.grad)

    @overload
    def step(self, closure: None = None) -> None: ...
    @overload
    def step(self, closure: Callable[[], _T]) -> _T: ...
    def step(self, closure: Callable[[], _T] | None = None) -> _T | None:
        """Update the parameters once. ``closure`` (optional) recomputes and
        returns the loss, which ``step`` returns."""
        loss = None
        if closure is not None:
            with autograd.enable_grad():
                loss = closure()
        for group in self.param_groups:  # checked first, so a refused step changes no parameter
            for p in group["params"]:
                if p.grad is not None and autograd.held_by_graph(p):
                    raise EveryOInPlaceError(
                        f"{type(self).__name__}.step(): a parameter (shape {p.shape}, {p.dtype}) is still held by "
                        f"a forward pass's graph that backward() has not run through (or kept with "
                        f"retain_graph=True); stepping now would change values its gradient needs. Call "
                        f"backward() first, or drop the graph (del loss). No parameter was changed."
                    )
        self._step()
        return loss

    def _step(self):
        # Built-in optimizers override this with vectorised loops; by default
        # it hands each parameter that has a gradient to update().
        for group, indexed in self._groups():
            for i, p in indexed:
                if p.grad is not None:
                    self.update(p, p.grad, self.state.setdefault(i, {}), group)

    def update(self, param: Tensor, grad: Any, state: dict[str, Any], group: dict[str, Any]) -> None:
        """Update one parameter; :meth:`step` calls it for each parameter with a
        gradient (override it to write an optimizer).

        Args:
            param: the parameter. Change its values through ``param.data``
                (``param.data -= lr * d``, or ``param.data = new``): assigning
                ``.data`` is how EveryO counts an in-place change.
            grad: its gradient, an ndarray of its shape (read it, do not change it).
            state: this parameter's state dict (empty on the first step), kept
                in ``optimizer.state``; store ndarrays and numbers, so it saves.
            group: its param group, with every hyperparameter.
        """
        raise NotImplementedError(
            f"{type(self).__name__}: override update(param, grad, state, group), which step() calls for "
            f"each parameter that has a gradient"
        )

    def _groups(self):
        """(group, [(state index, parameter), ...]) for each group, in order."""
        start = 0
        for group in self.param_groups:
            params = group["params"]
            yield group, enumerate(params, start)
            start += len(params)

    # --- checkpoints -------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {"<index>": {...}}, "param_groups": [{..., "params": [indices]}]}``
        (copies; holds only what ``eo.save`` accepts)."""
        groups, start = [], 0
        for group in self.param_groups:
            entry = {k: v for k, v in group.items() if k != "params"}
            entry["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(entry)
        state = {
            str(i): {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
            for i, s in self.state.items()
        }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore param groups' hyperparameters and per-parameter state.

        Everything is validated before anything changes: the group structure
        and state shapes (``EveryOStateDictError``), the hyperparameters (the
        constructor's ``TypeError``/``ValueError``). A 0.1 state dict
        (``{"hyper": ..., "state": ...}``) applies its hyperparameters to every group.
        """
        name = type(self).__name__
        try:
            state = state_dict["state"]
            saved_groups = (
                state_dict["param_groups"] if "param_groups" in state_dict else self._legacy_groups(state_dict["hyper"])
            )
        except (KeyError, TypeError):
            raise EveryOStateDictError(
                f"{name}.load_state_dict needs a dict with 'param_groups' and 'state' (as returned by "
                f"state_dict(); a 0.1 one with 'hyper' and 'state' loads too), got keys "
                f"{list(getattr(state_dict, 'keys', lambda: [])())}"
            ) from None
        index_of = self._saved_index_map(saved_groups)
        new_groups = []
        for g, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            where = f"param group {g} of the loaded state dict"
            values = {**group, **{k: v for k, v in saved.items() if k != "params"}}
            new = {**values, **checked(name, self.hyperparameters, values, where)}
            self._check_group(new, where)
            new["params"] = group["params"]
            new_groups.append(new)
        if not isinstance(state, dict):
            raise EveryOStateDictError(f"{name}: the state dict's 'state' must be a dict, got {type(state).__name__}")
        group_of = [group for group, indexed in zip(new_groups, self._groups()) for _ in indexed[1]]
        new_state = {}
        for key, entry in state.items():
            try:
                i = index_of[int(key)]
            except (KeyError, ValueError, TypeError):
                raise EveryOStateDictError(
                    f"{name} state refers to parameter {key}, which no loaded param group lists "
                    f"(the optimizer has {len(self.params)} parameters)"
                ) from None
            if not isinstance(entry, dict):
                raise EveryOStateDictError(f"{name} state for parameter {i} must be a dict, got {type(entry).__name__}")
            p = self.params[i]
            for k, value in entry.items():
                if isinstance(value, np.ndarray) and value.ndim and value.shape != p.data.shape:
                    raise EveryOStateDictError(
                        f"{name} state {k!r} for parameter {i} has shape {value.shape}, the parameter has "
                        f"{p.data.shape}"
                    )
            self._check_state(i, entry, group_of[i])
            new_state[i] = {k: self._own(v, p) for k, v in entry.items()}
        for group, new in zip(self.param_groups, new_groups):
            group.clear()
            group.update(new)
        self.state = new_state

    def _check_state(self, index, entry, group):
        """Raise ``EveryOStateDictError`` if a loaded per-parameter state lacks what ``step`` needs."""

    def _require(self, index, entry, keys):
        # A helper for _check_state: ``keys`` must be present, arrays of the parameter's shape.
        for k in keys:
            if k not in entry:
                raise EveryOStateDictError(
                    f"{type(self).__name__} state for parameter {index} has no {k!r} (it has {sorted(entry)})"
                )
            if k != "step" and not isinstance(entry[k], np.ndarray):
                raise EveryOStateDictError(
                    f"{type(self).__name__} state {k!r} for parameter {index} must be an array, got "
                    f"{type(entry[k]).__name__}"
                )
        if "step" in entry:
            step = entry["step"]
            if isinstance(step, np.ndarray):
                step = step[()] if step.ndim == 0 else step
            if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
                raise EveryOStateDictError(
                    f"{type(self).__name__} state 'step' for parameter {index} must be an int >= 0, got {step!r}"
                )

    @staticmethod
    def _own(value, p):
        if isinstance(value, np.ndarray):
            if value.ndim == 0:
                return value.item()
            floating = np.issubdtype(value.dtype, np.floating)
            return np.array(value, dtype=p.data.dtype if floating else value.dtype, copy=True)
        return value

    def _legacy_groups(self, hyper):
        if not isinstance(hyper, dict):
            raise TypeError
        groups, start = [], 0
        for group in self.param_groups:
            n = len(group["params"])
            groups.append({**hyper, "params": list(range(start, start + n))})
            start += n
        return groups

    def _saved_index_map(self, saved_groups):
        """saved parameter id -> index in ``self.params``, matching groups by position as PyTorch does."""
        name = type(self).__name__
        if not isinstance(saved_groups, (list, tuple)) or not all(isinstance(g, dict) for g in saved_groups):
            raise EveryOStateDictError(f"{name}: the state dict's 'param_groups' must be a list of dicts")
        if len(saved_groups) != len(self.param_groups):
            raise EveryOStateDictError(
                f"{name}: the state dict has {len(saved_groups)} param groups, this optimizer has "
                f"{len(self.param_groups)}"
            )
        index_of = {}
        for g, (saved, (group, indexed)) in enumerate(zip(saved_groups, self._groups())):
            ids = saved.get("params")
            if isinstance(ids, np.ndarray):
                ids = ids.tolist()
            if not isinstance(ids, (list, tuple)) or len(ids) != len(group["params"]):
                got = len(ids) if isinstance(ids, (list, tuple)) else repr(ids)
                raise EveryOStateDictError(
                    f"{name}: param group {g} of the state dict has {got} parameters, this optimizer's has "
                    f"{len(group['params'])}"
                )
            for saved_id, (i, _) in zip(ids, indexed):
                if (
                    isinstance(saved_id, (bool, np.bool_))
                    or not isinstance(saved_id, (int, np.integer))
                    or int(saved_id) in index_of
                ):
                    raise EveryOStateDictError(
                        f"{name}: param group {g} of the state dict lists parameter id {saved_id!r} "
                        f"(ids must be distinct ints)"
                    )
                index_of[int(saved_id)] = i
        return index_of
