"""The framework corpus, today's training code: a plain loop with activation checkpointing (reentrant
and not), ``torch.compile``, bf16 autocast with ``GradScaler`` and ``save_on_cpu`` (one process, each
in turn), traced with the default options and with every step's memory measured, against the truth
the script measures about itself and an untraced run with the same seed.

Phases are compared with the job's own timers in the same run (both see the same load): this module
need not run alone, unlike ``test_frameworks_torch.py``'s DDP job.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from conftest import run_python, traced
from test_frameworks_torch import POINTS, assert_agrees, assert_no_false_findings, env, phase_s, script, truth


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
