"""``holoprof query RUN "SQL"``: SQL over a run's tables and views, read-only.

The tables (:data:`holoprof.model.TABLES`) and views (:data:`holoprof.store.reader.VIEWS`) are there
by name. Only one query is run (``SELECT``, ``WITH ...``, ``DESCRIBE``, ``SHOW``...), and after the run
is loaded DuckDB's access to files outside the run (and its private temporary folder) is switched off
(``allowed_directories``, ``enable_external_access``), so
SQL can neither read nor write anything else (``COPY``, ``ATTACH``, ``read_csv('/etc/...')`` fail).
Output: a table (default), ``--json`` (a list of objects), ``--csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from holoprof.errors import HoloprofError

#: statement types DuckDB may run here (anything else is refused before it runs)
_READ_ONLY = ("SELECT", "EXPLAIN")


def query(run: Any, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one read-only statement over the loaded run ``run``; its column names and rows."""
    import duckdb

    con = run.con
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise HoloprofError(f"the query does not parse ({_first_line(exc)}); check its SQL")
    if len(statements) != 1:
        raise HoloprofError(f"give one query, not {len(statements)} statements")
    (stmt,) = statements
    kind = str(stmt.type).rsplit(".", 1)[-1].upper()
    if kind not in _READ_ONLY:
        raise HoloprofError(f"only queries are run here, not {kind}; `holoprof query` is read-only")
    allowed = [run.path.rstrip("/") + "/", run.temp_dir.rstrip("/") + "/"]
    con.execute("SET allowed_directories = ?", [allowed])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    try:
        cur = con.execute(sql)
    except duckdb.Error as exc:
        raise HoloprofError(f"the query failed ({_first_line(exc)}); the tables and views: {_names(run)}")
    return [d[0] for d in cur.description or []], cur.fetchall()


def _names(run: Any) -> str:
    from holoprof import model
    from holoprof.store.reader import VIEWS

    return ", ".join((*model.TABLES, *VIEWS))


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run directory (or a packed run)")
    p.add_argument(
        "sql", metavar="SQL", help='one query, e.g. "SELECT kind, count(*) FROM spans GROUP BY kind"'
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the rows as a JSON list of objects")
    fmt.add_argument("--csv", action="store_true", help="print the rows as CSV with a header")


def main(args: argparse.Namespace) -> int:
    from holoprof.store.reader import load

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
        from rich.console import Console
        from rich.table import Table

        table = Table(*names, show_lines=False)
        for r in rows:
            table.add_row(*("" if v is None else str(v) for v in r))
        Console(markup=False, highlight=False).print(table)
    return 0
