"""holoprof iobench against fio: the same files, the same access pattern, cold page cache.

For N readers and block size B, the dataset is a directory of N files (hard links to the same
inodes for every N) that each reader streams sequentially in reads of B bytes:

* holoprof: ``run_iobench(dir, threads=[N], block_sizes=[B], prefetch=[0], cache="cold")``
  (prefetch 0: every reader consumes its own blocks, as fio does);
* fio: N jobs (``--thread``), one file each, ``--rw=read --bs=B --ioengine=psync --direct=0
  --invalidate=1 --fadvise_hint=0``, the files also evicted with posix_fadvise(DONTNEED) first.

Each pair is measured ``--repeats`` times, alternating which tool goes first, with a pause of
``--settle-seconds`` before every run: a cold read that starts right after another one (by either
tool) is often much slower on virtual disks, which would favour whichever tool runs first. The table
gives the median bandwidths and their ratio (target: within 15%). fio's number
is computed like holoprof's: all bytes read over the longest job's runtime. fio must be installed (e.g. ``apt-get install fio``);
this script does not install anything.

    .venv/bin/python benchmarks/bench_iobench_fio.py [--file-mb 768] [--readers 1,2,4]
        [--block-sizes 128k,1m] [--repeats 4] [--settle-seconds 2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from holoprof.bench.iobench import evict, parse_int_list, parse_size_list, run_iobench

OUT_DIR = Path(__file__).resolve().parent / "out"


def make_dataset(root: Path, files: int, file_bytes: int) -> list[Path]:
    base = root / "files"
    base.mkdir(parents=True, exist_ok=True)
    chunk = os.urandom(8 << 20)
    paths = []
    for i in range(files):
        p = base / f"part-{i:02d}.bin"
        if not p.exists() or p.stat().st_size != file_bytes:
            with open(p, "wb") as f:
                left = file_bytes
                while left > 0:
                    n = min(left, len(chunk))
                    f.write(chunk[:n])
                    left -= n
                f.flush()
                os.fsync(f.fileno())
        paths.append(p)
    return paths


def dataset_for(root: Path, parts: list[Path], readers: int) -> Path:
    d = root / f"readers-{readers}"
    d.mkdir(exist_ok=True)
    for p in parts[:readers]:
        link = d / p.name
        if not link.exists():
            os.link(p, link)
    return d


def run_fio(files: list[Path], block_size: int) -> float:
    """Aggregate bandwidth of one fio job per file: all bytes over the longest job's runtime."""
    evict([(str(p), p.stat().st_size) for p in files])
    cmd = [
        "fio",
        "--output-format=json",
        "--thread",
        "--rw=read",
        f"--bs={block_size}",
        "--ioengine=psync",
        "--direct=0",
        "--invalidate=1",
        "--fadvise_hint=0",
    ]
    for i, p in enumerate(files):
        cmd += [f"--name=reader{i}", f"--filename={p}", f"--size={p.stat().st_size}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    jobs = json.loads(out[out.index("{") :])["jobs"]
    io_bytes = sum(j["read"]["io_bytes"] for j in jobs)
    runtime_ms = max(j["read"]["runtime"] for j in jobs)
    return io_bytes / (runtime_ms / 1000)


def run_holoprof(directory: Path, readers: int, block_size: int) -> tuple[float, str]:
    result = run_iobench(
        directory, threads=[readers], block_sizes=[block_size], prefetch=[0], cache="cold", max_seconds=120
    )
    (row,) = result.rows
    assert row.complete, "holoprof iobench stopped early"
    return row.bandwidth_bytes_per_s, row.cache


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file-mb", type=int, default=768, help="size of each file (default 768 MB)")
    parser.add_argument("--readers", default="1,2,4")
    parser.add_argument("--block-sizes", default="128k,1m")
    parser.add_argument("--repeats", type=int, default=4, help="runs of each tool per configuration (even)")
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=2.0,
        help="pause before each run (default 2; see the docstring)",
    )
    parser.add_argument(
        "--dir", default=None, help="where to put the data (default: a temporary dir under /var/tmp)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the data files afterwards")
    args = parser.parse_args()

    if shutil.which("fio") is None:
        sys.stderr.write(
            "fio is not installed: this benchmark compares holoprof iobench with fio and needs it "
            "(Debian/Ubuntu: apt-get install fio; RHEL: dnf install fio; macOS: brew install fio)\n"
        )
        return 2
    fio_version = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    readers_list = parse_int_list(args.readers, "readers", 1)
    block_sizes = parse_size_list(args.block_sizes, "block-sizes")
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="holoprof-fio-", dir="/var/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    parts = make_dataset(root, max(readers_list), args.file_mb << 20)

    rows = []
    try:
        for bs in block_sizes:
            for n in readers_list:
                d = dataset_for(root, parts, n)
                files = sorted(d.iterdir())
                ours: list[float] = []
                theirs: list[float] = []
                caches = set()
                for rep in range(args.repeats):
                    order = ("holoprof", "fio") if rep % 2 == 0 else ("fio", "holoprof")
                    for tool in order:
                        time.sleep(args.settle_seconds)
                        if tool == "fio":
                            theirs.append(run_fio(files, bs))
                        else:
                            bw, cache = run_holoprof(d, n, bs)
                            ours.append(bw)
                            caches.add(cache)
                h, f = statistics.median(ours), statistics.median(theirs)
                rows.append(
                    {
                        "readers": n,
                        "block_size": bs,
                        "bytes": n * (args.file_mb << 20),
                        "holoprof_bytes_per_s": h,
                        "fio_bytes_per_s": f,
                        "ratio": h / f,
                        "holoprof_runs": ours,
                        "fio_runs": theirs,
                        "holoprof_cache": "/".join(sorted(caches)),
                    }
                )
                print(
                    f"readers={n} bs={bs}: holoprof {h / 1e6:,.0f} MB/s, fio {f / 1e6:,.0f} MB/s",
                    file=sys.stderr,
                )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    ratios = [r["ratio"] for r in rows]
    worst = max(abs(1 - x) for x in ratios)
    lines = [
        f"### holoprof iobench vs {fio_version}: sequential reads, cold page cache, {args.repeats} runs each (medians)",
        "",
        f"{args.file_mb} MiB per file, one file per reader; {os.cpu_count()} CPUs; data under {root}; "
        f"{args.settle_seconds:g} s pause before each run, alternating which tool goes first",
        "",
        "| readers | block | data | holoprof iobench (MB/s) | fio (MB/s) | holoprof / fio |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['readers']} | {r['block_size'] // 1024} KiB | {r['bytes'] / 2**30:.2f} GiB "
            f"| {r['holoprof_bytes_per_s'] / 1e6:,.0f} | {r['fio_bytes_per_s'] / 1e6:,.0f} | {r['ratio']:.2f} |"
        )
    lines += [
        "",
        f"Median ratio {statistics.median(ratios):.2f}; largest deviation {worst:.0%} (target: within 15%). "
        f"holoprof rows were {', '.join(sorted({r['holoprof_cache'] for r in rows}))}-cache.",
    ]
    table = "\n".join(lines)
    print(table)
    (OUT_DIR / "bench_iobench_fio.md").write_text(table + "\n")
    (OUT_DIR / "bench_iobench_fio.json").write_text(
        json.dumps({"fio": fio_version, "rows": rows}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
