"""The newest row of each process of a finished run, read from the ``processes`` table's Parquet parts
with pyarrow alone.

``holoprof run``'s last steps after the job (the processes' exit times, the CPU peaks to measure) need
only this small table, one row per process; loading the run for it imports DuckDB and registers every
table, about 0.2 s of CPU per run, twice. The rows are chosen as the loaded run's ``processes`` view
chooses them (:mod:`holoprof.store.reader`): per (host, pid), an agent's row before the sampler's, then
the newest. Times are as recorded (no clock offset taken off). Where this cannot stand for the loaded
view, :func:`newest_rows` says None and the caller loads the run: rows still in raw chunks (a
conversion that did not finish) or a part that does not read.
"""

from __future__ import annotations

import json
import os
from typing import Any

from holoprof import model
from holoprof.store import layout, safeio
from holoprof.store.raw import RAW_SUFFIX


def read_rows(run_dir: str, host: str | None = None) -> list[dict[str, Any]] | None:
    """Every row of the ``processes`` table (the schema's columns; None where a part lacks one), or
    None when some rows are not in readable Parquet parts. ``host``: that host's processes only (its
    staging folders and partitions: a run that several launchers joined, each finishing its own)."""
    run_dir = safeio.utf8_path(run_dir)  # pyarrow opens text paths only
    for folder in layout.process_folders(run_dir, host):
        try:
            files = os.listdir(folder)
        except OSError:
            return None
        if any(n.startswith("processes-") and n.endswith(RAW_SUFFIX) for n in files):
            return None  # not converted yet
        if "processes" in layout.scan_dir(folder, None):
            return None  # a run of the old layout: its Parquet chunks are in the process folders
    try:
        import pyarrow.parquet as pq  # lazy: the launcher has it loaded; the agent never comes here
    except ImportError:  # pragma: no cover - pyarrow is a core dependency
        return None
    names = model.column_names("processes")
    rows: list[dict[str, Any]] = []
    for d in layout.partition_dirs(run_dir, "processes", host):
        chunks = layout.scan_dir(d, "processes").get("processes")
        if chunks is None:
            continue
        for path in [p for _, _, p in chunks.compacted] + [p for _, p in chunks.parts]:
            try:
                table = pq.read_table(path)
            except Exception:
                return None
            present = [n for n in names if n in table.column_names]
            for row in table.select(present).to_pylist():
                if row.get("host") is not None and row.get("pid") is not None:
                    rows.append({n: row.get(n) for n in names})
    return rows


def newest_rows(run_dir: str, host: str | None = None) -> list[dict[str, Any]] | None:
    """Each process's newest row of :func:`read_rows` (None where it says None)."""
    rows = read_rows(run_dir, host)
    if rows is None:
        return None
    best: dict[tuple[str, int], tuple[tuple[bool, int], dict[str, Any]]] = {}
    for row in rows:
        key = (str(row["host"]), int(row["pid"]))
        rank = (not model.sampler_row(row.get("info")), int(row.get("updated_ns") or 0))
        held = best.get(key)
        if held is None or rank > held[0]:
            best[key] = (rank, row)
    return [row for _, row in best.values()]


def info_of(row: dict[str, Any]) -> dict[str, Any]:
    """A row's ``info`` as a dictionary (empty where it does not parse)."""
    try:
        doc = json.loads(row.get("info") or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
