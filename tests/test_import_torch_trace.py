"""`holoprof import torch-trace`: real PyTorch profiler traces become runs that report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "holoprof.cli", *args], capture_output=True, text=True, timeout=180
    )


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = str(tmp_path_factory.mktemp("kineto"))
    p = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "trace_scripts", "profile_loop.py"),
            os.path.join(tmp, "rank0.json"),
            "gz",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    return tmp


def _report(run: str) -> dict:
    r = _cli("report", run, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_profiler_trace_imports_with_steps_and_phases(traces: str, tmp_path: os.PathLike[str]) -> None:
    out = os.path.join(tmp_path, "run")
    r = _cli("import", "torch-trace", os.path.join(traces, "rank0.json"), "--out", out)
    assert r.returncode == 0, r.stderr
    doc = _report(out)
    assert doc["run"]["status"] == "imported"
    assert doc["steps"]["count"] == 5  # the profiler's active steps
    phases = doc["phases"]
    for p in ("data_wait", "forward", "backward", "optimizer"):
        assert phases[p]["total_s"] > 0, p
    assert abs(sum(v["fraction"] for v in phases.values()) - 1) < 1e-9


def test_gzipped_and_plain_traces_import_the_same(traces: str, tmp_path: os.PathLike[str]) -> None:
    a, b = os.path.join(tmp_path, "a"), os.path.join(tmp_path, "b")
    assert _cli("import", "torch-trace", os.path.join(traces, "rank0.json"), "--out", a).returncode == 0
    assert _cli("import", "torch-trace", os.path.join(traces, "rank0.json.gz"), "--out", b).returncode == 0
    da, db = _report(a), _report(b)
    assert da["steps"] == db["steps"]
    assert da["phases"] == db["phases"]


def test_a_folder_of_rank_traces_gives_one_process_per_rank(traces: str, tmp_path: os.PathLike[str]) -> None:
    folder = os.path.join(tmp_path, "ranks")
    os.makedirs(folder)
    shutil.copy(os.path.join(traces, "rank0.json"), os.path.join(folder, "rank0.json"))
    shutil.copy(os.path.join(traces, "rank0.json.gz"), os.path.join(folder, "rank1.json.gz"))
    out = os.path.join(tmp_path, "run")
    assert _cli("import", "torch-trace", folder, "--out", out).returncode == 0
    doc = _report(out)
    assert doc["run"]["ranks"] == 2
    assert sorted(p["rank"] for p in doc["processes"]) == [0, 1]


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"traceEvents": [{"ph": "X", "name": '])
def test_bad_traces_are_refused_in_one_line(tmp_path: os.PathLike[str], content: bytes) -> None:
    bad = os.path.join(tmp_path, "bad.json")
    with open(bad, "wb") as f:
        f.write(content)
    r = _cli("import", "torch-trace", bad, "--out", os.path.join(tmp_path, "run"))
    assert r.returncode == 2
    assert r.stderr.startswith("holoprof: error:") and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_missing_trace_is_refused(tmp_path: os.PathLike[str]) -> None:
    r = _cli(
        "import", "torch-trace", os.path.join(tmp_path, "nope.json"), "--out", os.path.join(tmp_path, "run")
    )
    assert r.returncode == 2 and "does not exist" in r.stderr


# --- a 2-rank DDP job, and the same with a device timeline -----------------------------------------


def _ddp_traces(out: str, *device: str) -> list[str]:
    p = subprocess.run(
        [sys.executable, os.path.join(HERE, "trace_scripts", "profile_ddp.py"), out, *device],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    return sorted(os.path.join(out, f) for f in os.listdir(out))


@pytest.fixture(scope="module")
def ddp_traces(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("ddp"))
    assert len(_ddp_traces(out)) == 2
    return out


@pytest.fixture(scope="module")
def device_traces(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("ddp-device"))
    assert len(_ddp_traces(out, "--device")) == 2
    return out


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def _expected_breakdown(doc: dict) -> dict[str, float]:
    """Holistic Trace Analysis's temporal breakdown, computed here from the JSON in plain Python."""
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    last_step = max(e["ts"] for e in xs if e["name"].startswith("ProfilerStep#"))
    launched = {
        e["args"]["correlation"] for e in xs if e.get("cat") == "cuda_runtime" and e["ts"] < last_step
    }
    acts = [
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in xs
        if e.get("cat") in ("kernel", "gpu_memcpy") and e["args"]["correlation"] in launched
    ]
    span = max(e for _, e, _ in acts) - min(s for s, _, _ in acts)
    busy = _union_us([(s, e) for s, e, _ in acts])
    compute = _union_us([(s, e) for s, e, n in acts if not n.startswith(("nccl", "Memcpy"))])
    return {
        "kernel_time_s": span / 1e6,
        "idle_s": (span - busy) / 1e6,
        "compute_s": compute / 1e6,
        "non_compute_s": (busy - compute) / 1e6,
    }


def test_ddp_ranks_steps_and_gloo_collectives_match_the_trace(
    ddp_traces: str, tmp_path: os.PathLike[str]
) -> None:
    from holoprof.store.import_torch_trace import temporal_breakdown

    out = os.path.join(tmp_path, "run")
    r = _cli("import", "torch-trace", ddp_traces, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "device time" not in r.stderr  # a CPU-only trace has no device timeline
    assert temporal_breakdown(out) == []
    import holoprof

    run = holoprof.load(out)
    for path in sorted(os.listdir(ddp_traces)):
        doc = _load(os.path.join(ddp_traces, path))
        rank = doc["distributedInfo"]["rank"]
        assert doc["distributedInfo"]["world_size"] == 2
        xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        want = {int(e["name"].split("#")[1]): e["dur"] for e in xs if e["name"].startswith("ProfilerStep#")}
        got = dict(
            run.rows(
                "SELECT step, (end_ns - start_ns) / 1000.0 FROM spans WHERE kind = 'step' AND rank = ?",
                [rank],
            )
        )
        assert set(got) == set(want) and len(want) == 4
        for n, us in want.items():
            assert got[n] == pytest.approx(us, abs=0.002)
        gloo = sorted(e["dur"] for e in xs if e["name"].startswith("gloo:"))
        got_gloo = [
            us
            for (us,) in run.rows(
                "SELECT (end_ns - start_ns) / 1000.0 FROM spans WHERE kind = 'comm' AND rank = ? "
                "AND name LIKE 'gloo:%' ORDER BY 1",
                [rank],
            )
        ]
        assert gloo and got_gloo == pytest.approx(gloo, abs=0.002)
    doc = _report(out)
    assert doc["run"]["ranks"] == 2 and doc["steps"]["count"] == 4
    assert doc["device"] == {}, "no device timeline, no breakdown"


def test_device_temporal_breakdown_is_htas_definition(device_traces: str, tmp_path: os.PathLike[str]) -> None:
    from holoprof.store.import_torch_trace import temporal_breakdown

    out = os.path.join(tmp_path, "run")
    r = _cli("import", "torch-trace", device_traces, "--out", out)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("device time") == 2
    got = {b["rank"]: b for b in temporal_breakdown(out)}
    assert sorted(got) == [0, 1]
    for path in os.listdir(device_traces):
        doc = _load(os.path.join(device_traces, path))
        want = _expected_breakdown(doc)
        b = got[doc["distributedInfo"]["rank"]]
        for k, v in want.items():
            assert b[k] == pytest.approx(v, abs=1e-8), k
        assert want["idle_s"] > 0 and want["compute_s"] > 0 and want["non_compute_s"] > 0
        assert b["idle_fraction"] + b["compute_fraction"] + b["non_compute_fraction"] == pytest.approx(1)
    doc = _report(out)
    assert doc["steps"]["count"] == 4
    assert doc["device"]["temporal_breakdown"] == temporal_breakdown(out)
    text = _cli("report", out)
    assert text.returncode == 0, text.stderr
    assert "Device time (imported trace)" in text.stdout
    share = f"idle {100 * got[0]['idle_fraction']:.1f}%"
    assert any(line.count("rank 0:") and share in line for line in text.stdout.splitlines()), text.stdout


def test_files_imported_in_parallel_give_the_same_run(device_traces: str, tmp_path: os.PathLike[str]) -> None:
    import holoprof
    from holoprof.store.import_torch_trace import import_torch_trace, temporal_breakdown

    one = import_torch_trace(device_traces, os.path.join(tmp_path, "one"), jobs=1)
    two = import_torch_trace(device_traces, os.path.join(tmp_path, "two"), jobs=2)
    q = "SELECT rank, kind, name, start_ns, end_ns, step FROM spans ORDER BY ALL"
    assert holoprof.load(one).rows(q) == holoprof.load(two).rows(q)
    assert temporal_breakdown(one) == temporal_breakdown(two)
