"""One batch's loading work: the dataset fetchers (``_MapDatasetFetcher.fetch``,
``_IterableDatasetFetcher.fetch``) record an ``op`` span ``fetch`` per batch with its thread CPU time
(``cpu_ns``) and time spent waiting for a CPU (``runq_ns``) in every DataLoader worker; in the training
process (a loader without workers), on the batch waits that read those clocks, with the wait's readings.

The worker's side of the torch collector: a DataLoader worker started with "spawn" installs this
alone (:mod:`holoprof.collect.torch.worker`), the training process with the rest of the collector
(:mod:`holoprof.collect.torch.dataloader`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, Collector, now_ns

thread_time_ns = time.thread_time_ns

#: a batch wait's ``fetch`` while it waits for the fetch inside it to be timed
WANTED = (0, 0)


class RunQueue(threading.local):
    """This thread's time spent runnable but waiting for a CPU (Linux ``schedstat``), in ns: a fetch
    that waited for a core is told from one that waited for a file or a sleep. One ``pread`` of a file
    kept open per thread (a few microseconds); 0 where the kernel does not provide it. The process is
    the agent's (``agent.pid``, set again in a forked child): ``os.getpid`` is a system call."""

    fd = -1
    pid = 0

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def wait_ns(self) -> int:
        try:
            pid = self.agent.pid
            if self.fd < 0 or self.pid != pid:  # a forked child: the file is its parent's thread's
                self.fd, self.pid = os.open("/proc/thread-self/schedstat", os.O_RDONLY), pid
            return int(os.pread(self.fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return 0


class FetchSpans:
    """The fetchers' patches of collector ``col``, and the process whose DataLoader-worker SIGTERM
    handler is set (:meth:`reset` forgets it, after fork)."""

    def __init__(self, col: Collector, runq: RunQueue | None = None, nested: bool = False) -> None:
        self.col = col
        self.runq = runq or RunQueue(col.agent)
        #: the batch wait's patch records a fetch made inside it (the training process's, not a worker's)
        self.nested = nested
        self.torch: ModuleType | None = None
        self.term_pid = 0

    def reset(self) -> None:
        self.term_pid = 0

    def install(self, torch: ModuleType) -> None:
        """Patch the dataset fetchers of ``torch.utils.data``."""
        import torch.utils.data._utils.fetch as fetch_mod  # lazy: torch loads only when the job imports it

        self.torch = torch
        col = self.col
        agent = col.agent
        span = agent.span
        runq = self.runq

        def wrap_fetch(orig: Any) -> Any:
            def fetch(self_: Any, possibly_batched_index: Any) -> Any:
                if not col.enabled:
                    return orig(self_, possibly_batched_index)
                if self.term_pid != agent.pid:
                    self.worker_sigterm()
                tls = agent.tls  # read at each call: a forked child has its own
                if self.nested and tls.active == "data_wait":
                    # inside the batch wait of this thread (no workers): the fetch is nearly all of
                    # the wait (the sampler's next index and the wrapper's own bookkeeping are the
                    # rest). It is timed on the waits that read the thread's CPU and run queue
                    # (``WANTED``: the wait records this span with those readings, four system calls
                    # fewer per batch), which are the fetches the input model reads; on the other
                    # waits the wait's own span is the batch's time
                    if tls.fetch is None:
                        return orig(self_, possibly_batched_index)
                    t0 = now_ns()
                    try:
                        return orig(self_, possibly_batched_index)
                    finally:
                        tls.fetch = (t0, now_ns())
                t0, c0, q0 = now_ns(), thread_time_ns(), runq.wait_ns()
                try:
                    return orig(self_, possibly_batched_index)
                finally:
                    try:
                        attrs = {"cpu_ns": thread_time_ns() - c0, "runq_ns": runq.wait_ns() - q0}
                        span("op", "fetch", t0, now_ns(), -1, attrs)
                    except Exception as exc:
                        agent.fail(col, exc)

            fetch.__wrapped__ = orig  # type: ignore[attr-defined]
            return fetch

        for cls_name in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
            fcls = getattr(fetch_mod, cls_name, None)
            if fcls is not None and "fetch" in vars(fcls):
                col._set(fcls, "fetch", wrap_fetch(fcls.fetch))

    def worker_sigterm(self) -> None:
        """In a DataLoader worker, flush what it recorded when its parent ends it with SIGTERM.

        PyTorch's workers answer SIGTERM with a C handler that calls ``_exit(0)`` at once: that is how
        the parent's multiprocessing ends persistent workers at exit, and the worker's records were
        lost. A Python handler does the same exit through ``os._exit``, which flushes first."""
        self.term_pid = self.col.agent.pid
        data = getattr(self.torch, "utils", None)
        info = getattr(getattr(data, "data", None), "get_worker_info", None)
        if info is None or info() is None or threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum: int, frame: Any) -> None:
            os._exit(0)  # as PyTorch's own handler; the agent's os._exit flushes before it exits

        signal.signal(signal.SIGTERM, on_term)
