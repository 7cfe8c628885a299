"""The ``deep-profile`` action: torch.profiler (or TensorFlow's profiler) around the next N steps.

The control mailbox (:mod:`holoprof.collect.control`) arms a job; the profiler starts at the next step
boundary and stops N + 1 boundaries later (one warm-up step), both on the training thread; a thread
of its own exports the Chrome trace and a summary of the top ops into ``<run>/artifacts/``.

Standard library only at import time; torch (or TensorFlow) is touched only when a profile starts.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from typing import Any, Protocol

from holoprof.agent.core import Agent
from holoprof.store.mailbox import write_json

#: How long an armed deep profile waits for a training step before it gives up.
ARM_TIMEOUT_S = 600.0
#: Chrome traces larger than this are stored gzip-compressed.
GZIP_ABOVE_BYTES = 8 * 1024 * 1024
SUMMARY_OPS = 30


class StepHooks(Protocol):
    """What the profiler needs of the collector that owns it: the agent, and step boundaries."""

    @property
    def agent(self) -> Agent: ...

    def hook_steps(self) -> None:
        """From now on, call :meth:`DeepProfiler.on_boundary` at each step boundary."""


class ProfileJob(Protocol):
    """The request being answered (a :class:`holoprof.collect.control.Job`)."""

    @property
    def params(self) -> dict[str, int]: ...

    def artifact_path(self, suffix: str) -> str: ...

    def running(self, **info: Any) -> None: ...

    def done(self, artifacts: list[str] | None = None, **info: Any) -> None: ...

    def failed(self, reason: str) -> None: ...


class DeepProfiler:
    """torch.profiler around the next N training steps of this process (one profile at a time).

    The poller arms a job; the profiler starts at the next step boundary and stops N + 1 boundaries
    later (one warm-up step), both on the training thread; a thread of its own exports the result.
    """

    def __init__(self, collector: StepHooks) -> None:
        self.collector = collector
        self.lock = threading.Lock()
        self.armed: ProfileJob | None = None
        self.armed_at = 0.0
        self.active: ProfileJob | None = None
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

    def arm(self, job: ProfileJob) -> None:
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
            # only a TensorFlow job's profile needs it: the agent does not load it at start-up
            # lazy: loaded only when this runs, not when the agent starts
            from holoprof.collect.tf_profile import TFProfile

            return TFProfile(os.path.join(self.collector.agent.run_dir, "artifacts"))
        import torch  # lazy: optional dependency, loaded by the job already (arm checks)

        # lazy: the job's framework, imported by the job, never by the agent
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
    def _export(self, job: ProfileJob, prof: Any, steps: int, partial: bool) -> None:
        try:
            job.running(phase="exporting")
            trace = _export_trace(job, prof)
            summary = job.artifact_path(".summary.json")
            if hasattr(prof, "summarize"):  # TensorFlow's profiler
                doc = prof.summarize(steps, job.params["steps"])
            else:
                doc = summarize(prof, steps, job.params["steps"])
            doc["partial"] = partial
            doc["trace"] = os.path.basename(trace)
            write_json(summary, doc)
            job.done([trace, summary, *getattr(prof, "extra_artifacts", [])], steps=steps, partial=partial)
        except Exception as exc:
            job.failed(f"the profile could not be exported ({type(exc).__name__}: {exc})")


def _export_trace(job: ProfileJob, prof: Any) -> str:
    """Write the profile's Chrome trace (gzip-compressed when large); return its path."""
    import gzip  # lazy: only when a profile is exported: not loaded at the agent's start-up

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
    return trace


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
