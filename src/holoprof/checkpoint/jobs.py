"""A save on its way: the job the persist thread writes, and the ``SaveResult`` the caller holds."""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from holoprof.checkpoint.errors import CheckpointError
from holoprof.checkpoint.format import CheckpointInfo
from holoprof.checkpoint.route import Tier
from holoprof.checkpoint.snapshot import Snapshot


@dataclass(frozen=True)
class SaveResult:
    """What ``save()`` did: how long the caller was blocked and which path the checkpoint takes.

    ``tier`` is the path chosen: ``"fast"`` (serialized to the fast tier, then drained to durable
    storage) or ``"durable"`` (serialized straight to durable storage); ``reason`` says why.
    ``blocking_s`` is the time ``save()`` took (the snapshot), ``backpressure_s`` the part of it spent
    waiting for snapshot memory, ``snapshot_bytes`` what was copied. ``copied`` is False when
    ``copy=False`` let host tensors be used as they are. ``synchronous`` is True when the checkpoint
    was written before ``save()`` returned (its snapshot would not fit the memory budget).
    ``wait()`` / ``info`` block until the checkpoint is written to its tier.
    """

    name: str
    seq: int
    tier: Tier
    reason: str
    blocking_s: float
    backpressure_s: float
    snapshot_bytes: int
    copied: bool
    synchronous: bool
    _outcome: Future[tuple[CheckpointInfo, Tier]] = field(repr=False, compare=False)

    def wait(self, timeout: float | None = None) -> CheckpointInfo:
        """The checkpoint's record once written (fast tier, or durable on the direct path).

        Raises the ``CheckpointError`` that made it fail (also raised by the buffer's next call).
        """
        try:
            return self._outcome.result(timeout)[0]
        except FutureTimeout:
            raise CheckpointError(
                f"checkpoint {self.name!r} is not written yet after {timeout} s; wait longer"
            ) from None

    @property
    def info(self) -> CheckpointInfo:
        return self.wait()

    @property
    def written_tier(self) -> Tier:
        """Where the checkpoint was written: ``tier``, or ``"durable"`` when the fast tier was full or failed."""
        self.wait()
        return self._outcome.result()[1]


@dataclass
class Job:
    """A snapshot waiting to be written by the persist thread."""

    name: str
    seq: int
    snapshot: Snapshot
    tier: Tier
    outcome: Future[tuple[CheckpointInfo, Tier]]
