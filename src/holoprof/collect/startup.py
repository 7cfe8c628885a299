"""Starting the agent with its collectors in a process of a traced job.

``holoprof run`` starts it from the environment it set up (its ``sitecustomize`` calls
:func:`start_from_env` at interpreter start-up); ``holoprof.start()`` calls :func:`start_agent`.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

from holoprof import model
from holoprof.agent import core
from holoprof.agent.core import Agent, Collector
from holoprof.agent.setup import OPTION_GC_RESET, post_import_finder, reset_gc_clock


def options_from_env() -> dict[str, Any]:
    raw = os.environ.get(model.ENV_OPTIONS)
    if not raw:
        return {}
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
    agent.start()
    try:
        after_collectors(agent)
    except Exception as exc:
        agent.fail("setup", exc)
    return agent


#: The always-on collectors, "module:Class", in installation order. A collector that cannot be
#: imported or built is reported once (fail open) and the others run.
COLLECTORS: list[str] = [
    "holoprof.collect.knobs:KnobCollector",
    "holoprof.collect.torch:TorchCollector",
    "holoprof.collect.checkpoints:CheckpointCollector",
    "holoprof.collect.tensorflow:TensorFlowCollector",
    "holoprof.collect.control:ControlCollector",
    "holoprof.collect.memory:MemoryCollector",
    "holoprof.collect.flops:FlopCollector",
    "holoprof.collect.compile:CompileCollector",
    "holoprof.collect.comm:CommCollector",
    "holoprof.collect.io_collector:IoCollector",
]


def default_collectors(agent: Agent) -> list[Collector]:
    """The always-on collectors for this process; ``options["disable"]`` lists names to skip."""
    disabled = set(agent.options.get("disable", []))
    collectors: list[Collector] = []
    for target in COLLECTORS:
        module_name, cls_name = target.split(":")
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
            if getattr(cls, "name", None) in disabled:
                continue
            collectors.append(cls(agent))
        except Exception as exc:
            agent.fail(module_name.rsplit(".", 1)[-1], exc)
    return collectors


def after_collectors(agent: Agent) -> None:
    """Process-wide set-up once every collector is installed. (The writer's raw chunk module is
    imported with the agent, so that a worker forked before the first flush, a DataLoader's, does not
    import it at its final flush, which the training loop waits for.)"""
    if agent.options.get(OPTION_GC_RESET, True) and "torch" not in sys.modules:
        post_import_finder().add("torch", reset_gc_clock)
