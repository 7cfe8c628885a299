"""The HTML report: one self-contained file with charts and findings that a real browser renders."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

from conftest import TracedRun, run_holoprof
from holoprof.present.html import render_html
from test_serve_browser import chromium
from workflows.runs import pipeline

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    return pipeline(tmp_path_factory)


@pytest.fixture(scope="module")
def report_file(run: TracedRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html") / "report.html"
    proc = run_holoprof("report", run.run_dir, "--html", str(out), cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "", "--html alone writes the file and prints nothing on stdout"
    return out


def test_one_self_contained_file(report_file: Path) -> None:
    text = report_file.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    external = (
        r"""(?:src|href|xlink:href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//|@import"""
    )
    assert not re.search(external, text, re.I), "no reference to anything on the network"
    assert not re.search(r"<(link|iframe|img)\b", text), "no external resources"
    assert not re.search(r"<script[^>]*\bsrc\s*=", text, re.I), "scripts are inline"
    assert "default-src 'none'" in text, "the page's policy forbids loading anything"
    assert "uPlot" in text, "the dashboard's chart library, inlined"
    assert len(list(report_file.parent.iterdir())) == 1, "one file"
    assert report_file.stat().st_size < 500_000


def test_charts_findings_and_stages_are_in_it(run: TracedRun, report_file: Path) -> None:
    text = report_file.read_text(encoding="utf-8")
    doc = run.report
    for chart in ("step", "phases", "resources"):
        assert f"data-chart='{chart}'" in text, chart
    assert "data-chart='gantt'" in text and "stages and processes over time" in text, "the Gantt chart"
    assert "<svg" not in text and "<rect" not in text, "every chart is drawn by uPlot, none is SVG"
    assert doc["findings"], "the pipeline sleeps outside the phases each step: host overhead"
    for f in doc["findings"]:
        assert html.escape(f["title"]) in text
        assert html.escape(f["recommendation"]) in text
    assert "host_overhead" in text
    for s in doc["stages"]:
        assert html.escape(s["name"]) in text
    assert doc["io"].get("files_detail"), "the pipeline ran with --io-trace: the I/O section has data"
    assert "Read sizes (Darshan buckets)" in text and "data-chart='read-sizes'" in text
    assert "class='io-files'" in text
    assert html.escape(doc["io"]["files_detail"][0]["path"]) in text
    if (doc.get("memory") or {}).get("categories"):
        assert "Categories at the step with the peak" in text and "data-chart='memory'" in text
    assert f">{doc['steps']['count']}<" in text


def test_user_strings_are_escaped(run: TracedRun) -> None:
    doc = dict(run.report)
    evil = '<script>alert("x")</script>'
    doc["run"] = {**doc["run"], "command": ["python", evil], "warnings": [evil], "dir": "/tmp/<b>run"}
    doc["findings"] = [{**f, "title": evil} for f in doc["findings"]]
    doc["io"] = {
        "bytes_read": 10, "bytes_written": 0, "files": 1, "reads": 1, "writes": 0,
        "read_size_histogram": {"0_100": 1},
        "files_detail": [{"path": f"/data/{evil}.bin", "bytes_read": 10, "reads": 1}],
    }  # fmt: skip
    out = render_html(doc)
    assert evil not in out and "<b>run" not in out
    assert html.escape(evil) in out
    # the chart data inside the page's script cannot end it
    doc["phases"] = {
        **doc["phases"],
        "</script><script>alert(1)//": {"fraction": 0, "total_s": 0, "median_s": 0},
    }
    assert "</script><script>alert(1)" not in render_html(doc)


def test_long_runs_say_they_are_downsampled(run: TracedRun) -> None:
    doc = dict(run.report)
    doc["steps"] = {**doc["steps"], "count": 10_000}
    out = render_html(doc)
    assert "downsampled" in out and "of 10000" in out


#: Every chart of the report as the browser drew it: per data-chart element, its uPlot charts and
#: canvases, and what the Gantt chart says it drew.
DRAWN = """(() => [...document.querySelectorAll('[data-chart]')].map((el) => ({
  kind: el.dataset.chart, uplots: el.querySelectorAll('.uplot').length, canvases: el.querySelectorAll('canvas').length,
  rows: el.dataset.rows || null, labels: el.dataset.labels ? JSON.parse(el.dataset.labels) : null,
  height: Math.round(el.getBoundingClientRect().height)})))()"""


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} is missing (apt-get install chromium) to render the report",
)
def test_renders_in_headless_chromium_without_console_errors(
    run: TracedRun, report_file: Path, tmp_path: Path
) -> None:
    doc = run.report
    with chromium(tmp_path / "profile", 1400, 1000) as browser:
        browser.send("Page.navigate", url=report_file.as_uri())
        browser.wait_for("document.readyState === 'complete'", 60, "the report")
        charts = browser.wait_for(f"(() => {{ const d = {DRAWN}; return d.every((c) => c.canvases) ? d : null; }})()", 30, "the charts")  # fmt: skip
        text = browser.eval("document.body.innerText")
        assert browser.errors() == [], "console errors in the HTML report"
    by_kind = {c["kind"]: c for c in charts}
    expected = {"step", "phases", "resources", "gantt", "read-sizes"}
    if (doc.get("memory") or {}).get("categories"):
        expected.add("memory")
    assert set(by_kind) == expected, sorted(by_kind)
    for kind, c in by_kind.items():
        if kind == "resources":  # one chart per resource group the run sampled (CPU, memory, ...)
            assert c["uplots"] >= 2 and c["canvases"] == c["uplots"], c
        else:
            assert c["uplots"] == 1 and c["canvases"] == 1 and c["height"] > 60, c
    # the Gantt chart: one row per stage and per process, each labelled on its axis
    gantt = by_kind["gantt"]
    procs = [p for p in doc["processes"] if p.get("role") != "launcher" and p.get("start_ns")]
    assert int(gantt["rows"]) == len(doc["stages"]) + len(procs) == len(gantt["labels"]), gantt
    labels = [label.strip() for label in gantt["labels"]]
    for st in doc["stages"]:
        assert ("◆ " if st.get("critical") else "") + st["name"] in labels, (st["name"], labels)
    for p in procs:
        assert any(label.startswith(f"pid {p['pid']} ") for label in labels), (p["pid"], labels)
    assert "Findings" in text and "Workflow: stages and processes" in text
    assert "The charts need JavaScript" not in text, "the charts' fallback only shows without script"


def test_one_phase_list_for_every_view() -> None:
    """The palette colours and names every phase of the data model, in its order; the dashboard and
    the shared chart code keep no phase list of their own (they take the report's, the model's)."""
    from holoprof import model
    from holoprof.present import palette

    assert list(palette.PHASE_COLORS) == list(model.PHASES)
    assert palette.palette_doc()["phases"] == list(model.PHASES)
    assert len(set(palette.PHASE_COLORS.values())) == len(model.PHASES), "one colour each"
    static = Path(palette.__file__).resolve().parent.parent / "serve" / "static"
    for source in (static / "app.js", Path(palette.ASSETS_DIR) / "charts.js"):
        text = source.read_text(encoding="utf-8")
        assert not re.search(r"[\"']data_wait[\"']", text), f"{source.name} has its own phase list"


def test_evidence_reads_as_named_numbers() -> None:
    from holoprof.present.palette import evidence_label, evidence_value

    cases = {
        "data_wait_fraction": ("data wait share", 0.342, "34%"),
        "step_median_s": ("step median", 0.0547, "54.7 ms"),
        "exposed_s_per_step": ("exposed per step", 0.00258, "2.58 ms"),
        "peak_bytes": ("peak", 3 * 1024**3, "3 GiB"),
        "bytes_per_step": ("bytes per step", 4, "4 B"),
        "median_bandwidth_bytes_per_s": ("median bandwidth", 41.6 * 1024**2, "41.6 MiB/s"),
        "gpu_util_mean_percent": ("gpu util mean", 37.25, "37%"),
        "pid": ("pid", 13029, "13029"),
        "reads": ("reads", 34816, "34,816"),
        "pin_memory": ("pin memory", False, "no"),
    }
    for key, (label, value, shown) in cases.items():
        assert (evidence_label(key), evidence_value(key, value)) == (label, shown), key
