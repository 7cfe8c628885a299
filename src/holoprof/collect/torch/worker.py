"""A DataLoader worker started with "spawn": only what a worker needs.

Such a worker is a new interpreter: its agent starts at interpreter start-up, and the collectors that
wait for ``import torch`` would be installed when the worker imports torch, while it loads what its
parent sent (the main module, the dataset). A worker never trains: the training-step collectors
(phases, device times, memory, FLOPs, compile, communication) have nothing to record there, and
installing them cost every worker's start their modules and patches, and the full garbage collection
that their allocations pulled into it (tens of milliseconds, ``benchmarks/bench_startup.py``).

How a worker is told from other children: the traced parent sets ``HOLOPROF_LOADER_WORKERS`` to its
pid while a DataLoader iterator starts its workers (:func:`mark_worker_starts`); a child whose parent's
pid is there and which imports torch while multiprocessing loads what its parent sent is taken for a
worker (:func:`holoprof.collect.startup.loader_worker_start`), and installs :class:`LoaderWorkerCollector`
(its batch fetches) and the checkpoint collector (a dataset's ``torch.load``) in place of the torch
collectors. Once multiprocessing has read the process object, its target says for sure: a child that
does not run torch's worker loop (another thread of the parent started it meanwhile) gets the other
collectors before its target runs (:func:`unless_loader_worker`). Either way the child's first flush,
held since its start (:func:`holoprof.collect.startup.started_by_loader`), comes a flush interval after
that moment, not while it starts. A worker forked from its parent (the
default on Linux) is not concerned: it inherits its parent's collectors, already installed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from holoprof import model
from holoprof.agent.core import Agent, Collector
from holoprof.agent.setup import before_target
from holoprof.collect.torch.base import TorchImportCollector
from holoprof.collect.torch.fetch import FetchSpans


class LoaderWorkerCollector(TorchImportCollector):
    """The torch collector of a DataLoader worker started with "spawn": the batch fetches only."""

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self.fetches = FetchSpans(self)

    def _patch(self, torch: ModuleType) -> None:
        self.fetches.install(torch)
        self.agent.info["torch"] = {"patched": True, "loader_worker": True}

    def after_fork_child(self) -> None:
        self.fetches.reset()


def mark_worker_starts(col: Collector, dl_mod: ModuleType) -> None:
    """In the training process: ``HOLOPROF_LOADER_WORKERS`` is this process's pid while an iterator
    of ``torch.utils.data.dataloader`` starts its workers (``_MultiProcessingDataLoaderIter.__init__``),
    empty afterwards (its value changes; the variable is never removed, which a thread reading the
    environment at that moment could see half done)."""
    cls = getattr(dl_mod, "_MultiProcessingDataLoaderIter", None)
    if cls is None:
        return
    orig_init = cls.__init__

    def __init__(it: Any, *args: Any, **kwargs: Any) -> None:
        if not col.enabled:
            return orig_init(it, *args, **kwargs)
        before = os.environ.get(model.ENV_LOADER_WORKERS)
        os.environ[model.ENV_LOADER_WORKERS] = str(os.getpid())
        try:
            return orig_init(it, *args, **kwargs)
        finally:
            os.environ[model.ENV_LOADER_WORKERS] = before or ""

    col._set(cls, "__init__", __init__)


def runs_worker_loop(process: Any) -> bool:
    """Whether the multiprocessing process object ``process`` runs torch's DataLoader worker loop."""
    worker = sys.modules.get("torch.utils.data._utils.worker")
    loop = getattr(worker, "_worker_loop", None)
    return loop is not None and getattr(process, "_target", None) is loop


def unless_loader_worker(then: Callable[[], None], starting: Callable[[], None]) -> None:
    """Run ``then`` right before this multiprocessing child runs its target, unless that target is
    torch's DataLoader worker loop, and ``starting`` in either case (``BaseProcess._bootstrap``,
    patched once, for this call only)."""

    def before(process: Any) -> None:
        starting()
        if not runs_worker_loop(process):
            then()

    if not before_target(before):
        starting()
        then()
