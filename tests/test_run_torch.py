"""`holoprof run` on ordinary, unadapted PyTorch training scripts: steps, epochs, phases, the report."""

from __future__ import annotations

import itertools
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from conftest import (
    STANDARD_BATCHES,
    STANDARD_EPOCHS,
    TracedRun,
    main_process,
    report_json,
    run_holoprof,
    script,
    traced,
)
from holoprof import model

PHASES = ("data_wait", "forward", "backward", "optimizer", "communication", "checkpoint", "eval", "other")
SECTIONS = {
    "run": dict,
    "steps": dict,
    "phases": dict,
    "findings": list,
    "io": dict,
    "memory": dict,
    "communication": dict,
    "stages": list,
}


def test_exit_status_is_the_jobs(standard_run: TracedRun, tmp_path: Path) -> None:
    assert standard_run.proc.returncode == 0
    proc = run_holoprof(
        "run", "--out", str(tmp_path / "run"), "--no-report", "--", sys.executable, "-c", "raise SystemExit(7)",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 7, proc.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["exit_code"] == 7
    assert manifest["status"] == "crashed"


def test_run_directory_is_private(standard_run: TracedRun) -> None:
    mode = stat.S_IMODE(os.stat(standard_run.run_dir).st_mode)
    assert mode == 0o700, oct(mode)


def test_run_directory_is_announced_first(standard_run: TracedRun) -> None:
    first = standard_run.proc.stderr.splitlines()[0]
    assert first.startswith("holoprof:") and standard_run.run_dir in first, first


def test_manifest_says_finished(standard_run: TracedRun) -> None:
    manifest = json.loads((Path(standard_run.run_dir) / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["exit_code"] == 0
    assert manifest["end_ns"] >= manifest["start_ns"] > 0
    assert standard_run.report["run"]["status"] == "finished"


def test_steps_are_optimizer_steps(standard_run: TracedRun) -> None:
    steps = standard_run.report["steps"]
    assert steps["count"] == STANDARD_EPOCHS * STANDARD_BATCHES
    assert steps["epochs"] == STANDARD_EPOCHS
    assert 0 < steps["median_s"] <= steps["p90_s"]
    assert steps["per_s"] > 0
    assert main_process(standard_run.report)["steps"] == steps["count"]


def test_a_traced_runs_steps_are_scanned_in_one_streamed_pass(standard_run: TracedRun) -> None:
    """A compacted run holds each step's spans one after another: the report's per-step table comes
    from one pass in file order, equal to DuckDB's aggregation by step and to the plain join."""
    import holoprof
    from holoprof.analyze.per_step import join_steps, scan_steps
    from holoprof.analyze.steps import _stats, step_processes

    run = holoprof.load(standard_run.run_dir)
    main = step_processes(run)[0]
    streamed = scan_steps(run, main)
    assert streamed.how == "stream"
    hashed = scan_steps(run, main, stream=False)
    joined = join_steps(run, main, hashed.epochs)
    fast, by_hash, plain = (_stats(ps, main, 120) for ps in (streamed, hashed, joined))
    assert fast.count == standard_run.report["steps"]["count"] > 0
    assert fast == by_hash
    assert fast.total_s == pytest.approx(plain.total_s, rel=1e-12)
    for p, ps in plain.phases.items():
        assert fast.phases[p].total_s == pytest.approx(ps.total_s, rel=1e-12), p
        assert fast.phases[p].median_s == pytest.approx(ps.median_s, rel=1e-12), p


def test_phase_fractions_cover_every_phase_and_sum_to_one(standard_run: TracedRun) -> None:
    phases = standard_run.report["phases"]
    assert set(phases) >= set(PHASES), "every phase of the design is present"
    assert set(phases) == set(model.PHASES)
    assert sum(p["fraction"] for p in phases.values()) == pytest.approx(1.0, abs=1e-6)
    for name in ("data_wait", "forward", "backward", "optimizer"):
        assert phases[name]["fraction"] > 0, name
        assert phases[name]["total_s"] > 0, name
    assert phases["communication"]["fraction"] == 0, "a single process does not communicate"


@pytest.mark.parametrize("phase", ["eval", "checkpoint"])
def test_eval_and_checkpoint_time_is_found(standard_run: TracedRun, phase: str) -> None:
    doc = standard_run.report
    inside = doc["phases"][phase]["total_s"]
    outside = doc["outside_steps"]["phases"].get(phase, 0.0)
    assert inside + outside > 0
    assert outside > 0, "the eval/checkpoint after the last step is listed outside training steps"


def test_report_has_every_section(standard_run: TracedRun) -> None:
    doc = standard_run.report
    assert doc["schema"] == "holoprof.report/1"
    for name, kind in SECTIONS.items():
        assert isinstance(doc.get(name), kind), (name, doc.get(name))
    assert not doc["communication"].get("collectives"), "no collectives in a single-process job"
    for key in ("dir", "command", "status", "duration_s", "processes", "ranks"):
        assert key in doc["run"], key
    assert doc["run"]["duration_s"] > 0
    assert doc["run"]["errors"] == [] and doc["run"]["warnings"] == []
    assert doc["run"]["dropped_events"] == 0


def test_resources_of_the_job_are_sampled(standard_run: TracedRun) -> None:
    summary = standard_run.report["resources"]["summary"]
    assert summary["job.rss_bytes"]["max"] > 10 * 2**20, "a Python process with torch loaded"
    assert summary["job.cpu_percent"]["max"] > 0
    assert summary["job.processes"]["max"] >= 1


def test_tracing_does_not_change_the_results(standard_run: TracedRun, standard_untraced) -> None:
    assert "final loss" in standard_untraced.stdout
    assert standard_run.proc.stdout == standard_untraced.stdout


def test_terminal_report_renders(standard_run: TracedRun) -> None:
    proc = run_holoprof("report", standard_run.run_dir, cwd=os.path.dirname(standard_run.run_dir))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert str(STANDARD_EPOCHS * STANDARD_BATCHES) in out
    for name in ("data_wait", "forward", "backward", "optimizer"):
        assert name in out


def test_loop_without_optimizer_counts_backward_passes(tmp_path: Path) -> None:
    run = traced(
        tmp_path, script("train.py"), "--optimizer", "none", "--epochs", "1", "--batches", "7", "--no-eval"
    )
    assert run.proc.returncode == 0, run.proc.stderr
    assert "steps 7" in run.proc.stdout
    assert run.report["steps"]["count"] == 7
    assert run.report["phases"]["optimizer"]["total_s"] == 0, "there is no optimizer"
    assert run.report["phases"]["backward"]["fraction"] > 0


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path) -> None:
    run = traced(tmp_path, script("train.py"), "--accum", "4", "--epochs", "1", "--batches", "3", "--no-eval")
    assert run.proc.returncode == 0, run.proc.stderr
    assert "steps 3" in run.proc.stdout
    assert run.report["steps"]["count"] == 3, "12 micro-batches, 3 optimizer steps"


def test_one_batch_epochs_count_and_unknown_epochs_are_null(tmp_path: Path, small_run: TracedRun) -> None:
    """An epoch of one batch ends with the batch that also shows its loader is a training loader; a
    loop with no DataLoader has no epoch boundary: its epochs are unknown (null), not 0."""
    run = traced(tmp_path, script("train.py"), "--epochs", "3", "--batches", "1", "--no-eval")
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.report["steps"]["count"] == 3
    assert run.report["steps"]["epochs"] == 3
    assert small_run.report["steps"]["count"] > 0
    assert small_run.report["steps"]["epochs"] is None


def test_manual_steps_count_each_marked_iteration(small_run: TracedRun) -> None:
    assert "iterations 20" in small_run.proc.stdout
    assert small_run.report["steps"]["count"] == 20
    assert small_run.report["phases"]["forward"]["fraction"] > 0.5, "the marked phase fills the steps"


def test_manual_steps_without_any_activity_start_at_the_first_call(tmp_path: Path) -> None:
    # With nothing recorded before it, the first holoprof.step() can only start the clock: the
    # documented behaviour is that steps are measured between consecutive calls.
    run = traced(tmp_path, script("manual_steps.py"), "6")
    assert run.proc.returncode == 0, run.proc.stderr
    assert "iterations 6" in run.proc.stdout
    assert run.report["steps"]["count"] == 5
    assert run.report["steps"]["median_s"] >= 0.009, "each step holds one 10 ms iteration"


def test_torch_profiler_with_stack_works_inside_a_traced_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """torch's Python tracer reads `self` in every Module.__call__ frame; ours must provide it."""
    script = tmp_path / "with_stack.py"
    script.write_text(
        "import torch\n"
        "from torch.profiler import profile, ProfilerActivity\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "with profile(activities=[ProfilerActivity.CPU], with_stack=True):\n"
        "    for _ in range(3):\n"
        "        opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()\n"
        "print('profiled')\n"
    )
    proc = run_holoprof("run", "--no-report", "--out", str(tmp_path / "run"), "--", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "profiled" in proc.stdout
    assert report_json(str(tmp_path / "run"))["steps"]["count"] == 3


def test_after_its_first_waits_a_thread_reads_its_clocks_on_pairs_of_waits(tmp_path: Path) -> None:
    """The batch wait's CPU and run-queue readings (system calls) are taken on every one of a thread's
    first READ_ALL waits, then on two consecutive waits in every READ_EVERY; the input model pairs only
    consecutive waits, so what the training thread did between two waits is still one step's, and
    weighs each later pair by the READ_EVERY pairs of waits it stands for."""
    from holoprof import load
    from holoprof.analyze.input_model import _data_waits, _MainThread
    from holoprof.analyze.steps import step_processes
    from holoprof.collect.torch.dataloader import READ_ALL, READ_EVERY

    batches = READ_ALL + 6 * READ_EVERY
    run = traced(tmp_path, sys.executable, script("train.py"), "--epochs", "1", "--batches", str(batches))
    assert run.proc.returncode == 0, run.proc.stderr
    r = load(run.run_dir)
    rows = r.rows(
        """SELECT json_extract(attrs, '$.wait_n'), json_extract(attrs, '$.cpu_ns') FROM spans
           WHERE kind = 'phase' AND name IN ('data_wait', 'eval') AND json_exists(attrs, '$.loader')
           ORDER BY start_ns"""
    )  # every batch wait of the thread: the training loader's and, after them, the evaluation's
    assert len(rows) > batches
    read = [int(n) for n, cpu in rows if cpu is not None]
    assert read == [n for n in range(len(rows)) if n < READ_ALL or n % READ_EVERY < 2]
    assert all(n is None for n, cpu in rows if cpu is None)
    fetches = r.rows("SELECT json_extract(attrs, '$.cpu_ns') FROM spans WHERE kind = 'op' AND name = 'fetch'")
    # a fetch is recorded inside the waits that read, with their readings; the wait that ends each
    # loader's epoch (StopIteration) fetched none
    assert all(c is not None for (c,) in fetches) and len(read) - 2 <= len(fetches) <= len(read)
    # the training thread's CPU between two waits, from the sampled pairs alone: one step's compute
    (main,) = step_processes(r)
    vals = _data_waits(r, main)
    late = [v for v in vals if v[8] >= READ_ALL]
    loader = r.rows(
        "SELECT json_extract(attrs, '$.read_every') FROM spans WHERE kind = 'op' AND name = 'dataloader'"
    )
    assert {int(v) for (v,) in loader} == {READ_EVERY}  # the run says how its waits were read
    thread = _MainThread.of(late, READ_EVERY)
    assert len(thread.compute_cpu) == READ_EVERY * (len(late) // 2)  # each pair stands for READ_EVERY
    walls = sorted((b[0] - a[1]) / 1e9 for a, b in itertools.pairwise(vals) if b[8] == a[8] + 1)
    cpu = sorted(thread.compute_cpu)
    assert 0.2 * walls[len(walls) // 2] < cpu[len(cpu) // 2] < 2.0 * walls[len(walls) // 2], (cpu, walls)


FORKED_TRAINER = """
import multiprocessing as mp
import torch
from torch.utils.data import DataLoader, TensorDataset

def train():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(80 * 4, 4), torch.randn(80 * 4, 1))
    for x, y in DataLoader(data, batch_size=4):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

if __name__ == "__main__":
    p = mp.get_context("fork").Process(target=train)
    p.start()
    p.join()
    raise SystemExit(p.exitcode)
"""


def test_a_forked_child_times_the_fetches_inside_its_batch_waits_as_its_parent_would(tmp_path: Path) -> None:
    """A child forked from the traced process trains with a loader without workers: the fetch inside
    its batch waits is recorded on the waits that read the clocks, with their readings, as in the
    parent (the child's per-thread state is new, and the fetch's patch reads it)."""
    from holoprof import load

    job = tmp_path / "forked.py"
    job.write_text(FORKED_TRAINER)
    run = traced(tmp_path, sys.executable, str(job))
    assert run.proc.returncode == 0, run.proc.stderr
    r = load(run.run_dir)
    ((child,),) = r.rows("SELECT DISTINCT pid FROM spans WHERE kind = 'step'")
    waits = r.rows(
        "SELECT json_extract(attrs, '$.wait_n') FROM spans WHERE kind = 'phase' AND name = 'data_wait' "
        "AND pid = ? AND json_extract(attrs, '$.cpu_ns') IS NOT NULL",
        [child],
    )
    fetches = r.rows(
        "SELECT json_extract(attrs, '$.wait_n') FROM spans WHERE kind = 'op' AND name = 'fetch' AND pid = ?",
        [child],
    )
    assert len(waits) >= 64 and sorted(n for (n,) in fetches) == sorted(n for (n,) in waits)
