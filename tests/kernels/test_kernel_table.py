"""The registry: lazy discovery, EVERYO_KERNELS=0, eo.kernels()."""

import json
import os
import subprocess
import sys

import everyo as eo
from everyo import kernel_table

EXPECTED = {
    "bfloat16_codes",
    "round_to_bfloat16",
    "bfloat16_to_float",
    "lstm_gates_in",
    "lstm_gates_out",
    "lstm_cell_backward",
    # need NumPy's own gemm and tanh loop (everyo.kernels._native), found with NumPy's wheels
    "lstm_forward_scan",
    "lstm_backward_scan",
    "split_matmul",  # large 2-D products on the pair (everyo.kernels.pair)
    "split_batched",  # stacks of small products (attention), on the pair
    "numpy_halves",  # core's own large NumPy passes (everyo._passes), in halves on the pair
    "add_bias",
    "relu_forward",
    "relu_backward",
    "column_sums",
    "outer_product",
    "im2col",
    "col2im",
    "max_pool_forward",
    "max_pool_backward",
    "softmax_shift",
    "softmax_scale",
    "softmax_backward",
    "layer_norm_forward",
    "layer_norm_backward",
    "gelu_forward",
    "gelu_backward",
    "adam_update",
    "embedding_backward",
    "half_codes",
    "round_to_half",
    "half_to_float",
    "relu_codes",
    "relu_codes_backward",
}


def _python(code, **env):
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON."""
    full = {**os.environ, **env}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_status_lists_every_kernel():
    status = eo.kernels()
    assert status.enabled and set(status.active) == EXPECTED, status
    assert "everyo-kernels" in status.reason and "numba" in status.reason
    assert "lstm_gates_in" in str(status)


def test_import_loads_nothing_and_first_use_loads_numba():
    out = _python(
        "import sys, json, numpy as np, everyo as eo\n"
        "before = 'numba' in sys.modules or 'everyo.kernels' in sys.modules\n"
        "lstm = eo.LSTM(3, 4)\n"
        "lstm(eo.tensor(np.ones((2, 5, 3), np.float32)))\n"
        "print(json.dumps([before, 'numba' in sys.modules, eo.kernels().enabled]))"
    )
    assert out == [False, True, True]


def test_environment_variable_turns_them_off():
    code = (
        "import sys, json, numpy as np, everyo as eo\n"
        "lstm = eo.LSTM(3, 4)\n"
        "y = lstm(eo.tensor(np.ones((2, 5, 3), np.float32)))[0]\n"
        "y.sum().backward()\n"
        "s = eo.kernels()\n"
        "print(json.dumps([s.enabled, list(s.active), s.reason, 'numba' in sys.modules]))"
    )
    enabled, active, reason, numba_loaded = _python(code, EVERYO_KERNELS="0")
    assert (enabled, active, numba_loaded) == (False, [], False)
    assert reason == "disabled by EVERYO_KERNELS=0"


def test_not_installed_says_how_to_install(tmp_path):
    # A stand-in everyo.kernels that cannot be found: hide it behind a finder that refuses it.
    code = (
        "import sys, json, importlib.abc\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'everyo.kernels': raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import everyo as eo\n"
        "s = eo.kernels()\n"
        "print(json.dumps([s.enabled, s.reason]))"
    )
    assert _python(code) == [False, "not installed: pip install everyo-core[kernels]"]


def test_disabled_block_runs_numpy_and_restores():
    assert kernel_table.get("lstm_gates_in") is not None
    with kernel_table.disabled():
        assert kernel_table.get("lstm_gates_in") is None
        assert kernel_table.get("bfloat16_codes") is None
    assert kernel_table.get("bfloat16_codes") is not None
    assert kernel_table.get("no such kernel") is None


def test_eo_kernels_still_callable_once_the_subpackage_is_imported():
    # Importing everyo.kernels rebinds the attribute everyo.kernels to the subpackage;
    # the subpackage is callable, so eo.kernels() answers the same either way.
    import importlib

    package = importlib.import_module("everyo.kernels")
    assert eo.kernels is package or eo.kernels is kernel_table.kernels
    assert eo.kernels() == kernel_table.kernels() == package()
    assert package.TABLE.keys() == EXPECTED


def test_loading_the_kernels_changes_no_shared_ctypes_function():
    # _native reads NumPy's loop capsules through a PyCapsule_GetPointer prototype of its own:
    # setting restype/argtypes on ctypes.pythonapi's shared object would change it for every
    # other library in the process.
    code = (
        "import ctypes, json, everyo as eo\n"
        "f = ctypes.pythonapi.PyCapsule_GetPointer\n"
        "before = (f.restype, f.argtypes)\n"
        "status = eo.kernels()\n"
        "import everyo.kernels._native as native\n"
        "print(json.dumps([native.AVAILABLE, (f.restype, f.argtypes) == before, status.enabled]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ.copy()
    )
    available, untouched, enabled = json.loads(out.stdout.strip().splitlines()[-1])
    assert enabled and available
    assert untouched, "loading everyo-kernels changed ctypes.pythonapi.PyCapsule_GetPointer's restype/argtypes"
