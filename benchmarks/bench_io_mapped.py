"""Cost of counting memory-mapped files in the native I/O layer: a nanoGPT-style loader.

Each iteration maps a token file anew with ``np.memmap`` (as nanoGPT does for every batch), copies a
batch of random windows out of it and drops the mapping, so every iteration is one ``mmap`` and one
``munmap`` of a counted file, whose resident pages the library measures from ``/proc/self/pagemap``
(within its budget of 1% of the process's time plus 20 ms). Runs of the loop with the library
preloaded alternate with runs without it; the median time per iteration of each, and the ratio.
``--control`` preloads an empty library instead: the ratio then shows the machine's noise.

    python benchmarks/bench_io_mapped.py [--mib 64] [--iters 3000] [--repeat 5] [--control] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from holoprof.collect import io_native
from holoprof.collect.io_native import build
from holoprof.store import native_dumps

LOOP = r"""
import sys, time
import numpy as np
path, iters = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
t0 = time.perf_counter()
for _ in range(iters):
    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = rng.integers(0, len(data) - 1024, 12)
    x = np.stack([data[i : i + 1024].astype(np.int64) for i in ix])
    del data
print((time.perf_counter() - t0) / iters)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="size of the token file")
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--control", action="store_true", help="preload an empty library instead")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    lib = io_native.library_path()
    if lib is None:
        sys.exit("the native I/O library is not built: python -m holoprof.collect.io_native.build")
    with tempfile.TemporaryDirectory() as d:
        import numpy as np

        if args.control:
            cc = build.find_compiler()
            if cc is None:
                sys.exit("--control needs a C compiler")
            src = os.path.join(d, "empty.c")
            with open(src, "w") as f:
                f.write("int holoprof_bench_empty(void) { return 0; }\n")
            lib = os.path.join(d, "libempty.so")
            subprocess.run([*cc, "-shared", "-fPIC", "-o", lib, src], check=True)

        path = os.path.join(d, "train.bin")
        np.random.default_rng(0).integers(0, 65535, args.mib << 19, dtype=np.uint16).tofile(path)
        run = os.path.join(d, "run")
        os.mkdir(run)
        times: dict[str, list[float]] = {"untraced": [], "library": []}
        for _ in range(args.repeat):
            for case in times:
                env = {
                    k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("HOLOPROF_")
                }
                if case == "library":
                    env.update({"LD_PRELOAD": lib, "HOLOPROF_RUN_DIR": run})
                out = subprocess.run(
                    [sys.executable, "-c", LOOP, path, str(args.iters)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                times[case].append(float(out.stdout))
        dumps = [
            r for f in native_dumps.dump_files(run) for r in native_dumps.read_dump(f) if r["path"] == path
        ]
    med = {k: statistics.median(v) for k, v in times.items()}
    c = dumps[-1]["counters"] if dumps else {}
    result = {
        "control": args.control,
        "file_mib": args.mib,
        "iterations": args.iters,
        "untraced_us_per_iteration": round(med["untraced"] * 1e6, 1),
        "library_us_per_iteration": round(med["library"] * 1e6, 1),
        "ratio": round(med["library"] / med["untraced"], 4),
        "last_run_mmaps": c.get("POSIX_MMAPS"),
        "last_run_mmaps_measured": c.get("POSIX_MMAPS_MEASURED"),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
