"""Checkpoints as the frameworks write them: path and bytes of the final file, and time, against what
the script itself wrote (os.path.getsize after the save)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import HOLOPROF, job_env, report_json, require

SCRIPT = str(Path(__file__).resolve().parent / "ckpt_scripts" / "frameworks_ckpt.py")


def traced(tmp: Path, which: str) -> tuple[dict[str, Any], dict[str, Any]]:
    out = tmp / "out"
    out.mkdir()
    run = tmp / "run"
    p = subprocess.run(
        [*HOLOPROF, "run", "--no-report", "--out", str(run), "--", SCRIPT, str(out), which],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return report_json(run), json.loads(p.stdout.strip().splitlines()[-1])


def items(doc: dict[str, Any], op: str) -> list[dict[str, Any]]:
    return [i for i in doc["checkpoints"]["items"] if i["op"] == op]


def test_torch_save_fsync_and_rename_are_one_checkpoint(tmp_path: Path) -> None:
    doc, truth = traced(tmp_path, "torch")
    saves = items(doc, "save")
    # the temporary name is renamed into place: the checkpoint is the final file, fsync and rename included
    assert [(i["path"], i["bytes"]) for i in saves] == [(s["path"], s["bytes"]) for s in truth["saves"]]
    for i, s in zip(saves, truth["saves"], strict=True):
        assert i["api"] == "torch.save" and i["then"] == ["os.fsync", "os.replace"]
        assert s["fsync_s"] <= i["seconds"]
    assert doc["checkpoints"]["saves"] == 2
    # the first save is inside the training steps: its fsync is checkpoint time, not `other`
    assert doc["phases"]["checkpoint"]["total_s"] >= truth["saves"][0]["fsync_s"]


def test_safetensors_saves_and_loads(tmp_path: Path) -> None:
    require("safetensors")
    doc, truth = traced(tmp_path, "safetensors")
    got = [(i["api"], i["path"], i["bytes"]) for i in doc["checkpoints"]["items"]]
    a, m = truth["saves"]
    assert got == [
        ("safetensors.torch.save_file", a["path"], a["bytes"]),
        ("safetensors.torch.save_model", m["path"], m["bytes"]),
        ("safetensors.torch.load_file", a["path"], a["bytes"]),
        ("safetensors.torch.load_model", m["path"], m["bytes"]),
    ]
    assert all(i["seconds"] > 0 for i in doc["checkpoints"]["items"])


def test_hugging_face_save_pretrained_and_trainer_checkpoints(tmp_path: Path) -> None:
    require("transformers")
    doc, truth = traced(tmp_path, "hf")
    saves = items(doc, "save")
    assert [(i["path"], i["bytes"]) for i in saves] == [(s["path"], s["bytes"]) for s in truth["saves"]]
    assert [i["api"] for i in saves] == ["transformers.PreTrainedModel.save_pretrained"] + [
        "transformers.Trainer._save_checkpoint"
    ] * 2
    assert saves[0]["files"] == truth["saves"][0]["files"]
    assert all(i["seconds"] > 0 for i in saves)
    # safetensors writes a temporary file and renames it: the I/O counters have the final name too
    written = {f["path"]: f["bytes_written"] for f in doc["io"]["files_detail"]}
    assert not [p for p in written if "/.tmp" in p]
    model_file = f"{truth['saves'][1]['path']}/model.safetensors"
    assert written[model_file] == Path(model_file).stat().st_size


def test_lightning_model_checkpoint_and_save_checkpoint(tmp_path: Path) -> None:
    require("lightning")
    doc, truth = traced(tmp_path, "lightning")
    saves = items(doc, "save")
    assert [(i["path"], i["bytes"]) for i in saves] == [(s["path"], s["bytes"]) for s in truth["saves"]]
    assert {i["api"] for i in saves} == {"lightning.Trainer.save_checkpoint"}
    assert all(i["seconds"] > 0 for i in saves)
