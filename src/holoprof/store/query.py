"""``holoprof query RUN "SQL"``: SQL over a run's tables and views, read-only.

The tables (:data:`holoprof.model.TABLES`) and views (:data:`holoprof.store.reader.VIEWS`) are there
by name. Only one query is run (``SELECT``, ``WITH ...``, ``DESCRIBE``, ``SHOW``...), and after the run
is loaded DuckDB's access to files outside the run (and its private temporary folder) is switched off
(``allowed_directories``, ``enable_external_access``), so
SQL can neither read nor write anything else (``COPY``, ``ATTACH``, ``read_csv('/etc/...')`` fail).
Output: a table (default), ``--json`` (a list of objects), ``--csv``.
"""

from __future__ import annotations

from typing import Any

from holoprof import model
from holoprof.errors import HoloprofError
from holoprof.store.reader import VIEWS, corrupt_chunks, is_corrupt_data

#: statement types DuckDB may run here (anything else is refused before it runs)
_READ_ONLY = ("SELECT", "EXPLAIN")


def query(run: Any, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one read-only statement over the loaded run ``run``; its column names and rows."""
    import duckdb  # lazy: DuckDB loads only where a run is queried

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
    allowed = [run.root.rstrip("/") + "/", run.temp_dir.rstrip("/") + "/"]
    con.execute("SET allowed_directories = ?", [allowed])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    try:
        cur = con.execute(sql)
    except duckdb.Error as exc:
        if is_corrupt_data(exc) and corrupt_chunks(run.path):
            raise  # a chunk whose data does not decode: the command reads the run again without it
        raise HoloprofError(f"the query failed ({_first_line(exc)}); the tables and views: {_names(run)}")
    return [d[0] for d in cur.description or []], cur.fetchall()


def _names(run: Any) -> str:

    return ", ".join((*model.TABLES, *VIEWS))


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
