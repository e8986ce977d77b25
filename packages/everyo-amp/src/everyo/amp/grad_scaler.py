"""``GradScaler``: dynamic loss scaling, so small float16 gradients survive.

float16's smallest subnormal is about 6e-8; gradients routinely fall below it
and flush to zero. Multiplying the loss by a large constant before backward()
shifts every gradient by the same factor into representable range; dividing
it back out (in the float32 master gradients) before the optimizer steps
leaves the update unchanged. The constant is searched dynamically: it halves
(``backoff_factor``) whenever a gradient overflows, and that step is skipped,
and it grows (``growth_factor``) after ``growth_interval`` clean steps.

The search has a floor (``min_scale``): gradients that stay inf/NaN however
small the scale come from the forward pass or the data, not from float16's
range, and halving forever would only reach 0.0. At the floor the scale stops
falling and a ``RuntimeWarning`` says so; a long run of skipped steps warns
as well (``warn_after_skips``).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.errors import EveryODTypeError, EveryOStateDictError
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from everyo.optim.optimizer import Optimizer

__all__ = ["GradScaler"]

# Per-optimizer stage within one iteration (between two update() calls).
_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"

_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "growth_tracker")
# Added in 0.2; a 0.1 checkpoint without them loads with the defaults.
_NEW_STATE_KEYS = ("min_scale", "skipped_in_a_row")
_DEFAULT_MIN_SCALE = 1.0


class GradScaler:
    """Scale the loss, unscale and check the gradients, skip steps that overflowed.

    Args:
        init_scale: the first loss scale.
        growth_factor: multiplies the scale after ``growth_interval`` steps in a
            row without inf/NaN gradients (only if the grown scale is finite).
        backoff_factor: multiplies the scale when a gradient is inf/NaN.
        growth_interval: clean steps needed before the scale grows.
        min_scale: the floor of the backoff (default 1.0). At scale 1 the
            backward pass is the plain, unscaled one; below it every gradient
            is *shrunk* towards float16's underflow (2**-24), which trades the
            overflow a skip avoids for silent flushes, so a smaller scale is
            no cure. Gradients that are still inf/NaN at scale 1 are
            non-finite at any scale (a NaN in the loss, an overflow in the
            forward pass): the scale stops at the floor and a RuntimeWarning
            says how many steps in a row were skipped. From the default
            ``init_scale`` of 2**16 the floor is 16 halvings away, so a real
            overflow is still backed off in full.
        warn_after_skips: warn (RuntimeWarning) after this many skipped steps
            in a row, and again after each further as many (default 100).
        enabled: ``False`` turns every method into the plain float32 behaviour
            (``step`` just steps), so one training loop serves both modes.

    Several optimizers share one scaler as in PyTorch: ``scaler.step(opt1);
    scaler.step(opt2); scaler.update()``. Each optimizer's gradients are
    unscaled once (by :meth:`unscale_` or :meth:`step`); each step is skipped
    only if *its* gradients are inf/NaN, and :meth:`update` backs off once if
    any optimizer's were.

    In data-parallel training average the gradients before :meth:`step`
    (``everyo.distributed.average_gradients``): an inf/NaN on one rank makes
    the average inf/NaN on every rank, so all ranks skip together and their
    scales stay equal.

    bfloat16: ``autocast(dtype="bfloat16")`` has float32's exponent range, so
    gradients neither overflow nor flush where float32's would not and loss
    scaling is unnecessary; a GradScaler still works with it (it only
    multiplies and divides by a power of two, which is exact).

    Examples:
        >>> model, criterion = eo.nn.Linear(4, 2), eo.nn.MSELoss()
        >>> optimizer = eo.SGD(model.parameters(), lr=0.1)
        >>> batch, targets = eo.ones(8, 4), eo.zeros(8, 2)
        >>> scaler = eo.GradScaler(init_scale=1024.0)  # 2**16 may overflow this tiny model's first step
        >>> with eo.autocast():
        ...     predictions = model(batch)
        >>> loss = criterion(predictions, targets)
        >>> scaler.backward(loss)              # scale, then backward
        >>> applied = scaler.step(optimizer)   # False when the step was skipped
        >>> scaler.update()                    # grow or shrink the scale
        >>> applied, scaler.get_scale()
        (True, 1024.0)
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        min_scale: float = _DEFAULT_MIN_SCALE,
        warn_after_skips: int = 100,
    ) -> None:
        self._enabled = bool(enabled)
        self._check_hyper("GradScaler", init_scale, growth_factor, backoff_factor, growth_interval, min_scale)
        if _integer("GradScaler: warn_after_skips", warn_after_skips) < 1:
            raise ValueError(f"GradScaler: warn_after_skips must be a positive integer, got {warn_after_skips!r}")
        self._scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._min_scale = float(min_scale)
        self._warn_after_skips = int(warn_after_skips)
        self._growth_tracker = 0
        self._skipped_in_a_row = 0
        self._floor_warned = False
        self._per_optimizer: dict[int, dict[str, Any]] = {}  # id(optimizer) -> {"stage": ..., "found_inf": bool}

    # --- the loss ---------------------------------------------------------
    def scale(self, loss: Tensor) -> Tensor:
        """``loss * scale``, computed in float32 (a float16 loss times 65536 would overflow)."""
        if not isinstance(loss, Tensor):
            raise TypeError(f"GradScaler.scale expects an everyo Tensor (the loss), got {type(loss).__name__}")
        if not self._enabled:
            return loss
        if loss.data.dtype == np.float16:
            loss = loss.astype("float32")
        return loss * self._scale

    def backward(self, loss: Tensor) -> None:
        """``scale(loss).backward()`` with NumPy's overflow warnings silenced.

        An overflow here is the signal :meth:`step` acts on, not something to
        print. Use ``scaler.scale(loss).backward()`` to see the warnings.
        """
        scaled = self.scale(loss)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            scaled.backward()

    # --- the gradients ----------------------------------------------------
    def unscale_(self, optimizer: Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place, and note any inf/NaN.

        Call it before clipping gradients (``eo.clip_grad_norm``) so the clip
        sees true magnitudes; :meth:`step` then does not unscale again. At most
        once per optimizer between two :meth:`update` calls.
        """
        if not self._enabled:
            return
        state = self._state_for(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError(
                "GradScaler.unscale_() was already called on this optimizer since the last update(); "
                "call it at most once per optimizer per iteration"
            )
        if state["stage"] == _STEPPED:
            raise RuntimeError("GradScaler.unscale_() called after step(); call it before step(), then update()")
        for index, p in enumerate(optimizer.params):
            if p.grad is not None and p.grad.dtype == np.float16:
                raise EveryODTypeError(
                    f"GradScaler.unscale_: parameter {index} (shape {p.grad.shape}) has a float16 gradient; "
                    "unscaled float16 gradients would flush to zero. Keep parameters in float32 "
                    "(autocast casts them for matmul/conv2d) instead of model.to('float16')"
                )
        inv_scale = 1.0 / self._scale
        found_inf = False
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            for p in optimizer.params:
                g = p.grad
                if g is None:
                    continue
                g = g * np.asarray(inv_scale, dtype=g.dtype)
                p.grad = g
                # A float64 sum of float32 values cannot overflow, so it is
                # non-finite exactly when some element is inf or NaN.
                if not found_inf and not math.isfinite(float(np.sum(g, dtype=np.float64))):
                    found_inf = True
        state["stage"], state["found_inf"] = _UNSCALED, found_inf

    def step(self, optimizer: Optimizer) -> bool:
        """Unscale (unless :meth:`unscale_` already did), then step unless a gradient is inf/NaN.

        Returns ``True`` when ``optimizer.step()`` ran, ``False`` when the step
        was skipped; a skipped step leaves parameters and optimizer state
        untouched.
        """
        if not self._enabled:
            optimizer.step()
            return True
        state = self._state_for(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("GradScaler.step() was already called on this optimizer since the last update()")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        state["stage"] = _STEPPED
        if state["found_inf"]:
            return False
        optimizer.step()
        return True

    def update(self, new_scale: float | None = None) -> None:
        """End the iteration: back off on inf/NaN, grow after ``growth_interval`` clean steps.

        ``new_scale`` sets the scale directly instead.
        """
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = _positive_finite("GradScaler.update(new_scale=...)", new_scale)
        else:
            if not self._per_optimizer:
                raise RuntimeError(
                    "GradScaler.update() found no gradients checked since the last update(); "
                    "call scaler.step(optimizer) (or unscale_) first"
                )
            if any(s["found_inf"] for s in self._per_optimizer.values()):
                self._back_off()
            else:
                self._skipped_in_a_row = 0
                self._floor_warned = False
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    grown = self._scale * self._growth_factor
                    if math.isfinite(grown):
                        self._scale = grown
                    self._growth_tracker = 0
        self._per_optimizer = {}

    def _back_off(self):
        self._growth_tracker = 0
        self._skipped_in_a_row += 1
        skipped = self._skipped_in_a_row
        lowered = self._scale * self._backoff_factor
        if lowered >= self._min_scale:
            self._scale = lowered
        else:
            self._scale = min(self._scale, self._min_scale)  # (an update(new_scale=) below it stays)
        if lowered < self._min_scale and not self._floor_warned:  # once per run of skips
            self._floor_warned = True
            warnings.warn(
                f"GradScaler: {skipped} step(s) in a row skipped; the scale would fall below min_scale="
                f"{self._min_scale} and stops there. Gradients still inf/NaN at this scale are non-finite at any scale: "
                "look for a NaN/inf in the loss or the forward pass (or a learning rate that diverged)",
                RuntimeWarning,
                stacklevel=3,
            )
        if skipped % self._warn_after_skips == 0:
            warnings.warn(
                f"GradScaler: {skipped} steps in a row skipped because gradients were inf/NaN "
                f"(scale now {self._scale}); training is not progressing",
                RuntimeWarning,
                stacklevel=3,
            )

    # --- inspection and checkpoints ---------------------------------------
    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    @property
    def growth_tracker(self) -> int:
        """Clean steps in a row since the scale last changed."""
        return self._growth_tracker

    @property
    def skipped_in_a_row(self) -> int:
        """Steps skipped in a row (inf/NaN gradients) up to the last :meth:`update`."""
        return self._skipped_in_a_row

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """Scale, factors and growth counter (empty when disabled); saves with ``eo.save``."""
        if not self._enabled:
            return {}
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "growth_tracker": self._growth_tracker,
            "min_scale": self._min_scale,
            "skipped_in_a_row": self._skipped_in_a_row,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the scale search; the input is validated before anything changes."""
        if not self._enabled:
            raise RuntimeError("GradScaler.load_state_dict: this scaler is disabled (enabled=False)")
        if not isinstance(state_dict, dict):
            raise EveryOStateDictError(
                f"GradScaler.load_state_dict expects a dict from state_dict(), got {type(state_dict).__name__}"
            )
        if not state_dict:
            raise EveryOStateDictError(
                "GradScaler.load_state_dict got an empty dict; it was probably saved from a disabled scaler"
            )
        missing = [k for k in _STATE_KEYS if k not in state_dict]
        unexpected = sorted(set(state_dict) - set(_STATE_KEYS) - set(_NEW_STATE_KEYS))
        if missing or unexpected:
            raise EveryOStateDictError(
                f"GradScaler.load_state_dict: missing keys {missing}, unexpected keys {unexpected}; "
                f"expected {list(_STATE_KEYS + _NEW_STATE_KEYS)} (the last two optional)"
            )
        defaults = {"min_scale": _DEFAULT_MIN_SCALE, "skipped_in_a_row": 0}
        values = {k: _scalar(k, state_dict.get(k, defaults.get(k))) for k in _STATE_KEYS + _NEW_STATE_KEYS}
        try:
            self._check_hyper(
                "GradScaler.load_state_dict",
                values["scale"],
                values["growth_factor"],
                values["backoff_factor"],
                values["growth_interval"],
                values["min_scale"],
            )
            tracker = _integer("growth_tracker", values["growth_tracker"])
            skipped = _integer("skipped_in_a_row", values["skipped_in_a_row"])
        except (TypeError, ValueError) as exc:
            raise EveryOStateDictError(str(exc)) from None
        if skipped < 0:
            raise EveryOStateDictError(f"GradScaler.load_state_dict: skipped_in_a_row={skipped} must be >= 0")
        if not 0 <= tracker < int(values["growth_interval"]):
            raise EveryOStateDictError(
                f"GradScaler.load_state_dict: growth_tracker={tracker} must be in "
                f"[0, growth_interval={int(values['growth_interval'])})"
            )
        self._scale = float(values["scale"])
        self._growth_factor = float(values["growth_factor"])
        self._backoff_factor = float(values["backoff_factor"])
        self._growth_interval = int(values["growth_interval"])
        self._growth_tracker = tracker
        self._min_scale = float(values["min_scale"])
        self._skipped_in_a_row = skipped

    # --- helpers ----------------------------------------------------------
    def _state_for(self, optimizer):
        if not hasattr(optimizer, "params") or not hasattr(optimizer, "step"):
            raise TypeError(
                f"GradScaler needs an optimizer with .params and .step() (e.g. eo.SGD), got {type(optimizer).__name__}"
            )
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": False})

    @staticmethod
    def _check_hyper(where, scale, growth_factor, backoff_factor, growth_interval, min_scale):
        _positive_finite(f"{where}: scale", scale)
        _positive_finite(f"{where}: min_scale", min_scale)
        if scale < min_scale:
            raise ValueError(f"{where}: scale {scale!r} is below min_scale {min_scale!r}")
        if not _is_real(growth_factor) or not (math.isfinite(growth_factor) and growth_factor > 1.0):
            raise ValueError(f"{where}: growth_factor must be a finite number > 1, got {growth_factor!r}")
        if not _is_real(backoff_factor) or not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"{where}: backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if _integer("growth_interval", growth_interval) < 1:
            raise ValueError(f"{where}: growth_interval must be a positive integer, got {growth_interval!r}")

    def __repr__(self):
        if not self._enabled:
            return "GradScaler(enabled=False)"
        return (
            f"GradScaler(scale={self._scale}, growth_factor={self._growth_factor}, "
            f"backoff_factor={self._backoff_factor}, growth_interval={self._growth_interval}, "
            f"growth_tracker={self._growth_tracker}, min_scale={self._min_scale})"
        )


def _is_real(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _positive_finite(what, x):
    if not _is_real(x) or not (math.isfinite(x) and x > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {x!r}")
    return float(x)


def _integer(what, x):
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        if isinstance(x, numbers.Real) and float(x).is_integer():
            return int(x)  # e.g. 2000.0 read back from a JSON-ish checkpoint
        raise TypeError(f"{what} must be an integer, got {x!r}")
    return int(x)


def _scalar(key, value):
    # eo.load gives NumPy scalars or 0-d arrays back for some numbers.
    if isinstance(value, np.ndarray):
        if value.shape != ():
            raise EveryOStateDictError(
                f"GradScaler.load_state_dict: {key!r} must be a number, got an array of shape {value.shape}"
            )
        value = value.item()
    elif isinstance(value, np.generic):
        value = value.item()
    if not _is_real(value):
        raise EveryOStateDictError(f"GradScaler.load_state_dict: {key!r} must be a number, got {value!r}")
    return value
