"""The errors and the warning of burst-buffer checkpointing; each message says why and what to do."""

from __future__ import annotations

from holoprof.errors import HoloprofError


class CheckpointError(HoloprofError):
    """A checkpoint could not be saved, drained or loaded; the message says why and what to do."""


class DrainError(CheckpointError):
    """Copying a checkpoint from the fast tier to durable storage failed (raised at the next call)."""


class CheckpointNotFoundError(CheckpointError):
    """No verified checkpoint of that name exists."""


class CheckpointCorruptError(CheckpointError):
    """The data of a checkpoint does not match its manifest (size or SHA-256)."""


class CheckpointWarning(UserWarning):
    """Something went wrong but a good copy was used (e.g. a corrupted fast copy was skipped)."""
