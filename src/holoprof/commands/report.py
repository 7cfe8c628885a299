"""`holoprof report RUN [--json] [--html FILE]`: every analysis of a run, rendered."""

from __future__ import annotations

import argparse
import json
import sys

from holoprof.analyze.report import build_report
from holoprof.commands.common import add_engine_arguments, check_engine_arguments
from holoprof.errors import HoloprofError
from holoprof.launch.peak import ensure_peaks
from holoprof.present.html import render_html, write_html
from holoprof.present.terminal import render
from holoprof.store.reader import Run, load


def add_arguments(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("run", help="a run directory")
    rp.add_argument("--json", action="store_true", help="print the report as JSON (schema holoprof.report/1)")
    rp.add_argument("--html", metavar="FILE", help="write a self-contained HTML report (- for stdout)")
    add_engine_arguments(rp)


def measure_peaks(run: Run) -> None:
    """A run made on this machine whose CPU peak FLOP/s is not in it yet (``holoprof.start()`` runs,
    which no launcher finished): measured now, or taken from the machine's cache, and written into
    it; a run that cannot be written is reported without."""
    try:
        for note in ensure_peaks(run.path, run):
            sys.stderr.write(f"holoprof: {note}\n")
    except Exception:
        # a run directory this user cannot write, or a run the report cannot read either (the report
        # then says why, in one line): MFU says which peak is missing
        pass


def main(args: argparse.Namespace) -> int:
    check_engine_arguments(args)
    if args.html == "-" and args.json:
        raise HoloprofError("--html - and --json both write to stdout; choose one")
    run = load(args.run)
    measure_peaks(run)
    doc = build_report(run, engine=args.engine, scheduler=args.scheduler)
    if args.html == "-":
        sys.stdout.buffer.write(render_html(doc).encode("utf-8"))
        return 0
    if args.html:
        write_html(doc, args.html)
        sys.stderr.write(f"holoprof: wrote {args.html}\n")
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    elif not args.html:
        render(doc)
    return 0
