"""Post-import hooks that install framework collectors lazily, and process-wide set-up.

Framework support is imported only when the job itself imports the framework: the torch collector
installs right after ``import torch`` finishes (or at once if torch is already imported).
"""

from __future__ import annotations

import gc
import os
import sys
import threading

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (loaded in every traced process)
if TYPE_CHECKING:
    from collections.abc import Callable
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any


class _HookedLoader:
    """The module's own loader, then the hook. A loader by its methods, as the import system asks
    (``importlib.abc``, the base class, imports ``importlib.resources`` and ``pathlib``: ~10 ms in every
    process)."""

    def __init__(self, loader: Any, hook: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return,unused-ignore]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name: str) -> Any:  # resource readers, get_source, ...
        return getattr(self._loader, name)


class PostImportFinder:
    """Runs each ``hook(module)`` once right after the named module finishes importing.

    Several collectors may hook the same module (``torch``): hooks run in registration order, each
    guarded so that one failing hook does not stop the others. A meta path finder by its
    ``find_spec``, which asks the finders after it for the module's spec and wraps its loader.
    """

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._busy = threading.local()
        #: modules whose loader is wrapped and still running: a hook added meanwhile (while ``keras``
        #: imports ``tensorflow`` half-way through its own import) waits for the module to finish
        self._importing: set[str] = set()

    def add(self, name: str, hook: Callable[[ModuleType], None]) -> None:
        mod = sys.modules.get(name)
        if mod is not None and name not in self._importing:
            hook(mod)
        else:
            self.hooks.setdefault(name, []).append(hook)

    def _run(self, name: str, module: ModuleType) -> None:
        self._importing.discard(name)
        for hook in self.hooks.pop(name, []):
            try:
                hook(module)
            except Exception:
                pass  # each hook fails open on its own (collectors report through agent.fail)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if fullname not in self.hooks or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname
        spec = None
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.name = None
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookedLoader(spec.loader, lambda m: self._run(fullname, m))
        self._importing.add(fullname)
        return spec


_FINDER: PostImportFinder | None = None


def post_import_finder() -> PostImportFinder:
    global _FINDER
    if _FINDER is None:
        _FINDER = PostImportFinder()
        sys.meta_path.insert(0, _FINDER)
    return _FINDER


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

    A multiprocessing child that imports torch while it loads what its parent sent (a DataLoader
    worker started with "spawn" or "forkserver", a ``torch.multiprocessing.spawn`` rank) collects
    before its first fork instead: the cliff is a fork's, and a worker, which never forks, is spared a
    full collection (tens to hundreds of milliseconds) at every start.
    """
    if not gc.isenabled():
        return
    if loading_from_parent():
        _collect_before_first_fork()
    else:
        gc.collect()


def loading_from_parent() -> bool:
    """Whether this is a multiprocessing child still unpickling its process object (multiprocessing
    marks the current process ``_inheriting`` meanwhile)."""
    mp = sys.modules.get("multiprocessing.process")
    try:
        return mp is not None and bool(getattr(mp.current_process(), "_inheriting", False))
    except Exception:
        return False


def before_target(fn: Callable[[Any], None]) -> bool:
    """Run ``fn(process)`` once, right before this multiprocessing child runs its process object's
    target (``BaseProcess._bootstrap``, patched for that one call; ``fn`` fails open). False, and nothing
    done, when multiprocessing is not loaded."""
    mpp = sys.modules.get("multiprocessing.process")
    if mpp is None:
        return False
    cls = mpp.BaseProcess
    orig = cls.__dict__["_bootstrap"]

    def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
        cls._bootstrap = orig
        try:
            fn(self)
        except Exception:
            pass  # never in the way of the job's process
        return orig(self, *args, **kwargs)

    cls._bootstrap = _bootstrap
    return True


_FORK_RESET = {"armed": False, "done": False}


def _collect_before_first_fork() -> None:
    def before_fork() -> None:
        if not _FORK_RESET["done"]:
            _FORK_RESET["done"] = True
            if gc.isenabled():
                gc.collect()

    if not _FORK_RESET["armed"] and hasattr(os, "register_at_fork"):
        _FORK_RESET["armed"] = True
        os.register_at_fork(before=before_fork)
