"""The progress-bar interface that long library functions (export, import, pack) advance. It draws
nothing: :func:`holoprof.present.progress.progress` gives one that draws on a terminal."""

from __future__ import annotations


class Bar:
    """The handle of one bar: ``add_total(n)`` as the size of the work becomes known, ``advance(n)``
    as it is done. ``active`` is False where bars are off (then both do nothing), so a caller can skip
    work done only to size the bar."""

    active = False

    def add_total(self, n: float) -> None:
        return None

    def advance(self, n: float) -> None:
        return None
