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

See docs/checkpoint.md for the guarantees, the on-disk layout and recipes.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import functools
import logging
import os
import secrets
import shutil
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, NoReturn, cast

from holoprof.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWarning,
    DrainError,
)
from holoprof.checkpoint.format import COPY_CHUNK as _COPY_CHUNK
from holoprof.checkpoint.format import DATA_RE as _DATA_RE
from holoprof.checkpoint.format import (
    DATA_SUFFIX,
    MANIFEST_SUFFIX,
    MAX_NAME_LENGTH,
    SCHEMA,
    TMP_PREFIX,
    CheckpointInfo,
    check_name,
)
from holoprof.checkpoint.format import Checksum as _Checksum
from holoprof.checkpoint.format import checksum_file as _checksum_file
from holoprof.checkpoint.format import fsync_dir as _fsync_dir
from holoprof.checkpoint.format import manifest_names as _manifest_names
from holoprof.checkpoint.format import manifest_path as _manifest_path
from holoprof.checkpoint.format import read_manifest as _read_manifest
from holoprof.checkpoint.format import size_matches as _size_matches
from holoprof.checkpoint.format import tmp_path as _tmp_path
from holoprof.checkpoint.format import unlink as _unlink
from holoprof.checkpoint.format import write_manifest as _write_manifest
from holoprof.checkpoint.locks import LOCK_NAME, lock_dir, release_locks
from holoprof.checkpoint.serializers import (
    PickleSerializer,
    Serializer,
    SerializerName,
    TorchSerializer,
    check_serializer,
    serializer_for,
    serializer_named,
)
from holoprof.checkpoint.serializers import inspect_object as _inspect_object
from holoprof.checkpoint.snapshot import Aborted as SnapshotAborted
from holoprof.checkpoint.snapshot import OverBudget, Snapshot, Snapshotter

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

_PARALLEL_HASH_MIN = 1 << 20
_DEFAULT_FAST_SHARE = 0.5
_DEFAULT_SNAPSHOT_SHARE = 0.25  # of physical memory
_MIN_SNAPSHOT_BUDGET = 64 << 20
#: the fast tier is used only when it writes at least this many times faster than durable storage
FAST_TIER_MIN_SPEEDUP = 1.2

Tier = Literal["fast", "durable"]
Route = Literal["auto", "fast", "durable"]

# --------------------------------------------------------------------------------------------------
# records


@dataclass(frozen=True)
class SaveResult:
    """What ``save()`` did: how long the caller was blocked and which path the checkpoint takes.

    ``tier`` is the path chosen: ``"fast"`` (serialized to the fast tier, then drained to durable
    storage) or ``"durable"`` (serialized straight to durable storage); ``reason`` says why.
    ``blocking_s`` is the time ``save()`` took (the snapshot), ``backpressure_s`` the part of it spent
    waiting for snapshot memory, ``snapshot_bytes`` what was copied. ``copied`` is False when
    ``copy=False`` let host tensors be used as they are. ``synchronous`` is True when the checkpoint
    was written before ``save()`` returned (its snapshot would not fit the memory budget).
    ``wait()`` / ``info`` block until the checkpoint is written to its tier.
    """

    name: str
    seq: int
    tier: Tier
    reason: str
    blocking_s: float
    backpressure_s: float
    snapshot_bytes: int
    copied: bool
    synchronous: bool
    _outcome: Future[tuple[CheckpointInfo, Tier]] = field(repr=False, compare=False)

    def wait(self, timeout: float | None = None) -> CheckpointInfo:
        """The checkpoint's record once written (fast tier, or durable on the direct path).

        Raises the ``CheckpointError`` that made it fail (also raised by the buffer's next call).
        """
        try:
            return self._outcome.result(timeout)[0]
        except FutureTimeout:
            raise CheckpointError(
                f"checkpoint {self.name!r} is not written yet after {timeout} s; wait longer"
            ) from None

    @property
    def info(self) -> CheckpointInfo:
        return self.wait()

    @property
    def written_tier(self) -> Tier:
        """Where the checkpoint was written: ``tier``, or ``"durable"`` when the fast tier was full or failed."""
        self.wait()
        return self._outcome.result()[1]


@dataclass
class _Job:
    """A snapshot waiting to be written by the persist thread."""

    name: str
    seq: int
    snapshot: Snapshot
    tier: Tier
    outcome: Future[tuple[CheckpointInfo, Tier]]


@dataclass
class _FastEntry:
    info: CheckpointInfo
    state: Literal["pending", "durable", "failed"]


class _TooLarge(Exception):
    pass


class _Aborted(Exception):
    pass


class _ChecksumSink:
    """File-like object for serializers: checksums and counts what it writes.

    ``reserve(n, written)`` is called before each write (capacity accounting, may block or raise).
    Large chunks are checksummed on ``pool`` while this thread writes them, so the two overlap.
    """

    def __init__(
        self,
        f: IO[bytes],
        reserve: Callable[[int, int], None] | None,
        pool: ThreadPoolExecutor | None,
        *,
        sha256: bool,
    ) -> None:
        self._f = f
        self._reserve = reserve
        self._pool = pool
        self.checksum = _Checksum(sha256=sha256)
        self.size = 0
        self.failure: BaseException | None = None

    def write(self, data: Any) -> int:
        if self.failure is not None:
            raise _Aborted()
        try:
            view = memoryview(data)
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
            n = view.nbytes
            if n == 0:
                return 0
            if self._reserve is not None:
                self._reserve(n, self.size)
            if self._pool is not None and n >= _PARALLEL_HASH_MIN:
                future = self._pool.submit(self.checksum.update, view)
                try:
                    self._f.write(view)
                finally:
                    future.result()
            else:
                self.checksum.update(view)
                self._f.write(view)
            self.size += n
            return n
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
            raise

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


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


def _trace_span(start_ns: int, end_ns: int, attrs: dict[str, Any]) -> None:
    """Record a checkpoint phase when the process is traced by holoprof (never fails)."""
    if "holoprof.agent.core" not in sys.modules:
        return
    try:
        from holoprof.api import _agent

        agent = _agent()
        if agent is None or agent.tls.active is not None:
            return
        agent.span("phase", "checkpoint", start_ns, end_ns, agent.steps.index, attrs)
    except Exception as exc:  # tracing never breaks a checkpoint
        log.debug("not traced: %s", exc)


def _default_snapshot_budget() -> int:
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        phys = 0
    return max(_MIN_SNAPSHOT_BUDGET, int(phys * _DEFAULT_SNAPSHOT_SHARE))


# --------------------------------------------------------------------------------------------------
# the burst buffer


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
        self.fast_dir = Path(fast_dir)
        self.durable_dir = Path(durable_dir)
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
        self.keep_last = keep_last
        self.route: Route = route
        self._serializer_choice = self._check_serializer(serializer)
        self._fsync_fast = fsync_fast

        self._cond = threading.Condition()
        self._save_lock = threading.Lock()
        self._durable_lock = threading.Lock()
        self._fast: dict[str, _FastEntry] = {}
        self._fast_bytes: dict[str, int] = {}
        self._durable: dict[str, CheckpointInfo] = {}
        self._latest_seq: dict[str, int] = {}
        self._jobs: deque[_Job] = deque()
        self._queue: deque[CheckpointInfo] = deque()
        self._inflight: CheckpointInfo | None = None
        self._failed: list[CheckpointInfo] = []
        self._errors: list[BaseException] = []
        self._reserved = 0
        self._next_seq = 1
        self._stopping = False
        self._closed = False
        self._lock_fds: list[int] = []
        self._pid = os.getpid()
        self._fast_bps: float | None = None  # measured write speed of each path (bytes/s)
        self._durable_bps: float | None = None
        self._samples: dict[Tier, int] = {"fast": 0, "durable": 0}
        self.last_load_source: Tier | None = None

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
            self._lock_fds.extend(self._lock_dir(self.durable_dir))
            self._lock_fds.extend(self._lock_dir(self.fast_dir))
            self._recover()
        except OSError as exc:
            self._release_locks()
            raise CheckpointError(
                f"cannot open the checkpoint directories: {exc.strerror or exc} "
                f"({exc.filename or self.durable_dir}); check that both exist and are writable"
            ) from None
        except BaseException:
            self._release_locks()
            raise
        if fast_capacity_bytes is None:
            free = shutil.disk_usage(self.fast_dir).free
            fast_capacity_bytes = max(1, int(free * _DEFAULT_FAST_SHARE) + self._fast_used_locked())
        self.fast_capacity_bytes = fast_capacity_bytes
        self.snapshots = Snapshotter(snapshot_budget_bytes or _default_snapshot_budget())

        self._hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="holoprof-ckpt-hash")
        self._persister = threading.Thread(
            target=self._persist_loop, name="holoprof-ckpt-persist", daemon=True
        )
        self._worker = threading.Thread(target=self._drain_loop, name="holoprof-ckpt-drain", daemon=True)
        self._persister.start()
        self._worker.start()
        self._atexit_hook = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit_hook)

    # ---------------------------------------------------------------------------------------- public

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
        with self._save_lock:
            t0_ns = time.perf_counter_ns()
            with self._cond:
                self._check_usable()
                self._raise_errors()
                self._requeue_failed()
                seq = self._next_seq
                self._next_seq += 1
                tier, reason = self._choose_tier_locked()
            outcome: Future[tuple[CheckpointInfo, Tier]] = Future()
            try:
                snap, waited = self.snapshots.take(obj, copy=copy, should_stop=self._snapshot_should_stop)
            except OverBudget as over:
                waited = 0.0
                reason = (
                    f"its snapshot ({over.needed} bytes) exceeds snapshot_budget_bytes ({over.budget}): "
                    f"written to the {tier} tier before save() returned; raise the budget to snapshot it"
                )
                log.warning("checkpoint %r: %s", name, reason)
                job = _Job(name, seq, Snapshot(None, obj, [], [], 0, False, 0), tier, outcome)
                with self._cond:  # earlier snapshots first, so that checkpoints keep their order
                    while self._jobs:
                        self._cond.wait()
                self._persist(job)
                self._raise_outcome(job)
                return self._result(job, reason, t0_ns, waited, synchronous=True)
            except SnapshotAborted:
                with self._cond:
                    self._raise_errors()
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
            job = _Job(name, seq, snap, tier, outcome)
            with self._cond:
                self._jobs.append(job)
                self._cond.notify_all()
            return self._result(job, reason, t0_ns, waited, synchronous=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every checkpoint saved so far is durable; raise the first drain error.

        Returns False if ``timeout`` (seconds) passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._check_usable(allow_stopping=True)
            self._raise_errors()
            self._requeue_failed()
            target = self._next_seq - 1
            while not self._errors and self._pending_upto(target):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._raise_errors()
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
        with self._cond:
            self._check_usable(allow_stopping=True)
            while any(j.name == name for j in self._jobs):  # a snapshot of it is being written
                self._cond.wait()
            self._raise_errors()
        for _ in range(3):
            with self._cond:
                entry = self._fast.get(name)
                info = entry.info if entry is not None else None
            if info is None:
                break
            try:
                obj = self._load_verified(self.fast_dir, info, options)
            except FileNotFoundError:
                continue  # evicted or replaced while we read it: look again
            except CheckpointCorruptError as exc:
                self._handle_corrupt_fast(info, exc)
                break
            self.last_load_source = "fast"
            log.info("loaded checkpoint %r from the fast tier (%s)", name, self.fast_dir)
            return obj, "fast"
        info = self._read_durable_manifest(name)
        obj = self._load_verified(self.durable_dir, info, options)
        self.last_load_source = "durable"
        log.info("loaded checkpoint %r from durable storage (%s)", name, self.durable_dir)
        return obj, "durable"

    def list(self, *, verify: bool = False) -> list[CheckpointInfo]:
        """Checkpoints visible in durable storage (manifest present, data size matches), oldest first.

        ``verify=True`` also checks each SHA-256 (reads every byte).
        """
        with self._cond:
            self._check_usable(allow_stopping=True)
        found: list[CheckpointInfo] = []
        try:
            paths = list(self.durable_dir.iterdir())
        except OSError as exc:
            raise CheckpointError(
                f"cannot list durable checkpoints in {str(self.durable_dir)!r}: {exc.strerror or exc}; "
                "check that the durable directory exists and is readable (was it removed or unmounted?)"
            ) from None
        for path in paths:
            fname = path.name
            if fname.startswith(TMP_PREFIX) or not fname.endswith(MANIFEST_SUFFIX):
                continue
            name = fname[: -len(MANIFEST_SUFFIX)]
            try:
                info = _read_manifest(path, name)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if not _size_matches(self.durable_dir, info):
                continue
            if verify:
                try:
                    ck = _checksum_file(self.durable_dir / info.data_file, sha256=True)
                except OSError:
                    continue
                if ck.mismatch(info) is not None:
                    continue
            found.append(info)
        return sorted(found, key=lambda i: i.seq)

    def remove(self, name: str) -> bool:
        """Delete checkpoint ``name`` from both tiers (manifest first); False if there was none.

        A snapshot of it still being written is finished first; a drain of it still queued or in
        flight is dropped.
        """
        check_name(name)
        with self._cond:
            self._check_usable()
            while any(j.name == name for j in self._jobs):
                self._cond.wait()
        with self._durable_lock:
            with self._cond:
                # a newer seq makes every earlier copy of the name superseded: in-flight drains skip it
                self._latest_seq[name] = self._next_seq
                self._next_seq += 1
                entry = self._fast.pop(name, None)
                self._queue = deque(i for i in self._queue if i.name != name)
                self._failed = [i for i in self._failed if i.name != name]
                durable = self._durable.pop(name, None)
                self._cond.notify_all()
            if entry is not None:
                self._fast_bytes.pop(entry.info.data_file, None)
                self._remove_fast_files(entry.info)
            if durable is not None:
                _unlink(_manifest_path(self.durable_dir, name))
                with contextlib.suppress(OSError):
                    _fsync_dir(self.durable_dir)
                _unlink(self.durable_dir / durable.data_file)
        return entry is not None or durable is not None

    @property
    def fast_used_bytes(self) -> int:
        """Bytes of checkpoint data on the fast tier now (including a save in progress)."""
        with self._cond:
            return self._fast_used_locked() + self._reserved

    @property
    def pending(self) -> int:
        """Checkpoints saved but not yet durable."""
        with self._cond:
            return len(self._jobs) + len(self._queue) + (self._inflight is not None) + len(self._failed)

    def close(self) -> None:
        """Persist and drain everything, stop the threads and release the directories.

        Raises the first error (``DrainError``, ``CheckpointError``) when a checkpoint could not be
        made durable: closing never loses a checkpoint in silence. Checkpoints that could not be
        drained stay on the fast tier and are drained the next time a BurstBuffer opens these
        directories (``undrained_names()`` lists them). At interpreter exit the same happens, and a
        failure is written to stderr as an error line.
        """
        with self._cond:
            if self._closed:
                return
            self._stopping = True
            self._cond.notify_all()
        error: CheckpointError | None = None
        try:
            self.wait()
        except CheckpointError as exc:
            error = exc
        finally:
            with self._cond:
                # snapshots not written yet are the only copy: write them before stopping
                while self._jobs and self._persister.is_alive():
                    self._cond.wait(0.5)
                self._queue.clear()
                self._closed = True
                self._cond.notify_all()
            self._persister.join()
            self._worker.join()
            self._hash_pool.shutdown(wait=True)
            self.snapshots.abort()
            self._release_locks()
            atexit.unregister(self._atexit_hook)
        if error is None:
            with self._cond:
                self._raise_errors()
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

    _check_serializer = staticmethod(check_serializer)

    def _serializer_for(self, has_tensor: bool) -> Serializer:
        return serializer_for(self._serializer_choice, has_tensor)

    def _serializer_named(self, name: str) -> Serializer:
        return serializer_named(self._serializer_choice, name)

    def _check_usable(self, *, allow_stopping: bool = False) -> None:
        if self._closed or (self._stopping and not allow_stopping):
            raise CheckpointError("this BurstBuffer is closed; create a new one to save or load checkpoints")

    def _snapshot_should_stop(self) -> bool:
        return self._closed

    def _choose_tier_locked(self) -> tuple[Tier, str]:
        """The path of the next checkpoint, and why (caller holds ``_cond``)."""
        if self.route != "auto":
            return self.route, f"route={self.route!r} was asked for"
        fast, durable = self._fast_bps, self._durable_bps
        if fast is None or durable is None:
            return "fast", "the fast tier is used until the speeds of both tiers are measured"
        speeds = f"fast tier {fast / 1e6:,.0f} MB/s, durable storage {durable / 1e6:,.0f} MB/s (measured)"
        if fast >= FAST_TIER_MIN_SPEEDUP * durable:
            return "fast", speeds
        return "durable", f"the fast tier is not faster than durable storage: {speeds}"

    def _learn(self, tier: Tier, nbytes: int, seconds: float) -> None:
        """Update the measured write speed of a path from one write of ``nbytes``."""
        if nbytes < (64 << 10) or seconds <= 0:
            return  # too small to say anything about bandwidth
        bps = nbytes / seconds
        with self._cond:
            self._samples[tier] += 1
            if self._samples[tier] == 1:
                return  # the first write of a path pays first-touch costs (allocator, page cache)
            old = self._fast_bps if tier == "fast" else self._durable_bps
            new = bps if old is None else 0.5 * old + 0.5 * bps
            if tier == "fast":
                self._fast_bps = new
            else:
                self._durable_bps = new

    def _result(self, job: _Job, reason: str, t0_ns: int, waited: float, *, synchronous: bool) -> SaveResult:
        t1_ns = time.perf_counter_ns()
        snap = job.snapshot
        _trace_span(
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

    @staticmethod
    def _raise_outcome(job: _Job) -> None:
        exc = job.outcome.exception()
        if exc is not None:
            raise exc

    # persisting snapshots --------------------------------------------------------------------------

    def _persist_loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs[0]
            self._persist(job, record_error=True)
            with self._cond:
                self._jobs.popleft()
                self._cond.notify_all()

    def _persist(self, job: _Job, *, record_error: bool = False) -> None:
        """Serialize a snapshot to its tier; the outcome goes to ``job.outcome`` (and errors to the
        next call when ``record_error``)."""
        t0_ns = time.perf_counter_ns()
        tier: Tier = job.tier
        info: CheckpointInfo | None = None
        try:
            obj = job.snapshot.materialize()
            has_tensor, estimate = _inspect_object(obj)
            serializer = self._serializer_for(has_tensor)
            data_file = f"{job.name}.{secrets.token_hex(8)}{DATA_SUFFIX}"
            if tier == "fast":
                why = ""
                if estimate > self.fast_capacity_bytes:
                    why = (
                        f"its estimated size ({estimate} bytes) exceeds the fast tier's capacity "
                        f"({self.fast_capacity_bytes} bytes)"
                    )
                else:
                    t = time.perf_counter()
                    try:
                        info, waited = self._write_fast(obj, job.name, job.seq, serializer, data_file)
                        self._learn("fast", info.size_bytes, time.perf_counter() - t - waited)
                    except _TooLarge:
                        why = f"it is larger than the fast tier's capacity ({self.fast_capacity_bytes} bytes)"
                    except _Aborted:
                        why = "the fast tier is full of copies that cannot be drained"
                    except OSError as exc:
                        why = f"writing it to the fast tier failed ({exc})"
                if info is None:
                    log.warning("checkpoint %r goes straight to durable storage because %s", job.name, why)
                    tier = "durable"
            if info is None:
                t = time.perf_counter()
                info = self._write_durable_direct(obj, job.name, job.seq, serializer, data_file)
                self._learn("durable", info.size_bytes, time.perf_counter() - t)
            del obj
            job.outcome.set_result((info, tier))
        except Exception as exc:
            err = (
                exc
                if isinstance(exc, CheckpointError)
                else CheckpointError(f"writing checkpoint {job.name!r} failed: {type(exc).__name__}: {exc}")
            )
            if err is not exc:
                err.__cause__ = exc
            job.outcome.set_exception(err)
            if record_error:
                with self._cond:
                    self._errors.append(err)
                    self._cond.notify_all()
        finally:
            job.snapshot.release()
            if info is not None:
                directory = self.fast_dir if tier == "fast" else self.durable_dir
                _trace_span(
                    t0_ns,
                    time.perf_counter_ns(),
                    {
                        "op": "save",
                        "api": "holoprof.BurstBuffer.write",
                        "checkpoint": job.name,
                        "seq": job.seq,
                        "bytes": info.size_bytes,
                        "path": str(directory / info.data_file),
                        "tier": tier,
                    },
                )

    def _raise_errors(self) -> None:
        """Raise (once) the drain errors recorded since the last call. Caller holds ``_cond``."""
        if not self._errors:
            return
        errors, self._errors = self._errors, []
        first = errors[0]
        more = f" ({len(errors) - 1} more drain error(s) after it)" if len(errors) > 1 else ""
        if isinstance(first, CheckpointError):
            raise type(first)(f"{first}{more}") from first.__cause__
        raise DrainError(f"{first}{more}") from first

    def _requeue_failed(self) -> None:
        """Give checkpoints whose drain failed another try (their error was raised already)."""
        if not self._failed:
            return
        for info in self._failed:
            entry = self._fast.get(info.name)
            if entry is not None and entry.info.seq == info.seq:
                entry.state = "pending"
                self._queue.append(info)
        self._failed.clear()
        self._queue = deque(sorted(self._queue, key=lambda i: i.seq))
        self._cond.notify_all()

    def _pending_upto(self, target: int) -> bool:
        if self._inflight is not None and self._inflight.seq <= target:
            return True
        return any(j.seq <= target for j in self._jobs) or any(i.seq <= target for i in self._queue)

    def undrained_names(self) -> builtins.list[str]:
        """Names of checkpoints saved but not durable yet (snapshots, queued or failed drains)."""
        with self._cond:
            names = [j.name for j in self._jobs]
            names += [
                e.info.name
                for e in sorted(self._fast.values(), key=lambda e: e.info.seq)
                if e.state != "durable"
            ]
        return list(dict.fromkeys(names))

    def _fast_used_locked(self) -> int:
        return sum(self._fast_bytes.values())

    # locking the directories -----------------------------------------------------------------------

    _lock_dir = staticmethod(lock_dir)

    def _release_locks(self) -> None:
        release_locks(self._lock_fds)

    # recovery --------------------------------------------------------------------------------------

    def _scan(self, directory: Path) -> tuple[dict[str, CheckpointInfo], set[str]]:
        """Remove temporary files; return (valid manifests by name, data file names present)."""
        manifests: dict[str, CheckpointInfo] = {}
        data_files: set[str] = set()
        for path in directory.iterdir():
            fname = path.name
            if fname.startswith(TMP_PREFIX):
                log.info("removing temporary file %s left by an interrupted checkpoint", path)
                _unlink(path)
            elif fname.endswith(MANIFEST_SUFFIX):
                name = fname[: -len(MANIFEST_SUFFIX)]
                try:
                    info = _read_manifest(path, name)
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring unreadable checkpoint manifest %s: %s", path, exc)
                    continue
                manifests[name] = info
            elif _DATA_RE.match(fname):
                data_files.add(fname)
        return manifests, data_files

    def _recover(self) -> None:
        durable, durable_data = self._scan(self.durable_dir)
        for name, info in durable.items():
            if info.data_file in durable_data and _size_matches(self.durable_dir, info):
                self._durable[name] = info
            else:
                log.warning(
                    "durable checkpoint %r is damaged (data file %s missing or of the wrong size); ignoring it",
                    name,
                    info.data_file,
                )
        referenced = {i.data_file for i in durable.values()}
        for orphan in sorted(durable_data - referenced):
            log.info("removing orphaned data file %s (a checkpoint that never completed)", orphan)
            _unlink(self.durable_dir / orphan)
        _fsync_dir(self.durable_dir)

        fast, fast_data = self._scan(self.fast_dir)
        resumed: list[CheckpointInfo] = []
        kept: set[str] = set()
        for name, info in sorted(fast.items(), key=lambda kv: kv[1].seq):
            d = self._durable.get(name)
            if d is not None and d.seq == info.seq and d.crc32 == info.crc32:
                self._fast[name] = _FastEntry(info, "durable")
                kept.add(info.data_file)
                continue
            if d is not None and d.seq > info.seq:
                self._remove_fast_files(info)
                continue
            try:
                bad = _checksum_file(self.fast_dir / info.data_file, sha256=False).mismatch(info)
            except OSError as exc:
                bad = str(exc)
            if bad is not None:
                log.warning(
                    "fast copy of checkpoint %r does not match its manifest and was never made durable; "
                    "dropping it",
                    name,
                )
                self._remove_fast_files(info)
                continue
            self._fast[name] = _FastEntry(info, "pending")
            kept.add(info.data_file)
            resumed.append(info)
        for orphan in sorted(fast_data - kept):
            _unlink(self.fast_dir / orphan)
        for entry in self._fast.values():
            self._fast_bytes[entry.info.data_file] = entry.info.size_bytes
        all_infos = [*self._durable.values(), *(e.info for e in self._fast.values())]
        for info in all_infos:
            self._latest_seq[info.name] = max(self._latest_seq.get(info.name, 0), info.seq)
        self._next_seq = max((i.seq for i in all_infos), default=0) + 1
        self._queue.extend(resumed)
        if resumed:
            log.info("resuming the drain of %d checkpoint(s) interrupted earlier", len(resumed))
        self._prune_durable()
        with self._cond:
            self._prune_fast_locked()

    # writing ---------------------------------------------------------------------------------------

    def _reserve(self, n: int, written: int) -> None:
        """Make room for ``n`` more bytes of the checkpoint being written (``written`` so far)."""
        with self._cond:
            while True:
                used = self._fast_used_locked() + self._reserved
                if used + n <= self.fast_capacity_bytes:
                    self._reserved += n
                    return
                if written + n > self.fast_capacity_bytes:
                    raise _TooLarge()
                if self._evict_oldest_locked():
                    continue
                if self._errors:
                    raise _Aborted()  # copies that cannot drain will not free space
                if not self._queue and self._inflight is None:
                    raise _TooLarge()  # nothing will free space (copies that failed to drain hold it)
                self._cond.wait(0.5)

    def _write_fast(
        self, obj: Any, name: str, seq: int, serializer: Serializer, data_file: str
    ) -> tuple[CheckpointInfo, float]:
        tmp = _tmp_path(self.fast_dir, data_file)
        waited = 0.0
        reserved = 0

        def reserve(n: int, written: int) -> None:
            nonlocal waited, reserved
            t = time.perf_counter()
            try:
                self._reserve(n, written)
                reserved += n
            finally:
                waited += time.perf_counter() - t

        def release() -> None:
            with self._cond:
                self._reserved -= reserved
                self._cond.notify_all()

        try:
            with open(tmp, "wb", buffering=1 << 20) as f:
                sink = _ChecksumSink(f, reserve, self._hash_pool, sha256=False)
                try:
                    serializer.dump(obj, cast(IO[bytes], sink))
                except Exception as exc:
                    self._raise_sink_failure(name, serializer, sink, exc)
                f.flush()
                if self._fsync_fast:
                    os.fsync(f.fileno())
            info = CheckpointInfo(
                name=name,
                seq=seq,
                data_file=data_file,
                size_bytes=sink.size,
                crc32=sink.checksum.crc32,
                sha256=None,
                serializer=serializer.name,
                saved_unix_ns=time.time_ns(),
            )
            os.replace(tmp, self.fast_dir / data_file)
        except BaseException:
            _unlink(tmp)
            release()
            raise
        try:
            _write_manifest(self.fast_dir, info, durable=self._fsync_fast)
        except BaseException:
            _unlink(self.fast_dir / data_file)
            release()
            raise
        with self._cond:
            self._reserved -= reserved
            self._fast_bytes[data_file] = info.size_bytes
            old = self._fast.get(name)
            self._fast[name] = _FastEntry(info, "pending")
            self._latest_seq[name] = seq
            self._queue.append(info)
            if old is not None:
                # the new manifest replaced the old one; its data file is now unreferenced
                self._fast_bytes.pop(old.info.data_file, None)
                _unlink(self.fast_dir / old.info.data_file)
            self._cond.notify_all()
        return info, waited

    def _raise_sink_failure(
        self, name: str, serializer: Serializer, sink: _ChecksumSink, exc: Exception
    ) -> NoReturn:
        """Turn what went wrong inside ``serializer.dump`` into the exception ``save()`` handles."""
        failure = sink.failure
        if isinstance(failure, (_TooLarge, _Aborted, OSError)):
            raise failure from None
        if isinstance(exc, OSError):
            raise exc
        raise CheckpointError(
            f"cannot serialize checkpoint {name!r} with {serializer.name}: {exc}; "
            "save picklable objects (e.g. model.state_dict())"
        ) from exc

    def _write_durable_direct(
        self, obj: Any, name: str, seq: int, serializer: Serializer, data_file: str
    ) -> CheckpointInfo:
        tmp = _tmp_path(self.durable_dir, data_file)
        try:
            with open(tmp, "wb", buffering=1 << 20) as f:
                sink = _ChecksumSink(f, None, self._hash_pool, sha256=True)
                try:
                    serializer.dump(obj, cast(IO[bytes], sink))
                except Exception as exc:
                    self._raise_sink_failure(name, serializer, sink, exc)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            _unlink(tmp)
            raise CheckpointError(
                f"cannot write checkpoint {name!r} to durable storage {str(self.durable_dir)!r}: {exc}; "
                "check that the directory exists, is writable and has free space"
            ) from exc
        except BaseException:
            _unlink(tmp)
            raise
        info = CheckpointInfo(
            name=name,
            seq=seq,
            data_file=data_file,
            size_bytes=sink.size,
            crc32=sink.checksum.crc32,
            sha256=sink.checksum.sha256,
            serializer=serializer.name,
            saved_unix_ns=time.time_ns(),
        )
        try:
            self._commit_durable(info, tmp)
        except OSError as exc:
            raise CheckpointError(
                f"cannot commit checkpoint {name!r} to durable storage {str(self.durable_dir)!r}: {exc}; "
                "check that the directory is writable and has free space"
            ) from exc
        with self._cond:
            self._latest_seq[name] = seq
            old = self._fast.get(name)
            if old is not None and old.info.seq < seq:
                self._drop_fast_locked(old.info)
            self._cond.notify_all()
        return info

    # draining --------------------------------------------------------------------------------------

    def _superseded(self, info: CheckpointInfo) -> bool:
        """True if draining ``info`` is pointless: a newer save of the name, or retention drops it."""
        with self._cond:
            return self._superseded_locked(info, retention=True)

    def _drain_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                info = self._queue.popleft()
                self._inflight = info
            outcome: BaseException | bool
            t0_ns = time.perf_counter_ns()
            try:
                outcome = self._drain_one(info)
            except BaseException as exc:
                outcome = exc
            if outcome is True:
                _trace_span(
                    t0_ns,
                    time.perf_counter_ns(),
                    {
                        "op": "save",
                        "api": "holoprof.BurstBuffer.drain",
                        "checkpoint": info.name,
                        "seq": info.seq,
                        "bytes": info.size_bytes,
                        "path": str(self.durable_dir / info.data_file),
                        "tier": "durable",
                    },
                )
            with self._cond:
                self._inflight = None
                entry = self._fast.get(info.name)
                current = entry is not None and entry.info.seq == info.seq
                if outcome is True:
                    if current and entry is not None:
                        entry.state = "durable"
                    self._prune_fast_locked()
                elif outcome is False:
                    if current:
                        self._drop_fast_locked(info)
                elif isinstance(outcome, _FastCopyLost):
                    if current:
                        self._drop_fast_locked(info)
                    self._errors.append(DrainError(str(outcome)))
                elif self._latest_seq.get(info.name, 0) > info.seq:
                    if current:  # a newer save of the name replaced it: the failure no longer matters
                        self._drop_fast_locked(info)
                elif self._superseded_locked(info, retention=False):
                    if current and entry is not None:  # committed, then a later step failed
                        entry.state = "durable"
                    self._errors.append(self._drain_error(info, outcome))
                else:
                    if current and entry is not None:
                        entry.state = "failed"
                        self._failed.append(info)
                    self._errors.append(self._drain_error(info, outcome))
                self._cond.notify_all()

    def _superseded_locked(self, info: CheckpointInfo, *, retention: bool) -> bool:
        if self._latest_seq.get(info.name, 0) > info.seq:
            return True
        current = self._durable.get(info.name)
        if current is not None and current.seq >= info.seq:
            return True
        if retention and self.keep_last is not None:
            return sum(1 for d in self._durable.values() if d.seq > info.seq) >= self.keep_last
        return False

    def _drain_error(self, info: CheckpointInfo, exc: BaseException) -> DrainError:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        where = getattr(exc, "filename", None) or str(self.durable_dir)
        err = DrainError(
            f"draining checkpoint {info.name!r} to durable storage failed: {detail} ({where}); "
            "make the durable directory writable and with free space, then call wait() to retry "
            "(the copy stays on the fast tier)"
        )
        err.__cause__ = exc
        return err

    def _drain_one(self, info: CheckpointInfo) -> bool:
        """Copy one fast checkpoint to durable storage. True: durable; False: skipped (superseded)."""
        if self._superseded(info):
            return False
        src = self.fast_dir / info.data_file
        tmp = _tmp_path(self.durable_dir, info.data_file)
        ck = _Checksum(sha256=True)
        buf = bytearray(_COPY_CHUNK)
        view = memoryview(buf)
        t0 = time.perf_counter()
        try:
            with open(src, "rb", buffering=0) as fin, open(tmp, "wb", buffering=0) as fout:
                while True:
                    n = fin.readinto(buf)
                    if not n:
                        break
                    chunk = view[:n]
                    ck.update(chunk)
                    written = 0
                    while written < n:
                        written += fout.write(chunk[written:]) or 0
                os.fsync(fout.fileno())
                if hasattr(os, "posix_fadvise"):  # the fast copy serves loads: keep the page cache free
                    os.posix_fadvise(fout.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            self._learn("durable", ck.size, time.perf_counter() - t0)
            bad = ck.mismatch(info)
            if bad is not None:
                raise _FastCopyLost(
                    f"the fast copy of checkpoint {info.name!r} was corrupted before it reached durable "
                    f"storage ({bad}); that checkpoint is lost, save it again"
                )
        except FileNotFoundError as exc:
            _unlink(tmp)
            if exc.filename == str(src) and not self._superseded(info):
                raise _FastCopyLost(
                    f"the fast copy of checkpoint {info.name!r} disappeared before it reached durable "
                    f"storage ({src}); that checkpoint is lost, save it again"
                ) from None
            raise
        except BaseException:
            _unlink(tmp)
            raise
        return self._commit_durable(dataclasses.replace(info, sha256=ck.sha256), tmp)

    def _commit_durable(self, info: CheckpointInfo, tmp: Path) -> bool:
        """Publish a fully written, fsynced data file and its manifest. False if superseded."""
        with self._durable_lock:
            with self._cond:
                skip = self._superseded_locked(info, retention=True)
            if skip:
                _unlink(tmp)
                return False
            final = self.durable_dir / info.data_file
            try:
                os.replace(tmp, final)
            except BaseException:
                _unlink(tmp)
                raise
            try:
                _fsync_dir(self.durable_dir)
                _write_manifest(self.durable_dir, info, durable=True)  # the commit point
            except BaseException:
                if not _manifest_names(self.durable_dir, info):
                    _unlink(final)  # no manifest names it: it would only be an orphan
                raise
            with self._cond:
                old = self._durable.get(info.name)
                self._durable[info.name] = info
            if old is not None and old.data_file != info.data_file:
                _unlink(self.durable_dir / old.data_file)
            self._prune_durable()
        return True

    # retention and eviction -----------------------------------------------------------------------

    def _prune_durable(self) -> None:
        """Delete durable checkpoints beyond ``keep_last`` (manifest first, then data)."""
        if self.keep_last is None:
            return
        with self._cond:
            ordered = sorted(self._durable.values(), key=lambda i: i.seq, reverse=True)
            doomed = ordered[self.keep_last :]
            for info in doomed:
                del self._durable[info.name]
            self._prune_fast_locked()
        if not doomed:
            return
        for info in doomed:
            _unlink(_manifest_path(self.durable_dir, info.name))
        _fsync_dir(self.durable_dir)
        for info in doomed:
            _unlink(self.durable_dir / info.data_file)
            log.info("retention: removed checkpoint %r (keep_last=%d)", info.name, self.keep_last)

    def _prune_fast_locked(self) -> None:
        """Drop drained fast copies whose checkpoint is no longer kept in durable storage."""
        for name, entry in list(self._fast.items()):
            if entry.state != "durable":
                continue
            d = self._durable.get(name)
            if d is None or d.seq != entry.info.seq:
                self._drop_fast_locked(entry.info)

    def _evict_oldest_locked(self) -> bool:
        drained = [e for e in self._fast.values() if e.state == "durable"]
        if not drained:
            return False
        victim = min(drained, key=lambda e: e.info.seq)
        self._drop_fast_locked(victim.info)
        return True

    def _drop_fast_locked(self, info: CheckpointInfo) -> None:
        entry = self._fast.get(info.name)
        if entry is not None and entry.info.seq == info.seq:
            del self._fast[info.name]
            self._remove_fast_files(info)
        else:
            _unlink(self.fast_dir / info.data_file)
        self._fast_bytes.pop(info.data_file, None)
        self._cond.notify_all()

    def _remove_fast_files(self, info: CheckpointInfo) -> None:
        path = _manifest_path(self.fast_dir, info.name)
        try:
            current = _read_manifest(path, info.name)
        except (OSError, ValueError, KeyError, TypeError):
            current = None
        if current is None or current.seq == info.seq:
            _unlink(path)
        _unlink(self.fast_dir / info.data_file)

    # loading ---------------------------------------------------------------------------------------

    def _read_durable_manifest(self, name: str) -> CheckpointInfo:
        path = _manifest_path(self.durable_dir, name)
        try:
            info = _read_manifest(path, name)
        except FileNotFoundError:
            known = [i.name for i in self.list()]
            hint = f"available: {', '.join(known[-5:])}" if known else "no checkpoints are stored there yet"
            with self._cond:
                pending = name in self._fast
            if pending:
                hint = "its fast copy is unusable and it never reached durable storage"
            raise CheckpointNotFoundError(
                f"no checkpoint named {name!r} in {str(self.durable_dir)!r} ({hint}); check the name"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointCorruptError(
                f"the manifest of checkpoint {name!r} in {str(self.durable_dir)!r} is unreadable ({exc}); "
                "load an older checkpoint"
            ) from None
        return info

    def _load_verified(self, directory: Path, info: CheckpointInfo, options: dict[str, Any]) -> Any:
        path = directory / info.data_file
        strong = directory == self.durable_dir and info.sha256 is not None
        try:
            bad = _checksum_file(path, sha256=strong).mismatch(info)
        except FileNotFoundError:
            if directory == self.fast_dir:
                raise
            raise CheckpointCorruptError(
                f"the data file of checkpoint {info.name!r} ({path}) is missing; load an older checkpoint"
            ) from None
        except OSError as exc:
            raise CheckpointError(
                f"cannot read checkpoint {info.name!r} ({path}): {exc.strerror or exc}; "
                "check that the directory is readable"
            ) from None
        if bad is not None:
            raise CheckpointCorruptError(
                f"checkpoint {info.name!r} in {str(directory)!r} does not match its manifest ({bad}); "
                "load an older checkpoint"
            )
        serializer = self._serializer_named(info.serializer)
        try:
            with open(path, "rb") as f:
                return serializer.load(f, **options)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(
                f"cannot load checkpoint {info.name!r} from {str(path)!r} with {serializer.name}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _handle_corrupt_fast(self, info: CheckpointInfo, exc: CheckpointCorruptError) -> None:
        with self._cond:
            durable = self._durable.get(info.name)
            same = durable is not None and durable.seq == info.seq and durable.crc32 == info.crc32
            if same:
                self._drop_fast_locked(info)
        if not same:
            raise CheckpointCorruptError(
                f"the fast copy of checkpoint {info.name!r} is corrupted and it is not durable yet: {exc}"
            ) from None
        warnings.warn(
            f"the fast copy of checkpoint {info.name!r} is corrupted ({exc}); "
            "loading it from durable storage instead",
            CheckpointWarning,
            stacklevel=4,
        )


class _FastCopyLost(Exception):
    """The fast copy is corrupted or gone before it was drained: retrying cannot help."""
