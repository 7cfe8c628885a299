"""Reading files that holoprof did not just write itself, and naming paths to libraries, safely.

A run directory, a trace or a pack comes from a file system that anyone may have touched: a
``manifest.json`` can be a FIFO (a plain ``open`` waits for a writer forever), a link to
``/dev/zero`` (a plain ``read`` never ends), a file of gigabytes, or JSON nested 100,000 levels deep
(``json.loads`` raises RecursionError). Every reader of such a file goes through this module:

* :func:`open_regular` opens with ``O_NONBLOCK`` (opening a FIFO does not wait) and checks with
  ``fstat`` that it got a regular file, of at most ``limit`` bytes; otherwise it raises
  :class:`NotRegularFile` or :class:`FileTooLarge` (both OSError, with a ``strerror`` that says what
  was found). :func:`read_bytes` and :func:`read_json` read a whole file that way.
* :func:`loads_json` parses JSON with a depth limit: too deep is a ValueError, never a RecursionError.

Paths are ``str`` as Python gives them: bytes that are not UTF-8 are kept as surrogate escapes
(:func:`os.fsdecode`), which every ``os`` function turns back into the same bytes. pyarrow, DuckDB and
the Darshan library take file names as UTF-8 text, which such a path is not: :func:`utf8_path` gives
them a path that is (a symbolic link, in a private temporary folder), so a run whose directory name
holds any bytes is written and read like any other.

Standard library only: the agent's raw chunks are read through here too.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from typing import IO, Any

#: nesting of JSON objects and arrays that :func:`loads_json` accepts by default
JSON_DEPTH = 64
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class NotRegularFile(OSError):
    """The path is not a regular file (a FIFO, a device, a socket, a directory)."""


class FileTooLarge(OSError):
    """The file is larger than the reader allows."""


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``a FIFO``, ``a device``...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def open_regular(path: str, limit: int | None = None, dir_fd: int | None = None) -> IO[bytes]:
    """``path`` opened for reading in binary, once it is known to be a regular file of at most
    ``limit`` bytes. Opening never blocks (``O_NONBLOCK``: a FIFO is refused, not waited on).
    Raises :class:`NotRegularFile`, :class:`FileTooLarge` or the OSError of ``open``."""
    fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{file_kind(st.st_mode)}, not a regular file", path)
        if limit is not None and st.st_size > limit:
            raise FileTooLarge(errno.EFBIG, f"{st.st_size:,} bytes, over the {limit:,} allowed", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`), at most ``limit`` of them
    (a file that grows past it while it is read is refused too)."""
    with open_regular(path, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(errno.EFBIG, f"more than the {limit:,} bytes allowed", path)
    return data


def loads_json(data: bytes | str, max_depth: int | None = JSON_DEPTH) -> Any:
    """The JSON document in ``data``; a ValueError (never a RecursionError) when it is not JSON or
    nests objects and arrays more than ``max_depth`` levels deep (None: as deep as the parser goes,
    for records whose shape the caller checks)."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ValueError(f"JSON nested more than {max_depth or 'a thousand'} levels deep")
    if max_depth is not None and _depth_over(doc, max_depth):
        raise ValueError(f"JSON nested more than {max_depth} levels deep")
    return doc


def _depth_over(doc: Any, max_depth: int) -> bool:
    """Whether ``doc`` nests lists and dicts more than ``max_depth`` levels (without recursion)."""
    level: list[Any] = [doc]
    depth = 0
    while level:
        containers = [x for x in level if isinstance(x, (dict, list))]
        if not containers:
            return False
        depth += 1
        if depth > max_depth:
            return True
        level = [v for x in containers for v in (x.values() if isinstance(x, dict) else x)]
    return False


def read_json(path: str, limit: int, max_depth: int = JSON_DEPTH) -> Any:
    """The JSON document of the regular file ``path`` of at most ``limit`` bytes: OSError when it
    cannot be read (see :func:`read_bytes`), ValueError when it is not JSON (see :func:`loads_json`)."""
    return loads_json(read_bytes(path, limit), max_depth)


# --- paths for libraries that take UTF-8 file names -----------------------------------------------------
_aliases: dict[str, str] = {}
_alias_lock = threading.Lock()
_alias_dir: list[str] = []


def is_utf8(path: str) -> bool:
    """Whether ``path`` is UTF-8 text (no surrogate escapes of bytes that are not)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def utf8_path(path: str) -> str:
    """``path`` itself when it is UTF-8 text; else a path that is, to the same file or directory: a
    symbolic link in a private temporary folder (0700, removed at exit), made once per process and
    path. Files under the link are the files under ``path``: writes, renames and reads go there."""
    if is_utf8(path):
        return path
    real = os.path.abspath(path)
    with _alias_lock:
        alias = _aliases.get(real)
        if alias is not None and os.path.islink(alias):
            return alias
        if not _alias_dir:
            import atexit  # lazy: only for a path that is not UTF-8
            import tempfile  # lazy: only for a path that is not UTF-8

            folder = tempfile.mkdtemp(prefix="holoprof-paths-")
            _alias_dir.append(folder)
            atexit.register(_remove_aliases, folder, os.getpid())
        alias = os.path.join(_alias_dir[0], f"p{len(_aliases)}")
        os.symlink(real, alias)
        _aliases[real] = alias
    return alias


def _remove_aliases(folder: str, owner: int) -> None:
    """Remove the folder of aliases at exit, in the process that made it (not in a forked child)."""
    if os.getpid() == owner:
        import shutil  # lazy: only for a path that is not UTF-8, at exit

        shutil.rmtree(folder, ignore_errors=True)
