"""`holoprof import darshan`: real Darshan logs (shipped with PyDarshan) against PyDarshan's own totals."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import error_lines, report_json, run_holoprof
from holoprof import model

darshan = pytest.importorskip("darshan")

PACKAGE = Path(darshan.__file__).resolve().parent
EXAMPLES = PACKAGE / "examples" / "example_logs"
LOGS = ["example.darshan", "dxt.darshan", "ior_hdf5_example.darshan"]


def _shipped_logs() -> list[Path]:
    """Every Darshan log shipped with PyDarshan (examples and test inputs) and, when installed, with
    its ``darshan-logs`` test-data package; each content once."""
    from darshan import log_utils

    paths = sorted(PACKAGE.rglob("*.darshan"))
    paths += sorted(Path(p) for p in log_utils._provide_logs_repo_filepaths())
    seen: dict[bytes, Path] = {}
    for path in paths:
        seen.setdefault(path.read_bytes(), path)
    return sorted(seen.values())


SHIPPED = _shipped_logs()


def _pydarshan_totals(log: Path) -> dict[str, Any]:
    """Totals as PyDarshan itself reports them (every POSIX and STDIO record, shared ones included)."""
    rep = darshan.DarshanReport(str(log), read_all=True)
    out: dict[str, Any] = {
        "bytes_read": 0.0,
        "bytes_written": 0.0,
        "opens": 0.0,
        "records": 0.0,
        "dxt_ops": 0.0,
    }
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


def _module_sums(log: Path) -> dict[str, dict[str, float]]:
    """PyDarshan's sum of every counter of every module (LUSTRE per layout component, DXT segments
    and bytes), and its record counts under ``#records``."""
    rep = darshan.DarshanReport(str(log), read_all=True)
    out: dict[str, dict[str, float]] = {}
    for mod in rep.records:
        recs = list(rep.records[mod].to_numpy())
        sums: dict[str, float] = {"#records": len(recs)}
        if mod.startswith("DXT_"):
            for rec in recs:
                for key in ("read_segments", "write_segments"):
                    for seg in rec[key]:
                        sums["#ops"] = sums.get("#ops", 0) + 1
                        sums["#bytes"] = sums.get("#bytes", 0) + int(seg["length"])
        elif mod == "LUSTRE":
            names = rep.counters["LUSTRE"]["counters"]
            for rec in recs:
                for i, comp in enumerate(rec["components"], 1):
                    for n, v in zip(names, comp["counters"], strict=True):
                        k = n.replace("LUSTRE_COMP_", f"LUSTRE_COMP{i}_")
                        sums[k] = sums.get(k, 0) + int(v)
        else:
            names = rep.counters[mod]["counters"] + rep.counters[mod]["fcounters"]
            for rec in recs:
                for n, v in zip(names, [*rec["counters"], *rec["fcounters"]], strict=True):
                    sums[n] = sums.get(n, 0) + float(v)
        out[mod] = sums
    return out


@pytest.mark.parametrize("log", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_log_imports_every_module_as_pydarshan_reads_it(tmp_path: Path, log: Path) -> None:
    import holoprof
    from holoprof.store.import_darshan import DXT_MODULES, import_darshan_log

    ref = _module_sums(log)
    run_dir, notes = import_darshan_log(str(log), str(tmp_path / "run"))
    run = holoprof.load(run_dir)
    got: dict[str, dict[str, float]] = {}
    for module, counters in run.rows("SELECT module, counters FROM io_files"):
        sums = got.setdefault(module, {"#records": 0})
        sums["#records"] += 1
        for n, v in json.loads(counters).items():
            sums[n] = sums.get(n, 0) + v
    for dxt, base in DXT_MODULES.items():
        n, b = run.rows(f"SELECT count(*), coalesce(sum(size_bytes), 0) FROM io_ops WHERE module = '{base}'")[
            0
        ]
        if n:
            got[dxt] = {"#ops": n, "#bytes": b, "#records": ref.get(dxt, {}).get("#records", -1)}
    assert set(got) == {m for m, s in ref.items() if s["#records"]}, notes
    for module, sums in ref.items():
        if not sums["#records"]:
            continue
        for name, total in sums.items():
            assert got[module].get(name, 0) == pytest.approx(total, rel=1e-12, abs=1e-9), (module, name)
        if module == "LUSTRE":
            assert any(k.startswith("LUSTRE_COMP1_OST_ID_") for k in got[module])
    # modules PyDarshan lists but holoprof has no table for are named, never dropped in silence
    listed = set(darshan.DarshanReport(str(log), read_all=False).modules)
    skipped = listed - set(got)
    assert {m for m in skipped if any(m in note for note in notes)} == skipped


def test_mpiio_totals_in_the_report(imported: dict[str, Any], tmp_path: Path) -> None:
    """example.darshan: 2048 ranks write 2.2 TB through MPI-IO; the report's io section says so."""
    log = EXAMPLES / "example.darshan"
    rep = darshan.DarshanReport(str(log), read_all=True)
    c = rep.records["MPI-IO"].to_df()["counters"]
    run_dir, _, stderr = imported["example.darshan"]
    assert "MPI-IO (1)" in stderr  # the modules imported, with their records
    assert "by module: MPI-IO" in run_holoprof("report", str(run_dir), cwd=tmp_path).stdout
    mpiio = report_json(str(run_dir))["io"]["by_module"]["MPI-IO"]
    assert mpiio["records"] == len(c)
    assert mpiio["bytes_written"] == int(c["MPIIO_BYTES_WRITTEN"].sum()) > 2 * 10**12
    assert mpiio["bytes_read"] == int(c["MPIIO_BYTES_READ"].sum())
    writes = sum(int(c[f"MPIIO_{k}_WRITES"].sum()) for k in ("INDEP", "COLL", "SPLIT", "NB"))
    assert mpiio["writes"] == writes == 16402
    assert mpiio["opens"] == int(c["MPIIO_INDEP_OPENS"].sum() + c["MPIIO_COLL_OPENS"].sum())


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each of LOGS imported by ``holoprof import darshan``: its run directory, PyDarshan's totals and
    the command's stderr."""
    tmp = tmp_path_factory.mktemp("darshan")
    out: dict[str, Any] = {}
    for name in LOGS:
        log = EXAMPLES / name
        if not log.exists():
            pytest.skip(f"{log} is not shipped with this PyDarshan")
        run_dir = tmp / name.replace(".darshan", "")
        proc = run_holoprof("import", "darshan", str(log), "--out", str(run_dir), cwd=tmp)
        assert proc.returncode == 0, proc.stderr
        out[name] = (run_dir, _pydarshan_totals(log), proc.stderr)
    return out


@pytest.mark.parametrize("name", LOGS)
def test_totals_match_pydarshan(imported: dict[str, Any], name: str) -> None:
    import holoprof

    run_dir, ref, _ = imported[name]
    run = holoprof.load(str(run_dir))
    assert run.manifest["status"] == "imported"
    assert " ".join(run.manifest["command"]) == ref["exe"].strip()
    rows = run.rows("SELECT module, layer, counters FROM io_files WHERE module IN ('POSIX', 'STDIO')")
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
    assert run.rows("SELECT count(*) FROM io_ops WHERE module = 'POSIX'")[0][0] == ref["dxt_ops"]
    doc = report_json(str(run_dir))
    assert doc["run"]["status"] == "imported"
    assert doc["io"]["bytes_read"] == ref["bytes_read"]
    assert doc["io"]["bytes_written"] == ref["bytes_written"]
    assert doc["io"]["layers"] == ["darshan"]


def test_dxt_segments_become_io_ops(imported: dict[str, Any]) -> None:
    import holoprof

    run_dir, ref, _ = imported["dxt.darshan"]
    assert ref["dxt_ops"] > 0
    run = holoprof.load(str(run_dir))
    ops = run.rows("SELECT op, count(*), min(start_ns), min(end_ns - start_ns) FROM io_ops GROUP BY op")
    assert {op for op, *_ in ops} <= {"read", "write"}
    assert all(start >= run.manifest["start_ns"] and dur >= 0 for _, _, start, dur in ops)


def test_odd_file_name_imports(tmp_path: Path) -> None:
    # a small log: the name is what is tested, not the size of the log
    log = tmp_path / "my log é ü.darshan"
    shutil.copyfile(EXAMPLES / "ior_hdf5_example.darshan", log)
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


def _assert_refused(proc: Any, out: Path) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("holoprof: error:"), proc.stderr
    assert "run saved" not in proc.stderr and not out.exists()


@pytest.mark.parametrize(
    ("name", "fraction"),
    [
        ("example.darshan", 0.1),  # the C library aborts (SIGABRT)
        ("example.darshan", 0.5),  # ... or crashes (SIGSEGV)
        ("example.darshan", 0.7),  # it stops reading MPI-IO and says so only on its stderr
        ("ior_hdf5_example.darshan", 0.99),  # the DXT_MPIIO module is cut short
        ("dxt.darshan", 0.3),
    ],
)
def test_truncated_log_is_one_line_exit_2_and_leaves_nothing(
    tmp_path: Path, name: str, fraction: float
) -> None:
    data = (EXAMPLES / name).read_bytes()
    log = tmp_path / "cut.darshan"
    log.write_bytes(data[: int(len(data) * fraction)])
    out = tmp_path / "out"
    proc = run_holoprof("import", "darshan", str(log), "--out", str(out), cwd=tmp_path)
    _assert_refused(proc, out)
    assert "damaged or truncated" in proc.stderr


def test_flipped_bytes_import_completely_or_refuse(tmp_path: Path) -> None:
    """Bytes flipped anywhere in a log: a complete import, or one line and exit 2 with nothing left."""
    import random

    from holoprof.errors import HoloprofError
    from holoprof.store.import_darshan import import_darshan_log

    data = (EXAMPLES / "ior_hdf5_example.darshan").read_bytes()
    rng = random.Random(7)
    outcomes = set()
    for i in range(8):
        damaged = bytearray(data)
        for _ in range(3):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        log = tmp_path / f"flip{i}.darshan"
        log.write_bytes(bytes(damaged))
        out = tmp_path / f"out{i}"
        try:
            run_dir, _ = import_darshan_log(str(log), str(out))
        except HoloprofError as exc:
            assert "\n" not in str(exc)
            assert not out.exists()
            outcomes.add("refused")
        else:
            assert (Path(run_dir) / "manifest.json").exists()
            outcomes.add("imported")
    assert "refused" in outcomes


def test_parser_memory_limit_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_holoprof(
        "import",
        "darshan",
        str(EXAMPLES / "dxt.darshan"),
        "--out",
        str(out),
        cwd=tmp_path,
        env={"HOLOPROF_LIMIT_PARSER_BYTES": "1"},
    )
    _assert_refused(proc, out)
    assert "HOLOPROF_LIMIT_PARSER_BYTES" in proc.stderr


def test_findings_on_an_imported_log_speak_of_the_job(tmp_path: Path) -> None:
    """A Darshan log comes from an HPC job elsewhere: no DataLoader advice, nothing about this machine."""
    run_dir = tmp_path / "run"
    proc = run_holoprof(
        "import", "darshan", str(EXAMPLES / "dxt.darshan"), "--out", str(run_dir), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    findings = report_json(str(run_dir))["findings"]
    # its one process spent longer in metadata calls than the job ran: what I/O costs it is measurable
    assert {f["id"] for f in findings} >= {"small_file_io", "io_bandwidth"}
    assert all(f["estimated_gain"] >= f["threshold"]["min_gain"] for f in findings)
    text = json.dumps(findings)
    for phrase in ("this machine", "DataLoader", "num_workers", "/dev/shm", "before training"):
        assert phrase not in text, phrase
    assert "burst buffer" in text


def test_io_that_costs_an_imported_job_nothing_measurable_is_no_finding(tmp_path: Path) -> None:
    """512 ranks for 39,212 s and 393 s of reads and metadata in all: a saving of at most 0.002% of the
    ranks' time is no finding (the staging advice was one before)."""
    run_dir = tmp_path / "run"
    proc = run_holoprof(
        "import", "darshan", str(EXAMPLES / "noposix.darshan"), "--out", str(run_dir), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    doc = report_json(str(run_dir))
    assert doc["run"]["processes"] == 512 and doc["io"]["read_time_s"] + doc["io"]["meta_time_s"] > 300
    assert doc["findings"] == []


def _dxt_bomb(path: Path, segments: int) -> Path:
    """dxt.darshan with its first DXT_POSIX record grown to ``segments`` zero segments: 32 bytes each
    once inflated, a few bytes each in the log's zlib region (the region is the log's last)."""
    import struct
    import zlib

    data = bytearray((EXAMPLES / "dxt.darshan").read_bytes())
    slot = 40 + 16 * 8  # the header's map entry (offset, length) of module 8, DXT_POSIX
    off, length = struct.unpack_from("<QQ", data, slot)
    assert off + length == len(data)
    region = bytearray(zlib.decompress(bytes(data[off : off + length])))
    first = struct.unpack_from("<q", region, 88)[0]  # the segment count after the record's hostname
    struct.pack_into("<q", region, 88, segments)
    at = 104 + 32 * first
    region[at:at] = bytes(32 * (segments - first))
    packed = zlib.compress(bytes(region), 6)
    out = data[:off] + packed
    struct.pack_into("<QQ", out, slot, off, len(packed))
    path.write_bytes(bytes(out))
    return path


def test_a_log_that_inflates_past_the_parser_memory_limit_is_refused(tmp_path: Path) -> None:
    """A 200 KB log whose DXT region holds three million segments: the parser stops at its memory limit
    (lowered here to 1 GiB, under which the intact log imports), in one line naming the limit."""
    limit = {"HOLOPROF_LIMIT_PARSER_BYTES": str(1 << 30)}
    intact = run_holoprof(
        "import",
        "darshan",
        str(EXAMPLES / "dxt.darshan"),
        "--out",
        str(tmp_path / "ok"),
        "--no-report",
        cwd=tmp_path,
        env=limit,
    )
    assert intact.returncode == 0, intact.stderr
    bomb = _dxt_bomb(tmp_path / "bomb.darshan", 3_000_000)
    assert bomb.stat().st_size < 400_000
    out = tmp_path / "out"
    proc = run_holoprof("import", "darshan", str(bomb), "--out", str(out), cwd=tmp_path, env=limit)
    _assert_refused(proc, out)
    assert "HOLOPROF_LIMIT_PARSER_BYTES" in proc.stderr


def test_a_2048_rank_log_reads_as_its_command_and_its_io(imported: dict[str, Any], tmp_path: Path) -> None:
    """example.darshan, 2,048 ranks of one write-only job: a few files in the run (one part per table,
    not one per rank), and a terminal report that opens with the I/O it did, shows the ranks as one
    stage and no read columns of zeros."""
    run_dir, _, _ = imported["example.darshan"]
    parts = [p for p in Path(run_dir).rglob("*.parquet")]
    # one part per table: processes and io_files with the ranks' rows, the others with none
    assert sorted(p.relative_to(run_dir).parts[0] for p in parts) == sorted(model.TABLES), parts
    out = run_holoprof("report", str(run_dir), cwd=tmp_path, env={"COLUMNS": "110"}).stdout
    assert "holoprof.step()" not in out  # an import has no loop to mark
    assert out.index("2.0 TiB written") < out.index("Findings")
    assert "vpicio_uni [ranks 0-2047]" in out and "[rank 7]" not in out
    assert "read bandwidth" not in out and "write bandwidth" in out
    doc = report_json(str(run_dir))
    assert doc["run"]["ranks"] == 2048 and len(doc["stages"]) == 2048  # the JSON keeps every rank
