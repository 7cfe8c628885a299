"""Burst-buffer checkpointing: save to a fast tier, drain to durable storage in the background.

>>> from holoprof.checkpoint import BurstBuffer
>>> with BurstBuffer("/dev/shm/ckpt", "/data/ckpt", keep_last=3) as bb:   # doctest: +SKIP
...     bb.save(model.state_dict(), f"step-{step:07d}")
"""

from holoprof.checkpoint.burst import (
    BurstBuffer,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointInfo,
    CheckpointNotFoundError,
    CheckpointWarning,
    DrainError,
    PickleSerializer,
    SaveResult,
    Serializer,
    TorchSerializer,
)

__all__ = [
    "BurstBuffer",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "CheckpointWarning",
    "DrainError",
    "PickleSerializer",
    "SaveResult",
    "Serializer",
    "TorchSerializer",
]
