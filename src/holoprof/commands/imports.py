"""`holoprof import darshan LOG --out DIR`, `holoprof import torch-trace PATH --out DIR`: another
tool's trace as a holoprof run directory, then the short report as ``holoprof run`` ends."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from holoprof.commands.run import short_report
from holoprof.errors import HoloprofError, printable_text
from holoprof.present.progress import progress
from holoprof.store.chunks import without_pandas
from holoprof.store.import_darshan import import_darshan_log
from holoprof.store.import_torch_trace import import_torch_trace, skipped_files, temporal_breakdown


def _darshan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", help="the Darshan log file (.darshan)")
    parser.add_argument("--out", help="run directory to create (default: ./holoprof-runs/<time>-<log name>)")


def _darshan(args: argparse.Namespace) -> int:
    run_dir, notes = import_darshan_log(args.log, args.out)
    return imported(args, args.log, run_dir, notes)


def _torch_trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", help="a Kineto trace (.json or .json.gz) or a directory of them (one per rank)"
    )
    parser.add_argument("--out", help="run directory to create (default: ./holoprof-runs/<time>-<name>)")


def _torch_trace(args: argparse.Namespace) -> int:
    with without_pandas():  # this command's own process (and its workers): nothing here needs pandas
        # no drawing thread: the import forks its workers when this process has a single thread
        with progress("reading the trace", refresh_thread=False) as bar:
            run_dir = import_torch_trace(args.path, args.out, jobs=None, bar=bar)
        notes = [
            f"rank {b['rank']} device time {b['kernel_time_s'] * 1e3:.1f} ms: "
            f"idle {b['idle_fraction']:.1%}, compute {b['compute_fraction']:.1%}, "
            f"non-compute {b['non_compute_fraction']:.1%}"
            for b in temporal_breakdown(run_dir)
        ]
        notes += [f"skipped {name}" for name in skipped_files(run_dir)]
        return imported(args, args.path, run_dir, notes)


Arguments = Callable[[argparse.ArgumentParser], None]
Runner = Callable[[argparse.Namespace], int]
#: format -> (help, its arguments, its run)
IMPORTERS: dict[str, tuple[str, Arguments, Runner]] = {
    "darshan": (
        "a Darshan log (.darshan): holoprof import darshan LOG --out DIR",
        _darshan_arguments,
        _darshan,
    ),
    "torch-trace": (
        "a PyTorch profiler (Kineto) trace or a folder of them: holoprof import torch-trace PATH --out DIR",
        _torch_trace_arguments,
        _torch_trace,
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="import_format", metavar="FORMAT", parser_class=type(parser))
    for name, (help_text, arguments, runner) in IMPORTERS.items():
        sp = sub.add_parser(name, help=help_text)
        arguments(sp)
        sp.add_argument("--no-report", action="store_true", help="do not print the report at the end")
        sp.set_defaults(import_run=runner)


def main(args: argparse.Namespace) -> int:
    runner = getattr(args, "import_run", None)
    if runner is None:
        raise HoloprofError(f"say what to import: holoprof import {{{','.join(IMPORTERS)}}} PATH --out DIR")
    return int(runner(args))


def imported(args: argparse.Namespace, source: str, run_dir: str, notes: Sequence[str] = ()) -> int:
    """What every importer prints when it is done: the run, its notes and (unless ``--no-report``) the
    short report, as ``holoprof run`` ends."""
    shown = printable_text(run_dir)
    sys.stderr.write(f"holoprof: imported {printable_text(source)} into {shown}\n")
    for note in notes:
        sys.stderr.write(f"holoprof: {note}\n")
    if not getattr(args, "no_report", False):
        short_report(run_dir)
    sys.stderr.write(f"holoprof: run saved in {shown}; see it again with: holoprof report {shown}\n")
    return 0
