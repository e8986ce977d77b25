"""The shared ``everyo`` namespace: core alone, lazy add-on names, light import.

In the core-only cell of the test matrix (hatch.toml sets EVERYO_TEST_CELL=core)
the add-ons must be absent, and these tests then *must* run the absence
assertions: a stray add-on fails the cell instead of skipping it. Run by hand
with add-ons on the path (and no EVERYO_TEST_CELL), the absence checks skip with
a reason and the rest still runs.
"""

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

import everyo as eo

CELL = os.environ.get("EVERYO_TEST_CELL")

# add-on module -> (distribution, pip extra)
ADDONS = {
    "everyo.amp": ("everyo-amp", "amp"),
    "everyo.onnx": ("everyo-onnx", "onnx"),
    "everyo.distributed": ("everyo-distributed", "distributed"),
    "everyo.distributed_tcp": ("everyo-distributed", "distributed"),
    "everyo.distributed_mpi": ("everyo-distributed", "distributed"),
    "everyo.kernels": ("everyo-kernels", "kernels"),
}

# lazily resolved name on ``eo`` -> add-on module that provides it
LAZY_NAMES = {
    "autocast": "everyo.amp",
    "GradScaler": "everyo.amp",
    "export_onnx": "everyo.onnx",
    "run_onnx": "everyo.onnx",
    "onnx_available": "everyo.onnx",
    "amp": "everyo.amp",
    "onnx": "everyo.onnx",
    "distributed": "everyo.distributed",
}

# Modules that importing core must never pull in.
FORBIDDEN_AT_IMPORT = (
    "everyo.amp",
    "everyo.onnx",
    "everyo.distributed",
    "everyo.kernels",
    "onnx",
    "onnxruntime",
    "mpi4py",
    "numba",
    "llvmlite",
)


def _module_present(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _require_core_only(what: str) -> None:
    """Skip only outside the core cell when add-ons are present; in the core cell, never skip."""
    present = sorted(m for m in ADDONS if _module_present(m))
    if present and CELL != "core":
        pytest.skip(f"{what}: add-ons {present} are importable here and EVERYO_TEST_CELL is {CELL!r}, not 'core'")


def test_cell_variable_is_known():
    # A typo in hatch.toml's EVERYO_TEST_CELL would silently turn the absence checks into skips.
    assert CELL in (None, "core", "amp", "onnx", "distributed", "kernels"), CELL


@pytest.mark.parametrize("module", sorted(ADDONS))
def test_addon_module_absent_in_core_cell(module):
    _require_core_only("absence check")
    assert importlib.util.find_spec(module) is None, (
        f"{module} is importable from {importlib.util.find_spec(module).origin}, "
        f"but the core-only cell must not have it"
    )


@pytest.mark.parametrize("distribution", sorted({d for d, _ in ADDONS.values()}))
def test_addon_distribution_not_installed_in_core_cell(distribution):
    _require_core_only("absence check")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution(distribution)


@pytest.mark.parametrize("name", sorted(LAZY_NAMES))
def test_lazy_name_without_addon_raises_install_hint(name):
    module = LAZY_NAMES[name]
    if _module_present(module):
        if CELL == "core":
            pytest.fail(f"{module} is present in the core-only cell")
        pytest.skip(f"{module} is installed here; the hint applies only without it")
    extra = ADDONS[module][1]
    hint = f"pip install everyo-core[{extra}]"
    with pytest.raises(ImportError, match=re.escape(hint)):
        getattr(eo, name)
    # ``from everyo import name`` goes through the same module __getattr__.
    with pytest.raises(ImportError, match=re.escape(hint)):
        exec(f"from everyo import {name}", {})
    # The failure is not cached as a value: asking again raises again.
    with pytest.raises(ImportError):
        getattr(eo, name)


def test_unknown_attribute_is_attribute_error_not_import_hint():
    with pytest.raises(AttributeError, match="no_such_name"):
        eo.no_such_name  # noqa: B018


def _modules_loaded(code: str) -> set[str]:
    """Names in sys.modules after running ``code`` in a fresh interpreter."""
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy(), check=False
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def import_footprint():
    """Modules that ``import everyo`` adds, beyond what interpreter start-up already loads."""
    baseline = _modules_loaded("pass")
    after = _modules_loaded("import everyo as eo\nassert eo.Tensor is not None")
    return after - baseline


def test_importing_everyo_imports_no_addon_and_no_onnx(import_footprint):
    loaded = sorted(m for m in import_footprint if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_AT_IMPORT))
    assert not loaded, (
        f"import everyo pulled in {sorted({m.split('.')[0] for m in loaded} | {m for m in loaded if m.startswith('everyo.')})}"
        f" ({len(loaded)} modules); add-ons and their dependencies must load lazily (PEP 562)"
    )


def test_core_imports_only_numpy_among_third_party_modules(import_footprint):
    top_level = {m.split(".")[0] for m in import_footprint}
    third_party = sorted(top_level - set(sys.stdlib_module_names) - {"everyo", "numpy"})
    assert not third_party, f"import everyo imported third-party modules {third_party}; core may use only NumPy"
    assert "numpy" in top_level


def test_core_package_is_the_regular_package_with_init():
    # The pkgutil line keeps everyo a regular package that add-ons extend; a
    # namespace package (no __init__) would mean an add-on shadowed core.
    assert eo.__file__ is not None and eo.__file__.endswith("__init__.py")
    assert any(os.path.samefile(p, os.path.dirname(eo.__file__)) for p in eo.__path__)
