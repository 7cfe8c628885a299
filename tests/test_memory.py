"""Memory by category on real traced training loops: exact byte counts for a model of known size.

The model is an MLP ``Linear(D, H) - ReLU - Linear(H, OUT)`` trained with Adam in fp32, so:

* P = D*H + H + H*OUT + OUT parameters; weights = 4P bytes and gradients = 4P bytes exactly;
* Adam's state is ``exp_avg`` and ``exp_avg_sq`` (4P bytes each) plus one 0-dim float32 ``step``
  tensor per parameter tensor (4 tensors here: two weights, two biases): 8P + 4*4 bytes;
* the tensors saved for backward by the model are its input (B*D floats, kept by the first Linear to
  compute its weight gradient) and the ReLU's output (B*H floats, kept by the ReLU for its own backward
  and by the second Linear for its weight gradient: one storage, counted once). The second Linear's
  transposed weight is saved too, but it is a parameter's storage: a weight, not an activation.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    TracedRun,
    error_lines,
    report_json,
    run_holoprof,
    run_python,
    traced,
    traced_with_agent_options,
)

B, D, H, OUT = 16, 64, 128, 10
P = D * H + H + H * OUT + OUT
PARAM_TENSORS = 4
ACTIVATIONS = 4 * (B * D + B * H)

MLP = f"""
import json, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

class Opaque(torch.Tensor):  # a tensor subclass whose storage cannot be read
    @staticmethod
    def __new__(cls, n):
        return torch.Tensor._make_wrapper_subclass(cls, (n,), dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


steps = int(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(1)
B, D, H, OUT = {B}, {D}, {H}, {OUT}
data = TensorDataset(torch.randn(B * steps, D), torch.randn(B * steps, OUT))
loader = DataLoader(data, batch_size=B)
model = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, OUT))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for i, (x, y) in enumerate(loader):
    if "--replace" in sys.argv and i == 3:
        # a parameter's storage replaced between steps: a view of a storage twice its size
        model[2].bias.data = torch.zeros(2 * OUT)[:OUT]
    if "--opaque" in sys.argv and i == 1:
        opt.state[model[0].weight]["opaque"] = Opaque(8)  # kept with Adam's state, never used
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
if "--snapshot" in sys.argv:
    from holoprof.agent.core import get_agent
    from holoprof.collect.memory import memory_snapshot_action

    print("SNAPSHOT " + json.dumps(memory_snapshot_action(get_agent(), {{}})))
print("done")
"""

PROFILED = f"""
import collections, json
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action

torch.manual_seed(0)
model = nn.Sequential(nn.Linear({D}, {H}), nn.ReLU(), nn.Linear({H}, {OUT}))
opt = torch.optim.Adam(model.parameters())
x, y = torch.randn({B}, {D}), torch.randn({B}, {OUT})
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
    for _ in range(3):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
mp = prof._memory_profile()
live = collections.Counter()

def category(key, version):
    c = mp._categories.get(key, version)
    return c.name if c is not None else "UNKNOWN"

for _t, action, (key, version), size in mp.timeline:
    if action in (Action.PREEXISTING, Action.CREATE):
        live[category(key, version)] += size
    elif action == Action.DESTROY:
        live[category(key, version)] -= size
    elif action == Action.INCREMENT_VERSION:
        live[category(key, version)] -= size
        live[category(key, version + 1)] += size
print("PROFILER " + json.dumps(dict(live)))
"""


@pytest.fixture(scope="module")
def mlp_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mlp") / "mlp.py"
    path.write_text(MLP)
    return path


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory: pytest.TempPathFactory, mlp_script: Path) -> TracedRun:
    run = traced(tmp_path_factory.mktemp("sampled"), str(mlp_script), "8", "--snapshot")
    assert run.proc.returncode == 0, run.proc.stderr
    return run


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory, mlp_script: Path) -> TracedRun:
    """``--memory full``; from step 3 on, a parameter's storage is replaced by a larger one."""
    run = traced(
        tmp_path_factory.mktemp("full"), str(mlp_script), "6", "--replace", options=("--memory", "full")
    )
    assert run.proc.returncode == 0, run.proc.stderr
    return run


def snapshot(doc: dict[str, Any], step: int, phase: str) -> dict[str, Any]:
    found = [t for t in doc["memory"]["timeline"] if t["step"] == step and t["phase"] == phase]
    assert len(found) == 1, doc["memory"]["timeline"]
    return found[0]


def test_weights_gradients_and_adam_state_are_exact(sampled_run: TracedRun) -> None:
    after_opt = snapshot(sampled_run.report, 1, "optimizer")
    assert after_opt["weights"] == 4 * P
    assert after_opt["gradients"] == 4 * P
    # exp_avg + exp_avg_sq, plus Adam's 0-dim float32 `step` counter per parameter tensor
    assert after_opt["optimizer_state"] == 8 * P + 4 * PARAM_TENSORS
    # before the first optimizer step Adam has no state yet; after zero_grad gradients are gone
    # the report's categories: the peak step, each category at its largest within the step
    cats = sampled_run.report["memory"]["categories"]
    assert cats["weights"] == cats["gradients"] == 4 * P
    assert cats["optimizer_state"] == 8 * P + 4 * PARAM_TENSORS
    assert cats["activations"] == ACTIVATIONS
    first_fwd = snapshot(sampled_run.report, 0, "forward")
    assert first_fwd["optimizer_state"] == 0
    assert first_fwd["gradients"] == 0
    assert first_fwd["weights"] == 4 * P


def test_activations_are_the_tensors_saved_for_backward(sampled_run: TracedRun) -> None:
    for step in (0, 1, 2):
        fwd = snapshot(sampled_run.report, step, "forward")
        assert fwd["activations"] == pytest.approx(ACTIVATIONS, rel=0.05)
        # the backward pass releases them
        assert snapshot(sampled_run.report, step, "backward")["activations"] == 0


def test_other_is_resident_memory_not_in_tensors(sampled_run: TracedRun) -> None:
    mem = sampled_run.report["memory"]
    assert mem["device"] == "cpu"
    assert "resident memory not attributed to tensors" in mem["other_note"]
    # the interpreter and torch's libraries: tens of MiB at least, far more than this model's tensors
    assert mem["categories"]["other"] > 20 * 1024**2
    assert mem["peak_bytes"] >= sum(mem["categories"].values()) * 0.99


def test_per_layer_names_the_layers(sampled_run: TracedRun) -> None:
    layers = {r["name"]: r for r in sampled_run.report["memory"]["per_layer"]}
    assert set(layers) == {"0 (Linear)", "1 (ReLU)", "2 (Linear)"}, layers
    assert layers["0 (Linear)"]["parameter_bytes"] == 4 * (D * H + H)
    assert layers["2 (Linear)"]["parameter_bytes"] == 4 * (H * OUT + OUT)
    assert layers["1 (ReLU)"]["parameter_bytes"] == 0
    assert layers["0 (Linear)"]["activation_bytes"] == 4 * B * D  # the input batch
    assert layers["1 (ReLU)"]["activation_bytes"] == 4 * B * H  # its output, shared with the next Linear
    # largest first
    sizes = [r["activation_bytes"] + r["parameter_bytes"] for r in sampled_run.report["memory"]["per_layer"]]
    assert sizes == sorted(sizes, reverse=True)


def test_default_samples_the_first_steps_and_full_samples_every_step(
    sampled_run: TracedRun, full_run: TracedRun
) -> None:
    assert sampled_run.report["steps"]["count"] == 8
    assert sampled_run.report["memory"]["sampled_steps"] == [0, 1, 2]
    assert sampled_run.report["memory"]["mode"] == "sampled"
    assert full_run.report["steps"]["count"] == 6
    assert full_run.report["memory"]["sampled_steps"] == [0, 1, 2, 3, 4, 5]
    assert full_run.report["memory"]["mode"] == "full"
    for step in range(6):
        assert {t["phase"] for t in full_run.report["memory"]["timeline"] if t["step"] == step} == {
            "forward",
            "backward",
            "optimizer",
        }
    assert snapshot(full_run.report, 5, "optimizer")["optimizer_state"] == 8 * P + 4 * PARAM_TENSORS


def test_full_picks_up_a_replaced_parameter_storage(full_run: TracedRun) -> None:
    # sizes are cached between steps under --memory full; a replaced storage must still be seen
    for step in (0, 1, 2):
        assert snapshot(full_run.report, step, "forward")["weights"] == 4 * P
    for step in (3, 4, 5):
        for phase in ("forward", "backward", "optimizer"):
            assert snapshot(full_run.report, step, phase)["weights"] == 4 * P + 4 * OUT
    assert snapshot(full_run.report, 5, "optimizer")["optimizer_state"] == 8 * P + 4 * PARAM_TENSORS
    assert snapshot(full_run.report, 5, "backward")["gradients"] == 4 * P


def test_a_tensor_whose_storage_cannot_be_read_is_left_out_and_said(tmp_path: Path, mlp_script: Path) -> None:
    """The collector keeps measuring the rest, and the report says what it left out."""
    run = traced(tmp_path, str(mlp_script), "4", "--opaque", "--snapshot")
    assert run.proc.returncode == 0, run.proc.stderr
    assert not run.report["run"]["errors"], run.report["run"]["errors"]
    # the on-demand snapshot's census too: the tensor is left out, the rest counted
    (line,) = [x for x in run.proc.stdout.splitlines() if x.startswith("SNAPSHOT ")]
    census = json.loads(line.split(" ", 1)[1])
    assert "error" not in json.dumps(census).lower(), census
    mem = run.report["memory"]
    assert mem["tensors_unmeasured"]["types"] == {"Opaque": 1}
    assert mem["tensors_unmeasured"]["steps"] == [1, 2]  # from the step that added it on
    assert snapshot(run.report, 2, "optimizer")["optimizer_state"] == 8 * P + 4 * PARAM_TENSORS
    text = run_holoprof("report", run.run_dir, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "some tensors not measured" in text.stdout and "Opaque" in text.stdout


TWO_OPTIMIZERS = f"""
import sys
import torch
from torch import nn

steps = int(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(1)
nets = [nn.Sequential(nn.Linear({D}, {H}), nn.ReLU(), nn.Linear({H}, {OUT})) for _ in range(2)]
opts = [torch.optim.Adam(n.parameters(), lr=1e-3) for n in nets]
for i in range(steps):
    x, y = torch.randn({B}, {D}), torch.randn({B}, {OUT})
    for o in opts:
        o.zero_grad()
    loss = sum(((n(x) - y) ** 2).mean() for n in nets)
    loss.backward()
    for o in opts:
        o.step()
print("done")
"""


def test_two_optimizers_are_measured_on_the_sampled_steps_only(tmp_path: Path) -> None:
    """A loop that steps two optimizers (a GAN's generator and discriminator), sampled on the first
    steps and then every 4th: each measured step sees both optimizer steps (the snapshot after them
    counts both Adams' state, from the first step on), and no other step is measured. The collector
    is called by the torch collector's optimizer hooks on those steps only."""
    path = tmp_path / "two.py"
    path.write_text(TWO_OPTIMIZERS)
    proc, run_dir = traced_with_agent_options(tmp_path, {"memory_every": 4}, sys.executable, str(path), "10")
    assert proc.returncode == 0, proc.stderr
    doc = report_json(run_dir)
    assert doc["steps"]["count"] == 10
    mem = doc["memory"]
    assert mem["sampled_steps"] == [0, 1, 2, 4, 8]
    after = [t for t in mem["timeline"] if t["phase"] == "optimizer"]
    assert {t["step"] for t in after} == {0, 1, 2, 4, 8}
    for step in (0, 1, 2, 4, 8):
        state = max(t["optimizer_state"] for t in after if t["step"] == step)
        assert state == 2 * (8 * P + 4 * PARAM_TENSORS), step
        assert max(t["weights"] for t in after if t["step"] == step) == 2 * 4 * P, step


def test_memory_off_records_nothing(tmp_path: Path, mlp_script: Path) -> None:
    run = traced(tmp_path, str(mlp_script), "3", options=("--memory", "off"))
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.report["steps"]["count"] == 3
    assert run.report["memory"] == {}


def test_categories_are_also_samples(sampled_run: TracedRun) -> None:
    import holoprof

    run = holoprof.load(sampled_run.run_dir)
    pid = next(p["pid"] for p in sampled_run.report["processes"] if p["role"] == "main")
    rows = run.rows(
        "SELECT name, count(*), max(value) FROM samples WHERE name LIKE 'mem.%' AND target_pid = ? GROUP BY name",
        [pid],
    )
    got = {name: (n, v) for name, n, v in rows}
    for cat in ("weights", "gradients", "optimizer_state", "activations", "other"):
        assert got[f"mem.{cat}_bytes"][0] == 9, got  # 3 sampled steps x 3 phase boundaries
    assert got["mem.weights_bytes"][1] == 4 * P


def test_no_headroom_finding_on_the_cpu(sampled_run: TracedRun) -> None:
    """A larger batch fits in the machine's memory, but nothing in a CPU run measures that it would
    help: no memory_headroom (its memory section is there all the same)."""
    found = {f["id"] for f in sampled_run.report["findings"]}
    assert "memory_headroom" not in found and "memory_pressure" not in found
    assert sampled_run.report["memory"]["batch_size"] == B
    assert sampled_run.report["memory"]["categories"]["activations"] == ACTIVATIONS


def test_memory_snapshot_action_counts_tensors_by_category(sampled_run: TracedRun) -> None:
    line = next(ln for ln in sampled_run.proc.stdout.splitlines() if ln.startswith("SNAPSHOT "))
    result = json.loads(line[len("SNAPSHOT ") :])
    assert result["ok"]
    cats = result["categories"]
    assert cats["weights"] == 4 * P
    assert cats["gradients"] == 4 * P
    assert cats["optimizer_state"] == 8 * P + 4 * PARAM_TENSORS
    assert os.path.dirname(result["census"]) == os.path.join(sampled_run.run_dir, "artifacts")
    # no GPU here: the CUDA allocator snapshot is left out, without an error
    assert "cuda_snapshot" not in result and "cuda_error" not in result
    with open(result["census"]) as f:
        assert json.load(f)["categories"] == cats


def test_totals_agree_with_torch_profiler_memory_categories(tmp_path: Path) -> None:
    # torch.profiler's memory profiler (MemoryProfile) categorizes every allocation on the CPU too, with
    # its Python tracer (with_stack=True) running under the torch collector's Module.__call__ wrapper.
    # Every step is measured: the last 'optimizer' snapshot is the end of the loop.
    (tmp_path / "profiled.py").write_text(PROFILED)
    code = (
        "import sys; from holoprof.launch.run import run; "
        "sys.exit(run(['profiled.py'], out='run', options={'memory': 'full'}, report=None))"
    )
    proc = run_python("-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROFILER "))
    prof = json.loads(line[len("PROFILER ") :])
    from conftest import report_json

    doc = report_json(tmp_path / "run")
    last = [t for t in doc["memory"]["timeline"] if t["phase"] == "optimizer"][-1]
    assert last["weights"] == prof["PARAMETER"] == 4 * P
    assert last["gradients"] == prof["GRADIENT"] == 4 * P
    assert last["optimizer_state"] == prof["OPTIMIZER_STATE"] == 8 * P + 4 * PARAM_TENSORS


def test_bad_memory_options_exit_2(tmp_path: Path) -> None:
    for args in (("--memory", "sometimes"), ("--stop-after-steps", "0")):
        proc = run_holoprof(
            "run", "--out", str(tmp_path / "r"), *args, "--", sys.executable, "-c", "0", cwd=tmp_path
        )
        assert proc.returncode == 2, proc.stderr
        lines = error_lines(proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("holoprof: error:"), proc.stderr


def _stats(categories: dict[str, int], limit: int, **attrs: Any) -> Any:
    from holoprof.analyze.memory import MemoryStats, Snapshot

    snap = Snapshot(3, "forward", 1, categories, attrs.pop("total", sum(categories.values())), attrs)
    return MemoryStats(
        device=attrs.get("device", "cuda:0"),
        peak=snap,
        snapshots=[snap],
        limit_bytes=limit,
        limit_source="test",
        other_basis=attrs.get("other_basis", "cuda_reserved"),
        batch_size=32,
    )


def test_pressure_names_the_largest_category() -> None:
    from holoprof.analyze.memory import memory_headroom, memory_pressure

    gib = 1024**3
    ms = _stats(
        {"weights": gib, "gradients": gib, "optimizer_state": 2 * gib, "activations": 10 * gib, "other": gib},
        16 * gib,
    )
    f = memory_pressure(ms)
    assert f is not None and f.severity == "high"
    assert f.evidence["peak_fraction"] == pytest.approx(15 / 16, abs=1e-4)
    assert "activation checkpointing" in f.recommendation
    assert memory_headroom(ms, 32, 30.0) is None  # no larger batch fits at 94%
    ms = _stats(
        {"weights": gib, "gradients": gib, "optimizer_state": 6 * gib, "activations": gib, "other": gib},
        11 * gib,
    )
    f = memory_pressure(ms)
    assert f is not None and "optimizer" in f.recommendation


def test_headroom_needs_a_gpu_measured_idle_and_keeps_the_effective_batch() -> None:
    from holoprof.analyze.memory import memory_headroom

    gib = 1024**3
    cats = {"weights": gib, "gradients": gib, "optimizer_state": 2 * gib, "activations": gib, "other": gib}
    ms = _stats(cats, 80 * gib)
    # 32 x (0.9 x 80 GiB - 5 GiB of everything else) / 1 GiB of activations
    f = memory_headroom(ms, 32, 40.0)
    assert f is not None and f.severity == "low"
    assert f.evidence["max_batch_size"] == int(32 * (0.9 * 80 - 5))
    assert f.evidence["suggested_batch_size"] == 32 * 64
    assert f.estimated_gain == pytest.approx(0.6 * (1 - 1 / 64), abs=1e-4)  # the idle 60%, amortized
    # accumulating 4 micro-batches: larger micro-batches, the same 128 samples per optimizer step
    f = memory_headroom(ms, 32, 40.0, accumulation=4)
    assert f is not None and f.evidence["suggested_batch_size"] == 128
    assert "accumulate over 1" in f.recommendation and "128 samples per optimizer step" in f.recommendation
    assert f.estimated_gain == pytest.approx(0.6 * 0.75, abs=1e-4)
    assert memory_headroom(ms, 32, 95.0) is None, "a busy GPU gains little from a larger batch"
    assert memory_headroom(ms, 32, None) is None, "no utilization measured: no gain to back it"
    cpu = _stats(cats, 80 * gib, device="cpu", other_basis="rss")
    assert memory_headroom(cpu, 32, 40.0) is None


def test_fragmentation_on_a_gpu_is_pressure() -> None:
    from holoprof.analyze.memory import memory_pressure

    gib = 1024**3
    cats = {
        "weights": gib,
        "gradients": gib,
        "optimizer_state": 2 * gib,
        "activations": 2 * gib,
        "other": 4 * gib,
    }
    ms = _stats(cats, 80 * gib, reserved_bytes=10 * gib, allocated_bytes=6 * gib)
    f = memory_pressure(ms)
    assert f is not None and f.severity == "medium"
    assert f.evidence["other_fraction"] == pytest.approx(0.4)
    assert "expandable_segments" in f.recommendation
    # the same 'other' on the CPU is libraries and the interpreter, not fragmentation
    assert memory_pressure(_stats(cats, 80 * gib, other_basis="rss", device="cpu")) is None


def test_a_failing_memory_collector_leaves_the_job_alone(tmp_path: Path, mlp_script: Path) -> None:
    run = traced(tmp_path, str(mlp_script), "4", env={"HOLOPROF_FAULT_INJECT": "memory"})
    assert run.proc.returncode == 0, run.proc.stderr
    assert "done" in run.proc.stdout
    assert "the 'memory' collector failed" in run.proc.stderr
    assert run.report["steps"]["count"] == 4  # the torch collector goes on
    assert run.report["memory"] == {}
    assert any("memory: FaultInjected: injected fault" in e for e in run.report["run"]["errors"])
