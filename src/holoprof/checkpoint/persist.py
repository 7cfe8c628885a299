"""The persist thread: serialize each snapshot to the fast tier, or straight to durable storage.

A fast write reserves room on the fast tier as it goes (backpressure: it waits for drained copies to
be evicted) and falls back to durable storage when the checkpoint cannot fit or the write fails.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, NoReturn, cast

from holoprof.checkpoint.commit import commit_durable
from holoprof.checkpoint.errors import CheckpointError
from holoprof.checkpoint.format import (
    CheckpointInfo,
    Checksum,
    new_data_file,
    tmp_path,
    unlink,
    write_manifest,
)
from holoprof.checkpoint.jobs import Job
from holoprof.checkpoint.retention import drop_fast_locked, evict_oldest_locked
from holoprof.checkpoint.route import Tier, TierSpeeds
from holoprof.checkpoint.serializers import Serializer, SerializerName, inspect_object, serializer_for
from holoprof.checkpoint.state import FastEntry, Ledger
from holoprof.checkpoint.trace import trace_span

log = logging.getLogger("holoprof.checkpoint")

_PARALLEL_HASH_MIN = 1 << 20


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
        self.checksum = Checksum(sha256=sha256)
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


def _raise_sink_failure(name: str, serializer: Serializer, sink: _ChecksumSink, exc: Exception) -> NoReturn:
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


class Persister:
    """Writes the snapshots of ``ledger.jobs`` in order (``run`` is the persist thread's loop)."""

    def __init__(
        self,
        ledger: Ledger,
        speeds: TierSpeeds,
        serializer_choice: SerializerName | Serializer,
        *,
        fsync_fast: bool,
    ) -> None:
        self._ledger = ledger
        self._speeds = speeds
        self._serializer_choice = serializer_choice
        self._fsync_fast = fsync_fast
        self.hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="holoprof-ckpt-hash")

    def run(self) -> None:
        ledger = self._ledger
        while True:
            with ledger.cond:
                while not ledger.jobs and not ledger.closed:
                    ledger.cond.wait()
                if not ledger.jobs:
                    return
                job = ledger.jobs[0]
            self.persist(job, record_error=True)
            with ledger.cond:
                ledger.jobs.popleft()
                ledger.cond.notify_all()

    def persist(self, job: Job, *, record_error: bool = False) -> None:
        """Serialize a snapshot to its tier; the outcome goes to ``job.outcome`` (and errors to the
        next call when ``record_error``)."""
        t0_ns = time.perf_counter_ns()
        written: tuple[CheckpointInfo, Tier] | None = None
        try:
            obj = job.snapshot.materialize()
            written = self._write(job, obj)
            del obj
            job.outcome.set_result(written)
        except Exception as exc:
            self._fail(job, exc, record_error=record_error)
        finally:
            job.snapshot.release()
            if written is not None:
                info, tier = written
                directory = self._ledger.fast_dir if tier == "fast" else self._ledger.durable_dir
                trace_span(
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

    def _write(self, job: Job, obj: Any) -> tuple[CheckpointInfo, Tier]:
        """Write ``obj`` to the job's tier, or straight to durable storage when the fast tier cannot take it."""
        has_tensor, estimate = inspect_object(obj)
        serializer = serializer_for(self._serializer_choice, has_tensor)
        data_file = new_data_file(job.name)
        if job.tier == "fast":
            info = self._try_fast(job, obj, estimate, serializer, data_file)
            if info is not None:
                return info, "fast"
        t = time.perf_counter()
        info = self.write_durable_direct(obj, job.name, job.seq, serializer, data_file)
        self._speeds.learn("durable", info.size_bytes, time.perf_counter() - t)
        return info, "durable"

    def _try_fast(
        self, job: Job, obj: Any, estimate: int, serializer: Serializer, data_file: str
    ) -> CheckpointInfo | None:
        """Write ``obj`` to the fast tier; None (said in the log) when it goes to durable storage instead."""
        if estimate > self._ledger.fast_capacity_bytes:
            why = (
                f"its estimated size ({estimate} bytes) exceeds the fast tier's capacity "
                f"({self._ledger.fast_capacity_bytes} bytes)"
            )
        else:
            t = time.perf_counter()
            try:
                info, waited = self.write_fast(obj, job.name, job.seq, serializer, data_file)
                self._speeds.learn("fast", info.size_bytes, time.perf_counter() - t - waited)
                return info
            except _TooLarge:
                why = f"it is larger than the fast tier's capacity ({self._ledger.fast_capacity_bytes} bytes)"
            except _Aborted:
                why = "the fast tier is full of copies that cannot be drained"
            except OSError as exc:
                why = f"writing it to the fast tier failed ({exc})"
        log.warning("checkpoint %r goes straight to durable storage because %s", job.name, why)
        return None

    def _fail(self, job: Job, exc: Exception, *, record_error: bool) -> None:
        err = (
            exc
            if isinstance(exc, CheckpointError)
            else CheckpointError(f"writing checkpoint {job.name!r} failed: {type(exc).__name__}: {exc}")
        )
        if err is not exc:
            err.__cause__ = exc
        job.outcome.set_exception(err)
        if record_error:
            with self._ledger.cond:
                self._ledger.errors.append(err)
                self._ledger.cond.notify_all()

    def _reserve(self, n: int, written: int) -> None:
        """Make room for ``n`` more bytes of the checkpoint being written (``written`` so far)."""
        ledger = self._ledger
        with ledger.cond:
            while True:
                used = ledger.fast_used_locked() + ledger.reserved
                if used + n <= ledger.fast_capacity_bytes:
                    ledger.reserved += n
                    return
                if written + n > ledger.fast_capacity_bytes:
                    raise _TooLarge()
                if evict_oldest_locked(ledger):
                    continue
                if ledger.errors:
                    raise _Aborted()  # copies that cannot drain will not free space
                if not ledger.queue and ledger.inflight is None:
                    raise _TooLarge()  # nothing will free space (copies that failed to drain hold it)
                ledger.cond.wait(0.5)

    def write_fast(
        self, obj: Any, name: str, seq: int, serializer: Serializer, data_file: str
    ) -> tuple[CheckpointInfo, float]:
        ledger = self._ledger
        tmp = tmp_path(ledger.fast_dir, data_file)
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
            with ledger.cond:
                ledger.reserved -= reserved
                ledger.cond.notify_all()

        try:
            with open(tmp, "wb", buffering=1 << 20) as f:
                sink = _ChecksumSink(f, reserve, self.hash_pool, sha256=False)
                try:
                    serializer.dump(obj, cast(IO[bytes], sink))
                except Exception as exc:
                    _raise_sink_failure(name, serializer, sink, exc)
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
            os.replace(tmp, ledger.fast_dir / data_file)
        except BaseException:
            unlink(tmp)
            release()
            raise
        try:
            write_manifest(ledger.fast_dir, info, durable=self._fsync_fast)
        except BaseException:
            unlink(ledger.fast_dir / data_file)
            release()
            raise
        with ledger.cond:
            ledger.reserved -= reserved
            ledger.fast_bytes[data_file] = info.size_bytes
            old = ledger.fast.get(name)
            ledger.fast[name] = FastEntry(info, "pending")
            ledger.latest_seq[name] = seq
            ledger.queue.append(info)
            if old is not None:
                # the new manifest replaced the old one; its data file is now unreferenced
                ledger.fast_bytes.pop(old.info.data_file, None)
                unlink(ledger.fast_dir / old.info.data_file)
            ledger.cond.notify_all()
        return info, waited

    def write_durable_direct(
        self, obj: Any, name: str, seq: int, serializer: Serializer, data_file: str
    ) -> CheckpointInfo:
        ledger = self._ledger
        tmp = tmp_path(ledger.durable_dir, data_file)
        try:
            with open(tmp, "wb", buffering=1 << 20) as f:
                sink = _ChecksumSink(f, None, self.hash_pool, sha256=True)
                try:
                    serializer.dump(obj, cast(IO[bytes], sink))
                except Exception as exc:
                    _raise_sink_failure(name, serializer, sink, exc)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            unlink(tmp)
            raise CheckpointError(
                f"cannot write checkpoint {name!r} to durable storage {str(ledger.durable_dir)!r}: {exc}; "
                "check that the directory exists, is writable and has free space"
            ) from exc
        except BaseException:
            unlink(tmp)
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
            commit_durable(ledger, info, tmp)
        except OSError as exc:
            raise CheckpointError(
                f"cannot commit checkpoint {name!r} to durable storage {str(ledger.durable_dir)!r}: {exc}; "
                "check that the directory is writable and has free space"
            ) from exc
        with ledger.cond:
            ledger.latest_seq[name] = seq
            old = ledger.fast.get(name)
            if old is not None and old.info.seq < seq:
                drop_fast_locked(ledger, old.info)
            ledger.cond.notify_all()
        return info
