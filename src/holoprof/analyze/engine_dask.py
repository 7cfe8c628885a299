"""The Dask engine: the step, phase and resource analyses on dask.dataframe, for runs that outgrow
one machine.

``holoprof report RUN --engine dask [--scheduler ADDRESS]`` (or ``build_report(run, engine="dask")``)
reads the same Parquet files with ``dask.dataframe`` on a ``dask.distributed`` cluster — a local one
by default, or the scheduler given — and computes steps, the phase breakdown and resource summaries
there, with the same definitions as the DuckDB queries (medians and p90 interpolated the same way), so
both engines give the same numbers. The heavy part (scanning and joining every span) runs on the
cluster; only per-step sums of the main loop come back. The other sections (I/O, memory, ...) are
small aggregates and still run on DuckDB.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from holoprof import model
from holoprof.analyze.resources import Resources, SeriesStat
from holoprof.analyze.steps import NS, PhaseStat, ProcKey, StepStats
from holoprof.errors import HoloprofError, MissingExtraError
from holoprof.store.reader import Run

_PHASE_COLS = list(model.MEASURED_PHASES)


@contextmanager
def client(scheduler: str | None = None, workers: int = 2) -> Iterator[Any]:
    """A dask.distributed client: on ``scheduler`` if given, else on a local cluster."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise MissingExtraError("the Dask engine", "dask", "dask[dataframe] distributed")
    if scheduler:
        try:
            c = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError) as exc:
            raise HoloprofError(f"cannot reach the Dask scheduler at {scheduler} ({exc}); check the address")
        try:
            yield c
        finally:
            c.close()
        return
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


class DaskEngine:
    def __init__(self, run: Run, dask_client: Any) -> None:
        import dask.dataframe as dd

        self.run = run
        self.client = dask_client
        self.dd = dd
        files = run.chunks.files["spans"]
        cols = ["host", "pid", "rank", "tid", "kind", "name", "start_ns", "end_ns", "step"]
        self.spans = dd.read_parquet(files, columns=cols) if files else None
        sfiles = run.chunks.files["samples"]
        self.samples = (
            dd.read_parquet(sfiles, columns=["ts_ns", "name", "value", "target_pid"]) if sfiles else None
        )
        f = run.filter
        if self.spans is not None:
            self.spans = self._window(self.spans, "start_ns", f)
            if f.steps is not None:
                a, b = f.steps
                self.spans = self.spans[
                    ((self.spans.step >= a) & (self.spans.step <= b)) | (self.spans.step < 0)
                ]
        if self.samples is not None:
            self.samples = self._window(self.samples, "ts_ns", f)

    @staticmethod
    def _window(df: Any, col: str, f: Any) -> Any:
        if f.start_s is not None:
            df = df[df[col] >= f.run_start_ns + int(f.start_s * 1e9)]
        if f.end_s is not None:
            df = df[df[col] <= f.run_start_ns + int(f.end_s * 1e9)]
        if f.ranks is not None and "rank" in df.columns:
            df = df[df["rank"].isin(list(f.ranks))]
        return df

    # -- the analyses ------------------------------------------------------------------------------
    def step_processes(self) -> list[ProcKey]:
        if self.spans is None:
            return []
        steps = self.spans[self.spans.kind == "step"]
        per_tid = steps.groupby(["host", "pid", "tid"]).agg({"rank": "first", "step": "count"}).compute()
        if per_tid.empty:
            return []
        per_tid = per_tid.reset_index()
        out = []
        for (host, pid), g in per_tid.groupby(["host", "pid"]):
            n = int(g["step"].sum())
            best = g.sort_values(["step", "tid"], ascending=[False, True]).iloc[0]
            rank = int(g["rank"].iloc[0]) if g["rank"].notna().any() else -1
            out.append((n, rank, int(pid), ProcKey(str(host), int(pid), rank, int(best["tid"]))))
        out.sort(key=lambda x: (-x[0], x[1] if x[1] >= 0 else 1 << 30, x[2]))
        return [p for *_, p in out]

    def step_stats(self, proc: ProcKey, timeline_points: int = 120) -> StepStats:
        import numpy as np
        import pandas as pd

        assert self.spans is not None
        sp = self.spans
        mine = sp[(sp.host == proc.host) & (sp.pid == proc.pid)]
        steps = mine[(mine.kind == "step") & (mine.end_ns >= mine.start_ns)][
            ["step", "start_ns", "end_ns"]
        ].compute()
        steps = steps.rename(columns={"start_ns": "s", "end_ns": "e"})
        phases = mine[(mine.kind == "phase") & (mine.tid == proc.tid)][["step", "name", "start_ns", "end_ns"]]
        joined = phases.merge(steps, on="step", how="inner")
        joined = joined[(joined.end_ns > joined.s) & (joined.start_ns < joined.e)]
        joined = joined.assign(
            d=joined.end_ns.where(joined.end_ns < joined.e, joined.e)
            - joined.start_ns.where(joined.start_ns > joined.s, joined.s)
        )
        sums = joined.groupby(["step", "name"]).d.sum().compute()
        table = sums.unstack(fill_value=0) if len(sums) else pd.DataFrame()
        per = steps.set_index("step").sort_index()
        per["dur"] = (per["e"] - per["s"]).astype("float64")
        for p in _PHASE_COLS:
            per[p] = table[p].reindex(per.index).fillna(0).astype("float64") if p in table else 0.0
        measured = per[_PHASE_COLS].sum(axis=1)
        f = np.where(
            (measured > per["dur"]) & (measured > 0), per["dur"] / measured.where(measured > 0, 1), 1.0
        )
        for p in _PHASE_COLS:
            per[p] = per[p] * f
        per["other"] = np.maximum(per["dur"] - measured * f, 0)
        count = len(per)
        total = float(per["dur"].sum())
        phase_stats: dict[str, PhaseStat] = {}
        for p in (*_PHASE_COLS, "other"):
            tot = float(per[p].sum())
            phase_stats[p] = PhaseStat(
                fraction=tot / total if total > 0 else 0.0,
                total_s=tot / NS,
                median_s=float(per[p].median()) / NS if count else 0.0,
                median_share=float((per[p] / per["dur"].clip(lower=1)).median()) if count else 0.0,
            )
        if total > 0:
            residue = 1.0 - sum(ps.fraction for ps in phase_stats.values())
            phase_stats["other"].fraction = max(0.0, phase_stats["other"].fraction + residue)
        first = int(per["s"].min()) if count else 0
        last = int(per["e"].max()) if count else 0
        wall = (last - first) / NS if last > first else 0.0
        timeline: list[dict[str, float]] = []
        if count:
            k = max(1, -(-count // timeline_points))
            grp = per.reset_index().assign(i=np.arange(count) // k).groupby("i")
            agg = grp.agg({"step": "min", "dur": "mean", **{p: "mean" for p in (*_PHASE_COLS, "other")}})
            for _, r in agg.iterrows():
                row = {"step": float(r["step"]), "step_s": float(r["dur"]) / NS}
                row.update({p: float(r[p]) / NS for p in (*_PHASE_COLS, "other")})
                timeline.append(row)
        epochs = int((mine.kind == "epoch").sum().compute())
        return StepStats(
            proc=proc,
            count=count,
            median_s=float(per["dur"].median()) / NS if count else 0.0,
            p90_s=float(np.percentile(per["dur"], 90)) / NS if count else 0.0,
            mean_s=float(per["dur"].mean()) / NS if count else 0.0,
            per_s=(count / wall) if wall > 0 else 0.0,
            total_s=total / NS,
            first_start_ns=first,
            last_end_ns=last,
            phases=phase_stats,
            epochs=epochs,
            timeline=timeline,
        )

    def resources(self, points: int = 60) -> Resources:
        res = Resources()
        if self.samples is None:
            return res
        job = self.samples[self.samples.target_pid == -1]
        pdf = job.compute().reset_index(drop=True)
        if pdf.empty:
            return res
        for name, g in pdf.groupby("name"):
            last = float(g.loc[g["ts_ns"].idxmax(), "value"])
            res.stats[str(name)] = SeriesStat(
                str(name), float(g["value"].mean()), float(g["value"].max()), last, len(g)
            )
        t0, t1 = int(pdf["ts_ns"].min()), int(pdf["ts_ns"].max())
        res.start_ns = t0
        width = max(1, (t1 - t0) // max(1, points - 1) + 1)
        pdf = pdf.assign(b=(pdf["ts_ns"] - t0) // width)
        for (name, b), v in pdf.groupby(["name", "b"])["value"].mean().items():
            res.series.setdefault(str(name), []).append((int(b) * width / 1e9, float(v)))
        res.gpus = sorted(
            {int(n.split(".")[1]) for n in res.stats if n.startswith("gpu.") and n.count(".") >= 2}
        )
        return res
