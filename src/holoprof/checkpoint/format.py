"""The on-disk format of a checkpoint: names, data files, manifests, checksums and atomic writes.

Every checkpoint is two files per tier: the data file ``NAME.TOKEN.ckpt`` and the manifest
``NAME.manifest.json`` (size and checksums of the data), each written through a temporary name
(``.tmp-...``) and an atomic rename. The manifest is the commit record.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from holoprof.checkpoint.errors import CheckpointError

SCHEMA = "holoprof.checkpoint/1"
MANIFEST_SUFFIX = ".manifest.json"
DATA_SUFFIX = ".ckpt"
TMP_PREFIX = ".tmp-"
MAX_NAME_LENGTH = 200

DATA_RE = re.compile(r"^(?P<name>.+)\.(?P<token>[0-9a-f]{16})\.ckpt$")
COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class CheckpointInfo:
    """What a manifest says about one checkpoint.

    ``crc32`` is computed while the checkpoint is written (cheap enough for the save path) and guards
    the fast copy; ``sha256`` is computed by the drain and is present in durable manifests (and in
    checkpoints written straight to durable storage).
    """

    name: str
    seq: int
    data_file: str
    size_bytes: int
    crc32: str
    sha256: str | None
    serializer: str
    saved_unix_ns: int

    def to_manifest(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_manifest(cls, doc: Any, expected_name: str) -> CheckpointInfo:
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} manifest")
        info = cls(
            name=str(doc["name"]),
            seq=int(doc["seq"]),
            data_file=str(doc["data_file"]),
            size_bytes=int(doc["size_bytes"]),
            crc32=str(doc["crc32"]),
            sha256=None if doc.get("sha256") is None else str(doc["sha256"]),
            serializer=str(doc["serializer"]),
            saved_unix_ns=int(doc["saved_unix_ns"]),
        )
        match = DATA_RE.match(info.data_file)
        if info.name != expected_name or match is None or match.group("name") != expected_name:
            raise ValueError("manifest does not belong to its file name")
        return info


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid checkpoint name, else raise HoloprofError saying why."""
    if not isinstance(name, str) or not name:
        raise CheckpointError(
            f"checkpoint name must be a non-empty string, got {name!r}; use e.g. 'step-000100'"
        )
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if any(s in name for s in seps) or ".." in name:
        raise CheckpointError(
            f"checkpoint name {name!r} contains a path separator or '..'; "
            "use a plain file name such as 'step-000100' (checkpoints always live in the buffer's directories)"
        )
    if name.startswith("."):
        raise CheckpointError(
            f"checkpoint name {name!r} starts with '.'; those names are reserved, drop the dot"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise CheckpointError(
            f"checkpoint name {name!r} contains control characters; use printable characters"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise CheckpointError(
            f"checkpoint name is {len(name)} characters long; use at most {MAX_NAME_LENGTH}"
        )
    return name


def new_data_file(name: str) -> str:
    """A fresh data file name for checkpoint ``name`` (a random token keeps every save apart)."""
    return f"{name}.{secrets.token_hex(8)}{DATA_SUFFIX}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def manifest_path(directory: Path, name: str) -> Path:
    return directory / f"{name}{MANIFEST_SUFFIX}"


def tmp_path(directory: Path, final_name: str) -> Path:
    return directory / f"{TMP_PREFIX}{secrets.token_hex(4)}-{final_name}"


def write_manifest(directory: Path, info: CheckpointInfo, *, durable: bool) -> None:
    final = manifest_path(directory, info.name)
    tmp = tmp_path(directory, final.name)
    payload = (json.dumps(info.to_manifest(), indent=1, sort_keys=True) + "\n").encode()
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)


def read_manifest(path: Path, name: str) -> CheckpointInfo:
    with open(path, "rb") as f:
        doc = json.loads(f.read())
    return CheckpointInfo.from_manifest(doc, name)


def manifest_names(directory: Path, info: CheckpointInfo) -> bool:
    """True if the manifest of ``info.name`` in ``directory`` points at ``info.data_file``."""
    try:
        return read_manifest(manifest_path(directory, info.name), info.name).data_file == info.data_file
    except (OSError, ValueError, KeyError, TypeError):
        return False


def size_matches(directory: Path, info: CheckpointInfo) -> bool:
    try:
        return (directory / info.data_file).stat().st_size == info.size_bytes
    except OSError:
        return False


class Checksum:
    """Size and CRC-32 of a byte stream, plus SHA-256 when asked for."""

    def __init__(self, *, sha256: bool) -> None:
        self.size = 0
        self._crc = 0
        self._sha = hashlib.sha256() if sha256 else None

    def update(self, view: memoryview) -> None:
        self._crc = zlib.crc32(view, self._crc)  # releases the GIL on large buffers
        if self._sha is not None:
            self._sha.update(view)
        self.size += view.nbytes

    @property
    def crc32(self) -> str:
        return f"{self._crc:08x}"

    @property
    def sha256(self) -> str | None:
        return None if self._sha is None else self._sha.hexdigest()

    def mismatch(self, info: CheckpointInfo) -> str | None:
        """Why this stream is not the checkpoint ``info`` describes, or None if it is."""
        if self.size != info.size_bytes:
            return f"{self.size} bytes instead of {info.size_bytes}"
        if self.crc32 != info.crc32:
            return f"CRC-32 {self.crc32} instead of {info.crc32}"
        if self._sha is not None and info.sha256 is not None and self.sha256 != info.sha256:
            return "SHA-256 mismatch"
        return None


def checksum_file(path: Path, *, sha256: bool) -> Checksum:
    ck = Checksum(sha256=sha256)
    buf = bytearray(COPY_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            ck.update(view[:n])
    return ck


def remove_files(directory: Path, info: CheckpointInfo) -> None:
    """Delete the data file of ``info``, and its manifest unless a newer save of the name rewrote it."""
    path = manifest_path(directory, info.name)
    try:
        current = read_manifest(path, info.name)
    except (OSError, ValueError, KeyError, TypeError):
        current = None
    if current is None or current.seq == info.seq:
        unlink(path)
    unlink(directory / info.data_file)
