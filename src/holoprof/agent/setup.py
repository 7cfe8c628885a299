"""Which collectors run, and post-import hooks that install framework collectors lazily.

Framework support is imported only when the job itself imports the framework: the torch collector
installs right after ``import torch`` finishes (or at once if torch is already imported).
"""

from __future__ import annotations

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
    "holoprof.collect.torch:TorchCollector",
    "holoprof.collect.tensorflow:TensorFlowCollector",
    "holoprof.collect.control:ControlCollector",
    "holoprof.collect.memory:MemoryCollector",
    "holoprof.collect.comm:CommCollector",
    "holoprof.collect.io_py:IoCollector",
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
