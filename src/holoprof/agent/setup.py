"""Which collectors run, and post-import hooks that install framework collectors lazily.

Framework support is imported only when the job itself imports the framework: the torch collector
installs right after ``import torch`` finishes (or at once if torch is already imported).
"""

from __future__ import annotations

import gc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from holoprof.agent.core import Agent, Collector


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return,unused-ignore]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name: str) -> Any:  # resource readers, get_source, ...
        return getattr(self._loader, name)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs each ``hook(module)`` once right after the named module finishes importing.

    Several collectors may hook the same module (``torch``): hooks run in registration order, each
    guarded so that one failing hook does not stop the others.
    """

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._busy = threading.local()

    def add(self, name: str, hook: Callable[[ModuleType], None]) -> None:
        mod = sys.modules.get(name)
        if mod is not None:
            hook(mod)
        else:
            self.hooks.setdefault(name, []).append(hook)

    def _run(self, name: str, module: ModuleType) -> None:
        for hook in self.hooks.pop(name, []):
            try:
                hook(module)
            except Exception:
                pass  # each hook fails open on its own (collectors report through agent.fail)

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.hooks or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.name = None
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookedLoader(spec.loader, lambda m: self._run(fullname, m))
        return spec


_FINDER: PostImportFinder | None = None


def post_import_finder() -> PostImportFinder:
    global _FINDER
    if _FINDER is None:
        _FINDER = PostImportFinder()
        sys.meta_path.insert(0, _FINDER)
    return _FINDER


#: The always-on collectors, "module:Class", in installation order. A collector that cannot be
#: imported or built is reported once (fail open) and the others run.
COLLECTORS: list[str] = [
    "holoprof.collect.knobs:KnobCollector",
    "holoprof.collect.torch:TorchCollector",
    "holoprof.collect.checkpoints:CheckpointCollector",
    "holoprof.collect.tensorflow:TensorFlowCollector",
    "holoprof.collect.control:ControlCollector",
    "holoprof.collect.memory:MemoryCollector",
    "holoprof.collect.comm:CommCollector",
    "holoprof.collect.io_collector:IoCollector",
]


def default_collectors(agent: Agent) -> list[Collector]:
    """The always-on collectors for this process; ``options["disable"]`` lists names to skip."""
    disabled = set(agent.options.get("disable", []))
    collectors: list[Collector] = []
    for target in COLLECTORS:
        module_name, cls_name = target.split(":")
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
            if getattr(cls, "name", None) in disabled:
                continue
            collectors.append(cls(agent))
        except Exception as exc:
            agent.fail(module_name.rsplit(".", 1)[-1], exc)
    return collectors


# --- after the collectors are installed -------------------------------------------------------------
#: Agent option (default on): one full garbage collection right after ``import torch``.
OPTION_GC_RESET = "gc_reset_after_torch"


def reset_gc_clock(_module: ModuleType | None = None) -> None:
    """One full collection right after ``import torch`` (and the agent's torch hooks), once.

    CPython runs a full (generation 2) collection after a number of allocations, counted from the
    last one. The agent's own start-up allocations (its modules, the collectors, the hooks run at
    ``import torch``) move that count forward, so the job's next full collection comes earlier than
    in the untraced job. Its timing is a cliff: when it falls just before a ``DataLoader`` forks its
    workers, each worker inherits a count at the limit and runs a full collection of the whole
    inherited heap (all of torch's objects, ~170,000) in its first milliseconds, copying on write
    every page it touches: ~200 ms per worker and ~80 ms in the main process, in the first epoch
    only. A job without holoprof that keeps ~3,000 more objects alive pays exactly the same.

    Collecting once here, at the end of ``import torch`` (already a second or more), restarts the
    count from zero, so none of the agent's start-up allocations are left to pull the job's first
    full collection forward. It costs one full collection at import (tens of milliseconds, once per
    process that imports torch), does nothing when the job turned the collector off
    (``gc.disable()``), and is turned off with the agent option ``gc_reset_after_torch=False``. Registered by
    :func:`after_collectors`, after every collector's own torch hook, so their allocations are
    behind the reset too.
    """
    if gc.isenabled():
        gc.collect()


def after_collectors(agent: Agent) -> None:
    """Process-wide set-up once every collector is installed.

    The writer's raw chunk module is imported now: a worker forked before the first flush (a
    DataLoader's) would otherwise import it at its final flush, which the training loop waits for.
    """
    import holoprof.store.raw  # noqa: F401

    if agent.options.get(OPTION_GC_RESET, True) and "torch" not in sys.modules:
        post_import_finder().add("torch", reset_gc_clock)
