"""Checkpoint cost: blocking saves measured, checkpoint_bound, Young/Daly interval, the input what-if."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from conftest import report_json
from holoprof.analyze.checkpoints import young_daly_interval_s

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(tmp: str, name: str, *args: str, opts: tuple[str, ...] = ()) -> dict:
    out = os.path.join(tmp, name)
    p = subprocess.run(
        [sys.executable, "-m", "holoprof.cli", "run", "--no-report", "--out", out, *opts, "--", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return report_json(out)


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = str(tmp_path_factory.mktemp("ckpt"))
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    script = os.path.join(HERE, "ckpt_scripts", "ckpt_loop.py")
    # a save in every step: steps alike, so the run's noise (the floor of every finding) stays low
    # even on a loaded machine, where saves in every other step made it hide the finding
    return _run(tmp, "heavy", script, data, "20", "1", opts=("--mtbf", "24"))


def test_every_save_is_recorded_with_bytes_and_bandwidth(heavy: dict) -> None:
    ck = heavy["checkpoints"]
    assert ck["saves"] == 20
    for item in ck["items"]:
        assert item["api"] == "torch.save"
        assert item["bytes"] > 32 * 1024 * 1024
        assert item["bandwidth_bytes_per_s"] > 0
        assert item["blocking"] is True


def test_checkpoint_bound_fires_with_young_daly_interval(heavy: dict) -> None:
    f = {x["id"]: x for x in heavy["findings"]}["checkpoint_bound"]
    assert f["evidence"]["blocking_fraction"] >= 0.05
    assert f["estimated_gain"] == pytest.approx(f["evidence"]["blocking_fraction"], abs=1e-3)
    ck = heavy["checkpoints"]
    assert ck["mtbf_s"] == 24 * 3600
    assert ck["young_daly_interval_s"] == pytest.approx(
        math.sqrt(2 * ck["median_save_s"] * 24 * 3600), rel=1e-3
    )
    assert "BurstBuffer" in f["recommendation"] and "Young/Daly" in f["recommendation"]


def test_young_daly_formula() -> None:
    assert young_daly_interval_s(10.0, 3600.0 * 24) == pytest.approx(math.sqrt(2 * 10 * 86400))
    assert young_daly_interval_s(0.0, 100.0) == 0.0


def test_bad_mtbf_is_refused(tmp_path: object) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "holoprof.cli", "run", "--mtbf", "-1", "--", "x.py"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    assert p.stderr.strip().startswith("holoprof: error:") and "--mtbf" in p.stderr
    assert "Traceback" not in p.stderr
