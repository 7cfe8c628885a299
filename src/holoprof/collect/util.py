"""Small helpers shared by collectors (standard library only)."""

from __future__ import annotations

import os


def path_bytes(path: str) -> int | None:
    """Bytes of a file, of a directory (recursively), or of a TF checkpoint prefix (its files)."""
    try:
        if os.path.isfile(path):
            return os.path.getsize(path)
        if os.path.isdir(path):
            return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        parent, base = os.path.split(path)
        parent = parent or "."
        total = sum(
            os.path.getsize(os.path.join(parent, f))
            for f in os.listdir(parent)
            if f.startswith(base) and os.path.isfile(os.path.join(parent, f))
        )
        return total or None
    except OSError:
        return None


def usable_cores() -> dict[str, float]:
    """The CPU this process may use: ``affinity`` (cores in its affinity mask), ``quota`` (cores'
    worth of the cgroup CPU quota, absent when unlimited), ``cores`` (the smaller) and ``host_cpus``
    (the machine's logical CPUs)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    out: dict[str, float] = {"affinity": affinity, "cores": affinity, "host_cpus": os.cpu_count() or affinity}
    quota = _cgroup_quota()
    if quota is not None:
        out["quota"] = round(quota, 3)
        out["cores"] = min(affinity, quota)
    return out


def _cgroup_quota() -> float | None:
    """Cores' worth of this process's cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [ln.strip().split(":", 2) for ln in f if ln.count(":") >= 2]
    except OSError:
        return None
    for _, controllers, rel in lines:
        rel = rel.lstrip("/")
        try:
            if controllers == "":
                with open(os.path.join("/sys/fs/cgroup", rel, "cpu.max")) as f:
                    quota, period = f.read().split()[:2]
            elif "cpu" in controllers.split(","):
                base = os.path.join("/sys/fs/cgroup", controllers, rel)
                with open(os.path.join(base, "cpu.cfs_quota_us")) as f:
                    quota = f.read().strip()
                with open(os.path.join(base, "cpu.cfs_period_us")) as f:
                    period = f.read().strip()
            else:
                continue
        except (OSError, ValueError):
            continue
        if quota not in ("max", "-1") and float(period) > 0:
            return float(quota) / float(period)
    return None


def process_created_ns() -> int | None:
    """When this process was created (wall-clock ns, to 10 ms): its start in clock ticks since boot
    (``/proc/self/stat``) against the time since boot now. The interpreter's own start-up comes before
    the agent's; goodput's ``startup`` starts here. None where the system does not say."""
    import time  # lazy: only once per process, at the agent's start

    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        age = since_boot - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time_ns() - int(max(0.0, age) * 1e9)
