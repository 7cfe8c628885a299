"""The framework corpus: ``model.fit`` of Keras 3 on the PyTorch backend with ``ModelCheckpoint``
(``.keras`` and ``.weights.h5``), traced with no change: epochs counted once (Keras's, not also the end
of the DataLoader Keras iterates), the saves as checkpoints, and memory by category, the Keras
optimizer's gradients and state included; compared bit for bit with an untraced run of the same
seeded script.

Phases are compared with the job's own timers in the same run (both see the same load): this module
need not run alone, unlike ``test_tf_distribute_keras.py``'s MirroredStrategy loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import TracedRun, require
from test_tf_distribute_keras import assert_agrees, phase_s, traced_and_untraced

require("keras")


# --- Keras 3 on the PyTorch backend -------------------------------------------------------------------
@pytest.fixture(scope="module")
def keras_torch(tmp_path_factory: pytest.TempPathFactory) -> tuple[TracedRun, dict[str, Any], dict[str, Any]]:
    require("torch")
    return traced_and_untraced(tmp_path_factory, "keras_torch_fit.py", "OUT")


def test_keras_torch_fit_trains_bit_for_bit_as_untraced(
    keras_torch: tuple[TracedRun, dict[str, Any], dict[str, Any]],
) -> None:
    _run, t, untraced = keras_torch
    assert len(t["losses"]) == t["steps"] == 28
    assert t["losses"] == untraced["losses"]
    assert t["weights"] == untraced["weights"]


def test_keras_torch_fit_counts_epochs_once_and_its_steps(
    keras_torch: tuple[TracedRun, dict[str, Any], dict[str, Any]],
) -> None:
    run, t, _ = keras_torch
    doc = run.report
    assert t["steps"] == 2 * 14 and t["epochs"] == 2  # 448 samples, batches of 32
    assert doc["steps"]["count"] == t["steps"]
    assert doc["steps"]["epochs"] == t["epochs"]
    # Keras fetches each batch from its own DataLoader before the batch begins: data_wait, and the
    # train step is the torch collector's forward, backward and the Keras optimizer's update
    assert_agrees(doc, "data_wait", t["timers"]["data_wait"])
    for p in ("forward", "backward", "optimizer"):
        assert doc["phases"][p]["total_s"] > 0, p
    assert doc["phases"]["compute"]["total_s"] == 0  # nothing fused, nothing counted twice
    assert not any("compiled train step" in w for w in doc["run"]["warnings"])
    assert phase_s(doc, "eval") > 0  # the validation passes


def test_keras_torch_model_checkpoint_saves_are_checkpoints(
    keras_torch: tuple[TracedRun, dict[str, Any], dict[str, Any]],
) -> None:
    run, t, _ = keras_torch
    doc = run.report
    saves = t["saves"]
    assert sorted(saves) == ["ep01.keras", "ep02.keras", "last.weights.h5", "last.weights.h5"]
    ck = doc["checkpoints"]
    assert ck["saves"] == len(saves)
    assert sorted(Path(i["path"]).name for i in ck["items"] if i["op"] == "save") == sorted(saves)
    assert all(i["bytes"] > 0 for i in ck["items"])
    assert_agrees(doc, "checkpoint", t["timers"]["checkpoint"])


def test_keras_torch_memory_is_measured_by_category(
    keras_torch: tuple[TracedRun, dict[str, Any], dict[str, Any]],
) -> None:
    """The memory collector measures Keras's model (symbolic build calls skipped), its gradients and
    the Keras optimizer's variables, on the sampled steps."""
    run, t, _ = keras_torch
    mem = run.report["memory"]
    assert mem["sampled_steps"] == [0, 1, 2]
    assert mem["batch_size"] == 32
    at = {(r["step"], r["phase"]): r for r in mem["timeline"]}
    for step in (0, 1, 2):
        assert at[step, "forward"]["activations"] > 0
        assert at[step, "forward"]["weights"] >= t["trainable_bytes"]
        assert at[step, "optimizer"]["gradients"] == t["trainable_bytes"]
        assert at[step, "optimizer"]["optimizer_state"] == t["optimizer_bytes"]
