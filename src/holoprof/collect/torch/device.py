"""Device time per phase on a GPU: CUDA events recorded at the phase boundaries and resolved on the
writer thread (off the hot path); the device is never synchronized."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent


class DeviceTimes:
    """The CUDA events of the phases not yet resolved; :meth:`poll` turns the finished ones into
    ``cuda.<phase>_ms`` samples. ``torch`` is set when torch is patched."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.torch: ModuleType | None = None
        #: whether CUDA can be in use at all (a torch built with it): the phases' wrappers call
        #: :meth:`begin` only then, so a CPU-only torch pays one attribute read per phase
        self.maybe = False
        self.reset()

    def use(self, torch: ModuleType) -> None:
        """torch is imported (and about to be patched)."""
        self.torch = torch
        try:
            self.maybe = bool(torch.cuda._is_compiled())
        except Exception:
            self.maybe = True  # cannot tell: ask at each phase, as begin() does

    def reset(self) -> None:
        self.pending: list[tuple[str, int, int, Any, Any]] = []

    def begin(self) -> Any:
        torch = self.torch
        # ``torch.cuda._initialized`` first: one attribute read on a CPU job's every phase, where
        # ``is_initialized()`` (which also rules out a child forked after CUDA started) is two calls
        if torch is None or not getattr(torch.cuda, "_initialized", True) or not torch.cuda.is_initialized():
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def end(self, name: str, step: int, t0: int, ev0: Any) -> None:
        torch = self.torch
        assert torch is not None
        ev1 = torch.cuda.Event(enable_timing=True)
        ev1.record()
        if len(self.pending) < 100_000:
            self.pending.append((name, step, t0, ev0, ev1))
        else:
            self.agent.dropped += 1

    def poll(self) -> list[tuple[str, dict[str, list[Any]]]]:
        if not self.pending:
            return []
        done: list[tuple[str, int, int, float]] = []
        keep = []
        for item in self.pending:
            name, step, t0, ev0, ev1 = item
            if ev1.query():
                done.append((name, step, t0, ev0.elapsed_time(ev1)))
            else:
                keep.append(item)
        self.pending = keep
        off = self.agent.clock_offset_ns
        return [
            (
                "samples",
                {
                    "ts_ns": [t0 + off for _, _, t0, _ in done],
                    "name": [f"cuda.{name}_ms" for name, _, _, _ in done],
                    "value": [ms for _, _, _, ms in done],
                    "target_pid": [self.agent.pid] * len(done),
                },
            )
        ]
