"""One run of each kind that the views must show, made once per test session in one runs folder (one
for all of pytest-xdist's workers).

``kinds(tmp_path_factory, *names)``: the runs folder, with the runs asked for (made when first asked):

* ``torch``: ``holoprof run -- train.py`` (PyTorch, eval and a checkpoint per epoch);
* ``keras``: ``holoprof run -- keras_fit.py`` (a Keras ``fit``: its fused step is the ``compute`` phase);
* ``ddp``: a generated run of two ranks with DDP communication;
* ``darshan``: PyDarshan's 4-rank log of a job that reads two files and writes a third (an import);
* ``darshan-ranks``: PyDarshan's 16-rank MACSio log (stages named "... [rank 10]");
* ``kineto``: a real PyTorch profiler trace of a small loop, imported.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import job_env, run_holoprof, script, session_root, shared

TESTS = Path(__file__).resolve().parent.parent
_CACHE: dict[str, Any] = {}


def _darshan_log(prefix: str) -> str:
    darshan = pytest.importorskip("darshan", reason="the darshan extra (PyDarshan) reads Darshan logs")
    found = sorted(Path(darshan.__file__).resolve().parent.rglob(f"{prefix}*.darshan"))
    assert found, f"PyDarshan ships no {prefix}*.darshan"
    return str(found[0])


def _make(name: str, root: Path) -> None:
    out = str(root / name)
    if name == "torch":
        proc = run_holoprof(
            "run", "--out", out, "--no-report", "--sample-interval", "0.2", "--", script("train.py"), cwd=root
        )
    elif name == "keras":
        keras = str(TESTS / "tf_scripts" / "keras_fit.py")
        proc = run_holoprof(
            "run", "--out", out, "--no-report", "--", keras, str(root / "keras-ck"), "fast", "2",
            cwd=root, env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=240,
        )  # fmt: skip
    elif name == "ddp":
        from holoprof.bench.synth import generate_run

        generate_run(out, 30, ranks=2, comm=True)
        return
    elif name == "darshan":
        proc = run_holoprof(
            "import", "darshan", _darshan_log("pq_app_readAB_writeC"), "--out", out, "--no-report", cwd=root
        )
    elif name == "darshan-ranks":
        proc = run_holoprof(
            "import", "darshan", _darshan_log("shane_macsio"), "--out", out, "--no-report", cwd=root
        )
    elif name == "kineto":
        trace = str(root / "kineto-trace.json")
        import subprocess

        made = subprocess.run(
            [sys.executable, str(TESTS / "trace_scripts" / "profile_loop.py"), trace],
            capture_output=True, text=True, timeout=180, env=job_env(), stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr[-2000:]
        proc = run_holoprof("import", "torch-trace", trace, "--out", out, "--no-report", cwd=root)
    else:
        raise AssertionError(f"no run kind {name!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.path.isfile(os.path.join(out, "manifest.json"))


def kinds(factory: pytest.TempPathFactory, *names: str) -> Path:
    """The runs folder holding (at least) the runs ``names``: one folder for all of pytest-xdist's
    workers, each run made by the first worker that asks for it (``conftest.shared``)."""
    root = session_root(factory) / "kinds"
    root.mkdir(exist_ok=True)
    for name in names:
        if name not in _CACHE:
            shared(factory, f"kind-{name}", lambda folder, name=name: _make_into(name, folder, root))
            _CACHE[name] = True
    return root


def _make_into(name: str, staging: Path, root: Path) -> None:
    """Make run ``name`` in ``staging``, then move it into ``root`` whole: a dashboard serving ``root``
    in another worker never lists a run half made."""
    _make(name, staging)
    shutil.rmtree(root / name, ignore_errors=True)  # left by a worker that failed half-way
    os.rename(staging / name, root / name)
