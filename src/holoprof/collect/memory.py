"""Memory by category (weights, gradients, optimizer state, activations, other) on sampled steps.

What is measured, with no change to the job:

* **weights** — parameters (and buffers) of the modules that ran a training forward, plus the
  parameters the optimizers hold; **gradients** — their ``.grad``; **optimizer_state** — every tensor
  in ``optimizer.state`` (Adam: ``exp_avg``, ``exp_avg_sq`` and one 0-dim ``step`` tensor per
  parameter). Optimizers are found through the global optimizer step hooks, modules through global
  module forward hooks that are armed only while a sampled step runs.
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
``mem.<category>_bytes``. Loops without a ``torch.optim`` optimizer get their first step only.

Standard library only at import time; torch is touched only after the job imports it.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from holoprof import model
from holoprof.agent.core import Agent, Collector, now_ns
from holoprof.agent.setup import post_import_finder

CATEGORIES: tuple[str, ...] = ("weights", "gradients", "optimizer_state", "activations", "other")
MODES: tuple[str, ...] = ("sampled", "full", "off")
_SAMPLE_NAMES: tuple[tuple[str, str], ...] = tuple((c, f"mem.{c}_bytes") for c in CATEGORIES)
#: Sampled mode: the first ``FIRST_STEPS`` steps, then every ``EVERY``-th step.
FIRST_STEPS = 3
EVERY = 200
PER_LAYER_TOP = 50
#: Bound on the saved-tensor records kept for one measured step (memory of the profiler itself).
MAX_SAVED_RECORDS = 200_000
OTHER_NOTE = {
    "rss": "other (CPU): resident memory not attributed to tensors: interpreter, libraries, allocator caches",
    "cuda_reserved": (
        "other (GPU): memory reserved by the CUDA caching allocator that no category accounts for: "
        "workspaces, temporaries, cached and fragmented blocks"
    ),
}


def is_sampled(step: int, mode: str, every: int = EVERY) -> bool:
    if mode == "full":
        return True
    if mode != "sampled":
        return False
    return step < FIRST_STEPS or (every > 0 and step % every == 0)


# --- process memory (standard library) -------------------------------------------------------------
_statm: tuple[int, int] | None = None  # (pid, fd) of /proc/<pid>/statm, kept open: a pread is cheap
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# taken at import, before the I/O collector wraps os.pread: reading our own /proc file is not the job's I/O
_pread = getattr(os, "pread", None)
_ref = weakref.ref
_pid = os.getpid()  # os.getpid() is a system call: known here, and again in a forked child


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
_get_ident = threading.get_ident


def rss_bytes() -> int:
    global _statm
    try:
        pid = _pid
        if _statm is None or _statm[0] != pid:  # first call, or a forked child: /proc/self of this process
            if _statm is not None:
                try:
                    os.close(_statm[1])
                except OSError:
                    pass
            _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY))
        return int(_pread(_statm[1], 128, 0).split()[1]) * _PAGE  # type: ignore[misc]
    except (OSError, ValueError, IndexError, AttributeError, TypeError):
        import resource

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(r if sys.platform == "darwin" else r * 1024)


def cpu_limit_bytes() -> tuple[int, str]:
    """The memory this process may use: the machine's total, or a smaller cgroup limit."""
    total = 0
    try:
        total = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    limit, source = total, "machine memory"
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit():
            v = int(raw)
            if 0 < v < (limit or 2**62):
                limit, source = v, f"cgroup limit ({path})"
        break
    return limit, source


class _Saved:
    """What the pack hook hands to autograd: the saved tensor, unchanged, in a weakly referenceable box."""

    __slots__ = ("__weakref__", "t")

    def __init__(self, t: Any) -> None:
        self.t = t


def _unpack(box: Any) -> Any:
    return box.t if type(box) is _Saved else box


class MemoryCollector(Collector):
    name = "memory"
    default_fault = "forward"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        mode = str(agent.options.get("memory", "sampled"))
        self.mode = mode if mode in MODES else "sampled"
        self.every = int(agent.options.get("memory_every", EVERY) or EVERY)
        stop = agent.options.get("stop_after_steps")
        self.stop_after = int(stop) if isinstance(stop, (int, float)) and stop > 0 else 0
        self._torch: ModuleType | None = None
        self._param_cls: Any = ()
        self._tensor_cls: Any = None
        self._push_hooks: Any = None
        self._pop_hooks: Any = None
        self._pack_fn: Any = None
        self._arm_handles: list[Any] = []
        self._reset_state()

    def _reset_state(self) -> None:
        self._modules: weakref.WeakSet[Any] = weakref.WeakSet()
        self._optimizers: dict[int, Any] = {}  # id -> weak reference (a dict: seen twice a step, cheaply)
        self._depth = 0
        self._owner = 0  # thread running the outermost forward
        self._active = False  # the current outermost forward is being measured
        self._layers = False  # this measured step attributes saved tensors to modules (per-layer list)
        self._track = False  # the current outermost forward keeps the module stack (active and layers)
        self._stack: list[str] = []
        self._names: dict[int, str] = {}
        self._hooks_ctx: Any = None
        self._saved: list[
            tuple[Any, tuple[int, int], bool, str]
        ] = []  # (ref to box, storage key, GPU, layer)
        self._measure_step = -1
        self._batch_size: int | None = None
        self._device = "cpu"
        self._limit: tuple[int, str] | None = None
        # weights: (key, (params, storage keys, bytes, GPU bytes), data_ptr of each param)
        self._wcache: (
            tuple[tuple[int, int, int], tuple[list[Any], set[tuple[int, int]], int, int], list[int]] | None
        ) = None
        # gradients: ((id, data_ptr) of each .grad, result, storage key by (id, data_ptr))
        self._gcache: (
            tuple[list[tuple[int, int]], tuple[set[tuple[int, int]], int, int, int], dict[Any, Any]] | None
        ) = None
        self._ostats: tuple[Any, Any, tuple[set[tuple[int, int]], int, int, int]] | None = None
        self._wchecked = -1  # the measured step whose parameters were checked against the cache
        self._layer_params: dict[str, int] = {}
        # outermost modules seen: id -> [ref, epoch, has params, device, names by id() or None]
        self._roots: dict[int, list[Any]] = {}
        self._fwd_step = -1  # the step whose "forward" snapshot was taken at its backward's start
        # optimizer state: (epoch, ids of the state's values, [(storage key, bytes, on GPU)])
        self._ocache: tuple[int, list[int], list[tuple[tuple[int, int], int, bool]]] | None = None

    # -- install -----------------------------------------------------------------------------------
    def install(self) -> None:
        if self.mode == "off" and not self.stop_after:
            return
        post_import_finder().add("torch", self._on_torch)

    def _on_torch(self, torch: ModuleType) -> None:
        if not self.enabled:
            return
        try:
            self._setup(torch)
        except Exception as exc:
            self.agent.fail(self, exc)

    def after_fork_child(self) -> None:
        # A forked child (a DataLoader worker) does not train: no hooks fire there that matter.
        self._pop_saved_hooks()
        self._reset_state()

    def uninstall(self) -> None:
        self._pop_saved_hooks()
        self._disarm()
        super().uninstall()

    def _setup(self, torch: ModuleType) -> None:
        import torch.optim.optimizer as optim_mod

        self._torch = torch
        self._param_cls = torch.nn.Parameter
        self._tensor_cls = torch.Tensor
        ag = getattr(torch._C, "_autograd", None)
        self._push_hooks = getattr(ag, "_push_saved_tensors_default_hooks", None)
        self._pop_hooks = getattr(ag, "_pop_saved_tensors_default_hooks", None)
        self._pack_fn = self._pack
        self._handles.append(optim_mod.register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(optim_mod.register_optimizer_step_post_hook(self._opt_post))
        if self.mode != "off":
            self._arm()
        self.agent.info["memory"] = {"mode": self.mode, "every": self.every}

    # -- arming: global module hooks only while a sampled step runs --------------------------------
    def _arm(self) -> None:
        if self._arm_handles or self._torch is None:
            return
        mm = self._torch.nn.modules.module
        self._arm_handles.append(mm.register_module_forward_pre_hook(self._fwd_pre))
        try:
            h = mm.register_module_forward_hook(self._fwd_post, always_call=True)
        except TypeError:  # older torch: no always_call
            h = mm.register_module_forward_hook(self._fwd_post)
        self._arm_handles.append(h)

    def _disarm(self) -> None:
        if self._depth:  # never in the middle of a forward: the stack must stay balanced
            return
        for h in self._arm_handles:
            try:
                h.remove()
            except Exception:
                pass
        self._arm_handles.clear()

    def _push_saved_hooks(self) -> None:
        # what torch.autograd.graph.saved_tensors_hooks does on enter and exit, without building the
        # context manager twice a step; the context manager where these functions are missing
        if self._push_hooks is not None and self._pop_hooks is not None:
            self._push_hooks(self._pack_fn, _unpack)
            self._hooks_ctx = True
            return
        assert self._torch is not None
        ctx = self._torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        ctx.__enter__()
        self._hooks_ctx = ctx

    def _pop_saved_hooks(self) -> None:
        ctx, self._hooks_ctx = self._hooks_ctx, None
        if ctx is None:
            return
        try:
            if ctx is True:
                self._pop_hooks()
            else:
                ctx.__exit__(None, None, None)
        except Exception:
            pass

    # -- module hooks (armed only) -----------------------------------------------------------------
    # Both run on every module call of a measured step: the nested calls take the shortest path (a depth
    # count, and the module stack only on the steps that record the per-layer list).
    def _fwd_pre(self, mod: Any, args: Any) -> None:
        if self._depth:
            if _get_ident() == self._owner:
                self._depth += 1
                if self._track:
                    self._stack.append(self._names.get(id(mod)) or type(mod).__name__)
            return
        if not self.enabled:
            return
        try:
            self._owner = _get_ident()
            self._depth = 1
            self._begin_outermost(mod, args)
        except Exception as exc:
            self._fail(exc)

    def _fwd_post(self, mod: Any, args: Any, out: Any) -> None:
        if not self._depth or _get_ident() != self._owner:
            return
        self._depth -= 1
        if self._depth:
            if self._track and self._stack:
                self._stack.pop()
            return
        if not self._active or not self.enabled:
            return
        try:
            self._active = self._track = False
            self._pop_saved_hooks()
            # "after the forward" is taken when the backward pass starts (a pre-hook on the output's
            # autograd node): by then every forward of the step (the model's, the loss module's) has
            # run and all their saved tensors are alive; one snapshot per step.
            node = _grad_fn_of(out)
            if node is None:
                self._snapshot("forward")
            else:
                step = self.agent.steps.index
                node.register_prehook(lambda grads: self._at_backward_start(step))
        except Exception as exc:
            self._fail(exc)

    def _at_backward_start(self, step: int) -> None:
        if self._fwd_step == step or not self.enabled:
            return
        try:
            self._fwd_step = step
            self._snapshot("forward", step)
        except Exception as exc:
            self._fail(exc)

    def _begin_outermost(self, mod: Any, args: Any) -> None:
        torch = self._torch
        assert torch is not None
        if self.fault_at:
            self.inject("forward")
        step = self.agent.steps.index
        if not is_sampled(step, self.mode, self.every) or not torch.is_grad_enabled():
            return
        if step != self._measure_step:
            self._measure_step = step
            self._prune_saved(all_dead=False)
            self._layers = is_sampled(step, "sampled", self.every)
            self._reset_device_peak()
        # what is known of this module is kept (one dict lookup a forward) and looked at again every
        # EVERY steps: a module moved to another device, or with submodules added later, shows up there
        epoch = step // EVERY
        root = self._roots.get(id(mod))
        if root is None or root[1] != epoch or root[0]() is not mod:
            if len(self._roots) > 16:
                self._roots.clear()
            p = next(iter(mod.parameters()), None)
            root = [_ref(mod), epoch, p is not None, _device_name(p.device) if p is not None else "", None]
            self._roots[id(mod)] = root
            if p is not None:
                self._modules.add(mod)
        if root[2]:
            self._device = root[3]
            for a in args:
                shape = getattr(a, "shape", None)
                if shape is not None and len(shape) > 0:
                    self._batch_size = int(shape[0])
                    break
        if self._layers:
            names = root[4]
            if names is None:
                rname = type(mod).__name__
                names = {id(m): (f"{n} ({type(m).__name__})" if n else rname) for n, m in mod.named_modules()}
                root[4] = names
            self._names = names
            self._stack = [names.get(id(mod)) or type(mod).__name__]
            self._track = True
        else:
            self._stack = []
        self._active = True
        self._push_saved_hooks()

    # -- saved tensors -----------------------------------------------------------------------------
    def _pack(self, t: Any) -> Any:
        saved = self._saved
        try:
            # type() first: isinstance(t, Parameter) runs Parameter's metaclass hook, in Python
            if len(saved) < MAX_SAVED_RECORDS and (
                type(t) is self._tensor_cls or not isinstance(t, self._param_cls)
            ):
                st = t.untyped_storage()
                box = _Saved(t)
                stack = self._stack
                saved.append(
                    (_ref(box), (st.data_ptr(), st.nbytes()), t.is_cuda, stack[-1] if stack else "?")
                )
                return box
        except Exception as exc:
            self._fail(exc)
        return t

    def _prune_saved(self, all_dead: bool) -> None:
        self._saved = [] if all_dead else [s for s in self._saved if s[0]() is not None]

    # -- optimizer hooks (always on: one call per step) -------------------------------------------
    def _see_optimizer(self, optimizer: Any) -> None:
        i = id(optimizer)
        r = self._optimizers.get(i)
        if r is not None and r() is optimizer:
            return
        opts = self._optimizers

        def gone(ref: Any, i: int = i) -> None:
            if opts.get(i) is ref:
                del opts[i]

        opts[i] = _ref(optimizer, gone)

    def _live_optimizers(self) -> list[Any]:
        return [o for o in (r() for r in list(self._optimizers.values())) if o is not None]

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.enabled:
            return
        try:
            self._see_optimizer(optimizer)
            if self._measure_step == self.agent.steps.index and self.mode != "off":
                self._snapshot("backward")
        except Exception as exc:
            self._fail(exc)

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.enabled:
            return
        try:
            if self.fault_at:
                self.inject("optimizer_post")
            step = self.agent.steps.index
            if self.mode != "off":
                self._see_optimizer(optimizer)
                if self._measure_step == step:
                    self._snapshot("optimizer")
                if is_sampled(step + 1, self.mode, self.every):
                    self._arm()
                elif self.mode == "sampled":
                    self._disarm()
        except Exception as exc:
            self._fail(exc)
            return
        if self.stop_after and self.agent.steps.index + 1 >= self.stop_after:
            self.agent.info["stopped_after_steps"] = self.stop_after
            raise SystemExit(0)  # asked for with --stop-after-steps: end the job cleanly now

    def _fail(self, exc: BaseException) -> None:
        self._active = self._track = False
        self._pop_saved_hooks()
        self._depth = 0
        self._disarm()
        self.agent.fail(self, exc)

    # -- measuring ---------------------------------------------------------------------------------
    def _optimizer_state(self, phase: str) -> list[tuple[tuple[int, int], int, bool]]:
        """[(storage key, bytes, on a GPU)] of the optimizers' state, each storage once.

        The state changes only inside ``optimizer.step()``, and its sizes only when a tensor in it is
        replaced (Adam updates ``exp_avg`` in place): after each step the identities of the state's
        values are compared with the last count's, and the tensors are counted again only when one
        differs (and on every EVERY-th step). The forward and backward snapshots of the next step reuse
        the count.
        """
        c = self._ocache
        if phase != "optimizer" and c is not None:
            return c[2]
        opts = self._live_optimizers()
        ids = [
            id(v) for opt in opts for st in opt.state.values() if isinstance(st, dict) for v in st.values()
        ]
        epoch = self._measure_step // EVERY
        if c is not None and c[0] == epoch and c[1] == ids:
            return c[2]
        keys: set[tuple[int, int]] = set()
        entries: list[tuple[tuple[int, int], int, bool]] = []
        for opt in opts:
            for state in list(opt.state.values()):
                for v in _tensors(state.values() if isinstance(state, dict) else ()):
                    st = v.untyped_storage()
                    n = int(st.nbytes())
                    k = (int(st.data_ptr()), n)
                    if k in keys:
                        continue
                    keys.add(k)
                    entries.append((k, n, bool(v.is_cuda)))
        if phase == "optimizer":
            self._ocache = (epoch, ids, entries)
        return entries

    def categories(self, include_per_layer: bool = False, phase: str = "optimizer") -> dict[str, Any]:
        """Bytes per category now (storages counted once, in the first category that claims them:
        weights, gradients, optimizer state, activations), and per layer when asked."""
        params, wkeys, wbytes, cuda = self._weights()
        gkeys, gbytes, gcount, gcuda = self._gradients(params, wkeys)
        cuda += gcuda
        entries = self._optimizer_state(phase)
        c = self._ostats
        if c is None or c[0] is not entries or c[1] is not wkeys:  # counted once per new state or weights
            c = (entries, wkeys, _claim(entries, (wkeys,)))
            self._ostats = c
        okeys, obytes, ocount, ocuda = c[2]
        if not gkeys.isdisjoint(okeys):  # a gradient claims a storage the state also holds (rare)
            okeys, obytes, ocount, ocuda = _claim(entries, (wkeys, gkeys))
        cuda += ocuda
        abytes = acount = 0
        per_layer: dict[str, int] = {}
        akeys: set[tuple[int, int]] = set()
        live = [s for s in self._saved if s[0]() is not None]
        self._saved = live
        for _r, k, on_gpu, layer in live:
            if k in wkeys or k in gkeys or k in okeys or k in akeys:
                continue
            akeys.add(k)
            n = k[1]
            abytes += n
            acount += 1
            if on_gpu:
                cuda += n
            if include_per_layer:
                per_layer[layer] = per_layer.get(layer, 0) + n
        cats = {
            "weights": wbytes,
            "gradients": gbytes,
            "optimizer_state": obytes,
            "activations": abytes,
            "other": 0,
        }
        counts = {
            "weights": len(wkeys),
            "gradients": gcount,
            "optimizer_state": ocount,
            "activations": acount,
            "other": 0,
        }
        out: dict[str, Any] = {"categories": cats, "tensors": counts, "cuda_tensor_bytes": cuda}
        if include_per_layer:
            out["per_layer"] = self._per_layer(per_layer)
        return out

    def _gradients(
        self, params: list[Any], wkeys: set[tuple[int, int]]
    ) -> tuple[set[tuple[int, int]], int, int, int]:
        """(storage keys, bytes, count, bytes on a GPU) of the parameters' ``.grad`` not already weights.

        A gradient tensor is looked at once: its storage key is kept by (id, data pointer), which holds
        no reference to it, and the whole result is reused while every parameter has the same gradient
        tensor (the backward and optimizer snapshots of a step, usually).
        """
        ident = [(id(g), g.data_ptr()) for p in params if (g := p.grad) is not None]
        c = self._gcache
        if c is not None and c[0] == ident:
            return c[1]
        known = c[2] if c is not None else {}
        keys: set[tuple[int, int]] = set()
        total = count = cuda = 0
        memo: dict[tuple[int, int], tuple[tuple[int, int], bool]] = {}
        for p in params:
            g = p.grad
            if g is None:
                continue
            i = (id(g), g.data_ptr())
            hit = known.get(i)
            if hit is None:
                st = g.untyped_storage()
                hit = ((st.data_ptr(), st.nbytes()), bool(g.is_cuda))
            memo[i] = hit
            k = hit[0]
            if k in wkeys or k in keys:
                continue
            keys.add(k)
            total += k[1]
            count += 1
            if hit[1]:
                cuda += k[1]
        value = (keys, total, count, cuda)
        self._gcache = (ident, value, memo)
        return value

    def _weights(self) -> tuple[list[Any], set[tuple[int, int]], int, int]:
        """Parameters and buffers: (params, storage keys, bytes, bytes on a GPU), cached.

        They do not change from step to step unless a parameter's storage is replaced (moved to another
        device, loaded into a new tensor): the cache is rebuilt when a module or an optimizer shows up,
        when a parameter's data pointer differs from the cached one (checked once a measured step), and
        every EVERY steps (buffers replaced, parameters added to an optimizer).
        """
        key = (self._measure_step // EVERY, len(self._modules), len(self._optimizers))
        c = self._wcache
        if c is not None and c[0] == key:
            if self._wchecked == self._measure_step:
                return c[1]
            self._wchecked = self._measure_step
            if [p.data_ptr() for p in c[1][0]] == c[2]:
                return c[1]
            self._roots.clear()  # the device of the model may have changed too
        params = list(self._params())
        keys: set[tuple[int, int]] = set()
        total = cuda = 0
        layer_params: dict[str, int] = {}
        tensors = [*params, *(b for m in list(self._modules) for b in m.buffers())]
        for t in tensors:
            st = t.untyped_storage()
            n = int(st.nbytes())
            k = (int(st.data_ptr()), n)
            if k in keys:
                continue
            keys.add(k)
            total += n
            if t.is_cuda:
                cuda += n
        for m in list(self._modules):
            for name, sub in m.named_modules():
                label = f"{name} ({type(sub).__name__})" if name else type(sub).__name__
                b = sum(int(p.untyped_storage().nbytes()) for p in sub.parameters(recurse=False))
                if b:
                    layer_params[label] = layer_params.get(label, 0) + b
        value = (params, keys, total, cuda)
        self._wcache = (key, value, [p.data_ptr() for p in params])
        self._wchecked = self._measure_step
        self._layer_params = layer_params
        return value

    def _params(self) -> Iterable[Any]:
        seen: set[int] = set()
        for m in list(self._modules):
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p
        for opt in self._live_optimizers():
            for group in opt.param_groups:
                for p in group.get("params", ()):
                    if id(p) not in seen:
                        seen.add(id(p))
                        yield p

    def _per_layer(self, activations: dict[str, int]) -> list[dict[str, Any]]:
        params = self._layer_params
        rows: list[dict[str, Any]] = [
            {"name": k, "activation_bytes": activations.get(k, 0), "parameter_bytes": params.get(k, 0)}
            for k in set(activations) | set(params)
        ]
        rows.sort(key=lambda r: (-(r["activation_bytes"] + r["parameter_bytes"]), r["name"]))
        return rows[:PER_LAYER_TOP]

    def _reset_device_peak(self) -> None:
        torch = self._torch
        if torch is None or not self._device.startswith("cuda") or not torch.cuda.is_initialized():
            return
        try:
            torch.cuda.reset_peak_memory_stats(_cuda_index(self._device))
        except Exception:
            pass

    def _limits(self) -> tuple[int, str]:
        if self._limit is None:
            torch = self._torch
            if torch is not None and self._device.startswith("cuda"):
                try:
                    props = torch.cuda.get_device_properties(_cuda_index(self._device))
                    self._limit = (int(props.total_memory), f"{props.name} memory")
                except Exception:
                    self._limit = (0, "unknown")
            else:
                self._limit = cpu_limit_bytes()
        return self._limit

    def _snapshot(self, phase: str, step: int | None = None) -> None:
        t0 = now_ns()
        if step is None:
            step = self.agent.steps.index
        # the per-layer list on the default schedule's steps only (also under --memory full: it is the
        # largest part of a snapshot, and layers do not change from step to step)
        per_layer = phase == "forward" and is_sampled(step, "sampled", self.every)
        doc = self.categories(include_per_layer=per_layer, phase=phase)
        cats: dict[str, int] = doc["categories"]
        tensor_total = sum(cats.values())
        rss = rss_bytes()
        limit, limit_source = self._limits()
        attrs: dict[str, Any] = {
            "step": step,
            "phase": phase,
            "device": self._device,
            "mode": self.mode,
            "rss_bytes": rss,
            "limit_bytes": limit,
            "limit_source": limit_source,
            "tensors": doc["tensors"],
        }
        torch = self._torch
        if self._device.startswith("cuda") and torch is not None and torch.cuda.is_initialized():
            idx = _cuda_index(self._device)
            allocated = int(torch.cuda.memory_allocated(idx))
            reserved = int(torch.cuda.memory_reserved(idx))
            cats["other"] = max(0, reserved - int(doc["cuda_tensor_bytes"]))
            attrs.update(
                other_basis="cuda_reserved",
                allocated_bytes=allocated,
                reserved_bytes=reserved,
                device_peak_bytes=int(torch.cuda.max_memory_reserved(idx)),
                allocated_peak_bytes=int(torch.cuda.max_memory_allocated(idx)),
                total_bytes=reserved,
            )
        else:
            cats["other"] = max(0, rss - tensor_total)
            attrs.update(other_basis="rss", total_bytes=max(rss, tensor_total))
        attrs["categories"] = cats
        if self._batch_size is not None:
            attrs["batch_size"] = self._batch_size
        if "per_layer" in doc:
            attrs["per_layer"] = doc["per_layer"]
        t1 = now_ns()
        attrs["cost_ns"] = t1 - t0
        self.agent.span("op", "memory", t1, t1, step, attrs)
        pid = self.agent.pid
        sample = self.agent.sample
        for c, name in _SAMPLE_NAMES:
            sample(name, float(cats[c]), pid, t1)

    def finish(self) -> None:
        self._pop_saved_hooks()


def _claim(
    entries: list[tuple[tuple[int, int], int, bool]], taken: tuple[set[tuple[int, int]], ...]
) -> tuple[set[tuple[int, int]], int, int, int]:
    """(keys, bytes, count, bytes on a GPU) of the entries whose storage no earlier category holds."""
    keys: set[tuple[int, int]] = set()
    total = count = cuda = 0
    for k, n, on_gpu in entries:
        if k in keys or any(k in t for t in taken):
            continue
        keys.add(k)
        total += n
        count += 1
        if on_gpu:
            cuda += n
    return keys, total, count, cuda


def _grad_fn_of(out: Any) -> Any:
    """The autograd node of a forward's output (the first tensor in a tuple, list or dict that has one)."""
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else (out,)
    for v in items:
        node = getattr(v, "grad_fn", None)
        if node is not None and hasattr(node, "register_prehook"):
            return node
    return None


def _tensors(values: Iterable[Any]) -> Iterable[Any]:
    for v in values:
        if hasattr(v, "untyped_storage"):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if hasattr(x, "untyped_storage"))


def _device_name(dev: Any) -> str:
    if dev.type == "cuda":
        return f"cuda:{dev.index if dev.index is not None else 0}"
    return str(dev.type)


def _cuda_index(device: str) -> int:
    try:
        return int(device.split(":", 1)[1])
    except (IndexError, ValueError):
        return 0


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
    if col is not None and col._torch is None:
        col._torch = torch
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
    """
    result = memory_snapshot_action(
        job.agent,
        dict(job.params or {}),
        census_path=job.artifact_path(".census.json"),
        cuda_path=job.artifact_path(".pickle"),
    )
    if not result.get("ok"):
        job.failed(str(result.get("error", "memory snapshot failed")))
        return
    paths = [p for p in (result.get("census"), result.get("cuda_snapshot")) if p]
    info = {k: v for k, v in result.items() if k not in ("census", "cuda_snapshot", "ok")}
    job.done(paths, **info)


def tensor_census(torch: ModuleType, col: MemoryCollector | None) -> dict[str, Any]:
    """Every live tensor the garbage collector knows, by category, each storage counted once."""
    known: dict[tuple[int, int], str] = {}
    if col is not None:
        for p in col._params():
            known.setdefault(_key(p), "weights")
            if p.grad is not None:
                known.setdefault(_key(p.grad), "gradients")
        for opt in col._live_optimizers():
            for state in list(opt.state.values()):
                for v in _tensors(state.values() if isinstance(state, dict) else ()):
                    known.setdefault(_key(v), "optimizer_state")
        for r, key, _gpu, _layer in col._saved:
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
