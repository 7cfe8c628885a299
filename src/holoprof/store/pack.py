"""Packs: a whole run as one portable file (``holoprof pack RUN -o FILE.holoprof``).

A pack is a tar archive of the run directory, made after leftover raw chunks are converted and a
finished run is compacted (one Parquet file per table per process). Every command that takes a run
(report, export, diff) accepts a pack in its place: :func:`open_run` unpacks it into a private
temporary directory (mode 0700, removed when the program exits) and returns the run directory.

Unpacking trusts nothing in the archive: only regular files and directories are extracted; absolute
names, names with ``..`` components, links and device files are refused with a HoloprofError. The
number of entries, the bytes they declare (against the pack's size: a gzipped pack of blanks would
inflate a thousandfold) and the manifest's size are bounded (:mod:`holoprof.store.limits`), checked
header by header before anything is extracted; the Parquet files' footers are then held to the same
decompression ratio.
"""

from __future__ import annotations

import atexit
import lzma
import os
import shutil
import sys
import tarfile
import tempfile
import zlib
from typing import TYPE_CHECKING

from holoprof import model
from holoprof.errors import HoloprofError
from holoprof.store import limits, rundir, safeio
from holoprof.store.compact import compact_run
from holoprof.store.convert import find_chunks

if TYPE_CHECKING:
    from holoprof.progress import Bar

PACK_SUFFIX = ".holoprof"
MAX_MANIFEST_BYTES = rundir.MAX_MANIFEST_BYTES
_TEMP_DIRS: list[str] = []


def _cleanup() -> None:
    while _TEMP_DIRS:
        shutil.rmtree(_TEMP_DIRS.pop(), ignore_errors=True)


atexit.register(_cleanup)


# --- packing -------------------------------------------------------------------------------------------
def pack_run(run_dir: str | os.PathLike[str], out: str | os.PathLike[str], bar: Bar | None = None) -> str:
    """Write ``run_dir`` as one pack file ``out``; returns the path written. ``bar`` (a progress bar)
    counts the bytes packed."""

    src = os.path.abspath(os.fspath(run_dir))
    if os.path.isfile(src):
        raise HoloprofError(f"{src} is a file (already a pack?); pass a run directory to `holoprof pack`")
    manifest = rundir.read_manifest(src)
    find_chunks(src)  # converts raw chunks left behind by a killed process
    if manifest.get("status") in ("finished", "crashed"):
        try:
            compact_run(src)
        except Exception as exc:  # compaction only saves space; pack the chunks as they are
            sys.stderr.write(f"holoprof: could not compact {src} ({exc}); packing it as it is\n")
    dest = os.path.abspath(os.fspath(out))
    if os.path.commonpath([dest, src]) == src:
        raise HoloprofError(f"{dest} is inside the run directory; write the pack somewhere else (-o FILE)")
    arcroot = os.path.basename(src.rstrip(os.sep)) or "run"
    tmp = dest + ".tmp"
    if bar is not None and bar.active:
        bar.add_total(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs))
    try:
        with tarfile.open(tmp, "w") as tar:
            for dirpath, dirnames, filenames in os.walk(src):
                dirnames.sort()
                rel = os.path.relpath(dirpath, src)
                arcdir = arcroot if rel == "." else os.path.join(arcroot, rel)
                tar.add(dirpath, arcname=arcdir, recursive=False)
                for name in sorted(filenames):
                    path = os.path.join(dirpath, name)
                    if os.path.islink(path) or not os.path.isfile(path) or ".tmp" in name:
                        continue
                    tar.add(path, arcname=os.path.join(arcdir, name), recursive=False)
                    if bar is not None:
                        bar.advance(os.path.getsize(path))
        os.replace(tmp, dest)
    except OSError as exc:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise HoloprofError(f"cannot write {dest} ({exc.strerror or exc}); choose a writable path with -o")
    return dest


# --- unpacking -----------------------------------------------------------------------------------------
def _check_member(m: tarfile.TarInfo, pack: str) -> None:
    name = m.name
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise HoloprofError(f"{pack} holds an absolute path ({name!r}); refusing to unpack it")
    if ".." in parts:
        raise HoloprofError(
            f"{pack} holds a path that leaves its directory ({name!r}); refusing to unpack it"
        )
    if m.issym() or m.islnk():
        raise HoloprofError(f"{pack} holds a link ({name!r}); refusing to unpack it")
    if not (m.isfile() or m.isdir()):
        raise HoloprofError(f"{pack} holds a special file ({name!r}); refusing to unpack it")


def _root(name: str) -> str:
    parts = [x for x in name.replace("\\", "/").split("/") if x not in ("", ".")]
    return parts[0] if parts else ""


def _is_tar(p: str) -> bool:
    """``tarfile.is_tarfile`` of a regular file, False for a compressed stream that is cut short or
    damaged (and for a FIFO or a device, which are not read)."""
    try:
        with safeio.open_regular(p) as f:
            return tarfile.is_tarfile(f)
    except (EOFError, zlib.error, lzma.LZMAError, ValueError, OSError):
        return False


def is_pack(path: str | os.PathLike[str]) -> bool:
    p = os.fspath(path)
    return os.path.isfile(p) and _is_tar(p)


def _members(tar: tarfile.TarFile, p: str) -> list[tarfile.TarInfo]:
    """The pack's members, read one header at a time and checked as they come: names, kinds, and the
    limits on entries, bytes and decompression ratio (see :mod:`holoprof.store.limits`), so that a
    bomb is refused at its first oversized header, before its data is inflated or written."""
    max_files = limits.value(limits.PACK_FILES)
    compressed = os.path.getsize(p)
    members: list[tarfile.TarInfo] = []
    declared = 0
    for m in tar:
        _check_member(m, p)
        members.append(m)
        if len(members) > max_files:
            raise limits.exceeded(p, f"more than {max_files:,} entries", limits.PACK_FILES)
        declared += max(0, m.size)
        limits.check_ratio(p, declared, compressed)
        if os.path.basename(m.name) == model.MANIFEST and m.size > MAX_MANIFEST_BYTES:
            raise HoloprofError(
                f"{p} holds a {m.name} of {m.size:,} bytes (a manifest is a few KiB); refusing to unpack it"
            )
    return members


def _check_parquet(p: str, dest: str, members: list[tarfile.TarInfo]) -> None:
    """The Parquet files of a pack may not declare more uncompressed data than the ratio limit allows
    (a GZIP or ZSTD page of zeros inflates a thousandfold when the run is read): their footers are
    read (a few hundred bytes each) and the declared size of their row groups checked. A footer that
    cannot be read is left to the reader, which skips unreadable chunks."""
    import pyarrow.parquet as pq  # lazy: pyarrow loads only where chunks are written or read, not with the module

    for m in members:
        if not (m.isfile() and m.name.endswith(model.CHUNK_SUFFIX)):
            continue
        path = os.path.join(dest, m.name)
        try:
            md = pq.read_metadata(path)
            declared = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        except Exception:
            continue
        limits.check_ratio(f"{p} ({m.name})", declared, m.size)


def unpack(pack: str | os.PathLike[str], dest: str) -> str:
    """Extract ``pack`` into the directory ``dest`` (checked member by member); returns the run dir."""
    p = os.fspath(pack)
    try:
        with safeio.open_regular(p) as f, tarfile.open(fileobj=f, mode="r:*") as tar:
            members = _members(tar, p)
            roots = {_root(m.name) for m in members} - {""}
            for m in members:
                target = os.path.realpath(os.path.join(dest, m.name))
                if os.path.commonpath([target, os.path.realpath(dest)]) != os.path.realpath(dest):
                    raise HoloprofError(
                        f"{p} holds a path that leaves its directory ({m.name!r}); refusing it"
                    )
                m.mode = (m.mode & 0o700) | (0o700 if m.isdir() else 0o600)
                if hasattr(tarfile, "data_filter"):
                    tar.extract(m, dest, set_attrs=True, filter="data")
                else:  # pragma: no cover - Python without extraction filters; members checked above
                    tar.extract(m, dest, set_attrs=True)
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, ValueError) as exc:
        raise HoloprofError(f"{p} is not a readable holoprof pack ({exc}); make one with `holoprof pack RUN`")
    except OSError as exc:
        raise HoloprofError(f"cannot unpack {p} ({exc.strerror or exc}); check the free space in {dest}")
    _check_parquet(p, dest, members)
    for root in sorted(roots):
        cand = os.path.join(dest, root)
        if os.path.isfile(os.path.join(cand, model.MANIFEST)):
            return cand
    if os.path.isfile(os.path.join(dest, model.MANIFEST)):
        return dest
    raise HoloprofError(
        f"{p} holds no holoprof run (no {model.MANIFEST}); make packs with `holoprof pack RUN`"
    )


#: packs unpacked by this process: (path, size, mtime) -> the run directory (a pack opened again, as
#: when a command reads it once more without a corrupt chunk, is not unpacked again)
_UNPACKED: dict[tuple[str, int, int], str] = {}


def open_run(path: str | os.PathLike[str]) -> str:
    """A run directory for ``path``: the directory itself, or a pack unpacked into a private
    temporary directory (0700, removed at exit; once per process)."""
    p = os.path.abspath(os.fspath(path))
    if not os.path.isfile(p):
        return p
    if not _is_tar(p):
        raise HoloprofError(
            f"{p} is a file but not a holoprof pack; pass a run directory or a .holoprof file made by "
            "`holoprof pack RUN`"
        )
    st = os.stat(p)
    key = (p, st.st_size, st.st_mtime_ns)
    if key in _UNPACKED and os.path.isdir(_UNPACKED[key]):
        return _UNPACKED[key]
    dest = tempfile.mkdtemp(prefix="holoprof-pack-")
    os.chmod(dest, 0o700)
    _TEMP_DIRS.append(dest)
    try:
        _UNPACKED[key] = unpack(p, dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        if dest in _TEMP_DIRS:
            _TEMP_DIRS.remove(dest)
        raise
    return _UNPACKED[key]
