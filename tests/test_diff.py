"""`holoprof diff`: a real 5 ms/step slowdown is significant, two runs of the same config are not."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from conftest import error_lines, run_holoprof
from holoprof.analyze.stats import mann_whitney_u
from workflows.runs import DIFF_STEPS, step_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return step_runs(tmp_path_factory)


def diff_json(a: str, b: str, cwd: Path) -> dict[str, Any]:
    proc = run_holoprof("diff", a, b, "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "holoprof.diff/1"
    return doc


def test_a_slowdown_of_5_ms_per_step_is_significant(runs: dict[str, str], tmp_path: Path) -> None:
    d = diff_json(runs["a"], runs["slow"], tmp_path)
    st = d["steps"]
    assert d["a"]["steps"] == d["b"]["steps"] == DIFF_STEPS
    assert st["p_value"] < 0.01 and st["significant"] and st["direction"] == "slower", st
    assert d["b"]["median_s"] - d["a"]["median_s"] == pytest.approx(0.005, abs=0.003)
    assert st["median_change"] > 0.05 and d["throughput"]["change"] < 0
    assert d["phases"]["forward"]["median_s_b"] > d["phases"]["forward"]["median_s_a"]
    for f in d["findings"]:  # side by side: present in A, in B, or both
        assert (
            f["status"]
            == {(True, True): "both", (True, False): "resolved", (False, True): "new"}[
                (f["a"] is not None, f["b"] is not None)
            ]
        ), f


def test_two_runs_of_the_same_config_do_not_differ_significantly(
    runs: dict[str, str], tmp_path: Path
) -> None:
    st = diff_json(runs["a"], runs["b"], tmp_path)["steps"]
    assert not st["significant"] and st["direction"] == "unchanged", st


def test_terminal_diff_shows_both_runs_side_by_side(runs: dict[str, str], tmp_path: Path) -> None:
    proc = run_holoprof("diff", runs["a"], runs["slow"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "holoprof diff" in out and "median step" in out and "p90 step" in out
    assert "B is slower" in out and "Mann-Whitney" in out and "forward" in out


def test_diff_of_a_run_with_itself_is_refused(runs: dict[str, str], tmp_path: Path) -> None:
    a = runs["a"]
    proc = run_holoprof("diff", a, a + "/", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "both runs are" in line


def test_diff_of_a_missing_run_is_refused(runs: dict[str, str], tmp_path: Path) -> None:
    proc = run_holoprof("diff", runs["a"], str(tmp_path / "missing"), cwd=tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def _reference_u(a: list[float], b: list[float]) -> float:
    return sum(1.0 if y > x else (0.5 if y == x else 0.0) for x in a for y in b)


def test_mann_whitney_u_statistic_and_p_value() -> None:
    rng = random.Random(1)
    a = [rng.gauss(10, 1) for _ in range(60)]
    same = [rng.gauss(10, 1) for _ in range(50)]
    shifted = [v + 1.5 for v in same]
    ties = [round(v) for v in a]
    for x, y in ((a, same), (a, shifted), (ties, [round(v) for v in same])):
        assert mann_whitney_u(x, y).u == pytest.approx(_reference_u(x, y))
    assert mann_whitney_u(a, shifted).p_value < 1e-6
    assert mann_whitney_u(a, same).p_value > 0.01
    # a textbook case: no overlap between 4 and 4 values -> U = 16 for the larger sample
    r = mann_whitney_u([1, 2, 3, 4], [5, 6, 7, 8])
    assert r.u == 16 and r.prob_b_longer == 1.0
    assert mann_whitney_u([1.0, 1.0], [1.0, 1.0]).p_value == 1.0
