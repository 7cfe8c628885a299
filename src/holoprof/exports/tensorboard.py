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
from holoprof.analyze.engine_dask import BATCH, STEP_WINDOW
from holoprof.errors import HoloprofError
from holoprof.progress import Bar
from holoprof.store.reader import Run, row_batches, windows


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
        import numpy as np
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


def _per_step_rows(run: Run, select: str, params: dict[str, Any]) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``select`` over the per-step table of a process, one window of about
    STEP_WINDOW steps (cut at quantiles of their indices) at a time, in batches."""
    from holoprof.analyze.steps import _per_step_sql

    steps = "FROM spans WHERE kind = 'step' AND host = $host AND pid = $pid AND end_ns >= start_ns"
    proc = {"host": params["host"], "pid": params["pid"]}
    n = int(run.con.execute(f"SELECT count(*) {steps}", proc).fetchone()[0])  # type: ignore[index]

    def quantiles(qs: list[float]) -> list[int | None]:
        row = run.con.execute(f"SELECT approx_quantile(step, {[float(q) for q in qs]!r}) {steps}", proc)
        return list(row.fetchone()[0] or [])  # type: ignore[index]

    for window in windows(n, "step", quantiles, STEP_WINDOW):
        cond = " AND ".join(f"step {op} {int(v)}" for _, op, v in window)
        yield from row_batches(run.con.cursor(), _per_step_sql(cond) + select, params, BATCH)


def write_tensorboard(run: Run, logdir: str, engine: Any = None, bar: Bar | None = None) -> TensorBoardStats:
    """Write the per-step scalars of ``run``'s main training loop into ``logdir``.

    ``engine``: DuckDB by default, or a :class:`~holoprof.analyze.engine_dask.DaskEngine` (which
    computes the per-step table on the cluster); both write the same records. ``bar`` (a progress
    bar) counts the steps as they are written.
    """
    bar = bar or Bar()
    from holoprof.analyze.steps import step_processes

    procs = engine.step_processes() if engine is not None else step_processes(run)
    if not procs:
        raise HoloprofError(
            f"{run.path} has no training steps to export to TensorBoard; steps come from optimizer.step() "
            "(PyTorch) or holoprof.step() — the Chrome trace export works for any run (--format chrome)"
        )
    main = procs[0]
    if engine is not None:
        sample_names = engine.job_sample_names()
    else:
        sample_names = {
            str(n) for (n,) in run.rows("SELECT DISTINCT name FROM samples WHERE target_pid = -1")
        }
    series = [("job.rss_bytes", "memory/rss_bytes")]
    for name, tag in (
        ("job.read_bytes_per_s", "io/read_bytes_per_s"),
        ("job.write_bytes_per_s", "io/write_bytes_per_s"),
    ):
        series.append((name, tag))
    for name in sorted(sample_names):
        if name.startswith("gpu.") and name.endswith(".util_percent"):
            series.append((name, f"gpu/{name.split('.')[1]}/util_percent"))
    series = [(n, t) for n, t in series if n in sample_names]
    phases = [*model.MEASURED_PHASES, "other"]
    joins = []
    cols = []
    for i, (name, _tag) in enumerate(series):
        joins.append(
            f"""ASOF LEFT JOIN (SELECT ts_ns, value FROM samples WHERE target_pid = -1 AND name = '{name}') s{i}
                ON per_step.e >= s{i}.ts_ns"""
        )
        cols.append(f"s{i}.value")
    select = f"""SELECT step, e, dur, {", ".join(phases)}{"".join(", " + c for c in cols)}
                 FROM per_step {" ".join(joins)} ORDER BY step"""
    params: dict[str, object] = {"host": main.host, "pid": main.pid, "tid": main.tid}
    tags = ["step_time_s", "throughput_steps_per_s", *(f"phase/{p}_fraction" for p in phases)]
    tags += [t for _, t in series]
    if engine is not None:
        batches = engine.tensorboard_rows(main, [name for name, _ in series])
    else:
        batches = _per_step_rows(run, select, params)
    if bar.active:
        bar.add_total(
            run.rows(
                "SELECT count(*) FROM spans WHERE kind = 'step' AND host = ? AND pid = ? AND end_ns >= start_ns",
                [main.host, main.pid],
            )[0][0]
        )
    n = 0
    with EventWriter(logdir) as w:
        for rows in batches:
            bar.advance(len(rows))
            for r in rows:
                step, end_ns, dur = int(r[0]), int(r[1]), float(r[2] or 0)
                dur_s = dur / 1e9
                values: list[tuple[str, float]] = [("step_time_s", dur_s)]
                values.append(("throughput_steps_per_s", 1.0 / dur_s if dur_s > 0 else 0.0))
                for j, p in enumerate(phases):
                    v = float(r[3 + j] or 0)
                    values.append((f"phase/{p}_fraction", v / dur if dur > 0 else 0.0))
                for j, (_name, tag) in enumerate(series):
                    sv = r[3 + len(phases) + j]
                    if sv is not None:
                        values.append((tag, float(sv)))
                w.scalars(step, end_ns / 1e9, values)
                n += 1
        path = w.path
    return TensorBoardStats(path=path, steps=n, tags=tags)
