"""`holoprof import`: turn another tool's trace into a holoprof run directory.

``holoprof import darshan LOG --out DIR`` reads a Darshan log with PyDarshan (the ``darshan`` extra)
into the same tables that ``holoprof run`` writes, so that ``holoprof report`` and the analyses work
on it unchanged:

* ``manifest.json`` — status ``imported``, ``command`` = the job's executable line from the log,
  start and end from the job record, ``source`` = {format, log, jobid, nprocs, log_version};
* ``processes`` — one row per MPI rank (``host`` "darshan", ``pid`` = rank, role ``rank``);
* ``io_files`` — one row per record of the POSIX and STDIO modules, ``layer`` "darshan", the counters
  under Darshan's own names; records shared by all ranks (Darshan's rank -1) have ``pid`` -1;
* ``io_ops`` — the DXT_POSIX segments when the log has them.

Importers are registered in :data:`IMPORTERS` (format -> module, help); each module provides
``add_import_arguments(parser)`` and ``run_import(args) -> int``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from holoprof.errors import HoloprofError, MissingExtraError

#: format -> (module, help). The module provides add_import_arguments(parser) and run_import(args).
IMPORTERS: dict[str, tuple[str, str]] = {
    "darshan": (__name__, "a Darshan log (.darshan): holoprof import darshan LOG --out DIR"),
    "torch-trace": (
        "holoprof.store.import_torch_trace",
        "a PyTorch profiler (Kineto) trace or a folder of them: holoprof import torch-trace PATH --out DIR",
    ),
}

HOST = "darshan"
MODULES = ("POSIX", "STDIO")
NS = 1_000_000_000


# --- the command ---------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    import importlib

    sub = parser.add_subparsers(dest="import_format", metavar="FORMAT", parser_class=type(parser))
    for name, (module_name, help_text) in IMPORTERS.items():
        sp = sub.add_parser(name, help=help_text)
        try:
            importlib.import_module(module_name).add_import_arguments(sp)
            sp.add_argument("--no-report", action="store_true", help="do not print the report at the end")
        except ImportError as exc:  # one broken importer must not take the whole command line down
            sp.set_defaults(
                import_unavailable=f"`holoprof import {name}` is unavailable ({exc}); reinstall holoprof"
            )
            sp.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            continue
        sp.set_defaults(import_module=module_name)


def main(args: argparse.Namespace) -> int:
    import importlib

    unavailable = getattr(args, "import_unavailable", None)
    if unavailable:
        raise HoloprofError(unavailable)
    module_name = getattr(args, "import_module", None)
    if not module_name:
        raise HoloprofError(f"say what to import: holoprof import {{{','.join(IMPORTERS)}}} PATH --out DIR")
    return int(importlib.import_module(module_name).run_import(args))


def imported(args: argparse.Namespace, source: str, run_dir: str, notes: Sequence[str] = ()) -> int:
    """What every importer prints when it is done: the run, its notes and (unless ``--no-report``) the
    short report, as ``holoprof run`` ends."""
    sys.stderr.write(f"holoprof: imported {source} into {run_dir}\n")
    for note in notes:
        sys.stderr.write(f"holoprof: {note}\n")
    if not getattr(args, "no_report", False):
        from holoprof.present.terminal import short_report

        short_report(run_dir)
    sys.stderr.write(f"holoprof: run saved in {run_dir}; see it again with: holoprof report {run_dir}\n")
    return 0


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", help="the Darshan log file (.darshan)")
    parser.add_argument("--out", help="run directory to create (default: ./holoprof-runs/<time>-<log name>)")


def run_import(args: argparse.Namespace) -> int:
    return imported(args, args.log, import_darshan(args.log, args.out))


# --- reading the log -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The Darshan C library prints its own errors on fd 2: keep them out of our one-line message."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _check_path(log: str) -> str:
    path = os.path.abspath(log)
    if not os.path.exists(path):
        raise HoloprofError(f"Darshan log not found: {log}; check the path")
    if not os.path.isfile(path):
        raise HoloprofError(f"{log} is not a file; pass a Darshan log file (.darshan)")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise HoloprofError(f"cannot read {log} ({exc.strerror or exc}); check its permissions")
    return path


def read_log(log: str) -> Any:
    """A PyDarshan report with every module read; HoloprofError when the file is not a Darshan log."""
    path = _check_path(log)
    try:
        import darshan
    except ImportError:
        raise MissingExtraError("importing Darshan logs", "darshan", "darshan")
    failure: str | None = None
    report: Any = None
    with _quiet_stderr():
        try:
            report = darshan.DarshanReport(path, read_all=True)
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            exc.__traceback__ = None
        if failure is not None:
            import gc

            gc.collect()  # the half-open report's finalizer prints on fd 2 too
    if failure is not None:
        raise HoloprofError(
            f"{log} is not a readable Darshan log ({failure}); pass a .darshan file written by Darshan 3.x"
        )
    return report


def _names(report: Any, module: str) -> tuple[list[str], list[str]]:
    c = report.counters.get(module, {})
    return list(c.get("counters", [])), list(c.get("fcounters", []))


def _records(report: Any, module: str) -> list[dict[str, Any]]:
    coll = report.records.get(module)
    if coll is None:
        return []
    return list(coll.to_numpy())


def _segments(segs: Any) -> list[dict[str, Any]]:
    if hasattr(segs, "to_dict"):  # a pandas DataFrame in some PyDarshan versions
        return list(segs.to_dict("records"))
    return list(segs or [])


def _num(v: Any) -> int | float:
    f = float(v)
    return int(f) if f.is_integer() and abs(f) < 2**63 else f


def convert(report: Any, log_path: str) -> dict[str, Any]:
    """The tables of a holoprof run (column lists) and the manifest fields, from a PyDarshan report."""
    meta = report.metadata
    job = meta.get("job", {})
    start_ns = int(job.get("start_time_sec", 0)) * NS + int(job.get("start_time_nsec", 0) or 0)
    end_ns = int(job.get("end_time_sec", 0)) * NS + int(job.get("end_time_nsec", 0) or 0)
    if end_ns <= start_ns:
        end_ns = start_ns + int(float(job.get("run_time", 0) or 0) * NS)
    nprocs = int(job.get("nprocs", 1) or 1)
    exe = str(meta.get("exe") or "").strip()
    try:
        argv = shlex.split(exe) if exe else []
    except ValueError:
        argv = exe.split()
    names = report.name_records

    io_files: dict[str, list[Any]] = {
        k: [] for k in ("host", "pid", "rank", "ts_ns", "module", "layer", "path", "counters")
    }
    for module in MODULES:
        ints, floats = _names(report, module)
        for rec in _records(report, module):
            rank = int(rec.get("rank", -1))
            counters: dict[str, Any] = {}
            for n, v in zip(ints, rec["counters"], strict=False):
                counters[n] = int(v)
            for n, v in zip(floats, rec["fcounters"], strict=False):
                counters[n] = float(v)
            path = str(names.get(rec["id"], f"<unknown record {rec['id']}>"))
            io_files["host"].append(HOST)
            io_files["pid"].append(rank)
            io_files["rank"].append(rank)
            io_files["ts_ns"].append(end_ns)
            io_files["module"].append(module)
            io_files["layer"].append("darshan")
            io_files["path"].append(path)
            io_files["counters"].append(json.dumps(counters))

    io_ops: dict[str, list[Any]] = {
        k: []
        for k in ("host", "pid", "rank", "module", "path", "op", "offset", "size_bytes", "start_ns", "end_ns")
    }
    for rec in _records(report, "DXT_POSIX"):
        rank = int(rec.get("rank", -1))
        path = str(names.get(rec["id"], f"<unknown record {rec['id']}>"))
        for op, key in (("read", "read_segments"), ("write", "write_segments")):
            for seg in _segments(rec.get(key)):
                io_ops["host"].append(HOST)
                io_ops["pid"].append(rank)
                io_ops["rank"].append(rank)
                io_ops["module"].append("POSIX")
                io_ops["path"].append(path)
                io_ops["op"].append(op)
                io_ops["offset"].append(int(seg["offset"]))
                io_ops["size_bytes"].append(int(seg["length"]))
                io_ops["start_ns"].append(start_ns + int(float(seg["start_time"]) * NS))
                io_ops["end_ns"].append(start_ns + int(float(seg["end_time"]) * NS))

    ranks = list(range(nprocs))
    info = json.dumps({"source": "darshan", "log": log_path})
    processes = {
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
    return {
        "tables": {"io_files": io_files, "io_ops": io_ops, "processes": processes},
        "command": argv,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "source": {
            "format": "darshan",
            "log": log_path,
            "jobid": job.get("jobid"),
            "nprocs": nprocs,
            "log_version": job.get("log_ver"),
            "modules": sorted(report.modules.keys()),
        },
    }


def _lib_ver(job: dict[str, Any]) -> dict[str, str]:
    m = job.get("metadata") or {}
    return {"darshan": str(m["lib_ver"])} if isinstance(m, dict) and "lib_ver" in m else {}


def import_darshan(log: str, out: str | None = None) -> str:
    """Import the Darshan log ``log`` into a new run directory ``out``; return its path."""
    from holoprof.store import rundir
    from holoprof.store.chunks import write_chunk

    report = read_log(log)
    path = os.path.abspath(log)
    doc = convert(report, path)
    name = "darshan-" + (os.path.splitext(os.path.basename(path))[0] or "log")
    run_dir = rundir.create_run_dir(out or rundir.default_run_dir(name))
    for seq, (table, cols) in enumerate(doc["tables"].items()):
        write_chunk(run_dir, table, cols, seq=seq)  # one part per rank of the log
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
    return run_dir
