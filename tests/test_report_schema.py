"""The JSON Schema of ``holoprof.report/1``: shipped with the package, in step with the data model, and
followed by the reports of every kind of run (conftest.report_json checks every report the suite
makes through it; here a PyTorch run, imported Darshan logs, an imported Kineto trace and a run of
two ranks, and documents that break it)."""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import report_json
from holoprof import model
from workflows.kinds import kinds

jsonschema = pytest.importorskip(
    "jsonschema", reason="the dev extra (pip install -e '.[dev]') brings jsonschema"
)

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("torch", "ddp", "darshan", "darshan-ranks", "kineto")


def _schema() -> dict[str, Any]:
    with open(model.REPORT_SCHEMA_FILE, encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _errors(doc: dict[str, Any]) -> list[str]:
    v = jsonschema.Draft202012Validator(_schema())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]


def test_the_schema_is_valid_and_names_every_phase_and_finding_of_the_model() -> None:
    schema = _schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    props = schema["properties"]
    assert props["schema"]["const"] == model.REPORT_SCHEMA
    assert props["phases"]["required"] == list(model.PHASES), "every phase, in the model's order"
    assert props["findings"]["items"]["properties"]["id"]["enum"] == list(model.FINDING_IDS)


def test_the_schema_ships_with_the_package() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[tool.setuptools.package-data]", 1)[1]
    found = re.search(r"^holoprof\s*=\s*(\[.*?\])", section, re.M | re.S)
    assert found, "pyproject.toml lists the package's data files"
    globs = json.loads(found.group(1))
    rel = os.path.relpath(model.REPORT_SCHEMA_FILE, ROOT / "src" / "holoprof")
    assert any(fnmatch.fnmatch(rel, g) for g in globs), (rel, globs)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = kinds(tmp_path_factory, *KINDS)
    return {name: report_json(root / name) for name in KINDS}


def test_reports_of_every_kind_of_run_follow_the_schema(reports: dict[str, dict[str, Any]]) -> None:
    for name, doc in reports.items():
        assert _errors(doc) == [], name
    # the kinds are what they say: steps, ranks, imported I/O with reads and writes
    assert reports["torch"]["steps"]["count"] > 0 and reports["torch"]["run"]["status"] == "finished"
    assert len(reports["ddp"]["steps"]["per_rank"]) == 2 and reports["ddp"]["communication"]["per_rank"]
    io = reports["darshan"]["io"]
    assert (
        reports["darshan"]["run"]["status"] == "imported" and io["bytes_read"] > 0 and io["bytes_written"] > 0
    )
    assert reports["darshan"]["steps"]["count"] == 0
    assert reports["kineto"]["steps"]["count"] == 5 and reports["kineto"]["run"]["status"] == "imported"


def test_stages_of_an_imported_log_are_in_rank_order(reports: dict[str, dict[str, Any]]) -> None:
    names = [s["name"] for s in reports["darshan-ranks"]["stages"]]
    assert len(names) == 16, names
    ranks = [int(n.rsplit("[rank ", 1)[1].rstrip("]")) for n in names]
    assert ranks == sorted(ranks), names  # rank 2 before rank 10


def test_an_imported_log_has_its_write_bandwidth_over_the_run(reports: dict[str, dict[str, Any]]) -> None:
    doc = reports["darshan"]
    io, duration = doc["io"], doc["run"]["duration_s"]
    assert io["bandwidth_write_wall_bytes_per_s"] == pytest.approx(io["bytes_written"] / duration, rel=1e-3)
    assert io["bandwidth_write_bytes_per_s"] == pytest.approx(
        io["bytes_written"] / io["write_time_s"], rel=1e-3
    )


@pytest.mark.parametrize(
    "why",
    ["a phase missing", "an unknown finding", "bytes as text", "a section missing", "a fraction above 1"],
)
def test_documents_that_break_the_contract_are_refused(reports: dict[str, dict[str, Any]], why: str) -> None:
    doc = copy.deepcopy(reports["torch"])
    if why == "a phase missing":
        del doc["phases"]["compute"]
    elif why == "an unknown finding":
        doc["findings"] = [{"id": "made_up", "severity": "high", "title": "x", "evidence": {},
                            "recommendation": "y", "estimated_gain": 0.1}]  # fmt: skip
    elif why == "bytes as text":
        doc["io"]["bytes_read"] = "12"
    elif why == "a section missing":
        del doc["memory"]
    else:
        doc["phases"]["other"]["fraction"] = 1.5
    assert _errors(doc), why
