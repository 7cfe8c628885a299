"""Counts that dropped spans cannot spoil, and steps of loops run in several threads.

The agent counts steps, epochs and phases beside its span buffer (the ``counters`` of each process's
row), so a run whose buffer overflowed still reports the step count the job printed, and says in
``run.warnings`` what was dropped and which figures are exact. Each thread that trains has its own
steps: eight threads of 50 iterations are 400 steps, with holoprof.step() and with torch loops.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import holoprof
from conftest import TracedRun, main_process, report_json, script, traced, traced_with_agent_options

STEPS = 20_000
THREADS, PER_THREAD = 8, 50


def printed_steps(stdout: str) -> int:
    m = re.search(r"^steps (\d+)$", stdout, re.M)
    assert m, stdout
    return int(m.group(1))


@pytest.fixture(scope="module")
def dropped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str, dict[str, Any]]:
    """20,000 fast iterations (a phase and a step each) into a buffer of 100 spans: most are dropped."""
    tmp = tmp_path_factory.mktemp("drops")
    proc, run_dir = traced_with_agent_options(
        tmp, {"buffer_limit": 100}, sys.executable, script("thread_steps.py"), "1", str(STEPS)
    )
    assert proc.returncode == 0, proc.stderr
    return proc, run_dir, report_json(run_dir)


@pytest.fixture(scope="module")
def marked_threads(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    """Eight threads, each 50 iterations of a forward phase and a holoprof.step(), nothing dropped."""
    run = traced(tmp_path_factory.mktemp("threads"), script("thread_steps.py"), str(THREADS), str(PER_THREAD))
    assert run.proc.returncode == 0, run.proc.stderr
    return run


def span_sum(run_dir: str, where: str) -> tuple[int, int]:
    """(rows, summed ns) of the spans matching ``where``."""
    n, ns = holoprof.load(run_dir).rows(
        f"SELECT count(*), coalesce(sum(end_ns - start_ns), 0) FROM spans WHERE {where}"
    )[0]
    return int(n), int(ns)


def test_a_run_that_dropped_spans_reports_the_step_count_the_job_printed(dropped: Any) -> None:
    proc, run_dir, doc = dropped
    assert printed_steps(proc.stdout) == STEPS
    assert doc["run"]["dropped_events"] > 0
    steps = doc["steps"]
    assert steps["count"] == STEPS, "the agent's exact count, not the kept spans'"
    kept, kept_ns = span_sum(run_dir, "kind = 'step'")
    assert 0 < kept < STEPS / 2 and steps["kept"] == kept
    assert main_process(doc)["steps"] == STEPS
    assert steps["total_s"] > kept_ns / 1e9 and steps["mean_s"] == pytest.approx(
        steps["total_s"] / STEPS, abs=1e-6
    )
    assert steps["sources"]["steps.count"] == "counters" and steps["sources"]["phases.total_s"] == "counters"
    assert steps["sources"]["steps.median_s"] == "spans" and steps["sources"]["steps.p90_s"] == "spans"
    # the phase totals are exact too: far more than the kept forward spans, and still 100% in all
    _, kept_forward_ns = span_sum(run_dir, "kind = 'phase' AND name = 'forward'")
    assert doc["phases"]["forward"]["total_s"] > 2 * kept_forward_ns / 1e9
    assert sum(p["fraction"] for p in doc["phases"].values()) == pytest.approx(1.0)
    assert doc["phases"]["forward"]["total_s"] + doc["phases"]["other"]["total_s"] == pytest.approx(
        steps["total_s"], abs=1e-5
    )


def test_the_drop_is_a_warning_in_the_json_with_the_terminals_words(dropped: Any) -> None:
    proc, _, doc = dropped
    found = [w for w in doc["run"]["warnings"] if "events were dropped" in w]
    assert len(found) == 1, doc["run"]["warnings"]
    warning = found[0]
    assert warning.startswith(f"{doc['run']['dropped_events']} events were dropped (buffer full")
    assert "exact counts" in warning and f"the {doc['steps']['kept']} of {STEPS} steps" in warning
    # the short report the run printed (on stdout) shows the same line (once), wrapped in its panel
    terminal = " ".join(re.sub("[│╭╮╰╯─]", " ", proc.stdout).split())
    assert terminal.count(" ".join(warning.split())) == 1, proc.stdout


def test_a_run_that_kept_no_step_at_all_still_counts_its_steps(tmp_path: Path) -> None:
    """A buffer of no span: every span is dropped, and the counts alone make the report."""
    proc, run_dir = traced_with_agent_options(
        tmp_path, {"buffer_limit": 0}, sys.executable, script("thread_steps.py"), "2", "500"
    )
    assert proc.returncode == 0, proc.stderr
    assert span_sum(run_dir, "true") == (0, 0)
    doc = report_json(run_dir)
    assert doc["steps"]["count"] == printed_steps(proc.stdout) == 1000 and doc["steps"]["kept"] == 0
    assert doc["phases"]["forward"]["total_s"] > 0 and doc["steps"]["per_s"] > 0
    assert "no step's records were kept" in doc["run"]["warnings"][0]


def test_threads_that_each_mark_steps_count_every_step(marked_threads: TracedRun) -> None:
    run = marked_threads
    assert printed_steps(run.proc.stdout) == THREADS * PER_THREAD
    doc = run.report
    assert doc["run"]["dropped_events"] == 0 and doc["run"]["warnings"] == []
    assert doc["steps"]["count"] == doc["steps"]["kept"] == THREADS * PER_THREAD
    assert set(doc["steps"]["sources"].values()) == {"spans"}
    per_thread = holoprof.load(run.run_dir).rows(
        "SELECT tid, count(*), count(DISTINCT step) FROM spans WHERE kind = 'step' GROUP BY tid"
    )
    assert sorted(n for _, n, _ in per_thread) == [PER_THREAD] * THREADS
    distinct = holoprof.load(run.run_dir).rows("SELECT count(DISTINCT step) FROM spans WHERE kind = 'step'")[
        0
    ][0]
    assert distinct == THREADS * PER_THREAD, "a step is known by its process and index"
    # the phases of every thread make the breakdown, not those of one thread
    _, forward_ns = span_sum(run.run_dir, "kind = 'phase' AND name = 'forward'")
    assert doc["phases"]["forward"]["total_s"] == pytest.approx(forward_ns / 1e9, abs=1e-5)


def test_the_agents_counts_agree_with_the_spans_when_nothing_was_dropped(marked_threads: TracedRun) -> None:
    ((raw,),) = holoprof.load(marked_threads.run_dir).rows(
        "SELECT counters FROM processes WHERE role IS DISTINCT FROM 'launcher'"
    )
    threads = json.loads(raw)["threads"]
    assert len(threads) == THREADS
    for tid, c in threads.items():
        n, ns = span_sum(marked_threads.run_dir, f"kind = 'step' AND tid = {int(tid)}")
        assert (c["steps"], c["step_ns"]) == (n, ns) == (PER_THREAD, ns)
        fn, fns = span_sum(
            marked_threads.run_dir, f"kind = 'phase' AND name = 'forward' AND tid = {int(tid)}"
        )
        inside, outside = c["phases"].get("forward", [0, 0]), c["outside"].get("forward", [0, 0])
        assert [inside[0] + outside[0], inside[1] + outside[1]] == [fn, fns]
        assert inside[0] == PER_THREAD, "every forward phase lies inside its thread's step"


def test_threads_that_each_train_a_torch_model_count_every_step(tmp_path: Path) -> None:
    run = traced(tmp_path, script("thread_steps.py"), str(THREADS), str(PER_THREAD), "--torch")
    assert run.proc.returncode == 0, run.proc.stderr
    assert printed_steps(run.proc.stdout) == THREADS * PER_THREAD
    doc = run.report
    assert doc["steps"]["count"] == THREADS * PER_THREAD
    per_thread = holoprof.load(run.run_dir).rows(
        "SELECT tid, count(*) FROM spans WHERE kind = 'step' GROUP BY tid"
    )
    assert sorted(n for _, n in per_thread) == [PER_THREAD] * THREADS
    for phase in ("forward", "backward"):  # one of each per iteration, in every thread
        assert span_sum(run.run_dir, f"kind = 'phase' AND name = '{phase}'")[0] == THREADS * PER_THREAD
    assert all(doc["phases"][p]["fraction"] > 0 for p in ("forward", "backward", "optimizer"))
    # memory is not measured once several threads train (another thread writes what a snapshot reads)
    assert any("memory by category was not measured" in w for w in doc["run"]["warnings"])


def _scripted_loop(buffer_limit: int, tmp: Path) -> dict[str, Any]:
    """One thread's loop through the step tracker, its spans kept (the writer counts their phases,
    flushing twice), some dropped or all dropped (the loop counts them): an evaluation before the
    loop's first step, two steps, an evaluation after each update, the last one after the loop's end."""
    from holoprof.agent.core import Agent

    agent = Agent(str(tmp), options={"buffer_limit": buffer_limit})
    steps = agent.steps

    def flush(final: bool) -> None:
        before = steps.indices()
        spans, agent.spans_buf = agent.spans_buf, []
        steps.count_kept(spans, before, final)

    def phase(name: str, t0: int, t1: int) -> None:
        agent.span("phase", name, t0, t1, steps.index)

    phase("eval", 1, 5)  # before the loop's first step: not counted
    flush(False)
    phase("eval", 6, 8)
    steps.opener(10)
    phase("forward", 11, 12)
    phase("backward", 12, 14)
    phase("optimizer", 14, 16)
    steps.update_done(16)
    phase("eval", 17, 18)  # after the update: the step ends at the next opener, with it
    steps.opener(20)
    phase("data_wait", 20, 21)
    flush(False)  # the step in progress waits for its end
    phase("forward", 21, 22)
    phase("optimizer", 22, 23)
    steps.update_done(23)
    phase("eval", 25, 27)  # after the last update: outside the steps
    steps.finish(30)
    flush(True)
    counts = steps.counts(0)
    assert counts is not None
    (thread,) = counts["threads"].values()
    return {k: thread[k] for k in ("steps", "step_ns", "phases", "outside")}


def test_the_writers_counts_of_kept_phases_equal_the_loops_of_dropped_ones(tmp_path: Path) -> None:
    kept = _scripted_loop(50_000, tmp_path / "kept")
    # the buffer fills in the first step: its phases are kept, its step span and what follows dropped
    some = _scripted_loop(4, tmp_path / "some")
    dropped = _scripted_loop(0, tmp_path / "dropped")
    assert (
        kept
        == some
        == dropped
        == {
            "steps": 2,
            "step_ns": 10 + 3,
            "phases": {
                "forward": [2, 2],
                "backward": [1, 2],
                "optimizer": [2, 3],
                "eval": [1, 1],
                "data_wait": [1, 1],
            },
            "outside": {"eval": [1, 2]},
        }
    )


@pytest.mark.parametrize("ends", [True, False], ids=["step-recorded", "never-recorded"])
def test_a_step_with_more_phases_than_the_writer_keeps_apart_counts_them_all(
    tmp_path: Path, ends: bool
) -> None:
    from holoprof.agent.core import Agent
    from holoprof.agent.steps import PENDING_PHASES

    agent = Agent(str(tmp_path))
    steps = agent.steps
    steps.mark()  # holoprof.step(): the first step starts
    n = PENDING_PHASES * 2 + 10
    for _ in range(3):  # three flushes while the step goes on: the waiting phases stay bounded
        for _ in range(n // 3 + 1):
            t0 = time.perf_counter_ns()
            agent.span("phase", "eval", t0, t0 + 5, steps.index)
        before = steps.indices()
        spans, agent.spans_buf = agent.spans_buf, []
        steps.count_kept(spans, before, False)
        assert sum(len(v) for v in steps._pending.values()) < PENDING_PHASES
    if ends:
        steps.mark()  # the step ends after its phases began: they lie inside it
    steps.finish(time.perf_counter_ns())
    before = steps.indices()
    spans, agent.spans_buf = agent.spans_buf, []
    steps.count_kept(spans, before, True)
    counts = steps.counts(0)
    total = 3 * (n // 3 + 1)
    if ends:
        assert counts is not None
        (thread,) = counts["threads"].values()
        assert thread["phases"] == {"eval": [total, 5 * total]} and thread["outside"] == {}
    else:
        assert counts is None or all(not t["phases"] for t in counts["threads"].values())
        assert steps.kept[next(iter(steps.kept))][1] == {"eval": [total, 5 * total]}


def test_a_thread_that_only_fetches_keeps_no_phase_waiting_for_a_step(tmp_path: Path) -> None:
    """A thread with a loop but no step of its own (a thread that fetches batches for the training
    thread and ends their epochs) records its phases with the training thread's step: the writer keeps
    none of them waiting, flush after flush."""
    import threading

    from holoprof.agent.core import Agent

    agent = Agent(str(tmp_path))
    steps = agent.steps
    steps.mark()

    def fetcher() -> None:
        steps.mine().epochs += 1  # an epoch's end made this thread a loop, with no step
        for _ in range(200):
            t0 = time.perf_counter_ns()
            agent.span("phase", "data_wait", t0, t0 + 5, steps.index)

    for _ in range(20):
        th = threading.Thread(target=fetcher)
        th.start()
        th.join()
        steps.mark()
        before = steps.indices()
        spans, agent.spans_buf = agent.spans_buf, []
        steps.count_kept(spans, before, False)
        assert steps._pending == {}, "phases of a thread that runs no step are not kept waiting"
