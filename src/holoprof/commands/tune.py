"""`holoprof tune -- COMMAND`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from holoprof.errors import HoloprofError
from holoprof.present.sweep import render, render_measured
from holoprof.workflows.tune import DEFAULT_STEPS, tune


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, help=f"steps per run (default {DEFAULT_STEPS})"
    )
    p.add_argument("--out", help="directory for the runs (default: ./holoprof-runs/<time>-tune)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (schema holoprof.tune/1)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.steps <= 0:
        raise HoloprofError("--steps must be a positive number of steps, e.g. --steps 30")
    out = args.out or os.path.join("holoprof-runs", time.strftime("%Y%m%d-%H%M%S") + "-tune")

    def progress(what: str) -> None:
        sys.stderr.write(f"holoprof: tune: {what}\n")
        sys.stderr.flush()

    doc = tune(command, out, args.steps, progress)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if "message" in doc:
        sys.stdout.write(f"{doc['message']}\n")
        return 0
    render(doc["sweep"])
    render_measured(doc["measured"])
    return 0
