"""Nothing recorded is lost and the job is never broken: crashes, kills, signals, Ctrl-C, bad chunks,
and a collector that fails."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest

import holoprof
from conftest import (
    TracedRun,
    copy_run,
    job_env,
    main_process,
    read_until,
    report_json,
    run_holoprof,
    script,
    start_holoprof,
    traced,
)
from holoprof.store.raw import write_raw


def manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "manifest.json").read_text())


def printed_int(output: str, key: str) -> int:
    """The number printed after ``key`` (the last time; a terminal may echo ``^C`` before it)."""
    values = re.findall(rf"{key} (\d+)", output)
    assert values, (key, output)
    return int(values[-1])


def wait_for_flushed_steps(run_dir: Path, timeout: float = 60) -> None:
    """Wait until the job's writer has flushed spans, then a few flush intervals (0.2 s) more."""
    deadline = time.monotonic() + timeout
    while not list(run_dir.glob("spans/*/*/part-*")):
        assert time.monotonic() < deadline, "no spans were flushed"
        time.sleep(0.05)
    time.sleep(0.6)


def finish(proc: subprocess.Popen[bytes], timeout: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(), err.decode()


def test_job_that_raises_is_saved_as_crashed_with_its_steps(tmp_path: Path) -> None:
    run = traced(
        tmp_path, script("train.py"), "--optimizer", "adam", "--raise-after", "5", "--epochs", "1",
        "--no-eval",
    )  # fmt: skip
    assert run.proc.returncode == 1
    assert "RuntimeError: boom after 5 steps" in run.proc.stderr, "the job's own traceback is shown"
    assert manifest(run.run_dir)["status"] == "crashed"
    assert manifest(run.run_dir)["exit_code"] == 1
    assert run.report["run"]["status"] == "crashed"
    assert run.report["steps"]["count"] == 5


def test_sigkilled_job_leaves_a_run_that_loads(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_holoprof(
        "run", "--out", str(run_dir), "--no-report", "--flush-interval", "0.2", "--",
        script("train.py"), "--batches", "2000", "--epochs", "1", "--sleep-per-step", "0.01",
        "--announce-after", "5",
        cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        read_until(proc.stdout.fileno(), "started")
        wait_for_flushed_steps(run_dir)
        children = psutil.Process(proc.pid).children()
        assert len(children) == 1, children
        os.kill(children[0].pid, signal.SIGKILL)
        rc, _, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert rc == 128 + signal.SIGKILL, err
    m = manifest(run_dir)
    assert m["status"] == "crashed" and m["signal"] == "SIGKILL"
    doc = report_json(run_dir)
    assert doc["run"]["status"] == "crashed"
    assert doc["steps"]["count"] >= 5, "the steps flushed before the kill are there"


def test_run_whose_launcher_was_killed_too_still_loads(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_holoprof(
        "run", "--out", str(run_dir), "--no-report", "--flush-interval", "0.2", "--",
        script("manual_steps.py"), "100000", "--phases", "--announce",
        cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        read_until(proc.stdout.fileno(), "started")
        wait_for_flushed_steps(run_dir)
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the job, at once
        finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert manifest(run_dir)["status"] == "running", "nobody was left to close the run"
    doc = report_json(run_dir)
    assert doc["run"]["status"] == "crashed"
    assert any("never finished" in w for w in doc["run"]["warnings"]), doc["run"]["warnings"]
    assert doc["steps"]["count"] >= 5


def test_truncated_chunk_is_skipped_and_reported(tmp_path: Path, standard_run: TracedRun) -> None:
    run_dir = Path(copy_run(standard_run.run_dir, tmp_path / "run"))
    main = main_process(standard_run.report)
    folder = run_dir / "spans" / f"hostname={main['host']}" / f"proc={main['pid']}"
    real = sorted(folder.glob("part-*.parquet"))
    assert real, list(folder.iterdir())
    data = real[0].read_bytes()
    (folder / "part-99999999.parquet").write_bytes(data[: len(data) // 2])

    proc = run_holoprof("report", str(run_dir), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert any("part-99999999.parquet" in w for w in doc["run"]["warnings"]), doc["run"]["warnings"]
    assert doc["steps"]["count"] == standard_run.report["steps"]["count"], "the good chunks all count"
    assert holoprof.load(run_dir).warnings, "the Python API says so too"

    terminal = run_holoprof("report", str(run_dir), cwd=tmp_path)
    assert terminal.returncode == 0, terminal.stderr
    assert "Traceback" not in terminal.stderr


def test_truncated_raw_chunk_left_by_a_killed_process_is_skipped_and_reported(
    tmp_path: Path, standard_run: TracedRun
) -> None:
    # What a process killed in the middle of a flush leaves when nobody converted its chunks.
    run_dir = Path(copy_run(standard_run.run_dir, tmp_path / "run"))
    main = main_process(standard_run.report)
    folder = run_dir / f"{main['host']}-{main['pid']}"  # the process's staging folder
    folder.mkdir()
    (spans,) = (run_dir / "spans" / f"hostname={main['host']}" / f"proc={main['pid']}").glob("part-*.parquet")
    raw = write_raw(str(folder), "spans", pq.read_table(spans).to_pydict(), seq=99_999_998)
    assert raw is not None
    data = Path(raw).read_bytes()
    Path(raw).write_bytes(data[: len(data) // 2])

    doc = report_json(run_dir)
    assert any("spans-99999998" in w for w in doc["run"]["warnings"]), doc["run"]["warnings"]
    assert doc["steps"]["count"] == standard_run.report["steps"]["count"]


@pytest.mark.parametrize("handler", [True, False], ids=["job-handles-it", "default-action"])
def test_sigterm_to_holoprof_run_reaches_the_job_and_flushes(tmp_path: Path, handler: bool) -> None:
    run_dir = tmp_path / "run"
    args = ["--handle", "SIGTERM"] if handler else []
    proc = start_holoprof(
        "run", "--out", str(run_dir), "--no-report", "--",
        script("interruptible.py"), "--no-torch", *args,
        cwd=tmp_path,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        head = read_until(proc.stdout.fileno(), "started")
        proc.send_signal(signal.SIGTERM)
        rc, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = head + out
    assert rc == 128 + signal.SIGTERM, err
    m = manifest(run_dir)
    assert m["status"] == "crashed" and m["exit_code"] == 143
    doc = report_json(run_dir)
    main = main_process(doc)
    assert main["end_ns"] > 0, "the job's agent wrote its final record"
    if handler:
        assert printed_int(out, "signals") == 1, "forwarded once"
        assert doc["steps"]["count"] == printed_int(out, "steps")
    else:
        assert "signals" not in out, "the job died of SIGTERM"
        assert main["exit_code"] == 143
        assert doc["steps"]["count"] >= 3


def start_in_terminal(args: list[str], cwd: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``args`` as the session leader of a new pseudo-terminal, as a shell would."""
    master, slave = pty.openpty()

    def take_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=job_env(),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=take_terminal,
        )
    finally:
        os.close(slave)
    return proc, master


def test_ctrl_c_interrupts_the_job_exactly_once(tmp_path: Path) -> None:
    from conftest import HOLOPROF

    run_dir = tmp_path / "run"
    proc, master = start_in_terminal(
        [*HOLOPROF, "run", "--out", str(run_dir), "--no-report", "--",
         script("interruptible.py"), "--handle", "SIGINT"],
        tmp_path,
    )  # fmt: skip
    try:
        head = read_until(master, "started")
        os.write(master, b"\x03")  # Ctrl-C: the terminal signals its whole foreground group
        rest = read_until(master, None)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    out = head + rest
    assert printed_int(out, "signals") == 1, out
    assert rc == 130, out
    m = manifest(run_dir)
    assert m["status"] == "crashed" and m["exit_code"] == 130
    doc = report_json(run_dir)
    assert doc["steps"]["count"] == printed_int(out, "steps")
    assert "holoprof: run saved" in out


def test_failing_collector_leaves_the_job_unchanged(tmp_path: Path, standard_untraced) -> None:
    run = traced(tmp_path, script("train.py"), env={"HOLOPROF_FAULT_INJECT": "torch"})
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.proc.stdout == standard_untraced.stdout
    failed = [
        line for line in run.proc.stderr.splitlines() if "holoprof: the 'torch' collector failed" in line
    ]
    assert len(failed) == 1, run.proc.stderr
    assert "Traceback" not in run.proc.stderr
    errors = run.report["run"]["errors"]
    assert len(errors) == 1 and "torch" in errors[0], errors
    assert main_process(run.report)["errors"], "the failing process records it"


def test_flushes_while_the_job_imports_torch_do_not_break_it(tmp_path: Path) -> None:
    # The writer thread flushes every 20 ms, many times while `import torch` is under way.
    run = traced(
        tmp_path, script("train.py"), "--epochs", "1", "--batches", "3", "--no-eval",
        options=("--flush-interval", "0.02"),
    )  # fmt: skip
    assert run.proc.returncode == 0, run.proc.stderr
    assert "Traceback" not in run.proc.stderr
    assert "steps 3" in run.proc.stdout
    assert run.report["steps"]["count"] == 3
    assert main_process(run.report)["role"] == "main"
