"""`holoprof export RUN --format chrome|tensorboard -o PATH`."""

from __future__ import annotations

import argparse
import sys

from holoprof.commands.common import add_engine_arguments, check_engine_arguments, finite_float
from holoprof.errors import HoloprofError
from holoprof.exports.formats import FORMATS, export_run
from holoprof.store.pack import open_run
from holoprof.store.reader import load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run directory or a .holoprof pack")
    parser.add_argument("--format", "-f", required=True, choices=FORMATS, help="chrome or tensorboard")
    parser.add_argument(
        "-o",
        "--out",
        required=True,
        help="the file (chrome; - for stdout) or log directory (tensorboard) to write",
    )
    parser.add_argument(
        "--from", dest="start_s", type=finite_float, help="chrome: start of the window, seconds"
    )
    parser.add_argument("--to", dest="end_s", type=finite_float, help="chrome: end of the window, seconds")
    add_engine_arguments(parser)


def main(args: argparse.Namespace) -> int:
    check_engine_arguments(args)
    if args.start_s is not None and args.start_s < 0:
        raise HoloprofError("--from must be 0 or more seconds after the run start")
    if args.start_s is not None and args.end_s is not None and args.end_s <= args.start_s:
        raise HoloprofError(f"--to ({args.end_s}) must be after --from ({args.start_s})")
    if args.format != "chrome" and (args.start_s is not None or args.end_s is not None):
        raise HoloprofError("--from/--to apply to --format chrome only; leave them out for tensorboard")
    run = load(open_run(args.run))
    msg = export_run(run, args.format, args.out, args.start_s, args.end_s, args.engine, args.scheduler)
    sys.stderr.write(f"holoprof: {msg}\n")
    return 0
