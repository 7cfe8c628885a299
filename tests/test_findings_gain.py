"""No finding without a measurable gain, evidence about the data the training reads, and advice that
fits the machine: real traced runs of small jobs that drew false findings before.

* a job that reads its environment's files every step (a tool's configuration in a hidden directory,
  a launcher script in a ``bin`` directory, a dataset library's metadata and lock file) and a few
  small reads of its data, and sleeps outside the phases: the environment is no evidence, the small
  reads cost far less than 1% of a step (no ``small_file_io``), and the host overhead of a CPU job is
  told nothing about CUDA;
* a job that reads one 8 MiB file whole each step: the read at end of file is no small read;
* tar shards read with tar's block size: small reads, but no advice to pack them into shards;
* a DataLoader whose time is in its sampler, outside what the input-pipeline model measures: the
  model is far from the measured step, so it advises no worker count.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import TracedRun, traced
from holoprof.analyze.findings import MIN_GAIN, severity_of_gain

ENV_JOB = textwrap.dedent(
    """
    import os, sys, time
    import torch

    data = sys.argv[1]
    environment = [
        os.path.join(data, "home", ".keras", "keras.json"),
        os.path.join(data, ".cache", "tool", "settings.json"),
        os.path.join(data, "venv", "bin", "torchrun"),
        os.path.join(data, "ds", "dataset_info.json"),
        os.path.join(data, "ds", "state.json"),
        os.path.join(data, "ds", "cache.lock"),
    ]
    torch.manual_seed(0)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(int(sys.argv[2])):
        for p in environment:
            with open(p, "rb") as f:
                f.read()
        with open(os.path.join(data, "tokens.bin"), "rb", buffering=0) as f:  # the data: a few small reads
            for k in range(8):
                f.seek(4096 * ((step * 8 + k) % 64))
                f.read(256)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        time.sleep(0.02)  # host-side work outside the phases
    """
)

EOF_JOB = textwrap.dedent(
    """
    import sys
    import torch

    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(int(sys.argv[2])):
        with open(sys.argv[1], "rb") as f:  # one read of 8 MiB, then the read at end of file
            raw = f.read()
        x = torch.frombuffer(bytearray(raw[: 64 * 16 * 4]), dtype=torch.float32).view(64, 16)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    """
)

SHARDS_JOB = textwrap.dedent(
    """
    import os, sys
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    root = sys.argv[1]
    shards = sorted(os.path.join(root, n) for n in os.listdir(root))

    class Shards(IterableDataset):  # tar shards read with tar's block size, 512 bytes a call
        def __iter__(self):
            for p in shards:
                with open(p, "rb", buffering=0) as f:
                    sample = bytearray()
                    while block := f.read(512):
                        sample += block
                        if len(sample) >= 512 + 16384:  # a member: its header and its data
                            yield torch.tensor(len(sample), dtype=torch.float32)
                            sample = bytearray()

    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in DataLoader(Shards(), batch_size=8):
        opt.zero_grad()
        model(x.view(-1, 1)).sum().backward()
        opt.step()
    """
)

SAMPLER_JOB = textwrap.dedent(
    """
    import time
    import torch
    from torch.utils.data import DataLoader, Sampler, TensorDataset

    class SlowSampler(Sampler):  # the loader's time is here, outside the dataset fetches
        def __init__(self, n):
            self.n = n
        def __len__(self):
            return self.n
        def __iter__(self):
            for i in range(self.n):
                time.sleep(0.002)
                yield i

    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(ds, batch_size=8, sampler=SlowSampler(256)):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    """
)


def _job(tmp: Path, source: str, *args: str) -> TracedRun:
    (tmp / "job.py").write_text(source)
    run = traced(tmp, str(tmp / "job.py"), *args)
    assert run.proc.returncode == 0, run.proc.stderr
    return run


def raw_io_findings(run_dir: str) -> dict[str, Any]:
    """The I/O findings before the report keeps only those with a measurable gain."""
    import holoprof
    from holoprof.analyze.io import io_section
    from holoprof.analyze.steps import step_processes, step_stats

    run = holoprof.load(run_dir)
    procs = step_processes(run)
    _, found = io_section(run, {"steps": step_stats(run, procs[0]) if procs else None})
    return {f.id: f.to_dict() for f in found}


def gain_floor_of(run_dir: str) -> float:
    import holoprof
    from holoprof.analyze.findings import gain_floor
    from holoprof.analyze.steps import step_processes, step_stats

    run = holoprof.load(run_dir)
    return gain_floor(step_stats(run, step_processes(run)[0]))


def found(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["id"]: f for f in doc["findings"]}


@pytest.fixture(scope="module")
def env_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    tmp = tmp_path_factory.mktemp("envfiles")
    data = tmp / "data"
    for rel, text in (
        ("home/.keras/keras.json", '{"backend": "torch", "floatx": "float32"}'),
        (".cache/tool/settings.json", "{}"),
        ("venv/bin/torchrun", "#!/usr/bin/python\nimport sys\n"),
        ("ds/dataset_info.json", '{"features": {}}'),
        ("ds/state.json", '{"_data_files": []}'),
        ("ds/cache.lock", ""),
    ):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text(text)
    (data / "tokens.bin").write_bytes(os.urandom(256 << 10))
    return _job(tmp, ENV_JOB, str(data), "40")


@pytest.fixture(scope="module")
def eof_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    tmp = tmp_path_factory.mktemp("eof")
    (tmp / "big.bin").write_bytes(os.urandom(8 << 20))
    return _job(tmp, EOF_JOB, str(tmp / "big.bin"), "20")


@pytest.fixture(scope="module")
def shards_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    tmp = tmp_path_factory.mktemp("shards")
    root = tmp / "shards"
    root.mkdir()
    payload = os.urandom(16384)
    for s in range(4):
        with tarfile.open(root / f"shard-{s:03d}.tar", "w") as tar:
            for i in range(64):
                info = tarfile.TarInfo(f"{s}-{i:04d}.bin")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return _job(tmp, SHARDS_JOB, str(root))


@pytest.fixture(scope="module")
def sampler_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    return _job(tmp_path_factory.mktemp("sampler"), SAMPLER_JOB)


def test_environment_files_are_no_evidence_of_the_data(env_run: TracedRun) -> None:
    io_doc = env_run.report["io"]
    # the section still reports what the job did
    paths = [d["path"] for d in io_doc["files_detail"]]
    assert any(p.endswith("keras.json") for p in paths) and any(p.endswith("torchrun") for p in paths)
    data = io_doc["training_data"]
    assert data["files_read"] == 1  # tokens.bin only
    assert data["left_out_files"]["configuration"] == 2  # home/.keras, .cache
    assert data["left_out_files"]["program"] == 1  # venv/bin/torchrun
    assert data["left_out_files"]["bookkeeping"] == 3  # dataset_info.json, state.json, cache.lock
    assert data["small_reads"] == 40 * 8
    # the small reads of tokens.bin make a small_file_io verdict, with only the data as evidence...
    raw = raw_io_findings(env_run.run_dir)["small_file_io"]
    assert raw["evidence"]["files_read"] == 1
    data_dir = str(Path(env_run.run_dir).parent / "data")
    assert [s["directory"] for s in raw["evidence"]["staging"]] == [data_dir]  # not venv/bin, not ds
    # ...whose gain, a few reads against a 20 ms step, is far below a measurable one: not shown
    assert raw["estimated_gain"] < MIN_GAIN
    assert "small_file_io" not in found(env_run.report)
    # the terminal report says what was left out
    from rich.console import Console

    from holoprof.present.io import render_io

    buf = io.StringIO()
    render_io(env_run.report, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "I/O findings judge the data the training reads (1 files)" in text
    assert "files left out, per reason: 3 bookkeeping, 2 configuration, 1 program" in text


def test_host_overhead_of_a_cpu_job_gives_no_cuda_advice(env_run: TracedRun) -> None:
    doc = env_run.report
    assert doc["run"]["gpus"] == []
    f = found(doc)["host_overhead"]  # 20 ms of sleep against well under 1 ms of compute a step
    assert f["severity"] == "high" and f["estimated_gain"] >= 0.3
    text = f["recommendation"]
    assert "CUDA" not in text and "device sync" not in text and "on the device" not in text
    assert "torch.compile" in text


def test_a_whole_file_read_in_one_call_is_no_small_read(eof_run: TracedRun) -> None:
    io_doc = eof_run.report["io"]
    detail = next(d for d in io_doc["files_detail"] if d["path"].endswith("big.bin"))
    assert detail["bytes_read"] == 20 * (8 << 20) and detail["reads"] == 40
    # the counters keep Darshan's histogram (the 0-byte read is in its smallest bucket)...
    assert io_doc["read_size_histogram"]["0_100"] >= 20 and io_doc["read_size_histogram"]["4M_10M"] == 20
    # ...but a read at end of file is no small read
    assert io_doc["eof_reads"] >= 20
    assert io_doc["training_data"]["small_reads"] == 0
    assert io_doc["small_read_fraction"] == 0.0
    assert "small_file_io" not in raw_io_findings(eof_run.run_dir)
    assert "small_file_io" not in found(eof_run.report)


def test_small_reads_of_tar_shards_are_not_told_to_pack_them_into_shards(shards_run: TracedRun) -> None:
    doc = shards_run.report
    assert doc["io"]["training_data"]["container_files"] == 4
    raw = raw_io_findings(shards_run.run_dir)["small_file_io"]
    assert raw["evidence"]["small_read_fraction"] == 1.0 and raw["evidence"]["container_files"] == 4
    for f in [raw] + [f for f in doc["findings"] if f["id"] == "small_file_io"]:
        assert "already packed in 4 shard or container files" in f["recommendation"]
        assert "buffering=1 << 20" in f["recommendation"]
        assert "pack the samples" not in f["recommendation"]
    # shown exactly when its gain is measurable: at least 1% of the step and the run's noise
    assert ("small_file_io" in found(doc)) == (raw["estimated_gain"] >= gain_floor_of(shards_run.run_dir))


def test_a_model_far_from_the_measured_step_advises_no_worker_count(sampler_run: TracedRun) -> None:
    f = found(sampler_run.report)["input_bound"]
    fit = f["evidence"]["model"]["fit"]
    # 16 ms a batch in the sampler; the fetches the model measures take well under a millisecond
    assert not fit["fits"] and fit["error"] > fit["tolerance"] >= 0.25, fit
    assert fit["predicted_now_s"] < 0.5 * fit["measured_s"]
    assert "does not describe this run" in f["recommendation"]
    assert "use DataLoader(..., num_workers=" not in f["recommendation"]
    # the gain is what removing the wait can save, and the severity follows it
    assert f["gain_basis"]["model"].startswith("input fully overlapped")
    assert f["estimated_gain"] == pytest.approx(f["evidence"]["data_wait_fraction"], abs=1e-4)
    assert f["severity"] == severity_of_gain(f["estimated_gain"]) == "high"


@pytest.mark.parametrize("name", ["env_run", "eof_run", "shards_run", "sampler_run"])
def test_every_finding_shown_has_a_measurable_gain(name: str, request: pytest.FixtureRequest) -> None:
    doc = request.getfixturevalue(name).report
    for f in doc["findings"]:
        if f["id"] in ("memory_pressure", "hang"):
            continue
        assert f["estimated_gain"] >= f["threshold"]["min_gain"] >= MIN_GAIN, f
        order = {"high": 0, "medium": 1, "low": 2}
        assert order[f["severity"]] >= order[severity_of_gain(f["estimated_gain"])], f
        assert "CUDA" not in json.dumps(f)  # none of these jobs had a GPU
