"""The framework corpus (PyTorch), trainers in one process each: LBFGS in a plain loop (every step is
``optimizer.step(closure)``), PyTorch Lightning's Trainer (automatic optimization through a closure, 2
DataLoader workers, validation and ModelCheckpoint), Hugging Face's Trainer on a tiny BERT built from a
config, with and without gradient accumulation. Each is checked against the truth its script measures
about itself, and an untraced run with the same seed.

Phases are compared with the job's own timers in the same run (both see the same load): this module
need not run alone, unlike ``test_frameworks_torch.py``'s DDP job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import TracedRun, require
from test_frameworks_torch import (
    assert_agrees,
    assert_no_false_findings,
    phase_s,
    script,
    traced_job,
    untraced_losses,
)


def assert_counts_and_phases(doc: dict[str, Any], t: dict[str, Any], steps: int, epochs: int) -> None:
    """The script counted ``steps`` and ``epochs``, the report the same, and its data_wait, forward,
    backward and optimizer phases agree with the script's timers."""
    assert t["steps"] == steps and t["epochs"] == epochs
    assert doc["steps"]["count"] == t["steps"]
    assert doc["steps"]["epochs"] == t["epochs"]
    assert_agrees(doc, t["timers"], "data_wait", "forward", "backward", "optimizer")


# --- LBFGS: optimizer.step(closure) in a plain loop ---------------------------------------------------
@pytest.fixture(scope="module")
def lbfgs(tmp_path_factory: pytest.TempPathFactory) -> tuple[TracedRun, dict[str, Any]]:
    return traced_job(tmp_path_factory.mktemp("lbfgs"), script("lbfgs_loop.py"))


def test_lbfgs_closure_steps_are_the_loops_steps(lbfgs: tuple[TracedRun, dict[str, Any]]) -> None:
    run, t = lbfgs
    doc = run.report
    # forward and backward run inside optimizer.step(closure), and keep their own phases
    assert_counts_and_phases(doc, t, steps=32, epochs=2)
    assert_no_false_findings(doc)


def test_lbfgs_traced_computes_what_untraced_does(
    lbfgs: tuple[TracedRun, dict[str, Any]], tmp_path: Path
) -> None:
    assert untraced_losses(tmp_path, script("lbfgs_loop.py")) == lbfgs[1]["losses"]


# --- Lightning -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lightning(tmp_path_factory: pytest.TempPathFactory) -> tuple[TracedRun, dict[str, Any]]:
    require("lightning", reason="the frameworks extra is not installed")
    return traced_job(tmp_path_factory.mktemp("lightning"), script("lightning_fit.py"))


def test_lightning_steps_epochs_and_phases(lightning: tuple[TracedRun, dict[str, Any]]) -> None:
    run, t = lightning
    doc = run.report
    assert_counts_and_phases(doc, t, steps=128, epochs=2)
    # the validation loop is eval, ModelCheckpoint's saves are checkpoint (one per epoch)
    assert phase_s(doc, "eval") > 0
    assert phase_s(doc, "checkpoint") > 0
    assert doc["phases"]["checkpoint"]["steps"] + ("checkpoint" in doc["outside_steps"]["phases"]) == 2
    assert_no_false_findings(doc)


def test_lightning_traced_computes_what_untraced_does(
    lightning: tuple[TracedRun, dict[str, Any]], tmp_path: Path
) -> None:
    assert untraced_losses(tmp_path, script("lightning_fit.py")) == lightning[1]["losses"]


# --- Hugging Face Trainer ------------------------------------------------------------------------------
@pytest.mark.parametrize("accum", [1, 2])
def test_hf_trainer_steps_epochs_and_phases(tmp_path: Path, accum: int) -> None:
    require("transformers", reason="the frameworks extra is not installed")
    run, t = traced_job(tmp_path, script("hf_trainer.py"), str(accum))
    doc = run.report
    # 128 samples, batches of 8: 16 batches an epoch, one optimizer step per `accum` of them
    assert_counts_and_phases(doc, t, steps=2 * 16 // accum, epochs=2)
    assert phase_s(doc, "eval") > 0
    assert_no_false_findings(doc)
