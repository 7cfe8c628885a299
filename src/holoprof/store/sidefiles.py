"""Files a workflow writes beside the runs it made, read back through the run: ``sweep.json`` (the
result of ``holoprof sweep`` / ``holoprof tune``, in the folder that holds the sweep's runs)."""

from __future__ import annotations

import json
import os
from typing import Any

from holoprof.store import safeio

SWEEP_FILE = "sweep.json"
#: a sweep's result is a few KiB per configuration; a larger file is not read
MAX_SWEEP_BYTES = 64 * 2**20


def write_sweep(out_dir: str, doc: dict[str, Any]) -> str:
    """Write a sweep's result into the folder of its runs; the path written."""
    path = os.path.join(out_dir, SWEEP_FILE)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    return path


def sweep_of(run_dir: str) -> tuple[dict[str, Any], int] | None:
    """For a run made by a sweep: the sweep's result and the index of this run's row; None for a run
    that no sweep made (or whose sweep.json is unreadable)."""
    parent = os.path.dirname(os.path.abspath(run_dir))
    try:
        doc = safeio.read_json(os.path.join(parent, SWEEP_FILE), MAX_SWEEP_BYTES)
        rows = doc["rows"]
        me = os.path.abspath(run_dir)
        idx = next((i for i, r in enumerate(rows) if os.path.abspath(str(r.get("run_dir"))) == me), None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (doc, idx) if idx is not None else None
