"""The files the native I/O library (:mod:`holoprof.collect.io_native`) leaves in a process's folder
of the run (``<run>/<host>-<pid>/``), read here by the launcher, the reader and the analyses alike:

* ``io_native-<pid>.jsonl``: the dump of its counters at exit, one header line, then one Darshan-style
  counter record per file, with the distinct pages of a memory-mapped file the process brought in
  (over all its mappings, inherited ones included); read into ``io_files`` rows;
* ``exit-<pid>.json``: when a process an agent reads exited, after its interpreter's finalization (the
  agent's own end is taken before); the process's end where it is later.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final

from holoprof.store import safeio

LAYER: Final = "native"
DUMP_PREFIX: Final = "io_native-"
DUMP_SUFFIX: Final = ".jsonl"
DUMP_FORMAT: Final = "holoprof.io_native/1"
#: a dump holds one record (about 1 KiB) per file a process used; a larger file is not read
MAX_DUMP_BYTES: Final = 4 * 2**30
EXIT_PREFIX: Final = "exit-"
EXIT_FORMAT: Final = "holoprof.exit/1"


def path_text(raw: bytes) -> str:
    """The text form of a path as the native layer reports it: UTF-8, other bytes as ``\\xNN``.

    Valid UTF-8 (spaces, newlines, any Unicode) comes back unchanged. Other layers should pass their
    paths through ``path_text(os.fsencode(p))`` to match native rows (the result is always safe to
    store as an Arrow string, unlike :func:`os.fsdecode`'s surrogates).
    """
    return raw.decode("utf-8", "backslashreplace")


# -- dump files -----------------------------------------------------------------------------------
def _process_files(run_dir: str, prefix: str, suffix: str) -> list[str]:
    """``<run>/<folder>/<prefix>*<suffix>`` files, sorted."""
    out: list[str] = []
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return out
    for d in entries:
        if not d.is_dir(follow_symlinks=False):
            continue
        try:
            for f in os.scandir(d.path):
                if f.name.startswith(prefix) and f.name.endswith(suffix) and f.is_file():
                    out.append(f.path)
        except OSError:
            continue
    return sorted(out)


def dump_files(run_dir: str) -> list[str]:
    """The dump files in a run directory (``<run>/<host>-<pid>/io_native-<pid>.jsonl``), sorted."""
    return _process_files(run_dir, DUMP_PREFIX, DUMP_SUFFIX)


def _folder_host(path: str, pid: int) -> str:
    """The host of a process folder ``<host>-<pid>`` (its agent's name for it) holding ``path``."""
    folder = os.path.basename(os.path.dirname(path))
    tail = f"-{pid}"
    return _dump_text(folder[: -len(tail)] if folder.endswith(tail) else folder.rpartition("-")[0])


def _dump_text(s: str) -> str:
    # the library writes non-UTF-8 bytes as \udcXX escapes; turn them back into bytes first
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return path_text(s.encode("utf-8", "surrogateescape"))


def read_dump_header(path: str) -> dict[str, Any]:
    """The first line of a dump file: host, pid, ppid, exe, reason (exit, _exit, request), start_ns,
    ts_ns, dropped (files not recorded: table full), trace_dropped, counter_names (per module)."""
    with safeio.open_regular(path, MAX_DUMP_BYTES) as f:
        first = f.readline(MAX_DUMP_BYTES)
    head = safeio.loads_json(first)
    if not isinstance(head, dict) or head.get("format") != DUMP_FORMAT:
        raise ValueError(f"{path}: not a holoprof native I/O dump (format {head.get('format')!r})")
    for key in ("host", "exe"):
        if isinstance(head.get(key), str):
            head[key] = _dump_text(head[key])
    return head


def read_dump(path: str) -> list[dict[str, Any]]:
    """The ``io_files`` rows of a dump file (host, pid and rank -1 filled in from its header; a mapped
    file's distinct pages brought in as ``mapped_pages``, see :func:`pages_json`).

    A truncated last line (the process died while writing) is skipped.
    """
    lines = safeio.read_bytes(path, MAX_DUMP_BYTES).split(b"\n")
    if not lines or not lines[0].strip():
        return []
    head = safeio.loads_json(lines[0])
    if not isinstance(head, dict) or head.get("format") != DUMP_FORMAT:
        raise ValueError(f"{path}: not a holoprof native I/O dump (format {head.get('format')!r})")
    host = _dump_text(str(head.get("host", "")))
    pid = int(head.get("pid", -1))
    ts = int(head.get("ts_ns", 0))
    page_size = int(head.get("page_size") or 4096)
    # counters that are zero are left out of the records: fill them in, in the header's order
    zeros: dict[str, dict[str, Any]] = {
        module: {name: (0.0 if "_F_" in name else 0) for name in names}
        for module, names in (head.get("counter_names") or {}).items()
    }
    rows: list[dict[str, Any]] = []
    for line in lines[1:]:
        if not line.strip():
            continue
        try:
            rec = safeio.loads_json(line, None)
        except ValueError:
            continue
        if not _is_record(rec):
            continue  # not a record the library writes
        counters = dict(zeros.get(rec["module"], {}))
        counters.update(rec["counters"])
        row = {
            "host": host,
            "pid": pid,
            "rank": -1,
            "ts_ns": ts,
            "module": rec["module"],
            "layer": LAYER,
            "path": _dump_text(rec["path"]),
            "counters": counters,
        }
        if rec.get("mapped_pages"):
            row["mapped_pages"] = pages_json(page_size, rec["mapped_pages"])
        rows.append(row)
    return rows


def _is_record(rec: Any) -> bool:
    return (
        isinstance(rec, dict)
        and isinstance(rec.get("module"), str)
        and isinstance(rec.get("path"), str)
        and isinstance(rec.get("counters"), dict)
    )


# -- pages of mapped files --------------------------------------------------------------------------
def pages_json(page_size: int, runs: list[list[int]]) -> str:
    """The ``mapped_pages`` column of an ``io_files`` row: ``{"page_size", "pages": [[first, count]]}``."""
    return json.dumps({"page_size": int(page_size), "pages": runs}, separators=(",", ":"))


def read_pages(text: str | None) -> tuple[int, list[tuple[int, int]]] | None:
    """A ``mapped_pages`` value as (page size, runs of pages); None when absent or unreadable."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        return int(doc["page_size"]), [(int(a), int(n)) for a, n in doc["pages"]]
    except (ValueError, KeyError, TypeError):
        return None


def union_bytes(runs: list[tuple[int, int]], page_size: int) -> int:
    """The bytes of the pages in ``runs`` (first page, count), each page counted once."""
    total, end = 0, -1
    for first, count in sorted(runs):
        last = first + count
        if last > end:
            total += last - max(first, end)
            end = last
    return total * page_size


# -- exit times -------------------------------------------------------------------------------------
def exit_files(run_dir: str) -> list[str]:
    """The exit files in a run directory (``<run>/<host>-<pid>/exit-<pid>.json``), sorted."""
    return _process_files(run_dir, EXIT_PREFIX, ".json")


def exit_files_done(run_dir: str, written: set[tuple[str, int]], host: str | None = None) -> list[str]:
    """The exit files that can go once the exit times of the processes ``written`` (host, pid) are in
    the table: theirs, and those that say nothing (empty or unreadable: a full disk); ``host``: of
    that host's processes only."""
    out = []
    for path in exit_files(run_dir):
        try:
            pid = int(os.path.basename(path)[len(EXIT_PREFIX) : -len(".json")])
        except ValueError:
            continue
        key = (_folder_host(path, pid), pid)
        if host is not None and key[0] != host:
            continue
        if key in written or _read_exit(path) is None:
            out.append(path)
    return out


def _read_exit(path: str) -> tuple[int, int, int | None] | None:
    """(pid, exit time in wall-clock ns, exit status or None) of an exit file, None when it does not
    say. The status is what the process gave ``exit()`` or ``_exit()`` (files before it was recorded
    have none)."""
    try:
        doc = safeio.read_json(path, 1 << 16)
        if not isinstance(doc, dict) or doc.get("format") != EXIT_FORMAT:
            return None
        status = doc.get("status")
        return int(doc["pid"]), int(doc["exit_ns"]), int(status) if isinstance(status, int) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def exits(run_dir: str) -> dict[tuple[str, int], tuple[int, int | None]]:
    """When processes of the run exited (wall-clock ns) and with which status (None: not recorded),
    per (host, pid), from their ``exit-<pid>.json`` (those an agent read; unreadable files are
    skipped). A process killed by a signal leaves none."""
    out: dict[tuple[str, int], tuple[int, int | None]] = {}
    for path in exit_files(run_dir):
        got = _read_exit(path)
        if got is not None:
            out[(_folder_host(path, got[0]), got[0])] = (got[1], got[2])
    return out
