"""``convert(array, dtype)``: ``array.astype(dtype)``, through the fast exact
conversions where the project has them (float16 <-> float32 and bfloat16 <->
float32, in :mod:`everyo.half`). One place for every cast that autograd and
the ops make, so a new floating type needs one entry here, not a branch in
each caller."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from everyo.half import _bfloat16_to_float, _float_to_bfloat16, _float_to_half, _half_to_float, as_dtype, is_bfloat16

if TYPE_CHECKING:
    from typing import Any

    from everyo._typing import Array, DType

_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)


def convert(arr: Array, dtype: DType) -> Array:
    """``arr.astype(dtype)``, bit for bit, but faster between a 16-bit float and float32."""
    src, dtype = arr.dtype, as_dtype(dtype)
    if src == _F16 and dtype == _F32:
        return _half_to_float(arr)
    if src == _F32 and dtype == _F16:
        return _float_to_half(arr)
    if src == _F32 and is_bfloat16(dtype):
        return _float_to_bfloat16(arr, dtype)
    if dtype == _F32 and is_bfloat16(src):
        return _bfloat16_to_float(arr)
    return arr.astype(dtype)


def is_floating(dtype: np.dtype[Any]) -> bool:
    """NumPy's floating types and bfloat16 (whose NumPy kind is 'V')."""
    return dtype.kind == "f" or is_bfloat16(dtype)


#: The floating type that integer-only arithmetic gives (``int / int``, an
#: integer tensor times a Python float), PyTorch's default dtype.
DEFAULT_FLOAT = np.dtype(np.float32)


def mixed_dtype(a: DType, b: DType) -> DType | None:
    """The dtype both operands of a binary op take when one is floating and the
    other is not (integer or bool): the floating one's, as in PyTorch and JAX
    (NumPy would widen ``int32 + float32`` to float64). ``None`` when nothing
    is to change: two floating types promote as NumPy does (float16 with
    bfloat16 gives float32), two integer types too."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return None
    fa, fb = is_floating(a), is_floating(b)
    if fa and not fb:
        return a
    if fb and not fa:
        return b
    return None


def scalar_dtype(like: DType, value: bool | int | float) -> DType:
    """The dtype of a Python number combined with an array of dtype ``like``:
    the number is weakly typed (``float16 * 2.0`` stays float16), and a float
    with an integer or bool array gives the default float (float32)."""
    like = np.dtype(like)
    if isinstance(value, float) and not is_floating(like):
        return DEFAULT_FLOAT
    return np.result_type(like, value)
