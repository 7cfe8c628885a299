"""What checkpoints cost the job: the `checkpoints` section and the `checkpoint_bound` finding.

A checkpoint span (``torch.save``/``torch.load``, ``torch.distributed.checkpoint``, safetensors,
Hugging Face and Lightning saves and loads, Keras and ``tf.train.Checkpoint`` saves) recorded on the thread that runs the training loop blocked training
for its whole duration; one recorded on another thread (an asynchronous save, a burst buffer's drain)
did not. Each item has ``blocking_s`` and ``background_s``; a ``BurstBuffer.save`` is one item whose
``background_s`` is the time its background write and drain took. The share of training time blocked
by checkpoints is the measure behind ``checkpoint_bound``.

The checkpoint interval recommendation follows Young's and Daly's first-order formula,
``interval = sqrt(2 * C * MTBF)`` where ``C`` is the blocking cost of one checkpoint, when the user
gives the mean time between failures (``holoprof run --mtbf HOURS``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from holoprof.analyze.engine import Aggregation, aggregate
from holoprof.analyze.findings import Finding
from holoprof.store.reader import Run

#: BurstBuffer.save records its blocking part (the snapshot) on the caller's thread, and the write to
#: a tier and the drain to durable storage on its own threads; the report shows them as one save.
_BURST_SAVE_API = "holoprof.BurstBuffer.save"
_BURST_BACKGROUND_APIS = ("holoprof.BurstBuffer.write", "holoprof.BurstBuffer.drain")

CHECKPOINT_BOUND_MEDIUM = 0.05
CHECKPOINT_BOUND_HIGH = 0.20


def young_daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Optimal time between checkpoints (first order): sqrt(2 C M)."""
    return math.sqrt(2.0 * max(cost_s, 0.0) * max(mtbf_s, 0.0))


#: The checkpoint phases of every process, in time order.
_CHECKPOINT_ROWS = Aggregation(
    name="checkpoints",
    table="spans",
    columns=("host", "pid", "tid", "kind", "name", "start_ns", "end_ns", "attrs"),
    chunk="""SELECT host, pid, tid, start_ns, end_ns, attrs FROM {t}
        WHERE kind = 'phase' AND name = 'checkpoint'""",
    order="start_ns, host, pid, tid, end_ns, attrs",
)


def checkpoints_section(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    rows = aggregate(run, ctx, _CHECKPOINT_ROWS)
    if not rows:
        return {}, []
    items = _items(rows, ctx.get("main"))
    saves = [i for i in items if i["op"] == "save"]
    blocked_s = sum(i["blocking_s"] for i in items)
    train_s = _training_s(ctx.get("steps"), items)
    share = blocked_s / train_s if train_s > 0 else 0.0
    save_cost = sorted(i["seconds"] for i in saves if i["blocking"])
    median_cost = save_cost[len(save_cost) // 2] if save_cost else 0.0
    mtbf_s = _mtbf_s(run)
    section: dict[str, Any] = {
        "count": len(items),
        "saves": len(saves),
        "loads": len(items) - len(saves),
        "bytes_written": sum(i["bytes"] or 0 for i in saves),
        "blocking_s": round(blocked_s, 6),
        "background_s": round(sum(i["background_s"] for i in items), 6),
        "blocking_fraction": round(share, 6),
        "median_save_s": round(median_cost, 6),
        "items": [{k: v for k, v in i.items() if k not in ("start_ns", "host")} for i in items[:200]],
    }
    if mtbf_s and median_cost > 0:
        section["young_daly_interval_s"] = round(young_daly_interval_s(median_cost, mtbf_s), 1)
        section["mtbf_s"] = mtbf_s
    findings: list[Finding] = []
    if share >= CHECKPOINT_BOUND_MEDIUM and saves:
        findings.append(_checkpoint_bound(section, saves, share, blocked_s, median_cost, mtbf_s))
    return section, findings


def _attrs(raw: Any) -> dict[str, Any]:
    """A span's attributes, or {} when they are not a JSON object."""
    try:
        a = json.loads(raw) if raw else {}
    except ValueError:
        a = {}
    return a if isinstance(a, dict) else {}


def _items(rows: list[tuple[Any, ...]], main: Any) -> list[dict[str, Any]]:
    """One item per checkpoint call, in time order: the parts of a save (the job's own fsync or
    rename, a BurstBuffer's background write and drain) folded into it; with its bandwidth."""
    items: list[dict[str, Any]] = []
    burst_saves: dict[tuple[Any, ...], dict[str, Any]] = {}
    for host, pid, tid, s, e, attrs in rows:
        a = _attrs(attrs)
        blocking = main is None or (host == main.host and pid == main.pid and tid == main.tid)
        dur = max(0, e - s) / 1e9
        if a.get("part_of") and _fold(items, host, pid, a, dur):
            continue
        api = a.get("api", "torch.save" if a.get("op") != "load" else "torch.load")
        key = (host, pid, a.get("checkpoint"), a.get("seq"))
        owner = burst_saves.get(key) if api in _BURST_BACKGROUND_APIS else None
        if owner is not None:  # the background part of a BurstBuffer save: counted with that save
            _add_background(owner, api, a, dur)
            continue
        item = _item(a, api, dur, blocking, host, pid, s)
        if api == _BURST_SAVE_API:
            burst_saves[key] = item
        items.append(item)
    for i in items:
        b, dur = i["bytes"], i["seconds"]
        i["bandwidth_bytes_per_s"] = (
            round(b / dur, 1) if isinstance(b, (int, float)) and b and dur > 0 else None
        )
    return items


def _item(
    a: dict[str, Any], api: str, dur: float, blocking: bool, host: str, pid: int, s: int
) -> dict[str, Any]:
    """The item of one checkpoint call (its bandwidth comes once its parts are folded in)."""
    item: dict[str, Any] = {
        "op": a.get("op", "save"),
        "api": api,
        "path": a.get("path"),
        "bytes": a.get("bytes"),
        "seconds": round(dur, 6),
        "bandwidth_bytes_per_s": None,
        "blocking": blocking,
        "blocking_s": round(dur, 6) if blocking else 0.0,
        "background_s": 0.0 if blocking else round(dur, 6),
        "pid": pid,
        "start_ns": s,
        "host": host,
    }
    if a.get("files") is not None:
        item["files"] = a["files"]
    return item


def _add_background(owner: dict[str, Any], api: str, a: dict[str, Any], dur: float) -> None:
    """Count the background write or drain of a BurstBuffer save with that save."""
    b = a.get("bytes")
    owner["background_s"] = round(owner["background_s"] + dur, 6)
    if api == "holoprof.BurstBuffer.write" and isinstance(b, int):
        owner["bytes"] = b
    if a.get("path"):
        owner["path"] = a["path"]


def _training_s(st: Any, items: list[dict[str, Any]]) -> float:
    """Training time: the main loop from its first step to its last, plus blocking checkpoints after
    it."""
    train_s = 0.0
    if st is not None and st.count:
        train_s = (st.last_end_ns - st.first_start_ns) / 1e9
        train_s += sum(i["seconds"] for i in items if i["blocking"] and i["start_ns"] >= st.last_end_ns)
    return train_s


def _checkpoint_bound(
    section: dict[str, Any],
    saves: list[dict[str, Any]],
    share: float,
    blocked_s: float,
    median_cost: float,
    mtbf_s: float | None,
) -> Finding:
    bw = [i["bandwidth_bytes_per_s"] for i in saves if i["bandwidth_bytes_per_s"]]
    return Finding(
        id="checkpoint_bound",
        severity="high" if share >= CHECKPOINT_BOUND_HIGH else "medium",
        title=f"checkpoint-bound: checkpoints block {100 * share:.0f}% of training time",
        evidence={
            "blocking_fraction": round(share, 4),
            "blocking_s": round(blocked_s, 3),
            "saves": len(saves),
            "median_save_s": round(median_cost, 4),
            "bytes_per_save": (section["bytes_written"] // len(saves)) if saves else 0,
            "median_bandwidth_bytes_per_s": sorted(bw)[len(bw) // 2] if bw else None,
        },
        recommendation=_recommendation(section, mtbf_s),
        estimated_gain=round(share, 4),
        threshold={
            "medium": CHECKPOINT_BOUND_MEDIUM,
            "high": CHECKPOINT_BOUND_HIGH,
            "measure": "blocking checkpoint time / training time",
        },
    )


def _recommendation(section: dict[str, Any], mtbf_s: float | None) -> str:
    rec = (
        "save asynchronously so training goes on while the checkpoint is written: "
        "holoprof.checkpoint.BurstBuffer(fast_dir='/dev/shm/ckpt', durable_dir=...) writes to a fast "
        "tier and drains to durable storage in the background (or torch.distributed.checkpoint.async_save)"
    )
    if mtbf_s and "young_daly_interval_s" in section:
        rec += f"; with an MTBF of {mtbf_s / 3600:.1f} h, checkpoint every {section['young_daly_interval_s']:.0f} s (Young/Daly)"
    else:
        rec += "; give `holoprof run --mtbf HOURS` to get the optimal checkpoint interval (Young/Daly)"
    return rec


def _fold(items: list[dict[str, Any]], host: str, pid: int, a: dict[str, Any], dur: float) -> bool:
    """The job's own fsync or rename of a file a checkpoint call had just saved (``part_of``) is part
    of that save: its time is added, and a rename gives the save its final path and bytes."""
    path = a.get("renamed_from") or a.get("path")
    for i in reversed(items):
        if i["host"] == host and i["pid"] == pid and i["op"] == "save" and i["path"] == path:
            i["seconds"] = round(i["seconds"] + dur, 6)
            part = "blocking_s" if i["blocking"] else "background_s"
            i[part] = round(i[part] + dur, 6)
            i["path"] = a.get("path", i["path"])
            if a.get("bytes") is not None:
                i["bytes"] = a["bytes"]
            i.setdefault("then", []).append(a.get("api"))
            return True
    return False


def _mtbf_s(run: Run) -> float | None:
    opts = run.manifest.get("options") or {}
    raw = opts.get("mtbf_s")
    if raw is None:
        return None
    try:
        v = float(raw)
    except (TypeError, ValueError):
        return None
    return v if v and v > 0 else None
