"""A generated run of many hosts: each host's resources in the report equal what was written, a host
whose clock is off is aligned, and the terminal, HTML and Chrome trace stay bounded as hosts and
ranks grow (the same generator as benchmarks/bench_multihost_scale.py, smaller)."""

from __future__ import annotations

import io
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

import holoprof
from conftest import report_json, run_holoprof
from holoprof.bench.synth import T0_NS
from holoprof.bench.synth_hosts import HostsTotals, generate_hosts_run
from holoprof.present.hosts import MAX_HOSTS
from holoprof.present.html import render_html
from holoprof.present.summary import MAX_ROWS
from holoprof.present.terminal import MAX_CLOCK_LINES, render

HOSTS, RANKS_PER_HOST, STEPS = 12, 3, 40
SKEWED = {4: 700_000_000, 9: -300_000_000}  # host index -> its clock's offset (ns)
#: report key -> the sample the generator wrote
FIGURES = {
    "cpu_percent": "host.cpu_percent",
    "memory_used_bytes": "host.mem_used_bytes",
    "net_recv_bytes_per_s": "host.net_recv_bytes_per_s",
    "net_sent_bytes_per_s": "host.net_sent_bytes_per_s",
    "job_cpu_percent": "job.cpu_percent",
    "job_rss_bytes": "job.rss_bytes",
}


@pytest.fixture(scope="module")
def hosts_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, HostsTotals, dict[str, Any]]:
    run = tmp_path_factory.mktemp("multihost") / "run"
    totals = generate_hosts_run(str(run), HOSTS, RANKS_PER_HOST, STEPS, samples_per_host=30, skew_ns=SKEWED)
    return run, totals, report_json(run)


def test_each_hosts_resources_equal_what_was_written(
    hosts_run: tuple[Path, HostsTotals, dict[str, Any]],
) -> None:
    _, totals, doc = hosts_run
    hosts = {h["host"]: h for h in doc["resources"]["hosts"]}
    assert sorted(hosts) == sorted(totals.samples) and len(hosts) == HOSTS
    for name, written in totals.samples.items():
        h = hosts[name]
        assert h["ranks"] == totals.host_ranks[name]
        assert h["gpu_util_percent"] is None  # no GPU sample was written
        for key, sample in FIGURES.items():
            want = written[sample]
            got = h[key]
            assert got["samples"] == want["count"] == 30
            for stat in ("mean", "p90", "max"):
                assert got[stat] == pytest.approx(want[stat], rel=1e-9, abs=1e-3), (name, key, stat)
    spread = doc["resources"]["host_spread"]["cpu_percent"]
    means = {n: w["host.cpu_percent"]["mean"] for n, w in totals.samples.items()}
    assert spread["hosts"] == HOSTS
    assert spread["max_host"] == max(means, key=lambda n: means[n])
    assert spread["min_host"] == min(means, key=lambda n: means[n])
    assert spread["min"] == pytest.approx(min(means.values()), abs=1e-3)


def test_the_job_wide_figures_are_the_hosts_total_and_mean(
    hosts_run: tuple[Path, HostsTotals, dict[str, Any]],
) -> None:
    """``resources.summary``: the job's RSS is the sum over the hosts at each instant, a machine's CPU
    the mean over the hosts; the terminal says which."""
    run, totals, doc = hosts_run
    res = doc["resources"]
    assert res["hosts_combined"] == {"hosts": HOSTS, "job.*": "sum", "host.*": "mean", "gpu.*": "mean"}
    # once aligned, every host samples at the same instants: each instant's sum over the hosts
    rows = holoprof.load(run).rows(
        "SELECT name, ts_ns, sum(value), avg(value), count(*) FROM samples WHERE target_pid = -1 GROUP BY name, ts_ns"
    )
    per: dict[str, dict[int, tuple[float, float]]] = {}
    for name, ts, total, mean, n in rows:
        assert n == HOSTS
        per.setdefault(name, {})[ts] = (total, mean)
    rss, cpu = res["summary"]["job.rss_bytes"], res["summary"]["host.cpu_percent"]
    assert rss["mean"] == pytest.approx(
        sum(w["job.rss_bytes"]["mean"] for w in totals.samples.values()), rel=1e-12
    )
    assert rss["max"] == pytest.approx(max(t for t, _ in per["job.rss_bytes"].values()), abs=1e-3)
    assert rss["last"] == pytest.approx(per["job.rss_bytes"][max(per["job.rss_bytes"])][0], abs=1e-3)
    assert rss["max"] > 5 * max(h["job_rss_bytes"]["max"] for h in res["hosts"])  # a total, not a host's
    assert cpu["mean"] == pytest.approx(
        statistics.mean(h["cpu_percent"]["mean"] for h in res["hosts"]), abs=1e-3
    )
    assert cpu["max"] == pytest.approx(max(m for _, m in per["host.cpu_percent"].values()), abs=1e-3)
    series = res["series"]["job.rss_bytes"]
    assert len(series) == 30 and series[0][1] == pytest.approx(
        per["job.rss_bytes"][min(per["job.rss_bytes"])][0], abs=1e-3
    )
    out = io.StringIO()
    render(doc, file=out, width=160)
    text = " ".join(out.getvalue().split())
    assert "memory RSS (job, sum of 12 hosts)" in text and "network in (host, mean of 12 hosts)" in text


def test_a_host_whose_clock_is_off_is_aligned(hosts_run: tuple[Path, HostsTotals, dict[str, Any]]) -> None:
    run, totals, doc = hosts_run
    clocks = {c["host"]: c for c in doc["run"]["host_clocks"]}
    for name, off in totals.offsets.items():
        assert clocks[name]["clock_offset_s"] == pytest.approx(off / 1e9, abs=1e-5), clocks[name]
    assert {n for n, off in totals.offsets.items() if off} == {"node04", "node09"}
    # recorded late (or early) by their offset, every host's samples and steps start together once loaded
    loaded = holoprof.load(run)
    firsts = dict(loaded.rows("SELECT host, min(ts_ns) FROM samples GROUP BY host"))
    assert firsts == {n: T0_NS for n in totals.samples}
    steps = dict(loaded.rows("SELECT host, min(start_ns) FROM spans WHERE kind = 'step' GROUP BY host"))
    assert steps == {n: T0_NS for n in totals.samples}


def test_the_terminal_report_stays_bounded(hosts_run: tuple[Path, HostsTotals, dict[str, Any]]) -> None:
    _, totals, doc = hosts_run
    out = io.StringIO()
    render(doc, file=out, width=160)
    text = out.getvalue()
    block = text[text.index("Resources per host") :]
    block = block[: block.index("over 12 hosts")]
    rows = [line for line in block.splitlines() if re.search(r"│\s*node\d\d\s", line)]
    assert len(rows) == MAX_HOSTS, block
    assert f"… {HOSTS - MAX_HOSTS} more hosts" in block
    busiest = max(totals.samples, key=lambda n: totals.samples[n]["host.cpu_percent"]["mean"])
    assert busiest in rows[0], rows
    # the header names at most MAX_CLOCK_LINES hosts' clocks, the skewed ones among them
    head = text[: text.index("Steps")]
    clock_lines = [line for line in head.splitlines() if re.search(r"node\d\d \(ranks", line)]
    assert len(clock_lines) == MAX_CLOCK_LINES - 1, head
    assert any("node04" in line and "+700.0 ms" in line for line in clock_lines), clock_lines
    assert any("node09" in line and "-300.0 ms" in line for line in clock_lines), clock_lines
    assert f"… and {HOSTS - MAX_CLOCK_LINES + 1} more hosts" in head
    # every rank table is cut to MAX_ROWS rows with a "more" line (the JSON keeps every rank)
    assert len(doc["communication"]["per_rank"]) == HOSTS * RANKS_PER_HOST
    assert f"… {HOSTS * RANKS_PER_HOST - MAX_ROWS + 1} more" in text
    assert len(text.splitlines()) < 200


def test_the_html_report_stays_bounded(hosts_run: tuple[Path, HostsTotals, dict[str, Any]]) -> None:
    _, _, doc = hosts_run
    page = render_html(doc)
    section = page[page.index("<section id='hosts'>") :]
    section = section[: section.index("</section>")]
    assert section.count("data-host=") == MAX_HOSTS
    assert f"… {HOSTS - MAX_HOSTS} more hosts" in section
    assert "over 12 hosts" in section  # the spread of each figure over every host
    assert "over 12 hosts: the job's lines are its total (the sum over the hosts)" in page


def test_the_chrome_trace_has_every_rank_and_host(
    hosts_run: tuple[Path, HostsTotals, dict[str, Any]], tmp_path: Path
) -> None:
    run, _, _ = hosts_run
    out = tmp_path / "trace.json"
    proc = run_holoprof("export", str(run), "--format", "chrome", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(out.read_text())["traceEvents"]
    step_pids = {e["pid"] for e in events if e.get("ph") == "X" and e.get("cat") == "step"}
    counter_pids = {e["pid"] for e in events if e.get("ph") == "C"}
    assert len(step_pids) == HOSTS * RANKS_PER_HOST
    assert len(counter_pids) == HOSTS  # each host's launcher track holds its samples
    steps = [e for e in events if e.get("ph") == "X" and e.get("cat") == "step"]
    assert len(steps) == HOSTS * RANKS_PER_HOST * STEPS
    assert min(e["ts"] for e in steps) == pytest.approx(0, abs=1)  # the skewed hosts aligned too


def test_a_process_is_read_from_its_own_partition_only_when_that_holds_all_its_rows(tmp_path: Path) -> None:
    """A query of one process reads only its partition's files, and gives the same rows as the whole
    table; once a file holds rows of another process, every query reads the whole table again."""
    from holoprof.bench.synth import generate_run
    from holoprof.store.chunks import write_chunk

    out = str(tmp_path / "run")
    generate_run(out, 50, ranks=2)
    run = holoprof.load(out)
    src = run.process_source("spans", "synth", 10_001)
    assert src.startswith("(") and "proc=10001" in src and "proc=10000" not in src
    q = "SELECT count(*), sum(end_ns - start_ns) FROM {} WHERE host = 'synth' AND pid = 10001"
    assert run.rows(q.format(src)) == run.rows(q.format("spans")) and run.rows(q.format(src))[0][0] > 0
    assert run.process_source("spans", "synth", 99) == "spans"  # no such process: the table
    row = {"host": ["synth"], "pid": [10_001], "rank": [1], "tid": [10_001], "span_id": [1], "parent_id": [0],
           "kind": ["user"], "name": ["x"], "start_ns": [T0_NS], "end_ns": [T0_NS + 1], "step": [0]}  # fmt: skip
    write_chunk(out, "spans", row, seq=99, writer=("synth", 10_000))  # rank 1's row in rank 0's partition
    run = holoprof.load(out)
    assert run.process_source("spans", "synth", 10_001) == "spans"
