"""TensorFlow's own profiler for on-demand deep profiles of TensorFlow/Keras jobs.

Used by the control mailbox's ``deep-profile`` action when the process runs TensorFlow and not
PyTorch. It has the shape of ``torch.profiler.profile`` that the deep profiler drives: ``start()`` at
a step boundary, ``step()`` at each following boundary (the first step is the warm-up, then
``tf.profiler.experimental.start`` records), ``stop()``. TensorFlow writes its XPlane trace (what
TensorBoard's profile plugin and XProf open); holoprof keeps it, converts it to a Chrome trace, and
summarizes the top ops by self time, from TensorFlow's own protobuf definitions.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections import defaultdict
from typing import Any


class TFProfile:
    def __init__(self, artifacts_dir: str) -> None:
        self.logdir = tempfile.mkdtemp(prefix="holoprof-tfprof-", dir=artifacts_dir)
        self.steps_seen = 0
        self.recording = False
        self.extra_artifacts: list[str] = []

    def start(self) -> None:
        self.steps_seen = 0

    def step(self) -> None:
        self.steps_seen += 1
        if self.steps_seen == 1 and not self.recording:  # after one warm-up step
            # lazy: the job's framework, imported by the job, never by the agent
            import tensorflow as tf

            tf.profiler.experimental.start(self.logdir)
            self.recording = True

    def stop(self) -> None:
        if self.recording:
            # lazy: the job's framework, imported by the job, never by the agent
            import tensorflow as tf

            tf.profiler.experimental.stop()
            self.recording = False

    # -- export (on the exporter thread) -----------------------------------------------------------
    def _xspace(self) -> Any:
        # lazy: the job's framework, imported by the job, never by the agent
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

        files = sorted(glob.glob(os.path.join(self.logdir, "**", "*.xplane.pb"), recursive=True))
        if not files:
            raise RuntimeError("TensorFlow's profiler wrote no trace (no step ran while it recorded?)")
        space = xplane_pb2.XSpace()
        with open(files[-1], "rb") as f:
            space.ParseFromString(f.read())
        self.xplane_file = files[-1]
        return space

    def _events(self) -> list[tuple[str, str, int, int, str]]:
        """(plane, line, start_ns, duration_ns, op name) for every event of the host and device planes."""
        space = self._xspace()
        out = []
        for plane in space.planes:
            names = {k: v.name for k, v in plane.event_metadata.items()}
            for line in plane.lines:
                base = int(line.timestamp_ns)
                for ev in line.events:
                    start = base + int(ev.offset_ps) // 1000
                    out.append(
                        (
                            plane.name,
                            line.name or str(line.id),
                            start,
                            int(ev.duration_ps) // 1000,
                            names.get(ev.metadata_id, "?"),
                        )
                    )
        return out

    def export_chrome_trace(self, path: str) -> None:
        events = self._events()
        t0 = min((e[2] for e in events), default=0)
        pids: dict[str, int] = {}
        tids: dict[tuple[str, str], int] = {}
        with open(path, "w") as f:
            f.write('{"traceEvents": [\n')
            first = True

            def emit(obj: dict[str, Any]) -> None:
                nonlocal first
                f.write(("" if first else ",\n") + json.dumps(obj))
                first = False

            for plane, line, start, dur, name in events:
                pid = pids.setdefault(plane, len(pids) + 1)
                key = (plane, line)
                if key not in tids:
                    tids[key] = len(tids) + 1
                    if len([k for k in tids if k[0] == plane]) == 1:
                        emit({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": plane}})
                    emit(
                        {
                            "ph": "M",
                            "name": "thread_name",
                            "pid": pid,
                            "tid": tids[key],
                            "args": {"name": line},
                        }
                    )
                emit(
                    {
                        "ph": "X",
                        "name": name,
                        "pid": pid,
                        "tid": tids[key],
                        "ts": (start - t0) / 1000,
                        "dur": dur / 1000,
                    }
                )
            f.write('\n], "displayTimeUnit": "ms"}\n')
        base = path[: -len(".tmp")] if path.endswith(".tmp") else path
        base = base[: -len(".json")] if base.endswith(".json") else base
        shutil.copy(self.xplane_file, base + ".xplane.pb")  # opens in TensorBoard's profile plugin / XProf
        self.extra_artifacts = [base + ".xplane.pb"]

    def summarize(self, steps: int, requested: int, top: int = 30) -> dict[str, Any]:
        """Top ops by time (events on the host threads that ran TensorFlow ops and on devices)."""
        agg: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for plane, _line, _start, dur, name in self._events():
            if plane.startswith("/host:metadata") or name.startswith(("TraceContext", "$")):
                continue
            a = agg[name]
            a[0] += 1
            a[1] += dur / 1000.0
        total = sum(v[1] for v in agg.values()) or 1.0
        ops = [
            {
                "name": name,
                "calls": int(v[0]),
                "self_cpu_us": round(v[1], 3),
                "total_cpu_us": round(v[1], 3),
                "self_cpu_fraction": round(v[1] / total, 6),
                "input_shapes": "",
            }
            for name, v in sorted(agg.items(), key=lambda kv: kv[1][1], reverse=True)[:top]
        ]
        shutil.rmtree(self.logdir, ignore_errors=True)
        return {
            "schema": "holoprof.deep-profile/1",
            "framework": "tensorflow",
            "steps": steps,
            "requested_steps": requested,
            "warmup_steps": 1,
            "self_cpu_total_us": round(total, 3),
            "ops": ops,
            "note": "TensorFlow's profiler events aggregated by name (time includes nested events)",
        }
