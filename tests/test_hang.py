"""Hangs diagnosed while the job runs: 2 ranks under torchrun on gloo, a watchdog time-out of 3 s.

One rank sleeps 30 s before an all_reduce: the live report's ``hang`` finding names it as stuck (with
the sleep in its stack), the other as waiting in that all_reduce with its sequence number; the job's
output and exit status are those of the job untraced. A rank that exits early leaves the other in
that all_reduce for good: the finding names the dead rank, and keeps it once the job is killed.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import free_port, job_env, report_json, run_holoprof, script, start_holoprof
from holoprof.analyze.report import build_report
from holoprof.bench.synth import generate_run
from holoprof.present.prometheus import prometheus_text
from holoprof.present.terminal import render
from holoprof.store.reader import load

HANG_SCRIPT = script("hang.py")


def torchrun_args() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-port", str(free_port()), HANG_SCRIPT]  # fmt: skip


def untraced_torchrun(cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """The hang script untraced and without the hang: the reference for its output. Tried twice, on
    a fresh port: gloo can abort a rank (SIGABRT) when another job of the suite's other worker takes
    a port it was about to connect to, which has nothing to do with tracing."""
    for attempt in (1, 2):
        plain = subprocess.run(
            torchrun_args(), cwd=cwd, env=job_env(), capture_output=True, timeout=120, check=False
        )
        if plain.returncode == 0 or attempt == 2:
            break
    err = plain.stderr.decode()
    assert plain.returncode == 0, err[:2000] + "\n...\n" + err[-2000:]
    return plain


def hang_finding(doc: dict[str, Any]) -> dict[str, Any] | None:
    return next((f for f in doc["findings"] if f["id"] == "hang"), None)


def wait_for_hang(proc: subprocess.Popen[bytes], run: Path, files: int) -> dict[str, Any]:
    """The live run's report once ``files`` processes wrote their hang state and the report has a hang
    finding; fails if the job ends before."""
    while proc.poll() is None:
        if len(list(run.glob("*/hang-*.json"))) >= files:
            doc = report_json(run)
            if hang_finding(doc) is not None:
                return doc
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    _, err = proc.communicate()
    raise AssertionError(f"the job ended (status {proc.returncode}) with no hang finding: {err.decode()}")


def test_a_rank_held_before_an_all_reduce_is_named_while_the_job_runs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    wake = tmp_path / "wake"  # made once the live hang is checked: the hang ends there
    env = {"HANG_RANK": "1", "HANG_STEP": "3", "HANG_SLEEP_S": "60", "HANG_WAKE_FILE": str(wake)}
    proc = start_holoprof(
        "run", "--out", str(run), "--hang-timeout", "3", "--no-report", "--", *torchrun_args(),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    doc = wait_for_hang(proc, run, files=2)
    assert doc["run"]["status"] == "running"
    f = hang_finding(doc)
    assert f is not None and f["severity"] == "high"
    ev = f["evidence"]
    assert ev["status"] == "ongoing"
    assert ev["stuck_ranks"] == [1] and ev["waiting_ranks"] == [0], ev["ranks"]
    # 3 all_reduces a step (weight and bias gradients, the loss): the loss's of step 3 is the 12th
    assert ev["collective"] == {"group": "0", "op": "all_reduce", "seq": 12, "bytes": 4}
    assert ev["ranks"]["1"]["state"] == "elsewhere" and ev["ranks"]["1"]["last_seq"] == 11
    assert "time.sleep(0.1)  # the hang" in ev["stacks"]["1"], ev["stacks"]["1"]
    assert "all_reduce" in ev["stacks"]["0"]
    # torch's flight recorder (on by default in torch 2.6+, gloo's too) says the same as holoprof's ring:
    # rank 0 is in the all_reduce #12 of group 0, rank 1 completed #11 and has nothing in flight
    fr = ev["flight_recorder"]
    assert fr["0"]["in_flight"][0] == {
        "op": "all_reduce", "seq": 12, "pg": "0", "state": "scheduled", "input_sizes": [[]],
    }, fr["0"]  # fmt: skip
    assert fr["0"]["matches_ring"] is True and fr["0"]["last_completed"]["seq"] == 11
    assert fr["0"]["backend"] == "gloo" and fr["0"]["set_by"] == "torch" and fr["0"]["entries"] == 12
    assert fr["1"]["in_flight"] == [] and "matches_ring" not in fr["1"]
    assert fr["1"]["last_completed"] == {"op": "all_reduce", "seq": 11, "pg": "0"}
    assert "failures" not in fr["0"] and "failures" not in fr["1"]
    assert "rank 1" in f["title"] and "all_reduce #12" in f["title"]
    text = io.StringIO()
    render(doc, file=text)
    assert "hang: rank(s) 0 wait in all_reduce #12" in " ".join(text.getvalue().split())
    metrics = prometheus_text([("live", doc)])
    hung = [line for line in metrics.splitlines() if line.startswith("holoprof_hang_seconds{")]
    assert len(hung) == 1 and float(hung[0].split()[-1]) > 0, hung

    wake.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    # the same job untraced and without the hang (after it: two gloo jobs at once can fail to meet)
    plain = untraced_torchrun(tmp_path)
    plain_out = plain.stdout
    # the ranks print at the same moment: their lines can interleave on the shared stdout
    done = re.compile(r"rank \d+ done, loss [0-9.]+")
    lines = sorted(done.findall(out.decode()))
    assert lines == sorted(done.findall(plain_out.decode()))
    assert len(lines) == 2, out.decode()
    # the evidence stays in the run: a hang that resolved once rank 1 woke up
    f = hang_finding(report_json(run))
    assert f is not None and f["severity"] == "medium"
    ev = f["evidence"]
    assert ev["status"] == "resolved" and ev["hung_s"] >= 3, ev  # at least the --hang-timeout
    assert ev["stuck_ranks"] == [1] and ev["collective"]["seq"] == 12
    assert "time.sleep" in ev["stacks"]["1"] and "resolved" in f["title"]
    assert ev["flight_recorder"]["0"]["in_flight"][0]["seq"] == 12  # as the watchdog saw it, kept


def test_a_rank_that_exits_early_is_named_as_dead(tmp_path: Path) -> None:
    run = tmp_path / "run"
    linger = tmp_path / "linger.pid"
    env = {"DEAD_RANK": "1", "HANG_STEP": "3", "DEAD_LINGER_S": "60", "DEAD_PID_FILE": str(linger)}
    proc = start_holoprof(
        "run", "--out", str(run), "--hang-timeout", "3", "--no-report", "--", *torchrun_args(),
        cwd=tmp_path, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        doc = wait_for_hang(proc, run, files=1)
        f = hang_finding(doc)
        assert f is not None
        ev = f["evidence"]
        assert ev["status"] == "ongoing"
        assert ev["dead_ranks"] == [1] and ev["stuck_ranks"] == [1] and ev["waiting_ranks"] == [0], ev[
            "ranks"
        ]
        assert ev["ranks"]["1"]["state"] == "died" and "ended" in ev["ranks"]["1"]["reason"]
        assert ev["collective"]["seq"] == 12 and ev["collective"]["op"] == "all_reduce"
        fr = ev["flight_recorder"]["0"]  # torch's record of rank 0: waiting in that all_reduce
        assert fr["in_flight"][0]["seq"] == 12 and fr["matches_ring"] is True, fr
        assert "ended" in f["recommendation"]
        # the job is killed, as a scheduler kills a job that stops making progress
        rank0 = next(p for p in doc["processes"] if p["rank"] == 0)
        os.kill(rank0["pid"], signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:  # the whole job goes (after a failed check), and the child the dead rank left behind
        kills = [(os.killpg, proc.pid)] + ([(os.kill, int(linger.read_text()))] if linger.exists() else [])
        for kill, pid in kills:
            try:
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate()
    assert proc.returncode != 0
    f = hang_finding(report_json(run))
    assert f is not None
    ev = f["evidence"]
    assert ev["status"] == "killed" and ev["dead_ranks"] == [1], ev
    assert "killed" in f["title"]


def hang_file(folder: Path, rank: int, waiting_in: dict[str, Any] | None, seqs: dict[str, int]) -> None:
    """A rank's hang state as its watchdog writes it (holoprof.collect.hangs), still stuck."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": "holoprof.hang/1", "host": "synth", "pid": 100 + rank, "rank": rank, "world_size": 3,
        "state": "hung", "updated_ns": 9 * 10**18 + 30 * 10**9, "since_ns": 9 * 10**18, "seqs": seqs,
        "waiting_in": waiting_in, "stacks": f"stack of rank {rank}\n", "episodes": [],
    }  # fmt: skip
    (folder / f"hang-{100 + rank}.json").write_text(json.dumps(doc))


def test_ranks_waiting_in_different_collectives_are_a_mismatch(tmp_path: Path) -> None:
    run = tmp_path / "run"
    generate_run(str(run), steps=20, ranks=3)
    ar = {"group": "0", "op": "all_reduce", "seq": 41, "bytes": 4096}
    bc = {"group": "0", "op": "broadcast", "seq": 41, "bytes": 64}
    hang_file(run / "synth-100", 0, ar, {"0": 41})
    hang_file(run / "synth-101", 1, ar, {"0": 41})
    hang_file(run / "synth-102", 2, bc, {"0": 41})
    f = hang_finding(build_report(load(str(run))))
    assert f is not None
    ev = f["evidence"]
    assert ev["waiting_ranks"] == [0, 1] and ev["stuck_ranks"] == [2]
    assert ev["collective"] == ar
    assert ev["mismatch"] == [{"rank": 2, "group": "0", "op": "broadcast", "seq": 41}]
    assert ev["ranks"]["2"]["state"] == "other_collective"
    assert ev["status"] == "killed" and ev["hung_s"] == 30.0  # the run is over: it ended while hung
    assert "different collectives" in f["recommendation"]
    assert ev["stacks"] == {str(r): f"stack of rank {r}\n" for r in range(3)}


def test_a_rank_stuck_in_its_step_with_nobody_waiting_is_no_hang(tmp_path: Path) -> None:
    run = tmp_path / "run"
    generate_run(str(run), steps=20, ranks=2)
    hang_file(run / "synth-100", 0, None, {"0": 7})  # a long evaluation: nobody waits for it
    doc = build_report(load(str(run)))
    assert hang_finding(doc) is None and doc["hang"] == {}


def test_a_negative_hang_timeout_is_refused(tmp_path: Path) -> None:
    proc = run_holoprof(
        "run", "--out", str(tmp_path / "r"), "--hang-timeout", "-1", "--", "true", cwd=tmp_path
    )
    assert proc.returncode == 2 and not (tmp_path / "r").exists()
    assert proc.stderr.strip() == (
        "holoprof: error: --hang-timeout must be a number of seconds (0 turns the watchdog off), e.g. 300"
    )
