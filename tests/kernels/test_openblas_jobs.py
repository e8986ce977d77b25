"""OpenBLAS's parallel jobs on the pair (everyo.kernels.pair.install_jobs).

Installing the callback is OpenBLAS's setting for the whole process, so each
check that needs OpenBLAS's own threads for a reference runs in a fresh
process: the reference first (OpenBLAS's own two threads), then the same
products with the callback installed, which must have the same bits. The
processes run with OPENBLAS_NUM_THREADS=2, whatever the machine's cores. Nothing
here waits on a clock: a part that must run beside the other waits for an event
the other sets.
"""

import os
import platform
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from everyo import _blas
from everyo.kernels import _native, pair

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")),
    reason="OpenBLAS's jobs go to the pair on x86-64 Linux only",
)


needs_callback = pytest.mark.skipif(
    _native.jobs_setter() is None,
    reason="NumPy's OpenBLAS exports no openblas_set_threads_callback_function (NumPy 2.2's wheels, "
    "OpenBLAS 0.3.29): products run on OpenBLAS's own threads or split_matmul's halves",
)


def _run(code: str, **env: str) -> str:
    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "2", **env}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environment, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


PRELUDE = """
    import os, threading, numpy as np
    from everyo import _blas
    from everyo.kernels import _native, pair

    _blas.machine_busy = lambda: False  # the callback is OpenBLAS's only while the machine is quiet

    def operand(rng, shape, dtype, layout):
        a = rng.standard_normal(shape).astype(dtype)
        return a if layout == "C" else np.asfortranarray(a)

    def products(seed):
        rng = np.random.default_rng(seed)
        cases = []
        for dtype in (np.float32, np.float64):
            for m, k, n in [(128, 1600, 512), (128, 4096, 128), (1601, 37, 301), (33, 1600, 512),
                            (500, 500, 500), (37, 1001, 77), (4096, 9, 32), (2048, 128, 128)]:
                for layouts in ("CC", "FC", "CF"):
                    x = operand(rng, (m, k), dtype, layouts[0])
                    y = operand(rng, (k, n), dtype, layouts[1])
                    cases.append((x, y))
        return cases

    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))
"""


@needs_callback
def test_openblas_jobs_on_the_pair_have_openblas_own_bits():
    out = _run(
        PRELUDE
        + """
    assert _native.blas_threads() == 2 and not pair.jobs_on_pair()
    cases = products(0)
    want = [x @ y for x, y in cases]  # OpenBLAS's own two threads
    assert pair.install_jobs() and pair.jobs_on_pair()
    pair.run(lambda: None, lambda: None)  # returns with the worker in its loop, free for OpenBLAS's jobs
    worker = pair._get()
    jobs, spare = worker.ctrl[pair._JOBS], worker.ctrl[pair._SPARE]
    got = [x @ y for x, y in cases]
    bad = [(x.shape, y.shape, x.dtype.name) for (x, y), g, w in zip(cases, got, want) if not same(g, w)]
    assert not bad, bad
    served = worker.ctrl[pair._JOBS] - jobs
    print("served", served, "spare", worker.ctrl[pair._SPARE] - spare)
    assert served >= len(cases) and worker.ctrl[pair._SPARE] == spare  # every second job on the worker
    """
    )
    assert out.startswith("served")


@needs_callback
def test_jobs_run_on_threads_of_their_own_where_the_worker_is_not_free():
    # The worker is running a job of Python's (a split's half), a call has three jobs, or the
    # process is a fork child with no worker yet: the jobs run at once on threads started for
    # them, still with OpenBLAS's bits.
    _run(
        PRELUDE
        + """
    import ctypes, importlib, warnings
    x, y = products(1)[0]
    want2 = x @ y
    umath = importlib.import_module("numpy._core._multiarray_umath")
    set_threads = getattr(ctypes.CDLL(umath.__file__), "scipy_openblas_set_num_threads64_")
    set_threads.argtypes = [ctypes.c_int]
    set_threads(3)
    want3 = x @ y
    set_threads(2)
    assert pair.install_jobs()
    worker = pair._get()

    # 1. the worker busy with a job of Python's, which waits for the caller's product
    made, started, release = {}, threading.Event(), threading.Event()
    spare = worker.ctrl[pair._SPARE]

    def theirs():
        started.set()
        release.wait(120)

    def mine():
        assert started.wait(120)  # the worker has taken its job of Python's
        made["z"] = x @ y
        release.set()

    pair.run(mine, theirs)
    assert same(made["z"], want2)
    assert worker.ctrl[pair._SPARE] == spare + 1

    # 2. three jobs
    set_threads(3)
    assert same(x @ y, want3)
    set_threads(2)

    # 3. a fork child, before and after its own worker starts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            first = x @ y  # the parent's worker is not in this process
            pair.run(lambda: None, lambda: None)  # the child's worker starts
            child = pair._get()
            second = x @ y
            code = 0 if same(first, want2) and same(second, want2) and child.ctrl[pair._JOBS] >= 1 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert same(x @ y, want2)
    """
    )


@needs_callback
def test_two_threads_making_products_at_once():
    # One call gets the worker, the other runs its jobs on a thread of its own; both are right.
    _run(
        PRELUDE
        + """
    cases = products(2)[:12]
    want = [x @ y for x, y in cases]
    assert pair.install_jobs()
    barrier = threading.Barrier(2)
    wrong = []

    def loop():
        barrier.wait()
        for _ in range(20):
            for (x, y), w in zip(cases, want):
                if not same(x @ y, w):
                    wrong.append(x.shape)

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong
    """
    )


@needs_callback
def test_a_worker_asleep_is_woken_by_the_next_product():
    _run(
        PRELUDE
        + """
    import time
    x, y = products(3)[0]
    want = x @ y
    assert pair.install_jobs()
    worker = pair._get()
    assert same(x @ y, want)
    guard = time.monotonic() + 120
    while not worker.sleeping and time.monotonic() < guard:  # its spin ends, then it sleeps
        time.sleep(0.001)
    assert worker.sleeping
    wakes, jobs = worker.ctrl[pair._WAKES], worker.ctrl[pair._JOBS]
    assert same(x @ y, want)
    assert worker.ctrl[pair._WAKES] == wakes + 1 and worker.ctrl[pair._JOBS] == jobs + 1
    """
    )


@needs_callback
def test_a_training_loop_with_jobs_on_the_pair_matches_the_numpy_path():
    # A user's own model (custom forward and activation, LayerNorm, cross-entropy; no GELU, whose kernel is
    # within a bound, not bit-identical) trained a
    # few steps with everything on, against EVERYO_KERNELS=0 (core's NumPy path on OpenBLAS's
    # own threads): the same bits. The first process must have sent OpenBLAS's jobs to the pair.
    code = """
    import hashlib, numpy as np, everyo as eo
    from everyo import _blas
    from everyo.kernels import pair  # importable in both processes; only registered where kernels are on

    _blas.machine_busy = lambda: False  # the callback is OpenBLAS's only while the machine is quiet

    class Net(eo.Module):
        def __init__(self):
            super().__init__()
            self.a = eo.Linear(256, 512)
            self.norm = eo.LayerNorm(512)
            self.b = eo.Linear(512, 10)

        def forward(self, x):
            h = self.a(x)
            return self.b(self.norm(h * h * 0.1 + 0.5 * eo.relu(h)))

    eo.manual_seed(0)
    rng = np.random.default_rng(0)
    x = eo.tensor(rng.standard_normal((1024, 256), dtype=np.float32))
    y = eo.tensor(rng.integers(0, 10, 1024))
    model = Net()
    opt = eo.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = eo.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    digest = hashlib.sha256(b"".join(p.data.tobytes() for p in model.parameters())).hexdigest()
    print(digest, pair.jobs_on_pair())
    """
    on = _run(code).split()
    off = _run(code, EVERYO_KERNELS="0").split()
    assert on[1] == "True" and off[1] == "False"
    assert on[0] == off[0]


def test_install_only_on_two_blas_threads(monkeypatch):
    monkeypatch.setattr(pair, "_callback", None)
    monkeypatch.setattr(pair, "_set", False)
    set_calls = []
    monkeypatch.setattr(_native, "_set_callback", lambda address: set_calls.append(address))
    for threads in (1, 3, 4):
        monkeypatch.setattr(pair, "blas_threads", lambda threads=threads: threads)
        assert not pair.install_jobs()
    monkeypatch.setattr(_native, "_set_callback", None)  # an OpenBLAS older than 0.3.27
    monkeypatch.setattr(pair, "blas_threads", lambda: 2)
    assert not pair.install_jobs()
    assert set_calls == [] and not pair.jobs_on_pair()


def test_a_large_product_through_core_installs_the_jobs_and_is_not_split(monkeypatch):
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    installs = []
    monkeypatch.setattr(pair, "install_jobs", lambda: installs.append(1) or True)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    y = rng.standard_normal((1024, 512)).astype(np.float32)
    out = np.empty((256, 512), np.float32)
    assert not pair.split_matmul(x, y, out)  # core makes it whole, on OpenBLAS's threads
    assert installs == [1]


def test_openblas_gets_its_own_threads_back_while_the_machine_is_busy(monkeypatch):
    # two jobs that wait for each other in spin loops ran slower still on the pair's threads
    # than on OpenBLAS's own beside four CPU-bound processes; the setter is a fake here
    calls = []
    monkeypatch.setattr(pair, "_callback", (types.SimpleNamespace(address=1234), None))
    monkeypatch.setattr(pair, "_set", True)
    monkeypatch.setattr(_native, "_set_callback", lambda a: calls.append(None if a is None else a.value))
    monkeypatch.setattr(_blas, "machine_busy", lambda: True)
    assert not pair.install_jobs() and not pair.jobs_on_pair() and calls == [None]
    assert not pair.install_jobs() and calls == [None]  # no change, no call
    monkeypatch.setattr(_blas, "machine_busy", lambda: False)
    assert pair.install_jobs() and pair.jobs_on_pair() and calls == [None, 1234]
    assert pair._spinning() is False  # no OpenBLAS worker of its own spins now
