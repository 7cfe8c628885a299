"""``holoprof ctl RUN ACTION``: ask the processes of a running job for a stack dump, a deep profile, ...

The request goes through the run's control mailbox (the format: :mod:`holoprof.store.mailbox`); with
``--wait`` the command waits until every live traced process it was addressed to has answered.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from holoprof import model
from holoprof.errors import HoloprofError
from holoprof.store import mailbox
from holoprof.store.reader import load


@dataclass(frozen=True)
class Proc:
    host: str
    pid: int
    rank: int
    role: str

    @property
    def key(self) -> str:
        return f"{self.host}-{self.pid}"


@dataclass
class Outcome:
    """Where a request stands: one state per process that took it, and who has not answered."""

    request: dict[str, Any]
    states: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[Proc] = field(default_factory=list)
    gone: list[Proc] = field(default_factory=list)
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return (
            not self.timed_out
            and not self.waiting
            and bool(self.states)
            and all(s.get("state") == "done" for s in self.states)
        )

    def to_dict(self, run_dir: str) -> dict[str, Any]:
        art = os.path.join(run_dir, model.ARTIFACTS_DIR)
        return {
            "request": self.request,
            "states": [
                {**s, "artifact_paths": [os.path.join(art, a) for a in s.get("artifacts", [])]}
                for s in self.states
            ],
            "waiting": [p.key for p in self.waiting],
            "gone": [p.key for p in self.gone],
            "timed_out": self.timed_out,
        }


def _alive(p: Proc) -> bool:
    if p.host != socket.gethostname():
        return True  # another node: trust its processes row
    try:
        os.kill(p.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def live_processes(run_dir: str) -> tuple[str, list[Proc]]:
    """The run's status and its live traced processes (not the launcher)."""
    run = load(run_dir)
    rows = run.rows(
        """SELECT host, pid, rank, role FROM processes
           WHERE coalesce(end_ns, 0) = 0 AND coalesce(info, '') LIKE '%"source": "agent"%'
             AND role <> 'launcher'
           ORDER BY pid"""
    )
    procs = [Proc(str(h), int(p), int(r if r is not None else -1), str(role)) for h, p, r, role in rows]
    return run.status, [p for p in procs if _alive(p)]


def addressed(procs: list[Proc], target: dict[str, Any] | None) -> list[Proc]:
    if target is None:
        return procs
    ((key, value),) = target.items()
    return [p for p in procs if getattr(p, key) == value]


def check_running(run_dir: str) -> list[Proc]:
    status, procs = live_processes(run_dir)
    if status != "running":
        raise HoloprofError(
            f"{run_dir} is not running (status: {status}); on-demand actions need a live job — start one "
            "with `holoprof run`"
        )
    return procs


def request(
    run_dir: str,
    action: str,
    params: dict[str, Any] | None = None,
    target: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[Proc]]:
    """Validate, check that the run is live, and write the request. Returns it and the processes asked."""
    try:
        mailbox.validate(action, params, target)
    except mailbox.RequestError as exc:
        raise HoloprofError(str(exc))
    procs = addressed(check_running(run_dir), target)
    try:
        req = mailbox.write_request(run_dir, action, params, target)
    except OSError as exc:
        raise HoloprofError(
            f"cannot write the request into {os.path.join(run_dir, model.CONTROL_DIR)} "
            f"({exc.strerror or exc}); it must be a writable directory of the run, not a link"
        )
    return req, procs


def outcome(run_dir: str, req: dict[str, Any], expected: list[Proc]) -> Outcome:
    states = mailbox.request_states(run_dir, str(req["id"]))
    answered = {f"{s.get('host')}-{s.get('pid')}": s for s in states}
    waiting = [
        p
        for p in expected
        if p.key not in answered or answered[p.key].get("state") not in mailbox.FINAL_STATES
    ]
    pending = [s for s in states if s.get("state") not in mailbox.FINAL_STATES]
    out = Outcome(req, states)
    out.waiting = waiting
    for s in pending:
        key = f"{s.get('host')}-{s.get('pid')}"
        if all(p.key != key for p in waiting):
            out.waiting.append(
                Proc(str(s.get("host")), int(s.get("pid") or 0), int(s.get("rank", -1)), str(s.get("role")))
            )
    return out


def wait(
    run_dir: str, req: dict[str, Any], expected: list[Proc], timeout_s: float, poll_s: float = 0.25
) -> Outcome:
    """Wait until every expected process answered (done or failed), ended, or the timeout passed."""
    deadline = time.monotonic() + timeout_s
    last_check = time.monotonic()
    gone: list[Proc] = []
    while True:
        out = outcome(run_dir, req, expected)
        out.gone = gone
        if not out.waiting:
            return out
        if time.monotonic() >= deadline:
            out.timed_out = True
            return out
        time.sleep(poll_s)
        if time.monotonic() - last_check >= 2.0:
            # a process that ended without answering is not waited for
            last_check = time.monotonic()
            try:
                _, live = live_processes(run_dir)
            except HoloprofError:
                continue
            keys = {p.key for p in live}
            for p in out.waiting:
                if p in expected and p.key not in keys:
                    expected.remove(p)
                    gone.append(p)
