"""`holoprof demo` / `make demo`: train the bundled example traced, then print its full report."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from holoprof import examples
from holoprof.analyze.report import build_report
from holoprof.errors import MissingExtraError
from holoprof.launch.run import run
from holoprof.present.terminal import render
from holoprof.store.reader import load
from holoprof.store.rundir import DEFAULT_RUNS_DIR, default_run_dir

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(examples.__file__)), "demo_train.py")


def add_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("--out", help="run directory to create")
    d.add_argument("--quick", action="store_true", help="a shorter demo (fewer files and steps)")


def main(args: argparse.Namespace) -> int:
    return run_demo(out=args.out, quick=args.quick)


def _require_torch() -> None:
    """The demo trains with PyTorch: without it, say how to install it before anything is written."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtraError("holoprof demo", "torch")


def run_demo(out: str | None = None, quick: bool = False) -> int:
    _require_torch()
    data = os.path.join(DEFAULT_RUNS_DIR, ".demo-data-quick" if quick else ".demo-data")
    files = 600 if quick else 3000
    out = out or default_run_dir("demo")
    cmd = [sys.executable, SCRIPT, "--data", data, "--train-files", str(files), "--epochs", "2"]
    sys.stderr.write(f"holoprof demo: training a small CNN on {files} image files ({data})\n")
    rc = run(cmd, out=out, name="demo")
    render(build_report(load(out)))
    print(f"\nThe run is in {out}. Explore it again with: holoprof report {out} [--json]")
    print(
        "Measure the fix the report suggests, with no change to the script:\n"
        f"  holoprof tune -- {SCRIPT if os.path.relpath(SCRIPT).startswith('..') else os.path.relpath(SCRIPT)} "
        f"--data {data}"
    )
    return rc
