"""Eager iteration over TensorFlow datasets: ``data_wait``, and the epochs it makes.

* ``OwnedIterator.__next__`` (``for batch in dataset`` or ``next(iterator)`` over a ``tf.data``
  dataset, eagerly) and ``DistributedIteratorBase.get_next`` (``next()`` on the iterator of a dataset
  distributed by ``strategy.experimental_distribute_dataset`` or
  ``strategy.distribute_datasets_from_function``: its ``__next__`` calls ``get_next``): each fetch is
  ``data_wait`` and opens a step.
* An iteration that runs out (``StopIteration``, or ``OutOfRangeError`` from ``get_next``) is an
  epoch, from its first fetch to its end, when a training step was completed while it ran: a pass over
  an evaluation dataset, or a loop that only reads, is no epoch.

Fetches made inside Keras's calls (``fit`` iterates its own data), inside a phase, or while a
``tf.function`` is traced pass straight through.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from holoprof.agent.core import Collector, now_ns

#: iterations whose first fetch is remembered at a time (dead ones are dropped first)
MAX_ITERATIONS = 64


def _strong(obj: Any) -> Callable[[], Any]:
    return lambda: obj


class InputFetches:
    """The fetch wrappers, and the first fetch of each iteration still running (for its epoch)."""

    def __init__(self, col: Collector, in_keras: Callable[[], bool]) -> None:
        self.col = col
        self.in_keras = in_keras  # a Keras call (fit, evaluate, predict) is in progress
        self.reset()

    def reset(self) -> None:
        self._first: dict[int, tuple[Callable[[], Any], int]] = {}  # id(iterator) -> (ref, first fetch)
        self.epochs = 0

    def wrap(
        self,
        cls: Any,
        meth: str,
        inside_function: Callable[[], bool],
        end_errors: tuple[type[BaseException], ...],
    ) -> None:
        """``cls.meth`` (a fetch) is ``data_wait``; raising one of ``end_errors`` ends the iteration."""
        col = self.col
        agent = col.agent
        steps = agent.steps
        orig = getattr(cls, meth)
        phase = agent.span
        in_keras = self.in_keras

        def fetch(it: Any, *args: Any, **kwargs: Any) -> Any:
            t = agent.tls
            if t.active is not None or not col.enabled or in_keras() or inside_function():
                return orig(it, *args, **kwargs)
            t0 = now_ns()
            try:
                if col.fault_at:
                    col.inject("tf_data")
                steps.opener(t0)
                self._begin(it, t0)
            except Exception as exc:
                agent.fail(col, exc)
            t.active = "data_wait"
            ended = False
            try:
                return orig(it, *args, **kwargs)
            except end_errors:
                ended = True
                raise
            finally:
                t.active = None
                try:
                    t1 = now_ns()
                    phase("phase", "data_wait", t0, t1, steps.index)
                    if ended:
                        self._end(it, t1)
                except Exception as exc:
                    agent.fail(col, exc)

        fetch.__wrapped__ = orig  # type: ignore[attr-defined]
        col._set(cls, meth, fetch)

    def _begin(self, it: Any, t0: int) -> None:
        first = self._first
        known = first.get(id(it))
        if known is not None and known[0]() is it:
            return
        if len(first) >= MAX_ITERATIONS:
            dead = [k for k, (r, _) in first.items() if r() is None]
            for k in dead or list(first)[:1]:
                del first[k]
        try:
            ref: Callable[[], Any] = weakref.ref(it)
        except TypeError:  # not weakly referenceable: held until its end (at most MAX_ITERATIONS)
            ref = _strong(it)
        first[id(it)] = (ref, t0)

    def _end(self, it: Any, t1: int) -> None:
        known = self._first.pop(id(it), None)
        if known is None or known[0]() is not it:
            return
        agent = self.col.agent
        start = known[1]
        if agent.steps.last_update_ns > start:  # a training step completed during this iteration
            attrs = {"epoch": self.epochs, "framework": "tensorflow"}
            agent.span("epoch", "epoch", start, t1, -1, attrs)
            self.epochs += 1
