"""The framework corpus (PyTorch): real training code of the frameworks people use, traced with no
change, checked against the truth each script measures about itself (its own step and epoch counts,
its own timers around forward, backward, the optimizer and the data fetches, its losses).

Here: a DDP job on gloo started by torchrun (2 ranks), with a DistributedSampler. It needs both cores
and its communication times against the ranks' own timers: it runs alone (conftest's TIMING_MODULES).
LBFGS, Lightning's and Hugging Face's Trainers are in ``test_frameworks_trainers.py``, today's
training code (checkpointing, ``torch.compile``, AMP) in ``test_frameworks_modern.py``; both use the
helpers below.

Phases must agree with the job's timers within a few points of the step time, and tracing must not
change what the job computes (the same losses, bit for bit, as an untraced run with the same seed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import TracedRun, free_port, run_python, traced

SCRIPTS = Path(__file__).resolve().parent / "framework_scripts"
#: phases agree with the job's own timers within this share of the total step time
POINTS = 0.05
#: nothing may reach the network; no logger of any kind
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "WANDB_DISABLED": "true",
    "TOKENIZERS_PARALLELISM": "false",
}


def script(name: str) -> str:
    return str(SCRIPTS / name)


def env(tmp: Path) -> dict[str, str]:
    return {**OFFLINE, "TRUTH_OUT": str(tmp / "truth.json")}


def truth(tmp: Path, rank: int | None = None) -> dict[str, Any]:
    path = tmp / ("truth.json" if rank is None else f"truth.json.{rank}")
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict)
    return doc


def traced_job(tmp: Path, *command: str) -> tuple[TracedRun, dict[str, Any]]:
    run = traced(tmp, sys.executable, *command, env=env(tmp), timeout=240)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    return run, truth(tmp)


def untraced_losses(tmp: Path, *command: str) -> list[str]:
    proc = run_python(*command, cwd=tmp, env=env(tmp), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = truth(tmp)["losses"]
    assert isinstance(losses, list)
    return losses


def phase_s(doc: dict[str, Any], name: str) -> float:
    """A phase's time over the whole run: within the steps and outside them (before the first)."""
    return float(doc["phases"][name]["total_s"]) + float(doc["outside_steps"]["phases"].get(name, 0.0))


def assert_agrees(doc: dict[str, Any], timers: dict[str, float], *names: str) -> None:
    """Each phase within POINTS of the step time of the job's own timer for it, and the breakdown
    whole (the phases sum to 1)."""
    total = doc["steps"]["total_s"]
    assert total > 0
    for name in names:
        got, want = phase_s(doc, name), timers[name]
        assert abs(got - want) <= POINTS * total, (
            f"{name}: holoprof {got:.4f} s, the job's timer {want:.4f} s"
        )
    assert sum(p["fraction"] for p in doc["phases"].values()) == pytest.approx(1.0, abs=1e-6)


def assert_no_false_findings(doc: dict[str, Any]) -> None:
    """A CPU run gives no measurement that a larger batch would help; no finding is shown without a
    measurable gain, none speaks of CUDA without a GPU or of the network when every rank ran on one host."""
    assert "memory_headroom" not in {f["id"] for f in doc["findings"]}
    for f in doc["findings"]:
        if f["id"] not in ("memory_pressure", "hang"):
            assert f["estimated_gain"] >= f["threshold"]["min_gain"] >= 0.01, f
        if not doc["run"]["gpus"]:
            assert "CUDA" not in f["recommendation"], f
        if len(doc["run"]["hosts"]) <= 1:
            assert "network" not in f["recommendation"], f


# --- torchrun DDP on gloo ------------------------------------------------------------------------------
def test_torchrun_ddp_steps_phases_and_communication(tmp_path: Path) -> None:
    command = (
        "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        script("ddp_torchrun.py"),
    )  # fmt: skip
    run = traced(tmp_path, sys.executable, *command, env=env(tmp_path), timeout=240)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    doc = run.report
    truths = {r: truth(tmp_path, r) for r in (0, 1)}
    t = truths[0]
    assert t["steps"] == 16 * 2 and t["epochs"] == 2  # 512 samples, 2 ranks, batches of 16
    assert doc["steps"]["count"] == t["steps"] and doc["steps"]["epochs"] == t["epochs"]
    assert {r["rank"]: r["count"] for r in doc["steps"]["per_rank"]} == {
        r: truths[r]["steps"] for r in (0, 1)
    }
    timers = t["timers"]
    assert_agrees(doc, timers, "forward", "optimizer")
    # loss.backward() holds backward's compute and DDP's wait for its allreduce (a communication
    # phase); the job's own all_reduce of the loss is communication too
    total = doc["steps"]["total_s"]
    both = phase_s(doc, "backward") + phase_s(doc, "communication")
    assert abs(both - timers["backward"] - timers["all_reduce"]) <= POINTS * total
    assert phase_s(doc, "communication") >= timers["all_reduce"] - POINTS * total
    comm = doc["communication"]
    assert comm["exposed_fraction"] == pytest.approx(doc["phases"]["communication"]["fraction"], abs=1e-6)
    assert 0 < comm["exposed_s_per_step"] <= comm["total_s_per_step"] <= comm["step_mean_s"]
    for r in comm["per_rank"]:
        assert 0 < r["exposed_s"] <= r["comm_s"] <= r["step_median_s"], r
    assert_no_false_findings(doc)
