"""Cost of the native I/O capture library per call.

A small C program, run with ``libholoprof_io.so`` preloaded, does N reads of 4 KiB from a file in
the page cache (``pread`` at rotating offsets, and sequential ``read`` with a rewind at the end of
the file). Blocks of calls through the normal symbol (interposed) alternate with blocks of calls
straight into libc's own function (``dlsym`` on libc.so.6), so noise from a busy machine hits both
alike; the median per-block difference is the time the library adds to each call. A control run
without the library measures the same difference (it should be ~0). Also measured: a descriptor the
library does not track (``/dev/zero``), and a tracked file while the per-operation trace records.

    python benchmarks/bench_io_native.py [--n 2000000] [--repeat 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from holoprof.collect.io_native import build

BENCH_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Blocks of calls through the normal symbol (interposed when the library is preloaded) alternate
 * with blocks of calls straight into libc (looked up in libc.so.6 itself), in the same process:
 * machine noise hits both alike, and the per-block difference is what the library adds. */
typedef ssize_t (*pread_t)(int, void *, size_t, off_t);
typedef ssize_t (*read_t)(int, void *, size_t);
typedef off_t (*lseek_t)(int, off_t, int);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char buf[4096];
static long blocks;

static void run_block(int use_libc, int is_pread, int fd, long k, long *pos,
                      pread_t lpread, read_t lread, lseek_t llseek) {
    for (long i = 0; i < k; i++) {
        if (is_pread) {
            off_t off = ((*pos)++ % blocks) * 4096;
            if (use_libc) lpread(fd, buf, 4096, off); else pread(fd, buf, 4096, off);
        } else {
            ssize_t r = use_libc ? lread(fd, buf, 4096) : read(fd, buf, 4096);
            if (r <= 0) { if (use_libc) llseek(fd, 0, SEEK_SET); else lseek(fd, 0, SEEK_SET); }
        }
    }
}

int main(int argc, char **argv) {
    const char *mode = argv[1], *path = argv[2];
    long n = atol(argv[3]);
    long size = atol(argv[4]);
    int trace = argc > 5 && atoi(argv[5]);
    int is_pread = strcmp(mode, "pread") == 0;
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    pread_t lpread = (pread_t)dlsym(libc, "pread");
    read_t lread = (read_t)dlsym(libc, "read");
    lseek_t llseek = (lseek_t)dlsym(libc, "lseek");
    int fd = open(path, O_RDONLY);
    if (fd < 0 || !lpread || !lread || !llseek) { perror(path); return 1; }
    if (trace) {
        /* the library's trace API, when preloaded: a 1M-record ring that fills, then drops */
        int (*start)(uint64_t) = (int (*)(uint64_t))dlsym(RTLD_DEFAULT, "holoprof_io_trace_start");
        if (start) start(1u << 20);
    }
    blocks = size / 4096;
    long k = 5000, nb = n / k, pos = 0;
    double *diff = calloc(nb, sizeof(double)), *via = calloc(nb, sizeof(double)), *direct = calloc(nb, sizeof(double));
    run_block(0, is_pread, fd, 2000, &pos, lpread, lread, llseek); /* warm up both paths */
    run_block(1, is_pread, fd, 2000, &pos, lpread, lread, llseek);
    for (long b = 0; b < nb; b++) {
        int first = b & 1; /* alternate which side goes first */
        double t0 = now();
        run_block(first, is_pread, fd, k, &pos, lpread, lread, llseek);
        double t1 = now();
        run_block(!first, is_pread, fd, k, &pos, lpread, lread, llseek);
        double t2 = now();
        double a = (t1 - t0) / k, c = (t2 - t1) / k;
        via[b] = first ? c : a;
        direct[b] = first ? a : c;
        diff[b] = via[b] - direct[b];
    }
    qsort(diff, nb, sizeof(double), cmp);
    qsort(via, nb, sizeof(double), cmp);
    qsort(direct, nb, sizeof(double), cmp);
    printf("%.2f %.2f %.2f\n", via[nb / 2], direct[nb / 2], diff[nb / 2]);
    close(fd);
    return 0;
}
"""

CASES = (
    ("pread", "file", 0),
    ("read", "file", 0),
    ("read", "devzero", 0),
    ("pread", "file", 1),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2_000_000, help="reads per run")
    ap.add_argument("--repeat", type=int, default=7, help="runs per case (the median is reported)")
    ap.add_argument("--size", type=int, default=16 << 20, help="bytes of the cached data file")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    cc = build.find_compiler()
    if cc is None:
        print("no C compiler: cannot build the library or the benchmark", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="holoprof-bench-io-") as tmp:
        lib = build.build(tmp)
        src = os.path.join(tmp, "bench.c")
        exe = os.path.join(tmp, "bench")
        with open(src, "w") as f:
            f.write(BENCH_C)
        subprocess.run([*cc, "-O2", "-o", exe, src, "-ldl"], check=True)
        data = os.path.join(tmp, "data.bin")
        with open(data, "wb") as out:
            out.write(os.urandom(args.size))
        with open(data, "rb") as inp:  # into the page cache
            while inp.read(1 << 20):
                pass
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "HOLOPROF_RUN_DIR")}

        def run(mode: str, target: str, trace: int, preload: bool) -> tuple[float, float, float]:
            e = dict(env)
            if preload:
                e["LD_PRELOAD"] = lib
            path = data if target == "file" else "/dev/zero"
            out = subprocess.run(
                [exe, mode, path, str(args.n), str(args.size), str(trace)],
                env=e,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            via, direct, diff = (float(x) for x in out.split())
            return via, direct, diff

        results = []
        for mode, target, trace in CASES:
            runs = [run(mode, target, trace, True) for _ in range(args.repeat)]
            control = [run(mode, target, trace, False)[2] for _ in range(max(1, args.repeat // 2))]
            name = f"{mode} 4KiB {'cached file' if target == 'file' else '/dev/zero (untracked)'}"
            if trace:
                name += " + trace on"
            results.append(
                {
                    "case": name,
                    "libc_ns": round(statistics.median(r[1] for r in runs), 1),
                    "interposed_ns": round(statistics.median(r[0] for r in runs), 1),
                    "added_ns": round(statistics.median(r[2] for r in runs), 1),
                    "control_ns": round(statistics.median(control), 1),
                }
            )

    print(
        f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus; {args.n} calls per run, "
        f"{args.repeat} runs; medians of per-block (5000 calls) times"
    )
    print(f"{'case':44s} {'libc ns':>8s} {'via lib':>8s} {'added':>7s} {'control':>8s}")
    for r in results:
        print(
            f"{r['case']:44s} {r['libc_ns']:8.1f} {r['interposed_ns']:8.1f} {r['added_ns']:7.1f} {r['control_ns']:8.1f}"
        )
    print("added: per-call time through the preloaded library minus straight into libc, same process;")
    print("control: the same difference without the library (measurement noise, should be ~0)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "repeat": args.repeat, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
