"""`holoprof sweep`: throughput and memory against a parameter (batch size, or any other).

    holoprof sweep --param batch_size=8,16,32,64 [--param lr=0.1,0.01] [--steps N] [--max-seconds S]
                   [--out DIR] [--json] [--plot FILE] -- python train.py --batch-size {batch_size}

Each configuration (the cartesian product of the ``--param`` values) runs traced as
``holoprof run --out DIR/<config> --no-report [--stop-after-steps N] -- COMMAND`` with every
``{name}`` placeholder replaced by its value; the job's output goes to ``DIR/<config>.log``. A
configuration that runs past ``--max-seconds`` is stopped (SIGTERM, forwarded to the job, which
flushes what it recorded) and kept with the steps it made. ``--steps N`` ends each job cleanly after N
optimizer steps, so a sweep costs N steps per configuration whatever the script's own length.

Per configuration: median step time, throughput (samples/s when the swept parameter is the batch
size — ``batch × steps/s`` — or when the DataLoader's batch size is known; steps/s otherwise), the peak
memory and its categories. A job that exits non-zero is marked ``oom`` when its output says it ran
out of memory (or it was killed by SIGKILL, as the kernel's OOM killer does), ``failed`` otherwise;
the other rows are kept. The recommendation is the configuration with the best throughput among
those that finished and fit (peak under 90% of the device's memory).
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": self.command,
            "params": self.params,
            "out_dir": self.out_dir,
            "steps_limit": self.steps_limit,
            "max_seconds": self.max_seconds,
            "rows": [{**asdict(r), "label": r.label} for r in self.rows],
            "recommended": None if self.recommended is None else self.rows[self.recommended].params,
            "recommended_index": self.recommended,
            "reason": self.reason,
        }


# --- input -------------------------------------------------------------------------------------------
def parse_params(specs: list[str]) -> dict[str, list[str]]:
    """``["batch_size=8,16", "lr=0.1"]`` -> ``{"batch_size": ["8", "16"], "lr": ["0.1"]}``."""
    if not specs:
        raise HoloprofError("give at least one --param NAME=V1,V2,..., e.g. --param batch_size=8,16,32")
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
            row.steps_per_s = 1.0 / st.median_s if st.median_s > 0 else 0.0
            bp = batch_param(row.params)
            batch: int | None = None
            if bp is not None:
                try:
                    batch = int(float(row.params[bp]))
                except ValueError:
                    batch = None
            if batch is None:
                b = loader_config(run, main).get("batch_size")
                batch = int(b) if isinstance(b, (int, float)) and b > 0 else None
            row.batch_size = batch
            if batch:
                row.throughput, row.throughput_unit = row.steps_per_s * batch, "samples/s"
            else:
                row.throughput, row.throughput_unit = row.steps_per_s, "steps/s"
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


# --- running -----------------------------------------------------------------------------------------
def run_config(
    command: list[str],
    values: dict[str, str],
    out_dir: str,
    steps: int | None,
    max_seconds: float | None,
    memory: str | None,
) -> SweepRow:
    name = slug(values)
    run_dir = os.path.join(out_dir, name)
    log = os.path.join(out_dir, f"{name}.log")
    argv = [sys.executable, "-m", "holoprof.cli", "run", "--out", run_dir, "--no-report"]
    if steps:
        argv += ["--stop-after-steps", str(steps)]
    if memory:
        argv += ["--memory", memory]
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
    row = SweepRow(params=dict(values), status=status, exit_code=rc, run_dir=run_dir, log=log, wall_s=wall)
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
) -> SweepResult:
    check_template(command, params)
    from holoprof.launch.run import resolve_command

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
    configs = configurations(params)
    for i, values in enumerate(configs):
        if progress is not None:
            progress(i, len(configs), values)
        rows.append(run_config(command, values, out_dir, steps, max_seconds, memory))
    best, reason = recommend(rows)
    result = SweepResult(
        command=list(command),
        params=params,
        out_dir=os.path.abspath(out_dir),
        steps_limit=steps,
        max_seconds=max_seconds,
        rows=rows,
        recommended=best,
        reason=reason,
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
    params = parse_params(list(args.param))
    check_template(command, params)
    if args.steps is not None and args.steps <= 0:
        raise HoloprofError("--steps must be a positive number of steps, e.g. --steps 20")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise HoloprofError("--max-seconds must be a positive number of seconds, e.g. --max-seconds 120")
    out = args.out or os.path.join("holoprof-runs", time.strftime("%Y%m%d-%H%M%S") + "-sweep")

    def progress(i: int, n: int, values: dict[str, str]) -> None:
        sys.stderr.write(f"holoprof: sweep {i + 1}/{n}: {', '.join(f'{k}={v}' for k, v in values.items())}\n")
        sys.stderr.flush()

    result = sweep(command, params, out, args.steps, args.max_seconds, args.memory, progress)
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
