"""`holoprof run [options] -- COMMAND`: run a command traced, then print its short report.

Options come from the parts of the agent they configure (sampling, memory, I/O, TensorFlow,
checkpoints, knobs); each is checked here and handed to the agent as JSON in its environment.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from holoprof import model
from holoprof.commands.common import finite_float
from holoprof.errors import HoloprofError
from holoprof.knobspec import KNOBS, parse_assignments
from holoprof.launch.run import run

#: ``--io-layer`` choices
IO_LAYERS = ("auto", "native", "python")


def add_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("--out", help="run directory to create (default: ./holoprof-runs/<time>-<name>)")
    r.add_argument("--name", help="name of the run (default: the script's name)")
    r.add_argument(
        "--join",
        action="store_true",
        help="one node of a multi-node job: create the run --out DIR, or join it as one more host when "
        "another node's holoprof run --join has created it (DIR on a file system all nodes share)",
    )
    r.add_argument(
        "--sample-interval", type=finite_float, help="seconds between resource samples (default 1)"
    )
    r.add_argument(
        "--flush-interval", type=finite_float, help="seconds between flushes to disk (default 1, at most 1)"
    )
    r.add_argument("--no-report", action="store_true", help="do not print the report at the end")
    r.add_argument(
        "--hang-timeout",
        type=finite_float,
        metavar="S",
        help="a rank stuck in one collective or one step for max(S, 20 x the median step) seconds is "
        "a hang: its stacks and collectives go into the run, the report shows a 'hang' finding "
        "(default 300; 0 turns the watchdog off)",
    )
    _tensorflow_arguments(r)
    _checkpoint_arguments(r)
    _memory_arguments(r)
    _io_arguments(r)
    _knob_arguments(r)
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command to trace, after --")


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    options = run_options(args)
    report = None if args.no_report else short_report
    if args.join and not args.out:
        raise HoloprofError(
            "--join needs --out DIR: the same run directory on every node, on a file system they share"
        )
    return run(command, out=args.out, name=args.name, options=options, report=report, join=args.join)


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The agent options of ``holoprof run``'s flags (JSON-able), each checked."""
    options: dict[str, Any] = {}
    if args.sample_interval is not None:
        if args.sample_interval <= 0:
            raise HoloprofError("--sample-interval must be a positive number of seconds, e.g. 0.5")
        options["sample_interval_s"] = args.sample_interval
    if args.flush_interval is not None:
        if not 0 < args.flush_interval <= 1:
            raise HoloprofError("--flush-interval must be between 0 and 1 second")
        options["flush_interval_s"] = args.flush_interval
    if getattr(args, "hang_timeout", None) is not None:
        if args.hang_timeout < 0:
            raise HoloprofError(
                "--hang-timeout must be a number of seconds (0 turns the watchdog off), e.g. 300"
            )
        options["hang_timeout_s"] = args.hang_timeout
    for part in (_tensorflow_options, _checkpoint_options, _memory_options, _io_options, _knob_options):
        options.update(part(args))
    return options


def short_report(run_dir: str) -> None:
    """The short report of a saved run on stdout (after the job's own output), as commands print it when
    they end; never raises."""
    try:
        # lazy: DuckDB and the analyses load once the job has ended, not while the launcher starts it
        from holoprof.analyze.report import build_report
        from holoprof.present.terminal import render  # lazy: with the report, after the job
        from holoprof.store.reader import load, skip_corrupt  # lazy: DuckDB, after the job

        doc = skip_corrupt(lambda: build_report(load(run_dir)), [run_dir])
        sys.stdout.flush()
        render(doc, short=True, file=sys.stdout)
    except Exception as exc:
        sys.stderr.write(f"holoprof: could not build the report ({type(exc).__name__}: {exc})\n")


# --- TensorFlow ----------------------------------------------------------------------------------------
def _tensorflow_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tf-input-timing",
        choices=("on", "off"),
        default=None,
        help=(
            "Keras: time each batch fetch as data_wait (default off: Keras's in-graph fetch, the exact "
            "computation; on changes how Keras iterates, for diagnosing an input pipeline)"
        ),
    )


def _tensorflow_options(args: argparse.Namespace) -> dict[str, Any]:
    value = getattr(args, "tf_input_timing", None)
    return {} if value is None else {"tf_input_timing": value}


# --- checkpoints: --mtbf HOURS -------------------------------------------------------------------------
def _checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mtbf",
        type=finite_float,
        metavar="HOURS",
        help="mean time between failures of the job's machines, for the checkpoint interval advice",
    )


def _checkpoint_options(args: argparse.Namespace) -> dict[str, Any]:
    v = getattr(args, "mtbf", None)
    if v is None:
        return {}
    if not v > 0:
        raise HoloprofError("--mtbf must be a positive number of hours, e.g. --mtbf 24")
    return {"mtbf_s": v * 3600.0}


# --- memory ----------------------------------------------------------------------------------------------
def _memory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--memory",
        choices=model.MEMORY_MODES,
        default=None,
        help="memory by category: on sampled steps (default: the first 3, then 1 in 200), every step, or off",
    )
    parser.add_argument(
        "--stop-after-steps",
        type=int,
        default=None,
        metavar="N",
        help="end the job cleanly (exit status 0) after N optimizer steps (quick looks, sweeps)",
    )
    parser.add_argument(
        "--flops",
        choices=("on", "off"),
        default=None,
        help="count the FLOPs of one training step (the second) for MFU (default on; PyTorch)",
    )


def _memory_options(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    mode = getattr(args, "memory", None)
    if mode is not None:
        out["memory"] = mode
    n = getattr(args, "stop_after_steps", None)
    if n is not None:
        if n <= 0:
            raise HoloprofError("--stop-after-steps must be a positive number of steps, e.g. 20")
        out["stop_after_steps"] = n
    flops = getattr(args, "flops", None)
    if flops is not None:
        out["flops"] = flops
    return out


# --- I/O: which paths count, which layer, the per-op trace ------------------------------------------------
def _io_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("I/O profiling")
    g.add_argument(
        "--io-include",
        action="append",
        metavar="PREFIX",
        default=[],
        help="count files under PREFIX even where they are left out by default (the interpreter's "
        "own files, /proc, /sys, /dev); repeatable",
    )
    g.add_argument(
        "--io-exclude",
        action="append",
        metavar="PREFIX",
        default=[],
        help="do not count files under PREFIX; repeatable",
    )
    g.add_argument(
        "--io-trace",
        action="store_true",
        help="record every I/O operation of the whole run in the io_ops table (heavier)",
    )
    g.add_argument(
        "--io-layer",
        choices=IO_LAYERS,
        default=None,
        help="where I/O is counted: native (the preloaded C library), python (patched Python file "
        "calls), auto (native when loaded; the default)",
    )


def _io_options(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("io_include", "io_exclude"):
        values = list(getattr(args, key, None) or [])
        for v in values:
            if not v or not v.strip():
                flag = "--" + key.replace("_", "-")
                raise HoloprofError(f"{flag} needs a path prefix, e.g. {flag} /data/train")
        if values:
            out[key] = values
    if getattr(args, "io_trace", False):
        out["io_trace"] = True
    layer = getattr(args, "io_layer", None)
    if layer:
        out["io_layer"] = layer
    return out


# --- knobs: --set KNOB=VALUE ------------------------------------------------------------------------------
def _knob_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=None,
        dest="knobs",
        metavar="KNOB=VALUE",
        help=f"apply a knob inside the job with no code change (repeatable): {', '.join(KNOBS)}",
    )


def _knob_options(args: argparse.Namespace) -> dict[str, Any]:
    specs = getattr(args, "knobs", None)
    if not specs:
        return {}
    parsed = parse_assignments(list(specs))
    many = [k for k, v in parsed.items() if len(v) != 1]
    if many:
        raise HoloprofError(
            f"holoprof run --set takes one value per knob ({many[0]} has {len(parsed[many[0]])}); "
            "use holoprof sweep --set to measure several"
        )
    return {"knobs": {k: v[0] for k, v in parsed.items()}}
