"""The framework corpus (PyTorch): real training code of the frameworks people use, traced with no
change, checked against the truth each script measures about itself (its own step and epoch counts,
its own timers around forward, backward, the optimizer and the data fetches, its losses).

* LBFGS in a plain loop: every step is ``optimizer.step(closure)``;
* PyTorch Lightning's Trainer: automatic optimization (a closure), 2 DataLoader workers, validation
  and ModelCheckpoint;
* Hugging Face's Trainer on a tiny BERT built from a config, with and without gradient accumulation;
* a DDP job on gloo started by torchrun (2 ranks), with a DistributedSampler;
* a plain loop written as today's training code is: activation checkpointing (reentrant and not),
  ``torch.compile``, bf16 autocast with ``GradScaler``, ``save_on_cpu`` (one process, in turn), traced
  with the default options and with every step's memory measured.

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
    """A CPU run gives no measurement that a larger batch would help."""
    assert "memory_headroom" not in {f["id"] for f in doc["findings"]}


# --- LBFGS: optimizer.step(closure) in a plain loop ---------------------------------------------------
@pytest.fixture(scope="module")
def lbfgs(tmp_path_factory: pytest.TempPathFactory) -> tuple[TracedRun, dict[str, Any]]:
    return traced_job(tmp_path_factory.mktemp("lbfgs"), script("lbfgs_loop.py"))


def test_lbfgs_closure_steps_are_the_loops_steps(lbfgs: tuple[TracedRun, dict[str, Any]]) -> None:
    run, t = lbfgs
    doc = run.report
    assert t["steps"] == 32 and t["epochs"] == 2
    assert doc["steps"]["count"] == t["steps"]
    assert doc["steps"]["epochs"] == t["epochs"]
    # forward and backward run inside optimizer.step(closure), and keep their own phases
    assert_agrees(doc, t["timers"], "data_wait", "forward", "backward", "optimizer")
    assert_no_false_findings(doc)


def test_lbfgs_traced_computes_what_untraced_does(
    lbfgs: tuple[TracedRun, dict[str, Any]], tmp_path: Path
) -> None:
    assert untraced_losses(tmp_path, script("lbfgs_loop.py")) == lbfgs[1]["losses"]


# --- Lightning -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lightning(tmp_path_factory: pytest.TempPathFactory) -> tuple[TracedRun, dict[str, Any]]:
    pytest.importorskip("lightning", reason="the frameworks extra is not installed")
    return traced_job(tmp_path_factory.mktemp("lightning"), script("lightning_fit.py"))


def test_lightning_steps_epochs_and_phases(lightning: tuple[TracedRun, dict[str, Any]]) -> None:
    run, t = lightning
    doc = run.report
    assert t["steps"] == 128 and t["epochs"] == 2
    assert doc["steps"]["count"] == t["steps"]
    assert doc["steps"]["epochs"] == t["epochs"]
    assert_agrees(doc, t["timers"], "data_wait", "forward", "backward", "optimizer")
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
    pytest.importorskip("transformers", reason="the frameworks extra is not installed")
    run, t = traced_job(tmp_path, script("hf_trainer.py"), str(accum))
    doc = run.report
    # 128 samples, batches of 8: 16 batches an epoch, one optimizer step per `accum` of them
    assert t["steps"] == 2 * 16 // accum and t["epochs"] == 2
    assert doc["steps"]["count"] == t["steps"]
    assert doc["steps"]["epochs"] == t["epochs"]
    assert_agrees(doc, t["timers"], "data_wait", "forward", "backward", "optimizer")
    assert phase_s(doc, "eval") > 0
    assert_no_false_findings(doc)


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


# --- today's training code: checkpointing, torch.compile, AMP, save_on_cpu ---------------------------
@pytest.fixture(scope="module")
def modern(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for name, opts in (("default", ()), ("full", ("--memory", "full"))):
        tmp = tmp_path_factory.mktemp(f"modern-{name}")
        run = traced(tmp, sys.executable, script("modern_loop.py"), options=opts, env=env(tmp), timeout=300)
        assert run.proc.returncode == 0, run.proc.stderr[-3000:]
        runs[name] = (run, truth(tmp))
    tmp = tmp_path_factory.mktemp("modern-untraced")
    proc = run_python(script("modern_loop.py"), cwd=tmp, env=env(tmp), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs["untraced"] = truth(tmp)
    return runs


def test_modern_code_trains_bit_for_bit_as_untraced(modern: dict[str, Any]) -> None:
    """No crash under activation checkpointing, the same losses, and torch.compile's graph unchanged:
    one graph and no graph break, as untraced (holoprof leaves nothing in what Dynamo traces)."""
    want = modern["untraced"]
    assert want["graphs"] == 1 and want["graph_breaks"] == 0
    for name in ("default", "full"):
        run, t = modern[name]
        assert t["losses"] == want["losses"], name
        assert (t["graphs"], t["graph_breaks"]) == (1, 0), name
        assert "Traceback" not in run.proc.stderr and "global hooks" not in run.proc.stderr, name
        assert not run.report["run"]["errors"], run.report["run"]["errors"]


def test_modern_code_steps_epochs_and_phases(modern: dict[str, Any]) -> None:
    run, t = modern["default"]
    doc = run.report
    assert t["steps"] == 5 * 24 and t["epochs"] == 5 * 2
    assert doc["steps"]["count"] == t["steps"] and doc["steps"]["epochs"] == t["epochs"]
    # checkpointing's recomputation is backward's time (it runs inside loss.backward()); torch.compile's
    # compilation is its own phase, cut out of the forward and backward it ran in
    assert_agrees(doc, t["timers"], "data_wait", "optimizer")
    got = sum(phase_s(doc, p) for p in ("forward", "backward", "compile"))
    want = t["timers"]["forward"] + t["timers"]["backward"]
    assert abs(got - want) <= POINTS * doc["steps"]["total_s"], (got, want)
    assert doc["phases"]["compile"]["total_s"] > 0
    assert_no_false_findings(doc)


def test_modern_code_memory_on_every_step(modern: dict[str, Any]) -> None:
    """Measured on every step: activations where holoprof may push its saved-tensor hooks; under the
    job's own save_on_cpu (the last 24 steps), none pushed over it, and the report says so."""
    run, _t = modern["full"]
    mem = run.report["memory"]
    assert mem["sampled_steps"] == list(range(120))
    fwd = {r["step"]: r["activations"] for r in mem["timeline"] if r["phase"] == "forward"}
    assert all(fwd[s] > 0 for s in range(96)), fwd
    assert mem["activations_unmeasured"]["steps"] == list(range(96, 120))
    assert "save_on_cpu" in mem["activations_unmeasured"]["why"]
