"""The Python API: holoprof.trace / start / stop, the stage, phase and step markers, holoprof.load."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import duckdb
import pytest

import holoprof
from conftest import TracedRun, report_json, run_python, script, traced


class ApiRun:
    def __init__(self, proc, run_dir: str) -> None:
        self.proc = proc
        self.run_dir = run_dir
        self.run = holoprof.load(run_dir)


@pytest.fixture(scope="module")
def api_run(tmp_path_factory: pytest.TempPathFactory) -> ApiRun:
    tmp = tmp_path_factory.mktemp("api")
    out = str(tmp / "run")
    proc = run_python(script("api_trace.py"), out, "5", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert f"run_dir {out}" in proc.stdout
    return ApiRun(proc, out)


def test_trace_writes_a_run_that_loads(api_run: ApiRun) -> None:
    assert stat.S_IMODE(os.stat(api_run.run_dir).st_mode) == 0o700
    m = json.loads((Path(api_run.run_dir) / "manifest.json").read_text())
    assert m["status"] == "finished"
    assert api_run.run.status == "finished"
    doc = report_json(api_run.run_dir)
    assert doc["steps"]["count"] == 5, "one step per optimizer step"
    assert doc["run"]["status"] == "finished"
    assert doc["phases"]["forward"]["fraction"] > 0
    assert doc["phases"]["backward"]["fraction"] > 0


def test_trace_records_the_calling_process_as_main(api_run: ApiRun) -> None:
    rows = api_run.run.processes.filter("role = 'main'").fetchall()
    assert len(rows) == 1
    cols = api_run.run.processes.columns
    row = dict(zip(cols, rows[0], strict=True))
    assert row["end_ns"] > 0, "stop() wrote the final record"
    assert "torch" in json.loads(row["versions"]), "torch imported inside the block is traced"


def test_stage_marker_is_recorded(api_run: ApiRun) -> None:
    stages = api_run.run.spans.filter("kind = 'stage'").project("name, start_ns, end_ns").fetchall()
    assert [s[0] for s in stages] == ["train"]
    (_, start, end) = stages[0]
    steps = api_run.run.rows("SELECT min(start_ns), max(end_ns) FROM spans WHERE kind = 'step'")[0]
    assert start <= steps[0] and steps[1] <= end, "the steps ran inside the stage"


def test_standard_phase_marker_counts_as_that_phase(api_run: ApiRun) -> None:
    n = api_run.run.rows("SELECT count(*) FROM spans WHERE kind = 'phase' AND name = 'forward'")[0][0]
    assert n == 5, (
        "one forward per iteration, marked by holoprof.phase; the module call inside is not doubled"
    )


def test_custom_phase_marker_is_a_user_span(api_run: ApiRun) -> None:
    rows = api_run.run.rows("SELECT kind, end_ns - start_ns FROM spans WHERE name = 'custom'")
    assert len(rows) == 5
    assert all(kind == "user" for kind, _ in rows)
    assert all(d >= 2_000_000 for _, d in rows), "each custom block slept 2 ms"


def test_markers_after_stop_record_nothing(api_run: ApiRun) -> None:
    names = {
        r[0] for r in api_run.run.rows("SELECT DISTINCT name FROM spans WHERE kind IN ('stage', 'user')")
    }
    assert "after" not in names
    assert "final loss" in api_run.proc.stdout


def test_load_returns_duckdb_relations(api_run: ApiRun) -> None:
    run = holoprof.load(api_run.run_dir)
    for table in ("spans", "samples", "io_files", "io_ops", "processes"):
        rel = getattr(run, table)
        assert isinstance(rel, duckdb.DuckDBPyRelation), table
        assert isinstance(rel.fetchall(), list)
    assert len(run.spans.filter("kind = 'step'").fetchall()) == 5
    assert run.sql("SELECT count(*) FROM samples").fetchone()[0] > 0, "resources were sampled"
    # a half-read SQL result does not block the relations of the same run
    assert len(run.spans.filter("kind = 'step'").fetchall()) == 5


def test_load_of_a_bad_path_raises_a_holoprof_error(tmp_path: Path) -> None:
    with pytest.raises(holoprof.HoloprofError, match="does not exist"):
        holoprof.load(tmp_path / "nope")


def test_markers_do_nothing_when_nothing_is_traced() -> None:
    before = holoprof.api._agent()
    assert before is None, "this test process is not traced"
    with holoprof.stage("s"), holoprof.phase("forward"), holoprof.phase("custom"):
        holoprof.step()
    assert holoprof.stop() is None
    assert holoprof.api._agent() is None


def test_markers_do_nothing_in_an_untraced_script(tmp_path: Path) -> None:
    code = (
        "import holoprof\n"
        "with holoprof.stage('s'), holoprof.phase('forward'), holoprof.phase('custom'):\n"
        "    holoprof.step()\n"
        "print('done', holoprof.stop())\n"
    )
    proc = run_python("-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done None"
    assert proc.stderr == ""
    assert os.listdir(tmp_path) == [], "no run directory appears"


def test_trace_under_holoprof_run_joins_that_run(tmp_path: Path) -> None:
    run: TracedRun = traced(tmp_path, script("api_nested.py"), str(tmp_path / "other"))
    assert run.proc.returncode == 0, run.proc.stderr
    assert f"run_dir {run.run_dir}" in run.proc.stdout
    assert not (tmp_path / "other").exists()
    assert run.report["steps"]["count"] == 2
