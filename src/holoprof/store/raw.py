"""Raw chunks: what the in-process agent writes, converted to Parquet outside the job.

The agent must stay light in every process of a job (a DataLoader worker included): importing pyarrow
costs about 50 MiB of resident memory and a few hundred milliseconds per process. So the writer thread
stores each flush as a *raw chunk* — the columns, serialized with ``marshal`` and compressed with
``zlib`` (standard library only) — and the launcher (``holoprof run``), or a converter thread under
``holoprof.start()``, turns raw chunks into Parquet chunks within a couple of seconds. Loading a run
converts any raw chunk left over (a launcher that was killed).

Raw chunks wait in the process's staging folder (``RUN/<host>-<pid>/<table>-<seq>.hpr``); a raw chunk
becomes the part ``RUN/<table>/host=<host>/pid=<pid>/part-<seq>.parquet`` (written again, the same,
when a conversion was interrupted before the raw chunk was removed). Conversion is
:mod:`holoprof.store.convert`'s job; this module is what the agent needs, standard library only.
"""

from __future__ import annotations

import marshal
import os
import zlib

from holoprof import model

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (loaded in every traced process)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

RAW_SUFFIX = ".hpr"
_MAGIC = b"HPR1"


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


#: bytes of a raw chunk, on disk and decompressed, past which it is not one an agent wrote (a flush
#: holds at most the agent's buffer: 50,000 rows by default, a few MiB)
RAW_MAX_BYTES = 2**30


def read_raw(path: str) -> tuple[str, dict[str, list[Any]]]:
    """Read a raw chunk; raises ValueError when it is not a complete raw chunk, OSError when it
    cannot be read or is not a regular file of at most :data:`RAW_MAX_BYTES`."""
    # lazy: the readers' module; the agent, which imports this one at start-up, only writes
    from holoprof.store import safeio

    data = safeio.read_bytes(path, RAW_MAX_BYTES)
    if not data.startswith(_MAGIC):
        raise ValueError(f"{path}: not a raw chunk")
    try:
        inflate = zlib.decompressobj()
        payload = inflate.decompress(data[len(_MAGIC) :], RAW_MAX_BYTES)
        if inflate.unconsumed_tail:
            raise ValueError(f"more than {RAW_MAX_BYTES:,} bytes once decompressed")
        if not inflate.eof:
            raise ValueError("the compressed data ends early")
        version, table, cols = marshal.loads(payload)
    except (zlib.error, EOFError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: truncated or corrupted raw chunk ({exc})")
    if table not in model.TABLES or not isinstance(cols, dict) or int(version) > model.SCHEMA_VERSION:
        raise ValueError(f"{path}: not a raw chunk of a known table")
    return table, cols


def discard(path: str) -> None:
    """Remove a temporary file that a failed write left, if any (never raises)."""
    try:
        os.remove(path)
    except OSError:
        pass
