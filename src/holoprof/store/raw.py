"""Raw chunks: what the in-process agent writes, converted to Parquet outside the job.

The agent must stay light in every process of a job (a DataLoader worker included): importing pyarrow
costs about 50 MiB of resident memory and a few hundred milliseconds per process. So the writer thread
stores each flush as a *raw chunk* — the columns, serialized with ``marshal`` and compressed with
``zlib`` (standard library only) — and the launcher (``holoprof run``), or a converter thread under
``holoprof.start()``, turns raw chunks into Parquet chunks within a couple of seconds. Loading a run
converts any raw chunk left over (a launcher that was killed).

Raw chunks wait in the process's staging folder (``RUN/<host>-<pid>/<table>-<seq>.hpr``); a raw chunk
becomes the part ``RUN/<table>/host=<host>/pid=<pid>/part-<seq>.parquet`` (written again, the same,
when a conversion was interrupted before the raw chunk was removed). The converter also compacts the
parts of a running job (:func:`holoprof.store.compact.compact_live`), so that the number of files of
each process and table stays bounded however long the job runs.
"""

from __future__ import annotations

import marshal
import os
import re
import threading
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from holoprof import model

RAW_SUFFIX = ".hpr"
_MAGIC = b"HPR1"
_RAW = re.compile(r"^(?P<table>[a-z_]+)-(?P<seq>\d{8,})\.hpr$")


def write_raw(folder: str, table: str, columns: Mapping[str, Sequence[Any]], seq: int) -> str | None:
    """Write one raw chunk atomically (temporary name, then rename). Standard library only."""
    n = max((len(v) for v in columns.values()), default=0)
    if n == 0:
        return None
    payload = marshal.dumps((model.SCHEMA_VERSION, table, {k: list(v) for k, v in columns.items()}))
    data = _MAGIC + zlib.compress(payload, 1)
    path = os.path.join(folder, f"{table}-{seq:08d}{RAW_SUFFIX}")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        f = open(tmp, "wb")  # noqa: SIM115
    except FileNotFoundError:  # the staging folder was tidied away while this process lived on
        os.makedirs(folder, mode=0o700, exist_ok=True)
        f = open(tmp, "wb")  # noqa: SIM115
    try:
        with f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)  # a full disk leaves no empty temporary file behind
        raise
    return path


def read_raw(path: str) -> tuple[str, dict[str, list[Any]]]:
    """Read a raw chunk; raises ValueError when it is not a complete raw chunk."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(_MAGIC):
        raise ValueError(f"{path}: not a raw chunk")
    try:
        version, table, cols = marshal.loads(zlib.decompress(data[len(_MAGIC) :]))
    except (zlib.error, EOFError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: truncated or corrupted raw chunk ({exc})")
    if table not in model.TABLES or not isinstance(cols, dict) or int(version) > model.SCHEMA_VERSION:
        raise ValueError(f"{path}: not a raw chunk of a known table")
    return table, cols


_convert_lock = threading.Lock()


def convert_folder(folder: str) -> tuple[int, list[str]]:
    """Convert the raw chunks of one staging folder to parts of the run's table folders.
    Returns (converted, bad paths)."""
    from holoprof.store.chunks import write_chunk

    converted = 0
    bad: list[str] = []
    host, _, pid = os.path.basename(folder).rpartition("-")
    if not host or not pid.isdigit():
        return 0, bad  # not a staging folder
    writer = (host, int(pid))
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return 0, bad
    for name in names:
        m = _RAW.match(name)
        if not m:
            continue
        path = os.path.join(folder, name)
        try:
            table, cols = read_raw(path)
        except (ValueError, OSError):
            bad.append(path)
            continue
        try:
            with _convert_lock:
                run_dir = os.path.dirname(folder)
                write_chunk(run_dir, table, cols, seq=int(m["seq"]), exact=True, writer=writer)
        except (ValueError, TypeError, ArithmeticError):  # rows pyarrow cannot type
            bad.append(path)
            continue
        _remove(path)
        converted += 1
    return converted, bad


def convert_run(run_dir: str) -> tuple[int, list[str]]:
    from holoprof.store.layout import process_folders

    total, bad = 0, []
    for folder in process_folders(run_dir):
        n, b = convert_folder(folder)
        total += n
        bad += b
    return total, bad


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def discard(path: str) -> None:
    """Remove a temporary file that a failed write left, if any (never raises)."""
    try:
        os.remove(path)
    except OSError:
        pass


class Converter:
    """A background thread converting the raw chunks of a run every ``interval_s``."""

    def __init__(self, run_dir: str, interval_s: float = 1.0) -> None:
        self.run_dir = run_dir
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="holoprof-converter", daemon=True)
        self.errors: list[str] = []

    def start(self) -> Converter:
        self._thread.start()
        return self

    def _loop(self) -> None:
        from holoprof.store.compact import compact_live

        while not self._stop.wait(self.interval_s):
            try:
                convert_run(self.run_dir)
                compact_live(self.run_dir)
            except Exception as exc:  # keep converting later; the raw chunks stay readable
                if len(self.errors) < 10:
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Stop, convert everything that is left and remove the staging folders left empty."""
        from holoprof.store.layout import process_folders

        self._stop.set()
        self._thread.join(30)
        convert_run(self.run_dir)
        for folder in process_folders(self.run_dir):
            try:
                os.rmdir(folder)
            except OSError:
                pass  # not empty: a process still writes there, or a chunk that could not be converted
