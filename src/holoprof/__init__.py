"""holoprof: where the time, memory and bandwidth of ML training go, and what to change.

    holoprof run -- python train.py          # trace a job, no code change
    holoprof report holoprof-runs/<run>      # explore it offline

From Python::

    import holoprof
    with holoprof.trace():                   # or holoprof.start() / holoprof.stop()
        train()
    run = holoprof.load("holoprof-runs/<run>")   # DuckDB relations: run.spans.df()

This module imports nothing heavy: it is imported at start-up in every process of a traced job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["HoloprofError", "__version__", "load", "phase", "stage", "start", "step", "stop", "trace"]

from holoprof.api import phase, stage, start, step, stop, trace
from holoprof.errors import HoloprofError

if TYPE_CHECKING:
    from holoprof.store.reader import Run


def load(path: Any, **where: Any) -> Run:
    """Load a run directory: ``run.spans``, ``run.samples``, ... are DuckDB relations.

    Keyword filters, pushed down into the Parquet scans: ``start_s``/``end_s`` (seconds from the
    run's start), ``ranks`` (list of ranks), ``steps`` (inclusive ``(first, last)``).
    """
    from holoprof.store.reader import load as _load

    return _load(path, **where)
