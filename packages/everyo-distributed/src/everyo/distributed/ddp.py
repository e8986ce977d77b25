"""``DistributedDataParallel``: rank 0's weights everywhere, gradients averaged in buckets while backward runs.

At construction every rank checks that all ranks hold the same parameter
and buffer names, shapes and dtypes, then takes rank 0's values. Parameters
are grouped, in reverse registration order (the order backward produces
their gradients, as in PyTorch), into buckets of at most ``bucket_cap_mb``.
Each parameter carries a post-accumulate-grad hook; when the last gradient of
a bucket is complete, the bucket goes to a background thread that averages it
(one ``all_reduce_mean``) while the main thread keeps running backward. A
callback queued for the end of the backward pass averages whatever buckets are
left on the main thread (always the last bucket: once it is complete there is
no backward left to overlap with), waits for the others and writes the
averages back, so every ``.grad`` is averaged by the time ``backward()``
returns. A model whose gradients fit one bucket never starts the thread.

Buckets are sent strictly in bucket order on every rank (a bucket completed
early waits for the ones before it), so the ranks' collectives always line
up, whichever order their gradients arrive in.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from everyo import autograd
from everyo.distributed.protocol import PeerFailedError
from everyo.errors import EveryODistributedError
from everyo.nn.module import Module

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import TypeAlias

    from everyo.distributed.protocol import ProcessGroup
    from everyo.tensor import Tensor

    #: A bucket to average: (the pass, bucket index, bucket, group).
    _Job: TypeAlias = "tuple[_Pass, int, _Bucket, ProcessGroup]"

__all__ = ["DistributedDataParallel"]

_DESCRIPTION_BYTES = 256


class _Bucket:
    """Parameters whose gradients travel together: one flat vector, plus one presence flag per parameter."""

    __slots__ = ("params", "offsets", "size", "dtype", "_flat")

    def __init__(self, params: list[Tensor], dtype: np.dtype[Any]) -> None:
        self.params, self.dtype = params, dtype
        self.offsets, total = [], 0
        for p in params:
            self.offsets.append(total)
            total += p.data.size
        self.size = total
        self._flat: np.ndarray | None = None

    def flatten(self) -> np.ndarray:
        """The gradients and presence flags in one vector.

        The vector is allocated once and refilled every pass (a fresh array of
        a large bucket costs a page fault per 4 KiB on every step); every
        collective copies its input, so refilling it next pass is safe.
        """
        flat = self._flat
        if flat is None:
            flat = self._flat = np.empty(self.size + len(self.params), self.dtype)
        grads = [p.grad for p in self.params]
        parts = [
            np.zeros(p.data.size, self.dtype) if g is None else np.asarray(g).reshape(-1)
            for g, p in zip(grads, self.params)
        ]
        parts.append(np.array([g is not None for g in grads], self.dtype))
        return np.concatenate(parts, out=flat, casting="same_kind")  # one C call fills the vector

    def write_back(self, averaged: np.ndarray) -> None:
        present = averaged[self.size :] > 0
        for p, start, has_grad in zip(self.params, self.offsets, present):
            if has_grad:
                p.grad = averaged[start : start + p.data.size].reshape(p.data.shape)
            # no rank had a gradient: .grad stays None everywhere, so optimizers skip it


class _Pass:
    """The communication state of one synchronized backward pass."""

    def __init__(self, buckets: Sequence[_Bucket]) -> None:
        self.arrived = [0] * len(buckets)
        self.seen: set[int] = set()
        self.launched = 0
        self.done = [threading.Event() for _ in buckets]
        self.results: list[np.ndarray | None] = [None] * len(buckets)
        self.error: BaseException | None = None
        self.seconds = 0.0  # the background thread's time on this pass's buckets


class DistributedDataParallel(Module):
    """Wrap ``model`` so that ``loss.backward()`` leaves every gradient averaged over ``group``.

    Args:
        model: the :class:`~everyo.nn.Module` to train; the same architecture on every rank.
        group: any :class:`~everyo.distributed.ProcessGroup` (shared memory, TCP, MPI).
        bucket_cap_mb: the largest bucket of gradients sent in one collective (MiB).
            Smaller buckets start communicating earlier; larger ones cost fewer calls.
        broadcast_buffers: also take rank 0's buffers (e.g. BatchNorm running
            statistics) at construction and before every forward pass in training mode
            (when the model had buffers at construction, as in PyTorch's DDP).

    Every rank must run the same number of synchronized backward passes, and
    each must reach at least one parameter on every rank (the first gradient
    hook is what starts the pass's communication): each synchronized backward
    runs the same collectives on every rank. A rank that skipped one would
    leave its peers waiting (``spawn``'s ``stall_timeout`` or the TCP group's
    ``timeout`` then names it).

    Parameters that got no gradient. Every synchronized backward averages every
    parameter's current ``.grad``: one whose ``.grad`` is ``None`` on some ranks
    counts as a zero gradient there (the other ranks' gradients are still divided by
    ``world_size``) and ends with the same average on every rank; one whose
    ``.grad`` is ``None`` on every rank stays ``None`` everywhere, so optimizers
    skip it exactly as in one process. Such parameters cannot complete their
    bucket early; their buckets go at the end of backward.

    Mixed precision: under ``eo.autocast`` with a ``GradScaler`` the scaled
    gradients are averaged; since every rank ends with the same bits, an
    infinite gradient on any rank is infinite (or NaN) on all, and every rank
    takes the same skip decision.

    Example (needs a running process group, so not run as a doctest)::

        model = DistributedDataParallel(build_model(), group)
        optimizer = eo.SGD(model.parameters(), lr=0.05)
        loss = eo.mean((model(x) - y) ** 2)
        loss.backward()                 # gradients are averaged when this returns
        optimizer.step()
    """

    def __init__(
        self, model: Module, group: ProcessGroup, *, bucket_cap_mb: float = 25, broadcast_buffers: bool = True
    ) -> None:
        super().__init__()
        if not isinstance(model, Module):
            raise TypeError(f"DistributedDataParallel: model must be an everyo Module, got {type(model).__name__}")
        if not bucket_cap_mb > 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be positive, got {bucket_cap_mb!r}")
        self.module = model
        self.group = group
        self.broadcast_buffers = bool(broadcast_buffers)
        self.bucket_cap_mb = bucket_cap_mb
        # Buffers are looked up once, here (as PyTorch's DDP does): walking the module tree on
        # every forward pass costs more than the seed MLP's whole all-reduce.
        self._has_buffers = bool(model.buffers())
        self._check_same_model()
        self._broadcast_state(params=True, buffers=self.broadcast_buffers)
        params = [p for p in model.parameters() if p.requires_grad]
        buckets = _make_buckets(list(reversed(params)), int(bucket_cap_mb * 2**20))
        where: dict[int, int] = {}
        for b, bucket in enumerate(buckets):
            for p in bucket.params:
                where[id(p)] = b
        self._buckets = buckets
        self._where = where
        self._sync = True
        self._pass: _Pass | None = None
        self._jobs = _Jobs()
        self._worker: threading.Thread | None = None
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]
        # Time the background thread spent on buckets (flatten + all-reduce), and the part of it backward() waited for
        # at its end (not hidden behind the rest of backward); benchmarks/bench_ddp.py prints both.
        self.comm_seconds = 0.0
        self.wait_seconds = 0.0
        # Elastic restart (everyo.distributed.elastic): synchronized steps completed, and the
        # state object that snapshots every K of them at the next forward pass.
        self._synced_steps = 0
        self._elastic: Any = None

    # -- the public API -------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._drain_stale_pass()
        if self._elastic is not None and self.training:
            self._elastic._on_forward(self._synced_steps)  # after the last step's optimizer step
        if self.broadcast_buffers and self.training and self._has_buffers:
            self._broadcast_state(params=False, buffers=True)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside, backward passes only accumulate local gradients (for gradient accumulation).

        The next backward pass outside averages the accumulated ``.grad``.

        Example (needs a running process group, so not run as a doctest)::

            with ddp.no_sync():
                loss_fn(ddp(x1), y1).backward()        # local only
            loss_fn(ddp(x2), y2).backward()            # averages the sum of both
        """
        previous = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = previous

    def remove_hooks(self) -> None:
        """Detach from the model's parameters (the wrapper stops communicating)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- construction -----------------------------------------------------------------------------
    def _entries(self):
        entries = [("parameter", n, p) for n, p in self.module.named_parameters()]
        entries += [("buffer", n, b) for n, b in self.module.named_buffers()]
        return entries

    def _check_same_model(self) -> None:
        """Every rank must hold the same names, shapes and dtypes; otherwise name the first difference."""
        group = self.group
        descriptions = [
            f"{kind} {name!r} shape {tuple(t.data.shape)} {t.data.dtype}" for kind, name, t in self._entries()
        ]
        counts = group.all_gather(np.array([len(descriptions)], np.int64))[:, 0]
        longest = int(counts.max())
        digests = np.zeros(longest, np.uint64)
        for i, text in enumerate(descriptions):
            digests[i] = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        table = group.all_gather(digests)
        differs = np.nonzero((table != table[0]).any(axis=0))[0]
        if differs.size == 0 and (counts == counts[0]).all():
            return
        first = int(differs[0]) if differs.size else int(counts.min())
        mine = descriptions[first] if first < len(descriptions) else f"no entry #{first} ({len(descriptions)} in all)"
        raw = np.zeros(_DESCRIPTION_BYTES, np.uint8)
        encoded = mine.encode()[:_DESCRIPTION_BYTES]
        raw[: len(encoded)] = np.frombuffer(encoded, np.uint8)
        gathered = group.all_gather(raw)
        by_text: dict[str, list[int]] = {}
        for rank, row in enumerate(gathered):
            by_text.setdefault(row.tobytes().rstrip(b"\0").decode(errors="replace"), []).append(rank)
        lines = [
            f"  {'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))}: {text}" for text, r in by_text.items()
        ]
        raise EveryODistributedError(
            f"DistributedDataParallel: the ranks' models differ at parameter/buffer #{first} "
            f"(counts per rank: {counts.tolist()}):\n"
            + "\n".join(lines)
            + "\nEvery rank must build the same model (same layers, in the same order, same dtypes)."
        )

    def _broadcast_state(self, params: bool, buffers: bool) -> None:
        """Take rank 0's values: one broadcast per dtype (flat), in registration order."""
        tensors: list[Tensor] = [p for _, p in self.module.named_parameters()] if params else []
        tensors += [b for _, b in self.module.named_buffers()] if buffers else []
        by_dtype: dict[np.dtype[Any], list[Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.data.dtype, []).append(t)
        for same_dtype in by_dtype.values():
            received = self.group.broadcast(np.concatenate([t.data.reshape(-1) for t in same_dtype]), root=0)
            offset = 0
            for t in same_dtype:
                t.data = received[offset : offset + t.data.size].reshape(t.data.shape).copy()
                offset += t.data.size

    # -- during backward ------------------------------------------------------------------------
    def _on_grad_ready(self, param: Tensor) -> None:
        if not self._sync:
            return
        current = self._pass
        if current is None:
            current = _Pass(self._buckets)
            self._pass = current
            autograd.queue_callback(self._finish_pass)
        b = self._where.get(id(param))
        if b is None or id(param) in current.seen:
            return
        current.seen.add(id(param))
        current.arrived[b] += 1
        if current.arrived[b] == len(self._buckets[b].params):
            self._launch(current, all_left=False)  # a bucket just completed

    def _launch(self, current: _Pass, all_left: bool) -> None:
        """Send buckets in bucket order: every complete one not yet sent (or all that are left).

        The last bucket is never handed to the background thread: once it is
        complete, every parameter has its gradient, so the rest of backward has
        nothing left to overlap with; the end-of-backward callback averages it
        on the main thread, without the thread's wake-up (which, on a core
        shared with the main thread, is also a context switch). A model with one
        bucket therefore never starts the thread.
        """
        buckets = self._buckets
        while current.launched < len(buckets):
            b = current.launched
            if not all_left and (b == len(buckets) - 1 or current.arrived[b] < len(buckets[b].params)):
                return
            current.launched += 1
            if not all_left:
                self._ensure_worker()
            # At the end of backward the main thread takes queued buckets itself (_wait_for):
            # no need to wake the thread for them.
            self._jobs.put((current, b, self._buckets[b], self.group), wake=not all_left)

    def _wait_for(self, current: _Pass) -> None:
        """Wait until every bucket of ``current`` is averaged, averaging queued ones here meanwhile.

        When the background thread is idle, the main thread takes the next
        queued bucket itself (still one at a time, in bucket order): at the end
        of backward there is nothing left to overlap with, and handing a bucket
        to another thread only adds its wake-up latency.
        """
        jobs = self._jobs
        while not all(event.is_set() for event in current.done):
            job = jobs.take(block=False)
            if job is None:
                with jobs.cond:
                    if not all(event.is_set() for event in current.done):
                        jobs.cond.wait(0.1)
                continue
            _run(jobs, job)

    def _finish_pass(self) -> None:
        """End of backward: send what is left, wait for every bucket, write the averages back."""
        current = self._pass
        assert current is not None  # queued by the pass's first hook, which set it
        try:
            self._launch(current, all_left=True)
            start = time.perf_counter()
            self._wait_for(current)
            self.wait_seconds += time.perf_counter() - start
            self.comm_seconds += current.seconds
            error = current.error
            if error is not None:
                message = (
                    f"DistributedDataParallel: averaging the gradients failed on rank {self.group.rank}: "
                    f"{type(error).__name__}: {error}"
                )
                if isinstance(error, PeerFailedError):  # a consequence of a peer's failure stays one
                    raise type(error)(message, error.failed_rank) from error
                raise EveryODistributedError(message) from error
            for bucket, averaged in zip(self._buckets, current.results):
                assert averaged is not None  # no error: every bucket was averaged
                bucket.write_back(averaged)
            self._synced_steps += 1
        finally:
            self._pass = None

    def _drain_stale_pass(self) -> None:
        # A backward pass that raised never ran its end callback: finish its collectives, drop it.
        current = self._pass
        if current is not None:
            self._launch(current, all_left=True)
            self._wait_for(current)
            self._pass = None

    # -- the background thread ------------------------------------------------------------------
    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            # The thread holds the queue and a weak reference only, so a dropped wrapper is
            # collected and its thread ends (within _IDLE_CHECK_SECONDS).
            worker = threading.Thread(
                target=_serve,
                args=(self._jobs, weakref.ref(self)),
                name=f"everyo-ddp-rank{self.group.rank}",
                daemon=True,
            )
            self._worker = worker
            worker.start()

    def extra_repr(self) -> str:
        return f"world_size={self.group.world_size}, buckets={len(self._buckets)}, bucket_cap_mb={self.bucket_cap_mb}"


_IDLE_CHECK_SECONDS = 2.0


class _Jobs:
    """Buckets waiting to be averaged, in bucket order, and whether one is being averaged now.

    Whoever takes a job (the background thread, or the main thread at the end
    of backward) holds ``busy`` until it is done, so the group runs one
    collective at a time, in the same order on every rank.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pending: collections.deque[_Job] = collections.deque()
        self.busy = False

    def put(self, job: _Job, wake: bool = True) -> None:
        with self.cond:
            self.pending.append(job)
            if wake:
                self.cond.notify_all()

    def take(self, block: bool, timeout: float | None = None) -> _Job | None:
        """The next job (now marked busy), or None (nothing to take, or another job is running)."""
        with self.cond:
            if block:
                self.cond.wait_for(lambda: self.pending and not self.busy, timeout)
            if not self.pending or self.busy:
                return None
            self.busy = True
            return self.pending.popleft()

    def finished(self) -> None:
        with self.cond:
            self.busy = False
            self.cond.notify_all()


def _run(jobs: _Jobs, job: _Job) -> None:
    current, b, bucket, group = job
    try:
        if current.error is None:
            start = time.perf_counter()
            current.results[b] = group.all_reduce_mean(bucket.flatten())
            current.seconds += time.perf_counter() - start
    except BaseException as exc:  # noqa: B902 - handed to the main thread
        current.error = exc
    finally:
        current.done[b].set()
        jobs.finished()


def _serve(jobs: _Jobs, owner: weakref.ref[DistributedDataParallel]) -> None:
    """The background thread: average buckets in the order queued; end once the wrapper is gone."""
    while True:
        job = jobs.take(block=True, timeout=_IDLE_CHECK_SECONDS)
        if job is None:
            if owner() is None:
                return
            continue
        _run(jobs, job)
        del job


def _make_buckets(params: Sequence[Tensor], cap_bytes: int) -> list[_Bucket]:
    """Consecutive parameters of one dtype, up to ``cap_bytes`` each (a larger parameter gets its own)."""
    buckets: list[_Bucket] = []
    current: list[Tensor] = []
    size = 0
    dtype: Any = None  # current's dtype, once it holds a parameter
    for p in params:
        nbytes = p.data.nbytes
        if current and (p.data.dtype != dtype or size + nbytes > cap_bytes):
            buckets.append(_Bucket(current, dtype))
            current, size = [], 0
        current.append(p)
        dtype, size = p.data.dtype, size + nbytes
    if current:
        buckets.append(_Bucket(current, dtype))
    return buckets
