"""`holoprof report RUN [--json] [--html FILE]`: every analysis of a run, rendered."""

from __future__ import annotations

import argparse
import json
import sys

from holoprof.analyze.report import build_report
from holoprof.commands.common import add_engine_arguments, check_engine_arguments
from holoprof.errors import HoloprofError
from holoprof.present.html import render_html, write_html
from holoprof.present.terminal import render
from holoprof.store.reader import load


def add_arguments(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("run", help="a run directory")
    rp.add_argument("--json", action="store_true", help="print the report as JSON (schema holoprof.report/1)")
    rp.add_argument("--html", metavar="FILE", help="write a self-contained HTML report (- for stdout)")
    add_engine_arguments(rp)


def main(args: argparse.Namespace) -> int:
    check_engine_arguments(args)
    if args.html == "-" and args.json:
        raise HoloprofError("--html - and --json both write to stdout; choose one")
    doc = build_report(load(args.run), engine=args.engine, scheduler=args.scheduler)
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
