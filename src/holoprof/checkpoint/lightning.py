"""Lightning checkpoints through a BurstBuffer: ``Trainer(plugins=[BurstBufferCheckpointIO(bb)])``.

Lightning hands every checkpoint (``ModelCheckpoint``, ``trainer.save_checkpoint``) to the plugin,
which snapshots it and returns; the write and the drain to durable storage run in the background.
The checkpoint's name is the file name Lightning chose (``epoch=3-step=400.ckpt``); its directory is
not used: the checkpoints live in the BurstBuffer's directories, so give one BurstBuffer per run.
Resume with ``trainer.fit(model, ckpt_path=".../epoch=3-step=400.ckpt")`` (any directory part).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from holoprof.checkpoint.burst import BurstBuffer
from holoprof.errors import MissingExtraError

try:
    from lightning.pytorch.plugins.io import CheckpointIO
except ImportError:  # pragma: no cover - only without the frameworks extra
    raise MissingExtraError("holoprof.checkpoint.lightning", "frameworks", "lightning") from None


class BurstBufferCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that saves through ``buffer`` (snapshot, then persist).

    ``teardown`` (the end of ``fit``) waits until every checkpoint is durable and raises a
    ``CheckpointError`` if one could not be; the BurstBuffer stays open (close it yourself).
    """

    def __init__(self, buffer: BurstBuffer) -> None:
        self.buffer = buffer

    @staticmethod
    def _name(path: str | os.PathLike[str]) -> str:
        return Path(path).name

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike[str], storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}"
            )
        self.buffer.save(checkpoint, self._name(path))

    def load_checkpoint(
        self, path: str | os.PathLike[str], map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        options: dict[str, Any] = {"map_location": map_location}
        if weights_only is not None:
            options["weights_only"] = weights_only
        loaded: dict[str, Any] = self.buffer.load(self._name(path), **options)
        return loaded

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        self.buffer.remove(self._name(path))

    def teardown(self) -> None:
        self.buffer.wait()
