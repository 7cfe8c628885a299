"""Robust at the edges: run directories and files whose names are not UTF-8, two launchers racing for one
run directory, FIFOs and devices where files are read, JSON nested too deeply. Every case gives the
right result or one line and exit status 2: never a hang, a traceback or data silently lost."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import holoprof
from conftest import (
    HOLOPROF,
    TracedRun,
    copy_run,
    error_lines,
    job_env,
    main_process,
    report_json,
    run_holoprof,
    script,
)
from holoprof.store import rundir, safeio

#: what a command may take before it counts as hung (generous: a slow machine is not a hang)
HANG_S = 60

#: a job that reads a file whose name is not UTF-8 and marks 9 iterations
ODD_JOB = """
import os, holoprof
d = os.fsencode(os.getcwd()) + b"/data \\xfe"
os.makedirs(d, exist_ok=True)
p = d + b"/f\\xff.bin"
with open(p, "wb") as f:
    f.write(b"x" * 4096)
for _ in range(9):
    with open(p, "rb") as f:
        f.read()
    holoprof.step()
"""


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("holoprof: error: "), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# --- paths that are not UTF-8 --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def odd_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``holoprof run --out $'x \\xff/r'`` of a job reading a file named with bytes that are not UTF-8."""
    tmp = tmp_path_factory.mktemp("odd")
    run_dir = os.fsdecode(os.fsencode(str(tmp)) + b"/x \xff/r")
    proc = run_holoprof("run", "--out", run_dir, "--", sys.executable, "-c", ODD_JOB, cwd=tmp, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    assert "x \\xff/r" in proc.stderr and "unreadable" not in proc.stderr, proc.stderr
    return tmp, run_dir


def test_a_run_directory_whose_name_is_not_utf8_keeps_all_its_data(odd_run: tuple[Path, str]) -> None:
    tmp, run_dir = odd_run
    doc = report_json(run_dir)
    assert doc["run"]["dir"] == run_dir, "the path survives exactly (surrogate escapes in JSON)"
    assert doc["run"]["warnings"] == [] and doc["run"]["processes"] == 1, doc["run"]
    assert doc["steps"]["count"] == 8, doc["steps"]
    paths = [f["path"] for f in doc["io"]["files_detail"]]
    odd = os.fsencode(str(tmp)).decode() + "/data \\xfe/f\\xff.bin"
    assert odd in paths, paths
    shown_run = os.fsencode(run_dir).decode("utf-8", "backslashreplace")
    assert not [p for p in paths if p.startswith(shown_run)], "the run directory is not the job's I/O"
    (row,) = [f for f in doc["io"]["files_detail"] if f["path"] == odd]
    assert row["bytes_read"] == 9 * 4096 and row["reads"] >= 9, row
    run = holoprof.load(run_dir)
    assert run.rows("SELECT count(*) FROM spans WHERE kind = 'step'") == [(8,)]


def test_reports_and_exports_of_that_run_show_its_name_escaped(odd_run: tuple[Path, str]) -> None:
    tmp, run_dir = odd_run
    terminal = run_holoprof("report", run_dir, cwd=tmp)
    assert terminal.returncode == 0 and "Traceback" not in terminal.stderr, terminal.stderr
    assert "x \\xff/r" in terminal.stdout and "f\\xff.bin" in terminal.stdout, terminal.stdout
    html = tmp / "report.html"
    proc = run_holoprof("report", run_dir, "--html", str(html), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    text = html.read_text(encoding="utf-8")
    assert "x \\xff/r" in text and "f\\xff.bin" in text
    trace = tmp / "trace.json"
    proc = run_holoprof("export", run_dir, "--format", "chrome", "-o", str(trace), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "step") == 8
    pack = tmp / "odd.holoprof"
    assert run_holoprof("pack", run_dir, "-o", str(pack), cwd=tmp).returncode == 0
    assert report_json(pack)["steps"]["count"] == 8


# --- two launchers, one run directory --------------------------------------------------------------------
def _claim(path: str, barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        rundir.create_run_dir(path)
        results.put("won")
    except rundir.RunExistsError:
        results.put("refused")


def test_of_launchers_creating_one_run_directory_at_once_exactly_one_wins(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for i in range(10):
        target = str(tmp_path / f"run{i}")
        if i % 2:
            os.mkdir(target)  # an empty directory made beforehand is claimed the same way
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_claim, args=(target, barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(HANG_S)
        outcomes = sorted(results.get(timeout=HANG_S) for _ in procs)
        assert outcomes == ["refused", "refused", "refused", "won"], (i, outcomes)


def test_two_runs_started_together_with_the_same_out_one_is_refused(tmp_path: Path) -> None:
    out = str(tmp_path / "shared")
    job = [sys.executable, script("manual_steps.py"), "3", "--phases"]
    argv = [*HOLOPROF, "run", "--out", out, "--no-report", "--", *job]
    procs = [
        subprocess.Popen(
            argv, cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    done = [(*p.communicate(timeout=HANG_S), p.returncode) for p in procs]
    assert sorted(rc for _, _, rc in done) == [0, 2], done
    (loser,) = [err for _, err, rc in done if rc == 2]
    lines = error_lines(loser)
    assert len(lines) == 1 and "already exists" in lines[0] and out in lines[0], loser
    (winner,) = [stdout for stdout, _, rc in done if rc == 0]
    assert "iterations 3" in winner
    doc = report_json(out)
    assert doc["run"]["processes"] == 1, "one job's process in the run, not two"
    assert doc["steps"]["count"] == 3


# --- FIFOs, devices and deep JSON where files are read ------------------------------------------------------
def test_open_regular_refuses_a_fifo_and_a_device_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((str(fifo), "a FIFO"), ("/dev/zero", "a device"), (str(tmp_path), "a directory")):
        with pytest.raises(safeio.NotRegularFile, match=kind):
            safeio.open_regular(path)
    big = tmp_path / "big"
    big.write_bytes(b"0" * 100)
    with pytest.raises(safeio.FileTooLarge):
        safeio.read_bytes(str(big), 99)
    assert safeio.read_bytes(str(big), 100) == b"0" * 100
    with pytest.raises(ValueError, match="nested"):
        safeio.loads_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested more than 3"):
        safeio.loads_json('{"a": [[[1]]]}', max_depth=3)
    assert safeio.loads_json('{"a": [[1]]}', max_depth=3) == {"a": [[1]]}


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "deep", "huge"])
def test_a_manifest_that_is_not_a_manifest_file_is_one_line_never_a_hang(
    small_run: TracedRun, tmp_path: Path, kind: str
) -> None:
    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    manifest = run_dir / "manifest.json"
    manifest.unlink()
    if kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "dev-zero":
        manifest.symlink_to("/dev/zero")
    elif kind == "deep":
        manifest.write_text("[" * 100_000 + "]" * 100_000)
    else:
        with open(manifest, "wb") as f:
            f.truncate(rundir.MAX_MANIFEST_BYTES + 1)
    for cmd in (("report",), ("report", "--json"), ("export", "--format", "chrome", "-o", "t.json")):
        proc = run_holoprof(cmd[0], str(run_dir), *cmd[1:], cwd=tmp_path, timeout=HANG_S)
        assert_one_line_error(proc, "manifest.json", "restore it from a copy")


def test_fifos_and_devices_among_the_chunks_are_skipped_and_reported(
    small_run: TracedRun, tmp_path: Path
) -> None:
    run_dir = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    main = main_process(small_run.report)
    folder = run_dir / "spans" / f"hostname={main['host']}" / f"proc={main['pid']}"
    os.mkfifo(folder / "part-99999998.parquet")
    (folder / "part-99999999.parquet").symlink_to("/dev/zero")
    staging = run_dir / f"{main['host']}-{main['pid']}"
    staging.mkdir()
    os.mkfifo(staging / "spans-99999997.hpr")
    (run_dir.parent / "sweep.json").symlink_to("/dev/zero")  # a side file read beside the run
    doc = report_json(run_dir)
    assert doc["steps"]["count"] == small_run.report["steps"]["count"]
    warned = " ".join(doc["run"]["warnings"])
    for name in ("part-99999998", "part-99999999", "spans-99999997"):
        assert name in warned, doc["run"]["warnings"]
    pack = run_holoprof(
        "pack", str(run_dir), "-o", str(tmp_path / "r.holoprof"), cwd=tmp_path, timeout=HANG_S
    )
    assert pack.returncode == 0, pack.stderr


def test_a_fifo_given_as_a_torch_trace_or_inside_a_trace_folder_never_hangs(tmp_path: Path) -> None:
    from test_fuzz_inputs import TRACE

    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    proc = run_holoprof(
        "import", "torch-trace", str(fifo), "--out", str(tmp_path / "a"), cwd=tmp_path, timeout=HANG_S
    )
    assert_one_line_error(proc, str(fifo), "a FIFO")
    assert not (tmp_path / "a").exists()
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(TRACE)
    os.mkfifo(folder / "rank1.json")
    proc = run_holoprof(
        "import",
        "torch-trace",
        str(folder),
        "--out",
        str(tmp_path / "b"),
        "--no-report",
        cwd=tmp_path,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert "skipped rank1.json (a FIFO, not a regular file)" in proc.stderr, proc.stderr
    assert report_json(tmp_path / "b")["steps"]["count"] == 2
    (folder / "rank0.json").unlink()
    proc = run_holoprof(
        "import", "torch-trace", str(folder), "--out", str(tmp_path / "c"), cwd=tmp_path, timeout=HANG_S
    )
    assert_one_line_error(proc, "rank1.json", "a FIFO")


def test_a_trace_imports_from_and_into_paths_that_are_not_utf8(tmp_path: Path) -> None:
    from test_fuzz_inputs import TRACE

    base = os.fsencode(str(tmp_path))
    trace = os.fsdecode(base + b"/trace \xff.json")
    Path(trace).write_bytes(TRACE)
    out = os.fsdecode(base + b"/imported \xfe")
    proc = run_holoprof(
        "import", "torch-trace", trace, "--out", out, "--no-report", cwd=tmp_path, timeout=HANG_S
    )
    assert proc.returncode == 0 and "imported \\xfe" in proc.stderr, proc.stderr
    assert report_json(out)["steps"]["count"] == 2
