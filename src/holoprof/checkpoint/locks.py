"""Exclusive use of a checkpoint directory: an ``flock`` on the directory and on a lock file."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import NoReturn

from holoprof.checkpoint.errors import CheckpointError

LOCK_NAME = ".holoprof-burst.lock"


def lock_dir(directory: Path) -> list[int]:
    """Lock ``directory`` for this buffer; returns the descriptors that hold the locks.

    The lock is an ``flock`` on the directory itself, which deleting a file cannot undo, plus one
    on ``.holoprof-burst.lock`` (which names the holder's pid), checked to still be the file at
    that path after locking. File systems without directory locks rely on the lock file alone.
    """
    fds: list[int] = []
    try:
        _lock_directory_itself(directory, fds)
        fd = _lock_lock_file(directory, fds)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        release_locks(fds)
        raise
    return fds


def release_locks(fds: list[int]) -> None:
    """Close the descriptors that hold the locks (which releases them) and empty ``fds``."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def _refuse(directory: Path) -> NoReturn:
    holder = ""
    with contextlib.suppress(OSError, ValueError):
        holder = f" (pid {int((directory / LOCK_NAME).read_text().strip())})"
    raise CheckpointError(
        f"another BurstBuffer{holder} is using {str(directory)!r}; "
        "close it first or use a different directory"
    )


def _lock_directory_itself(directory: Path, fds: list[int]) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fds.append(dfd)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            _refuse(directory)
        os.close(fds.pop())  # no flock on directories here: the lock file below holds it


def _lock_lock_file(directory: Path, fds: list[int]) -> int:
    path = directory / LOCK_NAME
    for _ in range(5):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        fds.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                _refuse(directory)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fds.pop())  # removed or replaced while we locked it: lock the new one
    _refuse(directory)
