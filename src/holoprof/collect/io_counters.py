"""Darshan-style POSIX counters of one file in one process, and the functions that update them.

Counters (Darshan's names): ``POSIX_OPENS``, ``POSIX_READS``, ``POSIX_WRITES``, ``POSIX_SEEKS``,
``POSIX_STATS``, ``POSIX_FSYNCS``, ``POSIX_MMAPS``, ``POSIX_BYTES_MAPPED``, ``POSIX_MAX_BYTE_MAPPED``,
``POSIX_BYTES_READ``, ``POSIX_BYTES_WRITTEN``,
``POSIX_MAX_BYTE_READ``, ``POSIX_MAX_BYTE_WRITTEN``, ``POSIX_CONSEC_*``, ``POSIX_SEQ_*``,
``POSIX_RW_SWITCHES``, the ten ``POSIX_SIZE_READ_*`` / ``POSIX_SIZE_WRITE_*`` buckets, and the float
counters ``POSIX_F_READ_TIME``, ``POSIX_F_WRITE_TIME``, ``POSIX_F_META_TIME`` (seconds) and the
``POSIX_F_{OPEN,READ,WRITE,CLOSE}_{START,END}_TIMESTAMP`` (seconds since the epoch).

The hot path (a read) does a few integer updates on a per-file record. Counters are updated without
a lock: two threads reading the same file at the same instant may lose an increment, as in Darshan
without its lock. While a per-op trace runs, each operation is also appended to a ring
(:func:`trace_begin`), at most :data:`TRACE_RING` of them between two flushes.

Standard library only: this module loads in every process of a job.
"""

from __future__ import annotations

import collections
from typing import Any, Final

from holoprof import model

#: Operations kept by the Python layer's trace ring between two flushes (older ones are dropped).
TRACE_RING: Final = 200_000

_BUCKETS: Final = tuple(name for name, _, _ in model.DARSHAN_SIZE_BUCKETS)
_READ_BUCKET_NAMES: Final = tuple(f"POSIX_SIZE_READ_{b}" for b in _BUCKETS)
_WRITE_BUCKET_NAMES: Final = tuple(f"POSIX_SIZE_WRITE_{b}" for b in _BUCKETS)

_NONE, _READ, _WRITE = 0, 1, 2


def _bucket(n: int) -> int:
    if n < 100:
        return 0
    if n < 1024:
        return 1
    if n < 10240:
        return 2
    if n < 102400:
        return 3
    if n < 1048576:
        return 4
    if n < 4194304:
        return 5
    if n < 10485760:
        return 6
    if n < 104857600:
        return 7
    if n < 1073741824:
        return 8
    return 9


class FileStats:
    """Darshan POSIX counters of one file in this process (times in monotonic ns until reported)."""

    __slots__ = (
        "bytes_mapped",
        "bytes_read",
        "bytes_written",
        "close_end",
        "close_start",
        "consec_reads",
        "consec_writes",
        "dirty",
        "fsyncs",
        "last_byte_read",
        "last_byte_written",
        "last_io",
        "max_byte_mapped",
        "max_byte_read",
        "max_byte_written",
        "meta_ns",
        "mmaps",
        "open_end",
        "open_start",
        "opens",
        "path",
        "read_end",
        "read_ns",
        "read_start",
        "reads",
        "rw_switches",
        "seeks",
        "seq_reads",
        "seq_writes",
        "size_read",
        "size_write",
        "stats",
        "write_end",
        "write_ns",
        "write_start",
        "writes",
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self.reset()

    def reset(self) -> None:
        self.opens = self.reads = self.writes = self.seeks = self.stats = 0
        self.fsyncs = self.mmaps = 0
        self.bytes_mapped = self.max_byte_mapped = 0
        self.bytes_read = self.bytes_written = 0
        self.max_byte_read = self.max_byte_written = 0
        self.consec_reads = self.consec_writes = self.seq_reads = self.seq_writes = 0
        self.rw_switches = 0
        self.last_byte_read = self.last_byte_written = 0
        self.last_io = _NONE
        self.size_read = [0] * 10
        self.size_write = [0] * 10
        self.read_ns = self.write_ns = self.meta_ns = 0
        self.open_start = self.open_end = self.read_start = self.read_end = 0
        self.write_start = self.write_end = self.close_start = self.close_end = 0
        self.dirty = False

    def merge(self, o: FileStats) -> None:
        """Add the counters of ``o`` (the same file under its earlier name, before a rename)."""
        for k in ("opens", "reads", "writes", "seeks", "stats", "fsyncs", "mmaps", "bytes_mapped"):
            setattr(self, k, getattr(self, k) + getattr(o, k))
        for k in ("bytes_read", "bytes_written", "consec_reads", "consec_writes", "seq_reads", "seq_writes"):
            setattr(self, k, getattr(self, k) + getattr(o, k))
        for k in ("rw_switches", "read_ns", "write_ns", "meta_ns"):
            setattr(self, k, getattr(self, k) + getattr(o, k))
        for k in ("max_byte_read", "max_byte_written", "max_byte_mapped"):
            setattr(self, k, max(getattr(self, k), getattr(o, k)))
        for k in ("open_start", "read_start", "write_start", "close_start"):
            a, b = getattr(self, k), getattr(o, k)
            setattr(self, k, min(a, b) if a and b else a or b)
        for k in ("open_end", "read_end", "write_end", "close_end"):
            setattr(self, k, max(getattr(self, k), getattr(o, k)))
        self.size_read = [a + b for a, b in zip(self.size_read, o.size_read, strict=True)]
        self.size_write = [a + b for a, b in zip(self.size_write, o.size_write, strict=True)]
        self.dirty = True

    def counters(self, clock_offset_ns: int) -> dict[str, Any]:
        def ts(t: int) -> float:
            return (t + clock_offset_ns) / 1e9 if t else 0.0

        c: dict[str, Any] = {
            "POSIX_OPENS": self.opens,
            "POSIX_READS": self.reads,
            "POSIX_WRITES": self.writes,
            "POSIX_SEEKS": self.seeks,
            "POSIX_STATS": self.stats,
            "POSIX_MMAPS": self.mmaps,
            "POSIX_FSYNCS": self.fsyncs,
            "POSIX_BYTES_READ": self.bytes_read,
            "POSIX_BYTES_WRITTEN": self.bytes_written,
            "POSIX_MAX_BYTE_READ": self.max_byte_read,
            "POSIX_MAX_BYTE_WRITTEN": self.max_byte_written,
            "POSIX_BYTES_MAPPED": self.bytes_mapped,
            "POSIX_MAX_BYTE_MAPPED": self.max_byte_mapped,
            "POSIX_CONSEC_READS": self.consec_reads,
            "POSIX_CONSEC_WRITES": self.consec_writes,
            "POSIX_SEQ_READS": self.seq_reads,
            "POSIX_SEQ_WRITES": self.seq_writes,
            "POSIX_RW_SWITCHES": self.rw_switches,
        }
        for i in range(10):
            c[_READ_BUCKET_NAMES[i]] = self.size_read[i]
        for i in range(10):
            c[_WRITE_BUCKET_NAMES[i]] = self.size_write[i]
        c.update(
            {
                "POSIX_F_OPEN_START_TIMESTAMP": ts(self.open_start),
                "POSIX_F_READ_START_TIMESTAMP": ts(self.read_start),
                "POSIX_F_WRITE_START_TIMESTAMP": ts(self.write_start),
                "POSIX_F_CLOSE_START_TIMESTAMP": ts(self.close_start),
                "POSIX_F_OPEN_END_TIMESTAMP": ts(self.open_end),
                "POSIX_F_READ_END_TIMESTAMP": ts(self.read_end),
                "POSIX_F_WRITE_END_TIMESTAMP": ts(self.write_end),
                "POSIX_F_CLOSE_END_TIMESTAMP": ts(self.close_end),
                "POSIX_F_READ_TIME": self.read_ns / 1e9,
                "POSIX_F_WRITE_TIME": self.write_ns / 1e9,
                "POSIX_F_META_TIME": self.meta_ns / 1e9,
            }
        )
        return c


class Handle:
    """An open descriptor of a tracked file: its record and the file offset (shared by dups)."""

    __slots__ = ("f", "pos")

    def __init__(self, f: FileStats, pos: int = 0) -> None:
        self.f = f
        self.pos = pos


# --- the per-op trace ring -----------------------------------------------------------------------------
#: One traced operation: (path, op, offset, size, start, end), times in monotonic ns.
TraceOp = tuple[str, str, int, int, int, int]

_trace: collections.deque[TraceOp] | None = None
_trace_dropped = 0


def trace_begin() -> None:
    """Record every operation into the ring from now on (a new ring, its drop count from zero, when
    none is recording)."""
    global _trace, _trace_dropped
    if _trace is None:
        _trace_dropped = 0
        _trace = collections.deque()


def trace_end() -> collections.deque[TraceOp] | None:
    """Stop recording; return the ring (still holding what was not drained), or None."""
    global _trace
    ring = _trace
    _trace = None
    return ring


def trace_ring() -> collections.deque[TraceOp] | None:
    """The ring being recorded, or None."""
    return _trace


def trace_dropped() -> int:
    """Operations the ring dropped while full since the trace began."""
    return _trace_dropped


# --- the recording functions (hot path) ------------------------------------------------------------


def on_read(h: Handle, off: int, n: int, t0: int, t1: int) -> None:
    # the hot path: plain attribute updates, no calls but the trace check (literals, not globals)
    f = h.f
    f.reads += 1
    f.bytes_read += n
    if f.last_io == 2:
        f.rw_switches += 1
    f.last_io = 1
    last = f.last_byte_read
    if off > last:
        f.seq_reads += 1
        if off == last + 1:
            f.consec_reads += 1
    end = off + n - 1
    f.last_byte_read = end
    if end > f.max_byte_read:
        f.max_byte_read = end
    if n < 10240:
        f.size_read[0 if n < 100 else 1 if n < 1024 else 2] += 1
    else:
        f.size_read[_bucket(n)] += 1
    f.read_ns += t1 - t0
    if not f.read_start:
        f.read_start = t0
    f.read_end = t1
    f.dirty = True
    if _trace is not None:
        _trace_op(_trace, f.path, "read", off, n, t0, t1)


def on_write(h: Handle, off: int, n: int, t0: int, t1: int) -> None:
    f = h.f
    f.writes += 1
    f.bytes_written += n
    if f.last_io == _READ:
        f.rw_switches += 1
    f.last_io = _WRITE
    last = f.last_byte_written
    if off == last + 1:
        f.consec_writes += 1
    if off > last:
        f.seq_writes += 1
    end = off + n - 1
    f.last_byte_written = end
    if end > f.max_byte_written:
        f.max_byte_written = end
    f.size_write[_bucket(n)] += 1
    f.write_ns += t1 - t0
    if not f.write_start:
        f.write_start = t0
    f.write_end = t1
    f.dirty = True
    tr = _trace
    if tr is not None:
        _trace_op(tr, f.path, "write", off, n, t0, t1)


def on_open(f: FileStats, t0: int, t1: int) -> None:
    f.opens += 1
    f.meta_ns += t1 - t0
    if not f.open_start:
        f.open_start = t0
    f.open_end = t1
    f.dirty = True
    tr = _trace
    if tr is not None:
        _trace_op(tr, f.path, "open", -1, 0, t0, t1)


def on_close(f: FileStats, t0: int, t1: int) -> None:
    f.meta_ns += t1 - t0
    if not f.close_start:
        f.close_start = t0
    f.close_end = t1
    f.dirty = True
    tr = _trace
    if tr is not None:
        _trace_op(tr, f.path, "close", -1, 0, t0, t1)


def on_meta(f: FileStats, op: str, t0: int, t1: int, off: int = -1) -> None:
    if op == "seek":
        f.seeks += 1
    elif op == "stat":
        f.stats += 1
    elif op == "sync":
        f.fsyncs += 1
    f.meta_ns += t1 - t0
    f.dirty = True
    tr = _trace
    if tr is not None:
        _trace_op(tr, f.path, op, off, 0, t0, t1)


def on_mmap(f: FileStats, off: int, n: int, t0: int, t1: int) -> None:
    f.mmaps += 1
    f.bytes_mapped += n
    if off + n - 1 > f.max_byte_mapped:
        f.max_byte_mapped = off + n - 1
    f.meta_ns += t1 - t0
    f.dirty = True
    tr = _trace
    if tr is not None:
        _trace_op(tr, f.path, "mmap", off, n, t0, t1)


def _trace_op(
    tr: collections.deque[TraceOp],
    path: str,
    op: str,
    off: int,
    n: int,
    t0: int,
    t1: int,
) -> None:
    global _trace_dropped
    if len(tr) >= TRACE_RING:
        _trace_dropped += 1
        return
    tr.append((path, op, off, n, t0, t1))
