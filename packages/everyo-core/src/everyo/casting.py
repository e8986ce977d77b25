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
