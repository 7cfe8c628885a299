"""I/O profiling overhead on a DataLoader job reading 10,000 small files with 2 workers.

Alternates plain and traced runs (`holoprof run`, native I/O layer preloaded, as users run it); each
run times its own loop; the result is the median traced/plain ratio of adjacent pairs. The CPU time of
the loop (main process and workers) is reported beside it: it moves less than wall time when other
work shares the machine.

    python benchmarks/bench_io_dataloader.py [--files 10000] [--pairs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workloads", "small_files_loader.py")


def _run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--pairs", type=int, default=7)
    args = ap.parse_args()
    ratios, plain, traced, cpu_ratios = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        for i in range(args.files):
            with open(os.path.join(data, f"{i:06d}.bin"), "wb") as f:
                f.write(os.urandom(args.size))
        holoprof = [sys.executable, "-m", "holoprof.cli", "run", "--no-report"]
        _run([sys.executable, WORKLOAD, data])  # warm the page cache for both
        for i in range(args.pairs):
            order = ("plain", "traced") if i % 2 == 0 else ("traced", "plain")
            res = {}
            for kind in order:
                if kind == "plain":
                    res[kind] = _run([sys.executable, WORKLOAD, data])
                else:
                    res[kind] = _run([*holoprof, "--out", os.path.join(tmp, f"run{i}"), "--", WORKLOAD, data])
            assert res["traced"]["files"] == res["plain"]["files"] == args.files
            ratios.append(res["traced"]["loop_s"] / res["plain"]["loop_s"])
            cpu_ratios.append(res["traced"]["cpu_s"] / res["plain"]["cpu_s"])
            plain.append(res["plain"]["loop_s"])
            traced.append(res["traced"]["loop_s"])
        last = os.path.join(tmp, f"run{args.pairs - 1}")
        doc = json.loads(
            subprocess.run(
                [sys.executable, "-m", "holoprof.cli", "report", last, "--json"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
    counted = sum(1 for f in doc["io"].get("files_detail", []) if "/data/" in f["path"])
    med = statistics.median(ratios)
    print("## I/O profiling overhead: DataLoader reading small files\n")
    print(f"`python benchmarks/bench_io_dataloader.py --files {args.files} --pairs {args.pairs}`\n")
    print(
        f"{args.files} files of {args.size} bytes, DataLoader(batch_size=64, num_workers=2), native I/O layer.\n"
    )
    print("| measure | value |\n| --- | --- |")
    print(f"| median plain loop | {statistics.median(plain):.3f} s |")
    print(f"| median traced loop | {statistics.median(traced):.3f} s |")
    print(f"| traced/plain, median of {args.pairs} alternating pairs | {med:.4f} ({100 * (med - 1):+.2f}%) |")
    print(f"| all ratios | {', '.join(f'{r:.3f}' for r in ratios)} |")
    cmed = statistics.median(cpu_ratios)
    print(
        f"| CPU time of the loop (main + workers), traced/plain, median | {cmed:.4f} ({100 * (cmed - 1):+.2f}%) |"
    )
    print(
        f"| files of the dataset in the report (top-50 list) / total files read | {counted} / {doc['io'].get('files')} |"
    )
    print("| target | ≤ 1.03 |\n")


if __name__ == "__main__":
    main()
