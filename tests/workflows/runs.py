"""Traced runs of the workflow scripts, made once per test session and shared by the test modules.

``pipeline(tmp_path_factory)``: ``holoprof run --sample-interval 0.1 --io-trace -- bash pipeline.sh``
(prepare with numpy, sort and tar the prepared files, train 30 steps with PyTorch, evaluate; every
I/O operation recorded), made once for all of pytest-xdist's workers (``conftest.shared``).
``step_runs(tmp_path_factory)``: three runs of ``steps.py 40`` whose loops run at the same time: ``a`` and
``b`` identical, ``slow`` 5 ms longer per step. They run at a raised scheduling priority where the
test may raise it (root): on a crowded machine a sleeping loop otherwise wakes up late by tens of
milliseconds, noise that buries a 5 ms difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import HOLOPROF, TracedRun, job_env, shared_traced

HERE = Path(__file__).resolve().parent
PIPELINE_STEPS = 30
DIFF_STEPS = 40
_CACHE: dict[str, Any] = {}


def pipeline(factory: pytest.TempPathFactory) -> TracedRun:
    if "pipeline" not in _CACHE:
        run = shared_traced(
            factory, "pipeline", "bash", str(HERE / "pipeline.sh"),
            options=("--sample-interval", "0.1", "--io-trace"),
            env={"PYTHON": sys.executable, "STEPS": str(PIPELINE_STEPS), "SLEEP_PER_STEP": "0.003"},
            timeout=240,
        )  # fmt: skip
        assert run.proc.returncode == 0, run.proc.stderr
        _CACHE["pipeline"] = run
    result: TracedRun = _CACHE["pipeline"]
    return result


def _raise_priority() -> None:
    try:
        os.nice(-10)
    except OSError:  # not permitted: run at the normal priority
        pass


def step_runs(factory: pytest.TempPathFactory) -> dict[str, str]:
    """Run directories by name: ``a``, ``b`` (same as a) and ``slow`` (+5 ms per step)."""
    if "steps" not in _CACHE:
        tmp = factory.mktemp("steps")
        start_at = time.time() + 8.0  # all three loops start together: they share the machine's load
        procs = {}
        for name, extra in (("a", "0"), ("b", "0"), ("slow", "0.005")):
            procs[name] = subprocess.Popen(
                [*HOLOPROF, "run", "--out", str(tmp / name), "--no-report", "--",
                 str(HERE / "steps.py"), str(DIFF_STEPS), "--extra", extra, "--start-at", str(start_at)],
                cwd=tmp, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                stdin=subprocess.DEVNULL, preexec_fn=_raise_priority,
            )  # fmt: skip
        for name, p in procs.items():
            _out, err = p.communicate(timeout=120)
            assert p.returncode == 0, (name, err)
        _CACHE["steps"] = {name: str(tmp / name) for name in procs}
    runs: dict[str, str] = _CACHE["steps"]
    return runs
