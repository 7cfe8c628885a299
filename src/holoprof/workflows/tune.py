"""`holoprof tune -- COMMAND`: from a finding to a measured fix, with no code change.

    holoprof tune [--steps N] [--out DIR] [--json] -- python train.py

1. runs COMMAND traced for ``--steps`` steps (default 30) and reads its ``input_bound`` finding;
2. sweeps the DataLoader knobs that finding names — ``num_workers``: the current value and the
   model's best predictions (``pin_memory`` too when the job trains on a GPU, and ``omp_wait_policy``
   default and passive when torch's threads contended for the cores, ``persistent_workers`` when the
   workers started again at every epoch) — each applied inside the
   job by the agent (``holoprof sweep --set``), the current configuration measured again beside them;
3. prints the sweep and the measured best: its step time with the 95% interval, against the current
   configuration's, and whether the diff's test calls it significantly faster. The finding is printed
   again with its gain labelled ``measured``.

A run that is not input-bound but whose ``low_mfu`` finding names changes that a knob applies with no
code change (``autocast=bf16`` where the device's bfloat16 peak is higher, ``matmul_precision=high``
for TF32 on an NVIDIA GPU) has those swept instead, the job as it is first. A run with neither, or whose
loader the model cannot describe (a tf.data pipeline: use ``holoprof sweep --set
num_parallel_calls=...``), ends after step 1 with one line saying so.
"""

from __future__ import annotations

import os
from typing import Any

from holoprof.analyze.report import build_report
from holoprof.analyze.sweep import SweepResult, SweepRow, measurement
from holoprof.errors import HoloprofError
from holoprof.launch.run import resolve_command
from holoprof.store.reader import load
from holoprof.workflows.sweep import check_template, run_config, sweep

SCHEMA = "holoprof.tune/1"
DEFAULT_STEPS = 30


def candidates(finding: dict[str, Any]) -> dict[str, list[str]]:
    """The knob values worth measuring, from the finding's model: the current worker count and the
    (up to) two best predicted ones; pin_memory only for a job on a GPU."""
    ev = finding.get("evidence") or {}
    model = ev.get("model") or {}
    pred = {int(k): float(v) for k, v in (model.get("predicted_step_s") or {}).items()}
    if not pred:
        return {}
    cur = int(ev.get("num_workers") or 0)
    best = sorted(pred, key=lambda n: (pred[n], n))[:2]
    knobs = {"num_workers": [str(n) for n in sorted({cur, *best})]}
    if (model.get("inputs") or {}).get("gpu") and not ev.get("pin_memory"):
        knobs["pin_memory"] = ["false", "true"]
    if model.get("persistent_workers_advised"):  # the workers started again at every epoch
        knobs["persistent_workers"] = ["false", "true"]
    if model.get("spin_worth_measuring"):  # torch's idle threads spun on cores the loader needs
        knobs["omp_wait_policy"] = ["default", "passive"]
    return knobs


def measured_finding(finding: dict[str, Any], result: SweepResult, current: dict[str, str]) -> dict[str, Any]:
    """``finding`` with its gain measured by ``result``: the best configuration against ``current``."""
    doc = result.to_dict()
    rows = result.rows
    cur = next((i for i, r in enumerate(rows) if r.knobs == current), None)
    best = result.recommended
    out = dict(finding)
    basis = measurement(doc, cur) if cur is not None else None
    if basis is None or best is None:
        return out
    out["gain_kind"] = "measured"
    out["gain_basis"] = basis
    out["estimated_gain"] = basis["gain"]
    return out


def _findings(run_dir: str) -> dict[str, dict[str, Any]]:
    doc = build_report(load(run_dir))
    return {f["id"]: f for f in doc["findings"]}


def mfu_candidates(finding: dict[str, Any]) -> dict[str, list[str]]:
    """The ``--set`` values of the ``low_mfu`` finding's changes that need no code change (e.g.
    ``autocast=off,bf16``, ``matmul_precision=highest,high``), each knob's current value first."""
    knobs: dict[str, list[str]] = {}
    for change in (finding.get("evidence") or {}).get("changes") or []:
        for k, values in (change.get("knobs") or {}).items():
            knobs.setdefault(str(k), [str(v) for v in values])
    return knobs


def tune(command: list[str], out_dir: str, steps: int, progress: Any = None) -> dict[str, Any]:
    """Run ``command``, then sweep what its ``input_bound`` finding names (or, for a job that is not
    input-bound, what its ``low_mfu`` finding can apply with no code change), and measure the best."""
    check_template(command, {})
    resolve_command(command)
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise HoloprofError(f"{out_dir} exists and is not empty; give another --out directory")
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    if progress is not None:
        progress("measuring the job as it is")
    base: SweepRow = run_config(command, {}, out_dir, steps, None, None, {})
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": command,
        "out_dir": os.path.abspath(out_dir),
        "baseline": base.run_dir,
    }
    if base.steps == 0:
        doc["message"] = f"the job made no training steps ({base.error or base.status}; log: {base.log})"
        return doc
    found = _findings(base.run_dir)
    finding = found.get("input_bound")
    if finding is not None:
        knobs = candidates(finding)
        current = _input_current(finding, knobs)
        if not knobs:
            doc["finding"] = finding
            doc["message"] = (
                "the loader could not be modelled (no DataLoader measurements, e.g. a tf.data pipeline); "
                "measure its knobs with: holoprof sweep --set num_parallel_calls=1,autotune -- COMMAND"
            )
            return doc
    else:
        finding = found.get("low_mfu")
        knobs = mfu_candidates(finding) if finding is not None else {}
        current = {k: v[0] for k, v in knobs.items()}
        if finding is None or not knobs:
            doc["finding"] = finding
            doc["message"] = _nothing_to_tune(finding)
            return doc
    doc["finding"] = finding
    if progress is not None:
        progress("sweeping " + ", ".join(k + "=" + ",".join(v) for k, v in knobs.items()))
    result = sweep(command, {}, os.path.join(out_dir, "sweep"), steps, None, None, None, knobs)
    doc["sweep"] = result.to_dict()
    doc["measured"] = measured_finding(finding, result, current)
    return doc


def _input_current(finding: dict[str, Any], knobs: dict[str, list[str]]) -> dict[str, str]:
    """The job's own configuration, in the sweep's terms."""
    current = {"num_workers": str(int(finding["evidence"].get("num_workers") or 0))}
    if "pin_memory" in knobs:
        current["pin_memory"] = "false"
    if "omp_wait_policy" in knobs:
        current["omp_wait_policy"] = "default"
    if "persistent_workers" in knobs:
        current["persistent_workers"] = "false"
    return current


def _nothing_to_tune(low_mfu: dict[str, Any] | None) -> str:
    if low_mfu is None:
        return (
            "the job is not input-bound (it waits for data less than 5% of a step, or less than a saving "
            "this run can measure: 1% of the step and the noise of its mean step) and its MFU gives no "
            "change worth measuring: nothing to tune"
        )
    return (
        f"the job is not input-bound; {low_mfu.get('title')}, and the changes that finding names need "
        f"code changes: {low_mfu.get('recommendation')}"
    )
