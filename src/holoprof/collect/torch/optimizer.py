"""``optimizer``: the global optimizer step hooks, and ``Optimizer.__init__`` (a loop with an optimizer).

A ``step(closure)`` (LBFGS, Lightning's automatic optimization) is a whole iteration: the step starts
there, and the closure is handed to the optimizer wrapped so that the forward, backward and
``zero_grad`` it runs keep their own phases (the optimizer's phase is the rest of the call).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from holoprof.agent.core import Collector, now_ns
from holoprof.collect.torch.device import DeviceTimes
from holoprof.collect.torch.state import NEVER, TorchState
from holoprof.collect.waits import phase_spans


class StepFrame:
    """One thread's optimizer step in progress: its nesting depth, start and CUDA event (kept on the
    thread's :class:`~holoprof.agent.core.PhaseState` as ``opt``, so that a forked child, whose
    per-thread state is new, starts with none)."""

    __slots__ = ("depth", "ev0", "t0")

    def __init__(self) -> None:
        self.depth = 0
        self.t0 = 0
        self.ev0: Any = None


class OptimizerPhases:
    """The hooks that record each thread's optimizer steps. Threads that each train a model step their
    optimizers at the same time, and the steps of one must not nest in another's: the step in progress
    is the calling thread's :class:`StepFrame`, kept on the thread's state; the hooks' own attributes
    are plain ones (an attribute of a ``threading.local`` costs about 8 times as much to read)."""

    def __init__(self, col: Collector, st: TorchState, dev: DeviceTimes) -> None:
        self.col = col
        self.st = st
        self.dev = dev
        self.agent = col.agent
        self.steps = col.agent.steps
        self.reset()

    def reset(self) -> None:
        """Forget the positions of ``closure`` (after fork; the step frames are on the threads' state,
        which a forked child makes anew)."""
        self.closure_pos: dict[type, int] = {}

    def install(self, optim_mod: ModuleType) -> None:
        """Register the global step hooks of ``torch.optim.optimizer`` and patch ``Optimizer.__init__``."""
        col, steps = self.col, self.steps
        col._handles.append(optim_mod.register_optimizer_step_pre_hook(self.pre))
        col._handles.append(optim_mod.register_optimizer_step_post_hook(self.post))

        orig_opt_init = optim_mod.Optimizer.__init__

        def opt_init(self_: Any, *args: Any, **kwargs: Any) -> None:
            steps.optimizer_seen = True
            orig_opt_init(self_, *args, **kwargs)

        col._set(optim_mod.Optimizer, "__init__", opt_init)

    # These run inside torch's loop over its hooks: a failure here turns the collector off
    # (its hooks become no-ops) and leaves the hook dicts alone. The other collectors that act around
    # optimizer steps on a few steps (TorchState.watchers) are called from here on those steps only,
    # even when this collector is off.
    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        col, st = self.col, self.st
        t = st.tls
        out = None
        f = None
        try:
            if col.enabled:
                if col.fault_at:
                    col.inject("optimizer_pre")
                f = t.opt
                if f is None:
                    f = t.opt = StepFrame()
                f.depth += 1
                if f.depth == 1:
                    if t.active is not None:
                        f.depth = -1_000_000  # nested inside another phase: not ours
                    else:
                        out = self.begin_step(f, t, optimizer, args, kwargs)
        except Exception as exc:
            self.forget(f)
            self.agent.fail(col, exc)
        if st.watch_due < NEVER:
            st.call_watchers(False, optimizer, args, kwargs)
        return out

    def begin_step(self, f: StepFrame, t: Any, optimizer: Any, args: Any, kwargs: Any) -> Any:
        """The outermost optimizer step of the thread begins: its phase opens. Returns the hook's result
        (new arguments, with a step's closure wrapped) or None."""
        st = self.st
        t0 = now_ns()
        # torch's ``args`` start with the optimizer itself: ``step()`` alone has no closure
        plain = len(args) < 2 and not kwargs
        at, closure = (-1, None) if plain else self.closure_arg(optimizer, args, kwargs)
        if closure is not None:
            # a step that runs its own forward and backward (LBFGS, Lightning): a whole
            # iteration, which starts here
            st.begin_forward(True, t0)
        f.t0 = t0
        f.ev0 = self.dev.begin() if self.dev.maybe else None
        t.active = "optimizer"
        self.steps.optimizer_seen = True
        if closure is None:
            return None
        wrapped = self.wrap_closure(closure, f)
        if at < 0:
            return args, {**kwargs, "closure": wrapped}
        return (*args[:at], wrapped, *args[at + 1 :]), kwargs

    def post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        col, st = self.col, self.st
        t = st.tls
        f = t.opt
        if f is not None:
            if not col.enabled:
                self.forget(f)  # turned off between the two hooks: close what the first one opened
            else:
                try:
                    if col.fault_at:
                        col.inject("optimizer_post")
                    f.depth -= 1
                    if f.depth < 0:
                        f.depth = 0
                    elif f.depth == 0:
                        self.end_step(f, t)
                except Exception as exc:
                    self.forget(f)
                    self.agent.fail(col, exc)
        # (f is None: no step of this thread began, the collector was off at its start)
        if st.watch_due < NEVER:
            st.call_watchers(True, optimizer, args, kwargs)

    def end_step(self, f: StepFrame, t: Any) -> None:
        """The outermost optimizer step of the thread ended: its phase, and the update of the step."""
        t.active = None
        t1 = now_ns()
        steps = self.steps
        loop = t.loop
        if loop is None or loop.start_ns is None:
            steps.activity(f.t0)
            loop = steps.mine()
        self.end_part(f, t1, loop.index)  # the thread's step: started by now
        steps.update_done(t1, loop)

    # -- optimizer steps that take a closure -------------------------------------------------------
    def closure_arg(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[int, Any]:
        """Where the ``closure`` of this ``step`` call is (its position in ``args``, -1 for a keyword) and
        the closure itself (None when there is none). The position comes from the signature of the
        optimizer's ``step``, looked up once per class."""
        closure = kwargs.get("closure")
        if closure is not None:
            return -1, closure if callable(closure) else None
        cls = type(optimizer)
        at = self.closure_pos.get(cls)
        if at is None:
            import inspect  # lazy: only once a step runs: not at the agent's start-up

            try:
                names = list(inspect.signature(cls.step).parameters)
            except (TypeError, ValueError):
                names = []
            at = names.index("closure") if "closure" in names else 0  # 0: `self`, never a closure
            self.closure_pos[cls] = at
        if 0 < at < len(args) and callable(args[at]):
            return at, args[at]
        return -1, None

    def wrap_closure(self, closure: Any, f: StepFrame) -> Any:
        """The closure given to the optimizer, as the optimizer calls it: the same call, but the forward,
        backward and ``zero_grad`` it runs keep their own phases; the optimizer's phase is what it does
        outside the closure. The result (the loss) is the closure's, untouched."""
        col, st = self.col, self.st

        def closure_traced(*args: Any, **kwargs: Any) -> Any:
            t = st.tls
            if t.active != "optimizer" or f.depth < 1 or not col.enabled:
                return closure(*args, **kwargs)
            try:
                self.end_part(f, now_ns())
            except Exception as exc:
                col.agent.fail(col, exc)
                return closure(*args, **kwargs)
            t.active = None
            try:
                return closure(*args, **kwargs)
            finally:
                t.active = "optimizer"
                try:
                    f.t0 = now_ns()
                    f.ev0 = self.dev.begin() if self.dev.maybe else None
                except Exception as exc:
                    col.agent.fail(col, exc)

        closure_traced.__wrapped__ = closure  # type: ignore[attr-defined]
        return closure_traced

    def end_part(self, f: StepFrame, t1: int, index: int | None = None) -> None:
        """The optimizer's phase from the start of its step (or the end of its closure) to ``t1``, in
        step ``index`` (default: the calling thread's)."""
        t0 = f.t0
        if index is None:
            index = self.steps.index
        if t1 > t0:
            phase_spans(self.agent, "optimizer", t0, t1, index, record=self.st.phase)
        if f.ev0 is not None:
            self.dev.end("optimizer", index, t0, f.ev0)
            f.ev0 = None

    def forget(self, f: StepFrame | None) -> None:
        """Forget the calling thread's optimizer step in progress (after a failure): the phase it opened
        is closed."""
        if f is None:
            return
        if f.depth > 0:
            self.st.tls.active = None
        f.depth = 0
        f.ev0 = None
