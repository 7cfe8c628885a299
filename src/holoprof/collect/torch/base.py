"""What every torch collector does: wait for the job's ``import torch``, then patch, failing open."""

from __future__ import annotations

from types import ModuleType

from holoprof.agent.core import Collector
from holoprof.agent.setup import post_import_finder


class TorchImportCollector(Collector):
    """A collector whose patches go in when the job imports torch (:meth:`_patch`); one that raises
    is turned off and named once, the job unchanged."""

    name = "torch"
    default_fault = "forward"

    def install(self) -> None:
        post_import_finder().add("torch", self._on_torch)

    def _on_torch(self, torch: ModuleType) -> None:
        if not self.enabled:
            return
        try:
            self._patch(torch)
        except Exception as exc:
            self.agent.fail(self, exc)

    def _patch(self, torch: ModuleType) -> None:
        raise NotImplementedError
