"""``backward``: ``torch.autograd.backward`` (which ``Tensor.backward`` calls) and ``torch.autograd.grad``."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from holoprof.agent.core import Collector, now_ns
from holoprof.collect.torch.device import DeviceTimes
from holoprof.collect.torch.state import TorchState
from holoprof.collect.waits import phase_spans


def install_backward(col: Collector, st: TorchState, dev: DeviceTimes, torch: ModuleType) -> None:
    """Patch ``torch.autograd.backward`` and ``torch.autograd.grad``; a ``backward`` in a loop that has
    no optimizer at all ends the step."""
    col._set(torch.autograd, "backward", _wrap_backward(col, st, dev, torch.autograd.backward, True))
    col._set(torch.autograd, "grad", _wrap_backward(col, st, dev, torch.autograd.grad, False))


def _wrap_backward(col: Collector, st: TorchState, dev: DeviceTimes, orig: Any, update: bool) -> Any:
    agent = col.agent
    steps = agent.steps

    def backward(*args: Any, **kwargs: Any) -> Any:
        t = st.tls
        if t.active is not None or not col.enabled:
            return orig(*args, **kwargs)
        t0 = now_ns()
        try:
            if col.fault_at:
                col.inject("backward")
            ev0 = dev.begin() if dev.maybe else None
        except Exception as exc:
            agent.fail(col, exc)
            return orig(*args, **kwargs)
        t.active = "backward"
        try:
            return orig(*args, **kwargs)
        finally:
            t.active = None
            try:
                t1 = now_ns()
                loop = t.loop
                if loop is None or loop.start_ns is None:
                    steps.activity(t0)
                    loop = steps.mine()
                step = loop.index  # the thread's step: started by now
                ready = agent.bucket_ready_ns
                if t0 < ready < t1:
                    # DDP: from the moment the last gradient bucket was ready, backward only
                    # waited for the buckets' allreduce (exposed communication)
                    phase_spans(agent, "backward", t0, t1, step, (ready, "ddp_allreduce"), st.phase)
                elif t.waits is not None:  # it waited for communication (FSDP's reduce-scatters)
                    phase_spans(agent, "backward", t0, t1, step, record=st.phase)
                else:
                    st.phase("backward", t0, t1, step)
                if ev0 is not None:
                    dev.end("backward", step, t0, ev0)
                if update and not steps.optimizer_seen:
                    steps.update_done(t1, loop)  # loops with no optimizer at all
            except Exception as exc:
                agent.fail(col, exc)

    backward.__wrapped__ = orig  # type: ignore[attr-defined]
    return backward
