"""The control mailbox: on-demand actions requested while a job runs.

The training process opens no network port. ``holoprof ctl`` and ``holoprof serve`` write a request
file into ``<run>/control/``; every traced process looks there about once a second (an agent poller,
on the writer thread), claims the requests addressed to it at most once, runs them and writes the
result into ``<run>/artifacts/``.

Files (all written atomically: temporary name, then rename):

* ``control/req-<id>.json`` — the request: ``{"id", "action", "target", "params", "created_ns"}``;
  ``target`` is ``null`` (every process of the job) or one of ``{"pid": P}``, ``{"rank": R}``,
  ``{"role": NAME}``.
* ``control/<id>/<host>-<pid>.state`` — one per process that took the request:
  ``{"state": queued|running|done|failed|refused, "reason", "artifacts": [names], ...}``;
  ``refused``: the request was not valid and did not run (``reason`` says why).
* ``artifacts/<action>-<id>-<host>-<pid>.*`` — what the action produced.

Requests are validated on both sides: known actions only (:data:`ACTION_SPECS`), integer parameters
within bounds. The mailbox is read and written only through real directories of the run
(``control/`` and ``control/<id>/`` are opened with ``O_NOFOLLOW``, a symbolic link there is refused)
and a request is read only from a regular file opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never
blocks the reader), at most :data:`MAX_REQUEST_BYTES` and nested at most :data:`MAX_REQUEST_DEPTH`
deep. A bad request file is refused with a reason; it never turns the mailbox off.

Actions never run long on the training thread: a stack dump runs on the writer thread, a deep
profile starts and stops at step boundaries on the training thread and is exported on a thread of
its own.

Other modules add actions by registering a handler in :data:`ACTIONS` (and, for a new action name,
its parameters in :data:`ACTION_SPECS`). A handler receives a :class:`Job` and calls
:meth:`Job.done` or :meth:`Job.failed`, now or later; an exception it raises fails the request.

This module runs inside the job: standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from holoprof import model
from holoprof.agent.core import Agent, Collector, StepTracker

# --- the request format (shared by the agent, `holoprof ctl` and `holoprof serve`) -----------------

#: The allow-list: action -> {parameter: (minimum, maximum, default)}.
ACTION_SPECS: dict[str, dict[str, tuple[int, int, int]]] = {
    "stacks": {},
    "deep-profile": {"steps": (1, 100, 5)},
    "memory-snapshot": {"max_entries": (1, 1_000_000, 100_000)},
    "io-trace": {"seconds": (1, 600, 10)},
}
TARGET_KEYS = ("pid", "rank", "role")
STATES = ("queued", "running", "done", "failed", "refused")
FINAL_STATES = ("done", "failed", "refused")
NOT_AVAILABLE = "not available yet in this version"
MAX_REQUEST_BYTES = 16 * 1024
#: Arrays and objects nested deeper than this are refused before the JSON parser sees them.
MAX_REQUEST_DEPTH = 8
#: State files are a little larger than requests (they carry artifact names and info).
MAX_STATE_BYTES = 4 * MAX_REQUEST_BYTES
#: A request older than this is ignored by processes (they never saw it in time).
MAX_REQUEST_AGE_S = 3600.0
#: How long an armed deep profile waits for a training step before it gives up.
ARM_TIMEOUT_S = 600.0
#: Chrome traces larger than this are stored gzip-compressed.
GZIP_ABOVE_BYTES = 8 * 1024 * 1024
SUMMARY_OPS = 30

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ROLE = re.compile(r"^[a-z_]{1,32}$")


class RequestError(ValueError):
    """A request that is not valid: the message names the problem and the fix."""


def validate(
    action: Any, params: Any, target: Any = None
) -> tuple[str, dict[str, int], dict[str, Any] | None]:
    """Check an action, its parameters and its target; return them normalized (defaults filled in)."""
    if not isinstance(action, str) or action not in ACTION_SPECS:
        raise RequestError(f"unknown action {action!r}; the actions are: {', '.join(ACTION_SPECS)}")
    spec = ACTION_SPECS[action]
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RequestError('params must be a JSON object, e.g. {"steps": 5}')
    out: dict[str, int] = {}
    for key, value in params.items():
        if key not in spec:
            allowed = ", ".join(spec) or "none"
            raise RequestError(f"{action} takes no parameter {key!r} (its parameters: {allowed})")
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(f"{key} must be a whole number, got {value!r}")
        lo, hi, _ = spec[key]
        if not lo <= value <= hi:
            raise RequestError(f"{key} must be between {lo} and {hi}, got {value}")
        out[key] = value
    for key, (_, _, default) in spec.items():
        out.setdefault(key, default)
    if target is not None:
        if not isinstance(target, dict) or len(target) != 1 or next(iter(target)) not in TARGET_KEYS:
            raise RequestError('target must be null or one of {"pid": P}, {"rank": R}, {"role": NAME}')
        ((key, value),) = target.items()
        if key == "role":
            if not isinstance(value, str) or not _ROLE.match(value):
                raise RequestError(f"role must be a role name such as 'main' or 'rank', got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 2**31:
            raise RequestError(f"{key} must be a non-negative whole number, got {value!r}")
        target = {key: value}
    return action, out, target


def new_request_id() -> str:
    import secrets

    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_dir(name: str, dir_fd: int | None = None) -> int:
    """Open a directory that must be a real one (not a symbolic link); returns its descriptor.
    Raises OSError (ELOOP or ENOTDIR for a link or a file)."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _nesting_ok(data: bytes, limit: int) -> bool:
    """Whether the arrays and objects of a JSON text nest at most ``limit`` deep (strings skipped)."""
    depth = 0
    in_str = esc = False
    for b in data:
        if in_str:
            if esc:
                esc = False
            elif b == 0x5C:  # backslash
                esc = True
            elif b == 0x22:  # quote
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return False
        elif b in (0x5D, 0x7D):
            depth -= 1
    return True


def parse_request(data: bytes, limit: int = MAX_REQUEST_BYTES) -> dict[str, Any]:
    """The JSON object in ``data``; raises :class:`RequestError` naming what is wrong with it."""
    if len(data) > limit:
        raise RequestError(f"the request is larger than {limit} bytes")
    if not _nesting_ok(data, MAX_REQUEST_DEPTH):
        raise RequestError(f"the request nests deeper than {MAX_REQUEST_DEPTH} levels")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise RequestError(f"the request is not valid JSON ({exc})")
    if not isinstance(doc, dict):
        raise RequestError(f"the request must be a JSON object, not {type(doc).__name__}")
    return doc


def read_file(name: str, dir_fd: int, limit: int = MAX_REQUEST_BYTES) -> tuple[dict[str, Any], int]:
    """Read the JSON object of ``name`` in the directory ``dir_fd``: a regular file only, opened
    without following a symbolic link and without blocking. Returns it and the file's mtime (ns);
    raises :class:`RequestError` with the reason it was refused."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RequestError("the request is a symbolic link; only regular files are read")
        raise RequestError(f"the request cannot be opened ({exc.strerror or exc})")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RequestError(f"the request is {_kind(st.st_mode)}; only regular files are read")
        if st.st_size > limit:
            raise RequestError(f"the request is larger than {limit} bytes")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise RequestError(f"the request cannot be read ({exc.strerror or exc})")
    finally:
        _close(fd)
    return parse_request(b"".join(chunks), limit), st.st_mtime_ns


def _write_json(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}-{threading.get_native_id()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def _write_json_at(dir_fd: int, name: str, doc: dict[str, Any]) -> None:
    """Write ``name`` atomically inside the directory ``dir_fd`` (a new file, never through a link)."""
    data = (json.dumps(doc, sort_keys=True) + "\n").encode()
    tmp = f".{name}.tmp{os.getpid()}-{threading.get_native_id()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink(tmp, dir_fd)
        raise


def _unlink(name: str, dir_fd: int | None = None) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _read_json(name: str, dir_fd: int, limit: int = MAX_STATE_BYTES) -> dict[str, Any] | None:
    try:
        return read_file(name, dir_fd, limit)[0]
    except RequestError:
        return None


def write_request(
    run_dir: str, action: str, params: dict[str, Any] | None = None, target: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Validate and write a request into ``run_dir``'s mailbox; return it (with its id)."""
    action, norm, tgt = validate(action, params, target)
    control = os.path.join(run_dir, model.CONTROL_DIR)
    os.makedirs(control, mode=0o700, exist_ok=True)
    cfd = open_dir(control)
    req = {
        "id": new_request_id(),
        "action": action,
        "target": tgt,
        "params": norm,
        "created_ns": time.time_ns(),
    }
    try:
        _write_json_at(cfd, f"req-{req['id']}.json", req)
    finally:
        _close(cfd)
    return req


def _control_fd(run_dir: str) -> int | None:
    try:
        return open_dir(os.path.join(run_dir, model.CONTROL_DIR))
    except OSError:
        return None


def read_request(run_dir: str, req_id: str) -> dict[str, Any] | None:
    if not _ID.match(req_id):
        return None
    cfd = _control_fd(run_dir)
    if cfd is None:
        return None
    try:
        return _read_json(f"req-{req_id}.json", cfd, MAX_REQUEST_BYTES)
    finally:
        _close(cfd)


def _states_at(cfd: int, req_id: str) -> list[dict[str, Any]]:
    try:
        dfd = open_dir(req_id, cfd)
    except OSError:
        return []
    try:
        names = sorted(os.listdir(dfd))
        out = []
        for name in names:
            if name.endswith(".state") and not name.startswith("."):
                doc = _read_json(name, dfd)
                if doc is not None:
                    out.append(doc)
        return out
    except OSError:
        return []
    finally:
        _close(dfd)


def request_states(run_dir: str, req_id: str) -> list[dict[str, Any]]:
    """The state files of one request: one per process that took it."""
    if not _ID.match(req_id):
        return []
    cfd = _control_fd(run_dir)
    if cfd is None:
        return []
    try:
        return _states_at(cfd, req_id)
    finally:
        _close(cfd)


def list_requests(run_dir: str) -> list[dict[str, Any]]:
    """Every valid request of the run, newest first, each with ``states`` (one per process that
    took it). Request files that are not valid are left out (each process refuses them)."""
    cfd = _control_fd(run_dir)
    if cfd is None:
        return []
    out = []
    try:
        names = os.listdir(cfd)
        for name in names:
            if not (name.startswith("req-") and name.endswith(".json")):
                continue
            req = _read_json(name, cfd, MAX_REQUEST_BYTES)
            if req is None or not isinstance(req.get("id"), str) or not _ID.match(req["id"]):
                continue
            out.append({**req, "states": _states_at(cfd, req["id"])})
    except OSError:
        return []
    finally:
        _close(cfd)
    out.sort(key=lambda r: r["created_ns"] if isinstance(r.get("created_ns"), int) else 0, reverse=True)
    return out


# --- the agent side --------------------------------------------------------------------------------


class Job:
    """One request taken by this process. Handlers call :meth:`done` or :meth:`failed` exactly once."""

    def __init__(
        self, collector: ControlCollector, id: str, action: str, params: dict[str, int], created_ns: int
    ) -> None:
        self.collector = collector
        self.id = id
        self.action = action
        self.params = params
        self.created_ns = created_ns
        self.state = "queued"
        self.artifacts: list[str] = []

    @property
    def agent(self) -> Agent:
        return self.collector.agent

    def artifact_path(self, suffix: str) -> str:
        """``<run>/artifacts/<action>-<id>-<host>-<pid><suffix>`` (the folder is created)."""
        a = self.agent
        folder = os.path.join(a.run_dir, model.ARTIFACTS_DIR)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        _close(open_dir(folder))  # a real directory of the run, not a link out of it
        return os.path.join(folder, f"{self.action}-{self.id}-{a.host}-{a.pid}{suffix}")

    def running(self, **info: Any) -> None:
        self._write("running", **info)

    def done(self, artifacts: list[str] | None = None, **info: Any) -> None:
        for p in artifacts or []:
            self.artifacts.append(os.path.basename(p))
        self._write("done", **info)

    def failed(self, reason: str) -> None:
        self._write("failed", reason=reason)

    def refused(self, reason: str) -> None:
        """The request is not valid: it does not run."""
        self._write("refused", reason=reason)

    def _write(self, state: str, **info: Any) -> None:
        if self.state in FINAL_STATES:
            return
        self.state = state
        self.collector.write_state(self, info)


Handler = Callable[[Job], None]


def _stacks(job: Job) -> None:
    """Every Python thread's stack, as text."""
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    lines = [
        f"# holoprof stacks: pid {job.agent.pid} on {job.agent.host}, {time.strftime('%Y-%m-%d %H:%M:%S')}"
    ]
    for ident, frame in sorted(sys._current_frames().items()):
        lines.append("")
        lines.append(f'Thread {ident} "{names.get(ident, "?")}" (most recent call last):')
        lines.append("".join(traceback.format_stack(frame)).rstrip())
    path = job.artifact_path(".txt")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
    job.done([path], threads=len(names))


def _deep_profile(job: Job) -> None:
    job.collector.deep.arm(job)


#: Action handlers in this process. Actions of :data:`ACTION_SPECS` without a handler here fail with
#: "not available yet in this version".
def _io_trace(job: Job) -> None:
    from holoprof.collect.io_collector import io_trace_job

    io_trace_job(job)


def _memory_snapshot(job: Job) -> None:
    from holoprof.collect.memory import memory_snapshot_handler

    memory_snapshot_handler(job)


ACTIONS: dict[str, Handler] = {
    "stacks": _stacks,
    "deep-profile": _deep_profile,
    "io-trace": _io_trace,
    "memory-snapshot": _memory_snapshot,
}


class DeepProfiler:
    """torch.profiler around the next N training steps of this process (one profile at a time).

    The poller arms a job; the profiler starts at the next step boundary and stops N + 1 boundaries
    later (one warm-up step), both on the training thread; a thread of its own exports the result.
    """

    def __init__(self, collector: ControlCollector) -> None:
        self.collector = collector
        self.lock = threading.Lock()
        self.armed: Job | None = None
        self.armed_at = 0.0
        self.active: Job | None = None
        self.prof: Any = None
        self.boundaries = 0
        self.exporter: threading.Thread | None = None

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.armed = None
        self.active = None
        self.prof = None
        self.boundaries = 0
        self.exporter = None

    def busy(self) -> bool:
        return (
            self.armed is not None
            or self.active is not None
            or (self.exporter is not None and self.exporter.is_alive())
        )

    def arm(self, job: Job) -> None:
        if self.agent_role() in ("dataloader_worker", "forkserver"):
            job.failed("this process runs no training steps")
            return
        if sys.modules.get("torch") is None and sys.modules.get("tensorflow") is None:
            job.failed("neither PyTorch nor TensorFlow is imported in this process")
            return
        with self.lock:
            if self.busy():
                job.failed("another deep profile is running in this process; wait for it to finish")
                return
            self.armed = job
            self.armed_at = time.monotonic()
        self.collector.hook_steps()
        job.running(phase="waiting for the next training step")

    def agent_role(self) -> str:
        try:
            return str(self.collector.agent.identity()["role"])
        except Exception:
            return "?"

    def expire(self) -> None:
        """Writer thread: give up on a profile that saw no step boundary for a long time."""
        job = self.armed
        if job is not None and time.monotonic() - self.armed_at > ARM_TIMEOUT_S:
            with self.lock:
                if self.armed is job:
                    self.armed = None
            job.failed(f"no training step within {ARM_TIMEOUT_S:.0f} s")

    # training thread, at each step boundary --------------------------------------------------------
    def on_boundary(self) -> None:
        current = self.active
        if current is not None:
            self.boundaries += 1
            try:
                self.prof.step()
            except Exception as exc:
                self.active, self.prof = None, None
                current.failed(f"torch.profiler failed during a step ({type(exc).__name__}: {exc})")
                return
            if self.boundaries >= current.params["steps"] + 1:
                self._stop(partial=False)
            return
        job = self.armed
        if job is None:
            return
        with self.lock:
            if self.armed is not job:
                return
            self.armed = None
        try:
            self.prof = self._make_profiler(job.params["steps"])
            self.prof.start()
        except Exception as exc:
            self.prof = None
            job.failed(f"torch.profiler could not start ({type(exc).__name__}: {exc})")
            return
        self.active = job
        self.boundaries = 0

    def _make_profiler(self, steps: int) -> Any:
        if sys.modules.get("torch") is None and sys.modules.get("tensorflow") is not None:
            from holoprof.collect.tf_profile import TFProfile

            return TFProfile(os.path.join(self.collector.agent.run_dir, "artifacts"))
        import torch
        import torch.profiler as tp

        activities = [tp.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(tp.ProfilerActivity.CUDA)
        return tp.profile(
            activities=activities,
            schedule=tp.schedule(wait=0, warmup=1, active=steps, repeat=1),
            record_shapes=True,
        )

    def _stop(self, partial: bool) -> None:
        job, prof = self.active, self.prof
        self.active, self.prof = None, None
        if job is None or prof is None:
            return
        try:
            prof.stop()
        except Exception as exc:
            job.failed(f"torch.profiler could not stop ({type(exc).__name__}: {exc})")
            return
        steps = max(0, self.boundaries - 1)
        t = threading.Thread(
            target=self._export, args=(job, prof, steps, partial), name="holoprof-deep-profile", daemon=True
        )
        self.exporter = t
        t.start()

    def finish(self) -> None:
        """At shutdown: a profile still waiting fails; a running one is stopped and exported."""
        job = self.armed
        if job is not None:
            self.armed = None
            job.failed("the process ended before the next training step")
        if self.active is not None:
            self._stop(partial=True)
        t = self.exporter
        if t is not None:
            t.join(60)

    # export thread -----------------------------------------------------------------------------------
    def _export(self, job: Job, prof: Any, steps: int, partial: bool) -> None:
        import gzip
        import shutil

        try:
            job.running(phase="exporting")
            trace = job.artifact_path(".json")
            tmp = trace + ".tmp"
            prof.export_chrome_trace(tmp)
            if os.path.getsize(tmp) > GZIP_ABOVE_BYTES:
                with open(tmp, "rb") as src, gzip.open(trace + ".gz.tmp", "wb", compresslevel=5) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.remove(tmp)
                trace += ".gz"
                os.replace(trace + ".tmp", trace)
            else:
                os.replace(tmp, trace)
            summary = job.artifact_path(".summary.json")
            if hasattr(prof, "summarize"):  # TensorFlow's profiler
                doc = prof.summarize(steps, job.params["steps"])
            else:
                doc = summarize(prof, steps, job.params["steps"])
            doc["partial"] = partial
            doc["trace"] = os.path.basename(trace)
            _write_json(summary, doc)
            job.done([trace, summary, *getattr(prof, "extra_artifacts", [])], steps=steps, partial=partial)
        except Exception as exc:
            job.failed(f"the profile could not be exported ({type(exc).__name__}: {exc})")


def summarize(prof: Any, steps: int, requested: int) -> dict[str, Any]:
    """Top ops by self CPU time, grouped by input shapes."""
    ops = []
    # ProfilerStep#N spans a whole step: its self time is the Python time between ops, not an op
    events = [
        e for e in prof.key_averages(group_by_input_shape=True) if not str(e.key).startswith("ProfilerStep")
    ]
    total_self = sum(float(e.self_cpu_time_total) for e in events) or 1.0
    for e in sorted(events, key=lambda e: float(e.self_cpu_time_total), reverse=True)[:SUMMARY_OPS]:
        row: dict[str, Any] = {
            "name": str(e.key),
            "calls": int(e.count),
            "self_cpu_us": round(float(e.self_cpu_time_total), 3),
            "total_cpu_us": round(float(e.cpu_time_total), 3),
            "self_cpu_fraction": round(float(e.self_cpu_time_total) / total_self, 6),
            "input_shapes": str(e.input_shapes) if e.input_shapes else "",
        }
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:
            dev = getattr(e, "self_cuda_time_total", 0)
        if dev:
            row["self_device_us"] = round(float(dev), 3)
        ops.append(row)
    return {
        "schema": "holoprof.deep-profile/1",
        "steps": steps,
        "requested_steps": requested,
        "warmup_steps": 1,
        "self_cpu_total_us": round(total_self, 3),
        "ops": ops,
    }


class ControlCollector(Collector):
    """Reads the mailbox on the writer thread and runs the requests addressed to this process."""

    name = "control"
    poll_interval_s = 0.5

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self.deep = DeepProfiler(self)
        self._seen: set[str] = set()
        self._last_poll = 0.0
        self._hooked: StepTracker | None = None
        self._orig_class: type | None = None
        self._start_wall_ns = time.time_ns()

    def install(self) -> None:
        self.agent.pollers.append(self.poll)

    def uninstall(self) -> None:
        try:
            self.agent.pollers.remove(self.poll)
        except ValueError:
            pass
        self.unhook_steps()

    def after_fork_child(self) -> None:
        # the child is a new process: it answers for itself, from its own start on
        self._seen = set()
        self._start_wall_ns = time.time_ns()
        self.deep.reset()
        if self.enabled and self.poll not in self.agent.pollers:
            self.agent.pollers.append(self.poll)

    def finish(self) -> None:
        self.deep.finish()

    # step boundaries: the tracker's class is swapped for a subclass whose close() also calls us ----
    def hook_steps(self) -> None:
        tracker = self.agent.steps
        if self._hooked is tracker:
            return
        collector = self
        base = type(tracker)
        orig_close = base.close

        def close(tracker_self: StepTracker, t_ns: int) -> None:
            orig_close(tracker_self, t_ns)
            if collector.enabled:
                try:
                    collector.deep.on_boundary()
                except Exception as exc:
                    collector.agent.fail(collector, exc)

        hooked = type("HookedStepTracker", (base,), {"__slots__": (), "close": close})
        tracker.__class__ = hooked
        self._orig_class = base
        self._hooked = tracker

    def unhook_steps(self) -> None:
        tracker, base = self._hooked, self._orig_class
        if tracker is not None and base is not None:
            try:
                tracker.__class__ = base
            except TypeError:
                pass
        self._hooked = None

    # writer thread -------------------------------------------------------------------------------
    def poll(self) -> list[tuple[str, dict[str, list[Any]]]]:
        if not self.enabled:
            return []
        now = time.monotonic()
        if now - self._last_poll < self.poll_interval_s:
            return []
        self._last_poll = now
        try:
            self.deep.expire()
            self._poll_once()
        except Exception as exc:
            self.agent.fail(self, exc)
        return []

    def _poll_once(self) -> None:
        cfd = _control_fd(self.agent.run_dir)
        if cfd is None:
            return  # no mailbox (or not a real directory of the run): nothing to read
        try:
            try:
                names = os.listdir(cfd)
            except OSError:
                return
            for name in sorted(names):
                if not (name.startswith("req-") and name.endswith(".json")):
                    continue
                req_id = name[4:-5]
                if req_id in self._seen:
                    continue
                self._seen.add(req_id)
                try:
                    self._take(cfd, name, req_id)
                except Exception as exc:  # one request never turns the mailbox off
                    self.agent.warn_once(
                        f"control-{req_id}",
                        f"holoprof: request {req_id} could not be handled ({type(exc).__name__}: {exc}); "
                        "the mailbox goes on",
                    )
        finally:
            _close(cfd)

    def _take(self, cfd: int, name: str, req_id: str) -> None:
        """Read one request file; run it if it is addressed to this process, refuse it if it is bad."""
        if not _ID.match(req_id):
            return  # no state can be written for it: its name is not an id
        try:
            req, mtime_ns = read_file(name, cfd)
        except RequestError as exc:
            try:
                st = os.stat(name, dir_fd=cfd, follow_symlinks=False)
            except OSError:
                return
            if st.st_mtime_ns >= self._start_wall_ns and not self._taken(cfd, req_id):
                Job(self, req_id, "?", {}, st.st_mtime_ns).refused(str(exc))
            return
        if req.get("id") != req_id:
            if mtime_ns >= self._start_wall_ns and not self._taken(cfd, req_id):
                Job(self, req_id, "?", {}, mtime_ns).refused(
                    f"the request's id {req.get('id')!r} is not the one in its file name ({req_id!r})"
                )
            return
        created = req.get("created_ns")
        if isinstance(created, bool) or not isinstance(created, int):
            if mtime_ns >= self._start_wall_ns and not self._taken(cfd, req_id):
                Job(self, req_id, str(req.get("action")), {}, mtime_ns).refused(
                    "created_ns must be the request's time in nanoseconds (a whole number)"
                )
            return
        if created < self._start_wall_ns:
            return  # made before this process started: not meant for it
        if time.time_ns() - created > MAX_REQUEST_AGE_S * 1e9:
            return
        if self._taken(cfd, req_id):
            return  # taken already (by this very process)
        job = Job(self, req_id, str(req.get("action")), {}, created)
        try:
            action, params, target = validate(req.get("action"), req.get("params"), req.get("target"))
        except RequestError as exc:
            job.refused(f"invalid request: {exc}")  # by every process: it may have been meant for any
            return
        if self._addressed(target):
            job.params = params
            self._run(job, action)

    def _taken(self, cfd: int, req_id: str) -> bool:
        a = self.agent
        try:
            os.stat(os.path.join(req_id, f"{a.host}-{a.pid}.state"), dir_fd=cfd, follow_symlinks=False)
        except OSError:
            return False
        return True

    def _addressed(self, target: dict[str, Any] | None) -> bool:
        """Whether a (validated) target names this process."""
        if target is None:
            return True
        ((key, value),) = target.items()
        return bool(self.agent.identity().get(key) == value)

    def _run(self, job: Job, action: str) -> None:
        job.running()
        handler = ACTIONS.get(action)
        if handler is None:
            job.failed(NOT_AVAILABLE)
            return
        try:
            handler(job)
        except Exception as exc:
            job.failed(f"{type(exc).__name__}: {exc}")

    def write_state(self, job: Job, info: dict[str, Any]) -> None:
        """Write this process's state of ``job`` into ``control/<id>/``, a real directory of the run
        (created here; a symbolic link in its place is refused, so nothing is written elsewhere)."""
        a = self.agent
        try:
            ident = a.identity()
            doc = {
                "id": job.id,
                "action": job.action,
                "state": job.state,
                "reason": info.pop("reason", ""),
                "artifacts": list(job.artifacts),
                "host": a.host,
                "pid": a.pid,
                "rank": ident["rank"],
                "role": ident["role"],
                "updated_ns": time.time_ns(),
                "info": info,
            }
            control = os.path.join(a.run_dir, model.CONTROL_DIR)
            os.makedirs(control, mode=0o700, exist_ok=True)
            cfd = open_dir(control)
            try:
                try:
                    os.mkdir(job.id, 0o700, dir_fd=cfd)
                except FileExistsError:
                    pass
                dfd = open_dir(job.id, cfd)
                try:
                    _write_json_at(dfd, f"{a.host}-{a.pid}.state", doc)
                finally:
                    _close(dfd)
            finally:
                _close(cfd)
        except OSError as exc:
            # this request cannot be answered (e.g. control/<id> is not a real directory of the run);
            # the mailbox goes on with the next one
            a.warn_once(
                f"control-state-{job.id}",
                f"holoprof: cannot write the state of request {job.id} ({exc.strerror or exc}); "
                "it is left unanswered",
            )
        except Exception as exc:
            a.fail(self, exc)
