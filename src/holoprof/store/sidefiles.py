"""Files a workflow writes beside the runs it made, read back through the run: ``sweep.json`` (the
result of ``holoprof sweep`` / ``holoprof tune``, in the folder that holds the sweep's runs); and
the peak FLOP/s measured on a run's hosts (``artifacts/peak-flops-<host>.json``)."""

from __future__ import annotations

import json
import os
from typing import Any

from holoprof import model
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


# --- measured peak FLOP/s of a host's CPU: artifacts/peak-flops-<host>.json -------------------------
PEAK_PREFIX = "peak-flops-"


def write_peaks(run_dir: str, host: str, entries: list[dict[str, Any]]) -> str:
    """Write the peak FLOP/s measured on ``host`` for this run (one entry per device, dtype and thread
    count) into the run's artifacts; the path written (atomically: a reader sees all or nothing)."""
    art = os.path.join(run_dir, model.ARTIFACTS_DIR)
    os.makedirs(art, mode=0o700, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)
    path = os.path.join(art, f"{PEAK_PREFIX}{safe}.json")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"host": host, "peaks": entries}, f, indent=1)
    os.replace(tmp, path)
    return path


def read_peaks(run_dir: str) -> list[dict[str, Any]]:
    """Every peak FLOP/s entry written into the run (each with its ``host``); [] when there is none."""
    art = os.path.join(run_dir, model.ARTIFACTS_DIR)
    try:
        names = sorted(n for n in os.listdir(art) if n.startswith(PEAK_PREFIX) and n.endswith(".json"))
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for name in names:
        try:
            with open(os.path.join(art, name)) as f:
                doc = json.load(f)
            host = str(doc["host"])
            out += [{**e, "host": host} for e in doc["peaks"] if isinstance(e, dict)]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
