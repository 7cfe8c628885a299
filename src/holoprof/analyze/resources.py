"""Resources over time: summary statistics and downsampled series of the job-wide samples, and each
host's own figures (CPU, memory, network, GPU) in a run of several hosts.

The job-wide samples (``target_pid = -1``) come from each host's launcher (:mod:`holoprof.collect.system`):
``host.*`` for the whole machine, ``job.*`` for the job's processes on it. :func:`resources` combines
the hosts at each instant (``job.*``: the job's total, the sum over the hosts; ``host.*`` and
``gpu.*``: the mean over the hosts); :func:`host_resources` keeps them apart.
Every time is already on the reference host's clock: the run's reader takes each host's clock offset
off its rows (:mod:`holoprof.store.clocks`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from holoprof.analyze.engine import Aggregation, Engine, engine_for
from holoprof.store.reader import Run


@dataclass
class SeriesStat:
    name: str
    mean: float
    max: float
    last: float
    count: int


@dataclass
class HostStat:
    """One figure of one host over the run: its samples' mean, 90th percentile and largest value."""

    mean: float
    p90: float
    max: float
    count: int


@dataclass
class HostResources:
    host: str
    stats: dict[str, HostStat] = field(default_factory=dict)  # HOST_METRICS key -> its figures


#: A host's figures (the report's ``resources.hosts``): key -> the sample it summarizes. Every GPU of
#: a host is pooled into ``gpu_util_percent``.
HOST_METRICS: dict[str, str] = {
    "cpu_percent": "host.cpu_percent",  # the whole machine, 100 = every core busy
    "memory_used_bytes": "host.mem_used_bytes",
    "net_recv_bytes_per_s": "host.net_recv_bytes_per_s",
    "net_sent_bytes_per_s": "host.net_sent_bytes_per_s",
    "job_cpu_percent": "job.cpu_percent",  # the job's processes on the host, 100 = one core
    "job_rss_bytes": "job.rss_bytes",
    "gpu_util_percent": "gpu.util_percent",
}


@dataclass
class Resources:
    stats: dict[str, SeriesStat] = field(default_factory=dict)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # name -> [(t_s, value)]
    start_ns: int = 0
    gpus: list[int] = field(default_factory=list)
    #: each host's figures (:func:`host_resources`), by host name
    hosts: list[HostResources] = field(default_factory=list)

    def get(self, name: str) -> SeriesStat | None:
        return self.stats.get(name)


def _resources_agg(points: int, window: tuple[int, int] | None) -> Aggregation:
    """The job-wide samples (``target_pid = -1``; within ``window``, ns), each host's (each launcher's:
        ``host``, ``pid``) combined into one figure per instant at which any host sampled: ``job.*`` the
        sum of every host's latest sample (the job's total), the others (``host.*``, ``gpu.*``) their mean
        over the hosts. A host counts from its first sample of a series until three of its sampling
    intervals after its last (3 s for a single sample): in a live run every host that still samples
    counts, a host whose launcher ended long before the others does not. The sum is carried
        as a running sum of each host's changes (a host's new sample replaces its last one), in exact
        decimals (6 places), so one host's figures are its samples, and both engines get the same digits.

        Then per series (``part`` 0) the mean, maximum, last value and count of those instants' figures,
        and (``part`` 1) their mean in each of ``points`` buckets of ``width`` ns from the first instant,
        ``t0``. The samples are few next to the spans: the last stage holds all of them (on one worker
        under Dask)."""
    where = " AND ts_ns BETWEEN $lo AND $hi" if window is not None else ""
    return Aggregation(
        name="resources",
        table="samples",
        columns=("host", "pid", "ts_ns", "name", "value", "target_pid"),
        chunk=f"SELECT host, pid, name, ts_ns, value FROM {{t}} WHERE target_pid = -1 AND isfinite(value){where}",
        final="""WITH s AS (
                SELECT host, pid, name, ts_ns, CAST(value AS DECIMAL(38, 6)) AS v FROM {t}),
            ev AS (
                SELECT name, ts_ns, 0 AS kind,
                       v - coalesce(lag(v) OVER src, 0) AS dv,
                       CASE WHEN lag(v) OVER src IS NULL THEN 1 ELSE 0 END AS dk
                FROM s WINDOW src AS (PARTITION BY host, pid, name ORDER BY ts_ns, v)
                UNION ALL
                SELECT name,
                       max(ts_ns) + coalesce(3 * ((max(ts_ns) - min(ts_ns)) // nullif(count(*) - 1, 0)), 3000000000),
                       1, -arg_max(v, struct_pack(t := ts_ns, v := v)), -1
                FROM s GROUP BY host, pid, name),
            tot AS (
                SELECT name, ts_ns, kind, sum(dv) OVER w AS sv, sum(dk) OVER w AS k
                FROM ev WINDOW w AS (PARTITION BY name ORDER BY ts_ns)),
            p AS (
                SELECT name, ts_ns,
                       any_value(CASE WHEN name LIKE 'job.%' THEN CAST(sv AS DOUBLE)
                                      ELSE CAST(sv AS DOUBLE) / k END) AS value
                FROM tot WHERE kind = 0 GROUP BY name, ts_ns),
            w AS (
                SELECT min(ts_ns) AS t0, greatest(1, (max(ts_ns) - min(ts_ns)) // greatest(1, $points - 1) + 1) AS width
                FROM p)
            SELECT 0 AS part, name, NULL::BIGINT AS b, favg(value) AS mean, max(value) AS mx,
                   arg_max(value, ts_ns) AS last, count(*) AS n, any_value(w.t0) AS t0, any_value(w.width) AS width
            FROM p, w GROUP BY name
            UNION ALL
            SELECT 1, name, (ts_ns - w.t0) // w.width AS b, favg(value), NULL, NULL, NULL, any_value(w.t0),
                   any_value(w.width)
            FROM p, w GROUP BY name, b""",
        order="part, name, b",
        params={"points": points, **({"lo": window[0], "hi": window[1]} if window is not None else {})},
    )


def resources(
    run: Run, points: int = 60, window: tuple[int, int] | None = None, engine: Engine | None = None
) -> Resources:
    """Summary of job-wide samples (``target_pid = -1``; the hosts combined: :func:`_resources_agg`),
    optionally within a time window (ns), on ``engine`` (DuckDB by default).

    Means are taken with compensated summation (DuckDB's ``favg``): a plain sum's last bit depends on
    the order rows are added in, which differs between engines and threads, and can move a mean
    rounded to 3 decimals across its rounding boundary."""
    res = Resources()
    for part, name, b, mean, mx, last, n, t0, width in engine_for(run, engine).aggregate(
        _resources_agg(points, window)
    ):
        res.start_ns = int(t0 or 0)
        if part == 0:
            res.stats[str(name)] = SeriesStat(
                str(name), float(mean or 0), float(mx or 0), float(last or 0), int(n)
            )
        elif b is not None:
            res.series.setdefault(str(name), []).append((int(b) * int(width) / 1e9, float(mean or 0)))
    res.gpus = sorted({int(n.split(".")[1]) for n in res.stats if n.startswith("gpu.") and n.count(".") >= 2})
    if window is None:
        res.hosts = host_resources(run, engine)
    return res


def _hosts_agg() -> Aggregation:
    """Per host and figure of :data:`HOST_METRICS`: the mean, the 90th percentile (interpolated), the
    largest value and the count of its job-wide samples. A host samples once a second, so the
    samples of every host fit in the last stage, as :func:`_resources_agg`'s do."""
    names = ", ".join(f"'{n}'" for n in HOST_METRICS.values() if not n.startswith("gpu."))
    return Aggregation(
        name="host_resources",
        table="samples",
        columns=("host", "name", "value", "target_pid"),
        chunk=f"""SELECT host, CASE WHEN name LIKE 'gpu.%.util_percent' THEN 'gpu.util_percent' ELSE name END
                         AS name, value
                  FROM {{t}} WHERE target_pid = -1 AND (name IN ({names}) OR name LIKE 'gpu.%.util_percent')""",
        final="""SELECT host, name, favg(value) AS mean, quantile_cont(value, 0.9) AS p90, max(value) AS mx,
                        count(*) AS n
                 FROM {t} GROUP BY host, name""",
        order="host, name",
    )


def host_resources(run: Run, engine: Engine | None = None) -> list[HostResources]:
    """Each host's figures (:data:`HOST_METRICS`) over the run, hosts in name order; a host with no
    job-wide sample (its launcher did not sample) is not listed."""
    key_of = {v: k for k, v in HOST_METRICS.items()}
    out: dict[str, HostResources] = {}
    for host, name, mean, p90, mx, n in engine_for(run, engine).aggregate(_hosts_agg()):
        h = out.setdefault(str(host), HostResources(str(host)))
        h.stats[key_of[str(name)]] = HostStat(float(mean or 0), float(p90 or 0), float(mx or 0), int(n))
    return list(out.values())


def host_spread(hosts: list[HostResources]) -> dict[str, dict[str, Any]]:
    """How the hosts differ, per figure that two hosts or more have: the smallest, median and largest
    of the hosts' means, and the hosts with the smallest and the largest (ties: the first by name)."""
    out: dict[str, dict[str, Any]] = {}
    for key in HOST_METRICS:
        means = sorted(((h.stats[key].mean, h.host) for h in hosts if key in h.stats), key=lambda x: x[0])
        if len(means) < 2:
            continue
        lo = min(means, key=lambda x: x[0])
        hi = max(means, key=lambda x: x[0])
        out[key] = {
            "hosts": len(means),
            "min": round(lo[0], 3),
            "median": round(statistics.median(m for m, _ in means), 3),
            "max": round(hi[0], 3),
            "min_host": lo[1],
            "max_host": hi[1],
        }
    return out


def hosts_doc(hosts: list[HostResources], ranks: dict[str, list[int]]) -> list[dict[str, Any]]:
    """``resources.hosts`` of the report: per host its ranks and, per figure of :data:`HOST_METRICS`,
    ``{mean, p90, max, samples}`` (null where the host has no such sample)."""
    out = []
    for h in hosts:
        doc: dict[str, Any] = {"host": h.host, "ranks": ranks.get(h.host, [])}
        for key in HOST_METRICS:
            s = h.stats.get(key)
            doc[key] = (
                None
                if s is None
                else {
                    "mean": round(s.mean, 3),
                    "p90": round(s.p90, 3),
                    "max": round(s.max, 3),
                    "samples": s.count,
                }
            )
        out.append(doc)
    return out
