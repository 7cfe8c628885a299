"""Resources over time: summary statistics and downsampled series of the job-wide samples."""

from __future__ import annotations

from dataclasses import dataclass, field

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
class Resources:
    stats: dict[str, SeriesStat] = field(default_factory=dict)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # name -> [(t_s, value)]
    start_ns: int = 0
    gpus: list[int] = field(default_factory=list)

    def get(self, name: str) -> SeriesStat | None:
        return self.stats.get(name)


def _resources_agg(points: int, window: tuple[int, int] | None) -> Aggregation:
    """The job-wide samples (``target_pid = -1``; within ``window``, ns): per series (``part`` 0) its
    mean, maximum, last value and count, then (``part`` 1) its mean in each of ``points`` buckets of
    ``width`` ns from the first sample, ``t0``. The samples are few next to the spans: the last stage
    holds all of them (on one worker under Dask), so every mean is taken over all of a series at once."""
    where = " AND ts_ns BETWEEN $lo AND $hi" if window is not None else ""
    return Aggregation(
        name="resources",
        table="samples",
        columns=("ts_ns", "name", "value", "target_pid"),
        chunk=f"SELECT name, ts_ns, value FROM {{t}} WHERE target_pid = -1{where}",
        final="""WITH w AS (
                SELECT min(ts_ns) AS t0, greatest(1, (max(ts_ns) - min(ts_ns)) // greatest(1, $points - 1) + 1) AS width
                FROM {t})
            SELECT 0 AS part, name, NULL::BIGINT AS b, favg(value) AS mean, max(value) AS mx,
                   arg_max(value, ts_ns) AS last, count(*) AS n, any_value(w.t0) AS t0, any_value(w.width) AS width
            FROM {t}, w GROUP BY name
            UNION ALL
            SELECT 1, name, (ts_ns - w.t0) // w.width AS b, favg(value), NULL, NULL, NULL, any_value(w.t0),
                   any_value(w.width)
            FROM {t}, w GROUP BY name, b""",
        order="part, name, b",
        params={"points": points, **({"lo": window[0], "hi": window[1]} if window is not None else {})},
    )


def resources(
    run: Run, points: int = 60, window: tuple[int, int] | None = None, engine: Engine | None = None
) -> Resources:
    """Summary of job-wide samples (``target_pid = -1``), optionally within a time window (ns), on
    ``engine`` (DuckDB by default).

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
    return res
