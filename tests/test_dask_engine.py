"""The Dask engine on a real dask.distributed LocalCluster of 2 worker processes: reports (the I/O and
communication sections included), Chrome and TensorBoard exports and the Python API give the same
numbers and the same files as DuckDB, on a generated run, on a real traced workflow and on a real
2-rank DDP job."""

from __future__ import annotations

import os
import re
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import holoprof
from conftest import (
    TracedRun,
    error_lines,
    free_port,
    run_holoprof,
    script,
    traced,
    traced_with_agent_options,
)
from holoprof.bench.synth import generate_run
from holoprof.errors import HoloprofError
from workflows.runs import pipeline

DDP_SCRIPT = str(Path(__file__).resolve().parent / "dist_scripts" / "ddp_train.py")

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two worker processes, one thread each: every partition crosses a process boundary."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: Any) -> Iterator[Any]:
    with distributed.Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = os.path.join(str(tmp_path_factory.mktemp("dask-synth")), "run")
    generate_run(out, steps=4_000, ranks=3, chunk_steps=1_500, io_ops=True)
    return out


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    """A traced shell pipeline: several processes, a training loop, samples, an I/O op trace."""
    return pipeline(tmp_path_factory)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    """2 ranks (torchrun, gloo), DDP gradient buckets plus a synchronous loss all_reduce per step."""
    tmp = tmp_path_factory.mktemp("dask-ddp")
    run = traced(
        tmp, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(free_port()), DDP_SCRIPT,
        env={"DDP_SYNC_ALLREDUCE": "1", "DDP_STEPS": "6"}, timeout=180,
    )  # fmt: skip
    assert run.proc.returncode == 0, run.proc.stderr
    return run


def _report_on_cluster(run: Any, client: Any) -> tuple[dict[str, Any], set[str]]:
    """The Dask engine's report, and the names of the holoprof tasks the cluster's workers ran."""
    with distributed.get_task_stream(client=client) as ts:
        doc = holoprof.report(run, engine="dask", scheduler=client)
    names = set()
    for t in ts.data:
        key = t["key"]
        name = str(key[0] if isinstance(key, tuple) else key)
        if name.startswith("holoprof-"):  # holoprof-<aggregation>-<stage>-<tokens>
            parts = name.split("-")
            while re.fullmatch("[0-9a-f]+", parts[-1]):
                parts.pop()
            names.add("-".join(parts))
    return doc, names


def _same_report(duck: dict[str, Any], dask: dict[str, Any]) -> None:
    assert duck.pop("engine") == "duckdb" and dask.pop("engine") == "dask"
    for key in duck:
        assert dask[key] == duck[key], key
    assert set(dask) == set(duck)


def _export(run: str, fmt: str, out: Path, *extra: str) -> str:
    proc = run_holoprof("export", run, "--format", fmt, "-o", str(out), *extra, cwd=out.parent, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert len(error_lines(proc.stderr)) == 1 and "wrote" in proc.stderr, proc.stderr
    return proc.stderr


def _records(logdir: Path) -> list[bytes]:
    """The TFRecords of the one event file in ``logdir``, without the first (file version, wall clock
    of the export itself)."""
    (path,) = logdir.iterdir()
    data = path.read_bytes()
    out = []
    while data:
        n = struct.unpack("<Q", data[:8])[0]
        out.append(data[: 16 + n])
        data = data[16 + n :]
    return out[1:]


# --- report -----------------------------------------------------------------------------------------
def test_api_report_is_the_same_on_dask_for_a_generated_run(synth: str, client: Any) -> None:
    duck = holoprof.report(synth)
    dask = holoprof.report(synth, engine="dask", scheduler=client)
    assert dask["steps"]["count"] == 4_000 and len(dask["steps"]["per_rank"]) == 3
    _same_report(duck, dask)


def _asof_totals(rows: list[tuple[str, int, int, float]]) -> dict[int, float]:
    """At each instant a launcher sampled: the sum of every launcher's latest sample, a launcher
    counted from its first sample until three of its intervals after its last (what
    resources.summary's job.* figures are)."""
    times: dict[tuple[str, int], list[int]] = {}
    for host, pid, ts, _ in rows:
        times.setdefault((host, pid), []).append(ts)
    until = {k: max(t) + 3 * ((max(t) - min(t)) // (len(t) - 1)) for k, t in times.items()}
    latest: dict[tuple[str, int], float] = {}
    out: dict[int, float] = {}
    for host, pid, ts, v in sorted(rows, key=lambda r: r[2]):
        latest[(host, pid)] = v
        out[ts] = sum(x for k, x in latest.items() if min(times[k]) <= ts < until[k])
    return out


def test_the_hosts_job_totals_are_the_same_on_dask(client: Any, tmp_path: Path) -> None:
    """Four hosts, and a second launcher on node00 sampling half an interval later, that stops before
    the others: the job's RSS in ``resources.summary`` is, at each instant, the sum of every
    launcher's latest sample while it samples, on both engines."""
    from holoprof.bench.synth_hosts import generate_hosts_run
    from holoprof.store.chunks import write_chunk

    out = str(tmp_path / "run")
    generate_hosts_run(out, 4, 2, 10, samples_per_host=20)
    run = holoprof.load(out)
    (t0, t1, n), *_ = run.rows("SELECT min(ts_ns), max(ts_ns), count(DISTINCT ts_ns) FROM samples")
    half = (t1 - t0) // (n - 1) // 2
    ts = [t0 + half + i * 2 * half for i in range(12)]  # starts later and ends earlier than the others
    rows = {"host": ["node00"] * 12, "pid": [999] * 12, "rank": [-1] * 12, "ts_ns": ts,
            "name": ["job.rss_bytes"] * 12, "value": [1e9 + i for i in range(12)], "target_pid": [-1] * 12}  # fmt: skip
    write_chunk(out, "samples", rows, seq=0, writer=("node00", 999))
    samples = holoprof.load(out).rows(
        "SELECT host, pid, ts_ns, value FROM samples WHERE name = 'job.rss_bytes' AND target_pid = -1"
    )
    want = _asof_totals(samples)
    assert len(want) == 20 + 12
    # the second launcher no longer counts at the end: the four hosts' samples only
    assert want[t1] == pytest.approx(sum(v for _, pid, t, v in samples if t == t1 and pid != 999), rel=1e-12)
    assert want[ts[-1]] > 1e9 + sum(v for _, pid, t, v in samples if t == max(x for x in want if x < ts[-1]))
    duck = holoprof.report(out)
    dask = holoprof.report(out, engine="dask", scheduler=client)
    rss = duck["resources"]["summary"]["job.rss_bytes"]
    assert rss["mean"] == pytest.approx(sum(want.values()) / len(want), abs=1e-3)
    assert rss["max"] == pytest.approx(max(want.values()), abs=1e-3)
    assert rss["last"] == pytest.approx(want[max(want)], abs=1e-3)
    assert dask["resources"] == duck["resources"]
    _same_report(duck, dask)


def test_a_run_of_threads_that_dropped_spans_is_the_same_on_dask(client: Any, tmp_path: Path) -> None:
    """Four threads each marking 3,000 steps into a buffer of 100 spans: the exact counts, the kept
    steps of every loop thread and the warning are the same on both engines."""
    proc, run_dir = traced_with_agent_options(
        tmp_path, {"buffer_limit": 100}, sys.executable, script("thread_steps.py"), "4", "3000"
    )
    assert proc.returncode == 0 and "steps 12000" in proc.stdout, proc.stderr
    duck = holoprof.report(run_dir)
    dask = holoprof.report(run_dir, engine="dask", scheduler=client)
    assert dask["steps"]["count"] == 12_000 and 0 < dask["steps"]["kept"] < 12_000
    assert any("events were dropped" in w for w in dask["run"]["warnings"])
    _same_report(duck, dask)


def test_each_process_is_read_from_its_own_chunk_files_only(synth: str, client: Any) -> None:
    """Per-process analyses read the chunk files that can hold the process (by the Parquet
    statistics of pid), not every chunk of the run, and give DuckDB's numbers."""
    from holoprof.analyze.engine_dask import DaskEngine
    from holoprof.analyze.steps import step_processes, step_stats

    run = holoprof.load(synth)
    eng = DaskEngine(run, client)
    procs = step_processes(run, eng)
    assert len(procs) == 3
    every = run.chunks.files["spans"]
    for proc in procs:
        own = [f for f in every if Path(f).parent.parts[-2:] == (f"hostname={proc.host}", f"proc={proc.pid}")]
        assert 1 < len(own) < len(every)
        assert sorted(eng._files_of((proc.pid,))) == sorted(own)
        dask, duck = step_stats(run, proc, engine=eng), step_stats(run, proc)
        assert (dask.count, dask.epochs, dask.first_start_ns, dask.last_end_ns) == (
            duck.count, duck.epochs, duck.first_start_ns, duck.last_end_ns,
        )  # fmt: skip
        assert dask.phases == duck.phases and dask.timeline == duck.timeline


def test_api_report_and_export_are_the_same_on_dask_with_filters(
    synth: str, client: Any, tmp_path: Path
) -> None:
    def part() -> Any:
        return holoprof.load(synth, ranks=[1, 2], start_s=3.0, end_s=20.0, steps=(0, 1_200))

    duck = holoprof.report(part())
    dask = holoprof.report(part(), "dask", client)
    assert 0 < dask["steps"]["count"] < 1_200
    assert sorted(r["rank"] for r in dask["steps"]["per_rank"]) == [1, 2]
    _same_report(duck, dask)
    holoprof.export(part(), "chrome", str(tmp_path / "duck.json"))
    holoprof.export(part(), "chrome", str(tmp_path / "dask.json"), engine="dask", scheduler=client)
    assert (tmp_path / "dask.json").read_bytes() == (tmp_path / "duck.json").read_bytes()


def test_cli_report_is_the_same_on_dask_for_a_real_run(real: TracedRun, cluster: Any) -> None:
    import json

    proc = run_holoprof(
        "report", real.run_dir, "--json", "--engine", "dask", "--scheduler", cluster.scheduler_address,
        cwd=os.path.dirname(real.run_dir), timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    dask = json.loads(proc.stdout)
    assert dask["steps"]["count"] > 0 and dask["io"], "a real run with steps and I/O"
    duck = json.loads(json.dumps(holoprof.report(real.run_dir), default=str))
    _same_report(duck, dask)


# --- the I/O and communication sections ------------------------------------------------------------
#: the last task of each aggregation the two sections run on the cluster
IO_TASKS = {"holoprof-io-files-final", "holoprof-io-series-final", "holoprof-io-series-group"}
COMM_TASKS = {
    "holoprof-comm-collectives-final",
    "holoprof-comm-steps-group",
    "holoprof-comm-steps-final",
    "holoprof-comm-buckets-final",
    "holoprof-comm-backward-final",
}


def _sections(run: Any, eng: Any) -> dict[str, Any]:
    """The io and communication sections (with their findings) on ``eng``, from the context the
    report gives them."""
    from holoprof.analyze.comm import communication
    from holoprof.analyze.io import io_section
    from holoprof.analyze.steps import step_processes, step_stats

    procs = step_processes(run, eng)
    main = procs[0] if procs else None
    ctx = {
        "main": main,
        "steps": step_stats(run, main, engine=eng) if main else None,
        "step_processes": procs,
        "engine": eng,
    }
    out = {}
    for name, func in (("io", io_section), ("communication", communication)):
        section, found = func(run, ctx)
        out[name] = section
        out[name + "_findings"] = [f.to_dict() for f in found]
    return out


def test_ddp_io_and_communication_sections_run_on_the_cluster(ddp: TracedRun, client: Any) -> None:
    dask, tasks = _report_on_cluster(ddp.run_dir, client)
    duck = holoprof.report(ddp.run_dir)
    comm = duck["communication"]
    assert sorted(r["rank"] for r in comm["per_rank"]) == [0, 1] and comm["world_size"] == 2
    assert comm["buckets"] and comm["collectives"] and comm["exposed_s_per_step"] > 0
    assert all(r["comm_s"] > 0 for r in comm["per_rank"])
    assert duck["io"]["files"] > 0, "the DDP job reads its script and libraries"
    assert dask["communication"] == comm
    assert dask["io"] == duck["io"]
    _same_report(duck, dask)
    assert tasks >= IO_TASKS | COMM_TASKS, tasks


def test_ddp_sections_with_filters_are_the_same_on_the_cluster(ddp: TracedRun, client: Any) -> None:
    """A rank, a time window: the partitions' filters give DuckDB's views' numbers; the engine counts
    what it ran on the cluster."""
    from holoprof.analyze.engine import DuckDBEngine
    from holoprof.analyze.engine_dask import DaskEngine

    ran: set[str] = set()
    for where in ({"ranks": [1], "start_s": 0.5}, {"start_s": 0.5}):
        run = holoprof.load(ddp.run_dir, **where)
        eng = DaskEngine(run, client)
        dask = _sections(run, eng)
        duck_run = holoprof.load(ddp.run_dir, **where)
        duck = _sections(duck_run, DuckDBEngine(duck_run))
        assert dask == duck, where
        ranks = [r["rank"] for r in duck["communication"]["per_rank"]]
        assert ranks == ([1] if "ranks" in where else [0, 1]), where
        ran |= set(eng.aggregations)
    assert duck["io"]["files"] > 0, "the window holds I/O (of rank -1: before the process group)"
    assert {"io-files", "io-series", "comm-steps", "comm-collectives", "comm-buckets"} <= ran, ran


def test_failed_ranks_of_a_many_partition_run_are_found_on_the_cluster(
    synth: str, client: Any, tmp_path: Path
) -> None:
    """Rank 1 exits with code 3, rank 2 leaves no exit record: their last activity (a scan of every
    span) is merged in a tree of partial results over the run's 9 partitions."""
    import shutil
    import time

    from holoprof.store.chunks import write_chunk

    run_dir = str(tmp_path / "run")
    shutil.copytree(synth, run_dir)
    for rank, code, end in ((1, 3, 1), (2, None, None)):
        pid = 10_000 + rank
        write_chunk(
            run_dir, "processes",
            {"host": ["synth"], "pid": [pid], "rank": [rank], "world_size": [3], "role": ["rank"],
             "start_ns": [1], "end_ns": [end], "exit_code": [code], "updated_ns": [time.time_ns()],
             "info": ['{"source": "agent"}']},
            seq=900,
        )  # fmt: skip
    dask, tasks = _report_on_cluster(run_dir, client)
    duck = holoprof.report(run_dir)
    failed = duck["communication"]["failed_ranks"]
    assert [(f["rank"], f["exit_code"], f["steps"]) for f in failed] == [(2, None, 4_000), (1, 3, 4_000)]
    assert dask["communication"] == duck["communication"]
    _same_report(duck, dask)
    assert {"holoprof-comm-activity-combine", "holoprof-comm-activity-final"} <= tasks, tasks


#: the whole-table scans of the stages, memory and checkpoints sections and of the process table
WHOLE_RUN_TASKS = {
    "holoprof-stages-spans-final",
    "holoprof-stages-stage-spans-final",
    "holoprof-stages-samples-final",
    "holoprof-stages-ticks-final",
    "holoprof-stages-gpu-final",
    "holoprof-checkpoints-final",
    "holoprof-memory-snapshots-final",
    "holoprof-process-steps-final",
}


def test_io_stages_and_the_other_scans_of_a_real_run_run_on_the_cluster(real: TracedRun, client: Any) -> None:
    dask, tasks = _report_on_cluster(real.run_dir, client)
    duck = holoprof.report(real.run_dir)
    assert duck["io"]["files_read"] > 0 and duck["io"]["bandwidth_timeline"]
    assert dask["io"] == duck["io"]
    assert len(duck["stages"]) > 1 and any(p["steps"] > 0 for p in duck["processes"])
    assert dask["stages"] == duck["stages"] and dask["processes"] == duck["processes"]
    assert tasks >= IO_TASKS | WHOLE_RUN_TASKS, tasks - IO_TASKS


# --- exports ----------------------------------------------------------------------------------------
def test_chrome_export_is_byte_identical_on_a_generated_run(synth: str, cluster: Any, tmp_path: Path) -> None:
    _export(synth, "chrome", tmp_path / "duck.json")
    msg = _export(
        synth, "chrome", tmp_path / "dask.json", "--engine", "dask", "--scheduler", cluster.scheduler_address
    )
    assert "60000 spans" in msg
    assert (tmp_path / "dask.json").read_bytes() == (tmp_path / "duck.json").read_bytes()
    # a window
    win = ("--from", "2.5", "--to", "9")
    _export(synth, "chrome", tmp_path / "wduck.json", *win)
    _export(
        synth, "chrome", tmp_path / "wdask.json", *win, "--engine", "dask",
        "--scheduler", cluster.scheduler_address,
    )  # fmt: skip
    assert (tmp_path / "wdask.json").read_bytes() == (tmp_path / "wduck.json").read_bytes()
    assert (tmp_path / "wduck.json").stat().st_size < (tmp_path / "duck.json").stat().st_size / 2


def test_exports_in_small_pieces_write_the_same_files(
    synth: str, client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pieces that keep an export's memory flat do not change what it writes: a Chrome trace
    sorted under 64 MiB of DuckDB memory and read from the cluster one chunk at a time, and
    TensorBoard records computed about 500 steps at a time (4000 steps: 5 to 8 windows cut at
    quantiles of the step index), are the files of one piece, on both engines."""
    from holoprof.analyze import engine_dask, per_step
    from holoprof.exports import chrome_trace
    from holoprof.store import reader

    holoprof.export(synth, "chrome", str(tmp_path / "whole.json"))
    holoprof.export(synth, "tensorboard", str(tmp_path / "whole-tb"))
    seen: list[int] = []
    cut = reader.windows

    def windows(rows: int, col: str, quantiles: Any, size: int) -> Any:
        out = cut(rows, col, quantiles, size)
        seen.append(len(out))
        return out

    monkeypatch.setattr(chrome_trace, "SORT_MEMORY", 64 * 2**20)
    monkeypatch.setattr(engine_dask, "EXPORT_IN_FLIGHT", 1)
    monkeypatch.setattr(per_step, "STEP_WINDOW", 500)
    monkeypatch.setattr(per_step, "windows", windows)
    spilled = []
    with_limit = reader.Run.lean_memory

    def lean_memory(self: Any, limit: int | None = None) -> Any:
        spilled.append(limit)
        return with_limit(self, limit)

    monkeypatch.setattr(reader.Run, "lean_memory", lean_memory)
    for engine in ("duckdb", "dask"):
        sched = client if engine == "dask" else None
        holoprof.export(synth, "chrome", str(tmp_path / f"{engine}.json"), engine=engine, scheduler=sched)
        assert (tmp_path / f"{engine}.json").read_bytes() == (tmp_path / "whole.json").read_bytes(), engine
        assert 64 * 2**20 in spilled, spilled
        spilled.clear()
        holoprof.export(synth, "tensorboard", str(tmp_path / f"{engine}-tb"), engine=engine, scheduler=sched)
        assert _records(tmp_path / f"{engine}-tb") == _records(tmp_path / "whole-tb"), engine
        assert seen and seen[0] >= 5, (engine, seen)  # the steps in 5 windows or more
        seen.clear()


def test_chrome_export_is_byte_identical_on_a_real_run(real: TracedRun, cluster: Any, tmp_path: Path) -> None:
    import json

    _export(real.run_dir, "chrome", tmp_path / "duck.json")
    _export(
        real.run_dir, "chrome", tmp_path / "dask.json", "--engine", "dask",
        "--scheduler", cluster.scheduler_address,
    )  # fmt: skip
    duck = (tmp_path / "duck.json").read_bytes()
    assert (tmp_path / "dask.json").read_bytes() == duck
    events = json.loads(duck)["traceEvents"]
    kinds = {(e["ph"], e.get("cat")) for e in events}
    assert {("X", "step"), ("X", "phase"), ("X", "io"), ("C", None)} <= kinds, kinds
    assert len({e["pid"] for e in events if e["ph"] == "X"}) >= 3, "spans of several processes"


def test_tensorboard_export_has_the_same_records(
    synth: str, real: TracedRun, cluster: Any, tmp_path: Path
) -> None:
    for name, run in (("synth", synth), ("real", real.run_dir)):
        _export(run, "tensorboard", tmp_path / f"{name}-duck")
        _export(
            run, "tensorboard", tmp_path / f"{name}-dask", "--engine", "dask",
            "--scheduler", cluster.scheduler_address,
        )  # fmt: skip
        duck = _records(tmp_path / f"{name}-duck")
        assert len(duck) >= 4 and _records(tmp_path / f"{name}-dask") == duck, name


def test_api_export_on_dask_and_a_local_cluster_of_its_own(synth: str, client: Any, tmp_path: Path) -> None:
    _export(synth, "chrome", tmp_path / "duck.json")
    msg = holoprof.export(synth, "chrome", str(tmp_path / "api.json"), engine="dask", scheduler=client)
    assert msg.startswith("wrote ")
    assert (tmp_path / "api.json").read_bytes() == (tmp_path / "duck.json").read_bytes()
    assert client.status == "running", "a client of the caller's is left open"
    # no scheduler: the command starts (and stops) a local cluster of its own
    _export(synth, "chrome", tmp_path / "local.json", "--engine", "dask")
    assert (tmp_path / "local.json").read_bytes() == (tmp_path / "duck.json").read_bytes()


# --- errors -----------------------------------------------------------------------------------------
_NO_DASK = (
    "import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None; "
    "from holoprof.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize("command", ["report", "export"])
def test_without_the_dask_extra_the_install_line_is_printed(synth: str, tmp_path: Path, command: str) -> None:
    import subprocess

    from conftest import job_env

    args = [synth, "--engine", "dask"]
    if command == "export":
        args += ["--format", "chrome", "-o", str(tmp_path / "t.json")]
    proc = subprocess.run(
        [sys.executable, "-c", _NO_DASK, command, *args],
        cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert error_lines(proc.stderr) == [
        "holoprof: error: the Dask engine needs the 'dask[dataframe] distributed' package, which is not "
        "installed; install it with: pip install 'holoprof[dask]'"
    ]
    assert not (tmp_path / "t.json").exists()


def test_bad_scheduler_and_engine_arguments_are_one_line_errors(synth: str, tmp_path: Path) -> None:
    out = str(tmp_path / "t.json")
    proc = run_holoprof("export", synth, "-f", "chrome", "-o", out, "--scheduler", "tcp://x:1", cwd=tmp_path)
    assert proc.returncode == 2 and error_lines(proc.stderr) == [
        "holoprof: error: --scheduler goes with --engine dask"
    ]
    address = f"tcp://127.0.0.1:{free_port()}"
    proc = run_holoprof(
        "export", synth, "-f", "chrome", "-o", out, "--engine", "dask", "--scheduler", address, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert line.startswith(f"holoprof: error: cannot reach the Dask scheduler at {address}")
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")
    with pytest.raises(HoloprofError, match="unknown engine"):
        holoprof.export(synth, "chrome", out, engine="spark")
    with pytest.raises(HoloprofError, match="scheduler goes with"):
        holoprof.report(synth, scheduler="tcp://x:1")
