"""PyTorch, always on: steps and phases with no code change.

What is patched (each original kept, each patch undone by ``uninstall``):

* ``torch.nn.Module.__call__`` — the outermost module call of a thread is ``forward`` when autograd is
  on, ``eval`` under ``no_grad``/``inference_mode``; nested module calls pass straight through.
* ``torch.autograd.backward`` / ``torch.autograd.grad`` — ``backward`` (``Tensor.backward`` calls it).
* the global optimizer step hooks, ``Optimizer.zero_grad`` and ``Module.zero_grad`` — ``optimizer``.
  A ``step(closure)`` (LBFGS, Lightning's automatic optimization) is a whole iteration: the step
  starts there, and the closure is handed to the optimizer wrapped so that the forward, backward and
  ``zero_grad`` it runs keep their own phases (the optimizer's phase is the rest of the call).
* ``_BaseDataLoaderIter.__next__`` — ``data_wait``; a fetch whose batch feeds an eval forward counts
  as ``eval``; the end of a training loader is an epoch boundary. Its attributes carry the CPU time
  of the waiting thread (``cpu_ns``: the loading itself without workers, receiving a batch with them)
  and its run-queue wait (``runq_ns``), and, when the wait began, the process's CPU time
  (``proc_cpu_ns``), the thread's (``thread_cpu_ns``) and its run-queue wait so far
  (``thread_runq_ns``), which the input-pipeline model turns into CPU per step and the share of a
  core the training thread got; and the process's CPU time during the wait (``proc_wait_cpu_ns``):
  less the waiting thread's own, what the process's other threads burnt meanwhile (torch's idle
  OpenMP threads spin there).
* the dataset fetchers (``_MapDatasetFetcher.fetch``, ``_IterableDatasetFetcher.fetch``) — an
  ``op`` span ``fetch`` per batch with its thread CPU time (``cpu_ns``) and time spent waiting for a
  CPU (``runq_ns``), in the training process and in every DataLoader worker.

Checkpoints (``torch.save``, ``torch.load``, ``torch.distributed.checkpoint``, safetensors, Hugging
Face, Lightning) are recorded by :mod:`holoprof.collect.checkpoints`.

Only one phase is open per thread at a time: whatever runs inside a phase (a transform module inside
``data_wait``, ``torch.load`` in a dataset) belongs to that phase. On a GPU, device time per phase is
measured with CUDA events recorded at the phase boundaries and resolved on the writer thread; the
device is never synchronized.
"""

from __future__ import annotations

import os
import threading
import time
from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, Collector, now_ns
from holoprof.agent.setup import post_import_finder
from holoprof.collect.util import usable_cores

thread_time_ns = time.thread_time_ns
process_time_ns = time.process_time_ns


class _RunQueue(threading.local):
    """This thread's time spent runnable but waiting for a CPU (Linux ``schedstat``), in ns: a fetch
    that waited for a core is told from one that waited for a file or a sleep. One ``pread`` of a file
    kept open per thread (a few microseconds); 0 where the kernel does not provide it."""

    fd = -1
    pid = 0

    def wait_ns(self) -> int:
        try:
            if self.fd < 0 or self.pid != os.getpid():  # a forked child: the file is its parent's thread's
                self.fd, self.pid = os.open("/proc/thread-self/schedstat", os.O_RDONLY), os.getpid()
            return int(os.pread(self.fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return 0


class TorchCollector(Collector):
    name = "torch"
    default_fault = "forward"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self._reset_state()
        self._torch: ModuleType | None = None

    def _reset_state(self) -> None:
        self._tls = self.agent.tls
        # (start, end, loader, (cpu, process cpu at start, thread cpu at start, run-queue wait, at start))
        self._pending_dw: tuple[int, int, int, tuple[int, int, int, int, int, int]] | None = None
        self._term_pid = 0  # the process whose DataLoader-worker SIGTERM handler is set
        self._train_loaders: set[int] = set()
        self._eval_loaders: set[int] = set()
        self._seen_loaders: set[int] = set()
        self._epoch_start: dict[int, int] = {}
        self._epochs = 0
        self._opt_depth = 0
        self._opt_t0 = 0
        self._opt_dev: Any = None
        self._dev_pending: list[tuple[str, int, int, Any, Any]] = []
        self._closure_pos: dict[type, int] = {}
        self._iter_len: dict[int, tuple[int, int]] = {}  # loader key -> (iterator id, batches)
        self._unclaimed_epochs: dict[int, tuple[int, int]] = {}  # loader key -> (start, end)

    # -- install -----------------------------------------------------------------------------------
    def install(self) -> None:
        post_import_finder().add("torch", self._on_torch)

    def _on_torch(self, torch: ModuleType) -> None:
        if not self.enabled:
            return
        try:
            self._patch(torch)
        except Exception as exc:
            self.agent.fail(self, exc)

    def after_fork_child(self) -> None:
        self._reset_state()

    # -- the patches -------------------------------------------------------------------------------
    def _patch(self, torch: ModuleType) -> None:
        import torch.autograd
        import torch.optim.optimizer as optim_mod
        import torch.utils.data.dataloader as dl_mod

        self._torch = torch
        agent = self.agent
        steps = agent.steps
        col = self
        span = agent.span
        is_grad_enabled = torch.is_grad_enabled

        def fail(exc: BaseException) -> None:
            agent.fail(col, exc)

        # forward / eval: the outermost module call ---------------------------------------------
        orig_call = torch.nn.Module.__call__

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:  # `self`: torch's tracer reads it
            t = col._tls
            if t.active is not None or not col.enabled:
                return orig_call(self, *args, **kwargs)
            try:
                t_open = now_ns()
                if col.fault_at:
                    col.inject("forward")
                training = is_grad_enabled()
                name = "forward" if training else "eval"
                col._begin_forward(training, t_open)
                dev = col._dev_begin()
                t0 = now_ns()  # the phase is the module call: the bookkeeping above is not in it
            except Exception as exc:
                fail(exc)
                return orig_call(self, *args, **kwargs)
            t.active = name
            try:
                return orig_call(self, *args, **kwargs)
            finally:
                t.active = None
                try:
                    t1 = now_ns()
                    span("phase", name, t0, t1, steps.index)
                    if dev is not None:
                        col._dev_end(name, steps.index, t0, dev)
                except Exception as exc:
                    fail(exc)

        self._set(torch.nn.Module, "__call__", __call__)

        # backward ----------------------------------------------------------------------------------
        def wrap_backward(orig: Any, update: bool) -> Any:
            def backward(*args: Any, **kwargs: Any) -> Any:
                t = col._tls
                if t.active is not None or not col.enabled:
                    return orig(*args, **kwargs)
                t0 = now_ns()
                try:
                    if col.fault_at:
                        col.inject("backward")
                    dev = col._dev_begin()
                except Exception as exc:
                    fail(exc)
                    return orig(*args, **kwargs)
                t.active = "backward"
                try:
                    return orig(*args, **kwargs)
                finally:
                    t.active = None
                    try:
                        t1 = now_ns()
                        steps.activity(t0)
                        ready = agent.bucket_ready_ns
                        if t0 < ready < t1:
                            # DDP: from the moment the last gradient bucket was ready, backward only
                            # waited for the buckets' allreduce (exposed communication)
                            span("phase", "backward", t0, ready, steps.index)
                            span("phase", "communication", ready, t1, steps.index, {"op": "ddp_allreduce"})
                        else:
                            span("phase", "backward", t0, t1, steps.index)
                        if dev is not None:
                            col._dev_end("backward", steps.index, t0, dev)
                        if update and not steps.optimizer_seen:
                            steps.update_done(t1)  # loops with no optimizer at all
                    except Exception as exc:
                        fail(exc)

            backward.__wrapped__ = orig  # type: ignore[attr-defined]
            return backward

        self._set(torch.autograd, "backward", wrap_backward(torch.autograd.backward, True))
        self._set(torch.autograd, "grad", wrap_backward(torch.autograd.grad, False))

        # optimizer ---------------------------------------------------------------------------------
        # These run inside torch's loop over its hooks: a failure here turns the collector off
        # (its hooks become no-ops) and leaves the hook dicts alone.
        def opt_pre(optimizer: Any, args: Any, kwargs: Any) -> Any:
            if not col.enabled:
                return None
            try:
                if col.fault_at:
                    col.inject("optimizer_pre")
                col._opt_depth += 1
                if col._opt_depth == 1:
                    if col._tls.active is not None:
                        col._opt_depth = -1_000_000  # nested inside another phase: not ours
                        return None
                    t0 = now_ns()
                    at, closure = col._closure_arg(optimizer, args, kwargs)
                    if closure is not None:
                        # a step that runs its own forward and backward (LBFGS, Lightning): a whole
                        # iteration, which starts here
                        col._begin_forward(True, t0)
                    col._opt_t0 = t0
                    col._opt_dev = col._dev_begin()
                    col._tls.active = "optimizer"
                    steps.optimizer_seen = True
                    if closure is not None:
                        wrapped = col._wrap_closure(closure)
                        if at < 0:
                            return args, {**kwargs, "closure": wrapped}
                        return (*args[:at], wrapped, *args[at + 1 :]), kwargs
            except Exception as exc:
                col._opt_end()
                fail(exc)
            return None

        def opt_post(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not col.enabled:
                col._opt_end()  # turned off between the two hooks: close what the first one opened
                return
            try:
                if col.fault_at:
                    col.inject("optimizer_post")
                col._opt_depth -= 1
                if col._opt_depth < 0:
                    col._opt_depth = 0
                    return
                if col._opt_depth == 0:
                    col._tls.active = None
                    t1 = now_ns()
                    steps.activity(col._opt_t0)
                    col._end_optimizer_part(t1)
                    steps.update_done(t1)
            except Exception as exc:
                col._opt_end()
                fail(exc)

        self._handles.append(optim_mod.register_optimizer_step_pre_hook(opt_pre))
        self._handles.append(optim_mod.register_optimizer_step_post_hook(opt_post))

        orig_opt_init = optim_mod.Optimizer.__init__

        def opt_init(self_: Any, *args: Any, **kwargs: Any) -> None:
            steps.optimizer_seen = True
            orig_opt_init(self_, *args, **kwargs)

        self._set(optim_mod.Optimizer, "__init__", opt_init)

        def wrap_zero_grad(orig: Any) -> Any:
            def zero_grad(self_: Any, *args: Any, **kwargs: Any) -> Any:
                t = col._tls
                if t.active is not None or not col.enabled:
                    return orig(self_, *args, **kwargs)
                t0 = now_ns()
                try:
                    if col.fault_at:
                        col.inject("zero_grad")
                    if steps.just_updated and col._pending_dw is None:
                        pass  # `step(); zero_grad()`: the end of this iteration, not the next one's start
                    elif is_grad_enabled():
                        col._begin_forward(True, t0)  # a training activity: claims the pending fetch
                    else:
                        steps.opener(t0)
                except Exception as exc:
                    fail(exc)
                t.active = "optimizer"
                try:
                    return orig(self_, *args, **kwargs)
                finally:
                    t.active = None
                    try:
                        span("phase", "optimizer", t0, now_ns(), steps.index, {"op": "zero_grad"})
                    except Exception as exc:
                        fail(exc)

            return zero_grad

        self._set(optim_mod.Optimizer, "zero_grad", wrap_zero_grad(optim_mod.Optimizer.zero_grad))
        self._set(torch.nn.Module, "zero_grad", wrap_zero_grad(torch.nn.Module.zero_grad))

        # data_wait ---------------------------------------------------------------------------------
        runq = _RunQueue()
        base_iter = dl_mod._BaseDataLoaderIter
        orig_next = base_iter.__next__

        def __next__(it: Any) -> Any:
            t = col._tls
            if t.active is not None or not col.enabled:
                return orig_next(it)
            try:
                t0 = now_ns()
                if col.fault_at:
                    col.inject("dataloader")
                key = id(it._dataset)
                if key not in col._seen_loaders:
                    col._new_loader(it, key, t0)
                col._resolve_pending(None)
                steps.just_updated = False
                if key in col._train_loaders:
                    steps.opener(t0)
                pc0 = process_time_ns()
                c0 = thread_time_ns()
                q0 = runq.wait_ns()
            except Exception as exc:
                fail(exc)
                return orig_next(it)
            t.active = "data_wait"
            stop = False
            try:
                return orig_next(it)
            except StopIteration:
                stop = True
                raise
            finally:
                t.active = None
                try:
                    t1 = now_ns()
                    cpu = (thread_time_ns() - c0, pc0, c0, runq.wait_ns() - q0, q0, process_time_ns() - pc0)
                    col._pending_dw = (t0, t1, key, cpu)
                    if stop:
                        col._end_epoch(key, t1)
                    else:
                        col._epoch_start.setdefault(key, t0)
                        if col._last_batch(it, key):
                            col._end_epoch(key, t1)
                except Exception as exc:
                    fail(exc)

        self._set(base_iter, "__next__", __next__)

        # fetch: one batch's loading work, in the training process and in DataLoader workers ------
        import torch.utils.data._utils.fetch as fetch_mod

        def wrap_fetch(orig: Any) -> Any:
            def fetch(self_: Any, possibly_batched_index: Any) -> Any:
                if not col.enabled:
                    return orig(self_, possibly_batched_index)
                if col._term_pid != os.getpid():
                    col._worker_sigterm()
                t0, c0, q0 = now_ns(), thread_time_ns(), runq.wait_ns()
                try:
                    return orig(self_, possibly_batched_index)
                finally:
                    try:
                        attrs = {"cpu_ns": thread_time_ns() - c0, "runq_ns": runq.wait_ns() - q0}
                        span("op", "fetch", t0, now_ns(), -1, attrs)
                    except Exception as exc:
                        fail(exc)

            fetch.__wrapped__ = orig  # type: ignore[attr-defined]
            return fetch

        for cls_name in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
            fcls = getattr(fetch_mod, cls_name, None)
            if fcls is not None and "fetch" in vars(fcls):
                self._set(fcls, "fetch", wrap_fetch(fcls.fetch))

        # torch.distributed: the rank is remembered when the group starts (jobs destroy it before exit)
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and hasattr(dist, "init_process_group"):
            orig_init_pg = dist.init_process_group

            def init_process_group(*args: Any, **kwargs: Any) -> Any:
                out = orig_init_pg(*args, **kwargs)
                try:
                    agent.note_distributed()
                except Exception as exc:
                    fail(exc)
                return out

            init_process_group.__wrapped__ = orig_init_pg  # type: ignore[attr-defined]
            self._set(dist, "init_process_group", init_process_group)

        agent.pollers.append(self._poll_device)
        agent.info["torch"] = {"patched": True}

    # -- optimizer steps that take a closure ---------------------------------------------------------
    def _closure_arg(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[int, Any]:
        """Where the ``closure`` of this ``step`` call is (its position in ``args``, -1 for a keyword) and
        the closure itself (None when there is none). The position comes from the signature of the
        optimizer's ``step``, looked up once per class."""
        closure = kwargs.get("closure")
        if closure is not None:
            return -1, closure if callable(closure) else None
        cls = type(optimizer)
        at = self._closure_pos.get(cls)
        if at is None:
            import inspect

            try:
                names = list(inspect.signature(cls.step).parameters)
            except (TypeError, ValueError):
                names = []
            at = names.index("closure") if "closure" in names else 0  # 0: `self`, never a closure
            self._closure_pos[cls] = at
        if 0 < at < len(args) and callable(args[at]):
            return at, args[at]
        return -1, None

    def _wrap_closure(self, closure: Any) -> Any:
        """The closure given to the optimizer, as the optimizer calls it: the same call, but the forward,
        backward and ``zero_grad`` it runs keep their own phases; the optimizer's phase is what it does
        outside the closure. The result (the loss) is the closure's, untouched."""
        col = self

        def closure_traced(*args: Any, **kwargs: Any) -> Any:
            t = col._tls
            if t.active != "optimizer" or col._opt_depth < 1 or not col.enabled:
                return closure(*args, **kwargs)
            try:
                col._end_optimizer_part(now_ns())
            except Exception as exc:
                col.agent.fail(col, exc)
                return closure(*args, **kwargs)
            t.active = None
            try:
                return closure(*args, **kwargs)
            finally:
                t.active = "optimizer"
                try:
                    col._opt_t0 = now_ns()
                    col._opt_dev = col._dev_begin()
                except Exception as exc:
                    col.agent.fail(col, exc)

        closure_traced.__wrapped__ = closure  # type: ignore[attr-defined]
        return closure_traced

    def _end_optimizer_part(self, t1: int) -> None:
        """The optimizer's phase from the start of its step (or the end of its closure) to ``t1``."""
        t0, index = self._opt_t0, self.agent.steps.index
        if t1 > t0:
            self.agent.span("phase", "optimizer", t0, t1, index)
        if self._opt_dev is not None:
            self._dev_end("optimizer", index, t0, self._opt_dev)
            self._opt_dev = None

    # -- state machine helpers (called from the patches) -------------------------------------------
    def _opt_end(self) -> None:
        """Forget an optimizer step in progress (after a failure): the phase it opened is closed."""
        if self._opt_depth > 0:
            self._tls.active = None
        self._opt_depth = 0
        self._opt_dev = None

    def _begin_forward(self, training: bool, t0: int) -> None:
        self.agent.steps.just_updated = False
        steps = self.agent.steps
        pend = self._pending_dw
        if training:
            if pend is not None and pend[2] not in self._eval_loaders:
                self._train_loaders.add(pend[2])
                steps.opener(pend[0])
                ended = self._unclaimed_epochs.pop(pend[2], None)
                if ended is not None:  # its epoch ended with the batch that made it a training loader
                    self._epoch_span(pend[2], *ended)
            else:
                steps.opener(t0)
            self._resolve_pending("data_wait")
        else:
            if pend is not None and pend[2] not in self._train_loaders:
                self._eval_loaders.add(pend[2])
            self._resolve_pending("eval")

    def _worker_sigterm(self) -> None:
        """In a DataLoader worker, flush what it recorded when its parent ends it with SIGTERM.

        PyTorch's workers answer SIGTERM with a C handler that calls ``_exit(0)`` at once: that is how
        the parent's multiprocessing ends persistent workers at exit, and the worker's records were
        lost. A Python handler does the same exit through ``os._exit``, which flushes first."""
        import signal

        self._term_pid = os.getpid()
        data = getattr(self._torch, "utils", None)
        info = getattr(getattr(data, "data", None), "get_worker_info", None)
        if info is None or info() is None or threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum: int, frame: Any) -> None:
            os._exit(0)  # as PyTorch's own handler; the agent's os._exit flushes before it exits

        signal.signal(signal.SIGTERM, on_term)

    def _resolve_pending(self, label: str | None) -> None:
        pend = self._pending_dw
        if pend is None:
            return
        self._pending_dw = None
        t0, t1, key, cpu = pend
        if label is None or (label == "data_wait" and key in self._eval_loaders):
            label = "eval" if key in self._eval_loaders else "data_wait"
        attrs = {
            "loader": key,
            "cpu_ns": cpu[0],
            "proc_cpu_ns": cpu[1],
            "thread_cpu_ns": cpu[2],
            "runq_ns": cpu[3],
            "thread_runq_ns": cpu[4],
            "proc_wait_cpu_ns": cpu[5],
        }
        self.agent.span("phase", label, t0, t1, self.agent.steps.index, attrs)

    def _new_loader(self, it: Any, key: int, t0: int) -> None:
        self._seen_loaders.add(key)
        attrs: dict[str, Any] = {"loader": key, "dataset": type(it._dataset).__name__}
        for a in ("_num_workers", "_prefetch_factor", "_pin_memory", "_persistent_workers", "_timeout"):
            if hasattr(it, a):
                attrs[a.lstrip("_")] = getattr(it, a)
        bs = getattr(getattr(it, "_index_sampler", None), "batch_size", None)
        if bs is not None:
            attrs["batch_size"] = bs
        ctx = getattr(it, "_multiprocessing_context", None)
        if ctx is not None:
            attrs["multiprocessing_context"] = getattr(ctx, "_name", str(ctx))
        # the machine the input-pipeline model needs: usable cores, torch threads, a GPU in use
        attrs.update(usable_cores())
        torch = self._torch
        if torch is not None:
            attrs["torch_threads"] = torch.get_num_threads()
            attrs["gpu"] = bool(torch.cuda.is_initialized())
        self.agent.span("op", "dataloader", t0, t0, -1, attrs)

    def _last_batch(self, it: Any, key: int) -> bool:
        """The iterator of a map-style dataset has just yielded its last batch: its epoch is over.
        Loops that stop at the loader's length (Lightning, Hugging Face) never ask for more, so the
        ``StopIteration`` that ends a plain ``for`` loop's epoch never comes. The length is read once
        per iterator (``len`` of its batch sampler, as the iterator itself computes it)."""
        if getattr(it, "_dataset_kind", None) != 0:  # torch's _DatasetKind.Map
            return False
        known = self._iter_len.get(key)
        if known is None or known[0] != id(it):
            try:
                known = (id(it), len(it._index_sampler))
            except TypeError:  # a sampler without a length
                known = (id(it), 0)
            self._iter_len[key] = known
        return 0 < known[1] <= getattr(it, "_num_yielded", 0)

    def _end_epoch(self, key: int, t1: int) -> None:
        start = self._epoch_start.pop(key, None)
        if start is None:
            return
        if key in self._train_loaders:
            self._epoch_span(key, start, t1)
        elif key not in self._eval_loaders:  # not known yet (a one-batch epoch): its use decides
            self._unclaimed_epochs[key] = (start, t1)

    def _epoch_span(self, key: int, start: int, t1: int) -> None:
        self.agent.span("epoch", "epoch", start, t1, -1, {"epoch": self._epochs, "loader": key})
        self._epochs += 1

    def finish(self) -> None:
        self._resolve_pending(None)

    # -- device time (CUDA events, resolved off the hot path) --------------------------------------
    def _dev_begin(self) -> Any:
        torch = self._torch
        if torch is None or not torch.cuda.is_initialized():
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _dev_end(self, name: str, step: int, t0: int, ev0: Any) -> None:
        torch = self._torch
        assert torch is not None
        ev1 = torch.cuda.Event(enable_timing=True)
        ev1.record()
        if len(self._dev_pending) < 100_000:
            self._dev_pending.append((name, step, t0, ev0, ev1))
        else:
            self.agent.dropped += 1

    def _poll_device(self) -> list[tuple[str, dict[str, list[Any]]]]:
        if not self._dev_pending:
            return []
        done: list[tuple[str, int, int, float]] = []
        keep = []
        for item in self._dev_pending:
            name, step, t0, ev0, ev1 = item
            if ev1.query():
                done.append((name, step, t0, ev0.elapsed_time(ev1)))
            else:
                keep.append(item)
        self._dev_pending = keep
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
