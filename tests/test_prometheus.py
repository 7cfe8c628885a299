"""/metrics by Prometheus' conventions, read back with prometheus_client's own parser.

One metric per quantity with its unit in its name, ``_ratio`` for fractions, the same labels on every
sample of a metric (``rank`` on every per-rank one), and nothing exported that was not measured.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_holoprof, script
from holoprof.analyze.report import build_report
from holoprof.bench.synth import generate_run
from holoprof.present.prometheus import prometheus_text, render, run_samples
from holoprof.store.reader import load

#: The base units of Prometheus' naming conventions, and the suffixes of counts and rates.
UNITS = ("_seconds", "_bytes", "_ratio", "_watts", "_per_second", "_total")
COUNTS = ("holoprof_run_running", "holoprof_job_processes", "holoprof_job_threads")
PER_RANK = (
    "holoprof_steps",
    "holoprof_step_time_seconds",
    "holoprof_step_time_p90_seconds",
    "holoprof_steps_per_second",
    "holoprof_phase_ratio",
)


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def ranks_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ranks") / "run"
    generate_run(str(out), steps=40, ranks=3, io_files=2)
    return build_report(load(str(out)))


def test_every_per_rank_metric_has_the_same_labels(ranks_report: dict[str, Any]) -> None:
    fams = families(prometheus_text([("r", ranks_report)]))
    for name in PER_RANK:
        samples = fams[name].samples
        keys = {tuple(sorted(s.labels)) for s in samples}
        want = ("phase", "rank", "run") if name == "holoprof_phase_ratio" else ("rank", "run")
        assert keys == {want}, (name, keys)
        assert {s.labels["rank"] for s in samples} == {"0", "1", "2"}, name
    rates = {s.labels["rank"]: s.value for s in fams["holoprof_steps_per_second"].samples}
    for row in ranks_report["steps"]["per_rank"]:
        assert rates[str(row["rank"])] == pytest.approx(row["per_s"])
    steps = {s.labels["rank"]: s.value for s in fams["holoprof_steps"].samples if s.name.endswith("_total")}
    assert steps == {str(r["rank"]): r["count"] for r in ranks_report["steps"]["per_rank"]}


def test_one_metric_per_unit_with_the_unit_in_its_name(ranks_report: dict[str, Any]) -> None:
    fams = families(prometheus_text([("r", ranks_report)]))
    assert "holoprof_resource" not in fams and not any("fraction" in n for n in fams)
    for name, fam in fams.items():
        sample_names = {s.name for s in fam.samples}
        assert sample_names, name
        assert all(n.endswith(UNITS) or n in COUNTS for n in sample_names), sample_names
        assert all(set(s.labels) == set(fam.samples[0].labels) for s in fam.samples), name
        if name.endswith("_ratio") and name != "holoprof_job_cpu_ratio":  # the CPU may use several cores
            assert all(0 <= s.value <= 1 for s in fam.samples), name
    phases = {
        s.labels["phase"]: s.value for s in fams["holoprof_phase_ratio"].samples if s.labels["rank"] == "0"
    }
    assert sum(phases.values()) == pytest.approx(1.0, abs=1e-3)


def test_a_run_without_steps_exports_no_step_metrics(tmp_path: Path) -> None:
    # a job that reads and writes files but has no steps: markup_names.py without holoprof.step()
    data = tmp_path / "data"
    plain = tmp_path / "plain.py"
    plain.write_text(Path(script("markup_names.py")).read_text().replace("holoprof.step()", "pass"))
    proc = run_holoprof(
        "run", "--out", str(tmp_path / "nosteps"), "--no-report", "--", str(plain), str(data), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    doc = build_report(load(str(tmp_path / "nosteps")))
    assert doc["steps"]["count"] == 0 and doc["io"]["bytes_read"] > 0
    fams = families(prometheus_text([("n", doc)]))
    assert not [n for n in fams if "step" in n or "phase" in n], sorted(fams)
    assert [s.value for s in fams["holoprof_io_read_bytes"].samples if s.name.endswith("_total")] == [
        doc["io"]["bytes_read"]
    ]
    assert [s.value for s in fams["holoprof_run_running"].samples] == [0.0]
    summary = doc["resources"]["summary"]  # the latest sample of each, in its base unit
    assert [s.value for s in fams["holoprof_job_rss_bytes"].samples] == [summary["job.rss_bytes"]["last"]]
    cpu = fams["holoprof_job_cpu_ratio"].samples
    assert [s.value for s in cpu] == [pytest.approx(summary["job.cpu_percent"]["last"] / 100)]
    written = [s.value for s in fams["holoprof_job_disk_written_bytes"].samples if s.name.endswith("_total")]
    assert written == [summary["job.write_bytes"]["last"]]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (apt-get install prometheus)")
def test_promtool_accepts_the_metrics(ranks_report: dict[str, Any]) -> None:
    proc = subprocess.run(
        ["promtool", "check", "metrics"],
        input=prometheus_text([("r", ranks_report)]),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_runs_samples_survive_json_and_render_as_its_report(ranks_report: dict[str, Any]) -> None:
    """The dashboard server keeps each run's samples (as JSON on disk) and renders /metrics from them."""
    stored = json.loads(json.dumps(run_samples(ranks_report)))
    two = [("r", ranks_report), ("s", ranks_report)]
    assert render([("r", stored), ("s", stored)]) == prometheus_text(two)
    fams = families(render([("r", stored)], pending=2))
    assert [s.value for s in fams["holoprof_runs_pending"].samples] == [2]
    assert "holoprof_runs_pending" not in families(render([("r", stored)], pending=0))
