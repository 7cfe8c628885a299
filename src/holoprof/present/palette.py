"""One palette and one vocabulary for every view of a report: the dashboard, the HTML report and the
charts they share (``assets/charts.js``, drawn with uPlot).

The phases come from :data:`holoprof.model.PHASES` (the data model's one list): every phase has a
colour and a label here, and the dashboard and the HTML report take this list (as
:func:`palette_js`) instead of keeping their own. Resource series get human labels and units; host
series are marked so that charts show the job's own series first.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from holoprof import model

#: Every phase of the data model, in its order, with its colour (the dashboard's palette).
PHASE_COLORS: dict[str, str] = {
    "data_wait": "#e45756",
    "forward": "#4c78a8",
    "backward": "#72b7b2",
    "optimizer": "#54a24b",
    "compute": "#5b5fc7",
    "compile": "#ff9da6",
    "communication": "#b279a2",
    "checkpoint": "#f58518",
    "eval": "#eeca3b",
    "other": "#a5a9b4",
}
PHASE_LABELS: dict[str, str] = {p: p.replace("_", " ") for p in model.PHASES}
#: A phase that a later version adds and this palette does not know yet is still drawn, in grey.
UNKNOWN_PHASE_COLOR = "#7f7f7f"

SEVERITY_COLORS = {"high": "#d0453c", "medium": "#d48a1c", "low": "#3b6fd8"}
KIND_COLORS = {
    "train": "#54a24b",
    "evaluate": "#a5a9b4",
    "checkpoint": "#f58518",
    "prepare": "#e45756",
    "other": "#9ecae9",
}
MEMORY_COLORS = {
    "weights": "#4c78a8",
    "gradients": "#e45756",
    "optimizer_state": "#b279a2",
    "activations": "#54a24b",
    "other": "#a5a9b4",
}
#: Colours of the lines of one chart, in order (the job's series first, then the host's).
SERIES_COLORS = ("#3b6fd8", "#e45756", "#54a24b", "#b279a2", "#f58518", "#72b7b2")

#: Resource series: name -> (label, unit). Units: "percent", "bytes", "bytes_per_s", "watts".
SERIES: dict[str, tuple[str, str]] = {
    "job.cpu_percent": ("job CPU (100% = one core)", "percent"),
    "host.cpu_percent": ("host CPU, all processes (100% = every core)", "percent"),
    "job.rss_bytes": ("job memory (RSS)", "bytes"),
    "host.mem_used_bytes": ("host memory used, all processes", "bytes"),
    "job.read_bytes_per_s": ("job storage reads", "bytes_per_s"),
    "job.write_bytes_per_s": ("job storage writes", "bytes_per_s"),
    "host.net_recv_bytes_per_s": ("host network in", "bytes_per_s"),
    "host.net_sent_bytes_per_s": ("host network out", "bytes_per_s"),
}
#: Resource charts: (key, title, unit, series). Host series start hidden when the job's own are there
#: (a click on the legend shows them): they would set the scale and flatten the job's lines.
RESOURCE_GROUPS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("cpu", "CPU", "percent", ("job.cpu_percent", "host.cpu_percent")),
    ("mem", "Memory", "bytes", ("job.rss_bytes", "host.mem_used_bytes")),
    ("disk", "Storage I/O", "bytes_per_s", ("job.read_bytes_per_s", "job.write_bytes_per_s")),
    ("net", "Network (host)", "bytes_per_s", ("host.net_recv_bytes_per_s", "host.net_sent_bytes_per_s")),
)
#: GPU series (``gpu.<index>.<what>``): what -> (label, unit, chart key, chart title).
GPU_SERIES: dict[str, tuple[str, str, str, str]] = {
    "util_percent": ("utilization", "percent", "gpu-util", "GPU utilization"),
    "mem_used_bytes": ("memory used", "bytes", "gpu-mem", "GPU memory"),
    "power_w": ("power", "watts", "gpu-power", "GPU power"),
}

#: The rank × step heatmap's maps (the report's ``stragglers.heatmap`` keys): (key, label, colour of
#: the largest value; cells go from the palest tint of it to it).
HEATMAP_MAPS: tuple[tuple[str, str, str], ...] = (
    ("step_s", "step time", SERIES_COLORS[0]),
    ("compute_s", "compute", PHASE_COLORS["compute"]),
    ("data_wait_s", "data wait", PHASE_COLORS["data_wait"]),
    ("communication_s", "communication (exposed: waiting included)", PHASE_COLORS["communication"]),
    ("other_s", "other", PHASE_COLORS["other"]),
)

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")


def phase_color(phase: str) -> str:
    return PHASE_COLORS.get(phase, UNKNOWN_PHASE_COLOR)


def phase_label(phase: str) -> str:
    return PHASE_LABELS.get(phase, phase.replace("_", " "))


def series_label(name: str) -> str:
    """A resource series' name for people: ``job.cpu_percent`` -> "job CPU (100% = one core)"."""
    if name in SERIES:
        return SERIES[name][0]
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "gpu" and parts[2] in GPU_SERIES:
        return f"GPU {parts[1]} {GPU_SERIES[parts[2]][0]}"
    return name.replace("_", " ").replace(".", " ")


def palette_doc() -> dict[str, Any]:
    """Everything above as one JSON-able document (what the JavaScript views read)."""
    return {
        "phases": list(model.PHASES),
        "phase_colors": {p: phase_color(p) for p in model.PHASES},
        "phase_labels": {p: phase_label(p) for p in model.PHASES},
        "unknown_phase_color": UNKNOWN_PHASE_COLOR,
        "severity_colors": SEVERITY_COLORS,
        "kind_colors": KIND_COLORS,
        "memory_colors": MEMORY_COLORS,
        "series_colors": list(SERIES_COLORS),
        "series": {k: {"label": v[0], "unit": v[1]} for k, v in SERIES.items()},
        "resource_groups": [
            {"key": k, "title": t, "unit": u, "names": list(n)} for k, t, u, n in RESOURCE_GROUPS
        ],
        "gpu_series": {
            k: {"label": v[0], "unit": v[1], "key": v[2], "title": v[3]} for k, v in GPU_SERIES.items()
        },
        "heatmap_maps": [{"key": k, "label": label, "color": c} for k, label, c in HEATMAP_MAPS],
    }


def script_json(doc: Any) -> str:
    """``doc`` as JSON that is safe inside a ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(doc, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def palette_js() -> str:
    """The palette as a script that sets ``window.HOLOPROF_PALETTE``."""
    return f"window.HOLOPROF_PALETTE = {script_json(palette_doc())};\n"


def asset(name: str) -> str:
    """The text of one of the shared view assets (``charts.js``, ``vendor/uPlot.iife.min.js``, ...)."""
    with open(os.path.join(ASSETS_DIR, *name.split("/")), encoding="utf-8") as f:
        return f.read()


# --- findings' evidence: named numbers with their units (as charts.js's evidenceLabel/Value) ---------
_LABEL_RULES = (
    (re.compile(r"^per_s$"), "per second"),
    (re.compile(r"_bytes_per_s$"), ""),
    (re.compile(r"_per_s$"), " per second"),
    (re.compile(r"_s_per_step$"), " per step"),
    (re.compile(r"_(s|bytes|percent)$"), ""),
    (re.compile(r"_fraction(_of_[a-z]+)?$"), r" share\1"),
)


def evidence_label(key: str) -> str:
    """An evidence key for people, its unit left to the value: ``data_wait_fraction`` -> "data wait
    share", ``step_median_s`` -> "step median"."""
    for pattern, repl in _LABEL_RULES:
        key = pattern.sub(repl, key)
    return key.replace("_", " ")


def fmt_seconds(s: float) -> str:
    """Seconds as the dashboard writes them: 243 µs, 54.7 ms, 2.07 s, 3 min 5 s."""
    a = abs(s)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{s * 1e6:.{2 if a < 1e-5 else 0}f} µs"
    if a < 1:
        return _trim(f"{s * 1e3:.{2 if a < 0.01 else 1 if a < 0.1 else 0}f}") + " ms"
    if a < 120:
        return _trim(f"{s:.{2 if a < 10 else 1}f}") + " s"
    if a < 7200:
        return f"{int(s // 60)} min {round(s % 60)} s"
    return f"{s / 3600:.1f} h"


def fmt_bytes(b: float) -> str:
    """Bytes in binary units as the dashboard writes them: 0 B, 9.77 KiB, 256 MiB, 512 GiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    v, i = abs(float(b)), 0
    while v >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    num = f"{v:.0f}" if i == 0 else _trim(f"{v:.{2 if v < 10 else 1 if v < 100 else 0}f}")
    return ("-" if b < 0 else "") + f"{num} {units[i]}"


def fmt_pct(f: float) -> str:
    return _trim(f"{100 * f:.{1 if f < 0.1 else 0}f}") + "%"


def fmt_number(x: float) -> str:
    """Counts with thousands separators, other numbers to three significant digits."""
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{round(x):,}" if abs(x) >= 1000 else f"{float(f'{x:.3g}'):g}"


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))


def fmt_flops(x: float | None, unit: str = "FLOP") -> str:
    """``x`` FLOPs (or FLOP/s with ``unit="FLOP/s"``) with an SI prefix: "136.2 MFLOP", "15.6 GFLOP/s"."""
    if x is None:
        return "n/a"
    x = float(x)
    for scale, prefix in _SI:
        if abs(x) >= scale:
            return f"{x / scale:.1f} {prefix}{unit}"
    return f"{x:.0f} {unit}"


def fmt_mfu(f: float) -> str:
    """Model FLOPs utilization with one decimal, as the ``low_mfu`` finding's title writes it: 16.3%."""
    return f"{100 * f:.1f}%"


def _trim(text: str) -> str:
    """``12.0`` -> ``12``, ``12.50`` -> ``12.5`` (as JavaScript's ``+x.toFixed(n)``)."""
    return text.rstrip("0").rstrip(".") if "." in text else text


_VALUE_RULES: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"(^|_)flops_per_s$"), lambda v: fmt_flops(v, "FLOP/s")),
    (re.compile(r"(^|_)flops(_per_step)?$"), fmt_flops),
    (re.compile(r"(^|_)mfu$"), fmt_mfu),
    (re.compile(r"_bytes_per_s$"), lambda v: fmt_bytes(v) + "/s"),
    (re.compile(r"(^|_)per_s$"), lambda v: fmt_number(v) + "/s"),
    (re.compile(r"_s(_per_step)?$"), fmt_seconds),
    (re.compile(r"(^|_)bytes(_per_(step|save|sample))?$"), fmt_bytes),
    (re.compile(r"(fraction|share|ratio)(_of_[a-z]+)?$"), fmt_pct),
    (re.compile(r"_percent$"), lambda v: _trim(f"{v:.{1 if abs(v) < 10 else 0}f}") + "%"),
    (re.compile(r"(^|_)(pid|rank|step)$"), lambda v: str(v)),
)


def evidence_value(key: str, v: Any) -> str:
    """An evidence value with the unit its key names (``_s``, ``_bytes``, ``_fraction``, ...)."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if not isinstance(v, (int, float)):
        return str(v)
    for pattern, fmt in _VALUE_RULES:
        if pattern.search(key):
            return str(fmt(v))
    return fmt_number(v)
