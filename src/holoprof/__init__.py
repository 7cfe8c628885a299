"""holoprof: where the time, memory and bandwidth of ML training go, and what to change.

    holoprof run -- python train.py          # trace a job, no code change
    holoprof report holoprof-runs/<run>      # explore it offline

From Python::

    import holoprof
    with holoprof.trace():                   # or holoprof.start() / holoprof.stop()
        train()
    run = holoprof.load("holoprof-runs/<run>")   # DuckDB relations: run.spans.df()
    doc = holoprof.report(run)                   # the report (holoprof.report/1) as a dict
    holoprof.export(run, "chrome", "trace.json") # or "tensorboard" into a log directory

On a Dask cluster (``pip install 'holoprof[dask]'``), for runs that outgrow one machine: the same
numbers and the same files, computed with dask.dataframe over the same Parquet files::

    doc = holoprof.report(run, engine="dask")                   # on a local cluster
    doc = holoprof.report(run, engine="dask", scheduler="tcp://host:8786")
    holoprof.export(run, "chrome", "trace.json", engine="dask", scheduler=client)  # your Client

With ``engine="dask"`` the report's steps, phases and resources are computed on the cluster (the
other sections — I/O, memory, communication, stages, checkpoints — are small aggregates read with
DuckDB); the exports read spans, samples and I/O operations through Dask partitions.

This module imports nothing heavy: it is imported at start-up in every process of a traced job. The
functions of the Python API (``holoprof.step()``, ``holoprof.trace()``, ...) load on first use.
"""

from __future__ import annotations

import sys

from holoprof._version import __version__

__all__ = [
    "HoloprofError",
    "__version__",
    "export",
    "load",
    "phase",
    "report",
    "stage",
    "start",
    "step",
    "stop",
    "trace",
]

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (it loads re: milliseconds)
if TYPE_CHECKING:
    from typing import Any

    from holoprof.api import phase, stage, start, step, stop, trace
    from holoprof.errors import HoloprofError

    # lazy: DuckDB and the analyses load on use, not at `import holoprof`
    from holoprof.store.reader import Run

_API = ("phase", "stage", "start", "step", "stop", "trace")
#: the submodules `import holoprof` used to load with the API, still reached as attributes
_SUBMODULES = ("api", "errors", "model")


def __getattr__(name: str) -> Any:
    """The Python API's functions, ``HoloprofError`` and the submodules ``import holoprof`` used to
    load with them, imported at first use (PEP 562)."""
    if name in _API:
        module, attr = "holoprof.api", name
    elif name == "HoloprofError":
        module, attr = "holoprof.errors", name
    elif name in _SUBMODULES:
        module, attr = f"holoprof.{name}", ""
    else:
        raise AttributeError(f"module 'holoprof' has no attribute {name!r}")
    # lazy: `import holoprof` runs at start-up in every traced process; the API loads on use
    __import__(module)
    value = sys.modules[module]
    if attr:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def load(path: Any, **where: Any) -> Run:
    """Load a run directory: ``run.spans``, ``run.samples``, ... are DuckDB relations.

    Keyword filters, pushed down into the Parquet scans: ``start_s``/``end_s`` (seconds from the
    run's start), ``ranks`` (list of ranks), ``steps`` (inclusive ``(first, last)``).
    """
    # lazy: DuckDB and the analyses load on use, not at `import holoprof`
    from holoprof.store.reader import load as _load

    return _load(path, **where)


def _as_run(run: Any) -> Run:
    # lazy: DuckDB and the analyses load on use, not at `import holoprof`
    from holoprof.store.reader import Run as _Run

    return run if isinstance(run, _Run) else load(run)


def report(run: Any, engine: str = "duckdb", scheduler: Any = None) -> dict[str, Any]:
    """Every analysis of ``run`` (a loaded run or a path) as the ``holoprof.report/1`` dict, the
    same document as ``holoprof report RUN --json``.

    ``engine="dask"`` computes steps, phases and resources with dask.dataframe on a Dask cluster:
    ``scheduler`` is an address (``"tcp://host:8786"``) or a ``distributed.Client``; by default a
    local cluster is started for the call. The numbers are the same as the DuckDB engine's.
    """
    # lazy: DuckDB and the analyses load on use, not at `import holoprof`
    from holoprof.analyze.report import build_report
    from holoprof.errors import HoloprofError

    if scheduler is not None and engine != "dask":
        raise HoloprofError("scheduler goes with engine='dask'")
    return build_report(_as_run(run), engine=engine, scheduler=scheduler)


def export(
    run: Any,
    format: str,
    out: str,
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    engine: str = "duckdb",
    scheduler: Any = None,
) -> str:
    """Export ``run`` (a loaded run or a path) as ``format`` (``"chrome"``: a trace file, or
    ``"tensorboard"``: a log directory) into ``out``, like ``holoprof export``; returns a summary
    line. ``engine``/``scheduler`` as for :func:`report`: Dask writes the same file as DuckDB."""
    # lazy: DuckDB and the analyses load on use, not at `import holoprof`
    from holoprof.exports.formats import export_run

    return export_run(_as_run(run), format, out, start_s, end_s, engine=engine, scheduler=scheduler)
