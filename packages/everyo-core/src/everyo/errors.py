"""One exception hierarchy for everything EveryO raises on purpose.

Every class also derives from the built-in exception a Python user would
catch for the same mistake (``ValueError`` for a bad shape, ``TypeError`` for
a bad dtype), so ``except ValueError`` keeps working.
"""


class EveryOError(Exception):
    """Base class of every error raised by EveryO."""


class EveryOShapeError(EveryOError, ValueError):
    """An input has the wrong rank or shape for a layer or an op.

    The message names the layer (and its position inside a ``Sequential``),
    the shape it expected and the shape it received.
    """


class EveryODTypeError(EveryOError, TypeError):
    """An input has a dtype the layer or op cannot use (e.g. ints into Linear)."""


class EveryOIndexError(EveryOError, IndexError):
    """An index is out of range (e.g. a token id outside an Embedding's table)."""


class EveryOStateDictError(EveryOError, KeyError):
    """A state dict has missing, unexpected or mis-shaped entries."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class EveryOSerializationError(EveryOError):
    """A file cannot be written or read (corrupt, truncated, foreign), or a
    model cannot be exported (unsupported layer)."""


class EveryOExportMismatchError(EveryOSerializationError):
    """An exported model computes something else than the EveryO model
    (``export_onnx(..., verify=True)``): the message names the first value over
    tolerance, its op and the user's source line."""


class EveryOSpellingError(EveryOError, TypeError):
    """A PyTorch spelling that means something else in EveryO (whose arrays
    follow NumPy), e.g. ``x.size()``, ``x.max(dim=1)``, ``transpose(0, 1)`` on a
    matrix. The message names the EveryO spelling of what was meant; see
    "Coming from PyTorch" in the docs."""


class EveryODistributedError(EveryOError, RuntimeError):
    """A collective or a worker process failed."""


class EveryOInPlaceError(EveryOError, RuntimeError):
    """A value saved for backward was changed in place before backward ran
    (an optimizer step, ``.data`` assignment or in-place method between the
    forward pass and ``backward()``). The message names the op and the tensor.
    ``RuntimeError``, as PyTorch raises for the same mistake."""
