"""The first screen of the dashboard and of the HTML report, for every kind of run, in real headless
Chromium: the headline numbers, every phase the run has (Keras's ``compute`` included) and the
findings with readable evidence within the first 900 pixels; an I/O first screen with reads and
writes for imported logs; a per-rank chart for a run of several ranks; no console error; no element
that widens the page.

Needs Debian's ``chromium`` package (``apt-get install -y chromium``); skipped without it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import run_holoprof
from holoprof.serve.app import Server, make_server
from test_serve_browser import CHROMIUM, DevTools, chromium
from workflows.kinds import kinds

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="needs Debian's chromium (apt-get install -y chromium)"
)

KINDS = ("torch", "keras", "ddp", "darshan", "kineto")
FIRST_SCREEN_PX = 900
WIDTH = 1400

#: What a page shows on its first screen, read from the DOM (positions in pixels from the page's top).
PROBE = """(() => {
  const top = (el) => el ? Math.round(el.getBoundingClientRect().top + window.scrollY) : null;
  const q = (s) => [...document.querySelectorAll(s)];
  return {
    phases: q('#headline tr[data-phase]').map((tr) => [tr.dataset.phase, top(tr)]),
    findings: q('#findings .finding').map((f) => ({id: f.dataset.finding, title: top(f.querySelector('.t')),
      evidence: top(f.querySelector('.ev, .ev-details, .fix')), fix: f.querySelector('.fix').textContent})),
    noFindings: top(document.getElementById('no-findings')),
    kpis: q('#kpis .kpi').map((k) => [k.querySelector('.l').textContent, k.querySelector('.v').textContent, top(k)]),
    charts: q('.uplot').length,
    legends: q('.u-legend th').map((th) => th.textContent),
    ranks: (document.querySelector('[data-chart="ranks"] .uplot, #rank-chart .uplot') || {}).nodeName || null,
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
    text: document.body.innerText,
  };
})()"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kinds(tmp_path_factory, *KINDS)


@pytest.fixture(scope="module")
def server(runs: Path) -> Iterator[Server]:
    srv = make_server(str(runs), port=0)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    with chromium(tmp_path_factory.mktemp("chromium-profile"), WIDTH, 1000) as tools:
        tools.send(
            "Emulation.setDeviceMetricsOverride", width=WIDTH, height=1000, deviceScaleFactor=1, mobile=False
        )
        yield tools


def _report(server: Server, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = server.runs.report(name)
    return doc


def _phases_in_data(doc: dict[str, Any]) -> list[str]:
    return [p for p, v in doc["phases"].items() if v["fraction"] > 0 or v["total_s"] > 0]


def _check_first_screen(page: dict[str, Any], doc: dict[str, Any], name: str) -> None:
    """What both views must show on their first screen for the run ``doc``."""
    assert page["scrollWidth"] <= page["innerWidth"], f"{name}: something widens the page"
    assert page["kpis"] and all(top < FIRST_SCREEN_PX for _l, _v, top in page["kpis"]), page["kpis"]
    shown = dict((p, top) for p, top in page["phases"])
    assert list(shown) == _phases_in_data(doc), (name, list(shown))
    assert all(top < FIRST_SCREEN_PX for top in shown.values()), (name, shown)
    if doc["findings"]:
        assert [f["id"] for f in page["findings"]] == [f["id"] for f in doc["findings"]]
        for f in page["findings"]:
            assert f["title"] < FIRST_SCREEN_PX, (name, f)
        first = page["findings"][0]
        assert first["evidence"] < FIRST_SCREEN_PX, (name, first)
        assert first["fix"].startswith("Fix:")
    else:
        assert page["noFindings"] is not None and page["noFindings"] < FIRST_SCREEN_PX
    assert "{" not in "".join(f["fix"] for f in page["findings"]), "no raw JSON"
    if doc["steps"]["count"]:
        assert page["charts"] >= 2, "step time and phases over steps"
    else:
        assert "No training step" not in page["text"], name
    if doc["io"] and not doc["steps"]["count"]:  # an import of an I/O-only job: its I/O first
        labels = {label: (v, top) for label, v, top in page["kpis"]}
        assert {"read", "written", "read bandwidth", "write bandwidth"} <= set(labels), labels
        assert labels["written"][0] != "0 B" and labels["read"][0] != "0 B", labels
    if len(doc["steps"]["per_rank"]) > 1:
        assert page["ranks"] == "DIV", "the per-rank chart"
    assert not any("." in h or h.isupper() for h in page["legends"]), page["legends"]


@pytest.mark.parametrize("name", KINDS)
def test_dashboard_first_screen(runs: Path, server: Server, browser: DevTools, name: str) -> None:
    doc = _report(server, name)
    if name == "keras":
        assert doc["phases"]["compute"]["fraction"] > 0.3, "a Keras fit's fused step"
    browser.events.clear()
    browser.send("Page.navigate", url=f"http://127.0.0.1:{server.port}/?token={server.token}#/run/{name}")
    browser.wait_for(
        "document.querySelector('#findings .finding, #no-findings') !== null && document.getElementById('kpis').children.length > 0",
        60, "the first screen",
    )  # fmt: skip
    if doc["steps"]["count"]:
        browser.wait_for("document.querySelectorAll('.uplot').length >= 2", 30, "the step charts")
    page = browser.eval(PROBE)
    _check_first_screen(page, doc, name)
    assert browser.eval("document.getElementById('actions-grid').hidden") is True, "no on-demand panel"
    if doc["steps"]["count"]:
        assert "job CPU (100% = one core)" in page["legends"] or name in ("ddp", "kineto"), page["legends"]
        _check_recent_steps(browser, doc, name)
    markup = browser.eval(
        "[document.querySelectorAll('svg').length, document.documentElement.outerHTML.includes('<svg')]"
    )
    assert markup == [0, False], f"{name}: SVG on the dashboard"
    assert browser.errors() == [], "console errors on the dashboard"


#: The recent-steps chart as drawn: its rows, their labels, its phases, its canvases, its legend.
RECENT = """(() => {
  const el = document.getElementById('timeline');
  return {rows: el.dataset.rows, labels: JSON.parse(el.dataset.labels || '[]'), phases: el.dataset.phases,
    canvases: el.querySelectorAll('.uplot canvas').length, charts: el.querySelectorAll('.uplot').length,
    legend: [...el.querySelectorAll('.u-legend th')].map((th) => th.textContent)};
})()"""


def _check_recent_steps(browser: DevTools, doc: dict[str, Any], name: str) -> None:
    """The recent steps: one uPlot chart with a row per recent step stacked by phase, in human phase
    names; hovering a bar names its step, phase and duration."""
    from holoprof.present.palette import phase_label

    drawn = browser.wait_for(
        f"(() => {{ const r = {RECENT}; return r.charts ? r : null; }})()", 30, "the recent steps"
    )
    recent = doc["steps"]["timeline"][-12:]
    shown = [p for p in doc["phases"] if any((t.get(p) or 0) > 0 for t in recent)]
    assert (drawn["charts"], drawn["canvases"]) == (1, 1), (name, drawn)
    assert drawn["rows"] == str(len(recent)) and len(drawn["labels"]) == len(recent), (name, drawn)
    first = drawn["labels"][0].split()[-1].split("–")[0].replace(",", "")
    assert float(first) == recent[0]["step"], drawn["labels"]
    assert drawn["phases"].split() == shown, (name, drawn["phases"], shown)
    # the legend as the other stacked charts: the top of the stack first
    legend = [h for h in drawn["legend"] if h != "step"]
    assert legend == [phase_label(p) for p in reversed(shown)], legend
    # the pointer over the first row, at the start of its bar: the tip under the chart names the part
    box = browser.eval(
        "(() => { const o = document.querySelector('#timeline .u-over'); o.scrollIntoView({block: 'center'});"
        " const r = o.getBoundingClientRect(); return [r.left, r.top, r.height]; })()"
    )
    x, y = box[0] + 2, box[1] + box[2] * 0.5 / len(recent)
    browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
    tip = browser.wait_for("document.querySelector('#timeline .chart-tip').textContent", 10, "the tip")
    row, _, part = tip.partition(" · ")
    phase, _, value = part.partition(": ")
    assert row == drawn["labels"][0] and phase in [phase_label(p) for p in shown], tip
    assert value.split()[-1] in ("µs", "ms", "s", "h"), tip
    browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=box[1] - 40)  # off the chart
    assert browser.wait_for("document.querySelector('#timeline .chart-tip').textContent === ''", 10, "no tip")


@pytest.mark.parametrize("name", KINDS)
def test_html_report_first_screen(
    runs: Path, server: Server, browser: DevTools, tmp_path: Path, name: str
) -> None:
    doc = _report(server, name)
    out = tmp_path / f"{name}.html"
    proc = run_holoprof("report", str(runs / name), "--html", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    browser.events.clear()
    browser.send("Page.navigate", url=out.as_uri())
    browser.wait_for("document.readyState === 'complete'", 60, "the report")
    page = browser.eval(PROBE)
    _check_first_screen(page, doc, name)
    heat = (doc.get("stragglers") or {}).get("heatmap") or {}
    if heat:  # the rank × step heatmap, drawn for a job of several ranks
        drawn = browser.eval(
            "(() => { const el = document.querySelector('[data-chart=rank-heatmap]');"
            " return el ? [el.dataset.ranks, el.dataset.columns, el.querySelectorAll('canvas').length] : null; })()"
        )
        assert drawn == [str(len(heat["ranks"])), str(len(heat["steps"])), 1], (name, drawn)
    assert browser.errors() == [], "console errors in the HTML report"


def test_run_list_shows_steps_and_step_time(runs: Path, server: Server, browser: DevTools) -> None:
    browser.events.clear()
    browser.send("Page.navigate", url=f"http://127.0.0.1:{server.port}/?token={server.token}#/")
    rows = browser.wait_for(
        "(() => { const r = [...document.querySelectorAll('#runs-table tbody tr')].map((tr) => "
        "[tr.dataset.run, tr.children[4].textContent, tr.children[5].textContent]);"
        " return r.length && r.every((x) => x[1] !== '–') ? r : null; })()",
        60, "steps in the run list",
    )  # fmt: skip
    by_run = {r[0]: r for r in rows}
    torch = _report(server, "torch")
    assert by_run["torch"][1] == str(torch["steps"]["count"])
    assert by_run["torch"][2].split()[-1] in ("µs", "ms", "s") and torch["steps"]["median_s"] > 0
    assert by_run["darshan"][1] == "0"
    assert browser.errors() == [], "console errors on the run list"


def test_both_views_write_numbers_alike(runs: Path, browser: DevTools, tmp_path: Path) -> None:
    """The HTML report's findings are written in Python, the dashboard's by the shared script: the
    same evidence reads the same in both."""
    from holoprof.analyze.findings import gain_label
    from holoprof.present.palette import evidence_label, evidence_value

    out = tmp_path / "report.html"
    assert run_holoprof("report", str(runs / "ddp"), "--html", str(out), cwd=tmp_path).returncode == 0
    browser.events.clear()
    browser.send("Page.navigate", url=out.as_uri())
    browser.wait_for("window.HoloViews !== undefined", 60, "the shared view code")
    cases = [
        ["data_wait_fraction", 0.342], ["data_wait_fraction_of_total", 0.0324], ["step_median_s", 0.0547],
        ["exposed_s_per_step", 0.00258], ["median_save_s", 0.992], ["blocking_s", 185.0], ["peak_bytes", 3 * 1024**3],
        ["bytes_per_step", 4], ["median_bandwidth_bytes_per_s", 43620000.0], ["gpu_util_mean_percent", 37.25],
        ["pid", 13029], ["reads", 34816], ["cpu_cores", 2.0], ["pin_memory", False], ["dataset", "Samples"],
        ["per_s", 75.5], ["files", 2051], ["world_size", 4], ["ratio", 0.5], ["other_median_s", 3.2e-05],
        ["flops_per_step", 308330496], ["achieved_flops_per_s", 15563176178.0], ["mfu", 0.163], ["flops", 512],
    ]  # fmt: skip
    js = browser.eval(
        f"{json.dumps(cases)}.map(([k, v]) => [window.HoloViews.evidenceLabel(k), window.HoloViews.evidenceValue(k, v)])"
    )
    py = [[evidence_label(k), evidence_value(k, v)] for k, v in cases]
    assert js == py
    # and a finding's gain, labelled alike: an estimate with the most it could be, an upper bound
    # alone, the input-pipeline model's prediction
    findings = [
        {"estimated_gain": 0.09, "gain_kind": "predicted", "gain_basis": {"gain_upper_bound": 0.28}},
        {"estimated_gain": 0.26, "gain_kind": "predicted", "gain_basis": {"model": "x"}},
        {"estimated_gain": 0.21, "gain_kind": "predicted", "gain_basis": {"model": "input_pipeline"}},
    ]
    labels = browser.eval(f"{json.dumps(findings)}.map((f) => window.HoloViews.gainLabel(f))")
    assert labels == [gain_label(f) for f in findings]
    assert labels[0] == "predicted: 9% of step time (at most 28%)"
    assert browser.errors() == []
