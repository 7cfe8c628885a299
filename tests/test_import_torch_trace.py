"""`holoprof import torch-trace`: real PyTorch profiler traces become runs that report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "holoprof.cli", *args], capture_output=True, text=True, timeout=180
    )


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = str(tmp_path_factory.mktemp("kineto"))
    p = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "trace_scripts", "profile_loop.py"),
            os.path.join(tmp, "rank0.json"),
            "gz",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    return tmp


def _report(run: str) -> dict:
    r = _cli("report", run, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_profiler_trace_imports_with_steps_and_phases(traces: str, tmp_path: os.PathLike[str]) -> None:
    out = os.path.join(tmp_path, "run")
    r = _cli("import", "torch-trace", os.path.join(traces, "rank0.json"), "--out", out)
    assert r.returncode == 0, r.stderr
    doc = _report(out)
    assert doc["run"]["status"] == "imported"
    assert doc["steps"]["count"] == 5  # the profiler's active steps
    phases = doc["phases"]
    for p in ("data_wait", "forward", "backward", "optimizer"):
        assert phases[p]["total_s"] > 0, p
    assert abs(sum(v["fraction"] for v in phases.values()) - 1) < 1e-9


def test_gzipped_and_plain_traces_import_the_same(traces: str, tmp_path: os.PathLike[str]) -> None:
    a, b = os.path.join(tmp_path, "a"), os.path.join(tmp_path, "b")
    assert _cli("import", "torch-trace", os.path.join(traces, "rank0.json"), "--out", a).returncode == 0
    assert _cli("import", "torch-trace", os.path.join(traces, "rank0.json.gz"), "--out", b).returncode == 0
    da, db = _report(a), _report(b)
    assert da["steps"] == db["steps"]
    assert da["phases"] == db["phases"]


def test_a_folder_of_rank_traces_gives_one_process_per_rank(traces: str, tmp_path: os.PathLike[str]) -> None:
    folder = os.path.join(tmp_path, "ranks")
    os.makedirs(folder)
    shutil.copy(os.path.join(traces, "rank0.json"), os.path.join(folder, "rank0.json"))
    shutil.copy(os.path.join(traces, "rank0.json.gz"), os.path.join(folder, "rank1.json.gz"))
    out = os.path.join(tmp_path, "run")
    assert _cli("import", "torch-trace", folder, "--out", out).returncode == 0
    doc = _report(out)
    assert doc["run"]["ranks"] == 2
    assert sorted(p["rank"] for p in doc["processes"]) == [0, 1]


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"traceEvents": [{"ph": "X", "name": '])
def test_bad_traces_are_refused_in_one_line(tmp_path: os.PathLike[str], content: bytes) -> None:
    bad = os.path.join(tmp_path, "bad.json")
    with open(bad, "wb") as f:
        f.write(content)
    r = _cli("import", "torch-trace", bad, "--out", os.path.join(tmp_path, "run"))
    assert r.returncode == 2
    assert r.stderr.startswith("holoprof: error:") and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_missing_trace_is_refused(tmp_path: os.PathLike[str]) -> None:
    r = _cli(
        "import", "torch-trace", os.path.join(tmp_path, "nope.json"), "--out", os.path.join(tmp_path, "run")
    )
    assert r.returncode == 2 and "does not exist" in r.stderr
