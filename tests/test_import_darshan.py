"""`holoprof import darshan`: real Darshan logs (shipped with PyDarshan) against PyDarshan's own totals."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import error_lines, report_json, run_holoprof

darshan = pytest.importorskip("darshan")

EXAMPLES = Path(darshan.__file__).resolve().parent / "examples" / "example_logs"
LOGS = ["example.darshan", "dxt.darshan", "ior_hdf5_example.darshan"]


def _pydarshan_totals(log: Path) -> dict[str, float]:
    """Totals as PyDarshan itself reports them (every POSIX and STDIO record, shared ones included)."""
    rep = darshan.DarshanReport(str(log), read_all=True)
    out = {"bytes_read": 0.0, "bytes_written": 0.0, "opens": 0.0, "records": 0.0, "dxt_ops": 0.0}
    for mod in ("POSIX", "STDIO"):
        if mod not in rep.records:
            continue
        c = rep.records[mod].to_df()["counters"]
        out["bytes_read"] += float(c[f"{mod}_BYTES_READ"].clip(lower=0).sum())
        out["bytes_written"] += float(c[f"{mod}_BYTES_WRITTEN"].clip(lower=0).sum())
        out["opens"] += float(c[f"{mod}_OPENS"].clip(lower=0).sum())
        out["records"] += len(c)
    if "DXT_POSIX" in rep.records:
        for rec in rep.records["DXT_POSIX"].to_numpy():
            out["dxt_ops"] += int(rec["read_count"]) + int(rec["write_count"])
    out["nprocs"] = int(rep.metadata["job"]["nprocs"])
    out["exe"] = rep.metadata["exe"]
    return out


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("darshan")
    out: dict[str, Any] = {}
    for name in LOGS:
        log = EXAMPLES / name
        if not log.exists():
            pytest.skip(f"{log} is not shipped with this PyDarshan")
        run_dir = tmp / name.replace(".darshan", "")
        proc = run_holoprof("import", "darshan", str(log), "--out", str(run_dir), cwd=tmp)
        assert proc.returncode == 0, proc.stderr
        out[name] = (run_dir, _pydarshan_totals(log))
    return out


@pytest.mark.parametrize("name", LOGS)
def test_totals_match_pydarshan(imported: dict[str, Any], name: str) -> None:
    import holoprof

    run_dir, ref = imported[name]
    run = holoprof.load(str(run_dir))
    assert run.manifest["status"] == "imported"
    assert " ".join(run.manifest["command"]) == ref["exe"].strip()
    rows = run.rows("SELECT module, layer, counters FROM io_files")
    assert len(rows) == ref["records"]
    assert {r[1] for r in rows} == {"darshan"}
    tot = {"bytes_read": 0, "bytes_written": 0, "opens": 0}
    for module, _, counters in rows:
        c = json.loads(counters)
        tot["bytes_read"] += max(0, c[f"{module}_BYTES_READ"])
        tot["bytes_written"] += max(0, c[f"{module}_BYTES_WRITTEN"])
        tot["opens"] += max(0, c[f"{module}_OPENS"])
    for k in tot:
        assert tot[k] == ref[k], k
    assert run.rows("SELECT count(*) FROM processes")[0][0] == ref["nprocs"]
    assert run.rows("SELECT count(*) FROM io_ops")[0][0] == ref["dxt_ops"]
    doc = report_json(str(run_dir))
    assert doc["run"]["status"] == "imported"
    assert doc["io"]["bytes_read"] == ref["bytes_read"]
    assert doc["io"]["bytes_written"] == ref["bytes_written"]
    assert doc["io"]["layers"] == ["darshan"]


def test_dxt_segments_become_io_ops(imported: dict[str, Any]) -> None:
    import holoprof

    run_dir, ref = imported["dxt.darshan"]
    assert ref["dxt_ops"] > 0
    run = holoprof.load(str(run_dir))
    ops = run.rows("SELECT op, count(*), min(start_ns), min(end_ns - start_ns) FROM io_ops GROUP BY op")
    assert {op for op, *_ in ops} <= {"read", "write"}
    assert all(start >= run.manifest["start_ns"] and dur >= 0 for _, _, start, dur in ops)


def test_odd_file_name_imports(tmp_path: Path) -> None:
    log = tmp_path / "my log é ü.darshan"
    shutil.copyfile(EXAMPLES / "example.darshan", log)
    proc = run_holoprof("import", "darshan", str(log), "--out", str(tmp_path / "run é"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "run é" / "manifest.json").read_text())["source"]["log"] == str(log)


@pytest.mark.parametrize("kind", ["garbage", "missing", "directory", "truncated"])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, kind: str) -> None:
    if kind == "garbage":
        path = tmp_path / "bad.darshan"
        path.write_bytes(os.urandom(4096))
    elif kind == "truncated":
        path = tmp_path / "cut.darshan"
        path.write_bytes((EXAMPLES / "example.darshan").read_bytes()[:300])
    elif kind == "missing":
        path = tmp_path / "nope.darshan"
    else:
        path = tmp_path
    proc = run_holoprof("import", "darshan", str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("holoprof: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
