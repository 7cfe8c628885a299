"""``forward`` and ``eval``: the outermost module call of a thread (``torch.nn.Module.__call__``)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from holoprof.agent.core import Collector, now_ns
from holoprof.collect.torch.device import DeviceTimes
from holoprof.collect.torch.state import TorchState
from holoprof.collect.waits import phase_spans


def install_forward(col: Collector, st: TorchState, dev: DeviceTimes, torch: ModuleType) -> None:
    """Patch ``torch.nn.Module.__call__``: the outermost module call of a thread is ``forward`` when
    autograd is on, ``eval`` under ``no_grad``/``inference_mode``; nested module calls pass straight
    through. A training forward claims the batch wait before it (see :class:`TorchState`).

    Two kinds of module call are left alone, so that nothing of holoprof's runs where it could change
    what the job computes: calls that ``torch.compile`` traces (``torch.compiler.is_compiling()``, in
    effect, which Dynamo folds to a constant: the wrapper leaves nothing in the graph and no guard on
    holoprof's state), and calls made by the autograd engine during a backward pass (activation checkpointing
    recomputes the forward there: that time is backward's, and its saved tensors are checkpoint's).
    """
    agent = col.agent
    steps = agent.steps
    is_grad_enabled = torch.is_grad_enabled
    orig_call = torch.nn.Module.__call__
    dynamo_compiling, flag = _compiling_test(torch)
    graph_task_id = getattr(torch._C, "_current_graph_task_id", None) or _no_task

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:  # `self`: torch's tracer reads it
        if dynamo_compiling() or flag._is_compiling_flag:
            return orig_call(self, *args, **kwargs)
        t = st.tls
        if t.active is not None or not col.enabled:
            nested = st.nested
            if nested is None or t.active != "forward":
                return orig_call(self, *args, **kwargs)
            return nested.call(orig_call, self, args, kwargs)
        if graph_task_id() != -1:  # inside a backward pass (the engine's own threads included)
            return orig_call(self, *args, **kwargs)
        try:
            t_open = now_ns()
            if col.fault_at:
                col.inject("forward")
            training = is_grad_enabled()
            name = "forward" if training else "eval"
            st.begin_forward(training, t_open)
            ev0 = dev.begin() if dev.maybe else None
            observers = st.observers if training else ()
            for o in observers:
                o.begin(self, args)
            # the phase is the call as the job's own timer around it sees it: the bookkeeping above
            # (and a sampled step's set-up, e.g. the FLOP counter's) is in it, not in ``other``
            t0 = t_open
        except Exception as exc:
            agent.fail(col, exc)
            return orig_call(self, *args, **kwargs)
        t.active = name
        out = None
        try:
            out = orig_call(self, *args, **kwargs)
            return out
        finally:
            t.active = None
            try:
                t1 = now_ns()
                step = steps.index
                if t.waits is None:
                    st.phase(name, t0, t1, step)
                else:  # it waited for communication (FSDP's all-gathers): those parts are not forward
                    phase_spans(agent, name, t0, t1, step, record=st.phase)
                if ev0 is not None:
                    dev.end(name, step, t0, ev0)
                for o in observers:
                    o.end(out)
            except Exception as exc:
                agent.fail(col, exc)

    col._set(torch.nn.Module, "__call__", __call__)


def _compiling_test(torch: ModuleType) -> tuple[Any, Any]:
    """``(f, flag)``: a module call is traced by ``torch.compile`` or ``torch.export`` when
    ``f() or flag._is_compiling_flag``. That is ``torch.compiler.is_compiling()``, which is two Python
    calls on every module call, nested ones included (hundreds a step in a transformer), in one call
    and one read: ``is_dynamo_compiling()`` (Dynamo folds it to True, as it folds ``is_compiling``) and
    the flag ``torch.export`` sets. A torch without them gets ``is_compiling`` itself."""
    compiler = getattr(torch, "compiler", None)
    dynamo_compiling = getattr(compiler, "is_dynamo_compiling", None)
    if dynamo_compiling is None or not hasattr(compiler, "_is_compiling_flag"):
        return getattr(compiler, "is_compiling", None) or _never, _NoFlag
    return dynamo_compiling, compiler


def _never() -> bool:
    return False


class _NoFlag:
    """Where ``torch.compiler`` has no ``_is_compiling_flag``: ``is_compiling()`` alone decides."""

    _is_compiling_flag = False


def _no_task() -> int:
    return -1
