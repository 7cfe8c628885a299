"""Memory of the whole process, standard library only: its resident size and the limit it may grow to."""

from __future__ import annotations

import os
import sys

_statm: tuple[int, int] | None = None  # (pid, fd) of /proc/<pid>/statm, kept open: a pread is cheap
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# taken at import, before the I/O collector wraps os.pread: reading our own /proc file is not the job's I/O
_pread = getattr(os, "pread", None)
_pid = os.getpid()  # os.getpid() is a system call: known here, and again in a forked child


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def rss_bytes() -> int:
    global _statm
    try:
        pid = _pid
        if _statm is None or _statm[0] != pid:  # first call, or a forked child: /proc/self of this process
            if _statm is not None:
                try:
                    os.close(_statm[1])
                except OSError:
                    pass
            _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY))
        return int(_pread(_statm[1], 128, 0).split()[1]) * _PAGE  # type: ignore[misc]
    except (OSError, ValueError, IndexError, AttributeError, TypeError):
        import resource  # lazy: not on every platform: only where /proc cannot be read

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(r if sys.platform == "darwin" else r * 1024)


def cpu_limit_bytes() -> tuple[int, str]:
    """The memory this process may use: the machine's total, or a smaller cgroup limit."""
    total = 0
    try:
        total = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    limit, source = total, "machine memory"
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit():
            v = int(raw)
            if 0 < v < (limit or 2**62):
                limit, source = v, f"cgroup limit ({path})"
        break
    return limit, source
