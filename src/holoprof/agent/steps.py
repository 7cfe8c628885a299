"""Step boundaries, per training thread, and the exact counts kept beside the span buffer.

Every thread that runs a training loop has its own :class:`ThreadLoop`: the step in progress and the
exact counts of the steps it ran (number, total time, first start, last end), of its epochs and of its
phases (count and time, inside steps and outside them). Eight threads that each train a model are eight
loops, whose step boundaries never mix. A thread that only records phases of another thread's step
(a checkpoint writer, an autograd thread) reads the step index of the process's *primary* loop, the
first that ran a step, as every thread did when a process had one loop.

Step indices are unique within a process: each loop takes its next index from one counter, so a step is
known by (process, index) and belongs to the thread that ran it. With one training thread the indices
run 0, 1, 2, ... exactly as they always did.

The counts are kept whatever happens to the spans: when the buffer is full a span is dropped (and
counted), but its step, epoch or phase is still counted here. The writer thread writes them with the
process's row (the ``counters`` column of ``processes``, see :meth:`StepTracker.counts`), so a report of
a run that dropped spans still gives the true step count and phase totals. Only the owning thread
changes a loop; the writer reads copies.

Phases are counted off the training thread: the writer counts those it writes
(:meth:`StepTracker.count_kept`: inside a step when they start in its window), and a loop counts only
the phases dropped in its thread (by its own rule, which places them alike in ordinary loops).
Counting every phase where it ends cost the training thread several µs of a 6 ms step (each count
touches objects that the step's own work has pushed out of the caches).

Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import itertools
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (loaded in every traced process)
if TYPE_CHECKING:
    from typing import Any

    from holoprof.agent.core import Agent

_perf_ns = time.perf_counter_ns
_NO_START = 1 << 62
#: phases of one step that the writer keeps one by one until the step is recorded; more are summed
PENDING_PHASES = 4096
#: sums of such phases kept apart per step (each placed by its own first phase); more are merged
FOLDS = 64


def _count(into: dict[str, list[int]], name: str, ns: int) -> None:
    v = into.get(name)
    if v is None:
        into[name] = [1, ns]
    else:
        v[0] += 1
        v[1] += ns


def _merge(into: dict[str, list[int]], more: dict[str, list[int]]) -> None:
    for name, (n, ns) in list(more.items()):
        v = into.get(name)
        if v is None:
            into[name] = [n, ns]
        else:
            v[0] += n
            v[1] += ns


class ThreadLoop:
    """One thread's training loop: its step in progress and its exact counts.

    The phases dropped while a step is open wait in ``open`` (or, after its update, in ``tail``) until
    the step is recorded: then they count as inside steps, as the report's per-step table counts them;
    the phases of a step that is never recorded (a half-done last step), and those after the last
    update when the loop ends there, count as outside steps. The phases kept are counted by the writer
    (:meth:`StepTracker.count_kept`).
    """

    __slots__ = (
        "epochs",
        "first_ns",
        "index",
        "just_updated",
        "last_ns",
        "last_update_ns",
        "manual",
        "open",
        "origin_ns",
        "outside",
        "pending_close",
        "phases",
        "start_ns",
        "step_ns",
        "steps",
        "tail",
        "tail_start",
        "tid",
        "trains",
    )

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.index = -1  # no step started yet: the thread reads the primary loop's index
        self.origin_ns = _NO_START  # the start of its first step: phases before it are not counted
        self.start_ns: int | None = None
        self.pending_close = False
        self.manual = False  # holoprof.step() marks this loop's steps
        self.trains = False  # an opener, an update or holoprof.step() came from this thread
        self.last_update_ns = 0
        self.just_updated = False  # nothing but the update happened since it ended
        self.steps = 0
        self.step_ns = 0
        self.first_ns = 0
        self.last_ns = 0
        self.epochs = 0
        self.phases: dict[str, list[int]] = {}  # name -> [count, ns] inside recorded steps
        self.outside: dict[str, list[int]] = {}  # name -> [count, ns] outside any step
        self.open: dict[str, list[int]] = {}  # of the step in progress, before its update
        self.tail: dict[str, list[int]] = {}  # of the step in progress, after its update
        self.tail_start = _NO_START

    def phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """A phase of this thread ended and was dropped."""
        start = self.start_ns
        if start is None or start_ns < start:
            into = self.outside
        elif self.pending_close:
            into = self.tail
            if start_ns < self.tail_start:
                self.tail_start = start_ns
        else:
            into = self.open
        _count(into, name, end_ns - start_ns)

    def recorded(self, start_ns: int, end_ns: int) -> None:
        """The step in progress was recorded, from ``start_ns`` to ``end_ns``."""
        if not self.steps:
            self.first_ns = start_ns
        self.steps += 1
        self.step_ns += end_ns - start_ns
        self.last_ns = end_ns
        if self.open:  # phases dropped in the step (none while the buffer has room: nothing to make)
            _merge(self.phases, self.open)
            self.open = {}
        # what followed the update belongs to the step unless the step ended at the update
        if self.tail:
            _merge(self.phases if end_ns > self.tail_start else self.outside, self.tail)
            self.tail, self.tail_start = {}, _NO_START

    def discard(self) -> None:
        """The step in progress is not recorded: its phases count as outside steps."""
        if self.open or self.tail:
            _merge(self.outside, self.open)
            _merge(self.outside, self.tail)
            self.open, self.tail, self.tail_start = {}, {}, _NO_START

    def counts(self, off: int) -> dict[str, Any]:
        """The counts as JSON-able values (times on the wall clock: ``off`` added)."""
        return {
            "steps": self.steps,
            "step_ns": self.step_ns,
            "first_ns": self.first_ns + off if self.steps else 0,
            "last_ns": self.last_ns + off if self.steps else 0,
            "epochs": self.epochs,
            "phases": {k: list(v) for k, v in dict(self.phases).items()},
            "outside": {k: list(v) for k, v in dict(self.outside).items()},
        }


def _merge_counts(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two loops of one thread id (the system reused the id of a thread that ended)."""
    firsts = [c["first_ns"] for c in (a, b) if c["steps"]]
    out = {
        "steps": a["steps"] + b["steps"],
        "step_ns": a["step_ns"] + b["step_ns"],
        "first_ns": min(firsts) if firsts else 0,
        "last_ns": max(a["last_ns"], b["last_ns"]),
        "epochs": a["epochs"] + b["epochs"],
    }
    for key in ("phases", "outside"):
        merged: dict[str, list[int]] = {k: list(v) for k, v in a[key].items()}
        _merge(merged, b[key])
        out[key] = merged
    return out


class StepTracker:
    """Step boundaries of every training thread of a process, shared by all collectors and by
    ``holoprof.step()``; each call acts on the calling thread's loop.

    A step ends at the first *opener* (a training forward, a training-loader fetch, ``zero_grad``)
    after an optimizer step, so that the whole iteration, logging included, belongs to one step.
    Loops without an optimizer fall back to backward passes; ``holoprof.step()`` overrides both (for the
    thread that calls it).
    """

    __slots__ = (
        "_folded",
        "_lost",
        "_next",
        "_pending",
        "agent",
        "kept",
        "loops",
        "optimizer_seen",
        "primary",
        "running",
        "tls",
    )

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.reset()

    def reset(self) -> None:
        """Forget every loop (a new process, after fork: the agent's per-thread state is new too)."""
        self.tls = self.agent.tls
        self.loops: list[ThreadLoop] = []  # every thread's loop (the writer reads a copy)
        self.primary: ThreadLoop | None = None  # the loop whose index threads without one read
        self.optimizer_seen = False  # the process made an optimizer (of any thread)
        self.running = 0  # threads that train (an opener, an update or holoprof.step() of their own)
        self._next = itertools.count()
        # the writer's: the phases written, by thread: (inside steps, outside), and those whose step
        # is not written yet, by (thread, step index)
        self.kept: dict[int, tuple[dict[str, list[int]], dict[str, list[int]]]] = {}
        self._pending: dict[tuple[int, int], list[tuple[str, int, int]]] = {}
        self._folded: dict[tuple[int, int], list[tuple[int, dict[str, list[int]]]]] = {}
        #: steps whose span was dropped: (thread, index, start, end), for the writer
        self._lost: list[tuple[int, int, int, int]] = []

    # -- the calling thread's loop ----------------------------------------------------------------
    def mine(self) -> ThreadLoop:
        """The calling thread's loop (made on first use; it starts with its first step)."""
        tls = self.tls
        loop = tls.loop
        if loop is None:
            loop = tls.loop = ThreadLoop(tls.tid)
            self.loops.append(loop)
        return loop

    @property
    def index(self) -> int:
        """The index of the calling thread's step in progress (the primary loop's, for a thread that
        runs none). Read with every phase recorded: kept short."""
        loop = self.tls.loop
        if loop is not None and loop.index >= 0:
            return loop.index
        loop = self.primary
        return loop.index if loop is not None else 0

    @property
    def last_update_ns(self) -> int:
        loop = self.tls.loop
        return loop.last_update_ns if loop is not None else 0

    def runs(self, tid: int) -> bool:
        """Whether the thread ``tid`` runs a training loop (started a step)."""
        return any(loop.tid == tid and loop.index >= 0 for loop in list(self.loops))

    def _trains(self, loop: ThreadLoop) -> None:
        if not loop.trains:
            loop.trains = True
            self.running += 1

    def _start(self, loop: ThreadLoop, t_ns: int) -> None:
        loop.start_ns = t_ns
        if loop.index < 0:
            loop.index = next(self._next)
            loop.origin_ns = t_ns
            if self.primary is None:
                self.primary = loop

    # -- boundaries -------------------------------------------------------------------------------
    def activity(self, t_ns: int) -> None:
        """Something of the training loop happened at ``t_ns``: the first step starts here."""
        loop = self.mine()
        if loop.start_ns is None:
            self._start(loop, t_ns)

    def opener(self, t_ns: int, loop: ThreadLoop | None = None) -> None:
        """An iteration's first activity (``loop``: the calling thread's, when the caller has it)."""
        if loop is None:
            loop = self.mine()
        if not loop.trains:
            self._trains(loop)
        loop.just_updated = False
        if loop.pending_close and not loop.manual:
            self.close(t_ns, loop)
        elif loop.start_ns is None:
            self._start(loop, t_ns)

    def update_done(self, t_ns: int, loop: ThreadLoop | None = None) -> None:
        """An optimizer step (or, without any optimizer, a backward pass) finished (``loop``: the calling
        thread's, when the caller has it)."""
        if loop is None:
            loop = self.mine()
        if not loop.trains:
            self._trains(loop)
        if loop.manual:
            return
        if loop.start_ns is None:
            self._start(loop, t_ns)
        loop.pending_close = True
        loop.last_update_ns = t_ns
        loop.just_updated = True

    def close(self, t_ns: int, loop: ThreadLoop | None = None) -> None:
        """The step in progress of ``loop`` (the calling thread's) ends at ``t_ns``; the next starts."""
        if loop is None:
            loop = self.mine()
        start = loop.start_ns
        if start is not None and t_ns >= start:
            if not self.agent.span("step", "step", start, t_ns, loop.index, tid=loop.tid):
                self._lost.append((loop.tid, loop.index, start, t_ns))  # the writer places its phases
            loop.recorded(start, t_ns)
            loop.index = next(self._next)
            primary = self.primary
            if primary is None or (not primary.steps and primary is not loop):
                self.primary = loop
        else:
            loop.discard()
        loop.pending_close = False
        if loop.index < 0:
            self._start(loop, t_ns)
        else:
            loop.start_ns = t_ns

    # holoprof.step() -----------------------------------------------------------------------------
    def mark(self) -> None:
        """Plain ``holoprof.step()``: the calling thread's step ends now, its next one starts now."""
        t = _perf_ns()
        loop = self.mine()
        self._trains(loop)
        loop.manual = True
        loop.pending_close = False
        if loop.start_ns is not None:
            self.close(t, loop)
        else:
            self._start(loop, t)

    def end_loop(self, t_ns: int) -> None:
        """The training loop ended (e.g. ``fit`` returned): close a pending step, open none."""
        loop = self.mine()
        if loop.pending_close and not loop.manual:
            self.close(t_ns, loop)
        loop.start_ns = None
        loop.discard()

    def finish(self, t_ns: int) -> None:
        """At exit, for every loop: a step whose update happened is closed where that update ended
        (what follows it, such as a final evaluation, is not part of a step); a half-done step is
        dropped."""
        for loop in list(self.loops):
            if loop.pending_close and not loop.manual:
                self.close(loop.last_update_ns or t_ns, loop)
            loop.start_ns = None
            loop.discard()

    # -- the writer's view ------------------------------------------------------------------------
    def indices(self) -> dict[int, int]:
        """Each loop's step in progress, by thread (read before the writer drains the spans: a step
        recorded before this is in the drain, or among the steps whose span was dropped)."""
        return {loop.tid: loop.index for loop in list(self.loops)}

    def count_kept(self, spans: list[tuple[Any, ...]], before: dict[int, int], final: bool) -> None:
        """Count the phases of ``spans`` (drained by the writer) of the threads that run a loop, from the
        start of the loop's first step: a phase of a thread's step counts as inside it when it starts
        in the step's window, else as outside steps; a phase whose step is not recorded (its thread's
        loop had gone past it before the drain, ``before``: :meth:`indices`; or the process ends)
        counts as outside. The steps whose span was dropped place their phases too. Runs on the
        writer only."""
        pending = self._pending
        lost, self._lost = self._lost, []
        for tid, _sid, _parent, kind, name, start, end, step, _attrs in spans:
            if kind == "phase":
                key = (tid, step)
                waiting = pending.get(key)
                if waiting is None:
                    pending[key] = [(name, start, end)]
                    continue
                waiting.append((name, start, end))
                if len(waiting) >= PENDING_PHASES:  # a step that goes on and on: its phases fold
                    self._fold(key, waiting)
            elif kind == "step":
                self._step_ended((tid, step), start, end)
        for tid, step, start, end in lost:
            self._step_ended((tid, step), start, end)
        now = self.indices()
        for key in list(pending):
            current = now.get(key[0], -1)
            if current < 0:  # no loop, or none started yet: before its start, not counted
                del pending[key]
                self._folded.pop(key, None)
            elif final or key[1] < before.get(key[0], -1):
                self._step_ended(key, 0, 0)

    def _step_ended(self, key: tuple[int, int], start: int, end: int) -> None:
        """Step ``key`` (thread, index) was recorded from ``start`` to ``end`` (or not: 0, 0): count the
        phases that waited for it, inside it those that start from ``start`` to before ``end``, else
        outside steps; those before the start of the thread's loop are not counted."""
        waiting = self._pending.pop(key, None)
        folded = self._folded.pop(key, None)
        if waiting is None and folded is None:
            return
        origin = next((loop.origin_ns for loop in list(self.loops) if loop.tid == key[0]), _NO_START)
        inside, outside = self._kept_of(key[0])
        for pname, p0, p1 in waiting or ():
            if p0 >= origin:
                _count(inside if start <= p0 < end else outside, pname, p1 - p0)
        for first, sums in folded or ():
            if first >= origin:
                _merge(inside if start <= first < end else outside, sums)

    def _fold(self, key: tuple[int, int], waiting: list[tuple[str, int, int]]) -> None:
        """Sum the phases waiting for step ``key`` by name, placed where the first of them starts
        (bounded memory for a long step or one never recorded, such as a loop that only evaluates):
        each fold is placed by its own first phase, so at most one fold's worth is misplaced."""
        sums: dict[str, list[int]] = {}
        for pname, p0, p1 in waiting:
            _count(sums, pname, p1 - p0)
        chunks = self._folded.setdefault(key, [])
        chunks.append((waiting[0][1], sums))
        if len(chunks) > FOLDS:  # the two oldest become one
            first, older = chunks.pop(0)
            _merge(older, chunks[0][1])
            chunks[0] = (first, older)
        waiting.clear()

    def _kept_of(self, tid: int) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        kept = self.kept.get(tid)
        if kept is None:
            kept = self.kept[tid] = ({}, {})
        return kept

    def counts(self, off: int) -> dict[str, Any] | None:
        """The exact counts of the loops that ran steps or epochs, by thread id (``None``: none yet)."""
        threads: dict[str, dict[str, Any]] = {}
        for loop in list(self.loops):
            if not loop.steps and not loop.epochs:
                continue
            key = str(loop.tid)
            c = loop.counts(off)
            threads[key] = _merge_counts(threads[key], c) if key in threads else c
        for key, c in threads.items():
            kept = self.kept.get(int(key))
            if kept is not None:
                _merge(c["phases"], kept[0])
                _merge(c["outside"], kept[1])
        return {"threads": threads} if threads else None
