"""`holoprof export RUN --format chrome|tensorboard -o PATH`: a run in another tool's format.

* ``chrome``: one JSON file in the Chrome trace event format (Perfetto, chrome://tracing);
  ``--from S --to S`` keeps the window from S to S seconds after the run start; ``-o -`` writes it
  to stdout.
* ``tensorboard``: a log directory with an event file of per-step scalars
  (``tensorboard --logdir PATH``).

RUN may be a run directory or a pack (``holoprof pack``). ``--engine dask [--scheduler ADDRESS]``
reads the run through Dask partitions on a Dask cluster (a local one by default) and writes the same
file as the default DuckDB engine (``pip install 'holoprof[dask]'``).
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from holoprof.analyze.engine import DuckDBEngine, Engine
from holoprof.analyze.engine_dask import DaskEngine, client
from holoprof.errors import HoloprofError
from holoprof.exports.chrome_trace import write_chrome_trace
from holoprof.exports.tensorboard import write_tensorboard
from holoprof.present.progress import progress

FORMATS = ("chrome", "tensorboard")


#: The largest --from/--to (seconds, about 31 years): a window past it cannot hold a recorded time.
MAX_WINDOW_S = 1e9


@contextmanager
def _engine(run: Any, engine: str, scheduler: Any) -> Iterator[Engine]:
    if engine == "duckdb":
        if scheduler is not None:
            raise HoloprofError("--scheduler goes with --engine dask")
        yield DuckDBEngine(run)
        return
    if engine != "dask":
        raise HoloprofError(f"unknown engine {engine!r}; use duckdb (default) or dask")
    with client(scheduler) as c:
        yield DaskEngine(run, c)


def _check(fmt: str, out: str, start_s: float | None, end_s: float | None) -> None:
    """The arguments of an export, each wrong one a one-line error."""
    if fmt not in FORMATS:
        raise HoloprofError(f"unknown export format {fmt!r}; use {' or '.join(FORMATS)}")
    if start_s is not None and start_s < 0:
        raise HoloprofError("--from must be 0 or more seconds after the run start")
    if any(v is not None and abs(v) > MAX_WINDOW_S for v in (start_s, end_s)):
        raise HoloprofError(f"--from and --to are seconds from the run start, at most {MAX_WINDOW_S:g}")
    if start_s is not None and end_s is not None and end_s <= start_s:
        raise HoloprofError(f"--to ({end_s}) must be after --from ({start_s})")
    if fmt != "chrome" and (start_s is not None or end_s is not None):
        raise HoloprofError("--from/--to apply to --format chrome only; leave them out for tensorboard")
    if out == "-" and fmt != "chrome":
        raise HoloprofError("TensorBoard writes a log directory, not a stream; give one with -o, e.g. -o tb/")


def _chrome_to_stdout(
    run: Any, window: tuple[float | None, float | None], engine: str, scheduler: Any
) -> str:
    sys.stdout.flush()
    stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")  # JSON is UTF-8
    try:
        with _engine(run, engine, scheduler) as eng, progress("Chrome trace") as bar:
            stats = write_chrome_trace(run, stdout, *window, engine=eng, bar=bar)
        stdout.flush()
    finally:
        stdout.detach()
    return (
        f"wrote the trace to stdout: {stats.spans} spans, {stats.counters} samples, {stats.io_ops} I/O ops, "
        f"{stats.processes} processes"
    )


def _chrome_to_file(
    run: Any, out: str, window: tuple[float | None, float | None], engine: str, scheduler: Any
) -> str:
    """The trace written to ``out`` through a temporary file beside it, renamed when complete."""
    if os.path.isdir(out):
        raise HoloprofError(f"{out} is a directory; give the trace file to write, e.g. -o trace.json")
    tmp = out + ".tmp"
    try:
        with (
            _engine(run, engine, scheduler) as eng,
            open(tmp, "w", encoding="utf-8") as f,
            progress("Chrome trace") as bar,
        ):
            stats = write_chrome_trace(run, f, *window, engine=eng, bar=bar)
        os.replace(tmp, out)
    except OSError as exc:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise HoloprofError(f"cannot write {out} ({exc.strerror or exc}); choose a writable path with -o")
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return (
        f"wrote {out}: {stats.spans} spans, {stats.counters} samples, {stats.io_ops} I/O ops, "
        f"{stats.processes} processes; open it in https://ui.perfetto.dev or chrome://tracing"
    )


def _tensorboard(run: Any, out: str, engine: str, scheduler: Any) -> str:
    if os.path.isfile(out):
        raise HoloprofError(f"{out} is a file; give a log directory for TensorBoard, e.g. -o tb/")
    with _engine(run, engine, scheduler) as eng, progress("TensorBoard steps") as bar:
        tb = write_tensorboard(run, out, engine=eng, bar=bar)
    return f"wrote {tb.path}: {tb.steps} steps, {len(tb.tags)} scalars each; view with: tensorboard --logdir {out}"


def export_run(
    run: Any,
    fmt: str,
    out: str,
    start_s: float | None = None,
    end_s: float | None = None,
    engine: str = "duckdb",
    scheduler: Any = None,
) -> str:
    """Export ``run`` (a loaded run) as ``fmt`` into ``out``; returns a one-line summary. ``out``
    ``"-"`` writes a Chrome trace to stdout (UTF-8); TensorBoard needs a directory. A progress bar is
    drawn on stderr when it is a terminal (:mod:`holoprof.present.progress`).

    ``engine="dask"`` reads it on a Dask cluster (``scheduler``: an address or a
    ``distributed.Client``; default: a local cluster); the output is the same as DuckDB's.
    """
    _check(fmt, out, start_s, end_s)
    if fmt == "chrome" and out == "-":
        return _chrome_to_stdout(run, (start_s, end_s), engine, scheduler)
    out = os.path.abspath(out)
    if fmt == "chrome":
        return _chrome_to_file(run, out, (start_s, end_s), engine, scheduler)
    return _tensorboard(run, out, engine, scheduler)
