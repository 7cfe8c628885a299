"""The memory snapshot of a phase boundary of a measured step: one span and the ``mem.*`` samples.

Each snapshot is one span (kind ``op``, name ``memory``) with the categories in its attributes, plus
samples ``mem.<category>_bytes``. ``other`` is the rest of the process's memory: on a GPU, memory
reserved by the caching allocator that no category accounts for; on the CPU, the resident memory not
attributed to tensors.
"""

from __future__ import annotations

from typing import Any

from holoprof.agent.core import now_ns
from holoprof.collect.memory_accounts import CATEGORIES, TensorAccounts
from holoprof.collect.memory_hooks import ForwardTracker, Owner, cuda_index
from holoprof.collect.memory_process import cpu_limit_bytes, rss_bytes
from holoprof.collect.memory_schedule import is_sampled

_SAMPLE_NAMES: tuple[tuple[str, str], ...] = tuple((c, f"mem.{c}_bytes") for c in CATEGORIES)


class PhaseSnapshots:
    """Takes the snapshots: categories from the accounts, ``other`` and the limit from the device."""

    def __init__(self, owner: Owner, tracker: ForwardTracker, accounts: TensorAccounts) -> None:
        self.owner = owner
        self.tracker = tracker
        self.accounts = accounts
        self.reset()

    def reset(self) -> None:
        self._limit: tuple[int, str] | None = None

    def take(self, phase: str, step: int | None = None) -> None:
        t0 = now_ns()
        owner = self.owner
        if step is None:
            step = owner.agent.steps.index
        # the per-layer list on the default schedule's steps only (also under --memory full: it is the
        # largest part of a snapshot, and layers do not change from step to step)
        per_layer = phase == "forward" and is_sampled(step, "sampled", owner.every)
        doc = self.accounts.categories(include_per_layer=per_layer, phase=phase)
        cats: dict[str, int] = doc["categories"]
        rss = rss_bytes()
        limit, limit_source = self._limits()
        attrs: dict[str, Any] = {
            "step": step,
            "phase": phase,
            "device": self.tracker.device,
            "mode": owner.mode,
            "rss_bytes": rss,
            "limit_bytes": limit,
            "limit_source": limit_source,
            "tensors": doc["tensors"],
        }
        self._add_other(cats, attrs, rss, int(doc["cuda_tensor_bytes"]))
        attrs["categories"] = cats
        if self.tracker.batch_size is not None:
            attrs["batch_size"] = self.tracker.batch_size
        if self.tracker.unmeasured:
            attrs["activations_unmeasured"] = self.tracker.unmeasured
        if self.tracker.unreadable:  # not counted: their storage cannot be read
            attrs["tensors_unmeasured"] = dict(self.tracker.unreadable)
        if "per_layer" in doc:
            attrs["per_layer"] = doc["per_layer"]
        t1 = now_ns()
        attrs["cost_ns"] = t1 - t0
        agent = owner.agent
        agent.span("op", "memory", t1, t1, step, attrs)
        pid = agent.pid
        sample = agent.sample
        for c, name in _SAMPLE_NAMES:
            sample(name, float(cats[c]), pid, t1)

    def _add_other(
        self, cats: dict[str, int], attrs: dict[str, Any], rss: int, cuda_tensor_bytes: int
    ) -> None:
        """``other`` into ``cats``, and the device's totals (and peaks, on a GPU) into ``attrs``."""
        tensor_total = sum(cats.values())
        device = self.tracker.device
        torch = self.tracker.torch
        if device.startswith("cuda") and torch is not None and torch.cuda.is_initialized():
            idx = cuda_index(device)
            allocated = int(torch.cuda.memory_allocated(idx))
            reserved = int(torch.cuda.memory_reserved(idx))
            cats["other"] = max(0, reserved - cuda_tensor_bytes)
            attrs.update(
                other_basis="cuda_reserved",
                allocated_bytes=allocated,
                reserved_bytes=reserved,
                device_peak_bytes=int(torch.cuda.max_memory_reserved(idx)),
                allocated_peak_bytes=int(torch.cuda.max_memory_allocated(idx)),
                total_bytes=reserved,
            )
        else:
            cats["other"] = max(0, rss - tensor_total)
            attrs.update(other_basis="rss", total_bytes=max(rss, tensor_total))

    def _limits(self) -> tuple[int, str]:
        if self._limit is None:
            torch = self.tracker.torch
            device = self.tracker.device
            if torch is not None and device.startswith("cuda"):
                try:
                    props = torch.cuda.get_device_properties(cuda_index(device))
                    self._limit = (int(props.total_memory), f"{props.name} memory")
                except Exception:
                    self._limit = (0, "unknown")
            else:
                self._limit = cpu_limit_bytes()
        return self._limit
