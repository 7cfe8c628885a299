"""`holoprof export` (Chrome trace and TensorBoard) of a large run, on DuckDB and on Dask.

python benchmarks/bench_export_scale.py [--run DIR | --steps 2000000 [--io-ops]]
                                        [--formats chrome,tensorboard] [--engines duckdb,dask]

Without --run it generates a run of --steps steps on one rank (5 spans per step: 10 M spans by
default; with --io-ops, one per-operation read per step too) in a temporary folder. For the 100 M-span run over 64 ranks, generate it first with
`benchmarks/bench_report_100m.py --out DIR --phase generate` and pass `--run DIR`.

Each export is the command a user runs (`holoprof export RUN -f FORMAT -o OUT [--engine dask]`,
Dask: a local cluster of 2 worker processes that the command starts). Memory is sampled every
0.1 s with psutil: "client" is the peak resident set of the exporting process, "worker" the
largest peak of its descendant processes (the Dask workers), "temporary files" the peak size of
the command's TMPDIR (sampled every second: DuckDB's spilled sort runs, the Dask client's spool
and the workers' scratch space). The outputs of both engines are compared: the Chrome trace byte
for byte, the TensorBoard records all but the file header (its wall clock). Outputs are written next to the run (a 100 M-span Chrome trace is about 15 GB) and
removed once compared.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import psutil


def _du(path: str) -> int:
    total = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            try:
                total += os.path.getsize(os.path.join(d, f))
            except OSError:
                pass
    return total


def _measure(cmd: list[str], tmpdir: str) -> tuple[float, int, int, int]:
    """Wall seconds, peak RSS of the process, the largest peak RSS of its descendants, and the
    peak size of its temporary folder (TMPDIR)."""
    t0 = time.perf_counter()
    env = dict(os.environ, TMPDIR=tmpdir)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    ps = psutil.Process(proc.pid)
    top = kids = spill = 0
    last_du = 0.0
    while proc.poll() is None:
        if time.perf_counter() - last_du > 1.0:
            spill = max(spill, _du(tmpdir))
            last_du = time.perf_counter()
        try:
            top = max(top, ps.memory_info().rss)
            for child in ps.children(recursive=True):
                try:
                    kids = max(kids, child.memory_info().rss)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    return wall, top, kids, spill


def _records(logdir: str) -> list[bytes]:
    """The TFRecords of the one event file in ``logdir``, without the file header."""
    (name,) = os.listdir(logdir)
    with open(os.path.join(logdir, name), "rb") as f:
        data = f.read()
    out, i = [], 0
    while i < len(data):
        n = struct.unpack_from("<Q", data, i)[0]
        out.append(data[i : i + 16 + n])
        i += 16 + n
    return out[1:]


def _same(fmt: str, a: str, b: str) -> bool:
    if fmt == "chrome":
        return filecmp.cmp(a, b, shallow=False)
    return _records(a) == _records(b)


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", help="an existing run directory (default: generate one)")
    ap.add_argument("--steps", type=int, default=2_000_000, help="steps of the generated run (5 spans each)")
    ap.add_argument("--io-ops", action="store_true", help="generated run: a per-operation read per step")
    ap.add_argument("--formats", default="chrome,tensorboard")
    ap.add_argument("--engines", default="duckdb,dask")
    args = ap.parse_args()
    engines = args.engines.split(",")
    tmp = tempfile.mkdtemp(prefix="bench-export-")
    try:
        run = args.run
        if run is None:
            from holoprof.bench.synth import generate_run

            run = os.path.join(tmp, "run")
            generate_run(run, args.steps, io_ops=args.io_ops)
        run = os.path.abspath(run)
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(run) for f in fs)
        out_dir = tempfile.mkdtemp(prefix="bench-export-out-", dir=os.path.dirname(run))
        spill_dir = os.path.join(out_dir, "tmp")
        os.mkdir(spill_dir)
        mib = 2**20
        print("## holoprof export at scale\n")
        print(f"Run: {run} ({disk / mib:.0f} MiB on disk). Command: `python benchmarks/bench_export_scale.py "
              f"{' '.join(sys.argv[1:])}`\n")  # fmt: skip
        print(
            "| format | engine | time | client peak | worker peak | temporary files | output | same as DuckDB |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        try:
            for fmt in args.formats.split(","):
                outs = {}
                for engine in engines:
                    out = os.path.join(out_dir, f"{engine}.json" if fmt == "chrome" else f"{engine}-tb")
                    cmd = [sys.executable, "-m", "holoprof.cli", "export", run, "-f", fmt, "-o", out]
                    wall, top, kids, spill = _measure([*cmd, "--engine", engine], spill_dir)
                    size = (
                        os.path.getsize(out)
                        if fmt == "chrome"
                        else sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
                    )
                    outs[engine] = out
                    same = "—" if engine == engines[0] else str(_same(fmt, outs[engines[0]], out)).lower()
                    worker = f"{kids / mib:.0f} MiB" if engine == "dask" else "—"
                    print(f"| {fmt} | {engine} | {wall:.1f} s | {top / mib:.0f} MiB | {worker} | "
                          f"{spill / mib:.0f} MiB | {size / mib:.0f} MiB | {same} |", flush=True)  # fmt: skip
                    if engine != engines[0]:
                        _remove(out)
                for out in outs.values():
                    _remove(out)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
