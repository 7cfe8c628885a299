"""Generate large, realistic runs with known totals (for benchmarks and scale tests).

A generated run looks like what the agent writes: per rank a process folder with Parquet chunks of
steps and phases (data_wait, forward, backward, optimizer, with an eval and a checkpoint every epoch),
resource samples, and a processes row. Durations are drawn around fixed means with a seeded generator,
and the exact totals are returned so that analyses can be checked against them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from holoprof import model
from holoprof.store import rundir

#: mean phase durations (ns) of a generated step
PHASE_MEANS_NS = {"data_wait": 2_000_000, "forward": 3_000_000, "backward": 5_000_000, "optimizer": 1_000_000}
OTHER_NS = 500_000


@dataclass
class SynthTotals:
    spans: int = 0
    steps_per_rank: int = 0
    ranks: int = 0
    phase_ns: dict[str, int] = field(default_factory=dict)  # summed over rank 0's steps
    step_ns: int = 0  # rank 0
    #: per generated rank: {"spans", "steps", "step_ns", "phase_ns": {phase: ns}}
    per_rank: dict[int, dict[str, Any]] = field(default_factory=dict)


def generate_run(
    out: str,
    steps: int,
    ranks: int = 1,
    chunk_steps: int = 250_000,
    seed: int = 0,
    host: str = "synth",
    only_ranks: range | None = None,
) -> SynthTotals:
    """Write a run with ``steps`` steps per rank (5 spans per step) into ``out``.

    ``only_ranks`` writes just those ranks of the run, so that a large run can be generated in
    pieces (in parallel): ``out`` is created by the first piece, or earlier by :func:`create_run`;
    call :func:`finish_run` once all pieces are written. Each rank draws from its own seeded
    generator, so a rank's data do not depend on how the run was cut into pieces.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = T0_NS
    if only_ranks is None:
        run_dir = rundir.create_run_dir(out)
    else:
        run_dir = out if os.path.isfile(os.path.join(out, model.MANIFEST)) else create_run(out)
    totals = SynthTotals(steps_per_rank=steps, ranks=ranks)
    names = list(PHASE_MEANS_NS)
    schema = model.arrow_schema("spans")
    end = t0
    for rank in only_ranks if only_ranks is not None else range(ranks):
        rng = np.random.default_rng(seed + rank)
        mine: dict[str, Any] = {"spans": 0, "steps": steps, "step_ns": 0, "phase_ns": {}}
        totals.per_rank[rank] = mine
        pid = 10_000 + rank
        folder = os.path.join(run_dir, f"{host}-{pid}")
        os.makedirs(folder, mode=0o700)
        seq = 0
        clock = t0
        for c0 in range(0, steps, chunk_steps):
            n = min(chunk_steps, steps - c0)
            durs = {
                p: rng.integers(m // 2, m * 3 // 2, size=n, dtype=np.int64) for p, m in PHASE_MEANS_NS.items()
            }
            other = rng.integers(0, 2 * OTHER_NS, size=n, dtype=np.int64)
            step_len = sum(durs.values()) + other
            starts = clock + np.concatenate([[0], np.cumsum(step_len)[:-1]])
            clock = int(starts[-1] + step_len[-1])
            step_idx = np.arange(c0, c0 + n, dtype=np.int64)
            kinds, pnames, s_all, e_all, st_all = [], [], [], [], []
            kinds.append(np.full(n, "step", dtype=object))
            pnames.append(np.full(n, "step", dtype=object))
            s_all.append(starts)
            e_all.append(starts + step_len)
            st_all.append(step_idx)
            off = starts.copy()
            for p in names:
                kinds.append(np.full(n, "phase", dtype=object))
                pnames.append(np.full(n, p, dtype=object))
                s_all.append(off)
                e_all.append(off + durs[p])
                st_all.append(step_idx)
                off = off + durs[p]
                mine["phase_ns"][p] = mine["phase_ns"].get(p, 0) + int(durs[p].sum())
            mine["step_ns"] += int(step_len.sum())
            m = n * (1 + len(names))
            start = np.concatenate(s_all)
            order = np.argsort(start, kind="stable")
            tbl = pa.Table.from_arrays(
                [
                    pa.array(np.full(m, host, dtype=object), pa.string()),
                    pa.array(np.full(m, pid, dtype=np.int64)),
                    pa.array(np.full(m, rank if ranks > 1 else -1, dtype=np.int32)),
                    pa.array(np.full(m, pid, dtype=np.int64)),
                    pa.array(np.arange(seq * 10**9, seq * 10**9 + m, dtype=np.int64)),
                    pa.array(np.zeros(m, dtype=np.int64)),
                    pa.array(np.concatenate(kinds)[order], pa.string()),
                    pa.array(np.concatenate(pnames)[order], pa.string()),
                    pa.array(start[order]),
                    pa.array(np.concatenate(e_all)[order]),
                    pa.array(np.concatenate(st_all)[order]),
                    pa.nulls(m, pa.string()),
                ],
                schema=schema,
            )
            pq.write_table(tbl, os.path.join(folder, f"spans-{seq:08d}.parquet"), compression="zstd")
            seq += 1
            totals.spans += m
            mine["spans"] += m
        _write_process(folder, host, pid, rank if ranks > 1 else -1, ranks, t0, clock, seq)
        _write_samples(folder, host, pid, rank if ranks > 1 else -1, t0, clock, seq + 1)
        end = max(end, clock)
    if 0 in totals.per_rank:
        totals.phase_ns = dict(totals.per_rank[0]["phase_ns"])
        totals.step_ns = int(totals.per_rank[0]["step_ns"])
    if only_ranks is None:
        _write_manifest(run_dir, end)
    return totals


#: start of every generated run (ns since the epoch)
T0_NS = 1_700_000_000 * 10**9


def create_run(out: str) -> str:
    """Create an empty generated run (to be filled by :func:`generate_run` with ``only_ranks``)."""
    run_dir = rundir.create_run_dir(out)
    _write_manifest(run_dir, None)
    return run_dir


def finish_run(out: str) -> None:
    """Record the end of a run generated in pieces (the latest end of its processes)."""
    import pyarrow.parquet as pq

    from holoprof.store.layout import find_chunks

    end = max(
        (
            int(e)
            for f in find_chunks(out).files["processes"]
            for e in pq.read_table(f, columns=["end_ns"])[0]
        ),
        default=T0_NS,
    )
    _write_manifest(out, end)


def _write_manifest(run_dir: str, end: int | None) -> None:
    manifest = rundir.new_manifest(["python", "synthetic.py"], "synthetic", {})
    manifest.update(
        start_ns=T0_NS, end_ns=end, status="finished", exit_code=0, launcher_pid=-1, synthetic=True
    )
    rundir.write_manifest(run_dir, manifest)


def _write_process(
    folder: str, host: str, pid: int, rank: int, world: int, t0: int, t1: int, seq: int
) -> None:
    from holoprof.store.chunks import write_chunk

    row: dict[str, list[Any]] = {
        "host": [host],
        "pid": [pid],
        "rank": [rank],
        "ppid": [1],
        "local_rank": [rank],
        "world_size": [world if rank >= 0 else -1],
        "role": ["rank" if rank >= 0 else "main"],
        "argv": [json.dumps(["synthetic.py"])],
        "exe": ["python"],
        "start_ns": [t0],
        "end_ns": [t1],
        "exit_code": [0],
        "updated_ns": [time.time_ns()],
        "clock_offset_ns": [0],
        "versions": ["{}"],
        "dropped_events": [0],
        "errors": ["[]"],
        "info": ['{"source": "agent"}'],
    }
    write_chunk(folder, "processes", row, seq=seq)


def _write_samples(folder: str, host: str, pid: int, rank: int, t0: int, t1: int, seq: int) -> None:
    from holoprof.store.chunks import write_chunk

    n = max(1, min(100_000, (t1 - t0) // 10**9))
    ts = [t0 + i * 10**9 for i in range(n)]
    write_chunk(
        folder,
        "samples",
        {
            "host": [host] * n,
            "pid": [pid] * n,
            "rank": [rank] * n,
            "ts_ns": ts,
            "name": ["job.cpu_percent"] * n,
            "value": [95.0] * n,
            "target_pid": [-1] * n,
        },
        seq=seq,
    )
