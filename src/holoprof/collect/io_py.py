"""I/O, always on: Darshan-style POSIX counters per file, per process.

Two layers produce the same rows of the ``io_files`` table:

* **native** — ``libholoprof_io.so`` (:mod:`holoprof.collect.io_native`), preloaded into the job,
  counts at the C library. When it is loaded in this process, the collector only reads its counters
  at each flush (:func:`holoprof.collect.io_native.changes`).
* **python** — otherwise (or with the agent option ``io_layer="python"``), this module patches the
  file calls of the interpreter and counts with Darshan's POSIX semantics:

  - ``builtins.open`` / ``io.open``: files opened by path get an :class:`io.FileIO` subclass as their
    raw layer, so the counted reads and writes are the real ones under the buffers;
  - ``os.open``, ``os.read``, ``os.pread``, ``os.write``, ``os.pwrite``, ``os.lseek``, ``os.close``,
    ``os.stat``, ``os.lstat``, ``os.fstat``, ``os.fsync``, ``mmap.mmap``;
  - ``os.rename``, ``os.replace``: a counted file's counters move to its new name;
  - ``numpy.fromfile`` (and so ``np.load`` of ``.npy`` files), whose reads happen in C on a duplicate
    descriptor: it counts as one read of the bytes it consumed.

Counters (Darshan's names): ``POSIX_OPENS``, ``POSIX_READS``, ``POSIX_WRITES``, ``POSIX_SEEKS``,
``POSIX_STATS``, ``POSIX_FSYNCS``, ``POSIX_MMAPS``, ``POSIX_BYTES_MAPPED``, ``POSIX_MAX_BYTE_MAPPED``,
``POSIX_BYTES_READ``, ``POSIX_BYTES_WRITTEN``,
``POSIX_MAX_BYTE_READ``, ``POSIX_MAX_BYTE_WRITTEN``, ``POSIX_CONSEC_*``, ``POSIX_SEQ_*``,
``POSIX_RW_SWITCHES``, the ten ``POSIX_SIZE_READ_*`` / ``POSIX_SIZE_WRITE_*`` buckets, and the float
counters ``POSIX_F_READ_TIME``, ``POSIX_F_WRITE_TIME``, ``POSIX_F_META_TIME`` (seconds) and the
``POSIX_F_{OPEN,READ,WRITE,CLOSE}_{START,END}_TIMESTAMP`` (seconds since the epoch).

Noise filtering (both layers): the interpreter's own files (``sys.prefix``, ``sys.base_prefix``,
site-packages, the standard library), the files of any other Python installation
(:func:`python_env_path`: site-packages, dist-info, ``__pycache__``, ``lib/pythonX.Y``, Python sources
``.py``/``.pyc`` anywhere: the program being imported), ``/proc``, ``/sys``, ``/dev`` and the run
directory are left out unless ``--io-include PREFIX`` brings them back; ``--io-exclude PREFIX`` leaves
out more.

The hot path (a read) does a few integer updates on a per-file record; rows are built on the writer
thread, which writes a cumulative snapshot of the files that changed since the last flush.
Counters are updated without a lock: two threads reading the same file at the same instant may lose
an increment, as in Darshan without its lock.

Standard library only: this module loads in every process of a job.
"""

from __future__ import annotations

import builtins
import collections
import io
import mmap
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from holoprof import model
from holoprof.agent.core import Agent, Collector

if TYPE_CHECKING:  # pragma: no cover
    from holoprof.collect.control import Job

_perf = time.perf_counter_ns

#: Agent option: "auto" (native when the library is loaded here, else python), "python", "native".
OPTION_LAYER: Final = "io_layer"
OPTION_INCLUDE: Final = "io_include"
OPTION_EXCLUDE: Final = "io_exclude"
OPTION_TRACE: Final = "io_trace"
#: Operations kept by the Python layer's trace ring between two flushes (older ones are dropped).
TRACE_RING: Final = 200_000
TRACE_MAX_SECONDS: Final = 600

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


class _Handle:
    """An open descriptor of a tracked file: its record and the file offset (shared by dups)."""

    __slots__ = ("f", "pos")

    def __init__(self, f: FileStats, pos: int = 0) -> None:
        self.f = f
        self.pos = pos


# --- the recording functions (hot path) ------------------------------------------------------------
_trace: collections.deque[tuple[str, str, int, int, int, int]] | None = None
_trace_dropped = 0


def _on_read(h: _Handle, off: int, n: int, t0: int, t1: int) -> None:
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


def _on_write(h: _Handle, off: int, n: int, t0: int, t1: int) -> None:
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


def _on_open(f: FileStats, t0: int, t1: int) -> None:
    f.opens += 1
    f.meta_ns += t1 - t0
    if not f.open_start:
        f.open_start = t0
    f.open_end = t1
    f.dirty = True
    tr = _trace
    if tr is not None:
        _trace_op(tr, f.path, "open", -1, 0, t0, t1)


def _on_close(f: FileStats, t0: int, t1: int) -> None:
    f.meta_ns += t1 - t0
    if not f.close_start:
        f.close_start = t0
    f.close_end = t1
    f.dirty = True
    tr = _trace
    if tr is not None:
        _trace_op(tr, f.path, "close", -1, 0, t0, t1)


def _on_meta(f: FileStats, op: str, t0: int, t1: int, off: int = -1) -> None:
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


def _on_mmap(f: FileStats, off: int, n: int, t0: int, t1: int) -> None:
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
    tr: collections.deque[tuple[str, str, int, int, int, int]],
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


# --- path policy -------------------------------------------------------------------------------------
def _norm_prefix(p: str) -> str:
    p = os.path.abspath(os.path.expanduser(p))
    return p.rstrip("/") or "/"


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p if p.endswith("/") else p + "/") for p in prefixes)


def default_excludes(run_dir: str | None = None) -> list[str]:
    """Prefixes left out by default: the interpreter's own files, pseudo file systems, the run."""
    out = ["/proc", "/sys", "/dev"]
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        if p:
            out.append(p)
    try:
        paths = sysconfig.get_paths()
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            if paths.get(key):
                out.append(paths[key])
    except Exception:
        pass
    try:
        import site

        out += list(site.getsitepackages())
        user = site.getusersitepackages()
        if isinstance(user, str):
            out.append(user)
    except Exception:
        pass
    for p in sys.path:  # other site-packages on the path (a venv's, a --user install's)
        if p and ("site-packages" in p or "dist-packages" in p):
            out.append(p)
    out.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holoprof itself
    if run_dir:
        out.append(run_dir)
    seen: list[str] = []
    for p in out:
        q = _norm_prefix(p)
        if q not in seen:
            seen.append(q)
    return seen


#: Python source and bytecode: the interpreter reading the program itself (the script, its imports).
_SOURCE_SUFFIXES: Final = (".py", ".pyc", ".pyi", ".pth")
#: Directories that only Python installations have.
_ENV_DIRS: Final = frozenset(("site-packages", "dist-packages", "__pycache__"))
_ENV_DIR_SUFFIXES: Final = (".dist-info", ".egg-info")


def python_env_path(path: str) -> bool:
    """A file of a Python installation, whichever interpreter it belongs to (a job's own virtual
    environment, a conda env, the system Python): under a ``site-packages``, ``dist-packages``,
    ``__pycache__``, ``*.dist-info`` or ``*.egg-info`` directory, in a standard library
    (``lib/pythonX.Y``, ``lib64/pythonX.Y``), a ``pyvenv.cfg``, or Python source and bytecode.
    The native library applies the same rules (``python_env_path`` in ``io_native/hp_paths.c``)."""
    if path.endswith(_SOURCE_SUFFIXES) or path.endswith("/pyvenv.cfg"):
        return True
    prev = ""
    for c in path.split("/")[:-1]:
        if c in _ENV_DIRS or c.endswith(_ENV_DIR_SUFFIXES):
            return True
        if prev in ("lib", "lib64") and len(c) > 6 and c.startswith("python") and c[6].isdigit():
            return True
        prev = c
    return False


class PathPolicy:
    """Which paths are counted: user excludes > user includes > default excludes > everything else."""

    def __init__(
        self, include: list[str] | None = None, exclude: list[str] | None = None, run_dir: str | None = None
    ) -> None:
        self.include = tuple(_norm_prefix(p) for p in include or [])
        self.exclude = tuple(_norm_prefix(p) for p in exclude or [])
        self.defaults = tuple(default_excludes(run_dir))
        self._cache: dict[str, bool] = {}

    def keep(self, path: str) -> bool:
        k = self._cache.get(path)
        if k is None:
            k = self._decide(path)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[path] = k
        return k

    def _decide(self, path: str) -> bool:
        if _under(path, self.exclude):
            return False
        if _under(path, self.include):
            return True
        return not (python_env_path(path) or _under(path, self.defaults))


def path_key(file: Any) -> str | None:
    """The normalised text of a path argument (as the native layer writes it), or None."""
    try:
        p = os.fspath(file)
    except TypeError:
        return None
    if isinstance(p, bytes):
        raw = p
        p = os.fsdecode(p)
    else:
        raw = None
    if not p:
        return None
    p = os.path.abspath(p)
    if not p.isascii():
        raw = os.fsencode(p)
        return raw.decode("utf-8", "backslashreplace")
    return p


# --- the traced raw file -----------------------------------------------------------------------------
_FileIO = io.FileIO
_fio_readinto = io.FileIO.readinto
_fio_read = io.FileIO.read
_fio_readall = io.FileIO.readall
_fio_write = io.FileIO.write
_fio_seek = io.FileIO.seek
_fio_close = io.FileIO.close
_os_lseek = os.lseek


class TracedFileIO(io.FileIO):
    """``io.FileIO`` that counts its reads, writes, seeks and close on a :class:`FileStats`."""

    _hp: _Handle | None = None

    def readinto(self, b: Any) -> Any:
        h = self._hp
        if h is None:
            return _fio_readinto(self, b)
        t0 = _perf()
        n = _fio_readinto(self, b)
        t1 = _perf()
        if n is not None:
            off = h.pos
            h.pos = off + n
            try:
                _on_read(h, off, n, t0, t1)
            except Exception as exc:
                _fail(exc)
        return n

    def read(self, size: int | None = -1) -> Any:
        h = self._hp
        if h is None:
            return _fio_read(self, size)
        if size is None or size < 0:
            return self.readall()
        t0 = _perf()
        data = _fio_read(self, size)
        t1 = _perf()
        if data is not None:
            off = h.pos
            n = len(data)
            h.pos = off + n
            try:
                _on_read(h, off, n, t0, t1)
            except Exception as exc:
                _fail(exc)
        return data

    def readall(self) -> Any:
        h = self._hp
        if h is None:
            return _fio_readall(self)
        t0 = _perf()
        data = _fio_readall(self)
        t1 = _perf()
        if data is not None:
            # FileIO.readall reads until a read returns 0 bytes: for a regular file, one read of the
            # rest of the file and one at the end (the time goes to the first).
            off = h.pos
            n = len(data)
            h.pos = off + n
            try:
                if n:
                    _on_read(h, off, n, t0, t1)
                    _on_read(h, off + n, 0, t1, t1)
                else:
                    _on_read(h, off, 0, t0, t1)
            except Exception as exc:
                _fail(exc)
        return data

    def write(self, b: Any) -> Any:
        h = self._hp
        if h is None:
            return _fio_write(self, b)
        t0 = _perf()
        n = _fio_write(self, b)
        t1 = _perf()
        if n is not None:
            off = h.pos
            h.pos = off + n
            try:
                _on_write(h, off, n, t0, t1)
            except Exception as exc:
                _fail(exc)
        return n

    def seek(self, pos: int, whence: int = 0) -> int:
        h = self._hp
        if h is None:
            return _fio_seek(self, pos, whence)
        t0 = _perf()
        r = _fio_seek(self, pos, whence)
        t1 = _perf()
        h.pos = r
        try:
            _on_meta(h.f, "seek", t0, t1, r)
        except Exception as exc:
            _fail(exc)
        return r

    def close(self) -> None:
        h = self._hp
        if h is None or self.closed:
            return _fio_close(self)
        self._hp = None
        try:
            fd = self.fileno()
        except (OSError, ValueError):
            fd = -1
        t0 = _perf()
        try:
            _fio_close(self)
        finally:
            t1 = _perf()
            try:
                if _fds.get(fd) is h:
                    del _fds[fd]
                _on_close(h.f, t0, t1)
            except Exception as exc:
                _fail(exc)


# --- process-wide state ------------------------------------------------------------------------------
_files: dict[str, FileStats] = {}
_fds: dict[int, _Handle] = {}
_policy: PathPolicy | None = None
_active: IoCollector | None = None


def _fail(exc: BaseException) -> None:
    c = _active
    if c is not None:
        try:
            c.agent.fail(c, exc)
        except Exception:
            pass


def _stats_for(file: Any) -> FileStats | None:
    """The record of a path argument, or None when it is not counted."""
    pol = _policy
    if pol is None or isinstance(file, int):
        return None
    key = path_key(file)
    if key is None or not pol.keep(key):
        return None
    f = _files.get(key)
    if f is None:
        f = _files[key] = FileStats(key)
    return f


def _open_traced(
    f: FileStats,
    file: Any,
    mode: str,
    buffering: int,
    encoding: str | None,
    errors: str | None,
    newline: str | None,
    closefd: bool,
    opener: Any,
) -> Any:
    """``io.open`` with a :class:`TracedFileIO` raw layer (the logic of ``_pyio.open``)."""
    modes = set(mode)
    creating, reading, writing = "x" in modes, "r" in modes, "w" in modes
    appending, updating = "a" in modes, "+" in modes
    binary = "b" in modes
    rawmode = (
        ("x" if creating else "")
        + ("r" if reading else "")
        + ("w" if writing else "")
        + ("a" if appending else "")
        + ("+" if updating else "")
    )
    t0 = _perf()
    raw = TracedFileIO(file, rawmode, closefd, opener=opener)
    t1 = _perf()
    result: Any = raw
    try:
        pos = 0
        if appending:
            try:
                pos = _os_lseek(raw.fileno(), 0, os.SEEK_CUR)
            except OSError:
                pos = 0
        h = _Handle(f, pos)
        raw._hp = h
        _fds[raw.fileno()] = h
        _on_open(f, t0, t1)
        line_buffering = False
        if buffering == 1 or (buffering < 0 and raw.isatty()):
            buffering = -1
            line_buffering = True
        if buffering < 0:
            blk = getattr(raw, "_blksize", 0)
            buffering = blk if blk > 1 else io.DEFAULT_BUFFER_SIZE
        if buffering == 0:
            if binary:
                return result
            raise ValueError("can't have unbuffered text I/O")
        buffer: Any
        if updating:
            buffer = io.BufferedRandom(raw, buffering)
        elif creating or writing or appending:
            buffer = io.BufferedWriter(raw, buffering)
        else:
            buffer = io.BufferedReader(raw, buffering)
        result = buffer
        if binary:
            return result
        wrapper = io.TextIOWrapper(buffer, encoding, errors, newline, line_buffering)
        result = wrapper
        wrapper.mode = mode  # type: ignore[misc]
        return result
    except BaseException:
        result.close()
        raise


_VALID_MODE = frozenset("axrwb+t")


def _plain_mode(mode: str, encoding: Any, errors: Any, newline: Any) -> bool:
    """A valid ``open`` mode that :func:`_open_traced` handles (anything else goes to the original)."""
    modes = set(mode)
    if modes - _VALID_MODE or len(mode) != len(modes) or len(modes & {"r", "w", "a", "x"}) != 1:
        return False
    return not ("t" in modes and "b" in modes) and not ("b" in modes and (encoding or errors or newline))


def _make_open(orig_open: Callable[..., Any]) -> Callable[..., Any]:
    def open(
        file: Any,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
        closefd: bool = True,
        opener: Any = None,
    ) -> Any:
        f = None
        if not isinstance(file, int) and type(mode) is str:
            try:
                if _plain_mode(mode, encoding, errors, newline):
                    f = _stats_for(file)
                    if f is not None and _active is not None and _active.fault_at:
                        _active.inject("open")
            except Exception as exc:
                _fail(exc)
                f = None
        if f is None:
            return orig_open(file, mode, buffering, encoding, errors, newline, closefd, opener)
        return _open_traced(f, file, mode, buffering, encoding, errors, newline, closefd, opener)

    open.__doc__ = orig_open.__doc__
    open.__wrapped__ = orig_open  # type: ignore[attr-defined]
    return open


def _renamed(src: Any, dst: Any) -> None:
    """A counted file was renamed: its counters move to the new name (a file written under a
    temporary name and renamed into place is counted under its final name; the old name is left with
    zeros), and descriptors still open on it follow."""
    key = path_key(src)
    f = _files.get(key) if key is not None else None
    if f is None:
        return
    g = _stats_for(dst)
    if g is None or g is f:
        return
    g.merge(f)
    f.reset()
    f.dirty = True
    for h in list(_fds.values()):
        if h.f is f:
            h.f = g


def _renamer(orig: Callable[..., Any]) -> Callable[..., Any]:
    def rename(src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        orig(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        if src_dir_fd is None and dst_dir_fd is None:
            try:
                _renamed(src, dst)
            except Exception as exc:
                _fail(exc)

    rename.__wrapped__ = orig  # type: ignore[attr-defined]
    rename.__doc__ = orig.__doc__
    return rename


# --- os-level patches --------------------------------------------------------------------------------
def _os_patches() -> dict[str, Callable[..., Any]]:
    o_open, o_read, o_pread = os.open, os.read, os.pread
    o_write, o_pwrite, o_lseek, o_close = os.write, os.pwrite, os.lseek, os.close
    o_stat, o_lstat, o_fstat, o_fsync = os.stat, os.lstat, os.fstat, os.fsync

    def os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        t0 = _perf()
        fd = o_open(path, flags, mode, dir_fd=dir_fd)
        t1 = _perf()
        if dir_fd is None:
            try:
                f = _stats_for(path)
                if f is not None:
                    pos = o_lseek(fd, 0, 1) if flags & os.O_APPEND else 0
                    _fds[fd] = _Handle(f, pos)
                    _on_open(f, t0, t1)
            except Exception as exc:
                _fail(exc)
        return fd

    def os_read(fd: int, n: int) -> bytes:
        h = _fds.get(fd)
        if h is None:
            return o_read(fd, n)
        t0 = _perf()
        data = o_read(fd, n)
        t1 = _perf()
        off = h.pos
        k = len(data)
        h.pos = off + k
        try:
            _on_read(h, off, k, t0, t1)
        except Exception as exc:
            _fail(exc)
        return data

    def os_pread(fd: int, n: int, offset: int) -> bytes:
        h = _fds.get(fd)
        if h is None:
            return o_pread(fd, n, offset)
        t0 = _perf()
        data = o_pread(fd, n, offset)
        t1 = _perf()
        try:
            _on_read(h, offset, len(data), t0, t1)
        except Exception as exc:
            _fail(exc)
        return data

    def os_write(fd: int, data: Any) -> int:
        h = _fds.get(fd)
        if h is None:
            return o_write(fd, data)
        t0 = _perf()
        k = o_write(fd, data)
        t1 = _perf()
        off = h.pos
        h.pos = off + k
        try:
            _on_write(h, off, k, t0, t1)
        except Exception as exc:
            _fail(exc)
        return k

    def os_pwrite(fd: int, data: Any, offset: int) -> int:
        h = _fds.get(fd)
        if h is None:
            return o_pwrite(fd, data, offset)
        t0 = _perf()
        k = o_pwrite(fd, data, offset)
        t1 = _perf()
        try:
            _on_write(h, offset, k, t0, t1)
        except Exception as exc:
            _fail(exc)
        return k

    def os_lseek(fd: int, pos: int, how: int) -> int:
        h = _fds.get(fd)
        if h is None:
            return o_lseek(fd, pos, how)
        t0 = _perf()
        r = o_lseek(fd, pos, how)
        t1 = _perf()
        h.pos = r
        try:
            _on_meta(h.f, "seek", t0, t1, r)
        except Exception as exc:
            _fail(exc)
        return r

    def os_close(fd: int) -> None:
        h = _fds.pop(fd, None)
        if h is None:
            return o_close(fd)
        t0 = _perf()
        try:
            return o_close(fd)
        finally:
            try:
                _on_close(h.f, t0, _perf())
            except Exception as exc:
                _fail(exc)

    def _stat_of(orig: Callable[..., Any]) -> Callable[..., Any]:
        def stat(path: Any, *, dir_fd: int | None = None, follow_symlinks: bool = True) -> Any:
            if isinstance(path, int):
                h = _fds.get(path)
                if h is None:
                    return orig(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
                f: FileStats | None = h.f
            elif dir_fd is None:
                try:
                    f = _stats_for(path)
                except Exception as exc:
                    _fail(exc)
                    f = None
            else:
                f = None
            if f is None:
                return orig(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
            t0 = _perf()
            r = orig(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
            try:
                _on_meta(f, "stat", t0, _perf())
            except Exception as exc:
                _fail(exc)
            return r

        stat.__wrapped__ = orig  # type: ignore[attr-defined]
        return stat

    os_stat = _stat_of(o_stat)

    def os_lstat(path: Any, *, dir_fd: int | None = None) -> Any:
        if dir_fd is None and not isinstance(path, int):
            try:
                f = _stats_for(path)
            except Exception as exc:
                _fail(exc)
                f = None
            if f is not None:
                t0 = _perf()
                r = o_lstat(path)
                try:
                    _on_meta(f, "stat", t0, _perf())
                except Exception as exc:
                    _fail(exc)
                return r
        return o_lstat(path, dir_fd=dir_fd)

    def os_fstat(fd: int) -> Any:
        h = _fds.get(fd)
        if h is None:
            return o_fstat(fd)
        t0 = _perf()
        r = o_fstat(fd)
        try:
            _on_meta(h.f, "stat", t0, _perf())
        except Exception as exc:
            _fail(exc)
        return r

    def os_fsync(fd: Any) -> None:
        try:
            n = fd if isinstance(fd, int) else fd.fileno()
        except Exception:
            return o_fsync(fd)
        h = _fds.get(n)
        if h is None:
            return o_fsync(fd)
        t0 = _perf()
        try:
            return o_fsync(fd)
        finally:
            try:
                _on_meta(h.f, "sync", t0, _perf())
            except Exception as exc:
                _fail(exc)

    return {
        "open": os_open,
        "read": os_read,
        "pread": os_pread,
        "write": os_write,
        "pwrite": os_pwrite,
        "lseek": os_lseek,
        "close": os_close,
        "stat": os_stat,
        "lstat": os_lstat,
        "fstat": os_fstat,
        "fsync": os_fsync,
        "rename": _renamer(os.rename),
        "replace": _renamer(os.replace),
    }


def _make_mmap(orig: type) -> type:
    class TracedMmap(orig):
        """``mmap.mmap`` that counts the mapping of a tracked file (POSIX_MMAPS, POSIX_BYTES_MAPPED:
        the length mapped, ``len(m)``; ``numpy.memmap`` maps through it)."""

        def __new__(cls, fileno: int, *args: Any, **kwargs: Any) -> Any:
            t0 = _perf()
            m = super().__new__(cls, fileno, *args, **kwargs)
            h = _fds.get(fileno) if isinstance(fileno, int) else None
            if h is not None:
                try:
                    off = kwargs.get("offset", args[4] if len(args) > 4 else 0)
                    _on_mmap(h.f, int(off or 0), len(m), t0, _perf())
                except Exception as exc:
                    _fail(exc)
            return m

    TracedMmap.__name__ = "mmap"
    TracedMmap.__qualname__ = "mmap"
    TracedMmap.__module__ = "mmap"
    return TracedMmap


def _wrap_fromfile(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``numpy.fromfile``: its reads happen in C on a duplicate descriptor; count the bytes it used."""

    def fromfile(file: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = _perf()
        arr = orig(file, *args, **kwargs)
        t1 = _perf()
        try:
            n = int(getattr(arr, "nbytes", 0))
            h: _Handle | None = None
            if isinstance(file, (str, bytes, os.PathLike)):
                f = _stats_for(file)
                if f is not None:
                    off = int(kwargs.get("offset", 0) or 0)
                    _on_read(_Handle(f, off), off, n, t0, t1)
            else:
                try:
                    h = _fds.get(file.fileno())
                except Exception:
                    h = None
                if h is not None:
                    # numpy moved the file to just after what it read
                    _on_read(h, max(0, h.pos - n), n, t0, t1)
        except Exception as exc:
            _fail(exc)
        return arr

    fromfile.__wrapped__ = orig  # type: ignore[attr-defined]
    fromfile.__doc__ = orig.__doc__
    return fromfile


# --- the collector -----------------------------------------------------------------------------------
def _native() -> ModuleType | None:
    try:
        from holoprof.collect import io_native

        return io_native
    except Exception:
        return None


class IoCollector(Collector):
    """Per-file I/O counters of this process, from the native layer when loaded, else from Python."""

    name = "io"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self._final_dumped = False
        opts = agent.options
        self.policy = PathPolicy(
            list(opts.get(OPTION_INCLUDE) or []), list(opts.get(OPTION_EXCLUDE) or []), agent.run_dir
        )
        want = str(opts.get(OPTION_LAYER) or "auto")
        self.native: ModuleType | None = None
        if want != "python":
            nat = _native()
            try:
                if nat is not None and nat.available():
                    self.native = nat
            except Exception:
                self.native = None
        self.layer = "native" if self.native is not None else "python"
        self._since = 0
        self._trace_until_ns: int | None = None  # monotonic deadline of an on-demand trace
        self._trace_all = bool(opts.get(OPTION_TRACE))
        self._trace_jobs: list[tuple[int, Any]] = []
        self._tail: collections.deque[tuple[str, str, int, int, int, int]] | None = None
        self._lock = threading.Lock()

    # -- install -----------------------------------------------------------------------------------
    def install(self) -> None:
        global _policy, _active
        _active = self
        self.agent.info["io_layer"] = self.layer
        self.agent.pollers.append(self.poll)
        self._claim_native()
        if self.native is None:
            _policy = self.policy
            opener = _make_open(builtins.open)
            self._set(builtins, "open", opener)
            self._set(io, "open", opener)
            for name, fn in _os_patches().items():
                self._set(os, name, fn)
            self._set(mmap, "mmap", _make_mmap(mmap.mmap))
            from holoprof.agent.setup import post_import_finder

            post_import_finder().add("numpy", self._on_numpy)
        if self._trace_all:
            self.trace_start()
        self.inject("install")

    def _on_numpy(self, numpy: ModuleType) -> None:
        if not self.enabled or self.native is not None:
            return
        try:
            orig = getattr(numpy, "fromfile", None)
            if orig is not None and not hasattr(orig, "__wrapped__"):
                self._set(numpy, "fromfile", _wrap_fromfile(orig))
        except Exception as exc:
            self.agent.fail(self, exc)

    def turn_off(self) -> None:
        global _policy, _trace
        super().turn_off()
        _policy = None
        _trace = None

    def after_fork_child(self) -> None:
        """The child starts with zero counters; files opened before the fork stay tracked."""
        for f in list(_files.values()):
            f.reset()
        if _trace is not None:
            _trace.clear()
        self._trace_jobs = []
        self._since = 0
        self._claim_native()

    def _claim_native(self) -> None:
        """This process is read in process: the native library (when loaded) writes no dump at exit,
        also when the Python layer was chosen (its counters would be counted twice)."""
        nat = self.native or (_native() if self.layer == "python" else None)
        if nat is None:
            return
        try:
            if nat.available():
                nat.set_owner(True)
        except Exception:
            pass

    # -- per-op trace --------------------------------------------------------------------------------
    def trace_start(self, seconds: float | None = None) -> None:
        global _trace, _trace_dropped
        with self._lock:
            if seconds is not None:
                until = _perf() + int(seconds * 1e9)
                if self._trace_until_ns is None or until > self._trace_until_ns:
                    self._trace_until_ns = until
            if _trace is None:
                _trace_dropped = 0
                _trace = collections.deque()
            if self.native is not None:
                self.native.trace_start(1_000_000)

    def trace_stop(self) -> None:
        global _trace
        with self._lock:
            self._trace_until_ns = None
            if self._trace_all:
                return
            if self.native is not None:
                self.native.trace_stop()
            # keep the ring until the next flush drains it
            if _trace is not None:
                self._tail = _trace
            _trace = None

    @property
    def tracing(self) -> bool:
        return _trace is not None or self._trace_all

    def _drain_ops(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        off = self.agent.clock_offset_ns
        rings = []
        tail = self._tail
        if tail is not None:
            rings.append(tail)
            self._tail = None
        if _trace is not None:
            rings.append(_trace)
        pol = self.policy
        for ring in rings:
            while ring:
                path, op, o, n, t0, t1 = ring.popleft()
                rows.append(
                    {
                        "module": "POSIX",
                        "path": path,
                        "op": op,
                        "offset": o,
                        "size_bytes": n,
                        "start_ns": t0 + off,
                        "end_ns": t1 + off,
                    }
                )
        if self.native is not None:
            while True:
                got = self.native.trace_drain(65536)
                rows += [r for r in got if pol.keep(str(r.get("path", "")))]
                if len(got) < 65536:
                    break
        return rows

    # -- the poller (writer thread) ----------------------------------------------------------------
    def poll(self) -> list[tuple[str, dict[str, list[Any]]]]:
        out: list[tuple[str, dict[str, list[Any]]]] = []
        if not self.enabled:
            return out
        rows = self.native_rows() if self.native is not None else self.python_rows()
        if rows:
            out.append(("io_files", _columns(rows, ("ts_ns", "module", "layer", "path", "counters"))))
        until = self._trace_until_ns
        if until is not None and _perf() >= until:
            self.trace_stop()
            self._finish_jobs()
        ops = self._drain_ops()
        if ops:
            out.append(
                (
                    "io_ops",
                    _columns(ops, ("module", "path", "op", "offset", "size_bytes", "start_ns", "end_ns")),
                )
            )
        return out

    def _finish_jobs(self) -> None:
        jobs, self._trace_jobs = self._trace_jobs, []
        for _, job in jobs:
            try:
                job.done(layer=self.layer, dropped=_trace_dropped)
            except Exception:
                pass

    def python_rows(self) -> list[dict[str, Any]]:
        import json

        ts = time.time_ns()
        off = self.agent.clock_offset_ns
        rows = []
        for f in list(_files.values()):
            if not f.dirty:
                continue
            f.dirty = False
            rows.append(
                {
                    "ts_ns": ts,
                    "module": "POSIX",
                    "layer": "python",
                    "path": f.path,
                    "counters": json.dumps(f.counters(off)),
                }
            )
        return rows

    def native_rows(self) -> list[dict[str, Any]]:
        import json

        assert self.native is not None
        if self._final_dumped:
            return []  # the library wrote the final counters itself (see finish)
        got, self._since = self.native.changes(self._since)
        pol = self.policy
        return [{**r, "counters": json.dumps(r["counters"])} for r in got if pol.keep(str(r.get("path", "")))]

    def finish(self) -> None:
        if self._trace_jobs:
            self.trace_stop()
            self._finish_jobs()
        # At exit the native library writes this process's final counters itself, in C: a DataLoader
        # worker reading thousands of files must not spend its last moments (which the training loop
        # waits for) serializing them in Python. The launcher (or holoprof.stop) imports the dump.
        if self.native is not None and self.enabled:
            try:
                self._final_dumped = bool(self.native.dump())
            except Exception:
                self._final_dumped = False


def _columns(rows: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, list[Any]]:
    return {k: [r.get(k) for r in rows] for k in names}


def collector(agent: Agent) -> IoCollector:
    return IoCollector(agent)


# --- on-demand trace (the control mailbox) -----------------------------------------------------------
def _io_collector(agent: Agent) -> IoCollector | None:
    for c in agent.collectors:
        if isinstance(c, IoCollector) and c.enabled:
            return c
    return None


def _seconds(request: Any) -> int:
    params = request.get("params") if isinstance(request, dict) else None
    raw = (params or {}).get("seconds", request.get("seconds") if isinstance(request, dict) else None)
    if raw is None:
        raw = 10
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= TRACE_MAX_SECONDS:
        raise ValueError(f"io-trace: seconds must be an integer from 1 to {TRACE_MAX_SECONDS}, got {raw!r}")
    return raw


def io_trace_action(agent: Agent, request: dict[str, Any]) -> dict[str, Any]:
    """Trace every I/O operation of this process for ``params.seconds`` (1..600) into ``io_ops``.

    Both layers: the native ring (``io_native.trace_start``) when the library is loaded, the Python
    ring otherwise. The trace stops by itself after the window (checked at each flush, about once a
    second); what was recorded is written as ``io_ops`` rows at the flushes. Returns a summary.
    """
    seconds = _seconds(request)
    col = _io_collector(agent)
    if col is None:
        raise RuntimeError("the I/O collector is not running in this process")
    col.trace_start(seconds)
    return {"layer": col.layer, "seconds": seconds, "until_ns": time.time_ns() + seconds * 1_000_000_000}


def io_trace_job(job: Job) -> None:
    """The ``io-trace`` handler for :data:`holoprof.collect.control.ACTIONS`: done when the window ends."""
    info = io_trace_action(job.agent, {"params": dict(job.params)})
    job.running(**info)
    col = _io_collector(job.agent)
    if col is not None:
        col._trace_jobs.append((info["until_ns"], job))
