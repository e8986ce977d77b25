"""atomic_write: non-regular targets are written through, temporaries are
named, cleaned and never left behind, modes follow open()'s rules."""

import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import everyo as eo
from everyo.io import atomic_write

TMP_RE = re.compile(r"\.(?P<name>.+)\.everyo-tmp-(?P<pid>[0-9]+)-[0-9a-f]{8}")


def _state():
    return {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "step": 7}


def _same(a, b):
    return (
        a.keys() == b.keys()
        and np.array_equal(a["w"], b["w"])
        and a["w"].dtype == b["w"].dtype
        and a["step"] == b["step"]
    )


def _read_fifo(path, sink):
    with open(path, "rb") as f:
        sink.append(f.read())


def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=_read_fifo, args=(fifo, received))
    reader.start()
    eo.save(_state(), fifo)
    reader.join(timeout=30)
    assert not reader.is_alive() and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["pipe"]
    copy = tmp_path / "copy.npz"
    copy.write_bytes(received[0])
    assert _same(eo.load(copy), _state())


def test_a_symlink_to_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.npz"
    link.symlink_to(fifo)
    received = []
    reader = threading.Thread(target=_read_fifo, args=(fifo, received))
    reader.start()
    atomic_write(link, lambda f: f.write(b"hello"))
    reader.join(timeout=30)
    assert received == [b"hello"] and link.is_symlink() and stat.S_ISFIFO(os.stat(link).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["link.npz", "pipe"]


def test_dev_null_is_not_replaced():
    before = os.stat("/dev/null")
    eo.save(_state(), "/dev/null")
    atomic_write("/dev/null", lambda f: f.write(b"x" * 1000))
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert stat.S_IMODE(after.st_mode) == stat.S_IMODE(before.st_mode)
    assert not [n for n in os.listdir("/dev") if "everyo-tmp" in n]


def test_a_symlink_to_a_file_stays_a_symlink(tmp_path):
    real = tmp_path / "real.npz"
    eo.save({"step": 1}, real)
    link = tmp_path / "latest.npz"
    link.symlink_to(real)
    eo.save(_state(), link)
    assert link.is_symlink() and _same(eo.load(real), _state())


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(IsADirectoryError, match="folder"):
        atomic_write(tmp_path, lambda f: f.write(b"x"))


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_0666_less_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        eo.save(_state(), tmp_path / "c.npz")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "c.npz").st_mode) == mode


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o600, 0o444])
def test_an_overwritten_file_keeps_its_mode(tmp_path, mode):
    path = tmp_path / "c.npz"
    eo.save({"step": 0}, path)
    os.chmod(path, mode)
    old = os.umask(0o077)  # must not matter for an existing file
    try:
        eo.save(_state(), path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode and _same(eo.load(path), _state())


def test_the_temporary_has_a_recognisable_name_beside_the_target(tmp_path):
    seen = []

    def write(f):
        seen.extend(os.listdir(tmp_path))
        f.write(b"data")

    atomic_write(tmp_path / "model.onnx", write)
    match = TMP_RE.fullmatch(seen[0])
    assert len(seen) == 1 and match and match["name"] == "model.onnx" and int(match["pid"]) == os.getpid()
    assert os.listdir(tmp_path) == ["model.onnx"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_exception_mid_write_leaves_the_old_file_and_no_temporary(tmp_path, error):
    path = tmp_path / "c.npz"
    eo.save(_state(), path)
    before = path.read_bytes()

    def write(f):
        f.write(b"partial" * 1000)
        raise error("simulated crash")

    with pytest.raises(error, match="simulated"):
        atomic_write(path, write)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["c.npz"]


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_stale_temporaries_of_this_target_are_removed(tmp_path):
    dead = _dead_pid()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "stale": f".c.npz.everyo-tmp-{dead}-0123abcd",
            "live": f".c.npz.everyo-tmp-{alive.pid}-0123abcd",
            "mine": f".c.npz.everyo-tmp-{os.getpid()}-0123abcd",
            "other target": f".d.npz.everyo-tmp-{dead}-0123abcd",
            "not our pattern": f".c.npz.everyo-tmp-{dead}-notours",
            "user file": "c.npz.bak",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"junk")
        eo.save(_state(), tmp_path / "c.npz")
        left = set(os.listdir(tmp_path))
    finally:
        alive.kill()
        alive.wait()
    assert names["stale"] not in left
    assert left == (set(names.values()) - {names["stale"]}) | {"c.npz"}


_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from everyo.io import atomic_write
    import everyo as eo

    def write(f):
        np.save(f, np.ones(2_000_000, dtype=np.float32))  # 8 MB written, then stuck mid-save
        f.flush()
        print("writing", flush=True)
        sys.stdin.read()

    atomic_write(sys.argv[1], write)
""")


def test_a_kill_9_mid_save_leaves_a_temporary_that_the_next_save_removes(tmp_path):
    path = tmp_path / "c.npz"
    eo.save({"step": 0}, path)
    before = path.read_bytes()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ.copy()
    )
    try:
        assert child.stdout.readline() == b"writing\n"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    temps = [n for n in os.listdir(tmp_path) if TMP_RE.fullmatch(n)]
    assert len(temps) == 1 and int(TMP_RE.fullmatch(temps[0])["pid"]) == child.pid
    assert os.path.getsize(tmp_path / temps[0]) > 8_000_000 and path.read_bytes() == before
    eo.save(_state(), path)
    assert os.listdir(tmp_path) == ["c.npz"] and _same(eo.load(path), _state())
