"""Distributed jobs: collectives, DDP buckets, exposed communication, stragglers, a rank that dies."""

from __future__ import annotations

import io
import json
import re
import statistics
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

import holoprof
from conftest import TracedRun, free_port, run_holoprof, run_python, traced
from holoprof.analyze.comm import load_procs
from holoprof.analyze.steps import step_processes, step_stats
from holoprof.present.terminal import render
from holoprof.serve.app import make_server

DIST = Path(__file__).resolve().parent / "dist_scripts"
DDP_SCRIPT = str(DIST / "ddp_train.py")
STEPS = 6
# ddp_train.build(): Linear(32, 64), Linear(64, 64), Linear(64, 4) in float32
PARAMS = 32 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4
GRAD_BYTES = 4 * PARAMS


def torchrun(tmp: Path, env: dict[str, str], nproc: int = 2) -> TracedRun:
    return traced(
        tmp, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--master-port", str(free_port()), DDP_SCRIPT, env=env, timeout=180,
    )  # fmt: skip


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    """2 ranks (torchrun), DDP, plus a synchronous loss all_reduce per step outside any phase."""
    run = torchrun(tmp_path_factory.mktemp("ddp"), {"DDP_SYNC_ALLREDUCE": "1", "DDP_STEPS": str(STEPS)})
    assert run.proc.returncode == 0, run.proc.stderr
    return run


#: the straggler job: rank 1 sleeps this long inside its forward pass, every step
SLOW_S = 0.03
STRAGGLER_STEPS = 12


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    """3 ranks (torchrun); rank 1 sleeps SLOW_S in its forward every step; the job registers its own
    comm hook and writes its own step timers (truth/rank<N>.json)."""
    tmp = tmp_path_factory.mktemp("straggler")
    (tmp / "truth").mkdir()
    env = {
        "DDP_SLOW_RANK": "1",
        "DDP_SLOW_S": str(SLOW_S),
        "DDP_SLOW_IN": "forward",
        "DDP_USER_HOOK": "1",
        "DDP_COLLECTIVES": "1",
        "DDP_STEPS": str(STRAGGLER_STEPS),
        "DDP_TRUTH_DIR": str(tmp / "truth"),
    }
    run = torchrun(tmp, env, nproc=3)
    assert run.proc.returncode == 0, run.proc.stderr
    return run


def test_every_rank_is_present_with_its_communication(ddp_run: TracedRun) -> None:
    comm = ddp_run.report["communication"]
    assert sorted(r["rank"] for r in comm["per_rank"]) == [0, 1]
    for r in comm["per_rank"]:
        assert r["steps"] == STEPS and r["step_median_s"] > 0 and r["comm_s"] > 0
    assert comm["world_size"] == 2
    rows = holoprof.load(ddp_run.run_dir).rows(
        "SELECT DISTINCT rank FROM spans WHERE kind = 'comm' ORDER BY rank"
    )
    assert [r[0] for r in rows] == [0, 1], "every rank wrote comm spans, with its rank"


def test_ddp_allreduce_bytes_per_step_equal_gradient_bytes(ddp_run: TracedRun) -> None:
    run = holoprof.load(ddp_run.run_dir)
    for rank in (0, 1):
        per_step = run.rows(
            """SELECT step, sum(CAST(json_extract(attrs, '$.bytes') AS BIGINT)) FROM spans
               WHERE kind = 'comm' AND name = 'all_reduce' AND rank = ?
                 AND json_extract(attrs, '$.async') = 'true' GROUP BY step ORDER BY step""",
            [rank],
        )
        assert [s for s, _ in per_step] == list(range(STEPS))
        assert {b for _, b in per_step} == {GRAD_BYTES}, per_step
        buckets = run.rows(
            """SELECT step, sum(CAST(json_extract(attrs, '$.bytes') AS BIGINT)) FROM spans
               WHERE kind = 'comm' AND name = 'ddp_bucket' AND rank = ? GROUP BY step""",
            [rank],
        )
        assert {b for _, b in buckets} == {GRAD_BYTES}
    comm = ddp_run.report["communication"]
    ops = {c["op"]: c for c in comm["collectives"]}
    # the DDP gradients plus the 4-byte loss all_reduce of each step
    assert ops["all_reduce"]["bytes_per_step"] == GRAD_BYTES + 4
    assert comm["bytes_per_step"] == GRAD_BYTES + 4
    assert ops["all_reduce"]["count"] == 2 * 2 * STEPS  # 2 ranks x (1 bucket + 1 loss) per step


def test_buckets_name_their_layers_and_per_layer_bytes_add_up(ddp_run: TracedRun) -> None:
    comm = ddp_run.report["communication"]
    assert [b["index"] for b in comm["buckets"]] == [0]
    b = comm["buckets"][0]
    assert b["bytes"] == GRAD_BYTES and b["params"] == 6
    assert sorted(b["layers"]) == ["0", "2", "4"]
    assert b["allreduce_s"] > 0 and b["ready_s"] > 0
    assert sum(layer["grad_bytes"] for layer in comm["per_layer"]) == GRAD_BYTES
    assert comm["per_layer"][0]["name"] == "2", "the largest layer first"


def test_synchronous_collective_outside_phases_is_exposed_communication(ddp_run: TracedRun) -> None:
    doc = ddp_run.report
    assert doc["phases"]["communication"]["total_s"] > 0
    run = holoprof.load(ddp_run.run_dir)
    # no communication phase inside backward: DDP's allreduce there is a comm span only
    inside = run.rows(
        """SELECT count(*) FROM spans c JOIN spans b ON c.pid = b.pid AND c.tid = b.tid
           WHERE c.kind = 'phase' AND c.name = 'communication' AND b.kind = 'phase'
             AND b.name = 'backward' AND c.start_ns >= b.start_ns AND c.end_ns <= b.end_ns"""
    )[0][0]
    assert inside == 0
    comm = doc["communication"]
    assert comm["exposed_s_per_step"] > 0
    assert 0 < comm["exposed_fraction"] < 1
    assert comm["total_s_per_step"] >= comm["exposed_s_per_step"]


def test_exposed_communication_is_the_communication_phase_and_never_more_than_the_step(
    ddp_run: TracedRun,
) -> None:
    """DDP's wait for its allreduce at the end of backward is exposed communication: a phase of its
    own (not backward), the same figure on the phase table, in the section and in the finding, and
    never more than the communication or the step, for the job and for each rank."""
    doc = ddp_run.report
    comm, phases = doc["communication"], doc["phases"]
    assert comm["exposed_fraction"] == pytest.approx(phases["communication"]["fraction"], abs=1e-6)
    assert comm["exposed_s_per_step"] == pytest.approx(
        phases["communication"]["total_s"] / doc["steps"]["count"], abs=1e-6
    )
    assert 0 < comm["exposed_s_per_step"] <= comm["total_s_per_step"] <= comm["step_mean_s"]
    for r in comm["per_rank"]:
        assert 0 < r["exposed_s"] <= r["comm_s"] <= r["step_median_s"], r
        assert 0 < r["exposed_fraction"] < 1
    bound = [f for f in doc["findings"] if f["id"] == "communication_bound"]
    assert len(bound) == (1 if comm["exposed_fraction"] >= 0.10 else 0)
    for f in bound:
        assert f["estimated_gain"] == pytest.approx(phases["communication"]["fraction"], abs=1e-4)
        assert f"{100 * phases['communication']['fraction']:.0f}%" in f["title"]
    run = holoprof.load(ddp_run.run_dir)
    waits, overlaps = run.rows(
        """WITH ph AS (SELECT pid, tid, name, start_ns, end_ns, attrs FROM spans WHERE kind = 'phase')
           SELECT (SELECT count(*) FROM ph WHERE json_extract_string(attrs, '$.op') = 'ddp_allreduce'),
                  (SELECT count(*) FROM ph a JOIN ph b ON a.pid = b.pid AND a.tid = b.tid
                     AND a.name = 'communication' AND b.name <> 'communication'
                     AND a.start_ns < b.end_ns AND b.start_ns < a.end_ns)"""
    )[0]
    assert waits == 2 * STEPS, "one wait for the allreduce per backward of each rank"
    assert overlaps == 0, "a communication phase overlaps no other phase"
    keys = step_processes(run)
    for p in load_procs(run, keys, [step_stats(run, k, timeline_points=1) for k in keys]):
        assert len(p.steps) == STEPS
        for step, (s, e) in p.steps.items():
            assert 0 < p.exposed[step] <= p.total[step] <= e - s, (p.key, step)


def test_communication_advice_fits_one_host_and_a_few_kilobytes(ddp_run: TracedRun) -> None:
    """Both ranks on one host exchange 27 KB a step: what the loop waits for is the collectives' latency
    and the ranks arriving apart, so the advice is neither compression nor a faster network."""
    doc = ddp_run.report
    assert len(doc["run"]["hosts"]) == 1
    assert doc["communication"]["bytes_per_step"] < 64 << 10
    found = {f["id"]: f for f in doc["findings"]}
    # the loop's wait is explained: by communication_bound, or (a rank slowed by the machine's load
    # on this run) by the straggler that the others wait for, which communication_bound leaves out
    assert "communication_bound" in found or "straggler" in found, sorted(found)
    f = found.get("communication_bound")
    if f is None:
        return
    assert f["evidence"]["hosts"] == 1
    text = f["recommendation"]
    assert "not bandwidth" in text and "make the work even across ranks" in text
    for word in ("network", "whatif", "compress", "PowerSGD"):
        assert word not in text, word


def truth(run: TracedRun) -> tuple[float, float]:
    """What the slow rank costs the job, by the job's own timers: its mean delay per step (as long as
    it really slept) and that over the job's mean step (each step the longest of the ranks' own step
    timers), over the steps the report takes (the first two, warm-up, left out)."""
    timers = [
        json.loads((Path(run.run_dir).parent / "truth" / f"rank{r}.json").read_text()) for r in range(3)
    ]
    assert [len(t["delay_s"]) for t in timers] == [0, STRAGGLER_STEPS, 0]
    delay = sum(timers[1]["delay_s"][2:]) / (STRAGGLER_STEPS - 2)
    steps = [max(t["step_s"][i] for t in timers) for i in range(2, STRAGGLER_STEPS)]
    return delay, delay / (sum(steps) / len(steps))


def test_slow_rank_is_named_the_straggler_with_its_gain(straggler_run: TracedRun) -> None:
    """Rank 1 sleeps 30 ms in its forward each step: it is the straggler, the slowest in (nearly)
    every step, its excess is compute, and running it at the others' pace saves the job what its
    own timers say the delay costs, within 25%."""
    doc = straggler_run.report
    assert doc["run"]["ranks"] == 3
    found = [f for f in doc["findings"] if f["id"] == "straggler"]
    assert len(found) == 1, doc["findings"]
    f, ev = found[0], found[0]["evidence"]
    assert ev["rank"] == 1 and ev["slow_ranks"] == [1] and "rank 1" in f["title"], f
    assert ev["slowest_fraction"] >= 0.9, ev
    excess = ev["excess_by_phase"]
    assert ev["slower_phase"] == "compute", ev
    delay, gain = truth(straggler_run)
    assert delay >= SLOW_S
    assert 0.75 * delay <= excess["compute"] <= 1.25 * delay, (delay, ev)
    assert abs(excess["data_wait"]) + abs(excess["other"]) < 0.25 * excess["compute"], ev
    assert abs(f["estimated_gain"] - gain) <= 0.25 * gain, (f["estimated_gain"], gain, ev)
    assert f["gain_kind"] == "predicted" and f["gain_basis"]["inputs"]["gain_s_per_step"] > 0
    assert "network" not in f["recommendation"], f  # one host: no network to speak of
    # the others' exposed communication is mostly the wait for rank 1: not advice about the network
    for c in (f for f in doc["findings"] if f["id"] == "communication_bound"):
        assert c["evidence"]["straggler_rank"] == 1 and "rank 1" in c["title"], c
        assert c["estimated_gain"] < c["evidence"]["exposed_fraction"] - 0.5 * gain, c
        for word in ("network", "whatif", "compress", "PowerSGD"):
            assert word not in c["recommendation"], word
    waits = {r["rank"]: r["wait_s"] for r in doc["communication"]["per_rank"]}
    assert waits[1] < waits[0] and waits[1] < waits[2], waits


@pytest.mark.parametrize("hosts", [("vm", "vm", "vm", "vm"), ("a", "a", "b", "b")])
def test_a_straggler_names_the_network_only_where_the_ranks_crossed_one(hosts: tuple[str, ...]) -> None:
    """Rank 3 computes 2 ms longer in every step and the others wait for it at their collectives: the
    finding says no faster network shortens that wait only when the ranks ran on several hosts."""
    import numpy as np

    from holoprof.analyze.steps import ProcKey
    from holoprof.analyze.stragglers import RankSteps, find_straggler, straggler_finding

    n = 40
    rng = np.random.default_rng(0)
    compute = 0.010 + rng.uniform(0, 2e-4, (4, n))
    compute[3] += 0.002
    wait = compute.max(axis=0) - compute  # the others wait at the collective for the slowest
    parts = {"compute": compute, "data_wait": np.full((4, n), 1e-4), "communication": wait + 5e-4}
    parts["other"] = np.full((4, n), 1e-4)
    parts["step"] = sum(parts[p] for p in ("compute", "data_wait", "communication", "other"))
    keys = [ProcKey(host=h, pid=100 + r, rank=r, tid=100 + r) for r, h in enumerate(hosts)]
    rs = RankSteps(keys=keys, steps=np.arange(n), parts=parts, counts=[n] * 4)
    s = find_straggler(rs)
    assert s is not None and keys[s.index].rank == 3
    rec = straggler_finding(rs, s).recommendation
    assert ("no faster network" in rec) == (len(set(hosts)) > 1), rec
    assert "rank 3" in rec


def test_the_rank_step_table_shows_the_slow_rank_in_every_step(straggler_run: TracedRun) -> None:
    s = straggler_run.report["stragglers"]
    per = {r["rank"]: r for r in s["per_rank"]}
    assert sorted(per) == [0, 1, 2] and all(r["steps"] == STRAGGLER_STEPS for r in per.values())
    assert per[1]["slowest_fraction"] >= 0.9 and per[1]["excess_s"] > 0.75 * SLOW_S
    assert s["median_rank"] in (0, 2) and per[s["median_rank"]]["excess_s"] == 0
    for r in (0, 2):  # the fast ranks spend the delay waiting at their collectives
        assert per[r]["communication_s"] > per[1]["communication_s"] + 0.75 * SLOW_S, per
    heat = s["heatmap"]
    assert heat["ranks"] == [0, 1, 2] and heat["steps"] == list(range(STRAGGLER_STEPS))
    assert heat["bin_steps"] == 1 and heat["binned"] is False
    for key in ("step_s", "compute_s", "data_wait_s", "communication_s", "other_s"):
        assert [len(row) for row in heat[key]] == [STRAGGLER_STEPS] * 3, key
    delays = json.loads((Path(straggler_run.run_dir).parent / "truth" / "rank1.json").read_text())["delay_s"]
    # rank 1 slept inside its forward: each step's compute holds that step's delay
    assert all(v >= d for v, d in zip(heat["compute_s"][1], delays, strict=True)), (heat["compute_s"], delays)
    steady = slice(2, None)
    slow_mean = statistics.mean(heat["compute_s"][1][steady])
    for r in (0, 2):
        fast_mean = statistics.mean(heat["compute_s"][r][steady])
        assert slow_mean - fast_mean > 0.75 * statistics.mean(delays[steady]), heat["compute_s"]
    # every cell's parts make up its step
    for r in range(3):
        for i in range(STRAGGLER_STEPS):
            parts = sum(heat[k][r][i] for k in ("compute_s", "data_wait_s", "communication_s", "other_s"))
            assert parts == pytest.approx(heat["step_s"][r][i], abs=5e-6)


def test_the_views_show_the_rank_step_heatmap_and_table(straggler_run: TracedRun, tmp_path: Path) -> None:
    """The HTML report carries the heatmap's data and the table of the ranks; the dashboard's API has
    the heatmap and serves the code that draws it; the terminal shows the table for 2+ ranks only."""
    doc = straggler_run.report
    out = tmp_path / "report.html"
    p = run_holoprof("report", straggler_run.run_dir, "--html", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    page = out.read_text(encoding="utf-8")
    assert "data-chart='rank-heatmap'" in page and "id='stragglers'" in page
    data = json.loads(re.search(r"window\.HOLOPROF_REPORT = (\{.*?\});</script>", page).group(1))  # type: ignore[union-attr]
    assert data["stragglers"]["heatmap"] == doc["stragglers"]["heatmap"]
    table = re.search(r"<table class='ranks-table'>(.*?)</table>", page, re.S).group(1)  # type: ignore[union-attr]
    assert [int(r) for r in re.findall(r"<tr><td>(\d+)</td>", table)] == [0, 1, 2]

    server = make_server(straggler_run.run_dir, port=0)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:

        def get(path: str) -> bytes:
            req = urllib.request.Request(
                f"http://127.0.0.1:{server.port}{path}", headers={"Authorization": f"Bearer {server.token}"}
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                body: bytes = r.read()
                return body

        (run_id,) = [r["id"] for r in json.loads(get("/api/runs"))["runs"]]
        api = json.loads(get(f"/api/runs/{run_id}/report"))
        assert api["stragglers"]["heatmap"] == doc["stragglers"]["heatmap"]
        assert b"renderStragglers" in get("/static/app.js") and b"function heatmap(" in get(
            "/static/charts.js"
        )
    finally:
        server.shutdown()
        server.server_close()

    text = run_holoprof("report", straggler_run.run_dir, cwd=tmp_path).stdout
    block = text.split("Ranks: who is slow, and where", 1)[1].split("I/O", 1)[0]
    rows = [line.strip("│ ").split()[0] for line in block.splitlines() if re.match(r"^│\s+\d+\s+\d", line)]
    assert rows == ["0", "1", "2"], block
    one = io.StringIO()
    render({**doc, "stragglers": {}}, file=one, width=110)
    assert "Ranks: who is slow" not in one.getvalue()


def test_user_comm_hook_runs_and_buckets_are_still_recorded(straggler_run: TracedRun) -> None:
    out = straggler_run.proc.stdout
    for rank in range(3):
        assert f"rank {rank} user hook calls {STRAGGLER_STEPS}" in out, out
    run = holoprof.load(straggler_run.run_dir)
    rows = run.rows(
        "SELECT DISTINCT json_extract_string(attrs, '$.hook') FROM spans WHERE name = 'ddp_bucket'"
    )
    assert [r[0] for r in rows] == ["train.<locals>.my_hook"]


def test_collectives_bytes_and_async_completion(straggler_run: TracedRun) -> None:
    run = holoprof.load(straggler_run.run_dir)
    rows = run.rows(
        """SELECT name, attrs, end_ns - start_ns FROM spans WHERE kind = 'comm' AND rank = 0
           AND name IN ('broadcast', 'all_gather', 'isend', 'barrier', 'all_reduce')"""
    )
    by_name: dict[str, list[dict]] = {}
    for name, attrs, dur in rows:
        a = json.loads(attrs)
        a["dur"] = dur
        by_name.setdefault(name, []).append(a)
    assert by_name["broadcast"][0]["bytes"] == 400 and by_name["broadcast"][0]["async"] is False
    assert by_name["all_gather"][0]["bytes"] == 400
    assert by_name["all_gather"][0]["group_size"] == 3 and by_name["all_gather"][0]["backend"] == "gloo"
    assert by_name["barrier"][0]["bytes"] == 0
    isend = by_name["isend"][0]
    assert isend["bytes"] == 200 and isend["async"] is True and isend["dur"] >= 0
    big = [a for a in by_name["all_reduce"] if a["bytes"] == 4000]
    assert len(big) == 1 and big[0]["async"] is True


def test_rank_that_dies_is_named_and_the_others_data_kept(tmp_path: Path) -> None:
    """Rank 1 leaves 1.5 s into step 3 while rank 0 waits in that step's all_reduce.

    How rank 0 then ends is gloo's choice: a Python exception (its agent flushes at exit) or a C++
    abort (nothing runs). Either way, what it recorded more than one flush interval earlier is on disk.
    """
    env = {
        "DDP_DIE_RANK": "1", "DDP_DIE_STEP": "3", "DDP_DIE_DELAY_S": "1.5", "DDP_TIMEOUT_S": "8",
        "DDP_STEPS": "8",
    }  # fmt: skip
    run = torchrun(tmp_path, env)
    assert run.proc.returncode != 0
    comm = run.report["communication"]
    first = comm["first_failure"]
    assert first["rank"] == 1 and first["exit_code"] == 3, comm["failed_ranks"]
    assert "rank 1 died first (exit code 3)" in first["message"]
    assert first["steps"] == 3
    by_rank = {p["rank"]: p for p in run.report["processes"] if p["role"] == "rank"}
    assert by_rank[0]["steps"] >= 3, "rank 0's steps before the failure are kept"
    assert by_rank[1]["exit_code"] == 3


def test_rank_that_raises_is_named_with_exit_status_1(tmp_path: Path) -> None:
    """The commonest death, an uncaught exception (a RuntimeError such as an out-of-memory one): the
    interpreter prints it and exits with 1, which the rank's agent records at its exit."""
    env = {"DDP_DIE_RANK": "1", "DDP_DIE_STEP": "3", "DDP_DIE_SIGNAL": "RAISE", "DDP_TIMEOUT_S": "8"}
    run = torchrun(tmp_path, env)
    assert run.proc.returncode != 0
    comm = run.report["communication"]
    first = comm["first_failure"]
    assert first is not None and first["rank"] == 1 and first["exit_code"] == 1, comm["failed_ranks"]
    by_rank = {p["rank"]: p for p in run.report["processes"] if p["role"] == "rank"}
    assert by_rank[1]["exit_code"] == 1 and by_rank[1]["steps"] == 3, by_rank


def test_rank_killed_by_sigkill_is_named_though_it_left_no_exit_record(tmp_path: Path) -> None:
    """SIGKILL (the OOM killer's signal) runs no code: the rank is named from its missing exit record."""
    env = {
        "DDP_DIE_RANK": "1", "DDP_DIE_STEP": "3", "DDP_DIE_DELAY_S": "1.5", "DDP_DIE_SIGNAL": "KILL",
        "DDP_TIMEOUT_S": "8", "DDP_STEPS": "8",
    }  # fmt: skip
    run = torchrun(tmp_path, env)
    assert run.proc.returncode != 0
    comm = run.report["communication"]
    killed = [f for f in comm["failed_ranks"] if f["rank"] == 1]
    # its third step was still open (a step ends at the next one's first activity): 2 are on record
    assert killed and killed[0]["exit_code"] is None and killed[0]["steps"] == 2, comm["failed_ranks"]
    message = comm["first_failure"]["message"]
    assert "rank 1 died first (no exit record" in message or "rank 1 (no exit record)" in message, message
    assert any("no exit record" in w for w in run.report["run"]["warnings"]), run.report["run"]["warnings"]


def final_losses(stdout: str) -> dict[int, str]:
    """Each rank's printed final loss (ranks print at the same moment: lines may interleave)."""
    found = {int(r): v for r, v in re.findall(r"rank (\d+) final loss ([0-9.]+)", stdout)}
    assert sorted(found) == [0, 1], stdout
    return found


def test_ddp_results_are_unchanged_by_tracing(ddp_run: TracedRun, tmp_path: Path) -> None:
    """The recording comm hook sums then divides, exactly as DDP does without a hook."""
    proc = run_python(
        "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()), DDP_SCRIPT,
        cwd=tmp_path, env={"DDP_SYNC_ALLREDUCE": "1", "DDP_STEPS": str(STEPS), "DDP_HARD_EXIT": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert final_losses(proc.stdout) == final_losses(ddp_run.proc.stdout)


@pytest.mark.parametrize("point", ["collective", "wait"])
def test_failing_comm_collector_leaves_the_job_unchanged(
    ddp_run: TracedRun, tmp_path: Path, point: str
) -> None:
    # "wait": Work.wait() of the async collectives and point-to-point ops the job runs after training
    env = {"DDP_SYNC_ALLREDUCE": "1", "DDP_STEPS": str(STEPS), "HOLOPROF_FAULT_INJECT": f"comm:{point}"}
    if point == "wait":
        env["DDP_COLLECTIVES"] = "1"
    run = torchrun(tmp_path, env)
    assert run.proc.returncode == 0, run.proc.stderr
    assert "Traceback" not in run.proc.stderr, run.proc.stderr
    assert run.proc.stderr.count("holoprof: the 'comm' collector failed") == 2, "once per rank"
    assert final_losses(run.proc.stdout) == final_losses(ddp_run.proc.stdout)
    assert run.report["steps"]["count"] == STEPS, "the other collectors go on"
    errors = run.report["run"]["errors"]
    assert len(errors) == 2 and all(
        f"comm: FaultInjected: injected fault (HOLOPROF_FAULT_INJECT=comm:{point})" in e for e in errors
    ), errors


def test_whatif_from_a_ddp_run_takes_its_communication_out(ddp_run: TracedRun, tmp_path: Path) -> None:
    p = run_holoprof(
        "whatif", ddp_run.run_dir, "--json", "--workers", "2", "--bandwidth", "10Gbit", cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["grad_bytes"] == GRAD_BYTES
    assert doc["removed_comm_s"] > 0
    assert doc["step_s"] < ddp_run.report["steps"]["median_s"]


def test_the_heatmap_of_a_long_run_is_binned_and_names_no_straggler_among_alike_ranks(tmp_path: Path) -> None:
    """1,000 steps of 3 generated ranks drawn alike: at most 200 columns, each the mean of 5 consecutive
    steps as the spans give them; no rank is the slowest often enough to be a straggler."""
    from holoprof.analyze.report import build_report
    from holoprof.bench.synth import generate_run

    out = str(tmp_path / "run")
    generate_run(out, 1_000, ranks=3, comm=True)
    run = holoprof.load(out)
    doc = build_report(run)
    heat = doc["stragglers"]["heatmap"]
    assert heat["binned"] is True and heat["bin_steps"] == 5 and heat["steps"] == list(range(0, 1_000, 5))
    for i, rank in enumerate(heat["ranks"]):
        durs = [
            d / 1e9
            for (d,) in run.rows(
                "SELECT end_ns - start_ns FROM spans WHERE kind = 'step' AND rank = ? ORDER BY step", [rank]
            )
        ]
        means = [statistics.mean(durs[a : a + 5]) for a in range(0, 1_000, 5)]
        assert heat["step_s"][i] == pytest.approx(means, abs=2e-6)
    assert doc["stragglers"]["steps"] == 998, "the first two steps left out"
    assert sum(r["slowest_fraction"] for r in doc["stragglers"]["per_rank"]) == pytest.approx(1, abs=0.01)
    assert not [f for f in doc["findings"] if f["id"] == "straggler"], doc["findings"]
