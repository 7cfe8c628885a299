"""The run directory on disk: compaction after a clean run, interrupted compaction, process snapshots."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pyarrow.parquet as pq

import holoprof
from conftest import TracedRun, copy_run, main_process, report_json
from holoprof.store.chunks import write_chunk

COMPACTED = re.compile(r"^(?P<table>[a-z_]+)-c(?P<first>\d+)-(?P<last>\d+)\.parquet$")
PART = re.compile(r"^(?P<table>[a-z_]+)-(?P<seq>\d{8,})\.parquet$")


def process_folders(run_dir: str | Path) -> list[Path]:
    return [p for p in Path(run_dir).iterdir() if p.is_dir() and p.name not in ("control", "artifacts")]


def step_count(run_dir: str | Path) -> int:
    return holoprof.load(run_dir).rows("SELECT count(*) FROM spans WHERE kind = 'step'")[0][0]


def test_clean_run_is_compacted_to_one_file_per_table_and_process(small_run: TracedRun) -> None:
    main = main_process(small_run.report)
    folders = process_folders(small_run.run_dir)
    assert {f.name for f in folders} >= {f"{main['host']}-{main['pid']}"}
    for folder in folders:
        names = sorted(p.name for p in folder.iterdir())
        assert not [n for n in names if n.endswith(".tmp")], names
        tables = [PART.match(n) or COMPACTED.match(n) for n in names]
        assert all(tables), names
        per_table = [m["table"] for m in tables if m]
        assert len(per_table) == len(set(per_table)), f"one file per table in {folder.name}: {names}"
    main_files = sorted(p.name for p in (Path(small_run.run_dir) / f"{main['host']}-{main['pid']}").iterdir())
    spans = [n for n in main_files if n.startswith("spans-")]
    assert len(spans) == 1 and COMPACTED.match(spans[0]), main_files
    m = COMPACTED.match(spans[0])
    assert m and int(m["last"]) > int(m["first"]), "many flushes were merged into it"


def test_compacted_run_keeps_every_step(small_run: TracedRun) -> None:
    assert small_run.report["steps"]["count"] == 20
    assert step_count(small_run.run_dir) == 20


def test_parts_inside_a_compacted_range_are_not_counted_twice(small_run: TracedRun, tmp_path: Path) -> None:
    # A compaction interrupted after writing the merged file and before removing the parts.
    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    main = main_process(small_run.report)
    folder = run_dir / f"{main['host']}-{main['pid']}"
    (compacted,) = folder.glob("spans-c*.parquet")
    m = COMPACTED.match(compacted.name)
    assert m
    first, last = int(m["first"]), int(m["last"])
    table = pq.read_table(compacted)
    half = table.num_rows // 2
    for seq, piece in ((first, table.slice(0, half)), (last, table.slice(half))):
        write_chunk(str(folder), "spans", piece.to_pydict(), seq=seq)
    files = sorted(p.name for p in folder.glob("spans-*.parquet"))
    assert len(files) == 3, files

    assert step_count(run_dir) == 20, files
    doc = report_json(run_dir)
    assert doc["steps"]["count"] == 20, files
    assert doc["run"]["warnings"] == [], doc["run"]["warnings"]


def test_parts_outside_the_compacted_range_are_read(small_run: TracedRun, tmp_path: Path) -> None:
    # Rows flushed after compaction (a later part) are data, not leftovers.
    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    main = main_process(small_run.report)
    folder = run_dir / f"{main['host']}-{main['pid']}"
    (compacted,) = folder.glob("spans-c*.parquet")
    m = COMPACTED.match(compacted.name)
    assert m
    assert "late" not in pq.read_table(compacted).column("name").to_pylist()
    row = {
        "host": [main["host"]], "pid": [main["pid"]], "rank": [-1], "tid": [1], "span_id": [10**9],
        "parent_id": [0], "kind": ["user"], "name": ["late"], "start_ns": [1], "end_ns": [2], "step": [-1],
    }  # fmt: skip
    write_chunk(str(folder), "spans", row, seq=int(m["last"]) + 1)
    run = holoprof.load(run_dir)
    assert run.rows("SELECT count(*) FROM spans WHERE name = 'late'")[0][0] == 1


def test_compaction_merges_in_bounded_groups_and_keeps_every_row(
    small_run: TracedRun, tmp_path: Path
) -> None:
    """A long run is compacted into several sorted files of bounded size, never loaded whole."""
    from holoprof.store.compact import compact_run

    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    main = main_process(small_run.report)
    folder = run_dir / f"{main['host']}-{main['pid']}"
    (compacted,) = folder.glob("spans-c*.parquet")
    table = pq.read_table(compacted)
    compacted.unlink()
    size = -(-table.num_rows // 10)
    for i in range(10):  # ten flushes, in time order as the agent writes them
        write_chunk(str(folder), "spans", table.slice(i * size, size).to_pydict(), seq=i)
    assert compact_run(str(run_dir), max_rows=3 * size) == 10
    files = sorted(folder.glob("spans-*.parquet"))
    assert all(COMPACTED.match(f.name) for f in files), files
    assert len(files) == 4, files  # 3 + 3 + 3 + 1 parts
    ranges = sorted((int(m["first"]), int(m["last"])) for f in files if (m := COMPACTED.match(f.name)))
    assert ranges[0][0] == 0 and ranges[-1][1] == 9
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges)), ranges
    for f in files:
        starts = pq.read_table(f).column("start_ns").to_pylist()
        assert starts == sorted(starts), f.name
    assert sum(pq.read_table(f).num_rows for f in files) == table.num_rows
    assert step_count(run_dir) == 20
    assert compact_run(str(run_dir), max_rows=3 * size) == 0, "compacted files are left as they are"


def test_processes_view_keeps_the_newest_row_per_process(small_run: TracedRun, tmp_path: Path) -> None:
    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    run = holoprof.load(run_dir)
    raw = run.rows("SELECT host, pid, count(*) FROM processes_raw GROUP BY host, pid")
    assert any(n > 1 for _, _, n in raw), "processes are written as repeated snapshots"
    view = run.rows("SELECT host, pid, count(*) FROM processes GROUP BY host, pid")
    assert sorted((h, p) for h, p, _ in view) == sorted((h, p) for h, p, _ in raw)
    assert all(n == 1 for _, _, n in view)
    newest = run.rows(
        """SELECT p.pid FROM processes p JOIN (
             SELECT host, pid, max(updated_ns) AS u FROM processes_raw
             WHERE info LIKE '%"source": "agent"%' GROUP BY host, pid) r USING (host, pid)
           WHERE p.updated_ns <> r.u"""
    )
    assert newest == [], "each process shows its last snapshot"

    # An older snapshot written later (e.g. by a slow writer) does not replace the newest one.
    main = main_process(small_run.report)
    folder = run_dir / f"{main['host']}-{main['pid']}"
    stale = {
        "host": [main["host"]], "pid": [main["pid"]], "rank": [-1], "role": ["child"], "updated_ns": [1],
        "end_ns": [0], "info": [json.dumps({"source": "agent"})],
    }  # fmt: skip
    write_chunk(str(folder), "processes", stale, seq=99_000_000)
    again = holoprof.load(run_dir)
    rows = again.processes.filter(f"pid = {main['pid']}").project("role, end_ns").fetchall()
    assert rows == [("main", main["end_ns"])]
