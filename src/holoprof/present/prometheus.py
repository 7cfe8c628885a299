"""Reports as Prometheus metrics (the text exposition format 0.0.4 that ``/metrics`` serves).

Renders ``holoprof.report/1`` documents; computes nothing. Follows Prometheus' naming conventions:
one metric per quantity with its unit in its name (``_seconds``, ``_bytes``, ``_ratio`` for
fractions, ``_total`` for counters), the same labels on every sample of a metric (``run``; ``rank``
on every per-rank metric), and nothing that was not measured: a run without training steps exports
no step metrics, a run without I/O records no I/O metrics, a resource that was not sampled is absent.
The text is written by ``prometheus_client``.

:func:`run_samples` turns one report into its samples (without the ``run`` label), plain JSON data
that the dashboard server caches per run; :func:`render` writes the text from such samples, so that a
scrape over many runs renders without rebuilding their reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

#: The content type of :func:`prometheus_text`.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Job-wide resource samples (``resources.summary`` of the report, by sample name) -> (metric,
#: type, help, scale). The latest value of each is exported, multiplied by scale. Rates the agent
#: derives (``job.read_bytes_per_s``) are left out where a counter exists: Prometheus' ``rate()``
#: over the counter gives them.
RESOURCE_METRICS: dict[str, tuple[str, str, str, float]] = {
    "job.cpu_percent": ("holoprof_job_cpu_ratio", "gauge", "CPU use of the job (1 = one core busy)", 0.01),
    "job.rss_bytes": ("holoprof_job_rss_bytes", "gauge", "resident memory of the job's processes", 1.0),
    "job.read_bytes": ("holoprof_job_disk_read_bytes", "counter", "bytes the job read from disk", 1.0),
    "job.write_bytes": ("holoprof_job_disk_written_bytes", "counter", "bytes the job wrote to disk", 1.0),
    "job.processes": ("holoprof_job_processes", "gauge", "processes of the job alive", 1.0),
    "job.threads": ("holoprof_job_threads", "gauge", "threads of the job's processes", 1.0),
    "host.net_recv_bytes_per_s": (
        "holoprof_host_network_receive_bytes_per_second",
        "gauge",
        "network receive rate of the whole machine",
        1.0,
    ),
    "host.net_sent_bytes_per_s": (
        "holoprof_host_network_transmit_bytes_per_second",
        "gauge",
        "network transmit rate of the whole machine",
        1.0,
    ),
}
#: Per-GPU samples ``gpu.<i>.<what>`` -> (metric, help, scale); labelled by ``gpu``.
GPU_METRICS: dict[str, tuple[str, str, float]] = {
    "util_percent": ("holoprof_gpu_utilization_ratio", "share of time a kernel ran on the GPU", 0.01),
    "mem_used_bytes": ("holoprof_gpu_memory_used_bytes", "GPU memory in use", 1.0),
    "mem_total_bytes": ("holoprof_gpu_memory_total_bytes", "GPU memory in all", 1.0),
    "power_w": ("holoprof_gpu_power_watts", "GPU power draw", 1.0),
}


#: One sample of a run: metric name, type (``gauge`` or ``counter``), help text, labels other than
#: ``run`` (values as text), value. Lists and dicts only, so that it survives a trip through JSON.
Sample = list[Any]


class _Adder(Protocol):
    def add(self, name: str, kind: str, help_text: str, labels: dict[str, Any], value: Any) -> None: ...


class _Samples:
    """Collects a run's samples in the order they are added."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def add(self, name: str, kind: str, help_text: str, labels: dict[str, Any], value: Any) -> None:
        self.samples.append([name, kind, help_text, {k: str(v) for k, v in labels.items()}, float(value)])


@dataclass
class _Family:
    kind: str
    help: str
    labels: tuple[str, ...]
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)


class _Metrics:
    """Metric families in the order they were first added; each keeps one set of label names."""

    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}

    def add(self, name: str, kind: str, help_text: str, labels: dict[str, Any], value: Any) -> None:
        fam = self.families.setdefault(name, _Family(kind, help_text, tuple(labels)))
        assert fam.labels == tuple(labels), f"{name}: labels {tuple(labels)} against {fam.labels}"
        fam.samples.append((tuple(str(v) for v in labels.values()), float(value)))

    def collect(self) -> Iterator[Metric]:
        for name, fam in self.families.items():
            metric: GaugeMetricFamily | CounterMetricFamily
            if fam.kind == "counter":
                metric = CounterMetricFamily(name, fam.help, labels=fam.labels)
            else:
                metric = GaugeMetricFamily(name, fam.help, labels=fam.labels)
            for values, v in fam.samples:
                metric.add_metric(values, v)
            yield metric


def _steps(m: _Adder, run: dict[str, str], doc: dict[str, Any]) -> None:
    st = doc.get("steps") or {}
    if not st.get("count"):
        return  # no step was measured: no step metrics (not zeros)
    main_rank = (st.get("process") or {}).get("rank", -1)
    per_rank = st.get("per_rank") or [
        {
            "rank": main_rank,
            "count": st["count"],
            "median_s": st["median_s"],
            "p90_s": st["p90_s"],
            "per_s": st.get("per_s"),
        }
    ]
    for r in sorted(per_rank, key=lambda r: int(r.get("rank", -1))):
        if not r.get("count"):
            continue
        lab = {**run, "rank": r.get("rank", -1)}
        if r.get("rank", -1) == main_rank and r.get("per_s") is None:
            r = {**r, "per_s": st.get("per_s")}
        m.add("holoprof_steps", "counter", "training steps completed", lab, r["count"])
        m.add("holoprof_step_time_seconds", "gauge", "median step time", lab, r["median_s"])
        m.add("holoprof_step_time_p90_seconds", "gauge", "90th percentile of the step time", lab, r["p90_s"])
        if r.get("per_s") is not None:
            m.add("holoprof_steps_per_second", "gauge", "training throughput", lab, r["per_s"])
        phases = r.get("phases")
        if phases is None and r.get("rank", -1) == main_rank:
            phases = {k: v["fraction"] for k, v in (doc.get("phases") or {}).items()}
        for phase, frac in (phases or {}).items():
            m.add(
                "holoprof_phase_ratio",
                "gauge",
                "share of the step time spent in each phase",
                {**lab, "phase": phase},
                frac,
            )


def _io(m: _Adder, run: dict[str, str], doc: dict[str, Any]) -> None:
    io = doc.get("io") or {}
    if not io:
        return
    m.add("holoprof_io_read_bytes", "counter", "bytes read by the job", run, io.get("bytes_read", 0))
    m.add("holoprof_io_written_bytes", "counter", "bytes written by the job", run, io.get("bytes_written", 0))
    m.add("holoprof_io_reads", "counter", "read calls of the job", run, io.get("reads", 0))
    m.add("holoprof_io_writes", "counter", "write calls of the job", run, io.get("writes", 0))
    if io.get("reads"):
        m.add(
            "holoprof_io_read_bandwidth_bytes_per_second",
            "gauge",
            "read bandwidth of the job while in read calls",
            run,
            io.get("bandwidth_read_bytes_per_s", 0),
        )


def _memory(m: _Adder, run: dict[str, str], doc: dict[str, Any]) -> None:
    mem = doc.get("memory") or {}
    if mem.get("peak_bytes") is not None:
        m.add(
            "holoprof_memory_peak_bytes",
            "gauge",
            "peak memory of the training process",
            run,
            mem["peak_bytes"],
        )
    for cat, v in (mem.get("categories") or {}).items():
        if isinstance(v, (int, float)):
            m.add(
                "holoprof_memory_category_bytes",
                "gauge",
                "memory by category at the peak",
                {**run, "category": cat},
                v,
            )


def _compute(m: _Adder, run: dict[str, str], doc: dict[str, Any]) -> None:
    c = doc.get("compute") or {}
    if c.get("flops_per_step"):
        m.add(
            "holoprof_flops_per_step",
            "gauge",
            "FLOPs of one training step (counted on one step)",
            run,
            c["flops_per_step"],
        )
        m.add(
            "holoprof_achieved_flops_per_second",
            "gauge",
            "FLOPs per step over the steady mean step",
            run,
            c.get("achieved_flops_per_s") or 0,
        )
    if c.get("peak_flops_per_s"):
        m.add(
            "holoprof_peak_flops_per_second",
            "gauge",
            "the peak MFU is measured against (data sheet or measured GEMM peak)",
            run,
            c["peak_flops_per_s"],
        )
    if c.get("mfu") is not None:
        m.add(
            "holoprof_mfu_ratio", "gauge", "model FLOPs utilization: achieved over peak FLOP/s", run, c["mfu"]
        )
    comp = c.get("compile") or {}
    if comp:
        m.add(
            "holoprof_compile_seconds",
            "gauge",
            "time torch.compile spent compiling",
            run,
            comp.get("total_s") or 0,
        )
        m.add(
            "holoprof_graph_breaks",
            "gauge",
            "graph breaks torch.compile recorded",
            run,
            sum(int(r.get("count") or 0) for r in comp.get("graph_breaks") or []),
        )
        m.add(
            "holoprof_recompiles",
            "gauge",
            "recompilations torch.compile made",
            run,
            sum(int(r.get("count") or 0) for r in comp.get("recompiles") or []),
        )
    g = doc.get("goodput") or {}
    if g.get("categories"):
        m.add(
            "holoprof_goodput_ratio",
            "gauge",
            "productive step compute over the wall time",
            run,
            g.get("fraction") or 0,
        )
        for cat, v in g["categories"].items():
            m.add(
                "holoprof_wall_time_seconds",
                "gauge",
                "the training process's wall time by goodput category",
                {**run, "category": cat},
                v,
            )


def _resources(m: _Adder, run: dict[str, str], doc: dict[str, Any]) -> None:
    summary = (doc.get("resources") or {}).get("summary") or {}
    for name, s in summary.items():
        if name in RESOURCE_METRICS:
            metric, kind, help_text, scale = RESOURCE_METRICS[name]
            m.add(metric, kind, help_text, run, s["last"] * scale)
            continue
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "gpu" and parts[2] in GPU_METRICS:
            metric, help_text, scale = GPU_METRICS[parts[2]]
            m.add(metric, "gauge", help_text, {**run, "gpu": parts[1]}, s["last"] * scale)


def _hang(m: _Adder, run: dict[str, str], doc: dict[str, Any]) -> None:
    """How long the job has been hung (0 once the hang resolved or the job ended); only for a run that
    hung (the ``hang`` section): alert on ``holoprof_hang_seconds > 0``."""
    hang = doc.get("hang") or {}
    if not hang.get("status"):
        return
    m.add(
        "holoprof_hang_seconds",
        "gauge",
        "how long the job has been hung in a collective (0 when it is not hung now)",
        run,
        hang.get("hung_s", 0.0) if hang["status"] == "ongoing" else 0.0,
    )


def run_samples(doc: dict[str, Any]) -> list[Sample]:
    """The samples of one report (``holoprof.report/1``), without the ``run`` label."""
    m = _Samples()
    run: dict[str, str] = {}
    m.add(
        "holoprof_run_running",
        "gauge",
        "1 while the run is running",
        run,
        doc["run"]["status"] == "running",
    )
    _steps(m, run, doc)
    _io(m, run, doc)
    _memory(m, run, doc)
    _compute(m, run, doc)
    _resources(m, run, doc)
    _hang(m, run, doc)
    return m.samples


def render(runs: Iterable[tuple[str, Iterable[Sample]]], pending: int | None = None) -> str:
    """The text of the runs' samples (``(run id, samples)``), each sample labelled with its run.
    ``pending``: how many runs were left out because their samples are not ready yet, exported as
    ``holoprof_runs_pending`` while there are any."""
    m = _Metrics()
    for run_id, samples in runs:
        for name, kind, help_text, labels, value in samples:
            m.add(name, kind, help_text, {"run": run_id, **labels}, value)
    if pending:
        m.add(
            "holoprof_runs_pending",
            "gauge",
            "runs left out of this scrape while their summary is being built",
            {},
            pending,
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(m)
    return generate_latest(registry).decode()


def prometheus_text(reports: Iterable[tuple[str, dict[str, Any]]]) -> str:
    """The reports (``(run id, report document)``) as the Prometheus text exposition format."""
    return render((run_id, run_samples(doc)) for run_id, doc in reports)
