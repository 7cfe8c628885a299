"""Hangs, seen from inside one process: a ring buffer of its collectives and a watchdog.

The comm collector (:mod:`holoprof.collect.comm`, :mod:`holoprof.collect.comm_functional`) appends
one entry to :class:`CollectiveRing` per collective the job issues (a deque append: bounded, cheap)
and marks it completed when it returns or its work completes: ``[group, seq, op, bytes, issued_ns,
started_ns, completed_ns]`` (monotonic ns; ``completed_ns`` 0 while in flight; ``seq`` counts the
collectives of each process group from 1, the same on every rank of a job that issues them in the
same order). ``started_ns`` is the issue time here (gloo and the CPU backends do not say when the
collective started on the wire).

:class:`HangWatch` runs on the agent's writer thread (a poller, about once a second). The process is
stuck when it has been in one collective for longer than the hang time-out, or inside one training
step for that long; the time-out is ``max(hang_timeout_s, 20 × the median step)`` (option
``hang_timeout_s``, ``holoprof run --hang-timeout``; 0 turns the watchdog off). While stuck it writes
``<run>/<host>-<pid>/hang-<pid>.json`` (atomically; again every few seconds while it lasts) with its
ring buffer's open and last collectives, the last sequence number of each group, every thread's
Python stack and a summary of torch's own flight recorder (:mod:`holoprof.collect.flight_recorder`:
what torch's backend says is in flight, checked against the ring); once the process moves on (a step ends, the collective completes) the file says when
it resolved, and at exit whether it ended while stuck. The report combines the files of all ranks
into the ``hang`` finding (:mod:`holoprof.analyze.hang`).

This module runs inside the job: standard library only.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from typing import Any

from holoprof.agent.core import Agent, now_ns
from holoprof.collect.flight_recorder import FlightRecorder

#: Collectives kept per process (the last ones, completed or not).
RING_SIZE = 256
#: The default hang time-out, and the multiple of the median step that lengthens it.
DEFAULT_TIMEOUT_S = 300.0
STEP_MULTIPLE = 20.0
#: While a process stays stuck its file is written again this often (its stacks move on).
REWRITE_S = 5.0
#: Collectives of the ring buffer written into the file, the newest last.
LAST_WRITTEN = 16
#: Resolved episodes kept in the file (the stacks of the last few).
EPISODES_KEPT = 20
STACKS_KEPT = 3
MAX_STACK_CHARS = 64_000
HANG_PREFIX = "hang-"
SCHEMA = "holoprof.hang/1"

#: Groups whose sequence numbers are kept (more, and a new group's collectives all say 1).
MAX_GROUPS = 1000

#: One collective: [group, seq, op, bytes, issued_ns, started_ns, completed_ns]
Entry = list[Any]


class CollectiveRing:
    """The last :data:`RING_SIZE` collectives of this process, and each group's sequence number."""

    def __init__(self, size: int = RING_SIZE) -> None:
        self.ring: collections.deque[Entry] = collections.deque(maxlen=size)
        self.seqs: dict[str, int] = {}

    def issued(self, group: str, op: str, nbytes: int, t_ns: int) -> Entry:
        """Note a collective issued on ``group`` (its name, the same on every rank); its entry's
        ``seq`` (from 1) is the number every rank gives it: the comm spans carry it too."""
        seq = self.seqs.get(group, 0) + 1
        if seq > 1 or len(self.seqs) < MAX_GROUPS:  # a job that makes groups without end: bounded
            self.seqs[group] = seq
        entry: Entry = [group, seq, op, nbytes, t_ns, t_ns, 0]
        self.ring.append(entry)
        return entry

    def oldest_open(self) -> Entry | None:
        """The collective in flight for the longest (None when none is). One issued before another of
        its group that completed is not waited for any more (a group's collectives complete in order:
        it is work nobody waited on, such as an ``isend`` without ``wait``)."""
        found = None
        done_groups: set[str] = set()
        for e in reversed(list(self.ring)):
            if e[6]:
                done_groups.add(e[0])
            elif e[0] not in done_groups:
                found = e
        return found


def completed(entry: Entry | None, t_ns: int) -> None:
    if entry is not None and not entry[6]:
        entry[6] = t_ns


def group_name(dist: Any, group: Any) -> str:
    """A process group's name, the same on every rank ("0" for the default group)."""
    try:
        pg = group if group is not None else dist.group.WORLD
        name = getattr(pg, "group_name", None)
        if name is None:
            name = dist.distributed_c10d._get_process_group_name(pg)
        return str(name)
    except Exception:
        return "?"


class HangWatch:
    """The watchdog of one process (see the module's text); ``poll`` runs on the writer thread."""

    def __init__(self, agent: Agent, ring: CollectiveRing) -> None:
        self.agent = agent
        self.ring = ring
        self.flight = FlightRecorder()  # torch's own record of the collectives, read when stuck
        opt = agent.options.get("hang_timeout_s", DEFAULT_TIMEOUT_S)
        self.timeout_s = float(opt) if isinstance(opt, (int, float)) and not isinstance(opt, bool) else 300.0
        self.reset()

    def reset(self) -> None:
        self._last_index = 0
        self._last_start: int | None = None
        self._durations: collections.deque[float] = collections.deque(maxlen=64)
        self._episode: dict[str, Any] | None = None
        self._episodes: list[dict[str, Any]] = []
        self._written = 0.0

    # -- the time-out ------------------------------------------------------------------------------
    def _note_steps(self) -> None:
        steps = self.agent.steps
        loop = steps.primary  # the training loop (this runs on the writer thread)
        idx, start = (loop.index, loop.start_ns) if loop is not None else (0, None)
        quiet = self._episode is None  # a step that hung is no measure of the usual step
        if quiet and idx > self._last_index and start is not None and self._last_start is not None:
            per = (start - self._last_start) / (idx - self._last_index) / 1e9
            if per > 0:
                self._durations.append(per)
        if idx != self._last_index or start != self._last_start:
            self._last_index, self._last_start = idx, start

    def median_step_s(self) -> float:
        d = sorted(self._durations)
        return d[len(d) // 2] if d else 0.0

    def limit_s(self) -> float:
        return max(self.timeout_s, STEP_MULTIPLE * self.median_step_s())

    # -- the poller --------------------------------------------------------------------------------
    def poll(self) -> list[tuple[str, dict[str, list[Any]]]]:
        if self.timeout_s <= 0:
            return []
        try:
            self._check()
        except OSError as exc:  # the run directory cannot be written: say it once, keep watching
            self.agent.warn_once(
                "hang-file", f"holoprof: cannot write the hang state ({exc.strerror or exc})"
            )
        except Exception as exc:  # the watchdog only is turned off; the collectives go on being recorded
            self.timeout_s = 0.0
            self.agent.fail("hang-watch", exc)
        return []

    def _check(self) -> None:
        self._note_steps()
        now = now_ns()
        limit_ns = int(self.limit_s() * 1e9)
        entry = self.ring.oldest_open()
        loop = self.agent.steps.primary
        step_start = loop.start_ns if loop is not None else None
        # in it for longer than the limit, with no step ended since it was issued
        waiting = (
            entry is not None and now - entry[4] > limit_ns and (step_start is None or step_start <= entry[4])
        )
        in_step = step_start is not None and now - step_start > limit_ns
        ep = self._episode
        if waiting or in_step:
            since = entry[4] if waiting and entry is not None else step_start
            assert since is not None
            if ep is None:
                ep = self._episode = {"since": since, "detected": now, "step": self.agent.steps.index}
                self._written = 0.0
            if waiting and ep.get("entry") is not entry:
                ep["entry"] = entry  # in the collective now (or in another one): what it waits in
                self._written = 0.0
            if time.monotonic() - self._written >= REWRITE_S:
                self._write("hung", now)
        elif ep is not None:
            self._close(ep, now)

    def _close(self, ep: dict[str, Any], now: int) -> None:
        self._episode = None
        off = self.agent.clock_offset_ns
        self._episodes.append(
            {
                "since_ns": ep["since"] + off,
                "resolved_ns": now + off,
                "duration_s": round((now - ep["since"]) / 1e9, 3),
                "waiting_in": _entry_doc(ep.get("entry"), self.agent),
                "step": ep["step"],
                "stacks": ep.get("stacks", ""),
                "seqs": ep.get("seqs", {}),
                "flight_recorder": ep.get("flight_recorder"),
            }
        )
        del self._episodes[:-EPISODES_KEPT]
        for old in self._episodes[:-STACKS_KEPT]:
            old.pop("stacks", None)
            old.pop("flight_recorder", None)
        self._write("resolved", now)

    def finish(self) -> None:
        """At exit: a process that ends while stuck says so in its file."""
        if self.timeout_s <= 0 or self._episode is None:
            return
        try:
            self._check()  # it may have moved on since the last look
            if self._episode is not None:
                self._write("ended", now_ns())
        except Exception:
            pass

    # -- the file ----------------------------------------------------------------------------------
    def _write(self, state: str, now: int) -> None:
        a = self.agent
        off = a.clock_offset_ns
        ident = a.identity()
        ep = self._episode
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "host": a.host,
            "pid": a.pid,
            "rank": ident["rank"],
            "world_size": ident["world_size"],
            "state": state,
            "updated_ns": now + off,
            "timeout_s": round(self.limit_s(), 3),
            "median_step_s": round(self.median_step_s(), 6),
            "steps_done": a.steps.index,
            "seqs": dict(self.ring.seqs),
            "last_collectives": [_entry_doc(e, a) for e in list(self.ring.ring)[-LAST_WRITTEN:]],
            "episodes": list(self._episodes),
        }
        if ep is not None:
            entry = ep.get("entry")
            doc.update(
                since_ns=ep["since"] + off,
                detected_ns=ep["detected"] + off,
                stuck_s=round((now - ep["since"]) / 1e9, 3),
                step=ep["step"],
                waiting_in=_entry_doc(entry, a) if entry is not None else None,
                stacks=stacks_text(a),
            )
            if state != "ended" or "flight_recorder" not in ep:  # at exit: the last one taken
                ep["flight_recorder"] = self.flight.summary(entry)
            doc["flight_recorder"] = ep["flight_recorder"]
            ep["stacks"] = doc["stacks"]
            ep["seqs"] = doc["seqs"]
        path = os.path.join(a.folder, f"{HANG_PREFIX}{a.pid}.json")
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
        self._written = time.monotonic()


def _entry_doc(e: Entry | None, agent: Agent) -> dict[str, Any] | None:
    if e is None:
        return None
    off = agent.clock_offset_ns
    group, seq, op, nbytes, issued, started, done = e
    return {
        "group": group,
        "seq": seq,
        "op": op,
        "bytes": nbytes,
        "issued_ns": issued + off,
        "started_ns": started + off,
        "completed_ns": done + off if done else None,
    }


def stacks_text(agent: Agent) -> str:
    """Every Python thread's stack but the writer's, the main thread first."""
    import traceback  # lazy: only for a process that is stuck

    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    frames = sorted(sys._current_frames().items(), key=lambda kv: (kv[0] != main, kv[0]))
    parts = [f"# pid {agent.pid} on {agent.host}, {time.strftime('%Y-%m-%d %H:%M:%S')}"]
    for ident, frame in frames:
        if ident == me:
            continue
        parts.append(f'\nThread {ident} "{names.get(ident, "?")}" (most recent call last):')
        parts.append("".join(traceback.format_stack(frame)).rstrip())
    text = "\n".join(parts) + "\n"
    return text if len(text) <= MAX_STACK_CHARS else text[:MAX_STACK_CHARS] + "\n[... cut]\n"
