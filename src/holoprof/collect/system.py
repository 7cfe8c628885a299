"""Resources over time: the job's process tree (psutil) and GPUs (NVML), sampled every second.

Under ``holoprof run`` the sampler runs in the launcher, so it sees every process of the job,
Python or not (a ``tar`` or ``sort`` in a pipeline too), and costs the job nothing. With
``holoprof.start()`` it runs as a thread of the traced process and samples that process and its
children.

Sample names (``samples`` table; ``target_pid`` -1 means the whole job):

==========================  ===================================================================
``job.cpu_percent``         CPU used by the process tree (100 = one core)
``job.rss_bytes``           resident memory, summed over the tree (pages shared after fork are
                            counted in every process that maps them)
``job.read_bytes_per_s``    storage reads of the tree (page-cache hits excluded), per second
``job.write_bytes_per_s``   storage writes, per second
``job.read_bytes``          cumulative storage reads (processes that ended included)
``job.write_bytes``         cumulative storage writes
``job.processes``           live processes in the tree
``host.cpu_percent``        whole machine
``host.mem_used_bytes``     whole machine
``host.net_recv_bytes_per_s`` / ``host.net_sent_bytes_per_s``   whole machine (no per-process
                            network accounting exists without privileges)
``gpu.<i>.util_percent``    NVML utilization of GPU i (share of time a kernel ran)
``gpu.<i>.mem_used_bytes`` / ``gpu.<i>.mem_total_bytes`` / ``gpu.<i>.power_w``
``proc.cpu_s``              per process (``target_pid``): cumulative CPU seconds
``proc.rss_bytes``          per process: resident memory
``proc.read_bytes`` / ``proc.write_bytes``   per process: cumulative storage bytes
==========================  ===================================================================
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from holoprof import model
from holoprof.agent.core import Agent, check_fault, fault_point, now_ns


class _Gpus:
    """NVML through nvidia-ml-py; absent or failing NVML means no GPU samples, said once."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.nvml: Any = None
        self.note = ""
        try:
            # lazy: only where an NVIDIA driver is there to ask
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.names = [str(pynvml.nvmlDeviceGetName(h)) for h in self.handles]
        except Exception as exc:
            self.note = f"no GPU metrics ({type(exc).__name__}: {exc})"
            self.handles = []
            self.names = []

    def sample(self, emit: Any, ts: int) -> None:
        nv = self.nvml
        for i, h in enumerate(self.handles):
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                emit(f"gpu.{i}.util_percent", float(util.gpu), -1, ts)
                emit(f"gpu.{i}.mem_used_bytes", float(mem.used), -1, ts)
                emit(f"gpu.{i}.mem_total_bytes", float(mem.total), -1, ts)
                try:
                    emit(f"gpu.{i}.power_w", nv.nvmlDeviceGetPowerUsage(h) / 1000.0, -1, ts)
                except Exception:
                    pass
            except Exception:
                continue


class SystemSampler:
    """Resources of the job's process tree, sampled by the launcher. A failure turns it off through
    ``agent.fail`` (so the report's errors name it); the job goes on."""

    name = "system"

    def __init__(self, agent: Agent, root_pid: int, interval_s: float = 1.0) -> None:
        self.fault_at = fault_point(self.name, "start")
        check_fault(self.fault_at, self.name, "start")
        # lazy: loaded by the sampler, not at the agent's start-up in every process
        import psutil

        self.psutil = psutil
        self.agent = agent
        self.root_pid = root_pid
        self.interval_s = max(0.05, float(interval_s))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False
        self._procs: dict[int, Any] = {}
        self._last_cpu: dict[int, float] = {}
        self._last_io: dict[int, tuple[int, int]] = {}
        self._cum_read = 0
        self._cum_write = 0
        self._last_t: float | None = None
        self._last_net: tuple[int, int] | None = None
        self._new_procs: list[dict[str, Any]] = []
        # a process seen between fork and exec still shows its parent's command line: look again
        self._recheck: dict[int, tuple[int, list[str]]] = {}  # pid -> (ticks left, argv seen)
        self._lock = threading.Lock()
        self.gpus = _Gpus()
        agent.info["gpus"] = self.gpus.names
        if self.gpus.note:
            agent.info["gpu_note"] = self.gpus.note
        agent.pollers.append(self._poll_processes)
        psutil.cpu_percent(None)

    def start(self) -> None:
        self.tick()
        self._thread = threading.Thread(target=self._run, name="holoprof-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._failed:
            return
        try:
            self.tick()
        except Exception:
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                check_fault(self.fault_at, self.name, "tick")
                self.tick()
            except Exception as exc:
                self._failed = True
                self.agent.fail(self.name, exc)
                return

    def _tree(self) -> list[Any]:
        ps = self.psutil
        try:
            root = self._procs.get(self.root_pid) or ps.Process(self.root_pid)
        except ps.Error:
            return []
        try:
            procs = [root, *root.children(recursive=True)]
        except ps.Error:
            procs = [root]
        out = []
        for p in procs:
            cached = self._procs.get(p.pid)
            if cached is None:
                self._procs[p.pid] = p
                self._describe(p)
                cached = p
            out.append(cached)
        return out

    def _recheck_names(self) -> None:
        for pid, (left, argv) in list(self._recheck.items()):
            proc = self._procs.get(pid)
            if proc is None or left <= 0:
                self._recheck.pop(pid, None)
                continue
            try:
                now = proc.cmdline()
            except Exception:
                self._recheck.pop(pid, None)
                continue
            if now != argv:
                self._recheck.pop(pid, None)
                self._describe(proc, recheck=False)
            else:
                self._recheck[pid] = (left - 1, argv)

    def _describe(self, p: Any, recheck: bool = True) -> None:
        try:
            with p.oneshot():
                row = {
                    "pid": p.pid,
                    "ppid": p.ppid(),
                    "argv": p.cmdline(),
                    "exe": p.exe(),
                    "start_ns": int(p.create_time() * 1e9),
                    "described_ns": time.time_ns(),
                }
        except Exception:
            return
        if recheck:
            self._recheck[p.pid] = (3, list(row["argv"]))
        with self._lock:
            self._new_procs.append(row)

    def tick(self) -> None:
        ps = self.psutil
        now = time.monotonic()
        ts = now_ns()
        emit = self.agent.sample
        dt = None if self._last_t is None else max(1e-6, now - self._last_t)
        self._last_t = now
        cpu_pct = 0.0
        rss_total = 0
        d_read = d_write = 0
        alive = 0
        threads = 0
        self._recheck_names()
        for p in self._tree():
            try:
                with p.oneshot():
                    ct = p.cpu_times()
                    cpu = ct.user + ct.system
                    rss = p.memory_info().rss
                    threads += p.num_threads()
                    try:
                        io = p.io_counters()
                        rb, wb = io.read_bytes, io.write_bytes
                    except (ps.Error, AttributeError):
                        rb = wb = 0
            except ps.Error:
                self._procs.pop(p.pid, None)
                continue
            alive += 1
            prev = self._last_cpu.get(p.pid)
            if dt is not None and prev is not None:
                cpu_pct += 100.0 * (cpu - prev) / dt
            self._last_cpu[p.pid] = cpu
            prb, pwb = self._last_io.get(p.pid, (0, 0))
            d_read += max(0, rb - prb)
            d_write += max(0, wb - pwb)
            self._last_io[p.pid] = (rb, wb)
            rss_total += rss
            emit("proc.cpu_s", cpu, p.pid, ts)
            emit("proc.rss_bytes", float(rss), p.pid, ts)
            emit("proc.read_bytes", float(rb), p.pid, ts)
            emit("proc.write_bytes", float(wb), p.pid, ts)
        self._cum_read += d_read
        self._cum_write += d_write
        emit("job.processes", float(alive), -1, ts)
        emit("job.threads", float(threads), -1, ts)
        emit("job.rss_bytes", float(rss_total), -1, ts)
        emit("job.read_bytes", float(self._cum_read), -1, ts)
        emit("job.write_bytes", float(self._cum_write), -1, ts)
        if dt is not None:
            emit("job.cpu_percent", cpu_pct, -1, ts)
            emit("job.read_bytes_per_s", d_read / dt, -1, ts)
            emit("job.write_bytes_per_s", d_write / dt, -1, ts)
        emit("host.cpu_percent", float(ps.cpu_percent(None)), -1, ts)
        emit("host.mem_used_bytes", float(ps.virtual_memory().used), -1, ts)
        try:
            net = ps.net_io_counters()
            cur = (net.bytes_recv, net.bytes_sent)
            if self._last_net is not None and dt is not None:
                emit("host.net_recv_bytes_per_s", max(0, cur[0] - self._last_net[0]) / dt, -1, ts)
                emit("host.net_sent_bytes_per_s", max(0, cur[1] - self._last_net[1]) / dt, -1, ts)
            self._last_net = cur
        except Exception:
            pass
        self.gpus.sample(emit, ts)

    def _poll_processes(self) -> list[tuple[str, dict[str, list[Any]]]]:
        """Processes seen by the sampler, as `processes` rows (an agent's own row wins over these)."""
        with self._lock:
            rows, self._new_procs = self._new_procs, []
        if not rows:
            return []
        n = len(rows)
        return [
            (
                "processes",
                {
                    "pid": [r["pid"] for r in rows],
                    "ppid": [r["ppid"] for r in rows],
                    "local_rank": [-1] * n,
                    "world_size": [-1] * n,
                    "role": ["child"] * n,
                    "argv": [json.dumps(r["argv"]) for r in rows],
                    "exe": [r["exe"] for r in rows],
                    "start_ns": [r["start_ns"] for r in rows],
                    "end_ns": [0] * n,
                    "exit_code": [-1] * n,
                    "updated_ns": [r["described_ns"] for r in rows],
                    "clock_offset_ns": [0] * n,
                    "versions": ["{}"] * n,
                    "dropped_events": [0] * n,
                    "errors": ["[]"] * n,
                    "info": [model.SAMPLER_INFO] * n,
                },
            )
        ]
