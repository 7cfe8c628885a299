"""Each host's clock offset in a run of several hosts, so that all ranks share one timeline.

Every timestamp a process records is its host's wall clock; hosts' clocks differ (by milliseconds
under NTP, by seconds without it). The offset of a host is estimated from what the run already holds,
without changing what the job computes, and :class:`holoprof.store.reader.Run` subtracts it from
every time column of that host's rows, so that every reader (``holoprof.load``, ``holoprof query``,
the report, the dashboard, the exports) sees the same aligned times.

* **collectives** (preferred): a collective that every rank of a group takes part in (all_reduce,
  all_gather, reduce_scatter, all_to_all, barrier) ends on all of them at nearly the same instant
  (the last rank to arrive releases everyone). The comm collector numbers each process's calls per
  group (attrs ``group`` and ``seq``), so the same call is found on every rank. A host's offset from
  the reference host is the median, over the collectives both took part in, of the difference of
  their end times (each host's end: the median over its ranks); the uncertainty is half the
  interquartile range of those differences (how far apart the "simultaneous" ends are), at least
  1 µs. A host with no collective in common with the reference is aligned through another host.
* **file_server** (when a host has no collectives in common with the others): each launcher of a
  joined run records, when it writes its part of the manifest, its wall time before and after the
  write and the modification time the file system gave the file (:mod:`holoprof.store.hosts`): on
  a file system whose server sets modification times (NFS), that is one reading of the server's
  clock; the offset is the median of ``(before + after) / 2 - mtime``, compared with the reference
  host's, and the uncertainty half the median write time plus the spread of the readings. On a file
  system whose clients set modification times, this says nothing: such offsets are 0 ± the write time.
* **reference**: the host of the launcher that created the run (offset 0 by definition); when that
  host took part in no collective (a launcher on a login node starting ranks elsewhere with ``srun``),
  the first host that did, and the launcher's host is then ``none``.
* **none**: nothing to estimate from; the host's times are used as recorded (uncertainty unknown).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: collectives that every member of the group takes part in, and that end for all at once
SYMMETRIC = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)
#: collectives in common that an estimate needs at least
MIN_MATCHES = 3
#: the smallest uncertainty claimed (the timers are read from Python)
MIN_UNCERTAINTY_NS = 1_000


@dataclass(frozen=True)
class HostClock:
    """A host's clock: ``offset_ns`` ahead of the reference host's (subtract it from its times)."""

    host: str
    offset_ns: int = 0
    uncertainty_ns: int | None = None  # None: not estimated
    source: str = "none"  # reference | collectives | file_server | none
    samples: int = 0  # collectives in common (collectives), clock readings (file_server)


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _collectives_sql(files: Sequence[str]) -> str:
    lst = "[" + ", ".join(_q(f) for f in files) + "]"
    names = ", ".join(_q(n) for n in SYMMETRIC)
    return f"""
        SELECT host, name, g, seq, min(end_ns) AS e FROM (
          SELECT host, name, end_ns, json_extract_string(attrs, '$.group') AS g,
                 TRY_CAST(json_extract_string(attrs, '$.seq') AS BIGINT) AS seq
          FROM read_parquet({lst}, union_by_name=true, hive_partitioning=false)
          WHERE kind = 'comm' AND name IN ({names}) AND attrs LIKE '%"seq"%')
        WHERE seq IS NOT NULL AND g IS NOT NULL
        GROUP BY host, name, g, seq"""


def _pairs(con: Any, table: str, known: list[str], unknown: list[str]) -> list[tuple[Any, ...]]:
    """(unknown host, known host, median, q1, q3, matches) of the end differences of the collectives
    each unknown host has in common with each known one."""
    k = ", ".join(_q(h) for h in known)
    u = ", ".join(_q(h) for h in unknown)
    return list(
        con.execute(
            f"""SELECT b.host, a.host, quantile_disc(b.e - a.e, 0.5), quantile_cont(b.e - a.e, 0.25),
                       quantile_cont(b.e - a.e, 0.75), count(*)
                FROM {table} a JOIN {table} b ON a.name = b.name AND a.g = b.g AND a.seq = b.seq
                WHERE a.host IN ({k}) AND b.host IN ({u})
                GROUP BY b.host, a.host"""
        ).fetchall()
    )


def from_collectives(con: Any, files: Sequence[str], hosts: list[str], ref: str) -> dict[str, HostClock]:
    """The offsets of ``hosts`` from ``ref`` that the matched collectives of the spans ``files`` give
    (the hosts they cannot align are left out). When ``ref`` has no collective (a launcher on a
    login node, its ranks elsewhere), the first host that has one is the reference instead."""
    table = "_holoprof_clock_collectives"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {_collectives_sql(files)}")
    try:
        present = {r[0] for r in con.execute(f"SELECT DISTINCT host FROM {table}").fetchall()}
        if ref not in present:
            ref = next((h for h in hosts if h in present), ref)
        out = {ref: HostClock(ref, 0, 0, "reference")}
        while True:
            unknown = [h for h in hosts if h not in out]
            if not unknown:
                break
            best: dict[str, tuple[Any, ...]] = {}
            for row in _pairs(con, table, list(out), unknown):
                if row[5] >= MIN_MATCHES and (row[0] not in best or row[5] > best[row[0]][5]):
                    best[row[0]] = row
            if not best:
                break
            for host, via, median, q1, q3, n in best.values():
                base = out[via]
                spread = max(int((q3 - q1) / 2), MIN_UNCERTAINTY_NS)
                unc = int(((base.uncertainty_ns or 0) ** 2 + spread**2) ** 0.5)
                out[host] = HostClock(host, base.offset_ns + int(median), unc, "collectives", int(n))
        return out
    finally:
        con.execute(f"DROP TABLE IF EXISTS {table}")


def _server_offset(parts: list[dict[str, Any]]) -> tuple[int, int, int] | None:
    """(offset from the file server's clock, uncertainty, readings) of one host's launchers."""
    offsets, halves = [], []
    for p in parts:
        for probe in p.get("clock_probes") or []:
            if (
                isinstance(probe, list)
                and len(probe) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in probe)
                and probe[2] >= probe[0]
            ):
                t0, mtime, t1 = probe
                offsets.append((t0 + t1) // 2 - mtime)
                halves.append((t1 - t0) // 2)
    if not offsets:
        return None
    spread = 0
    if len(offsets) >= 4:
        qs = statistics.quantiles(offsets, n=4)
        spread = int((qs[2] - qs[0]) / 2)
    return int(statistics.median(offsets)), int(statistics.median(halves)) + spread, len(offsets)


def from_file_server(parts: list[dict[str, Any]], hosts: list[str], ref: str) -> dict[str, HostClock]:
    """The offsets of ``hosts`` from ``ref`` that the launchers' readings of the file server's clock
    give (hosts without readings, or all of them when ``ref`` has none, are left out)."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        by_host.setdefault(str(p.get("host")), []).append(p)
    base = _server_offset(by_host.get(ref, []))
    if base is None:
        return {}
    out = {}
    for h in hosts:
        mine = _server_offset(by_host.get(h, [])) if h != ref else None
        if mine is not None:
            out[h] = HostClock(h, mine[0] - base[0], mine[1] + base[1], "file_server", mine[2])
    return out


def estimate(
    con: Any,
    files: Sequence[str],
    host_of: Callable[[str], str | None],
    manifest: dict[str, Any],
) -> dict[str, HostClock]:
    """Every host's clock in a run: the hosts of the chunk ``files`` (``host_of`` each) and of the
    manifest. One host: offset 0, by definition. ``con``: a DuckDB connection; ``files``: the run's
    spans chunks."""
    hosts = list(
        dict.fromkeys([*(str(h) for h in manifest.get("hosts") or []), *filter(None, map(host_of, files))])
    )
    ref = manifest.get("host") if manifest.get("host") in hosts else (hosts[0] if hosts else "")
    if len(hosts) <= 1:
        return {h: HostClock(h, 0, 0, "reference") for h in hosts}
    out = from_collectives(con, files, hosts, str(ref)) if files else {}
    anchor = next((h for h, c in out.items() if c.source == "reference"), str(ref))
    if anchor == ref:  # (readings of the file server's clock are against the run's creator)
        for h, clock in from_file_server(manifest.get("host_parts") or [], hosts, str(ref)).items():
            out.setdefault(h, clock)
        out.setdefault(str(ref), HostClock(str(ref), 0, 0, "reference"))
    return {h: out.get(h, HostClock(h)) for h in hosts}
