"""``data_wait`` and batch loading: ``_BaseDataLoaderIter.__next__`` and the dataset fetchers.

``__next__`` is ``data_wait``; a fetch whose batch feeds an eval forward counts as ``eval``; the end
of a training loader is an epoch boundary. Its attributes carry the CPU time of the waiting thread
(``cpu_ns``: the loading itself without workers, receiving a batch with them) and its run-queue wait
(``runq_ns``), and, when the wait began, the process's CPU time (``proc_cpu_ns``), the thread's
(``thread_cpu_ns``) and its run-queue wait so far (``thread_runq_ns``), which the input-pipeline
model turns into CPU per step and the share of a core the training thread got; and the process's CPU
time during the wait (``proc_wait_cpu_ns``): less the waiting thread's own, what the process's other
threads burnt meanwhile (torch's idle OpenMP threads spin there).

Those readings are system calls (six per batch, a few microseconds each inside a training loop), so
a thread's first :data:`READ_ALL` batch waits take them all, and after that two consecutive waits in
every :data:`READ_EVERY` (a pair: what the thread did between two waits is a difference of readings of
consecutive waits); a wait with readings carries its number among the thread's waits (``wait_n``).
The model takes medians over the waits read, each later one weighed by the waits it stands for.

The dataset fetchers record an ``op`` span ``fetch`` per batch in every DataLoader worker
(:mod:`holoprof.collect.torch.fetch`); in the training process (a loader without workers) a fetch is
recorded inside the batch waits that take the readings, with them (the input model reads those); on
the other waits the wait's own span is the batch's time.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from holoprof import model
from holoprof.agent.core import Collector, now_ns
from holoprof.collect.torch.fetch import WANTED, FetchSpans, RunQueue
from holoprof.collect.torch.state import TorchState
from holoprof.collect.util import usable_cores

thread_time_ns = time.thread_time_ns
process_time_ns = time.process_time_ns

#: a thread's first batch waits, which all read the CPU clocks and the run queue
READ_ALL = model.BATCH_WAITS_READ_ALL
#: after those, the first two waits of every this many read them
READ_EVERY = model.BATCH_WAITS_READ_EVERY


class LoaderPhases:
    """The loaders seen so far and the length of their current iterators, and the patches that record
    batch waits and fetches (:class:`FetchSpans`); :meth:`reset` forgets them (after fork)."""

    def __init__(self, col: Collector, st: TorchState) -> None:
        self.col = col
        self.st = st
        self.torch: ModuleType | None = None
        self.fetches = FetchSpans(col, nested=True)
        self.reset()

    def reset(self) -> None:
        self.fetches.reset()
        self.seen_loaders: set[int] = set()
        self.iter_len: dict[int, tuple[int, int]] = {}  # loader key -> (iterator id, batches)

    def install(self, torch: ModuleType, dl_mod: ModuleType) -> None:
        """Patch ``_BaseDataLoaderIter.__next__`` (of ``torch.utils.data.dataloader``), then the fetchers."""
        self.torch = torch
        self._install_next(dl_mod, self.fetches.runq)
        self.fetches.install(torch)

    def _install_next(self, dl_mod: ModuleType, runq: RunQueue) -> None:
        col, st = self.col, self.st
        agent = col.agent
        steps = agent.steps
        base_iter = dl_mod._BaseDataLoaderIter
        orig_next = base_iter.__next__

        def __next__(it: Any) -> Any:
            t = st.tls
            if t.active is not None or not col.enabled:
                return orig_next(it)
            try:
                t0 = now_ns()
                if col.fault_at:
                    col.inject("dataloader")
                key = id(it._dataset)
                if key not in self.seen_loaders:
                    self.new_loader(it, key, t0)
                if st.pending:
                    st.resolve_pending(None)
                loop = t.loop
                if loop is not None:
                    loop.just_updated = False
                    if loop.index >= 0 and key in st.train_loaders:
                        steps.opener(t0, loop)  # a training loader's fetch in a thread that runs a loop
                n = t.batch_waits
                t.batch_waits = n + 1
                if n < READ_ALL or n % READ_EVERY < 2:
                    t.fetch = WANTED  # the fetch inside is timed, and recorded with these readings
                    pc0 = process_time_ns()
                    c0 = thread_time_ns()
                    q0 = runq.wait_ns()
                else:
                    n = -1
            except Exception as exc:
                agent.fail(col, exc)
                return orig_next(it)
            t.active = "data_wait"
            stop = False
            try:
                return orig_next(it)
            except StopIteration:
                stop = True
                raise
            finally:
                t.active = None
                try:
                    t1 = now_ns()
                    cpu = None
                    if n >= 0:
                        c1, q1 = thread_time_ns(), runq.wait_ns()
                        cpu = (c1 - c0, pc0, c0, q1 - q0, q0, process_time_ns() - pc0, n)
                    st.pending[t.tid] = (t0, t1, key, cpu)  # named by what uses the batch
                    if t.fetch is not None:  # the fetch inside this wait, with the wait's readings
                        f0, f1 = t.fetch
                        t.fetch = None
                        if cpu is not None and f1:
                            fattrs = {"cpu_ns": cpu[0], "runq_ns": cpu[3], "wait_n": n}
                            agent.span("op", "fetch", f0, f1, -1, fattrs)
                    if stop:
                        st.end_epoch(key, t1)
                    else:
                        st.epoch_start.setdefault(key, t0)
                        if self.last_batch(it, key):
                            st.end_epoch(key, t1)
                except Exception as exc:
                    agent.fail(col, exc)

        col._set(base_iter, "__next__", __next__)

    def new_loader(self, it: Any, key: int, t0: int) -> None:
        """A loader's first batch: an ``op`` span ``dataloader`` with its settings and the machine."""
        self.seen_loaders.add(key)
        attrs: dict[str, Any] = {
            "loader": key,
            "dataset": type(it._dataset).__name__,
            "read_every": READ_EVERY,
        }
        for a in ("_num_workers", "_prefetch_factor", "_pin_memory", "_persistent_workers", "_timeout"):
            if hasattr(it, a):
                attrs[a.lstrip("_")] = getattr(it, a)
        bs = getattr(getattr(it, "_index_sampler", None), "batch_size", None)
        if bs is not None:
            attrs["batch_size"] = bs
        ctx = getattr(it, "_multiprocessing_context", None)
        if ctx is not None:
            attrs["multiprocessing_context"] = getattr(ctx, "_name", str(ctx))
        # the machine the input-pipeline model needs: usable cores, torch threads, a GPU in use
        attrs.update(usable_cores())
        torch = self.torch
        if torch is not None:
            attrs["torch_threads"] = torch.get_num_threads()
            attrs["gpu"] = bool(torch.cuda.is_initialized())
        self.col.agent.span("op", "dataloader", t0, t0, -1, attrs)

    def last_batch(self, it: Any, key: int) -> bool:
        """The iterator of a map-style dataset has just yielded its last batch: its epoch is over.
        Loops that stop at the loader's length (Lightning, Hugging Face) never ask for more, so the
        ``StopIteration`` that ends a plain ``for`` loop's epoch never comes. The length is read once
        per iterator (``len`` of its batch sampler, as the iterator itself computes it)."""
        if getattr(it, "_dataset_kind", None) != 0:  # torch's _DatasetKind.Map
            return False
        known = self.iter_len.get(key)
        if known is None or known[0] != id(it):
            try:
                known = (id(it), len(it._index_sampler))
            except TypeError:  # a sampler without a length
                known = (id(it), 0)
            self.iter_len[key] = known
        return 0 < known[1] <= getattr(it, "_num_yielded", 0)
