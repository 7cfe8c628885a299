"""Progress bars for the commands that can take more than a couple of seconds (export, import, pack).

A bar is drawn on stderr, and only when stderr is a terminal: in a pipe, a file or a CI log the
commands print nothing but their one-line result. ``HOLOPROF_PROGRESS=0`` turns bars off, ``=1``
forces them on (for a terminal that does not say it is one).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from holoprof.progress import Bar

#: Environment variable: 0 turns progress bars off, 1 forces them on.
ENV = "HOLOPROF_PROGRESS"


def enabled() -> bool:
    """Whether progress bars are drawn: stderr is a terminal (or HOLOPROF_PROGRESS says)."""
    forced = os.environ.get(ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):
        return False


@contextmanager
def progress(description: str, total: float | None = None, refresh_thread: bool = True) -> Iterator[Bar]:
    """A bar on stderr for one piece of work of ``total`` units (``None``: not known yet, see
    :meth:`Bar.add_total`). Yields a :class:`Bar`, inactive where bars are off. Without
    ``refresh_thread`` the bar is redrawn only as it advances (for work that forks)."""
    if not enabled():
        yield Bar()
        return
    # lazy: rich loads only where a bar is drawn (a terminal)
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(file=sys.stderr, force_terminal=True, markup=False, highlight=False)
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True, auto_refresh=refresh_thread) as rich_progress:
        task = rich_progress.add_task(description, total=total)

        class _Live(Bar):
            active = True

            def __init__(self, task: TaskID) -> None:
                self.task = task

            def add_total(self, n: float) -> None:
                now = rich_progress.tasks[0].total or 0
                rich_progress.update(self.task, total=now + n)

            def advance(self, n: float) -> None:
                rich_progress.advance(self.task, n)
                if not refresh_thread:
                    rich_progress.refresh()

        yield _Live(task)
