"""``torch.compile`` made visible: its compilation time, graph breaks and recompilations.

Installed when the job imports ``torch._dynamo`` (``torch.compile`` does); nothing of it runs in a job
that never compiles. What it reads is Dynamo's own record, with no log parsing and no change to
what Dynamo does:

* **compile time** — Dynamo's compilation callbacks (``torch._dynamo.callback.callback_handler``:
  start and end of every compilation, the frame's (``DYNAMO``) and the backward compiled at its first
  run (``LAZY_BACKWARD``)). Each compilation is a span (kind ``op``, name ``compile``, attributes
  ``trigger``, ``compile_id``). A compilation inside a phase of the loop (the first forward, the first
  backward, an optimizer step) is cut out of that phase and recorded as the ``compile`` phase
  (:meth:`holoprof.collect.torch.state.TorchState.phase`), so that the step's breakdown shows it
  instead of a long forward; one outside any phase is a ``compile`` phase of its own.
* **graph breaks** — ``torch._dynamo.utils.graph_break_reasons``, Dynamo's list of the reasons its
  graphs were cut, each with the user's stack: one span (``op``/``graph_break``) per entry, with the
  break's type and explanation (``reason``), Dynamo's hints (``hints``; for a data-dependent branch,
  whose record is terse, the hints of its entry in Dynamo's graph-break registry) and the user's
  source line (``location``, ``code``).
* **recompilations** — ``torch._dynamo.utils.get_compilation_metrics()``: a compilation of a frame
  that had been compiled before, with the guard that failed (``recompile_reason``): one span
  (``op``/``recompile``) each, with the frame and the user's line where Dynamo gives it.

They are read after each compilation ends and when the process ends. The callbacks run inside
Dynamo: each catches its own errors (fail open), and a collector turned off leaves them registered as
no-ops until it is uninstalled (Dynamo may be iterating over them).
"""

from __future__ import annotations

import json
import os
import re
import sys
from types import ModuleType
from typing import Any

from holoprof.agent.core import Agent, Collector, now_ns
from holoprof.agent.setup import post_import_finder
from holoprof.collect.torch.collector import torch_state
from holoprof.collect.torch.state import TorchState

#: Phases the torch collector writes through ``TorchState.phase`` (which cut compilations out).
CUT_PHASES = ("forward", "backward", "optimizer", "eval")
#: Most graph-break and recompile records kept per process (the profiler's own memory).
MAX_RECORDS = 2000

_GUARD_ID = re.compile(r"^\s*\d+/\d+:\s*")
#: holoprof's own package: a frame of its ``Module.__call__`` wrapper is the compiled module's call
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
MODULE_CALL = "torch.nn.Module.__call__ (the compiled module's call)"
_USER_LINE = re.compile(r'File "([^"]+)", line (\d+)')


class _Callbacks:
    """The pair registered with Dynamo's callback handler, removed at uninstall."""

    def __init__(self, handler: Any, start: Any, end: Any) -> None:
        self.handler, self.start, self.end = handler, start, end
        handler.register_start_callback(start)
        handler.register_end_callback(end)

    def remove(self) -> None:
        self.handler.remove_start_callback(self.start)
        self.handler.remove_end_callback(self.end)


class CompileCollector(Collector):
    name = "compile"
    default_fault = "compile_end"

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent)
        self.state: TorchState | None = None
        self.utils: ModuleType | None = None
        self.graph_task_id: Any = None
        self.registry: dict[str, list[str]] | None = None
        self.reset()

    def reset(self) -> None:
        self.open: tuple[int, int] | None = None  # (start, thread) of the compilation in progress
        self.breaks_seen = 0
        self.metrics_seen: set[tuple[str, Any]] = set()
        self.records = 0

    def install(self) -> None:
        post_import_finder().add("torch._dynamo", self._on_dynamo)

    def after_fork_child(self) -> None:
        self.reset()

    def _on_dynamo(self, _dynamo: ModuleType) -> None:
        if not self.enabled:
            return
        try:
            # lazy: Dynamo's own modules, loaded by the job's import of torch._dynamo
            import torch
            import torch._dynamo.callback as callback
            import torch._dynamo.utils as dynamo_utils

            self.utils = dynamo_utils
            self.state = torch_state(self.agent)
            self.graph_task_id = getattr(torch._C, "_current_graph_task_id", None) or _no_task
            self.breaks_seen = len(getattr(dynamo_utils, "graph_break_reasons", []))
            self._handles.append(_Callbacks(callback.callback_handler, self._start, self._end))
            limit = getattr(getattr(torch._dynamo, "config", None), "recompile_limit", None)
            self.agent.info["compile"] = {"hooked": True, "recompile_limit": limit}
        except Exception as exc:
            self.agent.fail(self, exc)

    # -- Dynamo's callbacks (inside its compilation: never raise) -----------------------------------
    def _start(self, args: Any) -> None:
        if not self.enabled:
            return
        try:
            self.open = (now_ns(), self.agent.tls.tid)
        except Exception as exc:
            self.agent.fail(self, exc)

    def _end(self, args: Any) -> None:
        if not self.enabled or self.open is None:
            return
        try:
            if self.fault_at:
                self.inject("compile_end")
            t0, _tid = self.open
            self.open = None
            t1 = now_ns()
            agent = self.agent
            step = agent.steps.index
            trigger = str(getattr(getattr(args, "callback_trigger", None), "name", "") or "")
            attrs = {"trigger": trigger, "compile_id": str(getattr(args, "compile_id", "") or "")}
            agent.span("op", "compile", t0, t1, step, attrs)
            active = agent.tls.active
            st = self.state
            if st is not None and (active in CUT_PHASES or self.graph_task_id() != -1):
                st.compile_cuts.append((t0, t1))  # the phase it ran in is cut when it ends
            elif st is not None and active is None:
                agent.span("phase", "compile", t0, t1, step, {"in": ""})
            self.harvest()
        except Exception as exc:
            self.agent.fail(self, exc)

    # -- Dynamo's records -----------------------------------------------------------------------
    def harvest(self) -> None:
        """Spans for the graph breaks and recompilations Dynamo recorded since the last look."""
        utils = self.utils
        if utils is None:
            return
        reasons = list(getattr(utils, "graph_break_reasons", []))
        if len(reasons) < self.breaks_seen:  # torch._dynamo.reset() cleared them
            self.breaks_seen = 0
        for r in reasons[self.breaks_seen :]:
            self._record("graph_break", self.graph_break(r))
        self.breaks_seen = len(reasons)
        get = getattr(utils, "get_compilation_metrics", None)
        for m in get() if get is not None else []:
            key = (
                str(getattr(m, "compile_id", "")),
                getattr(m, "start_time_us", None) or getattr(m, "start_time", None),
            )
            if key in self.metrics_seen:
                continue
            self.metrics_seen.add(key)
            if getattr(m, "recompile_reason", None):
                self._record("recompile", recompile_record(m))

    def _record(self, name: str, attrs: dict[str, Any]) -> None:
        if self.records >= MAX_RECORDS:
            return
        self.records += 1
        t = now_ns()
        self.agent.span("op", name, t, t, self.agent.steps.index, attrs)

    def graph_break(self, r: Any) -> dict[str, Any]:
        """One graph break of Dynamo's record: its type and explanation, hints and the user's line."""
        reason = str(getattr(r, "reason", "") or "")
        kind, explanation, hints = parse_reason(reason)
        if reason.startswith("generic_jump"):
            kind = "Data-dependent branching"
            explanation = explanation or "Detected data-dependent branching (e.g. `if my_tensor.sum() > 0:`)."
        if not hints:
            hints = self.registry_hints(kind)
        stack = list(getattr(r, "user_stack", None) or [])
        users = [f for f in stack if not str(getattr(f, "filename", "")).startswith(_OWN)]
        frame = users[-1] if users else stack[-1] if stack else None
        out: dict[str, Any] = {"reason": kind, "explanation": explanation, "hints": hints[:6]}
        if frame is not None:
            out["location"] = f"{getattr(frame, 'filename', '?')}:{getattr(frame, 'lineno', '?')}"
            out["code"] = str(getattr(frame, "line", "") or "").strip()
        return out

    def registry_hints(self, gb_type: str) -> list[str]:
        """Dynamo's hints for the graph-break type ``gb_type``, from its graph-break registry."""
        if self.registry is None:
            self.registry = {}
            try:
                dynamo = sys.modules["torch._dynamo"]
                path = os.path.join(os.path.dirname(str(dynamo.__file__)), "graph_break_registry.json")
                with open(path) as f:
                    for entries in json.load(f).values():
                        for e in entries:
                            hints = [str(h) for h in e.get("Hints") or []]
                            key = str(e.get("Gb_type", ""))
                            if len(hints) > len(self.registry.get(key, [])):
                                self.registry[key] = hints
            except (KeyError, OSError, ValueError, AttributeError, TypeError):
                pass
        return list(self.registry.get(gb_type, []))

    def finish(self) -> None:
        if self.enabled:
            try:
                self.harvest()
            except Exception as exc:
                self.agent.fail(self, exc)


def parse_reason(reason: str) -> tuple[str, str, list[str]]:
    """(type, explanation, hints) of a graph break's reason as Dynamo formats it: the type on the
    first line, then ``Explanation:`` and ``Hint:`` lines (continuations indented)."""
    lines = reason.splitlines()
    kind = lines[0].strip() if lines else ""
    explanation, hints = "", []
    current: list[str] | None = None
    for line in lines[1:]:
        s = line.strip()
        if s.startswith("Explanation:"):
            explanation = s.removeprefix("Explanation:").strip()
            current = None
        elif s.startswith("Hint:"):
            hints.append(s.removeprefix("Hint:").strip())
            current = hints
        elif not s or s.startswith(("Developer debug context:", "For more details")):
            current = None
        elif current is hints and line.startswith("    "):
            hints[-1] += " " + s
    return kind, explanation, hints


def recompile_record(m: Any) -> dict[str, Any]:
    """One recompilation from Dynamo's compilation metrics: the guard that failed and where."""
    text = str(getattr(m, "recompile_reason", "") or "")
    first = _GUARD_ID.sub("", text.splitlines()[0] if text else "")
    guard = first.split("  #", 1)[0].strip() or first.strip()
    user = _USER_LINE.search(text)
    frame = str(getattr(m, "co_name", "") or "")
    if user is not None:
        location = f"{user.group(1)}:{user.group(2)}"
    else:
        location = f"{getattr(m, 'co_filename', '?')}:{getattr(m, 'co_firstlineno', '?')}"
    if location.startswith(_OWN):
        location, frame = MODULE_CALL, "__call__"
    return {
        "reason": guard,
        "location": location,
        "frame": frame,
        "compile_id": str(getattr(m, "compile_id", "") or ""),
    }


def _no_task() -> int:
    return -1
