"""Bad input on the command line: exit status 2 and one clear line, never a traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import TracedRun, copy_run, error_lines, run_holoprof


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("holoprof: error: "), line
    for w in words:
        assert w in line, (w, line)
    return line


def test_unknown_subcommand_is_refused(tmp_path: Path) -> None:
    proc = run_holoprof("frobnicate", cwd=tmp_path)
    assert_one_line_error(proc, "frobnicate")


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["missing.py"], "missing.py"),
        (["python", "missing.py"], "missing.py"),
        (["no-such-command"], "no-such-command"),
        (["./not-there/run.sh"], "not-there"),
    ],
    ids=["script", "python-script", "command", "path"],
)
def test_run_of_a_missing_command_names_it(tmp_path: Path, command: list[str], named: str) -> None:
    proc = run_holoprof("run", "--out", str(tmp_path / "run"), "--", *command, cwd=tmp_path)
    assert_one_line_error(proc, named)
    assert not (tmp_path / "run").exists(), "no run directory for a command that cannot start"


def test_run_of_a_file_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("echo hi\n")
    proc = run_holoprof("run", "--", "./job.sh", cwd=tmp_path)
    assert_one_line_error(proc, "job.sh")


@pytest.mark.parametrize("args", [[], ["--"]], ids=["nothing", "only-dashes"])
def test_run_without_a_command_is_refused(tmp_path: Path, args: list[str]) -> None:
    proc = run_holoprof("run", *args, cwd=tmp_path)
    assert_one_line_error(proc, "no command")


def test_run_into_a_non_empty_out_directory_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_holoprof("run", "--out", str(out), "--", "python", "-c", "pass", cwd=tmp_path)
    assert_one_line_error(proc, str(out), "not empty")
    assert sorted(os.listdir(out)) == ["keep.txt"], "the existing directory is left untouched"
    assert (out / "keep.txt").read_text() == "mine"


def test_run_into_an_unwritable_place_is_refused(tmp_path: Path) -> None:
    # Under a regular file: no directory can be made there, not even by root.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "run"
    proc = run_holoprof("run", "--out", str(out), "--", "python", "-c", "pass", cwd=tmp_path)
    assert_one_line_error(proc, str(out), "--out")


def test_run_with_an_invalid_option_value_is_refused(tmp_path: Path) -> None:
    proc = run_holoprof("run", "--sample-interval", "0", "--", "python", "-c", "pass", cwd=tmp_path)
    assert_one_line_error(proc, "--sample-interval")


def test_report_on_a_missing_path_is_refused(tmp_path: Path) -> None:
    proc = run_holoprof("report", str(tmp_path / "nope"), cwd=tmp_path)
    assert_one_line_error(proc, "does not exist")


def test_report_on_a_directory_that_is_not_a_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "data.txt").write_text("x")
    proc = run_holoprof("report", str(tmp_path / "stuff"), "--json", cwd=tmp_path)
    assert_one_line_error(proc, "not a holoprof run")
    assert proc.stdout == ""


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", ""], ids=["garbage", "not-an-object", "empty"])
def test_report_on_a_corrupted_manifest_is_refused_and_keeps_the_data(
    tmp_path: Path, small_run: TracedRun, content: str
) -> None:
    run = Path(copy_run(small_run.run_dir, tmp_path / "run"))
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*.parquet"))
    assert before, "the run has Parquet files"
    (run / "manifest.json").write_text(content)
    proc = run_holoprof("report", str(run), "--json", cwd=tmp_path)
    assert_one_line_error(proc, "manifest.json")
    after = sorted(str(p.relative_to(run)) for p in run.rglob("*.parquet"))
    assert after == before, "the recorded data is untouched"


def test_no_subcommand_prints_help_and_fails(tmp_path: Path) -> None:
    proc = run_holoprof(cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "run" in proc.stdout and "report" in proc.stdout


#: Every numeric option of the command line that takes a fraction: (command before it, option).
FLOAT_OPTIONS = [
    (("run",), "--sample-interval"),
    (("run",), "--flush-interval"),
    (("run",), "--mtbf"),
    (("export", "RUN", "--format", "chrome", "-o", "out.json"), "--from"),
    (("export", "RUN", "--format", "chrome", "-o", "out.json"), "--to"),
    (("whatif", "RUN"), "--bucket-mb"),
    (("diff", "RUN", "RUN"), "--alpha"),
    (("diff", "RUN", "RUN"), "--min-effect"),
    (("ctl", "RUN", "stacks"), "--timeout"),
    (("sweep", "--param", "bs=1,2"), "--max-seconds"),
    (("iobench", "."), "--max-seconds"),
]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
@pytest.mark.parametrize(("before", "option"), FLOAT_OPTIONS, ids=[f"{b[0]} {o}" for b, o in FLOAT_OPTIONS])
def test_numeric_options_refuse_what_is_not_a_finite_number(
    tmp_path: Path, standard_run: TracedRun, before: tuple[str, ...], option: str, value: str
) -> None:
    args = [standard_run.run_dir if a == "RUN" else a for a in before]
    tail = ["--", "true"] if before[0] in ("run", "sweep") else []
    proc = run_holoprof(*args, f"{option}={value}", *tail, cwd=tmp_path)
    assert_one_line_error(proc, f"argument {option}:", repr(value))
    assert os.listdir(tmp_path) == [], "nothing was run or written"


def test_sweep_into_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    proc = run_holoprof("sweep", "--param", "bs=1,2", "--out", "file", "--", "echo", "{bs}", cwd=tmp_path)
    assert_one_line_error(proc, "file exists and is not a directory")


@pytest.mark.parametrize(
    "args", [("report", "RUN", "--json"), ("report", "RUN"), ("diff", "RUN", "RUN2", "--json")]
)
def test_a_reader_that_closes_the_pipe_gets_no_traceback(
    tmp_path: Path, standard_run: TracedRun, args: tuple[str, ...]
) -> None:
    """`holoprof report --json | head -c 10`: the reader is gone before holoprof writes."""
    from conftest import HOLOPROF, job_env

    other = copy_run(standard_run.run_dir, tmp_path / "copy")
    argv = [{"RUN": standard_run.run_dir, "RUN2": other}.get(a, a) for a in args]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [*HOLOPROF, *argv], stdout=write_end, stderr=subprocess.PIPE, text=True, env=job_env(),
            cwd=tmp_path, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == 1, "Python's documented status for a closed pipe"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("export", "RUN", "--format", "chrome", "-o", "out.json", "--from", "1e308"), "at most 1e+09"),
        (("export", "RUN", "--format", "chrome", "-o", "out.json", "--to", "1e300"), "at most 1e+09"),
        (("iobench", ".", "--threads", "100000000000"), "100000000000 is above 1024"),
        (("iobench", ".", "--processes", "5000"), "5000 is above 1024"),
    ],
)
def test_numbers_out_of_range_are_refused(
    tmp_path: Path, standard_run: TracedRun, args: tuple[str, ...], expected: str
) -> None:
    proc = run_holoprof(*[standard_run.run_dir if a == "RUN" else a for a in args], cwd=tmp_path, timeout=60)
    assert_one_line_error(proc, expected)
    assert os.listdir(tmp_path) == []
