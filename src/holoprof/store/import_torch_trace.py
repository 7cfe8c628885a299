"""`holoprof import torch-trace PATH --out DIR`: PyTorch profiler (Kineto) traces into a holoprof run.

``PATH`` is a Chrome-trace JSON file written by ``torch.profiler`` (``export_chrome_trace`` or
``tensorboard_trace_handler``), gzipped or not, or a directory of them (one per rank). Each file is
streamed (``ijson``), never loaded whole, and written as Parquet chunks of bounded size, so traces
larger than memory import.

What becomes what:

* ``ProfilerStep#N`` → a ``step`` span (step N) of that process and thread;
* ``enumerate(DataLoader)#...`` → ``data_wait``; ``Optimizer.step#...`` and ``Optimizer.zero_grad#...``
  → ``optimizer``; the CPU work of autograd (``autograd::engine::evaluate_function: ...`` and the
  backward ops under it) → ``backward``; the remaining top-level CPU ops of the step's thread before
  backward starts → ``forward``; the split is as good as the trace's annotations (no annotations for
  forward exist in Kineto traces, so forward is what is left between data loading and backward);
* collectives (``c10d::``/``record_param_comms`` CPU ops, ``nccl`` kernels) → ``comm`` spans;
* every CPU op and GPU kernel → an ``op`` span (attrs: category, device, stream, input shapes);
* ``distributedInfo`` → the process's rank and world size.

The run's status is ``imported``; ``holoprof report`` and the analyses work on it as on any run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import IO, Any, cast

from holoprof.errors import HoloprofError, MissingExtraError

CHUNK_ROWS = 200_000
HOST = "kineto"


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", help="a Kineto trace (.json or .json.gz) or a directory of them (one per rank)"
    )
    parser.add_argument("--out", help="run directory to create (default: ./holoprof-runs/<time>-<name>)")


def run_import(args: argparse.Namespace) -> int:
    run_dir = import_torch_trace(args.path, args.out)
    sys.stderr.write(
        f"holoprof: imported {args.path} into {run_dir}; see it with: holoprof report {run_dir}\n"
    )
    return 0


def _trace_files(path: str) -> list[str]:
    if not os.path.exists(path):
        raise HoloprofError(
            f"{path} does not exist; pass a PyTorch profiler trace (.json / .json.gz) or a folder of them"
        )
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, f)
            for f in os.listdir(path)
            if f.endswith((".json", ".json.gz", ".pt.trace.json"))
        )
        if not files:
            raise HoloprofError(
                f"{path} holds no .json or .json.gz trace files; pass the profiler's output folder"
            )
        return files
    return [path]


def _open(path: str) -> IO[bytes]:
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        return cast(IO[bytes], gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb"))
    except OSError as exc:
        raise HoloprofError(f"cannot read {path} ({exc.strerror or exc}); check the path and its permissions")


def _events(path: str) -> Iterator[dict[str, Any]]:
    import ijson

    with _open(path) as f:
        try:
            yield from ijson.items(f, "traceEvents.item", use_float=True)
        except (ijson.JSONError, EOFError, OSError, ValueError) as exc:
            raise HoloprofError(
                f"{path} is not a readable PyTorch profiler trace ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'empty'}); "
                "pass a file written by torch.profiler's export_chrome_trace"
            )


def _header(path: str) -> dict[str, Any]:
    """Top-level fields before traceEvents (Kineto writes them first)."""
    import ijson

    head: dict[str, Any] = {}
    with _open(path) as f:
        try:
            for prefix, event, value in ijson.parse(f, use_float=True):
                if prefix == "traceEvents":
                    break
                if prefix in ("baseTimeNanoseconds", "schemaVersion") and event == "number":
                    head[prefix] = value
                elif prefix == "distributedInfo.rank" and event == "number":
                    head["rank"] = int(value)
                elif prefix == "distributedInfo.world_size" and event == "number":
                    head["world_size"] = int(value)
                elif prefix == "distributedInfo.backend" and event == "string":
                    head["backend"] = value
        except (ijson.JSONError, EOFError, OSError, ValueError) as exc:
            raise HoloprofError(
                f"{path} is not a readable PyTorch profiler trace ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'empty'}); "
                "pass a file written by torch.profiler's export_chrome_trace"
            )
    return head


def _phase_of(name: str, cat: str) -> str | None:
    if name.startswith("enumerate(DataLoader)"):
        return "data_wait"
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return "optimizer"
    return None


def _is_comm(name: str, cat: str) -> bool:
    n = name.lower()
    return n.startswith(("c10d::", "record_param_comms", "nccl:")) or (cat == "kernel" and "nccl" in n)


class _Writer:
    """Buffers rows of one process folder and writes Parquet chunks of bounded size."""

    def __init__(self, folder: str, base: dict[str, Any]) -> None:
        self.folder = folder
        self.base = base
        self.rows: list[tuple[Any, ...]] = []
        self.seq = 0
        self.ids = 0
        self.total = 0

    def add(
        self, tid: int, kind: str, name: str, s: int, e: int, step: int, attrs: dict[str, Any] | None
    ) -> None:
        self.ids += 1
        self.rows.append(
            (tid, self.ids, 0, kind, name, s, e, step, None if attrs is None else json.dumps(attrs))
        )
        if len(self.rows) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        from holoprof.store.chunks import write_chunk

        if not self.rows:
            return
        n = len(self.rows)
        cols = list(zip(*self.rows, strict=True))
        names = ("tid", "span_id", "parent_id", "kind", "name", "start_ns", "end_ns", "step", "attrs")
        data: dict[str, list[Any]] = {k: [v] * n for k, v in self.base.items()}
        data.update({k: list(c) for k, c in zip(names, cols, strict=True)})
        write_chunk(self.folder, "spans", data, seq=self.seq)
        self.seq += 1
        self.total += n
        self.rows = []


def import_torch_trace(path: str, out: str | None = None) -> str:
    """Import one trace file or a folder of per-rank traces into a new run directory."""
    try:
        import ijson  # noqa: F401
    except ImportError:
        raise MissingExtraError("importing PyTorch profiler traces", "torch", "ijson")
    from holoprof.store import rundir
    from holoprof.store.chunks import write_chunk
    from holoprof.store.compact import compact_run

    files = _trace_files(path)
    heads = [_header(f) for f in files]
    name = os.path.basename(os.path.normpath(path)).split(".")[0] or "torch-trace"
    run_dir = rundir.create_run_dir(out or rundir.default_run_dir(name))
    t_min: int | None = None
    t_max = 0
    for idx, (f, head) in enumerate(zip(files, heads, strict=True)):
        rank = int(head.get("rank", idx if len(files) > 1 else -1))
        world = int(head.get("world_size", len(files) if len(files) > 1 else -1))
        base_ns = int(head.get("baseTimeNanoseconds", 0))
        pid_main = None
        folder = None
        writer: _Writer | None = None
        steps: list[tuple[int, int, int, int]] = []  # (tid, step, s, e)
        autograd: dict[int, list[int]] = {}  # step -> [first start, last end] of backward work
        top: list[tuple[int, int, int, str]] = []  # (tid, s, e, name) top-level cpu ops, for forward
        for ev in _events(f):
            if ev.get("ph") != "X":
                continue
            name = str(ev.get("name", ""))
            cat = str(ev.get("cat", ""))
            try:
                s = int(float(ev["ts"]) * 1000) + base_ns
                e = s + int(float(ev.get("dur", 0)) * 1000)
            except (KeyError, TypeError, ValueError):
                continue
            pid = int(ev.get("pid", 0)) if str(ev.get("pid", "0")).lstrip("-").isdigit() else 0
            tid = int(ev.get("tid", 0)) if str(ev.get("tid", "0")).lstrip("-").isdigit() else 0
            if writer is None:
                pid_main = pid
                folder = os.path.join(run_dir, f"{HOST}-{rank if rank >= 0 else pid}")
                os.makedirs(folder, mode=0o700, exist_ok=True)
                writer = _Writer(folder, {"host": HOST, "pid": rank if rank >= 0 else pid, "rank": rank})
            t_min = s if t_min is None else min(t_min, s)
            t_max = max(t_max, e)
            if name.startswith("ProfilerStep#"):
                try:
                    n = int(name.split("#", 1)[1])
                except ValueError:
                    continue
                steps.append((tid, n, s, e))
                writer.add(tid, "step", "step", s, e, n, None)
                continue
            phase = _phase_of(name, cat)
            if phase is not None:
                writer.add(tid, "phase", phase, s, e, -2, {"source": name.split("#")[0]})
                continue
            if cat in ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "python_function"):
                args = ev.get("args") or {}
                attrs: dict[str, Any] = {"cat": cat}
                if cat == "kernel":
                    attrs["device"] = args.get("device")
                    attrs["stream"] = args.get("stream")
                elif "Input Dims" in args:
                    attrs["shapes"] = args.get("Input Dims")
                writer.add(tid, "comm" if _is_comm(name, cat) else "op", name, s, e, -1, attrs)
                if cat == "cpu_op":
                    if name.startswith("autograd::engine::evaluate_function"):
                        autograd.setdefault(tid, []).append(s)
                        autograd.setdefault(-tid - 1, []).append(e)
                    else:
                        top.append((tid, s, e, name))
        if writer is None or folder is None:
            continue
        # phases derived per step: backward = the span of autograd work, forward = what precedes it
        for tid, n, s, e in steps:
            bw_starts = [x for x in autograd.get(tid, []) if s <= x < e]
            bw_ends = [x for x in autograd.get(-tid - 1, []) if s < x <= e]
            if bw_starts and bw_ends:
                b0, b1 = min(bw_starts), max(bw_ends)
                writer.add(tid, "phase", "backward", b0, b1, n, {"derived": "autograd span"})
                fw = [
                    (a, b)
                    for t2, a, b, nm in top
                    if t2 == tid and s <= a and b <= b0 and not nm.startswith("Optimizer")
                ]
                if fw:
                    writer.add(
                        tid,
                        "phase",
                        "forward",
                        min(a for a, _ in fw),
                        max(b for _, b in fw),
                        n,
                        {"derived": "ops before backward"},
                    )
        writer.flush()
        _assign_steps(folder)
        now = time.time_ns()
        write_chunk(
            folder,
            "processes",
            {
                "host": [HOST],
                "pid": [rank if rank >= 0 else (pid_main or 0)],
                "rank": [rank],
                "ppid": [-1],
                "local_rank": [-1],
                "world_size": [world],
                "role": ["rank" if rank >= 0 else "main"],
                "argv": [json.dumps([os.path.basename(f)])],
                "exe": [""],
                "start_ns": [t_min or 0],
                "end_ns": [t_max],
                "exit_code": [0],
                "updated_ns": [now],
                "clock_offset_ns": [0],
                "versions": ["{}"],
                "dropped_events": [0],
                "errors": ["[]"],
                "info": [
                    json.dumps(
                        {
                            "source": "agent",
                            "imported": "torch-trace",
                            "file": f,
                            "backend": head.get("backend"),
                        }
                    )
                ],
            },
            seq=10**7,
        )
    compact_run(run_dir)
    manifest = rundir.new_manifest([f"torch-trace {path}"], name, {})
    manifest.update(
        status="imported",
        start_ns=t_min or 0,
        end_ns=t_max,
        exit_code=0,
        launcher_pid=-1,
        source={"format": "torch-trace", "path": os.path.abspath(path), "files": len(files)},
    )
    rundir.write_manifest(run_dir, manifest)
    return run_dir


def _assign_steps(folder: str) -> None:
    """Give data_wait/optimizer spans (written with step -2) the index of the step that holds them."""
    import duckdb
    import pyarrow.parquet as pq

    from holoprof.store.layout import folder_chunks

    parts = [p for _, p in sorted(folder_chunks(folder).get("spans", ([], []))[1])]
    if not parts:
        return
    con = duckdb.connect()
    lst = "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in parts) + "]"
    tbl = con.sql(
        f"""WITH s AS (SELECT * FROM read_parquet({lst})),
                 st AS (SELECT tid AS st_tid, step AS n, start_ns AS a, end_ns AS b FROM s WHERE kind = 'step')
            SELECT s.* REPLACE (CASE WHEN s.step = -2 THEN
                       (CASE WHEN st.n IS NOT NULL AND s.start_ns < st.b THEN st.n ELSE -1 END)
                       ELSE s.step END AS step)
            FROM s ASOF LEFT JOIN st ON s.tid = st.st_tid AND s.start_ns >= st.a
            ORDER BY s.start_ns"""
    ).to_arrow_table()
    from holoprof import model

    tbl = tbl.cast(model.arrow_schema("spans"))
    dest = os.path.join(folder, f"spans-c{0:08d}-{len(parts) - 1:08d}.parquet")
    pq.write_table(tbl, dest + ".tmp", compression="zstd")
    os.replace(dest + ".tmp", dest)
    for p in parts:
        os.remove(p)
