"""Every Python process of a job is traced: DataLoader workers, ranks, pipelines, user sitecustomize."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import holoprof
from conftest import (
    SCRIPTS,
    TracedRun,
    free_port,
    main_process,
    processes_by_role,
    script,
    traced,
)


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_are_traced(tmp_path: Path, context: str) -> None:
    run = traced(
        tmp_path, script("train.py"), "--workers", "2", "--mp-context", context,
        "--epochs", "1", "--batches", "4", "--no-eval",
    )  # fmt: skip
    assert run.proc.returncode == 0, run.proc.stderr
    doc = run.report
    main = main_process(doc)
    assert main["traced"] and main["steps"] == 4
    assert doc["steps"]["count"] == 4
    assert doc["steps"]["process"]["pid"] == main["pid"]
    workers = processes_by_role(doc, "dataloader_worker")
    assert len(workers) >= 2, doc["processes"]
    assert all(w["traced"] for w in workers), workers
    assert len({w["pid"] for w in workers} | {main["pid"]}) == len(workers) + 1
    assert all(w["steps"] == 0 for w in workers), "workers load data; they run no training steps"

    if context == "forkserver":
        servers = processes_by_role(doc, "forkserver")
        assert len(servers) == 1 and servers[0]["traced"], doc["processes"]
        assert {w["ppid"] for w in workers} == {servers[0]["pid"]}, "the fork server forks the workers"
    else:
        assert {w["ppid"] for w in workers} == {main["pid"]}

    # the same from Python: the processes table holds one row per process
    rows = holoprof.load(run.run_dir).processes.filter("role = 'dataloader_worker'").fetchall()
    assert len(rows) == len(workers)


def ranks_of(run: TracedRun) -> dict[int, dict]:
    ranked = processes_by_role(run.report, "rank")
    by_rank = {p["rank"]: p for p in ranked}
    assert len(by_rank) == len(ranked), ranked
    return by_rank


def test_torch_multiprocessing_spawn_ranks_are_traced(tmp_path: Path) -> None:
    run = traced(tmp_path, script("ddp.py"), "spawn", str(free_port()))
    assert run.proc.returncode == 0, run.proc.stderr
    assert "rank 0 final loss" in run.proc.stdout and "rank 1 final loss" in run.proc.stdout
    by_rank = ranks_of(run)
    assert sorted(by_rank) == [0, 1], run.report["processes"]
    for r in (0, 1):
        assert by_rank[r]["traced"]
        assert by_rank[r]["steps"] == 6
        assert by_rank[r]["world_size"] == 2
    assert run.report["run"]["ranks"] == 2
    assert run.report["steps"]["count"] == 6
    assert sorted(p["rank"] for p in run.report["steps"]["per_rank"]) == [0, 1]


def test_torchrun_ranks_are_traced(tmp_path: Path) -> None:
    run = traced(
        tmp_path, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(free_port()), script("ddp.py"),
    )  # fmt: skip
    assert run.proc.returncode == 0, run.proc.stderr
    by_rank = ranks_of(run)
    assert sorted(by_rank) == [0, 1], run.report["processes"]
    for r in (0, 1):
        assert by_rank[r]["traced"]
        assert by_rank[r]["steps"] == 6
        assert by_rank[r]["local_rank"] == r
        assert by_rank[r]["world_size"] == 2
    assert run.report["run"]["ranks"] == 2
    assert main_process(run.report)["traced"], "torchrun's own process is traced too"


def test_shell_pipeline_processes_are_traced(tmp_path: Path) -> None:
    py = sys.executable
    pipeline = f"{py} {script('produce.py')} 5 | {py} {script('consume.py')}"
    run = traced(tmp_path, "bash", "-c", pipeline)
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.proc.stdout.strip() == "sum 10"
    by_script = {}
    for p in run.report["processes"]:
        for name in ("produce.py", "consume.py"):
            if p["argv"] and p["argv"][0].endswith(name):
                by_script[name] = p
    assert set(by_script) == {"produce.py", "consume.py"}, run.report["processes"]
    for p in by_script.values():
        assert p["traced"]
        assert p["steps"] == 5
    assert by_script["produce.py"]["ppid"] == by_script["consume.py"]["ppid"], "both children of bash"


def test_each_process_has_the_status_it_exited_with(tmp_path: Path) -> None:
    """The status a process gives ``exit()`` (``sys.exit(n)``, an uncaught exception's 1, a normal end's
    0) or ``os._exit`` is its ``exit_code``; a process killed by SIGKILL has none to give (-1); one that a
    ``KeyboardInterrupt`` ended dies of SIGINT, which the agent saw coming (130)."""
    py = sys.executable
    steps = [
        f"{py} -c 'import sys; sys.exit(5)'",
        f"{py} -c 'pass'",
        f"{py} -c 'raise SystemExit(\"bad input\")'",
        f"{py} -c 'import os; os._exit(7)'",
        f"{py} -c 'raise ValueError(3)'",
        f"{py} -c 'import os, signal, time; time.sleep(1.5); os.kill(os.getpid(), signal.SIGKILL)'",
        f"{py} -c 'raise KeyboardInterrupt'",  # the interpreter ends it with SIGINT: 128 + 2
    ]
    run = traced(tmp_path, "bash", "-c", "; ".join(steps) + "; exit 0")
    assert run.proc.returncode == 0, run.proc.stderr
    # each is `python -c` to the agent (sys.argv), started one after the other
    pythons = sorted((p for p in run.report["processes"] if p["argv"] == ["-c"]), key=lambda p: p["start_ns"])
    assert [p["exit_code"] for p in pythons] == [5, 0, 1, 7, 1, -1, 130], pythons


def test_user_sitecustomize_still_runs(tmp_path: Path) -> None:
    marker = tmp_path / "sitecustomize-ran"
    run = traced(
        tmp_path,
        script("manual_steps.py"),
        "3",
        "--phases",
        env={"PYTHONPATH": str(SCRIPTS / "user_site"), "USER_SITECUSTOMIZE_MARKER": str(marker)},
    )
    assert run.proc.returncode == 0, run.proc.stderr
    assert "user sitecustomize ran" in run.proc.stdout
    main = main_process(run.report)
    pids = {int(x) for x in marker.read_text().split()}
    assert main["pid"] in pids, "the job's own sitecustomize ran in the traced process"
    assert main["traced"] and main["steps"] == 3


def test_the_launcher_finishes_a_run_from_its_processes_rows_without_loading_it(tmp_path: Path) -> None:
    """After the job, ``holoprof run`` records the processes' exit times and measures the CPU peak for
    the FLOPs the job counted from the small ``processes`` table alone (no DuckDB, about 0.2 s of CPU
    a run less); what it writes is what loading the run would have given."""
    from holoprof.launch import peak
    from holoprof.store import native_dumps, process_rows
    from holoprof.store.sidefiles import read_peaks

    run = traced(
        tmp_path, script("train.py"), "--workers", "2", "--epochs", "1", "--batches", "4", "--no-eval",
        env={"PYTHONPROFILEIMPORTTIME": "1"},  # the launcher's imports (and the job's) on stderr
    )  # fmt: skip
    assert run.proc.returncode == 0, run.proc.stderr
    imported = {line.rpartition("|")[2].strip() for line in run.proc.stderr.splitlines() if "|" in line}
    assert "pyarrow.lib" in imported and "torch" in imported  # the launcher's, and the job's
    assert not any(m == "duckdb" or m.startswith("duckdb.") for m in imported)
    assert native_dumps.exit_files(run.run_dir) == [], "every exit time went into the table"
    loaded = holoprof.load(run.run_dir)
    view = sorted(loaded.rows("SELECT host, pid, role, start_ns, end_ns, updated_ns, info FROM processes"))
    rows = process_rows.newest_rows(run.run_dir)
    assert rows is not None and len(rows) == len(view) >= 4  # launcher, main, two workers
    cols = ("host", "pid", "role", "start_ns", "end_ns", "updated_ns", "info")
    assert sorted(tuple(r[c] for c in cols) for r in rows) == view
    # the peak it measured is the one the spans ask for
    need = peak.wanted(loaded)
    assert need and peak.wanted_from_processes(run.run_dir) == need
    measured = {(e["dtype"], e["threads"]) for e in read_peaks(run.run_dir) if e.get("device") == "cpu"}
    assert {(w["dtype"], w["threads"]) for w in need} <= measured


def test_rows_left_in_raw_chunks_make_the_launcher_load_the_run(tmp_path: Path) -> None:
    """A ``processes`` chunk not converted (a converter that did not finish) is read only by loading the
    run, which converts it: the light read says so instead of missing its rows."""
    from holoprof.store import process_rows
    from holoprof.store.raw import write_raw

    run = traced(tmp_path, sys.executable, "-c", "pass")
    assert run.proc.returncode == 0, run.proc.stderr
    assert process_rows.newest_rows(run.run_dir) is not None
    staging = Path(run.run_dir) / "somehost-4242"
    staging.mkdir()
    write_raw(str(staging), "processes", {"host": ["somehost"], "pid": [4242]}, seq=0)
    assert process_rows.newest_rows(run.run_dir) is None
