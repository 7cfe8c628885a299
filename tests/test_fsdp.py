"""FSDP2 (``fully_shard``) on gloo, started by torchrun with 2 ranks, traced with the default options
and checked against the truth the script measures about itself (framework_scripts/fsdp2_torchrun.py).

* its communication is recorded: the all-gathers and reduce-scatters FSDP must make (counted and sized
  from the shapes of the parameters each FSDP unit manages), DTensor's all-reduce of the gradient norm
  and the job's own asynchronous all-reduce of the loss;
* exposure: the time the job waited for them inside forward and backward is ``communication``, not
  forward or backward (the asynchronous prefetch of the root counts for its wait, not its issue), and
  forward, backward and the optimizer agree with the job's timers;
* the memory collector counts the sharded parameters (DTensors) by their local shards, and does not fail;
* tracing does not change what the job computes: the same losses, bit for bit, as untraced.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

import holoprof
from conftest import TracedRun, free_port, run_python, traced

SCRIPT = str(Path(__file__).resolve().parent / "framework_scripts" / "fsdp2_torchrun.py")
RANKS = 2
#: phases agree with the job's own timers within this share of the total step time
POINTS = 0.05
F32 = 4


def _command() -> tuple[str, ...]:
    port = str(free_port())
    return ("-m", "torch.distributed.run", "--nproc-per-node", str(RANKS), "--master-port", port, SCRIPT)


def _truths(tmp: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for r in range(RANKS):
        doc = json.loads((tmp / f"truth.json.{r}").read_text())
        assert isinstance(doc, dict)
        out[r] = doc
    return out


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("fsdp2")
    run = traced(tmp, sys.executable, *_command(), env={"TRUTH_OUT": str(tmp / "truth.json")}, timeout=240)
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    untraced = tmp_path_factory.mktemp("fsdp2-untraced")
    proc = run_python(*_command(), cwd=untraced, env={"TRUTH_OUT": str(untraced / "truth.json")}, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"run": run, "truth": _truths(tmp), "untraced": _truths(untraced)}


def _shard_numel(shape: list[int]) -> int:
    """Elements of one rank's shard of a parameter: FSDP2 shards dim 0, padded to a multiple of the ranks."""
    return math.ceil(shape[0] / RANKS) * math.prod(shape[1:])


def _expected(t: dict[str, Any]) -> dict[str, int]:
    """What FSDP must do per step and per rank: each unit all-gathers its shards before its forward,
    again before its backward if it resharded after forward (all but the root), and reduce-scatters
    its gradients (this rank sends all of them: the unsharded, padded size)."""
    ag = ag_bytes = rs_bytes = shards = root = 0
    for u in t["units"]:
        shard = sum(_shard_numel(s) for s in u["shapes"]) * F32
        gathers = 2 if u["reshard_after_forward"] else 1
        ag += gathers
        ag_bytes += gathers * shard
        rs_bytes += RANKS * shard
        shards += shard
        if not u["reshard_after_forward"]:
            root += RANKS * shard  # unsharded until the backward is over
    return {
        "all_gathers": ag,
        "all_gather_bytes": ag_bytes,
        "reduce_scatters": len(t["units"]),
        "reduce_scatter_bytes": rs_bytes,
        "shard_bytes": shards,
        "root_unsharded_bytes": root,
    }


def _ops(doc: dict[str, Any], prefix: str) -> tuple[int, int]:
    """(count, bytes) of the report's collectives named ``prefix...`` (all_gather_single on torch 2.13,
    all_gather_into_tensor before)."""
    rows = [c for c in doc["communication"]["collectives"] if c["op"].startswith(prefix)]
    return sum(c["count"] for c in rows), sum(c["bytes"] for c in rows)


def test_fsdp2_traced_trains_bit_for_bit_as_untraced(fsdp: dict[str, Any]) -> None:
    run: TracedRun = fsdp["run"]
    for r in range(RANKS):
        assert fsdp["truth"][r]["losses"] == fsdp["untraced"][r]["losses"], r
    assert not run.report["run"]["errors"], run.report["run"]["errors"]  # the memory collector measured
    assert "Traceback" not in run.proc.stderr


def test_fsdp2_collectives_are_what_fsdp_must_do(fsdp: dict[str, Any]) -> None:
    doc, t = fsdp["run"].report, fsdp["truth"][0]
    steps = t["steps"]
    assert steps == 2 * 6 and t["epochs"] == 2  # 192 samples, 2 ranks, batches of 16
    want = _expected(t)
    assert want == _expected(fsdp["truth"][1])
    calls = RANKS * steps
    assert _ops(doc, "all_gather") == (calls * want["all_gathers"], calls * want["all_gather_bytes"])
    assert _ops(doc, "reduce_scatter") == (
        calls * want["reduce_scatters"],
        calls * want["reduce_scatter_bytes"],
    )
    # all-reduces: the loss (the job's, asynchronous) and the gradients' norm (DTensor, in clip_grad_norm_)
    rows = holoprof.load(fsdp["run"].run_dir).rows(
        """SELECT json_extract_string(attrs, '$.api') AS api, count(*), sum(CAST(json_extract(attrs, '$.bytes') AS BIGINT)),
                  bool_and(CAST(json_extract(attrs, '$.async') AS BOOLEAN))
           FROM spans WHERE kind = 'comm' AND name = 'all_reduce' AND step >= 0 GROUP BY api ORDER BY api"""
    )
    by_api = {api: (int(n), int(b), bool(a)) for api, n, b, a in rows}
    assert by_api[None] == (calls, calls * F32, True)  # one float per step, async_op=True
    dtensor_calls, dtensor_bytes, _ = by_api["functional"]
    assert dtensor_calls == calls and dtensor_bytes > 0
    comm = doc["communication"]
    per_step = want["all_gather_bytes"] + want["reduce_scatter_bytes"] + F32 + dtensor_bytes // calls
    assert comm["bytes_per_step"] == per_step
    assert comm["world_size"] == RANKS


def _carved(run_dir: str, pid: int) -> dict[tuple[int, str], list[str]]:
    """Per (step, phase) of the training thread of ``pid``: the calls of the communication carved out
    of that phase, in time order."""
    run = holoprof.load(run_dir)
    tid = run.rows(
        "SELECT tid FROM spans WHERE pid = ? AND kind = 'phase' AND name = 'forward' LIMIT 1", [pid]
    )[0][0]
    rows = run.rows(
        """SELECT step, json_extract_string(attrs, '$.in'), json_extract_string(attrs, '$.op') FROM spans
           WHERE pid = ? AND tid = ? AND kind = 'phase' AND name = 'communication' AND step >= 0
           ORDER BY start_ns""",
        [pid, tid],
    )
    out: dict[tuple[int, str], list[str]] = {}
    for step, where, op in rows:
        out.setdefault((int(step), where or ""), []).append(op)
    return out


def test_fsdp2_waits_inside_forward_and_backward_are_communication(fsdp: dict[str, Any]) -> None:
    """Every step: forward waits for each unit's all-gather (the root's, prefetched asynchronously,
    at its wait); backward for the all-gathers of the units that resharded and every reduce-scatter;
    outside them, the waits for DTensor's norm and the job's loss all-reduce."""
    doc, t = fsdp["run"].report, fsdp["truth"][0]
    want = _expected(t)
    rank0 = next(p for p in doc["communication"]["per_rank"] if p["rank"] == 0)
    carved = _carved(fsdp["run"].run_dir, rank0["pid"])
    units = len(t["units"])
    for step in range(t["steps"]):
        fwd = carved.get((step, "forward"), [])
        assert len(fwd) == units and all(op.startswith("all_gather") for op in fwd), (step, fwd)
        bwd = carved.get((step, "backward"), [])
        assert sum(op.startswith("all_gather") for op in bwd) == want["all_gathers"] - units, (step, bwd)
        assert sum(op.startswith("reduce_scatter") for op in bwd) == units, (step, bwd)
        assert carved.get((step, ""), []) == ["all_reduce", "all_reduce"], step  # the norm, the loss


def _phase_s(doc: dict[str, Any], name: str) -> float:
    return float(doc["phases"][name]["total_s"]) + float(doc["outside_steps"]["phases"].get(name, 0.0))


def test_fsdp2_steps_and_phases_agree_with_the_jobs_timers(fsdp: dict[str, Any]) -> None:
    doc, truths = fsdp["run"].report, fsdp["truth"]
    t = truths[0]
    assert doc["steps"]["count"] == t["steps"] and doc["steps"]["epochs"] == t["epochs"]
    assert {r["rank"]: r["count"] for r in doc["steps"]["per_rank"]} == {
        r: truths[r]["steps"] for r in truths
    }
    timers, total = t["timers"], doc["steps"]["total_s"]
    assert total > 0
    for name in ("data_wait", "optimizer"):
        got = _phase_s(doc, name)
        assert abs(got - timers[name]) <= POINTS * total, (name, got, timers[name])
    # forward and backward less their waits, and all the waits: between the job's forward, backward and
    # loss wait, and those plus its clip_grad_norm_ (whose all-reduce wait is communication, its compute not)
    both = sum(_phase_s(doc, n) for n in ("forward", "backward", "communication"))
    low = timers["forward"] + timers["backward"] + timers["all_reduce_wait"]
    assert low - POINTS * total <= both <= low + timers["clip"] + POINTS * total, (both, low, timers)
    assert sum(p["fraction"] for p in doc["phases"].values()) == pytest.approx(1.0, abs=1e-6)
    comm = doc["communication"]
    assert comm["exposed_fraction"] == pytest.approx(doc["phases"]["communication"]["fraction"], abs=1e-6)
    assert 0 < comm["exposed_s_per_step"] <= comm["total_s_per_step"] <= comm["step_mean_s"]
    for r in comm["per_rank"]:
        assert 0 < r["exposed_s"] <= r["comm_s"] <= r["step_median_s"], r
    assert "memory_headroom" not in {f["id"] for f in doc["findings"]}


def test_fsdp2_memory_counts_local_shards(fsdp: dict[str, Any]) -> None:
    """Weights and gradients are this rank's shards (padded), the optimizer state twice that and a step
    counter per parameter; after the forward, the root's parameters are unsharded too."""
    doc, t = fsdp["run"].report, fsdp["truth"][0]
    want = _expected(t)
    mem = doc["memory"]
    assert mem["sampled_steps"] == [0, 1, 2]
    assert "tensors_unmeasured" not in mem
    nparams = sum(len(u["shapes"]) for u in t["units"])
    rows = {(r["step"], r["phase"]): r for r in mem["timeline"]}
    for step in (0, 1, 2):
        for phase in ("backward", "optimizer"):
            r = rows[(step, phase)]
            assert (r["weights"], r["gradients"]) == (want["shard_bytes"], want["shard_bytes"]), r
        assert rows[(step, "optimizer")]["optimizer_state"] == 2 * want["shard_bytes"] + nparams * F32
    for step in (1, 2):  # (on step 0 the optimizer, which holds the root's shards, is not known yet)
        r = rows[(step, "forward")]
        assert r["weights"] == want["shard_bytes"] + want["root_unsharded_bytes"], r
        assert r["activations"] > 0
