"""`holoprof sweep`: throughput and memory against a parameter (batch size, or any other).

    holoprof sweep --param batch_size=8,16,32,64 [--param lr=0.1,0.01] [--steps N] [--max-seconds S]
                   [--out DIR] [--json] [--plot FILE] -- python train.py --batch-size {batch_size}
    holoprof sweep --set num_workers=0,1,2 [--set pin_memory=true,false] [--steps N] -- python train.py

Each configuration (the cartesian product of the ``--param`` and ``--set`` values) runs traced as
``holoprof run --out DIR/<config> --no-report [--stop-after-steps N] [--set KNOB=V ...] -- COMMAND``
with every ``{name}`` placeholder replaced by its ``--param`` value; ``--set`` knobs are applied inside
the job by the agent with no change to the command (:mod:`holoprof.collect.knobs`), and each run records
what was applied. The job's output goes to ``DIR/<config>.log``. A
configuration that runs past ``--max-seconds`` is stopped (SIGTERM, forwarded to the job, which
flushes what it recorded) and kept with the steps it made. ``--steps N`` ends each job cleanly after N
optimizer steps, so a sweep costs N steps per configuration whatever the script's own length.

Per configuration: the steady mean step (the first steps, which start the DataLoader workers, left
out) with its 95% confidence interval (block means), throughput (samples/s when the swept parameter is
the batch size — ``batch / mean step`` — or when the DataLoader's batch size is known; steps/s
otherwise), the median step for reference, the peak
memory and its categories. A job that exits non-zero is marked ``oom`` when its output says it ran
out of memory (or it was killed by SIGKILL, as the kernel's OOM killer does), ``failed`` otherwise;
the other rows are kept. The recommendation is the configuration with the best throughput among
those that finished and fit (peak under 90% of the device's memory); its step times are compared with
those of the runner-up and of the first configuration by the diff's throughput test (Mann-Whitney U on
the block means of the steady steps, p < 0.01 and at least a 5% change of the mean step), which says
whether it is significantly better.

The mean, not the median: with DataLoader workers, steps alternate between a batch that was ready and
one that was not, and the median of such steps can be several times shorter than the time a step
really takes on average (measured: 1.3 ms median against 6.1 ms mean with 3 workers on a wait-bound
loader; docs/input-pipeline.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from holoprof.errors import HoloprofError

SCHEMA = "holoprof.sweep/1"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_OOM = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory", re.IGNORECASE)
FITS_FRACTION = 0.90
BATCH_NAMES = ("batch_size", "batch", "bs", "batchsize", "mini_batch", "micro_batch_size")


@dataclass
class SweepRow:
    params: dict[str, str]
    status: str  # ok | timeout | oom | failed
    exit_code: int
    run_dir: str
    log: str
    wall_s: float
    steps: int = 0
    step_median_s: float = 0.0
    step_mean_s: float = 0.0  # the steady mean step: what the throughput follows
    steps_per_s: float = 0.0
    batch_size: int | None = None
    throughput: float = 0.0
    throughput_unit: str = "steps/s"
    peak_bytes: int = 0
    limit_bytes: int = 0
    device: str = ""
    categories: dict[str, int] = field(default_factory=dict)
    error: str = ""
    fits: bool = False
    knobs: dict[str, str] = field(default_factory=dict)  # the --set values of this configuration
    applied: dict[str, Any] = field(default_factory=dict)  # what the job's agent recorded applying
    loader: dict[str, Any] = field(default_factory=dict)  # the training DataLoader as the job built it
    step_ci_s: list[float] = field(default_factory=list)  # 95% interval of the steady mean step
    # from the step's interval; its upper end is None (unbounded) when that interval reaches 0
    throughput_ci: list[float | None] = field(default_factory=list)
    durations_s: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items())


@dataclass
class SweepResult:
    command: list[str]
    params: dict[str, list[str]]
    out_dir: str
    steps_limit: int | None
    max_seconds: float | None
    rows: list[SweepRow]
    recommended: int | None  # index into rows
    reason: str
    knobs: dict[str, list[str]] = field(default_factory=dict)
    comparisons: list[dict[str, Any]] = field(default_factory=list)  # the best against others

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": self.command,
            "params": {**self.params, **self.knobs},
            "knobs": self.knobs,
            "comparisons": self.comparisons,
            "out_dir": self.out_dir,
            "steps_limit": self.steps_limit,
            "max_seconds": self.max_seconds,
            "rows": [
                {**{k: v for k, v in asdict(r).items() if k != "durations_s"}, "label": r.label}
                for r in self.rows
            ],
            "recommended": None if self.recommended is None else self.rows[self.recommended].params,
            "recommended_index": self.recommended,
            "reason": self.reason,
        }


# --- input -------------------------------------------------------------------------------------------
def parse_knobs(specs: list[str], params: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """``["num_workers=0,2"]`` -> ``{"num_workers": ["0", "2"]}``, each value checked and normalised."""
    from holoprof.collect.knobs import parse_assignments, text

    out = {k: [text(v) for v in vs] for k, vs in parse_assignments(specs).items()}
    both = sorted(set(out) & set(params or {}))
    if both:
        raise HoloprofError(f"{both[0]} is given both as --param and as --set; keep one")
    return out


def parse_params(specs: list[str], knobs: bool = False) -> dict[str, list[str]]:
    """``["batch_size=8,16", "lr=0.1"]`` -> ``{"batch_size": ["8", "16"], "lr": ["0.1"]}``."""
    if not specs and not knobs:
        raise HoloprofError(
            "give at least one --param NAME=V1,V2,... (e.g. --param batch_size=8,16,32) or --set KNOB=V1,V2,... "
            "(e.g. --set num_workers=0,2)"
        )
    out: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip()
        vals = [v.strip() for v in values.split(",")]
        if not sep or not _NAME.match(name) or not values.strip() or any(not v for v in vals):
            raise HoloprofError(
                f"bad --param {spec!r}: write NAME=V1,V2,... with a name of letters, digits and _ and "
                "non-empty values, e.g. --param batch_size=8,16,32"
            )
        if name in out:
            raise HoloprofError(f"--param {name} is given twice; list all its values in one: {name}=a,b,c")
        out[name] = vals
    return out


def check_template(command: list[str], params: dict[str, list[str]]) -> None:
    if not command:
        raise HoloprofError(
            "no command given; put it after --, with a placeholder per parameter, e.g.: "
            "holoprof sweep --param batch_size=8,16 -- python train.py --batch-size {batch_size}"
        )
    used = {m for a in command for m in _PLACEHOLDER.findall(a)}
    missing = [p for p in params if p not in used]
    if missing:
        raise HoloprofError(
            f"the command has no placeholder for {', '.join('{' + m + '}' for m in missing)}; write it where "
            f"the value goes, e.g.: -- python train.py --batch-size {{{missing[0]}}}"
        )
    unknown = sorted(used - set(params))
    if unknown:
        raise HoloprofError(
            f"the command has placeholder(s) {', '.join('{' + u + '}' for u in unknown)} with no --param; "
            f"add --param {unknown[0]}=V1,V2"
        )


def configurations(params: dict[str, list[str]]) -> list[dict[str, str]]:
    names = list(params)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(params[n] for n in names))]


def fill(command: list[str], values: dict[str, str]) -> list[str]:
    return [_PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), a) for a in command]


def slug(values: dict[str, str]) -> str:
    s = "-".join(f"{k}={v}" for k, v in values.items())
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", s)[:120]


def batch_param(params: dict[str, str]) -> str | None:
    for k in params:
        if k.lower() in BATCH_NAMES:
            return k
    return None


# --- analysis of one configuration ---------------------------------------------------------------------
def classify(exit_code: int, log_text: str, timed_out: bool) -> tuple[str, str]:
    """(status, error line) of a finished configuration."""
    if timed_out:
        return "timeout", ""
    if exit_code == 0:
        return "ok", ""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip() and not ln.startswith("holoprof:")]
    m = next((ln for ln in reversed(lines) if _OOM.search(ln)), None)
    if m is not None:
        return "oom", m[:300]
    if exit_code == 128 + signal.SIGKILL:
        return "oom", "killed by SIGKILL (the kernel's out-of-memory killer does this)"
    last = lines[-1] if lines else f"exit status {exit_code}"
    return "failed", last[:300]


def analyze_config(row: SweepRow) -> SweepRow:
    """Fill ``row`` with step time, throughput and memory from its run directory (if it has steps)."""
    if not os.path.isfile(os.path.join(row.run_dir, "manifest.json")):
        return row
    from holoprof.analyze.diff import mean_interval, steady, step_durations
    from holoprof.analyze.memory import memory_stats
    from holoprof.analyze.steps import loader_config, step_processes, step_stats
    from holoprof.store.reader import load

    run = load(row.run_dir)
    try:
        procs = step_processes(run)
        main = procs[0] if procs else None
        if main is not None:
            st = step_stats(run, main, timeline_points=1)
            row.steps = st.count
            row.step_median_s = st.median_s
            row.durations_s = step_durations(run)
            ss = steady(row.durations_s)
            row.step_mean_s = sum(ss) / len(ss) if ss else 0.0
            row.steps_per_s = 1.0 / row.step_mean_s if row.step_mean_s > 0 else 0.0
            lo, hi = mean_interval(ss)
            row.step_ci_s = [round(lo, 6), round(hi, 6)]
            row.applied = applied_knobs(run, main)
            row.loader = {
                k: v
                for k, v in loader_config(run, main).items()
                if k in ("num_workers", "batch_size", "prefetch_factor", "pin_memory", "persistent_workers")
            }
            bp = batch_param(row.params)
            batch: int | None = None
            if bp is not None:
                try:
                    batch = int(float(row.params[bp]))
                except ValueError:
                    batch = None
            if batch is None:
                b = row.loader.get("batch_size")
                batch = int(b) if isinstance(b, (int, float)) and b > 0 else None
            row.batch_size = batch
            per = float(batch) if batch else 1.0
            row.throughput_unit = "samples/s" if batch else "steps/s"
            row.throughput = row.steps_per_s * per
            row.throughput_ci = [
                round(per / hi, 4) if hi > 0 else 0.0,
                round(per / lo, 4) if lo > 0 else None,
            ]
        ms = memory_stats(run, main)
        if ms is not None:
            row.peak_bytes = ms.peak_bytes
            row.limit_bytes = ms.limit_bytes
            row.device = ms.device
            row.categories = dict(ms.categories or ms.peak.categories)
    finally:
        run.con.close()
    row.fits = (
        row.status in ("ok", "timeout")
        and row.steps > 0
        and (row.limit_bytes <= 0 or row.peak_bytes < FITS_FRACTION * row.limit_bytes)
    )
    return row


def applied_knobs(run: Any, main: Any) -> dict[str, Any]:
    """The knobs the job's agent recorded applying (its process row's ``info["knobs"]``)."""
    rows = run.rows(
        "SELECT info FROM processes WHERE host = ? AND pid = ? ORDER BY updated_ns DESC LIMIT 1",
        [main.host, main.pid],
    )
    try:
        info = json.loads(rows[0][0]) if rows and rows[0][0] else {}
    except ValueError:
        return {}
    knobs = info.get("knobs") if isinstance(info, dict) else None
    return knobs if isinstance(knobs, dict) else {}


def compare_best(rows: list[SweepRow], best: int | None) -> list[dict[str, Any]]:
    """The best configuration's steps against the runner-up's and the first configuration's, with the
    diff's significance test (B = the best)."""
    from holoprof.analyze.diff import throughput_test

    if best is None:
        return []
    fit = sorted((i for i, r in enumerate(rows) if r.fits and r.throughput > 0 and i != best),
                 key=lambda i: -rows[i].throughput)  # fmt: skip
    others = ([fit[0]] if fit else []) + (
        [0] if best != 0 and rows[0].durations_s and (not fit or fit[0] != 0) else []
    )
    out = []
    for i in others:
        t = throughput_test(rows[i].durations_s, rows[best].durations_s)
        out.append(
            {
                "against": rows[i].label,
                "against_index": i,
                "role": "runner-up" if fit and i == fit[0] else "first",
                "significant": t.significant and t.direction == "faster",
                "mean_change": t.mean_change,
                "median_change": t.median_change,
                "p_value": t.p_value,
                "verdict": t.verdict.replace("B is", "the best is"),
            }
        )
    return out


def recommend(rows: list[SweepRow]) -> tuple[int | None, str]:
    fit = [i for i, r in enumerate(rows) if r.fits and r.throughput > 0]
    if not fit:
        return None, "no configuration finished with steps that fit in memory"
    best = max(fit, key=lambda i: rows[i].throughput)
    r = rows[best]
    others = [rows[i].throughput for i in fit if i != best]
    vs = f" ({r.throughput / max(others):.2f}× the next best)" if others and max(others) > 0 else ""
    bad = [x.label for x in rows if x.status in ("oom", "failed")]
    tail = f"; {len(bad)} configuration(s) failed or ran out of memory: {'; '.join(bad)}" if bad else ""
    return (
        best,
        f"{r.label}: the best throughput, {r.throughput:.1f} {r.throughput_unit}{vs}, that fits{tail}",
    )


def step_of(row: dict[str, Any]) -> float:
    """A sweep row's step time: its steady mean (a sweep.json written before it had one: the median)."""
    return float(row.get("step_mean_s") or row.get("step_median_s") or 0.0)


def measurement(doc: dict[str, Any], this: int) -> dict[str, Any] | None:
    """What a sweep measured for its row ``this``: the best configuration's step against this one's,
    with their 95% intervals and the diff's verdict; ``gain`` is the saving when it is significant."""
    rows = doc["rows"]
    best = doc.get("recommended_index")
    if best is None or not 0 <= this < len(rows) or rows[this]["steps"] == 0:
        return None
    b, t = rows[best], rows[this]
    comp = next((c for c in doc.get("comparisons") or [] if c["against_index"] == this), None)
    significant = bool(comp and comp["significant"])
    bs, ts = step_of(b), step_of(t)
    gain = 1 - bs / ts if significant and ts > 0 else 0.0
    return {
        "sweep": doc["out_dir"],
        "this": t["label"],
        "this_step_s": ts,
        "this_interval_s": t.get("step_ci_s") or [],
        "best": b["label"],
        "best_step_s": bs,
        "best_interval_s": b.get("step_ci_s") or [],
        "significant": significant or this == best,
        "p_value": comp["p_value"] if comp else None,
        "verdict": comp["verdict"] if comp else ("this is the best configuration" if this == best else ""),
        "gain": round(max(0.0, gain), 4),
    }


def measured_gain(run_dir: str) -> dict[str, Any] | None:
    """For a run made by a sweep (its folder holds ``sweep.json``): what the sweep measured, as
    :func:`measurement` gives it; None for other runs."""
    parent = os.path.dirname(os.path.abspath(run_dir))
    try:
        with open(os.path.join(parent, "sweep.json")) as f:
            doc = json.load(f)
        rows = doc["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    me = os.path.abspath(run_dir)
    idx = next((i for i, r in enumerate(rows) if os.path.abspath(str(r.get("run_dir"))) == me), None)
    return measurement(doc, idx) if idx is not None else None


# --- running -----------------------------------------------------------------------------------------
def run_config(
    command: list[str],
    values: dict[str, str],
    out_dir: str,
    steps: int | None,
    max_seconds: float | None,
    memory: str | None,
    knobs: dict[str, str] | None = None,
) -> SweepRow:
    knobs = dict(knobs or {})
    name = slug({**values, **knobs}) or "baseline"
    run_dir = os.path.join(out_dir, name)
    log = os.path.join(out_dir, f"{name}.log")
    argv = [sys.executable, "-m", "holoprof.cli", "run", "--out", run_dir, "--no-report"]
    if steps:
        argv += ["--stop-after-steps", str(steps)]
    if memory:
        argv += ["--memory", memory]
    for k, v in knobs.items():
        argv += ["--set", f"{k}={v}"]
    argv += ["--", *fill(command, values)]
    t0 = time.monotonic()
    timed_out = False
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            rc = proc.wait(timeout=max_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGTERM)  # forwarded to the job; it flushes what it recorded
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    wall = time.monotonic() - t0
    with open(log, errors="replace") as f:
        text = f.read()
    status, err = classify(rc, text, timed_out)
    row = SweepRow(
        params={**values, **knobs},
        status=status,
        exit_code=rc,
        run_dir=run_dir,
        log=log,
        wall_s=wall,
        knobs=knobs,
    )
    row.error = err
    try:
        analyze_config(row)
    except HoloprofError as exc:
        row.error = row.error or str(exc)
    return row


def sweep(
    command: list[str],
    params: dict[str, list[str]],
    out_dir: str,
    steps: int | None = None,
    max_seconds: float | None = None,
    memory: str | None = None,
    progress: Any = None,
    knobs: dict[str, list[str]] | None = None,
) -> SweepResult:
    check_template(command, params)
    from holoprof.launch.run import resolve_command

    knobs = dict(knobs or {})
    resolve_command(fill(command, configurations(params)[0]))  # a missing script fails before any run
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise HoloprofError(f"{out_dir} exists and is not a directory; give a new --out directory")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise HoloprofError(f"{out_dir} exists and is not empty; give another --out directory")
    try:
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise HoloprofError(
            f"cannot create {out_dir} ({exc.strerror or exc}); choose a writable place with --out"
        )
    rows = []
    configs = [(v, k) for v in configurations(params) for k in configurations(knobs)]
    for i, (values, knob_values) in enumerate(configs):
        if progress is not None:
            progress(i, len(configs), {**values, **knob_values})
        rows.append(run_config(command, values, out_dir, steps, max_seconds, memory, knob_values))
    best, reason = recommend(rows)
    comparisons = compare_best(rows, best)
    if comparisons:
        sig = [c for c in comparisons if c["significant"]]
        not_sig = [c for c in comparisons if not c["significant"]]
        if not_sig:
            reason += f"; not significantly faster than {not_sig[0]['against']} ({not_sig[0]['verdict']})"
        elif sig:
            reason += f"; significantly faster than {', '.join(c['against'] for c in sig)}"
    result = SweepResult(
        command=list(command),
        params=params,
        out_dir=os.path.abspath(out_dir),
        steps_limit=steps,
        max_seconds=max_seconds,
        rows=rows,
        recommended=best,
        reason=reason,
        knobs=knobs,
        comparisons=comparisons,
    )
    with open(os.path.join(out_dir, "sweep.json"), "w") as f:
        json.dump(result.to_dict(), f, indent=2)
    return result


# --- command line --------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    from holoprof.cli import finite_float

    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="a parameter and its values; {NAME} in the command is replaced by each (repeatable: all combinations)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="knob_specs",
        metavar="KNOB=V1,V2,...",
        help="a knob applied inside the job with no code change, and its values (repeatable): num_workers, "
        "prefetch_factor, pin_memory, persistent_workers, batch_size, torch_threads, num_parallel_calls, prefetch",
    )
    p.add_argument("--steps", type=int, help="end each configuration cleanly after N optimizer steps")
    p.add_argument(
        "--max-seconds",
        type=finite_float,
        help="stop a configuration that runs longer (kept, marked timeout)",
    )
    p.add_argument("--out", help="directory for the runs (default: ./holoprof-runs/<time>-sweep)")
    p.add_argument("--memory", choices=("sampled", "full", "off"), help="memory accounting of each run")
    p.add_argument("--json", action="store_true", help="print the result as JSON (schema holoprof.sweep/1)")
    p.add_argument("--plot", metavar="FILE", help="write a self-contained HTML plot of throughput and memory")
    p.add_argument(
        "command", nargs=argparse.REMAINDER, help="the command, after --, with {NAME} placeholders"
    )


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    params = parse_params(list(args.param), knobs=bool(args.knob_specs))
    knobs = parse_knobs(list(args.knob_specs), params)
    check_template(command, params)
    if args.steps is not None and args.steps <= 0:
        raise HoloprofError("--steps must be a positive number of steps, e.g. --steps 20")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise HoloprofError("--max-seconds must be a positive number of seconds, e.g. --max-seconds 120")
    out = args.out or os.path.join("holoprof-runs", time.strftime("%Y%m%d-%H%M%S") + "-sweep")

    def progress(i: int, n: int, values: dict[str, str]) -> None:
        sys.stderr.write(f"holoprof: sweep {i + 1}/{n}: {', '.join(f'{k}={v}' for k, v in values.items())}\n")
        sys.stderr.flush()

    result = sweep(command, params, out, args.steps, args.max_seconds, args.memory, progress, knobs)
    from holoprof.present import sweep as present

    if args.plot:
        present.write_html(result.to_dict(), args.plot)
        sys.stderr.write(f"holoprof: wrote {args.plot}\n")
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        present.render(result.to_dict())
    return 0 if any(r.status in ("ok", "timeout") for r in result.rows) else 1
