"""torch.distributed, always on: collectives as ``comm`` spans, exposed communication, DDP buckets.

What is patched (each original kept, each patch undone by ``uninstall``):

* every collective and point-to-point call of ``torch.distributed`` (``all_reduce``, ``broadcast``,
  ``all_gather``, ..., ``send``/``recv``/``isend``/``irecv``, ``barrier``) — one ``comm`` span named
  after the call, with attrs ``{bytes, group_size, backend, async, group, seq}``. ``bytes`` is what this rank
  contributes (the input tensor or tensors). A synchronous call times the call itself; an
  asynchronous one (``async_op=True``, ``isend``/``irecv``) is timed until its work completes,
  observed through ``Work.get_future().then(...)`` — no wait is added — or, where the backend has no
  future for that work (gloo point-to-point), when the job's own ``Work.wait()`` returns.
  ``group`` names the process group as every rank names it (its ``group_name``) and ``seq`` numbers
  the calls on that group in this process, from 0: every rank calls a group's collectives in the same
  order, so the same ``(group, seq)`` on two ranks is the same collective (how hosts' clocks are
  aligned, :mod:`holoprof.store.clocks`).
* A synchronous collective on a thread that has no phase open (outside forward, backward, the
  optimizer) is exposed communication: it is also recorded as a ``communication`` phase. Inside a
  phase (a collective in forward, DDP's allreduce during backward) only the ``comm`` span is written.
  ``Work.wait()`` called outside a phase is exposed communication too.
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

The layer sampler (``holoprof.collect.layers``) is installed with this collector: it timestamps when
each parameter's gradient is produced during a few sampled steps, the input of ``holoprof whatif``.
"""

from __future__ import annotations

import inspect
import threading
from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, Collector, now_ns
from holoprof.agent.setup import post_import_finder

#: The patched calls, and the parameter holding what this rank sends (a tensor or a list of tensors).
COLLECTIVES: dict[str, str | None] = {
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
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


def _nbytes(x: Any) -> int:
    if x is None:
        return 0
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    try:
        return int(x.numel()) * int(x.element_size())
    except Exception:
        return 0


class _Nesting(threading.local):
    depth = 0


class CommCollector(Collector):
    name = "comm"
    default_fault = "collective"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self._nest = _Nesting()
        self._groups: dict[int, tuple[int, str]] = {}
        #: the name of each process group -> the number of the next call on it
        self._seqs: dict[str, int] = {}
        self._pending: dict[int, tuple[str, int, int, dict[str, Any]]] = {}
        self._sampler: Any = None

    # -- install -----------------------------------------------------------------------------------
    def install(self) -> None:
        post_import_finder().add("torch", self._on_torch)

    def _on_torch(self, torch: ModuleType) -> None:
        if not self.enabled:
            return
        try:
            dist = getattr(torch, "distributed", None)
            if dist is not None and dist.is_available():
                self._patch(torch, dist)
        except Exception as exc:
            self.agent.fail(self, exc)
        try:
            # lazy: loaded only when this runs, not when the agent starts
            from holoprof.collect.layers import LayerSampler

            self._sampler = LayerSampler(self.agent, self)
            self._sampler.attach(torch)
        except Exception as exc:
            self.agent.fail(self, exc)

    def after_fork_child(self) -> None:
        self._nest = _Nesting()
        self._seqs = {}
        self._pending = {}

    def uninstall(self) -> None:
        super().uninstall()
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

    def _sequence(self, dist: Any, group: Any) -> tuple[str, int]:
        """The name of ``group`` (None: the default group) as every rank knows it, and the number of
        this call on it. Counted by name, not by the group object: ``group=None`` and
        ``dist.group.WORLD`` are one group, and no group is kept alive past its destruction."""
        try:
            pg = group if group is not None else dist.distributed_c10d._get_default_group()
            name = str(getattr(pg, "group_name", "") or dist.get_process_group_ranks(pg))
        except Exception:
            name = "?"
        seq = self._seqs.get(name, 0)
        if seq or len(self._seqs) < 1000:
            self._seqs[name] = seq + 1
        return name, seq

    def _done(self, name: str, t0: int, step: int, attrs: dict[str, Any]) -> None:
        try:
            self.agent.span("comm", name, t0, now_ns(), step, attrs)
        except Exception as exc:
            self.agent.fail(self, exc)

    def _track_async(self, work: Any, name: str, t0: int, step: int, attrs: dict[str, Any]) -> None:
        """Record the span when ``work`` completes, without waiting for it."""
        fut = None
        if name not in ALWAYS_ASYNC:  # gloo has no future for point-to-point work
            try:
                fut = work.get_future()
            except Exception:
                fut = None
        if fut is not None:

            def _cb(_f: Any) -> None:
                self._done(name, t0, step, attrs)

            fut.then(_cb)
            return
        if len(self._pending) < _MAX_PENDING:
            self._pending[id(work)] = (name, t0, step, attrs)
        else:
            self.agent.dropped += 1

    # -- the patches -------------------------------------------------------------------------------
    def _patch(self, torch: ModuleType, dist: Any) -> None:
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

        def collective(*args: Any, **kwargs: Any) -> Any:
            nest = col._nest
            if nest.depth or not col.enabled:
                return orig(*args, **kwargs)
            try:
                if col.fault_at:
                    col.inject("collective")
                if arg is None:
                    nbytes = 0
                elif arg in kwargs:
                    nbytes = _nbytes(kwargs[arg])
                else:
                    nbytes = _nbytes(args[arg_pos]) if 0 <= arg_pos < len(args) else 0
                group = kwargs.get("group")
                if group is None and 0 <= group_pos < len(args):
                    group = args[group_pos]
                size, backend = col._group_info(dist, group)
                gname, seq = col._sequence(dist, group)
                is_async = always_async or bool(kwargs.get("async_op", False))
                attrs: dict[str, Any] = {
                    "bytes": nbytes,
                    "group_size": size,
                    "backend": backend,
                    "async": is_async,
                    "group": gname,
                    "seq": seq,
                }
                tls = agent.tls
                exposed = not is_async and tls.active is None
                step = steps.index
                t0 = now_ns()
            except Exception as exc:
                agent.fail(col, exc)
                return orig(*args, **kwargs)
            nest.depth += 1
            if exposed:
                tls.active = "communication"
            try:
                out = orig(*args, **kwargs)
            finally:
                nest.depth -= 1
                if exposed:
                    tls.active = None
            try:
                if out is not None and hasattr(out, "wait"):
                    attrs["async"] = True
                    col._track_async(out, name, t0, step, attrs)
                else:
                    t1 = now_ns()
                    agent.span("comm", name, t0, t1, step, attrs)
                    if exposed:
                        agent.span("phase", "communication", t0, t1, step, {"op": name})
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

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if not col.enabled:
                return orig_wait(work, *args, **kwargs)
            tls = agent.tls
            exposed = tls.active is None and col._nest.depth == 0
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
                        name, s0, step, attrs = pend
                        agent.span("comm", name, s0, t1, step, attrs)
                    if exposed and t1 - t0 > 0:
                        agent.span("phase", "communication", t0, t1, agent.steps.index, {"op": "wait"})
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
