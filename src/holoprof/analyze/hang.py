"""The ``hang`` finding: the hang files of all ranks (:mod:`holoprof.collect.hangs`), combined.

Each traced process whose watchdog saw it stuck (in one collective, or in one step, for longer than
its time-out) wrote ``<run>/<host>-<pid>/hang-<pid>.json``: what it waits in (group, op, sequence
number, bytes), the last sequence number it issued on each group, its Python stacks, and whether the
episode is still on (``hung``), ended with the process (``ended``) or resolved. This module reads
them while the job runs or after, with the processes table (which ranks exist, which have ended):

* ``waiting_ranks``: ranks in the collective most of the waiting ranks are in (``collective``);
* ``stuck_ranks``: every other rank, with why (``ranks``): it never entered that collective and is
  in its step elsewhere, it waits in another collective (a ``mismatch``: the ranks disagree on the
  collective sequence), it died (its process ended while the others wait), or it wrote nothing
  (its Python could not run, or it has no agent);
* ``stacks``: each rank's stacks as its watchdog last took them;
* ``flight_recorder``: each rank's summary of torch's flight recorder when its watchdog last looked
  (:mod:`holoprof.collect.flight_recorder`): its last completed collective, those in flight, and
  whether the one it waits in is the one holoprof's ring names (``matches_ring``);
* ``status``: ``ongoing`` (the job still runs and is stuck), ``resolved`` (the job moved on: a
  hang of ``hung_s`` seconds) or ``killed`` (the job ended while stuck: its scheduler killed it).
"""

from __future__ import annotations

import glob
import os
import socket
import time
from collections import Counter
from typing import Any

from holoprof.analyze.findings import Finding
from holoprof.store import safeio
from holoprof.store.reader import Run

#: A hang file is a few KiB (stacks at most 64 KiB each, for the last few episodes); larger is not read.
MAX_HANG_BYTES = 4 * 2**20
NS = 1_000_000_000


def hang_files(run_dir: str) -> list[dict[str, Any]]:
    """Every process's hang file (an unreadable one is left out)."""
    out = []
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "*", "hang-*.json"))):
        try:
            doc = safeio.read_json(path, MAX_HANG_BYTES)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rank"), int):
            out.append(doc)
    return out


def _episode(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The rank's hang: the one going on (or that ended with the process), else its last resolved."""
    if doc.get("state") in ("hung", "ended"):
        return {
            "state": doc["state"],
            "since_ns": doc.get("since_ns"),
            "end_ns": doc.get("updated_ns"),
            "waiting_in": doc.get("waiting_in"),
            "stacks": doc.get("stacks") or "",
            "seqs": doc.get("seqs") or {},
            "flight_recorder": doc.get("flight_recorder"),
        }
    eps = doc.get("episodes") or []
    if not eps:
        return None
    e = eps[-1]
    return {
        "state": "resolved",
        "since_ns": e.get("since_ns"),
        "end_ns": e.get("resolved_ns"),
        "waiting_in": e.get("waiting_in"),
        "stacks": e.get("stacks") or "",
        "seqs": e.get("seqs") or {},
        "flight_recorder": e.get("flight_recorder"),
    }


def _ranks(run: Run) -> dict[int, dict[str, Any]]:
    """Every rank's process: {rank: {host, pid, exit_code, ended}} (the last process of a rank)."""
    rows = run.rows(
        """SELECT rank, host, pid, max(exit_code), max(coalesce(end_ns, 0)), max(world_size)
           FROM processes WHERE rank >= 0 GROUP BY rank, host, pid ORDER BY rank, pid"""
    )
    out: dict[int, dict[str, Any]] = {}
    for rank, host, pid, code, end, ws in rows:
        ended = bool(end) or (code is not None and int(code) != -1)
        out[int(rank)] = {
            "host": host,
            "pid": int(pid),
            "exit_code": int(code) if code is not None and int(code) != -1 else None,
            "ended": ended,
            "world_size": int(ws or 0),
        }
    return out


def _gone(proc: dict[str, Any]) -> bool:
    """A process of this host that no longer exists (killed before it could say so: SIGKILL)."""
    if proc["host"] != socket.gethostname():
        return False
    try:
        os.kill(proc["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _key(w: dict[str, Any]) -> tuple[str, int, str]:
    return (str(w.get("group")), int(w.get("seq") or 0), str(w.get("op")))


def hang_section(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    docs = hang_files(run.path)
    if not docs:
        return {}, []
    eps = {d["rank"]: (d, e) for d in docs if d["rank"] >= 0 and (e := _episode(d)) is not None}
    waiting = {r: e["waiting_in"] for r, (_, e) in eps.items() if e["waiting_in"]}
    if not waiting:
        return {}, []  # stuck in a step, but nobody waits for it in a collective: not a hang
    counts = Counter(_key(w) for w in waiting.values())
    top = max(
        counts.items(), key=lambda kv: (kv[1], -min(r for r, w in waiting.items() if _key(w) == kv[0]))
    )[0]
    coll = next(w for w in waiting.values() if _key(w) == top)
    procs = _ranks(run)
    world = max([d.get("world_size") or 0 for d in docs] + [p["world_size"] for p in procs.values()] + [0])
    all_ranks = sorted(set(range(world)) | set(procs) | set(eps))
    ranks: dict[str, dict[str, Any]] = {}
    waiting_ranks: list[int] = []
    stuck: list[int] = []
    for r in all_ranks:
        info = _rank_state(r, eps.get(r), procs.get(r), top, run.status)
        ranks[str(r)] = info
        (waiting_ranks if info["state"] == "waiting" else stuck).append(r)
    states = [e["state"] for _, e in eps.values()]
    if "hung" in states and run.status == "running":
        status = "ongoing"
    elif "hung" in states or "ended" in states:
        status = "killed"
    else:
        status = "resolved"
    since = min(int(e["since_ns"]) for _, e in eps.values() if e["since_ns"])
    end = max(int(e["end_ns"] or 0) for _, e in eps.values())
    if status == "ongoing":
        end = max(end, time.time_ns())
    section = {
        "status": status,
        "hung_s": round(max(0, end - since) / NS, 3),
        "since_ns": since,
        "collective": {"group": coll["group"], "op": coll["op"], "seq": coll["seq"], "bytes": coll["bytes"]},
        "waiting_ranks": waiting_ranks,
        "stuck_ranks": stuck,
        "dead_ranks": [r for r in stuck if ranks[str(r)]["state"] == "died"],
        "mismatch": [
            {"rank": r, **{k: ranks[str(r)]["waiting_in"][k] for k in ("group", "op", "seq")}}
            for r in stuck
            if ranks[str(r)]["state"] == "other_collective"
        ],
        "ranks": ranks,
        "stacks": {str(r): e["stacks"] for r, (_, e) in sorted(eps.items()) if e["stacks"]},
        "flight_recorder": {
            str(r): e["flight_recorder"]
            for r, (_, e) in sorted(eps.items())
            if isinstance(e["flight_recorder"], dict)
        },
    }
    return section, [_finding(section)]


def _rank_state(
    rank: int,
    ep: tuple[dict[str, Any], dict[str, Any]] | None,
    proc: dict[str, Any] | None,
    top: Any,
    run_status: str,
) -> dict[str, Any]:
    """Where one rank is with respect to the collective the others wait in (``top``)."""
    group, seq, op = top
    if ep is not None and ep[1]["waiting_in"]:
        w = ep[1]["waiting_in"]
        if _key(w) == top:
            return {"state": "waiting", "reason": f"waits in {op} #{seq} of group {group}"}
        return {
            "state": "other_collective",
            "waiting_in": w,
            "reason": f"waits in another collective, {w.get('op')} #{w.get('seq')} of group {w.get('group')} "
            "(the ranks disagree on the collective sequence)",
        }
    last = ep[1]["seqs"].get(group) if ep is not None else None
    entered = f"its last collective on group {group} was #{last}" if isinstance(last, int) else ""
    if proc is not None and (proc["ended"] or _gone(proc)) and (ep is None or ep[1]["state"] == "hung"):
        code = proc["exit_code"]
        how = (
            f"exit code {code}"
            if code is not None
            else "it exited"
            if proc["ended"]
            else "no exit record: killed by a signal"
        )
        return {
            "state": "died",
            "reason": f"its process ended ({how}) while the others wait",
            "pid": proc["pid"],
        }
    if ep is not None:
        return {
            "state": "elsewhere",
            "reason": "in its step, not in any collective"
            + (f"; never entered {op} #{seq} ({entered})" if entered else ""),
            "last_seq": last,
        }
    if proc is None:
        return {"state": "unknown", "reason": "no traced process of this rank was seen"}
    return {
        "state": "silent",
        "reason": "wrote no hang state (its Python could not run: stuck in native code holding the "
        "interpreter, or its watchdog is off)",
    }


def _finding(sec: dict[str, Any]) -> Finding:
    coll = sec["collective"]
    what = f"{coll['op']} #{coll['seq']} (group {coll['group']})"
    stuck = sec["stuck_ranks"]
    names = ", ".join(f"rank {r} ({sec['ranks'][str(r)]['state']})" for r in stuck) or "no rank"
    waiting = ", ".join(str(r) for r in sec["waiting_ranks"])
    when = {
        "ongoing": f"hung for {sec['hung_s']:.0f} s so far",
        "resolved": f"a hang of {sec['hung_s']:.0f} s that resolved",
        "killed": f"the job ended while hung, after {sec['hung_s']:.0f} s (killed)",
    }[sec["status"]]
    if sec["mismatch"]:
        rec = (
            "The ranks wait in different collectives: they issue collectives in a different order "
            "(a collective under a condition that differs between ranks, or a different number of "
            "steps or batches per rank). Make every rank issue the same collectives in the same order."
        )
    elif sec["dead_ranks"]:
        rec = (
            f"Rank(s) {', '.join(str(r) for r in sec['dead_ranks'])} ended while the others wait: see "
            "their output for the error; a job should stop all ranks when one fails (torchrun does "
            "when a rank exits with an error), and set a collective time-out (init_process_group's "
            "timeout) so that the others do not wait forever."
        )
    else:
        rec = (
            f"See the stacks of {names}: it never entered {what} that rank(s) {waiting} wait in "
            "(a long operation on one rank only, a deadlock, a rank-dependent branch). Move that "
            "work out of the step or do it on every rank."
        )
    return Finding(
        id="hang",
        severity="medium" if sec["status"] == "resolved" else "high",
        title=f"hang: rank(s) {waiting} wait in {what} for {names}; {when}",
        evidence={
            k: sec[k]
            for k in (
                "status",
                "hung_s",
                "stuck_ranks",
                "waiting_ranks",
                "collective",
                "dead_ranks",
                "mismatch",
                "ranks",
                "stacks",
                "flight_recorder",
            )
        },
        recommendation=rec,
        estimated_gain=0.0,
        threshold={"timeout_s": "max(--hang-timeout, 20 x the median step) in one collective or step"},
        gain_basis={"model": "none: a hang is a fault to fix, not a share of the step time"},
    )
