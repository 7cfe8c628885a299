"""One prepared check of holoprof's GPU paths on a real GPU; every figure written under --out.

    python benchmarks/gpu_check.py --out DIR [--quick] [--wheels .gpu-wheels [.gpu-wheels-hta]]

Meant for a lent GPU machine (about 8 minutes on an H100; ``--quick`` about 3). Each check runs in
its own try/except: a failure is recorded as that check's ``error`` and the next check runs. Without
a CUDA device every GPU figure is ``"skipped: no CUDA device"`` and only the plumbing and the CPU-
possible parts run (the import of a CPU profiler trace). After each check DIR/gpu_check.json is
rewritten (a timeout still leaves the checks done so far) and, at the end, DIR/gpu_check.md is the
Markdown section for benchmarks/RESULTS.md.

Checks (the workload is benchmarks/workloads/gpu_train.py, a ResNet-like CNN and a small
transformer in bf16 autocast, 20-200 ms steps on an H100):

1. ``tests``: the tests that skip without CUDA (found by their ``needs a CUDA device`` skip reason).
2. ``overhead``: traced/untraced loop-time ratio over alternating runs (``holoprof run --no-report``),
   and the synchronization warnings of ``torch.cuda.set_sync_debug_mode("warn")`` in both variants.
3. ``agreement``: on the first traced run of each model, holoprof's report against what the workload
   and this script measured themselves: per-phase device time (``cuda.<phase>_ms`` samples vs the
   workload's ``torch.cuda.Event`` medians), GPU utilization (report vs NVML sampled here), memory
   categories (vs ``torch.cuda.memory_allocated`` deltas), MFU (vs FlopCounterMode / the measured step
   / the data-sheet peak); and ``burst``: BurstBuffer.save blocking time for a 2 GiB CUDA state vs a
   plain ``.to("cpu")`` copy, and the loaded state equal to the saved one.
4. ``trace``: a torch.profiler trace of 100+ steps imported with ``holoprof import torch-trace``,
   its temporal breakdown against HTA's ``get_temporal_breakdown`` (if HTA imports), time and peak
   memory of both.

``--wheels`` first installs the wheels carried to a machine without network (``make gpu-wheels``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOAD = os.path.join(HERE, "workloads", "gpu_train.py")
NO_CUDA = "skipped: no CUDA device"
PLUMBING = "CPU plumbing only, not a GPU figure"
PY = sys.executable
HOLOPROF = [PY, "-m", "holoprof.cli"]


#: where --wheels installs (pip --target: the machine's Python is left as it is)
SITE: list[str] = []


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [os.path.join(ROOT, "src"), *SITE]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _sh(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout)


def _json_line(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _cuda() -> bool:
    try:
        import torch  # lazy: the wheels may be installed first

        return bool(torch.cuda.is_available())
    except Exception:
        return False


# ------------------------------------------------------------------------------------------ setup
def install_wheels(dirs: list[str]) -> dict[str, Any]:
    """pip install, offline and without dependencies, the carried wheels whose project is not
    installed yet into a folder put on the path (what the machine has is kept as it is); one
    folder's failure does not stop the next."""
    from importlib import metadata  # lazy: only with --wheels

    site = tempfile.mkdtemp(prefix="gpucheck-site-")
    SITE.append(site)
    sys.path.insert(0, site)
    out: dict[str, Any] = {"target": site}
    for d in dirs:
        wheels, present = [], []
        for w in sorted(glob.glob(os.path.join(d, "*.whl"))):
            name = os.path.basename(w).split("-")[0]
            try:
                present.append(f"{name} {metadata.version(name)}")
            except metadata.PackageNotFoundError:
                wheels.append(w)
        res: dict[str, Any] = {"already_installed": present}
        if wheels:
            cmd = [PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", site, *wheels]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
            res.update(
                installed=[os.path.basename(w) for w in wheels], rc=p.returncode, stderr=p.stderr[-1500:]
            )
            if p.returncode != 0:  # one by one: the others still install
                failed = []
                for w in wheels:
                    q = subprocess.run([*cmd[: -len(wheels)], w], capture_output=True, text=True, timeout=120)
                    if q.returncode != 0:
                        failed.append(os.path.basename(w))
                res["failed"] = failed
                res["installed"] = [os.path.basename(w) for w in wheels if os.path.basename(w) not in failed]
        out[d] = res
    return out


# ------------------------------------------------------------------------------------------ checks
def check_tests(cuda: bool, quick: bool) -> dict[str, Any]:
    """The tests that skip without CUDA, by their skip reason; run them (on a CPU: to show they skip)."""
    ids = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if "needs a CUDA device" in line:
                name = next(
                    (m.group(1) for m in (re.match(r"\s*def (test_\w+)", x) for x in lines[i : i + 4]) if m),
                    None,
                )
                if name:
                    ids.append(f"{os.path.relpath(path, ROOT)}::{name}")
    if not ids:
        return {"figure": "no GPU-marked test found"}
    p = subprocess.run(
        [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra", *ids],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=300,
    )
    summary = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-500:]
    res: dict[str, Any] = {"tests": ids, "rc": p.returncode, "pytest": summary}
    res["figure"] = (("passed" if p.returncode == 0 else "FAILED") + f": {summary}") if cuda else NO_CUDA
    if p.returncode != 0:
        res["output"] = p.stdout[-4000:]
    return res


class NvmlSampler:
    """GPU 0 utilization from NVML every 100 ms while running (the script's own reference)."""

    def __init__(self) -> None:
        import pynvml  # lazy: only on a GPU machine

        pynvml.nvmlInit()
        self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.util: list[float] = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(0.1):
            self.util.append(float(self.nv.nvmlDeviceGetUtilizationRates(self.h).gpu))

    def __enter__(self) -> NvmlSampler:
        self.t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.t.join()


def _workload(model: str, quick: bool, cuda: bool) -> list[str]:
    steps = ["--steps", "25", "--warmup", "6"] if quick else ["--steps", "50", "--warmup", "10"]
    return [PY, WORKLOAD, "--model", model, *steps, "--sync-debug", *([] if cuda else ["--small"])]


def check_overhead(cuda: bool, quick: bool, tmp: str, plumbing: bool) -> dict[str, Any]:
    """Alternating plain/traced runs per model; the first traced run is kept for the agreement check.
    ``plumbing`` runs the small models on a CPU to check this script, not to give a GPU figure."""
    if not cuda and not plumbing:
        return {"figure": NO_CUDA}
    pairs = 1 if quick else 3
    res: dict[str, Any] = {"pairs": pairs}
    for model in ("cnn", "transformer"):
        job = _workload(model, quick, cuda)
        ratios, runs = [], []
        for i in range(pairs):
            order = ("plain", "traced") if i % 2 == 0 else ("traced", "plain")
            got: dict[str, Any] = {}
            for kind in order:
                if kind == "plain":
                    got[kind] = _json_line(_sh(job))
                    continue
                out = os.path.join(tmp, f"{model}-run{i}")
                sampler = NvmlSampler() if i == 0 and cuda else None
                if sampler:
                    with sampler:
                        got[kind] = _json_line(
                            _sh([*HOLOPROF, "run", "--no-report", "--out", out, "--", *job])
                        )
                    got["nvml_util"] = sampler.util
                else:
                    got[kind] = _json_line(_sh([*HOLOPROF, "run", "--no-report", "--out", out, "--", *job]))
                got["run_dir"] = out
            ratios.append(got["traced"]["loop_s"] / got["plain"]["loop_s"])
            runs.append(got)
        med = statistics.median(ratios)
        res[model] = {
            "median_step_ms_plain": 1e3 * statistics.median(r["plain"]["median_step_s"] for r in runs),
            "median_step_ms_traced": 1e3 * statistics.median(r["traced"]["median_step_s"] for r in runs),
            "ratios": [round(r, 4) for r in ratios],
            "figure": f"{med:.4f} ({100 * (med - 1):+.2f}%)",
            "sync_warnings_plain": [r["plain"]["sync_warnings"] for r in runs],
            "sync_warnings_traced": [r["traced"]["sync_warnings"] for r in runs],
            "sync_figure": _sync_figure(runs),
            "device": runs[0]["plain"]["device"],
            "_first": runs[0],
        }
        if not cuda:
            res[model]["figure"] = f"{PLUMBING}: {res[model]['figure']}"
    if not cuda:
        res["figure"] = f"{NO_CUDA} (the CPU plumbing ran: {PLUMBING})"
    return res


def _sync_figure(runs: list[dict[str, Any]]) -> str:
    """Silent: no warning in the traced runs; else whether holoprof added any to the plain job's."""
    traced = [r["traced"]["sync_warnings"] for r in runs]
    plain = [r["plain"]["sync_warnings"] for r in runs]
    if not any(traced):
        return "silent"
    return "none added (the job itself synchronizes)" if max(traced) <= min(plain) else "WARNINGS added"


def _rel(a: float | None, b: float | None) -> str:
    if a is None or b is None or not b:
        return "n/a"
    return f"{a / b:.3f}"


def agreement(cuda: bool, overhead: dict[str, Any], plumbing: bool) -> dict[str, Any]:
    """holoprof's report of the first traced run of each model against the workload's own figures."""
    if not cuda and not plumbing:
        return {"figure": NO_CUDA}
    res: dict[str, Any] = {}
    for model in ("cnn", "transformer"):
        first = overhead[model].pop("_first")
        own, run_dir = first["traced"], first["run_dir"]
        p = _sh([*HOLOPROF, "report", run_dir, "--json"])
        if p.returncode != 0:
            raise RuntimeError(f"holoprof report {run_dir}: exit {p.returncode}: {p.stderr[-2000:]}")
        rep = json.loads(p.stdout)
        rows = json.loads(
            _sh(
                [
                    *HOLOPROF,
                    "query",
                    run_dir,
                    "SELECT name, value FROM samples WHERE name LIKE 'cuda.%_ms'",
                    "--json",
                ]
            ).stdout
        )
        by: dict[str, list[float]] = {}
        for r in rows:
            by.setdefault(r["name"][5:-3], []).append(float(r["value"]))
        phases = {}
        for ph, own_ms in (own.get("phases_ms_median") or {}).items():
            hp = statistics.median(by[ph]) if by.get(ph) else None
            phases[ph] = {"holoprof_ms": hp, "events_ms": own_ms, "ratio": _rel(hp, own_ms)}
        util = (rep.get("resources", {}).get("summary", {}).get("gpu.0.util_percent") or {}).get("mean")
        nv = first.get("nvml_util") or []
        cats = (rep.get("memory") or {}).get("categories") or {}
        own_mem = own.get("memory_bytes") or {}
        mem = {
            k: {
                "holoprof": cats.get(k),
                "allocated_delta": own_mem.get(k),
                "ratio": _rel(cats.get(k), own_mem.get(k)),
            }
            for k in ("weights", "gradients", "optimizer_state", "activations")
        }
        comp = rep.get("compute") or {}
        res[model] = {
            "phases": phases,
            "phase_names_in_samples": sorted(by),
            "utilization": {
                "holoprof_mean": util,
                "nvml_mean": statistics.mean(nv) if nv else None,
                "nvml_samples": len(nv),
            },
            "memory": mem,
            "memory_report": {
                k: (rep.get("memory") or {}).get(k) for k in ("peak_bytes", "device", "step", "phase", "mode")
            },
            "memory_peak_allocated": own_mem.get("peak"),
            "mfu": {
                "holoprof": comp.get("mfu"),
                "own": own.get("mfu"),
                "holoprof_flops_per_step": comp.get("flops_per_step"),
                "own_flops_per_step": own.get("flops_per_step"),
                "holoprof_peak": comp.get("peak_flops_per_s"),
                "own_peak": own.get("peak_flops_per_s"),
                "holoprof_peak_source": comp.get("peak_source"),
                "own_peak_source": own.get("peak_source"),
                "holoprof_dtype": comp.get("dtype"),
                "ratio": _rel(comp.get("mfu"), own.get("mfu")),
            },
            "findings": [f.get("id") for f in rep.get("findings", [])],
            "gpus": rep.get("run", {}).get("gpus"),
            "warnings": rep.get("run", {}).get("warnings"),
        }
    if not cuda:
        res["figure"] = f"{NO_CUDA} (the CPU plumbing ran: {PLUMBING})"
    return res


def check_burst(cuda: bool, quick: bool) -> dict[str, Any]:
    """BurstBuffer.save's blocking time for a CUDA state vs a plain copy to host; loaded == saved."""
    if not cuda:
        return {"figure": NO_CUDA}
    import torch  # lazy: only with CUDA

    from holoprof.checkpoint import BurstBuffer  # lazy: after PYTHONPATH/wheels are set up

    gib = 0.25 if quick else 2.0
    n = 8
    per = int(gib * (1 << 30)) // n // 4
    state = {f"w{i}": torch.randn(per, device="cuda") for i in range(n)}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    plain = {k: v.to("cpu") for k, v in state.items()}
    plain_s = time.perf_counter() - t0
    shm = "/dev/shm" if shutil.disk_usage("/dev/shm").free > 3 * gib * (1 << 30) else tempfile.gettempdir()
    base = tempfile.mkdtemp(prefix="gpucheck-bb-", dir=shm)
    durable = tempfile.mkdtemp(prefix="gpucheck-durable-")
    try:
        with BurstBuffer(os.path.join(base, "fast"), durable) as bb:
            times = []
            for i in range(2):
                torch.cuda.synchronize()
                r = bb.save(state, f"s{i}")
                times.append(r.blocking_s)
                r.wait()
            for v in state.values():
                v.add_(1.0)  # after save: the snapshot must not see it
            loaded = bb.load("s1", map_location="cpu")
        equal = all(torch.equal(loaded[k], plain[k]) for k in plain)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(durable, ignore_errors=True)
    return {
        "state_gib": gib,
        "plain_to_cpu_s": plain_s,
        "save_blocking_s": times,
        "fast_dir": shm,
        "loaded_equal_saved": equal,
        "figure": f"save blocks {times[-1]:.3f} s vs .to('cpu') {plain_s:.3f} s; loaded == saved: {equal}",
    }


def check_trace(cuda: bool, quick: bool, tmp: str) -> dict[str, Any]:
    """A torch.profiler trace (GPU if there is one, else CPU) imported by holoprof and, if present, HTA."""
    sys.path.insert(0, HERE)
    import bench_hta  # lazy: a sibling script, for its timed runner and HTA script

    steps = "100" if cuda else "3"
    trace_dir = os.path.join(tmp, "trace")
    args = [PY, WORKLOAD, "--model", "transformer", "--steps", steps, "--profile", trace_dir]
    if not cuda or quick:
        args.append("--small")
    made = _json_line(_sh(args, timeout=400))
    files = glob.glob(os.path.join(trace_dir, "*.pt.trace.json*"))
    res: dict[str, Any] = {
        "steps": int(steps),
        "files": len(files),
        "bytes": sum(os.path.getsize(f) for f in files),
    }
    res["workload_device"] = made["device"]
    run = os.path.join(tmp, "imported")
    env = _env()
    hp = bench_hta.measure([*HOLOPROF, "import", "torch-trace", trace_dir, "--no-report", "--out", run], env)
    rep_m = bench_hta.measure([*HOLOPROF, "report", run, "--json"], env)
    rep = json.loads(str(rep_m["stdout"]))
    tb = (rep.get("device") or {}).get("temporal_breakdown")
    res["holoprof"] = {
        "import_s": hp["wall_s"],
        "report_s": rep_m["wall_s"],
        "peak_rss_bytes": max(hp["peak_rss_bytes"], rep_m["peak_rss_bytes"]),
        "steps": (rep.get("steps") or {}).get("count"),
        "temporal_breakdown": tb,
    }
    try:
        import hta  # noqa: F401  # lazy: optional, carried as a wheel

        have_hta = True
    except Exception:
        have_hta = False
    if not have_hta:
        res["hta"] = "skipped: HTA not installed"
    else:
        script = os.path.join(tmp, "hta_run.py")
        with open(script, "w") as f:
            f.write(bench_hta.HTA_SCRIPT)
        hta_out = os.path.join(tmp, "hta.json")
        m = bench_hta.measure([PY, script, trace_dir, hta_out], env)
        doc = json.loads(Path(hta_out).read_text())
        res["hta"] = {
            "wall_s": m["wall_s"],
            "peak_rss_bytes": m["peak_rss_bytes"],
            "temporal_breakdown": doc["breakdown"],
        }
    res["figure"] = (
        f"imported {res['holoprof']['steps']} steps in {hp['wall_s']:.1f} s (+ report {rep_m['wall_s']:.1f} s)"
        + ("" if cuda else f"; GPU part {NO_CUDA} (a CPU trace was imported)")
    )
    return res


# ------------------------------------------------------------------------------------------ output
def markdown(doc: dict[str, Any]) -> str:
    c = doc["checks"]
    lines = [f"## GPU checks ({doc['meta'].get('device')})\n", f"`{doc['meta']['command']}`\n"]
    lines += ["| check | figure |", "| --- | --- |"]

    def row(name: str, val: Any) -> None:
        lines.append(f"| {name} | {val} |")

    for name, r in c.items():
        if not isinstance(r, dict):
            continue
        if "error" in r:
            row(name, f"ERROR: {r['error']}")
            continue
        if "figure" in r:
            row(name, r["figure"])
        for model in ("cnn", "transformer"):
            m = r.get(model)
            if not isinstance(m, dict):
                continue
            if name == "overhead":
                row(
                    f"overhead {model} (traced/plain loop)",
                    f"{m['figure']}, steps {m['median_step_ms_plain']:.1f} ms",
                )
                row(
                    f"sync debug {model}",
                    f"{m['sync_figure']} (traced {m['sync_warnings_traced']}, plain {m['sync_warnings_plain']})",
                )
            if name == "agreement":
                for ph, v in m["phases"].items():
                    row(
                        f"{model} {ph} device ms (holoprof / events)",
                        f"{v['holoprof_ms']} / {v['events_ms']:.2f} ({v['ratio']})",
                    )
                u = m["utilization"]
                row(f"{model} utilization % (holoprof / NVML)", f"{u['holoprof_mean']} / {u['nvml_mean']}")
                for k, v in m["memory"].items():
                    row(
                        f"{model} memory {k} (holoprof / allocated delta)",
                        f"{v['holoprof']} / {v['allocated_delta']} ({v['ratio']})",
                    )
                f = m["mfu"]
                row(f"{model} MFU (holoprof / own)", f"{f['holoprof']} / {f['own']} ({f['ratio']})")
        if name == "trace" and isinstance(r.get("hta"), (dict, str)):
            h = r["hta"]
            row(
                "trace: HTA",
                h
                if isinstance(h, str)
                else f"{h['wall_s']:.1f} s, peak {h['peak_rss_bytes'] / 2**20:.0f} MiB",
            )
            row("trace: holoprof peak", f"{r['holoprof']['peak_rss_bytes'] / 2**20:.0f} MiB")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--cpu-plumbing",
        action="store_true",
        help="without CUDA, run the overhead and agreement code on small CPU models",
    )
    ap.add_argument("--wheels", nargs="*", default=[], help="folders of wheels to install first (offline)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "src"))
    os.makedirs(a.out, exist_ok=True)
    t_all = time.perf_counter()
    doc: dict[str, Any] = {
        "meta": {"command": " ".join(["python", *sys.argv]), "python": sys.version.split()[0]},
        "checks": {},
    }
    if a.wheels:
        doc["meta"]["wheels"] = install_wheels(a.wheels)
    cuda = _cuda()
    try:
        import torch  # lazy: recorded in the output

        doc["meta"].update(
            torch=torch.__version__, device=torch.cuda.get_device_name() if cuda else "no CUDA device"
        )
    except Exception as exc:
        doc["meta"]["torch"] = f"not importable: {exc}"
    tmp = tempfile.mkdtemp(prefix="gpucheck-")
    path = os.path.join(a.out, "gpu_check.json")

    def record(name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            r = fn()
        except BaseException as exc:  # one check's failure (even a SystemExit) does not stop the rest
            if isinstance(exc, KeyboardInterrupt):
                raise
            r = {"error": f"{type(exc).__name__}: {exc}"[:3000], "traceback": traceback.format_exc()[-4000:]}
        r["seconds"] = round(time.perf_counter() - t0, 2)
        doc["checks"][name] = r
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        print(f"{name}: {r.get('figure', r.get('error', 'done'))} ({r['seconds']} s)", flush=True)
        return r

    try:
        record("tests", lambda: check_tests(cuda, a.quick))
        over = record("overhead", lambda: check_overhead(cuda, a.quick, tmp, a.cpu_plumbing))
        record(
            "agreement",
            lambda: (
                agreement(cuda, over, a.cpu_plumbing) if "error" not in over else {"error": "overhead failed"}
            ),
        )
        for m in ("cnn", "transformer"):
            if isinstance(over.get(m), dict):
                over[m].pop("_first", None)
        record("burst", lambda: check_burst(cuda, a.quick))
        record("trace", lambda: check_trace(cuda, a.quick, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        doc["meta"]["total_s"] = round(time.perf_counter() - t_all, 1)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        with open(os.path.join(a.out, "gpu_check.md"), "w") as f:
            f.write(markdown(doc))
        print(f"wrote {path} and gpu_check.md ({doc['meta']['total_s']} s)", flush=True)


if __name__ == "__main__":
    main()
