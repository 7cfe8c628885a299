"""When each parameter's gradient is produced during backward, on a few sampled steps.

The input of ``holoprof whatif``: per-parameter gradient bytes and the time at which backward
produced each gradient give the per-layer backward compute and the order in which DDP would fill
its buckets.

Cost: nothing outside the sampled steps (by default steps 2, 3 and 4, i.e. the 3rd to 5th, after
warm-up). After the optimizer step that precedes a sampled step, the sampler observes the outermost
training forward through the torch collector's ``Module.__call__`` wrapper (no module hook: nothing
that ``torch.compile`` traces); the first training forward of that step (the outermost module: DDP,
or the model) stops the observing and puts a gradient hook on each of that module's parameters. Each hook appends one
``op`` span ``grad_ready`` (attrs ``{param, bytes}``) when the gradient is computed. The hooks are
removed at the next optimizer step. Option ``grad_sample_steps`` (a list of step indices) changes
the sampled steps; an empty list switches sampling off.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, Collector, now_ns
from holoprof.collect.torch.collector import torch_state
from holoprof.collect.torch.state import NEVER, TorchState

DEFAULT_SAMPLE_STEPS = (2, 3, 4)
_WRAPPERS = ("DistributedDataParallel", "DataParallel")


class LayerSampler:
    def __init__(self, agent: Agent, owner: Collector) -> None:
        self.agent = agent
        self.owner = owner
        raw = agent.options.get("grad_sample_steps", DEFAULT_SAMPLE_STEPS)
        self.sample = frozenset(int(s) for s in raw)
        self.last = max(self.sample, default=-1)
        self._torch: ModuleType | None = None
        self._state: TorchState | None = None
        self.due = NEVER  # the first step whose optimizer step it must see (TorchState.watchers)
        self._param_handles: list[Any] = []
        self.done = not self.sample

    def attach(self, torch: ModuleType) -> None:
        if self.done:
            return
        self._torch = torch
        self._state = torch_state(self.agent)
        if self._state is None:
            self.done = True  # the forward cannot be observed without the torch collector
            return
        self.reschedule(-1)
        self._state.watch(self)  # called by the torch collector's optimizer hooks when due
        if 0 in self.sample:
            self._arm()

    def detach(self) -> None:
        self.done = True
        self._clear_params()
        self._disarm()
        if self._state is not None:
            self._state.unwatch(self)

    # -- StepWatcher: the optimizer steps before and of each sampled step ---------------------------
    def reschedule(self, index: int) -> None:
        """After the optimizer step of step ``index``: the next one to see is that of the step before a
        sampled one (it arms the observing) or of a sampled one (its gradient hooks go)."""
        due = min((i for s in self.sample for i in (s - 1, s) if i > index), default=NEVER)
        if self._state is not None:
            self._state.schedule(self, due)

    def opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        pass

    def opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        index = self.agent.steps.index
        if self.done or not self.owner.enabled:
            self.reschedule(NEVER)
            return
        try:
            self._clear_params()  # the sampled backward (if any) is over
            nxt = index + 1
            if nxt in self.sample:
                self._arm()
            elif nxt > self.last:
                self.done = True
                self._disarm()
            self.reschedule(NEVER if self.done else index)
        except Exception as exc:
            self.reschedule(NEVER)
            self.agent.fail(self.owner, exc)

    def _arm(self) -> None:
        st = self._state
        if st is not None and self not in st.observers:
            st.observers.append(self)

    def _disarm(self) -> None:
        st = self._state
        if st is not None and self in st.observers:
            st.observers.remove(self)

    def end(self, out: Any) -> None:
        """The observed forward ended: nothing to do (its gradients are hooked at its start)."""

    def _clear_params(self) -> None:
        hs, self._param_handles = self._param_handles, []
        for h in hs:
            try:
                h.remove()
            except Exception:
                pass

    def begin(self, module: Any, args: Any) -> None:
        """The outermost training forward of a sampled step (observed through the torch collector)."""
        if not self.owner.enabled:
            return None
        try:
            self._disarm()  # only the outermost module of this step's training forward
            self._clear_params()
            strip = type(module).__name__ in _WRAPPERS
            agent = self.agent
            steps = agent.steps
            span = agent.span
            for name, p in module.named_parameters():
                if not p.requires_grad:
                    continue
                pname = name[len("module.") :] if strip and name.startswith("module.") else name
                attrs = {"param": pname, "bytes": int(p.numel()) * int(p.element_size())}

                def _ready(grad: Any, attrs: dict[str, Any] = attrs) -> None:
                    try:
                        t = now_ns()
                        span("op", "grad_ready", t, t, steps.index, attrs)
                    except Exception:
                        pass

                self._param_handles.append(p.register_hook(_ready))
        except Exception as exc:
            self.agent.fail(self.owner, exc)
        return None
