"""Learning-rate schedules, with PyTorch's names and calling convention.

Call ``scheduler.step()`` once per epoch (or per batch, for OneCycleLR) after
``optimizer.step()``. Constructing a scheduler sets every param group's
``lr`` to the schedule's first value and records the group's ``initial_lr``;
``last_epoch`` counts the steps taken; ``get_last_lr()`` gives the lr of each
group. Each schedule is its closed form in ``last_epoch`` and the groups'
initial lrs (PyTorch's ``_get_closed_form_lr``), so a resumed scheduler
continues exactly, and an lr changed by hand is overwritten at the next step
(chain two schedules with :class:`SequentialLR`, not by stacking them).
``ReduceLROnPlateau`` is the exception: it reacts to a metric.

Examples:
    >>> from everyo.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
    >>> model = eo.nn.Linear(4, 1)
    >>> opt = eo.SGD(model.parameters(), lr=0.1)
    >>> warmup = LinearLR(opt, start_factor=0.1, total_iters=5)
    >>> decay = CosineAnnealingLR(opt, T_max=95)
    >>> scheduler = SequentialLR(opt, [warmup, decay], milestones=[5])
    >>> for epoch in range(3):
    ...     opt.step()  # after the epoch's forward and backward passes
    ...     scheduler.step()
    >>> scheduler.get_last_lr()
    [0.064]
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Any

from everyo.errors import EveryOStateDictError
from everyo.optim.hyper import Choice, Flag, Integer, PerGroup, Real, _real, checked

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import SupportsFloat

    from everyo.optim.optimizer import Optimizer

__all__ = [
    "LRScheduler",
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "CosineAnnealingLR",
    "LinearLR",
    "OneCycleLR",
    "ReduceLROnPlateau",
    "SequentialLR",
]


class Milestones:
    """A list of ints > 0 in non-decreasing order."""

    def __call__(self, value: Any) -> list[int]:
        values = [Integer(1)(v) for v in value] if isinstance(value, (list, tuple)) else None
        if values is None or values != sorted(values):
            raise ValueError(f"must be a list of ints > 0 in increasing order, got {value!r}")
        return values


def _optimizer_groups(optimizer, who):
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or not all(isinstance(g, dict) and "lr" in g for g in groups):
        raise TypeError(f"{who} needs an optimizer with param_groups (e.g. eo.SGD), got {type(optimizer).__name__}")
    return groups


class LRScheduler:
    """Base class: subclasses set ``_checks()`` (their arguments) and ``_lr(group_index, base_lr)``."""

    optimizer: Optimizer
    base_lrs: list[float]
    last_epoch: int

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1, **args: Any) -> None:
        name = type(self).__name__
        self.optimizer = optimizer
        groups = _optimizer_groups(optimizer, name)
        for attr, value in checked(name, self._checks(), args, "the arguments").items():
            setattr(self, attr, value)
        last_epoch = Integer(-1)(last_epoch)
        for i, group in enumerate(groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(
                    f"{name}(last_epoch={last_epoch}): param group {i} has no 'initial_lr'; resume "
                    f"by loading the scheduler's state_dict, or start with last_epoch=-1"
                )
        self.base_lrs = [Real()(g["initial_lr"]) for g in groups]
        self.last_epoch = last_epoch
        self.step()

    def _checks(self):
        return {}

    def _lr(self, i, base_lr):
        raise NotImplementedError(f"{type(self).__name__} must implement _lr(group_index, base_lr)")

    def get_lr(self) -> list[float]:
        """The lr of each param group at ``last_epoch``."""
        return [self._lr(i, base) for i, base in enumerate(self.base_lrs)]

    def get_last_lr(self) -> list[float]:
        """The lr of each param group that the last ``step()`` set."""
        return list(self._last_lr)

    def step(self) -> None:
        self.last_epoch += 1
        self._apply()

    def _apply(self):
        lrs = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = lrs

    # --- checkpoints ------------------------------------------------------
    def _state_names(self):
        return list(self._checks()) + ["last_epoch", "base_lrs"]

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer, as numbers and lists (``eo.save`` takes it)."""
        return {name: _copy(getattr(self, name)) for name in self._state_names()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the schedule's arguments and position (validated first), and set
        the groups' lrs for that position."""
        self.__dict__.update(self._validated(state_dict))
        self._apply()

    def _validated(self, state_dict):
        name = type(self).__name__
        if not isinstance(state_dict, dict) or set(state_dict) != set(self._state_names()):
            raise EveryOStateDictError(
                f"{name}.load_state_dict needs the keys {sorted(self._state_names())} (as returned by state_dict()), "
                f"got {sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__}"
            )
        where = "the loaded state dict"
        values = checked(name, self._checks(), state_dict, where)
        values["last_epoch"] = checked(name, {"last_epoch": Integer(0)}, state_dict, where)["last_epoch"]
        groups = len(self.optimizer.param_groups)
        values["base_lrs"] = checked(name, {"base_lrs": PerGroup(Real(), groups)}, state_dict, where)["base_lrs"]
        if not isinstance(state_dict["base_lrs"], (list, tuple)):
            raise EveryOStateDictError(f"{name}: base_lrs in {where} must be a list, one lr per param group")
        return values


def _copy(value):
    return list(value) if isinstance(value, list) else value


class StepLR(LRScheduler):
    """``lr = initial_lr * gamma ** (last_epoch // step_size)``.

    Examples:
        >>> from everyo.optim.lr_scheduler import StepLR
        >>> opt = eo.SGD(eo.nn.Linear(4, 1).parameters(), lr=0.1)
        >>> scheduler = StepLR(opt, step_size=30, gamma=0.1)
        >>> for epoch in range(30):
        ...     scheduler.step()
        >>> scheduler.get_last_lr()
        [0.010000000000000002]
    """

    step_size: int
    gamma: float

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, step_size=step_size, gamma=gamma)

    def _checks(self):
        return {"step_size": Integer(1), "gamma": Real()}

    def _lr(self, i, base_lr):
        return base_lr * self.gamma ** (self.last_epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """``lr = initial_lr * gamma ** (number of milestones <= last_epoch)``.

    Examples:
        >>> from everyo.optim.lr_scheduler import MultiStepLR
        >>> opt = eo.SGD(eo.nn.Linear(4, 1).parameters(), lr=0.1)
        >>> scheduler = MultiStepLR(opt, milestones=[30, 80], gamma=0.1)
        >>> for epoch in range(80):
        ...     scheduler.step()
        >>> scheduler.get_last_lr()
        [0.0010000000000000002]
    """

    milestones: list[int]
    gamma: float

    def __init__(
        self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        super().__init__(optimizer, last_epoch, milestones=milestones, gamma=gamma)

    def _checks(self):
        return {"milestones": Milestones(), "gamma": Real()}

    def _lr(self, i, base_lr):
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, self.last_epoch)


class ExponentialLR(LRScheduler):
    """``lr = initial_lr * gamma ** last_epoch``.

    Examples:
        >>> from everyo.optim.lr_scheduler import ExponentialLR
        >>> opt = eo.SGD(eo.nn.Linear(4, 1).parameters(), lr=0.1)
        >>> scheduler = ExponentialLR(opt, gamma=0.95)
        >>> scheduler.step()
        >>> scheduler.get_last_lr()
        [0.095]
    """

    gamma: float

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, gamma=gamma)

    def _checks(self):
        return {"gamma": Real()}

    def _lr(self, i, base_lr):
        return base_lr * self.gamma**self.last_epoch


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (initial_lr - eta_min) * (1 + cos(pi * last_epoch / T_max)) / 2``
    (SGDR without restarts; past ``T_max`` the cosine goes on, as in PyTorch).

    Examples:
        >>> from everyo.optim.lr_scheduler import CosineAnnealingLR
        >>> opt = eo.SGD(eo.nn.Linear(4, 1).parameters(), lr=0.1)
        >>> scheduler = CosineAnnealingLR(opt, T_max=100, eta_min=1e-5)
        >>> for epoch in range(100):
        ...     scheduler.step()
        >>> scheduler.get_last_lr()
        [1e-05]
    """

    T_max: int
    eta_min: float

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, T_max=T_max, eta_min=eta_min)

    def _checks(self):
        return {"T_max": Integer(1), "eta_min": Real()}

    def _lr(self, i, base_lr):
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
    """Linear warm-up (or decay): the factor on ``initial_lr`` goes from
    ``start_factor`` to ``end_factor`` over ``total_iters`` steps, then stays.

    Examples:
        >>> from everyo.optim.lr_scheduler import LinearLR
        >>> opt = eo.SGD(eo.nn.Linear(4, 1).parameters(), lr=0.1)
        >>> scheduler = LinearLR(opt, start_factor=0.01, total_iters=500)
        >>> scheduler.get_last_lr()
        [0.001]
    """

    start_factor: float
    end_factor: float
    total_iters: int

    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        super().__init__(
            optimizer, last_epoch, start_factor=start_factor, end_factor=end_factor, total_iters=total_iters
        )

    def _checks(self):
        return {"start_factor": Real(), "end_factor": Real(), "total_iters": Integer(1)}

    def _lr(self, i, base_lr):
        done = min(self.last_epoch, self.total_iters) / self.total_iters
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin), stepped once per batch: the lr rises
    from ``max_lr / div_factor`` to ``max_lr`` over the first ``pct_start`` of
    ``total_steps``, then anneals to ``max_lr / div_factor / final_div_factor``
    (``three_phase``: back down to the start first, then to the minimum). With
    ``cycle_momentum`` the momentum (SGD's ``momentum`` or Adam's first beta)
    moves the opposite way between ``max_momentum`` and ``base_momentum``.

    Args:
        max_lr: the peak lr, one for all groups or a list with one per group.
        total_steps: the number of steps, or give ``epochs`` and ``steps_per_epoch``.
        anneal_strategy: ``"cos"`` or ``"linear"``.

    Examples:
        >>> from everyo.optim.lr_scheduler import OneCycleLR
        >>> opt = eo.SGD(eo.nn.Linear(4, 1).parameters(), lr=0.1)
        >>> loader = eo.data.DataLoader(eo.data.TensorDataset(eo.randn(64, 4)), batch_size=16)
        >>> scheduler = OneCycleLR(opt, max_lr=0.1, epochs=10, steps_per_epoch=len(loader))
        >>> scheduler.total_steps
        40
    """

    max_lr: list[float]
    total_steps: int
    pct_start: float
    anneal_strategy: str
    cycle_momentum: bool
    base_momentum: list[float]
    max_momentum: list[float]
    div_factor: float
    final_div_factor: float
    three_phase: bool

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | Sequence[float],
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float | Sequence[float] = 0.85,
        max_momentum: float | Sequence[float] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        groups = _optimizer_groups(optimizer, "OneCycleLR")
        self._groups = len(groups)
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError("OneCycleLR needs total_steps, or epochs and steps_per_epoch")
            total_steps = Integer(1)(epochs) * Integer(1)(steps_per_epoch)
        momentum_key = "betas" if "betas" in groups[0] else "momentum"
        if cycle_momentum and momentum_key not in groups[0]:
            raise ValueError(
                f"OneCycleLR: cycle_momentum=True, but {type(optimizer).__name__} has neither "
                f"'momentum' nor 'betas'; pass cycle_momentum=False"
            )
        self._momentum_key = momentum_key
        if last_epoch == -1:
            max_lrs = checked(
                "OneCycleLR", {"max_lr": PerGroup(Real(), len(groups))}, {"max_lr": max_lr}, "the arguments"
            )["max_lr"]
            for group, peak in zip(groups, max_lrs):
                group["initial_lr"] = peak / Real()(div_factor)
        super().__init__(
            optimizer,
            last_epoch,
            max_lr=max_lr,
            total_steps=total_steps,
            pct_start=pct_start,
            anneal_strategy=anneal_strategy,
            cycle_momentum=cycle_momentum,
            base_momentum=base_momentum,
            max_momentum=max_momentum,
            div_factor=div_factor,
            final_div_factor=final_div_factor,
            three_phase=three_phase,
        )

    def _checks(self):
        per_group = lambda check: PerGroup(check, self._groups)  # noqa: E731
        return {
            "max_lr": per_group(Real()),
            "total_steps": Integer(1),
            "pct_start": Real(0.0, 1.0),
            "anneal_strategy": Choice("cos", "linear"),
            "cycle_momentum": Flag(),
            "base_momentum": per_group(Real(0.0, 1.0)),
            "max_momentum": per_group(Real(0.0, 1.0)),
            "div_factor": Real(),
            "final_div_factor": Real(),
            "three_phase": Flag(),
        }

    def _phases(self):
        """(last step, start lr, end lr, start momentum, end momentum) of each phase, lrs as
        'initial'/'max'/'min', momenta as 'base'/'max'."""
        n, pct = self.total_steps, self.pct_start
        if self.three_phase:
            return [
                (pct * n - 1, "initial", "max", "max", "base"),
                (2 * pct * n - 2, "max", "initial", "base", "max"),
                (n - 1, "initial", "min", "max", "max"),
            ]
        return [(pct * n - 1, "initial", "max", "max", "base"), (n - 1, "max", "min", "base", "max")]

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _position(self, i):
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step} times, but total_steps is {self.total_steps}")
        initial = self.max_lr[i] / self.div_factor
        lrs = {"initial": initial, "max": self.max_lr[i], "min": initial / self.final_div_factor}
        momenta = {"base": self.base_momentum[i], "max": self.max_momentum[i]}
        start = 0.0
        phases = self._phases()
        for k, (end, lr0, lr1, m0, m1) in enumerate(phases):
            if step <= end or k == len(phases) - 1:
                pct = (step - start) / (end - start)
                return self._anneal(lrs[lr0], lrs[lr1], pct), self._anneal(momenta[m0], momenta[m1], pct)
            start = end

    def _lr(self, i, base_lr):
        return self._position(i)[0]

    def _apply(self):
        super()._apply()
        for i, group in enumerate(self.optimizer.param_groups):
            group["max_lr"], group["min_lr"] = self.max_lr[i], self.max_lr[i] / self.div_factor / self.final_div_factor
            if self.cycle_momentum:
                momentum = self._position(i)[1]
                if self._momentum_key == "betas":
                    group["betas"] = (momentum,) + tuple(group["betas"][1:])
                else:
                    group["momentum"] = momentum


class SequentialLR(LRScheduler):
    """Runs ``schedulers`` one after another, switching at ``milestones``; each
    starts from its own step 0 when its turn comes (PyTorch's semantics).

    Examples:
        >>> from everyo.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
        >>> opt = eo.SGD(eo.nn.Linear(4, 1).parameters(), lr=0.1)
        >>> warmup = LinearLR(opt, start_factor=0.1, total_iters=5)
        >>> scheduler = SequentialLR(opt, [warmup, CosineAnnealingLR(opt, T_max=95)], milestones=[5])
        >>> for epoch in range(5):
        ...     scheduler.step()
        >>> scheduler.get_last_lr()
        [0.1]
    """

    milestones: list[int]

    def __init__(
        self, optimizer: Optimizer, schedulers: Iterable[LRScheduler], milestones: Sequence[int], last_epoch: int = -1
    ) -> None:
        groups = _optimizer_groups(optimizer, "SequentialLR")
        schedulers = list(schedulers)
        for k, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler) or isinstance(s, SequentialLR):
                raise TypeError(
                    f"SequentialLR: schedulers[{k}] is a {type(s).__name__}; it takes the closed-form "
                    f"schedules (StepLR, ..., OneCycleLR), not ReduceLROnPlateau or another SequentialLR"
                )
            if s.optimizer is not optimizer:
                raise ValueError(f"SequentialLR: schedulers[{k}] drives another optimizer than this one")
        milestones = Milestones()(milestones)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, "
                f"got {len(milestones)}"
            )
        self.optimizer, self._schedulers, self.milestones = optimizer, schedulers, milestones
        self.base_lrs = [g["initial_lr"] for g in groups]
        self.last_epoch = Integer(-1)(last_epoch)
        self.step()

    def _active(self):
        k = bisect.bisect_right(self.milestones, self.last_epoch)
        return self._schedulers[k], self.last_epoch - (self.milestones[k - 1] if k else 0)

    def get_lr(self) -> list[float]:
        scheduler, epoch = self._active()
        scheduler.last_epoch = epoch
        return scheduler.get_lr()

    def _apply(self):
        scheduler, epoch = self._active()
        scheduler.last_epoch = epoch
        scheduler._apply()  # OneCycleLR also sets the momentum
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return {
            "last_epoch": self.last_epoch,
            "milestones": list(self.milestones),
            "schedulers": [s.state_dict() for s in self._schedulers],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or set(state_dict) != {"last_epoch", "milestones", "schedulers"}:
            raise EveryOStateDictError(
                "SequentialLR.load_state_dict needs 'last_epoch', 'milestones' and "
                "'schedulers' (as returned by state_dict())"
            )
        children = state_dict["schedulers"]
        if not isinstance(children, (list, tuple)) or len(children) != len(self._schedulers):
            raise EveryOStateDictError(
                f"SequentialLR: the state dict holds {len(children)} schedulers' states, "
                f"this one has {len(self._schedulers)} schedulers"
            )
        values = [s._validated(c) for s, c in zip(self._schedulers, children)]
        where = "the loaded state dict"
        own = checked("SequentialLR", {"last_epoch": Integer(0), "milestones": Milestones()}, state_dict, where)
        if len(own["milestones"]) != len(self._schedulers) - 1:
            raise EveryOStateDictError(
                f"SequentialLR: the state dict has {len(own['milestones'])} milestones, "
                f"this one needs {len(self._schedulers) - 1}"
            )
        for s, v in zip(self._schedulers, values):
            s.__dict__.update(v)
        self.__dict__.update(own)
        self._apply()


class ReduceLROnPlateau:
    """Multiply every group's lr by ``factor`` once the metric given to
    ``step(metric)`` has not improved for more than ``patience`` steps
    (PyTorch's rule: improvement is relative or absolute by ``threshold``;
    after a reduction, ``cooldown`` steps are not counted; lrs stop at ``min_lr``,
    and a change smaller than ``eps`` is skipped).

    Examples:
        >>> from everyo.optim.lr_scheduler import ReduceLROnPlateau
        >>> opt = eo.SGD(eo.nn.Linear(4, 1).parameters(), lr=0.1)
        >>> scheduler = ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=3)
        >>> for validation_loss in [1.0, 0.9, 0.9, 0.9, 0.9, 0.9]:
        ...     scheduler.step(validation_loss)
        >>> opt.param_groups[0]["lr"]
        0.05
    """

    optimizer: Optimizer
    mode: str
    factor: float
    patience: int
    threshold: float
    threshold_mode: str
    cooldown: int
    min_lr: list[float]
    eps: float
    best: float
    num_bad_epochs: int
    cooldown_counter: int
    last_epoch: int

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float | Sequence[float] = 0.0,
        eps: float = 1e-8,
    ) -> None:
        self.optimizer = optimizer
        groups = _optimizer_groups(optimizer, "ReduceLROnPlateau")
        values = checked(
            "ReduceLROnPlateau",
            self._checks(len(groups)),
            dict(
                mode=mode,
                factor=factor,
                patience=patience,
                threshold=threshold,
                threshold_mode=threshold_mode,
                cooldown=cooldown,
                min_lr=min_lr,
                eps=eps,
            ),
            "the arguments",
        )
        self.__dict__.update(values)
        self.best = math.inf if self.mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = self.last_epoch = 0
        self._last_lr = [g["lr"] for g in groups]

    @staticmethod
    def _checks(groups):
        return {
            "mode": Choice("min", "max"),
            "factor": Real(0.0, 1.0, open_high=True),
            "patience": Integer(0),
            "threshold": Real(),
            "threshold_mode": Choice("rel", "abs"),
            "cooldown": Integer(0),
            "min_lr": PerGroup(Real(), groups),
            "eps": Real(),
        }

    def _improves(self, value):
        if self.mode == "min":
            bound = self.best * (1 - self.threshold) if self.threshold_mode == "rel" else self.best - self.threshold
            return value < bound
        bound = self.best * (1 + self.threshold) if self.threshold_mode == "rel" else self.best + self.threshold
        return value > bound

    def step(self, metrics: SupportsFloat) -> None:
        """Record this epoch's ``metrics`` (a number or a one-element Tensor); NaN never improves."""
        value = float(metrics.item() if hasattr(metrics, "item") else metrics)
        self.last_epoch += 1
        if self._improves(value):
            self.best, self.num_bad_epochs = value, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for group, floor in zip(self.optimizer.param_groups, self.min_lr):
                new = max(group["lr"] * self.factor, floor)
                if group["lr"] - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    _STATE = ("best", "num_bad_epochs", "cooldown_counter", "last_epoch")

    def state_dict(self) -> dict[str, Any]:
        """The arguments and the plateau's progress; the lrs themselves live in the optimizer's state dict."""
        return {name: _copy(getattr(self, name)) for name in (*self._checks(1), *self._STATE)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        names = {*self._checks(1), *self._STATE}
        if not isinstance(state_dict, dict) or set(state_dict) != names:
            raise EveryOStateDictError(
                f"ReduceLROnPlateau.load_state_dict needs the keys {sorted(names)} (as returned by state_dict())"
            )
        where = "the loaded state dict"
        values = checked("ReduceLROnPlateau", self._checks(len(self.optimizer.param_groups)), state_dict, where)
        counters = {"num_bad_epochs": Integer(0), "cooldown_counter": Integer(0), "last_epoch": Integer(0)}
        values.update(checked("ReduceLROnPlateau", counters, state_dict, where))
        try:
            values["best"] = _real(state_dict["best"])  # inf before the first step
        except TypeError as exc:
            raise TypeError(f"ReduceLROnPlateau: best in {where} {exc}") from None
        self.__dict__.update(values)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]
