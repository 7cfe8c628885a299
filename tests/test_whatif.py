"""`holoprof whatif`: data-parallel predictions from a single-process run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import TracedRun, error_lines, run_holoprof, script, traced
from holoprof.analyze import whatif as wi

MLP = str(Path(__file__).resolve().parent / "dist_scripts" / "mlp.py")
WIDTH, DEPTH = 128, 3
GRAD_BYTES = 4 * (DEPTH * (WIDTH * WIDTH + WIDTH) + WIDTH * 10 + 10)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    tmp = tmp_path_factory.mktemp("whatif")
    run = traced(tmp, MLP, "--steps", "8", "--width", str(WIDTH), "--depth", str(DEPTH), "--batch", "16")
    assert run.proc.returncode == 0, run.proc.stderr
    return run


def whatif_json(run_dir: str, *args: str) -> dict[str, Any]:
    p = run_holoprof("whatif", run_dir, "--json", *args, cwd=os.path.dirname(run_dir))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == "holoprof.whatif/1"
    return doc


def test_measures_gradients_of_every_layer(single_run: TracedRun) -> None:
    doc = whatif_json(single_run.run_dir, "--workers", "2")
    assert doc["grad_bytes"] == GRAD_BYTES
    assert doc["params"] == 2 * (DEPTH + 1)
    assert doc["batch_size"] == 16
    assert doc["sampled_steps"] == [2, 3, 4]
    assert 0 < doc["backward_s"] < doc["step_s"]
    assert sum(b["bytes"] for b in doc["buckets"]) == GRAD_BYTES
    ready = [b["ready_s"] for b in doc["buckets"]]
    assert ready == sorted(ready)


def test_predictions_are_monotone_in_bandwidth_and_workers(single_run: TracedRun) -> None:
    doc = whatif_json(
        single_run.run_dir, "--workers", "2,4,8,16", "--bandwidth", "100Mbit,1Gbit,10Gbit,100Gbit"
    )
    preds = doc["predictions"]
    assert len(preds) == 16
    table = {(p["workers"], p["bandwidth_bytes_per_s"]): p for p in preds}
    bws = sorted({p["bandwidth_bytes_per_s"] for p in preds})
    assert bws[0] == pytest.approx(100e6 / 8)
    for n in (2, 4, 8, 16):
        steps = [table[n, b]["step_s"] for b in bws]
        assert steps == sorted(steps, reverse=True), f"faster network, shorter step ({n} workers)"
        assert steps[0] > steps[-1]
        effs = [table[n, b]["scaling_efficiency"] for b in bws]
        assert effs == sorted(effs) and all(0 < e <= 1 for e in effs)
    for b in bws:
        steps = [table[n, b]["step_s"] for n in (2, 4, 8, 16)]
        assert steps == sorted(steps), "more workers, more communication per step"
        assert all(s >= doc["step_s"] for s in steps)
    assert all(p["throughput_unit"] == "samples/s" for p in preds)
    p = table[2, bws[-1]]
    assert p["throughput"] == pytest.approx(2 * 16 / p["step_s"])


def test_minimum_bandwidth_is_consistent_with_the_table(single_run: TracedRun) -> None:
    doc = whatif_json(single_run.run_dir, "--workers", "2,8")
    single = 16 / doc["step_s"]
    for m in doc["min_bandwidth"]:
        n, bw = m["workers"], m["beats_one_bytes_per_s"]
        assert bw is not None and bw > 0
        # just above it N workers beat one; just below they do not
        around = whatif_json(
            single_run.run_dir, "--workers", str(n), "--bandwidth", f"{bw * 1.02:.6g}B/s,{bw * 0.98:.6g}B/s"
        )
        above, below = sorted(around["predictions"], key=lambda p: -p["bandwidth_bytes_per_s"])
        assert above["throughput"] > single > below["throughput"]
        assert m["efficiency_90_bytes_per_s"] is None or m["efficiency_90_bytes_per_s"] > bw


def test_table_and_plot(single_run: TracedRun, tmp_path: Path) -> None:
    plot = tmp_path / "whatif.html"
    p = run_holoprof("whatif", single_run.run_dir, "--plot", str(plot), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "bandwidth needed" in p.stdout and "16" in p.stdout
    text = plot.read_text()
    assert text.startswith("<!DOCTYPE html>") and "data-chart='whatif'" in text and "<svg" not in text
    assert not re.search(r"<script[^>]*\bsrc\s*=|(?:src|href)\s*=\s*[\"']?(?:https?:)?//", text), (
        "self-contained"
    )
    found = re.search(r"window\.HOLOPROF_REPORT = (.*?);</script>", text, re.S)
    assert found, "the plot's data, inline"
    data = json.loads(found.group(1))  # what uPlot draws: one line per worker count, 1 worker dashed
    assert [s["label"] for s in data["series"]][:2] == ["1 worker", "2 workers"]
    assert "16 workers" in [s["label"] for s in data["series"]]
    assert data["x"] == sorted(data["x"]) and len(data["x"]) == len(data["x_ticks"])
    assert all(len(s["values"]) == len(data["x"]) for s in data["series"])


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--workers", "0"), "at least 1"),
        (("--workers", "2,x"), "cannot read worker count"),
        (("--bandwidth=-1Gbit",), "must be positive"),
        (("--bandwidth", "fast"), "cannot read bandwidth"),
        (("--bandwidth", "10"), "cannot read bandwidth"),
        (("--latency", "soon"), "cannot read latency"),
        (("--bucket-mb", "0"), "--bucket-mb must be positive"),
    ],
)
def test_bad_values_exit_2_with_one_clear_line(
    single_run: TracedRun, tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    p = run_holoprof("whatif", single_run.run_dir, *args, cwd=tmp_path)
    assert p.returncode == 2
    lines = error_lines(p.stderr)
    assert len(lines) == 1 and lines[0].startswith("holoprof: error:") and words in lines[0], p.stderr


def test_run_without_gradient_timings_is_refused(tmp_path: Path) -> None:
    run = traced(tmp_path, script("manual_steps.py"), "3")
    p = run_holoprof("whatif", run.run_dir, cwd=tmp_path)
    assert p.returncode == 2
    assert "grad_ready" in p.stderr or "no training steps" in p.stderr


def test_ring_allreduce_and_bucketing_model() -> None:
    # 2(N-1)/N x bytes / bandwidth + 2(N-1) x latency
    assert wi.allreduce_s(1_000_000, 4, 1e6, 1e-3) == pytest.approx(1.5 + 0.006)
    assert wi.allreduce_s(1_000_000, 1, 1e6, 1e-3) == 0.0
    params = [wi.Param(f"p{i}", 600_000, 0.001 * (i + 1)) for i in range(4)]
    buckets = wi.make_buckets(params, bucket_mb=1.0)
    # first bucket capped at 1 MiB, then --bucket-mb: 2 + 2 parameters
    assert [(b.params, b.bytes) for b in buckets] == [(2, 1_200_000), (2, 1_200_000)]
    assert [b.ready_s for b in buckets] == [0.002, 0.004]
    step, comm, exposed = wi.simulate(0.010, 0.004, buckets, 2, 1.2e9, 0.0)
    # bucket 0: 0.002 -> 0.003; bucket 1: 0.004 -> 0.005; backward ends at 0.004
    assert comm == pytest.approx(0.002) and exposed == pytest.approx(0.001) and step == pytest.approx(0.011)


def test_bandwidth_units() -> None:
    assert wi.parse_bandwidth("1Gbit") == 125e6
    assert wi.parse_bandwidth("25Gbps") == 25e9 / 8
    assert wi.parse_bandwidth("1.25GB/s") == 1.25e9
    assert wi.parse_bandwidth("100Mbit/s") == 12.5e6
    assert wi.parse_latency("50us") == pytest.approx(50e-6)


def _netns_reason() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return (
            "needs root for network namespaces (the benchmark benchmarks/bench_whatif.py does the full check)"
        )
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    return None


@pytest.mark.skipif(_netns_reason() is not None, reason=str(_netns_reason()))
def test_bandwidth_limited_link_is_set_up_and_removed() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_whatif

    reason = bench_whatif.can_use_netns()
    if reason is not None:
        pytest.skip(reason)
    ns = bench_whatif.Netns()
    try:
        ns.open()
        ns.limit("100mbit")
        qd = subprocess.run(
            ["ip", "netns", "exec", ns.ns[0], "tc", "qdisc", "show", "dev", ns.dev[0]],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "tbf" in qd and "100Mbit" in qd
        ping = subprocess.run(
            ["ip", "netns", "exec", ns.ns[0], sys.executable, "-c",
             f"import socket; s = socket.create_connection(('{ns.ip[1]}', 9), 2)"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert "Connection refused" in ping.stderr, "the peer namespace answers (nothing listens there)"
    finally:
        ns.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert ns.ns[0] not in listed and ns.ns[1] not in listed
