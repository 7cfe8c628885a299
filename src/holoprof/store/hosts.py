"""The hosts of a run that many launchers write: one part of the manifest per launcher.

``holoprof run --out DIR --join`` on every node of a multi-node job writes one run: the first
launcher creates it (:func:`holoprof.store.rundir.claim_run`), the others join it. Each launcher
writes only its own file, ``RUN/hosts/<host>-<pid>.json`` (created with ``O_EXCL``, then replaced
atomically by that launcher alone), so no two launchers ever change the same file::

    {"host", "launcher_pid", "boot_id", "pid_ns", "start_ns", "end_ns", "heartbeat_ns",
     "status": "running|finished|crashed", "exit_code", "command", "clock_probes": [[t0, mtime, t1]]}

:func:`merge` folds the parts into the manifest on read: the hosts, the run's status (running while
any launcher runs; finished when every one finished with status 0), its end. A launcher that stops
without finishing its part is *dead*: on the same machine (same boot and pid namespace) its pid is
gone; elsewhere its heartbeat (rewritten every :data:`HEARTBEAT_S`) is older than :data:`STALE_S`.

``clock_probes`` are readings of the file server's clock: the launcher's wall time before and after
writing its part, and the part's modification time as the file system set it. They give each host's
offset from the file server's clock when the job has no collectives to align hosts by
(:mod:`holoprof.store.clocks`).

Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from typing import Any

from holoprof import model
from holoprof.store import safeio
from holoprof.store.raw import discard

#: seconds between two rewrites of a launcher's part while its job runs
HEARTBEAT_S = 10.0
#: a part not rewritten for this long, on another machine, belongs to a launcher that is gone
STALE_S = 180.0
#: clock probes kept per part (the ones with the shortest write)
MAX_PROBES = 16
#: a part is a few KiB; a larger one is not a part holoprof wrote
MAX_PART_BYTES = 1 << 20
#: parts read at most (a run of more hosts lists the first ones)
MAX_PARTS = 100_000
#: fields of a launcher's end that its part carries into the run's manifest
CARRIED = ("signal", "storage_error", "unrecorded_dropped_events")
#: environment variables that name the scheduler's job: launchers of two different jobs never join
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "COBALT_JOBID")


def machine_id() -> tuple[str, str]:
    """(boot id, pid namespace) of this machine: where both are equal, a pid means the same process."""
    boot = pidns = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    return boot, pidns


def job_id() -> str | None:
    """The scheduler's id of the job this launcher belongs to, when one is set."""
    for v in JOB_ID_VARIABLES:
        if os.environ.get(v):
            return f"{v}={os.environ[v]}"
    return None


def process_alive(pid: Any) -> bool:
    """A process of this host with that pid exists (a pid that is not a positive int: no)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True


def _safe(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", host).strip(".") or "host"


class HostPart:
    """This launcher's part of a run's manifest: created once, then rewritten by this launcher only."""

    def __init__(self, run_dir: str, command: list[str], creator: bool) -> None:
        self.run_dir = run_dir
        boot, pidns = machine_id()
        now = time.time_ns()
        self.doc: dict[str, Any] = {
            "host": socket.gethostname(),
            "launcher_pid": os.getpid(),
            "boot_id": boot,
            "pid_ns": pidns,
            "creator": creator,
            "job_id": job_id(),
            "command": command,
            "start_ns": now,
            "end_ns": None,
            "heartbeat_ns": now,
            "status": "running",
            "exit_code": None,
            "clock_probes": [],
        }
        self.path = ""
        self._next_beat = 0.0

    def create(self) -> None:
        """Write the part under a name no other launcher has (``O_EXCL``). Raises OSError."""
        folder = os.path.join(self.run_dir, model.HOSTS_DIR)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        base = f"{_safe(self.doc['host'])}-{os.getpid()}"
        for n in range(1000):
            path = os.path.join(folder, f"{base}{'' if n == 0 else f'.{n}'}.json")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            os.close(fd)
            self.path = path
            self.write()
            return
        raise FileExistsError(f"no free name for this host's part in {folder}")

    def write(self) -> None:
        """Rewrite the part atomically (temporary file, then rename), taking a clock probe of the
        file system on the way. Raises OSError."""
        self.doc["heartbeat_ns"] = time.time_ns()
        data = (json.dumps(self.doc, sort_keys=True) + "\n").encode()
        tmp = f"{self.path}.tmp"
        t0 = time.time_ns()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                mtime = os.fstat(f.fileno()).st_mtime_ns
            t1 = time.time_ns()
            os.replace(tmp, self.path)
        except OSError:
            discard(tmp)
            raise
        probes = [*self.doc["clock_probes"], [t0, mtime, t1]]
        self.doc["clock_probes"] = sorted(probes, key=lambda p: p[2] - p[0])[:MAX_PROBES]

    def heartbeat(self) -> None:
        """Rewrite the part when :data:`HEARTBEAT_S` have gone by; never raises."""
        now = time.monotonic()
        if now < self._next_beat:
            return
        self._next_beat = now + HEARTBEAT_S
        try:
            self.write()
        except OSError:
            pass

    def finish(self, status: str, exit_code: int) -> None:
        """The launcher's job has ended. Raises OSError."""
        self.doc.update(end_ns=time.time_ns(), status=status, exit_code=exit_code)
        self.write()
        self.write()  # a write's clock probe is kept by the next one


def read_parts(run_dir: str) -> list[dict[str, Any]]:
    """The parts of the launchers that joined ``run_dir`` (none for a run of one launcher), oldest
    first; a part that does not read is left out."""
    folder = os.path.join(run_dir, model.HOSTS_DIR)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return []
    out = []
    for n in names[:MAX_PARTS]:
        try:
            doc = safeio.read_json(os.path.join(folder, n), MAX_PART_BYTES)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("host"), str):
            out.append(doc)
    return sorted(out, key=lambda d: (not d.get("creator"), _int(d.get("start_ns")) or 0))


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def part_state(part: dict[str, Any], now_ns: int | None = None) -> str:
    """``running``, ``finished``, ``crashed`` (its job failed), or ``dead`` (its launcher stopped
    before the job ended: killed, or its machine went down)."""
    status = part.get("status")
    if status in ("finished", "crashed"):
        return str(status)
    boot, pidns = machine_id()
    if boot and part.get("boot_id") == boot and part.get("pid_ns") == pidns:
        return "running" if process_alive(part.get("launcher_pid")) else "dead"
    beat = _int(part.get("heartbeat_ns"))
    now = time.time_ns() if now_ns is None else now_ns
    return "running" if beat is not None and now - beat <= STALE_S * 1e9 else "dead"


def merge(manifest: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """``manifest`` with what the parts say: ``hosts``, ``host_parts``, ``status`` (running while any
    launcher runs, else finished when every one finished, else crashed), ``exit_code`` (the first
    that is not 0) and ``end_ns`` (the last, on each host's own clock). A manifest without parts is
    returned as it is."""
    if not parts:
        return manifest
    out = dict(manifest)
    out["hosts"] = list(dict.fromkeys([p["host"] for p in parts]))
    out["host_parts"] = parts
    states = [p.get("status") for p in parts]
    codes = [c for c in (_int(p.get("exit_code")) for p in parts) if c is not None]
    if "running" in states or any(s not in ("finished", "crashed") for s in states):
        out.update(status="running", end_ns=None, exit_code=None)
    else:
        out["status"] = "finished" if all(s == "finished" for s in states) else "crashed"
        out["exit_code"] = next((c for c in codes if c != 0), codes[0] if codes else None)
        ends = [e for e in (_int(p.get("end_ns")) for p in parts) if e is not None]
        out["end_ns"] = max(ends) if ends else manifest.get("end_ns")
        failed = next(
            (p for p in parts if _int(p.get("exit_code")) == out["exit_code"] and p.get("signal")), None
        )
        if failed is not None:
            out["signal"] = failed["signal"]
    errors = [f"{p['host']}: {p['storage_error']}" for p in parts if isinstance(p.get("storage_error"), str)]
    if errors:
        out["storage_error"] = "; ".join(errors)
        out["unrecorded_dropped_events"] = sum(_int(p.get("unrecorded_dropped_events")) or 0 for p in parts)
    return out


def run_state(manifest: dict[str, Any]) -> tuple[str, list[str]]:
    """The status of a (merged) manifest with its launchers' liveness, and the hosts whose launcher
    is dead: ``crashed`` when a launcher stopped before its job ended."""
    status = str(manifest.get("status", "running"))
    parts = manifest.get("host_parts")
    if not parts:
        if status == "running" and not process_alive(manifest.get("launcher_pid")):
            return "crashed", []
        return status, []
    now = time.time_ns()
    states = [(p["host"], part_state(p, now)) for p in parts]
    dead = list(dict.fromkeys(h for h, s in states if s == "dead"))
    if any(s == "running" for _, s in states):
        return "running", dead
    if dead:
        return "crashed", dead
    return status, dead
