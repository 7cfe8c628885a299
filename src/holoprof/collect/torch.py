"""PyTorch, always on: steps and phases with no code change.

What is patched (each original kept, each patch undone by ``uninstall``):

* ``torch.nn.Module.__call__`` — the outermost module call of a thread is ``forward`` when autograd is
  on, ``eval`` under ``no_grad``/``inference_mode``; nested module calls pass straight through.
* ``torch.autograd.backward`` / ``torch.autograd.grad`` — ``backward`` (``Tensor.backward`` calls it).
* the global optimizer step hooks, ``Optimizer.zero_grad`` and ``Module.zero_grad`` — ``optimizer``.
* ``_BaseDataLoaderIter.__next__`` — ``data_wait``; a fetch whose batch feeds an eval forward counts
  as ``eval``; the end of a training loader is an epoch boundary. Its attributes carry the CPU time
  of the waiting thread (``cpu_ns``: the loading itself without workers, receiving a batch with them)
  and its run-queue wait (``runq_ns``), and, when the wait began, the process's CPU time
  (``proc_cpu_ns``), the thread's (``thread_cpu_ns``) and its run-queue wait so far
  (``thread_runq_ns``), which the input-pipeline model turns into CPU per step and the share of a
  core the training thread got.
* the dataset fetchers (``_MapDatasetFetcher.fetch``, ``_IterableDatasetFetcher.fetch``) — an
  ``op`` span ``fetch`` per batch with its thread CPU time (``cpu_ns``) and time spent waiting for a
  CPU (``runq_ns``), in the training process and in every DataLoader worker.
* ``torch.save`` / ``torch.load`` — ``checkpoint``, with the path and bytes.

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

from holoprof import model
from holoprof.agent.core import Agent, Collector, now_ns
from holoprof.agent.setup import post_import_finder
from holoprof.collect.util import path_bytes, usable_cores

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


class _Fault(RuntimeError):
    pass


class TorchCollector(Collector):
    name = "torch"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self._fault = os.environ.get(model.ENV_FAULT) == self.name
        self._reset_state()
        self._torch: ModuleType | None = None

    def _reset_state(self) -> None:
        self._tls = self.agent.tls
        # (start, end, loader, (cpu, process cpu at start, thread cpu at start, run-queue wait, at start))
        self._pending_dw: tuple[int, int, int, tuple[int, int, int, int, int]] | None = None
        self._train_loaders: set[int] = set()
        self._eval_loaders: set[int] = set()
        self._seen_loaders: set[int] = set()
        self._epoch_start: dict[int, int] = {}
        self._epochs = 0
        self._opt_depth = 0
        self._opt_t0 = 0
        self._opt_dev: Any = None
        self._dev_pending: list[tuple[str, int, int, Any, Any]] = []

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
                t0 = now_ns()
                if col._fault:
                    raise _Fault("injected fault (HOLOPROF_FAULT_INJECT=torch)")
                training = is_grad_enabled()
                name = "forward" if training else "eval"
                col._begin_forward(training, t0)
                dev = col._dev_begin()
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
        def opt_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not col.enabled:
                return
            try:
                col._opt_depth += 1
                if col._opt_depth == 1:
                    if col._tls.active is not None:
                        col._opt_depth = -1_000_000  # nested inside another phase: not ours
                        return
                    col._opt_t0 = now_ns()
                    col._opt_dev = col._dev_begin()
                    col._tls.active = "optimizer"
                    steps.optimizer_seen = True
            except Exception as exc:
                fail(exc)

        def opt_post(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not col.enabled:
                return
            try:
                col._opt_depth -= 1
                if col._opt_depth < 0:
                    col._opt_depth = 0
                    return
                if col._opt_depth == 0:
                    col._tls.active = None
                    t0, t1 = col._opt_t0, now_ns()
                    steps.activity(t0)
                    span("phase", "optimizer", t0, t1, steps.index)
                    if col._opt_dev is not None:
                        col._dev_end("optimizer", steps.index, t0, col._opt_dev)
                        col._opt_dev = None
                    steps.update_done(t1)
            except Exception as exc:
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
                key = id(it._dataset)
                if key not in col._seen_loaders:
                    col._new_loader(it, key, t0)
                col._resolve_pending(None)
                steps.just_updated = False
                if key in col._train_loaders:
                    steps.opener(t0)
                col._epoch_start.setdefault(key, t0)
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
                    col._pending_dw = (t0, t1, key, (thread_time_ns() - c0, pc0, c0, runq.wait_ns() - q0, q0))
                    if stop:
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

        # checkpoints -------------------------------------------------------------------------------
        def wrap_ckpt(orig: Any, op: str, api: str) -> Any:
            def ckpt(*args: Any, **kwargs: Any) -> Any:
                t = col._tls
                if t.active is not None or not col.enabled:
                    return orig(*args, **kwargs)
                t0 = now_ns()
                t.active = "checkpoint"
                try:
                    return orig(*args, **kwargs)
                finally:
                    t.active = None
                    try:
                        t1 = now_ns()
                        if api.startswith("torch.distributed"):
                            target = kwargs.get("checkpoint_id")
                        elif op == "save":
                            target = args[1] if len(args) > 1 else kwargs.get("f")
                        else:
                            target = args[0] if args else kwargs.get("f")
                        attrs: dict[str, Any] = {"op": op, "api": api}
                        if isinstance(target, (str, os.PathLike)):
                            attrs["path"] = os.path.abspath(os.fspath(target))
                            size = path_bytes(attrs["path"])
                            if size is not None:
                                attrs["bytes"] = size
                        span("phase", "checkpoint", t0, t1, steps.index, attrs)
                    except Exception as exc:
                        fail(exc)

            ckpt.__wrapped__ = orig  # type: ignore[attr-defined]
            ckpt.__doc__ = orig.__doc__
            return ckpt

        self._set(torch, "save", wrap_ckpt(torch.save, "save", "torch.save"))
        self._set(torch, "load", wrap_ckpt(torch.load, "load", "torch.load"))

        def on_dcp(dcp: ModuleType) -> None:
            if not self.enabled:
                return
            try:
                for meth, op in (("save", "save"), ("load", "load"), ("async_save", "save")):
                    if hasattr(dcp, meth):
                        self._set(
                            dcp,
                            meth,
                            wrap_ckpt(getattr(dcp, meth), op, f"torch.distributed.checkpoint.{meth}"),
                        )
            except Exception as exc:
                fail(exc)

        post_import_finder().add("torch.distributed.checkpoint", on_dcp)

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

    # -- state machine helpers (called from the patches) -------------------------------------------
    def _begin_forward(self, training: bool, t0: int) -> None:
        self.agent.steps.just_updated = False
        steps = self.agent.steps
        pend = self._pending_dw
        if training:
            if pend is not None and pend[2] not in self._eval_loaders:
                self._train_loaders.add(pend[2])
                steps.opener(pend[0])
            else:
                steps.opener(t0)
            self._resolve_pending("data_wait")
        else:
            if pend is not None and pend[2] not in self._train_loaders:
                self._eval_loaders.add(pend[2])
            self._resolve_pending("eval")

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

    def _end_epoch(self, key: int, t1: int) -> None:
        start = self._epoch_start.pop(key, None)
        if start is not None and key in self._train_loaders:
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
