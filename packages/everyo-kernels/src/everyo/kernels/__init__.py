"""everyo-kernels: compiled (numba) replacements for inner steps of core's ops.

Core finds this package through :mod:`everyo.kernel_table` at the first use of
an op that has a kernel (or at ``eo.kernels()``), never at ``import everyo``;
``EVERYO_KERNELS=0`` keeps it unused. :data:`TABLE` maps each kernel's name to
the compiled function the op calls. Importing this module imports numba and
loads (or, the first time, compiles and caches) every kernel.

Importing this subpackage makes ``everyo.kernels`` (the attribute of the
``everyo`` package) this module instead of core's function
:func:`everyo.kernel_table.kernels`; so that ``eo.kernels()`` means the same
either way, this module is callable and calling it returns that function's
answer.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from everyo.kernels._native import AVAILABLE as _NATIVE
from everyo.kernels._version import __version__
from everyo.kernels.bfloat16 import bfloat16_codes, bfloat16_to_float, round_to_bfloat16
from everyo.kernels.conv import col2im, im2col
from everyo.kernels.dense import add_bias, column_sums, outer_product, relu_backward, relu_forward
from everyo.kernels.embedding import embedding_backward
from everyo.kernels.float16 import half_codes, half_to_float, round_to_half
from everyo.kernels.gelu import gelu_backward, gelu_forward
from everyo.kernels.halves import (
    by_images,
    by_leading_axis,
    layer_norm_backward_parts,
    numpy_halves,
    softmax_shift_rows,
)
from everyo.kernels.optim import adam_update
from everyo.kernels.pair import split_batched, split_matmul
from everyo.kernels.pool import max_pool_backward, max_pool_forward
from everyo.kernels.recurrent import (
    lstm_backward_scan,
    lstm_cell_backward,
    lstm_forward_scan,
    lstm_gates_in,
    lstm_gates_out,
)
from everyo.kernels.relu16 import relu_codes, relu_codes_backward
from everyo.kernels.rows import (
    layer_norm_backward,
    layer_norm_backward_input,
    layer_norm_backward_params,
    layer_norm_forward,
    softmax_backward,
    softmax_scale,
    softmax_shift,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from everyo.kernel_table import KernelStatus

__all__ = ["TABLE", "describe", "__version__"]

TABLE: dict[str, Callable[..., Any]] = {
    # autocast's conversions, in two element ranges on the pair where it owns the second core
    "bfloat16_codes": by_leading_axis(bfloat16_codes, (0, 1)),
    "round_to_bfloat16": by_leading_axis(round_to_bfloat16, (0, 1)),
    "bfloat16_to_float": by_leading_axis(bfloat16_to_float, (0, 1)),
    "half_codes": by_leading_axis(half_codes, (0, 1), combine=max),  # each half's largest magnitude
    "round_to_half": by_leading_axis(round_to_half, (0, 1), combine=max),
    "half_to_float": by_leading_axis(half_to_float, (0, 1)),
    "relu_codes": relu_codes,
    "relu_codes_backward": relu_codes_backward,
    "lstm_gates_in": lstm_gates_in,
    "lstm_gates_out": lstm_gates_out,
    "lstm_cell_backward": lstm_cell_backward,
    # the large passes in two halves on the pair where it owns the second core (everyo.kernels.halves)
    "add_bias": by_leading_axis(add_bias, (0,)),
    "relu_forward": by_leading_axis(relu_forward, (0, 1)),
    "relu_backward": by_leading_axis(relu_backward, (0, 1, 2)),
    "column_sums": column_sums,  # its halves by columns were slower (everyo.kernels.halves): whole
    "outer_product": by_leading_axis(outer_product, (0, 2), size_of=2),  # (a, b, out): rows of a and out
    "im2col": by_images(im2col, image=0, columns=1, geometry=slice(10, 12)),
    "col2im": by_images(col2im, image=1, columns=0, geometry=slice(10, 12)),
    "max_pool_forward": by_leading_axis(max_pool_forward, (0, 1)),
    "max_pool_backward": by_leading_axis(max_pool_backward, (0, 1, 2, 3)),
    "softmax_shift": softmax_shift_rows(softmax_shift),
    "softmax_scale": by_leading_axis(softmax_scale, (0,)),
    "softmax_backward": by_leading_axis(softmax_backward, (0, 1, 2)),
    "layer_norm_forward": by_leading_axis(layer_norm_forward, (0, 5, 6, 7)),
    "layer_norm_backward": layer_norm_backward_parts(
        layer_norm_backward, layer_norm_backward_input, layer_norm_backward_params
    ),
    "gelu_forward": by_leading_axis(gelu_forward, (0, 1, 2)),
    "gelu_backward": by_leading_axis(gelu_backward, (0, 1, 2, 3)),
    "numpy_halves": numpy_halves,  # core's own large NumPy passes (everyo._passes), in two halves
    "adam_update": adam_update,
    "embedding_backward": embedding_backward,
}
if _NATIVE:  # they call NumPy's own BLAS and tanh loop (everyo.kernels._native): only where those were found
    TABLE |= {"lstm_forward_scan": lstm_forward_scan, "lstm_backward_scan": lstm_backward_scan}
    # products on the pair (everyo.kernels.pair): where it owns the second core, or right after a scan
    TABLE["split_matmul"] = split_matmul
    TABLE["split_batched"] = split_batched


def describe() -> str:
    """One line: this package's and numba's versions (``eo.kernels().reason``)."""
    import numba

    return f"everyo-kernels {__version__}, numba {numba.__version__}"


class _CallableModule(types.ModuleType):
    """This module's type: calling it is ``eo.kernels()``."""

    def __call__(self) -> KernelStatus:
        from everyo.kernel_table import kernels

        return kernels()


sys.modules[__name__].__class__ = _CallableModule
