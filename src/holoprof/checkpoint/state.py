"""The buffer's bookkeeping: what each tier holds, what is on its way, and the errors to raise."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from holoprof.checkpoint.errors import CheckpointError, DrainError
from holoprof.checkpoint.format import CheckpointInfo
from holoprof.checkpoint.jobs import Job


@dataclass
class FastEntry:
    info: CheckpointInfo
    state: Literal["pending", "durable", "failed"]


class Ledger:
    """The directories of both tiers and what they hold, shared by the buffer and its threads.

    Every field from ``fast`` on is read and changed with ``cond`` held (functions named
    ``*_locked``, and those whose docstring says so, expect the caller to hold it), except by the
    recovery at opening, before the threads start. ``durable_lock`` keeps publishing a durable
    checkpoint and removing one apart.
    """

    def __init__(self, fast_dir: Path, durable_dir: Path, keep_last: int | None) -> None:
        self.fast_dir = fast_dir
        self.durable_dir = durable_dir
        self.keep_last = keep_last
        self.fast_capacity_bytes = 0  # set once the recovery knows what the fast tier holds
        self.cond = threading.Condition()
        self.durable_lock = threading.Lock()
        self.fast: dict[str, FastEntry] = {}
        self.fast_bytes: dict[str, int] = {}
        self.durable: dict[str, CheckpointInfo] = {}
        self.latest_seq: dict[str, int] = {}
        self.jobs: deque[Job] = deque()
        self.queue: deque[CheckpointInfo] = deque()
        self.inflight: CheckpointInfo | None = None
        self.failed: list[CheckpointInfo] = []
        self.errors: list[BaseException] = []
        self.reserved = 0
        self.next_seq = 1
        self.stopping = False
        self.closed = False

    def check_usable(self, *, allow_stopping: bool = False) -> None:
        """Raise if the buffer is closed (or closing, unless ``allow_stopping``). Caller holds ``cond``."""
        if self.closed or (self.stopping and not allow_stopping):
            raise CheckpointError("this BurstBuffer is closed; create a new one to save or load checkpoints")

    def raise_errors(self) -> None:
        """Raise (once) the drain errors recorded since the last call. Caller holds ``cond``."""
        if not self.errors:
            return
        errors, self.errors = self.errors, []
        first = errors[0]
        more = f" ({len(errors) - 1} more drain error(s) after it)" if len(errors) > 1 else ""
        if isinstance(first, CheckpointError):
            raise type(first)(f"{first}{more}") from first.__cause__
        raise DrainError(f"{first}{more}") from first

    def requeue_failed(self) -> None:
        """Give checkpoints whose drain failed another try (their error was raised already).

        Caller holds ``cond``.
        """
        if not self.failed:
            return
        for info in self.failed:
            entry = self.fast.get(info.name)
            if entry is not None and entry.info.seq == info.seq:
                entry.state = "pending"
                self.queue.append(info)
        self.failed.clear()
        self.queue = deque(sorted(self.queue, key=lambda i: i.seq))
        self.cond.notify_all()

    def pending_upto(self, target: int) -> bool:
        """True while a checkpoint of seq ``target`` or older is not durable. Caller holds ``cond``."""
        if self.inflight is not None and self.inflight.seq <= target:
            return True
        return any(j.seq <= target for j in self.jobs) or any(i.seq <= target for i in self.queue)

    def pending_count(self) -> int:
        """Checkpoints saved but not yet durable."""
        with self.cond:
            return len(self.jobs) + len(self.queue) + (self.inflight is not None) + len(self.failed)

    def undrained_names(self) -> list[str]:
        """Names of checkpoints saved but not durable yet (snapshots, queued or failed drains)."""
        with self.cond:
            names = [j.name for j in self.jobs]
            names += [
                e.info.name
                for e in sorted(self.fast.values(), key=lambda e: e.info.seq)
                if e.state != "durable"
            ]
        return list(dict.fromkeys(names))

    def fast_used_locked(self) -> int:
        return sum(self.fast_bytes.values())
