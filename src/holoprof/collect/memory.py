"""Memory by category (weights, gradients, optimizer state, activations, other) on sampled steps.

What is measured, with no change to the job:

* **weights** — parameters (and buffers) of the modules that ran a training forward, plus the
  parameters the optimizers hold; **gradients** — their ``.grad``; **optimizer_state** — every tensor
  in ``optimizer.state`` (Adam: ``exp_avg``, ``exp_avg_sq`` and one 0-dim ``step`` tensor per
  parameter; of a Keras optimizer on the torch backend, its variables). Optimizers are found through
  the global optimizer step hooks (Keras's through the TensorFlow/Keras collector, which runs the same
  around Keras's update: :class:`~holoprof.collect.torch.state.OptimizerObserver`), modules through
  the torch collector's ``Module.__call__`` wrapper, observed only while a sampled step runs (no
  module hook: nothing ``torch.compile`` traces, nothing that runs in a step that is not measured).
* **activations** — tensors saved for backward. During the outermost training forward of a sampled
  step, ``torch.autograd.graph.saved_tensors_hooks`` is pushed; its pack hook notes the storage of each
  saved tensor (parameters excluded) and the module that was running, and returns the tensor unchanged
  inside a small holder whose lifetime is the autograd graph's hold on it. A saved tensor counts while
  the graph still holds it.
* **other** — the rest of the process's memory: on a GPU, memory reserved by the caching allocator that
  no category accounts for (workspaces, temporaries, cached and fragmented blocks); on the CPU, the
  resident memory not attributed to tensors (interpreter, libraries, allocator caches).

Storages shared between tensors are counted once (keyed by storage address and size), in the first
category that claims them (weights, gradients, optimizer state, activations, in that order).

Snapshots are taken at phase boundaries — after the forward (when the backward pass starts: a
pre-hook on the autograd node of the outermost forward's output, so that the loss module's forward is
in too), after the backward (at the optimizer's step pre-hook) and after the optimizer step — on
sampled steps: the first three steps, then one step in 200 (``holoprof run --memory full``: every
step; ``--memory off``: none). Each snapshot is one span
(kind ``op``, name ``memory``) with the categories in its attributes, plus samples
``mem.<category>_bytes``. Loops with neither a ``torch.optim`` optimizer nor a Keras one get their
first step only.

Here: the collector, which puts together the hooks (:mod:`holoprof.collect.memory_hooks`), the counts by
category (:mod:`holoprof.collect.memory_accounts`) and the snapshots they make
(:mod:`holoprof.collect.memory_phases`); and the on-demand ``memory-snapshot`` action.

Standard library only at import time; torch is touched only after the job imports it.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from types import ModuleType
from typing import Any

from holoprof import model
from holoprof.agent.core import Agent
from holoprof.collect.memory_accounts import CATEGORIES, TensorAccounts, tensors_in
from holoprof.collect.memory_hooks import ForwardTracker
from holoprof.collect.memory_phases import PhaseSnapshots
from holoprof.collect.memory_process import rss_bytes
from holoprof.collect.memory_schedule import EVERY, MODES, is_sampled, next_sampled
from holoprof.collect.torch.base import TorchImportCollector
from holoprof.collect.torch.collector import torch_state
from holoprof.collect.torch.state import NEVER

#: The report's note when several threads of a process train: reading the tensors of a model while
#: another thread updates them is not safe, so memory is measured with one training thread only.
SEVERAL_LOOPS_NOTE = (
    "memory by category was not measured: several threads of the process train, and it is measured "
    "only where one thread trains"
)


class MemoryCollector(TorchImportCollector):
    """The hooks (:class:`ForwardTracker`), the counts (:class:`TensorAccounts`) and the snapshots
    (:class:`PhaseSnapshots`), driven by the optimizer's step hooks."""

    name = "memory"
    default_fault = "forward"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        mode = str(agent.options.get("memory", "sampled"))
        self.mode = mode if mode in MODES else "sampled"
        self.every = int(agent.options.get("memory_every", EVERY) or EVERY)
        stop = agent.options.get("stop_after_steps")
        self.stop_after = int(stop) if isinstance(stop, (int, float)) and stop > 0 else 0
        self.tracker = ForwardTracker(self)
        self.accounts = TensorAccounts(self.tracker)
        self.snapshots = PhaseSnapshots(self, self.tracker, self.accounts)
        #: the first step whose optimizer step the hooks must see (TorchState.watchers)
        self.due = 0

    # -- install -----------------------------------------------------------------------------------
    def install(self) -> None:
        if self.mode == "off" and not self.stop_after:
            return
        super().install()

    def after_fork_child(self) -> None:
        # A forked child (a DataLoader worker) does not train: no hooks fire there that matter.
        self.tracker.pop_saved_hooks()
        self.tracker.reset()
        self.accounts.reset()
        self.snapshots.reset()

    def uninstall(self) -> None:
        self.tracker.pop_saved_hooks()
        self.tracker.disarm()
        if self.tracker.state is not None:
            self.tracker.state.unwatch(self)
        super().uninstall()

    def _patch(self, torch: ModuleType) -> None:
        self.tracker.setup(torch)
        self.tracker.state = torch_state(self.agent)
        if self.tracker.state is None:
            self.agent.info["memory"] = {"mode": "off", "why": "the torch collector is not running"}
            return
        self.tracker.state.watch(self)  # called by the torch collector's optimizer hooks when due
        self.tracker.state.optimizer_observers.append(self)  # Keras's optimizers on the torch backend
        if self.mode != "off":
            self.tracker.arm()
        self.agent.info["memory"] = {"mode": self.mode, "every": self.every}

    # -- around optimizer steps: on the steps it measures (the torch collector's hooks call these
    # from ``due`` on: TorchState.watchers), and on every step of a Keras optimizer ---------------
    def opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._opt_pre(optimizer, args, kwargs)

    def opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._opt_post(optimizer, args, kwargs)
        finally:
            self.reschedule()

    def reschedule(self) -> None:
        """The next step whose optimizer step the hooks must see: the one before the next measured
        step (it arms the measuring), the measured step itself, or the step that ends the job
        (``--stop-after-steps``)."""
        step = self.agent.steps.index
        due = NEVER
        if self.enabled and self.mode != "off":
            nxt = next_sampled(step + 1, self.mode, self.every)
            if nxt < NEVER:
                due = max(nxt - 1, step + 1)
            if self.tracker.measure_step == step:
                due = step  # the step's other optimizers (a GAN's two) are seen too; the next step moves it
        if self.stop_after:
            due = min(due, self.stop_after - 1)
        st = self.tracker.state
        if st is not None:
            st.schedule(self, due)

    def single_loop(self) -> bool:
        """Whether at most one thread of the process trains. The first time more do, measuring stops for
        good (another thread's backward or optimizer writes the tensors a snapshot would read), with a
        note in the report."""
        if self.agent.steps.running <= 1:
            return True
        if self.mode != "off":
            self.mode = "off"
            self.agent.info.setdefault("notes", []).append(SEVERAL_LOOPS_NOTE)
        # the module hooks go once no forward is being measured (a forward of another thread that is
        # being measured ends as usual: its saved-tensor hooks are popped in its own thread)
        self.tracker.disarm()
        return False

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.enabled or not self.single_loop():
            return
        try:
            self.accounts.see_optimizer(optimizer)
            if self.tracker.measure_step == self.agent.steps.index and self.mode != "off":
                self.snapshot("backward")
        except Exception as exc:
            self.hook_failed(exc)

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.enabled:
            return
        try:
            if self.fault_at:
                self.inject("optimizer_post")
            step = self.agent.steps.index
            if self.mode != "off" and self.single_loop():
                self.accounts.see_optimizer(optimizer)
                if self.tracker.measure_step == step:
                    self.snapshot("optimizer")
                if is_sampled(step + 1, self.mode, self.every):
                    self.tracker.arm()
                elif self.mode == "sampled":
                    self.tracker.disarm()
        except Exception as exc:
            self.hook_failed(exc)
            return
        if self.stop_after and self.agent.steps.index + 1 >= self.stop_after:
            self.agent.info["stopped_after_steps"] = self.stop_after
            raise SystemExit(0)  # asked for with --stop-after-steps: end the job cleanly now

    # the same around the optimizer steps torch's hooks do not see (OptimizerObserver)
    def step_begins(self, optimizer: Any) -> None:
        self._opt_pre(optimizer, (), {})

    def step_ends(self, optimizer: Any) -> None:
        self._opt_post(optimizer, (), {})

    def hook_failed(self, exc: BaseException) -> None:
        """A hook raised: stop measuring, and turn the collector off (the job goes on)."""
        self.tracker.stop()
        self.agent.fail(self, exc)

    # -- measuring ---------------------------------------------------------------------------------
    def categories(self, include_per_layer: bool = False, phase: str = "optimizer") -> dict[str, Any]:
        """Bytes per category now, and per layer when asked (see :meth:`TensorAccounts.categories`)."""
        return self.accounts.categories(include_per_layer, phase)

    def snapshot(self, phase: str, step: int | None = None) -> None:
        """The memory span and samples of the phase boundary ``phase`` of ``step`` (default: this one)."""
        if self.single_loop():
            self.snapshots.take(phase, step)

    def finish(self) -> None:
        self.tracker.pop_saved_hooks()


# --- on demand: memory snapshot ---------------------------------------------------------------------
def memory_snapshot_action(
    agent: Agent,
    request: dict[str, Any],
    census_path: str | None = None,
    cuda_path: str | None = None,
) -> dict[str, Any]:
    """The ``memory-snapshot`` control action: where the memory of this process is, now.

    CUDA: the caching allocator's snapshot (``torch.cuda.memory._snapshot``; allocation stacks too
    when ``request["record_history"]`` started recording earlier) dumped to
    ``artifacts/memory-snapshot-<pid>-<time>.pickle`` (open it in https://pytorch.org/memory_viz).
    CPU, and always: a census of live tensors by category (storages counted once), written to
    ``artifacts/memory-census-<pid>-<time>.json``. Returns what was written and the totals.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return {"ok": False, "error": "torch is not imported in this process: no tensors to count"}
    art = os.path.join(agent.run_dir, model.ARTIFACTS_DIR)
    os.makedirs(art, mode=0o700, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    result: dict[str, Any] = {"ok": True, "pid": agent.pid}
    col = next((c for c in agent.collectors if isinstance(c, MemoryCollector)), None)
    if col is not None and col.tracker.torch is None:
        col.tracker.torch = torch
    census = tensor_census(torch, col)
    path = census_path or os.path.join(art, f"memory-census-{agent.pid}-{stamp}.json")
    with open(path, "w") as f:
        json.dump(census, f, indent=1)
    result["census"] = path
    result["categories"] = census["categories"]
    result["tensor_bytes"] = census["tensor_bytes"]
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            if request.get("record_history"):
                torch.cuda.memory._record_memory_history(max_entries=int(request.get("max_entries", 100_000)))
                result["recording_history"] = True
            snap = cuda_path or os.path.join(art, f"memory-snapshot-{agent.pid}-{stamp}.pickle")
            torch.cuda.memory._dump_snapshot(snap)
            result["cuda_snapshot"] = snap
            result["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated())
            result["cuda_reserved_bytes"] = int(torch.cuda.memory_reserved())
    except Exception as exc:
        result["cuda_error"] = f"{type(exc).__name__}: {exc}"
    return result


def memory_snapshot_handler(job: Any) -> None:
    """The control mailbox's handler (``holoprof.collect.control.ACTIONS["memory-snapshot"]``).

    ``job`` is a ``holoprof.collect.control.Job``: its params (``max_entries``, ``record_history``)
    are the request; artifacts are named by the job (``artifacts/memory-snapshot-<id>-<host>-<pid>.*``).
    The census reads every live tensor: it runs between two steps, on the training thread
    (``job.collector.between_steps``), never while the loop changes them.
    """
    job.running(phase="waiting for the next step boundary")
    job.collector.between_steps(lambda: _snapshot_now(job))


def _snapshot_now(job: Any) -> None:
    try:
        result = memory_snapshot_action(
            job.agent,
            dict(job.params or {}),
            census_path=job.artifact_path(".census.json"),
            cuda_path=job.artifact_path(".pickle"),
        )
    except Exception as exc:
        job.failed(f"the memory snapshot failed ({type(exc).__name__}: {exc})")
        return
    if not result.get("ok"):
        job.failed(str(result.get("error", "memory snapshot failed")))
        return
    paths = [p for p in (result.get("census"), result.get("cuda_snapshot")) if p]
    info = {k: v for k, v in result.items() if k not in ("census", "cuda_snapshot", "ok")}
    job.done(paths, **info)


def tensor_census(torch: ModuleType, col: MemoryCollector | None) -> dict[str, Any]:
    """Every live tensor the garbage collector knows, by category, each storage counted once."""
    known: dict[tuple[int, int], str] = {}

    def note(t: Any, cat: str) -> None:
        try:
            known.setdefault(_key(t), cat)
        except Exception:  # a storage that cannot be read (an invalid python storage): left out
            pass

    if col is not None:
        for p in col.accounts.params():
            note(p, "weights")
            if p.grad is not None:
                note(p.grad, "gradients")
        for opt in col.accounts.live_optimizers():
            for state in list(opt.state.values()):
                for v in tensors_in(state.values() if isinstance(state, dict) else ()):
                    note(v, "optimizer_state")
        for r, key, _gpu, _layer in col.tracker.saved:
            if r() is not None:
                known.setdefault(key, "activations")
    cats = dict.fromkeys((*CATEGORIES[:-1], "unattributed_tensors"), 0)
    seen: set[tuple[int, int]] = set()
    by_device: dict[str, int] = {}
    count = 0
    tensor_type = torch.Tensor
    for obj in gc.get_objects():
        try:
            # type(), not isinstance(): isinstance reads __class__, which some module proxies warn about
            if not issubclass(type(obj), tensor_type) or obj.is_meta:
                continue
            key = _key(obj)
        except Exception:
            continue
        if key in seen:
            continue
        seen.add(key)
        count += 1
        cat = known.get(key, "unattributed_tensors")
        cats[cat] += key[1]
        dev = str(obj.device)
        by_device[dev] = by_device.get(dev, 0) + key[1]
    return {
        "categories": cats,
        "tensor_bytes": sum(cats.values()),
        "storages": count,
        "by_device": by_device,
        "rss_bytes": rss_bytes(),
        "note": "tensors reachable by Python's garbage collector; storages shared by views counted once",
    }


def _key(t: Any) -> tuple[int, int]:
    st = t.untyped_storage()
    return (int(st.data_ptr()), int(st.nbytes()))
