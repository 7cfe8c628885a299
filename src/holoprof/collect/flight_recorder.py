"""PyTorch's own flight recorder, read by the hang watchdog (:mod:`holoprof.collect.hangs`).

torch.distributed keeps, in C++, a ring buffer of the collectives its backends ran (the "flight
recorder": NCCL's since torch 2.3, every c10d backend's — gloo included — in recent versions): per
collective its process group, sequence number, op, input sizes and state. The watchdog of a stuck
process dumps it in-process (``torch._C._distributed_c10d._dump_fr_trace_json``, and
``_dump_nccl_trace_json`` where the build has NCCL) and keeps a compact summary of it in its hang
file: the last completed collective, those still in flight, and whether they agree with holoprof's own
ring of the process's collectives.

* :func:`buffer_setting` runs when the job imports torch, before it can create a process group: a
  buffer size the user set (``TORCH_FR_BUFFER_SIZE``, or ``TORCH_NCCL_TRACE_BUFFER_SIZE``, which
  torch also reads) is theirs and left alone; torch 2.6 and later record 2000 entries when neither
  is set, and that default is left alone too; on an older torch, which records nothing by default,
  a small buffer (:data:`SMALL_BUFFER` entries) is turned on for NCCL. Nothing the job computes
  changes: the recorder only notes each collective.
* :class:`FlightRecorder` dumps it on a thread of its own with a time-out (the dump takes a lock
  that the backend's threads take too): a dump that fails or does not return in time is counted,
  never raised; while one has not returned, no other is started.

This module runs inside the job: standard library only (torch is reached through ``sys.modules``).
"""

from __future__ import annotations

import json
import re
import sys
import threading
from typing import Any

#: The environment variables torch reads for the buffer size (the first is the newer name).
ENV_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
#: Entries turned on where torch records none by default (torch < 2.6).
SMALL_BUFFER = 256
#: Set with the buffer size holoprof sets, so that the job's child processes do not take it for the
#: user's.
MARK = "HOLOPROF_FR_BUFFER_SET"
#: torch's own default from 2.6 on.
TORCH_DEFAULT = 2000
#: The dumps tried, the gloo/generic recorder's and NCCL's (a CUDA build's), in that order.
DUMPS = ("_dump_fr_trace_json", "_dump_nccl_trace_json")
DUMP_TIMEOUT_S = 2.0
#: Collectives in flight kept in the summary (the oldest first), and input shapes kept per collective.
MAX_IN_FLIGHT = 4
MAX_SHAPES = 4


def buffer_setting(environ: dict[str, str] | Any, torch_version: str) -> dict[str, Any]:
    """What the flight recorder's buffer is for this job, setting it in ``environ`` where holoprof
    turns it on: ``{"buffer": entries, "set_by": "user" | "torch" | "holoprof"}``."""
    for name in ENV_NAMES:
        value = environ.get(name)
        if value is not None and value.strip():
            try:
                size: int | None = int(value)
            except ValueError:
                size = None  # not a number: whatever torch makes of it, the dump says
            ours = environ.get(MARK) == f"{name}={value}"  # a parent process's agent set it
            return {"buffer": size, "set_by": "holoprof" if ours else "user", "variable": name}
    if _version(torch_version) >= (2, 6):
        return {"buffer": TORCH_DEFAULT, "set_by": "torch"}
    # older torch reads only the NCCL name, and records only NCCL's collectives
    environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = str(SMALL_BUFFER)
    environ[MARK] = f"TORCH_NCCL_TRACE_BUFFER_SIZE={SMALL_BUFFER}"
    return {"buffer": SMALL_BUFFER, "set_by": "holoprof", "variable": "TORCH_NCCL_TRACE_BUFFER_SIZE"}


def _version(text: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


class FlightRecorder:
    """Dumps of this process's flight recorder, summarized (see the module's text)."""

    def __init__(self, setting: dict[str, Any] | None = None) -> None:
        self.setting = setting or {}
        self.failures = 0
        self._pending: threading.Thread | None = None

    def summary(self, ring_entry: list[Any] | None, timeout_s: float = DUMP_TIMEOUT_S) -> dict[str, Any]:
        """The recorder's summary now (:func:`summarize`), or ``{"unavailable": why}``; never raises."""
        try:
            out = self._summary(ring_entry, timeout_s)
        except Exception as exc:  # fail open: the watchdog goes on without it
            self.failures += 1
            out = {"unavailable": f"the dump failed ({type(exc).__name__}: {exc})"}
        if self.setting:
            out["buffer"] = self.setting.get("buffer")
            out["set_by"] = self.setting.get("set_by")
        if self.failures:
            out["failures"] = self.failures
        return out

    def _summary(self, ring_entry: list[Any] | None, timeout_s: float) -> dict[str, Any]:
        why = unavailable(self.setting)
        if why:
            return {"unavailable": why}
        if self._pending is not None and self._pending.is_alive():
            self.failures += 1
            return {"unavailable": "an earlier dump has not returned"}
        c10d = sys.modules.get("torch._C._distributed_c10d")
        dumps = [f for f in (getattr(c10d, n, None) for n in DUMPS) if callable(f)]
        if not dumps:
            return {"unavailable": "this torch has no flight recorder dump (torch 2.5 or older without NCCL)"}
        box: dict[str, Any] = {}

        def body() -> None:
            try:
                box["docs"] = [json.loads(f(True, False)) for f in dumps]
            except BaseException as exc:  # reported by the caller, on its own thread
                box["error"] = exc

        t = threading.Thread(target=body, name="holoprof-flight-recorder", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            self._pending = t
            self.failures += 1
            return {"unavailable": f"the dump did not return within {timeout_s:g} s"}
        if "error" in box:
            raise box["error"]
        entries: list[dict[str, Any]] = []
        for doc in box.get("docs") or []:
            if isinstance(doc, dict):
                entries += [e for e in doc.get("entries") or [] if isinstance(e, dict)]
        return summarize(entries, ring_entry)


def unavailable(setting: dict[str, Any]) -> str:
    """Why there is nothing to read ('' when there may be)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return "no torch.distributed process group"
    except Exception:
        return "no torch.distributed process group"
    if setting.get("buffer") == 0:
        return f"turned off ({setting.get('variable') or 'buffer size'} = 0)"
    return ""


def _open(e: dict[str, Any]) -> bool:
    """In flight: not completed, and not retired (gloo never marks its entries completed: a retired
    one is done)."""
    if e.get("state") == "completed":
        return False
    return not e["retired"] if "retired" in e else True


def _brief(e: dict[str, Any]) -> dict[str, Any]:
    name = str(e.get("profiling_name") or "?")
    op = name.split(":", 1)[1] if ":" in name else name
    p2p = bool(e.get("is_p2p"))
    pg = e.get("process_group") or ["?"]
    seq = e.get("p2p_seq_id" if p2p else "collective_seq_id")
    out: dict[str, Any] = {"op": op, "seq": int(seq or 0), "pg": str(pg[0] if isinstance(pg, list) else pg)}
    if p2p:
        out["p2p"] = True
    return out


def _norm(op: str) -> str:
    """An op's name as both sources spell it (``_allgather_base`` and ``all_gather_into_tensor``)."""
    s = re.sub(r"[^a-z]", "", op.lower().split(" ")[0])
    for part in ("intotensor", "coalesced", "tensor", "single", "base"):
        s = s.replace(part, "")
    return s


def summarize(entries: list[dict[str, Any]], ring_entry: list[Any] | None) -> dict[str, Any]:
    """``{entries, backend, last_completed: {op, seq, pg}, in_flight: [{op, seq, pg, state,
    input_sizes}], matches_ring}`` of a dump's entries; ``matches_ring`` (when this process waits in a
    collective of holoprof's ring, ``[group, seq, op, ...]``) says whether the recorder has that
    collective (same group, sequence number and op) in flight, ``ring`` giving holoprof's when not,
    and ``seq_offset`` when the recorder has one collective of that op in flight on that group,
    numbered differently (by the collectives torch ran from C++, which the ring does not see)."""
    entries = sorted(entries, key=lambda e: int(e.get("time_created_ns") or 0))
    out: dict[str, Any] = {"entries": len(entries)}
    backends = sorted(
        {
            str(e.get("profiling_name")).split(":", 1)[0]
            for e in entries
            if ":" in str(e.get("profiling_name"))
        }
    )
    if backends:
        out["backend"] = ",".join(backends)
    done = [e for e in entries if not _open(e)]
    if done:
        out["last_completed"] = _brief(done[-1])
    flying = [e for e in entries if _open(e)]
    out["in_flight"] = [
        {**_brief(e), "state": e.get("state"), "input_sizes": (e.get("input_sizes") or [])[:MAX_SHAPES]}
        for e in flying[:MAX_IN_FLIGHT]
    ]
    if len(flying) > MAX_IN_FLIGHT:
        out["in_flight_more"] = len(flying) - MAX_IN_FLIGHT
    if ring_entry is not None:
        group, seq, op = str(ring_entry[0]), int(ring_entry[1]), str(ring_entry[2])
        same = any(
            b["pg"] == group and b["seq"] == seq and _norm(b["op"]) == _norm(op) for b in map(_brief, flying)
        )
        out["matches_ring"] = same
        if not same:
            out["ring"] = {"op": op, "seq": seq, "pg": group}
            alike = [b for b in map(_brief, flying) if b["pg"] == group and _norm(b["op"]) == _norm(op)]
            if len(alike) == 1:  # the same op in flight, numbered apart (collectives issued from C++)
                out["seq_offset"] = alike[0]["seq"] - seq
    return out
