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

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

from holoprof.analyze.sweep import SweepResult, SweepRow, analyze_config, compare_best, recommend
from holoprof.errors import HoloprofError
from holoprof.knobspec import parse_assignments, text
from holoprof.launch.run import resolve_command
from holoprof.store.sidefiles import write_sweep

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


_OOM = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory", re.IGNORECASE)


# --- input -------------------------------------------------------------------------------------------
def parse_knobs(specs: list[str], params: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """``["num_workers=0,2"]`` -> ``{"num_workers": ["0", "2"]}``, each value checked and normalised."""
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
    write_sweep(out_dir, result.to_dict())
    return result
