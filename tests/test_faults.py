"""Nothing recorded is lost and the job is never broken: crashes, kills, signals, Ctrl-C, bad chunks,
and a collector that fails."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import signal
import subprocess
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
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
    run_python,
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


def flushed_steps(run_dir: Path) -> int:
    """The step spans in the chunks the job's writer has flushed so far."""
    n = 0
    for part in run_dir.glob("spans/*/*/part-*.parquet"):
        try:
            n += pq.read_table(part, columns=["kind"])["kind"].to_pylist().count("step")
        except (OSError, pa.ArrowException):  # a chunk replaced meanwhile: its rows are in another
            return 0
    return n


def wait_for_flushed_steps(run_dir: Path, steps: int = 5, timeout: float = 60) -> None:
    """Wait until the job's writer has flushed ``steps`` steps, however slowly the machine runs."""
    deadline = time.monotonic() + timeout
    while flushed_steps(run_dir) < steps:
        assert time.monotonic() < deadline, f"{steps} steps were not flushed"
        time.sleep(0.05)


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


def assert_failed_open(
    run: TracedRun, untraced: subprocess.CompletedProcess[str], collector: str, point: str, failing: int = 1
) -> None:
    """The job ran as if untraced; the collector was turned off once, and the report says so.
    ``failing``: the collectors the job made fail, each at one entry point."""
    assert run.proc.returncode == untraced.returncode, run.proc.stderr
    assert run.proc.stdout == untraced.stdout, run.proc.stderr
    assert "Traceback" not in run.proc.stderr, run.proc.stderr
    lines = [line for line in run.proc.stderr.splitlines() if line.startswith("holoprof: the '")]
    assert len([line for line in lines if "' collector failed" in line]) == failing, run.proc.stderr
    failed = [line for line in lines if f"holoprof: the '{collector}' collector failed" in line]
    assert len(failed) == 1 and f"{collector}:{point}" in failed[0], run.proc.stderr
    errors = run.report["run"]["errors"]
    assert len(errors) == failing, errors
    mine = [e for e in errors if f": {collector}: FaultInjected" in e]
    assert len(mine) == 1 and f"{collector}:{point}" in mine[0], errors


#: Every entry point a collector patches in a PyTorch job, as HOLOPROF_FAULT_INJECT=<collector>:<point>,
#: grouped in the jobs that make them fail. A collector that fails is turned off, so a job makes each
#: collector fail at one entry point; the torch collector's entry points have a job each, since the
#: other collectors follow the steps and phases it records. The job of torch:forward asks for it by the
#: collector's name alone (its default entry point).
FAULT_JOBS = [
    ("torch",),
    ("torch:backward",),
    ("torch:optimizer_pre",),  # torch:optimizer_* fail inside torch's own loop over its optimizer hooks
    ("torch:optimizer_post",),
    ("torch:zero_grad",),
    ("torch:dataloader",),
    ("checkpoint:save", "memory:forward", "flops:forward", "io:install"),
    # flops:optimizer_post fails while the counting mode is entered; io:open is the Python layer's
    # open(), with --io-layer python
    ("checkpoint:load", "memory:optimizer_post", "flops:optimizer_post", "io:open"),
]
DEFAULT_POINTS = {"torch": "forward"}


def entry_point(inject: str) -> tuple[str, str]:
    collector, _, point = inject.partition(":")
    return collector, point or DEFAULT_POINTS[collector]


ENTRY_POINTS = {entry_point(inject): job for job in FAULT_JOBS for inject in job}
SHORT_TRAIN = ("--epochs", "1", "--batches", "4", "--reload")


@pytest.fixture(scope="module")
def short_untraced(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    tmp = tmp_path_factory.mktemp("short-untraced")
    proc = run_python(script("train.py"), *SHORT_TRAIN, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert "reloaded" in proc.stdout
    return proc


@pytest.fixture(scope="module")
def short_faulty(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple[str, ...]], TracedRun]:
    """The short training job traced with the collectors of a job of FAULT_JOBS failing; each job runs
    once."""
    runs: dict[tuple[str, ...], TracedRun] = {}

    def run(job: tuple[str, ...]) -> TracedRun:
        if job not in runs:
            io = any(entry_point(inject)[0] == "io" for inject in job)
            runs[job] = traced(
                tmp_path_factory.mktemp("fault"),
                script("train.py"),
                *SHORT_TRAIN,
                options=("--io-layer", "python") if io else (),
                env={"HOLOPROF_FAULT_INJECT": ",".join(job)},
            )
        return runs[job]

    return run


def test_failing_collector_leaves_the_job_unchanged(
    tmp_path: Path,
    short_untraced: subprocess.CompletedProcess[str],
    short_faulty: Callable[[tuple[str, ...]], TracedRun],
) -> None:
    run = short_faulty(("torch",))  # HOLOPROF_FAULT_INJECT=torch: its default entry point
    assert_failed_open(run, short_untraced, "torch", "forward")
    assert main_process(run.report)["errors"], "the failing process records it"
    terminal = run_holoprof("report", run.run_dir, cwd=tmp_path)
    assert terminal.returncode == 0, terminal.stderr
    assert "collector turned off" in terminal.stdout and "torch: FaultInjected" in terminal.stdout


@pytest.mark.parametrize(("collector", "point"), ENTRY_POINTS, ids=[f"{c}:{p}" for c, p in ENTRY_POINTS])
def test_a_collector_failing_at_any_entry_point_leaves_the_job_unchanged(
    short_untraced: subprocess.CompletedProcess[str],
    short_faulty: Callable[[tuple[str, ...]], TracedRun],
    collector: str,
    point: str,
) -> None:
    job = ENTRY_POINTS[collector, point]
    assert_failed_open(short_faulty(job), short_untraced, collector, point, failing=len(job))


def test_a_collector_failing_in_a_job_that_fails_keeps_its_exit_status(tmp_path: Path) -> None:
    args = (script("train.py"), "--epochs", "1", "--raise-after", "2")
    untraced = run_python(*args, cwd=tmp_path)
    assert untraced.returncode == 1
    run = traced(tmp_path, *args, env={"HOLOPROF_FAULT_INJECT": "torch:optimizer_post"})
    assert run.proc.returncode == 1
    assert run.proc.stdout == untraced.stdout
    assert run.proc.stderr.count("RuntimeError: boom after 2 steps") == 1, "the job's own error, once"
    assert "OrderedDict mutated" not in run.proc.stderr
    assert any("torch:optimizer_post" in e for e in run.report["run"]["errors"])


@pytest.mark.parametrize("point", ["start", "tick"])
def test_failing_resource_sampling_is_in_the_report(tmp_path: Path, point: str) -> None:
    run = traced(
        tmp_path, script("manual_steps.py"), "20", "--phases",
        options=("--sample-interval", "0.05"), env={"HOLOPROF_FAULT_INJECT": f"system:{point}"},
    )  # fmt: skip
    assert run.proc.returncode == 0, run.proc.stderr
    assert "holoprof: the 'system' collector failed" in run.proc.stderr
    errors = run.report["run"]["errors"]
    assert (
        len(errors) == 1
        and f"system: FaultInjected: injected fault (HOLOPROF_FAULT_INJECT=system:{point})" in (errors[0])
    ), errors
    assert run.report["steps"]["count"] == 20, "the job's own collectors go on"
    terminal = run_holoprof("report", run.run_dir, cwd=tmp_path)
    assert "collector turned off" in terminal.stdout and "system: FaultInjected" in terminal.stdout


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


# --- a run directory that fills up or turns read-only ------------------------------------------------------


@contextlib.contextmanager
def mounted_small_fs(mnt: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of its own at ``mnt`` (needs root), so a test can fill it or remount it
    read-only."""
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with mounted_small_fs(tmp_path / "fs") as mnt:
        yield mnt


@pytest.fixture(scope="module")
def filled_untraced(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """The job that fills its file system (exit status 3), untraced, on a small file system of its own:
    the reference for every variant of a run directory that fills up."""
    tmp = tmp_path_factory.mktemp("filled-untraced")
    with mounted_small_fs(tmp / "fs") as mnt:
        proc = run_python(script("fill_disk.py"), str(mnt / "filler"), "--free", "--exit", "3", cwd=tmp)
    assert proc.returncode == 3, proc.stderr
    return proc


def leftovers(run_dir: Path) -> list[str]:
    """Temporary files and empty files a failed write may leave."""
    return [str(p) for p in run_dir.rglob("*") if p.is_file() and (".tmp" in p.name or p.stat().st_size == 0)]


def storage_lines(stderr: str) -> list[str]:
    """The launcher's own lines about the run directory (the short report may mention it too)."""
    return [line for line in stderr.splitlines() if line.startswith("holoprof: the run directory")]


@pytest.mark.parametrize("free", [False, True], ids=["stays-full", "freed-before-exit"])
def test_a_run_directory_that_fills_up_keeps_the_exit_status_and_counts_the_loss(
    tmp_path: Path, small_fs: Path, filled_untraced: subprocess.CompletedProcess[str], free: bool
) -> None:
    extra = ["--free"] if free else []
    untraced = filled_untraced
    run_dir = small_fs / "run"
    proc = run_holoprof(
        "run", "--out", str(run_dir), "--",
        script("fill_disk.py"), str(small_fs / "filler"), "--exit", "3", *extra,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith(untraced.stdout), "the job's own output, then the report"
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = storage_lines(proc.stderr)
    assert "No space left on device" in line and "events were dropped" in line, line
    assert not leftovers(run_dir)
    m = manifest(run_dir)
    assert m["status"] == "crashed" and m["exit_code"] == 3, "finished, in the room kept for it"
    assert m["storage_error"] == "No space left on device"
    doc = report_json(run_dir)
    assert doc["run"]["dropped_events"] > 0
    assert any("could not be written" in w for w in doc["run"]["warnings"]), doc["run"]["warnings"]
    if free:
        assert main_process(doc)["dropped_events"] > 0, "the job's own count reached its last record"


def test_a_run_directory_that_turns_read_only_keeps_the_exit_status(tmp_path: Path, small_fs: Path) -> None:
    go = tmp_path / "go"
    go.touch()
    args = (script("fill_disk.py"), str(small_fs / "unused"), "--wait-for", str(go))
    untraced = run_python(*args, cwd=tmp_path)
    assert untraced.returncode == 0, untraced.stderr
    go.unlink()
    run_dir = small_fs / "run"
    proc = start_holoprof("run", "--out", str(run_dir), "--no-report", "--", *args, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        head = read_until(proc.stdout.fileno(), "started")
        wait_for_flushed_steps(run_dir, 1)
        subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
        go.touch()
        rc, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert rc == 0, err
    assert head + out == untraced.stdout
    assert "Traceback" not in err, err
    (line,) = storage_lines(err)
    assert "Read-only file system" in line and "the manifest could not be finished" in line, line
    subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)
    assert not leftovers(run_dir)
    assert manifest(run_dir)["status"] == "running", "nothing could be written after the remount"
    doc = report_json(run_dir)
    assert doc["steps"]["count"] >= 1, "what was flushed before is there"
