"""Corrupt runs: a chunk with intact magic bytes but a broken footer, corrupt pages or a column of the
wrong type, and a manifest with wrongly typed fields. Every command skips the chunk with a warning or
refuses the run with one line and exit 2; the dashboard keeps serving the other runs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import TracedRun, copy_run, main_process, run_holoprof


def _spans_part(run_dir: Path, proc: dict) -> Path:  # type: ignore[type-arg]
    (part,) = (run_dir / "spans" / f"hostname={proc['host']}" / f"proc={proc['pid']}").glob("part-*.parquet")
    return part


def _break_footer(part: Path) -> None:
    data = bytearray(part.read_bytes())
    n = len(data)
    data[n - 8 : n - 4] = (n * 4).to_bytes(4, "little")  # footer length past the file: PAR1 kept
    part.write_bytes(bytes(data))


def _break_pages(part: Path) -> None:
    md = pq.ParquetFile(part).metadata
    col = md.row_group(0).column(md.schema.names.index("name"))
    data = bytearray(part.read_bytes())
    for i in range(col.data_page_offset + 20, col.data_page_offset + col.total_compressed_size - 2):
        data[i] ^= 0x33  # compressed pages that no longer decode; footer and magic intact
    part.write_bytes(bytes(data))


def _wrong_type(part: Path) -> None:
    t = pq.read_table(part)
    i = t.schema.get_field_index("start_ns")
    pq.write_table(t.set_column(i, "start_ns", pa.array([str(v) for v in t["start_ns"].to_pylist()])), part)


@pytest.mark.parametrize("damage", [_break_footer, _wrong_type])
def test_a_chunk_with_a_broken_footer_or_wrong_types_is_skipped_with_a_warning(
    small_run: TracedRun, tmp_path: Path, damage: object
) -> None:
    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    part = _spans_part(run_dir, main_process(small_run.report))
    damage(part)  # type: ignore[operator]
    report = run_holoprof("report", str(run_dir), "--json", cwd=tmp_path)
    export = run_holoprof(
        "export", str(run_dir), "--format", "chrome", "-o", str(tmp_path / "t.json"), cwd=tmp_path
    )
    for proc in (report, export):
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(report.stdout)
    assert any(part.name in w and "corrupt" in w for w in doc["run"]["warnings"]), doc["run"]["warnings"]
    assert doc["steps"]["count"] == 0, "the only spans chunk was skipped"
    q = run_holoprof("query", str(run_dir), "SELECT count(*) AS n FROM spans", "--json", cwd=tmp_path)
    assert q.returncode == 0 and json.loads(q.stdout) == [{"n": 0}], q.stderr


def test_a_chunk_whose_pages_do_not_decode_is_skipped_and_reported(
    small_run: TracedRun, tmp_path: Path
) -> None:
    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    part = _spans_part(run_dir, main_process(small_run.report))
    _break_pages(part)  # bytes overwritten in the middle: magic and footer intact
    for cmd in (
        ("report", str(run_dir)),
        ("export", str(run_dir), "--format", "chrome", "-o", str(tmp_path / "t.json")),
        ("diff", str(run_dir), small_run.run_dir),
        ("query", str(run_dir), "SELECT count(DISTINCT name) FROM spans"),
    ):
        proc = run_holoprof(*cmd, cwd=tmp_path)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (cmd, proc.stderr)
    doc = json.loads(run_holoprof("report", str(run_dir), "--json", cwd=tmp_path).stdout)
    (warning,) = [w for w in doc["run"]["warnings"] if part.name in w]
    assert "skipped 1 corrupt chunk(s)" in warning and "does not decode" in warning, warning
    assert doc["steps"]["count"] == 0, "the only spans chunk was skipped"
    assert doc["run"]["processes"] == small_run.report["run"]["processes"], "the other tables still count"
    q = run_holoprof(
        "query", str(run_dir), "SELECT count(DISTINCT name) AS n FROM spans", "--json", cwd=tmp_path
    )
    assert q.returncode == 0 and json.loads(q.stdout) == [{"n": 0}], q.stderr
    assert part.name in q.stderr and "warning" in q.stderr, q.stderr
    # a pack of the run reads the same (unpacked once, whatever the command reads again)
    assert (
        run_holoprof("pack", str(run_dir), "-o", str(tmp_path / "r.holoprof"), cwd=tmp_path).returncode == 0
    )
    packed = json.loads(run_holoprof("report", str(tmp_path / "r.holoprof"), "--json", cwd=tmp_path).stdout)
    assert packed["steps"]["count"] == 0 and any("corrupt" in w for w in packed["run"]["warnings"])


@pytest.mark.parametrize("field,value", [("schema_version", "one"), ("start_ns", "abc"), ("status", 3)])
def test_a_manifest_with_wrongly_typed_fields_is_refused_in_one_line(
    small_run: TracedRun, tmp_path: Path, field: str, value: object
) -> None:
    from holoprof.present.prometheus import prometheus_text
    from holoprof.serve.app import Runs

    root = tmp_path / "runs"
    run_dir = Path(copy_run(small_run.run_dir, root / "broken"))
    copy_run(small_run.run_dir, root / "good")
    m = json.loads((run_dir / "manifest.json").read_text())
    m[field] = value
    (run_dir / "manifest.json").write_text(json.dumps(m))
    for cmd in (("report", str(run_dir)), ("query", str(run_dir), "SELECT 1"), ("whatif", str(run_dir))):
        proc = run_holoprof(*cmd, cwd=tmp_path)
        assert proc.returncode == 2, (cmd, proc.stderr)
        assert proc.stderr.count("\n") == 1 and field in proc.stderr, proc.stderr
    runs = Runs(str(root))
    listed = {r["id"]: r for r in runs.summary()}
    assert listed["broken"]["status"] == "broken" and field in listed["broken"]["error"]
    assert listed["good"]["status"] == "finished"
    text = prometheus_text([("good", runs.report("good"))])
    assert 'run="good"' in text


def test_query_is_read_only_and_stays_inside_the_run(small_run: TracedRun, tmp_path: Path) -> None:
    outside = tmp_path / "secret.csv"
    outside.write_text("a\n1\n")
    ok = run_holoprof("query", small_run.run_dir, "SELECT count(*) AS n FROM spans WHERE kind = 'step'",
                      "--csv", cwd=tmp_path)  # fmt: skip
    assert ok.returncode == 0 and ok.stdout.splitlines() == ["n", "20"], ok.stderr
    for sql in (
        f"SELECT * FROM read_csv('{outside}')",
        f"COPY spans TO '{tmp_path / 'out.csv'}'",
        "SET enable_external_access = true",
        "SELECT 1; SELECT 2",
        f"ATTACH '{tmp_path / 'x.db'}'",
    ):
        proc = run_holoprof("query", small_run.run_dir, sql, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (sql, proc.stderr)
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "x.db").exists()


def test_the_dashboard_serves_a_run_with_undecodable_pages_without_them(
    small_run: TracedRun, tmp_path: Path
) -> None:
    import threading

    from holoprof.serve.app import make_server
    from test_serve_api import Client

    root = tmp_path / "runs"
    broken = Path(copy_run(small_run.run_dir, root / "broken"))
    copy_run(small_run.run_dir, root / "good")
    _break_pages(_spans_part(broken, main_process(small_run.report)))
    server = make_server(str(root), port=0)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        client = Client(server)
        metrics = client.get("/metrics")
        assert metrics.status == 200
        text = metrics.body.decode()
        from prometheus_client.parser import text_string_to_metric_families

        samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
        assert any(s.name == "holoprof_steps_total" and s.labels["run"] == "good" for s in samples), text
        assert any(s.labels.get("run") == "broken" for s in samples), "served without its corrupt chunk"
        assert not [
            s for s in samples if s.name == "holoprof_steps_total" and s.labels["run"] == "broken" and s.value
        ]
        listed = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
        assert listed["good"]["status"] == "finished" and listed["good"]["steps"] == 20
        assert listed["broken"]["status"] == "finished" and listed["broken"]["steps"] == 0
        report = client.get("/api/runs/broken/report")
        assert report.status == 200
        assert any("corrupt" in w for w in report.json()["run"]["warnings"]), report.json()["run"]
    finally:
        server.shutdown()
        server.server_close()
