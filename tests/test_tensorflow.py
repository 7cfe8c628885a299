"""Keras and TensorFlow traced with no code change: real fits and custom loops under `holoprof run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import report_json, require, traced

require("tensorflow")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "tf_scripts")


def _trace(tmp: str, name: str, *args: str, options: tuple[str, ...] = ()) -> dict:
    out = os.path.join(tmp, name)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-m", "holoprof.cli", "run", "--no-report", "--out", out, *options, "--", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = report_json(out)
    doc["_stdout"] = proc.stdout
    doc["_stderr"] = proc.stderr
    return doc


@pytest.fixture(scope="module")
def fits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = str(tmp_path_factory.mktemp("keras"))
    script = os.path.join(SCRIPTS, "keras_fit.py")
    # Input timing is asked for: these fits check the data_wait it measures.
    return {
        mode: _trace(
            tmp, mode, script, os.path.join(tmp, f"ck-{mode}"), mode, "2", options=("--tf-input-timing", "on")
        )
        for mode in ("slow", "fast")
    }


def test_keras_fit_counts_steps_and_epochs(fits: dict[str, dict]) -> None:
    for doc in fits.values():
        assert "epochs run 2" in doc["_stdout"]
        assert doc["steps"]["count"] == 20  # 2 epochs x 10 batches
        assert doc["steps"]["epochs"] == 2
        assert abs(sum(p["fraction"] for p in doc["phases"].values()) - 1) < 1e-6
        assert doc["run"]["errors"] == []


def test_keras_fused_step_is_reported_as_compute_not_split(fits: dict[str, dict]) -> None:
    phases = fits["fast"]["phases"]
    assert phases["compute"]["total_s"] > 0
    for p in ("forward", "backward", "optimizer"):
        assert phases[p]["total_s"] == 0


def test_keras_validation_and_checkpoints_are_recorded(fits: dict[str, dict]) -> None:
    doc = fits["fast"]
    eval_s = doc["phases"]["eval"]["total_s"] + doc["outside_steps"]["phases"].get("eval", 0)
    ckpt_s = doc["phases"]["checkpoint"]["total_s"] + doc["outside_steps"]["phases"].get("checkpoint", 0)
    assert eval_s > 0
    assert ckpt_s > 0


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The same seeded TFRecord fit untraced and traced with the default options."""
    tmp = tmp_path_factory.mktemp("seeded")
    script = os.path.join(SCRIPTS, "keras_tfrecord_seeded.py")
    data = tmp / "data"
    data.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    untraced = tmp / "untraced.json"
    proc = subprocess.run(
        [sys.executable, script, str(data), str(untraced)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    traced = tmp / "traced.json"
    doc = _trace(str(tmp), "run", sys.executable, script, str(data), str(traced))
    return {
        "untraced": json.loads(untraced.read_text()),
        "traced": json.loads(traced.read_text()),
        "report": doc,
    }


def test_tracing_a_seeded_keras_fit_leaves_its_training_bit_identical(seeded: dict[str, dict]) -> None:
    untraced, traced = seeded["untraced"], seeded["traced"]
    # A TFRecord dataset has no known length: Keras's in-graph fetch counts one more optimizer
    # iteration than batches at each epoch's end; a different fetch path would not, and Adam's bias
    # correction would then change every later loss.
    assert untraced["iterations"] == traced["iterations"]
    assert untraced["losses"] == traced["losses"]
    assert untraced["val_losses"] == traced["val_losses"]
    assert untraced["weights"] == traced["weights"]
    assert untraced["batches"] == traced["batches"] == 48


def test_keras_fit_on_tfrecords_matches_the_jobs_own_counts_and_timers(seeded: dict[str, dict]) -> None:
    truth, doc = seeded["traced"], seeded["report"]
    assert doc["steps"]["count"] == truth["batches"]
    assert doc["steps"]["epochs"] == truth["epochs"] == 3
    phases = doc["phases"]
    assert abs(sum(p["fraction"] for p in phases.values()) - 1) < 1e-6
    # compute is what Keras runs between a batch's begin and end callbacks: the script's own timer
    assert phases["compute"]["total_s"] == pytest.approx(truth["batch_s"], rel=0.05)
    assert phases["data_wait"]["total_s"] == 0  # not measured: it is inside compute, and the report says so
    assert any("compute` includes the wait for input" in w for w in doc["run"]["warnings"])
    ckpt_s = phases["checkpoint"]["total_s"] + doc["outside_steps"]["phases"].get("checkpoint", 0)
    assert ckpt_s > 0  # ModelCheckpoint
    assert doc["run"]["errors"] == []


def test_slow_tf_data_map_is_input_bound_and_prefetched_pipeline_is_not(fits: dict[str, dict]) -> None:
    slow = {f["id"]: f for f in fits["slow"]["findings"]}
    assert "input_bound" in slow and slow["input_bound"]["severity"] == "high"
    assert slow["input_bound"]["evidence"]["data_wait_fraction"] >= 0.2
    assert "input_bound" not in {f["id"] for f in fits["fast"]["findings"]}


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_gradient_tape_loop_counts_its_steps(tmp_path: object, mode: str) -> None:
    doc = _trace(str(tmp_path), mode, os.path.join(SCRIPTS, "custom_loop.py"), mode, "12")
    assert "iterations 12" in doc["_stdout"]
    assert doc["steps"]["count"] == 12
    assert doc["phases"]["data_wait"]["total_s"] > 0
    if mode == "eager":
        assert doc["phases"]["backward"]["total_s"] > 0
        assert doc["phases"]["optimizer"]["total_s"] > 0
    else:
        assert doc["phases"]["compute"]["total_s"] > 0


def test_deep_profile_of_a_running_keras_job_uses_tensorflows_profiler(tmp_path: os.PathLike[str]) -> None:
    import time

    stop = os.path.join(tmp_path, "stop")
    run = os.path.join(tmp_path, "run")
    job = subprocess.Popen(
        [sys.executable, "-m", "holoprof.cli", "run", "--no-report", "--out", run, "--",
         os.path.join(SCRIPTS, "keras_live.py"), stop, "150"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the training process has flushed steps
            if any(Path(run).glob("spans/*/*/part-*")):
                break
            assert job.poll() is None, job.communicate()
            time.sleep(0.3)
        ctl = subprocess.run(
            [sys.executable, "-m", "holoprof.cli", "ctl", run, "deep-profile", "--steps", "3", "--wait", "--json",
             "--timeout", "90"],
            capture_output=True, text=True, timeout=150,
        )  # fmt: skip
        assert ctl.returncode == 0, ctl.stderr + ctl.stdout
        out = json.loads("\n".join(ctl.stdout.splitlines()[1:]))
        done = [s for s in out["states"] if s["state"] == "done"]
        assert done, out["states"]
        paths = done[0]["artifact_paths"]
        summary = json.loads(Path(next(p for p in paths if p.endswith(".summary.json"))).read_text())
        assert summary["framework"] == "tensorflow" and summary["steps"] == 3
        assert summary["ops"] and summary["ops"][0]["self_cpu_us"] > 0
        trace = next(p for p in paths if not p.endswith(".summary.json"))
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        assert sum(1 for e in events if e.get("ph") == "X") > 10
        assert any(p.endswith(".xplane.pb") and os.path.exists(p) for p in paths)
    finally:
        Path(stop).touch()
        job.communicate(timeout=120)
    assert job.returncode == 0


def test_tfrecord_shards_read_by_tensorflows_cpp_reader_appear_with_their_bytes(
    tmp_path: os.PathLike[str],
) -> None:
    from holoprof.collect import io_native

    if io_native.library_path() is None:
        pytest.skip("the native I/O library is not built (no C compiler at install)")
    data = os.path.join(tmp_path, "data")
    os.makedirs(data)
    script = os.path.join(SCRIPTS, "tfrecord_read.py")
    w = subprocess.run([sys.executable, script, data], capture_output=True, text=True, timeout=120)
    assert w.returncode == 0, w.stderr
    doc = _trace(str(tmp_path), "tfrecord", script, data)
    assert "read" in doc["_stdout"]
    files = {f["path"]: f for f in doc["io"]["files_detail"]}
    shards = sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".tfrecord"))
    assert len(shards) == 3
    for shard in shards:
        assert shard in files, sorted(files)
        assert files[shard]["bytes_read"] == os.path.getsize(shard)
    assert doc["steps"]["count"] == 12  # 600 records / batches of 50


#: Entry points of the TensorFlow collector, with the script that passes through each.
TF_FAULTS = [
    ("keras_callback", "keras_fit.py", ("fast", "1")),
    ("keras_fit", "keras_fit.py", ("fast", "1")),
    ("tf_data", "custom_loop.py", ("eager", "6")),
    ("apply_gradients", "custom_loop.py", ("eager", "6")),
]


def tf_command(name: str, args: tuple[str, ...], tmp: str) -> list[str]:
    script = os.path.join(SCRIPTS, name)
    return [script, os.path.join(tmp, "ck"), *args] if name == "keras_fit.py" else [script, *args]


@pytest.fixture(scope="module")
def untraced_tf(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, tuple[str, ...]], str]:
    """The stdout of an untraced run of a script (each script and arguments run once)."""
    runs: dict[tuple[str, tuple[str, ...]], str] = {}

    def run(name: str, args: tuple[str, ...]) -> str:
        if (name, args) not in runs:
            argv = tf_command(name, args, str(tmp_path_factory.mktemp("untraced-tf")))
            proc = subprocess.run(
                [sys.executable, *argv], capture_output=True, text=True, timeout=240, check=False,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-3000:]
            runs[name, args] = proc.stdout
        return runs[name, args]

    return run


@pytest.mark.parametrize(("point", "name", "args"), TF_FAULTS, ids=[p for p, _, _ in TF_FAULTS])
def test_a_failing_tensorflow_hook_leaves_the_job_unchanged(
    tmp_path: os.PathLike[str],
    untraced_tf: Callable[[str, tuple[str, ...]], str],
    point: str,
    name: str,
    args: tuple[str, ...],
) -> None:
    expected = untraced_tf(name, args)
    argv = tf_command(name, args, os.fspath(tmp_path))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["HOLOPROF_FAULT_INJECT"] = f"tensorflow:{point}"
    out = os.path.join(tmp_path, "run")
    proc = subprocess.run(
        [sys.executable, "-m", "holoprof.cli", "run", "--no-report", "--out", out, "--", *argv],
        capture_output=True, text=True, timeout=240, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == expected
    failed = [line for line in proc.stderr.splitlines() if "the 'tensorflow' collector failed" in line]
    assert len(failed) == 1 and f"tensorflow:{point}" in failed[0], proc.stderr[-3000:]
    errors = report_json(out)["run"]["errors"]
    assert (
        len(errors) == 1
        and f"tensorflow: FaultInjected: injected fault (HOLOPROF_FAULT_INJECT=tensorflow:{point})"
        in (errors[0])
    ), errors


TF_SCRIPT = """
import tensorflow as tf
ds = tf.data.Dataset.range(64).map(lambda x: x * 2).prefetch(1)
print("map dataset:", type(ds._input_dataset).__name__, flush=True)
print("sum:", int(sum(int(v) for v in ds)))
"""


def test_tf_data_knobs_reach_the_pipeline(tmp_path: Path) -> None:
    """``--set`` knobs for tf.data reach the unchanged script's pipeline (what ``holoprof tune`` and
    ``sweep`` apply), and the script computes the same."""
    (tmp_path / "tfjob.py").write_text(TF_SCRIPT)
    run = traced(
        tmp_path, "tfjob.py", options=("--set", "num_parallel_calls=autotune", "--set", "prefetch=autotune"),
        timeout=240,
    )  # fmt: skip
    assert run.proc.returncode == 0, run.proc.stderr
    assert (
        "map dataset: _ParallelMapDataset" in run.proc.stdout
    )  # the script's map (_MapDataset) is now parallel
    assert "sum: 4032" in run.proc.stdout  # and computes the same
    assert run.report["run"]["knobs"] == {"num_parallel_calls": "autotune", "prefetch": "autotune"}
    import holoprof

    r = holoprof.load(run.run_dir)
    (info,) = r.rows("SELECT info FROM processes WHERE role = 'main' ORDER BY updated_ns DESC LIMIT 1")[0]
    applied = json.loads(info)["knobs"]["applied"]
    assert applied == {"num_parallel_calls": {"applied": 1}, "prefetch": {"applied": 1}}
