"""The torch collector: installs the patches of :mod:`holoprof.collect.torch` when torch is imported,
over one shared state, and undoes them (``uninstall``) or turns them off (fail open) as one."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent
from holoprof.collect.torch.backward import install_backward
from holoprof.collect.torch.base import TorchImportCollector
from holoprof.collect.torch.dataloader import LoaderPhases
from holoprof.collect.torch.device import DeviceTimes
from holoprof.collect.torch.distributed import install_distributed
from holoprof.collect.torch.forward import install_forward
from holoprof.collect.torch.optimizer import OptimizerPhases
from holoprof.collect.torch.state import TorchState
from holoprof.collect.torch.worker import mark_worker_starts
from holoprof.collect.torch.zero_grad import install_zero_grad


def torch_state(agent: Agent) -> TorchState | None:
    """The torch collector's shared state in this process (where other collectors observe the forward),
    or None when the torch collector is not running."""
    for c in agent.collectors:
        if isinstance(c, TorchCollector) and c.enabled:
            return c._state
    return None


class TorchCollector(TorchImportCollector):
    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self._state = TorchState(agent)
        self._device = DeviceTimes(agent)
        self._optimizer = OptimizerPhases(self, self._state, self._device)
        self._loader = LoaderPhases(self, self._state)

    def after_fork_child(self) -> None:
        self._state.reset()
        self._device.reset()
        self._optimizer.reset()
        self._loader.reset()

    def _patch(self, torch: ModuleType) -> None:
        """Install every patch, in this order (``turn_off`` undoes them in reverse)."""
        # torch's submodules that the installers patch (torch is loaded only when the job imports
        # it), all loaded before the first patch: one that fails to load leaves none behind
        # lazy: the job's framework, imported by the job, never by the agent
        import torch.autograd
        import torch.optim.optimizer as optim_mod
        import torch.utils.data.dataloader as dl_mod

        st, dev = self._state, self._device
        dev.use(torch)
        install_forward(self, st, dev, torch)
        install_backward(self, st, dev, torch)
        self._optimizer.install(optim_mod)
        install_zero_grad(self, st, torch, optim_mod)
        self._loader.install(torch, dl_mod)
        mark_worker_starts(self, dl_mod)
        install_distributed(self, torch)
        self.agent.pollers.append(self._poll_device)
        self.agent.info["torch"] = {"patched": True}

    def _poll_device(self) -> list[tuple[str, dict[str, list[Any]]]]:
        # a method of the collector: a poller that raises turns off the collector it is bound to
        return self._device.poll()

    def finish(self) -> None:
        self._state.resolve_all()
