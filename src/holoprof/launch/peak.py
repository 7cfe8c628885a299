"""The peak FLOP/s of a CPU, measured: a short GEMM micro-benchmark for a job's dtype and thread count.

MFU needs a peak to divide by. NVIDIA GPUs have data-sheet numbers (:mod:`holoprof.analyze.peaks`);
a CPU's depends on its vector units, its clock under load, the BLAS library and the threads a job
uses, so it is measured: ``torch.matmul`` of two square matrices (256 to 2048 a side) of the job's
dtype with the job's thread count, in a process of its own (the job's Python, with no agent),
repeated for :data:`BUDGET_S` seconds in all; the best rate counts (on a busy machine a product that
lost its cores to another process runs slower, never faster).

When: after the job has ended (``holoprof run`` calls :func:`ensure_peaks` before its report;
``holoprof report`` does too, for runs made with ``holoprof.start()``, never on a run still running),
so that it neither disturbs the job nor counts in its time; only for the CPU dtypes and thread counts the run's counted steps
used, and only on the host that ran them. The result is cached per machine, in
``$XDG_CACHE_HOME/holoprof/peak-flops.json`` (``~/.cache/holoprof``) keyed by CPU model, dtype,
threads and torch version, so a machine measures each once; it is written into the run
(``artifacts/peak-flops-<host>.json``, :mod:`holoprof.store.sidefiles`) with its source, so the
report names the number it divides by wherever it is read.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from holoprof.store import hosts, process_rows, rundir
from holoprof.store.sidefiles import read_peaks, write_peaks

if TYPE_CHECKING:
    from holoprof.store.reader import Run

#: Seconds of timed GEMMs in all (after growing the matrices), shared by the dtypes measured: the
#: benchmark itself stays under half a second.
BUDGET_S = 0.4
CACHE_FILE = "peak-flops.json"

#: The benchmark, run with the job's Python: standard library and torch only. Arguments: the dtypes
#: (comma-separated), the thread count, the seconds of timed GEMMs per dtype.
GEMM = r"""
import json, sys, time
import torch
threads, budget = int(sys.argv[2]), float(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)
clock = time.perf_counter
out = []
for name in sys.argv[1].split(","):
    dtype = getattr(torch, name)
    best, best_n, reps, t_end = 0.0, 0, 0, clock() + budget
    for n in (256, 512, 1024, 2048):
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        c = torch.matmul(a, b)
        size_end, k = min(t_end, clock() + budget / 3), 0
        while k < 2 or clock() < size_end:
            t = clock()
            torch.matmul(a, b, out=c)
            dt = clock() - t
            if dt > 0 and 2.0 * n ** 3 / dt > best:
                best, best_n = 2.0 * n ** 3 / dt, n
            k += 1
            if dt > budget / 4:
                break
        reps += k
        if clock() >= t_end or dt > budget / 4:
            break
    out.append({"dtype": name, "peak_flops_per_s": best, "n": best_n, "reps": reps})
print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "peaks": out}))
"""


def cpu_model() -> str:
    """This machine's CPU model (``/proc/cpuinfo``), or what the platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "holoprof", CACHE_FILE)


def cache_key(model: str, dtype: str, threads: int, torch_version: str) -> str:
    """The machine cache's key of one peak: CPU model, dtype, thread count and torch version."""
    return f"{model}|{dtype}|{threads}|torch {torch_version}"


def _load_cache(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_cache(path: str, doc: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def measure_cpu_peaks(
    python: str, dtypes: list[str], threads: int, budget_s: float = BUDGET_S
) -> dict[str, Any]:
    """Run the GEMM benchmark for ``dtypes`` with ``python`` (no agent in it); its result (``torch`` and
    ``peaks``: per dtype ``peak_flops_per_s``, ``n``, ``reps``). RuntimeError with the reason when it
    cannot run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOLOPROF_")}
    each = budget_s / max(1, len(dtypes))
    try:
        done = subprocess.run(
            [python, "-c", GEMM, ",".join(dtypes), str(threads), str(each)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"the GEMM benchmark could not run ({exc})") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the GEMM benchmark failed ({tail})")
    out = json.loads(lines[-1])
    if not isinstance(out, dict) or not isinstance(out.get("peaks"), list):
        raise RuntimeError("the GEMM benchmark measured nothing")
    return out


def cpu_peaks(python: str, dtypes: list[str], threads: int, torch_version: str = "") -> list[dict[str, Any]]:
    """The peak FLOP/s entries of this machine's CPU for ``dtypes`` and ``threads``: from the cache, or
    measured now, all missing dtypes in one benchmark (and cached)."""
    model = cpu_model()
    path = cache_path()
    cache = _load_cache(path)

    def key(d: str) -> str:
        return cache_key(model, d, threads, torch_version)

    found: dict[str, dict[str, Any]] = {}
    for d in dtypes:
        hit = cache.get(key(d))
        if isinstance(hit, dict) and float(hit.get("peak_flops_per_s") or 0) > 0:
            found[d] = {**hit, "cached": True, "source": _source(hit, path, cached=True)}
    missing = [d for d in dtypes if d not in found]
    if missing:
        got = measure_cpu_peaks(python, missing, threads)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        fresh: dict[str, dict[str, Any]] = {}
        for p in got["peaks"]:
            if str(p.get("dtype")) in missing and float(p.get("peak_flops_per_s") or 0) > 0:
                d = str(p["dtype"])
                fresh[d] = {
                    "device": "cpu",
                    "cpu_model": model,
                    "dtype": d,
                    "threads": threads,
                    "peak_flops_per_s": float(p["peak_flops_per_s"]),
                    "n": int(p.get("n") or 0),
                    "reps": int(p.get("reps") or 0),
                    "torch": str(got.get("torch") or torch_version),
                    "measured_at": stamp,
                }
                cache[key(d)] = fresh[d]
        try:
            _save_cache(path, cache)
            stored = path
        except OSError:
            stored = ""
        for d, e in fresh.items():
            found[d] = {**e, "cached": False, "source": _source(e, stored, cached=False)}
    return [found[d] for d in dtypes if d in found]


def _source(e: dict[str, Any], path: str, cached: bool) -> str:
    n, threads = e.get("n"), e.get("threads")
    what = (
        f"measured GEMM peak of this CPU ({e.get('cpu_model')}): torch.matmul {e.get('dtype')}, best at "
        f"{n}x{n}, {threads} thread{'s' if threads != 1 else ''}, {e.get('reps')} products, on {e.get('measured_at')}"
    )
    if not path:
        return what + " (not cached: the cache could not be written)"
    return what + (f" (from the machine's cache {path})" if cached else f" (cached in {path})")


def wanted(run: Run) -> list[dict[str, Any]]:
    """The CPU dtypes and thread counts whose FLOPs the run counted on this host, each with the job's
    Python and torch version."""
    rows = run.rows(
        """SELECT s.host, s.attrs, p.exe FROM spans s LEFT JOIN processes p ON s.host = p.host AND s.pid = p.pid
           WHERE s.kind = 'op' AND s.name = 'flops'"""
    )
    counted = []
    for host, attrs, exe in rows:
        try:
            a = json.loads(attrs) if attrs else {}
        except ValueError:
            continue
        counted.append((host, a, exe))
    return _wanted_of(counted)


def wanted_from_processes(run_dir: str) -> list[dict[str, Any]] | None:
    """:func:`wanted` from the processes' rows alone (their agent keeps what its FLOP count saw in
    ``info["flops"]``), without loading the run; None where the rows cannot say (rows not in Parquet
    parts yet, or an agent that kept less): load the run instead."""
    rows = process_rows.read_rows(run_dir)  # every row: a count kept by an earlier row counts too
    if rows is None:
        return None
    counted = []
    for row in rows:
        flops = process_rows.info_of(row).get("flops")
        if not isinstance(flops, dict) or not flops.get("flops"):
            continue
        if "device" not in flops or "dtype" not in flops:
            return None
        counted.append((row["host"], flops, row["exe"]))
    return _wanted_of(counted)


def _wanted_of(counted: list[tuple[str, dict[str, Any], str | None]]) -> list[dict[str, Any]]:
    """The distinct (dtype, threads) of this host's CPU FLOP counts ``(host, attributes, the process's
    Python)``."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    here = socket.gethostname()
    for host, a, exe in counted:
        if host != here or not a.get("flops") or str(a.get("device", "")) != "cpu" or not a.get("dtype"):
            continue
        key = (str(a["dtype"]), int(a.get("threads") or 1))
        out.setdefault(key, {"python": exe or sys.executable, "torch": str(a.get("torch") or "")})
    return [{"dtype": d, "threads": t, **v} for (d, t), v in sorted(out.items())]


def ensure_peaks(run_dir: str, run: Run | None = None) -> list[str]:
    """Measure (or take from the cache) the CPU peak for every dtype and thread count the run counted
    on this host and has no peak for yet, and write them into the run; what was done, in words. A
    float32 step's bfloat16 peak is measured too (the ``low_mfu`` finding's bf16 autocast advice needs
    it). ``run``: the run already loaded (else its processes' rows are read, or, where they cannot say,
    it is loaded here)."""
    need = wanted_from_processes(run_dir) if run is None else None
    if need is not None:
        if hosts.run_state(rundir.read_manifest(run_dir))[0] == "running":
            return []  # never while the job runs (any host's): the benchmark would take its cores
    else:
        if run is None:
            from holoprof.store.reader import load  # lazy: DuckDB loads only when a run is read

            run = load(run_dir)
        if run.status == "running":
            return []
        need = wanted(run)
    if not need:
        return []
    here = socket.gethostname()
    entries = [e for e in read_peaks(run_dir) if e.get("host") == here]
    have = {(str(e.get("dtype")), int(e.get("threads") or 0)) for e in entries if e.get("device") == "cpu"}
    notes: list[str] = []
    changed = False
    for w in need:
        dtypes = [w["dtype"], *(["bfloat16"] if w["dtype"] == "float32" else [])]
        dtypes = [d for d in dtypes if (d, w["threads"]) not in have]
        if not dtypes:
            continue
        try:
            got = cpu_peaks(str(w["python"]), dtypes, w["threads"], w["torch"])
        except (RuntimeError, ValueError) as exc:
            notes.append(f"no CPU peak for {w['dtype']} with {w['threads']} threads: {exc}")
            continue
        for e in got:
            entries.append({k: v for k, v in e.items() if k != "host"})
            have.add((str(e["dtype"]), w["threads"]))
            changed = True
            if not e.get("cached"):
                notes.append(
                    f"measured this CPU's {e['dtype']} GEMM peak with {w['threads']} thread{'s' if w['threads'] != 1 else ''} "
                    f"({e['peak_flops_per_s'] / 1e9:.1f} GFLOP/s), once for this machine"
                )
    if changed:
        write_peaks(run_dir, here, [{k: v for k, v in e.items() if k != "host"} for e in entries])
    return notes
