"""Where the chunks of a run are: table folders partitioned by process, staging folders, the old layout.

A run directory holds one folder per table, Hive-partitioned by host and process::

    RUN/spans/hostname=<host>/proc=<pid>/part-<seq>.parquet        one flush of one process
    RUN/spans/hostname=<host>/proc=<pid>/part-c<first>-<last>.parquet   parts <first>..<last>, compacted

so that DuckDB, pandas, polars and Spark read ``RUN/<table>`` as one table. The files keep their own
``host`` and ``pid`` columns (a file read alone still says whose it is). The partition keys are named
``hostname`` and ``proc`` because a key that is also a column of the files breaks pyarrow (and so
pandas): it types the key from the folder names (a dictionary, an int32) and refuses to merge it with
the file's column. Readers add them as two more columns with the same values (the host URI-escaped
where it holds a character a folder name cannot). Files whose name starts with ``.`` or ``_`` (files
being written) are skipped by those readers and by this module.

Each process of a job writes its raw chunks (:mod:`holoprof.store.raw`) into a *staging folder*
``RUN/<host>-<pid>/``; the converter turns them into parts of the table folders. Runs written before
table folders existed keep their Parquet chunks in such process folders
(``<host>-<pid>/<table>-<seq>.parquet``, ``<table>-c<first>-<last>.parquet``): they load as before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from holoprof import model
from holoprof.store import safeio

_PART = re.compile(r"^part-(?P<seq>\d{8,})\.parquet$")
_COMPACT = re.compile(r"^part-c(?P<first>\d+)-(?P<last>\d+)\.parquet$")
_OLD_PART = re.compile(r"^(?P<table>[a-z_]+)-(?P<seq>\d{8,})\.parquet$")
_OLD_COMPACT = re.compile(r"^(?P<table>[a-z_]+)-c(?P<first>\d+)-(?P<last>\d+)\.parquet$")
_MAGIC = b"PAR1"
#: the partition keys (folder names ``hostname=<host>``, ``proc=<pid>``)
HOST_KEY = "hostname"
PID_KEY = "proc"
#: characters a host name keeps as they are in a partition folder's name
_HOST_SAFE = "-._~"


@dataclass
class Chunks:
    files: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in model.TABLES})
    bad: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)


@dataclass
class ChunkDir:
    """The chunks of one table of one process: a partition folder, or a process folder of the old
    layout (which holds every table side by side)."""

    table: str
    path: str
    compacted: list[tuple[int, int, str]] = field(default_factory=list)  # (first, last, path)
    parts: list[tuple[int, str]] = field(default_factory=list)  # (seq, path)
    old: bool = False

    def compacted_path(self, first: int, last: int) -> str:
        if self.old:
            return os.path.join(self.path, f"{self.table}-c{first:08d}-{last:08d}{model.CHUNK_SUFFIX}")
        return os.path.join(self.path, compacted_name(first, last))


def part_name(seq: int) -> str:
    return f"part-{seq:08d}{model.CHUNK_SUFFIX}"


def compacted_name(first: int, last: int) -> str:
    return f"part-c{first:08d}-{last:08d}{model.CHUNK_SUFFIX}"


def partition_dir(run_dir: str, table: str, host: str, pid: int) -> str:
    """``RUN/<table>/hostname=<host>/proc=<pid>``."""
    return os.path.join(
        run_dir, table, f"{HOST_KEY}={quote(str(host), safe=_HOST_SAFE)}", f"{PID_KEY}={int(pid)}"
    )


def partition_of(path: str) -> tuple[str, int] | None:
    """(host, pid) of a partition folder (or of a file in one), None when it is not one."""
    d = path if os.path.isdir(path) else os.path.dirname(path)
    pid_part, host_part = os.path.basename(d), os.path.basename(os.path.dirname(d))
    if not (host_part.startswith(f"{HOST_KEY}=") and pid_part.startswith(f"{PID_KEY}=")):
        return None
    try:
        return unquote(host_part.partition("=")[2]), int(pid_part.partition("=")[2])
    except ValueError:
        return None


def is_complete_parquet(path: str) -> bool:
    """A regular file (not a FIFO or a device: see :func:`safeio.open_regular`) that starts and ends
    with Parquet's magic bytes."""
    try:
        with safeio.open_regular(path) as f:
            if os.fstat(f.fileno()).st_size < 12:
                return False
            head = f.read(4)
            f.seek(-4, os.SEEK_END)
            tail = f.read(4)
        return head == _MAGIC and tail == _MAGIC
    except OSError:
        return False


def process_folders(run_dir: str, host: str | None = None) -> list[str]:
    """The staging folders of the processes (``RUN/<host>-<pid>``), and the process folders of a run
    of the old layout; with ``host``, those of that host only."""
    out: list[str] = []
    try:
        entries = sorted(os.listdir(run_dir))
    except OSError:
        return out
    for entry in entries:
        if (
            entry in (model.CONTROL_DIR, model.ARTIFACTS_DIR, model.HOSTS_DIR)
            or entry in model.TABLES
            or entry[:1] in "._"
        ):
            continue
        if host is not None and entry.rpartition("-")[0] != host:
            continue
        p = os.path.join(run_dir, entry)
        if os.path.isdir(p) and not os.path.islink(p):
            out.append(p)
    return out


def _subdirs(path: str, prefix: str) -> list[str]:
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    out = []
    for n in names:
        p = os.path.join(path, n)
        if n.startswith(prefix) and os.path.isdir(p) and not os.path.islink(p):
            out.append(p)
    return out


def partition_dirs(run_dir: str, table: str, host: str | None = None) -> list[str]:
    """The partition folders of ``table`` (``RUN/<table>/hostname=*/proc=*``); with ``host``, those of
    that host only."""
    prefix = f"{HOST_KEY}=" if host is None else f"{HOST_KEY}={quote(str(host), safe=_HOST_SAFE)}"
    return [
        p
        for h in _subdirs(os.path.join(run_dir, table), prefix)
        if host is None or os.path.basename(h) == prefix
        for p in _subdirs(h, f"{PID_KEY}=")
    ]


def scan_dir(path: str, table: str | None) -> dict[str, ChunkDir]:
    """The chunks in ``path``: a partition folder of ``table``, or an old process folder (``None``)."""
    res: dict[str, ChunkDir] = {}
    try:
        names = os.listdir(path)
    except OSError:
        return res
    for n in names:
        m = (_COMPACT if table else _OLD_COMPACT).match(n)
        t = table or (m["table"] if m else None)
        if m and t in model.TABLES:
            cd = res.setdefault(t, ChunkDir(t, path, old=table is None))
            cd.compacted.append((int(m["first"]), int(m["last"]), os.path.join(path, n)))
            continue
        m = (_PART if table else _OLD_PART).match(n)
        t = table or (m["table"] if m else None)
        if m and t in model.TABLES:
            cd = res.setdefault(t, ChunkDir(t, path, old=table is None))
            cd.parts.append((int(m["seq"]), os.path.join(path, n)))
    return res


def chunk_dirs(run_dir: str, host: str | None = None) -> Iterator[ChunkDir]:
    """Every table's chunks, one process at a time: the table folders, then old process folders;
    with ``host``, those of that host's processes only."""
    for table in model.TABLES:
        for d in partition_dirs(run_dir, table, host):
            yield from scan_dir(d, table).values()
    for folder in process_folders(run_dir, host):
        yield from scan_dir(folder, None).values()


def host_of(path: str) -> str | None:
    """The host whose process wrote the chunk ``path`` (from its partition folder, or its process
    folder in the old layout), None when the path does not say."""
    part = partition_of(path)
    if part is not None:
        return part[0]
    host, _, pid = os.path.basename(os.path.dirname(path)).rpartition("-")
    return host if host and pid.isdigit() else None
