"""A real run of 4 hosts × 8 ranks: 4 launchers with --join, 32 traced Python processes.

python benchmarks/bench_multihost_real.py [--hosts 4] [--ranks-per-host 8] [--steps 200]

Needs root on Linux (``unshare``) and libfaketime; not part of the test suite (32 interpreters on a
2-core machine take a while). Each "host" is a UTS and network namespace of its own (its hostname,
only its loopback interface), made with ``unshare --uts --net``; every host's launcher runs
``holoprof run --out RUN --join`` over one process that starts its 8 ranks (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE`` set as a launcher would) and waits for them. A rank is a tiny job with
no framework: ``holoprof.step()`` around a few ms of arithmetic, ``--steps`` times. The last host's
whole process tree runs 0.5 s ahead under libfaketime, so its offset is estimated from the
launchers' readings of the file system's clock (there are no collectives). The report is checked:
every host and rank, each host's resources with its 8 ranks, the skewed host aligned.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)
SKEW_S = 0.5
RANK = """import os, sys, time
import holoprof
x = 0
for _ in range(int(sys.argv[1])):
    with holoprof.phase("forward"):
        for i in range(20000):
            x += i * i
    holoprof.step()
"""
SPAWN = """import os, subprocess, sys
host, per, steps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
world = int(sys.argv[4])
procs = []
for i in range(per):
    env = dict(os.environ, RANK=str(host * per + i), LOCAL_RANK=str(i), WORLD_SIZE=str(world))
    procs.append(subprocess.Popen([sys.executable, sys.argv[5], steps], env=env))
sys.exit(max(p.wait() for p in procs))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ranks-per-host", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--keep", help="write the run here and keep it (default: a temporary folder)")
    args = ap.parse_args()
    lib = next((p for p in FAKETIME_LIBS if os.path.exists(p)), None)
    if os.geteuid() != 0 or shutil.which("unshare") is None or lib is None:
        raise SystemExit("needs root, unshare and libfaketime (apt-get install faketime)")
    hp = [sys.executable, "-m", "holoprof.cli"]
    world = args.hosts * args.ranks_per_host
    with tempfile.TemporaryDirectory() as tmp:
        rank_py, spawn_py = (os.path.join(tmp, n) for n in ("rank.py", "spawn.py"))
        run = os.path.join(args.keep or tmp, "run")
        with open(rank_py, "w") as f:
            f.write(RANK)
        with open(spawn_py, "w") as f:
            f.write(SPAWN)
        launchers = []
        t0 = time.perf_counter()
        for h in range(args.hosts):
            argv = [*hp, "run", "--out", run, "--join", "--no-report", "--", sys.executable, spawn_py,
                    str(h), str(args.ranks_per_host), str(args.steps), str(world), rank_py]  # fmt: skip
            if h == args.hosts - 1:
                argv = ["env", f"LD_PRELOAD={lib}", f"FAKETIME=+{SKEW_S}s", "NO_FAKE_STAT=1", *argv]
            cmd = ["unshare", "--uts", "--net", "sh", "-c", 'hostname "$0" && exec "$@"', f"node{h}", *argv]
            launchers.append(
                subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            )
        errs = [p.communicate(timeout=1200)[1] for p in launchers]
        job_s = time.perf_counter() - t0
        for p, e in zip(launchers, errs, strict=True):
            if p.returncode != 0:
                raise SystemExit(f"a launcher failed ({p.returncode}): {e[-2000:]}")
        t = time.perf_counter()
        rep = subprocess.run([*hp, "report", run, "--json"], capture_output=True, text=True, cwd=tmp)
        report_s = time.perf_counter() - t
        if rep.returncode != 0:
            raise SystemExit(rep.stderr[-2000:])
        doc = json.loads(rep.stdout)
        term = subprocess.run(
            [*hp, "report", run],
            capture_output=True,
            text=True,
            cwd=tmp,
            env={**os.environ, "COLUMNS": "120"},
        )
    hosts = {h["host"]: h for h in doc["resources"]["hosts"]}
    clocks = {c["host"]: c for c in doc["run"]["host_clocks"]}
    names = [f"node{h}" for h in range(args.hosts)]
    assert sorted(hosts) == names, sorted(hosts)
    assert doc["run"]["ranks"] == world and doc["run"]["status"] == "finished", doc["run"]
    for h, name in enumerate(names):
        want = list(range(h * args.ranks_per_host, (h + 1) * args.ranks_per_host))
        assert hosts[name]["ranks"] == want and hosts[name]["cpu_percent"]["samples"] >= 2, hosts[name]
    counts = {r["rank"]: r["count"] for r in doc["steps"]["per_rank"]}
    assert counts == {r: args.steps for r in range(world)}, counts
    skewed = clocks[names[-1]]
    assert skewed["clock_source"] == "file_server", skewed
    assert abs(skewed["clock_offset_s"] - SKEW_S) <= skewed["clock_uncertainty_s"] + 0.005, skewed
    print(f"## Many hosts, for real: {args.hosts} hosts × {args.ranks_per_host} ranks\n")
    print(f"`python benchmarks/bench_multihost_real.py --hosts {args.hosts} --ranks-per-host "
          f"{args.ranks_per_host} --steps {args.steps}`\n")  # fmt: skip
    print("| measure | value |\n| --- | --- |")
    print(
        f"| the job: {args.hosts} launchers with --join, {world} traced ranks of {args.steps} steps | {job_s:.1f} s |"
    )
    print(f"| `holoprof report --json` | {report_s:.1f} s |")
    cpu = ", ".join(f"{n} {hosts[n]['cpu_percent']['mean']:.0f}%" for n in names)
    print(f"| each host's CPU (mean; one machine shared by all) | {cpu} |")
    print(f"| skewed host's clock | +{skewed['clock_offset_s'] * 1e3:.1f} ms ± {skewed['clock_uncertainty_s'] * 1e3:.1f} ms "
          f"({skewed['clock_source']}), {SKEW_S * 1e3:.0f} ms set |")  # fmt: skip
    print(
        f"| checked | {args.hosts} hosts, {world} ranks of {args.steps} steps each, each host's resources with its ranks |\n"
    )
    table = term.stdout[term.stdout.find("Resources per host") :].splitlines()[: args.hosts + 3]
    print("```\n" + "\n".join(line.strip("│ ").rstrip() for line in table) + "\n```\n")


if __name__ == "__main__":
    main()
