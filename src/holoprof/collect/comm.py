"""torch.distributed, always on: collectives as ``comm`` spans, exposed communication, DDP buckets.

What is patched (each original kept, each patch undone by ``uninstall``):

* every collective and point-to-point call of ``torch.distributed`` (``all_reduce``, ``broadcast``,
  ``all_gather``, ``all_gather_single``/``all_gather_into_tensor`` and
  ``reduce_scatter_single``/``reduce_scatter_tensor`` — FSDP2's —, ..., ``send``/``recv``/
  ``isend``/``irecv``, ``barrier``), looked up on ``torch.distributed`` when the job (or FSDP) makes
  it — one ``comm`` span named after the call, with attrs ``{bytes, group_size, backend, async, group, seq}``.
  ``bytes`` is what this rank contributes (the input tensor or tensors: an all-gather's shard, a
  reduce-scatter's whole input). A synchronous call times the call itself; an asynchronous one
  (``async_op=True``, ``isend``/``irecv``) is timed until its work completes, observed through
  ``Work.get_future().then(...)`` — no wait is added — or, where the backend has no future for that
  work (gloo point-to-point), when the job's own ``Work.wait()`` returns.
  ``group`` names the process group as every rank names it (its ``group_name``) and ``seq`` numbers
  the calls on that group in this process, from 1 — the hang watchdog's ring
  (:mod:`holoprof.collect.hangs`) keeps the one count, DTensor's functional collectives included:
  every rank calls a group's collectives in the same order, so the same ``(group, seq)`` on two ranks
  is the same collective (how hosts' clocks are aligned, :mod:`holoprof.store.clocks`, and how a hang
  names the collective the ranks wait in).
* DTensor's functional collectives (:mod:`holoprof.collect.comm_functional`): the same spans, with
  ``api: "functional"``, from their issue to the wait that observed their completion.
* Exposed communication — what the job waited for: a synchronous collective, ``Work.wait()`` or a
  functional collective's wait on a thread that has no phase open is also recorded as a
  ``communication`` phase; inside forward, backward or the optimizer step (FSDP's all-gathers before
  a unit's forward and backward, its reduce-scatters, the wait for an all-gather prefetched with
  ``async_op=True``) it is carved out of that phase (:mod:`holoprof.collect.waits`). An asynchronous
  collective is exposed for its wait, never for its issue. Calls that ``torch.compile`` traces pass
  straight through.
* ``DistributedDataParallel``: a comm hook that does exactly what DDP does without one (sum the
  bucket across ranks, then divide by the group size) is registered at construction, so that each
  gradient bucket becomes a ``ddp_bucket`` span from the moment it is ready during backward until
  its allreduce completes, with attrs ``{bucket_index, bytes, ready_ns}`` and, whenever a bucket's
  content changes (the first step, after DDP rebuilds its buckets), ``params`` and ``param_bytes``.
  The time the last bucket was ready is the end of backward's compute: the rest of the backward
  call waits for the allreduce, and the PyTorch collector records it as a ``communication`` phase
  (``{"op": "ddp_allreduce"}``) instead of ``backward``.
  A hook the job registers later (``register_comm_hook``, ``_register_builtin_comm_hook``) is not
  displaced: it runs inside the recording wrapper instead of the default.

When the job imports torch, before it can make a process group, the size of torch's own flight
recorder is settled (:func:`holoprof.collect.flight_recorder.buffer_setting`: the user's kept, torch's
default kept, a small one turned on where torch has none); the hang watchdog reads that recorder.

The layer sampler (``holoprof.collect.layers``) is installed with this collector: it timestamps when
each parameter's gradient is produced during a few sampled steps, the input of ``holoprof whatif``.
"""

from __future__ import annotations

import inspect
import os
import threading
from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, now_ns
from holoprof.agent.setup import post_import_finder
from holoprof.collect.comm_functional import FunctionalCollectives, sent_bytes
from holoprof.collect.flight_recorder import buffer_setting
from holoprof.collect.hangs import CollectiveRing, HangWatch, completed, group_name
from holoprof.collect.torch.base import TorchImportCollector
from holoprof.collect.waits import CARVED, note_wait

#: The patched calls, and the parameter holding what this rank sends (a tensor or a list of tensors).
COLLECTIVES: dict[str, str | None] = {
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "all_gather_single": "input_tensor",  # FSDP2's all-gather in recent torch
    "all_gather_coalesced": "input_tensor_list",
    "_all_gather_base": "input_tensor",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
    "reduce_scatter_single": "input",  # FSDP2's reduce-scatter in recent torch
    "_reduce_scatter_base": "input",
    "all_reduce_coalesced": "tensors",
    "all_to_all": "input_tensor_list",
    "all_to_all_single": "input",
    "barrier": None,
    "send": "tensor",
    "recv": "tensor",
    "isend": "tensor",
    "irecv": "tensor",
    "reduce": "tensor",
    "gather": "tensor",
    "scatter": "tensor",
}
ALWAYS_ASYNC = frozenset({"isend", "irecv"})
_MAX_PENDING = 10_000


class _Nesting(threading.local):
    depth = 0


class CommCollector(TorchImportCollector):
    name = "comm"
    default_fault = "collective"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self._nest = _Nesting()
        self._groups: dict[int, tuple[int, str]] = {}
        self._group_names: dict[int, str] = {}
        self.ring = CollectiveRing()  # the last collectives, for the hang watchdog
        self.watch = HangWatch(agent, self.ring)
        #: the name of each process group -> the number of the next call on it
        self._pending: dict[int, tuple[str, int, int, dict[str, Any], list[Any] | None]] = {}
        self._async_names: dict[int, str] = {}  # id of an asynchronous collective's work -> its call
        self._functional = FunctionalCollectives(self, self)
        self._dist: Any = None
        self._is_compiling: Any = _never
        self._sampler: Any = None

    # -- install -----------------------------------------------------------------------------------
    def install(self) -> None:
        super().install()
        self.agent.pollers.append(self.watch.poll)

    def _patch(self, torch: ModuleType) -> None:
        """The job imported torch: patch its collectives, then attach the per-layer sampler."""
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available():
            # before the job can make a process group: torch reads the buffer size once, then
            self.watch.flight.setting = buffer_setting(os.environ, str(torch.__version__))
            self._patch_dist(torch, dist)
        # lazy: loaded only when this runs, not when the agent starts
        from holoprof.collect.layers import LayerSampler

        self._sampler = LayerSampler(self.agent, self)
        self._sampler.attach(torch)

    def after_fork_child(self) -> None:
        self._nest = _Nesting()
        self._pending = {}
        self._async_names = {}
        self._functional.reset()
        self.ring = CollectiveRing()
        self.watch.ring = self.ring
        self.watch.reset()
        if self.enabled and self.watch.poll not in self.agent.pollers:
            self.agent.pollers.append(self.watch.poll)

    def _on_functional(self, funcol: ModuleType) -> None:
        if not self.enabled or self._dist is None:
            return
        try:
            self._functional.install(funcol, self._dist, self._is_compiling)
        except Exception as exc:
            self.agent.fail(self, exc)

    def uninstall(self) -> None:
        super().uninstall()
        try:
            self.agent.pollers.remove(self.watch.poll)
        except ValueError:
            pass
        if self._sampler is not None:
            self._sampler.detach()

    # -- helpers -----------------------------------------------------------------------------------
    def _group_info(self, dist: Any, group: Any) -> tuple[int, str]:
        key = id(group)
        info = self._groups.get(key)
        if info is None:
            try:
                size = int(dist.get_world_size(group)) if group is not None else int(dist.get_world_size())
            except Exception:
                size = -1
            try:
                backend = str(dist.get_backend(group)) if group is not None else str(dist.get_backend())
            except Exception:
                backend = "?"
            info = (size, backend)
            if len(self._groups) < 1000:
                self._groups[key] = info
        return info

    def finish(self) -> None:
        self.watch.finish()

    def group_name(self, dist: Any, group: Any) -> str:
        key = id(group)
        name = self._group_names.get(key)
        if name is None:
            name = group_name(dist, group)
            if len(self._group_names) < 1000:
                self._group_names[key] = name
        return name

    def _done(
        self, name: str, t0: int, step: int, attrs: dict[str, Any], entry: list[Any] | None = None
    ) -> None:
        try:
            t1 = now_ns()
            completed(entry, t1)
            self.agent.span("comm", name, t0, t1, step, attrs)
        except Exception as exc:
            self.agent.fail(self, exc)

    def _track_async(
        self, work: Any, name: str, t0: int, step: int, attrs: dict[str, Any], entry: list[Any] | None
    ) -> None:
        """Record the span when ``work`` completes, without waiting for it."""
        names = self._async_names
        if len(names) >= _MAX_PENDING:
            names.clear()  # works never waited for: only their names, for a later wait's phase
        names[id(work)] = name
        fut = None
        if name not in ALWAYS_ASYNC:  # gloo has no future for point-to-point work
            try:
                fut = work.get_future()
            except Exception:
                fut = None
        if fut is not None:

            def _cb(_f: Any) -> None:
                self._done(name, t0, step, attrs, entry)

            fut.then(_cb)
            return
        if len(self._pending) < _MAX_PENDING:
            self._pending[id(work)] = (name, t0, step, attrs, entry)
        else:
            self.agent.dropped += 1

    # -- the patches -------------------------------------------------------------------------------
    def _patch_dist(self, torch: ModuleType, dist: Any) -> None:
        compiler = getattr(torch, "compiler", None)
        self._is_compiling = getattr(compiler, "is_compiling", None) or _never
        self._dist = dist
        c10d = getattr(dist, "distributed_c10d", None)
        for name, arg in COLLECTIVES.items():
            orig = getattr(dist, name, None)
            if orig is None or not callable(orig):
                continue
            wrapped = self._wrap(dist, name, arg, orig)
            self._set(dist, name, wrapped)
            if c10d is not None and getattr(c10d, name, None) is orig:
                self._set(c10d, name, wrapped)
        self._patch_work(dist)
        self._patch_ddp(torch, dist)
        # DTensor's collectives, once something imports them
        post_import_finder().add("torch.distributed._functional_collectives", self._on_functional)
        self.agent.info["comm"] = {"patched": True}

    def _wrap(self, dist: Any, name: str, arg: str | None, orig: Any) -> Any:
        col = self
        agent = self.agent
        steps = agent.steps
        try:
            params = list(inspect.signature(orig).parameters)
        except (TypeError, ValueError):
            params = []
        arg_pos = params.index(arg) if arg in params else -1
        group_pos = params.index("group") if "group" in params else -1
        always_async = name in ALWAYS_ASYNC
        is_compiling = self._is_compiling

        def collective(*args: Any, **kwargs: Any) -> Any:
            if is_compiling():  # torch.compile maps it to its own collective: nothing of ours there
                return orig(*args, **kwargs)
            nest = col._nest
            if nest.depth or not col.enabled:
                return orig(*args, **kwargs)
            try:
                if col.fault_at:
                    col.inject("collective")
                nbytes = _arg_bytes(args, kwargs, arg, arg_pos)
                group = kwargs.get("group")
                if group is None and 0 <= group_pos < len(args):
                    group = args[group_pos]
                size, backend = col._group_info(dist, group)
                gname = col.group_name(dist, group)
                is_async = always_async or bool(kwargs.get("async_op", False))
                tls = agent.tls
                active = tls.active
                exposed = not is_async and active is None
                carved = not is_async and active in CARVED
                step = steps.index
                t0 = now_ns()
                entry = col.ring.issued(gname, name, nbytes, t0)
                attrs: dict[str, Any] = {
                    "bytes": nbytes,
                    "group_size": size,
                    "backend": backend,
                    "async": is_async,
                    "group": gname,
                    "seq": entry[1],  # the hang ring's number of it on its group: one count
                }
            except Exception as exc:
                agent.fail(col, exc)
                return orig(*args, **kwargs)
            nest.depth += 1
            if exposed:
                tls.active = "communication"
            try:
                out = orig(*args, **kwargs)
            except BaseException:
                completed(entry, now_ns())  # it failed: no longer waited for
                raise
            finally:
                nest.depth -= 1
                if exposed:
                    tls.active = None
            try:
                if out is not None and hasattr(out, "wait"):
                    attrs["async"] = True
                    col._track_async(out, name, t0, step, attrs, entry)
                else:
                    t1 = now_ns()
                    completed(entry, t1)
                    agent.span("comm", name, t0, t1, step, attrs)
                    if exposed:
                        agent.span("phase", "communication", t0, t1, step, {"op": name})
                    elif carved:  # the phase waited for it: not forward's (backward's) time
                        note_wait(tls, t0, t1, name)
            except Exception as exc:
                agent.fail(col, exc)
            return out

        collective.__wrapped__ = orig  # type: ignore[attr-defined]
        collective.__doc__ = orig.__doc__
        collective.__name__ = name
        return collective

    def _patch_work(self, dist: Any) -> None:
        """``Work.wait()``: completes point-to-point spans; outside a phase it is exposed communication."""
        work_cls = getattr(getattr(dist, "distributed_c10d", dist), "Work", None)
        if work_cls is None:
            return
        orig_wait = work_cls.wait
        col = self
        agent = self.agent
        is_compiling = self._is_compiling

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if is_compiling() or not col.enabled:
                return orig_wait(work, *args, **kwargs)
            tls = agent.tls
            outer = col._nest.depth == 0
            active = tls.active
            exposed = outer and active is None
            carved = outer and active in CARVED
            t0 = now_ns()
            if exposed:
                tls.active = "communication"
            try:
                return orig_wait(work, *args, **kwargs)
            finally:
                if exposed:
                    tls.active = None
                try:
                    t1 = now_ns()
                    if col.fault_at:
                        col.inject("wait")
                    pend = col._pending.pop(id(work), None) if col._pending else None
                    if pend is not None:
                        name, s0, step, attrs, entry = pend
                        completed(entry, t1)
                        agent.span("comm", name, s0, t1, step, attrs)
                    op = col._async_names.pop(id(work), "wait") if col._async_names else "wait"
                    if exposed and t1 - t0 > 0:
                        agent.span("phase", "communication", t0, t1, agent.steps.index, {"op": op})
                    elif carved and t1 - t0 > 0:
                        note_wait(tls, t0, t1, op)
                except Exception as exc:
                    agent.fail(col, exc)

        self._set(work_cls, "wait", wait)

    # -- DistributedDataParallel -------------------------------------------------------------------
    def _patch_ddp(self, torch: ModuleType, dist: Any) -> None:
        try:
            # lazy: the job's framework, imported by the job, never by the agent
            from torch.nn.parallel import distributed as ddp_mod
        except Exception:
            return
        ddp_cls = ddp_mod.DistributedDataParallel
        col = self
        orig_init = ddp_cls.__init__
        orig_register = ddp_cls.register_comm_hook
        orig_builtin = getattr(ddp_cls, "_register_builtin_comm_hook", None)
        slots: dict[int, _DDPSlot] = {}
        self._ddp_slots = slots

        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(ddp, *args, **kwargs)
            if not col.enabled:
                return
            try:
                if (
                    getattr(ddp, "_comm_hooks", None)  # mixed precision registered its own
                    or getattr(ddp, "_use_python_reducer", False)
                    or getattr(ddp, "reducer", None) is None
                ):
                    return
                slot = _DDPSlot(col, dist, ddp)
                orig_register(ddp, ddp.process_group, slot.registered())
                slots[id(ddp)] = slot
            except Exception as exc:
                col.agent.fail(col, exc)

        def register_comm_hook(ddp: Any, state: object, hook: Any) -> None:
            slot = slots.get(id(ddp))
            if slot is None or slot.user is not None or not col.enabled:
                return orig_register(ddp, state, hook)
            ddp._check_comm_hook(hook)  # the same validation, the same errors
            slot.user = (hook, state)
            try:
                ddp.logger._set_comm_hook_name(getattr(hook, "__qualname__", str(hook)))
            except Exception:
                pass
            return None

        def _register_builtin_comm_hook(ddp: Any, comm_hook_type: Any) -> None:
            slot = slots.get(id(ddp))
            assert orig_builtin is not None
            if slot is None or slot.user is not None or not col.enabled:
                return orig_builtin(ddp, comm_hook_type)
            # lazy: the job's framework, imported by the job, never by the agent
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            kind = str(getattr(comm_hook_type, "name", comm_hook_type))
            if "FP16" in kind:
                slot.user = (default_hooks.fp16_compress_hook, ddp.process_group)
            elif "ALLREDUCE" not in kind:  # unknown: hand it to DDP (our default stays for this model)
                return orig_builtin(ddp, comm_hook_type)
            return None

        self._set(ddp_cls, "__init__", __init__)
        self._set(ddp_cls, "register_comm_hook", register_comm_hook)
        if orig_builtin is not None:
            self._set(ddp_cls, "_register_builtin_comm_hook", _register_builtin_comm_hook)


class _DDPSlot:
    """The hook registered on one DDP model: records each bucket, runs the job's hook or the default."""

    def __init__(self, col: CommCollector, dist: Any, ddp: Any) -> None:
        self.col = col
        self.dist = dist
        self.pg = ddp.process_group
        self.size = int(self.pg.size())
        self.user: tuple[Any, object] | None = None
        self.names: dict[int, str] | None = None
        self.module = ddp.module
        self.seen: dict[int, tuple[int, ...]] = {}
        self.sizes: dict[int, int] = {}

    def _default(self, bucket: Any) -> Any:
        size = self.size
        buf = bucket.buffer()
        fut = self.dist.all_reduce(buf, group=self.pg, async_op=True).get_future()

        def _avg(f: Any) -> Any:
            t = f.value()[0]
            return t.div_(size)  # sum, then divide: what DDP does without a hook

        return fut.then(_avg)

    def registered(self) -> Any:
        """The function given to DDP: unannotated, as DDP's signature check wants (bucket: GradBucket)."""
        hook = self.hook

        def holoprof_ddp_hook(state, bucket):  # type: ignore[no-untyped-def,unused-ignore]
            return hook(state, bucket)

        return holoprof_ddp_hook

    def hook(self, state: object, bucket: Any) -> Any:
        t0 = now_ns()
        user = self.user
        fut = self._default(bucket) if user is None else user[0](user[1], bucket)
        col = self.col
        if not col.enabled:
            return fut
        try:
            agent = col.agent
            agent.bucket_ready_ns = t0  # backward's compute is over once the last bucket is ready
            step = agent.steps.index
            index = int(bucket.index())
            buf = bucket.buffer()
            attrs: dict[str, Any] = {
                "bucket_index": index,
                "bytes": int(buf.numel()) * int(buf.element_size()),
                "ready_ns": t0 + agent.clock_offset_ns,
                "world_size": self.size,
            }
            if user is not None:
                attrs["hook"] = getattr(user[0], "__qualname__", "?")
            # which parameters a bucket holds changes only when DDP rebuilds buckets (after the first
            # step): look during the first steps and whenever a bucket's size changes
            if step < 3 or self.sizes.get(index) != attrs["bytes"]:
                self.sizes[index] = attrs["bytes"]
                self._describe(index, bucket, attrs)

            def _cb(_f: Any) -> None:
                col._done("ddp_bucket", t0, step, attrs)

            fut.then(_cb)
        except Exception as exc:
            col.agent.fail(col, exc)
        return fut

    def _describe(self, index: int, bucket: Any, attrs: dict[str, Any]) -> None:
        params = bucket.parameters()
        key = tuple(id(p) for p in params)
        if self.seen.get(index) != key:
            self.seen[index] = key
            if self.names is None:
                self.names = {id(p): n for n, p in self.module.named_parameters()}
            attrs["params"] = [self.names.get(id(p), "?") for p in params]
            attrs["param_bytes"] = [int(p.numel()) * int(p.element_size()) for p in params]


def _arg_bytes(args: tuple[Any, ...], kwargs: dict[str, Any], arg: str | None, pos: int) -> int:
    """Bytes of what a call sends: its argument ``arg`` (at position ``pos``); 0 without one."""
    if arg is None:
        return 0
    if arg in kwargs:
        return sent_bytes(kwargs[arg])
    return sent_bytes(args[pos]) if 0 <= pos < len(args) else 0


def _never() -> bool:
    return False
