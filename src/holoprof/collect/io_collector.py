"""I/O, always on: Darshan-style POSIX counters per file, per process, into ``io_files``.

Two layers produce the same rows of the ``io_files`` table:

* **native** — ``libholoprof_io.so`` (:mod:`holoprof.collect.io_native`), preloaded into the job,
  counts at the C library. When it is loaded in this process, the collector only reads its counters
  at each flush (:func:`holoprof.collect.io_native.changes`).
* **python** — otherwise (or with the agent option ``io_layer="python"``), the collector patches the
  file calls of the interpreter (:mod:`holoprof.collect.io_patches`) and counts with Darshan's POSIX
  semantics (:mod:`holoprof.collect.io_counters`).

Both layers leave out the files of the environment (:mod:`holoprof.collect.io_paths`). Rows are built
on the writer thread, which writes a cumulative snapshot of the files that changed since the last
flush. On demand (the ``io-trace`` action of the control mailbox, or the agent option ``io_trace``),
every operation is also written into ``io_ops``.

Standard library only: this module loads in every process of a job, at its start. So it loads the
rest when it is used: the Python layer's patches where that layer counts, the native layer's bindings
(:mod:`holoprof.collect._io_api`, else ``ctypes``) at the first flush or at exit, the path rules at
the first rows.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from holoprof.agent.core import Agent, Collector, json_text
from holoprof.agent.setup import post_import_finder

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (loaded in every traced process)
if TYPE_CHECKING:
    import collections
    from types import ModuleType
    from typing import Any, Final, Protocol

    from holoprof.collect.io_counters import TraceOp
    from holoprof.collect.io_paths import PathPolicy

_perf = time.perf_counter_ns

#: Agent option: "auto" (native when the library is loaded here, else python), "python", "native".
OPTION_LAYER: Final = "io_layer"
OPTION_INCLUDE: Final = "io_include"
OPTION_EXCLUDE: Final = "io_exclude"
OPTION_TRACE: Final = "io_trace"
TRACE_MAX_SECONDS: Final = 600


# --- the collector -----------------------------------------------------------------------------------
def _native() -> ModuleType | None:
    try:
        # loads ctypes and the library: only where the native layer may be used (and it may fail)
        # lazy: loaded only when this runs, not when the agent starts
        from holoprof.collect import io_native

        return io_native
    except Exception:
        return None


def _preloaded() -> bool:
    """Whether ``LD_PRELOAD`` names the native library (``io_native.LIBRARY_NAME``, or the one
    ``HOLOPROF_IO_LIB`` gives), as ``holoprof run`` sets it: then the dynamic loader has loaded it, and
    its bindings can wait (``ctypes`` costs milliseconds in a process that may live for thirty)."""
    preload = os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
    override = os.environ.get("HOLOPROF_IO_LIB")
    return any(os.path.basename(p).startswith("libholoprof_io.") or p == override for p in preload)


def _claim_and_dump() -> bool:
    """At the end of a process whose agent never bound the preloaded library (it ended before its
    first flush): claim its counters and have the library write them now, as
    :func:`holoprof.collect.io_native.set_owner` and :func:`~holoprof.collect.io_native.dump` do,
    without that module (its bindings and decoders cost a short process milliseconds more): through
    the extension module :mod:`holoprof.collect._io_api` where it was built, else ``ctypes``. The
    library then records when the process exits. False where it is not loaded."""
    try:
        from holoprof.collect import _io_api  # lazy: at the end of a short process only
    except ImportError:
        pass
    else:
        if not _io_api.loaded():
            return False
        _io_api.set_owner(1)
        return _io_api.dump(None) == 0
    try:
        import ctypes  # lazy: at the end of a short process only, where the extension is missing

        lib = ctypes.CDLL(None)
        set_owner, dump = lib.holoprof_io_set_owner, lib.holoprof_io_dump
    except (OSError, AttributeError):
        return False
    set_owner.argtypes, set_owner.restype = [ctypes.c_int], None
    dump.argtypes, dump.restype = [ctypes.c_char_p], ctypes.c_int
    set_owner(1)
    return bool(dump(None) == 0)


def _patches() -> ModuleType:
    # lazy: the Python layer's patches, loaded where that layer counts (or a trace asks)
    from holoprof.collect import io_patches

    return io_patches


def _counters() -> ModuleType:
    # lazy: the Python layer's counters and the per-operation ring, loaded where they are used
    from holoprof.collect import io_counters

    return io_counters


def _available_native() -> ModuleType | None:
    """The native layer's bindings when its library is loaded in this process, else None."""
    nat = _native()
    try:
        return nat if nat is not None and nat.available() else None
    except Exception:
        return None


class IoCollector(Collector):
    """Per-file I/O counters of this process, from the native layer when loaded, else from Python."""

    name = "io"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self._final_dumped = False
        self._policy: PathPolicy | None = None
        want = str(agent.options.get(OPTION_LAYER) or "auto")
        self.native: ModuleType | None = None
        #: the library is preloaded: its bindings load at the first flush, or at exit (:meth:`_bind`)
        self._unbound = want != "python" and _preloaded()
        if want != "python" and not self._unbound:
            self.native = _available_native()
        self.layer = "native" if self.native is not None or self._unbound else "python"
        self._since = 0
        self._trace_until_ns: int | None = None  # monotonic deadline of an on-demand trace
        self._trace_all = bool(agent.options.get(OPTION_TRACE))
        self._trace_jobs: list[tuple[int, Any]] = []
        self._native_traced = False
        self._tail: collections.deque[TraceOp] | None = None
        self._lock = threading.Lock()

    @property
    def policy(self) -> PathPolicy:
        """Which paths are counted (the environment's files are not), built at its first use."""
        if self._policy is None:
            # lazy: the path rules (site) load where paths are kept or dropped
            from holoprof.collect.io_paths import PathPolicy

            opts = self.agent.options
            self._policy = PathPolicy(
                list(opts.get(OPTION_INCLUDE) or []), list(opts.get(OPTION_EXCLUDE) or []), self.agent.run_dir
            )
        return self._policy

    # -- install -----------------------------------------------------------------------------------
    def install(self) -> None:
        self.agent.info["io_layer"] = self.layer
        self.agent.pollers.append(self.poll)
        if self.layer == "python":
            self._install_python()
        else:
            self._claim_native()
        if self._trace_all:
            self.trace_start()
        self.inject("install")

    def _install_python(self) -> None:
        """Count in Python: patch the interpreter's file calls."""
        import builtins  # lazy: the Python layer only
        import io  # lazy: the Python layer only
        import mmap  # lazy: the Python layer only

        patches = _patches()
        patches.activate(self)
        self._claim_native()
        patches.set_policy(self.policy)
        opener = patches.make_open(builtins.open)
        self._set(builtins, "open", opener)
        self._set(io, "open", opener)
        for name, fn in patches.os_patches().items():
            self._set(os, name, fn)
        self._set(mmap, "mmap", patches.make_mmap(mmap.mmap))
        post_import_finder().add("numpy", self._on_numpy)

    def _bind(self) -> None:
        """The preloaded library's bindings, loaded once it is needed (the first flush, exit, a
        trace): it reads this process's counters from then on. Where it turns out not to be loaded
        after all, the Python layer counts from now on."""
        if not self._unbound:
            return
        self._unbound = False
        self.native = _available_native()
        if self.native is not None:
            self._claim_native()
            return
        self.layer = self.agent.info["io_layer"] = "python"
        self._install_python()

    def _on_numpy(self, numpy: ModuleType) -> None:
        if not self.enabled or self.native is not None:
            return
        try:
            orig = getattr(numpy, "fromfile", None)
            if orig is not None and not hasattr(orig, "__wrapped__"):
                self._set(numpy, "fromfile", _patches().wrap_fromfile(orig))
        except Exception as exc:
            self.agent.fail(self, exc)

    def turn_off(self) -> None:
        super().turn_off()
        if "holoprof.collect.io_patches" in sys.modules:
            _patches().set_policy(None)
        if "holoprof.collect.io_counters" in sys.modules:
            _counters().trace_end()

    def after_fork_child(self) -> None:
        """The child starts with zero counters; files opened before the fork stay tracked."""
        if "holoprof.collect.io_patches" in sys.modules:
            for f in _patches().tracked_files():
                f.reset()
        if "holoprof.collect.io_counters" in sys.modules:
            ring = _counters().trace_ring()
            if ring is not None:
                ring.clear()
        self._trace_jobs = []
        self._since = 0
        self._claim_native()

    def _claim_native(self) -> None:
        """This process is read in process: the native library (when loaded) writes no dump at exit,
        also when the Python layer was chosen (its counters would be counted twice). A library not
        bound yet is claimed when it is (:meth:`_bind`)."""
        if self._unbound:
            return
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
        self._bind()
        with self._lock:
            if seconds is not None:
                until = _perf() + int(seconds * 1e9)
                if self._trace_until_ns is None or until > self._trace_until_ns:
                    self._trace_until_ns = until
            _counters().trace_begin()
            if self.native is not None:
                self._native_traced = True  # its ring is drained at every flush from now on
                self.native.trace_start(1_000_000)

    def trace_stop(self) -> None:
        with self._lock:
            self._trace_until_ns = None
            if self._trace_all:
                return
            if self.native is not None:
                self.native.trace_stop()
            # keep the ring until the next flush drains it
            ring = _counters().trace_end()
            if ring is not None:
                self._tail = ring

    @property
    def tracing(self) -> bool:
        counters = sys.modules.get("holoprof.collect.io_counters")
        return (counters is not None and counters.trace_ring() is not None) or self._trace_all

    def _drain_ops(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        off = self.agent.clock_offset_ns
        rings = []
        tail = self._tail
        if tail is not None:
            rings.append(tail)
            self._tail = None
        counters = sys.modules.get("holoprof.collect.io_counters")  # loaded by the first trace
        ring = counters.trace_ring() if counters is not None else None
        if ring is not None:
            rings.append(ring)
        if not rings and not self._native_traced:
            return rows
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
        if not self.enabled or (self._final_dumped and self.native is None):
            return out  # the library wrote this process's final counters itself (finish)
        self._bind()
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
                job.done(layer=self.layer, dropped=_counters().trace_dropped())
            except Exception:
                pass

    def python_rows(self) -> list[dict[str, Any]]:
        ts = time.time_ns()
        off = self.agent.clock_offset_ns
        rows = []
        for f in _patches().tracked_files():
            if not f.dirty:
                continue
            f.dirty = False
            rows.append(
                {
                    "ts_ns": ts,
                    "module": "POSIX",
                    "layer": "python",
                    "path": f.path,
                    "counters": json_text(f.counters(off)),
                }
            )
        return rows

    def native_rows(self) -> list[dict[str, Any]]:
        assert self.native is not None
        if self._final_dumped:
            return []  # the library wrote the final counters itself (see finish)
        got, self._since = self.native.changes(self._since)
        pol = self.policy
        return [{**r, "counters": json_text(r["counters"])} for r in got if pol.keep(str(r.get("path", "")))]

    def finish(self) -> None:
        if self._unbound and self.enabled and _claim_and_dump():
            self._unbound = False  # a process that ended before its first flush: read by the library
            self._final_dumped = True
            return
        self._bind()
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


if TYPE_CHECKING:

    class TraceJob(Protocol):
        """The request being answered (a :class:`holoprof.collect.control.Job`)."""

        @property
        def agent(self) -> Agent: ...

        @property
        def params(self) -> dict[str, int]: ...

        def running(self, **info: Any) -> None: ...

        def done(self, artifacts: list[str] | None = None, **info: Any) -> None: ...


def io_trace_job(job: TraceJob) -> None:
    """The ``io-trace`` handler for :data:`holoprof.collect.control.ACTIONS`: done when the window ends."""
    info = io_trace_action(job.agent, {"params": dict(job.params)})
    job.running(**info)
    col = _io_collector(job.agent)
    if col is not None:
        col._trace_jobs.append((info["until_ns"], job))
