"""Shared helpers: run the real `holoprof` command on real scripts and read what it wrote.

Traced runs are expensive (each imports torch in fresh processes), so the runs that many tests look
at are made once per session (``standard_run``, ``small_run``) and tests copy them before changing
anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
HOLOPROF = [sys.executable, "-m", "holoprof.cli"]

#: The standard script's shape: ``train.py --epochs 2 --batches 8`` (its defaults).
STANDARD_EPOCHS = 2
STANDARD_BATCHES = 8


def script(name: str) -> str:
    return str(SCRIPTS / name)


def require(module: str, reason: str | None = None) -> None:
    """Skip (the test, or the module when called at its top) unless the top-level ``module`` is
    installed. Unlike ``pytest.importorskip`` nothing is imported: the frameworks run in the jobs the
    tests start, and importing one into the test process (TensorFlow, Lightning: several seconds of CPU
    each) would only make every worker that collects the module pay for it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(reason or f"{module} is not installed", allow_module_level=True)


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a job: this one without any holoprof state, one torch thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOLOPROF_")}
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if extra:
        env.update(extra)
    return env


def run_holoprof(
    *args: str,
    cwd: str | os.PathLike[str],
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``holoprof ARGS...`` (the real command line) and capture its output."""
    return subprocess.run(
        [*HOLOPROF, *args],
        cwd=cwd,
        env=job_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def run_python(
    *args: str,
    cwd: str | os.PathLike[str],
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS...`` untraced, for comparisons with a traced run."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=job_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def start_holoprof(
    *args: str,
    cwd: str | os.PathLike[str],
    env: dict[str, str] | None = None,
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start ``holoprof ARGS...`` in the background (stdout and stderr piped unless given)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen([*HOLOPROF, *args], cwd=cwd, env=job_env(env), **popen)


def read_until(fd: int, text: str | None, timeout: float = 60) -> str:
    """Read from ``fd`` until ``text`` has appeared (or, with None, until end of file)."""
    buf = b""
    want = text.encode() if text is not None else None
    deadline = time.monotonic() + timeout
    while want is None or want not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out after {timeout} s waiting for {text!r}; got {buf!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # a pseudo-terminal whose other side closed (EIO)
            chunk = b""
        if not chunk:
            if want is None:
                break
            raise AssertionError(f"output ended before {text!r} appeared: {buf!r}")
        buf += chunk
    return buf.decode(errors="replace")


def report_json(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``holoprof report RUN --json`` prints, parsed: built in this process (the command's own
    code, without starting a Python that imports DuckDB for each of the suite's runs), or by the
    command itself with ``HOLOPROF_TEST_REPORT=cli``. The command line's own behaviour is tested
    where it matters (test_cli_errors, test_corrupt_runs, test_terminal, ...)."""
    if os.environ.get("HOLOPROF_TEST_REPORT") == "cli":
        proc = run_holoprof("report", str(run_dir), "--json", cwd=os.path.dirname(os.fspath(run_dir)))
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
    else:
        from holoprof.analyze.report import build_report
        from holoprof.store.reader import load, skip_corrupt

        def build() -> dict[str, Any]:
            run = load(os.fspath(run_dir))
            try:
                return dict(json.loads(json.dumps(build_report(run), default=str)))
            finally:
                run.con.close()

        doc = skip_corrupt(build, [os.fspath(run_dir)])  # as the command line does
    assert isinstance(doc, dict)
    check_report_schema(doc)
    return doc


_VALIDATOR: list[Any] = []


def check_report_schema(doc: dict[str, Any]) -> None:
    """Fails the test when ``doc`` does not follow the report's shipped JSON Schema. Every report made
    through :func:`report_json` (and so :func:`traced`) is checked. Needs ``jsonschema`` (the dev
    extra, which ``make test`` installs); without it the check is left to test_report_schema.py,
    which then says it skipped."""
    if not _VALIDATOR:
        try:
            import jsonschema  # lazy: the dev extra's; the suite's other checks do not need it
        except ImportError:
            _VALIDATOR.append(None)
        else:
            from holoprof import model

            with open(model.REPORT_SCHEMA_FILE, encoding="utf-8") as f:
                _VALIDATOR.append(jsonschema.Draft202012Validator(json.load(f)))
    if _VALIDATOR[0] is not None:
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
            for e in _VALIDATOR[0].iter_errors(doc)
        ]
        assert errors == [], f"the report does not follow holoprof/schema/report.schema.json: {errors[:5]}"


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def processes_by_role(doc: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [p for p in doc["processes"] if p["role"] == role]


def main_process(doc: dict[str, Any]) -> dict[str, Any]:
    mains = processes_by_role(doc, "main")
    assert len(mains) == 1, doc["processes"]
    return mains[0]


def copy_run(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> str:
    shutil.copytree(src, dest)
    return os.fspath(dest)


#: Test modules that compare measured times or throughputs (a significant 5 ms slowdown, throughput
#: growing with the batch, a read bandwidth against a measured reference, phases against the job's own
#: timers in 2-rank DDP and FSDP jobs, the input model's measured restarts and spinning, a live hang
#: seen while it lasts). The Dask engine's module compares numbers and bytes only, and the dashboard's
#: report rebuilds are spaced by a duty set from the build's own measured time (an hour away, or none):
#: they run beside the others.
#: Under pytest-xdist they run last, on one worker, alone: the other workers stop first, so
#: that no other test loads the machine meanwhile.
TIMING_MODULES = frozenset(
    {
        "test_diff.py",
        "test_sweep.py",
        "test_io_report.py",
        "test_frameworks_torch.py",
        "test_fsdp.py",
        "test_input_model.py",
        "test_hang.py",
        "test_tf_distribute_keras.py",
    }
)
TIMING = "timing"

#: The modules that take longest (seconds of one full run on 2 workers, 2026-11-27), given out first so
#: that the workers end together, on short modules, and the TIMING_MODULES start sooner (xdist's own
#: order, most tests first, gave out several of these last while the other worker sat idle). An entry
#: gone stale only changes the order; modules not listed follow, in xdist's order.
LONGEST_FIRST = {
    "test_faults.py": 118,
    "test_tensorflow.py": 97,
    "test_dask_engine.py": 84,
    "test_compute.py": 74,
    "test_comm.py": 63,
    "test_scale.py": 59,
    "test_import_torch_trace.py": 48,
    "test_burst_buffer.py": 38,
    "test_frameworks_trainers.py": 37,
    "test_import_darshan.py": 36,
    "test_memory.py": 36,
    "test_mailbox.py": 35,
    "test_processes.py": 34,
    "test_views_first_screen.py": 34,
    "test_multinode.py": 33,
    "test_run_torch.py": 32,
    "test_io_mapped.py": 30,
    "test_terminal.py": 27,
    "test_frameworks_modern.py": 26,
    "test_findings_gain.py": 23,
    "test_serve_browser.py": 22,
    "test_export.py": 20,
}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile holoprof's modules once, before any test: the jobs and commands the tests start run
    with PYTHONDONTWRITEBYTECODE (so that no job writes beside the sources it is traced reading), and
    without compiled modules each of those thousands of processes would compile what it imports anew.
    Only the controller compiles (xdist's workers start after it)."""
    if not hasattr(session.config, "workerinput"):
        import compileall

        compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "src" / "holoprof"), quiet=1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (``make test``: ``-n 2``), with the TIMING_MODULES as one unit that runs
    alone at the end. Each test module stays on one worker, so its module-scoped runs are made once."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class TimingAlone(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return TIMING if os.path.basename(path) in TIMING_MODULES else path

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:
                self.ordered = True
                for scope in sorted(self.workqueue, key=lambda s: LONGEST_FIRST.get(os.path.basename(s), 0)):
                    self.workqueue.move_to_end(scope, last=False)  # the longest ends up first
            if TIMING in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end(TIMING)  # every other unit first
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            if node.shutting_down or list(self.workqueue) != [TIMING]:
                super()._reschedule(node)
                return
            # A worker holds back its last test until it gets more work or is told to stop.
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            if any(other is not node and not other.shutting_down for other in self.assigned_work):
                node.shutdown()  # it runs its last test and stops; the last worker takes the timing unit
            else:
                super()._assign_work_unit(node)

    return TimingAlone(config, log)


@dataclass
class TracedRun:
    """One finished ``holoprof run``: the process result, the run directory and its JSON report."""

    proc: subprocess.CompletedProcess[str]
    run_dir: str
    report: dict[str, Any]


def traced(
    tmp: Path,
    *command: str,
    options: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> TracedRun:
    """``holoprof run --out TMP/run --no-report OPTIONS -- COMMAND`` in TMP, and its report."""
    run_dir = str(tmp / "run")
    proc = run_holoprof(
        "run", "--out", run_dir, "--no-report", *options, "--", *command, cwd=tmp, env=env, timeout=timeout
    )
    assert os.path.isfile(os.path.join(run_dir, "manifest.json")), proc.stderr
    return TracedRun(proc, run_dir, report_json(run_dir))


def traced_with_agent_options(
    tmp: Path, agent_options: dict[str, Any], *command: str, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], str]:
    """``holoprof run`` of COMMAND into TMP/run with agent options that have no flag (such as
    ``buffer_limit``, the spans a process buffers between two flushes), through the launcher's
    Python API, with the short report on stderr; returns the result and the run directory."""
    run_dir = str(tmp / "run")
    code = (
        "import sys; from holoprof.launch.run import run; from holoprof.commands.run import short_report; "
        f"sys.exit(run({list(command)!r}, out={run_dir!r}, options={agent_options!r}, report=short_report))"
    )
    proc = run_python("-c", code, cwd=tmp, timeout=timeout)
    assert os.path.isfile(os.path.join(run_dir, "manifest.json")), proc.stderr
    return proc, run_dir


def session_root(factory: pytest.TempPathFactory) -> Path:
    """The test session's folder, the same for all of pytest-xdist's workers (each has its own below it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """A folder made once per test session and shared by pytest-xdist's workers (each worker would
    otherwise make its own copy of a run that tests of several modules read): the first to ask makes it
    with ``make(folder)``, under a lock on the session's folder, and the others wait for it. Its
    readers never change it (they copy a run first: :func:`copy_run`)."""
    root = session_root(factory)
    folder = root / f"shared-{name}"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker failed half-way: made again
            folder.mkdir()
            make(folder)
            (folder / ".made").write_text("")
    return folder


def shared_traced(
    factory: pytest.TempPathFactory,
    name: str,
    *command: str,
    options: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> TracedRun:
    """:func:`traced` once per session for every worker (see :func:`shared`); the command's result is
    kept beside the run, and each worker builds the report itself."""

    def make(folder: Path) -> None:
        p = traced(folder, *command, options=options, env=env, timeout=timeout).proc
        result = {"args": p.args, "returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
        (folder / "proc.json").write_text(json.dumps(result))

    folder = shared(factory, name, make)
    d = json.loads((folder / "proc.json").read_text())
    proc = subprocess.CompletedProcess(d["args"], d["returncode"], d["stdout"], d["stderr"])
    run_dir = str(folder / "run")
    return TracedRun(proc, run_dir, report_json(run_dir))


@pytest.fixture(scope="session")
def standard_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    """The standard training script (SGD, eval and checkpoint per epoch), traced once."""
    run = shared_traced(
        tmp_path_factory, "standard", script("train.py"), options=("--sample-interval", "0.2")
    )
    assert run.proc.returncode == 0, run.proc.stderr
    return run


@pytest.fixture(scope="session")
def standard_untraced(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """The same script, same seed, not traced: its output is the reference for 'tracing changes nothing'."""
    tmp = tmp_path_factory.mktemp("untraced")
    proc = run_python(script("train.py"), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="session")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    """A quick run with no framework (20 marked steps) flushed often, so it has many chunks."""
    run = shared_traced(
        tmp_path_factory,
        "small",
        script("manual_steps.py"),
        "20",
        "--phases",
        options=("--flush-interval", "0.05"),
    )
    assert run.proc.returncode == 0, run.proc.stderr
    return run
