"""Generated runs with known totals: the report's numbers equal the generator's; filters push down."""

from __future__ import annotations

import os

import pytest

import holoprof
from holoprof.analyze.report import build_report
from holoprof.bench.synth import PHASE_MEANS_NS, generate_run
from holoprof.errors import HoloprofError


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object]:
    out = os.path.join(str(tmp_path_factory.mktemp("synth")), "run")
    totals = generate_run(out, steps=20_000, ranks=3, chunk_steps=6_000)
    return out, totals


def test_report_totals_equal_the_generated_ones(synth: tuple[str, object]) -> None:
    path, totals = synth
    doc = build_report(holoprof.load(path))
    assert doc["steps"]["count"] == 20_000
    assert doc["run"]["ranks"] == 3
    assert len(doc["steps"]["per_rank"]) == 3
    for phase in PHASE_MEANS_NS:
        assert doc["phases"][phase]["total_s"] == pytest.approx(totals.phase_ns[phase] / 1e9, rel=1e-6)  # type: ignore[attr-defined]
    step_s = totals.step_ns / 1e9  # type: ignore[attr-defined]
    assert doc["steps"]["total_s"] == pytest.approx(step_s, rel=1e-6)
    assert abs(sum(p["fraction"] for p in doc["phases"].values()) - 1) < 1e-9


def test_filters_read_only_what_is_asked(synth: tuple[str, object]) -> None:
    path, _ = synth
    run = holoprof.load(path, steps=(100, 199), ranks=[1])
    assert run.rows("SELECT count(*) FROM spans WHERE kind = 'step'")[0][0] == 100
    assert run.rows("SELECT DISTINCT rank FROM spans")[0][0] == 1
    whole = holoprof.load(path).rows("SELECT min(start_ns) FROM spans")[0][0]
    w = holoprof.load(path, start_s=10.0, end_s=20.0)
    lo, hi = w.rows("SELECT min(start_ns), max(start_ns) FROM spans")[0]
    assert lo >= whole + 10 * 10**9 and hi <= whole + 20 * 10**9


def test_a_reversed_window_is_refused(synth: tuple[str, object]) -> None:
    with pytest.raises(HoloprofError, match="swap"):
        holoprof.load(synth[0], start_s=5, end_s=1)


def test_memory_limit_is_applied(synth: tuple[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOLOPROF_MEMORY_LIMIT", "300MB")
    run = holoprof.load(synth[0])
    limit = run.rows("SELECT current_setting('memory_limit')")[0][0]
    assert "MiB" in limit or "MB" in limit
    assert build_report(run)["steps"]["count"] == 20_000


def test_dask_engine_gives_the_same_numbers_as_duckdb(synth: tuple[str, object]) -> None:
    pytest.importorskip("distributed")
    path, _ = synth
    duck = build_report(holoprof.load(path, ranks=[0, 2]))
    dask = build_report(holoprof.load(path, ranks=[0, 2]), engine="dask")
    assert dask["engine"] == "dask" and duck["engine"] == "duckdb"
    assert dask["steps"]["count"] == duck["steps"]["count"] == 20_000
    for key in ("median_s", "p90_s", "per_s", "total_s", "epochs", "per_rank"):
        assert dask["steps"][key] == duck["steps"][key], key
    assert dask["steps"]["timeline"] == duck["steps"]["timeline"]
    assert dask["phases"] == duck["phases"]
    assert dask["resources"] == duck["resources"]


def test_unknown_engine_is_refused(synth: tuple[str, object]) -> None:
    with pytest.raises(HoloprofError, match="unknown engine"):
        build_report(holoprof.load(synth[0]), engine="spark")


def test_rounded_phase_fractions_still_sum_to_one() -> None:
    from holoprof import model
    from holoprof.analyze.report import _phases_doc
    from holoprof.analyze.steps import PhaseStat, ProcKey, StepStats

    phases = {p: PhaseStat(0.0, 0.0, 0.0) for p in model.PHASES}
    for p in ("forward", "backward", "optimizer"):  # each rounds up: 3 x 0.333334 overshoots 1
        phases[p] = PhaseStat(0.3333335, 1.0, 1.0)
    st = StepStats(ProcKey("h", 1, -1, 1), 3, 1.0, 1.0, 1.0, 1.0, 3.0, 0, 1, phases)
    doc = _phases_doc(st)
    assert abs(sum(v["fraction"] for v in doc.values()) - 1) < 1e-12
    assert all(v["fraction"] >= 0 for v in doc.values())
