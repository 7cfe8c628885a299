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
  ``{"state": queued|running|done|failed, "reason", "artifacts": [names], ...}``.
* ``artifacts/<action>-<id>-<host>-<pid>.*`` — what the action produced.

Requests are validated on both sides: known actions only (:data:`ACTION_SPECS`), integer parameters
within bounds. Actions never run long on the training thread: a stack dump runs on the writer thread,
a deep profile starts and stops at step boundaries on the training thread and is exported on a thread
of its own.

Other modules add actions by registering a handler in :data:`ACTIONS` (and, for a new action name,
its parameters in :data:`ACTION_SPECS`). A handler receives a :class:`Job` and calls
:meth:`Job.done` or :meth:`Job.failed`, now or later; an exception it raises fails the request.

This module runs inside the job: standard library only.
"""

from __future__ import annotations

import json
import os
import re
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
STATES = ("queued", "running", "done", "failed")
FINAL_STATES = ("done", "failed")
NOT_AVAILABLE = "not available yet in this version"
MAX_REQUEST_BYTES = 16 * 1024
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


def _write_json(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}-{threading.get_native_id()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _read_json(path: str, limit: int = MAX_REQUEST_BYTES * 4) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    if len(data) > limit:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def write_request(
    run_dir: str, action: str, params: dict[str, Any] | None = None, target: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Validate and write a request into ``run_dir``'s mailbox; return it (with its id)."""
    action, norm, tgt = validate(action, params, target)
    control = os.path.join(run_dir, model.CONTROL_DIR)
    os.makedirs(control, mode=0o700, exist_ok=True)
    req = {
        "id": new_request_id(),
        "action": action,
        "target": tgt,
        "params": norm,
        "created_ns": time.time_ns(),
    }
    _write_json(os.path.join(control, f"req-{req['id']}.json"), req)
    return req


def read_request(run_dir: str, req_id: str) -> dict[str, Any] | None:
    if not _ID.match(req_id):
        return None
    return _read_json(os.path.join(run_dir, model.CONTROL_DIR, f"req-{req_id}.json"))


def request_states(run_dir: str, req_id: str) -> list[dict[str, Any]]:
    """The state files of one request: one per process that took it."""
    if not _ID.match(req_id):
        return []
    folder = os.path.join(run_dir, model.CONTROL_DIR, req_id)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        if name.endswith(".state"):
            doc = _read_json(os.path.join(folder, name))
            if doc is not None:
                out.append(doc)
    return out


def list_requests(run_dir: str) -> list[dict[str, Any]]:
    """Every request of the run, newest first, each with ``states`` (one per process that took it)."""
    control = os.path.join(run_dir, model.CONTROL_DIR)
    try:
        names = os.listdir(control)
    except OSError:
        return []
    out = []
    for name in names:
        if not (name.startswith("req-") and name.endswith(".json")):
            continue
        req = _read_json(os.path.join(control, name))
        if req is None or not isinstance(req.get("id"), str) or not _ID.match(req["id"]):
            continue
        out.append({**req, "states": request_states(run_dir, req["id"])})
    out.sort(key=lambda r: int(r.get("created_ns") or 0), reverse=True)
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
        return os.path.join(folder, f"{self.action}-{self.id}-{a.host}-{a.pid}{suffix}")

    def running(self, **info: Any) -> None:
        self._write("running", **info)

    def done(self, artifacts: list[str] | None = None, **info: Any) -> None:
        for p in artifacts or []:
            self.artifacts.append(os.path.basename(p))
        self._write("done", **info)

    def failed(self, reason: str) -> None:
        self._write("failed", reason=reason)

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
    from holoprof.collect.io_py import io_trace_job

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
        control = os.path.join(self.agent.run_dir, model.CONTROL_DIR)
        try:
            names = os.listdir(control)
        except OSError:
            return
        for name in sorted(names):
            if not (name.startswith("req-") and name.endswith(".json")):
                continue
            req_id = name[4:-5]
            if req_id in self._seen:
                continue
            self._seen.add(req_id)
            req = _read_json(os.path.join(control, name), MAX_REQUEST_BYTES)
            if req is None or req.get("id") != req_id or not _ID.match(req_id):
                continue
            created = req.get("created_ns")
            if not isinstance(created, int) or created < self._start_wall_ns:
                continue  # made before this process started: not meant for it
            if time.time_ns() - created > MAX_REQUEST_AGE_S * 1e9:
                continue
            if not self._addressed(req.get("target")):
                continue
            if os.path.exists(self.state_path(req_id)):
                continue  # taken already (by this very process)
            self._run(req)

    def _addressed(self, target: Any) -> bool:
        if target is None:
            return True
        if not isinstance(target, dict) or len(target) != 1:
            return False
        ident = self.agent.identity()
        ((key, value),) = target.items()
        if key not in TARGET_KEYS:
            return False
        return bool(ident.get(key) == value)

    def _run(self, req: dict[str, Any]) -> None:
        job = Job(self, str(req["id"]), str(req.get("action")), {}, int(req["created_ns"]))
        try:
            action, params, _ = validate(req.get("action"), req.get("params"), req.get("target"))
        except RequestError as exc:
            job.failed(f"invalid request: {exc}")
            return
        job.params = params
        job.running()
        handler = ACTIONS.get(action)
        if handler is None:
            job.failed(NOT_AVAILABLE)
            return
        try:
            handler(job)
        except Exception as exc:
            job.failed(f"{type(exc).__name__}: {exc}")

    def state_path(self, req_id: str) -> str:
        a = self.agent
        return os.path.join(a.run_dir, model.CONTROL_DIR, req_id, f"{a.host}-{a.pid}.state")

    def write_state(self, job: Job, info: dict[str, Any]) -> None:
        a = self.agent
        try:
            ident = a.identity()
            path = self.state_path(job.id)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
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
            _write_json(path, doc)
        except Exception as exc:
            a.fail(self, exc)
