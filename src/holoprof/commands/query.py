"""`holoprof query RUN SQL`."""

from __future__ import annotations

import argparse
import csv
import json
import sys

from rich.console import Console
from rich.table import Table

from holoprof.store.query import query
from holoprof.store.reader import load


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run directory (or a packed run)")
    p.add_argument(
        "sql", metavar="SQL", help='one query, e.g. "SELECT kind, count(*) FROM spans GROUP BY kind"'
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the rows as a JSON list of objects")
    fmt.add_argument("--csv", action="store_true", help="print the rows as CSV with a header")


def main(args: argparse.Namespace) -> int:
    run = load(args.run)
    for warning in run.warnings:
        sys.stderr.write(f"holoprof: warning: {warning}\n")
    names, rows = query(run, args.sql)
    if args.json:
        json.dump([dict(zip(names, r, strict=True)) for r in rows], sys.stdout, default=str)
        sys.stdout.write("\n")
    elif args.csv:
        out = csv.writer(sys.stdout)
        out.writerow(names)
        out.writerows(rows)
    else:
        table = Table(*names, show_lines=False)
        for r in rows:
            table.add_row(*("" if v is None else str(v) for v in r))
        Console(markup=False, highlight=False).print(table)
    return 0
