"""``zero_grad`` (``Optimizer.zero_grad`` and ``Module.zero_grad``): an ``optimizer`` phase with
``op: zero_grad``, which starts an iteration unless it ends the one an optimizer step just ended."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from holoprof.agent.core import Collector, now_ns
from holoprof.collect.torch.state import TorchState

#: the attributes of every ``zero_grad`` span: one dictionary, never changed (the writer only reads a
#: span's attributes), not one made at each step
ZERO_GRAD = {"op": "zero_grad"}


def install_zero_grad(col: Collector, st: TorchState, torch: ModuleType, optim_mod: ModuleType) -> None:
    """Patch ``Optimizer.zero_grad`` (of ``torch.optim.optimizer``), then ``Module.zero_grad``."""
    optimizer_cls = optim_mod.Optimizer
    col._set(optimizer_cls, "zero_grad", _wrap_zero_grad(col, st, torch, optimizer_cls.zero_grad))
    col._set(torch.nn.Module, "zero_grad", _wrap_zero_grad(col, st, torch, torch.nn.Module.zero_grad))


def _wrap_zero_grad(col: Collector, st: TorchState, torch: ModuleType, orig: Any) -> Any:
    agent = col.agent
    steps = agent.steps
    span = agent.span
    is_grad_enabled = torch.is_grad_enabled

    def zero_grad(self_: Any, *args: Any, **kwargs: Any) -> Any:
        t = st.tls
        if t.active is not None or not col.enabled:
            return orig(self_, *args, **kwargs)
        t0 = now_ns()
        try:
            if col.fault_at:
                col.inject("zero_grad")
            loop = t.loop
            if loop is not None and loop.just_updated and t.tid not in st.pending:
                pass  # `step(); zero_grad()`: the end of this iteration, not the next one's start
            elif is_grad_enabled():
                st.begin_forward(True, t0)  # a training activity: claims the pending fetch
            else:
                steps.opener(t0, loop)
        except Exception as exc:
            agent.fail(col, exc)
        t.active = "optimizer"
        try:
            return orig(self_, *args, **kwargs)
        finally:
            t.active = None
            try:
                span("phase", "optimizer", t0, now_ns(), steps.index, ZERO_GRAD)
            except Exception as exc:
                agent.fail(col, exc)

    return zero_grad
