"""Findings on real loops: an input-starved loop is called input-bound, a compute-bound one is not."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import TracedRun, script, traced


def finding(doc: dict[str, Any], fid: str) -> dict[str, Any] | None:
    found = [f for f in doc["findings"] if f["id"] == fid]
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.fixture(scope="module")
def starved_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    # 3 ms per sample, 8 samples per batch, loaded in the training process: ~24 ms of waiting per
    # step against well under a millisecond of compute.
    tmp = tmp_path_factory.mktemp("starved")
    run = traced(
        tmp, script("train.py"), "--epochs", "1", "--batches", "6", "--batch-size", "8",
        "--sleep-per-sample", "0.003", "--no-eval",
    )  # fmt: skip
    assert run.proc.returncode == 0, run.proc.stderr
    return run


@pytest.fixture(scope="module")
def compute_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    # Cheap in-memory samples, a wide model: the step is matmuls.
    tmp = tmp_path_factory.mktemp("compute")
    run = traced(
        tmp, script("train.py"), "--epochs", "1", "--batches", "8", "--batch-size", "32",
        "--features", "1024", "--hidden", "4096", "--no-eval",
    )  # fmt: skip
    assert run.proc.returncode == 0, run.proc.stderr
    return run


def test_input_starved_loop_is_input_bound_high(starved_run: TracedRun) -> None:
    doc = starved_run.report
    f = finding(doc, "input_bound")
    assert f is not None, doc["findings"]
    assert f["severity"] == "high"
    assert f["evidence"]["data_wait_fraction"] >= 0.2
    assert doc["phases"]["data_wait"]["fraction"] >= 0.2
    assert f["evidence"]["num_workers"] == 0
    assert f["evidence"]["batch_size"] == 8
    assert "num_workers" in f["recommendation"]
    assert 0 < f["estimated_gain"] <= 1
    assert f["title"]


def test_input_starved_loop_waits_at_least_the_sleep(starved_run: TracedRun) -> None:
    dw = starved_run.report["phases"]["data_wait"]
    assert dw["median_s"] >= 8 * 0.003 * 0.9, dw
    assert starved_run.report["steps"]["count"] == 6


def test_findings_carry_evidence_and_a_fix(starved_run: TracedRun) -> None:
    for f in starved_run.report["findings"]:
        assert set(f) >= {"id", "severity", "title", "evidence", "recommendation", "estimated_gain"}
        assert f["severity"] in ("high", "medium", "low")
        assert f["evidence"], f
        assert f["recommendation"], f


def test_compute_bound_loop_is_not_input_bound(compute_run: TracedRun) -> None:
    doc = compute_run.report
    assert doc["steps"]["count"] == 8
    # the step is the model's compute: forward, backward and the optimizer's update of its 8 M
    # parameters (whose share grows when another process takes the memory bandwidth), not the input
    ph = doc["phases"]
    assert ph["forward"]["fraction"] + ph["backward"]["fraction"] + ph["optimizer"]["fraction"] > 0.8, ph
    assert ph["data_wait"]["fraction"] < 0.1, ph
    assert finding(doc, "input_bound") is None, doc["findings"]
