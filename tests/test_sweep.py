"""`holoprof sweep` on a real script: one traced run per value, throughput and memory, a failed value kept."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import error_lines, run_holoprof
from test_serve_browser import CHROMIUM, chromium

# A fixed 4 ms per step (the host side of a step, which does not grow with the batch) plus a small
# model: samples/s grows with the batch. The script would run 40 steps; the sweep stops it after 6.
SCRIPT = """
import argparse, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, required=True)
ap.add_argument("--steps", type=int, default=40)
args = ap.parse_args()
if args.batch_size >= 64:
    raise RuntimeError(f"batch size {args.batch_size} is not supported by this model")
torch.manual_seed(0)
torch.set_num_threads(1)
n = args.batch_size * args.steps
loader = DataLoader(TensorDataset(torch.randn(n, 32), torch.randint(0, 4, (n,))), batch_size=args.batch_size)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for x, y in loader:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    time.sleep(0.004)
print("trained", args.batch_size)
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "train.py").write_text(SCRIPT)
    proc = run_holoprof(
        "sweep", "--param", "batch_size=8,16,32,64", "--steps", "6", "--out", str(tmp / "runs"),
        "--json", "--plot", str(tmp / "sweep.html"), "--", "train.py", "--batch-size", "{batch_size}",
        cwd=tmp, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return tmp, json.loads(proc.stdout)


def test_one_row_per_value_and_the_failed_one_is_kept(swept: tuple[Path, dict[str, Any]]) -> None:
    _, doc = swept
    assert doc["schema"] == "holoprof.sweep/1"
    rows = doc["rows"]
    assert [r["params"] for r in rows] == [{"batch_size": v} for v in ("8", "16", "32", "64")]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "failed"]
    failed = rows[3]
    assert failed["exit_code"] == 1
    assert "batch size 64 is not supported" in failed["error"]
    assert failed["steps"] == 0 and failed["throughput"] == 0
    assert "batch size 64 is not supported" in Path(failed["log"]).read_text()


def test_steps_are_bounded_and_throughput_grows_with_the_batch(swept: tuple[Path, dict[str, Any]]) -> None:
    _, doc = swept
    ok = doc["rows"][:3]
    assert [r["steps"] for r in ok] == [6, 6, 6]  # --steps 6 ended each 40-step job after 6 steps
    assert all(r["exit_code"] == 0 for r in ok)
    assert all(r["throughput_unit"] == "samples/s" for r in ok)
    for r in ok:
        assert r["throughput"] == pytest.approx(int(r["params"]["batch_size"]) / r["step_mean_s"])
        assert r["step_mean_s"] >= 0.004 and r["step_median_s"] > 0
    tput = [r["throughput"] for r in ok]
    assert tput[0] < tput[1] < tput[2], tput


def test_memory_by_category_per_value(swept: tuple[Path, dict[str, Any]]) -> None:
    _, doc = swept
    params = 32 * 64 + 64 + 64 * 4 + 4
    for r in doc["rows"][:3]:
        cats = r["categories"]
        assert cats["weights"] == 4 * params
        assert cats["optimizer_state"] == 4 * params  # SGD momentum: one buffer per parameter
        assert r["peak_bytes"] > 0 and r["device"] == "cpu"
        # saved for backward: the input batch and the ReLU's output; they scale with the batch
        assert cats["activations"] == 4 * int(r["params"]["batch_size"]) * (32 + 64)
    assert doc["rows"][3]["categories"] == {}


def test_recommends_the_fastest_that_fits(swept: tuple[Path, dict[str, Any]]) -> None:
    tmp, doc = swept
    assert doc["recommended"] == {"batch_size": "32"}
    assert doc["recommended_index"] == 2
    assert "batch_size=32" in doc["reason"] and "batch_size=64" in doc["reason"]
    saved = json.loads((tmp / "runs" / "sweep.json").read_text())
    assert saved["recommended"] == doc["recommended"]


def test_plot_is_self_contained_html(swept: tuple[Path, dict[str, Any]]) -> None:
    tmp, _ = swept
    page = (tmp / "sweep.html").read_text()
    assert page.startswith("<!doctype html>")
    assert "<svg" not in page, "drawn by uPlot (the views' chart library), not SVG"
    assert "uPlot" in page and "default-src 'none'" in page
    assert not re.search(r"<script[^>]*\bsrc\s*=|<(link|img|iframe)\b", page), "everything inline"
    assert not re.search(r"(?:src|href)\s*=\s*[\"']?(?:https?:)?//|url\(", page), "nothing from the network"
    assert "batch_size=32" in page and "FAILED" in page
    for cat in ("weights", "optimizer state", "activations"):
        assert cat in page


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="needs Debian's chromium (apt-get install -y chromium)"
)
def test_plot_renders_in_headless_chromium(swept: tuple[Path, dict[str, Any]]) -> None:
    tmp, _ = swept
    with chromium(tmp / "profile", 1300, 900) as browser:
        browser.send("Page.navigate", url=(tmp / "sweep.html").as_uri())
        browser.wait_for("document.readyState === 'complete'", 60, "the page")
        drawn = browser.wait_for(
            "(() => { const d = [...document.querySelectorAll('[data-chart]')].map((el) => [el.dataset.chart,"
            " el.querySelectorAll('.uplot canvas').length]); return d.every((x) => x[1]) ? d : null; })()",
            30, "the charts",
        )  # fmt: skip
        legends = browser.eval(
            "[...document.querySelectorAll('.u-legend th')].map((th) => th.textContent.trim())"
        )
        assert browser.errors() == [], "console errors on the sweep page"
    assert drawn == [["throughput", 1], ["memory", 1]], drawn
    assert {"throughput", "recommended ★", "weights", "optimizer state", "activations"} <= set(legends), (
        legends
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--param", "batch_size=8,16", "--", "train.py", "--batch-size", "8"],
            "no placeholder for {batch_size}",
        ),
        (["--param", "batch_size", "--", "train.py", "{batch_size}"], "bad --param 'batch_size'"),
        (["--param", "batch_size=8,,16", "--", "train.py", "{batch_size}"], "bad --param"),
        (["--param", "bs=8", "--", "train.py", "{bs}", "{lr}"], "{lr} with no --param"),
        (["--", "train.py"], "give at least one --param"),
        (["--param", "bs=8"], "no command given"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "train.py").write_text("print('never run')\n")
    proc = run_holoprof("sweep", "--out", str(tmp_path / "runs"), *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("holoprof: error:"), proc.stderr
    assert message in lines[0]
    assert not (tmp_path / "runs").exists()


def test_out_of_memory_is_told_from_other_failures() -> None:
    from holoprof.workflows.sweep import classify

    text = "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert classify(1, text, False) == (
        "oom",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    )
    assert classify(137, "", False)[0] == "oom"
    assert classify(1, "ValueError: bad shape\n", False) == ("failed", "ValueError: bad shape")
    assert classify(0, "", False) == ("ok", "")
    assert classify(143, "", True) == ("timeout", "")
