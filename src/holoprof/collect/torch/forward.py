"""``forward`` and ``eval``: the outermost module call of a thread (``torch.nn.Module.__call__``)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from holoprof.agent.core import Collector, now_ns
from holoprof.collect.torch.device import DeviceTimes
from holoprof.collect.torch.state import TorchState


def install_forward(col: Collector, st: TorchState, dev: DeviceTimes, torch: ModuleType) -> None:
    """Patch ``torch.nn.Module.__call__``: the outermost module call of a thread is ``forward`` when
    autograd is on, ``eval`` under ``no_grad``/``inference_mode``; nested module calls pass straight
    through. A training forward claims the batch wait before it (see :class:`TorchState`)."""
    agent = col.agent
    steps = agent.steps
    span = agent.span
    is_grad_enabled = torch.is_grad_enabled
    orig_call = torch.nn.Module.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:  # `self`: torch's tracer reads it
        t = st.tls
        if t.active is not None or not col.enabled:
            return orig_call(self, *args, **kwargs)
        try:
            t_open = now_ns()
            if col.fault_at:
                col.inject("forward")
            training = is_grad_enabled()
            name = "forward" if training else "eval"
            st.begin_forward(training, t_open)
            ev0 = dev.begin()
            t0 = now_ns()  # the phase is the module call: the bookkeeping above is not in it
        except Exception as exc:
            agent.fail(col, exc)
            return orig_call(self, *args, **kwargs)
        t.active = name
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            t.active = None
            try:
                t1 = now_ns()
                span("phase", name, t0, t1, steps.index)
                if ev0 is not None:
                    dev.end(name, steps.index, t0, ev0)
            except Exception as exc:
                agent.fail(col, exc)

    col._set(torch.nn.Module, "__call__", __call__)
