"""Resources over time: summary statistics and downsampled series of the job-wide samples."""

from __future__ import annotations

from dataclasses import dataclass, field

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


def resources(run: Run, points: int = 60, window: tuple[int, int] | None = None) -> Resources:
    """Summary of job-wide samples (``target_pid = -1``), optionally within a time window (ns).

    Means are taken with compensated summation (DuckDB's ``favg``; the Dask engine's ``math.fsum``):
    a plain sum's last bit depends on the order rows are added in, which differs between engines and
    threads, and can move a mean rounded to 3 decimals across its rounding boundary."""
    where = "target_pid = -1"
    params: list[object] = []
    if window is not None:
        where += " AND ts_ns BETWEEN ? AND ?"
        params += [window[0], window[1]]
    rows = run.rows(
        f"""SELECT name, favg(value), max(value), arg_max(value, ts_ns), count(*)
            FROM samples WHERE {where} GROUP BY name ORDER BY name""",
        params,
    )
    res = Resources()
    for name, mean, mx, last, n in rows:
        res.stats[str(name)] = SeriesStat(
            str(name), float(mean or 0), float(mx or 0), float(last or 0), int(n)
        )
    bounds = run.rows(f"SELECT min(ts_ns), max(ts_ns) FROM samples WHERE {where}", params)[0]
    if bounds[0] is None:
        return res
    t0, t1 = int(bounds[0]), int(bounds[1])
    res.start_ns = t0
    width = max(1, (t1 - t0) // max(1, points - 1) + 1)
    srows = run.rows(
        f"""SELECT name, (ts_ns - {t0}) // {width} AS b, favg(value)
            FROM samples WHERE {where} GROUP BY name, b ORDER BY name, b""",
        params,
    )
    for name, b, v in srows:
        res.series.setdefault(str(name), []).append((int(b) * width / 1e9, float(v or 0)))
    res.gpus = sorted({int(n.split(".")[1]) for n in res.stats if n.startswith("gpu.") and n.count(".") >= 2})
    return res
