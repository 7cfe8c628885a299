"""The control mailbox, agent side: on-demand actions requested while a job runs.

``holoprof ctl`` and ``holoprof serve`` write request files into ``<run>/control/`` (the format:
:mod:`holoprof.store.mailbox`); every traced process looks there about once a second (an agent poller,
on the writer thread), claims the requests addressed to it at most once, runs them and writes the
result into ``<run>/artifacts/``. A bad request file is refused with a reason; it never turns the
mailbox off.

Actions never run long on the training thread: a stack dump runs on the writer thread, a deep
profile (:mod:`holoprof.collect.deep_profile`) starts and stops at step boundaries on the training
thread and is exported on a thread of its own. What reads the job's tensors (the memory census) runs
on the training thread at the next step boundary (:meth:`ControlCollector.between_steps`): read from
another thread while the autograd engine or an in-place op changes them (without holding the GIL),
a tensor's ``.grad`` or storage can be freed under the reader, which crashes the job.

Other modules add actions by registering a handler in :data:`ACTIONS` (and, for a new action name,
its parameters in :data:`holoprof.store.mailbox.ACTION_SPECS`). A handler receives a :class:`Job` and
calls :meth:`Job.done` or :meth:`Job.failed`, now or later; an exception it raises fails the request.

This module runs inside the job: standard library only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from holoprof.agent.core import Agent, Collector, StepTracker, ThreadLoop
from holoprof.collect.deep_profile import DeepProfiler
from holoprof.collect.io_collector import io_trace_job
from holoprof.store import mailbox

#: How long a task for the next step boundary waits before it runs on the writer thread instead.
BETWEEN_STEPS_WAIT_S = 20.0


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
        return mailbox.artifact_path(a.run_dir, self.action, self.id, a.host, a.pid, suffix)

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
        if self.state in mailbox.FINAL_STATES:
            return
        self.state = state
        self.collector.write_state(self, info)


Handler = Callable[[Job], None]


def _stacks(job: Job) -> None:
    """Every Python thread's stack, as text."""
    import traceback  # lazy: only when stacks are asked for: not loaded at the agent's start-up

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


def _memory_snapshot(job: Job) -> None:
    # lazy: the memory collector (and the torch collector it reads) load when a snapshot is asked for,
    # not at every process's first flush (a DataLoader worker started with "spawn" has neither)
    from holoprof.collect.memory import memory_snapshot_handler

    memory_snapshot_handler(job)


#: Action handlers in this process. Actions of :data:`holoprof.store.mailbox.ACTION_SPECS` without a
#: handler here fail with "not available yet in this version".
ACTIONS: dict[str, Handler] = {
    "stacks": _stacks,
    "deep-profile": _deep_profile,
    "io-trace": io_trace_job,
    "memory-snapshot": _memory_snapshot,
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
        # requests from the agent's start on (this collector is installed at the first flush)
        self._start_wall_ns = agent.start_ns + agent.clock_offset_ns
        # tasks for the next step boundary: (task, deadline on the monotonic clock)
        self._boundary_tasks: list[tuple[Callable[[], None], float]] = []
        self._tasks_lock = threading.Lock()

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
        self._boundary_tasks = []
        self._tasks_lock = threading.Lock()
        if self.enabled and self.poll not in self.agent.pollers:
            self.agent.pollers.append(self.poll)

    def finish(self) -> None:
        self.deep.finish()
        self._run_tasks(expired_only=False)

    def between_steps(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the training thread at the next step boundary, where the loop changes no tensor.

        A process that has not started a step yet, or that sees no boundary within
        :data:`BETWEEN_STEPS_WAIT_S` (a long evaluation, a hang), runs it on the writer thread instead.
        """
        if not any(loop.start_ns is not None for loop in list(self.agent.steps.loops)):
            task()
            return
        with self._tasks_lock:
            self._boundary_tasks.append((task, time.monotonic() + BETWEEN_STEPS_WAIT_S))
        self.hook_steps()

    def _run_tasks(self, expired_only: bool) -> None:
        if not self._boundary_tasks:
            return
        now = time.monotonic()
        with self._tasks_lock:
            due = [t for t in self._boundary_tasks if not expired_only or t[1] <= now]
            self._boundary_tasks = [t for t in self._boundary_tasks if t not in due]
        for task, _ in due:
            task()  # a handler's task fails its own request; it never raises

    # step boundaries: the tracker's class is swapped for a subclass whose close() also calls us ----
    def hook_steps(self) -> None:
        tracker = self.agent.steps
        if self._hooked is tracker:
            return
        collector = self
        base = type(tracker)
        orig_close = base.close

        def close(tracker_self: StepTracker, t_ns: int, loop: ThreadLoop | None = None) -> None:
            orig_close(tracker_self, t_ns, loop)
            if collector.enabled:
                try:
                    collector.deep.on_boundary()
                    collector._run_tasks(expired_only=False)
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
            self._run_tasks(expired_only=True)
            self._poll_once()
        except Exception as exc:
            self.agent.fail(self, exc)
        return []

    def _poll_once(self) -> None:
        cfd = mailbox.control_fd(self.agent.run_dir)
        if cfd is None:
            return  # no mailbox (or not a real directory of the run): nothing to read
        try:
            try:
                names = os.listdir(cfd)
            except OSError:
                return
            for name in sorted(names):
                req_id = mailbox.request_id_of(name)
                if req_id is None or req_id in self._seen:
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
            mailbox.close_fd(cfd)

    def _take(self, cfd: int, name: str, req_id: str) -> None:
        """Read one request file; run it if it is addressed to this process, refuse it if it is bad."""
        if not mailbox.REQUEST_ID.match(req_id):
            return  # no state can be written for it: its name is not an id
        try:
            req, mtime_ns = mailbox.read_file(name, cfd)
        except mailbox.RequestError as exc:
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
        if time.time_ns() - created > mailbox.MAX_REQUEST_AGE_S * 1e9:
            return
        if self._taken(cfd, req_id):
            return  # taken already (by this very process)
        job = Job(self, req_id, str(req.get("action")), {}, created)
        try:
            action, params, target = mailbox.validate(req.get("action"), req.get("params"), req.get("target"))
        except mailbox.RequestError as exc:
            job.refused(f"invalid request: {exc}")  # by every process: it may have been meant for any
            return
        if self._addressed(target):
            job.params = params
            self._run(job, action)

    def _taken(self, cfd: int, req_id: str) -> bool:
        a = self.agent
        try:
            os.stat(
                os.path.join(req_id, mailbox.state_name(a.host, a.pid)), dir_fd=cfd, follow_symlinks=False
            )
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
            job.failed(mailbox.NOT_AVAILABLE)
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
            mailbox.write_state(a.run_dir, job.id, a.host, a.pid, doc)
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
