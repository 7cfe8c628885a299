"""The io section and its findings on real runs: a small-file dataset, a sharded one, no I/O at all."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import report_json, run_holoprof

LOADER = textwrap.dedent(
    """
    import os, sys
    import torch
    from torch.utils.data import DataLoader, Dataset

    root, block, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    files = sorted(os.path.join(root, n) for n in os.listdir(root))

    class Chunks(Dataset):
        def __init__(self):
            self.items = [(p, off) for p in files for off in range(0, os.path.getsize(p), block or 1 << 62)]

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            p, off = self.items[i]
            if chunk:  # the whole file in unbuffered reads of `chunk` bytes
                n = 0
                with open(p, "rb", buffering=0) as f:
                    while b := f.read(chunk):
                        n += len(b)
                return torch.tensor(n)
            with open(p, "rb") as f:
                if block:
                    f.seek(off)
                    return torch.tensor(len(f.read(block)))
                return torch.tensor(len(f.read()))

    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in DataLoader(Chunks(), batch_size=64, num_workers=2, multiprocessing_context="fork"):
        model(x.float().view(-1, 1)).sum().backward()
        opt.step()
        opt.zero_grad()
    """
)

IO_KEYS = {
    "bytes_read",
    "bytes_written",
    "files",
    "reads",
    "writes",
    "bandwidth_read_bytes_per_s",
    "read_size_histogram",
    "files_detail",
    "layers",
    "bandwidth_timeline",
    "file_size_histogram",
    "seq_read_fraction",
    "meta_time_fraction",
    "by_role",
    "staging",
}
DETAIL_KEYS = {
    "path",
    "bytes_read",
    "bytes_written",
    "reads",
    "writes",
    "opens",
    "seq_read_fraction",
    "read_time_s",
}


def _traced(
    tmp: Path, n_files: int, size: int, block: int, layer: str = "python", chunk: int = 0
) -> dict[str, Any]:
    data = tmp / "data"
    data.mkdir()
    payload = os.urandom(size)
    for i in range(n_files):
        (data / f"sample {i:05d}.bin").write_bytes(payload)
    script = tmp / "loader.py"
    script.write_text(LOADER)
    run_dir = tmp / "run"
    proc = run_holoprof(
        "run", "--out", str(run_dir), "--io-layer", layer, "--no-report", "--", str(script), str(data), str(block),
        str(chunk), cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return {"doc": _report(run_dir), "data": str(data), "size": size, "n": n_files}


def _report(run_dir: Path) -> dict[str, Any]:
    """The report document, built in process (the CLI's --json path is covered by the no-I/O test)."""
    import holoprof
    from holoprof.analyze.report import build_report

    doc = json.loads(json.dumps(build_report(holoprof.load(str(run_dir))), default=str))
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def small_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # the default layer: native where the library is built and preloaded, else python. Each file is
    # read in 16-byte reads, so that the workers' time is I/O calls (not Python per sample): the saving
    # stands far above the noise of a short run on a busy machine (no finding is shown below it)
    return _traced(tmp_path_factory.mktemp("small"), 2000, 2048, 0, layer="auto", chunk=16)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _traced(tmp_path_factory.mktemp("shards"), 8, 4 << 20, 1 << 20)


def test_small_file_dataset_fires_small_file_io(small_files: dict[str, Any]) -> None:
    doc = small_files["doc"]
    io = doc["io"]
    assert set(io) >= IO_KEYS
    assert io["files_read"] == 2000
    from holoprof.collect import io_native

    # holoprof run preloads the native library when it is built: then the agent reads its counters
    assert io["layers"] == (["native"] if io_native.library_path() else ["python"])
    assert io["file_size_median_bytes"] == 2048
    assert io["bytes_read"] == 2000 * 2048
    found = {f["id"]: f for f in doc["findings"]}
    assert "small_file_io" in found
    f = found["small_file_io"]
    assert f["evidence"]["files_read"] == 2000
    # 128 reads of 16 bytes a file, and the read at end of file that returns nothing (not a small read)
    assert f["evidence"]["eof_reads"] == 2000 and f["evidence"]["small_read_fraction"] == 1.0
    assert f["estimated_gain"] >= f["threshold"]["min_gain"] >= 0.01
    assert "pack the samples into a few large shards" in f["recommendation"]
    assert f["evidence"]["staging"][0]["directory"] == small_files["data"]
    assert f["threshold"]["files_min"] == 1000
    assert "shard" in f["recommendation"]
    assert io["by_role"]["dataloader_worker"]["bytes_read"] == 2000 * 2048
    assert io["by_role"]["dataloader_worker"]["processes"] == 2


def test_files_detail_largest_first_with_odd_names(small_files: dict[str, Any]) -> None:
    detail = small_files["doc"]["io"]["files_detail"]
    assert 0 < len(detail) <= 50
    assert all(set(d) >= DETAIL_KEYS for d in detail)
    totals = [d["bytes_read"] + d["bytes_written"] for d in detail]
    assert totals == sorted(totals, reverse=True)
    one = next(d for d in detail if d["path"].endswith("sample 00007.bin"))
    assert one["bytes_read"] == 2048 and one["opens"] == 1 and one["reads"] == 2048 // 16 + 1


def test_sharded_dataset_does_not_fire(sharded: dict[str, Any]) -> None:
    doc = sharded["doc"]
    io = doc["io"]
    assert io["bytes_read"] == 8 * (4 << 20)
    assert io["read_size_histogram"]["1M_4M"] == 32
    assert "small_file_io" not in {f["id"] for f in doc["findings"]}
    assert io["small_read_fraction"] < 0.5


def test_no_io_gives_empty_section(tmp_path: Path) -> None:
    script = tmp_path / "noio.py"
    script.write_text("x = sum(range(1000))\n")
    proc = run_holoprof("run", "--out", str(tmp_path / "run"), "--no-report", "--", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = report_json(str(tmp_path / "run"))
    assert doc["io"] == {}
    assert not {"small_file_io", "io_bandwidth"} & {f["id"] for f in doc["findings"]}


def test_terminal_section_renders(small_files: dict[str, Any]) -> None:
    import io as _io

    from rich.console import Console

    from holoprof.present.io import render_io

    buf = _io.StringIO()
    # wide enough that a file's path (a pytest-xdist worker's temporary directory is long) is not folded
    render_io(small_files["doc"], Console(file=buf, width=200))
    text = buf.getvalue()
    assert "read sizes" in text and "top files" in text and "sample 0" in text
    buf = _io.StringIO()
    render_io({"io": {}}, Console(file=buf))
    assert buf.getvalue() == ""


TINY_READS = textwrap.dedent(
    """
    import os, sys
    import torch
    from torch.utils.data import DataLoader, Dataset

    root = sys.argv[1]
    files = sorted(os.path.join(root, n) for n in os.listdir(root))

    class Tiny(Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            n = 0
            with open(files[i], "rb", buffering=0) as f:
                while b := f.read(256):
                    n += len(b)
            return torch.tensor(n)

    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in DataLoader(Tiny(), batch_size=4, num_workers=0):
        model(x.float().view(-1, 1)).sum().backward()
        opt.step()
        opt.zero_grad()
    """
)


def _measure_read_bandwidth(files: list[Path]) -> float:
    """This machine's read bandwidth for these files: whole files in 1 MiB reads, best of three."""
    import time

    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        n = 0
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while b := f.read(1 << 20):
                    n += len(b)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def test_tiny_reads_fire_io_bandwidth_against_a_measured_reference(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(32):
        (data / f"t{i:02d}.bin").write_bytes(os.urandom(512 * 1024))
    script = tmp_path / "tiny.py"
    script.write_text(TINY_READS)
    run_dir = tmp_path / "run"
    proc = run_holoprof(
        "run", "--out", str(run_dir), "--io-layer", "python", "--no-report", "--", str(script), str(data),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # without a device measurement (files under 1 MiB): no reference, no bandwidth verdict
    doc = _report(run_dir)
    assert doc["io"]["reference_bandwidth"] == {}
    assert "io_bandwidth" not in {f["id"] for f in doc["findings"]}
    # a real measurement of this machine saved as iobench results in the run's artifacts
    bw = _measure_read_bandwidth(sorted(data.iterdir()))
    (run_dir / "artifacts" / "iobench-local.json").write_text(json.dumps({"best_bandwidth_bytes_per_s": bw}))
    doc = _report(run_dir)
    io = doc["io"]
    assert io["reference_bandwidth"]["source"].startswith("holoprof iobench")
    found = {f["id"]: f for f in doc["findings"]}
    assert "io_bandwidth" in found, (io["bandwidth_read_window_bytes_per_s"], bw, io["data_wait"])
    ev = found["io_bandwidth"]["evidence"]
    assert ev["ratio"] < 0.25
    assert ev["reference_read_bytes_per_s"] == round(bw, 1)
    assert io["read_size_histogram"]["100_1K"] == 32 * 2048
    assert found["small_file_io"]["evidence"]["small_read_fraction"] >= 0.5
