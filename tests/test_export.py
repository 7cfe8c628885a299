"""Exports: the Chrome trace (Perfetto) and TensorBoard event files, read back by their own readers."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import holoprof
from conftest import TracedRun, error_lines, run_holoprof
from test_comm import torchrun
from workflows.runs import PIPELINE_STEPS, pipeline


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    return pipeline(tmp_path_factory)


@pytest.fixture(scope="module")
def trace(run: TracedRun, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("chrome") / "trace.json"
    proc = run_holoprof("export", run.run_dir, "--format", "chrome", "-o", str(out), cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert isinstance(doc, dict)
    return doc


def test_chrome_trace_events_are_well_formed(trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    assert events
    for ev in events:
        assert {"name", "ph", "pid", "tid"} <= set(ev), ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "X":
            assert isinstance(ev["ts"], (int, float)) and ev["dur"] >= 0 and "cat" in ev, ev
        elif ev["ph"] == "C":
            assert isinstance(ev["ts"], (int, float)) and isinstance(ev["args"]["value"], (int, float)), ev
        elif ev["ph"] in ("b", "e"):
            assert isinstance(ev["ts"], (int, float)) and ev["cat"] == "comm" and ev["id2"]["local"], ev
        else:
            assert ev["ph"] == "M", ev


def test_chrome_trace_has_every_step_span_and_process(run: TracedRun, trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    loaded = holoprof.load(run.run_dir)
    n_steps = loaded.rows("SELECT count(*) FROM spans WHERE kind = 'step'")[0][0]
    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert len(steps) == n_steps == PIPELINE_STEPS
    n_spans = loaded.rows("SELECT count(*) FROM spans")[0][0]
    assert sum(1 for e in events if e["ph"] in ("X", "b") and e["cat"] != "io") == n_spans
    named = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    labels = {
        e["pid"]: e["args"]["labels"] for e in events if e["ph"] == "M" and e["name"] == "process_labels"
    }
    for p in run.report["processes"]:
        assert p["pid"] in named, p
        assert f"role={p['role']}" in labels[p["pid"]]
    traced = [p for p in run.report["processes"] if p["traced"] and p["role"] != "launcher"]
    assert len(traced) >= 3
    train = next(p for p in traced if p["steps"])
    assert "train.py" in named[train["pid"]]
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in steps} <= threads
    # resource samples: counters on the process they measure
    cpu = [e for e in events if e["ph"] == "C" and e["name"] == "proc.cpu_s" and e["pid"] == train["pid"]]
    assert cpu and max(e["args"]["value"] for e in cpu) > 0
    assert min(e["ts"] for e in steps) > 0, "microseconds since the run start"


def test_chrome_trace_has_the_io_operations_on_their_own_track(run: TracedRun, trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    n_ops = holoprof.load(run.run_dir).rows("SELECT count(*) FROM io_ops")[0][0]
    assert n_ops > 0, "the pipeline ran with --io-trace"
    io_tracks = {
        (e["pid"], e["tid"]) for e in events if e["name"] == "thread_name" and e["args"]["name"] == "I/O"
    }
    ops = [e for e in events if e["ph"] == "X" and e["cat"] == "io"]
    assert len(ops) == n_ops
    assert {(e["pid"], e["tid"]) for e in ops} <= io_tracks
    keys = [e for e in ops if e["args"]["path"].endswith("keys.txt") and e["args"]["op"] == "write"]
    assert keys and all(e["args"]["size_bytes"] > 0 for e in keys), "prepare.py wrote the keys"


def _ns(us: Decimal) -> int:
    """A trace time (decimal microseconds, as written) in whole nanoseconds, exactly."""
    return int(us * 1000)


def assert_valid_trace(doc: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """The slices of every track (pid, tid) nest (each one inside or after the one before it,
    compared in exact nanoseconds); every async begin has its end, no earlier, with the same
    category and name; no number in args is an integer JavaScript would round (beyond 2**53).
    Returns the complete events by track."""
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    begins: dict[tuple[int, str, str], dict[str, Any]] = {}
    for ev in doc["traceEvents"]:
        for v in (ev.get("args") or {}).values():
            assert not (isinstance(v, int) and abs(v) > 2**53), ev
        if ev["ph"] == "X":
            tracks[(ev["pid"], ev["tid"])].append(ev)
        elif ev["ph"] == "b":
            key = (ev["pid"], ev["cat"], ev["id2"]["local"])
            assert key not in begins, ev
            begins[key] = ev
        elif ev["ph"] == "e":
            b = begins.pop((ev["pid"], ev["cat"], ev["id2"]["local"]))
            assert b["name"] == ev["name"] and _ns(ev["ts"]) >= _ns(b["ts"]), (b, ev)
    assert not begins, "async begins without an end"
    for track, evs in tracks.items():
        evs.sort(key=lambda e: (_ns(e["ts"]), -_ns(e["dur"])))
        open_ends: list[tuple[int, dict[str, Any]]] = []
        for e in evs:
            start, end = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
            while open_ends and open_ends[-1][0] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1][0], (track, open_ends[-1][1], e)
            open_ends.append((end, e))
    return tracks


def _export_chrome(run_dir: str, out: Path) -> dict[str, Any]:
    proc = run_holoprof("export", run_dir, "--format", "chrome", "-o", str(out), cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(out.read_text(), parse_float=Decimal)
    return doc


def test_chrome_trace_of_a_workflow_nests_on_every_track(run: TracedRun, tmp_path: Path) -> None:
    doc = _export_chrome(run.run_dir, tmp_path / "t.json")
    tracks = assert_valid_trace(doc)
    assert sum(1 for evs in tracks.values() for e in evs if e["cat"] == "step") == PIPELINE_STEPS


def test_chrome_trace_of_epochs_nests_on_every_track(standard_run: TracedRun, tmp_path: Path) -> None:
    """Two epochs with an evaluation and a checkpoint between them: the first step of the second
    epoch starts at the fetch that ended the first, inside it, so epochs have their own track."""
    run = standard_run
    doc = _export_chrome(run.run_dir, tmp_path / "t.json")
    tracks = assert_valid_trace(doc)
    epochs = [e for evs in tracks.values() for e in evs if e["cat"] == "epoch"]
    n_epochs = holoprof.load(run.run_dir).rows("SELECT count(*) FROM spans WHERE kind = 'epoch'")[0][0]
    assert len(epochs) == n_epochs > 0
    names = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"
    }
    assert {names[(e["pid"], e["tid"])] for e in epochs} == {"epochs"}


def test_chrome_trace_of_a_ddp_run_nests_on_every_track(tmp_path: Path) -> None:
    """DDP with small buckets: several buckets (and their all_reduce) in flight at once per rank."""
    ddp = torchrun(tmp_path, {"DDP_BUCKET_CAP_MB": "0.0001", "DDP_STEPS": "4", "DDP_COLLECTIVES": "1"})
    assert ddp.proc.returncode == 0, ddp.proc.stderr
    loaded = holoprof.load(ddp.run_dir)
    in_flight = loaded.rows(
        """SELECT count(*) FROM spans a JOIN spans b ON a.pid = b.pid AND a.tid = b.tid
           AND a.span_id < b.span_id AND a.start_ns < b.start_ns AND b.start_ns < a.end_ns AND a.end_ns < b.end_ns
           WHERE a.name = 'ddp_bucket' AND b.name = 'ddp_bucket'"""
    )[0][0]
    assert in_flight > 0, "buckets overlap on one thread: the case to export"
    doc = _export_chrome(ddp.run_dir, tmp_path / "ddp.json")
    assert_valid_trace(doc)
    buckets = [e for e in doc["traceEvents"] if e["name"] == "ddp_bucket" and e["ph"] == "b"]
    n = loaded.rows("SELECT count(*) FROM spans WHERE name = 'ddp_bucket'")[0][0]
    assert len(buckets) == n > 0
    ready = {int(b["args"]["ready_ns"]) for b in buckets}  # exact, as a string
    assert ready == {
        r
        for (r,) in loaded.rows(
            "SELECT (attrs::JSON->>'ready_ns')::BIGINT FROM spans WHERE name = 'ddp_bucket'"
        )
    }
    assert all(isinstance(b["args"]["ready_ns"], str) for b in buckets)
    dask = tmp_path / "dask.json"
    proc = run_holoprof(
        "export", ddp.run_dir, "-f", "chrome", "-o", str(dask), "--engine", "dask", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert dask.read_bytes() == (tmp_path / "ddp.json").read_bytes(), "both engines write the same bytes"


def test_chrome_trace_window(run: TracedRun, trace: dict[str, Any], tmp_path: Path) -> None:
    steps = sorted((e for e in trace["traceEvents"] if e.get("cat") == "step"), key=lambda e: e["ts"])
    lo = steps[10]["ts"] / 1e6
    hi = steps[19]["ts"] / 1e6 + 1e-4
    out = tmp_path / "window.json"
    proc = run_holoprof(
        "export",
        run.run_dir,
        "-f",
        "chrome",
        "-o",
        str(out),
        "--from",
        str(lo),
        "--to",
        str(hi),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    events = json.loads(out.read_text())["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert all(e["ts"] + e["dur"] >= lo * 1e6 - 1 and e["ts"] <= hi * 1e6 + 1 for e in xs)
    assert 10 <= sum(1 for e in xs if e["cat"] == "step") <= 12
    assert all(lo * 1e6 - 1 <= e["ts"] <= hi * 1e6 + 1 for e in events if e["ph"] == "C")


def test_chrome_trace_is_deterministic_and_in_time_order(
    run: TracedRun, trace: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "again.json"
    proc = run_holoprof("export", run.run_dir, "-f", "chrome", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == trace, "the same run exports to the same events, in the same order"
    for ph, cat in (("X", "step"), ("X", "phase"), ("C", None), ("X", "io")):
        ts = [e["ts"] for e in trace["traceEvents"] if e["ph"] == ph and (cat is None or e["cat"] == cat)]
        assert ts and ts == sorted(ts), (ph, cat)


def test_tensorboard_reads_the_exported_scalars(run: TracedRun, tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="TensorBoard's reader is needed: pip install tensorboard (the dev extra)",
    )
    logdir = tmp_path / "tb"
    proc = run_holoprof("export", run.run_dir, "--format", "tensorboard", "-o", str(logdir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"step_time_s", "throughput_steps_per_s", "phase/forward_fraction", "memory/rss_bytes"} <= tags
    times = acc.Scalars("step_time_s")
    assert [e.step for e in times] == list(range(PIPELINE_STEPS))
    # each iteration sleeps 3 ms after its optimizer step; that time belongs to the iteration's step
    # (the last step ends at its update: what follows the last update belongs to no step)
    assert all(e.value > 0.003 for e in times[:-1]), "each step sleeps 3 ms"
    median = sorted(e.value for e in times)[PIPELINE_STEPS // 2]
    assert median == pytest.approx(run.report["steps"]["median_s"], rel=0.1)
    fractions = [acc.Scalars(t) for t in tags if t.startswith("phase/")]
    for i in range(PIPELINE_STEPS):
        assert sum(f[i].value for f in fractions) == pytest.approx(1.0, abs=1e-4)
    thr = acc.Scalars("throughput_steps_per_s")
    assert thr[0].value == pytest.approx(1 / times[0].value, rel=1e-5)


def test_export_of_a_missing_run_is_refused(tmp_path: Path) -> None:
    proc = run_holoprof("export", str(tmp_path / "nope"), "-f", "chrome", "-o", "t.json", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(error_lines(proc.stderr)) == 1 and "does not exist" in proc.stderr
    assert not (tmp_path / "t.json").exists()


def test_export_to_an_unknown_format_is_refused(run: TracedRun, tmp_path: Path) -> None:
    proc = run_holoprof("export", run.run_dir, "--format", "svg", "-o", "x", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = error_lines(proc.stderr)
    assert (
        line.startswith("holoprof: error: ") and "svg" in line and "chrome" in line and "tensorboard" in line
    )


def test_tensorboard_export_of_a_run_without_steps_says_so(tmp_path: Path) -> None:
    proc = run_holoprof("run", "--out", str(tmp_path / "r"), "--no-report", "--", "true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = run_holoprof("export", str(tmp_path / "r"), "-f", "tensorboard", "-o", "tb", cwd=tmp_path)
    assert proc.returncode == 2 and "no training steps" in proc.stderr


def _bare_run(tmp_path: Path, t0: int) -> str:
    """An empty finished run that started at ``t0``."""
    from holoprof.store import rundir

    run_dir = rundir.create_run_dir(str(tmp_path / "run"))
    manifest = rundir.new_manifest(["python", "edge.py"], "edge", {})
    manifest.update(start_ns=t0, end_ns=t0 + 10**9, status="finished", exit_code=0)
    rundir.write_manifest(run_dir, manifest)
    return run_dir


def test_chrome_events_formatted_by_duckdb_carry_every_record_exactly(tmp_path: Path) -> None:
    """DuckDB writes the events' text: names with quotes, backslashes, control and non-ASCII
    characters, attributes that are objects (with spaces around them), empty, or not objects, times
    before the run's start and sub-microsecond ones, null steps and parents, a second host, values
    that are not finite, and I/O records with nulls all read back (strict JSON) as their records."""
    import math

    from holoprof.bench.synth import T0_NS
    from holoprof.store.chunks import write_chunk

    t0 = T0_NS
    run_dir = _bare_run(tmp_path, t0)
    write_chunk(run_dir, "processes", {"host": ["a"], "pid": [1], "rank": [-1], "role": ["main"],
                                      "argv": ['["edge.py"]'], "start_ns": [t0], "end_ns": [t0 + 10**9]})  # fmt: skip
    names = ['say "hi"', "back\\slash", "line\nbreak\x01", "café ✓", "plain", "x", "y", "z"]
    attrs = [None, "", "{}", '{"a": 1, "b": [2]}', '  {"c": "d"}\n', "not an object", "[1, 2]", None]
    starts = [
        t0 - 2_500,
        t0,
        t0 + 1,
        t0 + 999,
        t0 + 1_234_500,
        t0 + 5_000_000,
        t0 + 6_000_000,
        t0 + 7_000_000,
    ]
    ends = [s + d for s, d in zip(starts, [1_000, 0, 999, 1, 10**6, 1_001, -5, 3_000], strict=True)]
    steps = [None, -1, 0, 5, 5, None, 7, 8]
    parents = [None, 0, 3, None, 7, 0, 0, 1]
    hosts = ["a", "a", "a", "a", "a", "b", "b", "a"]
    tids = [1, 1, 1, 1, 1, 2, 2, 1]
    n = len(names)
    write_chunk(run_dir, "spans", {
        "host": hosts, "pid": [1] * n, "tid": tids, "span_id": list(range(10, 10 + n)),
        "parent_id": parents, "kind": ["phase"] * 7 + ['odd "kind"'], "name": names, "start_ns": starts,
        "end_ns": ends, "step": steps, "attrs": attrs,
    })  # fmt: skip
    values = [0.1, 1e20, float("nan"), float("inf"), None, 95.0]
    write_chunk(run_dir, "samples", {
        "host": ["a"] * 5 + ["b"], "pid": [1] * 6, "ts_ns": [t0 + i * 10**6 for i in range(6)],
        "name": ["job.cpu_percent", "job.x", "job.y", "proc.rss", "job.z", "proc.cpu"], "value": values,
        "target_pid": [-1, -1, -1, 1, -1, 3],
    })  # fmt: skip
    write_chunk(run_dir, "io_ops", {
        "host": ["a", "a", "b"], "pid": [1, 1, 1], "module": ["POSIX", None, "STDIO"],
        "path": ["/data/shard-0.bin", None, "rel/name"], "op": ["read", "write", None],
        "offset": [4096, None, 0], "size_bytes": [65536, 7, None],
        "start_ns": [t0 + 10, t0 + 20, t0 + 30], "end_ns": [t0 + 2_010, t0 + 19, t0 + 31],
    })  # fmt: skip

    out = tmp_path / "trace.json"
    holoprof.export(run_dir, "chrome", str(out))

    def strict(c: str) -> Any:
        raise AssertionError(f"{c} is not JSON")

    events = json.loads(out.read_text(encoding="utf-8"), parse_constant=strict)["traceEvents"]
    pid_b = 1 + (1 << 22)  # the second host's pids move by HOST_STRIDE
    spans = [e for e in events if e["ph"] == "X" and e["cat"] != "io"]
    assert len(spans) == n
    by_id = {e["args"]["span_id"]: e for e in spans}
    for i in range(n):
        e = by_id[10 + i]
        args: dict[str, Any] = {}
        a = (attrs[i] or "").strip()
        if a.startswith("{") and a.endswith("}") and len(a) > 2:
            args.update(json.loads(a))
        elif attrs[i] and a != "{}":
            args["attrs"] = a
        args["span_id"] = 10 + i
        if steps[i] is not None and steps[i] >= 0:  # type: ignore[operator]
            args["step"] = steps[i]
        if parents[i]:
            args["parent_id"] = parents[i]
        assert e == {
            "name": names[i], "cat": "odd \"kind\"" if i == 7 else "phase", "ph": "X",
            "ts": (starts[i] - t0) / 1000, "dur": max(0, ends[i] - starts[i]) / 1000,
            "pid": pid_b if hosts[i] == "b" else 1, "tid": tids[i],
            "args": args,
        }, i  # fmt: skip
    assert [e["ts"] for e in spans] == sorted(e["ts"] for e in spans)
    counters = [e for e in events if e["ph"] == "C"]
    got = {e["name"]: (e["pid"], e["args"]["value"], e["ts"]) for e in counters}
    assert got["job.cpu_percent"] == (1, 0.1, 0)
    assert got["job.x"][1] == 1e20 and got["job.y"][1] is None and got["proc.rss"] == (1, None, 3000)
    assert got["job.z"][1] == 0.0 and got["proc.cpu"] == (3 + (1 << 22), 95.0, 5000)
    assert not any(isinstance(v, float) and math.isnan(v) for _, v, _ in got.values())
    ios = [e for e in events if e.get("cat") == "io"]
    assert [(e["name"], e["pid"], e["tid"], e["ts"], e["dur"], e["args"]) for e in ios] == [
        ("read shard-0.bin", 1, 2**31 - 2, 0.01, 2.0,
         {"path": "/data/shard-0.bin", "op": "read", "module": "POSIX", "offset": 4096, "size_bytes": 65536}),
        ("write ", 1, 2**31 - 2, 0.02, 0,
         {"path": None, "op": "write", "module": None, "offset": None, "size_bytes": 7}),
        (" name", pid_b, 2**31 - 2, 0.03, 0.001,
         {"path": "rel/name", "op": None, "module": "STDIO", "offset": 0, "size_bytes": None}),
    ]  # fmt: skip
    io_threads = {
        (e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name" and e["tid"] == 2**31 - 2
    }
    assert io_threads == {(1, "I/O"), (pid_b, "I/O")}


def test_chrome_trace_of_many_hosts_extreme_times_and_odd_paths(tmp_path: Path) -> None:
    """600 hosts get 600 separate pid ranges (past 2**31); times at the ends of int64 and a file
    path with a line break are written, not refused."""
    from holoprof.store.chunks import write_chunk

    t0 = 10**18
    run_dir = _bare_run(tmp_path, t0)
    hosts = [f"node{i:04d}" for i in range(600)]
    n = len(hosts)
    write_chunk(run_dir, "spans", {
        "host": hosts, "pid": [7] * n, "tid": [7] * n, "span_id": list(range(n)), "kind": ["phase"] * n,
        "name": ["forward"] * n, "start_ns": [t0 + i for i in range(n)], "end_ns": [t0 + 2 * i for i in range(n)],
    })  # fmt: skip
    lo, hi = -(2**63) + 1, 2**63 - 1
    write_chunk(run_dir, "spans", {
        "host": ["node0000"] * 3, "pid": [7] * 3, "tid": [7] * 3, "span_id": [-1, -2, -3], "kind": ["odd"] * 3,
        "name": ["early", "late", "backwards"], "start_ns": [lo, 2**62, t0], "end_ns": [hi, hi, t0 - 5],
    })  # fmt: skip
    write_chunk(run_dir, "io_ops", {
        "host": ["node0001"], "pid": [7], "path": ["/data/we\nird/f.bin"], "op": ["read"],
        "start_ns": [t0], "end_ns": [t0 + 1],
    })  # fmt: skip
    out = tmp_path / "trace.json"
    holoprof.export(run_dir, "chrome", str(out))
    with open(out, encoding="utf-8") as f:
        events = json.load(f, parse_float=str)["traceEvents"]  # the decimals as written
    spans = {e["args"]["span_id"]: e for e in events if e.get("cat") == "phase"}
    assert sorted(e["pid"] for e in spans.values()) == [7 + i * (1 << 22) for i in range(n)]
    odd = {e["name"]: e for e in events if e.get("cat") == "odd"}
    assert odd["early"]["ts"] == f"-{(t0 - lo) // 1000}.{(t0 - lo) % 1000:03d}".rstrip("0")
    assert odd["early"]["dur"] == f"{(hi - lo) // 1000}.{(hi - lo) % 1000:03d}".rstrip("0")
    late = 2**62 - t0
    assert odd["late"]["ts"] == f"{late // 1000}.{late % 1000:03d}".rstrip("0")
    assert odd["late"]["dur"] == f"{(hi - 2**62) // 1000}.{(hi - 2**62) % 1000:03d}".rstrip("0")
    assert odd["backwards"]["ts"] == 0 and odd["backwards"]["dur"] == 0
    (io,) = [e for e in events if e.get("cat") == "io"]
    assert io["name"] == "read f.bin" and io["pid"] == 7 + (1 << 22)
