"""The Python I/O layer against strace: per-file opens, reads and bytes of a real DataLoader job.

The same workload runs twice: traced by ``holoprof run --io-layer python`` and untraced under
``strace -f -y`` (the reference). Files read by DataLoader workers (fork) through Python file objects
must match strace exactly; files read by numpy in C (``np.fromfile``, ``np.load``) match on opens and
bytes of data.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import job_env, run_holoprof

STRACE = shutil.which("strace") or "/usr/bin/strace"
ODD_NAME = "odd name é ü #1.bin"
N_SMALL = 24

WORKLOAD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    root = sys.argv[1]
    small = sorted(os.path.join(root, "small", n) for n in os.listdir(os.path.join(root, "small")))

    class Files(Dataset):
        def __len__(self):
            return len(small)

        def __getitem__(self, i):
            with open(small[i], "rb") as f:
                return torch.tensor(len(f.read()))

    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Files(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    for x in loader:
        model(x.float().view(-1, 1)).sum().backward()
        opt.step()
        opt.zero_grad()
    a = np.fromfile(os.path.join(root, "np", "b.raw"), dtype=np.uint8)
    b = np.load(os.path.join(root, "np", "a.npy"))
    with open(os.path.join(root, "blocks.bin"), "rb") as f:
        while f.read(1 << 16):
            pass
    """
)


def _make_data(root: Path) -> dict[str, int]:
    (root / "small").mkdir(parents=True)
    (root / "np").mkdir()
    sizes = {}
    for i in range(N_SMALL):
        p = root / "small" / f"s{i:03d}.bin"
        p.write_bytes(os.urandom(1000 + 37 * i))
        sizes[str(p)] = p.stat().st_size
    odd = root / "small" / ODD_NAME
    odd.write_bytes(os.urandom(3000))
    sizes[str(odd)] = 3000
    np.save(root / "np" / "a.npy", np.arange(100_000, dtype=np.float32))
    np.arange(300_000, dtype=np.uint8).tofile(root / "np" / "b.raw")
    (root / "blocks.bin").write_bytes(os.urandom(5 * (1 << 16) + 123))
    for rel in ("np/a.npy", "np/b.raw", "blocks.bin"):
        sizes[str(root / rel)] = (root / rel).stat().st_size
    return sizes


def _last_counters(run_dir: str) -> dict[str, dict[str, Any]]:
    """Per path: counters summed over processes (last snapshot per process)."""
    import holoprof

    run = holoprof.load(run_dir)
    out: dict[str, dict[str, Any]] = {}
    rows = run.rows(
        "SELECT path, module, arg_max(counters, ts_ns), any_value(layer) FROM io_files "
        "GROUP BY host, pid, module, path"
    )
    for path, module, counters, layer in rows:
        c = json.loads(counters)
        d = out.setdefault(path, {"opens": 0, "reads": 0, "bytes": 0, "layer": layer, "c": []})
        d["opens"] += c.get(f"{module}_OPENS", 0)
        d["reads"] += c.get(f"{module}_READS", 0)
        d["bytes"] += c.get(f"{module}_BYTES_READ", 0)
        d["c"].append(c)
    return out


_OPEN = re.compile(r"^openat\(.*\)\s+=\s+\d+<(?P<path>.*)>$")
_READ = re.compile(r"^(?:read|pread64)\(\d+<(?P<path>[^>]*)>,.*\)\s+=\s+(?P<n>\d+)$")


def _strace_counts(prefix: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"opens": 0, "reads": 0, "bytes": 0})
    folder = os.path.dirname(prefix)
    for name in os.listdir(folder):
        if not name.startswith(os.path.basename(prefix) + "."):
            continue
        with open(os.path.join(folder, name), errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                m = _OPEN.match(line)
                if m:
                    out[m["path"]]["opens"] += 1
                    continue
                m = _READ.match(line)
                if m:
                    d = out[m["path"]]
                    d["reads"] += 1
                    d["bytes"] += int(m["n"])
    return out


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not os.path.exists(STRACE):
        pytest.skip("strace is not installed")
    root = tmp_path_factory.mktemp("iopy")
    data = root / "data"
    sizes = _make_data(data)
    script = root / "workload.py"
    script.write_text(WORKLOAD)
    run_dir = root / "run"
    proc = run_holoprof(
        "run",
        "--out",
        str(run_dir),
        "--io-layer",
        "python",
        "--io-trace",
        "--no-report",
        "--",
        str(script),
        str(data),
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    prefix = str(root / "strace" / "st")
    os.makedirs(os.path.dirname(prefix))
    ref = subprocess.run(
        [
            STRACE,
            "-f",
            "-ff",
            "-y",
            "-qq",
            "-e",
            "trace=openat,read,pread64",
            "-o",
            prefix,
            sys.executable,
            str(script),
            str(data),
        ],
        cwd=root,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if ref.returncode != 0 and "ptrace" in ref.stderr:
        pytest.skip(f"strace cannot trace here: {ref.stderr.strip()[:200]}")
    assert ref.returncode == 0, ref.stderr[-2000:]
    return {
        "run": str(run_dir),
        "data": data,
        "sizes": sizes,
        "ours": _last_counters(str(run_dir)),
        "strace": _strace_counts(prefix),
    }


def test_dataloader_files_match_strace(traced: dict[str, Any]) -> None:
    ours, ref, sizes = traced["ours"], traced["strace"], traced["sizes"]
    small = [p for p in sizes if "/small/" in p and p.isascii()]
    assert len(small) == N_SMALL
    for p in [*small, str(traced["data"] / "blocks.bin")]:
        assert p in ours, f"{p} missing from io_files"
        assert ours[p]["layer"] == "python"
        assert ours[p]["bytes"] == sizes[p] == ref[p]["bytes"], p
        assert ours[p]["opens"] == ref[p]["opens"] == 1, p
        assert ours[p]["reads"] == ref[p]["reads"], (p, ours[p]["reads"], ref[p]["reads"])


def test_numpy_files_opens_and_data_bytes(traced: dict[str, Any]) -> None:
    ours, ref, sizes = traced["ours"], traced["strace"], traced["sizes"]
    raw = str(traced["data"] / "np" / "b.raw")
    npy = str(traced["data"] / "np" / "a.npy")
    assert ours[raw]["opens"] == ref[raw]["opens"] == 1
    assert ours[raw]["bytes"] == sizes[raw]  # the array numpy read, all of the file
    assert sizes[raw] <= ref[raw]["bytes"]  # glibc re-reads the block it seeks into
    assert ours[npy]["opens"] == ref[npy]["opens"] == 1
    assert sizes[npy] <= ours[npy]["bytes"] <= ref[npy]["bytes"]
    assert 1 <= ours[npy]["reads"] <= ref[npy]["reads"]


def test_sequential_block_reads_are_counted_as_darshan_does(traced: dict[str, Any]) -> None:
    c = traced["ours"][str(traced["data"] / "blocks.bin")]["c"][0]
    size = traced["sizes"][str(traced["data"] / "blocks.bin")]
    assert c["POSIX_MAX_BYTE_READ"] == size - 1
    # 64 KiB reads: 5 full blocks, the tail, and two reads at the end of the file (0 bytes: one
    # ends the short read of the tail, one ends the loop), as strace sees them
    assert c["POSIX_SIZE_READ_10K_100K"] == 5
    assert c["POSIX_SIZE_READ_100_1K"] == 1
    assert c["POSIX_SIZE_READ_0_100"] == 2
    # Darshan: the first read at offset 0 is neither consecutive nor sequential
    assert c["POSIX_CONSEC_READS"] == c["POSIX_READS"] - 1
    assert c["POSIX_F_READ_TIME"] > 0
    assert (
        c["POSIX_F_OPEN_START_TIMESTAMP"]
        <= c["POSIX_F_READ_START_TIMESTAMP"]
        <= c["POSIX_F_CLOSE_END_TIMESTAMP"]
    )


def test_odd_file_names_and_workers_attributed(traced: dict[str, Any]) -> None:
    import holoprof

    odd = str(traced["data"] / "small" / ODD_NAME)
    assert traced["ours"][odd]["bytes"] == 3000
    run = holoprof.load(traced["run"])
    roles = dict(
        run.rows(
            """SELECT p.role, count(DISTINCT f.path) FROM io_files f JOIN processes p USING (host, pid)
               WHERE f.path LIKE '%/small/%' GROUP BY p.role"""
        )
    )
    assert roles == {"dataloader_worker": N_SMALL + 1}
    info = run.rows("SELECT info FROM processes WHERE role = 'main'")[0][0]
    assert json.loads(info)["io_layer"] == "python"
    # the interpreter's own files and the run directory are left out
    paths = [p for (p,) in run.rows("SELECT DISTINCT path FROM io_files")]
    assert not [
        p for p in paths if p.startswith(sys.prefix) or p.startswith(traced["run"]) or p.endswith(".pyc")
    ]


def test_in_process_counters_and_uninstall(tmp_path: Path) -> None:
    import builtins
    import mmap

    from holoprof.agent.core import Agent
    from holoprof.collect.io_collector import IoCollector

    orig_open, orig_read = builtins.open, os.read
    agent = Agent(
        str(tmp_path / "run"), options={"io_layer": "python", "io_exclude": [str(tmp_path / "skip")]}
    )
    col = IoCollector(agent)
    agent.collectors = [col]
    col.install()
    try:
        p = tmp_path / "f.bin"
        with open(p, "wb") as f:
            f.write(b"a" * 5000)
        fd = os.open(p, os.O_RDWR)
        os.pread(fd, 100, 1000)
        os.lseek(fd, 200, os.SEEK_SET)
        os.read(fd, 50)
        os.read(fd, 50)
        os.write(fd, b"zz")
        os.fstat(fd)
        os.fsync(fd)
        m = mmap.mmap(fd, 0)
        m.close()
        os.close(fd)
        os.stat(p)
        (tmp_path / "skip").mkdir()
        with open(tmp_path / "skip" / "x", "w") as f:
            f.write("not counted")
        with open(p) as f:  # text mode
            assert len(f.read()) == 5000
        polled = col.poll()
        assert polled, agent.errors
        rows = {
            r[0]: json.loads(r[1]) for r in zip(*(polled[0][1][k] for k in ("path", "counters")), strict=True)
        }
    finally:
        col.uninstall()
    assert builtins.open is orig_open and os.read is orig_read
    c = rows[str(p)]
    assert not any("skip" in k for k in rows)
    assert c["POSIX_OPENS"] == 3
    assert c["POSIX_WRITES"] == 2 and c["POSIX_BYTES_WRITTEN"] == 5002
    assert (
        c["POSIX_SEEKS"] == 1 and c["POSIX_STATS"] == 2 and c["POSIX_FSYNCS"] == 1 and c["POSIX_MMAPS"] == 1
    )
    # pread(100 @1000), read(50 @200), read(50 @250), then the text read: 5000 bytes + the EOF read
    assert c["POSIX_READS"] == 5
    assert c["POSIX_BYTES_READ"] == 100 + 50 + 50 + 5000
    assert c["POSIX_CONSEC_READS"] == 2  # read @250 after read @200, the EOF read after the text read
    assert c["POSIX_RW_SWITCHES"] == 3  # write -> pread, read -> os.write, os.write -> text read
    assert c["POSIX_MAX_BYTE_WRITTEN"] == 4999  # "zz" went to offset 300


def test_io_trace_for_the_whole_run(traced: dict[str, Any]) -> None:
    import holoprof

    run = holoprof.load(traced["run"])
    small = str(traced["data"] / "small" / "s003.bin")
    ops = run.rows(
        'SELECT op, "offset", size_bytes, end_ns >= start_ns FROM io_ops WHERE path = ? ORDER BY start_ns',
        [small],
    )
    assert [o[0] for o in ops] == ["open", "read", "read", "close"]
    assert ops[1][1:] == (0, traced["sizes"][small], True)
    assert ops[2][1:3] == (traced["sizes"][small], 0)  # the read at the end of the file
    total = run.rows("SELECT sum(size_bytes) FROM io_ops WHERE op = 'read' AND path LIKE '%/small/%'")[0][0]
    assert total == sum(v for k, v in traced["sizes"].items() if "/small/" in k)


def test_on_demand_trace_window(tmp_path: Path) -> None:
    import time

    from holoprof.agent.core import Agent
    from holoprof.collect.io_collector import IoCollector, io_trace_action

    agent = Agent(str(tmp_path / "run"), options={"io_layer": "python"})
    col = IoCollector(agent)
    agent.collectors = [col]
    col.install()
    try:
        for bad in (0, 601, "5", True):
            with pytest.raises(ValueError, match="seconds"):
                io_trace_action(agent, {"params": {"seconds": bad}})
        p = tmp_path / "x.bin"
        p.write_bytes(b"0" * 10_000)  # before the window: counted, not traced
        info = io_trace_action(agent, {"params": {"seconds": 1}})
        assert info["layer"] == "python" and info["seconds"] == 1
        with open(p, "rb", buffering=0) as f:
            f.read(4000)
            f.read(4000)
        first = dict(col.poll())
        ops = first["io_ops"]
        assert [
            (o, off, n) for o, off, n in zip(ops["op"], ops["offset"], ops["size_bytes"], strict=True)
        ] == [
            ("open", -1, 0),
            ("read", 0, 4000),
            ("read", 4000, 4000),
            ("close", -1, 0),
        ]
        time.sleep(1.1)
        assert "io_ops" not in dict(col.poll())  # the window is over: tracing stopped
        assert not col.tracing
        with open(p, "rb") as f:
            f.read()
        assert "io_ops" not in dict(col.poll())
    finally:
        col.uninstall()


def test_native_layer_is_used_when_preloaded(traced: dict[str, Any], tmp_path: Path) -> None:
    """With the native library preloaded, the agent reads its counters (and they agree with strace)."""
    from holoprof.collect import io_native

    lib = io_native.library_path()
    if lib is None:
        pytest.skip("the native I/O library is not built")
    script = Path(traced["run"]).parent / "workload.py"
    run_dir = tmp_path / "run"
    proc = run_holoprof(
        "run", "--out", str(run_dir), "--no-report", "--", str(script), str(traced["data"]),
        cwd=tmp_path, env={"LD_PRELOAD": lib},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ours, ref = _last_counters(str(run_dir)), traced["strace"]
    small = [p for p in traced["sizes"] if "/small/" in p and p.isascii()]
    for p in small:
        assert ours[p]["layer"] == "native"
        assert (ours[p]["opens"], ours[p]["reads"], ours[p]["bytes"]) == (
            ref[p]["opens"],
            ref[p]["reads"],
            ref[p]["bytes"],
        ), p


def test_io_trace_job_reports_through_the_control_mailbox(tmp_path: Path) -> None:
    import time

    from holoprof.agent.core import Agent
    from holoprof.collect.control import ControlCollector, Job
    from holoprof.collect.io_collector import IoCollector, io_trace_job
    from holoprof.store.mailbox import request_states

    agent = Agent(str(tmp_path / "run"), options={"io_layer": "python"})
    col = IoCollector(agent)
    ctl = ControlCollector(agent)
    agent.collectors = [col]
    col.install()
    try:
        job = Job(ctl, "req1", "io-trace", {"seconds": 1}, time.time_ns())
        io_trace_job(job)
        assert job.state == "running"
        with open(tmp_path / "y.bin", "wb") as f:
            f.write(b"1" * 100)
        ops = dict(col.poll())["io_ops"]
        mine = [o for o, p in zip(ops["op"], ops["path"], strict=True) if p.endswith("y.bin")]
        assert mine == ["open", "write", "close"]
        time.sleep(1.1)
        col.poll()
        assert job.state == "done"
        states = request_states(str(tmp_path / "run"), "req1")
        assert [s["state"] for s in states] == ["done"]
        assert states[0]["info"]["layer"] == "python"
    finally:
        col.uninstall()


def test_a_failing_collector_is_switched_off_and_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    from holoprof.agent.core import Agent
    from holoprof.collect.io_collector import IoCollector

    monkeypatch.setenv("HOLOPROF_FAULT_INJECT", "io")
    orig = (builtins.open, os.read, os.stat)
    agent = Agent(str(tmp_path / "run"), options={"io_layer": "python"})
    col = IoCollector(agent)
    agent.collectors = [col]
    try:
        col.install()
    except RuntimeError as exc:
        agent.fail(col, exc)  # what Agent.start does with a collector that raises
    assert not col.enabled
    assert (builtins.open, os.read, os.stat) == orig
    assert agent.errors and agent.errors[0].startswith("io: FaultInjected")
    assert col.poll() == []


GC_PROBE = textwrap.dedent(
    """
    import gc, json, sys
    if sys.argv[1] == "off":
        gc.disable()
    full = gc.get_stats()[2]["collections"]
    import torch
    print(json.dumps({"count": gc.get_count(), "full": gc.get_stats()[2]["collections"] - full}))
    """
)


@pytest.mark.parametrize("gc_state", ["on", "off"])
def test_gc_clock_restarts_after_import_torch(tmp_path: Path, gc_state: str) -> None:
    """The agent's start-up allocations must not pull the job's first full collection forward: a
    traced job leaves ``import torch`` with the collector's counts at zero, and a job that switched
    the collector off keeps it off (no collection at all)."""
    script = tmp_path / "probe.py"
    script.write_text(GC_PROBE)
    proc = run_holoprof(
        "run", "--no-report", "--out", str(tmp_path / "run"), "--", str(script), gc_state, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if gc_state == "on":
        assert got["full"] >= 1, got
        # counted from zero again; the agent's writer thread may have flushed since (its allocations:
        # one young collection at most, seen once in a fully loaded run)
        assert got["count"][2] == 0 and got["count"][1] <= 1 and got["count"][0] < 700, got
    else:
        assert got["full"] == 0 and got["count"][0] > 10_000, got  # torch's objects, never collected
