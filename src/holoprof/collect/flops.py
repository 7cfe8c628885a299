"""FLOPs of a training step, counted on one sampled step with no code change (PyTorch).

On the step with index :data:`COUNT_STEP` (the second one: the first loads, compiles and starts
workers) the collector enters a ``TorchDispatchMode`` at the start of the outermost training forward
(observed through the torch collector's ``Module.__call__`` wrapper,
:class:`holoprof.collect.torch.state.ForwardObserver`) and leaves it when that step's optimizer step
ends (the global optimizer step post-hook; without an optimizer, at the next step's forward). Every
ATen operator of the step passes through the mode, which calls it unchanged and counts its FLOPs with
PyTorch's own formulas (``torch.utils.flop_counter.flop_registry``: matmuls, convolutions, attention;
the CPU flash-attention kernels are added, which that registry lacks). Nothing is decomposed and no
module hook is registered, so the job computes exactly what it computes untraced.

Each counted operator is attributed to the phase it ran in — ``backward`` inside an autograd graph
task, otherwise the torch collector's open phase (``forward``, ``optimizer``, ``eval``), or ``other``
(a loss computed outside any module) — and to the dtype of its first tensor (the dtype the step
mostly computes in is the one with the most FLOPs: ``bfloat16`` under bf16 autocast).

``torch.compile``: the mode says ``ignore_compile_internals``, so Dynamo compiles as it would
untraced (the mode is off while it compiles) and the compiled code's operators that reach the
dispatcher (the GEMMs and attention kernels Inductor calls) are counted; kernels that compiled code
generates itself (Triton or C++ GEMM templates under ``max-autotune``) are not seen. A torch whose
Dynamo has no such switch falls back to eager under any dispatch mode: there a job that uses
``torch.compile`` is not counted, and the record says why.

The result is one span (kind ``op``, name ``flops``) with the step's index, the counting window and
its attributes: ``flops`` (forward + backward + optimizer + other), ``by_phase``, ``by_dtype``,
``dtype``, ``device``, ``device_name`` (CUDA), ``threads``, ``matmul_precision``, ``allow_tf32``,
``counted_ops``, ``ops``; or ``why`` when the step could not be counted. The counted step is slower
than the others (every operator goes through Python): the compute analysis leaves it out of the mean
step it divides by.

Standard library only at import time; torch is touched only after the job imports it.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, now_ns
from holoprof.collect.torch.base import TorchImportCollector
from holoprof.collect.torch.collector import torch_state
from holoprof.collect.torch.state import NEVER, TorchState
from holoprof.collect.util import process_created_ns

#: The step whose FLOPs are counted (0-based): the second, after the first step's loading and compiling.
COUNT_STEP = 1
#: ``holoprof run --flops`` choices
MODES = ("on", "off")
#: Phases FLOPs are attributed to; ``eval`` is left out of the step's total.
STEP_PHASES = ("forward", "backward", "optimizer", "other")


class FlopCount:
    """What the dispatch mode adds up while one step is counted."""

    def __init__(self, state: TorchState, graph_task_id: Any) -> None:
        self.tls = state.tls
        self.graph_task_id = graph_task_id
        self.by_phase: dict[str, int] = {}
        self.by_dtype: dict[str, int] = {}
        self.by_device: dict[str, int] = {}
        self.ops = 0
        self.counted_ops = 0
        self.unseen: dict[str, int] = {}  # higher-order operators run without counting inside them
        self.error = ""
        self.active = True

    def add(self, flops: int, args: tuple[Any, ...]) -> None:
        if self.graph_task_id() != -1:
            phase = "backward"
        else:
            phase = self.tls.active or "other"
            if phase not in STEP_PHASES and phase != "eval":
                phase = "other"
        self.by_phase[phase] = self.by_phase.get(phase, 0) + flops
        first = next((a for a in args if hasattr(a, "dtype") and hasattr(a, "device")), None)
        if first is not None:
            dt = str(first.dtype).removeprefix("torch.")
            self.by_dtype[dt] = self.by_dtype.get(dt, 0) + flops
            dev = str(first.device)
            self.by_device[dev] = self.by_device.get(dev, 0) + flops
        self.counted_ops += 1


def mode_class(torch: ModuleType) -> Any:
    """The counting ``TorchDispatchMode`` class, built on this torch."""
    from torch.utils._python_dispatch import TorchDispatchMode  # lazy: torch is the job's

    registry = flop_registry(torch)
    hop_cls = getattr(torch._ops, "HigherOrderOperator", ())

    class _Counting(TorchDispatchMode):
        supports_higher_order_operators = True

        def __init__(self, count: FlopCount) -> None:
            super().__init__()
            self.count = count

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True  # Dynamo compiles with the mode off, and runs what it compiled under it

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)  # the operator itself, unchanged (the mode is off in here)
            c = self.count
            if not c.active:
                return out
            try:
                c.ops += 1
                if isinstance(func, hop_cls):
                    name = str(getattr(func, "_name", func))
                    c.unseen[name] = c.unseen.get(name, 0) + 1
                    return out
                f = registry.get(func._overloadpacket)
                if f is not None:
                    c.add(int(f(*args, **kwargs, out_val=out)), args)
            except Exception as exc:
                c.error = c.error or f"{type(exc).__name__}: {exc}"
            return out

    return _Counting


def flop_registry(torch: ModuleType) -> dict[Any, Any]:
    """PyTorch's FLOP formulas by operator, plus the CPU flash-attention kernels it lacks (counted with
    the formulas of the CUDA flash-attention kernels, whose arguments start the same way)."""
    from torch.utils import flop_counter as fc  # lazy: torch is the job's

    reg = dict(fc.flop_registry)
    aten = torch.ops.aten
    extra = (
        ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
        (
            "_scaled_dot_product_flash_attention_for_cpu_backward",
            "_scaled_dot_product_flash_attention_backward",
        ),
    )
    for name, like in extra:
        op, formula = getattr(aten, name, None), reg.get(getattr(aten, like, None))
        if op is not None and formula is not None and op not in reg:
            reg[op] = formula
    return reg


def unavailable(torch: ModuleType) -> str:
    """Why this torch cannot count a step without changing what the job computes ("" when it can)."""
    try:
        import torch.utils.flop_counter  # noqa: F401  lazy: torch is the job's
        from torch.utils._python_dispatch import TorchDispatchMode  # lazy: torch is the job's
    except ImportError:
        return "this PyTorch has no torch.utils.flop_counter (PyTorch 2.1 or later counts FLOPs)"
    if not hasattr(TorchDispatchMode, "ignore_compile_internals") and "torch._dynamo" in sys.modules:
        return (
            "the job uses torch.compile, and this PyTorch's Dynamo falls back to eager under a dispatch "
            "mode: counting would change what runs (PyTorch 2.9 or later counts compiled steps)"
        )
    return ""


class FlopCollector(TorchImportCollector):
    """Counts the FLOPs of step :data:`COUNT_STEP`, once per process."""

    name = "flops"
    default_fault = "forward"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self.mode_opt = str(agent.options.get("flops", "on"))
        self.count_step = int(agent.options.get("flops_step", COUNT_STEP))
        self.torch: ModuleType | None = None
        self.state: TorchState | None = None
        self.reset()
        self.note_created()

    def note_created(self) -> None:
        """The process's creation time (``info["created_ns"]``): goodput's start-up begins there, before
        the interpreter reached the agent."""
        created = process_created_ns()
        if created is not None:
            self.agent.info["created_ns"] = created

    def reset(self) -> None:
        self.due = NEVER  # no optimizer step to see until a count starts
        self.done = False
        self.count: FlopCount | None = None
        self.mode: Any = None
        self.owner = 0  # the thread whose dispatch-mode stack holds the mode
        self.step = -1
        self.t0 = 0

    def install(self) -> None:
        if self.mode_opt == "off":
            return
        super().install()

    def _patch(self, torch: ModuleType) -> None:
        self.torch = torch
        self.state = torch_state(self.agent)
        if self.state is None:
            self.agent.info["flops"] = {"why": "the torch collector is not running"}
            return
        self.state.watch(self)  # called by the torch collector's optimizer hooks while it counts
        self.state.observers.append(self)

    def after_fork_child(self) -> None:
        # a forked child (a DataLoader worker) does not train; a mode entered by the parent's thread
        # is not on this process's thread
        self.disarm()
        self.reset()
        self.done = True
        self.note_created()

    # -- ForwardObserver: the outermost training forward ---------------------------------------
    def begin(self, module: Any, args: tuple[Any, ...]) -> None:
        if not self.enabled:
            return
        try:
            if self.fault_at:
                self.inject("forward")
            index = self.agent.steps.index
            if self.count is not None:
                if index != self.step:  # a loop without an optimizer: the next step's forward ends it
                    self.end_count()
                return
            if self.done:
                self.disarm()
            elif index >= self.count_step:
                self.start_count(index)
        except Exception as exc:
            self.failed(exc)

    def end(self, out: Any) -> None:
        pass

    # -- StepWatcher: the optimizer step of the counted step ends the count --------------------------
    def opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        pass

    def opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.enabled or self.count is None:
            self.watch_from(NEVER)
            return
        try:
            if self.fault_at:
                self.inject("optimizer_post")  # tests: a failure with the mode on the stack
            if self.agent.steps.index == self.step:
                self.end_count()
        except Exception as exc:
            self.failed(exc)

    # -- counting -----------------------------------------------------------------------------------
    def start_count(self, index: int) -> None:
        torch = self.torch
        assert torch is not None and self.state is not None
        self.done = True
        why = unavailable(torch)
        if why:
            self.record(index, now_ns(), now_ns(), {"why": why})
            self.disarm()
            return
        graph_task_id = getattr(torch._C, "_current_graph_task_id", None) or _no_task
        count = FlopCount(self.state, graph_task_id)
        mode = mode_class(torch)(count)
        # the counted window opens with the forward that starts it (its phase includes this set-up)
        self.step, self.t0 = index, self.state.forward_t0 or now_ns()
        mode.__enter__()
        self.count, self.mode, self.owner = count, mode, threading.get_ident()
        self.watch_from(index)

    def watch_from(self, step: int) -> None:
        """Have the optimizer hooks call :meth:`opt_post` from ``step`` on (:data:`NEVER`: not)."""
        if self.state is not None:
            self.state.schedule(self, step)

    def end_count(self, partial: str = "") -> None:
        """Leave the mode (on the thread that entered it) and record what it counted."""
        count, mode = self.count, self.mode
        if count is None:
            return
        count.active = False
        self.count = None
        self.disarm()
        self.watch_from(NEVER)
        if threading.get_ident() == self.owner and _top_mode(self.torch) is mode:
            mode.__exit__(None, None, None)
            self.mode = None
        else:  # it stays on that thread's stack, counting nothing, until that thread leaves it
            partial = partial or "the step ended on another thread than it started"
        self.record(self.step, self.t0, now_ns(), self.attrs(count, partial))

    def attrs(self, c: FlopCount, partial: str) -> dict[str, Any]:
        torch = self.torch
        assert torch is not None
        by_phase = {k: v for k, v in c.by_phase.items() if k != "eval"}
        total = sum(by_phase.values())
        dtype = max(c.by_dtype, key=lambda k: c.by_dtype[k]) if c.by_dtype else ""
        device = max(c.by_device, key=lambda k: c.by_device[k]) if c.by_device else "cpu"
        attrs: dict[str, Any] = {
            "flops": total,
            "by_phase": {p: by_phase.get(p, 0) for p in STEP_PHASES},
            "by_dtype": dict(c.by_dtype),
            "dtype": dtype,
            "device": device,
            "threads": int(torch.get_num_threads()),
            "matmul_precision": _call(torch, "get_float32_matmul_precision"),
            "counted_ops": c.counted_ops,
            "ops": c.ops,
            "torch": str(getattr(torch, "__version__", "")),
        }
        if c.by_phase.get("eval"):
            attrs["eval_flops"] = c.by_phase["eval"]
        if device.startswith("cuda"):
            attrs.update(cuda_device(torch, device))
        if c.unseen:
            attrs["uncounted"] = dict(c.unseen)
        if c.error:
            attrs["error"] = c.error
        if partial:
            attrs["partial"] = partial
        return attrs

    def record(self, step: int, t0: int, t1: int, attrs: dict[str, Any]) -> None:
        self.agent.span("op", "flops", t0, t1, step, attrs)
        # what the launcher needs to measure this CPU's peak after the job, without reading the spans
        kept = {k: attrs[k] for k in ("dtype", "device", "threads", "torch") if k in attrs}
        self.agent.info["flops"] = {
            "step": step,
            "flops": attrs.get("flops"),
            "why": attrs.get("why"),
            **kept,
        }

    def disarm(self) -> None:
        st = self.state
        if st is not None and self in st.observers:
            st.observers.remove(self)

    def failed(self, exc: BaseException) -> None:
        self.stop_counting()
        self.agent.fail(self, exc)

    def stop_counting(self) -> None:
        """Stop counting (fail open): the mode counts nothing more and leaves the stack where it can."""
        if self.count is not None:
            self.count.active = False
            self.count = None
        mode = self.mode
        if mode is not None and threading.get_ident() == self.owner and _top_mode(self.torch) is mode:
            try:
                mode.__exit__(None, None, None)
                self.mode = None
            except Exception:
                pass
        self.disarm()
        self.watch_from(NEVER)

    def turn_off(self) -> None:
        self.stop_counting()
        super().turn_off()

    def uninstall(self) -> None:
        super().uninstall()
        if self.state is not None:
            self.state.unwatch(self)

    def finish(self) -> None:
        if self.count is not None:
            self.end_count("the job ended before the counted step did")


def cuda_device(torch: ModuleType, device: str) -> dict[str, Any]:
    """The CUDA device's name and compute capability, and whether float32 matmuls may use TF32."""
    try:
        index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return {
            "device_name": str(torch.cuda.get_device_name(index)),
            "capability": f"{major}.{minor}",
            "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        }
    except Exception as exc:
        return {"device_name": "", "device_error": f"{type(exc).__name__}: {exc}"}


def _top_mode(torch: ModuleType | None) -> Any:
    if torch is None:
        return None
    from torch.utils._python_dispatch import _get_current_dispatch_mode  # lazy: torch is the job's

    return _get_current_dispatch_mode()


def _call(torch: ModuleType, name: str) -> str:
    fn = getattr(torch, name, None)
    try:
        return str(fn()) if fn is not None else ""
    except Exception:
        return ""


def _no_task() -> int:
    return -1
