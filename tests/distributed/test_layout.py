"""The package layout: one protocol module, one folder per backend, shared memory loaded only on use."""

import subprocess
import sys
import textwrap

import pytest

from everyo.distributed import ProcessGroup

PUBLIC = (
    "all_reduce_sum",
    "all_reduce_mean",
    "broadcast",
    "all_gather",
    "reduce_scatter_sum",
    "reduce_scatter_mean",
    "barrier",
    "close",
)


def run(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_tcp_and_mpi_import_and_work_where_posixshmem_is_missing():
    # Setting sys.modules[name] = None makes `import name` raise ImportError, as on macOS/Windows.
    result = run("""
        import sys, threading
        sys.modules["_posixshmem"] = None
        import numpy as np
        import everyo.distributed, everyo.distributed_tcp, everyo.distributed_mpi
        from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group
        assert not any(m.startswith("everyo.distributed.sharedmem") for m in sys.modules), sorted(sys.modules)
        out = [None, None]
        with TCPRendezvousServer(port=0, world_size=2) as server:
            def rank(r):
                with init_tcp_process_group("127.0.0.1", server.port, r, 2, timeout=20) as g:
                    out[r] = g.all_reduce_sum(np.array([r + 1.0]))[0]
            threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
            [t.start() for t in threads]; [t.join(30) for t in threads]
        assert out == [3.0, 3.0], out
        try:
            from everyo.distributed import spawn
        except ImportError as exc:
            print("spawn:", exc)
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout and "spawn:" in result.stdout and "_posixshmem" in result.stdout


def test_importing_the_package_does_not_load_shared_memory():
    result = run("""
        import sys
        import everyo.distributed
        assert "everyo.distributed.sharedmem" not in sys.modules
        from everyo.distributed import spawn
        assert spawn.__module__ == "everyo.distributed.sharedmem.spawn", spawn.__module__
        print("ok")
    """)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_every_backend_inherits_the_collectives_and_their_bookkeeping():
    from everyo.distributed.mpi import MPIProcessGroup
    from everyo.distributed.sharedmem.group import SharedMemoryGroup
    from everyo.distributed.tcp.group import TCPProcessGroup

    for backend in (SharedMemoryGroup, TCPProcessGroup, MPIProcessGroup):
        assert issubclass(backend, ProcessGroup)
        for name in PUBLIC + ("_call", "_check_root"):
            assert getattr(backend, name) is getattr(ProcessGroup, name), (backend.__name__, name)


def test_the_facades_expose_the_spec_names():
    import everyo.distributed_mpi as dm
    import everyo.distributed_tcp as dt

    assert {"TCPRendezvousServer", "init_tcp_process_group", "TCPProcessGroup"} <= set(dir(dt))
    assert {"init_mpi_process_group", "MPIProcessGroup", "find_mpiexec"} <= set(dir(dm))
    with pytest.raises(AttributeError):
        import everyo.distributed as d

        _ = d.no_such_name
