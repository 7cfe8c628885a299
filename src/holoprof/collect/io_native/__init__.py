"""Native I/O capture: Darshan-style POSIX and STDIO counters from an ``LD_PRELOAD`` library.

``libholoprof_io.so`` (built from the ``hp_*.c`` files beside this module by
:mod:`holoprof.collect.io_native.build`) is preloaded into every process of a traced job. It
interposes the C library's file calls and keeps, per file and per module (``POSIX``, ``STDIO``), the
counters of Darshan's POSIX and STDIO modules.
This module is the Python side of it:

* in a process where the library is loaded, :func:`snapshot` / :func:`changes` read the counters and
  :func:`trace_start` / :func:`trace_drain` / :func:`trace_stop` run the per-operation trace;
* for processes that no agent reads (``tar``, ``cat``, a DataLoader worker without an agent), the
  library writes ``$HOLOPROF_RUN_DIR/<host>-<pid>/io_native-<pid>.jsonl`` at exit;
  :func:`read_dump` turns such a file into rows.

Rows have the columns of the ``io_files`` and ``io_ops`` tables (:data:`holoprof.model.COLUMNS`).
Float counters (``*_TIME``, ``*_TIMESTAMP``) are seconds; timestamps are seconds since the epoch.
Paths are absolute and lexically normalised (like :func:`os.path.abspath`); bytes that are not UTF-8
are shown as ``\\xNN`` (see :func:`path_text`).

Only the standard library is imported here: this module loads in every process of a job. The
library's functions are called through the extension module :mod:`holoprof.collect._io_api` where it
was built, else through ``ctypes`` (about 2 ms and 700 objects more per process).
"""

from __future__ import annotations

import os
import struct
import threading
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (this module loads at a process's exit)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Final

__all__ = [
    "ENV_DISABLE",
    "ENV_EXCLUDE",
    "ENV_INCLUDE",
    "ENV_LIB",
    "ENV_MAX_FILES",
    "LIBRARY_NAME",
    "available",
    "changes",
    "dropped",
    "dump",
    "library_path",
    "path_text",
    "preload_env",
    "set_owner",
    "snapshot",
    "trace_drain",
    "trace_dropped",
    "trace_start",
    "trace_stop",
]

LIBRARY_NAME: Final = "libholoprof_io.so"
#: Path of the library to use instead of the one beside this module.
ENV_LIB: Final = "HOLOPROF_IO_LIB"
#: Set to 1 to make the preloaded library pass every call straight through.
ENV_DISABLE: Final = "HOLOPROF_IO_DISABLE"
#: Colon-separated path prefixes the library ignores (replaces the default list; "" ignores none).
ENV_EXCLUDE: Final = "HOLOPROF_IO_EXCLUDE"
#: Colon-separated path prefixes under which files of Python installations are counted after all
#: (`holoprof run --io-include`); elsewhere the library leaves them out (site-packages, dist-info, ...).
ENV_INCLUDE: Final = "HOLOPROF_IO_INCLUDE"
#: Lower the number of file records the library keeps (default and maximum 65536).
ENV_MAX_FILES: Final = "HOLOPROF_IO_MAX_FILES"

MODULES: Final[tuple[str, str]] = ("POSIX", "STDIO")
OPS: Final[tuple[str, ...]] = ("", "open", "close", "read", "write", "seek", "stat", "sync", "mmap", "flush")

_TRACE_REC: Final = struct.Struct("<IBBHqqqq")
_HDR: Final = struct.Struct("<IIHHI")
_NS_PER_S: Final = 1e9


def path_text(raw: bytes) -> str:
    """A path as the rows show it: :func:`holoprof.store.native_dumps.path_text`."""
    # lazy: the dump files' module (it reads JSON) loads with the first path read, not at every exit
    from holoprof.store.native_dumps import path_text as text

    return text(raw)


def library_path() -> str | None:
    """The built ``libholoprof_io.so`` ($HOLOPROF_IO_LIB, else beside this module), or None."""
    override = os.environ.get(ENV_LIB)
    if override:
        return override if os.path.isfile(override) else None
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, LIBRARY_NAME)
    if os.path.isfile(path):
        return path
    # built as a setuptools Extension: libholoprof_io.cpython-311-x86_64-linux-gnu.so and the like
    try:
        names = sorted(n for n in os.listdir(here) if n.startswith("libholoprof_io.") and n.endswith(".so"))
    except OSError:
        return None
    return os.path.join(here, names[0]) if names else None


def preload_env(env: Mapping[str, str] | None = None, lib: str | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: ``os.environ``) whose ``LD_PRELOAD`` starts with the library.

    Returns the copy unchanged when the library is not built.
    """
    out = dict(os.environ if env is None else env)
    lib = lib or library_path()
    if not lib:
        return out
    current = [p for p in out.get("LD_PRELOAD", "").replace(":", " ").split() if p and p != lib]
    out["LD_PRELOAD"] = " ".join([lib, *current])
    return out


# -- the loaded library ---------------------------------------------------------------------------
class _CtypesApi:
    """The library's functions through ``ctypes`` (where ``holoprof.collect._io_api`` was not built),
    with the extension module's signatures: buffers are ``bytearray``, paths ``bytes``."""

    def __init__(self, handle: Any) -> None:
        import ctypes as c  # lazy: only where the extension module is missing

        self.c = c
        f = handle.holoprof_io_snapshot
        f.argtypes = [c.c_void_p, c.c_size_t, c.c_uint64, c.POINTER(c.c_uint64)]
        f.restype = c.c_int64
        self._snapshot = f
        self.set_owner = handle.holoprof_io_set_owner
        self.set_owner.argtypes = [c.c_int]
        self.set_owner.restype = None
        self.dropped = handle.holoprof_io_dropped
        self.dropped.restype = c.c_long
        self._path = handle.holoprof_io_path
        self._path.argtypes = [c.c_uint32, c.c_char_p, c.c_size_t]
        self._path.restype = c.c_int
        self.trace_start = handle.holoprof_io_trace_start
        self.trace_start.argtypes = [c.c_uint64]
        self.trace_start.restype = c.c_int
        self.trace_stop = handle.holoprof_io_trace_stop
        self.trace_stop.restype = None
        self._trace_drain = handle.holoprof_io_trace_drain
        self._trace_drain.argtypes = [c.c_void_p, c.c_uint64]
        self._trace_drain.restype = c.c_int64
        self.trace_dropped = handle.holoprof_io_trace_dropped
        self.trace_dropped.restype = c.c_long
        self.dump = handle.holoprof_io_dump
        self.dump.argtypes = [c.c_char_p]
        self.dump.restype = c.c_int
        self.counter_names = handle.holoprof_io_counter_names
        self.counter_names.argtypes = [c.c_int, c.c_int]
        self.counter_names.restype = c.c_char_p
        self._layout = handle.holoprof_io_layout
        self._layout.argtypes = [c.POINTER(c.c_int), c.POINTER(c.c_int), c.POINTER(c.c_int)]

    @staticmethod
    def bind() -> _CtypesApi | None:
        """The bindings, or None where the library is not loaded in this process."""
        try:
            import ctypes  # lazy: only where the extension module is missing

            handle = ctypes.CDLL(None)
            handle.holoprof_io_snapshot  # noqa: B018 - raises AttributeError when not loaded
        except (OSError, AttributeError):
            return None
        return _CtypesApi(handle)

    def _array(self, buf: bytearray) -> Any:
        return (self.c.c_char * len(buf)).from_buffer(buf)

    def layout(self) -> tuple[int, int, int]:
        c = self.c
        ni, nf, hdr = c.c_int(), c.c_int(), c.c_int()
        self._layout(c.byref(ni), c.byref(nf), c.byref(hdr))
        return ni.value, nf.value, hdr.value

    def snapshot(self, buf: bytearray, since: int) -> tuple[int, int]:
        nxt = self.c.c_uint64(0)
        n = self._snapshot(self._array(buf), len(buf), since, self.c.byref(nxt))
        return int(n), int(nxt.value)

    def trace_drain(self, buf: bytearray, want: int) -> int:
        return int(self._trace_drain(self._array(buf), want))

    def path(self, idx: int) -> bytes:
        buf = self.c.create_string_buffer(4096)
        n = self._path(idx, buf, len(buf))
        if n < 0:
            buf = self.c.create_string_buffer(-n)
            n = self._path(idx, buf, len(buf))
        return bytes(buf.raw[: max(n, 0)])


def _bind() -> Any:
    """The library's functions in this process (the extension module, else ctypes), or None where
    the library is not loaded."""
    try:
        from holoprof.collect import _io_api  # lazy: at the first flush, not at every start
    except ImportError:
        return _CtypesApi.bind()
    return _io_api if _io_api.loaded() else None


class _Lib:
    """The library's functions, resolved in this process, and what reading its records needs."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.ni, self.nf, hdr = api.layout()
        if hdr != _HDR.size:
            raise RuntimeError(f"unexpected snapshot layout of {LIBRARY_NAME} (header {hdr})")
        self.values = struct.Struct(f"<{self.ni + self.nf}q")
        # per module: (integer counter names, float counter names)
        self.names: list[tuple[list[str], list[str]]] = []
        for m in range(len(MODULES)):
            ints = (api.counter_names(m, 0) or b"").decode().strip(",").split(",")
            floats = (api.counter_names(m, 1) or b"").decode().strip(",").split(",")
            self.names.append((ints, floats))
        self.buf = bytearray(1 << 18)
        self.trace_buf: bytearray | None = None  # made at the first drain
        self.paths: dict[int, str] = {}

    def path_of(self, idx: int) -> str:
        p = self.paths.get(idx)
        if p is None:
            p = path_text(self.api.path(idx))
            self.paths[idx] = p
        return p


_lib: _Lib | None = None
_lib_pid = -1
_drain_lock = threading.Lock()
_DRAIN_CHUNK = 4096  # trace records moved per call (160 KiB buffer)


def _new_drain_lock() -> None:
    global _drain_lock
    _drain_lock = threading.Lock()  # a fork while another thread drained must not leave it held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_drain_lock)
_probed = False


def _get() -> _Lib | None:
    global _lib, _probed, _lib_pid
    if not _probed:
        _probed = True
        api = _bind()
        if api is None:
            return None
        _lib = _Lib(api)
        _lib_pid = os.getpid()
    elif _lib is not None and _lib_pid != os.getpid():
        _lib.paths.clear()  # paths are kept across fork, but keep the cache honest anyway
        _lib_pid = os.getpid()
    return _lib


def available() -> bool:
    """Whether the library is loaded in this process (preloaded, or loaded with RTLD_GLOBAL)."""
    return _get() is not None


def set_owner(owned: bool = True) -> None:
    """Tell the library that this process's counters are read in process (no dump at exit).

    The claim is for this pid: after ``fork()`` the child is not owned until it claims again (do it
    in an ``os.register_at_fork(after_in_child=...)`` hook when the agent keeps running there).
    """
    lib = _get()
    if lib is not None:
        lib.api.set_owner(1 if owned else 0)


def dropped() -> int:
    """Files the library could not record because its table (or name store) was full."""
    lib = _get()
    return int(lib.api.dropped()) if lib is not None else 0


def _decode(lib: _Lib, data: bytes, ts_ns: int) -> list[dict[str, Any]]:
    # lazy: the dump files' module (it reads JSON) loads with the first rows, not at every exit
    from holoprof.store.native_dumps import LAYER, path_text

    rows: list[dict[str, Any]] = []
    off = 0
    end = len(data)
    hdr = _HDR.size
    values = lib.values
    ni = lib.ni
    while off < end:
        reclen, _idx, module, plen, _ = _HDR.unpack_from(data, off)
        vals = values.unpack_from(data, off + hdr)
        p0 = off + hdr + values.size
        path = path_text(data[p0 : p0 + plen])
        int_names, float_names = lib.names[module]
        counters: dict[str, Any] = dict(zip(int_names, vals[: len(int_names)], strict=True))
        for name, v in zip(float_names, vals[ni : ni + len(float_names)], strict=True):
            counters[name] = v / _NS_PER_S
        rows.append(
            {"ts_ns": ts_ns, "module": MODULES[module], "layer": LAYER, "path": path, "counters": counters}
        )
        off += reclen
    return rows


def changes(since: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Rows of the files whose counters changed since ``since`` (0: every file), and the next ``since``.

    Counters are cumulative: a row replaces the previous row of the same (module, path). Call it with
    the returned value at each flush to write only what changed.
    """
    lib = _get()
    if lib is None:
        return [], since
    while True:
        n, nxt = lib.api.snapshot(lib.buf, since)
        if n >= 0:
            break
        lib.buf = bytearray(int(-n * 1.25) + (1 << 16))
    ts = time.time_ns()
    return _decode(lib, memoryview(lib.buf)[:n].tobytes(), ts), int(nxt)


def snapshot() -> list[dict[str, Any]]:
    """One row per file and module that this process has touched (empty when not loaded).

    Each row: ``{"ts_ns", "module": "POSIX"|"STDIO", "layer": "native", "path", "counters"}``.
    """
    return changes(0)[0]


def dump(path: str | None = None) -> bool:
    """Write this process's counters as a dump file now (default: the at-exit location)."""
    lib = _get()
    if lib is None:
        return False
    return bool(lib.api.dump(os.fsencode(path) if path is not None else None) == 0)


# -- per-operation trace --------------------------------------------------------------------------
def trace_start(max_records: int = 1_000_000) -> bool:
    """Record every access into a ring of ``max_records`` entries; later ones are dropped and counted.

    A trace already running is restarted (its records not drained yet are discarded).
    """
    lib = _get()
    if lib is None or max_records <= 0:
        return False
    return bool(lib.api.trace_start(int(max_records)) == 0)


def trace_stop() -> None:
    """Stop recording; what was recorded can still be drained."""
    lib = _get()
    if lib is not None:
        lib.api.trace_stop()


def trace_dropped() -> int:
    """Accesses not recorded since the trace started because the ring was full."""
    lib = _get()
    return int(lib.api.trace_dropped()) if lib is not None else 0


def trace_drain(max_records: int = 65536) -> list[dict[str, Any]]:
    """Move up to ``max_records`` recorded operations out of the ring, as ``io_ops`` rows.

    Each row: ``{"module", "path", "op", "offset", "size_bytes", "start_ns", "end_ns"}`` (wall-clock
    nanoseconds). ``offset`` is -1 where unknown (a failed ``ftell``).
    """
    lib = _get()
    if lib is None or max_records <= 0:
        return []
    rows: list[dict[str, Any]] = []
    size = _TRACE_REC.size
    with _drain_lock:  # one reused buffer: every flush drains, nearly always nothing
        buf = lib.trace_buf
        if buf is None:
            buf = lib.trace_buf = bytearray(size * _DRAIN_CHUNK)
        left = int(max_records)
        while left > 0:
            want = min(left, _DRAIN_CHUNK)
            n = int(lib.api.trace_drain(buf, want))
            if n <= 0:
                break
            left -= n
            raw = memoryview(buf)[: n * size].tobytes()
            for i in range(n):
                idx, module, op, _, offset, sz, start, end = _TRACE_REC.unpack_from(raw, i * size)
                rows.append(
                    {
                        "module": MODULES[module] if module < len(MODULES) else str(module),
                        "path": lib.path_of(idx),
                        "op": OPS[op] if op < len(OPS) else str(op),
                        "offset": offset,
                        "size_bytes": sz,
                        "start_ns": start,
                        "end_ns": end,
                    }
                )
            if n < want:
                break
    return rows
