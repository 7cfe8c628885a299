"""Starting the agent with its collectors in a process of a traced job.

``holoprof run`` starts it from the environment it set up (its ``sitecustomize`` calls
:func:`start_from_env` at interpreter start-up); ``holoprof.start()`` calls :func:`start_agent`.

Start-up is paid by every Python process of a job, a pipeline's ``python -c`` and a spawned DataLoader
worker included, so it does only what cannot wait: the process's agent (its row, exit status and
writer thread), the I/O collector (the files the process reads from its first line on) and the knobs
that must be set before a framework loads. A framework's collectors are imported and installed when
the job imports the framework (a post-import hook), the control mailbox's reader at the first flush
(:data:`COLLECTORS`). A DataLoader worker started with "spawn" installs at ``import torch`` only what a
worker records (:data:`IN_LOADER_WORKER`): never the training-step collectors.
``benchmarks/bench_startup.py`` measures what is left.
"""

from __future__ import annotations

import os
import sys

from holoprof import model
from holoprof.agent import core
from holoprof.agent.core import Agent, Collector
from holoprof.agent.gc_clock import OffTheClock
from holoprof.agent.setup import (
    OPTION_GC_RESET,
    before_target,
    loading_from_parent,
    post_import_finder,
    reset_gc_clock,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (loaded in every traced process)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any


def options_from_env() -> dict[str, Any]:
    raw = os.environ.get(model.ENV_OPTIONS)
    if not raw or raw == "{}":
        return {}
    # lazy: json loads re and enum (milliseconds); parsed only when the launcher passed options
    import json

    try:
        opts = json.loads(raw)
    except ValueError:
        return {}
    return opts if isinstance(opts, dict) else {}


def start_from_env() -> None:
    run_dir = os.environ.get(model.ENV_RUN_DIR)
    if not run_dir or not os.path.isdir(run_dir):
        return
    start_agent(run_dir, options=options_from_env())


def start_agent(run_dir: str, role: str | None = None, options: dict[str, Any] | None = None) -> Agent:
    """This process's agent, started with the always-on collectors (once per process)."""
    current = core.get_agent()
    if current is not None and not current._stopped and current.pid == os.getpid():
        return current
    agent = Agent(run_dir, role=role, options=options)
    agent.collectors = default_collectors(agent)
    core.set_agent(agent)
    held = started_by_loader() and SPAWN_CHILD_ARG in sys.argv  # a worker started with spawn
    if held:
        agent.hold_flushes(loader_hold_s())
    agent.start()
    if held:  # its writer starts at the latest where its target begins
        post_import_finder().add("multiprocessing.process", _writer_before_target)
    try:
        defer_collectors(agent)
        after_collectors(agent)
    except Exception as exc:
        agent.fail("setup", exc)
    return agent


#: When a collector is installed: with the agent (:data:`AT_START`), at the first flush, about a
#: second in, on the writer thread (:data:`AT_FIRST_FLUSH`), or when the job imports one of the
#: modules named (a post-import hook: at once when it is imported already).
AT_START: tuple[str, ...] = ()
AT_FIRST_FLUSH: tuple[str, ...] = ("",)
_TORCH: tuple[str, ...] = ("torch",)

#: The always-on collectors, "module:Class", in installation order, each with when it is installed
#: and the agent option without which it has nothing to do (None: always). A collector that cannot
#: be imported or built is reported once (fail open) and the others run. The torch hooks of the
#: collectors installed at ``import torch`` run in this order, after those of the collectors
#: installed at start-up.
COLLECTORS: list[tuple[str, tuple[str, ...], str | None]] = [
    ("holoprof.collect.knobs:KnobCollector", AT_START, "knobs"),  # before the framework loads
    ("holoprof.collect.torch:TorchCollector", _TORCH, None),
    ("holoprof.collect.checkpoints:CheckpointCollector", _TORCH, None),
    ("holoprof.collect.tensorflow:TensorFlowCollector", ("tensorflow", "keras"), None),
    ("holoprof.collect.control:ControlCollector", AT_FIRST_FLUSH, None),
    ("holoprof.collect.memory:MemoryCollector", _TORCH, None),
    ("holoprof.collect.flops:FlopCollector", _TORCH, None),
    ("holoprof.collect.compile:CompileCollector", _TORCH, None),
    ("holoprof.collect.comm:CommCollector", _TORCH, None),
    ("holoprof.collect.io_collector:IoCollector", AT_START, None),  # the process's first read on
]

#: In a DataLoader worker started with "spawn" (:func:`loader_worker_start`), what it installs at
#: ``import torch`` in place of the collectors of :data:`COLLECTORS` named here: its batch fetches for
#: the torch collector, the checkpoint collector itself (a dataset's ``torch.load``). The others
#: hooked on torch (the training-step collectors) are left out: a worker never trains
#: (:mod:`holoprof.collect.torch.worker`).
IN_LOADER_WORKER: dict[str, str] = {
    "holoprof.collect.torch:TorchCollector": "holoprof.collect.torch.worker:LoaderWorkerCollector",
    "holoprof.collect.checkpoints:CheckpointCollector": "holoprof.collect.checkpoints:CheckpointCollector",
}


def _build(agent: Agent, target: str) -> Collector | None:
    """The collector ``target`` ("module:Class") for ``agent``; None when disabled or failing."""
    module_name, cls_name = target.split(":")
    try:
        __import__(module_name)
        cls = getattr(sys.modules[module_name], cls_name)
        if getattr(cls, "name", None) in set(agent.options.get("disable", [])):
            return None
        collector: Collector = cls(agent)
        return collector
    except Exception as exc:
        agent.fail(module_name.rsplit(".", 1)[-1], exc)
        return None


def _wanted(agent: Agent, option: str | None) -> bool:
    return option is None or bool(agent.options.get(option))


def default_collectors(agent: Agent) -> list[Collector]:
    """The collectors installed with the agent; ``options["disable"]`` lists names to skip."""
    built = [
        _build(agent, target)
        for target, when, option in COLLECTORS
        if when == AT_START and _wanted(agent, option)
    ]
    return [c for c in built if c is not None]


def install_now(agent: Agent, targets: list[str]) -> list[Collector]:
    """Build and install the collectors ``targets`` in a running agent (the deferred ones); returns them."""
    if agent._stopped:
        return []  # holoprof.stop() came first
    installed = []
    for target in targets:
        c = _build(agent, target)
        if c is None:
            continue
        agent.collectors.append(c)
        installed.append(c)
        try:
            c.install()
        except Exception as exc:
            agent.fail(c, exc)
    return installed


#: How long at most a child that multiprocessing starts with "spawn" (its command line ends with
#: :data:`SPAWN_CHILD_ARG`) while its parent starts DataLoader workers (:func:`started_by_loader`) holds
#: its first flush: a worker releases it when it begins its loop, after its start-up (``import torch``,
#: about a second; more on a slow file system), so that its first flush, with the set-up that waits for
#: it, does not compete with that start-up. The other processes started meanwhile (multiprocessing's
#: resource tracker, a fork server) are not held.
LOADER_WORKER_HOLD_S = 10.0
#: the hold's largest limit that ``HOLOPROF_LOADER_HOLD_S`` can set
LOADER_WORKER_HOLD_MAX_S = 3600.0
SPAWN_CHILD_ARG = "--multiprocessing-fork"


def loader_hold_s() -> float:
    """:data:`LOADER_WORKER_HOLD_S`, or ``HOLOPROF_LOADER_HOLD_S`` where it is a number of seconds (at most
    :data:`LOADER_WORKER_HOLD_MAX_S`)."""
    try:
        held = float(os.environ.get(model.ENV_LOADER_HOLD) or LOADER_WORKER_HOLD_S)
    except ValueError:
        held = LOADER_WORKER_HOLD_S
    if held != held:  # NaN
        held = LOADER_WORKER_HOLD_S
    return min(max(0.0, held), LOADER_WORKER_HOLD_MAX_S)


def _writer_before_target(_module: ModuleType) -> None:
    before_target(_start_writer)


def _start_writer(_process: Any) -> None:
    agent = core.get_agent()
    if agent is not None:
        agent.start_writer()


def started_by_loader() -> bool:
    """Whether this process was started while its parent was starting DataLoader workers: its parent
    marked them with its pid (``HOLOPROF_LOADER_WORKERS``). A worker started with "spawn", mostly."""
    return os.environ.get(model.ENV_LOADER_WORKERS) == str(os.getppid())


def loader_worker_start() -> bool:
    """Whether this process is a DataLoader worker started with "spawn" that imports torch now: its
    parent marked it (:func:`started_by_loader`), and multiprocessing is loading what the parent sent."""
    return started_by_loader() and loading_from_parent()


def install_in_loader_worker(agent: Agent, targets: list[str]) -> None:
    """Install what a DataLoader worker needs of the collectors ``targets`` (:data:`IN_LOADER_WORKER`);
    the rest, in place of those swapped, only if the process's target is not torch's worker loop."""
    # lazy: a DataLoader worker's side of the torch collector, only in such a worker
    from holoprof.collect.torch.worker import unless_loader_worker

    replacements: list[Collector] = []  # installed in place of another collector
    for target in targets:
        light = IN_LOADER_WORKER.get(target)
        if light is not None:
            built = install_now(agent, [light])
            if light != target:
                replacements.extend(built)

    def not_a_worker() -> None:
        for c in replacements:
            c.uninstall()
            if c in agent.collectors:
                agent.collectors.remove(c)
        install_now(agent, [t for t in targets if IN_LOADER_WORKER.get(t) != t])

    unless_loader_worker(not_a_worker, starting=agent.release_flushes)


def defer_collectors(agent: Agent) -> None:
    """Hook the collectors that wait: on the modules that install them, and on the first flush."""
    by_module: dict[str, list[str]] = {}
    at_flush: list[str] = []
    for target, when, option in COLLECTORS:
        if when == AT_START or not _wanted(agent, option):
            continue
        if when == AT_FIRST_FLUSH:
            at_flush.append(target)
            continue
        for name in when:
            by_module.setdefault(name, []).append(target)
    done: set[str] = set()  # a collector hooked on two modules (tensorflow, keras) is installed once

    def installer(targets: list[str], module: str = "") -> Any:
        def install(_module: ModuleType | None = None) -> None:
            todo = [t for t in targets if t not in done]
            done.update(todo)
            with OffTheClock():
                if module == "torch" and loader_worker_start():
                    install_in_loader_worker(agent, todo)
                else:
                    if module == "torch":
                        agent.release_flushes()  # not a worker after all: its start-up is over
                    install_now(agent, todo)

        return install

    finder = post_import_finder()
    for name, targets in by_module.items():
        finder.add(name, installer(targets, name))
    if at_flush:
        agent.deferred.append(installer(at_flush))


def after_collectors(agent: Agent) -> None:
    """Process-wide set-up once every collector is installed or hooked: the garbage collector's reset
    runs after every collector's own torch hook. (The writer's raw chunk module is imported with the
    agent, so that a worker forked before the first flush, a DataLoader's, does not import it at its
    final flush, which the training loop waits for.)"""
    if agent.options.get(OPTION_GC_RESET, True) and "torch" not in sys.modules:
        post_import_finder().add("torch", reset_gc_clock)
