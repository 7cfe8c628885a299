"""The memory collector's view of the forward: which modules ran a measured training forward, which
tensors it saved for backward, and when the backward pass starts.

No module hook of torch's is used. The tracker observes the outermost training forward through the
torch collector's ``Module.__call__`` wrapper (:class:`holoprof.collect.torch.state.ForwardObserver`),
and only on the steps it measures; that wrapper never runs inside ``torch.compile``'s regions or inside
a backward pass. During the outermost training forward of a measured step,
``torch.autograd.graph.saved_tensors_hooks`` is pushed; its pack hook notes the storage of each saved
tensor (parameters excluded) and the module that was running, and returns the tensor unchanged inside
a small holder whose lifetime is the autograd graph's hold on it. Where the job has saved-tensor hooks
of its own around the forward (``save_on_cpu``, an outer checkpoint) or has disabled them, none are
pushed over them: that step's activations are reported as not measured.

Standard library only at import time; torch is handed over once the job imports it.
"""

from __future__ import annotations

import threading
import weakref
from types import ModuleType
from typing import Any, Protocol

from holoprof.agent.core import Agent
from holoprof.collect.memory_schedule import EVERY, is_sampled
from holoprof.collect.memory_storage import storage_keys
from holoprof.collect.torch.state import TorchState

#: Bound on the saved-tensor records kept for one measured step (memory of the profiler itself).
MAX_SAVED_RECORDS = 200_000

#: One tensor saved for backward: (weak reference to its box, storage key, on a GPU, layer).
SavedRecord = tuple[Any, tuple[int, int], bool, str]

_ref = weakref.ref
_get_ident = threading.get_ident


class Owner(Protocol):
    """What the hooks need of the collector that owns them."""

    agent: Agent
    enabled: bool
    fault_at: str | None
    mode: str
    every: int

    def inject(self, point: str) -> None: ...

    def snapshot(self, phase: str, step: int | None = None) -> None: ...

    def single_loop(self) -> bool: ...

    def hook_failed(self, exc: BaseException) -> None: ...


class _Saved:
    """What the pack hook hands to autograd: the saved tensor, unchanged, in a weakly referenceable box."""

    __slots__ = ("__weakref__", "t")

    def __init__(self, t: Any) -> None:
        self.t = t


def _unpack(box: Any) -> Any:
    return box.t if type(box) is _Saved else box


class ForwardTracker:
    """Module forward hooks and saved-tensor hooks of the measured steps."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.torch: ModuleType | None = None
        self.state: TorchState | None = None  # the torch collector's, where the tracker observes
        self._param_cls: Any = ()
        self._tensor_cls: Any = None
        self._push_hooks: Any = None
        self._pop_hooks: Any = None
        self._top_hooks: Any = None
        self._hooks_enabled: Any = None
        self._pack_fn: Any = None
        self.reset()

    def reset(self) -> None:
        self.modules: weakref.WeakSet[Any] = weakref.WeakSet()  # modules with parameters that ran forward
        self._owner = 0  # thread running the outermost forward being measured (0: none)
        #: why the activations of the step being measured are not counted ("" when they are)
        self.unmeasured = ""
        #: tensors not counted because their storage cannot be read: type name -> count
        self.unreadable: dict[str, int] = {}
        self._active = False  # the current outermost forward is being measured
        self._layers = False  # this measured step attributes saved tensors to modules (per-layer list)
        self._track = False  # the current outermost forward keeps the module stack (active and layers)
        self._stack: list[str] = []
        self._names: dict[int, str] = {}
        self._hooks_ctx: Any = None
        self.saved: list[SavedRecord] = []
        self.measure_step = -1
        self.batch_size: int | None = None
        self.device = "cpu"
        # outermost modules seen: id -> [ref, epoch, has params, device, names by id() or None]
        self.roots: dict[int, list[Any]] = {}
        self._fwd_step = -1  # the step whose "forward" snapshot was taken at its backward's start

    def setup(self, torch: ModuleType) -> None:
        self.torch = torch
        self._param_cls = torch.nn.Parameter
        self._tensor_cls = torch.Tensor
        ag = getattr(torch._C, "_autograd", None)
        self._push_hooks = getattr(ag, "_push_saved_tensors_default_hooks", None)
        self._pop_hooks = getattr(ag, "_pop_saved_tensors_default_hooks", None)
        self._top_hooks = getattr(ag, "_top_saved_tensors_default_hooks", None)
        self._hooks_enabled = getattr(ag, "_saved_tensors_hooks_is_enabled", None)
        self._pack_fn = self._pack

    def stop(self) -> None:
        """After a failure: no forward is being measured any more, and the tracker stops observing."""
        self._active = self._track = False
        self.pop_saved_hooks()
        self._end_nested()
        self._owner = 0
        self.disarm()

    # -- arming: observe the forward only while a sampled step runs --------------------------------
    def arm(self) -> None:
        st = self.state
        if st is not None and self not in st.observers:
            st.observers.append(self)

    def disarm(self) -> None:
        if self._owner:  # never in the middle of a forward: its end must still be seen
            return
        st = self.state
        if st is not None and self in st.observers:
            st.observers.remove(self)

    def _foreign_hooks(self) -> str:
        """Why saved-tensor hooks must not be pushed now ("" when they may be)."""
        try:
            if self._hooks_enabled is not None and not self._hooks_enabled():
                return "the job disabled saved-tensor hooks around its forward"
            if self._top_hooks is not None and self._top_hooks(False) is not None:
                return "the job's own saved-tensor hooks (e.g. save_on_cpu) wrap its forward"
        except Exception as exc:
            return f"saved-tensor hooks could not be inspected ({type(exc).__name__})"
        return ""

    def _push_saved_hooks(self) -> None:
        # what torch.autograd.graph.saved_tensors_hooks does on enter and exit, without building the
        # context manager twice a step; the context manager where these functions are missing
        if self._push_hooks is not None and self._pop_hooks is not None:
            self._push_hooks(self._pack_fn, _unpack)
            self._hooks_ctx = True
            return
        assert self.torch is not None
        ctx = self.torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        ctx.__enter__()
        self._hooks_ctx = ctx

    def pop_saved_hooks(self) -> None:
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

    # -- the outermost training forward (observed on measured steps only) ------------------------
    def begin(self, mod: Any, args: tuple[Any, ...]) -> None:
        if self._owner or not self.owner.enabled:
            return  # another thread's forward is being measured, or the collector is off
        try:
            if not self.owner.single_loop():  # several threads train: nothing is measured
                return
            self._owner = _get_ident()
            self._begin_outermost(mod, args)
            if not self._active:
                self._owner = 0
        except Exception as exc:
            self.owner.hook_failed(exc)

    def end(self, out: Any) -> None:
        if not self._owner or _get_ident() != self._owner:
            return
        self._owner = 0
        self._end_nested()
        owner = self.owner
        if not self._active or not owner.enabled:
            return
        try:
            self._active = self._track = False
            self.pop_saved_hooks()
            # "after the forward" is taken when the backward pass starts (a pre-hook on the output's
            # autograd node): by then every forward of the step (the model's, the loss module's) has
            # run and all their saved tensors are alive; one snapshot per step.
            node = _grad_fn_of(out)
            if node is None:
                owner.snapshot("forward")
            else:
                step = owner.agent.steps.index
                node.register_prehook(lambda grads: self._at_backward_start(step))
        except Exception as exc:
            owner.hook_failed(exc)

    def call(self, orig: Any, mod: Any, args: Any, kwargs: Any) -> Any:
        """A module call nested in the measured forward: the per-layer stack (on the steps that keep it)."""
        if _get_ident() != self._owner:
            return orig(mod, *args, **kwargs)
        stack = self._stack
        stack.append(self._names.get(id(mod)) or type(mod).__name__)
        try:
            return orig(mod, *args, **kwargs)
        finally:
            if stack:
                stack.pop()

    def _end_nested(self) -> None:
        st = self.state
        if st is not None and st.nested is self:
            st.nested = None

    def _at_backward_start(self, step: int) -> None:
        if self._fwd_step == step or not self.owner.enabled:
            return
        try:
            self._fwd_step = step
            self.owner.snapshot("forward", step)
        except Exception as exc:
            self.owner.hook_failed(exc)

    def _begin_outermost(self, mod: Any, args: Any) -> None:
        torch = self.torch
        assert torch is not None
        owner = self.owner
        if owner.fault_at:
            owner.inject("forward")
        step = owner.agent.steps.index
        if not is_sampled(step, owner.mode, owner.every) or not torch.is_grad_enabled():
            return
        if step != self.measure_step:
            self._begin_measured_step(step)
        root = self._root(mod, step)
        if root[2]:
            self.device = root[3]
            self._note_batch_size(args)
        if self._layers:
            self._start_module_stack(mod, root)
        else:
            self._stack = []
        self._active = True
        foreign = self._foreign_hooks()
        if foreign:
            self.unmeasured = foreign
            return
        self._push_saved_hooks()

    def _begin_measured_step(self, step: int) -> None:
        self.measure_step = step
        self.unmeasured = ""
        self.prune_saved(all_dead=False)
        self._layers = is_sampled(step, "sampled", self.owner.every)
        self._reset_device_peak()

    def _root(self, mod: Any, step: int) -> list[Any]:
        """What is known of the outermost module ``mod``: [ref, epoch, has params, device, names or None].

        It is kept (one dict lookup a forward) and looked at again every EVERY steps: a module moved to
        another device, or with submodules added later, shows up there.
        """
        epoch = step // EVERY
        root = self.roots.get(id(mod))
        if root is None or root[1] != epoch or root[0]() is not mod:
            if len(self.roots) > 16:
                self.roots.clear()
            p = next(iter(mod.parameters()), None)
            root = [_ref(mod), epoch, p is not None, _device_name(p.device) if p is not None else "", None]
            self.roots[id(mod)] = root
            if p is not None:
                self.modules.add(mod)
        return root

    def _note_batch_size(self, args: Any) -> None:
        """The first dimension of the first input that has a known one. A symbolic input has none
        (Keras calls its layers on ``KerasTensor``s of shape ``(None, ...)`` to build them): skipped."""
        for a in args:
            shape = getattr(a, "shape", None)
            if shape is not None and len(shape) > 0 and isinstance(shape[0], int):
                self.batch_size = int(shape[0])
                break

    def _start_module_stack(self, mod: Any, root: list[Any]) -> None:
        names = root[4]
        if names is None:
            rname = type(mod).__name__
            names = {id(m): (f"{n} ({type(m).__name__})" if n else rname) for n, m in mod.named_modules()}
            root[4] = names
        self._names = names
        self._stack = [names.get(id(mod)) or type(mod).__name__]
        self._track = True
        if self.state is not None:
            self.state.nested = self

    # -- saved tensors -----------------------------------------------------------------------------
    def _pack(self, t: Any) -> Any:
        saved = self.saved
        try:
            # type() first: isinstance(t, Parameter) runs Parameter's metaclass hook, in Python
            plain = type(t) is self._tensor_cls
            if len(saved) < MAX_SAVED_RECORDS and (plain or not isinstance(t, self._param_cls)):
                stack = self._stack
                layer = stack[-1] if stack else "?"
                if plain:
                    st = t.untyped_storage()
                    box = _Saved(t)
                    saved.append((_ref(box), (st.data_ptr(), st.nbytes()), t.is_cuda, layer))
                    return box
                keys = self.keys_or_note(t)  # a subclass (a DTensor: the storage of its local shard)
                if not keys:
                    return t
                box = _Saved(t)
                ref = _ref(box)
                saved.extend((ref, k, on_gpu, layer) for k, on_gpu in keys)
                return box
        except Exception as exc:
            self.owner.hook_failed(exc)
        return t

    def keys_or_note(self, t: Any) -> list[tuple[tuple[int, int], bool]]:
        """:func:`storage_keys` of ``t``; none for a tensor whose storage cannot be read (noted in
        ``unreadable``: the snapshots say what was not counted instead of failing)."""
        try:
            return storage_keys(t)
        except Exception:
            name = type(t).__name__
            if len(self.unreadable) < 20 or name in self.unreadable:
                self.unreadable[name] = self.unreadable.get(name, 0) + 1
            return []

    def prune_saved(self, all_dead: bool) -> None:
        self.saved = [] if all_dead else [s for s in self.saved if s[0]() is not None]

    def live_saved(self) -> list[SavedRecord]:
        """The records of the tensors the autograd graph still holds (the others are dropped)."""
        live = [s for s in self.saved if s[0]() is not None]
        self.saved = live
        return live

    def _reset_device_peak(self) -> None:
        torch = self.torch
        if torch is None or not self.device.startswith("cuda") or not torch.cuda.is_initialized():
            return
        try:
            torch.cuda.reset_peak_memory_stats(cuda_index(self.device))
        except Exception:
            pass


def _grad_fn_of(out: Any) -> Any:
    """The autograd node of a forward's output (the first tensor in a tuple, list or dict that has one)."""
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else (out,)
    for v in items:
        node = getattr(v, "grad_fn", None)
        if node is not None and hasattr(node, "register_prehook"):
            return node
    return None


def _device_name(dev: Any) -> str:
    if dev.type == "cuda":
        return f"cuda:{dev.index if dev.index is not None else 0}"
    return str(dev.type)


def cuda_index(device: str) -> int:
    try:
        return int(device.split(":", 1)[1])
    except (IndexError, ValueError):
        return 0
