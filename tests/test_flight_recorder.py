"""torch's flight recorder as the hang watchdog reads it (holoprof.collect.flight_recorder).

The end-to-end check is in tests/test_hang.py (a real 2-rank gloo hang: the recorder names the
all_reduce the waiting rank is in, as holoprof's ring does). Here: the buffer size a job gets, a
real dump of a one-rank gloo group in a fresh process, and a dump that fails or never returns.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from conftest import job_env
from holoprof.collect.flight_recorder import SMALL_BUFFER, FlightRecorder, buffer_setting, summarize


def test_the_users_buffer_size_is_kept_and_an_old_torch_gets_a_small_one() -> None:
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    assert buffer_setting(env, "2.13.0+cpu") == {
        "buffer": 0, "set_by": "user", "variable": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    }  # fmt: skip
    assert env == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    env = {"TORCH_FR_BUFFER_SIZE": "64", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}  # the newer name wins
    assert buffer_setting(env, "2.13.0")["buffer"] == 64
    env = {}
    assert buffer_setting(env, "2.13.0+cu128") == {"buffer": 2000, "set_by": "torch"} and env == {}
    assert buffer_setting(env, "2.4.1") == {
        "buffer": SMALL_BUFFER, "set_by": "holoprof", "variable": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    }  # fmt: skip
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == str(SMALL_BUFFER)
    assert buffer_setting(env, "2.4.1")["set_by"] == "holoprof"  # in a child process: still holoprof's
    env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "1000"  # changed since: the user's
    assert buffer_setting(env, "2.4.1")["set_by"] == "user"


DUMP_JOB = """
import json, os, tempfile, torch, torch.distributed as dist
from holoprof.collect.flight_recorder import FlightRecorder, buffer_setting
out = {"before": FlightRecorder(buffer_setting(dict(os.environ), torch.__version__)).summary(None)}
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
for _ in range(3):
    dist.all_reduce(torch.ones(2, 3))
dist.broadcast(torch.ones(5), 0)
out["default"] = FlightRecorder(buffer_setting(dict(os.environ), torch.__version__)).summary(["0", 4, "broadcast"])
out["off"] = FlightRecorder(buffer_setting({"TORCH_FR_BUFFER_SIZE": "0"}, torch.__version__)).summary(None)
dist.destroy_process_group()
print(json.dumps(out))
"""


def test_a_real_dump_of_a_gloo_group(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DUMP_JOB], cwd=tmp_path, env=job_env(), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"]["unavailable"] == "no torch.distributed process group"
    d = out["default"]
    assert d["entries"] == 4 and d["backend"] == "gloo" and d["set_by"] == "torch", d
    assert d["last_completed"] == {"op": "broadcast", "seq": 4, "pg": "0"} and d["in_flight"] == []
    # the ring says it waits in broadcast #4 but the recorder has it completed: they disagree, and say so
    assert d["matches_ring"] is False and d["ring"] == {"op": "broadcast", "seq": 4, "pg": "0"}
    assert out["off"]["unavailable"] == "turned off (TORCH_FR_BUFFER_SIZE = 0)"


def _fake_torch(monkeypatch: pytest.MonkeyPatch, dump: Any) -> None:
    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setitem(
        sys.modules, "torch._C._distributed_c10d", types.SimpleNamespace(_dump_fr_trace_json=dump)
    )


def test_a_dump_that_never_returns_or_fails_is_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def stuck(*_: Any) -> bytes:
        release.wait()
        return b'{"entries": []}'

    _fake_torch(monkeypatch, stuck)
    fr = FlightRecorder({"buffer": 2000, "set_by": "torch"})
    first = fr.summary(None, timeout_s=0.2)
    assert first == {
        "unavailable": "the dump did not return within 0.2 s", "buffer": 2000, "set_by": "torch", "failures": 1,
    }  # fmt: skip
    # while it has not returned, no second dump is started
    assert fr.summary(None, timeout_s=0.2)["unavailable"] == "an earlier dump has not returned"
    release.set()
    assert fr._pending is not None
    fr._pending.join()
    again = fr.summary(None, timeout_s=5)
    assert again["entries"] == 0 and again["failures"] == 2

    def broken(*_: Any) -> bytes:
        raise RuntimeError("no recorder")

    _fake_torch(monkeypatch, broken)
    assert fr.summary(None)["unavailable"] == "the dump failed (RuntimeError: no recorder)"
    assert fr.failures == 3


def test_nccl_entries_in_flight_and_their_names() -> None:
    """An NCCL dump's entries as torch writes them: a completed one, one started, a p2p one."""
    clock = iter(range(1, 100))

    def entry(seq: int, name: str, state: str, retired: bool, p2p: bool = False) -> dict[str, Any]:
        return {
            "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0, "is_p2p": p2p,
            "profiling_name": name, "process_group": ["3", "tp"], "state": state, "retired": retired,
            "input_sizes": [[1024]] * 6, "time_created_ns": next(clock),
        }  # fmt: skip

    entries = [
        entry(7, "nccl:all_reduce", "completed", True),
        entry(8, "nccl:_allgather_base", "started", False),
        entry(1, "nccl:send 0->1", "scheduled", False, p2p=True),
    ]
    s = summarize(entries, ["3", 8, "all_gather_into_tensor"])
    assert s["last_completed"] == {"op": "all_reduce", "seq": 7, "pg": "3"}
    assert s["in_flight"][0] == {
        "op": "_allgather_base", "seq": 8, "pg": "3", "state": "started", "input_sizes": [[1024]] * 4,
    }  # fmt: skip
    assert s["in_flight"][1]["p2p"] is True and s["in_flight"][1]["op"] == "send 0->1"
    assert s["matches_ring"] is True and s["backend"] == "nccl"
    # DDP's construction runs 3 collectives from C++ that the ring does not see: numbered 3 apart
    off = summarize(entries, ["3", 5, "all_gather_into_tensor"])
    assert off["matches_ring"] is False and off["seq_offset"] == 3
    assert off["ring"] == {"op": "all_gather_into_tensor", "seq": 5, "pg": "3"}
    assert "seq_offset" not in summarize(entries, ["3", 5, "broadcast"])
