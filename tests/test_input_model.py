"""Knobs applied inside the job with no code change, and an input-pipeline model that never advises a
slowdown: real traced runs of small scripts, and the model's promises checked as properties."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import error_lines, run_holoprof, traced
from holoprof.analyze.input_model import (
    PipelineInputs,
    advise,
    margin,
    measure,
    pipeline_model,
    predict,
    quiet,
)

# An ordinary script: a slow __getitem__ (a wait, or CPU work), a tiny model. It prints what its own
# DataLoader and torch really have, so the test sees the knobs from inside the job.
SCRIPT = """
import argparse, os, time, zlib
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("--kind", default="sleep")
ap.add_argument("--batches", type=int, default=40)
ap.add_argument("--one-core", action="store_true")
args = ap.parse_args()
if args.one_core:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
RAW = bytes(range(256)) * 256

class Samples(Dataset):
    def __len__(self):
        return 4 * args.batches
    def __getitem__(self, i):
        if args.kind == "sleep":
            time.sleep(0.002)
        else:
            for _ in range(8):  # about 2 ms of CPU: a decode
                zlib.compress(RAW, 6)
        return torch.full((8,), float(i % 5)), i % 2

def worker_init(_):
    print(f"worker threads={torch.get_num_threads()}", flush=True)

torch.manual_seed(0)
torch.set_num_threads(1)
loader = DataLoader(Samples(), batch_size=4, worker_init_fn=worker_init)
print(f"loader num_workers={loader.num_workers} pin_memory={loader.pin_memory} threads={torch.get_num_threads()}", flush=True)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = 0
t = time.perf_counter()
for x, y in loader:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    steps += 1
    now = time.perf_counter()  # the job's own step time, from one batch request to the next
    print(f"own step_s={now - t:.6f}", flush=True)
    t = now
print(f"steps={steps}")
"""


@pytest.fixture(scope="module")
def script_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("knobs")
    (tmp / "train.py").write_text(SCRIPT)
    return tmp


@pytest.fixture(scope="module")
def swept(script_dir: Path) -> dict[str, Any]:
    proc = run_holoprof(
        "sweep", "--set", "num_workers=0,3", "--set", "torch_threads=2", "--steps", "24",
        "--out", str(script_dir / "runs"), "--json", "--", "train.py", cwd=script_dir, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict)
    return doc


def test_sweep_applies_num_workers_inside_the_unchanged_script(swept: dict[str, Any]) -> None:
    rows = swept["rows"]
    assert [r["knobs"] for r in rows] == [
        {"num_workers": "0", "torch_threads": "2"},
        {"num_workers": "3", "torch_threads": "2"},
    ]
    for r, n in zip(rows, (0, 3), strict=True):
        log = Path(r["log"]).read_text()
        assert f"loader num_workers={n} pin_memory=False threads=2" in log, log  # the job's own DataLoader
        assert r["loader"]["num_workers"] == n  # the DataLoader as the trace recorded it
        assert r["applied"]["set"] == {"num_workers": n, "torch_threads": 2}
        assert r["applied"]["applied"]["num_workers"] == {"applied": 1}
        # the script's own torch.set_num_threads(1) was held to the knob; its workers kept one thread
        assert r["applied"]["applied"]["torch_threads"] == {
            "applied": 1,
            "held at 2 (the job asked for 1)": 1,
        }
        assert log.count("worker threads=1") == n
        manifest = json.loads((Path(r["run_dir"]) / "manifest.json").read_text())
        assert manifest["options"]["knobs"] == {"num_workers": n, "torch_threads": 2}
        assert manifest["status"] == "finished" and manifest["exit_code"] == 0


def test_steps_bound_each_configuration_and_the_run_is_complete(swept: dict[str, Any]) -> None:
    for r in swept["rows"]:
        assert r["status"] == "ok" and r["steps"] == 24  # the script would make 40
        assert "\nsteps=" not in Path(r["log"]).read_text()  # ended after step 24, before its loop ended
        lo, hi = r["step_ci_s"]
        assert lo <= r["step_mean_s"] <= hi
        tlo, thi = r["throughput_ci"]
        # the upper end is unbounded (None) when the step's interval reaches 0 (very uneven steps)
        assert tlo <= r["throughput"] <= (thi if thi is not None else math.inf)
        assert r["throughput_unit"] == "samples/s"


def test_the_step_time_is_the_jobs_own_steady_mean(swept: dict[str, Any]) -> None:
    # With 3 workers batches come in bursts: a ready batch makes a short step, the next one waits. The
    # sweep's step time is the throughput the job gets: the mean of the steady steps (the first 2,
    # which start the workers, left out), each equal to the job's own timer, not their median.
    from holoprof.analyze.stats import steady
    from holoprof.analyze.steps import step_durations
    from holoprof.store.reader import load

    for r in swept["rows"]:
        log = Path(r["log"]).read_text().splitlines()
        own = [float(line.split("=")[1]) for line in log if line.startswith("own step_s=")]
        # the agent ends the job inside step 24, before the script prints that step's time
        assert len(own) == 23, own
        run = load(r["run_dir"])
        try:
            traced_steps = steady(step_durations(run))
        finally:
            run.con.close()
        assert len(traced_steps) == 22
        assert r["step_mean_s"] == pytest.approx(sum(traced_steps) / 22)
        # the two clocks tick at different points of the loop (a batch request; the end of the body),
        # so single steps differ by what runs between them, and spans of steps telescope to the same
        assert sum(traced_steps[:21]) == pytest.approx(sum(own[2:]), abs=2e-3), (traced_steps, own)
        assert r["throughput"] == pytest.approx(4 / r["step_mean_s"])  # batches of 4 samples


def test_diff_asks_the_same_of_the_steady_mean(swept: dict[str, Any]) -> None:
    a, b = swept["rows"]
    proc = run_holoprof("diff", a["run_dir"], b["run_dir"], "--json", cwd=Path(a["run_dir"]).parent)
    assert proc.returncode == 0, proc.stderr
    steady = json.loads(proc.stdout)["steady"]
    assert steady["mean_a_s"] == pytest.approx(a["step_mean_s"]) and steady["mean_b_s"] == pytest.approx(
        b["step_mean_s"]
    )
    assert steady["mean_change"] == pytest.approx(b["step_mean_s"] / a["step_mean_s"] - 1)
    assert (
        steady["method"] == "mann-whitney-u on block means of the steady steps"
        and 0 <= steady["p_value"] <= 1
    )


def test_the_best_is_compared_with_the_diffs_test(swept: dict[str, Any]) -> None:
    best = swept["recommended_index"]
    assert best is not None
    (comp,) = swept["comparisons"]
    assert comp["against_index"] == 1 - best
    assert 0 <= comp["p_value"] <= 1 and comp["mean_change"] is not None
    assert isinstance(comp["significant"], bool)
    assert ("; significantly faster than" in swept["reason"]) == comp["significant"]
    assert ("not significantly faster than" in swept["reason"]) == (not comp["significant"])


def test_a_report_of_a_swept_run_shows_its_knobs_and_a_measured_gain(swept: dict[str, Any]) -> None:
    slow = swept["rows"][0]
    proc = run_holoprof("report", slow["run_dir"], "--json", cwd=Path(slow["run_dir"]).parent)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["run"]["knobs"] == {"num_workers": 0, "torch_threads": 2}
    (f,) = [f for f in doc["findings"] if f["id"] == "input_bound"]
    assert f["gain_kind"] == "measured"
    basis = f["gain_basis"]
    assert (
        basis["this"] == slow["label"] and basis["best"] == swept["rows"][swept["recommended_index"]]["label"]
    )
    assert basis["this_interval_s"] == slow["step_ci_s"]
    text = run_holoprof("report", slow["run_dir"], cwd=Path(slow["run_dir"]).parent).stdout
    assert "measured:" in text and "knobs" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "--set", "num_wrkers=0,2"], "unknown knob 'num_wrkers'; knobs are: num_workers"),
        (["sweep", "--set", "num_workers=-1"], "bad value '-1' for num_workers: write an integer >= 0"),
        (["sweep", "--set", "pin_memory=maybe"], "bad value 'maybe' for pin_memory: write true or false"),
        (["sweep", "--set", "prefetch=0"], "write an integer >= 1 or autotune"),
        (
            ["sweep", "--set", "omp_wait_policy=spin"],
            "bad value 'spin' for omp_wait_policy: write passive, active or default",
        ),
        (["sweep", "--set", "num_workers"], "bad --set 'num_workers': write KNOB=VALUE"),
        (["run", "--set", "num_workers=1,2"], "use holoprof sweep --set to measure several"),
    ],
)
def test_bad_knobs_are_one_line_and_exit_2(script_dir: Path, args: list[str], message: str) -> None:
    proc = run_holoprof(*args, "--", "train.py", cwd=script_dir)
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("holoprof: error:"), proc.stderr
    assert message in lines[0]


def test_cpu_bound_loader_on_one_core_is_told_no_worker_helps(tmp_path: Path) -> None:
    # All of a step's work is CPU on one core: no worker count can make it faster, so the finding
    # says what would help instead (cheaper loading: up to the whole wait) and no pin_memory (there is
    # no GPU).
    (tmp_path / "train.py").write_text(SCRIPT)
    run = traced(tmp_path, "train.py", "--kind", "cpu", "--batches", "30", "--one-core")
    assert run.proc.returncode == 0, run.proc.stderr
    (f,) = [f for f in run.report["findings"] if f["id"] == "input_bound"]
    model = f["evidence"]["model"]
    assert model["inputs"]["cores"] == 1 and model["inputs"]["gpu"] is False
    assert model["inputs"]["loader_cpu_s"] > 0 and model["inputs"]["compute_cpu_s"] > 0
    assert model["fit"]["fits"], model["fit"]
    assert model["recommended_workers"] == 0
    assert "already as good as this machine allows" in f["recommendation"]
    assert "cheaper decode" in f["recommendation"] and "caching decoded samples" in f["recommendation"]
    assert "pin_memory" not in f["recommendation"]
    assert f["gain_kind"] == "predicted" and f["gain_basis"]["model"].startswith("loading made free")
    assert f["estimated_gain"] == pytest.approx(f["evidence"]["data_wait_fraction"], abs=1e-4)
    assert f["severity"] == ("high" if f["estimated_gain"] >= 0.2 else "medium")


def test_wait_bound_loader_on_this_machine_is_advised_workers_without_pin_memory(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    run = traced(tmp_path, "train.py", "--kind", "sleep", "--batches", "30")
    assert run.proc.returncode == 0, run.proc.stderr
    (f,) = [f for f in run.report["findings"] if f["id"] == "input_bound"]
    model = f["evidence"]["model"]
    # 8 ms of sleeping per batch against well under a millisecond of CPU: workers overlap the waits
    assert model["inputs"]["loader_wall_s"] > 5 * model["inputs"]["loader_cpu_s"]
    pred = {int(k): v for k, v in model["predicted_step_s"].items()}
    assert pred[2] < pred[0]
    if model["recommended_workers"] > 0:  # advised only when it beats the measured step's noise
        assert f"num_workers={model['recommended_workers']}" in f["recommendation"]
        assert 0 < f["estimated_gain"] < 1
    assert "pin_memory" not in f["recommendation"]


# --- the model's promises, as properties ------------------------------------------------------------
ms = st.floats(min_value=1e-4, max_value=0.2)


@st.composite
def measured(draw: Any) -> PipelineInputs:
    workers = draw(st.integers(0, 4))
    compute = draw(ms)
    loader_cpu = draw(ms)
    loader_wall = loader_cpu + draw(st.floats(0, 0.2))
    loader_runq = draw(st.floats(0, 0.05))
    threads = draw(st.integers(1, 4))
    cores = float(draw(st.integers(1, 8)))
    wait = draw(st.floats(0, 0.2))
    return PipelineInputs(
        step_s=compute + wait, wait_s=wait, compute_s=compute,
        compute_quiet_s=compute * draw(st.floats(0.2, 1.0)) if workers else compute, num_workers=workers,
        loader_cpu_s=loader_cpu, loader_wall_s=loader_wall, loader_runq_s=loader_runq,
        loader_quiet_s=max(loader_cpu, loader_wall - loader_runq), ipc_cpu_s=draw(st.floats(0, 0.002)),
        ipc_measured=workers > 0, compute_cpu_s=compute * draw(st.floats(0.5, float(threads))),
        compute_runq_s=compute * draw(st.floats(0, 0.5)),
        cores=cores, others_runnable=draw(st.floats(0, 16)), cores_free=cores, torch_threads=threads, gpu=draw(st.booleans()),
        batches=50, noise=draw(st.floats(0, 0.3)),
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(measured())
def test_advice_is_never_a_predicted_slowdown(x: PipelineInputs) -> None:
    a = advise(x)
    if a.advised:
        assert a.workers != x.num_workers
        assert a.predicted_step_s <= x.step_s * (1 - margin(x)) + 1e-12
        assert a.gain >= margin(x) - 1e-12
        q = quiet(x)  # and no slower once the other processes competing for the cores are gone
        assert predict(q, a.workers)["step_s"] <= predict(q, x.num_workers)["step_s"] + 1e-12
    else:
        assert a.workers == x.num_workers and a.gain == 0


@settings(max_examples=300, deadline=None)
@given(measured(), st.integers(1, 16))
def test_no_prediction_beats_the_cores_or_the_training_loop(x: PipelineInputs, n: int) -> None:
    p = predict(x, n)
    cpu = x.compute_cpu_s + x.loader_cpu_s + x.ipc_cpu_s
    assert p["step_s"] >= cpu / x.cores - 1e-12  # all CPU work of a step shares the job's cores
    # other processes competing for the cores never make it faster
    assert p["step_s"] >= predict(dataclasses.replace(x, others_runnable=0.0), n)["step_s"] - 1e-12
    assert p["step_s"] >= x.loader_quiet_s / n - 1e-12  # n workers make at most n batches per batch time
    assert p["step_s"] >= p["main_s"]


def test_pin_memory_is_advised_only_on_a_gpu(tmp_path: Path) -> None:
    from holoprof.analyze.findings import _model_fix

    base = dict(
        step_s=0.02, wait_s=0.018, compute_s=0.002, compute_quiet_s=0.002, num_workers=0, loader_cpu_s=0.001,
        loader_wall_s=0.018, loader_runq_s=0.0, loader_quiet_s=0.018, ipc_cpu_s=0.0004, ipc_measured=False, compute_cpu_s=0.002, compute_runq_s=0.0, cores=8.0, others_runnable=0.0, cores_free=8.0, torch_threads=1,
        batches=50, noise=0.02,
    )  # fmt: skip
    for gpu in (False, True):
        x = PipelineInputs(gpu=gpu, **base)  # type: ignore[arg-type]
        a = advise(x)
        assert a.advised and a.workers > 0
        assert ("pin_memory=True" in _model_fix(pipeline_model(x), {"pin_memory": False})) == gpu


def test_tune_sweeps_what_the_finding_names_and_measures_the_best(script_dir: Path) -> None:
    proc = run_holoprof(
        "tune", "--steps", "8", "--out", str(script_dir / "tuned"), "--json", "--", "train.py",
        cwd=script_dir, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "holoprof.tune/1"
    predicted = doc["finding"]["evidence"]["model"]["predicted_step_s"]
    best_two = sorted(predicted, key=lambda n: (predicted[n], int(n)))[:2]
    swept = doc["sweep"]["knobs"]["num_workers"]
    assert swept == sorted({"0", *best_two}, key=int)  # the current value and the model's best two
    assert "pin_memory" not in doc["sweep"]["knobs"]  # no GPU here
    for r in doc["sweep"]["rows"]:
        assert r["loader"]["num_workers"] == int(r["knobs"]["num_workers"]) and r["steps"] == 8
    m = doc["measured"]
    assert m["gain_kind"] == "measured" and m["gain_basis"]["this"] == "num_workers=0"
    best = doc["sweep"]["rows"][doc["sweep"]["recommended_index"]]
    assert m["gain_basis"]["best"] == best["label"]
    assert m["gain_basis"]["best_interval_s"] == best["step_ci_s"]
    assert (m["estimated_gain"] > 0) == (m["gain_basis"]["significant"] and best["label"] != "num_workers=0")


# A dataset that waits 0.5 ms a sample (a remote store), for the scripts below.
SLOW_DATASET = """
import hashlib, os, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __init__(self, n, width, classes):
        self.n, self.width, self.classes = n, width, classes
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        time.sleep(0.0005)
        return torch.full((self.width,), float(i % 7)), i % self.classes

torch.manual_seed(0)
"""

# torch's own threads: an MLP whose matrix products run in OpenMP parallel regions on 2 threads. It
# prints its environment's wait policy and a digest of the trained weights, so a test sees the knob
# from inside the job and that the result is unchanged.
SPIN_SCRIPT = (
    SLOW_DATASET
    + """
print("OMP_WAIT_POLICY=" + os.environ.get("OMP_WAIT_POLICY", "unset"), flush=True)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Slow(16 * 24, 256, 10), batch_size=16):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print("weights", digest)
"""
)


def _spin_run(tmp: Path, policy: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    d = tmp / policy
    d.mkdir()
    (d / "spin.py").write_text(SPIN_SCRIPT)
    run = traced(d, "spin.py", options=("--set", "torch_threads=2", "--set", f"omp_wait_policy={policy}"))
    assert run.proc.returncode == 0, run.proc.stderr
    # the model's measurements, whether or not its saving is large enough for a finding on this machine
    import holoprof
    from holoprof.analyze.steps import loader_config, step_processes, step_stats

    loaded = holoprof.load(run.run_dir)
    main = step_processes(loaded)[0]
    x = measure(loaded, main, step_stats(loaded, main), loader_config(loaded, main))
    assert x is not None
    return run.proc.stdout, pipeline_model(x).evidence(), run.report["run"]


def test_omp_wait_policy_reaches_the_job_and_its_spinning_is_measured(tmp_path: Path) -> None:
    out_a, model_a, run_a = _spin_run(tmp_path, "active")
    out_d, model_d, _ = _spin_run(tmp_path, "default")
    out_p, model_p, _ = _spin_run(tmp_path, "passive")
    # set before torch was imported; "default" leaves the job's environment as it is
    assert "OMP_WAIT_POLICY=ACTIVE" in out_a and "OMP_WAIT_POLICY=PASSIVE" in out_p
    assert "OMP_WAIT_POLICY=unset" in out_d
    assert run_a["knobs"] == {"torch_threads": 2, "omp_wait_policy": "active"}
    # the policy changes when idle threads sleep, not what the job computes
    (wa,) = [ln for ln in out_a.splitlines() if ln.startswith("weights")]
    assert wa in out_d and wa in out_p
    # while the loop waited 8 ms for each batch, torch's second thread spun with the active and the
    # runtime's default policies (up to the wait) and slept with the passive one
    spin_a, spin_d, spin_p = (m["inputs"]["spin_cpu_s"] for m in (model_a, model_d, model_p))
    assert min(spin_a, spin_d) > 0.001 and min(spin_a, spin_d) > 3 * spin_p, (spin_a, spin_d, spin_p)


# Short epochs fed by 2 workers that, without persistent_workers, start again at every epoch.
EPOCHS_SCRIPT = (
    SLOW_DATASET
    + """
model = nn.Linear(64, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Slow(8 * 10, 64, 2), batch_size=8, num_workers=2)
for epoch in range(6):
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
print("persistent_workers", loader.persistent_workers)
"""
)


def test_workers_started_at_every_epoch_are_told_to_persist(tmp_path: Path) -> None:
    from conftest import processes_by_role

    runs = {}
    for flag in ("false", "true"):
        d = tmp_path / flag
        d.mkdir()
        (d / "epochs.py").write_text(EPOCHS_SCRIPT)
        runs[flag] = traced(d, "epochs.py", options=("--set", f"persistent_workers={flag}"))
        assert runs[flag].proc.returncode == 0, runs[flag].proc.stderr
        assert f"persistent_workers {flag == 'true'}" in runs[flag].proc.stdout
    # without: 2 workers started for each of the 6 epochs; with: 2 in all
    assert len(processes_by_role(runs["false"].report, "dataloader_worker")) == 12
    assert len(processes_by_role(runs["true"].report, "dataloader_worker")) == 2
    (f,) = [f for f in runs["false"].report["findings"] if f["id"] == "input_bound"]
    model = f["evidence"]["model"]
    inputs = model["inputs"]
    assert inputs["restarts"] == 5 and 0 < inputs["restart_s"] < inputs["epoch_s"]
    # starting 2 workers (a fork each, then their first batch) costs more than a 4 ms step here
    assert inputs["restart_s"] > inputs["step_s"]
    # (more workers may be advised beside it: the loader sleeps 4 ms a batch)
    assert model["persistent_workers_advised"]
    assert (
        "use DataLoader(..., persistent_workers=True): each of the 5 epochs after the first"
        in f["recommendation"]
    )
    assert "holoprof sweep --set persistent_workers=false,true" in f["recommendation"]
    assert f["estimated_gain"] >= model["persistent_gain"] > 0
    # with persistent workers there is nothing left to say about their start
    for g in runs["true"].report["findings"]:
        if g["id"] == "input_bound" and "model" in g["evidence"]:
            assert not g["evidence"]["model"]["persistent_workers_advised"]
            assert g["evidence"]["model"]["inputs"]["restarts"] == 0
