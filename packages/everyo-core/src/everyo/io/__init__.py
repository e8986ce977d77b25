"""Checkpoints without pickle: ``eo.save`` / ``eo.load``, and PyTorch weights.

Two formats, chosen by the file name:

* anything but ``.safetensors``: EveryO's ``.npz`` checkpoint
  (:mod:`everyo.io.npz`), which holds nested dicts, lists, tuples, arrays,
  numbers, strings and None, and needs nothing but NumPy;
* ``.safetensors``: the ecosystem's weights format (:mod:`everyo.io.safetensors_format`),
  through the optional ``safetensors`` package, for flat or nested dicts of arrays.

Every write goes through :func:`atomic_write`. ``load`` treats the file as
untrusted: it returns exactly what was saved or raises
:class:`~everyo.errors.EveryOSerializationError` naming the file and the problem.
"""

from __future__ import annotations

import os  # noqa: F401  (tests patch everyo.io.os.fsync / .replace to simulate failures)
from typing import TYPE_CHECKING

from everyo.io import npz as _npz
from everyo.io import safetensors_format as _safetensors
from everyo.io.atomic import atomic_write
from everyo.io.torch_weights import load_torch_state_dict

if TYPE_CHECKING:
    from typing import Any

__all__ = ["save", "load", "atomic_write", "load_torch_state_dict"]


def _is_safetensors(path: str | os.PathLike[str]) -> bool:
    return os.fspath(path).lower().endswith(".safetensors")


def save(state: Any, path: str | os.PathLike[str]) -> None:
    """Save ``state`` to ``path`` atomically, without pickle.

    Args:
        state: e.g. ``{'model': model.state_dict(), 'optimizer': opt.state_dict(), 'epoch': 3}``:
            dicts (string keys), lists, tuples, NumPy arrays (bfloat16 included),
            Tensors, numbers, strings and None. Masked arrays are refused (their
            mask would be lost). For a ``.safetensors`` path: a dict, possibly
            nested, whose leaves are arrays or Tensors only.
        path: the file. A ``.safetensors`` suffix selects that format (needs
            ``pip install everyo-core[safetensors]``); anything else writes
            EveryO's ``.npz`` checkpoint.

    Raises:
        EveryOSerializationError: a value cannot be saved (nothing is written then).

    Examples:
        >>> eo.save({"model": model.state_dict(), "epoch": 3}, "ckpt.npz")  # doctest: +SKIP
    """
    if _is_safetensors(path):
        _safetensors.write(state, path)
    else:
        _npz.write(state, path)


def load(path: str | os.PathLike[str]) -> Any:
    """Load a file written by :func:`save` (or any ``.safetensors`` file). Never unpickles.

    Returns exactly what was saved, with arrays as NumPy arrays (Tensors were
    saved as their arrays). A ``.safetensors`` file written elsewhere loads as
    a flat dict of arrays under its own keys.

    Raises:
        EveryOSerializationError: the file is missing, truncated, corrupt,
            foreign, or lies about its contents; the message names the file.

    Examples:
        >>> state = eo.load("ckpt.npz")  # doctest: +SKIP
        >>> model.load_state_dict(state["model"])  # doctest: +SKIP
    """
    path = os.fspath(path)
    if _is_safetensors(path):
        return _safetensors.read(path)
    return _npz.read(path)
