"""Communication a thread waits for inside forward, backward or the optimizer step: its own phase.

A training phase is a call the job makes (the outermost module call, ``loss.backward()``,
``optimizer.step()``); what runs inside it belongs to it — except the time its thread spends waiting
for communication: a synchronous collective made there (FSDP's all-gathers before a layer runs and
reduce-scatters after its gradients are ready, SyncBatchNorm's), ``Work.wait()`` of an asynchronous
one, a functional collective's wait (DTensor). The comm collector notes each such wait
(:func:`note_wait`) on the thread's :class:`~holoprof.agent.core.PhaseState`; when the phase ends,
:func:`phase_spans` records it in pieces: the phase, less those intervals, which become
``communication`` phases (``{"op": <call>, "in": <phase>}``). The phases of a step stay disjoint, so
the step breakdown and the communication section's exposed time are one figure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from holoprof.agent.core import Agent, PhaseState

#: The phases out of which waits for communication are carved.
CARVED = frozenset({"forward", "backward", "optimizer"})


def note_wait(tls: PhaseState, t0: int, t1: int, op: str) -> None:
    """This thread waited for communication ``op`` from ``t0`` to ``t1`` inside its open phase."""
    waits = tls.waits
    if waits is None:
        tls.waits = [(t0, t1, op)]
    else:
        waits.append((t0, t1, op))


def phase_spans(
    agent: Agent,
    name: str,
    t0: int,
    t1: int,
    step: int,
    tail: tuple[int, str] | None = None,
    record: Callable[[str, int, int, int], None] | None = None,
) -> None:
    """Record phase ``name`` of this thread from ``t0`` to ``t1``: the waits noted inside it (taken
    off the thread's state) and, with ``tail`` = (start, op), the end of the phase from ``start`` on
    are ``communication`` phases; the rest is ``name``, recorded by ``record(name, start, end, step)``
    (the torch state's, which cuts compilations out in turn) or as one span."""
    tls = agent.tls
    waits = tls.waits
    if waits is not None:
        tls.waits = None
    if record is None:
        record = _span_of(agent)
    if not waits and tail is None:
        record(name, t0, t1, step)
        return
    cuts: list[tuple[int, int, str]] = []
    for a, b, op in sorted(waits or ()):
        a, b = max(a, t0), min(b, t1)  # a wait noted before this phase began is not its own
        if b <= a:
            continue
        if cuts and a <= cuts[-1][1]:
            pa, pb, pop = cuts[-1]
            cuts[-1] = (pa, max(pb, b), pop)
        else:
            cuts.append((a, b, op))
    if tail is not None and t0 < tail[0] < t1:
        start = tail[0]
        cuts = [(a, min(b, start), op) for a, b, op in cuts if a < start]
        cuts.append((start, t1, tail[1]))
    at = t0
    attrs: dict[str, Any]
    for a, b, op in cuts:
        if a > at:
            record(name, at, a, step)
        attrs = {"op": op, "in": name}
        agent.span("phase", "communication", a, b, step, attrs)
        at = b
    if t1 > at:
        record(name, at, t1, step)


def _span_of(agent: Agent) -> Callable[[str, int, int, int], None]:
    def record(name: str, t0: int, t1: int, step: int) -> None:
        agent.span("phase", name, t0, t1, step)

    return record
