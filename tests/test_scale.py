"""Generated runs with known totals: the report's numbers equal the generator's; filters push down."""

from __future__ import annotations

import itertools
import os

import pytest

import holoprof
from holoprof.analyze.report import build_report
from holoprof.bench.synth import CHECKPOINT_BYTES, PHASE_MEANS_NS, generate_run
from holoprof.errors import HoloprofError


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object]:
    out = os.path.join(str(tmp_path_factory.mktemp("synth")), "run")
    totals = generate_run(
        out,
        steps=20_000,
        ranks=3,
        chunk_steps=6_000,
        comm=True,
        io_files=40,
        checkpoint_every=5_000,
        memory_every=500,
    )
    return out, totals


def test_report_totals_equal_the_generated_ones(synth: tuple[str, object]) -> None:
    path, totals = synth
    doc = build_report(holoprof.load(path))
    assert doc["steps"]["count"] == 20_000
    assert doc["run"]["ranks"] == 3
    assert len(doc["steps"]["per_rank"]) == 3
    for phase in PHASE_MEANS_NS:
        assert doc["phases"][phase]["total_s"] == pytest.approx(totals.phase_ns[phase] / 1e9, rel=1e-6)  # type: ignore[attr-defined]
    step_s = totals.step_ns / 1e9  # type: ignore[attr-defined]
    assert doc["steps"]["total_s"] == pytest.approx(step_s, rel=1e-6)
    assert abs(sum(p["fraction"] for p in doc["phases"].values()) - 1) < 1e-9


def test_communication_totals_equal_the_generated_ones(synth: tuple[str, object]) -> None:
    path, totals = synth
    doc = build_report(holoprof.load(path))
    comm = doc["communication"]
    by_op = {c["op"]: c for c in comm["collectives"]}
    assert set(by_op) == set(totals.comm) == {"ddp_bucket", "all_reduce"}  # type: ignore[attr-defined]
    for op, t in totals.comm.items():  # type: ignore[attr-defined]
        assert by_op[op]["count"] == t["count"] == 3 * 20_000 * (4 if op == "ddp_bucket" else 1)
        assert by_op[op]["bytes"] == t["bytes"]
        assert by_op[op]["total_s"] == pytest.approx(t["dur_ns"] / 1e9, abs=1e-6)
        assert by_op[op]["processes"] == 3
    assert comm["world_size"] == 3
    for r in comm["per_rank"]:
        mine = totals.per_rank[r["rank"]]  # type: ignore[attr-defined]
        assert r["exposed_fraction"] == pytest.approx(mine["exposed_ns"] / mine["step_ns"], abs=1e-6)
        assert 0 < r["exposed_s"] <= r["comm_s"] <= r["step_median_s"]
    main = totals.per_rank[0]  # type: ignore[attr-defined]
    assert comm["total_s_per_step"] == pytest.approx(main["comm_ns"] / 20_000 / 1e9, abs=1e-6)
    assert comm["exposed_s_per_step"] == pytest.approx(main["exposed_ns"] / 20_000 / 1e9, abs=1e-6)
    # exposed communication is the `communication` phase: one figure on the phase table and here
    assert comm["exposed_fraction"] == pytest.approx(doc["phases"]["communication"]["fraction"], abs=1e-6)
    assert main["phase_ns"]["communication"] == main["exposed_ns"]


def test_io_totals_equal_the_generated_ones(synth: tuple[str, object]) -> None:
    path, totals = synth
    io = build_report(holoprof.load(path))["io"]
    t = totals.io  # type: ignore[attr-defined]
    assert io["files"] == len(t["paths"]) == 3 * 40 + 1
    for key in ("bytes_read", "reads", "opens"):
        assert io[key] == t[key], key
    assert io["read_time_s"] == pytest.approx(t["read_time_s"], abs=1e-6)
    assert io["meta_time_s"] == pytest.approx(t["meta_time_s"], abs=1e-6)
    assert {b: n for b, n in io["read_size_histogram"].items() if n} == t["size_read"]
    # the timeline is a rate between snapshots: over its seconds it adds up to every byte read
    secs = [s for s, _ in io["bandwidth_timeline"]]
    widths = [1.0] + [b - a for a, b in itertools.pairwise(secs)]
    read = sum(rate * w for (_, rate), w in zip(io["bandwidth_timeline"], widths, strict=True))
    assert read == pytest.approx(t["bytes_read"], rel=1e-9)


def test_checkpoint_totals_equal_the_generated_ones(synth: tuple[str, object]) -> None:
    path, totals = synth
    doc = build_report(holoprof.load(path))
    made = totals.checkpoints  # type: ignore[attr-defined]
    c = doc["checkpoints"]
    assert c["count"] == c["saves"] == sum(m["count"] for m in made.values()) == 3 * 4
    assert c["bytes_written"] == sum(m["bytes"] for m in made.values()) == 12 * CHECKPOINT_BYTES
    # rank 0 runs the main loop: its checkpoints block training, the other ranks' are counted apart
    # (the section sums durations rounded to the microsecond)
    assert c["blocking_s"] == pytest.approx(made[0]["dur_ns"] / 1e9, abs=1e-5)
    assert c["background_s"] == pytest.approx((made[1]["dur_ns"] + made[2]["dur_ns"]) / 1e9, abs=1e-5)
    # training time: rank 0's steps and the checkpoints between them (the last one follows the last step)
    train_ns = totals.per_rank[0]["step_ns"] + made[0]["dur_ns"]  # type: ignore[attr-defined]
    assert c["blocking_fraction"] == pytest.approx(made[0]["dur_ns"] / train_ns, abs=1e-6)
    assert all(i["bytes"] == CHECKPOINT_BYTES and i["api"] == "torch.save" for i in c["items"])
    assert doc["steps"]["total_s"] == pytest.approx(totals.step_ns / 1e9, rel=1e-6)  # type: ignore[attr-defined]


def test_memory_totals_equal_the_generated_ones(synth: tuple[str, object]) -> None:
    """The memory section is the main process's: its peak step and categories, each at its largest
    over the step's snapshots, and the largest total of any snapshot, as generated."""
    path, totals = synth
    doc = build_report(holoprof.load(path))["memory"]
    want = totals.memory[0]  # type: ignore[attr-defined]
    assert want["snapshots"] == 3 * 40
    assert (doc["step"], doc["phase"], doc["categories"]) == (
        want["peak_step"],
        "forward",
        want["categories"],
    )
    assert doc["peak_bytes"] == want["peak_bytes"]
    assert doc["sampled_steps"] == list(range(0, 20_000, 500)) and len(doc["timeline"]) == 120
    assert doc["limit_bytes"] == 64 * 2**30 and doc["mode"] == "sampled"


def test_filters_read_only_what_is_asked(synth: tuple[str, object]) -> None:
    path, _ = synth
    run = holoprof.load(path, steps=(100, 199), ranks=[1])
    assert run.rows("SELECT count(*) FROM spans WHERE kind = 'step'")[0][0] == 100
    assert run.rows("SELECT DISTINCT rank FROM spans")[0][0] == 1
    whole = holoprof.load(path).rows("SELECT min(start_ns) FROM spans")[0][0]
    w = holoprof.load(path, start_s=10.0, end_s=20.0)
    lo, hi = w.rows("SELECT min(start_ns), max(start_ns) FROM spans")[0]
    assert lo >= whole + 10 * 10**9 and hi <= whole + 20 * 10**9


def test_a_reversed_window_is_refused(synth: tuple[str, object]) -> None:
    with pytest.raises(HoloprofError, match="swap"):
        holoprof.load(synth[0], start_s=5, end_s=1)


def test_memory_limit_is_applied(synth: tuple[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOLOPROF_MEMORY_LIMIT", "300MB")
    run = holoprof.load(synth[0])
    limit = run.rows("SELECT current_setting('memory_limit')")[0][0]
    assert "MiB" in limit or "MB" in limit
    assert build_report(run)["steps"]["count"] == 20_000


def test_dask_engine_gives_the_same_numbers_as_duckdb(synth: tuple[str, object]) -> None:
    pytest.importorskip("distributed")
    path, _ = synth
    duck = build_report(holoprof.load(path, ranks=[0, 2]))
    dask = build_report(holoprof.load(path, ranks=[0, 2]), engine="dask")
    assert dask["engine"] == "dask" and duck["engine"] == "duckdb"
    assert dask["steps"]["count"] == duck["steps"]["count"] == 20_000
    for key in ("median_s", "p90_s", "per_s", "total_s", "epochs", "per_rank"):
        assert dask["steps"][key] == duck["steps"][key], key
    assert dask["steps"]["timeline"] == duck["steps"]["timeline"]
    assert dask["phases"] == duck["phases"]
    assert dask["resources"] == duck["resources"]
    assert dask["communication"] == duck["communication"]
    assert dask["io"] == duck["io"]
    assert dask["checkpoints"] == duck["checkpoints"] and duck["checkpoints"]["count"] == 2 * 4
    assert dask["memory"] == duck["memory"] and duck["memory"]["peak_bytes"] > 0
    assert dask["io"]["files"] == 41 + 41 - 1  # two ranks' shards and the shared file


def test_unknown_engine_is_refused(synth: tuple[str, object]) -> None:
    with pytest.raises(HoloprofError, match="unknown engine"):
        build_report(holoprof.load(synth[0]), engine="spark")


def test_rounded_phase_fractions_still_sum_to_one() -> None:
    from holoprof import model
    from holoprof.analyze.report import _phases_doc
    from holoprof.analyze.steps import PhaseStat, ProcKey, StepStats

    phases = {p: PhaseStat(0.0, 0.0, 0.0) for p in model.PHASES}
    for p in ("forward", "backward", "optimizer"):  # each rounds up: 3 x 0.333334 overshoots 1
        phases[p] = PhaseStat(0.3333335, 1.0, 1.0)
    st = StepStats(ProcKey("h", 1, -1, 1), 3, 1.0, 1.0, 1.0, 1.0, 3.0, 0, 1, phases)
    doc = _phases_doc(st)
    assert abs(sum(v["fraction"] for v in doc.values()) - 1) < 1e-12
    assert all(v["fraction"] >= 0 for v in doc.values())


def test_a_run_generated_in_pieces_equals_one_generated_whole(tmp_path: object) -> None:
    from holoprof.bench.synth import create_run, finish_run

    whole = os.path.join(str(tmp_path), "whole")
    pieces = os.path.join(str(tmp_path), "pieces")
    t_whole = generate_run(whole, steps=3_000, ranks=3, chunk_steps=1_000)
    create_run(pieces)
    t_a = generate_run(pieces, steps=3_000, ranks=3, chunk_steps=1_000, only_ranks=range(0, 2))
    t_b = generate_run(pieces, steps=3_000, ranks=3, chunk_steps=1_000, only_ranks=range(2, 3))
    finish_run(pieces)
    assert {**t_a.per_rank, **t_b.per_rank} == t_whole.per_rank
    assert t_whole.spans == t_a.spans + t_b.spans == 3 * 3_000 * 5
    a, b = build_report(holoprof.load(whole)), build_report(holoprof.load(pieces))
    assert a["steps"]["per_rank"] == b["steps"]["per_rank"]
    assert a["phases"] == b["phases"]
    assert a["run"]["duration_s"] == b["run"]["duration_s"] > 0
    for r in b["steps"]["per_rank"]:
        assert r["count"] == 3_000
    rank1 = build_report(holoprof.load(pieces, ranks=[1]))  # the report rounds to the microsecond
    for phase, ns in t_whole.per_rank[1]["phase_ns"].items():
        assert rank1["phases"][phase]["total_s"] == pytest.approx(ns / 1e9, abs=1e-6)


def _late_chunk(run: object, main: object, extra: list[tuple[object, ...]]) -> None:
    """Spans (kind, name, start, end, step) of ``main``'s loop thread, as one chunk written last."""
    from holoprof.store.chunks import write_chunk

    n = len(extra)
    write_chunk(
        run.path,  # type: ignore[attr-defined]
        "spans",
        {
            "host": [main.host] * n,  # type: ignore[attr-defined]
            "pid": [main.pid] * n,  # type: ignore[attr-defined]
            "rank": [-1] * n,
            "tid": [main.tid] * n,  # type: ignore[attr-defined]
            "span_id": list(range(10**12, 10**12 + n)),
            "parent_id": [0] * n,
            "kind": [x[0] for x in extra],
            "name": [x[1] for x in extra],
            "start_ns": [x[2] for x in extra],
            "end_ns": [x[3] for x in extra],
            "step": [x[4] for x in extra],
            "attrs": [None] * n,
        },
        seq=900,
    )


def test_step_statistics_equal_the_plain_join_when_phases_cross_their_steps(tmp_path: object) -> None:
    """The per-step aggregation takes a shortcut for steps whose phases lie inside them; steps with
    phases crossing their window, repeated step indices and phases of no step take the exact join."""
    from holoprof.analyze.per_step import join_steps, scan_steps
    from holoprof.analyze.steps import _stats, outside_steps, step_processes

    out = os.path.join(str(tmp_path), "run")
    generate_run(out, steps=2_000, chunk_steps=1_000)
    run = holoprof.load(out)
    main = step_processes(run)[0]
    (s5, e5), (s7, e7) = (
        run.rows(f"SELECT start_ns, end_ns FROM spans WHERE kind = 'step' AND step = {k}")[0] for k in (5, 7)
    )
    extra = [  # (kind, name, start, end, step)
        ("phase", "data_wait", s5 - 1_000_000, s5 + 500_000, 5),  # starts before its step
        ("phase", "forward", e5 - 100, e5 + 9_000_000, 5),  # ends after it
        ("step", "step", s7 + 10, e7 + 20, 7),  # the same step index twice
        ("phase", "eval", e7 + 50, e7 + 4_000_000, 7),  # after both of its steps
        ("phase", "eval", 1, 3_000_001, 10**6),  # no step has this index
        ("phase", "custom", 5, 2_000_005, 10**6),
        ("phase", "checkpoint", 7, 1_000_007, None),  # no index at all
    ]
    _late_chunk(run, main, extra)
    run = holoprof.load(out)
    scanned = scan_steps(run, main)
    assert scanned.how == "hash"  # the late chunk puts steps 5 and 7 after step 1999: not in order
    fast = _stats(scanned, main, 120)
    plain = _stats(join_steps(run, main, fast.epochs), main, 120)
    assert fast.count == plain.count == 2_001
    for key in ("median_s", "p90_s", "mean_s", "per_s", "total_s", "first_start_ns", "last_end_ns"):
        assert getattr(fast, key) == pytest.approx(getattr(plain, key), rel=1e-12), key
    for p, ps in plain.phases.items():
        assert fast.phases[p].total_s == pytest.approx(ps.total_s, rel=1e-12), p
        assert fast.phases[p].median_s == pytest.approx(ps.median_s, rel=1e-12), p
    assert len(fast.timeline) == len(plain.timeline)
    for a, b in zip(fast.timeline, plain.timeline, strict=True):
        assert a == pytest.approx(b, rel=1e-9)
    by_sql = outside_steps(run, main)
    assert outside_steps(run, main, fast) == pytest.approx(by_sql, rel=1e-12)
    assert by_sql["custom"] == pytest.approx(0.002) and by_sql["eval"] > 0.003
    assert by_sql["checkpoint"] == pytest.approx(0.001)


def _assert_same_steps(a: object, b: object) -> None:
    for key in (
        "count",
        "epochs",
        "median_s",
        "p90_s",
        "mean_s",
        "per_s",
        "total_s",
        "first_start_ns",
        "last_end_ns",
    ):
        assert getattr(a, key) == pytest.approx(getattr(b, key), rel=1e-12), key
    for p, ps in b.phases.items():  # type: ignore[attr-defined]
        got = a.phases[p]  # type: ignore[attr-defined]
        for key in ("total_s", "median_s", "median_share", "fraction"):
            assert getattr(got, key) == pytest.approx(getattr(ps, key), rel=1e-12, abs=1e-15), (p, key)
    assert len(a.timeline) == len(b.timeline)  # type: ignore[attr-defined]
    for x, y in zip(a.timeline, b.timeline, strict=True):  # type: ignore[attr-defined]
        assert x == pytest.approx(y, rel=1e-9)
    assert (a.outside_ns or {}) == pytest.approx(b.outside_ns or {}, rel=1e-12)  # type: ignore[attr-defined]


def test_the_streamed_step_scan_equals_duckdbs_aggregation_and_the_join(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After compaction a process's spans are in start order: steps are scanned in one streamed pass,
    groups cut where the step index changes, with no hash table. Tiny batches put groups across batch
    boundaries; the odd records (a phase crossing its step's end, a step index used twice, phases
    with no step index or with an index no step has, epochs) keep their order and take the same
    exact paths as in DuckDB's aggregation. A memory limit too small for the scan falls back to it."""
    from holoprof.analyze import per_step
    from holoprof.analyze.per_step import join_steps, scan_steps
    from holoprof.analyze.steps import _stats, step_processes
    from holoprof.store.compact import compact_run

    out = os.path.join(str(tmp_path), "run")
    generate_run(out, steps=600, chunk_steps=200)
    run = holoprof.load(out)
    main = step_processes(run)[0]
    (s0, _), (_, e5), (s7, e7), (_, e_last) = (
        run.rows(f"SELECT start_ns, end_ns FROM spans WHERE kind = 'step' AND step = {k}")[0]
        for k in (0, 5, 7, 599)
    )
    extra = [  # (kind, name, start, end, step)
        ("epoch", "epoch", s0 - 10, e_last, 0),
        ("phase", "forward", e5 - 100, e5 + 9_000_000, 5),  # ends after its step
        ("step", "step", s7 + 10, e7 + 20, 7),  # the same step index twice
        ("phase", "checkpoint", 7, 1_000_007, None),  # no index at all
        ("phase", "custom", e_last + 5, e_last + 2_000_005, 10**6),  # an index no step has
        ("phase", "eval", e_last + 10, e_last + 3_000_010, 10**6),
    ]
    _late_chunk(run, main, extra)
    assert scan_steps(holoprof.load(out), main).how == "hash"  # the late chunk is out of order
    compact_run(out)
    run = holoprof.load(out)
    monkeypatch.setattr(per_step, "_BATCH_ROWS", 7)
    streamed = scan_steps(run, main)
    assert streamed.how == "stream" and not streamed.unique_steps  # step 7 twice
    hashed = scan_steps(run, main, stream=False)
    assert hashed.how == "hash"
    joined = join_steps(run, main, hashed.epochs)
    fast, by_hash, plain = (_stats(ps, main, 120) for ps in (streamed, hashed, joined))
    assert fast.count == 601 and fast.epochs == 1
    assert fast.outside_ns == pytest.approx({"checkpoint": 1e6, "custom": 2e6, "eval": 3e6})
    _assert_same_steps(fast, by_hash)
    _assert_same_steps(fast, plain)


def test_a_span_without_an_end_and_the_memory_limit_after_a_report(tmp_path: object) -> None:
    """A span without an end cannot take the streamed pass: DuckDB's aggregation skips it, as before.
    The lowered limits of the scans are undone exactly: the run's limit is the same after a report."""
    from holoprof.analyze.per_step import scan_steps
    from holoprof.analyze.steps import _stats, step_processes
    from holoprof.store.compact import compact_run

    out = os.path.join(str(tmp_path), "run")
    generate_run(out, steps=300, chunk_steps=100)
    run = holoprof.load(out)
    main = step_processes(run)[0]
    s3 = run.rows("SELECT start_ns FROM spans WHERE kind = 'step' AND step = 3")[0][0]
    _late_chunk(run, main, [("phase", "eval", s3 + 10, None, 3)])
    compact_run(out)
    run = holoprof.load(out)
    run.con.execute("SET memory_limit = '1900MiB'")  # read back as 1.8 GiB
    run.memory_limit = "1900MiB"
    limit = run.con.execute("SELECT current_setting('memory_limit')").fetchone()
    scanned = scan_steps(run, main)
    assert scanned.how == "hash"
    _assert_same_steps(_stats(scanned, main, 120), _stats(scan_steps(run, main, stream=False), main, 120))
    build_report(run)
    assert run.con.execute("SELECT current_setting('memory_limit')").fetchone() == limit
    assert run.memory_limit == "1900MiB"


def test_a_step_scan_out_of_its_memory_limit_gives_way_to_duckdbs_aggregation(
    synth: tuple[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    from holoprof.analyze import per_step
    from holoprof.analyze.per_step import scan_steps
    from holoprof.analyze.steps import _stats, step_processes

    run = holoprof.load(synth[0])
    for proc in step_processes(run):
        streamed = scan_steps(run, proc)
        assert streamed.how == "stream"
        with monkeypatch.context() as m:
            m.setattr(per_step, "scan_memory_limit", lambda threads: 2**20)  # DuckDB runs out at 1 MiB
            starved = scan_steps(run, proc)
        assert starved.how == "hash"
        _assert_same_steps(_stats(starved, proc, 120), _stats(streamed, proc, 120))


def test_a_memory_limit_too_small_is_one_line_and_exit_2(synth: tuple[str, object]) -> None:
    import subprocess
    import sys

    env = dict(os.environ, HOLOPROF_MEMORY_LIMIT="1MB")
    proc = subprocess.run(
        [sys.executable, "-m", "holoprof.cli", "report", synth[0], "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "HOLOPROF_MEMORY_LIMIT=1MB" in lines[0] and "higher" in lines[0], lines
    assert os.path.isdir(synth[0])  # the run is untouched


def _digest(pieces: object) -> tuple[int, str]:
    import hashlib

    h = hashlib.sha256()
    n = 0
    for text, events in pieces:  # type: ignore[attr-defined]
        n += events
        h.update(text.encode())
    return n, h.hexdigest()


def test_an_exports_sort_spills_to_disk_and_gives_the_same_events(
    synth: tuple[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Chrome export's sort of every span runs under its own memory limit: at 64 MiB it
    spills sorted runs to the run's temporary folder; at 1 MiB it cannot start and runs again at
    the run's limit. Both give the events of an unconstrained sort, in the same order."""
    from holoprof.bench.synth import T0_NS
    from holoprof.exports import chrome_trace as ct

    run = holoprof.load(synth[0])
    event = ct.span_event(T0_NS)
    monkeypatch.setattr(ct, "SORT_MEMORY", 4 * 2**30)
    whole = _digest(ct.sorted_events(run, "spans", ct.SPAN_COLS, (), ct.SPAN_ORDER, event, ["synth"]))
    assert whole[0] > 600_000
    monkeypatch.setattr(ct, "SORT_MEMORY", 64 * 2**20)
    spilled = ct.sorted_events(run, "spans", ct.SPAN_COLS, (), ct.SPAN_ORDER, event, ["synth"])
    first = next(spilled)
    files, size = run.rows("SELECT count(*), coalesce(sum(size), 0) FROM duckdb_temporary_files()")[0]
    assert files > 0 and size > 0, "the sort spilled"
    assert run.memory_limit == "64MiB"  # while its rows are read
    assert _digest(itertools.chain([first], spilled)) == whole
    assert run.memory_limit != "64MiB"
    monkeypatch.setattr(ct, "SORT_MEMORY", 2**20)
    assert _digest(ct.sorted_events(run, "spans", ct.SPAN_COLS, (), ct.SPAN_ORDER, event, ["synth"])) == whole


def test_the_report_on_duckdb_loads_neither_pyarrow_nor_pandas(synth: tuple[str, object]) -> None:
    """The report on DuckDB reads its streams with nanoarrow and NumPy: the command never loads
    pyarrow (about 27 MiB) nor pandas (about 50 MiB), and gives the same document as a process that
    has both."""
    import json
    import subprocess
    import sys

    code = """
import contextlib, io, json, sys
from holoprof import cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = cli.main(["report", sys.argv[1], "--json"])
loaded = sorted(m for m in ("pyarrow", "pandas") if m in sys.modules)
print(json.dumps({"code": code, "loaded": loaded, "doc": json.loads(out.getvalue())}))
"""
    proc = subprocess.run([sys.executable, "-c", code, synth[0]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["code"] == 0 and out["loaded"] == []
    import pyarrow  # noqa: F401  (this process has it: the document must not depend on it)

    plain = json.loads(json.dumps(build_report(holoprof.load(synth[0])), default=str))
    for doc in (out["doc"], plain):
        doc["run"].pop("dir", None)
    assert out["doc"] == plain


def test_per_step_columns_spill_to_a_file_and_read_back_exactly(tmp_path: object) -> None:
    """The per-step columns the scan writes to the run's temporary folder read back as written: zeros
    before the first other value, int32 while the values fit and int64 past that, nothing written for
    a column of zeros. Step indices stay a range while they run on by one and become a column at the
    first gap, with the same values."""
    import numpy as np

    from holoprof.analyze.per_step import Spilled, _Steps

    col = Spilled(str(tmp_path))
    col.add(np.zeros(5, dtype=np.int64))
    col.add(np.array([7, -3], dtype=np.int64))
    assert col.load().dtype == np.int32 and col.load().tolist() == [0] * 5 + [7, -3]
    col.add(np.array([2**40], dtype=np.int64))
    assert col.load().dtype == np.int64 and col.load().tolist() == [0] * 5 + [7, -3, 2**40]
    zeros = Spilled(str(tmp_path))
    zeros.add(np.zeros(3, dtype=np.int64))
    assert zeros.file is None and zeros.load().tolist() == [0, 0, 0]
    big = Spilled(str(tmp_path))
    values = np.arange(3 * Spilled._PIECE + 11, dtype=np.int64) * 3 - 5
    for part in np.array_split(values, 7):
        big.add(part)
    assert np.array_equal(big.load(), values)

    steps = _Steps(str(tmp_path))
    steps.add(np.array([10, 11, 12]))
    steps.add(np.array([13]))
    assert steps.indices() == range(10, 14)
    steps.add(np.array([15, 16]))  # 14 is missing
    assert steps.indices().tolist() == [10, 11, 12, 13, 15, 16]
    first = _Steps(str(tmp_path))
    first.add(np.array([4, 3]))
    assert first.indices().tolist() == [4, 3]


def test_an_error_in_the_middle_of_a_stream_keeps_duckdbs_message() -> None:
    """A DuckDB error raised while a result streams through nanoarrow (past the first batch) keeps
    DuckDB's message, so that running out of memory there is still recognised: the scan then falls
    back, or the command ends with its one-line error."""
    import duckdb

    from holoprof.store.reader import is_out_of_memory, numpy_batches

    con = duckdb.connect()
    con.execute("SET threads = 1")  # DuckDB buffers 10 MiB of a stream ahead: the error is far past that
    sql = "SELECT i, CASE WHEN i > 5000000 THEN error('Out of Memory Error: {}') ELSE i END FROM range(5000100) t(i)"
    seen = 0
    with pytest.raises(Exception) as info:
        for b in numpy_batches(con, sql.format("as in a spilled hash table")):
            seen += b.num_rows
    assert seen > 0 and is_out_of_memory(info.value)
    with pytest.raises(Exception) as other:
        for _ in numpy_batches(con, sql.replace("Out of Memory Error", "Conversion Error").format("x")):
            pass
    assert not is_out_of_memory(other.value)


def test_generated_io_operations_export_on_their_track_with_the_known_totals(tmp_path: object) -> None:
    """With ``io_ops=True`` every step's data wait holds one read of the rank's training file, at the
    offset where the last one ended; the Chrome trace's I/O track has them all with the generator's
    totals, and the steps are those of the same run generated without them."""
    import json

    import numpy as np

    out = os.path.join(str(tmp_path), "run")
    totals = generate_run(out, steps=3_000, ranks=2, chunk_steps=1_000, io_ops=True)
    plain = os.path.join(str(tmp_path), "plain")
    generate_run(plain, steps=3_000, ranks=2, chunk_steps=1_000)
    spans = "SELECT sum(hash(pid, kind, name, start_ns, end_ns, step)), count(*) FROM spans"
    assert holoprof.load(out).rows(spans) == holoprof.load(plain).rows(spans)
    assert totals.io_ops["count"] == 6_000

    trace = os.path.join(str(tmp_path), "trace.json")
    holoprof.export(out, "chrome", trace)
    with open(trace, encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    ios = [e for e in events if e.get("cat") == "io"]
    assert len(ios) == totals.io_ops["count"]
    assert sum(e["args"]["size_bytes"] for e in ios) == totals.io_ops["bytes"]
    assert sum(e["dur"] for e in ios) == pytest.approx(totals.io_ops["dur_ns"] / 1000, rel=1e-12)
    waits = {(e["pid"], e["ts"]): e["dur"] for e in events if e.get("name") == "data_wait"}
    for pid in {e["pid"] for e in ios}:
        mine = [e for e in ios if e["pid"] == pid]
        assert {e["args"]["path"] for e in mine} == {f"/data/train-{pid - 10_000:05d}.bin"}
        offsets = np.array([e["args"]["offset"] for e in mine])
        sizes = np.array([e["args"]["size_bytes"] for e in mine])
        assert offsets[0] == 0 and (offsets[1:] == offsets[:-1] + sizes[:-1]).all()
        for e in mine:
            assert 0 < e["dur"] <= waits[(pid, e["ts"])] / 2 + 0.001, e
