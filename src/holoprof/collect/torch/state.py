"""The state the torch installers share: the thread's open phase, the batch wait that waits for its
use to be named, which loaders train and which evaluate, and the epochs they make.

A batch wait (``data_wait``) is recorded once the next activity says what it was for: a training
forward (or ``zero_grad``, or an optimizer step with a closure) makes its loader a training loader
and the wait ``data_wait``; an eval forward makes it an eval loader and the wait ``eval``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from holoprof.agent.core import Agent

#: A batch wait not yet named: (start, end, loader, (cpu, process cpu at start, thread cpu at start,
#: run-queue wait, at start, process cpu during the wait, the wait's number in its thread), or None
#: for a wait that read no clock).
Pending = tuple[int, int, int, tuple[int, int, int, int, int, int, int] | None]


class ForwardObserver(Protocol):
    """What another collector runs around the outermost training forward of a thread (on the steps it
    measures): ``begin`` before the module call, ``end`` with its output after it. Each catches its own
    errors. Module calls inside ``torch.compile``'s regions and inside backward (activation
    checkpointing's recomputation) never reach an observer."""

    def begin(self, module: Any, args: tuple[Any, ...]) -> None: ...

    def end(self, out: Any) -> None: ...


class NestedObserver(Protocol):
    """Wraps the module calls nested in a measured training forward (the memory collector's per-layer
    attribution, on the few steps that record it)."""

    def call(self, orig: Callable[..., Any], module: Any, args: Any, kwargs: Any) -> Any: ...


class OptimizerObserver(Protocol):
    """What another collector runs around an optimizer step that torch's global optimizer step hooks
    do not see (a Keras optimizer on the torch backend), given a view of that optimizer that reads as
    a torch one (``param_groups``, ``state``). Each catches its own errors."""

    def step_begins(self, optimizer: Any) -> None: ...

    def step_ends(self, optimizer: Any) -> None: ...


#: A watcher's ``due`` when it needs no optimizer step any more.
NEVER = 1 << 62


class StepWatcher(Protocol):
    """Another collector that acts around optimizer steps on a few steps only (the memory collector's
    sampled steps, the FLOP counter's step, the layer sampler's): the torch collector's own optimizer
    step hooks call it on the steps from ``due`` on (a step index; :data:`NEVER`: none), so that
    the steps it does not measure cost one comparison, not a hook of its own. It changes ``due``
    through :meth:`TorchState.schedule`. Each catches its own errors (a ``SystemExit`` it raises on
    purpose goes through to the job)."""

    due: int

    def opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None: ...

    def opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None: ...


class TorchState:
    """One process's shared state of the torch collector; :meth:`reset` makes it fresh (after fork).

    A batch wait belongs to the thread that fetched the batch: a training forward claims its own
    thread's, or, when its thread fetched none, that of a thread that runs no training loop (a thread
    that only fetches batches for it), so that threads that each train a model never take each
    other's batches."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        #: observers of the outermost training forward (empty on the steps no collector measures)
        self.observers: list[ForwardObserver] = []
        #: when the last outermost forward (or eval) call began: the start of its phase
        self.forward_t0 = 0
        #: the observer of nested module calls, while one measures them
        self.nested: NestedObserver | None = None
        #: observers of the optimizer steps that torch's optimizer hooks do not see
        self.optimizer_observers: list[OptimizerObserver] = []
        #: torch.compile's compilations (start, end) that ran inside a phase of the loop and are not
        #: yet cut out of it (the compile collector appends them; :meth:`phase` takes them)
        self.compile_cuts: list[tuple[int, int]] = []
        #: the collectors called around optimizer steps from their ``due`` step on
        self.watchers: list[StepWatcher] = []
        #: the smallest ``due`` of the watchers: the step index from which a hook calls them
        self.watch_due = NEVER
        self.reset()

    def watch(self, watcher: StepWatcher) -> None:
        """Call ``watcher`` around the optimizer steps of its ``due`` steps."""
        if watcher not in self.watchers:
            self.watchers.append(watcher)
        self.rewatch()

    def unwatch(self, watcher: StepWatcher) -> None:
        if watcher in self.watchers:
            self.watchers.remove(watcher)
        self.rewatch()

    def rewatch(self) -> None:
        """A watcher's ``due`` changed."""
        self.watch_due = min((w.due for w in self.watchers), default=NEVER)

    def schedule(self, watcher: StepWatcher, due: int) -> None:
        """Call ``watcher`` from step ``due`` on (:data:`NEVER`: no more)."""
        watcher.due = due
        self.rewatch()

    def call_watchers(self, post: bool, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Before (``post`` False) or after an optimizer step of the calling thread: the watchers due at
        its step."""
        index = self.agent.steps.index
        if index < self.watch_due:
            return
        for w in list(self.watchers):
            if w.due <= index:
                if post:
                    w.opt_post(optimizer, args, kwargs)
                else:
                    w.opt_pre(optimizer, args, kwargs)

    def reset(self) -> None:
        self.tls = self.agent.tls
        self.pending: dict[int, Pending] = {}  # fetching thread's id -> its batch wait not yet named
        self.loader_attrs: dict[int, dict[str, int]] = {}  # loader key -> the attributes of its waits
        self.train_loaders: set[int] = set()
        self.eval_loaders: set[int] = set()
        self.epoch_start: dict[int, int] = {}
        self.epochs = 0
        self.unclaimed_epochs: dict[int, tuple[int, int]] = {}  # loader key -> (start, end)
        #: framework loops in progress that count the epochs themselves (Keras's ``fit`` on the torch
        #: backend, whose callback sees each epoch): the end of a loader is no epoch meanwhile
        self.loop_epochs = 0

    def phase(self, name: str, t0: int, t1: int, step: int, attrs: dict[str, Any] | None = None) -> None:
        """Record the phase ``name`` from ``t0`` to ``t1``, less the compilations that ran inside it,
        which are recorded as ``compile`` phases (so that the phases of a step never overlap)."""
        cuts = self.compile_cuts
        if not cuts:
            self.agent.span("phase", name, t0, t1, step, attrs)
            return
        mine = sorted(c for c in cuts if c[0] < t1 and c[1] > t0)
        self.compile_cuts = [c for c in cuts if c[0] >= t1]  # later ones wait; earlier ones are stale
        span = self.agent.span
        pos = t0
        for c0, c1 in mine:
            c0, c1 = max(c0, pos), min(c1, t1)
            if c0 > pos:
                span("phase", name, pos, c0, step, attrs)
            if c1 > c0:
                span("phase", "compile", c0, c1, step, {"in": name})
                pos = c1
        if t1 > pos:
            span("phase", name, pos, t1, step, attrs)

    def claim(self) -> Pending | None:
        """The batch wait a training or eval forward of the calling thread names: its own, else one of a
        thread that runs no training loop."""
        pend = self.pending.pop(self.tls.tid, None)
        if pend is None and self.pending:
            steps = self.agent.steps
            for tid in list(self.pending):
                if not steps.runs(tid):
                    pend = self.pending.pop(tid, None)
                    if pend is not None:
                        break
        return pend

    def begin_forward(self, training: bool, t0: int) -> None:
        self.forward_t0 = t0
        steps = self.agent.steps
        t = self.tls
        loop = t.loop
        if loop is not None:
            loop.just_updated = False
        pend = None
        if self.pending:
            pend = self.pending.pop(t.tid, None)
            if pend is None:
                pend = self.claim()
        if training:
            if pend is not None and pend[2] not in self.eval_loaders:
                self.train_loaders.add(pend[2])
                steps.opener(pend[0], loop)
                if self.unclaimed_epochs:
                    ended = self.unclaimed_epochs.pop(pend[2], None)
                    if ended is not None:  # its epoch ended with the batch that made it a training loader
                        self.epoch_span(pend[2], *ended)
            else:
                steps.opener(t0, loop)
            if pend is not None:
                self.resolve(pend, "data_wait")
        else:
            if pend is not None and pend[2] not in self.train_loaders:
                self.eval_loaders.add(pend[2])
            self.resolve(pend, "eval")

    def resolve_pending(self, label: str | None) -> None:
        """Record the calling thread's batch wait not yet named (as ``label``, or as its loader says)."""
        if self.pending:
            self.resolve(self.pending.pop(self.tls.tid, None), label)

    def resolve_all(self) -> None:
        """Record every thread's batch wait not yet named (at exit)."""
        for tid in list(self.pending):
            self.resolve(self.pending.pop(tid, None), None)

    def resolve(self, pend: Pending | None, label: str | None) -> None:
        if pend is None:
            return
        t0, t1, key, cpu = pend
        if label is None or (label == "data_wait" and key in self.eval_loaders):
            label = "eval" if key in self.eval_loaders else "data_wait"
        attrs: dict[str, int] | None
        if cpu is None:  # most waits: one attributes dictionary per loader, never changed
            attrs = self.loader_attrs.get(key)
            if attrs is None:
                attrs = self.loader_attrs[key] = {"loader": key}
        else:
            attrs = {
                "loader": key,
                "cpu_ns": cpu[0],
                "proc_cpu_ns": cpu[1],
                "thread_cpu_ns": cpu[2],
                "runq_ns": cpu[3],
                "thread_runq_ns": cpu[4],
                "proc_wait_cpu_ns": cpu[5],
                "wait_n": cpu[6],
            }
        self.agent.span("phase", label, t0, t1, self.agent.steps.index, attrs)

    def end_epoch(self, key: int, t1: int) -> None:
        start = self.epoch_start.pop(key, None)
        if start is None or self.loop_epochs:
            return
        if key in self.train_loaders:
            self.epoch_span(key, start, t1)
        elif key not in self.eval_loaders:  # not known yet (a one-batch epoch): its use decides
            self.unclaimed_epochs[key] = (start, t1)

    def epoch_span(self, key: int, start: int, t1: int) -> None:
        self.agent.span("epoch", "epoch", start, t1, -1, {"epoch": self.epochs, "loader": key})
        self.epochs += 1
