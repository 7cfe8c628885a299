"""Checkpoint cost: blocking saves measured, checkpoint_bound, Young/Daly interval, the input what-if."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

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
    r = subprocess.run(
        [sys.executable, "-m", "holoprof.cli", "report", out, "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = str(tmp_path_factory.mktemp("ckpt"))
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    script = os.path.join(HERE, "ckpt_scripts", "ckpt_loop.py")
    return _run(tmp, "heavy", script, data, "20", "2", opts=("--mtbf", "24"))


def test_every_save_is_recorded_with_bytes_and_bandwidth(heavy: dict) -> None:
    ck = heavy["checkpoints"]
    assert ck["saves"] == 10
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


def test_input_whatif_model() -> None:
    from holoprof.analyze.findings import input_whatif
    from holoprof.analyze.steps import PhaseStat, ProcKey, StepStats

    phases = {p: PhaseStat(0.0, 0.0, 0.0) for p in ("data_wait", "forward", "other")}
    phases["data_wait"] = PhaseStat(0.6, 6.0, 0.006, 0.6)
    st = StepStats(ProcKey("h", 1, -1, 1), 100, 0.010, 0.011, 0.010, 100.0, 1.0, 0, 1, phases)
    # no workers: 6 ms of loading per batch, 4 ms of compute; 4 readers on 8 cores -> 1.5 ms a batch
    w = input_whatif(st, {"num_workers": 0}, readers=4, cpus=8, gpu=True)
    assert w["compute_s"] == pytest.approx(0.004)
    assert w["predicted_step_s"] == pytest.approx(0.004)  # input now hides behind compute
    assert w["predicted_gain"] == pytest.approx(0.6)
    # 2 workers already: a worker needs 20 ms per batch; 4 workers give 5 ms > 4 ms of compute
    w = input_whatif(st, {"num_workers": 2}, readers=4, cpus=8, gpu=True)
    assert w["predicted_step_s"] == pytest.approx(0.005)
    # on a CPU-only 2-core machine only one core is left for workers
    w = input_whatif(st, {"num_workers": 0}, readers=4, cpus=2, gpu=False)
    assert w["effective_readers"] == 1 and w["predicted_step_s"] == pytest.approx(0.006)
