"""Export a run's per-step scalars as TensorBoard event files, with no TensorFlow or TensorBoard needed.

Scalars, one point per training step of the main loop (``global_step`` = the step index):

* ``step_time_s`` and ``throughput_steps_per_s`` (1 / step time)
* ``phase/<name>_fraction`` for every standard phase (they sum to 1 for each step)
* ``memory/rss_bytes`` (the job's resident memory at the end of the step, from the sampler)
* ``io/read_bytes_per_s`` and ``io/write_bytes_per_s`` (storage bandwidth of the job at that time),
  when the run has storage samples
* ``gpu/<i>/util_percent`` when the run has GPU samples

An event file is a sequence of TFRecords (length, masked CRC32C of the length, an ``Event`` protocol
buffer, masked CRC32C of the data). The few protobuf fields needed (``Event.wall_time``, ``step``,
``file_version``, ``summary``; ``Summary.Value.tag``, ``simple_value``) are encoded here by hand.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from holoprof import model
from holoprof.analyze.engine import Aggregation, Engine, engine_for
from holoprof.analyze.per_step import per_step_tables
from holoprof.analyze.steps import ProcKey, step_processes
from holoprof.errors import HoloprofError
from holoprof.progress import Bar
from holoprof.store.reader import Run


# --- CRC32C (Castagnoli), as TFRecord needs ----------------------------------------------------------
def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    t = _TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    return _mask(crc32c(data))


def _mask(c: int) -> int:
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def crc32c_many(records: list[bytes]) -> list[int]:
    """CRC32C of each record; vectorized over records of equal length when numpy is there."""
    try:
        import numpy as np  # lazy: numpy loads with the first analysis that needs it
    except ImportError:  # pragma: no cover - numpy comes with the usual ML stack
        return [crc32c(r) for r in records]
    out = [0] * len(records)
    table = np.array(_TABLE, dtype=np.uint32)
    by_len: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        by_len.setdefault(len(r), []).append(i)
    for length, idx in by_len.items():
        if len(idx) < 8:
            for i in idx:
                out[i] = crc32c(records[i])
            continue
        data = np.frombuffer(b"".join(records[i] for i in idx), dtype=np.uint8).reshape(len(idx), length)
        c = np.full(len(idx), 0xFFFFFFFF, dtype=np.uint32)
        for j in range(length):
            c = table[(c ^ data[:, j]) & 0xFF] ^ (c >> 8)
        c ^= np.uint32(0xFFFFFFFF)
        for i, v in zip(idx, c.tolist(), strict=True):
            out[i] = int(v)
    return out


def tfrecord(data: bytes, data_crc: int | None = None) -> bytes:
    length = struct.pack("<Q", len(data))
    dc = crc32c(data) if data_crc is None else data_crc
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", _mask(dc))


# --- protobuf, by hand ---------------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _len_field(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def summary_value(tag: str, value: float) -> bytes:
    """``Summary.Value{tag, simple_value}``."""
    return _len_field(1, tag.encode()) + _key(2, 5) + struct.pack("<f", float(value))


def event(
    wall_time: float, step: int, *, values: list[tuple[str, float]] | None = None, file_version: str = ""
) -> bytes:
    """An ``Event`` with either a file version or a summary of scalar values."""
    out = _key(1, 1) + struct.pack("<d", wall_time)
    if step:
        out += _key(2, 0) + _varint(step)
    if file_version:
        out += _len_field(3, file_version.encode())
    if values:
        summary = b"".join(_len_field(1, summary_value(t, v)) for t, v in values)
        out += _len_field(5, summary)
    return out


class EventWriter:
    """Writes one ``events.out.tfevents.*`` file in ``logdir``."""

    def __init__(self, logdir: str) -> None:
        try:
            os.makedirs(logdir, exist_ok=True)
        except OSError as exc:
            raise HoloprofError(f"cannot create {logdir} ({exc.strerror or exc}); choose a writable -o DIR")
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.holoprof"
        self.path = os.path.join(logdir, name)
        self._f: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self.events = 0
        self._pending: list[bytes] = []
        self._f.write(tfrecord(event(time.time(), 0, file_version="brain.Event:2")))

    def scalars(self, step: int, wall_time: float, values: list[tuple[str, float]]) -> None:
        self._pending.append(event(wall_time, step, values=values))
        self.events += 1
        if len(self._pending) >= 4096:
            self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            crcs = crc32c_many(pending)
            self._f.write(b"".join(tfrecord(d, c) for d, c in zip(pending, crcs, strict=True)))

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._f.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the export ----------------------------------------------------------------------------------------
@dataclass
class TensorBoardStats:
    path: str
    steps: int
    tags: list[str]


#: Per-step rows turned into Python objects at a time.
BATCH = 20_000
#: The phases of each step, as the per-step table gives them.
PHASES = [*model.MEASURED_PHASES, "other"]

#: The names of the job-wide sample series.
_JOB_SAMPLE_NAMES = Aggregation(
    name="job-sample-names",
    table="samples",
    columns=("name", "target_pid"),
    chunk="SELECT DISTINCT name FROM {t} WHERE target_pid = -1",
    combine="SELECT DISTINCT name FROM {t}",
    order="name",
)


def _samples_agg(names: list[str]) -> Aggregation:
    """The job-wide samples of the series ``names``, in time order."""
    return Aggregation(
        name="job-samples",
        table="samples",
        columns=("ts_ns", "name", "value", "target_pid"),
        chunk="""SELECT name, ts_ns, value FROM {t}
                 WHERE target_pid = -1 AND ts_ns IS NOT NULL AND name IN (SELECT unnest($names::VARCHAR[]))""",
        order="name, ts_ns, value",
        params={"names": names},
    )


def _series(eng: Engine, names: list[str]) -> list[tuple[Any, list[Any]]]:
    """Per series of ``names``: its sample times (sorted) and values."""
    import numpy as np  # lazy: numpy loads with the first export

    found: dict[str, tuple[list[int], list[Any]]] = {n: ([], []) for n in names}
    for name, ts, value in eng.aggregate(_samples_agg(names)) if names else []:
        found[name][0].append(int(ts))
        found[name][1].append(value)
    return [(np.asarray(found[n][0], dtype=np.int64), found[n][1]) for n in names]


def _rows(eng: Engine, proc: ProcKey, series: list[str]) -> Iterator[list[tuple[Any, ...]]]:
    """Per step of ``proc``, in step order, BATCH at a time: ``(step, end_ns, dur, <phases...>,
    other, <the last value of each series at or before the step's end, or None>)``."""
    import numpy as np  # lazy: numpy loads with the first export

    known = _series(eng, series)
    for t in per_step_tables(eng.run, proc, eng):
        columns = [t.step, t.e, t.dur, *(t.phases[p] for p in PHASES)]
        last = [np.searchsorted(ts, t.e, side="right") - 1 for ts, _ in known]
        for j in range(0, len(t.step), BATCH):
            cols = [c[j : j + BATCH].tolist() for c in columns]
            for idx, (_, values) in zip(last, known, strict=True):
                cols.append([values[i] if i >= 0 else None for i in idx[j : j + BATCH].tolist()])
            yield list(zip(*cols, strict=True))


def _series_tags(sample_names: set[str]) -> list[tuple[str, str]]:
    """The job-wide series the run has, and their tags."""
    series = [
        ("job.rss_bytes", "memory/rss_bytes"),
        ("job.read_bytes_per_s", "io/read_bytes_per_s"),
        ("job.write_bytes_per_s", "io/write_bytes_per_s"),
    ]
    for name in sorted(sample_names):
        if name.startswith("gpu.") and name.endswith(".util_percent"):
            series.append((name, f"gpu/{name.split('.')[1]}/util_percent"))
    return [(n, t) for n, t in series if n in sample_names]


def _scalars(r: tuple[Any, ...], series: list[tuple[str, str]]) -> list[tuple[str, float]]:
    """The scalars of one step's row (see :func:`_rows`)."""
    dur = float(r[2] or 0)
    dur_s = dur / 1e9
    values: list[tuple[str, float]] = [("step_time_s", dur_s)]
    values.append(("throughput_steps_per_s", 1.0 / dur_s if dur_s > 0 else 0.0))
    for j, p in enumerate(PHASES):
        v = float(r[3 + j] or 0)
        values.append((f"phase/{p}_fraction", v / dur if dur > 0 else 0.0))
    for j, (_name, tag) in enumerate(series):
        sv = r[3 + len(PHASES) + j]
        if sv is not None:
            values.append((tag, float(sv)))
    return values


def write_tensorboard(
    run: Run, logdir: str, engine: Engine | None = None, bar: Bar | None = None
) -> TensorBoardStats:
    """Write the per-step scalars of ``run``'s main training loop into ``logdir``.

    ``engine``: DuckDB by default, or a :class:`~holoprof.analyze.engine_dask.DaskEngine` (which
    computes the per-step table on the cluster); both write the same records. ``bar`` (a progress
    bar) counts the steps as they are written.
    """
    bar = bar or Bar()
    eng = engine_for(run, engine)
    procs = step_processes(run, eng)
    if not procs:
        raise HoloprofError(
            f"{run.path} has no training steps to export to TensorBoard; steps come from optimizer.step() "
            "(PyTorch) or holoprof.step() — the Chrome trace export works for any run (--format chrome)"
        )
    main = procs[0]
    series = _series_tags({str(n) for (n,) in eng.aggregate(_JOB_SAMPLE_NAMES)})
    tags = ["step_time_s", "throughput_steps_per_s", *(f"phase/{p}_fraction" for p in PHASES)]
    tags += [t for _, t in series]
    if bar.active:
        bar.add_total(
            run.rows(
                "SELECT count(*) FROM spans WHERE kind = 'step' AND host = ? AND pid = ? AND end_ns >= start_ns",
                [main.host, main.pid],
            )[0][0]
        )
    n = 0
    with EventWriter(logdir) as w:
        for rows in _rows(eng, main, [name for name, _ in series]):
            bar.advance(len(rows))
            for r in rows:
                w.scalars(int(r[0]), int(r[1]) / 1e9, _scalars(r, series))
                n += 1
        path = w.path
    return TensorBoardStats(path=path, steps=n, tags=tags)
