"""Burst-buffer checkpointing: snapshot in memory, persist and drain to durable storage in the background.

``save()`` copies the checkpoint into a snapshot in host memory (see ``snapshot.py``) and returns; a
background thread serializes the snapshot to the fast directory (tmpfs, local NVMe), or straight to
durable storage when the fast tier is not faster, and another copies fast copies to the durable
directory. Every checkpoint is two files per tier: the
data file and a JSON manifest (size and checksums of the data: CRC-32, plus SHA-256 once durable),
written in this order, each through a temporary name, fsync and an atomic rename. The manifest is the commit record: a checkpoint exists
only if its manifest exists and the data file matches it, so a crash at any moment leaves either the
old state or the new one, never a partial checkpoint that looks complete. Opening a BurstBuffer over
the same directories removes temporary files and orphaned data, and resumes the drains that a crash
interrupted when the fast copy still verifies.

This module is the ``BurstBuffer`` itself; the work is done by its parts: ``persist`` (the persist
thread), ``drain`` (the drain thread), ``commit`` and ``retention`` (what durable storage keeps),
``recovery`` (opening), ``load``, ``locks``, ``format`` (files and manifests), ``serializers``,
``route`` (which tier), ``state`` (the shared bookkeeping) and ``jobs``.

See docs/checkpoint.md for the guarantees, the on-disk layout and recipes.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import functools
import logging
import os
import shutil
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any

from holoprof.checkpoint import retention
from holoprof.checkpoint.drain import Drainer
from holoprof.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWarning,
    DrainError,
)
from holoprof.checkpoint.format import (
    DATA_SUFFIX,
    MANIFEST_SUFFIX,
    MAX_NAME_LENGTH,
    SCHEMA,
    TMP_PREFIX,
    CheckpointInfo,
    check_name,
)
from holoprof.checkpoint.jobs import Job, SaveResult
from holoprof.checkpoint.load import Loader, list_durable
from holoprof.checkpoint.locks import LOCK_NAME, lock_dir, release_locks
from holoprof.checkpoint.persist import Persister
from holoprof.checkpoint.recovery import recover
from holoprof.checkpoint.route import FAST_TIER_MIN_SPEEDUP, Route, Tier, TierSpeeds
from holoprof.checkpoint.serializers import (
    PickleSerializer,
    Serializer,
    SerializerName,
    TorchSerializer,
    check_serializer,
)
from holoprof.checkpoint.snapshot import Aborted as SnapshotAborted
from holoprof.checkpoint.snapshot import OverBudget, Snapshot, Snapshotter
from holoprof.checkpoint.state import Ledger
from holoprof.checkpoint.trace import trace_span

__all__ = [
    "DATA_SUFFIX",
    "FAST_TIER_MIN_SPEEDUP",
    "LOCK_NAME",
    "MANIFEST_SUFFIX",
    "MAX_NAME_LENGTH",
    "SCHEMA",
    "TMP_PREFIX",
    "BurstBuffer",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "CheckpointWarning",
    "DrainError",
    "PickleSerializer",
    "Route",
    "SaveResult",
    "Serializer",
    "SerializerName",
    "Tier",
    "TorchSerializer",
    "check_name",
]

log = logging.getLogger("holoprof.checkpoint")

_DEFAULT_FAST_SHARE = 0.5
_DEFAULT_SNAPSHOT_SHARE = 0.25  # of physical memory
_MIN_SNAPSHOT_BUDGET = 64 << 20


def _close_at_exit(ref: weakref.ReferenceType[BurstBuffer]) -> None:
    """At interpreter exit: make every checkpoint durable, or say loudly on stderr which were not.

    Python gives exit handlers no way to change the exit status without skipping the handlers that
    run after them, so a loss is an error line on stderr (and on the logger), not a status; call
    ``close()`` before exiting to get an exception instead.
    """
    buffer = ref()
    if buffer is None or buffer._pid != os.getpid():
        return  # a forked child exiting: the buffer and its threads belong to the parent
    try:
        buffer.close()
    except Exception as exc:
        names = ", ".join(repr(n) for n in buffer.undrained_names()[:10]) or "none listed"
        msg = (
            f"holoprof: ERROR: checkpoints were not made durable at exit ({names}): {exc}. They are "
            f"still on the fast tier {str(buffer.fast_dir)!r}; opening a BurstBuffer on the same "
            "directories drains them. Call close() before exiting to get this as an exception."
        )
        log.error("%s", msg)
        with contextlib.suppress(Exception):
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()


def _default_snapshot_budget() -> int:
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        phys = 0
    return max(_MIN_SNAPSHOT_BUDGET, int(phys * _DEFAULT_SNAPSHOT_SHARE))


def _check_options(
    keep_last: int | None, fast_capacity_bytes: int | None, snapshot_budget_bytes: int | None, route: Route
) -> None:
    if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
        raise CheckpointError(f"keep_last must be a positive integer or None, got {keep_last!r}")
    for label, value in (
        ("fast_capacity_bytes", fast_capacity_bytes),
        ("snapshot_budget_bytes", snapshot_budget_bytes),
    ):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise CheckpointError(f"{label} must be a positive integer (bytes), got {value!r}")
    if route not in ("auto", "fast", "durable"):
        raise CheckpointError(f"route must be 'auto', 'fast' or 'durable', got {route!r}")


class BurstBuffer:
    """Snapshot a checkpoint in memory and return; background threads persist and drain it.

    Parameters:
        fast_dir: directory on a fast tier (``/dev/shm``, local NVMe); created if missing.
        durable_dir: directory on durable storage (parallel file system, disk); created if missing.
        fast_capacity_bytes: most bytes of checkpoints kept on the fast tier. The persist thread waits
            (backpressure) until drained copies can be evicted; a checkpoint larger than this goes
            straight to durable storage. Default: half of the fast tier's free space at start.
        keep_last: keep only the newest ``keep_last`` checkpoints (by save order, over all names) on
            both tiers; ``None`` keeps everything.
        serializer: ``"auto"`` (torch.save for objects holding tensors, pickle otherwise),
            ``"torch"``, ``"pickle"``, or an object with ``name``, ``dump(obj, f)`` and
            ``load(f, **options)``.
        fsync_fast: also fsync fast-tier files. Off by default: fast copies are verified against
            their CRC-32 before they are drained or loaded, so a torn fast copy is never trusted.
        snapshot_budget_bytes: most bytes of host memory for snapshots (reused buffers); ``save()``
            waits for earlier snapshots to be persisted rather than exceed it. Default: a quarter of
            the physical memory.
        route: ``"auto"`` (the fast tier while it writes at least ``FAST_TIER_MIN_SPEEDUP`` times
            faster than durable storage, as measured by the saves and drains so far; otherwise
            straight to durable storage), ``"fast"`` or ``"durable"`` to force one path.

    One BurstBuffer at a time may use a directory (an ``flock`` on the directory enforces it).
    Thread-safe.
    """

    def __init__(
        self,
        fast_dir: str | os.PathLike[str],
        durable_dir: str | os.PathLike[str],
        *,
        fast_capacity_bytes: int | None = None,
        keep_last: int | None = None,
        serializer: SerializerName | Serializer = "auto",
        fsync_fast: bool = False,
        snapshot_budget_bytes: int | None = None,
        route: Route = "auto",
    ) -> None:
        fast, durable = Path(fast_dir), Path(durable_dir)
        _check_options(keep_last, fast_capacity_bytes, snapshot_budget_bytes, route)
        self._ledger = Ledger(fast, durable, keep_last)
        self.route: Route = route
        self._serializer_choice = check_serializer(serializer)
        self._save_lock = threading.Lock()
        self._lock_fds: builtins.list[int] = []
        self._pid = os.getpid()
        self._speeds = TierSpeeds(self._ledger.cond)
        self.last_load_source: Tier | None = None

        self._open_directories()
        if fast_capacity_bytes is None:
            free = shutil.disk_usage(self.fast_dir).free
            fast_capacity_bytes = max(1, int(free * _DEFAULT_FAST_SHARE) + self._ledger.fast_used_locked())
        self._ledger.fast_capacity_bytes = fast_capacity_bytes
        self.snapshots = Snapshotter(snapshot_budget_bytes or _default_snapshot_budget())

        self._persister = Persister(
            self._ledger, self._speeds, self._serializer_choice, fsync_fast=fsync_fast
        )
        self._drainer = Drainer(self._ledger, self._speeds)
        self._loader = Loader(self._ledger, self._serializer_choice)
        self._persist_thread = threading.Thread(
            target=self._persist_loop, name="holoprof-ckpt-persist", daemon=True
        )
        self._drain_thread = threading.Thread(
            target=self._drain_loop, name="holoprof-ckpt-drain", daemon=True
        )
        self._persist_thread.start()
        self._drain_thread.start()
        self._atexit_hook = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit_hook)

    def _open_directories(self) -> None:
        """Create both directories, lock them and recover what a crash left there."""
        for label, directory in (("fast_dir", self.fast_dir), ("durable_dir", self.durable_dir)):
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot create {label} {str(directory)!r}: {exc.strerror or exc}; "
                    "pass a directory you can write to"
                ) from None
        if os.path.samefile(self.fast_dir, self.durable_dir):
            raise CheckpointError(
                f"fast_dir and durable_dir are the same directory ({str(self.fast_dir)!r}); "
                "pass two different directories, e.g. fast_dir='/dev/shm/ckpt'"
            )
        try:
            self._lock_fds.extend(lock_dir(self.durable_dir))
            self._lock_fds.extend(lock_dir(self.fast_dir))
            recover(self._ledger)
        except OSError as exc:
            release_locks(self._lock_fds)
            raise CheckpointError(
                f"cannot open the checkpoint directories: {exc.strerror or exc} "
                f"({exc.filename or self.durable_dir}); check that both exist and are writable"
            ) from None
        except BaseException:
            release_locks(self._lock_fds)
            raise

    # The threads run these methods of the buffer (not of its parts) so that a buffer whose threads
    # run stays referenced: the exit hook finds it through a weak reference and drains it.
    def _persist_loop(self) -> None:
        self._persister.run()

    def _drain_loop(self) -> None:
        self._drainer.run()

    # ---------------------------------------------------------------------------------------- public

    @property
    def fast_dir(self) -> Path:
        return self._ledger.fast_dir

    @fast_dir.setter
    def fast_dir(self, value: Path) -> None:
        self._ledger.fast_dir = value

    @property
    def durable_dir(self) -> Path:
        return self._ledger.durable_dir

    @durable_dir.setter
    def durable_dir(self, value: Path) -> None:
        self._ledger.durable_dir = value

    @property
    def keep_last(self) -> int | None:
        return self._ledger.keep_last

    @keep_last.setter
    def keep_last(self, value: int | None) -> None:
        self._ledger.keep_last = value

    @property
    def fast_capacity_bytes(self) -> int:
        return self._ledger.fast_capacity_bytes

    @fast_capacity_bytes.setter
    def fast_capacity_bytes(self, value: int) -> None:
        self._ledger.fast_capacity_bytes = value

    @property
    def snapshot_budget_bytes(self) -> int:
        return self.snapshots.budget_bytes

    def save(self, obj: Any, name: str, *, copy: bool = True) -> SaveResult:
        """Snapshot ``obj`` as checkpoint ``name`` in host memory and return; it is written and
        drained to durable storage in the background.

        Once ``save`` returns, the caller may change every tensor and object it passed: the snapshot
        holds their state at the call. ``copy=False`` skips the copy of host tensors and of the
        object (device tensors are still copied): the caller promises not to change them until
        ``SaveResult.wait()`` returns. Raises a pending error of an earlier checkpoint first; that
        call saves nothing.
        """
        check_name(name)
        ledger = self._ledger
        with self._save_lock:
            t0_ns = time.perf_counter_ns()
            with ledger.cond:
                ledger.check_usable()
                ledger.raise_errors()
                ledger.requeue_failed()
                seq = ledger.next_seq
                ledger.next_seq += 1
                tier, reason = self._speeds.choose_locked(self.route)
            outcome: Future[tuple[CheckpointInfo, Tier]] = Future()
            try:
                snap, waited = self.snapshots.take(obj, copy=copy, should_stop=self._snapshot_should_stop)
            except OverBudget as over:
                reason = (
                    f"its snapshot ({over.needed} bytes) exceeds snapshot_budget_bytes ({over.budget}): "
                    f"written to the {tier} tier before save() returned; raise the budget to snapshot it"
                )
                log.warning("checkpoint %r: %s", name, reason)
                job = Job(name, seq, Snapshot(None, obj, [], [], 0, False, 0), tier, outcome)
                return self._save_synchronously(job, reason, t0_ns)
            except SnapshotAborted:
                with ledger.cond:
                    ledger.raise_errors()
                raise CheckpointError(
                    f"saving checkpoint {name!r} was given up while waiting for snapshot memory "
                    "(the buffer is closing)"
                ) from None
            except Exception as exc:
                raise CheckpointError(
                    f"cannot snapshot checkpoint {name!r}: {type(exc).__name__}: {exc}; "
                    "save picklable objects (e.g. model.state_dict())"
                ) from exc
            if tier == "fast" and snap.nbytes > self.fast_capacity_bytes:
                tier = "durable"
                reason = (
                    f"its snapshot ({snap.nbytes} bytes) is larger than the fast tier's capacity "
                    f"({self.fast_capacity_bytes} bytes)"
                )
                log.warning("checkpoint %r goes straight to durable storage because %s", name, reason)
            job = Job(name, seq, snap, tier, outcome)
            with ledger.cond:
                ledger.jobs.append(job)
                ledger.cond.notify_all()
            return self._result(job, reason, t0_ns, waited, synchronous=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every checkpoint saved so far is durable; raise the first drain error.

        Returns False if ``timeout`` (seconds) passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        ledger = self._ledger
        with ledger.cond:
            ledger.check_usable(allow_stopping=True)
            ledger.raise_errors()
            ledger.requeue_failed()
            target = ledger.next_seq - 1
            while not ledger.errors and ledger.pending_upto(target):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                ledger.cond.wait(remaining)
            ledger.raise_errors()
        return True

    def load(self, name: str, **options: Any) -> Any:
        """Load checkpoint ``name``: from the fast tier when a verified copy is there, else durable.

        ``options`` go to the serializer's load (``map_location=...``, ``weights_only=...`` for torch).
        The tier used is logged and kept in ``last_load_source``; see also ``load_with_source``.
        """
        return self.load_with_source(name, **options)[0]

    def load_with_source(self, name: str, **options: Any) -> tuple[Any, Tier]:
        """Like ``load`` but returns ``(object, "fast" | "durable")``."""
        check_name(name)
        obj, source = self._loader.load(name, options)
        self.last_load_source = source
        return obj, source

    def list(self, *, verify: bool = False) -> builtins.list[CheckpointInfo]:
        """Checkpoints visible in durable storage (manifest present, data size matches), oldest first.

        ``verify=True`` also checks each SHA-256 (reads every byte).
        """
        return list_durable(self._ledger, verify=verify)

    def remove(self, name: str) -> bool:
        """Delete checkpoint ``name`` from both tiers (manifest first); False if there was none.

        A snapshot of it still being written is finished first; a drain of it still queued or in
        flight is dropped.
        """
        check_name(name)
        return retention.remove(self._ledger, name)

    @property
    def fast_used_bytes(self) -> int:
        """Bytes of checkpoint data on the fast tier now (including a save in progress)."""
        with self._ledger.cond:
            return self._ledger.fast_used_locked() + self._ledger.reserved

    @property
    def pending(self) -> int:
        """Checkpoints saved but not yet durable."""
        return self._ledger.pending_count()

    def undrained_names(self) -> builtins.list[str]:
        """Names of checkpoints saved but not durable yet (snapshots, queued or failed drains)."""
        return self._ledger.undrained_names()

    def close(self) -> None:
        """Persist and drain everything, stop the threads and release the directories.

        Raises the first error (``DrainError``, ``CheckpointError``) when a checkpoint could not be
        made durable: closing never loses a checkpoint in silence. Checkpoints that could not be
        drained stay on the fast tier and are drained the next time a BurstBuffer opens these
        directories (``undrained_names()`` lists them). At interpreter exit the same happens, and a
        failure is written to stderr as an error line.
        """
        ledger = self._ledger
        with ledger.cond:
            if ledger.closed:
                return
            ledger.stopping = True
            ledger.cond.notify_all()
        error: CheckpointError | None = None
        try:
            self.wait()
        except CheckpointError as exc:
            error = exc
        finally:
            with ledger.cond:
                # snapshots not written yet are the only copy: write them before stopping
                while ledger.jobs and self._persist_thread.is_alive():
                    ledger.cond.wait(0.5)
                ledger.queue.clear()
                ledger.closed = True
                ledger.cond.notify_all()
            self._persist_thread.join()
            self._drain_thread.join()
            self._persister.hash_pool.shutdown(wait=True)
            self.snapshots.abort()
            release_locks(self._lock_fds)
            atexit.unregister(self._atexit_hook)
        if error is None:
            with ledger.cond:
                ledger.raise_errors()
        else:
            raise error

    def __enter__(self) -> BurstBuffer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except CheckpointError as drain_exc:
            log.error(
                "burst buffer: %s (while handling %s)", drain_exc, exc_type.__name__ if exc_type else ""
            )

    # ----------------------------------------------------------------------------------- internals

    def _snapshot_should_stop(self) -> bool:
        return self._ledger.closed

    def _save_synchronously(self, job: Job, reason: str, t0_ns: int) -> SaveResult:
        """Write a checkpoint whose snapshot would not fit the memory budget before ``save()`` returns."""
        with self._ledger.cond:  # earlier snapshots first, so that checkpoints keep their order
            while self._ledger.jobs:
                self._ledger.cond.wait()
        self._persister.persist(job)
        exc = job.outcome.exception()
        if exc is not None:
            raise exc
        return self._result(job, reason, t0_ns, 0.0, synchronous=True)

    def _result(self, job: Job, reason: str, t0_ns: int, waited: float, *, synchronous: bool) -> SaveResult:
        t1_ns = time.perf_counter_ns()
        snap = job.snapshot
        trace_span(
            t0_ns,
            t1_ns,
            {
                "op": "save",
                "api": "holoprof.BurstBuffer.save",
                "checkpoint": job.name,
                "seq": job.seq,
                "bytes": snap.nbytes if not synchronous else None,
                "tier": job.tier,
                "synchronous": synchronous,
            },
        )
        return SaveResult(
            name=job.name,
            seq=job.seq,
            tier=job.tier,
            reason=reason,
            blocking_s=(t1_ns - t0_ns) / 1e9,
            backpressure_s=waited,
            snapshot_bytes=snap.nbytes,
            copied=snap.copied,
            synchronous=synchronous,
            _outcome=job.outcome,
        )
