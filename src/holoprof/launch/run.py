"""`holoprof run`: set up the run directory, inject the agent into every Python process, wait.

The agent reaches every Python process of the job through a ``sitecustomize`` placed first on
``PYTHONPATH`` and gated by ``HOLOPROF_RUN_DIR``: the main script, DataLoader workers (fork, spawn,
forkserver), ``torch.multiprocessing.spawn`` and ``torchrun`` ranks, and Python subprocesses of shell
pipelines. Processes that ignore the environment (``python -E``/``-I``) are not traced.

Signals: SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2 sent to ``holoprof run`` are forwarded to the job.
SIGINT from the terminal (Ctrl-C) already reaches the job directly (same process group), so it is
not forwarded a second time; a SIGINT sent to ``holoprof run`` alone with ``kill`` is forwarded.
The exit status is the job's (128 + N when the job died of signal N).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from holoprof import model
from holoprof.agent.core import Agent
from holoprof.collect import io_native
from holoprof.collect.io_paths import PathPolicy, default_excludes, norm_prefix
from holoprof.collect.system import SystemSampler
from holoprof.errors import HoloprofError, printable_text
from holoprof.launch.multinode import multi_node_hint
from holoprof.launch.peak import ensure_peaks
from holoprof.store import hosts, native_dumps, process_rows, rundir
from holoprof.store.chunks import pyarrow_without_pandas, write_chunk, write_empty_tables
from holoprof.store.compact import compact_run
from holoprof.store.convert import Converter, remove_empty_staging
from holoprof.store.reader import load

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: What the supervising loop waits for: a signal to forward, or the job's end (SIGCHLD, which wakes it
#: at once instead of at its next 0.2 s poll).
WAITED = (*FORWARDED, signal.SIGCHLD)
_SI_USER = 0


def _is_python(exe: str) -> bool:
    base = os.path.basename(exe)
    return base.startswith("python") or base in ("pypy", "pypy3")


def resolve_command(command: list[str]) -> list[str]:
    """Turn the user's command into an argv, or raise a HoloprofError that says what is wrong."""
    if not command:
        raise HoloprofError(
            "no command given; put the command after --, e.g.: holoprof run -- python train.py --epochs 3"
        )
    first = command[0]
    if first.endswith(".py"):
        if not os.path.isfile(first):
            raise HoloprofError(f"script not found: {first}; check the path (relative to {os.getcwd()})")
        return [sys.executable, *command]
    if os.sep in first:
        if not os.path.exists(first):
            raise HoloprofError(f"command not found: {first}; check the path")
        if not os.access(first, os.X_OK) or os.path.isdir(first):
            raise HoloprofError(
                f"{first} is not an executable file; check the path or run it through its interpreter"
            )
        exe = first
    else:
        found = shutil.which(first)
        if found is None:
            raise HoloprofError(
                f"command not found: {first}; check the spelling, or give a path "
                "(a .py file runs with this Python: holoprof run -- train.py)"
            )
        exe = found
    if _is_python(exe):
        script = _script_of(command[1:])
        if script is not None and not os.path.isfile(script):
            raise HoloprofError(f"script not found: {script}; check the path (relative to {os.getcwd()})")
    return command


def _script_of(args: list[str]) -> str | None:
    """The script a python command line runs, if it runs one (not -c / -m)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-c", "-m", "-"):
            return None
        if a in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return a
    return None


def run_name(command: list[str]) -> str:
    script = _script_of(command[1:]) if _is_python(command[0]) else None
    base = script or command[0]
    if os.path.basename(base) in ("torchrun",) and len(command) > 1:
        s = next((a for a in command[1:] if a.endswith(".py")), None)
        base = s or base
    return os.path.splitext(os.path.basename(base))[0] or "run"


def job_environment(run_dir: str, options: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env[model.ENV_RUN_DIR] = run_dir
    env[model.ENV_LAUNCHER_PID] = str(os.getpid())
    env[model.ENV_BOOT_DIR] = BOOT_DIR
    env[model.ENV_OPTIONS] = json.dumps(options)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = BOOT_DIR + (os.pathsep + old if old else "")
    if options.get("io_layer", "auto") != "python":
        # The native I/O layer reaches every process of the job, Python or not (LD_PRELOAD).
        try:
            env = io_native.preload_env(env)
            env.setdefault(io_native.ENV_EXCLUDE, ":".join(native_excludes(run_dir, options)))
            includes = [norm_prefix(p) for p in options.get("io_include") or []]
            if includes:
                env.setdefault(io_native.ENV_INCLUDE, ":".join(p for p in includes if ":" not in p))
        except Exception:  # not built here: the Python layer counts Python's I/O
            pass
    return env


#: What the native library leaves out by default (its own list), extended below.
NATIVE_DEFAULT_EXCLUDES = (
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/boot",
    "/run",
)


def native_excludes(run_dir: str, options: dict[str, Any]) -> list[str]:
    """Prefixes the native library does not even record: its defaults, the interpreter's own files
    (stdlib, site-packages: thousands of files opened by `import torch`), the run directory and the
    user's --io-exclude, minus whatever --io-include asks for. Filtering there, not after the fact,
    keeps the agent from decoding thousands of records it would drop."""
    includes = [norm_prefix(p) for p in options.get("io_include") or []]
    out: list[str] = []
    for p in [*NATIVE_DEFAULT_EXCLUDES, *default_excludes(run_dir), *(options.get("io_exclude") or [])]:
        p = norm_prefix(p)  # as the library normalizes the paths it compares with them
        if ":" in p or p in out:
            continue
        if any(i == p or i.startswith(p + "/") for i in includes):
            continue  # the user wants something under it
        out.append(p)
    # a prefix under another one kept adds nothing but a compare to every path the library sees
    return [p for p in out if not any(q != p and (p.startswith(q + "/") or q == "/") for q in out)]


IMPORTED_SEQ = 90_000_000


def import_native_dumps(run_dir: str, options: dict[str, Any] | None = None, host: str | None = None) -> int:
    """Counters that non-Python processes of the job wrote at exit, into their process folders
    (filtered like the agent's own: no interpreter files, pseudo file systems or the run itself);
    ``host``: those of that host's processes only."""
    opts = options or {}
    policy = PathPolicy(opts.get("io_include"), opts.get("io_exclude"), run_dir)
    n = 0
    for i, path in enumerate(native_dumps.dump_files(run_dir)):
        if host is not None and os.path.basename(os.path.dirname(path)).rpartition("-")[0] != host:
            continue
        try:
            rows = [r for r in native_dumps.read_dump(path) if policy.keep(r["path"])]
            header = native_dumps.read_dump_header(path)
        except Exception:
            continue
        folder = os.path.dirname(path)
        if rows:
            host, _, pid = os.path.basename(folder).rpartition("-")
            write_chunk(
                run_dir,
                "io_files",
                {
                    "host": [host] * len(rows),
                    "pid": [int(header.get("pid") or pid)] * len(rows),
                    "rank": [-1] * len(rows),
                    "ts_ns": [int(r.get("ts_ns") or time.time_ns()) for r in rows],
                    "module": [r["module"] for r in rows],
                    "layer": ["native"] * len(rows),
                    "path": [r["path"] for r in rows],
                    "counters": [json.dumps(r["counters"]) for r in rows],
                    "mapped_pages": [r.get("mapped_pages") for r in rows],
                },
                seq=IMPORTED_SEQ + i,  # never the number of a raw chunk still waiting for conversion
                writer=(host, int(header.get("pid") or pid)),
            )
            n += len(rows)
        os.remove(path)  # its rows are in io_files now
    return n


EXIT_SEQ = 91_000_000


def finish_tables(run_dir: str, host: str | None = None) -> list[str]:
    """After the job, by the process that finishes the run: compact the tables of ``host``'s
    processes (every host's with None), then give each table with no rows (``io_ops`` without
    ``--io-trace``) a part of no rows in this process's partition, so that every table folder reads
    as a table. Neither is needed to load the run: what failed, in words (nothing raised)."""
    problems = []
    try:
        compact_run(run_dir, host=host)
    except Exception as exc:  # compaction is an optimization; the chunks are still there
        problems.append(f"could not compact the run ({exc}); it loads as it is")
    try:
        write_empty_tables(run_dir, host or os.uname().nodename, os.getpid())
    except Exception as exc:
        problems.append(
            f"could not write the schemas of the tables with no rows ({exc}); the run loads as it is"
        )
    return problems


def import_exit_times(run_dir: str, host: str | None = None) -> int:
    """The exit times and statuses the native library recorded for traced processes
    (``exit-<pid>.json``: after their interpreter's finalization, which their agent's final row
    precedes) into ``processes``: per process, its newest row again, ended when it exited, with the
    status it gave ``exit()``. The files are removed once written; until
    then a loaded run reads them itself. ``host``: that host's processes only (each launcher of a
    joined run finishes its own)."""
    if not native_dumps.exit_files(run_dir):
        return 0
    exits = {k: v for k, v in native_dumps.exits(run_dir).items() if host is None or k[0] == host}
    names = model.column_names("processes")
    newest = process_rows.newest_rows(run_dir, host)  # without DuckDB: one small table
    if newest is None:  # rows not in Parquet parts: the loaded run's view
        run = load(run_dir)
        loaded = run.rows(f"SELECT {', '.join(names)} FROM processes")
        rows = [r for r in loaded if (r[0], r[1]) in exits]
    else:  # ended when it exited, as the loaded run's view says
        rows = []
        for doc in newest:
            got = exits.get((doc["host"], doc["pid"]))
            if got is None:
                continue
            ns, status = got
            start, end = doc["start_ns"], doc["end_ns"]
            if start is not None and ns >= start and ns > (end or 0):
                doc["end_ns"] = ns
            if status is not None:
                doc["exit_code"] = status
            rows.append(tuple(doc[n] for n in names))
    if rows:
        cols: dict[str, list[Any]] = {k: [r[i] for r in rows] for i, k in enumerate(names)}
        cols["updated_ns"] = [
            max(int(u or 0), int(e or 0)) for u, e in zip(cols["updated_ns"], cols["end_ns"], strict=True)
        ]
        write_chunk(run_dir, "processes", cols, seq=EXIT_SEQ)  # a part in each process's partition
    # the others stay, for a loaded run to read
    for path in native_dumps.exit_files_done(run_dir, {(r[0], r[1]) for r in rows}, host):
        try:
            os.remove(path)
        except FileNotFoundError:  # gone meanwhile: nothing lost
            pass
    return len(rows)


def run(
    command: list[str],
    out: str | None = None,
    name: str | None = None,
    options: dict[str, Any] | None = None,
    report: Callable[[str], None] | None = None,
    join: bool = False,
) -> int:
    """Run ``command`` traced into a new run directory; its exit status. ``report(run_dir)`` prints
    the report when the job has ended (the command passes it). ``join``: ``out`` may be a run that
    another launcher created with ``join`` (one node of a multi-node job each): this one joins it
    as one more host."""
    options = dict(options or {})
    argv = resolve_command(command)
    name = name or run_name(argv)
    claim = rundir.claim_run(out, name, join, multi_node_hint(argv))
    run_dir = claim.path
    manifest = rundir.new_manifest(list(command), name, options)
    part = _start_host_part(claim, manifest) if join else None
    if part is None:
        try:
            rundir.write_manifest(run_dir, manifest, reserve=rundir.MANIFEST_RESERVE_BYTES)
        except OSError as exc:
            raise HoloprofError(
                f"cannot write to the run directory {run_dir} ({exc.strerror or exc}); choose a writable "
                "place with --out"
            )
    sys.stderr.write(f"holoprof: tracing into {printable_text(run_dir)}{_joined(claim, part)}\n")
    sys.stderr.flush()

    rc, storage = _supervise(argv, run_dir, options, part)
    # From here on the job is over: nothing may change its exit status, whatever the disk does.

    manifest["end_ns"] = time.time_ns()
    manifest["exit_code"] = rc
    manifest["status"] = "finished" if rc == 0 else "crashed"
    if rc > 128:
        try:
            manifest["signal"] = signal.Signals(rc - 128).name
        except ValueError:
            pass
    if storage.error:
        manifest["storage_error"] = storage.error
        manifest["unrecorded_dropped_events"] = storage.unrecorded_dropped
    if storage.error is None:
        for problem in finish_tables(run_dir, part.doc["host"] if part else None):
            sys.stderr.write(f"holoprof: {problem}\n")
    finished = True
    try:
        if part is None:
            rundir.write_manifest(run_dir, manifest)
        else:
            _finish_host_part(run_dir, part, manifest)
    except OSError as exc:
        finished = False
        storage.error = storage.error or f"{exc.strerror or exc}"
    if storage.error:
        lost = f"{storage.dropped} events were dropped" if storage.dropped else "events may have been dropped"
        done = "" if finished else "; the manifest could not be finished (the run loads as unfinished)"
        sys.stderr.write(
            f"holoprof: the run directory {run_dir} could not be written ({storage.error}): {lost}{done}; "
            f"your job's exit status ({rc}) is unchanged\n"
        )
    if storage.error is None:
        _measure_peaks(run_dir)
    if report is not None:
        try:
            report(run_dir)
        except Exception as exc:
            sys.stderr.write(f"holoprof: could not print the report ({type(exc).__name__}: {exc})\n")
    shown = printable_text(run_dir)
    sys.stderr.write(f"holoprof: run saved in {shown}; see it again with: holoprof report {shown}\n")
    return rc


def _measure_peaks(run_dir: str) -> None:
    """After the job: this CPU's peak FLOP/s for the dtypes and threads its counted steps used, from the
    machine's cache or a short GEMM benchmark (:mod:`holoprof.launch.peak`), written into the run."""
    try:
        for note in ensure_peaks(run_dir):
            sys.stderr.write(f"holoprof: {note}\n")
    except Exception as exc:  # one line: the first of the error's own (DuckDB's run over several)
        first = (str(exc).splitlines() or [""])[0]
        sys.stderr.write(
            f"holoprof: could not measure this CPU's peak FLOP/s ({type(exc).__name__}: {first})\n"
        )


def _start_host_part(claim: rundir.Claim, manifest: dict[str, Any]) -> hosts.HostPart:
    """This launcher's part of a run of several launchers; the creator writes it before the manifest
    (which marks the run as one to join), so that a launcher that joins finds it."""
    part = hosts.HostPart(claim.path, list(manifest["command"]), creator=not claim.joined)
    try:
        part.create()
        if not claim.joined:
            manifest.update(join=True, job_id=hosts.job_id())
            rundir.write_manifest(claim.path, manifest, reserve=rundir.MANIFEST_RESERVE_BYTES)
    except OSError as exc:
        raise HoloprofError(
            f"cannot write to the run directory {claim.path} ({exc.strerror or exc}); choose a writable "
            "place with --out"
        )
    return part


def _joined(claim: rundir.Claim, part: hosts.HostPart | None) -> str:
    if part is None:
        return ""
    n = len({p["host"] for p in hosts.read_parts(claim.path)} | {part.doc["host"]})
    what = "joined" if claim.joined else "created"
    return f" ({what} as host {printable_text(part.doc['host'])}; {n} host{'s' if n > 1 else ''} so far)"


def _finish_host_part(run_dir: str, part: hosts.HostPart, manifest: dict[str, Any]) -> None:
    """Finish this launcher's part; the last launcher to finish also writes the run's end into the
    manifest (every launcher that finds all parts finished writes the same). Raises OSError."""
    for key in hosts.CARRIED:  # what this launcher knows of its end: its signal, a full disk
        if key in manifest:
            part.doc[key] = manifest[key]
    part.finish(manifest["status"], manifest["exit_code"])
    parts = hosts.read_parts(run_dir)
    if not parts or any(p.get("status") not in ("finished", "crashed") for p in parts):
        return
    try:
        on_disk = rundir.read_manifest(run_dir)
    except HoloprofError:
        return
    on_disk.pop("host_parts", None)
    rundir.write_manifest(run_dir, on_disk)


@dataclass
class Storage:
    """What the launcher knows of writes to the run directory that failed."""

    error: str | None = None  # the first failure (strerror), None when every write went through
    dropped: int = 0  # events the launcher's own writer dropped
    unrecorded_dropped: int = 0  # of those, how many no processes row records


def _warm_up_converter() -> None:
    """Convert a one-row chunk before the job starts: pyarrow's lazy imports are then paid here, not on
    the job's cores in the middle of its run. The launcher never hands pyarrow a pandas object, so
    pyarrow's probe for pandas (half a second of CPU, when it is installed) is made to fail."""
    try:
        import psutil  # noqa: F401  lazy: its import paid here, before the job starts

        pyarrow_without_pandas()

        with tempfile.TemporaryDirectory(prefix="holoprof-warm-") as d:
            write_chunk(
                d,
                "samples",
                {"host": ["warm-up"], "pid": [0], "ts_ns": [0], "name": ["warm-up"], "value": [0.0]},
                seq=0,
            )
    except Exception:
        pass


def _from_terminal() -> bool:
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


# long: one sequence, start to stop, of the job and the threads that watch it (sampler, host heartbeat)
def _supervise(
    argv: list[str], run_dir: str, options: dict[str, Any], part: hosts.HostPart | None = None
) -> tuple[int, Storage]:
    env = job_environment(run_dir, options)
    _warm_up_converter()
    use_wait = hasattr(signal, "sigtimedwait")
    if use_wait:
        # Signals wait in a queue for the loop below; the child starts with the mask cleared.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)

        def _unblock() -> None:
            signal.pthread_sigmask(signal.SIG_SETMASK, set())

        try:
            proc = subprocess.Popen(argv, env=env, preexec_fn=_unblock)
        except OSError as exc:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            raise HoloprofError(f"cannot start {argv[0]} ({exc.strerror or exc}); check the command")
    else:  # pragma: no cover - platforms without sigtimedwait (macOS)
        proc = subprocess.Popen(argv, env=env)
        for s in FORWARDED:
            if s == signal.SIGINT:
                signal.signal(s, lambda n, f: None if _from_terminal() else proc.send_signal(n))
            else:
                signal.signal(s, lambda n, f: proc.send_signal(n))

    agent = Agent(run_dir, role="launcher", options=options)
    agent.warn_storage = False  # a failed write is summed up in one line at the end (run())
    sampler = None
    host = part.doc["host"] if part is not None else None  # joined: each launcher converts its own
    converter = Converter(run_dir, host=host).start()
    try:
        agent.start(process_hooks=False)
        sampler = SystemSampler(agent, proc.pid, float(options.get("sample_interval_s", 1.0)))
        sampler.start()
    except Exception as exc:  # in the report's errors, like any collector turned off
        agent.fail(SystemSampler.name, exc)
    try:
        while True:
            if use_wait:
                info = signal.sigtimedwait(WAITED, 0.2)
                if info is not None and info.si_signo != signal.SIGCHLD:
                    from_tty = (
                        info.si_signo == signal.SIGINT and info.si_code != _SI_USER and _from_terminal()
                    )
                    if not from_tty and proc.poll() is None:
                        proc.send_signal(info.si_signo)
            else:  # pragma: no cover
                time.sleep(0.2)
            rc = proc.poll()
            if rc is not None:
                break
            if part is not None:
                part.heartbeat()
    finally:
        if use_wait:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        if sampler is not None:
            sampler.stop()
        agent.shutdown()
        storage = Storage(agent.storage_error, agent.dropped, agent.dropped - agent.dropped_recorded)
        try:  # first: its compaction must be over before parts numbered out of order arrive
            converter.stop()
        except OSError as exc:  # the raw chunks stay; loading the run converts them
            storage.error = storage.error or f"{exc.strerror or exc}"
        except Exception as exc:
            sys.stderr.write(
                f"holoprof: could not convert all chunks ({exc}); `holoprof report` will retry\n"
            )
        try:
            import_native_dumps(run_dir, options, host)
        except OSError as exc:
            storage.error = storage.error or f"{exc.strerror or exc}"
        except Exception as exc:
            sys.stderr.write(f"holoprof: could not import the native I/O counters ({exc})\n")
        try:
            import_exit_times(run_dir, host)
        except OSError as exc:
            storage.error = storage.error or f"{exc.strerror or exc}"
        except Exception as exc:  # the exit files stay: loading the run reads them
            sys.stderr.write(f"holoprof: could not record when the processes exited ({exc})\n")
        remove_empty_staging(run_dir)

        remove_empty_staging(run_dir, host)
    return (rc if rc >= 0 else 128 - rc), storage
