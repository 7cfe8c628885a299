"""The drain thread: copy fast-tier checkpoints to durable storage, verified, then publish them."""

from __future__ import annotations

import dataclasses
import os
import time

from holoprof.checkpoint.commit import commit_durable
from holoprof.checkpoint.errors import DrainError
from holoprof.checkpoint.format import COPY_CHUNK, CheckpointInfo, Checksum, tmp_path, unlink
from holoprof.checkpoint.retention import (
    drop_fast_locked,
    prune_fast_locked,
    superseded,
    superseded_locked,
)
from holoprof.checkpoint.route import TierSpeeds
from holoprof.checkpoint.state import Ledger
from holoprof.checkpoint.trace import trace_span


class _FastCopyLost(Exception):
    """The fast copy is corrupted or gone before it was drained: retrying cannot help."""


class Drainer:
    """Drains the checkpoints of ``ledger.queue`` in order (``run`` is the drain thread's loop)."""

    def __init__(self, ledger: Ledger, speeds: TierSpeeds) -> None:
        self._ledger = ledger
        self._speeds = speeds

    def run(self) -> None:
        ledger = self._ledger
        while True:
            with ledger.cond:
                while not ledger.queue and not ledger.closed:
                    ledger.cond.wait()
                if ledger.closed:
                    return
                info = ledger.queue.popleft()
                ledger.inflight = info
            outcome: BaseException | bool
            t0_ns = time.perf_counter_ns()
            try:
                outcome = self.drain_one(info)
            except BaseException as exc:
                outcome = exc
            if outcome is True:
                trace_span(
                    t0_ns,
                    time.perf_counter_ns(),
                    {
                        "op": "save",
                        "api": "holoprof.BurstBuffer.drain",
                        "checkpoint": info.name,
                        "seq": info.seq,
                        "bytes": info.size_bytes,
                        "path": str(ledger.durable_dir / info.data_file),
                        "tier": "durable",
                    },
                )
            with ledger.cond:
                ledger.inflight = None
                self._settle_locked(info, outcome)
                ledger.cond.notify_all()

    def _settle_locked(self, info: CheckpointInfo, outcome: BaseException | bool) -> None:
        """Record how the drain of ``info`` ended: durable, skipped, lost or failed (to retry)."""
        ledger = self._ledger
        entry = ledger.fast.get(info.name)
        current = entry is not None and entry.info.seq == info.seq
        if outcome is True:
            if current and entry is not None:
                entry.state = "durable"
            prune_fast_locked(ledger)
        elif outcome is False:
            if current:
                drop_fast_locked(ledger, info)
        elif isinstance(outcome, _FastCopyLost):
            if current:
                drop_fast_locked(ledger, info)
            ledger.errors.append(DrainError(str(outcome)))
        elif ledger.latest_seq.get(info.name, 0) > info.seq:
            if current:  # a newer save of the name replaced it: the failure no longer matters
                drop_fast_locked(ledger, info)
        elif superseded_locked(ledger, info, retention=False):
            if current and entry is not None:  # committed, then a later step failed
                entry.state = "durable"
            ledger.errors.append(self._drain_error(info, outcome))
        else:
            if current and entry is not None:
                entry.state = "failed"
                ledger.failed.append(info)
            ledger.errors.append(self._drain_error(info, outcome))

    def _drain_error(self, info: CheckpointInfo, exc: BaseException) -> DrainError:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        where = getattr(exc, "filename", None) or str(self._ledger.durable_dir)
        err = DrainError(
            f"draining checkpoint {info.name!r} to durable storage failed: {detail} ({where}); "
            "make the durable directory writable and with free space, then call wait() to retry "
            "(the copy stays on the fast tier)"
        )
        err.__cause__ = exc
        return err

    def drain_one(self, info: CheckpointInfo) -> bool:
        """Copy one fast checkpoint to durable storage. True: durable; False: skipped (superseded)."""
        ledger = self._ledger
        if superseded(ledger, info):
            return False
        src = ledger.fast_dir / info.data_file
        tmp = tmp_path(ledger.durable_dir, info.data_file)
        ck = Checksum(sha256=True)
        buf = bytearray(COPY_CHUNK)
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
            self._speeds.learn("durable", ck.size, time.perf_counter() - t0)
            bad = ck.mismatch(info)
            if bad is not None:
                raise _FastCopyLost(
                    f"the fast copy of checkpoint {info.name!r} was corrupted before it reached durable "
                    f"storage ({bad}); that checkpoint is lost, save it again"
                )
        except FileNotFoundError as exc:
            unlink(tmp)
            if exc.filename == str(src) and not superseded(ledger, info):
                raise _FastCopyLost(
                    f"the fast copy of checkpoint {info.name!r} disappeared before it reached durable "
                    f"storage ({src}); that checkpoint is lost, save it again"
                ) from None
            raise
        except BaseException:
            unlink(tmp)
            raise
        return commit_durable(ledger, dataclasses.replace(info, sha256=ck.sha256), tmp)
