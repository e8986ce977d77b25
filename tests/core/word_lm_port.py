"""Runs examples/from_pytorch/word_language_model/main.py as a script (runpy, as
``python main.py ...``) and hands back its globals; shared by the core and ONNX tests."""

import os
import runpy
import sys

PORT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "from_pytorch", "word_language_model")


def run_main(tmp_path, *extra):
    argv = ["main.py", "--data", str(tmp_path / "corpus"), "--save", str(tmp_path / "lm.npz"), *extra]
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = argv, [PORT]
    try:
        return runpy.run_path(os.path.join(PORT, "main.py"), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        for name in ("data", "model"):  # the port's modules, not to be found by another test
            sys.modules.pop(name, None)
