"""The run directory on disk: compaction after a clean run, interrupted compaction, process snapshots."""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import holoprof
from conftest import TracedRun, copy_run, main_process, report_json
from holoprof import model
from holoprof.store.chunks import write_chunk

COMPACTED = re.compile(r"^part-c(?P<first>\d+)-(?P<last>\d+)\.parquet$")
PART = re.compile(r"^part-(?P<seq>\d{8,})\.parquet$")
TABLES = ("spans", "samples", "io_files", "io_ops", "processes")


def partitions(run_dir: str | Path) -> list[Path]:
    """Every table's partition folders: RUN/<table>/hostname=<host>/proc=<pid>."""
    return [p for t in TABLES for p in sorted(Path(run_dir).glob(f"{t}/hostname=*/proc=*"))]


def spans_of(run_dir: str | Path, proc: dict[str, Any]) -> Path:
    return Path(run_dir) / "spans" / f"hostname={proc['host']}" / f"proc={proc['pid']}"


def step_count(run_dir: str | Path) -> int:
    return holoprof.load(run_dir).rows("SELECT count(*) FROM spans WHERE kind = 'step'")[0][0]


def test_clean_run_is_compacted_to_one_file_per_table_and_process(small_run: TracedRun) -> None:
    main = main_process(small_run.report)
    run_dir = Path(small_run.run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        ["manifest.json", "control", "artifacts", *(t for t in TABLES if (run_dir / t).exists())]
    ), "no staging folder is left once every chunk is converted"
    folders = partitions(run_dir)
    assert spans_of(run_dir, main) in folders
    for folder in folders:
        names = sorted(p.name for p in folder.iterdir())
        assert len(names) == 1 and (PART.match(names[0]) or COMPACTED.match(names[0])), folder
    (spans,) = [p.name for p in spans_of(run_dir, main).iterdir()]
    m = COMPACTED.match(spans)
    assert m and int(m["last"]) > int(m["first"]), "many flushes were merged into it"


def test_compacted_run_keeps_every_step(small_run: TracedRun) -> None:
    assert small_run.report["steps"]["count"] == 20
    assert step_count(small_run.run_dir) == 20


def test_parts_inside_a_compacted_range_are_not_counted_twice(small_run: TracedRun, tmp_path: Path) -> None:
    # A compaction interrupted after writing the merged file and before removing the parts.
    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    main = main_process(small_run.report)
    folder = spans_of(run_dir, main)
    (compacted,) = folder.glob("part-c*.parquet")
    m = COMPACTED.match(compacted.name)
    assert m
    first, last = int(m["first"]), int(m["last"])
    table = pq.read_table(compacted)
    half = table.num_rows // 2
    for seq, piece in ((first, table.slice(0, half)), (last, table.slice(half))):
        write_chunk(str(run_dir), "spans", piece.to_pydict(), seq=seq)
    files = sorted(p.name for p in folder.glob("part-*.parquet"))
    assert len(files) == 3, files

    assert step_count(run_dir) == 20, files
    doc = report_json(run_dir)
    assert doc["steps"]["count"] == 20, files
    assert doc["run"]["warnings"] == [], doc["run"]["warnings"]


def test_parts_outside_the_compacted_range_are_read(small_run: TracedRun, tmp_path: Path) -> None:
    # Rows flushed after compaction (a later part) are data, not leftovers.
    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    main = main_process(small_run.report)
    (compacted,) = spans_of(run_dir, main).glob("part-c*.parquet")
    m = COMPACTED.match(compacted.name)
    assert m
    assert "late" not in pq.read_table(compacted).column("name").to_pylist()
    row = {
        "host": [main["host"]], "pid": [main["pid"]], "rank": [-1], "tid": [1], "span_id": [10**9],
        "parent_id": [0], "kind": ["user"], "name": ["late"], "start_ns": [1], "end_ns": [2], "step": [-1],
    }  # fmt: skip
    write_chunk(str(run_dir), "spans", row, seq=int(m["last"]) + 1)
    run = holoprof.load(run_dir)
    assert run.rows("SELECT count(*) FROM spans WHERE name = 'late'")[0][0] == 1


def test_compaction_merges_in_bounded_groups_and_keeps_every_row(
    small_run: TracedRun, tmp_path: Path
) -> None:
    """A long run is compacted into several sorted files of bounded size, never loaded whole."""
    from holoprof.store.compact import compact_run

    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    main = main_process(small_run.report)
    folder = spans_of(run_dir, main)
    (compacted,) = folder.glob("part-c*.parquet")
    table = pq.read_table(compacted)
    compacted.unlink()
    size = -(-table.num_rows // 10)
    for i in range(10):  # ten flushes, in time order as the agent writes them
        write_chunk(str(run_dir), "spans", table.slice(i * size, size).to_pydict(), seq=i)
    assert compact_run(str(run_dir), max_rows=3 * size) == 10
    files = sorted(folder.glob("part-*.parquet"))
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
    stale = {
        "host": [main["host"]], "pid": [main["pid"]], "rank": [-1], "role": ["child"], "updated_ns": [1],
        "end_ns": [0], "info": [json.dumps({"source": "agent"})],
    }  # fmt: skip
    write_chunk(str(run_dir), "processes", stale, seq=99_000_000)
    again = holoprof.load(run_dir)
    rows = again.processes.filter(f"pid = {main['pid']}").project("role, end_ns").fetchall()
    assert rows == [("main", main["end_ns"])]


# --- the table folders, read by other tools ---------------------------------------------------------
def test_each_table_folder_reads_as_one_table_with_pandas_pyarrow_and_duckdb(small_run: TracedRun) -> None:
    import duckdb
    import pandas as pd
    import pyarrow.dataset as ds

    run_dir = Path(small_run.run_dir)
    run = holoprof.load(run_dir)
    spans = pd.read_parquet(run_dir / "spans")
    assert len(spans) == run.rows("SELECT count(*) FROM spans")[0][0]
    assert (spans["kind"] == "step").sum() == 20
    assert list(spans.columns[: len(model.COLUMNS["spans"])]) == list(model.column_names("spans"))
    # the partition keys come as two more columns: the process that wrote the rows (its own spans)
    assert (spans["hostname"].astype(str) == spans["host"]).all()
    assert (spans["proc"].astype(int) == spans["pid"]).all()
    table = ds.dataset(run_dir / "samples", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == run.rows("SELECT count(*) FROM samples")[0][0] > 0
    con = duckdb.connect()
    glob = str(run_dir / "processes" / "**" / "*.parquet")
    rows = con.execute(
        f"SELECT DISTINCT host, pid, hostname, proc FROM read_parquet('{glob}', hive_partitioning=true)"
    ).fetchall()
    assert sorted({(h, p) for h, p, _, _ in rows}) == sorted(run.rows("SELECT host, pid FROM processes"))
    # the launcher's snapshots of the job's processes are in its own partition
    assert {(hn, pr) for _, _, hn, pr in rows} <= {(h, p) for h, p, _, _ in rows}


def test_a_table_with_no_rows_reads_as_an_empty_table_with_its_schema(small_run: TracedRun) -> None:
    """io_ops has rows only with --io-trace: without it, its folder still reads, with no rows and the
    table's columns, in pandas, pyarrow, DuckDB and holoprof's own reader."""
    import duckdb
    import pandas as pd
    import pyarrow.dataset as ds

    run_dir = Path(small_run.run_dir)
    df = pd.read_parquet(run_dir / "io_ops")
    assert len(df) == 0
    assert list(df.columns[: len(model.COLUMNS["io_ops"])]) == list(model.column_names("io_ops"))
    table = ds.dataset(run_dir / "io_ops", format="parquet", partitioning="hive").to_table()
    names = list(model.column_names("io_ops"))
    assert table.num_rows == 0 and table.schema.names[: len(names)] == names
    glob = str(run_dir / "io_ops" / "**" / "*.parquet")
    assert duckdb.connect().execute(
        f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning=true)"
    ).fetchall() == [(0,)]
    run = holoprof.load(run_dir)
    assert run.rows("SELECT count(*) FROM io_ops") == [(0,)]
    # written by the launcher, in its own partition
    (part,) = (run_dir / "io_ops").rglob("*.parquet")
    assert int(part.parent.name.partition("=")[2]) == run.manifest["launcher_pid"]


def test_a_part_being_written_is_invisible_to_other_readers(small_run: TracedRun, tmp_path: Path) -> None:
    import pandas as pd

    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    folder = spans_of(run_dir, main_process(small_run.report))
    (done,) = folder.iterdir()
    (folder / f".part-99999999.parquet.tmp{os.getpid()}").write_bytes(done.read_bytes()[:100])
    assert len(pd.read_parquet(run_dir / "spans")) == len(pd.read_parquet(done))
    assert holoprof.load(run_dir).warnings == []


def test_io_counters_are_typed_columns_and_io_file_totals_has_one_row_per_process_and_file(
    standard_run: TracedRun,
) -> None:
    import pandas as pd

    io = pd.read_parquet(Path(standard_run.run_dir) / "io_files")
    assert io["POSIX_BYTES_READ"].dtype == "Int64" or io["POSIX_BYTES_READ"].dtype.kind in "if"
    assert io["POSIX_F_READ_TIME"].dtype.kind == "f"
    from_json = [json.loads(c).get("POSIX_BYTES_READ") for c in io["counters"]]
    assert [None if pd.isna(v) else int(v) for v in io["POSIX_BYTES_READ"]] == from_json
    run = holoprof.load(standard_run.run_dir)
    totals = run.io_file_totals.df()
    assert not totals.duplicated(["host", "pid", "module", "path"]).any()
    assert len(totals) == len(io.drop_duplicates(["host", "pid", "module", "path"]))
    # the totals are the report's numbers, which read the JSON counters
    assert (
        int(totals["POSIX_BYTES_READ"].fillna(0).clip(lower=0).sum())
        + int(totals["STDIO_BYTES_READ"].fillna(0).clip(lower=0).sum())
        == standard_run.report["io"]["bytes_read"]
    )
    per_file = run.file_totals().df()
    assert not per_file.duplicated(["module", "path"]).any()
    assert int(per_file["processes"].sum()) == len(totals)


OLD = Path(__file__).parent / "data" / "old_layout_run"


def test_a_run_of_the_earlier_layout_still_loads(tmp_path: Path) -> None:
    """tests/data/old_layout_run was written by the code before the table folders (<host>-<pid>/
    <table>-*.parquet): a loop of 12 steps, each reading a 200,000-byte file whole."""
    run_dir = Path(copy_run(OLD, tmp_path / "old"))
    expected = json.loads((OLD.parent / "old_layout_run.expected.json").read_text())
    doc = report_json(run_dir)
    assert doc["steps"]["count"] == expected["steps"]["count"] == 12
    assert doc["io"]["bytes_read"] == expected["io"]["bytes_read"] == 12 * 200_000
    assert doc["run"]["warnings"] == []
    run = holoprof.load(run_dir)
    totals = run.io_file_totals.df()  # typed columns from the JSON counters of the old files
    assert totals["POSIX_BYTES_READ"].tolist() == [12 * 200_000]
    assert totals["POSIX_READS"].tolist() == [expected["files_detail"][0]["reads"]]


def test_the_typed_counters_are_darshans_own_names_and_types() -> None:
    backend = pytest.importorskip("darshan.backend.cffi_backend")
    typed = dict(model.IO_COUNTERS)
    for module in ("POSIX", "STDIO", "MPI-IO"):
        for name in backend.counter_names(module):
            assert typed.pop(name) == "int64", name
        for name in backend.fcounter_names(module):
            assert typed.pop(name) == "double", name
    for name in model.MAPPED_COUNTERS.split():  # holoprof's own, for memory-mapped files
        assert typed.pop(f"POSIX_{name}") == "int64", name
    assert typed == {}, "every other typed counter is one of Darshan's"


def test_a_conversion_interrupted_before_removing_its_raw_chunks_counts_each_row_once(tmp_path: Path) -> None:
    from holoprof.store.convert import convert_folder
    from holoprof.store.raw import write_raw

    run_dir = tmp_path / "run"
    staging = run_dir / "node-7"
    staging.mkdir(parents=True)
    (run_dir / "manifest.json").write_text('{"schema_version": 1, "status": "finished"}')
    rows = {"host": ["node"], "pid": [7], "span_id": [1], "kind": ["user"], "name": ["x"], "start_ns": [1]}
    raws = [Path(str(write_raw(str(staging), "spans", rows, seq=s))) for s in (1, 2)]
    kept = [r.read_bytes() for r in raws]
    assert convert_folder(str(staging)) == (2, [])
    (converted,) = (run_dir / "spans" / "hostname=node" / "proc=7").iterdir()
    assert converted.name == "part-c00000001-00000002.parquet"
    for r, data in zip(raws, kept, strict=True):  # the pass was stopped before it removed them
        r.write_bytes(data)
        os.utime(r, ns=(converted.stat().st_mtime_ns - 10**9,) * 2)
    assert convert_folder(str(staging)) == (0, [])
    assert not any(staging.iterdir())
    assert holoprof.load(run_dir).rows("SELECT count(*) FROM spans")[0][0] == 2
