"""Peak FLOP/s to measure a step against: NVIDIA data-sheet numbers by GPU and dtype, or the measured
CPU peak written into the run (:mod:`holoprof.launch.peak`).

The GPU numbers are the dense peaks (without structured sparsity, which the data sheets quote as well
at twice the rate and which training does not use): Tensor Core rates for bf16, fp16, TF32 and fp8,
the plain FP32 rate for float32 at the ``highest`` matmul precision. A float32 step on a GPU with
Tensor Cores whose matmuls may use TF32 (``torch.set_float32_matmul_precision("high")`` or
``"medium"``, or ``torch.backends.cuda.matmul.allow_tf32``) is measured against the TF32 peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

T = 1e12


@dataclass(frozen=True)
class Gpu:
    product: str  # as the data sheet names it
    sheet: str  # which data sheet
    peaks: dict[str, float]  # dtype -> dense peak FLOP/s


# fmt: off
GPUS: tuple[tuple[str, Gpu], ...] = (
    # (pattern over the upper-cased torch.cuda.get_device_name(), GPU); first match wins
    (r"H100.*NVL", Gpu("H100 NVL", "NVIDIA H100 Tensor Core GPU data sheet",
        {"float64": 30 * T, "float32": 60 * T, "tf32": 417.5 * T, "bfloat16": 835.5 * T,
         "float16": 835.5 * T, "float8": 1670.5 * T})),
    (r"H100.*PCIE", Gpu("H100 PCIe", "NVIDIA H100 Tensor Core GPU data sheet",
        {"float64": 26 * T, "float32": 51 * T, "tf32": 378 * T, "bfloat16": 756 * T,
         "float16": 756 * T, "float8": 1513 * T})),
    (r"H100|H200|GH200", Gpu("H100/H200 SXM", "NVIDIA H100 and H200 Tensor Core GPU data sheets",
        {"float64": 34 * T, "float32": 67 * T, "tf32": 494.5 * T, "bfloat16": 989.5 * T,
         "float16": 989.5 * T, "float8": 1979 * T})),
    (r"B200", Gpu("B200", "NVIDIA HGX B200 data sheet (per GPU)",
        {"bfloat16": 2250 * T, "float16": 2250 * T, "float8": 4500 * T})),
    (r"A100", Gpu("A100", "NVIDIA A100 Tensor Core GPU data sheet",
        {"float64": 9.7 * T, "float32": 19.5 * T, "tf32": 156 * T, "bfloat16": 312 * T,
         "float16": 312 * T})),
    (r"\bA10\b", Gpu("A10", "NVIDIA A10 Tensor Core GPU data sheet",
        {"float32": 31.2 * T, "tf32": 62.5 * T, "bfloat16": 125 * T, "float16": 125 * T})),
    (r"L40S", Gpu("L40S", "NVIDIA L40S GPU data sheet",
        {"float32": 91.6 * T, "tf32": 183 * T, "bfloat16": 362.05 * T, "float16": 362.05 * T,
         "float8": 733 * T})),
    (r"\bL4\b", Gpu("L4", "NVIDIA L4 Tensor Core GPU data sheet",
        {"float32": 30.3 * T, "tf32": 60 * T, "bfloat16": 121 * T, "float16": 121 * T,
         "float8": 242.5 * T})),
    (r"V100.*PCIE", Gpu("V100 PCIe", "NVIDIA V100 Tensor Core GPU data sheet",
        {"float64": 7 * T, "float32": 14 * T, "float16": 112 * T})),
    (r"V100", Gpu("V100 SXM2", "NVIDIA V100 Tensor Core GPU data sheet",
        {"float64": 7.8 * T, "float32": 15.7 * T, "float16": 125 * T})),
    (r"\bT4\b", Gpu("T4", "NVIDIA T4 Tensor Core GPU data sheet",
        {"float32": 8.1 * T, "float16": 65 * T})),
)
# fmt: on

_LABELS = {
    "float64": "FP64",
    "float32": "FP32",
    "tf32": "TF32 Tensor Core",
    "bfloat16": "BF16 Tensor Core",
    "float16": "FP16 Tensor Core",
    "float8": "FP8 Tensor Core",
}


def gpu_of(device_name: str) -> Gpu | None:
    name = device_name.upper()
    for pattern, gpu in GPUS:
        if re.search(pattern, name):
            return gpu
    return None


def table_dtype(dtype: str, matmul_precision: str = "highest", allow_tf32: bool = False) -> str:
    """The data-sheet column a step of ``dtype`` computes at: float32 matmuls that may use TF32 count
    as ``tf32``; every float8 variant as ``float8``."""
    if dtype.startswith("float8"):
        return "float8"
    if dtype == "float32" and (allow_tf32 or matmul_precision in ("high", "medium")):
        return "tf32"
    return dtype


def gpu_peak(
    device_name: str, dtype: str, matmul_precision: str = "highest", allow_tf32: bool = False
) -> tuple[float, str]:
    """(dense peak FLOP/s, its source) of ``device_name`` for a step computing in ``dtype``; (0, why)
    when the table has none."""
    gpu = gpu_of(device_name)
    if gpu is None:
        return 0.0, f"no data-sheet peak is known for {device_name or 'this GPU'}"
    col = table_dtype(dtype, matmul_precision, allow_tf32)
    peak = gpu.peaks.get(col)
    if peak is None:
        return 0.0, f"the {gpu.product} data sheet gives no {col} peak"
    label = _LABELS.get(col, col)
    return peak, f"{gpu.sheet}: {gpu.product} {label} {peak / T:g} TFLOP/s dense (without sparsity)"


def gpu_alternatives(device_name: str) -> dict[str, float]:
    """Every data-sheet peak of ``device_name`` by table dtype ({} when unknown)."""
    gpu = gpu_of(device_name)
    return dict(gpu.peaks) if gpu is not None else {}


def cpu_peak(peaks: list[dict[str, Any]], host: str, dtype: str, threads: int) -> tuple[float, str]:
    """(measured peak FLOP/s, its source) of ``host``'s CPU for ``dtype`` and ``threads`` among the
    run's measured ``peaks``; (0, why) when the run has none."""
    for e in peaks:
        if (
            e.get("host") == host
            and e.get("device") == "cpu"
            and e.get("dtype") == dtype
            and int(e.get("threads") or 0) == threads
        ):
            peak = float(e.get("peak_flops_per_s") or 0)
            if peak > 0:
                return peak, str(e.get("source") or "measured GEMM peak")
    return 0.0, (
        f"no CPU peak was measured for {dtype} with {threads} thread{'s' if threads != 1 else ''} on "
        f"{host}: it is measured once the job has ended, by `holoprof run` or by `holoprof report RUN` on that "
        "machine (a GEMM micro-benchmark of a few seconds, cached per machine)"
    )


def cpu_alternatives(peaks: list[dict[str, Any]], host: str, threads: int) -> dict[str, float]:
    """The measured CPU peaks of ``host`` with ``threads`` by dtype."""
    return {
        str(e.get("dtype")): float(e.get("peak_flops_per_s") or 0)
        for e in peaks
        if e.get("host") == host and e.get("device") == "cpu" and int(e.get("threads") or 0) == threads
    }
