"""`holoprof import`: turn another tool's trace into a holoprof run directory.

``holoprof import darshan LOG --out DIR`` reads a Darshan log with PyDarshan (the ``darshan`` extra)
into the same tables that ``holoprof run`` writes, so that ``holoprof report`` and the analyses work
on it unchanged:

* ``manifest.json`` — status ``imported``, ``command`` = the job's executable line from the log,
  start and end from the job record, ``source`` = {format, log, jobid, nprocs, log_version};
* ``processes`` — one row per MPI rank (``host`` "darshan", ``pid`` = rank, role ``rank``);
* ``io_files`` — one row per record of every module that has counters (POSIX, STDIO, MPI-IO, H5F, H5D,
  PNETCDF_FILE, PNETCDF_VAR, and the others PyDarshan reads), ``module`` = Darshan's module name,
  ``layer`` "darshan", the counters under Darshan's own names; LUSTRE records give their striping
  (``LUSTRE_COMP<i>_*``, OST ids); records shared by all ranks (Darshan's rank -1) have ``pid`` -1;
* ``io_ops`` — the DXT_POSIX and DXT_MPIIO segments when the log has them (module POSIX / MPI-IO).

A module holoprof has no table for (APMPI, APXC, HEATMAP) is named in the notes printed at the end
and in the manifest's ``source.not_imported``. The log is parsed in a child process (see
:func:`parse_log`): a damaged log is one line and exit status 2, never a crash, and the run directory
is written only once the whole log has been read.

Importers are registered in :data:`IMPORTERS` (format -> module, help); each module provides
``add_import_arguments(parser)`` and ``run_import(args) -> int``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pickle
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from holoprof.errors import HoloprofError, MissingExtraError
from holoprof.store import limits, rundir, safeio
from holoprof.store.chunks import write_chunk, write_empty_tables

HOST = "darshan"
#: the partition the import writes every rank's rows into (the ranks are pids 0 to N-1)
IMPORTER_PID = -1
#: DXT modules -> the module their segments are operations of (``io_ops.module``)
DXT_MODULES = {"DXT_POSIX": "POSIX", "DXT_MPIIO": "MPI-IO"}
#: module -> the prefix of its counter names, where the two differ
COUNTER_PREFIX = {"MPI-IO": "MPIIO"}
NS = 1_000_000_000


# --- reading the log (in a child process) ----------------------------------------------------------
def _check_path(log: str) -> str:
    path = os.path.abspath(log)
    if not os.path.exists(path):
        raise HoloprofError(f"Darshan log not found: {log}; check the path")
    if not os.path.isfile(path):
        raise HoloprofError(f"{log} is not a file; pass a Darshan log file (.darshan)")
    try:
        with safeio.open_regular(path) as f:
            f.read(1)
            size = os.fstat(f.fileno()).st_size
    except safeio.NotRegularFile:
        raise HoloprofError(f"{log} is not a file; pass a Darshan log file (.darshan)")
    except OSError as exc:
        raise HoloprofError(f"cannot read {log} ({exc.strerror or exc}); check its permissions")
    if size > limits.value(limits.INPUT_BYTES):
        raise limits.exceeded(log, f"a log of {size:,} bytes", limits.INPUT_BYTES)
    return path


def parse_log(log: str) -> dict[str, Any]:
    """The log's tables and manifest fields (see :func:`convert`), read by PyDarshan in a child process.

    The Darshan C library reads logs without checks of its own: a truncated or damaged log can make it
    abort or crash (SIGSEGV), or stop reading a module early with only a message on its stderr. The
    child runs under the memory and time limits of :mod:`holoprof.store.limits`; its crash, a limit
    crossed, or any error the library printed is a HoloprofError here, naming the log.
    """

    path = _check_path(log)
    if importlib.util.find_spec("darshan") is None:  # looked up, not imported: the child imports it
        raise MissingExtraError("importing Darshan logs", "darshan", "darshan")
    seconds = limits.value(limits.PARSER_SECONDS)
    memory = limits.value(limits.PARSER_BYTES)
    with tempfile.TemporaryDirectory(prefix="holoprof-darshan-") as tmp:
        result = os.path.join(tmp, "result.pickle")
        errors = os.path.join(tmp, "stderr.txt")
        # the child imports this very holoprof, installed or not
        home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        pythonpath = os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": pythonpath, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        code = "from holoprof.store.import_darshan import _child; _child()"
        with open(errors, "wb") as err:
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", code, path, result, str(memory)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                    timeout=seconds,
                )
            except subprocess.TimeoutExpired:
                raise limits.exceeded(log, f"parsing took more than {seconds} s", limits.PARSER_SECONDS)
        with open(errors, "rb") as f:
            said = [
                ln.strip() for ln in f.read(1 << 16).decode("utf-8", "replace").splitlines() if ln.strip()
            ]
        library = [ln for ln in said if ln.startswith("Error:") or "darshan-logutils" in ln]
        outcome: tuple[str, Any] | None = None
        if proc.returncode == 0 and os.path.exists(result):
            with open(result, "rb") as f:
                outcome = pickle.load(f)  # written by our own child just now
    if outcome is not None and outcome[0] == "error":
        raise HoloprofError(str(outcome[1]))
    said_most = next((ln for ln in library if "failed" in ln), library[0]) if library else ""
    why = f" (the Darshan library said: {said_most.removeprefix('Error: ').rstrip('.')})" if library else ""
    if outcome is None:
        # the child's peak (KiB on Linux) near its limit: it may have died of the limit, not of the log
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        if peak >= memory // 2:
            why += f"; it may have run out of the {memory:,} bytes allowed ({limits.PARSER_BYTES.env})"
        if proc.returncode < 0:
            try:
                how = f"crashed with {signal.Signals(-proc.returncode).name}"
            except ValueError:
                how = f"died of signal {-proc.returncode}"
        else:
            how = f"exited with status {proc.returncode}"
        raise HoloprofError(
            f"{log} is damaged or truncated: the Darshan parser {how}{why}; nothing was imported — pass "
            "an intact .darshan file written by Darshan 3.x"
        )
    if library:
        raise HoloprofError(
            f"{log} is damaged or truncated{why}; nothing was imported — pass an intact .darshan file "
            "written by Darshan 3.x"
        )
    return dict(outcome[1])


def _child() -> None:
    """The child process of :func:`parse_log`: ``argv`` = log, result file, memory limit (bytes)."""

    path, result, memory = sys.argv[1], sys.argv[2], int(sys.argv[3])
    payload: tuple[str, Any]
    try:
        import darshan  # noqa: F401  lazy: the libraries load before the limit, which bounds the parse

        try:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        except (ValueError, OSError):
            pass
        payload = ("ok", convert(read_log(path), path))
    except (MemoryError, HoloprofError, Exception) as exc:
        # under the limit, the C library's failed allocations surface as any error ("Failed to open
        # file."): an address space near the limit says which it was
        if isinstance(exc, MemoryError) or _address_space() >= memory // 2:
            payload = (
                "error",
                str(limits.exceeded(path, "parsing needs more memory", limits.PARSER_BYTES, memory)),
            )
        elif isinstance(exc, HoloprofError):
            payload = ("error", str(exc))
        else:
            payload = ("error", f"{path} is not a readable Darshan log ({type(exc).__name__}: {exc})")
    with open(result, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)


def _address_space() -> int:
    """This process's virtual memory size in bytes (0 where /proc cannot tell)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def read_log(log: str) -> Any:
    """A PyDarshan report with every module read; HoloprofError when the file is not a Darshan log.
    The Darshan C library may crash on a damaged log: call this in a child process (see
    :func:`parse_log`)."""
    import darshan  # lazy: the optional darshan extra, in the parsing child only

    try:
        return darshan.DarshanReport(safeio.utf8_path(log), read_all=True)  # the library takes UTF-8 names
    except Exception as exc:
        raise HoloprofError(
            f"{log} is not a readable Darshan log ({type(exc).__name__}: {exc}); pass a .darshan file "
            "written by Darshan 3.x"
        )


def _records(report: Any, module: str) -> list[dict[str, Any]]:
    coll = report.records.get(module)
    if coll is None:
        return []
    return list(coll.to_numpy())


def _segments(segs: Any) -> list[dict[str, Any]]:
    if hasattr(segs, "to_dict"):  # a pandas DataFrame in some PyDarshan versions
        return list(segs.to_dict("records"))
    return list(segs or [])


def _lustre_counters(rec: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """A LUSTRE record's striping as darshan-parser names it: ``LUSTRE_COMP<i>_<COUNTER>`` and
    ``LUSTRE_COMP<i>_OST_ID_<k>`` per layout component (from 1), and ``LUSTRE_NUM_COMPONENTS``."""
    comps = list(rec.get("components") or [])
    out: dict[str, Any] = {"LUSTRE_NUM_COMPONENTS": len(comps)}
    for i, comp in enumerate(comps, 1):
        for n, v in zip(names, comp.get("counters", []), strict=False):
            out[n.replace("LUSTRE_COMP_", f"LUSTRE_COMP{i}_", 1)] = int(v)
        for k, ost in enumerate(comp.get("ost_ids", [])):
            out[f"LUSTRE_COMP{i}_OST_ID_{k}"] = int(ost)
    return out


def convert(report: Any, log_path: str) -> dict[str, Any]:
    """The tables of a holoprof run (column lists), the manifest fields, and the notes to print, from a
    PyDarshan report.

    Every module whose records carry counters becomes ``io_files`` rows under its own name (POSIX,
    STDIO, MPI-IO, H5F, H5D, PNETCDF_FILE, PNETCDF_VAR, DFS, DAOS, ...), LUSTRE records their striping,
    DXT_POSIX and DXT_MPIIO segments ``io_ops``; any other module is named in the notes as not imported.
    """
    meta = report.metadata
    job = meta.get("job", {})
    start_ns, end_ns = _job_times(job)
    nprocs = int(job.get("nprocs", 1) or 1)
    argv = _command(meta)
    names = report.name_records
    io_files: dict[str, list[Any]] = {
        k: [] for k in ("host", "pid", "rank", "ts_ns", "module", "layer", "path", "counters")
    }
    io_ops: dict[str, list[Any]] = {
        k: []
        for k in ("host", "pid", "rank", "module", "path", "op", "offset", "size_bytes", "start_ns", "end_ns")
    }
    imported_modules: dict[str, int] = {}
    for module in report.records:
        records = _records(report, module)
        if module in DXT_MODULES:
            _add_segments(io_ops, names, records, DXT_MODULES[module], start_ns)
            imported_modules[module] = len(records)
            continue
        rows = _counter_rows(report, module, records)
        if rows is None:
            continue  # no counters: named below as not imported
        _add_counters(io_files, names, rows, module, end_ns)
        imported_modules[module] = len(rows)
    notes, not_imported = _module_notes(report, imported_modules)
    return {
        "tables": {
            "io_files": io_files,
            "io_ops": io_ops,
            "processes": _processes(job, nprocs, argv, start_ns, end_ns, log_path),
        },
        "command": argv,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "notes": notes,
        "source": {
            "format": "darshan",
            "log": log_path,
            "jobid": job.get("jobid"),
            "nprocs": nprocs,
            "log_version": job.get("log_ver"),
            "modules": sorted(report.modules.keys()),
            "imported_records": imported_modules,
            "not_imported": not_imported,
        },
    }


def _job_times(job: dict[str, Any]) -> tuple[int, int]:
    """(start, end) of the job in ns since the epoch; the end from the run time when the record has none."""
    start_ns = int(job.get("start_time_sec", 0)) * NS + int(job.get("start_time_nsec", 0) or 0)
    end_ns = int(job.get("end_time_sec", 0)) * NS + int(job.get("end_time_nsec", 0) or 0)
    if end_ns <= start_ns:
        end_ns = start_ns + int(float(job.get("run_time", 0) or 0) * NS)
    return start_ns, end_ns


def _command(meta: dict[str, Any]) -> list[str]:
    """The job's command line, from the executable line of the log."""
    exe = str(meta.get("exe") or "").strip()
    try:
        return shlex.split(exe) if exe else []
    except ValueError:
        return exe.split()


def _name_of(names: Any, rec: dict[str, Any]) -> str:
    return str(names.get(rec["id"], f"<unknown record {rec['id']}>"))


def _add_segments(
    io_ops: dict[str, list[Any]], names: Any, records: list[dict[str, Any]], module: str, start_ns: int
) -> None:
    """The read and write segments of DXT ``records`` as ``io_ops`` rows of ``module``."""
    for rec in records:
        rank = int(rec.get("rank", -1))
        path = _name_of(names, rec)
        for op, key in (("read", "read_segments"), ("write", "write_segments")):
            for seg in _segments(rec.get(key)):
                io_ops["host"].append(HOST)
                io_ops["pid"].append(rank)
                io_ops["rank"].append(rank)
                io_ops["module"].append(module)
                io_ops["path"].append(path)
                io_ops["op"].append(op)
                io_ops["offset"].append(int(seg["offset"]))
                io_ops["size_bytes"].append(int(seg["length"]))
                io_ops["start_ns"].append(start_ns + int(float(seg["start_time"]) * NS))
                io_ops["end_ns"].append(start_ns + int(float(seg["end_time"]) * NS))


def _counter_rows(
    report: Any, module: str, records: list[dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
    """[(record, its counters by Darshan's names)] of a module, or None when its records carry none."""
    names_c = list(report.counters.get(module, {}).get("counters", []))
    names_f = list(report.counters.get(module, {}).get("fcounters", []))
    if module == "LUSTRE":
        return [(rec, _lustre_counters(rec, names_c)) for rec in records]
    if not (records and "counters" in records[0] and names_c):
        return None
    rows = []
    for rec in records:
        counters: dict[str, Any] = {}
        for n, v in zip(names_c, rec["counters"], strict=False):
            counters[n] = int(v)
        for n, v in zip(names_f, rec.get("fcounters", []), strict=False):
            counters[n] = float(v)
        if "file_rec_id" in rec:  # H5D, PNETCDF_VAR: the file record the dataset is in
            counters[f"{COUNTER_PREFIX.get(module, module)}_FILE_REC_ID"] = int(rec["file_rec_id"])
        rows.append((rec, counters))
    return rows


def _add_counters(
    io_files: dict[str, list[Any]],
    names: Any,
    rows: list[tuple[dict[str, Any], dict[str, Any]]],
    module: str,
    end_ns: int,
) -> None:
    """The counters of ``module``'s records as ``io_files`` rows, taken at the end of the job."""
    for rec, counters in rows:
        rank = int(rec.get("rank", -1))
        io_files["host"].append(HOST)
        io_files["pid"].append(rank)
        io_files["rank"].append(rank)
        io_files["ts_ns"].append(end_ns)
        io_files["module"].append(module)
        io_files["layer"].append("darshan")
        io_files["path"].append(_name_of(names, rec))
        io_files["counters"].append(json.dumps(counters))


def _module_notes(report: Any, imported_modules: dict[str, int]) -> tuple[list[str], dict[str, Any]]:
    """The notes on the modules (imported, not imported, partial), and the modules not imported."""
    notes: list[str] = [
        "modules imported (records): " + ", ".join(f"{m} ({n})" for m, n in imported_modules.items())
    ]
    not_imported = {}
    for module, info in sorted(report.modules.items()):
        if module not in imported_modules:
            n = info.get("num_records") if isinstance(info, dict) else None
            not_imported[module] = n
            notes.append(
                f"module {module}{f' ({n} records)' if n else ''} is not imported: holoprof has no table for it"
            )
        elif isinstance(info, dict) and info.get("partial_flag"):
            notes.append(
                f"module {module}: Darshan ran out of record memory in the job and marked it partial; its "
                "totals are lower bounds"
            )
    if getattr(report, "heatmaps", None):
        notes.append("the HEATMAP module is not imported: holoprof has no table for it")
    return notes, not_imported


def _processes(
    job: dict[str, Any], nprocs: int, argv: list[str], start_ns: int, end_ns: int, log_path: str
) -> dict[str, list[Any]]:
    """One ``processes`` row per MPI rank of the job."""
    ranks = list(range(nprocs))
    info = json.dumps({"source": "darshan", "log": log_path})
    return {
        "host": [HOST] * nprocs,
        "pid": ranks,
        "rank": ranks,
        "ppid": [-1] * nprocs,
        "local_rank": [-1] * nprocs,
        "world_size": [nprocs] * nprocs,
        "role": ["rank"] * nprocs,
        "argv": [json.dumps(argv)] * nprocs,
        "exe": [argv[0] if argv else ""] * nprocs,
        "start_ns": [start_ns] * nprocs,
        "end_ns": [end_ns] * nprocs,
        "exit_code": [-1] * nprocs,
        "updated_ns": [end_ns] * nprocs,
        "clock_offset_ns": [0] * nprocs,
        "versions": [json.dumps({"darshan_log": str(job.get("log_ver", "")), **_lib_ver(job)})] * nprocs,
        "dropped_events": [0] * nprocs,
        "errors": ["[]"] * nprocs,
        "info": [info] * nprocs,
    }


def _lib_ver(job: dict[str, Any]) -> dict[str, str]:
    m = job.get("metadata") or {}
    return {"darshan": str(m["lib_ver"])} if isinstance(m, dict) and "lib_ver" in m else {}


def import_darshan_log(log: str, out: str | None = None) -> tuple[str, list[str]]:
    """Import the Darshan log ``log`` into a new run directory ``out``: (its path, notes to print).

    The log is parsed completely (in a child process) before the run directory is created; a failure
    while writing removes the directory again, so that a failed import leaves nothing behind.
    """

    doc = parse_log(log)
    path = os.path.abspath(log)
    name = "darshan-" + (os.path.splitext(os.path.basename(path))[0] or "log")
    target = os.path.abspath(out or rundir.default_run_dir(name))
    existed = os.path.isdir(target)
    run_dir = rundir.create_run_dir(target)
    try:
        for seq, (table, cols) in enumerate(doc["tables"].items()):
            # one part per table, all ranks' rows in it (the import is their one writer): a log of
            # 2,048 ranks reads as a few files, not a file per rank and table
            write_chunk(run_dir, table, cols, seq=seq, writer=(HOST, IMPORTER_PID))
        write_empty_tables(run_dir, HOST, IMPORTER_PID)
        manifest = rundir.new_manifest(doc["command"], name, {})
        manifest.update(
            {
                "status": "imported",
                "start_ns": doc["start_ns"],
                "end_ns": doc["end_ns"],
                "hosts": [HOST],
                "exit_code": None,
                "launcher_pid": None,
                "source": doc["source"],
            }
        )
        rundir.write_manifest(run_dir, manifest)
    except BaseException:
        remove_failed_run(run_dir, keep_dir=existed)
        raise
    return run_dir, list(doc["notes"])


def import_darshan(log: str, out: str | None = None) -> str:
    """Import the Darshan log ``log`` into a new run directory ``out``; return its path."""
    return import_darshan_log(log, out)[0]


def remove_failed_run(run_dir: str, keep_dir: bool) -> None:
    """Remove what a failed import wrote (the directory itself unless it was there, empty, before)."""

    if keep_dir:
        for entry in os.listdir(run_dir):
            p = os.path.join(run_dir, entry)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.remove(p)
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
