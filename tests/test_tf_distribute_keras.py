"""The framework corpus, TensorFlow side: a ``tf.distribute`` custom loop, traced with no change and
checked against the truth the script measures about itself.

MirroredStrategy over 2 logical CPUs, a distributed dataset and a ``tf.function`` around
``strategy.run(step_fn)``, with a Keras optimizer and with the job's own variable updates: steps are
the step function's calls, ``data_wait`` the fetches from the distributed iterator, epochs the
iterations over the distributed dataset; the loop waits for its (slow) input, which is an input-bound
finding, not host overhead. Compared bit for bit with an untraced run of the same seeded script.

Its share of time waiting for input is the job's own measure of a 2-replica loop on the 2 cores: it
runs alone (conftest's TIMING_MODULES). Keras 3 on the PyTorch backend is in ``test_keras_torch.py``,
with the helpers below.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import TracedRun, require, run_python, traced

require("tensorflow")
require("keras")

SCRIPTS = Path(__file__).resolve().parent / "framework_scripts"
#: phases agree with the job's own timers within this share of the total step time
POINTS = 0.05


def script(name: str) -> str:
    return str(SCRIPTS / name)


def env(tmp: Path) -> dict[str, str]:
    return {"TRUTH_OUT": str(tmp / "truth.json"), "TF_CPP_MIN_LOG_LEVEL": "3"}


def truth(tmp: Path) -> dict[str, Any]:
    doc = json.loads((tmp / "truth.json").read_text())
    assert isinstance(doc, dict)
    return doc


def phase_s(doc: dict[str, Any], name: str) -> float:
    """A phase's time over the whole run: within the steps and outside them."""
    return float(doc["phases"][name]["total_s"]) + float(doc["outside_steps"]["phases"].get(name, 0.0))


def assert_agrees(doc: dict[str, Any], phase: str, want_s: float) -> None:
    """The phase within POINTS of the step time of the job's own timer, and the breakdown whole."""
    total = doc["steps"]["total_s"]
    got = phase_s(doc, phase)
    assert total > 0
    assert abs(got - want_s) <= POINTS * total, (
        f"{phase}: holoprof {got:.4f} s, the job's timer {want_s:.4f} s"
    )
    assert sum(p["fraction"] for p in doc["phases"].values()) == pytest.approx(1.0, abs=1e-6)


def assert_clean(run: TracedRun) -> None:
    """No collector failed, nothing went wrong in the job."""
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert run.report["run"]["errors"] == [], run.report["run"]["errors"]
    assert "collector failed" not in run.proc.stderr, run.proc.stderr[-3000:]
    assert "Traceback" not in run.proc.stderr, run.proc.stderr[-3000:]


def traced_and_untraced(
    factory: pytest.TempPathFactory, name: str, *args: str
) -> tuple[TracedRun, dict[str, Any], dict[str, Any]]:
    """One traced run with the default options and one untraced run of the same seeded script, each
    with its truth (``OUT`` in ``args`` is a directory of each run's own)."""
    tmp = factory.mktemp(name)
    out = tmp / "out"
    out.mkdir()
    argv = [out.as_posix() if a == "OUT" else a for a in args]
    run = traced(tmp, sys.executable, script(name), *argv, env=env(tmp), timeout=300)
    assert_clean(run)
    traced_truth = truth(tmp)
    tmp = factory.mktemp(name + "-untraced")
    out = tmp / "out"
    out.mkdir()
    argv = [out.as_posix() if a == "OUT" else a for a in args]
    proc = run_python(script(name), *argv, cwd=tmp, env=env(tmp), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run, traced_truth, truth(tmp)


# --- tf.distribute: MirroredStrategy custom loop ------------------------------------------------------
@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> tuple[TracedRun, dict[str, Any], dict[str, Any]]:
    return traced_and_untraced(tmp_path_factory, "tf_mirrored_loop.py")


def test_mirrored_loop_trains_bit_for_bit_as_untraced(
    mirrored: tuple[TracedRun, dict[str, Any], dict[str, Any]],
) -> None:
    _run, t, untraced = mirrored
    assert t["replicas"] == 2
    assert len(t["losses"]) == t["steps"] == 100
    assert t["losses"] == untraced["losses"]


def test_mirrored_loop_steps_epochs_and_input_wait(
    mirrored: tuple[TracedRun, dict[str, Any], dict[str, Any]],
) -> None:
    """Steps are the calls of the distributed step function (Keras optimizer or the job's own
    updates), epochs the iterations over the distributed dataset, data_wait the iterator's fetches."""
    run, t, _ = mirrored
    doc = run.report
    assert t["steps"] == 2 * 2 * 25 and t["epochs"] == 2 * 2  # 2 modes x 2 epochs x 25 batches
    assert doc["steps"]["count"] == t["steps"]
    assert doc["steps"]["epochs"] == t["epochs"]
    assert_agrees(doc, "data_wait", t["timers"]["data_wait"])
    assert_agrees(doc, "compute", t["timers"]["step"])  # each call of the step function


def test_mirrored_loop_waiting_for_input_is_input_bound_not_host_overhead(
    mirrored: tuple[TracedRun, dict[str, Any], dict[str, Any]],
) -> None:
    run, t, _ = mirrored
    assert t["wait_share_median"] >= 0.2  # the job's own timers: it waits for its input (high)
    found = {f["id"]: f for f in run.report["findings"]}
    assert "host_overhead" not in found, found["host_overhead"]
    assert found["input_bound"]["severity"] == "high"
