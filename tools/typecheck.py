"""Type-check EveryO with mypy, as users see it installed.

1. The five packages share the ``everyo`` namespace; installed, they form one
   ``site-packages/everyo`` folder. mypy does not follow the
   ``pkgutil.extend_path`` that joins the editable src/ folders, so this builds
   that one folder from symbolic links in a temporary directory and checks it
   (``-p everyo``) with the root ``mypy.ini``.
2. Then the user's side: ``tests/typing/`` (code written with annotations, as
   a strictly typed user writes it) in ``--strict`` mode, and ``examples/``
   (tutorials without annotations of their own) with ``--check-untyped-defs``,
   so every public name they use is annotated and the annotations fit real code.

Run: ``hatch run types:check`` (or ``python tools/typecheck.py`` where mypy,
numpy, onnx and ml_dtypes are importable). Exits with mypy's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["everyo-core", "everyo-amp", "everyo-onnx", "everyo-distributed", "everyo-kernels"]


def build_merged_package(dest: Path) -> Path:
    target = dest / "everyo"
    target.mkdir()
    for pkg in PACKAGES:
        src = ROOT / "packages" / pkg / "src" / "everyo"
        for entry in sorted(src.iterdir()):
            if entry.name == "__pycache__":
                continue
            link = target / entry.name
            if link.exists() or link.is_symlink():
                raise SystemExit(f"{pkg} ships everyo/{entry.name}, which another package ships too")
            link.symlink_to(entry, target_is_directory=entry.is_dir())
    return dest


def run(args: list[str], cwd: Path, env: dict[str, str]) -> int:
    print("$ mypy " + " ".join(args), flush=True)
    return subprocess.call([sys.executable, "-m", "mypy", *args], cwd=cwd, env=env)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="everyo-mypy-") as tmp:
        tree = build_merged_package(Path(tmp))
        env = dict(os.environ, MYPYPATH=str(tree))
        env.pop("PYTHONPATH", None)
        common = ["--config-file", str(ROOT / "mypy.ini"), "--cache-dir", str(Path(tmp) / "cache")]
        status = run([*common, "-p", "everyo"], cwd=tree, env=env)
        # follow-imports=silent: the package's own errors are the first run's to report.
        user = [*common, "--follow-imports=silent"]
        typed_user_code = sorted(str(p) for p in (ROOT / "tests" / "typing").glob("*.py"))
        status = run([*user, "--strict", *typed_user_code], cwd=ROOT, env=env) or status
        # The examples are written as tutorials, without annotations of their
        # own: check their bodies against the package's annotations.
        examples = sorted(str(p) for p in (ROOT / "examples").glob("*.py"))
        status = run([*user, "--check-untyped-defs", *examples], cwd=ROOT, env=env) or status
    return status


if __name__ == "__main__":
    raise SystemExit(main())
