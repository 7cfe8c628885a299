"""``holoprof iobench PATH``: read bandwidth and IOPS of a dataset against readers, block size and prefetch.

Every configuration reads the dataset (a directory of files, read whole; or large files read in
contiguous ranges, one per reader) with ``threads`` reader threads in each of ``processes``
processes, in blocks of ``block_size`` bytes, handing blocks to a consumer through a bounded queue of
``prefetch`` blocks (0: readers consume their own blocks, no queue). Before each configuration the
files are evicted from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``) and the eviction is
checked with ``mincore(2)``; where that is impossible (tmpfs, no fadvise) the rows say ``warm`` and a
warning says why.

Measurement (``run_iobench``) returns plain dataclasses; the renderers (``render_terminal``,
``to_json``, ``render_html``) only present them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import json
import math
import mmap
import os
import platform
import queue
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from holoprof.errors import HoloprofError

if TYPE_CHECKING:
    pass

SCHEMA = "holoprof.iobench/1"
Cache = Literal["cold", "warm"]

DEFAULT_THREADS = (1, 2, 4, 8)
DEFAULT_BLOCK_SIZE = 1 << 20
DEFAULT_PREFETCH = 4
DEFAULT_MAX_SECONDS = 10.0
NEAR_BEST = 0.9  # "within 10% of the best bandwidth"
COLD_RESIDENT_MAX = 0.05  # at most this share of the data may still be cached for a "cold" row
_MINCORE_SAMPLE_FILES = 256


# --------------------------------------------------------------------------------------------------
# result objects


@dataclass(frozen=True)
class IoBenchRow:
    """One configuration and what it measured."""

    threads: int
    processes: int
    block_size: int
    prefetch: int
    bytes: int
    seconds: float
    bandwidth_bytes_per_s: float
    iops: float
    cache: Cache
    reads: int
    files_opened: int
    complete: bool  # False if --max-seconds / --max-bytes stopped the readers first
    resident_fraction: float | None  # page-cache share of the data before the run (None: unknown)

    @property
    def readers(self) -> int:
        return self.threads * self.processes


@dataclass(frozen=True)
class Recommendation:
    """Reader settings for the input pipeline, and the measurement behind them."""

    readers: int
    block_size: int
    prefetch: int
    bandwidth_bytes_per_s: float
    best_bandwidth_bytes_per_s: float
    best_readers: int
    dataloader_num_workers: int
    dataloader_prefetch_factor: int
    tf_num_parallel_calls: int
    reason: str


@dataclass(frozen=True)
class IoBenchResult:
    path: str
    files: int
    total_bytes: int
    cache_requested: Cache
    max_seconds: float
    max_bytes: int | None
    rows: list[IoBenchRow]
    recommendation: Recommendation | None
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# input parsing

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str, what: str = "size") -> int:
    """'4096', '64k', '1M', '1MiB', '2g' -> bytes (binary units). Raises HoloprofError."""
    m = _SIZE_RE.match(str(text))
    if m is None:
        raise HoloprofError(f"bad {what} {text!r}; use bytes or a binary unit, e.g. 4k, 64KiB, 1M, 2G")
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if value < 1 or value != int(value):
        raise HoloprofError(f"bad {what} {text!r}; it must be a whole number of bytes, at least 1")
    return int(value)


#: The most reader threads, reader processes or queued blocks one configuration may ask for.
MAX_PARALLEL = 1024


def parse_int_list(text: str, what: str, minimum: int, maximum: int = MAX_PARALLEL) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; each between ``minimum`` and ``maximum``. Raises HoloprofError."""
    values: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise HoloprofError(
                f"bad {what} list {text!r}: {part!r} is not an integer; use e.g. --{what} 1,2,4,8"
            ) from None
        if value < minimum:
            raise HoloprofError(f"bad {what} list {text!r}: {value} is below {minimum}")
        if value > maximum:
            raise HoloprofError(f"bad {what} list {text!r}: {value} is above {maximum}")
        values.append(value)
    if not values:
        raise HoloprofError(f"empty {what} list; use e.g. --{what} 1,2,4")
    return sorted(set(values))


def parse_size_list(text: str, what: str) -> list[int]:
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise HoloprofError(f"empty {what} list; use e.g. --{what} 64k,1m")
    return sorted({parse_size(p, what) for p in parts})


# --------------------------------------------------------------------------------------------------
# dataset


@dataclass(frozen=True)
class _Unit:
    path: str
    offset: int
    length: int


def scan_dataset(path: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """Regular files under ``path`` (or ``path`` itself) with their sizes, sorted. Raises HoloprofError."""
    root = Path(path)
    if not root.exists():
        raise HoloprofError(f"dataset path {str(root)!r} does not exist; pass a file or a directory of files")
    candidates: list[Path]
    if root.is_dir():
        candidates = []
        for dirpath, dirnames, filenames in os.walk(root, onerror=_raise_walk_error):
            dirnames.sort()
            candidates.extend(Path(dirpath) / f for f in sorted(filenames))
    else:
        candidates = [root]
    files: list[tuple[str, int]] = []
    for p in candidates:
        try:
            st = p.stat()
        except OSError as exc:
            raise HoloprofError(
                f"cannot read {str(p)!r}: {exc.strerror or exc}; fix or remove it from the dataset"
            ) from None
        if not _is_regular(st.st_mode):
            continue
        if not os.access(p, os.R_OK):
            raise HoloprofError(f"cannot read {str(p)!r}: permission denied; fix its permissions")
        files.append((str(p), st.st_size))
    if not files:
        raise HoloprofError(f"no regular files under {str(root)!r}; pass a directory that holds the dataset")
    if sum(size for _, size in files) == 0:
        raise HoloprofError(f"all {len(files)} file(s) under {str(root)!r} are empty; nothing to read")
    return files


def _is_regular(mode: int) -> bool:

    return stat.S_ISREG(mode)


def _raise_walk_error(exc: OSError) -> None:
    raise HoloprofError(f"cannot list {exc.filename!r}: {exc.strerror or exc}; fix its permissions")


def make_units(files: Sequence[tuple[str, int]], readers: int, block_size: int) -> list[_Unit]:
    """Whole files when there are at least as many files as readers; otherwise each file is cut into
    ``readers`` contiguous ranges (block-aligned), so that every reader streams its own range."""
    if len(files) >= readers:
        return [_Unit(p, 0, size) for p, size in files if size > 0]
    units: list[_Unit] = []
    for p, size in files:
        if size == 0:
            continue
        blocks = math.ceil(size / block_size)
        parts = min(readers, blocks)
        edges = [min(size, (i * blocks // parts) * block_size) for i in range(parts + 1)]
        units.extend(_Unit(p, a, b - a) for a, b in itertools.pairwise(edges) if b > a)
    return units


# --------------------------------------------------------------------------------------------------
# page cache


def evict(files: Iterable[tuple[str, int]], *, write_back: bool = False) -> str | None:
    """Drop the files from the page cache. Returns None, or why it could not be done.

    Dirty pages cannot be dropped: ``write_back=True`` first writes them back (``fdatasync``, which
    costs a device cache flush per file, so it is done only when needed).
    """
    if not hasattr(os, "posix_fadvise"):
        return "this platform has no posix_fadvise"
    for p, _ in files:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError as exc:
            return f"cannot open {p}: {exc.strerror or exc}"
        try:
            if write_back:
                try:
                    os.fdatasync(fd)
                except OSError:
                    pass
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            return f"posix_fadvise failed on {p}: {exc.strerror or exc}"
        finally:
            os.close(fd)
    return None


class _Mincore:
    """Page-cache residency of files through mincore(2) (Linux, via ctypes)."""

    def __init__(self) -> None:
        self.available = False
        if not sys.platform.startswith("linux"):
            return
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            self._mmap = libc.mmap
            self._mmap.restype = ctypes.c_void_p
            self._mmap.argtypes = [
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_long,
            ]
            self._munmap = libc.munmap
            self._munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            self._mincore = libc.mincore
            self._mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        except (OSError, AttributeError):
            return
        self.page = mmap.PAGESIZE
        self.available = True

    def resident(self, path: str, size: int) -> tuple[int, int] | None:
        """(resident pages, total pages) of a file, or None if it cannot be told."""
        if size == 0:
            return (0, 0)
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = self._mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                pages = (size + self.page - 1) // self.page
                vec = (ctypes.c_ubyte * pages)()
                if self._mincore(addr, size, vec) != 0:
                    return None
                return sum(b & 1 for b in bytes(vec)), pages
            finally:
                self._munmap(addr, size)
        finally:
            os.close(fd)


_MINCORE = _Mincore()


def resident_fraction(files: Sequence[tuple[str, int]]) -> float | None:
    """Share of the data's pages in the page cache (sampled over at most 256 files), or None."""
    if not _MINCORE.available:
        return None
    step = max(1, len(files) // _MINCORE_SAMPLE_FILES)
    resident = total = 0
    for p, size in files[::step]:
        try:
            got = _MINCORE.resident(p, size)
        except OSError:
            return None
        if got is None:
            return None
        resident += got[0]
        total += got[1]
    return resident / total if total else 0.0


# --------------------------------------------------------------------------------------------------
# reading


class _Budget:
    """Bytes left to read under --max-bytes, shared by the readers of one process."""

    def __init__(self, limit: int | None) -> None:
        self._left = limit
        self._lock = threading.Lock()

    def take(self, n: int) -> int:
        if self._left is None:
            return n
        with self._lock:
            got = min(n, self._left)
            self._left -= got
            return got


@dataclass
class _Tally:
    bytes: int = 0
    reads: int = 0
    files_opened: int = 0
    stopped_early: bool = False
    error: BaseException | None = None


def _read_units(
    units: Sequence[_Unit],
    threads: int,
    block_size: int,
    prefetch: int,
    deadline: float,
    budget: _Budget,
) -> _Tally:
    """Read ``units`` with ``threads`` readers; blocks go through a queue of ``prefetch`` to a consumer."""
    return _Readers(units, threads, block_size, prefetch, deadline, budget).run()


class _Readers:
    """Reader threads taking units from a shared queue; with ``prefetch`` > 0 their blocks go through a
    bounded queue of ``prefetch`` blocks to a consumer (the calling thread), which hands the buffers back."""

    def __init__(
        self,
        units: Sequence[_Unit],
        threads: int,
        block_size: int,
        prefetch: int,
        deadline: float,
        budget: _Budget,
    ) -> None:
        self.work: queue.SimpleQueue[_Unit] = queue.SimpleQueue()
        for u in units:
            self.work.put(u)
        self.stop = threading.Event()
        self.threads = threads
        self.block_size = block_size
        self.deadline = deadline
        self.budget = budget
        self.handoff: queue.Queue[tuple[bytearray, int] | None] | None = None
        self.free: queue.SimpleQueue[bytearray] | None = None
        if prefetch > 0:
            self.handoff = queue.Queue(maxsize=prefetch)
            self.free = queue.SimpleQueue()
            for _ in range(prefetch + threads):
                self.free.put(bytearray(block_size))

    def run(self) -> _Tally:
        """Read everything (or until the deadline or the budget) with the readers: the totals."""
        tallies = [_Tally() for _ in range(self.threads)]
        workers = [threading.Thread(target=self._reader, args=(t,), daemon=True) for t in tallies]
        for w in workers:
            w.start()
        consumed = self._consume()
        for w in workers:
            w.join()
        return _Tally(
            bytes=consumed + sum(t.bytes for t in tallies),
            reads=sum(t.reads for t in tallies),
            files_opened=sum(t.files_opened for t in tallies),
            stopped_early=any(t.stopped_early for t in tallies),
            error=next((t.error for t in tallies if t.error is not None), None),
        )

    def _consume(self) -> int:
        """The consumer: take blocks until every reader is done; returns the bytes taken (0: no queue)."""
        handoff, free = self.handoff, self.free
        consumed = 0
        if handoff is not None and free is not None:
            finished = 0
            while finished < self.threads:
                item = handoff.get()
                if item is None:
                    finished += 1
                    continue
                buf, n = item
                consumed += n  # the consumer's work: account for the block and hand the buffer back
                free.put(buf)
        return consumed

    def _reader(self, tally: _Tally) -> None:
        own = bytearray(self.block_size) if self.free is None else None
        try:
            while not self.stop.is_set():
                try:
                    unit = self.work.get_nowait()
                except queue.Empty:
                    return
                if not self._read_unit(unit, tally, own):
                    return
        except BaseException as exc:
            tally.error = exc
            self.stop.set()
        finally:
            if self.handoff is not None:
                self.handoff.put(None)

    def _read_unit(self, unit: _Unit, tally: _Tally, own: bytearray | None) -> bool:
        """Read one unit in blocks; False when the deadline or the budget stopped the reading."""
        block_size, deadline, budget, free, handoff = (
            self.block_size,
            self.deadline,
            self.budget,
            self.free,
            self.handoff,
        )
        fd = os.open(unit.path, os.O_RDONLY)
        tally.files_opened += 1
        try:
            pos, end = unit.offset, unit.offset + unit.length
            while pos < end:
                if time.monotonic() >= deadline:
                    tally.stopped_early = True
                    self.stop.set()
                    return False
                want = budget.take(min(block_size, end - pos))
                if want <= 0:
                    tally.stopped_early = True
                    self.stop.set()
                    return False
                if own is not None:
                    buf = own
                else:
                    assert free is not None
                    buf = free.get()
                n = os.preadv(fd, [memoryview(buf)[:want]], pos)
                tally.reads += 1
                if handoff is not None:
                    handoff.put((buf, n))
                else:
                    tally.bytes += n
                if n < want:  # the file shrank
                    break
                pos += n
        finally:
            os.close(fd)
        return True


_WORKER_CODE = "from holoprof.bench.iobench import _worker_main; _worker_main()"


def _worker_main() -> None:
    """Body of one reader process (``--processes``): read the job from stdin, wait for "go", read, report.

    Reader processes are plain ``python -c`` subprocesses (not multiprocessing), so that nothing of
    the calling program is re-imported or forked into them.
    """
    job = json.loads(sys.stdin.readline())
    units = [_Unit(p, o, n) for p, o, n in job["units"]]
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    t0 = time.monotonic()
    tally = _read_units(
        units,
        job["threads"],
        job["block_size"],
        job["prefetch"],
        t0 + job["max_seconds"],
        _Budget(job["max_bytes"]),
    )
    err = tally.error
    report = {
        "end": time.monotonic(),
        "bytes": tally.bytes,
        "reads": tally.reads,
        "files_opened": tally.files_opened,
        "stopped_early": tally.stopped_early,
        "error": None if err is None else str(_read_error(err)),
    }
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # so that a source checkout works too
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _measure(
    units: list[_Unit],
    threads: int,
    processes: int,
    block_size: int,
    prefetch: int,
    max_seconds: float,
    max_bytes: int | None,
) -> tuple[float, _Tally]:
    if processes == 1:
        t0 = time.monotonic()
        tally = _read_units(units, threads, block_size, prefetch, t0 + max_seconds, _Budget(max_bytes))
        seconds = time.monotonic() - t0
        if tally.error is not None:
            raise _read_error(tally.error)
        return seconds, tally
    share = None if max_bytes is None else max(1, max_bytes // processes)
    env = _worker_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(processes)
    ]
    try:
        for i, p in enumerate(procs):
            assert p.stdin is not None
            job = {
                "units": [[u.path, u.offset, u.length] for u in units[i::processes]],
                "threads": threads,
                "block_size": block_size,
                "prefetch": prefetch,
                "max_seconds": max_seconds,
                "max_bytes": share,
            }
            p.stdin.write(json.dumps(job) + "\n")
            p.stdin.flush()
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                _, err = p.communicate(timeout=10)
                raise HoloprofError(f"a reader process did not start: {err.strip()[-500:]}")
        t0 = time.monotonic()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        total = _Tally()
        end = t0
        for p in procs:
            out, err = p.communicate(timeout=max_seconds + 120)
            if p.returncode != 0 or not out.strip():
                raise HoloprofError(f"a reader process failed: {err.strip()[-500:]}")
            report = json.loads(out.strip().splitlines()[-1])
            if report["error"] is not None:
                raise HoloprofError(report["error"])
            end = max(end, report["end"])
            total.bytes += report["bytes"]
            total.reads += report["reads"]
            total.files_opened += report["files_opened"]
            total.stopped_early = total.stopped_early or report["stopped_early"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return end - t0, total


def _read_error(exc: BaseException) -> HoloprofError:
    if isinstance(exc, OSError):
        return HoloprofError(
            f"cannot read {exc.filename!r}: {exc.strerror or exc}; fix or remove it from the dataset"
        )
    return HoloprofError(f"reading the dataset failed: {exc}")


# --------------------------------------------------------------------------------------------------
# the benchmark


def run_iobench(
    path: str | os.PathLike[str],
    *,
    threads: Sequence[int] = DEFAULT_THREADS,
    processes: Sequence[int] = (1,),
    block_sizes: Sequence[int] = (DEFAULT_BLOCK_SIZE,),
    prefetch: Sequence[int] = (DEFAULT_PREFETCH,),
    cache: Cache = "cold",
    max_seconds: float = DEFAULT_MAX_SECONDS,
    max_bytes: int | None = None,
) -> IoBenchResult:
    """Measure every combination of the given settings on the dataset at ``path``."""
    _check_settings(threads, processes, block_sizes, prefetch, cache, max_seconds, max_bytes)
    files = scan_dataset(path)
    total = sum(size for _, size in files)
    warnings: list[str] = []
    can_evict = cache == "cold"
    if cache == "warm":
        # one untimed pass so that every configuration starts from the same (cached) state
        _read_units(
            make_units(files, 1, DEFAULT_BLOCK_SIZE), 1, DEFAULT_BLOCK_SIZE, 0, math.inf, _Budget(max_bytes)
        )
    rows: list[IoBenchRow] = []
    settings = itertools.product(
        sorted(set(block_sizes)), sorted(set(processes)), sorted(set(threads)), sorted(set(prefetch))
    )
    for bs, procs, th, pf in settings:
        row_cache: Cache = "warm"
        resident: float | None = None
        if can_evict:
            row_cache, resident, can_evict = _evict_before_row(files, str(path), warnings)
        elif cache == "warm":
            resident = resident_fraction(files)
        units = make_units(files, th * procs, bs)
        seconds, tally = _measure(units, th, procs, bs, pf, max_seconds, max_bytes)
        rows.append(_row((th, procs, bs, pf), max(seconds, 1e-9), tally, row_cache, resident, total))
    warnings.extend(_closing_warnings(rows, cache, can_evict, total))
    return IoBenchResult(
        path=str(path),
        files=len(files),
        total_bytes=total,
        cache_requested=cache,
        max_seconds=max_seconds,
        max_bytes=max_bytes,
        rows=rows,
        recommendation=recommend(rows),
        warnings=warnings,
    )


def _row(
    setting: tuple[int, int, int, int],
    seconds: float,
    tally: _Tally,
    cache: Cache,
    resident: float | None,
    total: int,
) -> IoBenchRow:
    """The row of one setting (threads, processes, block size, prefetch) read in ``seconds``."""
    th, procs, bs, pf = setting
    return IoBenchRow(
        threads=th,
        processes=procs,
        block_size=bs,
        prefetch=pf,
        bytes=tally.bytes,
        seconds=seconds,
        bandwidth_bytes_per_s=tally.bytes / seconds,
        iops=tally.reads / seconds,
        cache=cache,
        reads=tally.reads,
        files_opened=tally.files_opened,
        complete=not tally.stopped_early and tally.bytes == total,
        resident_fraction=resident,
    )


def _check_settings(
    threads: Sequence[int],
    processes: Sequence[int],
    block_sizes: Sequence[int],
    prefetch: Sequence[int],
    cache: str,
    max_seconds: float,
    max_bytes: int | None,
) -> None:
    """Raise a :class:`HoloprofError` naming the first setting of :func:`run_iobench` out of range."""
    for what, values, minimum in (
        ("threads", threads, 1),
        ("processes", processes, 1),
        ("block-size", block_sizes, 1),
        ("prefetch", prefetch, 0),
    ):
        if not values or any(not isinstance(v, int) or v < minimum for v in values):
            raise HoloprofError(f"bad {what} values {list(values)!r}: use integers of at least {minimum}")
    if not max_seconds > 0:
        raise HoloprofError(f"max-seconds must be positive, got {max_seconds!r}")
    if max_bytes is not None and max_bytes < 1:
        raise HoloprofError(f"max-bytes must be positive, got {max_bytes!r}")
    if cache not in ("cold", "warm"):
        raise HoloprofError(f"cache must be 'cold' or 'warm', got {cache!r}")


def _evict_before_row(
    files: Sequence[tuple[str, int]], path: str, warnings: list[str]
) -> tuple[Cache, float | None, bool]:
    """Evict the dataset before a cold row: (the row's cache state, the share still cached, whether
    eviction works and is worth trying before the next row); says why in ``warnings`` when it does not."""
    why = evict(files)
    resident = resident_fraction(files)
    if why is None and resident is not None and resident > COLD_RESIDENT_MAX:
        why = evict(files, write_back=True)  # recently written (dirty) data
        resident = resident_fraction(files)
    if why is not None:
        warnings.append(f"cannot evict the dataset from the page cache ({why}): warm-cache numbers only")
        return "warm", resident, False
    if resident is not None and resident > COLD_RESIDENT_MAX:
        warnings.append(
            f"evicting the dataset from the page cache left {resident:.0%} of it cached "
            f"(file system {fs_type(path)!r} keeps file data in memory, e.g. tmpfs): "
            "warm-cache numbers only; run on the storage the training job reads from"
        )
        return "warm", resident, False
    return "cold", resident, True


def _closing_warnings(rows: Sequence[IoBenchRow], cache: Cache, can_evict: bool, total: int) -> list[str]:
    """The warnings that hold for the whole table of rows."""
    warnings: list[str] = []
    if cache == "cold" and not can_evict and any(r.cache == "cold" for r in rows):
        warnings.append("some rows are cold and later ones warm: compare rows of the same cache state only")
    if cache == "warm":
        warnings.append("warm cache requested: the numbers show page-cache bandwidth, not the storage's")
    if any(not r.complete for r in rows):
        warnings.append(
            "some configurations stopped at --max-seconds/--max-bytes before reading all data "
            f"({fmt_bytes(total)}); their bandwidth covers the part they read"
        )
    return warnings


def recommend(rows: Sequence[IoBenchRow]) -> Recommendation | None:
    """The smallest reader count within 10% of the best bandwidth, and the settings that go with it."""
    measured = [r for r in rows if r.bytes > 0]
    if not measured:
        return None
    best = max(measured, key=lambda r: r.bandwidth_bytes_per_s)
    by_readers: dict[int, IoBenchRow] = {}
    for r in measured:
        cur = by_readers.get(r.readers)
        if cur is None or r.bandwidth_bytes_per_s > cur.bandwidth_bytes_per_s:
            by_readers[r.readers] = r
    floor = NEAR_BEST * best.bandwidth_bytes_per_s
    readers = min(n for n, r in by_readers.items() if r.bandwidth_bytes_per_s >= floor)
    chosen = by_readers[readers]
    # the smallest prefetch depth within 10% of the best for that reader count and block size
    same = [r for r in measured if r.readers == readers and r.block_size == chosen.block_size]
    top = max(r.bandwidth_bytes_per_s for r in same)
    depth = min(r.prefetch for r in same if r.bandwidth_bytes_per_s >= NEAR_BEST * top)
    prefetch_factor = max(2, math.ceil(depth / readers)) if depth else 2
    if readers == best.readers:
        reason = f"{_readers(readers)} give the best bandwidth, {fmt_rate(best.bandwidth_bytes_per_s)}"
        if readers != min(by_readers):
            fewer = by_readers[max(n for n in by_readers if n < readers)]
            reason += (
                f" ({_readers(fewer.readers)}: {fmt_rate(fewer.bandwidth_bytes_per_s)}, more than 10% less)"
            )
    else:
        reason = (
            f"{_readers(readers)} {'reaches' if readers == 1 else 'reach'} {fmt_rate(chosen.bandwidth_bytes_per_s)}, within 10% of the best "
            f"{fmt_rate(best.bandwidth_bytes_per_s)} ({_readers(best.readers)}); more readers add less than 10%"
        )
    if readers == max(by_readers) and len(by_readers) > 1:
        reason += "; bandwidth was still rising at the largest reader count tested: try more readers"
    if chosen.cache == "warm":
        reason += "; measured with a warm page cache, so storage bandwidth may be lower"
    return Recommendation(
        readers=readers,
        block_size=chosen.block_size,
        prefetch=depth,
        bandwidth_bytes_per_s=chosen.bandwidth_bytes_per_s,
        best_bandwidth_bytes_per_s=best.bandwidth_bytes_per_s,
        best_readers=best.readers,
        dataloader_num_workers=readers,
        dataloader_prefetch_factor=prefetch_factor,
        tf_num_parallel_calls=readers,
        reason=reason,
    )


def _readers(n: int) -> str:
    return f"{n} reader" if n == 1 else f"{n} readers"


def fs_type(path: str) -> str:
    """The file-system type of the mount that holds ``path`` (from /proc/mounts), or 'unknown'."""
    best, kind = "", "unknown"
    target = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1]
                if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


# --------------------------------------------------------------------------------------------------
# renderers


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_rate(bps: float) -> str:
    mbps = bps / 1e6
    return f"{mbps:,.0f} MB/s" if mbps >= 100 else f"{mbps:,.1f} MB/s"


def to_json(result: IoBenchResult) -> dict[str, Any]:
    """The result as a JSON-ready dict (``"schema": "holoprof.iobench/1"``)."""
    rows = []
    for r in result.rows:
        d = asdict(r)
        d["readers"] = r.readers
        rows.append(d)
    return {
        "schema": SCHEMA,
        "path": result.path,
        "files": result.files,
        "total_bytes": result.total_bytes,
        "cache_requested": result.cache_requested,
        "max_seconds": result.max_seconds,
        "max_bytes": result.max_bytes,
        "rows": rows,
        "recommendation": None if result.recommendation is None else asdict(result.recommendation),
        "warnings": list(result.warnings),
        "host": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
    }


# --------------------------------------------------------------------------------------------------
# command line
