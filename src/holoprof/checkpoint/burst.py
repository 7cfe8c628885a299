"""Burst-buffer checkpointing: save to a fast tier, drain to durable storage in the background.

``save()`` serializes the checkpoint into the fast directory (tmpfs, local NVMe) and returns; a
background thread copies it to the durable directory. Every checkpoint is two files per tier: the
data file and a JSON manifest (size and checksums of the data: CRC-32, plus SHA-256 once durable),
written in this order, each through a temporary name, fsync and an atomic rename. The manifest is the commit record: a checkpoint exists
only if its manifest exists and the data file matches it, so a crash at any moment leaves either the
old state or the new one, never a partial checkpoint that looks complete. Opening a BurstBuffer over
the same directories removes temporary files and orphaned data, and resumes the drains that a crash
interrupted when the fast copy still verifies.

See docs/checkpoint.md for the guarantees, the on-disk layout and recipes.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import pickle
import re
import secrets
import shutil
import sys
import threading
import time
import warnings
import weakref
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, NoReturn, Protocol, cast, runtime_checkable

from holoprof.errors import HoloprofError, MissingExtraError

log = logging.getLogger("holoprof.checkpoint")

SCHEMA = "holoprof.checkpoint/1"
MANIFEST_SUFFIX = ".manifest.json"
DATA_SUFFIX = ".ckpt"
TMP_PREFIX = ".tmp-"
LOCK_NAME = ".holoprof-burst.lock"
MAX_NAME_LENGTH = 200

_DATA_RE = re.compile(r"^(?P<name>.+)\.(?P<token>[0-9a-f]{16})\.ckpt$")
_COPY_CHUNK = 8 << 20
_PARALLEL_HASH_MIN = 1 << 20
_DEFAULT_FAST_SHARE = 0.5

Tier = Literal["fast", "durable"]
SerializerName = Literal["auto", "torch", "pickle"]


# --------------------------------------------------------------------------------------------------
# errors and warnings


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


# --------------------------------------------------------------------------------------------------
# serializers


@runtime_checkable
class Serializer(Protocol):
    """Turns an object into bytes on a writable file and back. ``name`` is stored in the manifest."""

    name: str

    def dump(self, obj: Any, f: IO[bytes]) -> None: ...

    def load(self, f: IO[bytes], **options: Any) -> Any: ...


class PickleSerializer:
    """``pickle`` with the highest protocol: any picklable object."""

    name = "pickle"

    def dump(self, obj: Any, f: IO[bytes]) -> None:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)

    def load(self, f: IO[bytes], **options: Any) -> Any:
        if options:
            raise CheckpointError(
                f"the pickle serializer takes no load options, got {sorted(options)}; "
                "drop them (map_location and weights_only apply to torch checkpoints only)"
            )
        return pickle.load(f)


class TorchSerializer:
    """``torch.save`` / ``torch.load``. Load options (``map_location``, ``weights_only``) pass through.

    ``weights_only`` defaults to False because these files were written and checksummed by this
    class (state dicts often carry NumPy RNG state, which ``weights_only=True`` refuses); pass
    ``weights_only=True`` to load files of unknown origin safely.
    """

    name = "torch"

    def dump(self, obj: Any, f: IO[bytes]) -> None:
        _torch().save(obj, f)

    def load(self, f: IO[bytes], **options: Any) -> Any:
        options.setdefault("weights_only", False)
        return _torch().load(f, **options)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise MissingExtraError("the torch checkpoint serializer", "torch") from None
    return torch


def _builtin_serializer(name: str) -> Serializer | None:
    if name == "pickle":
        return PickleSerializer()
    if name == "torch":
        return TorchSerializer()
    return None


def _inspect_object(obj: Any) -> tuple[bool, int]:
    """(contains a torch tensor, estimated serialized size in bytes) from a bounded walk of containers."""
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None)
    has_tensor = False
    total = 0
    seen_storages: set[tuple[int, int]] = set()
    stack: list[tuple[Any, int]] = [(obj, 0)]
    visited = 0
    while stack and visited < 200_000:
        x, depth = stack.pop()
        visited += 1
        if tensor_type is not None and isinstance(x, tensor_type):
            has_tensor = True
            try:
                storage = x.untyped_storage()
                key = (int(storage.data_ptr()), int(storage.nbytes()))
                if key not in seen_storages:
                    seen_storages.add(key)
                    total += key[1]
            except Exception:
                with contextlib.suppress(Exception):
                    total += int(x.element_size() * x.nelement())
        elif isinstance(x, (bytes, bytearray, str)):
            total += len(x)
        elif isinstance(x, memoryview):
            total += x.nbytes
        elif isinstance(x, dict):
            if depth < 10:
                stack.extend((v, depth + 1) for v in x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            if depth < 10:
                stack.extend((v, depth + 1) for v in x)
        else:
            try:
                nbytes = getattr(x, "nbytes", None)  # NumPy arrays and the like
            except Exception:
                nbytes = None
            if isinstance(nbytes, int) and not isinstance(nbytes, bool):
                total += nbytes
    return has_tensor, total


# --------------------------------------------------------------------------------------------------
# records


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
        match = _DATA_RE.match(info.data_file)
        if info.name != expected_name or match is None or match.group("name") != expected_name:
            raise ValueError("manifest does not belong to its file name")
        return info


@dataclass(frozen=True)
class SaveResult:
    """What ``save()`` did: where the checkpoint is now and how long the caller was blocked.

    ``tier`` is ``"fast"`` when the checkpoint is on the fast tier and draining in the background,
    ``"durable"`` when it was written straight to durable storage (larger than the fast tier, or the
    fast tier failed); ``backpressure_s`` is the part of ``blocking_s`` spent waiting for space.
    """

    info: CheckpointInfo
    tier: Tier
    blocking_s: float
    backpressure_s: float


@dataclass
class _FastEntry:
    info: CheckpointInfo
    state: Literal["pending", "durable", "failed"]


class _TooLarge(Exception):
    pass


class _Aborted(Exception):
    pass


# --------------------------------------------------------------------------------------------------
# file helpers


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _manifest_path(directory: Path, name: str) -> Path:
    return directory / f"{name}{MANIFEST_SUFFIX}"


def _tmp_path(directory: Path, final_name: str) -> Path:
    return directory / f"{TMP_PREFIX}{secrets.token_hex(4)}-{final_name}"


def _write_manifest(directory: Path, info: CheckpointInfo, *, durable: bool) -> None:
    final = _manifest_path(directory, info.name)
    tmp = _tmp_path(directory, final.name)
    payload = (json.dumps(info.to_manifest(), indent=1, sort_keys=True) + "\n").encode()
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        _unlink(tmp)
        raise
    if durable:
        _fsync_dir(directory)


def _read_manifest(path: Path, name: str) -> CheckpointInfo:
    with open(path, "rb") as f:
        doc = json.loads(f.read())
    return CheckpointInfo.from_manifest(doc, name)


class _Checksum:
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


def _manifest_names(directory: Path, info: CheckpointInfo) -> bool:
    """True if the manifest of ``info.name`` in ``directory`` points at ``info.data_file``."""
    try:
        return _read_manifest(_manifest_path(directory, info.name), info.name).data_file == info.data_file
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _checksum_file(path: Path, *, sha256: bool) -> _Checksum:
    ck = _Checksum(sha256=sha256)
    buf = bytearray(_COPY_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            ck.update(view[:n])
    return ck


def _size_matches(directory: Path, info: CheckpointInfo) -> bool:
    try:
        return (directory / info.data_file).stat().st_size == info.size_bytes
    except OSError:
        return False


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid checkpoint name, else raise HoloprofError saying why."""
    if not isinstance(name, str) or not name:
        raise HoloprofError(
            f"checkpoint name must be a non-empty string, got {name!r}; use e.g. 'step-000100'"
        )
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if any(s in name for s in seps) or ".." in name:
        raise HoloprofError(
            f"checkpoint name {name!r} contains a path separator or '..'; "
            "use a plain file name such as 'step-000100' (checkpoints always live in the buffer's directories)"
        )
    if name.startswith("."):
        raise HoloprofError(
            f"checkpoint name {name!r} starts with '.'; those names are reserved, drop the dot"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise HoloprofError(f"checkpoint name {name!r} contains control characters; use printable characters")
    if len(name) > MAX_NAME_LENGTH:
        raise HoloprofError(f"checkpoint name is {len(name)} characters long; use at most {MAX_NAME_LENGTH}")
    return name


class _ChecksumSink:
    """File-like object for serializers: checksums and counts what it writes.

    ``reserve(n, written)`` is called before each write (capacity accounting, may block or raise).
    Large chunks are checksummed on ``pool`` while this thread writes them, so the two overlap.
    """

    def __init__(
        self,
        f: IO[bytes],
        reserve: Callable[[int, int], None] | None,
        pool: ThreadPoolExecutor | None,
        *,
        sha256: bool,
    ) -> None:
        self._f = f
        self._reserve = reserve
        self._pool = pool
        self.checksum = _Checksum(sha256=sha256)
        self.size = 0
        self.failure: BaseException | None = None

    def write(self, data: Any) -> int:
        if self.failure is not None:
            raise _Aborted()
        try:
            view = memoryview(data)
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
            n = view.nbytes
            if n == 0:
                return 0
            if self._reserve is not None:
                self._reserve(n, self.size)
            if self._pool is not None and n >= _PARALLEL_HASH_MIN:
                future = self._pool.submit(self.checksum.update, view)
                try:
                    self._f.write(view)
                finally:
                    future.result()
            else:
                self.checksum.update(view)
                self._f.write(view)
            self.size += n
            return n
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
            raise

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


def _close_at_exit(ref: weakref.ReferenceType[BurstBuffer]) -> None:
    buffer = ref()
    if buffer is None:
        return
    try:
        buffer.close()
    except Exception as exc:
        log.error("burst buffer: checkpoints not drained at exit: %s", exc)


# --------------------------------------------------------------------------------------------------
# the burst buffer


class BurstBuffer:
    """Checkpoint to a fast tier; a background thread drains each checkpoint to durable storage.

    Parameters:
        fast_dir: directory on a fast tier (``/dev/shm``, local NVMe); created if missing.
        durable_dir: directory on durable storage (parallel file system, disk); created if missing.
        fast_capacity_bytes: most bytes of checkpoints kept on the fast tier. ``save()`` blocks
            (backpressure) until drained copies can be evicted; a checkpoint larger than this goes
            straight to durable storage. Default: half of the fast tier's free space at start.
        keep_last: keep only the newest ``keep_last`` checkpoints (by save order, over all names) on
            both tiers; ``None`` keeps everything.
        serializer: ``"auto"`` (torch.save for objects holding tensors, pickle otherwise),
            ``"torch"``, ``"pickle"``, or an object with ``name``, ``dump(obj, f)`` and
            ``load(f, **options)``.
        fsync_fast: also fsync fast-tier files. Off by default: fast copies are verified against
            their CRC-32 before they are drained or loaded, so a torn fast copy is never trusted.

    One BurstBuffer at a time may use a directory (a lock file enforces it). Thread-safe.
    """

    def __init__(
        self,
        fast_dir: str | os.PathLike[str],
        durable_dir: str | os.PathLike[str],
        *,
        fast_capacity_bytes: int | None = None,
        keep_last: int | None = None,
        serializer: SerializerName | Serializer = "auto",
        fsync_fast: bool = False,
    ) -> None:
        self.fast_dir = Path(fast_dir)
        self.durable_dir = Path(durable_dir)
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise HoloprofError(f"keep_last must be a positive integer or None, got {keep_last!r}")
        if fast_capacity_bytes is not None and (
            not isinstance(fast_capacity_bytes, int) or fast_capacity_bytes <= 0
        ):
            raise HoloprofError(
                f"fast_capacity_bytes must be a positive integer (bytes), got {fast_capacity_bytes!r}"
            )
        self.keep_last = keep_last
        self._serializer_choice = self._check_serializer(serializer)
        self._fsync_fast = fsync_fast

        self._cond = threading.Condition()
        self._save_lock = threading.Lock()
        self._durable_lock = threading.Lock()
        self._fast: dict[str, _FastEntry] = {}
        self._fast_bytes: dict[str, int] = {}
        self._durable: dict[str, CheckpointInfo] = {}
        self._latest_seq: dict[str, int] = {}
        self._queue: deque[CheckpointInfo] = deque()
        self._inflight: CheckpointInfo | None = None
        self._failed: list[CheckpointInfo] = []
        self._errors: list[BaseException] = []
        self._reserved = 0
        self._next_seq = 1
        self._stopping = False
        self._closed = False
        self._lock_fds: list[int] = []
        self.last_load_source: Tier | None = None

        for label, directory in (("fast_dir", self.fast_dir), ("durable_dir", self.durable_dir)):
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise HoloprofError(
                    f"cannot create {label} {str(directory)!r}: {exc.strerror or exc}; "
                    "pass a directory you can write to"
                ) from None
        if os.path.samefile(self.fast_dir, self.durable_dir):
            raise HoloprofError(
                f"fast_dir and durable_dir are the same directory ({str(self.fast_dir)!r}); "
                "pass two different directories, e.g. fast_dir='/dev/shm/ckpt'"
            )
        try:
            self._lock_fds.append(self._lock_dir(self.durable_dir))
            self._lock_fds.append(self._lock_dir(self.fast_dir))
            self._recover()
        except BaseException:
            self._release_locks()
            raise
        if fast_capacity_bytes is None:
            free = shutil.disk_usage(self.fast_dir).free
            fast_capacity_bytes = max(1, int(free * _DEFAULT_FAST_SHARE) + self._fast_used_locked())
        self.fast_capacity_bytes = fast_capacity_bytes

        self._hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="holoprof-ckpt-hash")
        self._worker = threading.Thread(target=self._drain_loop, name="holoprof-ckpt-drain", daemon=True)
        self._worker.start()
        self._atexit_hook = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit_hook)

    # ---------------------------------------------------------------------------------------- public

    def save(self, obj: Any, name: str) -> SaveResult:
        """Write ``obj`` as checkpoint ``name`` to the fast tier and return; it drains in the background.

        Blocks only for the fast-tier write (and for space, when the fast tier is full of copies not
        yet drained). Raises a pending DrainError from an earlier drain first; that call saves nothing.
        """
        check_name(name)
        with self._save_lock:
            t0 = time.perf_counter()
            with self._cond:
                self._check_usable()
                self._raise_errors()
                self._requeue_failed()
                seq = self._next_seq
                self._next_seq += 1
            has_tensor, estimate = _inspect_object(obj)
            serializer = self._serializer_for(has_tensor)
            data_file = f"{name}.{secrets.token_hex(8)}{DATA_SUFFIX}"
            waited = 0.0
            if estimate > self.fast_capacity_bytes:
                reason = (
                    f"its estimated size ({estimate} bytes) exceeds the fast tier's capacity "
                    f"({self.fast_capacity_bytes} bytes)"
                )
            else:
                try:
                    info, waited = self._write_fast(obj, name, seq, serializer, data_file)
                    return SaveResult(info, "fast", time.perf_counter() - t0, waited)
                except _TooLarge:
                    reason = f"it is larger than the fast tier's capacity ({self.fast_capacity_bytes} bytes)"
                except OSError as exc:
                    reason = f"writing it to the fast tier failed ({exc})"
            log.warning(
                "checkpoint %r goes straight to durable storage because %s; save() blocks until it is durable",
                name,
                reason,
            )
            info = self._write_durable_direct(obj, name, seq, serializer, data_file)
            return SaveResult(info, "durable", time.perf_counter() - t0, waited)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every checkpoint saved so far is durable; raise the first drain error.

        Returns False if ``timeout`` (seconds) passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._check_usable(allow_stopping=True)
            self._raise_errors()
            self._requeue_failed()
            target = self._next_seq - 1
            while not self._errors and self._pending_upto(target):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._raise_errors()
        return True

    def load(self, name: str, **options: Any) -> Any:
        """Load checkpoint ``name``: from the fast tier when a verified copy is there, else durable.

        ``options`` go to the serializer's load (``map_location=...``, ``weights_only=...`` for torch).
        The tier used is logged and kept in ``last_load_source``; see also ``load_with_source``.
        """
        return self.load_with_source(name, **options)[0]

    def load_with_source(self, name: str, **options: Any) -> tuple[Any, Tier]:
        """Like ``load`` but returns ``(object, "fast" | "durable")``."""
        check_name(name)
        with self._cond:
            self._check_usable(allow_stopping=True)
            self._raise_errors()
        for _ in range(3):
            with self._cond:
                entry = self._fast.get(name)
                info = entry.info if entry is not None else None
            if info is None:
                break
            try:
                obj = self._load_verified(self.fast_dir, info, options)
            except FileNotFoundError:
                continue  # evicted or replaced while we read it: look again
            except CheckpointCorruptError as exc:
                self._handle_corrupt_fast(info, exc)
                break
            self.last_load_source = "fast"
            log.info("loaded checkpoint %r from the fast tier (%s)", name, self.fast_dir)
            return obj, "fast"
        info = self._read_durable_manifest(name)
        obj = self._load_verified(self.durable_dir, info, options)
        self.last_load_source = "durable"
        log.info("loaded checkpoint %r from durable storage (%s)", name, self.durable_dir)
        return obj, "durable"

    def list(self, *, verify: bool = False) -> list[CheckpointInfo]:
        """Checkpoints visible in durable storage (manifest present, data size matches), oldest first.

        ``verify=True`` also checks each SHA-256 (reads every byte).
        """
        with self._cond:
            self._check_usable(allow_stopping=True)
        found: list[CheckpointInfo] = []
        for path in self.durable_dir.iterdir():
            fname = path.name
            if fname.startswith(TMP_PREFIX) or not fname.endswith(MANIFEST_SUFFIX):
                continue
            name = fname[: -len(MANIFEST_SUFFIX)]
            try:
                info = _read_manifest(path, name)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if not _size_matches(self.durable_dir, info):
                continue
            if verify:
                try:
                    ck = _checksum_file(self.durable_dir / info.data_file, sha256=True)
                except OSError:
                    continue
                if ck.mismatch(info) is not None:
                    continue
            found.append(info)
        return sorted(found, key=lambda i: i.seq)

    @property
    def fast_used_bytes(self) -> int:
        """Bytes of checkpoint data on the fast tier now (including a save in progress)."""
        with self._cond:
            return self._fast_used_locked() + self._reserved

    @property
    def pending(self) -> int:
        """Checkpoints saved but not yet durable."""
        with self._cond:
            return len(self._queue) + (self._inflight is not None) + len(self._failed)

    def close(self) -> None:
        """Wait for all drains, stop the worker and release the directories. Raises a pending DrainError.

        Checkpoints that could not be drained stay on the fast tier and are drained the next time a
        BurstBuffer opens these directories.
        """
        with self._cond:
            if self._closed:
                return
            self._stopping = True
            self._cond.notify_all()
        try:
            self.wait()
        finally:
            with self._cond:
                self._queue.clear()
                self._closed = True
                self._cond.notify_all()
            self._worker.join()
            self._hash_pool.shutdown(wait=True)
            self._release_locks()
            atexit.unregister(self._atexit_hook)

    def __enter__(self) -> BurstBuffer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except CheckpointError as drain_exc:
            log.error(
                "burst buffer: %s (while handling %s)", drain_exc, exc_type.__name__ if exc_type else ""
            )

    # ----------------------------------------------------------------------------------- internals

    @staticmethod
    def _check_serializer(serializer: SerializerName | Serializer) -> SerializerName | Serializer:
        if isinstance(serializer, str):
            if serializer not in ("auto", "torch", "pickle"):
                raise HoloprofError(
                    f"unknown serializer {serializer!r}; use 'auto', 'torch', 'pickle' or an object "
                    "with name, dump(obj, f) and load(f)"
                )
            if serializer == "torch":
                _torch()
            return serializer
        if not isinstance(serializer, Serializer) or not isinstance(getattr(serializer, "name", None), str):
            raise HoloprofError(
                "serializer must be 'auto', 'torch', 'pickle' or an object with a str 'name', "
                "dump(obj, f) and load(f, **options)"
            )
        return serializer

    def _serializer_for(self, has_tensor: bool) -> Serializer:
        choice = self._serializer_choice
        if isinstance(choice, str):
            if choice == "auto":
                choice = "torch" if has_tensor else "pickle"
            found = _builtin_serializer(choice)
            assert found is not None
            return found
        return choice

    def _serializer_named(self, name: str) -> Serializer:
        choice = self._serializer_choice
        if not isinstance(choice, str) and choice.name == name:
            return choice
        found = _builtin_serializer(name)
        if found is None:
            raise CheckpointError(
                f"checkpoint was written with serializer {name!r}; "
                "open the BurstBuffer with that serializer to load it"
            )
        return found

    def _check_usable(self, *, allow_stopping: bool = False) -> None:
        if self._closed or (self._stopping and not allow_stopping):
            raise HoloprofError("this BurstBuffer is closed; create a new one to save or load checkpoints")

    def _raise_errors(self) -> None:
        """Raise (once) the drain errors recorded since the last call. Caller holds ``_cond``."""
        if not self._errors:
            return
        errors, self._errors = self._errors, []
        first = errors[0]
        more = f" ({len(errors) - 1} more drain error(s) after it)" if len(errors) > 1 else ""
        if isinstance(first, CheckpointError):
            raise type(first)(f"{first}{more}") from first.__cause__
        raise DrainError(f"{first}{more}") from first

    def _requeue_failed(self) -> None:
        """Give checkpoints whose drain failed another try (their error was raised already)."""
        if not self._failed:
            return
        for info in self._failed:
            entry = self._fast.get(info.name)
            if entry is not None and entry.info.seq == info.seq:
                entry.state = "pending"
                self._queue.append(info)
        self._failed.clear()
        self._queue = deque(sorted(self._queue, key=lambda i: i.seq))
        self._cond.notify_all()

    def _pending_upto(self, target: int) -> bool:
        if self._inflight is not None and self._inflight.seq <= target:
            return True
        return any(i.seq <= target for i in self._queue)

    def _fast_used_locked(self) -> int:
        return sum(self._fast_bytes.values())

    # locking the directories -----------------------------------------------------------------------

    @staticmethod
    def _lock_dir(directory: Path) -> int:
        path = directory / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = f" (pid {int(os.pread(fd, 32, 0).decode().strip())})"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise HoloprofError(
                    f"another BurstBuffer{holder} is using {str(directory)!r}; "
                    "close it first or use a different directory"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _release_locks(self) -> None:
        for fd in self._lock_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._lock_fds.clear()

    # recovery --------------------------------------------------------------------------------------

    def _scan(self, directory: Path) -> tuple[dict[str, CheckpointInfo], set[str]]:
        """Remove temporary files; return (valid manifests by name, data file names present)."""
        manifests: dict[str, CheckpointInfo] = {}
        data_files: set[str] = set()
        for path in directory.iterdir():
            fname = path.name
            if fname.startswith(TMP_PREFIX):
                log.info("removing temporary file %s left by an interrupted checkpoint", path)
                _unlink(path)
            elif fname.endswith(MANIFEST_SUFFIX):
                name = fname[: -len(MANIFEST_SUFFIX)]
                try:
                    info = _read_manifest(path, name)
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring unreadable checkpoint manifest %s: %s", path, exc)
                    continue
                manifests[name] = info
            elif _DATA_RE.match(fname):
                data_files.add(fname)
        return manifests, data_files

    def _recover(self) -> None:
        durable, durable_data = self._scan(self.durable_dir)
        for name, info in durable.items():
            if info.data_file in durable_data and _size_matches(self.durable_dir, info):
                self._durable[name] = info
            else:
                log.warning(
                    "durable checkpoint %r is damaged (data file %s missing or of the wrong size); ignoring it",
                    name,
                    info.data_file,
                )
        referenced = {i.data_file for i in durable.values()}
        for orphan in sorted(durable_data - referenced):
            log.info("removing orphaned data file %s (a checkpoint that never completed)", orphan)
            _unlink(self.durable_dir / orphan)
        _fsync_dir(self.durable_dir)

        fast, fast_data = self._scan(self.fast_dir)
        resumed: list[CheckpointInfo] = []
        kept: set[str] = set()
        for name, info in sorted(fast.items(), key=lambda kv: kv[1].seq):
            d = self._durable.get(name)
            if d is not None and d.seq == info.seq and d.crc32 == info.crc32:
                self._fast[name] = _FastEntry(info, "durable")
                kept.add(info.data_file)
                continue
            if d is not None and d.seq > info.seq:
                self._remove_fast_files(info)
                continue
            try:
                bad = _checksum_file(self.fast_dir / info.data_file, sha256=False).mismatch(info)
            except OSError as exc:
                bad = str(exc)
            if bad is not None:
                log.warning(
                    "fast copy of checkpoint %r does not match its manifest and was never made durable; "
                    "dropping it",
                    name,
                )
                self._remove_fast_files(info)
                continue
            self._fast[name] = _FastEntry(info, "pending")
            kept.add(info.data_file)
            resumed.append(info)
        for orphan in sorted(fast_data - kept):
            _unlink(self.fast_dir / orphan)
        for entry in self._fast.values():
            self._fast_bytes[entry.info.data_file] = entry.info.size_bytes
        all_infos = [*self._durable.values(), *(e.info for e in self._fast.values())]
        for info in all_infos:
            self._latest_seq[info.name] = max(self._latest_seq.get(info.name, 0), info.seq)
        self._next_seq = max((i.seq for i in all_infos), default=0) + 1
        self._queue.extend(resumed)
        if resumed:
            log.info("resuming the drain of %d checkpoint(s) interrupted earlier", len(resumed))
        self._prune_durable()
        with self._cond:
            self._prune_fast_locked()

    # writing ---------------------------------------------------------------------------------------

    def _reserve(self, n: int, written: int) -> None:
        """Make room for ``n`` more bytes of the checkpoint being written (``written`` so far)."""
        with self._cond:
            while True:
                used = self._fast_used_locked() + self._reserved
                if used + n <= self.fast_capacity_bytes:
                    self._reserved += n
                    return
                if written + n > self.fast_capacity_bytes:
                    raise _TooLarge()
                if self._evict_oldest_locked():
                    continue
                if self._errors:
                    raise _Aborted()  # copies that cannot drain will not free space
                if not self._queue and self._inflight is None:
                    raise _TooLarge()  # nothing will free space (copies that failed to drain hold it)
                self._cond.wait(0.5)

    def _write_fast(
        self, obj: Any, name: str, seq: int, serializer: Serializer, data_file: str
    ) -> tuple[CheckpointInfo, float]:
        tmp = _tmp_path(self.fast_dir, data_file)
        waited = 0.0
        reserved = 0

        def reserve(n: int, written: int) -> None:
            nonlocal waited, reserved
            t = time.perf_counter()
            try:
                self._reserve(n, written)
                reserved += n
            finally:
                waited += time.perf_counter() - t

        def release() -> None:
            with self._cond:
                self._reserved -= reserved
                self._cond.notify_all()

        try:
            with open(tmp, "wb", buffering=1 << 20) as f:
                sink = _ChecksumSink(f, reserve, self._hash_pool, sha256=False)
                try:
                    serializer.dump(obj, cast(IO[bytes], sink))
                except Exception as exc:
                    self._raise_sink_failure(name, serializer, sink, exc)
                f.flush()
                if self._fsync_fast:
                    os.fsync(f.fileno())
            info = CheckpointInfo(
                name=name,
                seq=seq,
                data_file=data_file,
                size_bytes=sink.size,
                crc32=sink.checksum.crc32,
                sha256=None,
                serializer=serializer.name,
                saved_unix_ns=time.time_ns(),
            )
            os.replace(tmp, self.fast_dir / data_file)
        except BaseException:
            _unlink(tmp)
            release()
            raise
        try:
            _write_manifest(self.fast_dir, info, durable=self._fsync_fast)
        except BaseException:
            _unlink(self.fast_dir / data_file)
            release()
            raise
        with self._cond:
            self._reserved -= reserved
            self._fast_bytes[data_file] = info.size_bytes
            old = self._fast.get(name)
            self._fast[name] = _FastEntry(info, "pending")
            self._latest_seq[name] = seq
            self._queue.append(info)
            if old is not None:
                # the new manifest replaced the old one; its data file is now unreferenced
                self._fast_bytes.pop(old.info.data_file, None)
                _unlink(self.fast_dir / old.info.data_file)
            self._cond.notify_all()
        return info, waited

    def _raise_sink_failure(
        self, name: str, serializer: Serializer, sink: _ChecksumSink, exc: Exception
    ) -> NoReturn:
        """Turn what went wrong inside ``serializer.dump`` into the exception ``save()`` handles."""
        failure = sink.failure
        if isinstance(failure, _Aborted):
            with self._cond:
                self._raise_errors()
            raise CheckpointError(
                f"saving checkpoint {name!r} was interrupted by a drain error (raised in another "
                "thread); fix durable storage and save it again"
            ) from None
        if isinstance(failure, (_TooLarge, OSError)):
            raise failure from None
        if isinstance(exc, OSError):
            raise exc
        raise CheckpointError(
            f"cannot serialize checkpoint {name!r} with {serializer.name}: {exc}; "
            "save picklable objects (e.g. model.state_dict())"
        ) from exc

    def _write_durable_direct(
        self, obj: Any, name: str, seq: int, serializer: Serializer, data_file: str
    ) -> CheckpointInfo:
        tmp = _tmp_path(self.durable_dir, data_file)
        try:
            with open(tmp, "wb", buffering=1 << 20) as f:
                sink = _ChecksumSink(f, None, self._hash_pool, sha256=True)
                try:
                    serializer.dump(obj, cast(IO[bytes], sink))
                except Exception as exc:
                    self._raise_sink_failure(name, serializer, sink, exc)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            _unlink(tmp)
            raise CheckpointError(
                f"cannot write checkpoint {name!r} to durable storage {str(self.durable_dir)!r}: {exc}; "
                "check that the directory exists, is writable and has free space"
            ) from exc
        except BaseException:
            _unlink(tmp)
            raise
        info = CheckpointInfo(
            name=name,
            seq=seq,
            data_file=data_file,
            size_bytes=sink.size,
            crc32=sink.checksum.crc32,
            sha256=sink.checksum.sha256,
            serializer=serializer.name,
            saved_unix_ns=time.time_ns(),
        )
        try:
            self._commit_durable(info, tmp)
        except OSError as exc:
            raise CheckpointError(
                f"cannot commit checkpoint {name!r} to durable storage {str(self.durable_dir)!r}: {exc}; "
                "check that the directory is writable and has free space"
            ) from exc
        with self._cond:
            self._latest_seq[name] = seq
            old = self._fast.get(name)
            if old is not None and old.info.seq < seq:
                self._drop_fast_locked(old.info)
            self._cond.notify_all()
        return info

    # draining --------------------------------------------------------------------------------------

    def _superseded(self, info: CheckpointInfo) -> bool:
        """True if draining ``info`` is pointless: a newer save of the name, or retention drops it."""
        with self._cond:
            return self._superseded_locked(info, retention=True)

    def _drain_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                info = self._queue.popleft()
                self._inflight = info
            outcome: BaseException | bool
            try:
                outcome = self._drain_one(info)
            except BaseException as exc:
                outcome = exc
            with self._cond:
                self._inflight = None
                entry = self._fast.get(info.name)
                current = entry is not None and entry.info.seq == info.seq
                if outcome is True:
                    if current and entry is not None:
                        entry.state = "durable"
                    self._prune_fast_locked()
                elif outcome is False:
                    if current:
                        self._drop_fast_locked(info)
                elif isinstance(outcome, _FastCopyLost):
                    if current:
                        self._drop_fast_locked(info)
                    self._errors.append(DrainError(str(outcome)))
                elif self._latest_seq.get(info.name, 0) > info.seq:
                    if current:  # a newer save of the name replaced it: the failure no longer matters
                        self._drop_fast_locked(info)
                elif self._superseded_locked(info, retention=False):
                    if current and entry is not None:  # committed, then a later step failed
                        entry.state = "durable"
                    self._errors.append(self._drain_error(info, outcome))
                else:
                    if current and entry is not None:
                        entry.state = "failed"
                        self._failed.append(info)
                    self._errors.append(self._drain_error(info, outcome))
                self._cond.notify_all()

    def _superseded_locked(self, info: CheckpointInfo, *, retention: bool) -> bool:
        if self._latest_seq.get(info.name, 0) > info.seq:
            return True
        current = self._durable.get(info.name)
        if current is not None and current.seq >= info.seq:
            return True
        if retention and self.keep_last is not None:
            return sum(1 for d in self._durable.values() if d.seq > info.seq) >= self.keep_last
        return False

    def _drain_error(self, info: CheckpointInfo, exc: BaseException) -> DrainError:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        where = getattr(exc, "filename", None) or str(self.durable_dir)
        err = DrainError(
            f"draining checkpoint {info.name!r} to durable storage failed: {detail} ({where}); "
            "make the durable directory writable and with free space, then call wait() to retry "
            "(the copy stays on the fast tier)"
        )
        err.__cause__ = exc
        return err

    def _drain_one(self, info: CheckpointInfo) -> bool:
        """Copy one fast checkpoint to durable storage. True: durable; False: skipped (superseded)."""
        if self._superseded(info):
            return False
        src = self.fast_dir / info.data_file
        tmp = _tmp_path(self.durable_dir, info.data_file)
        ck = _Checksum(sha256=True)
        buf = bytearray(_COPY_CHUNK)
        view = memoryview(buf)
        try:
            with open(src, "rb", buffering=0) as fin, open(tmp, "wb", buffering=0) as fout:
                while True:
                    n = fin.readinto(buf)
                    if not n:
                        break
                    chunk = view[:n]
                    ck.update(chunk)
                    written = 0
                    while written < n:
                        written += fout.write(chunk[written:]) or 0
                os.fsync(fout.fileno())
                if hasattr(os, "posix_fadvise"):  # the fast copy serves loads: keep the page cache free
                    os.posix_fadvise(fout.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            bad = ck.mismatch(info)
            if bad is not None:
                raise _FastCopyLost(
                    f"the fast copy of checkpoint {info.name!r} was corrupted before it reached durable "
                    f"storage ({bad}); that checkpoint is lost, save it again"
                )
        except FileNotFoundError as exc:
            _unlink(tmp)
            if exc.filename == str(src) and not self._superseded(info):
                raise _FastCopyLost(
                    f"the fast copy of checkpoint {info.name!r} disappeared before it reached durable "
                    f"storage ({src}); that checkpoint is lost, save it again"
                ) from None
            raise
        except BaseException:
            _unlink(tmp)
            raise
        return self._commit_durable(dataclasses.replace(info, sha256=ck.sha256), tmp)

    def _commit_durable(self, info: CheckpointInfo, tmp: Path) -> bool:
        """Publish a fully written, fsynced data file and its manifest. False if superseded."""
        with self._durable_lock:
            with self._cond:
                skip = self._superseded_locked(info, retention=True)
            if skip:
                _unlink(tmp)
                return False
            final = self.durable_dir / info.data_file
            try:
                os.replace(tmp, final)
            except BaseException:
                _unlink(tmp)
                raise
            try:
                _fsync_dir(self.durable_dir)
                _write_manifest(self.durable_dir, info, durable=True)  # the commit point
            except BaseException:
                if not _manifest_names(self.durable_dir, info):
                    _unlink(final)  # no manifest names it: it would only be an orphan
                raise
            with self._cond:
                old = self._durable.get(info.name)
                self._durable[info.name] = info
            if old is not None and old.data_file != info.data_file:
                _unlink(self.durable_dir / old.data_file)
            self._prune_durable()
        return True

    # retention and eviction -----------------------------------------------------------------------

    def _prune_durable(self) -> None:
        """Delete durable checkpoints beyond ``keep_last`` (manifest first, then data)."""
        if self.keep_last is None:
            return
        with self._cond:
            ordered = sorted(self._durable.values(), key=lambda i: i.seq, reverse=True)
            doomed = ordered[self.keep_last :]
            for info in doomed:
                del self._durable[info.name]
            self._prune_fast_locked()
        if not doomed:
            return
        for info in doomed:
            _unlink(_manifest_path(self.durable_dir, info.name))
        _fsync_dir(self.durable_dir)
        for info in doomed:
            _unlink(self.durable_dir / info.data_file)
            log.info("retention: removed checkpoint %r (keep_last=%d)", info.name, self.keep_last)

    def _prune_fast_locked(self) -> None:
        """Drop drained fast copies whose checkpoint is no longer kept in durable storage."""
        for name, entry in list(self._fast.items()):
            if entry.state != "durable":
                continue
            d = self._durable.get(name)
            if d is None or d.seq != entry.info.seq:
                self._drop_fast_locked(entry.info)

    def _evict_oldest_locked(self) -> bool:
        drained = [e for e in self._fast.values() if e.state == "durable"]
        if not drained:
            return False
        victim = min(drained, key=lambda e: e.info.seq)
        self._drop_fast_locked(victim.info)
        return True

    def _drop_fast_locked(self, info: CheckpointInfo) -> None:
        entry = self._fast.get(info.name)
        if entry is not None and entry.info.seq == info.seq:
            del self._fast[info.name]
            self._remove_fast_files(info)
        else:
            _unlink(self.fast_dir / info.data_file)
        self._fast_bytes.pop(info.data_file, None)
        self._cond.notify_all()

    def _remove_fast_files(self, info: CheckpointInfo) -> None:
        path = _manifest_path(self.fast_dir, info.name)
        try:
            current = _read_manifest(path, info.name)
        except (OSError, ValueError, KeyError, TypeError):
            current = None
        if current is None or current.seq == info.seq:
            _unlink(path)
        _unlink(self.fast_dir / info.data_file)

    # loading ---------------------------------------------------------------------------------------

    def _read_durable_manifest(self, name: str) -> CheckpointInfo:
        path = _manifest_path(self.durable_dir, name)
        try:
            info = _read_manifest(path, name)
        except FileNotFoundError:
            known = [i.name for i in self.list()]
            hint = f"available: {', '.join(known[-5:])}" if known else "no checkpoints are stored there yet"
            with self._cond:
                pending = name in self._fast
            if pending:
                hint = "its fast copy is unusable and it never reached durable storage"
            raise CheckpointNotFoundError(
                f"no checkpoint named {name!r} in {str(self.durable_dir)!r} ({hint}); check the name"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointCorruptError(
                f"the manifest of checkpoint {name!r} in {str(self.durable_dir)!r} is unreadable ({exc}); "
                "load an older checkpoint"
            ) from None
        return info

    def _load_verified(self, directory: Path, info: CheckpointInfo, options: dict[str, Any]) -> Any:
        path = directory / info.data_file
        strong = directory == self.durable_dir and info.sha256 is not None
        try:
            bad = _checksum_file(path, sha256=strong).mismatch(info)
        except FileNotFoundError:
            if directory == self.fast_dir:
                raise
            raise CheckpointCorruptError(
                f"the data file of checkpoint {info.name!r} ({path}) is missing; load an older checkpoint"
            ) from None
        if bad is not None:
            raise CheckpointCorruptError(
                f"checkpoint {info.name!r} in {str(directory)!r} does not match its manifest ({bad}); "
                "load an older checkpoint"
            )
        serializer = self._serializer_named(info.serializer)
        with open(path, "rb") as f:
            return serializer.load(f, **options)

    def _handle_corrupt_fast(self, info: CheckpointInfo, exc: CheckpointCorruptError) -> None:
        with self._cond:
            durable = self._durable.get(info.name)
            same = durable is not None and durable.seq == info.seq and durable.crc32 == info.crc32
            if same:
                self._drop_fast_locked(info)
        if not same:
            raise CheckpointCorruptError(
                f"the fast copy of checkpoint {info.name!r} is corrupted and it is not durable yet: {exc}"
            ) from None
        warnings.warn(
            f"the fast copy of checkpoint {info.name!r} is corrupted ({exc}); "
            "loading it from durable storage instead",
            CheckpointWarning,
            stacklevel=4,
        )


class _FastCopyLost(Exception):
    """The fast copy is corrupted or gone before it was drained: retrying cannot help."""
