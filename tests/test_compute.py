"""How close to the machine's limit: FLOPs per step, MFU, goodput and torch.compile, on real jobs that
measure their own truth (tests/framework_scripts/flops_models.py): an MLP, a CNN and a small GPT, the
CNN and the GPT also under torch.compile, the GPT with a data-dependent branch (a graph break), both
with an evaluation under no_grad after training (a recompilation).

* FLOPs per step equal FlopCounterMode's count of the same step within 2%; the GPT's are within 10%
  of 6·N·tokens plus attention (12·layers·width·sequence per token);
* MFU is in (0, 1], against a peak whose source the report names (this CPU's GEMM peak, measured
  after the job and cached per machine; the NVIDIA data sheets for GPUs, checked with named devices);
* goodput's categories sum to the process's wall time, which agrees with the script's own (from its
  creation to its last line) within 2%;
* under torch.compile (the GPT and the CNN), the first step's compile time agrees with the script's
  own timing of that step within 25%, the evaluation's recompilation is outside the steps, the
  FLOPs are counted and tracing changes no loss bit; the GPT's data-dependent branch is a graph
  break with Dynamo's reason, hints and the script's line;
* tracing computes what the job computes untraced, bit for bit.

torch.compile runs with the ``aot_eager`` backend here (Dynamo, AOTAutograd and its lazily compiled
backward, without Inductor's code generation, which takes minutes on a small CPU): what holoprof
reads is Dynamo's, the same with every backend.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import TracedRun, run_holoprof, run_python, traced
from holoprof.analyze.compile import recompiles_finding
from holoprof.analyze.compute import _peak, low_mfu
from holoprof.analyze.findings import gain_floor, measurable
from holoprof.analyze.peaks import gpu_peak, table_dtype
from holoprof.analyze.steps import PhaseStat, ProcKey, StepStats
from holoprof.collect.compile import parse_reason, recompile_record
from holoprof.collect.flops import cuda_device
from holoprof.errors import HoloprofError
from holoprof.knobspec import parse_value
from holoprof.launch.peak import cache_key, cpu_model, cpu_peaks

SCRIPT = str(Path(__file__).resolve().parent / "framework_scripts" / "flops_models.py")
MODELS = ("mlp", "cnn", "gpt")
COMPILE_ENV = {"COMPILE_BACKEND": "aot_eager"}


def _truth(tmp: Path) -> dict[str, Any]:
    doc = json.loads((tmp / "truth.json").read_text())
    assert isinstance(doc, dict)
    return doc


def _env(tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"TRUTH_OUT": str(tmp / "truth.json"), **(extra or {})}


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """FlopCounterMode's count of one training step of each model (untraced)."""
    tmp = tmp_path_factory.mktemp("flops-count")
    proc = run_python(SCRIPT, "--count", cwd=tmp, env=_env(tmp), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k: int(v) for k, v in _truth(tmp).items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[TracedRun, dict[str, Any]]]:
    """Each model traced (the CNN with --set matmul_precision=high), with its own truth."""
    out = {}
    for m in MODELS:
        tmp = tmp_path_factory.mktemp(f"flops-{m}")
        opts = ("--set", "matmul_precision=high") if m == "cnn" else ()
        run = traced(tmp, sys.executable, SCRIPT, m, options=opts, env=_env(tmp), timeout=300)
        assert run.proc.returncode == 0, run.proc.stderr[-3000:]
        out[m] = (run, _truth(tmp))
    return out


COMPILED = ("gpt", "cnn")


@pytest.fixture(scope="module")
def compiled_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[TracedRun, dict[str, Any], dict[str, Any]]]:
    """The GPT and the CNN under torch.compile, traced and untraced: {model: (run, its truth, the
    untraced truth)}."""
    out = {}
    for m in COMPILED:
        tmp = tmp_path_factory.mktemp(f"flops-compiled-{m}")
        run = traced(tmp, sys.executable, SCRIPT, m, "--compile", env=_env(tmp, COMPILE_ENV), timeout=600)
        assert run.proc.returncode == 0, run.proc.stderr[-3000:]
        plain = tmp_path_factory.mktemp(f"flops-compiled-{m}-untraced")
        proc = run_python(SCRIPT, m, "--compile", cwd=plain, env=_env(plain, COMPILE_ENV), timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[m] = (run, _truth(tmp), _truth(plain))
    return out


@pytest.fixture(scope="module")
def compiled(
    compiled_runs: dict[str, tuple[TracedRun, dict[str, Any], dict[str, Any]]],
) -> tuple[TracedRun, dict[str, Any], dict[str, Any]]:
    """The GPT under torch.compile (a graph break, a recompilation for its evaluation)."""
    return compiled_runs["gpt"]


# --- FLOPs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", MODELS)
def test_flops_per_step_equal_flopcountermode(
    runs: dict[str, tuple[TracedRun, dict[str, Any]]], counted: dict[str, int], model: str
) -> None:
    c = runs[model][0].report["compute"]
    assert c["flops_per_step"] == pytest.approx(counted[model], rel=0.02)
    assert c["counted_step"] == 1 and c["dtype"] == "float32" and c["device"] == "cpu"
    phases = c["flops_by_phase"]
    assert phases["forward"] > 0 and phases["backward"] > phases["forward"], phases
    assert sum(phases.values()) == c["flops_per_step"]


def test_gpt_flops_are_6n_tokens_plus_attention(runs: dict[str, tuple[TracedRun, dict[str, Any]]]) -> None:
    """nanoGPT's estimate: 6 FLOPs per parameter and token (position embeddings left out) plus
    12·layers·width·sequence per token for attention."""
    run, t = runs["gpt"]
    n = t["params"] - t["position_params"]
    want = t["tokens"] * (6 * n + 12 * t["layers"] * t["d_model"] * t["seq"])
    assert run.report["compute"]["flops_per_step"] == pytest.approx(want, rel=0.10)


@pytest.mark.parametrize("model", MODELS)
def test_mfu_is_a_fraction_of_a_named_peak(
    runs: dict[str, tuple[TracedRun, dict[str, Any]]], model: str
) -> None:
    run, _t = runs[model]
    c = run.report["compute"]
    assert 0 < c["mfu"] <= 1, c
    assert "measured GEMM peak of this CPU" in c["peak_source"] and "float32" in c["peak_source"]
    assert c["achieved_flops_per_s"] == pytest.approx(c["flops_per_step"] / c["mean_step_s"], rel=1e-3)
    assert c["mfu"] == pytest.approx(c["achieved_flops_per_s"] / c["peak_flops_per_s"], rel=1e-3)
    # the mean is over the steady steps: the counted step (slower: every operator through Python) is
    # one of the warm-up steps left out
    assert c["counted_step"] < 2 and c["steps_in_mean"] == run.report["steps"]["count"] - 2
    peaks = list((Path(run.run_dir) / "artifacts").glob("peak-flops-*.json"))
    assert peaks, "the peak is written into the run"
    assert "MFU" in run_holoprof("report", run.run_dir, cwd=Path(run.run_dir).parent).stdout


def test_the_knob_sets_the_matmul_precision(runs: dict[str, tuple[TracedRun, dict[str, Any]]]) -> None:
    doc = runs["cnn"][0].report
    assert doc["run"]["knobs"] == {"matmul_precision": "high"}
    assert doc["compute"]["matmul_precision"] == "high"
    assert runs["mlp"][0].report["compute"]["matmul_precision"] == "highest"


def _given_peaks(tmp: Path, fp32: float, bf16: float) -> dict[str, str]:
    """A machine cache of CPU peaks (``XDG_CACHE_HOME`` under ``tmp``) that says this CPU's bf16
    GEMMs peak at ``bf16`` and its fp32 ones at ``fp32``, for every thread count: the environment of a
    job whose ``low_mfu`` finding must not depend on how this machine's measured peaks compare."""
    import torch

    cache = tmp / "cache"
    entries = {
        cache_key(cpu_model(), dtype, threads, torch.__version__): {
            "device": "cpu", "cpu_model": cpu_model(), "dtype": dtype, "threads": threads,
            "peak_flops_per_s": peak, "n": 512, "reps": 1, "torch": torch.__version__,
            "measured_at": "given by the test",
        }
        for dtype, peak in (("float32", fp32), ("bfloat16", bf16))
        for threads in range(1, (os.cpu_count() or 1) + 1)
    }  # fmt: skip
    (cache / "holoprof").mkdir(parents=True)
    (cache / "holoprof" / "peak-flops.json").write_text(json.dumps(entries))
    return {"XDG_CACHE_HOME": str(cache)}


def _tune_gpt(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """``holoprof tune --steps 8 --json`` of the GPT (its 8 steps): its JSON answer."""
    proc = run_holoprof(
        "tune", "--steps", "8", "--out", str(tmp / "t"), "--json", "--", sys.executable, SCRIPT, "gpt",
        cwd=tmp, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict)
    return doc


def test_tune_measures_what_low_mfu_can_apply(
    runs: dict[str, tuple[TracedRun, dict[str, Any]]], tmp_path: Path
) -> None:
    """A job that is not input-bound: tune sweeps the low_mfu finding's no-code-change knobs (bf16
    autocast, the job as it is first) and measures the best. The peaks are given, as a CPU with bf16
    units has them: whether this machine's own measured peaks fire the finding is up to its CPU and its
    load. The fp32 peak is 5 times the GPT's own achieved rate here (an MFU of about 20%: a finding
    whatever the load does to the tune run, from half to twice the speed), the bf16 one 10 times that."""
    achieved = runs["gpt"][0].report["compute"]["achieved_flops_per_s"]
    env = _env(tmp_path, _given_peaks(tmp_path, fp32=5 * achieved, bf16=50 * achieved))
    doc = _tune_gpt(tmp_path, env)
    f = doc["finding"]
    assert f is not None, doc
    assert f["id"] == "low_mfu", doc
    knobs = {k: v for c in f["evidence"]["changes"] for k, v in (c.get("knobs") or {}).items()}
    assert knobs == {"autocast": ["off", "bf16"]}  # no TF32 on a CPU
    assert doc["sweep"]["knobs"] == knobs
    rows = {r["label"]: r for r in doc["sweep"]["rows"]}
    assert set(rows) == {"autocast=off", "autocast=bf16"} and all(r["steps"] == 8 for r in rows.values())
    dtypes = {
        label: json.loads(run_holoprof("report", r["run_dir"], "--json", cwd=tmp_path, env=env).stdout)[
            "compute"
        ]["dtype"]
        for label, r in rows.items()
    }
    assert dtypes == {"autocast=off": "float32", "autocast=bf16": "bfloat16"}
    assert (
        doc["measured"]["gain_kind"] == "measured" and doc["measured"]["gain_basis"]["this"] == "autocast=off"
    )


def test_tune_says_when_low_mfu_names_no_knob(tmp_path: Path) -> None:
    """A CPU whose bf16 peak is below its fp32 one: no knob can raise the MFU, so tune sweeps nothing
    and says why (nothing to tune, or the changes the finding names need code)."""
    env = _env(tmp_path, _given_peaks(tmp_path, fp32=1e12, bf16=5e11))
    doc = _tune_gpt(tmp_path, env)
    assert "sweep" not in doc and "measured" not in doc, doc
    f = doc["finding"]
    if f is None:
        assert "nothing to tune" in doc["message"]
    else:
        assert f["id"] == "low_mfu" and "need code changes" in doc["message"]
        assert all(not c.get("knobs") for c in f["evidence"]["changes"])
    assert "autocast" not in doc["message"]


def test_traced_gpt_computes_what_untraced_does(
    runs: dict[str, tuple[TracedRun, dict[str, Any]]], tmp_path: Path
) -> None:
    proc = run_python(SCRIPT, "gpt", cwd=tmp_path, env=_env(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert runs["gpt"][1]["losses"] == _truth(tmp_path)["losses"]


# --- goodput ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", MODELS)
def test_goodput_sums_to_the_wall_time(runs: dict[str, tuple[TracedRun, dict[str, Any]]], model: str) -> None:
    run, t = runs[model]
    g = run.report["goodput"]
    cats = g["categories"]
    assert sum(cats.values()) == pytest.approx(g["wall_s"], abs=1e-4)
    # the process's wall time runs to its real exit (its interpreter's teardown after the script's
    # last line included, in after_last_step): at least the script's own, the rest after its last step
    script_wall = t["ended_s"] - t["created_s"]
    assert g["wall_s"] >= script_wall * 0.98
    assert g["wall_s"] - script_wall <= cats["after_last_step"] + 0.02 * g["wall_s"], (g, script_wall)
    assert cats["startup"] == pytest.approx(t["first_step_s"] - t["created_s"], rel=0.05)
    assert cats["eval"] > 0 and cats["checkpoint"] > 0 and cats["productive"] > 0
    assert g["fraction"] == pytest.approx(cats["productive"] / g["wall_s"], abs=1e-5)


# --- torch.compile -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", COMPILED)
def test_compiled_model_trains_bit_for_bit_and_counts_its_flops(
    compiled_runs: dict[str, tuple[TracedRun, dict[str, Any], dict[str, Any]]],
    counted: dict[str, int],
    model: str,
) -> None:
    run, t, untraced = compiled_runs[model]
    assert t["losses"] == untraced["losses"]
    c = run.report["compute"]
    assert c["flops_per_step"] == pytest.approx(counted[model], rel=0.02)
    assert 0 < c["mfu"] <= 1


@pytest.mark.parametrize("model", COMPILED)
def test_compile_time_is_its_own_phase(
    compiled_runs: dict[str, tuple[TracedRun, dict[str, Any], dict[str, Any]]], model: str
) -> None:
    """The first step's compilation, against the script's own timing of that step less a steady one;
    the evaluation's recompilation after training is outside the steps and said so."""
    run, t, _u = compiled_runs[model]
    comp = run.report["compute"]["compile"]
    own = t["step_s"][0] - statistics.median(t["step_s"][2:])
    first = next(s["seconds"] for s in comp["steps"] if s["step"] == 0)
    assert first == pytest.approx(own, rel=0.25)
    assert set(comp["by_trigger"]) >= {"DYNAMO", "LAZY_BACKWARD"}
    assert [s["step"] for s in comp["steps"]] == [0], "only the first step compiles"
    assert comp["outside_steps"]["after_last_step"] > 0, "the evaluation after training recompiles"
    assert comp["total_s"] == pytest.approx(
        sum(s["seconds"] for s in comp["steps"]) + sum(comp["outside_steps"].values()), abs=1e-5
    )
    phases = run.report["phases"]
    assert phases["compile"]["total_s"] == pytest.approx(first, rel=0.02)
    assert phases["forward"]["total_s"] < phases["compile"]["total_s"], "compilation is cut out of forward"
    assert run.report["goodput"]["categories"]["compile"] >= first


def test_graph_break_with_reason_hints_and_line(
    compiled: tuple[TracedRun, dict[str, Any], dict[str, Any]],
) -> None:
    run, t, _u = compiled
    breaks = run.report["compute"]["compile"]["graph_breaks"]
    b = next(b for b in breaks if b["reason"] == "Data-dependent branching")
    assert b["location"] == f"{SCRIPT}:{t['branch_line']}"
    assert "# BRANCH" in b["code"] and b["count"] >= 1
    assert any("torch.cond" in h for h in b["hints"])
    f = next(f for f in run.report["findings"] if f["id"] == "graph_breaks")
    assert str(t["branch_line"]) in f["title"] and "torch.cond" in f["recommendation"]


def test_recompilation_for_the_evaluation(compiled: tuple[TracedRun, dict[str, Any], dict[str, Any]]) -> None:
    """The evaluation under no_grad after training recompiles (grad mode is a guard): named and timed
    in the compile section, outside the training steps; it costs no step anything, so no finding."""
    run, _t, _u = compiled
    rec = run.report["compute"]["compile"]["recompiles"]
    assert any("grad_mode" in r["reason"] and r["seconds"] > 0 and r["in_steps_s"] == 0 for r in rec), rec
    assert not any("holoprof/collect" in r["location"] for r in rec), "holoprof's own wrapper is not named"
    assert "recompiles" not in {f["id"] for f in run.report["findings"]}


def _recompile_rows(in_steps_s: float, count: int = 1) -> dict[str, Any]:
    row = {"reason": "tensor 'x' size mismatch at index 0. expected 32, actual 7", "location": "train.py:12"}
    return {
        "recompiles": [{**row, "frame": "forward", "count": count, "seconds": 0.5, "in_steps_s": in_steps_s}]
    }


def test_recompiles_inside_the_steps_are_the_findings_gain() -> None:
    """The gain is the recompilations' time inside the training steps over the steps' total; their
    time outside the steps (0.5 s here in all) is no gain."""
    st = SimpleNamespace(total_s=4.0, count=100, noise=0.0)
    f = recompiles_finding(_recompile_rows(0.4), st)  # type: ignore[arg-type]
    assert f is not None and f.estimated_gain == pytest.approx(0.1)
    assert f.evidence["recompile_s"] == 0.5 and f.evidence["recompile_in_steps_s"] == 0.4
    shown = measurable([f], gain_floor(st))  # type: ignore[arg-type]
    assert [x.severity for x in shown] == ["medium"] and "drop_last" in f.recommendation
    outside = recompiles_finding(_recompile_rows(0.0), st)  # type: ignore[arg-type]
    assert outside is not None and measurable([outside], gain_floor(st)) == []  # type: ignore[arg-type]


def test_a_frame_at_the_recompile_limit_is_shown_though_its_cost_is_not_priced() -> None:
    """A frame that reached the recompile limit runs eagerly from then on: shown at low severity even
    when its recompilations were all outside the steps."""
    st = SimpleNamespace(total_s=4.0, count=100, noise=0.0)
    f = recompiles_finding(_recompile_rows(0.0, count=8), st)  # type: ignore[arg-type]
    assert f is not None and f.evidence["frames_at_limit"] == ["forward"]
    shown = measurable([f], gain_floor(st))  # type: ignore[arg-type]
    assert [(x.id, x.severity) for x in shown] == [("recompiles", "low")]
    assert "runs eagerly" in f.gain_basis["unpriced"] and "recompile_limit" in f.recommendation


def test_compute_sections_are_the_same_on_dask(
    compiled: tuple[TracedRun, dict[str, Any], dict[str, Any]],
) -> None:
    pytest.importorskip("distributed")
    run, _t, _u = compiled
    proc = run_holoprof(
        "report", run.run_dir, "--json", "--engine", "dask", cwd=Path(run.run_dir).parent, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dask = json.loads(proc.stdout)
    for key in ("compute", "goodput", "phases", "findings"):
        assert dask[key] == run.report[key], key


# --- peaks: the NVIDIA table (named devices), the CPU benchmark and its cache ----------------------------
@pytest.mark.parametrize(
    ("name", "dtype", "precision", "peak", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", "highest", 989.5e12, "BF16 Tensor Core 989.5 TFLOP/s dense"),
        ("NVIDIA H100 80GB HBM3", "float32", "highest", 67e12, "FP32 67 TFLOP/s"),
        ("NVIDIA H100 80GB HBM3", "float32", "high", 494.5e12, "TF32 Tensor Core"),
        ("NVIDIA H100 PCIe", "bfloat16", "highest", 756e12, "H100 PCIe"),
        ("NVIDIA A100-SXM4-80GB", "float16", "highest", 312e12, "A100"),
        ("NVIDIA A10", "bfloat16", "highest", 125e12, "A10 "),
        ("NVIDIA L4", "float8_e4m3fn", "highest", 242.5e12, "FP8"),
        ("Tesla V100-SXM2-16GB", "float16", "highest", 125e12, "V100 SXM2"),
    ],
)
def test_gpu_peaks_come_from_the_data_sheets(
    name: str, dtype: str, precision: str, peak: float, label: str
) -> None:
    got, source = gpu_peak(name, dtype, precision)
    assert got == pytest.approx(peak)
    assert label in source and "data sheet" in source and "without sparsity" in source


def test_gpu_without_a_known_peak_says_so() -> None:
    assert gpu_peak("Tesla V100-SXM2-16GB", "bfloat16")[0] == 0
    assert "no bfloat16 peak" in gpu_peak("Tesla V100-SXM2-16GB", "bfloat16")[1]
    assert gpu_peak("Some Future GPU", "bfloat16") == (0.0, "no data-sheet peak is known for Some Future GPU")
    assert table_dtype("float32", allow_tf32=True) == "tf32"


def test_a_cuda_step_is_measured_against_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's CUDA path with a stand-in torch.cuda (no GPU here): the device's name and
    capability are recorded, and the analysis finds its data-sheet peak, TF32 where allowed."""
    cuda = SimpleNamespace(
        current_device=lambda: 0,
        get_device_capability=lambda i: (9, 0),
        get_device_name=lambda i: "NVIDIA H100 80GB HBM3",
    )
    fake = SimpleNamespace(
        cuda=cuda, backends=SimpleNamespace(cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=True)))
    )
    attrs = cuda_device(fake, "cuda:0")  # type: ignore[arg-type]
    assert attrs == {"device_name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "allow_tf32": True}
    run = SimpleNamespace(path="/nonexistent")
    peak, source = _peak(run, ProcKey("h", 1, 0, 1), {"dtype": "float32", "device": "cuda:0", **attrs})  # type: ignore[arg-type]
    assert peak == 494.5e12 and "TF32" in source
    # a float32 step that may not use TF32: the low_mfu finding names the knob, with the peaks' ratio
    doc = {
        "mfu": 0.05,
        "dtype": "float32",
        "device": "cuda:0",
        "peak_flops_per_s": 67e12,
        "matmul_precision": "highest",
    }
    phases = {p: PhaseStat(0.0, 0.0, 0.0) for p in ("forward", "backward", "compute", "optimizer")}
    phases["forward"] = PhaseStat(0.3, 0.3, 0.01)
    phases["backward"] = PhaseStat(0.6, 0.6, 0.02)
    st = StepStats(ProcKey("h", 1, 0, 1), 10, 0.1, 0.1, 0.1, 10, 1.0, 0, 1, phases)
    f = low_mfu(doc, st, {"float32": 67e12, "tf32": 494.5e12, "bfloat16": 989.5e12})
    assert f is not None and f.severity == "high"
    assert "matmul_precision=highest,high" in f.recommendation
    knobs = [c.get("knobs") for c in f.evidence["changes"]]
    assert {"matmul_precision": ["highest", "high"]} in knobs and {"autocast": ["off", "bf16"]} in knobs
    # the step's FLOPs at the peak take 5% of it (its MFU): bf16 shortens that part by the peaks' ratio;
    # the forward and backward's whole 90% sped up so is the most it could gain
    assert f.estimated_gain == pytest.approx(0.05 * (1 - 67 / 989.5), abs=1e-3)
    bf16 = next(c for c in f.evidence["changes"] if c.get("knobs") == {"autocast": ["off", "bf16"]})
    assert bf16["gain_upper_bound"] == pytest.approx(0.9 * (1 - 67 / 989.5), abs=1e-3)


def test_a_step_far_below_its_peak_is_promised_little_by_a_faster_dtype() -> None:
    """MFU 1%: the GEMMs at the peak would take 1% of the step, so bf16 (whatever its peak) can shorten
    at most about that much of what the step spends; the finding names no dtype change."""
    doc = {"mfu": 0.01, "dtype": "float32", "device": "cpu", "peak_flops_per_s": 100e9}
    phases = {p: PhaseStat(0.0, 0.0, 0.0) for p in ("forward", "backward", "compute", "optimizer")}
    phases["forward"] = PhaseStat(0.3, 0.3, 0.01)
    phases["backward"] = PhaseStat(0.5, 0.5, 0.02)
    st = StepStats(ProcKey("h", 1, 0, 1), 10, 0.1, 0.1, 0.1, 10, 1.0, 0, 1, phases)
    assert low_mfu(doc, st, {"float32": 100e9, "bfloat16": 200e9}) is None


def test_cpu_peak_is_measured_once_per_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = cpu_peaks(sys.executable, ["float32"], 1, "test")
    assert len(first) == 1 and first[0]["peak_flops_per_s"] > 0 and not first[0]["cached"]
    again = cpu_peaks(sys.executable, ["float32"], 1, "test")
    assert again[0]["cached"] and again[0]["peak_flops_per_s"] == first[0]["peak_flops_per_s"]
    assert str(tmp_path) in again[0]["source"]


# --- Dynamo's records, parsed ------------------------------------------------------------------------------
def test_graph_break_reasons_and_recompile_guards_are_parsed() -> None:
    reason = (
        "Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace `print`\n"
        "  Hint: Avoid calling builtin `print`. Consider using an\n    equivalent alternative.\n"
        "  Hint: Please report an issue to PyTorch.\n\n  Developer debug context: builtin print"
    )
    kind, explanation, hints = parse_reason(reason)
    assert kind == "Failed to trace builtin operator"
    assert explanation.startswith("Dynamo does not know")
    assert hints == [
        "Avoid calling builtin `print`. Consider using an equivalent alternative.",
        "Please report an issue to PyTorch.",
    ]
    m = SimpleNamespace(
        recompile_reason='0/0: n == 2     # y = x * n  # a.py:8 in f\nUser stack trace:\n  File "/x/a.py", line 8, in f',
        co_filename="/x/a.py",
        co_firstlineno=6,
        co_name="f",
        compile_id="0/1",
    )
    assert recompile_record(m) == {
        "reason": "n == 2",
        "location": "/x/a.py:8",
        "frame": "f",
        "compile_id": "0/1",
    }


def test_a_bad_matmul_precision_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(HoloprofError, match="highest, high or medium"):
        parse_value("matmul_precision", "fast")
    with pytest.raises(HoloprofError, match="write off or bf16"):
        parse_value("autocast", "fp8")
    proc = run_holoprof(
        "run", "--set", "matmul_precision=fast", "--", sys.executable, "-c", "pass", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "holoprof: error: bad value 'fast' for matmul_precision: write highest, high or medium"
    ]
