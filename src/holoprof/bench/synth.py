"""Generate large, realistic runs with known totals (for benchmarks and scale tests).

A generated run looks like what the agent writes: per rank a partition of each table with Parquet chunks of
steps and phases (data_wait, forward, backward, optimizer), resource samples, and a processes row.
With ``comm=True`` each step also has DDP's gradient buckets (``ddp_bucket`` comm spans overlapped with
backward, the end of backward after the last one was ready a ``communication`` phase) and an exposed
loss ``all_reduce`` in a ``communication`` phase; with ``io_files=N`` each
rank reads N shard files of its own and one file shared by all ranks, recorded as Darshan-style
``io_files`` snapshots (one mid-run, one final). Durations, read counts and sizes are drawn around
fixed means with a seeded generator, and the exact totals are returned so that analyses can be
checked against them. With ``checkpoint_every=K`` each rank saves a checkpoint (a blocking
``checkpoint`` phase on the training thread, ``torch.save`` of ``CHECKPOINT_BYTES``) after every K-th
step, before the next step starts, recorded under the index of the step it follows, as the agent does.
With ``io_ops=True`` each step's data wait reads its batch from the rank's training file, and the
read is recorded in ``io_ops`` as the per-operation I/O trace records it: one ``read`` per step, at
the offset where the previous one ended, of one of READ_SIZES, lasting half the data wait at most.
With ``memory_every=M`` every M-th step (from step 0) has the agent's sampled memory snapshots at the
ends of its forward, backward and optimizer phases (spans of kind ``op``, name ``memory``): constant
weights, gradients and optimizer state (MODEL_BYTES, MODEL_BYTES, 2 x MODEL_BYTES), activations
drawn per step and alive after the forward only, and ``other`` drawn per snapshot.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from holoprof import model
from holoprof.store import layout, rundir
from holoprof.store.chunks import write_chunk
from holoprof.store.convert import find_chunks

#: mean phase durations (ns) of a generated step
PHASE_MEANS_NS = {"data_wait": 2_000_000, "forward": 3_000_000, "backward": 5_000_000, "optimizer": 1_000_000}
OTHER_NS = 500_000
#: with ``comm=True``: the exposed loss all_reduce (a ``communication`` phase holding one comm span)
COMM_PHASE_MEAN_NS = 1_500_000
#: with ``comm=True``: the bytes of DDP's gradient buckets, in the order they become ready
BUCKET_BYTES = (25 * 2**20, 25 * 2**20, 25 * 2**20, 10 * 2**20)
LOSS_BYTES = 4
#: with ``io_files``: the read sizes a file is read with (one size per file, drawn)
READ_SIZES = (4096, 65536, 2**20)
SHARED_FILE = "/data/vocab.json"
#: with ``checkpoint_every``: a checkpoint's mean duration and size
CHECKPOINT_MEAN_NS = 200_000_000
CHECKPOINT_BYTES = 512 * 2**20
#: with ``memory_every``: the weights' bytes, the range of a step's activations and of ``other``
MODEL_BYTES = 400 * 2**20
ACTIVATION_BYTES = (2**30, 3 * 2**30)
OTHER_BYTES = (100 * 2**20, 300 * 2**20)
MEMORY_LIMIT_BYTES = 64 * 2**30


@dataclass
class SynthTotals:
    spans: int = 0
    steps_per_rank: int = 0
    ranks: int = 0
    phase_ns: dict[str, int] = field(default_factory=dict)  # summed over rank 0's steps
    step_ns: int = 0  # rank 0
    #: per generated rank: {"spans", "steps", "step_ns", "phase_ns": {phase: ns}} and, with comm,
    #: "comm_ns" (the union of its comm spans over its steps) and "exposed_ns"
    per_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: with comm, per collective over all ranks: {"count", "bytes", "dur_ns"}
    comm: dict[str, dict[str, int]] = field(default_factory=dict)
    #: with io_files, over all ranks: "paths", "bytes_read", "reads", "opens", "read_time_s",
    #: "meta_time_s", "size_read" ({Darshan bucket: reads})
    io: dict[str, Any] = field(default_factory=dict)
    #: with checkpoint_every, per rank: {"count", "bytes", "dur_ns"} of its checkpoints
    checkpoints: dict[int, dict[str, int]] = field(default_factory=dict)
    #: with io_ops, over all ranks: {"count", "bytes", "dur_ns"} of the per-operation reads
    io_ops: dict[str, int] = field(default_factory=dict)
    #: with memory_every, per rank: "snapshots" (count), "peak_step" (the sampled step of the largest
    #: tensor footprint), "categories" (that step's, each at its largest over the step; ``other`` at
    #: the step's largest total) and "peak_bytes" (the largest total of any snapshot)
    memory: dict[int, dict[str, Any]] = field(default_factory=dict)


def generate_run(
    out: str,
    steps: int,
    ranks: int = 1,
    chunk_steps: int = 250_000,
    seed: int = 0,
    host: str = "synth",
    only_ranks: range | None = None,
    comm: bool = False,
    io_files: int = 0,
    checkpoint_every: int = 0,
    io_ops: bool = False,
    memory_every: int = 0,
    t0_ns: int | None = None,
    samples: bool = True,
) -> SynthTotals:
    """Write a run with ``steps`` steps per rank (5 spans per step) into ``out``.

    ``only_ranks`` writes just those ranks of the run, so that a large run can be generated in
    pieces (in parallel): ``out`` is created by the first piece, or earlier by :func:`create_run`;
    call :func:`finish_run` once all pieces are written. Each rank draws from its own seeded
    generator, so a rank's data do not depend on how the run was cut into pieces. ``comm`` and
    ``io_files`` add communication and I/O records, ``io_ops`` a per-operation read per step and
    ``memory_every`` memory snapshots (see the module's docstring): 6 more spans and two more
    phases per step with ``comm``. ``t0_ns``: when the ranks start (:data:`T0_NS` by default), on the
    clock of ``host``; ``samples=False`` leaves out each rank's job-wide CPU samples (for a caller that
    writes its hosts' samples itself, as :mod:`holoprof.bench.synth_hosts` does).
    """
    if only_ranks is None:
        run_dir = rundir.create_run_dir(out)
    else:
        run_dir = out if os.path.isfile(os.path.join(out, model.MANIFEST)) else create_run(out)
    totals = SynthTotals(steps_per_rank=steps, ranks=ranks)
    t0 = T0_NS if t0_ns is None else int(t0_ns)
    opts = _Options(
        steps, ranks, chunk_steps, seed, host, comm, io_files, checkpoint_every, io_ops, memory_every, t0,
        samples,
    )  # fmt: skip
    end = t0
    for rank in only_ranks if only_ranks is not None else range(ranks):
        end = max(end, _RankWriter(run_dir, rank, opts, totals).write())
    if 0 in totals.per_rank:
        totals.phase_ns = dict(totals.per_rank[0]["phase_ns"])
        totals.step_ns = int(totals.per_rank[0]["step_ns"])
    if only_ranks is None:
        _write_manifest(run_dir, end)
    return totals


@dataclass(frozen=True)
class _Options:
    """The arguments of :func:`generate_run` that shape every rank."""

    steps: int
    ranks: int
    chunk_steps: int
    seed: int
    host: str
    comm: bool
    io_files: int
    checkpoint_every: int
    io_ops: bool
    memory_every: int
    t0_ns: int = 0  # generate_run passes it (T0_NS by default)
    samples: bool = True


class _RankWriter:
    """One rank of a generated run: its spans chunk by chunk, then its process row, samples and I/O."""

    def __init__(self, run_dir: str, rank: int, opts: _Options, totals: SynthTotals) -> None:
        import numpy as np  # lazy: loaded only when a run is generated

        self.opts = opts
        self.totals = totals
        self.folder = run_dir  # write_chunk puts each table's rows into the run's table folders
        self.rng = np.random.default_rng(opts.seed + rank)
        self.mine: dict[str, Any] = {"spans": 0, "steps": opts.steps, "step_ns": 0, "phase_ns": {}}
        totals.per_rank[rank] = self.mine
        self.rank = rank
        self.rank_col = rank if opts.ranks > 1 else -1  # the rank column: -1 in a single-process run
        self.pid = 10_000 + rank
        self.spans_dir = layout.partition_dir(run_dir, "spans", opts.host, self.pid)
        os.makedirs(self.spans_dir, mode=0o700)
        self.seq = 0
        self.clock = opts.t0_ns
        self.offset = 0  # with io_ops: where the rank's next read starts in its training file
        self.io_rng = np.random.default_rng(
            (opts.seed + rank, 1)
        )  # its own: the steps are the same without it
        self.mem_rng = np.random.default_rng((opts.seed + rank, 2))

    def write(self) -> int:
        """Write the rank; returns the end of its last step (ns)."""
        opts = self.opts
        for c0 in range(0, opts.steps, opts.chunk_steps):
            self._chunk(c0, min(opts.chunk_steps, opts.steps - c0))
        t0, t1, host, folder = opts.t0_ns, self.clock, opts.host, self.folder
        _write_process(folder, host, self.pid, self.rank_col, opts.ranks, t0, t1, self.seq)
        if opts.samples:
            _write_samples(folder, host, self.pid, self.rank_col, t0, t1, self.seq + 1)
        if opts.io_files:
            _write_io(
                folder,
                self.rng,
                self.totals,
                host,
                self.pid,
                self.rank_col,
                opts.io_files,
                t0,
                t1,
                self.seq + 2,
            )
        return self.clock

    def _chunk(self, c0: int, n: int) -> None:
        """Steps ``c0`` to ``c0 + n - 1``: their spans as one Parquet chunk."""
        durs, step_len, step_idx, ckpt, starts = _draw_steps(self.rng, self.opts, c0, n, self.clock)
        self.clock = int(starts[-1] + step_len[-1] + ckpt[-1])
        out, phase_start = _step_and_phase_spans(durs, starts, step_len, step_idx, self.opts.comm, self.mine)
        self._add_records(out, phase_start, durs, starts + step_len, ckpt, step_idx)
        self.mine["step_ns"] += int(step_len.sum())
        m = _write_spans(self.spans_dir, self.seq, out, self.opts.host, self.pid, self.rank_col)
        self.seq += 1
        self.totals.spans += m
        self.mine["spans"] += m

    def _add_records(
        self,
        out: tuple[list[Any], ...],
        phase_start: dict[str, Any],
        durs: dict[str, Any],
        step_end: Any,
        ckpt: Any,
        step_idx: Any,
    ) -> None:
        """The chunk's optional records: memory snapshots, checkpoints, comm spans, per-operation reads."""
        opts, totals, rank = self.opts, self.totals, self.rank
        if opts.memory_every:
            _memory(self.mem_rng, totals, rank, opts.memory_every, phase_start, durs, step_idx, out)
        if opts.checkpoint_every:
            _checkpoints(totals, rank, step_end, ckpt, step_idx, out)
        if opts.comm:
            _comm_spans(
                self.rng, totals, self.mine, phase_start["backward"], durs["backward"], phase_start["communication"],
                durs["communication"], step_idx, opts.ranks, out,
            )  # fmt: skip
        if opts.io_ops:
            self.offset = _io_ops(
                self.folder, self.io_rng, totals, opts.host, self.pid, self.rank_col, phase_start["data_wait"],
                durs["data_wait"], self.offset, self.seq,
            )  # fmt: skip


def _draw_steps(
    rng: Any, opts: _Options, c0: int, n: int, clock: int
) -> tuple[dict[str, Any], Any, Any, Any, Any]:
    """The durations of ``n`` steps from ``c0`` starting at ``clock``: (phase durations, step lengths,
    step indices, the checkpoint after each step (0: none), step starts)."""
    import numpy as np  # lazy: loaded only when a run is generated

    durs = {p: rng.integers(m // 2, m * 3 // 2, size=n, dtype=np.int64) for p, m in PHASE_MEANS_NS.items()}
    if opts.comm:
        m_c = COMM_PHASE_MEAN_NS
        durs["communication"] = rng.integers(m_c // 2, m_c * 3 // 2, size=n, dtype=np.int64)
    other = rng.integers(0, 2 * OTHER_NS, size=n, dtype=np.int64)
    step_len = sum(durs.values()) + other
    step_idx = np.arange(c0, c0 + n, dtype=np.int64)
    ckpt = np.zeros(n, dtype=np.int64)  # the checkpoint after each step (0: none)
    if opts.checkpoint_every:
        at = (step_idx + 1) % opts.checkpoint_every == 0
        m_k = CHECKPOINT_MEAN_NS
        ckpt[at] = rng.integers(m_k // 2, m_k * 3 // 2, size=int(at.sum()), dtype=np.int64)
    starts = clock + np.concatenate([[0], np.cumsum(step_len + ckpt)[:-1]])
    return durs, step_len, step_idx, ckpt, starts


def _step_and_phase_spans(
    durs: dict[str, Any], starts: Any, step_len: Any, step_idx: Any, comm: bool, mine: dict[str, Any]
) -> tuple[tuple[list[Any], ...], dict[str, Any]]:
    """The chunk's step and phase spans (kinds, names, starts, ends, steps, attrs), and where each
    phase starts; adds the phases' time to ``mine["phase_ns"]``."""
    import numpy as np  # lazy: loaded only when a run is generated
    import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module

    n = len(step_idx)
    kinds, pnames, s_all, e_all, st_all = [], [], [], [], []
    attrs: list[Any] = []
    kinds.append(np.full(n, "step", dtype=object))
    pnames.append(np.full(n, "step", dtype=object))
    s_all.append(starts)
    e_all.append(starts + step_len)
    st_all.append(step_idx)
    off = starts.copy()
    phase_start = {}
    for p in durs:
        # with comm, backward's phase ends when DDP's last bucket is ready; the rest of the
        # backward call (waiting for the allreduce) is a `communication` phase, as recorded
        pieces = [(p, off, durs[p])]
        if comm and p == "backward":
            compute = len(BUCKET_BYTES) * (durs[p] // 5)
            pieces = [(p, off, compute), ("communication", off + compute, durs[p] - compute)]
        for name, at, dur in pieces:
            kinds.append(np.full(n, "phase", dtype=object))
            pnames.append(np.full(n, name, dtype=object))
            s_all.append(at)
            e_all.append(at + dur)
            st_all.append(step_idx)
            mine["phase_ns"][name] = mine["phase_ns"].get(name, 0) + int(dur.sum())
        phase_start[p] = off
        off = off + durs[p]
    attrs.append(pa.nulls(sum(len(k) for k in kinds), pa.string()))
    return (kinds, pnames, s_all, e_all, st_all, attrs), phase_start


def _write_spans(spans_dir: str, seq: int, out: tuple[list[Any], ...], host: str, pid: int, rank: int) -> int:
    """The chunk's spans, sorted by start, as Parquet part ``seq``; returns their number."""
    import numpy as np  # lazy: loaded only when a run is generated
    import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module
    import pyarrow.parquet as pq  # lazy: pyarrow loads only where chunks are written or read, not with the module

    kinds, pnames, s_all, e_all, st_all, attrs = out
    start = np.concatenate(s_all)
    m = len(start)
    order = np.argsort(start, kind="stable")
    tbl = pa.Table.from_arrays(
        [
            pa.array(np.full(m, host, dtype=object), pa.string()),
            pa.array(np.full(m, pid, dtype=np.int64)),
            pa.array(np.full(m, rank, dtype=np.int32)),
            pa.array(np.full(m, pid, dtype=np.int64)),
            pa.array(np.arange(seq * 10**9, seq * 10**9 + m, dtype=np.int64)),
            pa.array(np.zeros(m, dtype=np.int64)),
            pa.array(np.concatenate(kinds)[order], pa.string()),
            pa.array(np.concatenate(pnames)[order], pa.string()),
            pa.array(start[order]),
            pa.array(np.concatenate(e_all)[order]),
            pa.array(np.concatenate(st_all)[order]),
            pa.concat_arrays(attrs).take(pa.array(order)),
        ],
        schema=model.arrow_schema("spans"),
    )
    pq.write_table(tbl, os.path.join(spans_dir, layout.part_name(seq)), compression="zstd")
    return m


def _comm_spans(
    rng: Any,
    totals: SynthTotals,
    mine: dict[str, Any],
    bw_start: Any,
    bw_dur: Any,
    cp_start: Any,
    cp_dur: Any,
    step_idx: Any,
    world: int,
    out: tuple[list[Any], ...],
) -> None:
    """A chunk's comm spans, appended to ``out`` (kinds, names, starts, ends, steps, attrs).

    Bucket ``j`` becomes ready ``(j + 1) / 5`` into backward and takes at most a fifth of it, so the
    buckets never overlap and all end within backward; the loss all_reduce fills its communication
    phase. The exposed time of a step is its communication phases: the loss all_reduce's and the end
    of backward after the last bucket was ready (which holds the last bucket's allreduce). Its
    communication is the union of those phases and of the comm spans: the phases and the buckets
    before the last."""
    import numpy as np  # lazy: numpy loads only where arrays are built
    import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module
    import pyarrow.compute as pc  # lazy: pyarrow loads only where chunks are written or read, not with the module

    kinds, pnames, s_all, e_all, st_all, attrs = out
    n = len(step_idx)
    fifth = bw_dur // 5
    union = cp_dur.copy()
    for j, nbytes in enumerate(BUCKET_BYTES):
        ready = bw_start + (j + 1) * fifth
        dur = rng.integers(fifth // 2, fifth + 1, dtype=np.int64)
        kinds.append(np.full(n, "comm", dtype=object))
        pnames.append(np.full(n, "ddp_bucket", dtype=object))
        s_all.append(ready)
        e_all.append(ready + dur)
        st_all.append(step_idx)
        head = f'{{"bucket_index": {j}, "bytes": {nbytes}, "world_size": {world}, "ready_ns": '
        attrs.append(pc.binary_join_element_wise(head, pc.cast(pa.array(ready), pa.string()), "}", ""))
        _count(totals, "ddp_bucket", n, n * nbytes, int(dur.sum()))
        if j < len(BUCKET_BYTES) - 1:
            union = union + dur
    tail = bw_dur - len(BUCKET_BYTES) * fifth
    kinds.append(np.full(n, "comm", dtype=object))
    pnames.append(np.full(n, "all_reduce", dtype=object))
    s_all.append(cp_start)
    e_all.append(cp_start + cp_dur)
    st_all.append(step_idx)
    attrs.append(
        pa.array(np.full(n, f'{{"bytes": {LOSS_BYTES}, "group_size": {world}}}', dtype=object), pa.string())
    )
    _count(totals, "all_reduce", n, n * LOSS_BYTES, int(cp_dur.sum()))
    mine["comm_ns"] = mine.get("comm_ns", 0) + int((union + tail).sum())
    mine["exposed_ns"] = mine.get("exposed_ns", 0) + int((cp_dur + tail).sum())


def _checkpoints(
    totals: SynthTotals, rank: int, after: Any, dur: Any, step_idx: Any, out: tuple[list[Any], ...]
) -> None:
    """A chunk's checkpoint phases (``dur`` > 0 after a step ending at ``after``), appended to ``out``."""
    import numpy as np  # lazy: numpy loads only where arrays are built
    import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module

    kinds, pnames, s_all, e_all, st_all, attrs = out
    at = dur > 0
    k = int(at.sum())
    kinds.append(np.full(k, "phase", dtype=object))
    pnames.append(np.full(k, "checkpoint", dtype=object))
    s_all.append(after[at])
    e_all.append(after[at] + dur[at])
    st_all.append(step_idx[at])
    attrs.append(
        pa.array(
            [
                json.dumps(
                    {
                        "op": "save",
                        "api": "torch.save",
                        "path": f"/ckpt/rank{rank}-step{i}.pt",
                        "bytes": CHECKPOINT_BYTES,
                    }
                )
                for i in step_idx[at].tolist()
            ],
            pa.string(),
        )
    )
    c = totals.checkpoints.setdefault(rank, {"count": 0, "bytes": 0, "dur_ns": 0})
    c["count"] += k
    c["bytes"] += k * CHECKPOINT_BYTES
    c["dur_ns"] += int(dur.sum())


def _memory(
    rng: Any,
    totals: SynthTotals,
    rank: int,
    every: int,
    phase_start: dict[str, Any],
    durs: dict[str, Any],
    step_idx: Any,
    out: tuple[list[Any], ...],
) -> None:
    """A chunk's memory snapshots (every ``every``-th step), appended to ``out``; ``totals.memory``
    keeps the rank's peak as the report computes it (see :mod:`holoprof.analyze.memory`)."""
    import numpy as np  # lazy: numpy loads only where arrays are built
    import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module

    kinds, pnames, s_all, e_all, st_all, attrs = out
    at = step_idx % every == 0
    k = int(at.sum())
    if not k:
        return
    act = rng.integers(*ACTIVATION_BYTES, size=k, dtype=np.int64)
    mine = totals.memory.setdefault(
        rank, {"snapshots": 0, "peak_step": None, "categories": {}, "peak_bytes": 0}
    )
    steps = step_idx[at].tolist()
    for phase in ("forward", "backward", "optimizer"):
        ts = (phase_start[phase] + durs[phase])[at]
        other = rng.integers(*OTHER_BYTES, size=k, dtype=np.int64)
        texts = []
        for step, a, o in zip(steps, act.tolist(), other.tolist(), strict=True):
            cats = {
                "weights": MODEL_BYTES, "gradients": MODEL_BYTES, "optimizer_state": 2 * MODEL_BYTES,
                "activations": a if phase == "forward" else 0, "other": o,
            }  # fmt: skip
            total = sum(cats.values())
            texts.append(json.dumps({
                "step": step, "phase": phase, "device": "cpu", "mode": "sampled", "rss_bytes": total,
                "limit_bytes": MEMORY_LIMIT_BYTES, "limit_source": "machine", "other_basis": "rss",
                "total_bytes": total, "categories": cats,
            }))  # fmt: skip
            mine["peak_bytes"] = max(mine["peak_bytes"], total)
            if phase == "forward":  # the step's largest total, and its only activations
                best = mine["categories"]
                footprint = 4 * MODEL_BYTES + a
                if not best or footprint >= sum(v for c, v in best.items() if c != "other"):
                    mine["peak_step"], mine["categories"] = step, dict(cats)
        kinds.append(np.full(k, "op", dtype=object))
        pnames.append(np.full(k, "memory", dtype=object))
        s_all.append(ts)
        e_all.append(ts)
        st_all.append(step_idx[at])
        attrs.append(pa.array(texts, pa.string()))
    mine["snapshots"] += 3 * k


def _io_ops(
    folder: str,
    rng: Any,
    totals: SynthTotals,
    host: str,
    pid: int,
    rank: int,
    wait_start: Any,
    wait_dur: Any,
    offset: int,
    seq: int,
) -> int:
    """A chunk's per-operation reads (one per step, within its data wait), written as an ``io_ops``
    chunk; returns the offset after the last one."""
    import numpy as np  # lazy: numpy loads only where arrays are built

    n = len(wait_start)
    sizes = rng.choice(np.array(READ_SIZES, dtype=np.int64), size=n)
    dur = rng.integers(1, wait_dur // 2 + 1, dtype=np.int64)
    offsets = offset + np.concatenate([[0], np.cumsum(sizes)[:-1]])
    path = f"/data/train-{max(rank, 0):05d}.bin"
    rows: dict[str, Any] = {
        "host": np.full(n, host, dtype=object), "pid": np.full(n, pid, dtype=np.int64),
        "rank": np.full(n, rank, dtype=np.int32), "module": np.full(n, "POSIX", dtype=object),
        "path": np.full(n, path, dtype=object), "op": np.full(n, "read", dtype=object), "offset": offsets,
        "size_bytes": sizes, "start_ns": wait_start, "end_ns": wait_start + dur,
    }  # fmt: skip
    write_chunk(folder, "io_ops", rows, seq=seq)
    c = totals.io_ops
    c["count"] = c.get("count", 0) + n
    c["bytes"] = c.get("bytes", 0) + int(sizes.sum())
    c["dur_ns"] = c.get("dur_ns", 0) + int(dur.sum())
    return int(offset + sizes.sum())


def _count(totals: SynthTotals, op: str, calls: int, nbytes: int, dur_ns: int) -> None:
    c = totals.comm.setdefault(op, {"count": 0, "bytes": 0, "dur_ns": 0})
    c["count"] += calls
    c["bytes"] += nbytes
    c["dur_ns"] += dur_ns


def _write_io(
    folder: str,
    rng: Any,
    totals: SynthTotals,
    host: str,
    pid: int,
    rank: int,
    files: int,
    t0: int,
    t1: int,
    seq: int,
) -> None:
    """``files`` shard files of this rank and the shared file, each read with one size: a snapshot of
    its counters half-way through the run (half its reads done) and the final one at the end."""
    import numpy as np  # lazy: numpy loads only where arrays are built

    tag = rank if rank >= 0 else 0
    paths = [f"/data/shard-{tag:05d}-{i:05d}.bin" for i in range(files)] + [SHARED_FILE]
    reads = rng.integers(50, 500, size=len(paths), dtype=np.int64)
    sizes = rng.choice(np.array(READ_SIZES, dtype=np.int64), size=len(paths))
    read_ns = rng.integers(1_000_000, 50_000_000, size=len(paths), dtype=np.int64)
    meta_ns = rng.integers(10_000, 200_000, size=len(paths), dtype=np.int64)
    mid = t0 + (t1 - t0) // 2
    io = totals.io
    if not io:
        io.update(paths=set(), bytes_read=0, reads=0, opens=0, read_time_s=0.0, meta_time_s=0.0, size_read={})
    rows: dict[str, list[Any]] = {
        k: [] for k in ("host", "pid", "rank", "ts_ns", "module", "layer", "path", "counters")
    }
    for path, r, size, rt, mt in zip(
        paths, reads.tolist(), sizes.tolist(), read_ns.tolist(), meta_ns.tolist(), strict=True
    ):
        bucket = next(b for b, lo, hi in model.DARSHAN_SIZE_BUCKETS if lo <= size < hi)
        for ts, k in ((mid, r // 2), (t1, r)):
            c = {
                "POSIX_OPENS": 1,
                "POSIX_READS": k,
                "POSIX_BYTES_READ": k * size,
                "POSIX_SEQ_READS": max(0, k - 1),
                "POSIX_CONSEC_READS": max(0, k - 1),
                "POSIX_MAX_BYTE_READ": max(0, k * size - 1),
                f"POSIX_SIZE_READ_{bucket}": k,
                "POSIX_F_READ_START_TIMESTAMP": t0 / 1e9 + 0.001,
                "POSIX_F_READ_END_TIMESTAMP": ts / 1e9,
                "POSIX_F_READ_TIME": rt * k / r / 1e9,
                "POSIX_F_META_TIME": mt / 1e9,
            }
            for key, v in (("host", host), ("pid", pid), ("rank", rank), ("ts_ns", ts), ("module", "POSIX"),
                           ("layer", "python"), ("path", path), ("counters", json.dumps(c))):  # fmt: skip
                rows[key].append(v)
        io["paths"].add(path)
        io["bytes_read"] += r * size
        io["reads"] += r
        io["opens"] += 1
        io["read_time_s"] += rt / 1e9
        io["meta_time_s"] += mt / 1e9
        io["size_read"][bucket] = io["size_read"].get(bucket, 0) + r
    write_chunk(folder, "io_files", rows, seq=seq)


#: start of every generated run (ns since the epoch)
T0_NS = 1_700_000_000 * 10**9


def create_run(out: str) -> str:
    """Create an empty generated run (to be filled by :func:`generate_run` with ``only_ranks``)."""
    run_dir = rundir.create_run_dir(out)
    _write_manifest(run_dir, None)
    return run_dir


def finish_run(out: str) -> None:
    """Record the end of a run generated in pieces (the latest end of its processes)."""
    import pyarrow.parquet as pq  # lazy: pyarrow loads only where chunks are written or read, not with the module

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
