"""The workflow of a shell pipeline: every process is a stage, classified, with its resources and the
critical path."""

from __future__ import annotations

import io
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import holoprof
from conftest import TracedRun, traced
from holoprof.analyze.stages import Stage, mark_critical, process_name
from holoprof.present.stages import render_stages
from workflows.runs import PIPELINE_STEPS, pipeline


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    return pipeline(tmp_path_factory)


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Stages by name; ``sort`` is the non-Python stage that ran between preparation and training."""
    stages: dict[str, dict[str, Any]] = {}
    for s in doc["stages"]:
        stages.setdefault(s["name"], s)
    prep, train = stages["prepare.py"], stages["train.py"]
    tools = [
        s for s in doc["stages"]
        if s["depth"] == 1 and s["source"] == "process" and s["name"] not in ("prepare.py", "train.py")
        and s["start_s"] >= prep["end_s"] - 0.05 and s["end_s"] <= train["start_s"] + 0.05
    ]  # fmt: skip
    assert tools, [(s["name"], s["start_s"], s["end_s"]) for s in doc["stages"]]
    tools.sort(key=lambda s: -s["max_rss_bytes"])  # one the sampler measured, not only saw
    # Usually named `sort` (or `tar`, when the sampler caught that one too). The sampler names a process
    # when it first sees it: one caught between bash's fork and its exec carries the shell's command line.
    assert tools[0]["name"] in ("sort", "tar", "pipeline.sh"), tools
    stages["sort"] = tools[0]
    return stages


def test_each_process_is_a_stage_of_the_right_kind(run: TracedRun) -> None:
    stages = by_name(run.report)
    for name in ("pipeline.sh", "prepare.py", "sort", "train.py", "save", "evaluate.py"):
        assert name in stages, (name, [s["name"] for s in run.report["stages"]])
    assert stages["pipeline.sh"]["kind"] == "other"
    assert stages["prepare.py"]["kind"] == "prepare"
    assert stages["sort"]["kind"] == "prepare", "a non-Python tool that writes data before training"
    assert stages["train.py"]["kind"] == "train"
    assert stages["evaluate.py"]["kind"] == "evaluate"
    assert stages["save"]["kind"] == "checkpoint", "holoprof.stage('save') around torch.save"


def test_stages_nest_as_the_process_tree(run: TracedRun) -> None:
    stages = by_name(run.report)
    root = stages["pipeline.sh"]
    assert root["parent"] is None and root["depth"] == 0
    for name in ("prepare.py", "sort", "train.py", "evaluate.py"):
        assert stages[name]["parent"] == root["id"], stages[name]
    assert stages["save"]["parent"] == stages["train.py"]["id"]
    assert stages["save"]["source"] == "span" and stages["train.py"]["source"] == "process"
    # order: parents before children, siblings by start time
    names = [s["name"] for s in run.report["stages"]]
    assert (
        names.index("prepare.py") < names.index("sort") < names.index("train.py") < names.index("evaluate.py")
    )
    assert names.index("train.py") < names.index("save") < names.index("evaluate.py")


def test_steps_belong_to_the_train_stage_only(run: TracedRun) -> None:
    stages = by_name(run.report)
    assert stages["train.py"]["steps"] == PIPELINE_STEPS
    others = [s for s in run.report["stages"] if s["name"] != "train.py"]
    assert all(s["steps"] == 0 for s in others), others
    phases = stages["train.py"]["phases"]
    assert set(phases) >= {"data_wait", "forward", "backward", "optimizer", "other"}
    step_total = holoprof.load(run.run_dir).rows(
        "SELECT sum(end_ns - start_ns) / 1e9 FROM spans WHERE kind = 'step'"
    )[0][0]
    assert sum(phases.values()) == pytest.approx(step_total, rel=1e-3), "phases add up to the steps"
    assert phases["other"] >= 0.003 * PIPELINE_STEPS * 0.9, "the per-step sleep is outside the phases"
    assert stages["evaluate.py"]["phases"] == {}


def test_train_stage_phases_from_the_step_analysis_equal_the_join(run: TracedRun) -> None:
    from holoprof.analyze.stages import _loop_phases, workflow
    from holoprof.analyze.steps import step_processes, step_stats

    r = holoprof.load(run.run_dir)
    loop = step_stats(r, step_processes(r)[0])
    joined = {s.id: s for s in workflow(r).stages}
    reused = {s.id: s for s in workflow(r, loop).stages}
    train = [s for s in reused.values() if s.steps == loop.count and s.pid == loop.proc.pid]
    assert len(train) == 1
    sid = train[0].id
    assert _loop_phases(train[0], loop) is not None, "the train stage takes the step analysis's phases"
    assert set(reused[sid].phases) == set(joined[sid].phases)
    for p, v in joined[sid].phases.items():
        assert reused[sid].phases[p] == pytest.approx(v, abs=2e-6), p
    assert sum(reused[sid].phases.values()) > 0


def test_resources_are_attributed_to_their_stage(run: TracedRun) -> None:
    stages = by_name(run.report)
    train, prep, sort = stages["train.py"], stages["prepare.py"], stages["sort"]
    assert train["cpu_s"] > 0.5, train  # importing torch and training
    assert train["max_rss_bytes"] > 50 * 2**20, train  # torch is resident
    # four shards and 300k keys: storage writes, or (on a RAM file system) the traced writes
    assert max(prep["write_bytes"], prep["traced_write_bytes"]) > 1_000_000, prep
    assert sort["max_rss_bytes"] > 0 and sort["processes"] == 1
    assert stages["pipeline.sh"]["max_rss_bytes"] < train["max_rss_bytes"]
    for s in run.report["stages"]:
        assert s["gpu_s"] is None, "no GPU here: unknown, not zero"
        assert 0 <= s["start_s"] <= s["end_s"] <= run.report["run"]["duration_s"] + 0.5, s
        assert s["wall_s"] == pytest.approx(s["end_s"] - s["start_s"], abs=1e-5)
        assert 0 <= s["share"] <= 1
    # the sampler saw the non-Python process: its row in the processes table comes from the sampler
    sort_proc = holoprof.load(run.run_dir).rows("SELECT info FROM processes WHERE pid = ?", [sort["pid"]])[0][
        0
    ]
    assert '"source": "sampler"' in sort_proc


def test_the_sequential_pipeline_is_all_on_the_critical_path(run: TracedRun) -> None:
    stages = by_name(run.report)
    for name in ("pipeline.sh", "prepare.py", "sort", "train.py", "evaluate.py"):
        assert stages[name]["critical"], stages[name]
    crit = [s for s in run.report["stages"] if s["critical"] and s["depth"] == 1]
    for x, y in itertools.pairwise(crit):
        assert x["end_s"] <= y["start_s"] + 0.05, (x, y)


def test_overlapping_stage_is_off_the_critical_path() -> None:
    # a | b: b ends last and is on the path; a ran in its shadow. c started after both ended.
    def st(i: str, s: int, e: int, parent: str | None = "root") -> Stage:
        return Stage(id=i, name=i, host="h", pid=1, source="process", start_ns=s, end_ns=e, parent=parent)

    root = st("root", 0, 10_000_000_000, None)
    a, b = st("a", 1_000_000_000, 4_000_000_000), st("b", 1_000_000_000, 5_000_000_000)
    c = st("c", 5_100_000_000, 9_000_000_000)
    early = st("early", 0, 900_000_000)
    mark_critical([root, a, b, c, early])
    assert [s.id for s in (root, a, b, c, early) if s.critical] == ["root", "b", "c", "early"]


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["/usr/bin/python3", "-u", "prep.py", "--x"], "prep.py"),
        (["/data/job/train.py", "--epochs", "3"], "train.py"),
        (["python", "-m", "torch.distributed.run", "x.py"], "torch.distributed.run"),
        (["-c", "print(1)"], "python -c"),
        (["bash", "-e", "pipeline.sh"], "pipeline.sh"),
        (["bash", "-c", "a | b"], "bash -c"),
        (["sort", "-n", "keys.txt"], "sort"),
    ],
)
def test_stage_names_come_from_the_script_or_command(argv: list[str], name: str) -> None:
    assert process_name(argv) == name


def test_a_command_only_the_sampler_saw_starts_after_the_sibling_that_ended_before_it() -> None:
    """The sampler last missed ``sort`` at 0.60 s and first saw it at 0.80 s; ``prepare.py`` (traced)
    ended at 0.66 s in between: ``sort`` started after it, so the two are not shown overlapping, and
    both are on the critical path of the sequential script."""
    from holoprof.analyze.stages import _Proc, _process_stages

    ms = 1_000_000
    procs = [
        _Proc("h", 10, 1, "launcher", -1, ["holoprof"], "", 0, 5000 * ms, False),
        _Proc("h", 11, 10, "child", -1, ["bash", "run.sh"], "", 0, 0, True),
        _Proc("h", 12, 11, "child", -1, ["python", "prepare.py"], "", 300 * ms, 660 * ms, False),
        _Proc("h", 13, 11, "child", -1, ["sort", "keys"], "", 100 * ms, 0, True),
        _Proc("h", 14, 11, "child", -1, ["python", "train.py"], "", 900 * ms, 3000 * ms, False),
    ]
    no_counters = {"cpu_s": 0.0, "read_bytes": 0.0, "write_bytes": 0.0}
    bounds = {
        ("h", 11): (200 * ms, 3000 * ms, no_counters),
        ("h", 12): (400 * ms, 600 * ms, no_counters),
        ("h", 13): (800 * ms, 800 * ms, no_counters),
    }
    ticks = {"h": [200 * ms * i for i in range(16)]}
    stages, _owner = _process_stages(procs, bounds, ticks)
    by = {st.name: st for st in stages}
    assert by["sort"].start_ns == 660 * ms, "not the 600 ms tick, which overlaps prepare.py"
    assert by["sort"].end_ns == 800 * ms
    mark_critical(stages)
    assert by["prepare.py"].critical and by["sort"].critical and by["train.py"].critical


def test_terminal_stage_tree_marks_the_critical_path(run: TracedRun) -> None:
    buf = io.StringIO()
    render_stages(run.report, Console(file=buf, width=110, color_system=None))
    out = buf.getvalue()
    assert "Workflow stages" in out
    lines = {line.split("◆")[-1].split()[0]: line for line in out.splitlines() if "◆" in line and "%" in line}
    assert {"pipeline.sh", "prepare.py", "train.py", "evaluate.py"} <= set(lines), out
    assert "├─" in out and "└─" in out
    assert "critical path: " in out and "train.py → " in out


def test_a_process_shorter_than_a_sampler_tick_has_its_start_cpu_and_memory(tmp_path: Path) -> None:
    """A Python stage of a fraction of a second (the sampler ticks once a second): its start is when
    the shell forked it (the kernel's record, not when its interpreter reached holoprof), and its CPU
    time and peak memory are its own count at its end."""
    sh = (
        'echo "$EPOCHREALTIME" > m0; "$PY" -c "x = sum(range(3 * 10**6)); y = bytearray(64 << 20)"; '
        'echo "$EPOCHREALTIME" > m1'
    )
    run = traced(tmp_path, "bash", "-c", sh, env={"PY": sys.executable})
    assert run.proc.returncode == 0, run.proc.stderr
    m0, m1 = (float((tmp_path / m).read_text()) for m in ("m0", "m1"))
    (st,) = [s for s in run.report["stages"] if s["name"] == "python -c"]
    start = run.report["run"]["start_ns"] / 1e9 + st["start_s"]
    assert st["cpu_s"] > 0.05, st
    assert st["max_rss_bytes"] > 64 << 20, st
    assert m0 - 0.02 <= start <= m1, (m0, start, m1)


def test_a_process_ends_when_it_exits_not_when_its_agent_flushed(tmp_path: Path) -> None:
    """The end of a Python stage is its real exit: after the interpreter's finalization (here an object
    that takes 0.3 s to go at module teardown, after every atexit handler, the agent's final flush
    included), as the shell that waited for it sees it."""
    stage = "import time\nclass Slow:\n    def __del__(self):\n        time.sleep(0.3)\nslow = Slow()\n"
    (tmp_path / "stage.py").write_text(stage)
    sh = 'echo "$EPOCHREALTIME" > m0; "$PY" stage.py; echo "$EPOCHREALTIME" > m1'
    run = traced(tmp_path, "bash", "-c", sh, env={"PY": sys.executable})
    assert run.proc.returncode == 0, run.proc.stderr
    m0, m1 = (float((tmp_path / m).read_text()) for m in ("m0", "m1"))
    (st,) = [s for s in run.report["stages"] if s["name"] == "stage.py"]
    t0 = run.report["run"]["start_ns"] / 1e9
    assert m0 - 0.02 <= t0 + st["start_s"] and m1 - 0.05 <= t0 + st["end_s"] <= m1, (m0, st, m1)
    # every reader of the run agrees: the processes table has the same end
    rows = holoprof.load(run.run_dir).rows("SELECT argv, end_ns FROM processes")
    (end_ns,) = [e for a, e in rows if json.loads(a) == ["stage.py"]]
    assert m1 - 0.05 <= end_ns / 1e9 <= m1
