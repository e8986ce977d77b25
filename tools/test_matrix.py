"""Run the test matrix: every package cell on every supported Python found here.

``hatch run test:run`` calls this script. It looks for CPython 3.10-3.13 on
PATH and, failing that, under ``~/.pyenv/versions`` (without needing pyenv to
be activated), then runs ``hatch run +python=<found> cell:run`` so that Hatch
builds one environment per (Python, package) cell from this machine's own
interpreters (Hatch never downloads one), and last the ``lowest`` cells: the
lowest NumPy, onnx and onnxruntime versions the packages allow.

A supported Python that is missing is reported and its cells are skipped, so a
machine with only Python 3.12 still runs the 3.12 cells. CI sets
``EVERYO_REQUIRE_ALL_PYTHONS=1``, which makes a missing Python a failure.
Extra arguments go to pytest, e.g. ``hatch run test:run -x -q``.
"""

import os
import pathlib
import shutil
import subprocess
import sys

SUPPORTED = ("3.10", "3.11", "3.12", "3.13")
LOWEST_PYTHONS = ("3.10", "3.11", "3.12")  # NumPy 2.0.0 has no wheels for 3.13


def _base_interpreter(executable, version):
    """The real interpreter behind ``executable`` (never a venv's or a shim's
    copy), if it runs and is ``version`` with the venv module; else None."""
    probe = "import sys, venv; print('%d.%d' % sys.version_info[:2]); print(sys._base_executable)"
    try:
        out = subprocess.run([executable, "-c", probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or lines[0] != version:
        return None
    return pathlib.Path(os.path.realpath(lines[1]))


def find_interpreter(version):
    """The directory holding a working ``python<version>``, or None."""
    candidates = []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(pathlib.Path(on_path))
    pyenv_root = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"))
    candidates += sorted(pyenv_root.glob(f"versions/{version}.*/bin/python{version}"), reverse=True)
    for candidate in candidates:
        # A pyenv shim for a version that is not activated exists but fails to run.
        base = _base_interpreter(str(candidate), version)
        if base is not None:
            return base.parent
    return None


LOCAL_WHEELS = pathlib.Path("/opt/wheels")


def uv_find_links(env):
    """Let uv (which ignores pip's configuration) see the local wheels folder.

    The Python 3.11 core cell installs torch 2.13.0 as a test reference; from
    PyPI that is a CUDA build of several GB, while machines of this project keep
    its CPU build in /opt/wheels. hatch.toml passes PIP_FIND_LINKS on to uv;
    without it, the folder is named here, and only when it exists (uv fails on a
    --find-links folder that does not).
    """
    if "UV_FIND_LINKS" not in env and "PIP_FIND_LINKS" not in env and LOCAL_WHEELS.is_dir():
        env["UV_FIND_LINKS"] = str(LOCAL_WHEELS)


def main(argv):
    found, missing = {}, []
    for version in SUPPORTED:
        where = find_interpreter(version)
        if where is None:
            missing.append(version)
        else:
            found[version] = where
    for version, where in found.items():
        print(f"test matrix: Python {version} from {where}")
    if missing:
        print(
            f"test matrix: Python {', '.join(missing)} not found; those cells are skipped "
            f"(install them, or put them on PATH, to test every supported version)"
        )
        if os.environ.get("EVERYO_REQUIRE_ALL_PYTHONS") == "1":
            print("test matrix: EVERYO_REQUIRE_ALL_PYTHONS=1, so a missing Python is a failure")
            return 1
    if not found:
        print("test matrix: no supported Python found")
        return 1
    hatch = shutil.which("hatch")
    if hatch is None:
        print("test matrix: the hatch command is not on PATH (pip install hatch)")
        return 1
    env = dict(os.environ)
    # Found interpreters go first on PATH, ahead of any shims that cannot run them.
    env["PATH"] = os.pathsep.join([str(d) for d in dict.fromkeys(found.values())] + [env.get("PATH", "")])
    env.pop("HATCH_ENV_ACTIVE", None)
    uv_find_links(env)
    commands = [[hatch, "run", "+python=" + ",".join(found), "cell:run", *argv]]
    # The lowest allowed dependency versions, on the oldest Python NumPy 2.0.0 has wheels for.
    oldest = next((v for v in LOWEST_PYTHONS if v in found), None)
    if oldest is None:
        print(f"test matrix: no Python among {', '.join(LOWEST_PYTHONS)}, so the lowest-versions cells are skipped")
    else:
        commands.append([hatch, "run", "+python=" + oldest, "lowest:run", *argv])
    for command in commands:
        print("test matrix:", " ".join(command[1:]), flush=True)
        code = subprocess.call(command, env=env)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
