"""The Python I/O layer: patches of the interpreter's file calls that count with Darshan's POSIX
semantics (:mod:`holoprof.collect.io_counters`), for the paths that count
(:mod:`holoprof.collect.io_paths`).

- ``builtins.open`` / ``io.open``: files opened by path get an :class:`io.FileIO` subclass as their
  raw layer, so the counted reads and writes are the real ones under the buffers;
- ``os.open``, ``os.read``, ``os.pread``, ``os.write``, ``os.pwrite``, ``os.lseek``, ``os.close``,
  ``os.stat``, ``os.lstat``, ``os.fstat``, ``os.fsync``, ``mmap.mmap``;
- ``os.rename``, ``os.replace``: a counted file's counters move to its new name;
- ``numpy.fromfile`` (and so ``np.load`` of ``.npy`` files), whose reads happen in C on a duplicate
  descriptor: it counts as one read of the bytes it consumed.

The patches are installed by :class:`holoprof.collect.io_collector.IoCollector`; a failure inside
one turns that collector off (the call itself goes on).

Standard library only: this module loads in every process of a job.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from typing import Any

from holoprof.agent.core import Collector
from holoprof.collect.io_counters import (
    FileStats,
    Handle,
    on_close,
    on_meta,
    on_mmap,
    on_open,
    on_read,
    on_write,
)
from holoprof.collect.io_paths import PathPolicy, path_key

_perf = time.perf_counter_ns

# --- the traced raw file -----------------------------------------------------------------------------
_fio_readinto = io.FileIO.readinto
_fio_read = io.FileIO.read
_fio_readall = io.FileIO.readall
_fio_write = io.FileIO.write
_fio_seek = io.FileIO.seek
_fio_close = io.FileIO.close
_os_lseek = os.lseek


class TracedFileIO(io.FileIO):
    """``io.FileIO`` that counts its reads, writes, seeks and close on a :class:`FileStats`."""

    _hp: Handle | None = None

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
                on_read(h, off, n, t0, t1)
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
                on_read(h, off, n, t0, t1)
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
                    on_read(h, off, n, t0, t1)
                    on_read(h, off + n, 0, t1, t1)
                else:
                    on_read(h, off, 0, t0, t1)
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
                on_write(h, off, n, t0, t1)
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
            on_meta(h.f, "seek", t0, t1, r)
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
                on_close(h.f, t0, t1)
            except Exception as exc:
                _fail(exc)


# --- process-wide state ------------------------------------------------------------------------------
_files: dict[str, FileStats] = {}
_fds: dict[int, Handle] = {}
_policy: PathPolicy | None = None
_active: Collector | None = None


def activate(collector: Collector) -> None:
    """The collector that a failure in a patched call turns off (and whose faults are injected)."""
    global _active
    _active = collector


def set_policy(policy: PathPolicy | None) -> None:
    """Count the paths that ``policy`` keeps from now on; None: count nothing new."""
    global _policy
    _policy = policy


def tracked_files() -> list[FileStats]:
    """The record of every file counted in this process."""
    return list(_files.values())


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
        h = Handle(f, pos)
        raw._hp = h
        _fds[raw.fileno()] = h
        on_open(f, t0, t1)
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


def make_open(orig_open: Callable[..., Any]) -> Callable[..., Any]:
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
def os_patches() -> dict[str, Callable[..., Any]]:
    """The traced ``os`` functions, by name, wrapping the current ones (install in this order)."""
    opens, reads, writes = _open_patches(), _read_patches(), _write_patches()
    fd_meta, stats = _fd_meta_patches(), _stat_patches()
    return {
        "open": opens["open"],
        "read": reads["read"],
        "pread": reads["pread"],
        "write": writes["write"],
        "pwrite": writes["pwrite"],
        "lseek": fd_meta["lseek"],
        "close": opens["close"],
        "stat": stats["stat"],
        "lstat": stats["lstat"],
        "fstat": fd_meta["fstat"],
        "fsync": fd_meta["fsync"],
        "rename": _renamer(os.rename),
        "replace": _renamer(os.replace),
    }


def _open_patches() -> dict[str, Callable[..., Any]]:
    o_open, o_lseek, o_close = os.open, os.lseek, os.close

    def os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        t0 = _perf()
        fd = o_open(path, flags, mode, dir_fd=dir_fd)
        t1 = _perf()
        if dir_fd is None:
            try:
                f = _stats_for(path)
                if f is not None:
                    pos = o_lseek(fd, 0, 1) if flags & os.O_APPEND else 0
                    _fds[fd] = Handle(f, pos)
                    on_open(f, t0, t1)
            except Exception as exc:
                _fail(exc)
        return fd

    def os_close(fd: int) -> None:
        h = _fds.pop(fd, None)
        if h is None:
            return o_close(fd)
        t0 = _perf()
        try:
            return o_close(fd)
        finally:
            try:
                on_close(h.f, t0, _perf())
            except Exception as exc:
                _fail(exc)

    return {"open": os_open, "close": os_close}


def _read_patches() -> dict[str, Callable[..., Any]]:
    o_read, o_pread = os.read, os.pread

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
            on_read(h, off, k, t0, t1)
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
            on_read(h, offset, len(data), t0, t1)
        except Exception as exc:
            _fail(exc)
        return data

    return {"read": os_read, "pread": os_pread}


def _write_patches() -> dict[str, Callable[..., Any]]:
    o_write, o_pwrite = os.write, os.pwrite

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
            on_write(h, off, k, t0, t1)
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
            on_write(h, offset, k, t0, t1)
        except Exception as exc:
            _fail(exc)
        return k

    return {"write": os_write, "pwrite": os_pwrite}


def _fd_meta_patches() -> dict[str, Callable[..., Any]]:
    o_lseek, o_fstat, o_fsync = os.lseek, os.fstat, os.fsync

    def os_lseek(fd: int, pos: int, how: int) -> int:
        h = _fds.get(fd)
        if h is None:
            return o_lseek(fd, pos, how)
        t0 = _perf()
        r = o_lseek(fd, pos, how)
        t1 = _perf()
        h.pos = r
        try:
            on_meta(h.f, "seek", t0, t1, r)
        except Exception as exc:
            _fail(exc)
        return r

    def os_fstat(fd: int) -> Any:
        h = _fds.get(fd)
        if h is None:
            return o_fstat(fd)
        t0 = _perf()
        r = o_fstat(fd)
        try:
            on_meta(h.f, "stat", t0, _perf())
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
                on_meta(h.f, "sync", t0, _perf())
            except Exception as exc:
                _fail(exc)

    return {"lseek": os_lseek, "fstat": os_fstat, "fsync": os_fsync}


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
            on_meta(f, "stat", t0, _perf())
        except Exception as exc:
            _fail(exc)
        return r

    stat.__wrapped__ = orig  # type: ignore[attr-defined]
    return stat


def _stat_patches() -> dict[str, Callable[..., Any]]:
    o_stat, o_lstat = os.stat, os.lstat
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
                    on_meta(f, "stat", t0, _perf())
                except Exception as exc:
                    _fail(exc)
                return r
        return o_lstat(path, dir_fd=dir_fd)

    return {"stat": os_stat, "lstat": os_lstat}


def make_mmap(orig: type) -> type:
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
                    on_mmap(h.f, int(off or 0), len(m), t0, _perf())
                except Exception as exc:
                    _fail(exc)
            return m

    TracedMmap.__name__ = "mmap"
    TracedMmap.__qualname__ = "mmap"
    TracedMmap.__module__ = "mmap"
    return TracedMmap


def wrap_fromfile(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``numpy.fromfile``: its reads happen in C on a duplicate descriptor; count the bytes it used."""

    def fromfile(file: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = _perf()
        arr = orig(file, *args, **kwargs)
        t1 = _perf()
        try:
            n = int(getattr(arr, "nbytes", 0))
            h: Handle | None = None
            if isinstance(file, (str, bytes, os.PathLike)):
                f = _stats_for(file)
                if f is not None:
                    off = int(kwargs.get("offset", 0) or 0)
                    on_read(Handle(f, off), off, n, t0, t1)
            else:
                try:
                    h = _fds.get(file.fileno())
                except Exception:
                    h = None
                if h is not None:
                    # numpy moved the file to just after what it read
                    on_read(h, max(0, h.pos - n), n, t0, t1)
        except Exception as exc:
            _fail(exc)
        return arr

    fromfile.__wrapped__ = orig  # type: ignore[attr-defined]
    fromfile.__doc__ = orig.__doc__
    return fromfile
