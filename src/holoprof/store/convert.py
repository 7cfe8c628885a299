"""Raw chunks converted into Parquet parts, outside the job: by the launcher, by a converter thread
under ``holoprof.start()``, or when a run is loaded (a launcher that was killed).

The converter also compacts the parts of a running job (:func:`holoprof.store.compact.compact_live`),
so that the number of files of each process and table stays bounded however long the job runs.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from holoprof import model
from holoprof.store import safeio
from holoprof.store.chunks import write_chunk
from holoprof.store.compact import compact_live
from holoprof.store.layout import (
    Chunks,
    chunk_dirs,
    is_complete_parquet,
    partition_dir,
    process_folders,
    scan_dir,
)
from holoprof.store.raw import RAW_SUFFIX, read_raw

_convert_lock = threading.Lock()


#: rows of raw chunks converted into one Parquet file (and held in memory at once)
CONVERT_MAX_ROWS = 200_000
#: a raw chunk's name: <table>-<seq>.hpr
_RAW = re.compile(r"^(?P<table>[a-z_]+)-(?P<seq>\d{8,})" + re.escape(RAW_SUFFIX) + "$")


def convert_folder(folder: str) -> tuple[int, list[str]]:
    """Convert the raw chunks of one staging folder into the run's table folders: the raw chunks of a
    table that are there become one Parquet file, named after the range of their numbers
    (``part-c<first>-<last>.parquet``), written before they are removed (a raw chunk inside the range
    of a file already there, and older than it, was converted by an interrupted pass: it is removed).
    Returns
    (converted, bad paths)."""
    bad: list[str] = []
    host, _, pid = os.path.basename(folder).rpartition("-")
    if not host or not pid.isdigit():
        return 0, bad  # not a staging folder
    writer = (host, int(pid))
    run_dir = os.path.dirname(folder)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return 0, bad
    pending: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        m = _RAW.match(name)
        if m and m["table"] in model.TABLES:
            pending.setdefault(m["table"], []).append((int(m["seq"]), os.path.join(folder, name)))
    converted = 0
    for table, raws in pending.items():
        found = scan_dir(partition_dir(run_dir, table, *writer), table).get(table)
        files = [*found.compacted, *((q, q, p) for q, p in found.parts)] if found else []
        done = [(a, b, _mtime(p)) for a, b, p in files]
        batch: list[tuple[int, str, dict[str, list[Any]]]] = []
        rows = 0
        for seq, path in sorted(raws):
            try:
                _, cols = read_raw(path)
            except (ValueError, OSError):
                bad.append(path)
                continue
            if any(a <= seq <= b and _mtime(path) <= t for a, b, t in done):
                _remove(path)  # converted by a pass that was interrupted: its rows are in Parquet already
                continue
            batch.append((seq, path, cols))
            rows += max((len(v) for v in cols.values()), default=0)
            if rows >= CONVERT_MAX_ROWS:
                converted += _write_batch(run_dir, table, writer, batch, bad)
                batch, rows = [], 0
        converted += _write_batch(run_dir, table, writer, batch, bad)
    return converted, bad


def _write_batch(
    run_dir: str,
    table: str,
    writer: tuple[str, int],
    batch: list[tuple[int, str, dict[str, list[Any]]]],
    bad: list[str],
) -> int:
    """Write the raw chunks of ``batch`` as one Parquet file, then remove them; the number converted.
    Rows pyarrow cannot type make that raw chunk bad (the others are written one by one)."""
    if not batch:
        return 0
    names = list(dict.fromkeys(k for _, _, cols in batch for k in cols))
    merged: dict[str, list[Any]] = {k: [] for k in names}
    for _, _, cols in batch:
        n = max((len(v) for v in cols.values()), default=0)
        for k in names:
            merged[k].extend(cols.get(k) or [None] * n)
    try:
        with _convert_lock:
            write_chunk(run_dir, table, merged, seq=batch[0][0], exact=True, writer=writer, last=batch[-1][0])
    except (ValueError, TypeError, ArithmeticError):  # some rows pyarrow cannot type: find them
        if len(batch) == 1:
            bad.append(batch[0][1])
            return 0
        return sum(_write_batch(run_dir, table, writer, [b], bad) for b in batch)
    for _, path, _ in batch:
        _remove(path)
    return len(batch)


def convert_run(run_dir: str, host: str | None = None) -> tuple[int, list[str]]:
    """Convert the raw chunks of every process (of ``host`` only, when given): (converted, bad paths)."""
    total, bad = 0, []
    for folder in process_folders(run_dir, host):
        n, b = convert_folder(folder)
        total += n
        bad += b
    return total, bad


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class Converter:
    """A background thread converting the raw chunks of a run every ``interval_s`` (of ``host``'s
    processes only, when given: in a run that several launchers joined, each converts its own)."""

    def __init__(self, run_dir: str, interval_s: float = 1.0, host: str | None = None) -> None:
        self.run_dir = run_dir
        self.host = host
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="holoprof-converter", daemon=True)
        self.errors: list[str] = []
        self.passes = 0  # conversion passes done (each converts what is there, then compacts)

    def start(self) -> Converter:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                convert_run(self.run_dir, self.host)
                compact_live(self.run_dir, host=self.host)
                self.passes += 1
            except Exception as exc:  # keep converting later; the raw chunks stay readable
                if len(self.errors) < 10:
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Stop, convert everything that is left and remove the staging folders left empty."""
        self._stop.set()
        self._thread.join(30)
        convert_run(self.run_dir, self.host)
        remove_empty_staging(self.run_dir, self.host)


def remove_empty_staging(run_dir: str, host: str | None = None) -> None:
    """Remove the staging folders left empty once their raw chunks are converted (``host``'s only,
    when given)."""
    for folder in process_folders(run_dir, host):
        try:
            os.rmdir(folder)
        except OSError:
            pass  # not empty: a process still writes there, or a chunk that could not be converted


def find_chunks(run_dir: str, convert: bool = True) -> Chunks:
    """The readable chunks of a run, after converting raw chunks left behind (when writable and
    ``convert``: not while the run's own converter is at work). Their paths are under
    :func:`safeio.utf8_path` of ``run_dir``, which DuckDB and pyarrow can open."""
    run_dir = safeio.utf8_path(run_dir)
    out = Chunks()
    for folder in process_folders(run_dir) if convert else []:
        try:
            _, bad = convert_folder(folder)
            out.bad += bad
        except OSError:
            pass
    for cd in chunk_dirs(run_dir):
        if cd.path not in out.folders:
            out.folders.append(cd.path)
        covered: list[tuple[int, int]] = []
        # a compacted file inside a larger one is a leftover of an interrupted compaction
        compacted = [
            c
            for c in cd.compacted
            if not any(
                o is not c and o[0] <= c[0] and c[1] <= o[1] and (o[0], o[1]) != (c[0], c[1])
                for o in cd.compacted
            )
        ]
        for first, last, path in sorted(compacted):
            if is_complete_parquet(path):
                covered.append((first, last))
                out.files[cd.table].append(path)
            else:
                out.bad.append(path)
        for seq, path in sorted(cd.parts):
            if any(a <= seq <= b for a, b in covered):
                continue  # already inside a compacted file (compaction was interrupted)
            if is_complete_parquet(path):
                out.files[cd.table].append(path)
            else:
                out.bad.append(path)
    return out
