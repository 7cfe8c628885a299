"""The terminal, the HTML report and the command line with text from the job and in any terminal.

Text from the job (paths, arguments, stage names) is data in every renderer: a real traced job whose
file path, stage names and arguments hold Rich markup and HTML is reported literally. The report
follows the terminal's width and never cuts a number; ``-o -`` writes to stdout where the format
allows; progress bars appear on a terminal only; ``holoprof demo`` without torch says how to install
it before writing anything.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import HOLOPROF, job_env, run_holoprof, script
from holoprof.bench.synth import generate_run
from holoprof.present.summary import MAX_ROWS

#: Arguments of the job that Rich or a browser would take for markup.
ARGS = ["[link=http://e]x[/link]", "[bold]", "<script>alert(2)</script>&"]
#: The file the job writes and reads under its data folder (tests/scripts/markup_names.py).
FILE = os.path.join("in[bold]", "a[/x]<script>alert(1)</script>&amp;.bin")
STAGES = ("prepare [red]<b>", "train [/x]&")


@pytest.fixture(scope="module")
def markup_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A traced job with markup in its file path, stage names and arguments: (run dir, data dir)."""
    tmp = tmp_path_factory.mktemp("markup")
    data = str(tmp / "data")
    out = str(tmp / "run")
    proc = run_holoprof("run", "--out", out, "--", script("markup_names.py"), data, *ARGS, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert os.path.isfile(os.path.join(data, FILE))
    return out, data


def test_terminal_report_prints_markup_from_the_job_literally(markup_run: tuple[str, str]) -> None:
    run_dir, data = markup_run
    proc = run_holoprof("report", run_dir, cwd=run_dir, env={"COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert os.path.join(data, FILE) in out  # the path, every bracket and tag in place
    assert " ".join(ARGS) in out  # the command line
    for name in STAGES:
        assert name in out
    assert "\x1b]8;" not in out  # no terminal hyperlink made of [link=...]


def test_html_report_escapes_the_job_text(markup_run: tuple[str, str]) -> None:
    run_dir, _data = markup_run
    proc = run_holoprof("report", run_dir, "--html", "-", cwd=run_dir)
    assert proc.returncode == 0, proc.stderr
    page = proc.stdout
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # the page's own inline scripts (uPlot, the palette, the charts, their data) and none from the job
    assert re.findall(r"<script[^>]*>", page, re.I) == ["<script>"] * 5
    assert "<script>alert" not in page
    assert "a[/x]&lt;script&gt;alert(1)&lt;/script&gt;&amp;amp;.bin" in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt;&amp;" in page
    assert "train [/x]&amp;" in page


def test_html_and_json_cannot_both_go_to_stdout(markup_run: tuple[str, str]) -> None:
    proc = run_holoprof("report", markup_run[0], "--html", "-", "--json", cwd=markup_run[0])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "choose one" in proc.stderr


def _file_column(report: str) -> str:
    """The path of the first file of the report's top files, from its folded pieces: in the table's
    first column (the numbers to its right), or listed under the table on a narrow terminal."""
    lines = [line.strip("│").rstrip() for line in report.splitlines()]
    at = next(i for i, line in enumerate(lines) if line.strip() == "top files")
    head, rows = lines[at + 1], lines[at + 3 :]
    if head.lstrip().startswith("#"):  # narrow: "1 PATH" under the numbers, continued indented
        start = next(i for i, line in enumerate(rows) if re.match(r"^\s*1 /", line))
        pieces = [rows[start].split(maxsplit=1)[1]]
        for line in rows[start + 1 :]:
            if not line.startswith("   ") or not line.strip():
                break
            pieces.append(line.strip())
        return "".join(pieces)
    col = head.index("file")
    pieces = []
    for line in rows:
        if not line.strip("│ ") or line.startswith("╰"):  # a blank line of the panel, or its end
            break
        pieces.append(line[col:].split()[0] if line[col:].strip() else "")
    return "".join(pieces)


@pytest.mark.parametrize("columns", [60, 80, 150])
def test_report_follows_the_terminal_width_and_keeps_numbers_whole(
    markup_run: tuple[str, str], columns: int
) -> None:
    run_dir, _ = markup_run
    proc = run_holoprof("report", run_dir, cwd=run_dir, env={"COLUMNS": str(columns)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) == columns  # the panel spans the terminal
    assert not re.search(r"\d…|…\d", proc.stdout), proc.stdout  # no number cut short
    doc = json.loads(run_holoprof("report", run_dir, "--json", cwd=run_dir).stdout)
    path = doc["io"]["files_detail"][0]["path"]
    assert _file_column(proc.stdout) == path  # folded over lines, the path is still all there
    assert f"{doc['steps']['count']}" in proc.stdout


def test_iobench_table_keeps_numbers_whole_at_80_columns(tmp_path: Path) -> None:
    for i in range(4):
        (tmp_path / f"shard-{i}.bin").write_bytes(os.urandom(300_000))
    proc = run_holoprof(
        "iobench", str(tmp_path), "--threads", "1,16", "--block-size", "4K,1M", "--max-seconds", "1",
        cwd=tmp_path, env={"COLUMNS": "80"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    assert "…" not in proc.stdout, proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"^\s*(1|16)\s+1\s", line)]
    assert len(rows) == 4 and all(re.fullmatch(r"[\d,]+\.\d", r[-3]) for r in rows), proc.stdout


def test_chrome_export_to_stdout(markup_run: tuple[str, str], tmp_path: Path) -> None:
    run_dir, _data = markup_run
    proc = run_holoprof("export", run_dir, "--format", "chrome", "-o", "-", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    trace = json.loads(proc.stdout)
    assert {"prepare [red]<b>", "train [/x]&"} <= {e.get("name") for e in trace["traceEvents"]}
    assert not (tmp_path / "-").exists()
    assert proc.stderr.count("\n") == 1 and "stdout" in proc.stderr
    run_holoprof("export", run_dir, "--format", "chrome", "-o", str(tmp_path / "t.json"), cwd=tmp_path)
    assert (tmp_path / "t.json").read_text(encoding="utf-8") == proc.stdout


def test_tensorboard_export_refuses_stdout(markup_run: tuple[str, str], tmp_path: Path) -> None:
    proc = run_holoprof("export", markup_run[0], "--format", "tensorboard", "-o", "-", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "log directory" in proc.stderr
    assert not (tmp_path / "-").exists()


def _on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``holoprof ARGS`` with stderr on a pseudo-terminal (stdout a pipe); (status, what the
    terminal got)."""
    leader, follower = pty.openpty()
    env = job_env()
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        [*HOLOPROF, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    got = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the other side closed (EIO)
            break
        if not chunk:
            break
        got += chunk
    os.close(leader)
    return proc.wait(60), got.decode(errors="replace")


@pytest.mark.parametrize("fmt", ["chrome", "tensorboard"])
def test_export_shows_progress_on_a_terminal_only(
    markup_run: tuple[str, str], tmp_path: Path, fmt: str
) -> None:
    run_dir, _ = markup_run
    rc, tty = _on_a_terminal(["export", run_dir, "--format", fmt, "-o", str(tmp_path / "on-tty")], tmp_path)
    assert rc == 0, tty
    what = "Chrome trace" if fmt == "chrome" else "TensorBoard steps"
    assert what in tty and "\x1b[" in tty  # a bar, drawn with terminal control sequences
    proc = run_holoprof("export", run_dir, "--format", fmt, "-o", str(tmp_path / "piped"), cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stderr.count("\n") == 1 and what not in proc.stderr and "\x1b[" not in proc.stderr


def test_pack_shows_progress_on_a_terminal_only(markup_run: tuple[str, str], tmp_path: Path) -> None:
    rc, tty = _on_a_terminal(["pack", markup_run[0], "-o", str(tmp_path / "a.holoprof")], tmp_path)
    assert rc == 0 and "packing" in tty and "\x1b[" in tty, tty
    proc = run_holoprof("pack", markup_run[0], "-o", str(tmp_path / "b.holoprof"), cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr.count("\n") == 1 and "\x1b[" not in proc.stderr


def test_torch_trace_import_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    trace = tmp_path / "rank0.json"
    loop = Path(__file__).resolve().parent / "trace_scripts" / "profile_loop.py"
    made = subprocess.run(
        [sys.executable, str(loop), str(trace)], capture_output=True, text=True, timeout=180
    )
    assert made.returncode == 0, made.stderr
    rc, tty = _on_a_terminal(["import", "torch-trace", str(trace), "--out", str(tmp_path / "a")], tmp_path)
    assert rc == 0 and "reading the trace" in tty and "\x1b[" in tty, tty
    proc = run_holoprof("import", "torch-trace", str(trace), "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "reading the trace" not in proc.stderr and "\x1b[" not in proc.stderr


BLOCK_TORCH = """
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
"""


def test_demo_without_torch_says_how_to_install_it_and_writes_nothing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_TORCH)
    env = {"PYTHONPATH": str(site)}
    check = subprocess.run(
        [sys.executable, "-c", "import torch"], env=job_env(env), capture_output=True, text=True
    )
    assert check.returncode != 0 and "No module named 'torch'" in check.stderr
    work = tmp_path / "work"
    work.mkdir()
    proc = run_holoprof("demo", "--quick", "--out", str(work / "run"), cwd=work, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "pip install 'holoprof[torch]'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert list(work.iterdir()) == []


# --- many ranks ---------------------------------------------------------------------------------------

RANKS = 80


@pytest.fixture(scope="module")
def many_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """A generated run of RANKS ranks (a process and a stage each) with DDP communication and files."""
    out = str(tmp_path_factory.mktemp("many") / "run")
    generate_run(out, 2, ranks=RANKS, comm=True, io_files=1)
    proc = run_holoprof("report", out, "--json", cwd=out)
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


def test_terminal_summarizes_many_ranks_and_json_keeps_them_all(
    many_ranks: tuple[str, dict[str, Any]],
) -> None:
    run_dir, doc = many_ranks
    per_rank = doc["communication"]["per_rank"]
    assert len(per_rank) == len(doc["stages"]) == RANKS and len(doc["io"]["files_detail"]) > 10
    proc = run_holoprof("report", run_dir, cwd=run_dir, env={"COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) < 220, len(lines)
    # the communication table: the slowest ranks by step median, in numeric order, then the rest
    start = next(i for i, line in enumerate(lines) if re.match(r"^│\s+rank\s+steps", line))
    rows = []
    for line in lines[start + 2 :]:
        m = re.match(r"^│\s+(\d+)\s+\d+\s", line)
        if not m:
            break
        rows.append(int(m.group(1)))
    assert rows == sorted(rows) and len(rows) == MAX_ROWS - 1, rows
    slowest = sorted(per_rank, key=lambda r: -r["step_median_s"])[: MAX_ROWS - 1]
    assert set(rows) == {r["rank"] for r in slowest}
    assert f"… {RANKS - len(rows)} more" in lines[start + 2 + len(rows)]
    steps_rest = sum(r["steps"] for r in per_rank if r["rank"] not in rows)
    assert re.search(rf"… {RANKS - len(rows)} more\s+{steps_rest}\s", lines[start + 2 + len(rows)])
    # the ranks' stages, leaves of one command, are one row (the JSON keeps each)
    assert sum(1 for line in lines if f"synthetic.py [ranks 0-{RANKS - 1}]" in line) == 1
    assert "synthetic.py [rank " not in proc.stdout and "more stages" not in proc.stdout
    # counted from the run's totals, not from the files the JSON lists
    assert f"… and {doc['io']['files'] - 10:,} more files" in proc.stdout


def test_html_summarizes_many_ranks(many_ranks: tuple[str, dict[str, Any]]) -> None:
    run_dir, _doc = many_ranks
    proc = run_holoprof("report", run_dir, "--html", "-", cwd=run_dir)
    assert proc.returncode == 0, proc.stderr
    page = proc.stdout
    # every rank is a row of the rank × step heatmap (its five maps: about 110 bytes a rank here, and
    # the table under it about 100 bytes for each of its 12 rows); the rest is summarized
    assert len(page) < 150_000 + 200 * RANKS, len(page)
    assert len(re.findall(rf"synthetic\.py \[ranks 0-{RANKS - 1}\]", page)) >= 1  # one stage row
    assert not re.findall(r"synthetic\.py \[rank \d+\]", page) and "more stages" not in page
    assert re.search(r"longest processes; \d+ more processes are in the JSON report", page)
    in_chart = re.findall(r">pid \d+ synthetic\.py<", page)
    assert len(in_chart) <= MAX_ROWS
