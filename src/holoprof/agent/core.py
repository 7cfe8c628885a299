"""The in-process agent: hot-path buffers, the writer thread, process identity and lifecycle.

Rules that every line here keeps:

* The hot path (``Agent.span`` and friends) only appends a tuple to a list. Encoding, Parquet and
  disk writes happen on the writer thread (or at exit).
* Nothing here may break the job. Collectors report their own exceptions through :meth:`Agent.fail`,
  which logs once, switches that collector off and lets the job continue.
* Everything recorded is flushed at least every ``flush_interval_s``, at normal exit, on SIGTERM and
  SIGINT (through Python's normal exit path), and before ``os._exit`` (multiprocessing children).
  After ``fork`` the child starts clean with its own buffers, writer thread and process folder.

This module imports the standard library only, and so does the writer: it stores raw chunks
(``holoprof.store.raw``) that the launcher converts to Parquet outside the job.

It is imported at interpreter start-up in every process of a traced job, short ones included (a
pipeline's ``python -c``, a spawned DataLoader worker): it imports nothing that a process would not
need before its first flush. ``typing`` (with ``re``), ``json``, ``socket`` and ``signal`` cost several
milliseconds each, so annotations are only read by type checkers (``TYPE_CHECKING``), JSON is written
by :func:`json_text`, the host name comes from ``os.uname`` and SIGTERM is handled through ``_signal``.
``threading`` is imported here, on the main thread, on purpose: a module that first imports it on
another thread (the writer) makes that thread the job's "main thread" for good.
"""

from __future__ import annotations

import _signal  # the C module behind `signal` (which builds its enums at import: milliseconds)
import _thread
import atexit
import itertools
import os
import sys
import threading
import time

from holoprof import model
from holoprof._version import __version__
from holoprof.agent.steps import StepTracker, ThreadLoop
from holoprof.store.raw import write_raw

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (type checkers take it as True)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_perf_ns = time.perf_counter_ns

#: Tables whose rows are events (a lost row is a dropped event); the others hold snapshots.
EVENT_TABLES = ("spans", "samples", "io_ops")

#: Seconds between two writes of a process's exact counters (steps, epochs, phase totals) when
#: nothing was dropped; while events are being dropped they go out at every flush that changes them.
COUNTERS_EVERY_S = 5.0

if TYPE_CHECKING:
    #: A poller runs on the writer thread at each flush and returns rows to write:
    #: a list of (table, {column: values}) pairs.
    Poller = Callable[[], list[tuple[str, dict[str, list[Any]]]]]


def _versions() -> dict[str, str]:
    v = {"python": sys.version.split()[0], "holoprof": __version__}
    for mod in ("torch", "tensorflow", "numpy"):
        m = sys.modules.get(mod)
        if m is not None:
            v[mod] = str(getattr(m, "__version__", "?"))
    return v


class PhaseState(threading.local):
    """Per thread: the phase open (one at a time; nested work belongs to the outer phase), the
    thread's training loop (:class:`~holoprof.agent.steps.ThreadLoop`, once it has one) and the
    thread's native id, read once (``threading.get_native_id`` is a system call on every call).
    A forked child gets a fresh one (``Agent._init_process_state``), so no id outlives a fork.
    ``waits``: the communication the thread waited for inside its open phase, (start, end, call) —
    see :mod:`holoprof.collect.waits`. ``fetch``: a dataset fetch made inside the thread's batch
    wait, whose span the wait records with its own CPU readings (:mod:`holoprof.collect.torch.fetch`)."""

    active: str | None = None
    waits: list[tuple[int, int, str]] | None = None
    loop: ThreadLoop | None = None
    #: a dataset fetch inside this thread's batch wait: (start, end), recorded by the wait's end
    fetch: tuple[int, int] | None = None
    #: the thread's batch waits so far (which of them read the CPU clocks: :mod:`holoprof.collect.torch.dataloader`)
    batch_waits: int = 0
    #: the thread's optimizer step in progress (:class:`holoprof.collect.torch.optimizer.StepFrame`)
    opt: Any = None

    def __init__(self) -> None:
        self.tid = threading.get_native_id()


class FaultInjected(RuntimeError):
    """Raised by a collector where ``HOLOPROF_FAULT_INJECT`` asks for it (tests of fail-open)."""


def fault_point(collector: str, default: str) -> str | None:
    """The entry point of ``collector`` at which ``HOLOPROF_FAULT_INJECT`` asks it to raise, or None.

    ``HOLOPROF_FAULT_INJECT=<collector>:<entry point>`` (e.g. ``torch:optimizer_post``) names one;
    ``<collector>`` alone means the collector's ``default_fault``. Several, separated by commas,
    make several collectors fail in one job (``memory:forward,io:open``); the first naming
    ``collector`` counts.
    """
    for item in os.environ.get(model.ENV_FAULT, "").split(","):
        name, _, point = item.strip().partition(":")
        if name == collector:
            return point or default
    return None


def check_fault(fault_at: str | None, name: str, point: str) -> None:
    """Raise :class:`FaultInjected` when ``fault_at`` (from :func:`fault_point`) is ``point``."""
    if fault_at == point:
        raise FaultInjected(f"injected fault ({model.ENV_FAULT}={name}:{point})")


class Collector:
    """Base class: a named source of records that can fail open.

    Every monkeypatch goes through :meth:`_set` and every hook handle through :meth:`_handles`, so
    that :meth:`uninstall` (at stop) undoes all of them. When the collector fails,
    :meth:`turn_off` makes every hook a no-op at once and gives the patched functions back their
    originals; hook handles stay registered (as no-ops) until :meth:`uninstall`, because a failure
    may happen inside one of them while the framework iterates over its hooks (``optimizer.step()``
    runs its global hooks from a live view of their dict: removing one there breaks the job).
    """

    name = "collector"
    #: The entry point where ``HOLOPROF_FAULT_INJECT=<name>`` (with no ``:point``) raises.
    default_fault = "install"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.enabled = True
        self._patches: list[tuple[Any, str, Any]] = []
        self._handles: list[Any] = []
        self.fault_at = fault_point(self.name, self.default_fault)

    def install(self) -> None:  # pragma: no cover - interface
        pass

    def inject(self, point: str) -> None:
        """Tests: raise at ``point`` when ``HOLOPROF_FAULT_INJECT`` names this collector and it.
        Hooks call it only when ``fault_at`` is set, so it costs nothing otherwise."""
        check_fault(self.fault_at, self.name, point)

    def _set(self, obj: Any, attr: str, value: Any) -> None:
        """Replace ``obj.attr`` with ``value``, keeping the original for :meth:`uninstall`."""
        self._patches.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    def turn_off(self) -> None:
        """Fail open: hooks become no-ops and patched functions get their originals back. Safe to
        call from inside any hook (it changes no collection the framework may be iterating)."""
        self.enabled = False
        for obj, attr, orig in reversed(self._patches):
            try:
                setattr(obj, attr, orig)
            except Exception:
                pass
        self._patches.clear()

    def uninstall(self) -> None:
        """Undo everything, hook handles included (at stop, never from inside a hook)."""
        self.turn_off()
        for h in self._handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles.clear()

    def after_fork_child(self) -> None:
        pass

    def finish(self) -> None:
        """Called once at shutdown before the final flush."""


class Agent:
    """One per process. Use :func:`get_agent` / :func:`start_agent`, not the constructor."""

    def __init__(
        self,
        run_dir: str,
        role: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = os.path.abspath(run_dir)
        self.options: dict[str, Any] = dict(options or {})
        self.flush_interval_s = float(self.options.get("flush_interval_s", 1.0))
        self.buffer_limit = int(self.options.get("buffer_limit", 50_000))
        self.early_flush = max(1, self.buffer_limit // 4)
        self.fixed_role = role
        self.forked = False  # True in a child made by fork (it inherits its parent's command line)
        self.host = os.uname().nodename  # what socket.gethostname() says, without loading socket
        self.collectors: list[Collector] = []
        self.pollers: list[Poller] = []
        self.finalizers: list[Callable[[], None]] = []
        #: set-up that waits for the first flush before the final one (on the writer thread, about a
        #: second in): what a process shorter than that never needs (the control mailbox's reader)
        self.deferred: list[Callable[[], None]] = []
        self.errors: list[str] = []
        self._failed: set[str] = set()  # names already in errors
        self._warned: set[str] = set()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards flushes (and fork)
        self._init_process_state()
        self.steps = StepTracker(self)  # after the per-thread state, which it reads
        self._stopped = False
        self.exit_code = -1
        self.info: dict[str, Any] = {}
        self.warn_storage = True  # off in the launcher, which says so itself at the end

    # -- per-process state (fresh after fork) ------------------------------------------------------
    def _init_process_state(self) -> None:
        self.pid = os.getpid()
        self.ppid = os.getppid()
        self.tls = PhaseState()
        self.spans_buf: list[tuple[Any, ...]] = []
        self.samples_buf: list[tuple[Any, ...]] = []
        self.dropped = 0
        self.dropped_recorded = 0  # the dropped count in the last processes row that reached the disk
        self.storage_error: str | None = None  # the first write to the run directory that failed
        self.clock_offset_ns = time.time_ns() - _perf_ns()
        self.start_ns = _perf_ns()
        self._kernel_start: tuple[int, int | None] = (0, None)  # (pid, kernel's start) read once
        self.folder = os.path.join(self.run_dir, f"{self.host}-{self.pid}")
        self._seq = itertools.count()
        self._last_identity: tuple[Any, ...] | None = None
        self._counters_written: str | None = None  # the counters in the last processes row written
        self._counters_due = 0.0  # monotonic time from which changed counters are written
        self._stop_event = threading.Event()
        self._writer_done: threading.Event | None = None  # set when the writer thread has ended
        self._writer_ident = 0
        self._flushed_any = False
        #: monotonic time until which the writer holds its flushes (0: none; :meth:`hold_flushes`)
        self.flushes_held_until = 0.0
        self.dist_identity: tuple[int, int, int] | None = None  # (rank, local_rank, world_size)
        #: when a DDP gradient bucket was last ready (monotonic ns): the end of backward's compute
        self.bucket_ready_ns = 0

    # -- hot path ----------------------------------------------------------------------------------
    def span(
        self,
        kind: str,
        name: str,
        start_ns: int,
        end_ns: int,
        step: int = -1,
        attrs: dict[str, Any] | None = None,
        parent_id: int = 0,
        tid: int = 0,
    ) -> int:
        """Record a finished span (monotonic ns) of the calling thread (or of the thread ``tid``).
        Returns its id (0 if dropped). The counts stay exact when the buffer is full: the writer
        counts the phases it writes (:meth:`StepTracker.count_kept`), the thread's loop those dropped
        here; epochs are counted here, steps where they end (:meth:`StepTracker.close`)."""
        tls = self.tls
        if kind == "epoch":
            self.steps.mine().epochs += 1
        buf = self.spans_buf
        if len(buf) >= self.buffer_limit:
            self.dropped += 1
            if kind == "phase":
                loop = tls.loop
                if loop is not None and loop.index >= 0:
                    loop.phase(name, start_ns, end_ns)
            return 0
        sid = next(self._ids)
        buf.append((tid or tls.tid, sid, parent_id, kind, name, start_ns, end_ns, step, attrs))
        return sid

    def sample(self, name: str, value: float, target_pid: int = -1, ts_ns: int | None = None) -> None:
        buf = self.samples_buf
        if len(buf) >= self.buffer_limit:
            self.dropped += 1
            return
        buf.append((_perf_ns() if ts_ns is None else ts_ns, name, value, target_pid))

    # -- fail open ---------------------------------------------------------------------------------
    def fail(self, collector: Collector | str, exc: BaseException) -> None:
        """A collector raised: switch it off, tell the user once, keep the job going.

        Each failing part is recorded once in ``errors`` (the report's errors section) and named in
        one line on stderr; a collector is turned off with :meth:`Collector.turn_off`, which is safe
        inside any hook."""
        name = collector if isinstance(collector, str) else collector.name
        if not isinstance(collector, str):
            try:
                collector.turn_off()
            except Exception:
                collector.enabled = False
        if name in self._failed:
            return
        self._failed.add(name)
        self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
        self.warn_once(
            name,
            f"holoprof: the '{name}' collector failed ({type(exc).__name__}: {exc}) and was turned off; "
            "your job continues unchanged",
        )

    def warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        try:
            sys.stderr.write(message.rstrip() + "\n")
            sys.stderr.flush()
        except Exception:
            pass

    # -- identity ----------------------------------------------------------------------------------
    def note_distributed(self) -> None:
        """torch.distributed is initialized: remember the rank, which outlives destroy_process_group."""
        rank, local_rank, world_size = _dist_identity()
        if rank >= 0:
            self.dist_identity = (rank, local_rank, world_size)

    def identity(self) -> dict[str, Any]:
        rank, local_rank, world_size = _dist_identity()
        if rank >= 0:
            self.dist_identity = (rank, local_rank, world_size)
        elif self.dist_identity is not None:  # the process group was destroyed before this flush
            rank, local_rank, world_size = self.dist_identity
        role = self.fixed_role or _detect_role(self.pid, rank, self.forked)
        return {
            "host": self.host,
            "pid": self.pid,
            "ppid": self.ppid,
            "rank": rank,
            "local_rank": local_rank,
            "world_size": world_size,
            "role": role,
        }

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, process_hooks: bool = True) -> None:
        """Install collectors and start the writer thread.

        ``process_hooks`` (exit, fork, SIGTERM handling) is off only for the launcher's own writer.
        """
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        for c in self.collectors:
            try:
                c.install()
            except Exception as exc:
                self.fail(c, exc)
        if not self.flushes_held_until:
            self._start_thread()
        # else the writer starts when the hold is released (start_writer): a second thread makes each
        # malloc and free of the process's start-up take glibc's locked, multi-threaded path
        if not process_hooks:
            return
        atexit.register(self.shutdown)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(
                before=self._before_fork,
                after_in_parent=self._after_fork_parent,
                after_in_child=self._after_fork_child,
            )
        _patch_os_exit(self)
        _install_sigterm(self)

    def start_writer(self) -> None:
        """Start the writer thread of a process that held its flushes from its start, once."""
        if self._writer_done is not None or self._stopped or os.getpid() != self.pid:
            return
        with self._lock:
            if self._writer_done is None and not self._stopped:  # shutdown may have come meanwhile
                self._start_thread()

    def _start_thread(self) -> None:
        # A bare thread: ``threading.Thread.start`` waits until the new thread runs, which in a
        # DataLoader worker forked onto busy cores costs milliseconds before its first batch.
        self._stop_event = threading.Event()
        done = threading.Event()
        self._writer_done = done

        def body() -> None:
            try:
                self._writer_ident = threading.get_ident()
                threading.current_thread().name = "holoprof-writer"
                self._run()
            finally:
                done.set()

        _thread.start_new_thread(body, ())

    def _run(self) -> None:
        stop = self._stop_event
        tick = min(0.1, self.flush_interval_s)
        last = time.monotonic()
        while not stop.wait(tick):
            now = time.monotonic()
            if now < self.flushes_held_until and len(self.spans_buf) < self.early_flush:
                last = now  # the first flush comes a flush interval after the hold ends
                continue
            if now - last >= self.flush_interval_s or len(self.spans_buf) >= self.early_flush:
                last = now
                self.flush()

    def hold_flushes(self, seconds: float) -> None:
        """Hold the writer's flushes (and the set-up that waits for the first one) for at most
        ``seconds``, or until :meth:`release_flushes`: while a process starts, so that the first flush
        does not compete with it. A full buffer is flushed all the same once the writer runs, and the
        final flush always runs. Called before :meth:`start`, it holds the writer thread too: it starts
        at :meth:`start_writer` (at the latest where the process's target begins, ``collect.startup``),
        and the buffer, meanwhile, drops and counts what goes past its limit."""
        self.flushes_held_until = time.monotonic() + seconds

    def release_flushes(self) -> None:
        """The writer flushes again, the first time a flush interval from now (less up to one of its
        0.1 s ticks)."""
        self.flushes_held_until = 0.0
        self.start_writer()

    def _before_fork(self) -> None:
        # No fork while the writer is inside pyarrow: the child would inherit its locks mid-use.
        self._lock.acquire()

    def _after_fork_parent(self) -> None:
        self._lock.release()

    def _after_fork_child(self) -> None:
        self.forked = True
        self._lock = threading.Lock()
        self._init_process_state()
        self.steps.reset()
        self.errors = []
        self._failed = set()
        self.exit_code = -1
        self._stopped = False
        for c in self.collectors:
            try:
                c.after_fork_child()
            except Exception as exc:
                self.fail(c, exc)
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            self._start_thread()
        except Exception as exc:
            self.fail("agent", exc)
        # multiprocessing children leave through os._exit (patched) or its finalizers.
        try:
            import multiprocessing.util as mpu  # lazy: only for a process that uses multiprocessing

            mpu.register_after_fork(self, _register_mp_finalizer)
        except Exception:
            pass

    def shutdown(self, exit_code: int | None = None, timeout_s: float = 5.0) -> None:
        """Stop collecting and flush everything. Safe to call more than once."""
        if self._stopped or os.getpid() != self.pid:
            return
        self._stopped = True
        if exit_code is not None:
            self.exit_code = exit_code
        elif self.exit_code == -1:
            self.exit_code = _status_after_exception()
        self._stop_event.set()
        done = self._writer_done
        if done is not None and self._writer_ident != threading.get_ident():
            done.wait(timeout_s)
        now = _perf_ns()
        for c in self.collectors:
            try:
                c.finish()
            except Exception as exc:
                self.fail(c, exc)
        try:
            self.steps.finish(now)
        except Exception as exc:
            self.fail("steps", exc)
        for fn in self.finalizers:
            try:
                fn()
            except Exception as exc:
                self.fail("finalizer", exc)
        self.flush(final=True)

    # -- writer ------------------------------------------------------------------------------------
    def flush(self, final: bool = False) -> None:
        """Write what the buffers hold. Runs on the writer thread (or at exit)."""
        acquired = self._lock.acquire(timeout=10)
        if not acquired:
            return
        try:
            if self.deferred and not final:
                self._run_deferred()
            self._flush_locked(final)
        except Exception as exc:  # the writer must never take the job down
            self.fail("writer", exc)
        finally:
            self._lock.release()

    def _run_deferred(self) -> None:
        """Run the set-up that waited for the first flush (under the flush lock: no fork meanwhile)."""
        tasks, self.deferred = self.deferred, []
        for fn in tasks:
            try:
                fn()
            except Exception as exc:
                self.fail(getattr(fn, "__name__", "deferred"), exc)

    def _flush_locked(self, final: bool) -> None:
        steps_now = self.steps.indices()  # before the drain: a step recorded before it is in it
        spans, self.spans_buf = self.spans_buf, []
        samples, self.samples_buf = self.samples_buf, []
        ident = self.identity()
        base = {"host": ident["host"], "pid": ident["pid"], "rank": ident["rank"]}
        off = self.clock_offset_ns
        writes: list[tuple[str, dict[str, list[Any]]]] = []
        if spans:
            writes.append(("spans", _span_columns(spans, base, off)))
        if samples:
            writes.append(("samples", _sample_columns(samples, base, off)))
        writes.extend(self._poll(base))
        key = (
            tuple(sorted(ident.items())),
            self.dropped,
            len(self.errors),
            json_text(self.info, sort_keys=True),
        )
        try:
            self.steps.count_kept(spans, steps_now, final)
        except Exception as exc:  # the spans are written all the same
            self.fail("steps", exc)
        counts = self.steps.counts(off)
        counters = json_text(counts, compact=True) if counts is not None else None
        now = time.monotonic()
        # the counts go out with the process's row: at every change while events are being dropped,
        # else at most every COUNTERS_EVERY_S (they are the report's figures only when spans were lost)
        counters_due = counters != self._counters_written and (self.dropped > 0 or now >= self._counters_due)
        if final or key != self._last_identity or counters_due:
            self._last_identity = key
            self._counters_written = counters
            self._counters_due = now + COUNTERS_EVERY_S
            writes.append(("processes", self._process_row(ident, final, counters)))
        self._write_tables(writes)
        self._flushed_any = True

    def _poll(self, base: dict[str, Any]) -> list[tuple[str, dict[str, list[Any]]]]:
        """The rows of every poller (a poller that fails is removed, and its collector turned off)."""
        writes: list[tuple[str, dict[str, list[Any]]]] = []
        for poll in list(self.pollers):
            try:
                for table, cols in poll():
                    n = max((len(v) for v in cols.values()), default=0)
                    if n:
                        writes.append((table, {**{k: [v] * n for k, v in base.items()}, **cols}))
            except Exception as exc:  # named after the collector it belongs to, which is turned off
                owner = getattr(poll, "__self__", None)
                self.fail(owner if isinstance(owner, Collector) else getattr(owner, "name", "poller"), exc)
                self.pollers.remove(poll)
        return writes

    def _write_tables(self, writes: list[tuple[str, dict[str, list[Any]]]]) -> None:
        """Each table's rows as a raw chunk; a disk that fails drops the events, counted, and warns once."""
        for table, cols in writes:
            try:
                write_raw(self.folder, table, cols, seq=next(self._seq))
            except OSError as exc:  # full, read-only or vanished disk: count, tell once, keep going
                if table in EVENT_TABLES:
                    self.dropped += max((len(v) for v in cols.values()), default=0)
                if self.storage_error is None:
                    self.storage_error = f"{exc.strerror or exc}"
                if self.warn_storage:
                    self.warn_once(
                        "disk",
                        f"holoprof: cannot write to {self.folder} ({exc.strerror or exc}); events are "
                        "being dropped and counted, your job continues unchanged",
                    )
            else:
                if table == "processes":
                    self.dropped_recorded = int(cols["dropped_events"][0])

    def _process_row(self, ident: dict[str, Any], final: bool, counters: str | None) -> dict[str, list[Any]]:
        now_wall = time.time_ns()
        info = {"source": "agent", **self.info}
        if final:
            info["exit_usage"] = _own_usage()
        start = self.start_ns + self.clock_offset_ns
        if self._kernel_start[0] != self.pid:
            self._kernel_start = (self.pid, kernel_start_wall_ns())
        kstart = self._kernel_start[1]
        if kstart is not None and start - 60 * 10**9 < kstart < start:
            start = kstart  # the process began before its interpreter ran this agent
        return {
            "host": [ident["host"]],
            "pid": [ident["pid"]],
            "rank": [ident["rank"]],
            "ppid": [ident["ppid"]],
            "local_rank": [ident["local_rank"]],
            "world_size": [ident["world_size"]],
            "role": [ident["role"]],
            "argv": [json_text(list(sys.argv))],
            "exe": [sys.executable],
            "start_ns": [start],
            "end_ns": [now_wall if final else 0],
            "exit_code": [self.exit_code],
            "updated_ns": [now_wall],
            "clock_offset_ns": [self.clock_offset_ns],
            "versions": [json_text(_versions())],
            "dropped_events": [self.dropped],
            "errors": [json_text(self.errors)],
            "info": [json_text(info)],
            "counters": [counters],
        }


def kernel_start_wall_ns() -> int | None:
    """When the kernel started this process (its fork), on the wall clock, to 10 ms: /proc/self/stat's
    start time (clock ticks since boot) against CLOCK_BOOTTIME now. None where there is no /proc."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        hz = os.sysconf("SC_CLK_TCK")
        age_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - ticks * 1_000_000_000 // hz
        return time.time_ns() - age_ns
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _own_usage() -> dict[str, float]:
    """This process's CPU time and peak resident memory, at its end: what a sampler that ticks once a
    second misses for a process shorter than a tick."""
    try:
        import resource  # lazy: read once, at the process's end: not loaded at the agent's start-up

        ru = resource.getrusage(resource.RUSAGE_SELF)
        return {"cpu_s": round(ru.ru_utime + ru.ru_stime, 6), "max_rss_bytes": int(ru.ru_maxrss) * 1024}
    except Exception:
        return {}


# --- identity helpers ------------------------------------------------------------------------------
def _env_int(name: str, default: int = -1) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def _imported(name: str) -> Any:
    """The module ``name`` if it has finished importing, else None.

    Identity is computed on the writer thread: it must never import anything, nor use a module that
    the job is importing at that moment (that would break the job's own import).
    """
    mod = sys.modules.get(name)
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
        return None
    return mod


def _dist_identity() -> tuple[int, int, int]:
    rank, local_rank, world = _env_int("RANK"), _env_int("LOCAL_RANK"), _env_int("WORLD_SIZE")
    dist = _imported("torch.distributed") if _imported("torch") is not None else None
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
        except Exception:
            pass
    return rank, local_rank, world


def _detect_role(pid: int, rank: int, forked: bool = False) -> str:
    data = _imported("torch.utils.data") if _imported("torch") is not None else None
    if data is not None:
        try:
            if data.get_worker_info() is not None:
                return "dataloader_worker"
        except Exception:
            pass
    # the fork server runs as `python -c "from multiprocessing.forkserver import main; ..."`
    argv = " ".join(getattr(sys, "orig_argv", sys.argv))
    if "multiprocessing.forkserver" in argv and not forked:
        return "forkserver"
    if rank >= 0:
        return "rank"
    if str(os.getppid()) == os.environ.get(model.ENV_LAUNCHER_PID):
        return "main"
    return "child"


# --- exit paths ------------------------------------------------------------------------------------
_real_os_exit = os._exit


def _patch_os_exit(agent: Agent) -> None:
    if getattr(os._exit, "__holoprof__", False):
        return

    def _exit(code: int) -> Any:
        try:
            a = _AGENT
            if a is not None:
                a.shutdown(exit_code=code, timeout_s=2.0)
        except Exception:
            pass
        _real_os_exit(code)

    _exit.__holoprof__ = True  # type: ignore[attr-defined]
    os._exit = _exit  # type: ignore[assignment]


def _register_mp_finalizer(agent: Agent) -> None:
    import multiprocessing.util as mpu  # lazy: only for a process that uses multiprocessing

    mpu.Finalize(None, agent.shutdown, exitpriority=-100)


def _install_sigterm(agent: Agent) -> None:
    """Flush on SIGTERM when the job has no handler of its own, then die of SIGTERM as before."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if _signal.getsignal(_signal.SIGTERM) != _signal.SIG_DFL:
            return

        def _on_term(signum: int, frame: Any) -> None:
            try:
                a = _AGENT
                if a is not None:
                    a.shutdown(exit_code=128 + signum, timeout_s=2.0)
            finally:
                _signal.signal(signum, _signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        _signal.signal(_signal.SIGTERM, _on_term)
    except (ValueError, OSError):
        pass


# --- the process-wide agent ------------------------------------------------------------------------
_AGENT: Agent | None = None


def get_agent() -> Agent | None:
    return _AGENT


def set_agent(agent: Agent | None) -> None:
    """Make ``agent`` this process's agent (:func:`holoprof.collect.startup.start_agent` does)."""
    global _AGENT
    _AGENT = agent


def stop_agent() -> None:
    global _AGENT
    a = _AGENT
    if a is None:
        return
    a.shutdown()
    for c in a.collectors:
        try:
            c.uninstall()
        except Exception:
            pass
    _AGENT = None


def _span_columns(spans: list[Any], base: dict[str, Any], off: int) -> dict[str, list[Any]]:
    """The ``spans`` table's columns of buffered span tuples, times moved by the clock offset ``off``."""
    n = len(spans)
    tid, sid, parent, kind, name, start, end, step, attrs = (list(c) for c in zip(*spans, strict=True))
    return {
        **{k: [v] * n for k, v in base.items()},
        "tid": tid,
        "span_id": sid,
        "parent_id": parent,
        "kind": kind,
        "name": name,
        "start_ns": [s + off for s in start],
        "end_ns": [e + off for e in end],
        "step": step,
        "attrs": [None if a is None else json_text(a) for a in attrs],
    }


def _sample_columns(samples: list[Any], base: dict[str, Any], off: int) -> dict[str, list[Any]]:
    """The ``samples`` table's columns of buffered sample tuples, times moved by the clock offset ``off``."""
    n = len(samples)
    ts, sname, value, target = (list(c) for c in zip(*samples, strict=True))
    return {
        **{k: [v] * n for k, v in base.items()},
        "ts_ns": [t + off for t in ts],
        "name": sname,
        "value": value,
        "target_pid": target,
    }


#: The monotonic clock of every span (ns): ``time.perf_counter_ns`` itself, so that a wrapper's
#: reading of it is one C call, not a Python frame around one.
now_ns = _perf_ns


def _status_after_exception() -> int:
    """At the interpreter's exit (``atexit``): the status an uncaught exception that ended the main
    module gives the process, -1 (unknown) where none did. The interpreter printed it with
    ``PyErr_Print``, which keeps it in ``sys.last_value`` (``sys.last_exc`` from Python 3.12), and
    exits with 1; after a ``KeyboardInterrupt`` it kills itself with SIGINT (128 + 2, as a signal the
    agent handles is told). An interactive session, where every error is kept so, is left alone.
    ``sys.exit(n)`` is not seen here: the native library records what the process gives ``exit()``."""
    if sys.flags.interactive or hasattr(sys, "ps1"):
        return -1
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if not isinstance(last, BaseException) or isinstance(last, SystemExit):
        return -1
    return 128 + 2 if isinstance(last, KeyboardInterrupt) else 1


# --- JSON without the json module -----------------------------------------------------------------
class _NotPlain(Exception):
    """A value :func:`json_text` leaves to the json module."""


def json_text(obj: Any, sort_keys: bool = False, compact: bool = False) -> str:
    """``json.dumps(obj, default=str, sort_keys=sort_keys)`` (``compact``: separators ``","`` and
    ``":"``), the same text, written without importing ``json`` when the job has not (``json`` loads
    ``re`` and ``enum``: milliseconds in a short process) for the plain values the agent writes: str,
    int, float, bool, None, lists, tuples and dicts with str keys. Anything else goes through ``json``."""
    mod = sys.modules.get("json")
    if mod is None:
        try:
            # lazy: the C helper behind json's own encoder (not json itself, see above)
            from _json import encode_basestring_ascii

            parts: list[str] = []
            sep = (",", ":") if compact else (", ", ": ")
            _plain(obj, parts, encode_basestring_ascii, sort_keys, *sep)
            return "".join(parts)
        except (_NotPlain, ImportError, RecursionError):
            pass
        import json  # lazy: only for values that are not plain data

        mod = json
    seps = (",", ":") if compact else None
    return str(mod.dumps(obj, default=str, sort_keys=sort_keys, separators=seps))


def _plain(obj: Any, out: list[str], quote: Callable[[str], str], sort: bool, item: str, key: str) -> None:
    t = type(obj)
    if t is str:
        out.append(quote(obj))
    elif obj is None or obj is True or obj is False:
        out.append("null" if obj is None else "true" if obj else "false")
    elif t is int:
        out.append(int.__repr__(obj))
    elif t is float:
        if obj != obj or obj in (float("inf"), float("-inf")):
            out.append("NaN" if obj != obj else "Infinity" if obj > 0 else "-Infinity")
        else:
            out.append(float.__repr__(obj))
    elif t is list or t is tuple:
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(item)
            _plain(v, out, quote, sort, item, key)
        out.append("]")
    elif t is dict:
        if any(type(k) is not str for k in obj):
            raise _NotPlain
        out.append("{")
        for i, k in enumerate(sorted(obj) if sort else obj):
            if i:
                out.append(item)
            out.append(quote(k))
            out.append(key)
            _plain(obj[k], out, quote, sort, item, key)
        out.append("}")
    else:
        raise _NotPlain
