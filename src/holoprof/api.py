"""The Python API: trace from inside a script, and mark stages, phases and steps.

All of it is safe to call when nothing is being traced: the markers then do nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from holoprof import model

_STATE: dict[str, Any] = {}


def start(out: str | None = None, name: str | None = None, sample_interval_s: float = 1.0) -> str:
    """Start tracing this process (and the processes it starts from now on). Returns the run directory.

    Under ``holoprof run`` the process is traced already: the existing run directory is returned.
    """
    # lazy: `import holoprof` stays light in every process; tracing loads on start()
    from holoprof.agent.core import get_agent
    from holoprof.collect.startup import start_agent

    agent = get_agent()
    if agent is not None and not agent._stopped:
        return agent.run_dir
    # lazy: `import holoprof` stays light in every process; tracing loads on start()
    from holoprof.collect.system import SystemSampler
    from holoprof.launch.run import BOOT_DIR
    from holoprof.store import rundir

    script = os.path.splitext(os.path.basename(sys.argv[0] or "python"))[0] or "python"
    name = name or script
    run_dir = rundir.make_run_dir(out, name)
    options: dict[str, Any] = {"sample_interval_s": sample_interval_s}
    manifest = rundir.new_manifest(list(sys.argv), name, options)
    rundir.write_manifest(run_dir, manifest, reserve=rundir.MANIFEST_RESERVE_BYTES)
    agent = start_agent(run_dir, role="main", options=options)
    sampler: SystemSampler | None = None
    try:
        sampler = SystemSampler(agent, os.getpid(), sample_interval_s)
        sampler.start()
    except Exception as exc:  # in the report's errors; tracing goes on without resource samples
        agent.fail(SystemSampler.name, exc)
    # lazy: `import holoprof` stays light in every process; tracing loads on start()
    from holoprof.store.convert import Converter

    converter = Converter(run_dir).start()
    saved_env = {k: os.environ.get(k) for k in (model.ENV_RUN_DIR, "PYTHONPATH", model.ENV_OPTIONS)}
    os.environ[model.ENV_RUN_DIR] = run_dir
    os.environ[model.ENV_OPTIONS] = __import__("json").dumps(options)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = BOOT_DIR + (os.pathsep + old if old else "")
    _STATE.update(
        run_dir=run_dir,
        manifest=manifest,
        sampler=sampler,
        env=saved_env,
        converter=converter,
        options=options,
    )
    return run_dir


def stop(status: str = "finished") -> str | None:
    """Stop tracing started by :func:`start`; flush everything. Returns the run directory."""
    # lazy: `import holoprof` stays light in every process; tracing loads on start()
    from holoprof.agent.core import stop_agent
    from holoprof.launch.run import finish_tables
    from holoprof.store import rundir

    if "run_dir" not in _STATE:
        return None
    sampler = _STATE.pop("sampler")
    if sampler is not None:
        sampler.stop()
    stop_agent()
    for k, v in _STATE.pop("env").items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:  # first: its compaction must be over before the native dumps arrive
        _STATE.pop("converter").stop()
    except OSError:
        pass  # the raw chunks stay; loading the run converts them
    try:
        # lazy: `import holoprof` stays light in every process; tracing loads on start()
        from holoprof.launch.run import import_exit_times, import_native_dumps
        from holoprof.store.convert import remove_empty_staging

        import_native_dumps(_STATE["run_dir"], _STATE.get("options"))
        import_exit_times(_STATE["run_dir"])
        remove_empty_staging(_STATE["run_dir"])
    except Exception:
        pass
    run_dir: str = _STATE.pop("run_dir")
    manifest = _STATE.pop("manifest")
    finish_tables(run_dir)  # what fails there costs speed or the empty tables' schemas, nothing more
    manifest.update(end_ns=time.time_ns(), status=status, exit_code=0 if status == "finished" else 1)
    try:
        rundir.write_manifest(run_dir, manifest)
    except OSError as exc:  # never the job's problem: say so once
        sys.stderr.write(
            f"holoprof: could not finish the manifest of {run_dir} ({exc.strerror or exc}); "
            "the run loads as unfinished\n"
        )
    return run_dir


class trace:
    """``with holoprof.trace(out=...) as run_dir:`` traces the block."""

    def __init__(
        self, out: str | None = None, name: str | None = None, sample_interval_s: float = 1.0
    ) -> None:
        self.out, self.name, self.interval = out, name, sample_interval_s
        self.run_dir: str | None = None
        self._own = False

    def __enter__(self) -> str:
        self._own = "run_dir" not in _STATE and _agent() is None
        self.run_dir = start(self.out, self.name, self.interval)
        return self.run_dir

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._own:
            stop("crashed" if et is not None and not issubclass(et, (KeyboardInterrupt,)) else "finished")


def _agent() -> Any:
    # lazy: `import holoprof` stays light in every process; tracing loads on start()
    from holoprof.agent.core import get_agent

    a = get_agent()
    return None if a is None or a._stopped else a


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark a stage of the workflow (data preparation, training, evaluation, export, ...)."""
    agent = _agent()
    if agent is None:
        yield
        return
    t0 = time.perf_counter_ns()
    try:
        yield
    finally:
        agent.span("stage", str(name), t0, time.perf_counter_ns(), -1)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark a phase of the current step. Standard names (data_wait, forward, backward, optimizer,
    communication, checkpoint, eval) count in the phase breakdown; other names are recorded as user
    spans and their time stays in ``other``. Work detected automatically inside the block belongs to
    this phase."""
    agent = _agent()
    if agent is None or agent.tls.active is not None:
        yield
        return
    standard = name in model.MEASURED_PHASES
    tls = agent.tls
    t0 = time.perf_counter_ns()
    if standard:
        tls.active = name
        if name in ("data_wait", "forward"):
            agent.steps.opener(t0)  # the start of an iteration, as the automatic ones are
        elif name != "eval":
            agent.steps.activity(t0)
    try:
        yield
    finally:
        if standard:
            tls.active = None
        agent.span("phase" if standard else "user", str(name), t0, time.perf_counter_ns(), agent.steps.index)


def step() -> None:
    """Mark the end of a training step, for loops that have no optimizer (or a custom one).

    Call it once at the end of each iteration. The first step starts at the first activity recorded
    in the calling thread (a DataLoader fetch, a forward pass, a phase), later ones where the previous
    ended. Once called, automatic step detection is off for this thread. Each thread that calls it
    has its own steps: eight threads that each run 50 iterations make 400 steps.
    """
    a = _agent()
    if a is not None:
        a.steps.mark()
