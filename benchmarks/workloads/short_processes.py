"""Start N short Python processes (`python -c "import json"`), alternately traced and untraced.

    python short_processes.py N [CODE]

Run under `holoprof run`, each traced child inherits the job's environment (the agent starts in it);
each untraced child gets the same environment without holoprof's: no HOLOPROF_* variables, no native
I/O library in LD_PRELOAD, no agent boot directory on PYTHONPATH. So both kinds start from the same
process, one after the other, on a machine in the same state. Prints one JSON line: the wall time of
each child, from its start to its exit as this process waits for it, and its CPU time (user and
system, which moves less than wall time when other work shares the machine), in seconds, per kind, and
the process ids of the traced ones.
"""

import json
import os
import resource
import subprocess
import sys
import time


def untraced_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOLOPROF_")}
    boot = os.environ.get("HOLOPROF_BOOT_DIR")
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    else:
        env.pop("PYTHONPATH", None)
    preload = [p for p in env.get("LD_PRELOAD", "").split() if "libholoprof_io" not in os.path.basename(p)]
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def main() -> None:
    n = int(sys.argv[1])
    code = sys.argv[2] if len(sys.argv) > 2 else "import json"
    envs = {"traced": dict(os.environ), "untraced": untraced_env()}
    times: dict[str, list[float]] = {"traced": [], "untraced": []}
    cpu: dict[str, list[float]] = {"traced": [], "untraced": []}
    pids: list[int] = []
    for i in range(n):
        order = ("traced", "untraced") if i % 2 == 0 else ("untraced", "traced")
        for kind in order:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-c", code], env=envs[kind])
            rc = proc.wait()
            times[kind].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[kind].append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            if rc != 0:
                raise SystemExit(f"a {kind} child exited with {rc}")
            if kind == "traced":
                pids.append(proc.pid)
    print(json.dumps({"code": code, "times_s": times, "cpu_s": cpu, "traced_pids": pids}))


if __name__ == "__main__":
    main()
