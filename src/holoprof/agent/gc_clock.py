"""Keep the agent's own allocations off the garbage collector's clock.

CPython collects its youngest generation once the count of container objects allocated (less those
freed) passes a threshold (700); every tenth such collection collects the middle generation, and every
tenth of those, everything, once enough objects have survived since the last time (a full collection:
tens of milliseconds in a process that imported torch).
The agent's start-up allocates about 2,000 such objects of its own (its modules, its collectors)
that the untraced job never allocates, and so moves every later collection of the job forward by as
many allocations: where the untraced job was a few hundred allocations short of a full collection,
the traced one runs it during its start. A DataLoader worker started with spawn typically is:
``import torch`` and the worker's own start leave it just short of its third.

:class:`OffTheClock` runs such a burst with the collector paused, counts what it allocated, and raises
the youngest generation's threshold by that many until the next collection begins (a ``gc.callbacks``
entry puts it back), so the job's collections come when they would have untraced. It does so only where
it can count: the collector was on, no other Python thread ran meanwhile (their allocations would be
counted too; threads that C code starts and that create no Python objects do not matter), and nobody
changed the thresholds in between (then they are left alone). That is the agent's start in every
process (from ``sitecustomize`` on, before any code of the job's), and its hooks at a framework's import
where the main thread is the only one (a spawned DataLoader worker, whose writer thread waits for its
loop); in a process whose writer already runs, the hooks' allocations stay on the clock, and the
training process collects once after ``import torch`` anyway (``agent.setup.reset_gc_clock``). The
standard modules the agent needs (``threading``, ``zlib``, ``atexit``) are imported before the count
starts, on the clock, as the job that imports them itself (torch does) would have: it then allocates as
much less later. What stays on the clock in a spawned torch worker at its init function is about 200
allocations (the writer thread's start and the like), against about 2,200 before.
"""

from __future__ import annotations

import _thread
import gc
import sys

#: Where the young generation counts allocations as described above: CPython before 3.14 (whose
#: collector is incremental), with the global interpreter lock (a free-threaded build counts in batches).
SUPPORTED = (
    sys.implementation.name == "cpython"
    and sys.version_info < (3, 14)
    and bool(getattr(sys, "_is_gil_enabled", lambda: True)())
)

#: the youngest generation's threshold as the job set it, and how far the agent raised it (0: not)
_RAISED = {"base": 0, "by": 0}


def _restore(phase: str, _info: dict[str, int]) -> None:
    """At the start of the next collection: the threshold back as it was. It stays in ``gc.callbacks``
    afterwards, doing nothing: removed while the collector walks that list, it would make the collector
    skip the next callback's "start" (the job's own, perhaps)."""
    if phase != "start" or not _RAISED["by"]:
        return
    t0, t1, t2 = gc.get_threshold()
    if t0 == _RAISED["base"] + _RAISED["by"]:  # else the job set its own meanwhile
        gc.set_threshold(_RAISED["base"], t1, t2)
    _RAISED["by"] = 0


def _defer_young_collection(allocated: int) -> None:
    t0, t1, t2 = gc.get_threshold()
    if _RAISED["by"] and t0 == _RAISED["base"] + _RAISED["by"]:
        _RAISED["by"] += allocated  # a second burst before the next collection
    else:
        _RAISED["base"], _RAISED["by"] = t0, allocated
    gc.set_threshold(_RAISED["base"] + _RAISED["by"], t1, t2)
    if _restore not in gc.callbacks:
        gc.callbacks.append(_restore)


class OffTheClock:
    """``with OffTheClock(): ...``: the allocations inside do not bring the job's collections
    forward (see the module's documentation); the collector does not run inside."""

    def __init__(self, paused_at: int | None = None) -> None:
        #: the young count where the caller paused the collector itself, earlier (sitecustomize)
        self.paused_at = paused_at

    def __enter__(self) -> OffTheClock:
        if self.paused_at is not None:
            self.paused, self.before = True, self.paused_at
            return self
        self.paused = SUPPORTED and gc.isenabled() and _thread._count() == 0 and gc.get_threshold()[0] > 0
        if self.paused:
            gc.disable()
            self.before = gc.get_count()[0]
        return self

    def __exit__(self, *_exc: object) -> None:
        if not self.paused:
            return
        try:
            allocated = gc.get_count()[0] - self.before
            # from sitecustomize on (paused_at), no thread of the job's can have run: a thread started
            # meanwhile is the agent's own (its writer), whose allocations are the agent's too
            if allocated > 0 and SUPPORTED and (self.paused_at is not None or _thread._count() == 0):
                _defer_young_collection(allocated)
        finally:
            gc.enable()
