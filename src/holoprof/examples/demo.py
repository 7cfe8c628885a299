"""`holoprof demo` / `make demo`: train the bundled example traced, then print its full report."""

from __future__ import annotations

import os
import sys

from holoprof.errors import MissingExtraError
from holoprof.store.rundir import DEFAULT_RUNS_DIR

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "demo_train.py")


def _require_torch() -> None:
    """The demo trains with PyTorch: without it, say how to install it before anything is written."""
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtraError("holoprof demo", "torch")


def run_demo(out: str | None = None, quick: bool = False) -> int:
    _require_torch()
    from holoprof.analyze.report import build_report
    from holoprof.launch.run import run
    from holoprof.present.terminal import render
    from holoprof.store.reader import load
    from holoprof.store.rundir import default_run_dir

    data = os.path.join(DEFAULT_RUNS_DIR, ".demo-data-quick" if quick else ".demo-data")
    files = 600 if quick else 3000
    out = out or default_run_dir("demo")
    cmd = [sys.executable, SCRIPT, "--data", data, "--train-files", str(files), "--epochs", "2"]
    sys.stderr.write(f"holoprof demo: training a small CNN on {files} image files ({data})\n")
    rc = run(cmd, out=out, name="demo", report=False)
    render(build_report(load(out)))
    print(f"\nThe run is in {out}. Explore it again with: holoprof report {out} [--json]")
    print(
        "Measure the fix the report suggests, with no change to the script:\n"
        f"  holoprof tune -- {SCRIPT if os.path.relpath(SCRIPT).startswith('..') else os.path.relpath(SCRIPT)} "
        f"--data {data}"
    )
    return rc
