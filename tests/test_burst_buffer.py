"""BurstBuffer: round trips, durability, fallbacks, backpressure, retention and crash consistency.

Everything runs on real files; the crash tests SIGKILL real child processes while they save and drain.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from holoprof.checkpoint import (
    BurstBuffer,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWarning,
    DrainError,
)
from holoprof.errors import HoloprofError

torch = pytest.importorskip("torch")


@dataclass
class Point:
    x: int
    y: list[str]


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "fast", tmp_path / "durable"


def data_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".ckpt"))


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".tmp-"))


def manifests_in(directory: Path) -> list[Path]:
    """Committed manifests (pathlib's glob also matches dot files, i.e. temporary ones: skip those)."""
    return [p for p in directory.glob("*.manifest.json") if not p.name.startswith(".")]


def check_durable_on_disk(durable: Path) -> dict[str, dict[str, Any]]:
    """Independent of holoprof: every manifest in ``durable`` names a data file with its size and SHA-256."""
    manifests = {}
    for path in manifests_in(durable):
        doc = json.loads(path.read_text())
        data = durable / doc["data_file"]
        assert data.exists(), f"{path.name} is visible but its data file is missing"
        blob = data.read_bytes()
        assert len(blob) == doc["size_bytes"], f"{path.name}: partial data file visible"
        assert hashlib.sha256(blob).hexdigest() == doc["sha256"], f"{path.name}: data does not match"
        manifests[doc["name"]] = doc
    return manifests


def model_and_optimizer() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    return model, opt


# ------------------------------------------------------------------------------------------ round trips


def test_torch_state_dict_round_trip_from_both_tiers(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    model, opt = model_and_optimizer()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}
    with BurstBuffer(fast, durable) as bb:
        result = bb.save(ckpt, "step-000100")
        assert result.tier == "fast" and result.info.serializer == "torch"
        loaded, source = bb.load_with_source("step-000100")
        assert source == "fast"
        bb.wait()
    for k, v in model.state_dict().items():
        assert torch.equal(loaded["model"][k], v)
    assert loaded["optimizer"]["state"][0]["exp_avg"].shape == (64, 32)
    # a fresh fast tier (e.g. another node): the checkpoint comes from durable storage
    with BurstBuffer(tmp_path / "fast2", durable) as bb:
        again, source = bb.load_with_source("step-000100")
        assert source == "durable" and bb.last_load_source == "durable"
    for k, v in model.state_dict().items():
        assert torch.equal(again["model"][k], v)
    model.load_state_dict(again["model"])


def test_plain_object_round_trip_uses_pickle(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    obj = {"point": Point(3, ["a", "b"]), "tags": {1, 2}, "blob": os.urandom(10_000)}
    with BurstBuffer(fast, durable) as bb:
        assert bb.save(obj, "plain").info.serializer == "pickle"
        assert bb.load("plain") == obj
    with BurstBuffer(tmp_path / "other-fast", durable) as bb:
        assert bb.load("plain") == obj


def test_explicit_pickle_serializer_for_tensors(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable, serializer="pickle") as bb:
        bb.save({"w": torch.arange(5)}, "t")
        assert torch.equal(bb.load("t")["w"], torch.arange(5))
    with pytest.raises(HoloprofError, match="unknown serializer"):
        BurstBuffer(fast, durable, serializer="json")  # type: ignore[arg-type]


def test_wait_makes_every_saved_checkpoint_durable(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        for i in range(5):
            bb.save({"i": i, "w": torch.full((1000,), float(i))}, f"ck-{i}")
        assert bb.wait(timeout=30)
        assert bb.pending == 0
        on_disk = check_durable_on_disk(durable)
        assert sorted(on_disk) == [f"ck-{i}" for i in range(5)]
        assert [i.name for i in bb.list(verify=True)] == [f"ck-{i}" for i in range(5)]
        assert temp_files(durable) == []


def test_load_of_a_missing_name_says_what_exists(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        bb.save({"a": 1}, "exists")
        bb.wait()
        with pytest.raises(CheckpointNotFoundError, match=r"'nope'.*available: exists"):
            bb.load("nope")


# ------------------------------------------------------------------------------------------ snapshots


def test_training_may_change_everything_as_soon_as_save_returns(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    model, opt = model_and_optimizer()
    model[0].weight.requires_grad_(True)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "tied": {"a": model[0].bias, "view": model[0].bias[2:5]},
        "param": model[2].weight,  # an nn.Parameter
        "numpy": np.arange(6.0),
        "history": [1, 2, 3],
    }
    expected = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "exp_avg": opt.state_dict()["state"][0]["exp_avg"].clone(),
        "param": model[2].weight.detach().clone(),
    }
    with BurstBuffer(fast, durable, route="fast") as bb:
        result = bb.save(state, "s")
        # the training goes on at once: in-place updates, optimizer steps, Python objects changed
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        model(torch.randn(4, 32)).sum().backward()
        opt.step()
        state["numpy"][:] = -1
        state["history"].append(4)
        assert result.copied and result.snapshot_bytes > 0
        loaded = bb.load("s")
    for k, v in expected["model"].items():
        assert torch.equal(loaded["model"][k], v), k
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], expected["exp_avg"])
    assert torch.equal(loaded["param"], expected["param"])
    assert isinstance(loaded["param"], torch.nn.Parameter) and loaded["param"].requires_grad
    # storage sharing is kept as torch.save keeps it: a view of a tensor stays a view of it
    assert (
        loaded["tied"]["view"].untyped_storage().data_ptr()
        == loaded["tied"]["a"].untyped_storage().data_ptr()
    )
    assert torch.equal(loaded["tied"]["view"], expected["model"]["0.bias"][2:5])
    assert loaded["numpy"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and loaded["history"] == [1, 2, 3]


def test_snapshot_buffers_are_reused_and_memory_stays_within_the_budget(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    state = {f"w{i}": torch.arange(64 * 1024, dtype=torch.float32) * i for i in range(4)}  # 4 x 256 KiB
    one = sum(t.untyped_storage().nbytes() for t in state.values())
    budget = 2 * one + 64 * 1024
    with BurstBuffer(fast, durable, snapshot_budget_bytes=budget, route="fast") as bb:
        slow_drain(bb, 0.02)
        original = bb._persister.write_fast
        gate = threading.Event()
        results: list[Any] = []

        def slow_write(*args: Any) -> Any:
            gate.wait(30)  # a stalled fast tier: snapshots pile up until the budget stops them
            return original(*args)

        def open_gate() -> None:  # once two snapshots are held, a third save has to wait
            while len(results) < 2:
                time.sleep(0.005)
            time.sleep(0.2)
            gate.set()

        bb._persister.write_fast = slow_write  # type: ignore[method-assign]
        opener = threading.Thread(target=open_gate)
        opener.start()
        peak = 0
        for i in range(6):
            results.append(bb.save(state, f"ck-{i}"))
            peak = max(peak, bb.snapshots.in_use_bytes)
            for t in state.values():
                t.add_(1.0)
        bb.wait()
        opener.join()
        assert peak <= budget and bb.snapshots.allocated_bytes <= budget
        assert results[2].backpressure_s > 0.01  # save() waited for memory
        assert results[2].blocking_s >= results[2].backpressure_s
        assert bb.snapshots.allocations <= 2 * len(state)  # two snapshots' buffers, reused since
        for i, r in enumerate(results):
            assert r.written_tier == "fast"
            loaded = bb.load(f"ck-{i}")
            assert all(torch.equal(loaded[k], v - (6 - i)) for k, v in state.items())


def test_a_snapshot_larger_than_the_budget_is_written_before_save_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable, snapshot_budget_bytes=100_000, route="durable") as bb:
        with caplog.at_level(logging.WARNING, logger="holoprof.checkpoint"):
            result = bb.save({"w": torch.ones(100_000)}, "big")
        assert result.synchronous and "snapshot_budget_bytes" in result.reason
        assert "big" in check_durable_on_disk(durable)  # durable when save returned
        assert "exceeds snapshot_budget_bytes" in caplog.text


def test_copy_false_uses_host_tensors_as_they_are(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    state = {"w": torch.arange(10_000, dtype=torch.float32)}
    with BurstBuffer(fast, durable) as bb:
        result = bb.save(state, "nocopy", copy=False)
        assert not result.copied and result.snapshot_bytes == 0 and bb.snapshots.allocations == 0
        result.wait()  # the promise: unchanged until written
        state["w"].zero_()
        assert torch.equal(bb.load("nocopy")["w"], torch.arange(10_000, dtype=torch.float32))


def test_an_unpicklable_object_is_refused_at_save(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        with pytest.raises(CheckpointError, match="cannot snapshot checkpoint 'bad'"):
            bb.save({"f": lambda: 1}, "bad")
        assert bb.save({"ok": 1}, "good").info.name == "good"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_copied_to_pinned_host_buffers(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    w = torch.randn(1 << 20, device="cuda")
    expected = w.cpu()
    with BurstBuffer(fast, durable) as bb:
        result = bb.save({"w": w}, "gpu", copy=False)
        w.add_(1.0)  # queued on the same stream right after save returns
        assert result.snapshot_bytes >= w.untyped_storage().nbytes()
        loaded = bb.load("gpu", map_location="cpu")
    assert torch.equal(loaded["w"], expected)


# ------------------------------------------------------------------------------------------ routes


def test_slower_fast_tier_sends_checkpoints_straight_to_durable(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        first = bb.save({"w": torch.ones(10)}, "first")
        assert first.tier == "fast" and "until the speeds of both tiers are measured" in first.reason
        bb.wait()
        bb._speeds.fast_bps, bb._speeds.durable_bps = 300e6, 400e6  # as the saves and drains measured them
        direct = bb.save({"w": torch.ones(10)}, "direct")
        assert direct.tier == "durable" and "not faster than durable storage" in direct.reason
        assert "300 MB/s" in direct.reason and "400 MB/s" in direct.reason
        direct.wait()
        assert "direct" in check_durable_on_disk(durable)  # durable once written, no drain
        assert not (fast / "direct.manifest.json").exists()
        bb._speeds.fast_bps = 2000e6
        assert bb.save({"w": torch.ones(10)}, "again").tier == "fast"


def test_measured_speeds_choose_the_path(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    state = {"w": torch.randn(256, 1024)}  # 1 MiB: large enough to be measured
    with BurstBuffer(fast, durable) as bb:
        for i in range(5):
            bb.save(state, f"m-{i}")
            bb.wait()
        # the choice is made at the save from the speeds measured until then (the save's own write
        # then updates them)
        fast_bps, durable_bps = bb._speeds.fast_bps, bb._speeds.durable_bps
        assert fast_bps is not None and durable_bps is not None
        chosen = bb.save(state, "m-5")
        bb.wait()
        faster = fast_bps >= 1.2 * durable_bps
        assert chosen.tier == ("fast" if faster else "durable"), chosen.reason
        assert "MB/s (measured)" in chosen.reason


def test_route_durable_never_touches_the_fast_tier(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable, route="durable") as bb:
        for i in range(3):
            assert bb.save({"i": i}, f"d-{i}").tier == "durable"
        bb.wait()
        assert data_files(fast) == [] and sorted(check_durable_on_disk(durable)) == ["d-0", "d-1", "d-2"]
    with pytest.raises(HoloprofError, match="route must be"):
        BurstBuffer(fast, durable, route="nvme")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ corruption


def flip_byte(path: Path, offset: int = -10) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset] ^= 0xFF
    path.write_bytes(bytes(blob))


def test_corrupted_fast_copy_falls_back_to_durable_with_a_warning(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    model, _ = model_and_optimizer()
    with BurstBuffer(fast, durable) as bb:
        bb.save(model.state_dict(), "m")
        bb.wait()
        (fast_file,) = data_files(fast)
        flip_byte(fast / fast_file, offset=len((fast / fast_file).read_bytes()) // 2)
        with pytest.warns(CheckpointWarning, match="corrupted"):
            sd, source = bb.load_with_source("m")
        assert source == "durable"
        assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())
        assert data_files(fast) == []  # the bad copy is gone; the next load goes to durable quietly
        assert bb.load_with_source("m")[1] == "durable"


def test_corrupted_durable_copy_is_refused(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        bb.save({"blob": b"x" * 5000}, "c")
        bb.wait()
    flip_byte(durable / data_files(durable)[0])
    with BurstBuffer(tmp_path / "fresh-fast", durable) as bb:
        with pytest.raises(CheckpointCorruptError, match="does not match its manifest"):
            bb.load("c")
        assert bb.list(verify=True) == []
        assert [i.name for i in bb.list()] == ["c"]  # same size: only the SHA-256 check catches it


def test_reopen_resumes_undrained_copies_and_drops_corrupt_ones(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        bb.save({"v": 1}, "good")
        bb.save({"v": 2}, "bad")
        bb.wait()
    # make both look undrained (as after a crash before the drain), then corrupt one fast copy
    for p in list(durable.iterdir()):
        if p.name != ".holoprof-burst.lock":
            p.unlink()
    bad_manifest = json.loads((fast / "bad.manifest.json").read_text())
    flip_byte(fast / bad_manifest["data_file"], offset=-3)
    with BurstBuffer(fast, durable) as bb:
        bb.wait()
        assert [i.name for i in bb.list(verify=True)] == ["good"]
        assert bb.load("good") == {"v": 1}
        with pytest.raises(CheckpointNotFoundError):
            bb.load("bad")
    assert sorted(check_durable_on_disk(durable)) == ["good"]


def test_reopen_removes_temporary_and_orphaned_files(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        bb.save({"v": 1}, "keep")
    (durable / ".tmp-1234abcd-x.0123456789abcdef.ckpt").write_bytes(b"partial")
    (durable / ".tmp-1234abcd-x.manifest.json").write_bytes(b"{")
    (durable / "x.0123456789abcdef.ckpt").write_bytes(b"orphan: its manifest never landed")
    (fast / ".tmp-00000000-y.fedcba9876543210.ckpt").write_bytes(b"partial")
    (durable / "user-notes.txt").write_text("not ours, left alone")
    with BurstBuffer(fast, durable) as bb:
        assert temp_files(durable) == [] and temp_files(fast) == []
        assert "x.0123456789abcdef.ckpt" not in data_files(durable)
        assert (durable / "user-notes.txt").exists()
        assert bb.load("keep") == {"v": 1}


# ------------------------------------------------------------------------------------------ drain errors


def test_drain_error_surfaces_at_the_next_call_and_retries_after_a_fix(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    bb = BurstBuffer(fast, durable)
    try:
        moved = tmp_path / "durable-moved"
        durable.rename(moved)
        durable.write_text("a regular file where the durable directory was")  # root cannot write here
        bb.save({"v": 1}, "a")
        deadline = time.monotonic() + 10
        while bb.pending and not bb._ledger.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(DrainError, match="draining checkpoint 'a' to durable storage failed"):
            bb.save({"v": 2}, "b")
        with pytest.raises(DrainError):  # the retry fails the same way, and says so again
            bb.wait()
        durable.unlink()
        moved.rename(durable)
        assert bb.wait(timeout=30)
        assert bb.load("a") == {"v": 1}
        assert "a" in check_durable_on_disk(durable)
    finally:
        with contextlib.suppress(HoloprofError):
            bb.close()


def test_close_raises_drain_errors_and_keeps_the_fast_copy(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    bb = BurstBuffer(fast, durable)
    durable.rename(tmp_path / "gone")
    durable.write_text("blocked")
    bb.save({"v": 7}, "kept")
    with pytest.raises(DrainError):
        bb.close()
    bb.close()  # closing twice is fine
    durable.unlink()
    (tmp_path / "gone").rename(durable)
    with BurstBuffer(fast, durable) as bb2:  # the next start drains what was left
        bb2.wait()
        assert "kept" in [i.name for i in bb2.list()]


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_full_durable_file_system_error_surfaces_then_recovers(tmp_path: Path) -> None:
    fast = tmp_path / "fast"
    with tmpfs(tmp_path / "durable", "64k") as durable:
        bb = BurstBuffer(fast, durable, serializer="pickle")
        try:
            bb.save(os.urandom(300_000), "big")
            with pytest.raises(DrainError, match="No space left on device"):
                bb.wait(timeout=30)
            assert temp_files(durable) == []  # the partial copy was removed
            assert bb.list() == []
            subprocess.run(["mount", "-o", "remount,size=4m", str(durable)], check=True)
            assert bb.wait(timeout=30)
            assert [i.name for i in bb.list(verify=True)] == ["big"]
        finally:
            with contextlib.suppress(HoloprofError):
                bb.close()


# ------------------------------------------------------------------------------------------ capacity


def slow_drain(bb: BurstBuffer, seconds: float) -> None:
    original = bb._drainer.drain_one

    def slowed(info: Any) -> bool:
        time.sleep(seconds)
        return original(info)

    bb._drainer.drain_one = slowed  # type: ignore[method-assign]


class FastTierWatcher:
    """Samples the bytes of checkpoint data (including temporary files) in a directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for p in self.directory.iterdir():
                if p.name.endswith(".ckpt"):
                    with contextlib.suppress(FileNotFoundError):
                        total += p.stat().st_size
            self.peak = max(self.peak, total)
            time.sleep(0.001)

    def __enter__(self) -> FastTierWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_full_fast_tier_applies_backpressure_and_never_overfills(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    one = 200_000
    capacity = int(2.5 * one)
    with BurstBuffer(
        fast,
        durable,
        fast_capacity_bytes=capacity,
        snapshot_budget_bytes=capacity,
        serializer="pickle",
        route="fast",
    ) as bb:
        slow_drain(bb, 0.3)
        with FastTierWatcher(fast) as watcher:
            results = [bb.save(os.urandom(one), f"ck-{i}") for i in range(6)]
            assert bb.wait(timeout=30)
        assert watcher.peak <= capacity
        assert all(r.tier == "fast" and r.written_tier == "fast" for r in results)
        # the fast tier filled up, the writes waited for the drain, and the snapshots for the writes
        assert sum(r.backpressure_s for r in results) > 0.1
        assert bb.fast_used_bytes <= capacity
        assert len(check_durable_on_disk(durable)) == 6


def test_object_larger_than_the_fast_tier_goes_straight_to_durable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable, fast_capacity_bytes=50_000, route="fast") as bb:
        with caplog.at_level(logging.WARNING, logger="holoprof.checkpoint"):
            by_estimate = bb.save({"blob": os.urandom(100_000)}, "big")  # size known up front
            # copy=False takes no snapshot of a host object: the size is found out while writing
            by_writing = bb.save(list(range(40_000)), "long", copy=False)
        assert by_estimate.tier == "durable" and "larger than the fast tier" in by_estimate.reason
        assert by_writing.tier == "fast" and by_writing.written_tier == "durable"
        assert "straight to durable storage" in caplog.text
        assert sorted(check_durable_on_disk(durable)) == ["big", "long"]  # durable once written
        assert data_files(fast) == [] and temp_files(fast) == []
        assert bb.load("long") == list(range(40_000))


def test_small_tmpfs_fast_tier(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    durable = tmp_path / "durable"
    with tmpfs(tmp_path / "fast", "2m") as fast:
        # default capacity: half of the tmpfs; backpressure keeps it from filling up
        with BurstBuffer(fast, durable, serializer="pickle") as bb:
            assert bb.fast_capacity_bytes <= 2 * 1024 * 1024
            slow_drain(bb, 0.05)
            with FastTierWatcher(fast) as watcher:
                for i in range(6):
                    assert bb.save(os.urandom(300_000), f"d-{i}").tier == "fast"
                bb.wait()
            assert watcher.peak <= bb.fast_capacity_bytes
        # a capacity larger than the device: a full tmpfs (ENOSPC) sends the checkpoint to durable
        with BurstBuffer(fast, durable, fast_capacity_bytes=1 << 30, serializer="pickle", route="fast") as bb:
            with caplog.at_level(logging.WARNING, logger="holoprof.checkpoint"):
                result = bb.save(os.urandom(3 * 1024 * 1024), "enospc")
            assert result.tier == "fast" and result.written_tier == "durable"
            assert "fast tier failed" in caplog.text
            assert temp_files(fast) == []
        assert len(check_durable_on_disk(durable)) == 7


# ------------------------------------------------------------------------------------------ names, retention


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "..", "a\\b", ".hidden", "x" * 300, "tab\tname"])
def test_bad_names_are_refused(tmp_path: Path, bad: str) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        with pytest.raises(HoloprofError):
            bb.save({"v": 1}, bad)
        with pytest.raises(HoloprofError):
            bb.load(bad)
    assert not (tmp_path / "x").exists()


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with pytest.raises(HoloprofError, match="same directory"):
        BurstBuffer(fast, fast)
    with pytest.raises(HoloprofError, match="keep_last"):
        BurstBuffer(fast, durable, keep_last=0)
    with pytest.raises(HoloprofError, match="fast_capacity_bytes"):
        BurstBuffer(fast, durable, fast_capacity_bytes=-1)
    (tmp_path / "file").write_text("x")
    with pytest.raises(HoloprofError, match="cannot create durable_dir"):
        BurstBuffer(fast, tmp_path / "file" / "sub")


def test_one_buffer_per_directory(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable), pytest.raises(HoloprofError, match="another BurstBuffer"):
        BurstBuffer(tmp_path / "fast-b", durable)
    with BurstBuffer(fast, durable):
        pass


def test_deleting_the_lock_files_does_not_let_a_second_buffer_in(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        (fast / ".holoprof-burst.lock").unlink()
        (durable / ".holoprof-burst.lock").unlink()
        with pytest.raises(CheckpointError, match="another BurstBuffer"):
            BurstBuffer(tmp_path / "fast-b", durable)
        with pytest.raises(CheckpointError, match="another BurstBuffer"):
            BurstBuffer(fast, tmp_path / "durable-b")
        # a second process too (flock is per open file description, as across processes)
        other = subprocess.run(
            [sys.executable, "-c", f"from holoprof.checkpoint import BurstBuffer; BurstBuffer({str(tmp_path / 'f3')!r}, {str(durable)!r})"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert other.returncode != 0 and "another BurstBuffer" in other.stderr
        bb.save({"v": 1}, "still-mine")
    with BurstBuffer(fast, durable) as bb:  # released on close
        assert bb.load("still-mine") == {"v": 1}


def test_list_on_a_missing_durable_directory_says_so(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    bb = BurstBuffer(fast, durable)
    try:
        shutil.rmtree(durable)
        with pytest.raises(
            CheckpointError, match=r"cannot list durable checkpoints in .*durable.*removed or unmounted"
        ):
            bb.list()
    finally:
        durable.mkdir()
        bb.close()


def test_closed_buffer_and_unreadable_directories_raise_checkpoint_errors(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    bb = BurstBuffer(fast, durable)
    bb.close()
    for call in (lambda: bb.save({"v": 1}, "x"), lambda: bb.load("x"), bb.list, bb.wait):
        with pytest.raises(CheckpointError, match="closed"):
            call()
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="cannot create durable_dir"):
        BurstBuffer(fast, tmp_path / "file" / "sub")


EXIT_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from holoprof.checkpoint import BurstBuffer

    fast, durable = Path(sys.argv[1]), Path(sys.argv[2])
    bb = BurstBuffer(fast, durable)
    durable.rename(durable.with_name("moved"))
    durable.write_text("a file where the durable directory was")
    bb.save({"v": 1}, "lost-at-exit")
    print("saved", flush=True)
    """
)


def test_exit_with_undrained_checkpoints_is_a_loud_error(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    script = tmp_path / "exit_child.py"
    script.write_text(EXIT_CHILD)
    proc = subprocess.run(
        [sys.executable, str(script), str(fast), str(durable)], capture_output=True, text=True, timeout=60
    )
    assert "saved" in proc.stdout
    # documented: the exit status stays the job's; stderr says which checkpoint was not made durable
    assert proc.returncode == 0, proc.stderr
    assert "holoprof: ERROR: checkpoints were not made durable at exit ('lost-at-exit')" in proc.stderr
    assert "opening a BurstBuffer on the same directories drains them" in proc.stderr
    durable.unlink()
    (tmp_path / "moved").rename(durable)
    with BurstBuffer(fast, durable) as bb:  # and so it does
        bb.wait()
        assert bb.load("lost-at-exit") == {"v": 1}


def test_keep_last_applies_to_both_tiers_across_names(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable, keep_last=2) as bb:
        for i in range(5):
            bb.save({"i": i}, f"ck-{i}")
            bb.wait()
        assert [i.name for i in bb.list()] == ["ck-3", "ck-4"]
        assert len(data_files(fast)) <= 2 and len(data_files(durable)) == 2
        with pytest.raises(CheckpointNotFoundError):
            bb.load("ck-0")
    with BurstBuffer(fast, durable, keep_last=2) as bb:
        bb.save({"i": 5}, "ck-5")
        bb.wait()
        assert [i.name for i in bb.list()] == ["ck-4", "ck-5"]
    assert sorted(check_durable_on_disk(durable)) == ["ck-4", "ck-5"]


def test_saving_a_name_again_replaces_it_everywhere(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    with BurstBuffer(fast, durable) as bb:
        for i in range(4):
            bb.save({"i": i}, "latest")
        assert bb.load("latest") == {"i": 3}
        bb.wait()
        assert len(data_files(fast)) == 1 and len(data_files(durable)) == 1
    with BurstBuffer(tmp_path / "f2", durable) as bb:
        assert bb.load("latest") == {"i": 3}


def test_concurrent_saves_and_loads_from_threads(tmp_path: Path) -> None:
    fast, durable = dirs(tmp_path)
    errors: list[BaseException] = []
    with BurstBuffer(fast, durable, fast_capacity_bytes=400_000, serializer="pickle") as bb:

        def work(t: int) -> None:
            try:
                for i in range(8):
                    name = f"t{t}-{i}"
                    payload = os.urandom(20_000 + 1000 * i)
                    bb.save(payload, name)
                    assert bb.load(name) == payload
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        bb.wait()
        assert len(bb.list(verify=True)) == 32


# ------------------------------------------------------------------------------------------ crash tests

CHILD = textwrap.dedent(
    """
    import hashlib, os, random, signal, sys
    from holoprof.checkpoint import BurstBuffer

    fast, durable, start, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    keep_last = int(sys.argv[5]) or None
    crash_at = os.environ.get("CRASH_AT")  # "<os function>:<n>": SIGKILL at its n-th call after start
    armed = [False]
    if crash_at:
        fn, n = crash_at.split(":")
        original, calls = getattr(os, fn), [0]

        def hooked(*args, **kwargs):
            if armed[0]:
                calls[0] += 1
                if calls[0] == int(n):
                    os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        setattr(os, fn, hooked)
    rng = random.Random(seed)
    bb = BurstBuffer(fast, durable, fast_capacity_bytes=2_000_000, keep_last=keep_last, serializer="pickle")
    armed[0] = True
    print("READY", flush=True)
    i = start
    while True:
        payload = rng.randbytes(rng.randint(1_000, 400_000))
        obj = {"i": i, "payload": payload, "sha": hashlib.sha256(payload).hexdigest()}
        bb.save(obj, f"ck-{i:07d}")
        bb.save(obj, "latest")
        if i % 3 == 2:
            bb.wait()
            print(f"DURABLE {i}", flush=True)
        i += 1
    """
)


def consistent(obj: dict[str, Any]) -> bool:
    return hashlib.sha256(obj["payload"]).hexdigest() == obj["sha"]


def run_child(
    script: Path, fast: Path, durable: Path, start: int, seed: int, keep_last: int, kill_after: float | None
) -> list[int]:
    """Start the saving child, SIGKILL it after ``kill_after`` s (or let it kill itself); return durable ids."""
    env = dict(os.environ)
    if kill_after is None:
        env["CRASH_AT"] = f"{['replace', 'fsync', 'unlink'][seed % 3]}:{1 + (seed * 5) % 19}"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(fast), str(durable), str(start), str(seed), str(keep_last)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("READY"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if kill_after is not None:
            assert ready.wait(20), proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
            time.sleep(kill_after)
            proc.kill()
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == -9, f"child did not die by SIGKILL (rc {proc.returncode}): {stderr[-2000:]}"
    return [int(line.split()[1]) for line in lines if line.startswith("DURABLE")]


def verify_after_crash(fast: Path, durable: Path, reported: list[int], keep_last: int) -> None:
    # straight after the kill, before any recovery: whatever is visible is complete and verifies
    check_durable_on_disk(durable)
    with BurstBuffer(fast, durable, keep_last=keep_last or None, serializer="pickle") as bb:
        ids = sorted(int(i.name[3:]) for i in bb.list() if i.name.startswith("ck-"))
        for i in reported:
            name = f"ck-{i:07d}"
            if keep_last and sum(1 for j in ids if j > i) >= keep_last - 1:
                continue  # retired by retention: newer checkpoints replaced it
            try:
                obj = bb.load(name)
            except CheckpointNotFoundError:
                # a drain the buffer resumed when it opened made a newer checkpoint durable since the
                # listing, and retention retired this one: only then may it be gone
                newer = [x for x in bb.list() if x.name.startswith("ck-") and int(x.name[3:]) > i]
                assert keep_last and len(newer) >= keep_last - 1, (name, [x.name for x in bb.list()])
                continue
            assert obj["i"] == i and consistent(obj), name
        if reported and not keep_last:  # with retention, "latest" competes with the ck-* names
            latest = bb.load("latest")
            assert consistent(latest) and latest["i"] >= max(reported)
        assert bb.wait(timeout=30)  # resumed drains finish
        assert {i.name for i in bb.list()} == {i.name for i in bb.list(verify=True)}
        # what the crash left behind is gone: no temporary files, no unreferenced data
        assert temp_files(durable) == [] and temp_files(fast) == []
        referenced = {json.loads(p.read_text())["data_file"] for p in manifests_in(durable)}
        assert set(data_files(durable)) == referenced, "orphaned data files were left behind"
        fast_referenced = {json.loads(p.read_text())["data_file"] for p in manifests_in(fast)}
        assert set(data_files(fast)) == fast_referenced
    check_durable_on_disk(durable)


@pytest.mark.parametrize("keep_last", [0, 3])
def test_sigkill_at_random_moments_never_exposes_a_partial_checkpoint(
    tmp_path: Path, keep_last: int, caplog: pytest.LogCaptureFixture
) -> None:
    """10 children per retention setting, each SIGKILLed at a random moment while saving and draining."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    fast, durable = dirs(tmp_path)
    rng = random.Random(20240 + keep_last)
    reported: list[int] = []
    with caplog.at_level(logging.INFO, logger="holoprof.checkpoint"):
        for k in range(10):
            delay = rng.uniform(0.0, 0.5)
            ids = run_child(script, fast, durable, (k + 1) * 100_000, k, keep_last, kill_after=delay)
            reported += ids
            verify_after_crash(fast, durable, reported if not keep_last else ids, keep_last)
    assert reported, "no child lived long enough to report a durable checkpoint"
    assert "resuming the drain" in caplog.text or "removing temporary file" in caplog.text


def test_sigkill_at_each_file_operation(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The child kills itself at the n-th os.replace / os.fsync / os.unlink: commit steps of save and drain."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    fast, durable = dirs(tmp_path)
    reported: list[int] = []
    with caplog.at_level(logging.INFO, logger="holoprof.checkpoint"):
        for k in range(15):
            reported += run_child(script, fast, durable, (k + 1) * 100_000, k, 0, kill_after=None)
            verify_after_crash(fast, durable, reported, 0)
    assert "resuming the drain" in caplog.text
    assert "removing temporary file" in caplog.text


# ------------------------------------------------------------------------------------------ 100 kills

ZYGOTE = textwrap.dedent(
    """
    import os, random, sys

    import torch

    torch.set_num_threads(1)
    from holoprof.checkpoint import BurstBuffer

    fast, durable = sys.argv[1], sys.argv[2]


    def state(i):
        g = torch.Generator().manual_seed(i)
        w = torch.randn(1_000 + (i * 7919) % 60_000, generator=g)
        return {"i": i, "w": w, "view": w[10:20], "b": torch.arange(i % 100), "meta": {"lr": 0.1 * i}}


    def child(fast, durable, start, seed, ready=True, count=None):
        rng = random.Random(seed)
        route = rng.choice(["fast", "fast", "durable", "auto"])
        bb = BurstBuffer(fast, durable, keep_last=4, fast_capacity_bytes=600_000,
                         snapshot_budget_bytes=800_000, route=route)
        if ready:
            os.write(1, b"ready\\n")
        i = start
        while count is None or i < start + count:
            s = state(i)
            bb.save(s, f"ck-{i:07d}")
            s["w"].fill_(float("nan"))  # the training changes its tensors as soon as save returns
            s["b"].zero_()
            if i % 4 == 3:
                bb.wait()
            i += 1
        return bb


    scratch = sys.argv[3]  # warm up (lazy imports, first calls) so that children start saving at once
    child(scratch + "/fast", scratch + "/durable", 0, 0, ready=False, count=8).close()

    for line in sys.stdin:  # one child per line, forked from this already-imported interpreter
        start, seed = map(int, line.split())
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.read(r, 1)  # our pid is announced first
                child(fast, durable, start, seed)
            finally:
                os._exit(1)
        print(pid, flush=True)
        os.write(w, b"x")
        os.close(r)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        print(status, flush=True)
    """
)


def expected_state(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(i)
    w = torch.randn(1_000 + (i * 7919) % 60_000, generator=g)
    return {"i": i, "w": w, "view": w[10:20], "b": torch.arange(i % 100), "meta": {"lr": 0.1 * i}}


def test_100_sigkills_at_random_moments_leave_only_complete_checkpoints_equal_to_the_saved_state(
    tmp_path: Path,
) -> None:
    """A child saves small torch states in a loop (snapshot, write, drain, retention) and changes its
    tensors right after each save; it is SIGKILLed at a random moment, 100 times. After each kill a
    new BurstBuffer lists checkpoints: every one loads and equals the state at its save.

    The count, 100 (13 kills while the child opens the directories and recovers what the last kill
    left, 87 at random delays while it saves): the property is checked after each kill on its own, so
    the count buys more random moments, not a different check; 100 keeps many moments of each stage
    at half the time of 200. More than 50 distinct checkpoints must become durable over the kills,
    or the kills came too early to test much."""
    script = tmp_path / "zygote.py"
    script.write_text(ZYGOTE)
    fast, durable = dirs(tmp_path)
    stderr_path = tmp_path / "zygote.err"
    rng = random.Random(2026)
    seen: set[int] = set()
    with open(stderr_path, "w") as err:
        zygote = subprocess.Popen(
            [sys.executable, str(script), str(fast), str(durable), str(tmp_path / "warm-up")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert zygote.stdin is not None and zygote.stdout is not None
    try:
        for k in range(100):
            zygote.stdin.write(f"{(k + 1) * 1000} {k}\n")
            zygote.stdin.flush()
            pid = int(zygote.stdout.readline() or -1)
            assert pid > 0, stderr_path.read_text()[-3000:]
            if k % 8 == 0:  # while it opens the directories and recovers what the last kill left
                time.sleep(rng.uniform(0.0, 0.01))
            else:  # while it saves
                assert zygote.stdout.readline() == "ready\n", stderr_path.read_text()[-3000:]
                time.sleep(rng.uniform(0.0, 0.08))
            os.kill(pid, 9)
            line = zygote.stdout.readline()
            status = int(zygote.stdout.readline() if line == "ready\n" else line or -1)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, (
                f"kill {k}: the child ended by itself (status {status}): {stderr_path.read_text()[-3000:]}"
            )
            check_durable_on_disk(durable)  # before any recovery: what is visible is complete
            with BurstBuffer(fast, durable, keep_last=4) as bb:
                assert bb.wait(timeout=30)  # drains that the kill interrupted finish
                listed = bb.list()
                for info in listed:
                    i = int(info.name[3:])
                    got, want = bb.load(info.name), expected_state(i)
                    assert got["i"] == i and got["meta"] == want["meta"], info.name
                    for key in ("w", "view", "b"):
                        assert torch.equal(got[key], want[key]), f"kill {k}: {info.name}[{key}] differs"
                    assert got["view"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()
                    seen.add(i)
                assert {i.name for i in listed} == {i.name for i in bb.list(verify=True)}
            assert temp_files(durable) == [] and temp_files(fast) == []
    finally:
        zygote.stdin.close()
        zygote.kill()
        zygote.wait()
    assert len(seen) > 50, f"only {len(seen)} checkpoints ever became durable: the kills came too early"


# ------------------------------------------------------------------------------------------ traced


def test_traced_run_reports_blocking_and_background_time_of_each_save(tmp_path: Path) -> None:
    """``holoprof run`` on a loop that saves with a BurstBuffer: the report's checkpoint section has
    one item per save, whose blocking time is the one SaveResult told the job."""
    script = Path(__file__).parent / "ckpt_scripts" / "burst_loop.py"
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "holoprof.cli", "run", "--no-report", "--out", str(run_dir), "--",
         str(script), str(tmp_path / "fast"), str(tmp_path / "durable"), "12", "3"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    told = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULTS "))[8:])
    report = subprocess.run(
        [sys.executable, "-m", "holoprof.cli", "report", str(run_dir), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr[-3000:]
    section = json.loads(report.stdout)["checkpoints"]
    items = [i for i in section["items"] if i["api"] == "holoprof.BurstBuffer.save"]
    assert len(items) == len(told) == 4
    assert not [i for i in section["items"] if i["api"].startswith("torch.")], (
        "the background write was counted twice"
    )
    for item, r in zip(items, told, strict=True):
        assert item["blocking"] is True
        assert item["blocking_s"] == pytest.approx(r["blocking_s"], abs=2e-6)
        assert item["background_s"] > 0  # the write to the fast tier and the drain
        assert item["bytes"] == r["size_bytes"]
        assert item["path"].endswith(".ckpt") and str(tmp_path / "durable") in item["path"]
    assert section["blocking_s"] == pytest.approx(sum(r["blocking_s"] for r in told), abs=1e-5)
    assert section["background_s"] == pytest.approx(sum(i["background_s"] for i in items), abs=1e-5)


# ------------------------------------------------------------------------------------------ integrations


def test_lightning_checkpoints_through_the_burst_buffer_and_resume(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from holoprof.checkpoint.lightning import BurstBufferCheckpointIO

    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))

    def loader() -> Any:
        return torch.utils.data.DataLoader(data, batch_size=8, num_workers=0)

    def trainer(epochs: int, bb: BurstBuffer) -> Any:
        return pl.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path / "root"),
            callbacks=[pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpts"), save_top_k=1)],
            plugins=[BurstBufferCheckpointIO(bb)],
        )

    fast, durable = dirs(tmp_path)
    model = Tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about DataLoader workers and the like
        with BurstBuffer(fast, durable) as bb:
            trainer(2, bb).fit(model, loader())
            names = [i.name for i in bb.list()]
            assert names == ["epoch=1-step=8.ckpt"]  # save_top_k=1: the epoch-0 one was removed
            assert not (tmp_path / "ckpts").exists() or not any((tmp_path / "ckpts").iterdir())
            saved = bb.load(names[0])
        assert all(torch.equal(saved["state_dict"][k], v) for k, v in model.state_dict().items())
        resumed = Tiny()
        with BurstBuffer(fast, durable) as bb:
            t = trainer(3, bb)
            t.fit(resumed, loader(), ckpt_path=str(tmp_path / "ckpts" / names[0]))
            assert t.global_step == 12  # 8 steps restored, 4 more
            assert bb.list()[-1].name == "epoch=2-step=12.ckpt"


def test_distributed_checkpoint_state_dicts_save_per_rank(tmp_path: Path) -> None:
    """The documented recipe for torch.distributed.checkpoint users: get_state_dict per rank, save it
    through the buffer, set_state_dict after loading."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    fast, durable = dirs(tmp_path)
    model, opt = model_and_optimizer()
    rank = 0
    with BurstBuffer(fast, durable) as bb:
        model_sd, optim_sd = get_state_dict(model, opt)
        bb.save({"model": model_sd, "optim": optim_sd}, f"step-00000001-rank{rank:05d}")
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        model(torch.randn(4, 32)).sum().backward()
        opt.step()  # training goes on
    fresh, fresh_opt = model_and_optimizer()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    with BurstBuffer(tmp_path / "other-fast", durable) as bb:
        state = bb.load(f"step-00000001-rank{rank:05d}")
        set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in expected.items())


def test_hugging_face_trainer_callback_recipe(tmp_path: Path) -> None:
    """The callback of docs/checkpoint.md, with the Trainer's own checkpoints turned off."""
    transformers = pytest.importorskip("transformers")

    class BurstBufferCallback(transformers.TrainerCallback):  # type: ignore[misc,name-defined]
        def __init__(self, bb: BurstBuffer, every: int) -> None:
            self.bb, self.every = bb, every

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, lr_scheduler: Any = None, **kw: Any) -> None:  # fmt: skip
            if state.global_step % self.every == 0:
                self.bb.save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": lr_scheduler.state_dict(), "global_step": state.global_step},
                    f"step-{state.global_step:08d}",
                )  # fmt: skip

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.bb.wait()

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    model = transformers.BertForSequenceClassification(config)
    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.tensor(i % 2)} for i in range(8)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), save_strategy="no", max_steps=4, per_device_train_batch_size=2,
        report_to=[], logging_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    fast, durable = dirs(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with BurstBuffer(fast, durable) as bb:
            trainer = transformers.Trainer(
                model=model, args=args, train_dataset=data, callbacks=[BurstBufferCallback(bb, every=2)]
            )
            trainer.train()
            assert [i.name for i in bb.list()] == ["step-00000002", "step-00000004"]
            last = bb.load("step-00000004")
    assert last["global_step"] == 4
    assert all(torch.equal(last["model"][k], v) for k, v in model.state_dict().items())
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("checkpoint-*"))
