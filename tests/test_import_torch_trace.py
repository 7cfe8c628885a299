"""`holoprof import torch-trace`: real PyTorch profiler traces become runs that report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import report_json

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
    return report_json(run)


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
    # the phases nest as they did in the trace: one thread's never overlap, each lies in its step
    overlaps = _spans(
        out,
        """SELECT a.name, b.name, a.step FROM spans a JOIN spans b
             ON a.kind = 'phase' AND b.kind = 'phase' AND a.tid = b.tid AND a.step = b.step
            AND a.start_ns < b.start_ns AND b.start_ns < a.end_ns""",
    )
    assert overlaps == []
    outside = _spans(
        out,
        """SELECT p.name, p.step FROM spans p JOIN spans s
             ON p.kind = 'phase' AND s.kind = 'step' AND p.tid = s.tid AND p.step = s.step
            WHERE p.start_ns < s.start_ns OR p.end_ns > s.end_ns""",
    )
    assert outside == []


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


def _expected_breakdown(doc: dict) -> tuple[dict[str, float], int]:
    """Holistic Trace Analysis's temporal breakdown, computed here from the JSON in plain Python, and
    the number of device activities it spans."""
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
    }, len(acts)


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
        want, n = _expected_breakdown(doc)
        b = got[doc["distributedInfo"]["rank"]]
        for k, v in want.items():
            # holoprof keeps whole nanoseconds: each activity's two ends move by 0.5 ns at most
            assert b[k] == pytest.approx(v, abs=1e-9 * (2 * n + 1)), k
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


_FORKED = """
import sys
from holoprof.store import import_torch_trace as m
forked = m._single_threaded()  # a fresh interpreter: nothing has started a thread yet
try:
    m.import_torch_trace(sys.argv[1], sys.argv[2], jobs=2)
except m.HoloprofError as exc:
    print("error:", exc)
print("forked" if forked else "spawned")
"""


def test_files_imported_in_forked_workers_give_the_same_run(
    device_traces: str, tmp_path: os.PathLike[str]
) -> None:
    import holoprof
    from holoprof.store.import_torch_trace import import_torch_trace, temporal_breakdown

    one = import_torch_trace(device_traces, os.path.join(tmp_path, "one"), jobs=1)
    two = os.path.join(tmp_path, "two")
    p = subprocess.run([sys.executable, "-c", _FORKED, device_traces, two], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.split() == ["forked"], p.stdout + p.stderr
    q = "SELECT rank, kind, name, start_ns, end_ns, step FROM spans ORDER BY ALL"
    assert holoprof.load(one).rows(q) == holoprof.load(two).rows(q)
    assert temporal_breakdown(one) == temporal_breakdown(two)


def test_a_bad_file_in_a_forked_worker_is_named(device_traces: str, tmp_path: os.PathLike[str]) -> None:
    folder = os.path.join(tmp_path, "traces")
    os.makedirs(folder)
    shutil.copy(os.path.join(device_traces, sorted(os.listdir(device_traces))[0]), folder)
    with open(os.path.join(folder, "rank9.pt.trace.json"), "w") as f:
        f.write('{"traceEvents": [{"ph": "X", "name": ')
    p = subprocess.run(
        [sys.executable, "-c", _FORKED, folder, os.path.join(tmp_path, "run")], capture_output=True, text=True
    )
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and lines[-1] == "forked", p.stdout + p.stderr
    assert (
        lines[0].startswith("error: ")
        and "rank9.pt.trace.json is not a readable PyTorch profiler" in lines[0]
    )


def test_the_import_prints_the_short_report_unless_told_not_to(
    traces: str, tmp_path: os.PathLike[str]
) -> None:
    trace = os.path.join(traces, "rank0.json")
    shown = _cli("import", "torch-trace", trace, "--out", os.path.join(tmp_path, "a"))
    quiet = _cli("import", "torch-trace", trace, "--out", os.path.join(tmp_path, "b"), "--no-report")
    assert shown.returncode == 0 and quiet.returncode == 0, shown.stderr + quiet.stderr
    for r in (shown, quiet):
        assert r.stderr.startswith(f"holoprof: imported {trace} into ")
        assert "see it again with: holoprof report" in r.stderr.splitlines()[-1]
    assert "Where each step's time goes" in shown.stdout
    assert "Where each step's time goes" not in quiet.stdout


# Traces in the shapes of real GPU traces (hand-written here, small): the first Kineto format of a
# V100 trace from 2021, an A100 trace re-serialized with distributedInfo after the events and
# backward on autograd's device thread, and an H100 trace with ns-precision timestamps.


def _write(path: str, doc: dict, gz: bool = False) -> str:
    import gzip

    data = json.dumps(doc, indent=2).encode()
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(data)
    return path


def _spans(run: str, sql: str) -> list[tuple]:
    import holoprof

    return holoprof.load(run).rows(sql)


def _breakdown(doc: dict) -> dict:
    (b,) = doc["device"]["temporal_breakdown"]
    return b


def test_first_kineto_format_keeps_its_kernels_and_breakdown(tmp_path: os.PathLike[str]) -> None:
    pid, cpu, gpu = 24572, "24572", "stream 7"
    epoch_us = 1621401187223000  # no baseTimeNanoseconds: epoch microseconds, x1000 past float's 2**53

    def op(cat: str, name: str, tid: str, ts: int, dur: int, **args: object) -> dict:
        p = 0 if tid == gpu else pid
        ts += epoch_us
        return {"ph": "X", "cat": cat, "name": name, "pid": p, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [
        op("Operator", "ProfilerStep#2", cpu, 1000, 500, Device=pid),
        op("Operator", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", cpu, 1010, 40),
        op("Runtime", "cudaMemcpyAsync", cpu, 1060, 10, cbid=41, correlation=11),
        op("Memcpy", "Memcpy HtoD (Pageable -> Device)", gpu, 1072, 2, device=0, stream=7, correlation=11),
        op("Operator", "aten::mm", cpu, 1100, 50, Device=pid),
        op("Runtime", "cudaLaunchKernel", cpu, 1110, 10, cbid=211, correlation=12),
        op("Kernel", "volta_sgemm_128x32_nt", gpu, 1130, 6, device=0, stream=7, correlation=12),
        op("Runtime", "cudaLaunchKernel", "24610", 1200, 10, cbid=211, correlation=13),
        # no evaluate_function wrapper in this format: the grad_fn ops are the autograd nodes
        op("Operator", "MmBackward", cpu, 1300, 80, Device=pid),
        op("Operator", "torch::autograd::AccumulateGrad", cpu, 1390, 20, Device=pid),
        op(
            "Kernel",
            "void at::native::vectorized_elementwise_kernel<4>",
            gpu,
            1215,
            5,
            stream=7,
            correlation=13,
        ),
        {
            "ph": "f",
            "id": 13,
            "pid": 0,
            "tid": gpu,
            "ts": epoch_us + 1215,
            "cat": "async",
            "name": "launch",
            "bp": "e",
        },
        {
            "ph": "X",
            "cat": "Trace",
            "ts": epoch_us - 10,
            "dur": 600,
            "pid": "Traces",
            "tid": "PyTorch Profiler",
            "name": "PyTorch Profiler (0)",
            "args": {},
        },
    ]
    trace = _write(os.path.join(tmp_path, "v100.json"), {"schemaVersion": 1, "traceEvents": events})
    out = os.path.join(tmp_path, "run")
    r = _cli("import", "torch-trace", trace, "--out", out)
    assert r.returncode == 0, r.stderr
    doc = _report(out)
    assert doc["steps"]["count"] == 1
    b = _breakdown(doc)  # span 1072..1220 us; memcpy 2 us; kernels 6 + 5 us
    assert b["kernel_time_s"] == pytest.approx(148e-6)
    assert b["compute_s"] == pytest.approx(11e-6)
    assert b["non_compute_s"] == pytest.approx(2e-6)
    assert b["idle_s"] == pytest.approx(135e-6)
    rows = _spans(
        out,
        "SELECT json_extract_string(attrs, '$.cat'), tid, count(*) FROM spans WHERE kind = 'op' GROUP BY ALL",
    )
    got = {(c, t): n for c, t, n in rows}
    assert got[("kernel", 7)] == 2  # "stream 7" is the GPU row of stream 7
    assert got[("gpu_memcpy", 7)] == 1
    assert got[("cuda_runtime", 24572)] == 2 and got[("cuda_runtime", 24610)] == 1
    assert got[("cpu_op", 24572)] == 3
    ((step_ns,),) = _spans(out, "SELECT end_ns - start_ns FROM spans WHERE kind = 'step'")
    assert step_ns == 500_000
    assert doc["phases"]["backward"]["total_s"] == pytest.approx(110e-6)  # MmBackward to AccumulateGrad
    assert doc["phases"]["forward"]["total_s"] > 0


@pytest.mark.parametrize("gz", [False, True])
def test_distributed_info_after_the_events_and_backward_on_autograd_thread(
    tmp_path: os.PathLike[str], gz: bool
) -> None:
    main, bw = 3914, 24922

    def op(cat: str, name: str, tid: int, ts: int, dur: int, **args: object) -> dict:
        return {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": 0 if cat == "kernel" else main,
            "tid": tid,
            "ts": ts,
            "dur": dur,
            "args": args,
        }

    events = [
        op("user_annotation", "ProfilerStep#552", main, 1000, 1000),
        op("cpu_op", "aten::linear", main, 1100, 200),
        op("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", bw, 1400, 145),
        op("cpu_op", "aten::mm", bw, 1410, 58),
        op("cuda_runtime", "cudaLaunchKernel", bw, 1450, 10, correlation=2131433),
        op(
            "kernel",
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm>",
            7,
            1500,
            45,
            device=0,
            stream=7,
            correlation=2131433,
        ),
    ]
    doc = {"traceEvents": events, "distributedInfo": {"rank": 3, "world_size": 4, "backend": "nccl"}}
    trace = _write(os.path.join(tmp_path, "rank3.json" + (".gz" if gz else "")), doc, gz)
    out = os.path.join(tmp_path, "run")
    r = _cli("import", "torch-trace", trace, "--out", out)
    assert r.returncode == 0, r.stderr
    rep = _report(out)
    assert [(p["rank"], p["world_size"]) for p in rep["processes"]] == [(3, 4)]
    assert _breakdown(rep)["rank"] == 3
    assert _breakdown(rep)["compute_s"] == pytest.approx(45e-6)
    phases = dict(
        _spans(out, "SELECT name, sum(end_ns - start_ns) FROM spans WHERE kind = 'phase' GROUP BY ALL")
    )
    assert phases["backward"] == 145_000  # on autograd's thread, counted in the step of the main thread
    assert phases["forward"] == 200_000


def test_nanosecond_timestamps_are_rounded_not_truncated(tmp_path: os.PathLike[str]) -> None:
    pid = 392793

    def op(cat: str, name: str, tid: int, ts: float, dur: float, **args: object) -> dict:
        return {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": 0 if tid == 1 else pid,
            "tid": tid,
            "ts": ts,
            "dur": dur,
            "args": args,
        }

    events = [
        {
            "name": "process_name",
            "ph": "M",
            "ts": 88437691101.719,
            "pid": pid,
            "tid": 0,
            "args": {"name": "x"},
        },
        op("cpu_op", "op1", pid, 88437691101.729, 0.040, **{"External id": 1}),
        op("cuda_runtime", "cudaLaunchKernel", pid, 88437691101.729, 0.010, cbid=211, correlation=1),
        # 1.001 * 1000 is 1000.9999999999999: truncated, the kernel would lose a nanosecond
        op("kernel", "Kernel", 1, 88437691101.749, 1.001, device=0, stream=1, correlation=1),
        op("cuda_sync", "Stream Wait Event", 1, 88437691102.819, 0.010, stream=1, correlation=200),
        op("cuda_sync", "Event Sync", 1, 88437691102.839, 0.020, stream=-1, correlation=300),
        {
            "ph": "X",
            "cat": "Trace",
            "ts": 88437691101.719,
            "dur": 0.3,
            "pid": "Spans",
            "tid": "Test trace",
            "name": "Test trace (0)",
            "args": {},
        },
        {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 88437691102.019},
    ]
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": 1775078550000000000, "traceEvents": events}
    trace = _write(os.path.join(tmp_path, "h100.json"), doc)
    out = os.path.join(tmp_path, "run")
    r = _cli("import", "torch-trace", trace, "--out", out)
    assert r.returncode == 0, r.stderr
    b = _breakdown(_report(out))
    # span: kernel start .749 to the stream wait's end 2.829; the event sync (stream -1) is no activity;
    # HTA counts the stream wait (no Memcpy/Memset/Sync in its name) as computation
    assert round(b["kernel_time_s"] * 1e9) == 1080
    assert round(b["compute_s"] * 1e9) == 1011
    assert round(b["idle_s"] * 1e9) == 69
    assert b["non_compute_s"] == 0
    ((kernel_ns,),) = _spans(out, "SELECT end_ns - start_ns FROM spans WHERE name = 'Kernel'")
    assert kernel_ns == 1001


# --- input that is not a trace, and input built to exhaust memory or time ------------------------------


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{}", "no traceEvents"),
        (b"[1,2,3]", "not an object"),
        (b'{"traceEvents":[1]}', "traceEvents[0] is int"),
        (b'{"traceEvents":[{"ph":"X","name":"a","ts":1,"dur":1},"x"]}', "traceEvents[1] is str"),
        (b'{"traceEvents":{"ph":"X"}}', "not a list"),
        (b'{"traceEvents":[]}', "holds no trace events"),
        (b'{"traceEvents":[{"ph":"i","name":"instant","ts":1}]}', "holds no trace events"),
    ],
)
def test_json_that_is_not_a_trace_is_refused(tmp_path: os.PathLike[str], content: bytes, why: str) -> None:
    bad = os.path.join(tmp_path, "bad.json")
    with open(bad, "wb") as f:
        f.write(content)
    out = os.path.join(tmp_path, "run")
    r = _cli("import", "torch-trace", bad, "--out", out)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("holoprof: error:") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert why in r.stderr and not os.path.exists(out)


def _bombs(tmp: str) -> dict[str, tuple[str, str]]:
    """Small gzipped files that inflate into what exhausted memory or time before: name -> (path, the
    limit's variable)."""
    import gzip

    made = {
        # 200,000 nested arrays: ijson kept a prefix per level (quadratic memory: 23.7 GB)
        "nesting": (b'{"traceEvents":[{"args":' + b"[" * 200_000, "HOLOPROF_LIMIT_JSON_DEPTH"),
        # ... and before traceEvents, where the header is read
        "nesting-in-header": (b'{"meta":' + b"{" * 100_000, "HOLOPROF_LIMIT_JSON_DEPTH"),
        # one 24 MiB string (a 512 MiB one ran 300 s)
        "string": (
            b'{"traceEvents":[{"ph":"X","name":"' + b"a" * (24 << 20) + b'"}]}',
            "HOLOPROF_LIMIT_STRING_BYTES",
        ),
        # 32 MiB of blanks from 32 KiB
        "ratio": (b'{"traceEvents":[' + b" " * (32 << 20) + b"]}", "HOLOPROF_LIMIT_RATIO"),
    }
    out = {}
    for name, (text, var) in made.items():
        path = os.path.join(tmp, f"{name}.json.gz")
        with open(path, "wb") as f:
            f.write(gzip.compress(text, 6))
        assert os.path.getsize(path) < 200_000
        out[name] = (path, var)
    return out


@pytest.mark.parametrize("bomb", ["nesting", "nesting-in-header", "string", "ratio"])
def test_bombs_stop_at_a_limit_in_one_line(tmp_path: os.PathLike[str], bomb: str) -> None:
    path, var = _bombs(str(tmp_path))[bomb]
    out = os.path.join(tmp_path, "run")
    # a long string compresses well: past the ratio limit, the string's own limit
    env = {**os.environ, "HOLOPROF_LIMIT_RATIO": str(10**6)} if bomb == "string" else None
    r = subprocess.run(
        [sys.executable, "-c", _UNDER_RLIMIT, "import", "torch-trace", path, "--out", out],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("holoprof: error:") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{var}=" in r.stderr and not os.path.exists(out)
    if bomb.startswith("nesting"):
        return  # past the depth limit, the parser's memory grows with the square of the depth
    # the limit is a setting: raised, the same file gets past it (and is refused for having no events)
    r = subprocess.run(
        [sys.executable, "-c", _UNDER_RLIMIT, "import", "torch-trace", path, "--out", out],
        capture_output=True,
        text=True,
        timeout=120,
        env={**(env or os.environ), var: str(10**9)},
    )
    assert r.returncode == 2 and "holds no trace events" in r.stderr, r.stderr


#: the command line under a 2 GiB address-space limit: a bomb that got past the limits would fail here
#: with MemoryError instead of taking the machine's memory
_UNDER_RLIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from holoprof.cli import main
sys.argv[0] = "holoprof"
sys.exit(main())
"""


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan"])
def test_a_limit_that_is_not_a_positive_integer_is_refused(tmp_path: os.PathLike[str], value: str) -> None:
    path = os.path.join(tmp_path, "t.json")
    with open(path, "w") as f:
        f.write('{"traceEvents": []}')
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "holoprof.cli",
            "import",
            "torch-trace",
            path,
            "--out",
            os.path.join(tmp_path, "r"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOLOPROF_LIMIT_JSON_DEPTH": value},
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "HOLOPROF_LIMIT_JSON_DEPTH=" in r.stderr and "not a positive integer" in r.stderr


def test_findings_on_an_imported_trace_do_not_count_this_machines_cores(tmp_path: os.PathLike[str]) -> None:
    """A trace made elsewhere that waits for data 60% of each step: input_bound, without the cores of
    the machine that reads the trace in its evidence or its advice."""
    events = []
    for step in range(8):
        t = 1000 + 200 * step
        events += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 3,
                "tid": 1,
                "ts": t,
                "dur": 100,
            },
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                "pid": 3,
                "tid": 1,
                "ts": t + 1,
                "dur": 60,
            },
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 3, "tid": 1, "ts": t + 62, "dur": 30},
        ]
    path = os.path.join(tmp_path, "slow_input.json")
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)
    out = os.path.join(tmp_path, "run")
    r = _cli("import", "torch-trace", path, "--out", out, "--no-report")
    assert r.returncode == 0, r.stderr
    (finding,) = [f for f in _report(out)["findings"] if f["id"] == "input_bound"]
    assert finding["evidence"]["data_wait_fraction"] >= 0.5
    assert "cpu_cores" not in finding["evidence"]
    assert "this machine" not in json.dumps(finding)
