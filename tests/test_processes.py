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
