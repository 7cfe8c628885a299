"""Reading checkpoints back: list the durable ones, verify a copy against its manifest, load it."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from holoprof.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWarning,
)
from holoprof.checkpoint.format import (
    MANIFEST_SUFFIX,
    TMP_PREFIX,
    CheckpointInfo,
    checksum_file,
    manifest_path,
    read_manifest,
    size_matches,
)
from holoprof.checkpoint.retention import drop_fast_locked
from holoprof.checkpoint.route import Tier
from holoprof.checkpoint.serializers import Serializer, SerializerName, serializer_named
from holoprof.checkpoint.state import Ledger

log = logging.getLogger("holoprof.checkpoint")


def list_durable(ledger: Ledger, *, verify: bool = False) -> list[CheckpointInfo]:
    """Checkpoints visible in durable storage (manifest present, data size matches), oldest first.

    ``verify=True`` also checks each SHA-256 (reads every byte).
    """
    with ledger.cond:
        ledger.check_usable(allow_stopping=True)
    found: list[CheckpointInfo] = []
    try:
        paths = list(ledger.durable_dir.iterdir())
    except OSError as exc:
        raise CheckpointError(
            f"cannot list durable checkpoints in {str(ledger.durable_dir)!r}: {exc.strerror or exc}; "
            "check that the durable directory exists and is readable (was it removed or unmounted?)"
        ) from None
    for path in paths:
        fname = path.name
        if fname.startswith(TMP_PREFIX) or not fname.endswith(MANIFEST_SUFFIX):
            continue
        name = fname[: -len(MANIFEST_SUFFIX)]
        try:
            info = read_manifest(path, name)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not size_matches(ledger.durable_dir, info):
            continue
        if verify:
            try:
                ck = checksum_file(ledger.durable_dir / info.data_file, sha256=True)
            except OSError:
                continue
            if ck.mismatch(info) is not None:
                continue
        found.append(info)
    return sorted(found, key=lambda i: i.seq)


class Loader:
    """Loads a checkpoint from the fast tier when a verified copy is there, else from durable storage."""

    def __init__(self, ledger: Ledger, serializer_choice: SerializerName | Serializer) -> None:
        self._ledger = ledger
        self._serializer_choice = serializer_choice

    def load(self, name: str, options: dict[str, Any]) -> tuple[Any, Tier]:
        """``(object, tier)`` of checkpoint ``name``; ``options`` go to the serializer's load."""
        ledger = self._ledger
        with ledger.cond:
            ledger.check_usable(allow_stopping=True)
            while any(j.name == name for j in ledger.jobs):  # a snapshot of it is being written
                ledger.cond.wait()
            ledger.raise_errors()
        for _ in range(3):
            with ledger.cond:
                entry = ledger.fast.get(name)
                info = entry.info if entry is not None else None
            if info is None:
                break
            try:
                obj = self._load_verified(ledger.fast_dir, info, options)
            except FileNotFoundError:
                continue  # evicted or replaced while we read it: look again
            except CheckpointCorruptError as exc:
                self._handle_corrupt_fast(info, exc)
                break
            log.info("loaded checkpoint %r from the fast tier (%s)", name, ledger.fast_dir)
            return obj, "fast"
        info = self._read_durable_manifest(name)
        obj = self._load_verified(ledger.durable_dir, info, options)
        log.info("loaded checkpoint %r from durable storage (%s)", name, ledger.durable_dir)
        return obj, "durable"

    def _read_durable_manifest(self, name: str) -> CheckpointInfo:
        ledger = self._ledger
        path = manifest_path(ledger.durable_dir, name)
        try:
            info = read_manifest(path, name)
        except FileNotFoundError:
            known = [i.name for i in list_durable(ledger)]
            hint = f"available: {', '.join(known[-5:])}" if known else "no checkpoints are stored there yet"
            with ledger.cond:
                pending = name in ledger.fast
            if pending:
                hint = "its fast copy is unusable and it never reached durable storage"
            raise CheckpointNotFoundError(
                f"no checkpoint named {name!r} in {str(ledger.durable_dir)!r} ({hint}); check the name"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointCorruptError(
                f"the manifest of checkpoint {name!r} in {str(ledger.durable_dir)!r} is unreadable ({exc}); "
                "load an older checkpoint"
            ) from None
        return info

    def _load_verified(self, directory: Path, info: CheckpointInfo, options: dict[str, Any]) -> Any:
        path = directory / info.data_file
        strong = directory == self._ledger.durable_dir and info.sha256 is not None
        try:
            bad = checksum_file(path, sha256=strong).mismatch(info)
        except FileNotFoundError:
            if directory == self._ledger.fast_dir:
                raise
            raise CheckpointCorruptError(
                f"the data file of checkpoint {info.name!r} ({path}) is missing; load an older checkpoint"
            ) from None
        except OSError as exc:
            raise CheckpointError(
                f"cannot read checkpoint {info.name!r} ({path}): {exc.strerror or exc}; "
                "check that the directory is readable"
            ) from None
        if bad is not None:
            raise CheckpointCorruptError(
                f"checkpoint {info.name!r} in {str(directory)!r} does not match its manifest ({bad}); "
                "load an older checkpoint"
            )
        serializer = serializer_named(self._serializer_choice, info.serializer)
        try:
            with open(path, "rb") as f:
                return serializer.load(f, **options)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(
                f"cannot load checkpoint {info.name!r} from {str(path)!r} with {serializer.name}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _handle_corrupt_fast(self, info: CheckpointInfo, exc: CheckpointCorruptError) -> None:
        with self._ledger.cond:
            durable = self._ledger.durable.get(info.name)
            same = durable is not None and durable.seq == info.seq and durable.crc32 == info.crc32
            if same:
                drop_fast_locked(self._ledger, info)
        if not same:
            raise CheckpointCorruptError(
                f"the fast copy of checkpoint {info.name!r} is corrupted and it is not durable yet: {exc}"
            ) from None
        warnings.warn(
            f"the fast copy of checkpoint {info.name!r} is corrupted ({exc}); "
            "loading it from durable storage instead",
            CheckpointWarning,
            stacklevel=5,  # the caller of BurstBuffer.load (load, load_with_source, Loader.load, here)
        )
