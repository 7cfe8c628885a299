"""The files the native I/O library (:mod:`holoprof.collect.io_native`) writes at a process's exit
(``<run>/<host>-<pid>/io_native-<pid>.jsonl``): one header line, then one Darshan-style counter record
per file. Read here into ``io_files`` rows, by the launcher and by the analyses alike."""

from __future__ import annotations

import os
from typing import Any, Final

from holoprof.store import safeio

LAYER: Final = "native"
DUMP_PREFIX: Final = "io_native-"
DUMP_SUFFIX: Final = ".jsonl"
DUMP_FORMAT: Final = "holoprof.io_native/1"
#: a dump holds one record (about 1 KiB) per file a process used; a larger file is not read
MAX_DUMP_BYTES: Final = 4 * 2**30


def path_text(raw: bytes) -> str:
    """The text form of a path as the native layer reports it: UTF-8, other bytes as ``\\xNN``.

    Valid UTF-8 (spaces, newlines, any Unicode) comes back unchanged. Other layers should pass their
    paths through ``path_text(os.fsencode(p))`` to match native rows (the result is always safe to
    store as an Arrow string, unlike :func:`os.fsdecode`'s surrogates).
    """
    return raw.decode("utf-8", "backslashreplace")


# -- dump files -----------------------------------------------------------------------------------
def dump_files(run_dir: str) -> list[str]:
    """The dump files in a run directory (``<run>/<host>-<pid>/io_native-<pid>.jsonl``), sorted."""
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
                if f.name.startswith(DUMP_PREFIX) and f.name.endswith(DUMP_SUFFIX) and f.is_file():
                    out.append(f.path)
        except OSError:
            continue
    return sorted(out)


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
    """The ``io_files`` rows of a dump file (host, pid and rank -1 filled in from its header).

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
        rows.append(
            {
                "host": host,
                "pid": pid,
                "rank": -1,
                "ts_ns": ts,
                "module": rec["module"],
                "layer": LAYER,
                "path": _dump_text(rec["path"]),
                "counters": counters,
            }
        )
    return rows


def _is_record(rec: Any) -> bool:
    return (
        isinstance(rec, dict)
        and isinstance(rec.get("module"), str)
        and isinstance(rec.get("path"), str)
        and isinstance(rec.get("counters"), dict)
    )
