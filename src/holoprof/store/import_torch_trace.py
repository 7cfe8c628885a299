"""`holoprof import torch-trace PATH --out DIR`: PyTorch profiler (Kineto) traces into a holoprof run.

``PATH`` is a Chrome-trace JSON file written by ``torch.profiler`` (``export_chrome_trace`` or
``tensorboard_trace_handler``), gzipped or not, or a directory of them (one per rank). Each file is
streamed (``ijson``), never loaded whole, and written as Parquet chunks of bounded size, so traces
larger than memory import.

What becomes what:

* ``ProfilerStep#N`` → a ``step`` span (step N) of that process and thread;
* ``enumerate(DataLoader)#...`` → ``data_wait``; ``Optimizer.step#...`` and ``Optimizer.zero_grad#...``
  → ``optimizer``; the CPU work of autograd (``autograd::engine::evaluate_function: ...`` and the
  backward ops under it) → ``backward``; the remaining top-level CPU ops of the step's thread after
  its data loading (and ``zero_grad``) and before backward starts → ``forward``; the phases of a
  thread nest as in the trace, never overlapping; the split is as good as the trace's annotations (no
  annotations for forward exist in Kineto traces, so forward is what is left between data loading and
  backward);
* collectives (``c10d::``/``record_param_comms`` CPU ops, ``gloo:`` transfers, ``nccl`` kernels) →
  ``comm`` spans;
* every CPU op and GPU kernel → an ``op`` span (attrs: category, device, stream, input shapes);
* ``distributedInfo`` → the process's rank and world size (before or after ``traceEvents``);
* the first Kineto format (PyTorch 1.8/1.9: categories ``Operator``, ``Kernel``, ``Memcpy``,
  ``Runtime``; thread ids as strings, ``"stream 7"`` for GPU rows) reads as today's;
* the device timeline (GPU activities and the launches that correlate with them) → the temporal
  breakdown of Holistic Trace Analysis per rank (idle / compute / non-compute share of the time from
  the first activity to the last), in the manifest's ``source.temporal_breakdown`` and each process's
  ``info``; see :func:`temporal_breakdown`.

``holoprof import`` reads the files in parallel processes (one per core; forked, or spawned for large sets
when forking is unsafe). While streaming, only the current chunk and compact arrays of device
activities are held; the derived phases (forward, backward) are computed by DuckDB over the written
chunks; the final compaction (as for every run) reads one process at a time, in the parent, so that
the workers' peaks do not add up.

The run's status is ``imported``; ``holoprof report`` and the analyses work on it as on any run.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import multiprocessing
import os
import pickle
import re
import stat
import sys
import time
import zlib
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import IO, TYPE_CHECKING, Any, cast

from holoprof.errors import HoloprofError, MissingExtraError
from holoprof.store import limits, rundir, safeio
from holoprof.store.chunks import pyarrow_without_pandas, write_chunk, write_empty_tables
from holoprof.store.compact import compact_run
from holoprof.store.import_darshan import remove_failed_run
from holoprof.store.layout import partition_dir, scan_dir

if TYPE_CHECKING:
    from holoprof.progress import Bar

#: traces smaller than this in all are imported in one process, when workers must be spawned (a spawned
#: worker starts in ~0.5 s) or can be forked (a worker loads its own pyarrow and DuckDB: ~100 MiB)
PARALLEL_MIN_BYTES = 64 * 2**20
FORK_MIN_BYTES = 32 * 2**20
CHUNK_ROWS = 50_000  # rows buffered per process before a Parquet chunk is written
TAIL_BYTES = 1 << 16  # a distributedInfo after the events is looked for in this many last bytes
HOST = "kineto"
I64 = 2**63  # timestamps, ids and step numbers outside (-I64, I64) are not stored (int64 columns)
NOT_A_TRACE = "pass a file written by torch.profiler's export_chrome_trace"


def _trace_files(path: str) -> tuple[list[str], list[str]]:
    """The trace files of ``path`` (a file, or the trace files of a folder), and the names in the folder
    that are skipped, each with why (not a regular file: a FIFO, a device, a folder)."""
    if not os.path.exists(path):
        raise HoloprofError(
            f"{path} does not exist; pass a PyTorch profiler trace (.json / .json.gz) or a folder of them"
        )
    if not os.path.isdir(path):
        return [path], []
    files, skipped = [], []
    for f in sorted(os.listdir(path)):
        if not f.endswith((".json", ".json.gz", ".pt.trace.json")):
            continue
        p = os.path.join(path, f)
        try:
            mode = os.stat(p).st_mode
        except OSError as exc:
            skipped.append(f"{f} ({exc.strerror or exc})")
            continue
        if stat.S_ISREG(mode):
            files.append(p)
        else:
            skipped.append(f"{f} ({safeio.file_kind(mode)}, not a regular file)")
    if not files:
        also = f" (skipped: {', '.join(skipped[:5])})" if skipped else ""
        raise HoloprofError(
            f"{path} holds no .json or .json.gz trace files{also}; pass the profiler's output folder"
        )
    return files, skipped


def _open(path: str, scan: bool = True) -> IO[bytes]:
    """The file's JSON text (gunzipped when it is gzipped), checked against the limits of
    :mod:`holoprof.store.limits` as it is read (with ``scan``, nesting and string length too). Only a
    regular file is read (opened without blocking: a FIFO is refused, see :mod:`safeio`)."""
    try:
        f = safeio.open_regular(path)
    except safeio.NotRegularFile as exc:
        raise HoloprofError(f"cannot read {path} ({exc.strerror}); {NOT_A_TRACE}")
    except OSError as exc:
        raise HoloprofError(f"cannot read {path} ({exc.strerror or exc}); check the path and its permissions")
    try:
        magic = f.read(2)
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        raw = cast(IO[bytes], gzip.GzipFile(fileobj=f, mode="rb")) if magic == b"\x1f\x8b" else f
        return cast(IO[bytes], limits.BoundedJSON(raw, path, size, scan=scan, owner=f))
    except BaseException as exc:
        f.close()
        if isinstance(exc, OSError):
            raise HoloprofError(
                f"cannot read {path} ({exc.strerror or exc}); check the path and its permissions"
            )
        raise


#: What a damaged file raises while it is read: JSON, gzip and zlib errors.
_READ_ERRORS: tuple[type[BaseException], ...] = (EOFError, OSError, ValueError, OverflowError, zlib.error)


def _unreadable(path: str, exc: BaseException) -> HoloprofError:
    first = str(exc).splitlines()[0] if str(exc) else "empty"
    return HoloprofError(
        f"{path} is not a readable PyTorch profiler trace ({type(exc).__name__}: {first[:200]}); {NOT_A_TRACE}"
    )


#: Called with the bytes of the file read so far, every few thousand events, while a file is imported
#: in this process (the progress bar of ``holoprof import torch-trace``); None otherwise.
_on_read: Callable[[int], None] | None = None


def _events(path: str) -> Iterator[dict[str, Any]]:
    """The objects of ``traceEvents``; anything else there refuses the file."""
    import ijson  # lazy: a streaming parser loaded only for a trace being imported

    with _open(path) as f:
        inner = getattr(f, "raw", f)  # the file under the limits' checks
        raw = getattr(inner, "fileobj", None) or inner  # a gzip file's position in the compressed file
        try:
            on_read, done = _on_read, 0
            for i, ev in enumerate(ijson.items(f, "traceEvents.item", use_float=True)):
                if on_read is not None and i % 4096 == 0:
                    at = raw.tell()
                    on_read(at - done)
                    done = at
                if not isinstance(ev, dict):
                    raise HoloprofError(
                        f"{path} is not a PyTorch profiler trace (traceEvents[{i}] is "
                        f"{type(ev).__name__ if ev is not None else 'null'}, not an event object); {NOT_A_TRACE}"
                    )
                yield ev
            if on_read is not None:
                on_read(os.path.getsize(path) - done)
        except (ijson.JSONError, *_READ_ERRORS) as exc:
            raise _unreadable(path, exc)


def _int(v: Any, bound: int = I64) -> int | None:
    """``v`` as an int within (-bound, bound), or None (floats must be whole)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        if not v.is_integer():
            return None
        v = int(v)
    return v if isinstance(v, int) and -bound < v < bound else None


def _header(path: str) -> dict[str, Any]:
    """Top-level fields before traceEvents (Kineto writes them first). A file that is not a JSON
    object with a ``traceEvents`` array is refused here, before anything is written."""
    import ijson  # lazy: a streaming parser loaded only for a trace being imported

    head: dict[str, Any] = {}
    found = False
    with _open(path) as f:
        try:
            for n, (prefix, event, value) in enumerate(ijson.parse(f, use_float=True)):
                if n == 0 and event != "start_map":
                    raise HoloprofError(
                        f"{path} is not a PyTorch profiler trace (its JSON is not an object with traceEvents); "
                        f"{NOT_A_TRACE}"
                    )
                if prefix == "traceEvents":
                    if event != "start_array":
                        raise HoloprofError(
                            f"{path} is not a PyTorch profiler trace (its traceEvents is not a list); {NOT_A_TRACE}"
                        )
                    found = True
                    break
                if prefix in ("baseTimeNanoseconds", "schemaVersion") and event == "number":
                    if _int(value) is not None:
                        head[prefix] = _int(value)
                elif prefix == "distributedInfo.rank" and event == "number":
                    if _int(value, 2**31) is not None:
                        head["rank"] = _int(value, 2**31)
                elif prefix == "distributedInfo.world_size" and event == "number":
                    if _int(value, 2**31) is not None:
                        head["world_size"] = _int(value, 2**31)
                elif prefix == "distributedInfo.backend" and event == "string":
                    head["backend"] = value
        except (ijson.JSONError, *_READ_ERRORS) as exc:
            raise _unreadable(path, exc)
    if not found:
        raise HoloprofError(f"{path} is not a PyTorch profiler trace (it has no traceEvents); {NOT_A_TRACE}")
    if "rank" not in head:
        head.update({k: v for k, v in _trailing_distributed_info(path).items() if k not in head})
    return head


def _trailing_distributed_info(path: str) -> dict[str, Any]:
    """``distributedInfo`` written after ``traceEvents`` (files re-serialized with ``json.dump``, as in
    Holistic Trace Analysis's own test data): looked for in the file's last ``TAIL_BYTES``, without
    parsing the events a second time (a gzipped file is decompressed once more, not parsed)."""
    try:
        with safeio.open_regular(path) as f:
            gzipped = f.read(2) == b"\x1f\x8b"
            if not gzipped:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - TAIL_BYTES))
                tail = f.read()
        if gzipped:
            with _open(path, scan=False) as g:  # the size and ratio limits hold here too
                tail = b""
                while chunk := g.read(1 << 22):
                    tail = (tail + chunk)[-TAIL_BYTES:]
    except limits.LimitError:
        raise
    except (EOFError, OSError, ValueError, OverflowError, zlib.error, HoloprofError):
        return {}
    key = b'"distributedInfo"'
    i = tail.rfind(key)
    j = tail.find(b"{", i + len(key)) if i >= 0 else -1
    if j < 0 or tail[i + len(key) : j].strip() != b":":
        return {}
    try:
        info, _ = json.JSONDecoder().raw_decode(tail[j:].decode("utf-8", "replace"))
    except ValueError:
        return {}
    head: dict[str, Any] = {}
    if isinstance(info, dict):
        for k in ("rank", "world_size"):
            v = _int(info.get(k), 2**31)
            if v is not None:
                head[k] = v
        if isinstance(info.get("backend"), str):
            head["backend"] = info["backend"]
    return head


# Categories of the first Kineto trace format (PyTorch 1.8/1.9), as named since.
_LEGACY_CATS = {
    "Operator": "cpu_op",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Runtime": "cuda_runtime",
}
_TRAILING_INT = re.compile(r"(-?\d+)\s*$")


def _thread_id(v: Any) -> int:
    """A thread id: an int, a string of one (the first format writes ``"24572"``), or the stream of a
    GPU row (``"stream 7"`` in the first format); 0 otherwise."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    m = _TRAILING_INT.search(str(v))
    return int(m.group(1)) if m else 0


def _phase_of(name: str, cat: str) -> str | None:
    if name.startswith("enumerate(DataLoader)"):
        return "data_wait"
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return "optimizer"
    return None


def _is_comm(name: str, cat: str) -> bool:
    n = name.lower()
    return n.startswith(("c10d::", "record_param_comms", "nccl:", "gloo:")) or (
        cat == "kernel" and "nccl" in n
    )


# Kernel classes of Holistic Trace Analysis (hta.utils.utils.get_kernel_type), so that the temporal
# breakdown below is HTA's: communication (NCCL kernels), memory (memcpy/memset/dma), computation (the
# rest, save names that mention Memcpy/Memset/Sync, which HTA counts as "other").
_NCCL_KERNEL = re.compile(r"^nccl.*Kernel")
_MEMORY_KERNEL = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def _is_compute_kernel(name: str) -> bool:
    return not (_NCCL_KERNEL.match(name) or _MEMORY_KERNEL.match(name) or _NOT_COMPUTE.match(name))


def _ns(us: Any) -> int:
    """Kineto's microseconds as integer nanoseconds. Integers exactly: epoch microseconds (the first
    format has no baseTimeNanoseconds) times 1000 are past 2**53, where a float is off by up to
    128 ns. Fractions rounded, not truncated: Kineto writes ns-precision microseconds ("…101.749")
    and 1.001 * 1000 is 1000.999… in binary floating point."""
    if isinstance(us, int) and not isinstance(us, bool):
        return us * 1000
    f = float(us)
    whole = math.floor(f)
    return whole * 1000 + round((f - whole) * 1000)


def _int_arg(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class _Device:
    """The device timeline of one trace, kept compact while streaming (8-byte arrays, no dicts).

    GPU activities are the events with a ``stream`` (kernels, memcpy, memset, syncs on a stream) and a
    ``correlation`` id; launches are the host events carrying a ``correlation`` (cudaLaunchKernel,
    cudaMemcpyAsync, ...). As HTA does, only activities launched before the last ``ProfilerStep``
    starts count (the last step is usually cut short by the profiler).
    """

    def __init__(self) -> None:
        self.start = array("q")
        self.end = array("q")
        self.corr = array("q")
        self.compute = array("b")
        self.launch_corr = array("q")
        self.launch_ts = array("q")

    def add(self, ev: dict[str, Any], cat: str, name: str, s: int, e: int) -> None:
        args = ev.get("args")
        if not isinstance(args, dict) or cat in ("gpu_user_annotation", "python_function"):
            return
        corr = _int_arg(args.get("correlation"))
        if corr is None:
            return
        stream = _int_arg(args.get("stream"))
        if stream is not None and stream >= 0:
            if corr >= 0:
                self.start.append(s)
                self.end.append(e)
                self.corr.append(corr)
                self.compute.append(1 if _is_compute_kernel(name) else 0)
        else:
            self.launch_corr.append(corr)
            self.launch_ts.append(s)

    def temporal_breakdown(self, last_step_start_ns: int | None) -> dict[str, float] | None:
        """HTA's temporal breakdown: the span from the first activity's start to the last one's end,
        split into idle (no activity), compute (a computation kernel runs) and non-compute (only
        communication, memory or other activities run)."""
        if not self.start:
            return None
        import duckdb  # lazy: DuckDB loads only where a run is queried
        import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module

        def col(a: array[int], t: pa.DataType) -> pa.Array:
            return pa.Array.from_buffers(t, len(a), [None, pa.py_buffer(a)])

        gpu = pa.table(  # noqa: F841 (read by DuckDB by name)
            {
                "s": col(self.start, pa.int64()),
                "e": col(self.end, pa.int64()),
                "corr": col(self.corr, pa.int64()),
                "compute": col(self.compute, pa.int8()),
            }
        )
        launch = pa.table(  # noqa: F841
            {"corr": col(self.launch_corr, pa.int64()), "ts": col(self.launch_ts, pa.int64())}
        )
        keep = (
            "corr IN (SELECT corr FROM launch WHERE ts < $last)" if last_step_start_ns is not None else "TRUE"
        )
        # merged intervals: a new one starts where an activity starts after every earlier one ended
        sql = f"""
            WITH k AS (SELECT s, e, compute FROM gpu WHERE {keep}),
            m AS (SELECT s, e, compute, max(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING
                         AND 1 PRECEDING) AS prev FROM k),
            mc AS (SELECT s, e, max(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING
                          AND 1 PRECEDING) AS prev FROM k WHERE compute = 1),
            g AS (SELECT s, e, sum(CASE WHEN prev IS NULL OR s > prev THEN 1 ELSE 0 END)
                         OVER (ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp FROM m),
            gc AS (SELECT s, e, sum(CASE WHEN prev IS NULL OR s > prev THEN 1 ELSE 0 END)
                          OVER (ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp FROM mc),
            busy AS (SELECT min(s) AS a, max(e) AS b FROM g GROUP BY grp),
            comp AS (SELECT min(s) AS a, max(e) AS b FROM gc GROUP BY grp)
            SELECT (SELECT max(b) - min(a) FROM busy), (SELECT sum(b - a) FROM busy),
                   (SELECT coalesce(sum(b - a), 0) FROM comp), (SELECT count(*) FROM k)"""
        con = duckdb.connect()
        params = {"last": last_step_start_ns} if last_step_start_ns is not None else {}
        row = con.execute(sql, params).fetchone()
        con.close()
        if row is None or not row[3]:
            return None
        span, busy, comp, count = (int(x or 0) for x in row)
        idle = span - busy
        non_compute = span - comp - idle
        frac = (lambda x: x / span) if span > 0 else (lambda x: 0.0)
        return {
            "kernel_time_s": span / 1e9,
            "idle_s": idle / 1e9,
            "compute_s": comp / 1e9,
            "non_compute_s": non_compute / 1e9,
            "idle_fraction": frac(idle),
            "compute_fraction": frac(comp),
            "non_compute_fraction": frac(non_compute),
            "activities": count,
        }


class _Writer:
    """Buffers rows of one process and writes Parquet chunks of bounded size into the run."""

    def __init__(self, run_dir: str, base: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.base = base
        self.rows: list[tuple[Any, ...]] = []
        self.seq = 0
        self.ids = 0
        self.total = 0

    def add(
        self, tid: int, kind: str, name: str, s: int, e: int, step: int, attrs: dict[str, Any] | None
    ) -> None:
        self.ids += 1
        self.rows.append(
            (tid, self.ids, 0, kind, name, s, e, step, None if attrs is None else json.dumps(attrs))
        )
        if len(self.rows) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:

        if not self.rows:
            return
        n = len(self.rows)
        self.rows.sort(key=lambda r: r[5])  # by start: chunks sorted in time prune well on read
        cols = list(zip(*self.rows, strict=True))
        names = ("tid", "span_id", "parent_id", "kind", "name", "start_ns", "end_ns", "step", "attrs")
        data: dict[str, list[Any]] = {k: [v] * n for k, v in self.base.items()}
        data.update({k: list(c) for k, c in zip(names, cols, strict=True)})
        write_chunk(self.run_dir, "spans", data, seq=self.seq)
        self.seq += 1
        self.total += n
        self.rows = []


def import_torch_trace(
    path: str, out: str | None = None, jobs: int | None = 1, bar: Bar | None = None
) -> str:
    """Import one trace file or a folder of per-rank traces into a new run directory.

    ``jobs`` files are imported at a time, in worker processes when more than one. ``None`` (the command
    line) picks one per CPU core, at most one per file, for files of ``FORK_MIN_BYTES`` or more in all
    when the workers can be forked (this process has a single thread, on Linux), or of
    ``PARALLEL_MIN_BYTES`` when they must be spawned; else one. The default is 1: unless forking is
    safe the workers are spawned, which re-imports the caller's main module (a script without
    ``if __name__ == "__main__"`` would rerun). ``bar`` (a progress bar that starts no thread)
    counts the bytes of the files read when they are imported here, one at a time.
    """
    try:
        import ijson  # noqa: F401  lazy: checks the optional parser is there before any work
    except ImportError:
        raise MissingExtraError("importing PyTorch profiler traces", "torch", "ijson")

    files, skipped = _trace_files(path)
    heads = [_header(f) for f in files]
    name = os.path.basename(os.path.normpath(path)).split(".")[0] or "torch-trace"
    target = os.path.abspath(out or rundir.default_run_dir(name))
    existed = os.path.isdir(target)
    run_dir = rundir.create_run_dir(target)
    try:
        at = safeio.utf8_path(run_dir)  # where pyarrow and DuckDB write and read its chunks
        tasks = [
            (at, f, head, idx, len(files)) for idx, (f, head) in enumerate(zip(files, heads, strict=True))
        ]
        t_min, t_max, breakdowns = _totals(_import_files(tasks, files, jobs, bar), path)
        compact_run(run_dir)
        write_empty_tables(run_dir)
        manifest = rundir.new_manifest([f"torch-trace {path}"], name, {})
        manifest.update(
            status="imported",
            start_ns=t_min,
            end_ns=t_max,
            exit_code=0,
            launcher_pid=-1,
            source={
                "format": "torch-trace",
                "path": os.path.abspath(path),
                "files": len(files),
                "skipped": skipped,
                "temporal_breakdown": breakdowns,
            },
        )
        rundir.write_manifest(run_dir, manifest)
    except BaseException:  # a failed import leaves no run behind
        remove_failed_run(run_dir, keep_dir=existed)
        raise
    return run_dir


def _totals(results: list[_Result], path: str) -> tuple[int, int, list[dict[str, Any]]]:
    """(first start, last end, temporal breakdowns) of the imported files; refuses a trace with no event."""
    spans = [(a, b) for a, b, _ in results if a is not None]
    t_min = min((a for a, _ in spans), default=0)
    t_max = max((b for _, b in spans), default=0)
    breakdowns = [b for _, _, b in results if b is not None]
    if not spans:
        raise HoloprofError(
            f'{path} holds no trace events (no complete "X" events in traceEvents); nothing to import — '
            f"{NOT_A_TRACE}"
        )
    return t_min, t_max, breakdowns


def _import_files(
    tasks: list[tuple[Any, ...]], files: list[str], jobs: int | None, bar: Bar | None
) -> list[_Result]:
    """``_import_file(*task)`` for every task: here, in forked children or in spawned workers (see
    :func:`import_torch_trace` for ``jobs``); the results in the order of ``tasks``."""
    global _on_read
    fork = _single_threaded()
    if jobs is None:
        size = sum(os.path.getsize(f) for f in files)
        big = size >= (FORK_MIN_BYTES if fork else PARALLEL_MIN_BYTES)
        jobs = (os.cpu_count() or 1) if big else 1
    jobs = max(1, min(jobs, len(files)))
    if jobs == 1:
        if bar is not None and bar.active:
            bar.add_total(sum(os.path.getsize(f) for f in files))
            _on_read = bar.advance
        try:
            return [_import_file(*t) for t in tasks]
        finally:
            _on_read = None
    if fork:
        return _in_forks(tasks, jobs)
    # the standard library's process pool, and the store's pyarrow set-up: only when workers are spawned

    spawn = multiprocessing.get_context("spawn")  # the caller holds threads: fork could copy a held lock
    with ProcessPoolExecutor(jobs, mp_context=spawn, initializer=pyarrow_without_pandas) as pool:
        return list(pool.map(_import_file, *zip(*tasks, strict=True)))


def _single_threaded() -> bool:
    """This process has one thread, native ones included (Linux only; False where it cannot tell)."""
    try:
        return sys.platform == "linux" and len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


_Result = tuple[int | None, int, dict[str, Any] | None]


def _in_forks(tasks: list[tuple[Any, ...]], jobs: int) -> list[_Result]:
    """``_import_file(*task)`` for every task in ``jobs`` forked children (largest files first, each to
    the least loaded child); the results in the order of ``tasks``. Call only with a single thread."""

    groups: list[list[int]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    for i in sorted(range(len(tasks)), key=lambda i: -os.path.getsize(tasks[i][1])):
        k = load.index(min(load))
        groups[k].append(i)
        load[k] += os.path.getsize(tasks[i][1])
    sys.stdout.flush()
    sys.stderr.flush()
    children = []
    for group in groups:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: import, send the results or the error, leave without cleanup
            os.close(r)
            try:
                payload: Any = ("ok", [(i, _import_file(*tasks[i])) for i in group])
            except HoloprofError as exc:
                payload = ("holoprof", str(exc))
            except BaseException as exc:
                payload = ("error", f"{type(exc).__name__}: {exc}")
            try:
                with os.fdopen(w, "wb") as out:
                    out.write(pickle.dumps(payload))
            finally:
                os._exit(0)
        os.close(w)
        children.append((pid, r, group))
    results: list[_Result | None] = [None] * len(tasks)
    failure: tuple[str, str] | None = None
    for pid, r, group in children:
        with os.fdopen(r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        if not data:
            what = ", ".join(os.path.basename(tasks[i][1]) for i in group)
            failure = failure or ("error", f"the worker importing {what} died (wait status {status})")
            continue
        kind, value = pickle.loads(data)
        if kind != "ok":
            failure = failure or (kind, value)
            continue
        for i, res in value:
            results[i] = res
    if failure is not None:
        if failure[0] == "holoprof":
            raise HoloprofError(failure[1])
        raise RuntimeError(failure[1])
    return [r for r in results if r is not None]


def _import_file(run_dir: str, f: str, head: dict[str, Any], idx: int, nfiles: int) -> _Result:
    """One trace file into one process of the run; returns (first start, last end, temporal breakdown)."""
    trace = _TraceFile(run_dir, head, idx, nfiles)
    for ev in _events(f):
        trace.add(ev)
    return trace.finish(f)


_OP_CATS = ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "python_function")


class _TraceFile:
    """The import of one trace file, event by event: spans written as they come, the phases whose step
    is known only at the end kept until then, and the device timeline kept compact."""

    def __init__(self, run_dir: str, head: dict[str, Any], idx: int, nfiles: int) -> None:
        self.run_dir = run_dir
        self.head = head
        self.rank = int(head.get("rank", idx if nfiles > 1 else -1))
        self.world = int(head.get("world_size", nfiles if nfiles > 1 else -1))
        self.base_ns = int(head.get("baseTimeNanoseconds", 0))
        self.pid_main: int | None = None
        self.folder: str | None = None
        self.writer: _Writer | None = None
        self.t_min: int | None = None
        self.t_max = 0
        self.step_starts: dict[int, int] = {}
        self.steps: dict[int, list[tuple[int, int, int]]] = {}  # tid -> [(start, end, step)]
        self.pending: list[
            tuple[int, str, int, int, str]
        ] = []  # data_wait/optimizer phases, step unknown yet
        self.device = _Device()

    def add(self, ev: dict[str, Any]) -> None:
        """One trace event: complete ("X") events become spans, phases or device activities."""
        if ev.get("ph") != "X":
            return
        name = str(ev.get("name", ""))
        cat = str(ev.get("cat", ""))
        cat = _LEGACY_CATS.get(cat, cat)
        try:
            s = _ns(ev["ts"]) + self.base_ns
            e = s + _ns(ev.get("dur", 0))
        except (KeyError, TypeError, ValueError, OverflowError):
            return
        if not (-I64 < s < I64 and -I64 < e < I64):
            return
        pid = _int(_thread_id(ev.get("pid", 0))) or 0
        tid = _int(_thread_id(ev.get("tid", 0))) or 0
        writer = self.writer if self.writer is not None else self._open(pid)
        self.t_min = s if self.t_min is None else min(self.t_min, s)
        self.t_max = max(self.t_max, e)
        if name.startswith("ProfilerStep#"):
            self._step(writer, tid, name, s, e)
            return
        phase = _phase_of(name, cat)
        if phase is not None:
            self.pending.append((tid, phase, s, e, name.split("#")[0]))
            return
        if cat not in ("cpu_op", "user_annotation", "python_function"):
            self.device.add(ev, cat, name, s, e)
        if cat == "user_annotation" and name.startswith("gloo:"):
            # gloo's worker thread: the time the collective's data really took to move
            writer.add(tid, "comm", name, s, e, -1, {"cat": cat})
            return
        if cat in _OP_CATS:
            writer.add(tid, "comm" if _is_comm(name, cat) else "op", name, s, e, -1, _op_attrs(ev, cat))

    def _open(self, pid: int) -> _Writer:
        """The writer of this file's process, made at its first event (whose ``pid`` names it when the
        trace has no rank)."""
        # the store's layout (pyarrow): loaded only when a trace is imported

        rank = self.rank
        self.pid_main = pid
        self.folder = partition_dir(self.run_dir, "spans", HOST, rank if rank >= 0 else pid)
        self.writer = _Writer(self.run_dir, {"host": HOST, "pid": rank if rank >= 0 else pid, "rank": rank})
        return self.writer

    def _step(self, writer: _Writer, tid: int, name: str, s: int, e: int) -> None:
        """A ``ProfilerStep#N`` event: the step span N of its thread."""
        try:
            n = int(name.split("#", 1)[1])
        except ValueError:
            return
        if not -I64 < n < I64:
            return
        self.step_starts[n] = s
        self.steps.setdefault(tid, []).append((s, e, n))
        writer.add(tid, "step", "step", s, e, n, None)

    def finish(self, f: str) -> _Result:
        """Write the pending and derived phases and the process row: (first start, last end, breakdown)."""
        writer, folder = self.writer, self.folder
        if writer is None or folder is None:
            return None, 0, None
        self._write_pending(writer)
        writer.flush()
        for tid, phase, a, b, n, how in _derived_phases(folder):
            writer.add(tid, "phase", phase, a, b, n, {"derived": how})
        writer.flush()
        step_starts = self.step_starts
        breakdown = self.device.temporal_breakdown(
            max(step_starts.values()) if len(step_starts) >= 2 else None
        )
        del self.device
        _write_process(
            self.run_dir,
            f,
            self.head,
            self.rank,
            self.world,
            self.pid_main,
            self.t_min,
            self.t_max,
            breakdown,
        )
        return self.t_min, self.t_max, None if breakdown is None else {"rank": self.rank, **breakdown}

    def _write_pending(self, writer: _Writer) -> None:
        """The phases kept until the end: each belongs to the step of its thread that started last
        before it, if it starts in it."""
        steps = self.steps
        for tid_steps in steps.values():
            tid_steps.sort()
        for tid, phase, a, b, source in self.pending:
            tid_steps = steps.get(tid, [])
            i = bisect.bisect_right(tid_steps, (a, 2**63, 2**63)) - 1
            n = tid_steps[i][2] if i >= 0 and a < tid_steps[i][1] else -1
            writer.add(tid, "phase", phase, a, b, n, {"source": source})


def _op_attrs(ev: dict[str, Any], cat: str) -> dict[str, Any]:
    """An op span's attributes: its category, and its device and stream (kernels) or input shapes."""
    args = ev.get("args")
    args = args if isinstance(args, dict) else {}
    attrs: dict[str, Any] = {"cat": cat}
    if cat == "kernel":
        attrs["device"] = args.get("device")
        attrs["stream"] = args.get("stream")
    elif "Input Dims" in args:
        attrs["shapes"] = args.get("Input Dims")
    return attrs


def _write_process(
    run_dir: str,
    f: str,
    head: dict[str, Any],
    rank: int,
    world: int,
    pid_main: int | None,
    t_min: int | None,
    t_max: int,
    breakdown: dict[str, float] | None,
) -> None:
    """The ``processes`` row of the process that trace file ``f`` became."""
    # the store's chunk writer (pyarrow): loaded only when a trace is imported

    now = time.time_ns()
    write_chunk(
        run_dir,
        "processes",
        {
            "host": [HOST],
            "pid": [rank if rank >= 0 else (pid_main or 0)],
            "rank": [rank],
            "ppid": [-1],
            "local_rank": [-1],
            "world_size": [world],
            "role": ["rank" if rank >= 0 else "main"],
            "argv": [json.dumps([os.path.basename(f)])],
            "exe": [""],
            "start_ns": [t_min or 0],
            "end_ns": [t_max],
            "exit_code": [0],
            "updated_ns": [now],
            "clock_offset_ns": [0],
            "versions": ["{}"],
            "dropped_events": [0],
            "errors": ["[]"],
            "info": [
                json.dumps(
                    {
                        "source": "agent",
                        "imported": "torch-trace",
                        "file": f,
                        "backend": head.get("backend"),
                        "temporal_breakdown": breakdown,
                    }
                )
            ],
        },
        seq=10**7,
    )


def _span_parts(folder: str) -> str:

    found = scan_dir(folder, "spans").get("spans")
    parts = [p for _, p in sorted(found.parts)] if found else []
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in parts) + "]" if parts else ""


def _derived_phases(folder: str) -> list[tuple[int, str, int, int, int, str]]:
    """Backward and forward of each step, from the ops of the step's thread (one DuckDB pass):
    backward spans the autograd work (``autograd::engine::evaluate_function``; in the first Kineto
    format, which has no such wrapper, the grad_fn ops ``*Backward*`` and ``AccumulateGrad``) that starts or ends in
    the step, on the step's thread or on a thread with no steps (CUDA backward runs on autograd's
    device thread); forward spans the other CPU ops of the step that start after its data loading (and
    zero_grad) and end before backward starts: the phases of one thread never overlap."""
    import duckdb  # lazy: DuckDB loads only where a run is queried

    lst = _span_parts(folder)
    if not lst:
        return []
    con = duckdb.connect()
    rows = con.sql(
        f"""WITH s AS (SELECT tid, kind, name, step, start_ns, end_ns, attrs FROM read_parquet({lst})
                       WHERE kind IN ('step', 'op', 'comm', 'phase')),
            st AS (SELECT tid, step AS n, start_ns AS a, end_ns AS b FROM s WHERE kind = 'step'),
            ag AS (SELECT tid, start_ns, end_ns FROM s
                   WHERE kind = 'op' AND (name LIKE 'autograd::engine::evaluate_function%'
                     -- the first Kineto format (PyTorch 1.8/1.9) has no evaluate_function wrapper:
                     -- its autograd nodes are the grad_fn ops themselves (MmBackward, AccumulateGrad)
                     OR ((name LIKE '%Backward%' OR name = 'torch::autograd::AccumulateGrad')
                         AND NOT EXISTS (SELECT 1 FROM s WHERE kind = 'op'
                                         AND name LIKE 'autograd::engine::evaluate_function%')))),
            bw AS (SELECT st.tid, st.n, st.a,
                          min(ag.start_ns) FILTER (WHERE ag.start_ns >= st.a AND ag.start_ns < st.b) AS b0,
                          max(ag.end_ns) FILTER (WHERE ag.end_ns > st.a AND ag.end_ns <= st.b) AS b1
                   -- autograd runs on the step's thread (CPU) or on its own device thread (CUDA)
                   FROM st JOIN ag ON (ag.tid = st.tid OR ag.tid NOT IN (SELECT tid FROM st))
                                  AND ag.start_ns <= st.b AND ag.end_ns >= st.a
                   GROUP BY ALL HAVING b0 IS NOT NULL AND b1 IS NOT NULL),
            -- forward starts after the step's last data_wait or optimizer phase (zero_grad) that ends
            -- before backward: the ops under those annotations (a collate's aten::stack) are theirs
            pre AS (SELECT bw.tid, bw.n, max(p.end_ns) AS p1
                    FROM bw JOIN s p ON p.tid = bw.tid AND p.kind = 'phase'
                                    AND p.end_ns > bw.a AND p.end_ns <= bw.b0
                    GROUP BY ALL),
            -- attrs are written with "cat" first: '{{"cat": "cpu_op"...' marks CPU ops
            fw AS (SELECT bw.tid, bw.n, min(o.start_ns) AS f0, max(o.end_ns) AS f1
                   FROM bw LEFT JOIN pre ON pre.tid = bw.tid AND pre.n = bw.n
                   JOIN s o ON o.tid = bw.tid AND o.start_ns >= greatest(bw.a, coalesce(pre.p1, bw.a))
                           AND o.end_ns <= bw.b0
                   WHERE o.kind IN ('op', 'comm') AND o.attrs LIKE '{{"cat": "cpu_op"%'
                     AND o.name NOT LIKE 'autograd::engine::evaluate_function%'
                     AND o.name NOT LIKE 'Optimizer%'
                   GROUP BY ALL)
            SELECT tid, 'backward', b0, b1, n, 'autograd span' FROM bw
            UNION ALL SELECT tid, 'forward', f0, f1, n, 'ops before backward' FROM fw"""
    ).fetchall()
    con.close()
    return [(int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), str(r[5])) for r in rows]


def temporal_breakdown(run_dir: str) -> list[dict[str, Any]]:
    """The device temporal breakdown of an imported trace, per rank (empty without GPU activity):
    ``rank``, ``kernel_time_s`` (first activity's start to last one's end), ``idle_s``, ``compute_s``,
    ``non_compute_s`` and their ``*_fraction`` of ``kernel_time_s``, as Holistic Trace Analysis's
    ``get_temporal_breakdown`` defines them."""

    source = rundir.read_manifest(run_dir).get("source") or {}
    return list(source.get("temporal_breakdown") or [])


def skipped_files(run_dir: str) -> list[str]:
    """The files of the imported folder that were skipped (not regular files), each with why."""
    source = rundir.read_manifest(run_dir).get("source") or {}
    return [str(s) for s in source.get("skipped") or []]
