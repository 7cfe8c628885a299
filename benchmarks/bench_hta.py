"""Importing PyTorch profiler traces: holoprof against Holistic Trace Analysis on the same files.

    python benchmarks/bench_hta.py [--traces DIR] [--steps 100] [--hta-python /tmp/htavenv/bin/python]

The traces are a real 2-rank DDP (gloo) training job under torch.profiler, made by
``workloads/kineto_trace_job.py --gpu-shape`` (into benchmarks/out/kineto-traces unless --traces is
given). The device timeline in them is synthesized (there is no GPU here; see that script).

Each side runs in its own processes, timed from outside, with peak memory the largest sum of RSS
over the process tree (HTA parses ranks in parallel worker processes), polled every 20 ms:

* HTA: ``TraceAnalysis(trace_dir)`` (parse, align, filter) + ``get_temporal_breakdown()``;
* holoprof: ``holoprof import torch-trace DIR --out RUN`` then ``holoprof report RUN --json``.

Then the numbers are compared: per rank, HTA's temporal breakdown (idle / compute / non-compute /
kernel time) against holoprof's, and the duration of every ProfilerStep HTA keeps against holoprof's
step spans. HTA rounds each event inward to whole microseconds by default (ceil start, floor end);
it runs once more with HTA_DISABLE_NS_ROUNDING=1 (untimed) for the exact comparison.
HTA is installed in its own environment (``python3 -m venv /tmp/htavenv &&
/tmp/htavenv/bin/pip install torch==2.13.0 holistictraceanalysis``), never in holoprof's.
Prints a JSON document and writes it to benchmarks/out/bench_hta.json.

    python benchmarks/bench_hta.py --real DIR [--hta-python /tmp/htavenv/bin/python]

checks agreement (untimed) on traces someone else recorded on real GPUs: DIR is one trace folder
(the per-rank files of one job, as HTA wants) or a folder of such folders. For each, per rank: HTA's
temporal breakdown with its default rounding and with HTA_DISABLE_NS_ROUNDING=1 against holoprof's,
the count and total time of the GPU activities of each kind (kernel, memcpy, memset, ...) HTA keeps
against holoprof's op spans, and the ProfilerStep durations. A failure on either side is reported,
not raised. A file without distributedInfo is rank 0 to HTA and rank -1 (not distributed) to
holoprof; a single such rank is paired. Writes benchmarks/out/bench_hta_real.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")

#: HTA's temporal breakdown and ProfilerStep durations of a trace folder (argv[1]) into argv[2];
#: with a third argument also the count and summed duration of the GPU activities per category (after
#: the timed part, so that the timed comparison measures the breakdown alone)
HTA_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
tb = ta.get_temporal_breakdown(visualize=False)
elapsed = time.perf_counter() - t0
sym = ta.t.symbol_table.get_sym_table()
steps, acts = {}, {}
for rank in ta.t.get_ranks():
    df = ta.t.get_trace(rank)
    names = df["name"].map(lambda i: sym[int(i)])
    st = df[names.str.startswith("ProfilerStep")]
    steps[int(rank)] = {
        int(sym[int(n)].split("#")[1]): float(d) for n, d in zip(st["name"], st["dur"])
    }
    if len(sys.argv) > 3:
        g = df[df["stream"] >= 0]
        acts[int(rank)] = {
            str(c): [int(n), float(d)]
            for c, n, d in zip(*(lambda a: (a.index, a["count"], a["sum"]))(
                g.groupby(g["cat"].map(lambda i: sym[int(i)]))["dur"].agg(["count", "sum"])))
        }
rows = [{k: (float(v) if k != "rank" else int(v)) for k, v in r.items()} for r in tb.to_dict("records")]
json.dump({"breakdown": rows, "steps": steps, "activities": acts, "in_process_s": elapsed}, open(sys.argv[2], "w"))
"""

# HTA keeps the trace's own category names; the first Kineto format (PyTorch 1.8/1.9) wrote these
LEGACY_CATS = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}


def _run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    return p.returncode, p.stdout, p.stderr


def _last_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "failed"


def _trace_sets(root: str) -> list[str]:
    """DIR itself when it holds trace files, else each of its sub-folders that does."""

    def has_traces(d: str) -> bool:
        return any(f.endswith((".json", ".json.gz")) for f in os.listdir(d))

    if has_traces(root):
        return [root]
    return [
        os.path.join(root, d)
        for d in sorted(os.listdir(root))
        if os.path.isdir(os.path.join(root, d)) and has_traces(os.path.join(root, d))
    ]


def _real_one(trace_dir: str, hta_python: str, tmp: str) -> dict:
    script = os.path.join(tmp, "hta_real.py")
    with open(script, "w") as f:
        f.write(HTA_SCRIPT)
    out: dict = {"traces": trace_dir, "files": sorted(os.listdir(trace_dir))}
    hta: dict[str, dict | None] = {}
    for mode, extra in (("hta_default_rounding", {}), ("hta_exact", {"HTA_DISABLE_NS_ROUNDING": "1"})):
        env = {k: v for k, v in os.environ.items() if k != "HTA_DISABLE_NS_ROUNDING"} | extra
        res = os.path.join(tmp, f"{mode}.json")
        rc, _, err = _run([hta_python, script, trace_dir, res, "activities"], env)
        if rc != 0:
            out[f"{mode}_error"] = _last_error(err)
            hta[mode] = None
        else:
            with open(res) as f:
                hta[mode] = json.load(f)
    run = os.path.join(tmp, "run")
    holo = [sys.executable, "-m", "holoprof.cli"]
    rc, _, err = _run([*holo, "import", "torch-trace", trace_dir, "--out", run])
    if rc != 0:
        out["holoprof_error"] = _last_error(err)
        return out
    rc, rep, err = _run([*holo, "report", run, "--json"])
    if rc != 0:
        out["holoprof_error"] = _last_error(err)
        return out
    ours = {int(b["rank"]): b for b in json.loads(rep).get("device", {}).get("temporal_breakdown") or []}
    our_steps = holoprof_steps(run)
    import holoprof

    our_acts: dict[int, dict[str, list[float]]] = {}
    for rank, cat, n, ns in holoprof.load(run).rows(
        "SELECT rank, json_extract_string(attrs, '$.cat'), count(*), sum(end_ns - start_ns) FROM spans"
        " WHERE kind IN ('op', 'comm') AND json_extract_string(attrs, '$.cat')"
        " IN ('kernel', 'gpu_memcpy', 'gpu_memset') GROUP BY ALL"
    ):
        our_acts.setdefault(int(rank), {})[str(cat)] = [int(n), float(ns) / 1e3]
    shutil.rmtree(run, ignore_errors=True)

    def pair(rank: int, mine: dict) -> int | None:
        if rank in mine:
            return rank
        return next(iter(mine)) if len(mine) == 1 and len(hta_ranks) == 1 else None

    for mode, doc in hta.items():
        if doc is None:
            continue
        hta_ranks = [int(r["rank"]) for r in doc["breakdown"]]
        per_rank, worst = [], 0.0
        for row in doc["breakdown"]:
            r = pair(int(row["rank"]), ours)
            o = ours.get(r) if r is not None else None
            keys = ("idle", "compute", "non_compute", "kernel")
            h_us = {k: row[f"{k}_time(us)"] for k in keys}
            o_us = {k: o[f"{k}_s" if k != "kernel" else "kernel_time_s"] * 1e6 for k in keys} if o else None
            diff = max(abs(h_us[k] - o_us[k]) for k in keys) if o_us else None
            d = {
                "hta_rank": int(row["rank"]),
                "holoprof_rank": r,
                "hta_us": h_us,
                "holoprof_us": o_us,
                "hta_pct": {k: row[f"{k}_time_pctg"] for k in ("idle", "compute", "non_compute")},
                "holoprof_pct": (
                    {k: round(100 * o[f"{k}_fraction"], 2) for k in ("idle", "compute", "non_compute")}
                    if o
                    else None
                ),
                "max_abs_diff_us": diff,
            }
            if diff is not None:
                worst = max(worst, diff)
            per_rank.append(d)
        acts = []
        for rank_s, cats in doc["activities"].items():
            r = pair(int(rank_s), our_acts) if our_acts else None
            mine = our_acts.get(r, {}) if r is not None else {}
            for cat, (n, us) in sorted(cats.items()):
                norm = LEGACY_CATS.get(cat, cat)
                hp = mine.get(norm)
                acts.append(
                    {
                        "hta_rank": int(rank_s),
                        "cat": cat,
                        "hta_count": n,
                        "hta_total_us": us,
                        "holoprof_count": hp[0] if hp else None,
                        "holoprof_total_us": hp[1] if hp else None,
                    }
                )
        step_diffs = []
        for rank_s, st in doc["steps"].items():
            r = pair(int(rank_s), our_steps)
            for n, us in st.items():
                got = our_steps.get(r, {}).get(int(n)) if r is not None else None
                step_diffs.append({"rank": int(rank_s), "step": int(n), "hta_us": us, "holoprof_us": got})
        out[mode] = {
            "per_rank": per_rank,
            "max_abs_diff_us": worst,
            "gpu_activities": acts,
            "steps": step_diffs,
        }
    return out


def real(root: str, hta_python: str) -> None:
    if not os.path.isdir(root):
        raise SystemExit(f"--real {root}: not a folder of PyTorch profiler traces")
    sets = _trace_sets(root)
    if not sets:
        raise SystemExit(f"--real {root}: no .json / .json.gz traces in it or its sub-folders")
    results = []
    for d in sets:
        tmp = tempfile.mkdtemp(prefix="bench-hta-real-")
        try:
            results.append(_real_one(d, hta_python, tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "bench_hta_real.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))


def measure(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Wall time and peak RSS (summed over the process tree) of one command."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(p.pid)
    peak = 0
    while p.poll() is None:
        total = 0
        try:
            for q in [proc, *proc.children(recursive=True)]:
                try:
                    total += q.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak = max(peak, total)
        time.sleep(0.02)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-3000:]}")
    return {"wall_s": wall, "peak_rss_bytes": float(peak), "stdout": out}  # type: ignore[dict-item]


def holoprof_steps(run: str) -> dict[int, dict[int, float]]:
    import holoprof

    rows = holoprof.load(run).rows(
        "SELECT rank, step, (end_ns - start_ns) / 1000.0 FROM spans WHERE kind = 'step'"
    )
    out: dict[int, dict[int, float]] = {}
    for rank, step, us in rows:
        out.setdefault(int(rank), {})[int(step)] = float(us)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=os.path.join(OUT, "kineto-traces"))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--hta-python", default="/tmp/htavenv/bin/python")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--real", metavar="DIR", help="check agreement on given (real GPU) traces; no timing")
    a = ap.parse_args()
    if a.real:
        real(a.real, a.hta_python)
        return
    if not os.path.isdir(a.traces) or not os.listdir(a.traces):
        os.makedirs(a.traces, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                os.path.join(HERE, "workloads", "kineto_trace_job.py"),
                a.traces,
                "--steps",
                str(a.steps),
                "--gpu-shape",
            ],
            check=True,
            capture_output=True,
        )
    files = [os.path.join(a.traces, f) for f in sorted(os.listdir(a.traces)) if ".pt.trace.json" in f]
    size = sum(os.path.getsize(f) for f in files)
    tmp = tempfile.mkdtemp(prefix="bench-hta-")
    script = os.path.join(tmp, "hta_job.py")
    with open(script, "w") as f:
        f.write(HTA_SCRIPT)
    hta_runs, hp_runs = [], []
    try:
        for i in range(a.repeat):
            env = dict(os.environ)
            env.pop("HTA_DISABLE_NS_ROUNDING", None)
            m = measure([a.hta_python, script, a.traces, os.path.join(tmp, "hta.json")], env)
            hta_runs.append(m)
            run = os.path.join(tmp, f"run{i}")
            holo = [sys.executable, "-m", "holoprof.cli"]
            # one command, as a user runs it: the import prints the breakdown and the short report
            imp = measure([*holo, "import", "torch-trace", a.traces, "--out", run])
            rep = measure([*holo, "report", run, "--json"])  # a second look, from the saved run
            hp_runs.append(
                {
                    "wall_s": imp["wall_s"],
                    "report_s": rep["wall_s"],
                    "peak_rss_bytes": imp["peak_rss_bytes"],
                    "report_peak_rss_bytes": rep["peak_rss_bytes"],
                    "report": json.loads(str(rep["stdout"])),
                }
            )
        with open(os.path.join(tmp, "hta.json")) as f:
            hta_default = json.load(f)
        env = dict(os.environ, HTA_DISABLE_NS_ROUNDING="1")
        measure([a.hta_python, script, a.traces, os.path.join(tmp, "hta_exact.json")], env)
        with open(os.path.join(tmp, "hta_exact.json")) as f:
            hta_exact = json.load(f)

        from holoprof.store.import_torch_trace import temporal_breakdown

        ours = {b["rank"]: b for b in temporal_breakdown(os.path.join(tmp, "run0"))}
        our_steps = holoprof_steps(os.path.join(tmp, "run0"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def compare(hta: dict) -> dict:
        worst_us = 0.0
        worst_pct = 0.0
        per_rank = []
        for row in hta["breakdown"]:
            o = ours[int(row["rank"])]
            d: dict[str, Any] = {
                "rank": int(row["rank"]),
                "hta_us": {k: row[f"{k}_time(us)"] for k in ("idle", "compute", "non_compute", "kernel")},
                "holoprof_us": {
                    k: o[f"{k}_s" if k != "kernel" else "kernel_time_s"] * 1e6
                    for k in ("idle", "compute", "non_compute", "kernel")
                },
                "hta_pct": {k: row[f"{k}_time_pctg"] for k in ("idle", "compute", "non_compute")},
                "holoprof_pct": {
                    k: round(100 * o[f"{k}_fraction"], 2) for k in ("idle", "compute", "non_compute")
                },
            }
            worst_us = max(worst_us, *(abs(d["hta_us"][k] - d["holoprof_us"][k]) for k in d["hta_us"]))
            worst_pct = max(worst_pct, *(abs(d["hta_pct"][k] - d["holoprof_pct"][k]) for k in d["hta_pct"]))
            per_rank.append(d)
        step_diffs = [
            abs(us - our_steps[int(rank)][int(n)])
            for rank, st in hta["steps"].items()
            for n, us in st.items()
        ]
        return {
            "per_rank": per_rank,
            "max_abs_diff_us": worst_us,
            "max_abs_diff_pct_points": worst_pct,
            "steps_compared": len(step_diffs),
            "max_step_diff_us": max(step_diffs) if step_diffs else None,
        }

    best_hta = min(hta_runs, key=lambda m: m["wall_s"])
    best_hp = min(hp_runs, key=lambda m: m["wall_s"])
    rep = best_hp["report"]
    doc = {
        "trace_files": len(files),
        "trace_bytes": size,
        "hta": {
            "wall_s": round(best_hta["wall_s"], 2),
            "peak_rss_mb": round(best_hta["peak_rss_bytes"] / 2**20),
        },
        "holoprof": {
            "wall_s": round(best_hp["wall_s"], 2),
            "peak_rss_mb": round(best_hp["peak_rss_bytes"] / 2**20),
            "report_again_s": round(best_hp["report_s"], 2),
            "report_again_peak_rss_mb": round(best_hp["report_peak_rss_bytes"] / 2**20),
        },
        "speedup": round(best_hta["wall_s"] / best_hp["wall_s"], 2),
        "memory_ratio": round(best_hta["peak_rss_bytes"] / best_hp["peak_rss_bytes"], 2),
        "report_steps": {k: (rep.get("steps") or {}).get(k) for k in ("count", "median_s", "p90_s", "per_s")},
        "repeat": a.repeat,
        "agreement_exact": compare(hta_exact),
        "agreement_hta_default_rounding": compare(hta_default),
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "bench_hta.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
