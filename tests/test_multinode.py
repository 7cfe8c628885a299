"""Many nodes, one run: launchers on several hosts join one run directory, and the hosts' clocks are
aligned.

Hosts are made on this machine: each "host" is a network namespace (``ip netns``) with its own
hostname (``unshare --uts``), joined to the other by a veth pair; torchrun ``--nnodes 2`` runs over
gloo between them, and the run directory is one both see (the shared file system). One host's clock
is 0.5 s ahead: its whole process tree runs under libfaketime (``LD_PRELOAD``, ``FAKETIME=+0.5s``),
so every time it records — launcher, ranks — is 0.5 s late, as on a node whose clock is off.

Needs root (namespaces), ``ip`` (iproute2), ``unshare`` and libfaketime (``make tools`` installs the
``faketime`` package when it is missing and we are root); the tests skip, saying which, otherwise.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import holoprof
from conftest import HOLOPROF, error_lines, free_port, job_env, read_until, report_json, run_holoprof

DDP_SCRIPT = str(Path(__file__).resolve().parent / "dist_scripts" / "ddp_train.py")
STEPS = 6
SKEW_S = 0.5
FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def _faketime_lib() -> str | None:
    return next((p for p in FAKETIME_LIBS if os.path.exists(p)), None)


def _missing(netns: bool) -> str | None:
    """Why these hosts cannot be made here, or None."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "needs root on Linux (network and UTS namespaces)"
    tools = ["unshare", *(["ip"] if netns else [])]
    for tool in tools:
        if shutil.which(tool) is None:
            return f"needs `{tool}` (util-linux / iproute2)"
    if _faketime_lib() is None:
        return "needs libfaketime for a host whose clock is off (apt-get install faketime, or `make tools` as root)"
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return f"cannot make a UTS namespace here ({probe.stderr.decode(errors='replace').strip()})"
    return None


def _skewed(argv: list[str]) -> list[str]:
    """``argv`` run with its clock (and its children's) ``SKEW_S`` ahead."""
    return [
        "env",
        f"LD_PRELOAD={_faketime_lib()}",
        f"FAKETIME=+{SKEW_S}s",
        "NO_FAKE_STAT=1",  # file times as the file system gives them (the clock probes read them)
        *argv,
    ]


def _on_host(hostname: str, argv: list[str], netns: str | None = None) -> list[str]:
    """``argv`` run as host ``hostname`` (its own UTS namespace), in network namespace ``netns``."""
    cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


@dataclass
class Net:
    """Two network namespaces joined by a veth pair: (namespace, interface, address) per host."""

    a: tuple[str, str, str]
    b: tuple[str, str, str]


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    why = _missing(netns=True)
    if why:
        pytest.skip(why)
    tag = f"hp{os.getpid() % 100000}"
    a = (f"{tag}a", f"{tag}a", "10.213.7.1")
    b = (f"{tag}b", f"{tag}b", "10.213.7.2")

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    try:
        ip("netns", "add", a[0])
        ip("netns", "add", b[0])
        ip("link", "add", a[1], "type", "veth", "peer", "name", b[1])
        for ns, dev, addr in (a, b):
            ip("link", "set", dev, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        for ns in (a[0], b[0]):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        pytest.skip(f"cannot make network namespaces here ({exc.stderr.decode(errors='replace').strip()})")
    try:
        yield Net(a, b)
    finally:
        for ns in (a[0], b[0]):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@dataclass
class TwoHosts:
    run: Path
    procs: dict[str, subprocess.CompletedProcess[str]]
    refused: subprocess.CompletedProcess[str]


def _torchrun(net: Net, node_rank: int) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
        "--node-rank", str(node_rank), "--master-addr", net.a[2], "--master-port", "29533",
        "--max-restarts", "0", DDP_SCRIPT,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def two_hosts(net: Net, tmp_path_factory: pytest.TempPathFactory) -> TwoHosts:
    """nodeA and nodeB (clock 0.5 s ahead) × 2 ranks, DDP with a loss all_reduce per step, each node's
    launcher with --join; while they run, a third launcher without --join tries the same --out."""
    tmp = tmp_path_factory.mktemp("multinode")
    run = tmp / "run"
    env = {"DDP_SYNC_ALLREDUCE": "1", "DDP_STEPS": str(STEPS), "DDP_TIMEOUT_S": "120"}
    started = {}
    for name, (ns, dev, _), rank in (("nodeA", net.a, 0), ("nodeB", net.b, 1)):
        argv = [*HOLOPROF, "run", "--out", str(run), "--join", "--no-report", "--", *_torchrun(net, rank)]
        argv = _skewed(argv) if name == "nodeB" else argv
        started[name] = subprocess.Popen(
            _on_host(name, argv, ns),
            cwd=tmp,
            env=job_env({**env, "GLOO_SOCKET_IFNAME": dev}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        err = {
            n: read_until(p.stderr.fileno(), "holoprof: tracing into", timeout=120)
            for n, p in started.items()
        }  # type: ignore[union-attr]
        refused = run_holoprof("run", "--out", str(run), "--", *_torchrun(net, 1), cwd=tmp)
        procs = {}
        for n, p in started.items():
            out, rest = p.communicate(timeout=300)
            procs[n] = subprocess.CompletedProcess(p.args, p.returncode, out, err[n] + rest)
    finally:
        for p in started.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for n, cp in procs.items():
        assert cp.returncode == 0, f"{n}: {cp.stdout}\n{cp.stderr}"
    return TwoHosts(run, procs, refused)


def test_two_hosts_give_one_run_with_every_rank(two_hosts: TwoHosts) -> None:
    said = {n: cp.stderr for n, cp in two_hosts.procs.items()}
    assert sum("(created as host" in s for s in said.values()) == 1, said
    assert sum("(joined as host" in s for s in said.values()) == 1, said
    doc = report_json(two_hosts.run)
    run = doc["run"]
    assert run["status"] == "finished" and run["exit_code"] == 0
    assert run["hosts"] == ["nodeA", "nodeB"] and run["ranks"] == 4 and run["dead_hosts"] == []
    per_rank = {r["rank"]: r for r in doc["steps"]["per_rank"]}
    assert sorted(per_rank) == [0, 1, 2, 3]
    assert {r: p["host"] for r, p in per_rank.items()} == {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
    assert all(p["count"] == STEPS for p in per_rank.values()), per_rank
    clocks = {c["host"]: c for c in run["host_clocks"]}
    assert sorted(clocks) == ["nodeA", "nodeB"]
    assert clocks["nodeA"]["ranks"] == [0, 1] and clocks["nodeB"]["ranks"] == [2, 3]
    # the manifest on disk says the same as the merged one (the last launcher to finish wrote it)
    manifest = json.loads((two_hosts.run / "manifest.json").read_text())
    assert manifest["status"] == "finished" and sorted(manifest["hosts"]) == ["nodeA", "nodeB"]
    assert len(list((two_hosts.run / "hosts").glob("*.json"))) == 2
    # each launcher wrote its own host's exit times into the table (none was left, none raced)
    assert list(two_hosts.run.glob("*/exit-*.json")) == []
    assert not any("could not" in s for s in said.values()), said


def test_the_skewed_host_offset_is_estimated_from_collectives(two_hosts: TwoHosts) -> None:
    clocks = {c["host"]: c for c in report_json(two_hosts.run)["run"]["host_clocks"]}
    ref = next(h for h, c in clocks.items() if c["clock_source"] == "reference")
    other = "nodeB" if ref == "nodeA" else "nodeA"
    c = clocks[other]
    assert c["clock_source"] == "collectives" and c["clock_samples"] >= STEPS
    # nodeB's clock is SKEW_S ahead of nodeA's, whichever launcher created the run (the reference)
    skew = (c["clock_offset_s"] if other == "nodeB" else -c["clock_offset_s"]) - SKEW_S
    assert abs(skew) < 0.005, c
    assert 0 < c["clock_uncertainty_s"] < 0.005, c
    assert clocks[ref]["clock_offset_s"] == 0 and clocks[ref]["clock_uncertainty_s"] == 0


def _spread_ms(ends: dict[int, list[int]]) -> dict[int, float]:
    return {s: (max(v) - min(v)) / 1e6 for s, v in ends.items() if len(v) == 4}


def test_the_same_step_ends_on_every_rank_at_once_after_alignment(two_hosts: TwoHosts) -> None:
    """Each step ends on all 4 ranks within a few ms on the aligned timeline (every reader), though
    the recorded times of nodeB's ranks are 0.5 s late."""
    raw: dict[int, list[int]] = {}
    for f in glob.glob(str(two_hosts.run / "spans" / "*" / "*" / "*.parquet")):
        t = pq.read_table(f, columns=["kind", "step", "end_ns"]).to_pylist()
        for r in t:
            if r["kind"] == "step":
                raw.setdefault(r["step"], []).append(r["end_ns"])
    recorded = _spread_ms(raw)
    assert len(recorded) == STEPS and all(v > 0.4e3 for v in recorded.values()), recorded

    run = holoprof.load(two_hosts.run)
    loaded: dict[int, list[int]] = {}
    for step, end in run.rows("SELECT step, end_ns FROM spans WHERE kind = 'step'"):
        loaded.setdefault(step, []).append(end)
    aligned = _spread_ms(loaded)
    # the last step ends when each rank leaves the loop, not at a collective: the others
    steps = sorted(aligned)[:-1]
    assert len(steps) == STEPS - 1
    assert statistics.median(aligned[s] for s in steps) < 10, aligned
    assert all(aligned[s] < 25 for s in steps), aligned

    q = run_holoprof(
        "query", str(two_hosts.run), "--json",
        "SELECT step, max(end_ns) - min(end_ns) AS spread FROM spans WHERE kind = 'step' GROUP BY step",
        cwd=two_hosts.run.parent,
    )  # fmt: skip
    assert q.returncode == 0, q.stderr
    by_step = {r["step"]: r["spread"] / 1e6 for r in json.loads(q.stdout)}
    assert {s: round(by_step[s], 3) for s in steps} == {s: round(aligned[s], 3) for s in steps}


def test_the_chrome_trace_is_aligned(two_hosts: TwoHosts, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    proc = run_holoprof("export", str(two_hosts.run), "--format", "chrome", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(out.read_text())["traceEvents"]
    ends: dict[int, list[float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "step":
            ends.setdefault(e["args"]["step"], []).append(e["ts"] + e["dur"])  # µs
    spread = {s: (max(v) - min(v)) / 1e3 for s, v in ends.items() if len(v) == 4}
    steps = sorted(spread)[:-1]
    assert len(steps) == STEPS - 1 and all(spread[s] < 25 for s in steps), spread


def test_the_report_says_each_hosts_clock(two_hosts: TwoHosts) -> None:
    proc = run_holoprof("report", str(two_hosts.run), cwd=two_hosts.run.parent, env={"COLUMNS": "160"})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "nodeA (" in line or "nodeB (" in line]
    assert len(lines) == 2, proc.stdout
    assert any("reference clock" in line for line in lines), lines
    assert any("collectives)" in line and "±" in line for line in lines), lines


def test_each_hosts_resources_are_reported(two_hosts: TwoHosts) -> None:
    """Each host's launcher sampled its own machine: both hosts are in resources.hosts with their
    ranks, CPU and memory, and network traffic (gloo's, over the veth pair between the namespaces:
    each namespace counts only its own interfaces) on both; the terminal shows a row per host."""
    doc = report_json(two_hosts.run)
    hosts = {h["host"]: h for h in doc["resources"]["hosts"]}
    assert sorted(hosts) == ["nodeA", "nodeB"], doc["resources"]["hosts"]
    assert hosts["nodeA"]["ranks"] == [0, 1] and hosts["nodeB"]["ranks"] == [2, 3]
    for h in hosts.values():
        assert (
            h["cpu_percent"]["samples"] >= 2
            and 0 <= h["cpu_percent"]["mean"] <= h["cpu_percent"]["max"] <= 100
        )
        assert h["memory_used_bytes"]["max"] > 0 and h["job_rss_bytes"]["max"] > 0
        assert h["net_recv_bytes_per_s"]["max"] > 0 and h["net_sent_bytes_per_s"]["max"] > 0, h
    assert set(doc["resources"]["host_spread"]["cpu_percent"]) >= {"min_host", "max_host"}
    proc = run_holoprof("report", str(two_hosts.run), cwd=two_hosts.run.parent, env={"COLUMNS": "160"})
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout[proc.stdout.index("Resources per host") :]
    assert re.search(r"nodeA\s+0-1\s", table) and re.search(r"nodeB\s+2-3\s", table), table


def test_a_second_launcher_without_join_is_refused_with_the_fix(two_hosts: TwoHosts) -> None:
    refused = two_hosts.refused
    assert refused.returncode == 2, refused.stderr
    lines = error_lines(refused.stderr)
    assert len(lines) == 1 and lines[0].startswith("holoprof: error: "), lines
    assert "--join" in lines[0] and "torchrun --nnodes 2" in lines[0], lines
    assert "Traceback" not in refused.stderr


# --- launchers' lifecycle: cheap jobs, hosts made with unshare --uts only -------------------------------
_WAIT_FOR = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"


def _launcher(tmp: Path, run: Path, host: str, gate: str, skewed: bool = False) -> subprocess.Popen[str]:
    argv = [*HOLOPROF, "run", "--out", str(run), "--join", "--no-report", "--",
            sys.executable, "-c", _WAIT_FOR, str(tmp / gate)]  # fmt: skip
    return subprocess.Popen(
        _on_host(host, _skewed(argv) if skewed else argv),
        cwd=tmp,
        env=job_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.fixture
def uts_hosts() -> None:
    why = _missing(netns=False)
    if why:
        pytest.skip(why)


def _status(run: Path) -> tuple[str, list[str], list[str]]:
    r = holoprof.load(run)
    return r.status, r.manifest["hosts"], list(r.dead_hosts)


@pytest.mark.usefixtures("uts_hosts")
def test_the_run_is_finished_when_every_host_is(tmp_path: Path) -> None:
    run = tmp_path / "run"
    a = _launcher(tmp_path, run, "hostA", "go-a")
    read_until(a.stderr.fileno(), "created as host hostA")  # type: ignore[union-attr]
    b = _launcher(tmp_path, run, "hostB", "go-b", skewed=True)
    try:
        read_until(b.stderr.fileno(), "joined as host hostB")  # type: ignore[union-attr]
        assert _status(run) == ("running", ["hostA", "hostB"], [])
        (tmp_path / "go-a").touch()
        assert a.wait(timeout=60) == 0
        assert _status(run) == ("running", ["hostA", "hostB"], [])  # hostB's launcher still runs
        assert json.loads((run / "manifest.json").read_text())["status"] == "running"
        (tmp_path / "go-b").touch()
        assert b.wait(timeout=60) == 0
    finally:
        for p in (a, b):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert _status(run) == ("finished", ["hostA", "hostB"], [])
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
    # no collectives: hostB's clock comes from the launchers' readings of the file system's clock
    clocks = {c["host"]: c for c in report_json(run)["run"]["host_clocks"]}
    b_clock = clocks["hostB"]
    assert clocks["hostA"]["clock_source"] == "reference"
    assert b_clock["clock_source"] == "file_server" and b_clock["clock_samples"] >= 2, b_clock
    assert abs(b_clock["clock_offset_s"] - SKEW_S) <= b_clock["clock_uncertainty_s"] + 0.005, b_clock


@pytest.mark.usefixtures("uts_hosts")
def test_a_host_whose_launcher_dies_is_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    a = _launcher(tmp_path, run, "hostA", "go-a")
    read_until(a.stderr.fileno(), "created as host hostA")  # type: ignore[union-attr]
    b = _launcher(tmp_path, run, "hostB", "go-b")
    try:
        read_until(b.stderr.fileno(), "joined as host hostB")  # type: ignore[union-attr]
        os.killpg(b.pid, signal.SIGKILL)  # the node goes down: its launcher and its job
        b.wait()
        status, _, dead = _status(run)
        assert (status, dead) == ("running", ["hostB"])  # hostA's job still runs
        (tmp_path / "go-a").touch()
        assert a.wait(timeout=60) == 0
    finally:
        for p in (a, b):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    doc = report_json(run)
    assert doc["run"]["status"] == "crashed" and doc["run"]["dead_hosts"] == ["hostB"]
    assert any("hostB" in w and "stopped before its job ended" in w for w in doc["run"]["warnings"])
    proc = run_holoprof("run", "--out", str(run), "--join", "--", sys.executable, "-c", "pass", cwd=tmp_path)
    assert proc.returncode == 2 and "has ended" in proc.stderr, proc.stderr


@pytest.mark.usefixtures("uts_hosts")
def test_one_launcher_whose_ranks_run_on_other_hosts(tmp_path: Path) -> None:
    """No --join: one launcher (this host, no rank) starts a rank on each of two other hosts, as
    ``holoprof run -- srun ...`` does; the ranks' hosts are aligned with each other by their
    collectives, the launcher's host (no collective) keeps its times as recorded."""
    port = free_port()

    def node(host: str, rank: int, skew: bool) -> str:
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--max-restarts", "0", DDP_SCRIPT,
        ]  # fmt: skip
        return shlex.join(_on_host(host, _skewed(argv) if skew else argv))

    script = f"{node('rankhostA', 0, False)} & a=$!; {node('rankhostB', 1, True)} & b=$!; wait $a && wait $b"
    run = tmp_path / "run"
    env = {"DDP_SYNC_ALLREDUCE": "1", "DDP_STEPS": str(STEPS), "GLOO_SOCKET_IFNAME": "lo"}
    proc = run_holoprof(
        "run", "--out", str(run), "--no-report", "--", "sh", "-c", script, cwd=tmp_path, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    doc = report_json(run)
    clocks = {c["host"]: c for c in doc["run"]["host_clocks"]}
    assert {"rankhostA", "rankhostB"} < set(clocks) and len(clocks) == 3, clocks
    launcher_host = next(h for h in clocks if h not in ("rankhostA", "rankhostB"))
    assert clocks["rankhostA"]["clock_source"] == "reference" and clocks["rankhostA"]["ranks"] == [0]
    b = clocks["rankhostB"]
    assert (
        b["clock_source"] == "collectives" and b["ranks"] == [1] and abs(b["clock_offset_s"] - SKEW_S) < 0.005
    ), b
    assert (
        clocks[launcher_host]["clock_source"] == "none"
        and clocks[launcher_host]["clock_uncertainty_s"] is None
    )
    ends: dict[int, list[int]] = {}
    for step, end in holoprof.load(run).rows("SELECT step, end_ns FROM spans WHERE kind = 'step'"):
        ends.setdefault(step, []).append(end)
    spread = {s: (max(v) - min(v)) / 1e6 for s, v in ends.items() if len(v) == 2}
    steps = sorted(spread)[:-1]
    assert len(steps) == STEPS - 1 and all(spread[s] < 25 for s in steps), spread
