"""DTensor's communication: torch's functional collectives, as ``comm`` spans like the others.

DTensor (and so FSDP2's gradient clipping, tensor parallelism, ``full_tensor()``) communicates through
``torch.distributed._functional_collectives`` (``all_reduce``, ``all_gather_single``,
``reduce_scatter_single``, ...): each issues the collective and returns at once an
``AsyncCollectiveTensor``, which waits (``wait_tensor``) when its value is first used. Each call,
looked up on the module when DTensor makes it, is patched: the collective is one ``comm`` span named
after the call, from its issue to the end of the wait that observed its completion, with attrs
``{bytes, group_size, backend, async: true, api: "functional"}`` (``bytes``: what this rank sends).
The wait is the time the job waited for it: outside any phase a ``communication`` phase; inside
forward, backward or the optimizer step, carved out of that phase (:mod:`holoprof.collect.waits`);
its issue is not. Calls traced by ``torch.compile`` pass straight through (nothing of holoprof's in
the graph), and so do the calls a collective makes itself.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, Protocol

from holoprof.agent.core import Collector, now_ns
from holoprof.collect.hangs import completed
from holoprof.collect.waits import CARVED, note_wait

#: The patched calls: what this rank sends is their first argument (a tensor or a list of tensors).
FUNCTIONAL = (
    "all_reduce",
    "broadcast",
    "all_gather_single",
    "all_gather_tensor",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "permute_tensor",
    "all_reduce_coalesced",
    "all_gather_single_coalesced",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced",
)
_MAX_PENDING = 10_000

#: A collective in flight: [call, issue time, step, attrs, completed, its ring buffer entry]
Entry = list[Any]


class CommLike(Protocol):
    """What the patches use of the comm collector besides what every collector has."""

    _nest: Any  # the thread's nesting of collectives (a collective's own calls pass through)
    ring: Any  # the ring buffer of the process's collectives (holoprof.collect.hangs)

    def _group_info(self, dist: Any, group: Any) -> tuple[int, str]: ...

    def group_name(self, dist: Any, group: Any) -> str: ...


def _storage_key(t: Any) -> int:
    """The collective's output storage, which ``wait_tensor`` receives (or a view of it)."""
    return int(t.untyped_storage().data_ptr())


class FunctionalCollectives:
    """The patches of one process (``pending``: the collectives issued, not waited yet)."""

    def __init__(self, collector: Collector, comm: CommLike) -> None:
        self.col = collector  # the comm collector, as a collector and (``comm``) as itself
        self.comm = comm
        self.pending: dict[int, Entry] = {}

    def reset(self) -> None:
        self.pending = {}

    def install(self, funcol: ModuleType, dist: Any, is_compiling: Any) -> None:
        for name in FUNCTIONAL:
            orig = getattr(funcol, name, None)
            if callable(orig):
                self.col._set(funcol, name, self._wrap(name, orig, dist, is_compiling))
        orig_wait = getattr(funcol, "wait_tensor", None)
        if callable(orig_wait):
            self.col._set(funcol, "wait_tensor", self._wrap_wait(orig_wait, is_compiling))

    # -- the group of a call -----------------------------------------------------------------------
    def _group(self, dist: Any, group: Any) -> tuple[int, str, str]:
        """(size, backend, name) of a functional collective's group: a process group, its name, a
        device mesh (of one dimension), (mesh, dimension), or a list of ranks."""
        if isinstance(group, list):
            return (len(group), "?", "ranks " + ",".join(str(r) for r in group))
        pg = group
        if isinstance(group, str):
            pg = dist.distributed_c10d._resolve_process_group(group)
        elif isinstance(group, tuple) and len(group) == 2:
            pg = group[0].get_group(group[1])
        elif hasattr(group, "get_group"):  # a DeviceMesh
            pg = group.get_group(0)
        size, backend = self.comm._group_info(dist, pg)
        return size, backend, self.comm.group_name(dist, pg)

    # -- the patches -------------------------------------------------------------------------------
    def _wrap(self, name: str, orig: Any, dist: Any, is_compiling: Any) -> Any:
        col = self.col
        agent = col.agent
        steps = agent.steps
        try:
            params = list(inspect.signature(orig).parameters)
        except (TypeError, ValueError):
            params = []
        first = params[0] if params else ""
        group_pos = params.index("group") if "group" in params else -1

        def collective(*args: Any, **kwargs: Any) -> Any:
            if is_compiling():
                return orig(*args, **kwargs)
            nest = self.comm._nest
            if nest.depth or not col.enabled:
                return orig(*args, **kwargs)
            t0 = now_ns()
            nest.depth += 1
            try:
                out = orig(*args, **kwargs)
            finally:
                nest.depth -= 1
            try:
                sent = args[0] if args else kwargs.get(first)
                group = kwargs.get("group")
                if group is None and 0 <= group_pos < len(args):
                    group = args[group_pos]
                size, backend, gname = self._group(dist, group)
                attrs = {
                    "bytes": sent_bytes(sent),
                    "group_size": size,
                    "backend": backend,
                    "async": True,
                    "api": "functional",
                }
                ring_entry = self.comm.ring.issued(gname, name, attrs["bytes"], t0)
                self._issued([name, t0, steps.index, attrs, False, ring_entry], out)
            except Exception as exc:
                agent.fail(col, exc)
            return out

        collective.__wrapped__ = orig  # type: ignore[attr-defined]
        collective.__doc__ = orig.__doc__
        collective.__name__ = name
        return collective

    def _issued(self, entry: Entry, out: Any) -> None:
        """Keep ``entry`` until the wait on one of its outputs; one already complete (a plain tensor:
        waited while being traced) or one more than the bound allows is recorded now."""
        pending = self.pending
        kept = False
        for o in out if isinstance(out, (list, tuple)) else (out,):
            elem = getattr(o, "elem", None)  # an AsyncCollectiveTensor: its wait completes it
            if elem is not None and len(pending) < _MAX_PENDING:
                pending[_storage_key(elem)] = entry
                kept = True
        if not kept:
            entry[4] = True
            completed(entry[5], now_ns())
            self.col.agent.span("comm", entry[0], entry[1], now_ns(), entry[2], entry[3])

    def _wrap_wait(self, orig: Any, is_compiling: Any) -> Any:
        col = self.col
        agent = col.agent

        def wait_tensor(tensor: Any) -> Any:
            if is_compiling() or not col.enabled:
                return orig(tensor)
            entry = None
            try:
                if self.pending:
                    entry = self.pending.pop(_storage_key(tensor), None)
            except Exception:  # not a tensor with a storage (a fake one): nothing of ours
                entry = None
            if entry is None:
                return orig(tensor)
            tls = agent.tls
            active = tls.active
            outer = self.comm._nest.depth == 0
            exposed = outer and active is None
            t0 = now_ns()
            if exposed:
                tls.active = "communication"
            try:
                return orig(tensor)
            finally:
                if exposed:
                    tls.active = None
                try:
                    self._waited(entry, t0, now_ns(), exposed, outer and active in CARVED)
                except Exception as exc:
                    agent.fail(col, exc)

        wait_tensor.__wrapped__ = orig  # type: ignore[attr-defined]
        wait_tensor.__doc__ = orig.__doc__
        return wait_tensor

    def _waited(self, entry: Entry, t0: int, t1: int, exposed: bool, carved: bool) -> None:
        agent = self.col.agent
        if not entry[4]:
            entry[4] = True
            completed(entry[5], t1)
            agent.span("comm", entry[0], entry[1], t1, entry[2], entry[3])
        if exposed:
            agent.span("phase", "communication", t0, t1, agent.steps.index, {"op": entry[0]})
        elif carved:
            note_wait(agent.tls, t0, t1, entry[0])


def sent_bytes(x: Any) -> int:
    """Bytes of a tensor or of a list of tensors (0 for anything else)."""
    if x is None:
        return 0
    if isinstance(x, (list, tuple)):
        return sum(sent_bytes(t) for t in x)
    try:
        return int(x.numel()) * int(x.element_size())
    except Exception:
        return 0
