"""DataLoader: mini-batches over a Dataset (or in-memory arrays), resumable."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo.data.dataset import TensorDataset, aligned_arrays
from everyo.errors import EveryOStateDictError
from everyo.random import check_generator_state, generator_for, generator_state, set_generator_state
from everyo.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from everyo._typing import Array

__all__ = ["DataLoader", "default_collate"]


def default_collate(samples: Sequence[Any]) -> Any:
    """Stack a list of samples into a batch of Tensors: arrays, Tensors and numbers
    are stacked along a new first axis; tuples/lists and dicts are collated field by
    field (a tuple / a dict of batches); strings stay a list.

    Examples:
        >>> from everyo.data.loader import default_collate
        >>> batch = default_collate([(np.zeros(3), 1), (np.ones(3), 0)])
        >>> batch[0].shape, batch[1].data.tolist()
        ((2, 3), [1, 0])
    """
    first = samples[0]
    if isinstance(first, str):
        return list(samples)
    if isinstance(first, dict):
        return {key: default_collate([s[key] for s in samples]) for key in first}
    if isinstance(first, (tuple, list)):
        width = len(first)
        for i, s in enumerate(samples):
            if not isinstance(s, (tuple, list)) or len(s) != width:
                raise TypeError(
                    f"default_collate: sample 0 has {width} fields but sample {i} is {s!r:.80}; "
                    f"every sample needs the same structure"
                )
        return tuple(default_collate([s[k] for s in samples]) for k in range(width))
    if isinstance(first, (Tensor, np.ndarray, np.generic, numbers.Number)):
        arrays = [s.data if isinstance(s, Tensor) else np.asarray(s) for s in samples]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise ValueError(
                f"default_collate: samples have different shapes {sorted(shapes)}; pad them in a "
                f"collate_fn (eo.pad_sequences returns the padded batch and the lengths)"
            )
        return Tensor(np.stack(arrays))
    raise TypeError(f"default_collate cannot batch samples of type {type(first).__name__}; pass collate_fn=")


def _is_dataset(obj):
    if isinstance(obj, (np.ndarray, Tensor, list, tuple)):
        return False  # 0.1's in-memory form: DataLoader(x) iterates over the rows of x
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


class DataLoader:
    """Mini-batches over a dataset, yielding Tensors.

    Two forms: ``DataLoader(dataset, ...)`` over any object with ``__len__`` and
    ``__getitem__`` (see :class:`Dataset`), and 0.1's ``DataLoader(x, y, ...)``
    over aligned in-memory arrays, which yields a tuple of batches (or one
    batch for one array) and is as fast as before.

    Args:
        *data: a dataset, or arrays with the same first dimension.
        batch_size: samples per batch.
        shuffle: draw a new order at the start of every epoch.
        seed: makes the shuffling reproducible (each epoch still differs); without
            it the stream comes from the global state (``eo.manual_seed``).
        drop_last: drop a final batch smaller than ``batch_size``.
        sampler: an iterable of dataset indices giving the order of an epoch
            (e.g. a distributed sampler's shard); excludes ``shuffle``.
        collate_fn: turns a list of samples into a batch (default:
            :func:`default_collate`).

    ``state_dict()`` / ``load_state_dict()`` hold the epoch, the batches already
    taken from the current epoch and the shuffling stream, so a resumed run sees
    exactly the batches an uninterrupted one would (a sampler with its own
    ``state_dict`` is saved alongside).

    Examples:
        >>> x, y = np.zeros((100, 3), np.float32), np.arange(100)
        >>> loader = eo.DataLoader(x, y, batch_size=64, shuffle=True, seed=0)
        >>> [(batch.shape, targets.shape) for batch, targets in loader]
        [((64, 3), (64,)), ((36, 3), (36,))]
    """

    def __init__(
        self,
        *data: Any,
        batch_size: int = 32,
        shuffle: bool = False,
        seed: int | np.random.Generator | None = None,
        drop_last: bool = False,
        sampler: Iterable[int] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        if not data:
            raise ValueError("DataLoader needs a dataset or at least one array")
        if len(data) == 1 and _is_dataset(data[0]):
            self.dataset, self._unwrap = data[0], False
        else:
            self.dataset = TensorDataset(*aligned_arrays(data, "DataLoader"))
            self.arrays, self._unwrap = self.dataset.arrays, len(data) == 1
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, numbers.Integral)) or batch_size < 1:
            raise ValueError(f"DataLoader batch_size must be an integer >= 1, got {batch_size!r}")
        if sampler is not None and shuffle:
            raise ValueError("DataLoader: sampler= and shuffle=True exclude each other; the sampler decides the order")
        if sampler is not None and not hasattr(sampler, "__iter__"):
            raise TypeError(f"DataLoader sampler must be an iterable of indices, got {type(sampler).__name__}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"DataLoader collate_fn must be callable, got {type(collate_fn).__name__}")
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), bool(shuffle), bool(drop_last)
        self.sampler, self.collate_fn = sampler, collate_fn
        self.generator = generator_for(seed)
        self._epoch, self._position = 0, 0
        self._batches = 0
        self._epoch_start: Array | None = None  # the stream's state when the running epoch drew its order
        self._resume_at = 0  # batches to skip in the next epoch (set by load_state_dict)

    def _num_samples(self):
        if self.sampler is not None:
            if not hasattr(self.sampler, "__len__"):
                raise TypeError(f"len(DataLoader): the sampler {type(self.sampler).__name__} has no __len__")
            return len(self.sampler)
        return len(self.dataset)

    def __len__(self) -> int:
        n = self._num_samples()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _order(self):
        """This epoch's indices: the sampler's, a fresh permutation, or None (in order)."""
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), dtype=np.intp)
        if self.shuffle:
            return self.generator.permutation(len(self.dataset))
        return None

    def _fetch(self, rows):
        if self.collate_fn is None and isinstance(self.dataset, TensorDataset):
            return tuple(Tensor(a) for a in self.dataset.gather(rows))  # one fancy index per array
        indices = range(rows.start, rows.stop) if isinstance(rows, slice) else rows.tolist()
        samples = [self.dataset[i] for i in indices]
        return (self.collate_fn or default_collate)(samples)

    def __iter__(self) -> Iterator[Any]:
        self._epoch_start = generator_state(self.generator)
        order = self._order()
        n = len(order) if order is not None else len(self.dataset)
        batches = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        self._batches = batches
        start, self._resume_at = self._resume_at, 0
        self._position = start
        for b in range(start, batches):
            lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, n)
            rows = order[lo:hi] if order is not None else slice(lo, hi)
            batch = self._fetch(rows)
            self._position = b + 1  # counted as taken once handed out
            yield batch[0] if self._unwrap else batch
        self._epoch, self._position, self._epoch_start = self._epoch + 1, 0, None

    # --- resumption ---------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "position", "generator"}`` (+ ``"sampler"``): plain ints and a
        uint64 array, so ``eo.save`` can write it. Mid-epoch, ``generator`` is the
        stream's state from before this epoch's order was drawn."""
        start = self._epoch_start if self._position > 0 else None  # not None: mid-epoch
        if start is not None and self._position >= self._batches:
            # Every batch handed out (the loop body has the last one): resume at the next epoch.
            return self._state(self._epoch + 1, 0, generator_state(self.generator))
        if start is None:
            return self._state(self._epoch, 0, generator_state(self.generator))
        return self._state(self._epoch, self._position, start.copy())

    def _state(self, epoch, position, generator):
        state = {"epoch": epoch, "position": position, "generator": generator}
        if self.sampler is not None and hasattr(self.sampler, "state_dict"):
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (validated first); the next epoch starts
        where the saved one stopped."""
        if not isinstance(state, dict):
            raise EveryOStateDictError(f"DataLoader.load_state_dict expects a dict, got {type(state).__name__}")
        expected = {"epoch", "position", "generator"} | ({"sampler"} if "sampler" in state else set())
        if set(state) != expected or ("sampler" in state and not hasattr(self.sampler, "load_state_dict")):
            raise EveryOStateDictError(
                f"DataLoader.load_state_dict: expected keys ['epoch', 'position', 'generator'] (and 'sampler' "
                f"when the sampler has a state), got {sorted(state)}"
            )
        epoch, position = (_whole(state[k], k) for k in ("epoch", "position"))
        if position > len(self):
            raise EveryOStateDictError(
                f"DataLoader.load_state_dict: position {position} is past the {len(self)} batches of an epoch; "
                f"was it saved with another batch_size or data set?"
            )
        check_generator_state(state["generator"], "DataLoader.load_state_dict: generator")
        if "sampler" in state:
            sampler: Any = self.sampler  # checked above: it has load_state_dict
            sampler.load_state_dict(state["sampler"])
        set_generator_state(self.generator, state["generator"], "DataLoader.load_state_dict: generator")
        self._epoch, self._resume_at, self._position, self._epoch_start = epoch, position, 0, None


def _whole(value, key):
    value = value.item() if isinstance(value, np.ndarray) and value.shape == () else value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise EveryOStateDictError(f"DataLoader.load_state_dict: {key!r} must be a non-negative integer, got {value!r}")
    return int(value)
