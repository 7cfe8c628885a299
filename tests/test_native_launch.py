"""`holoprof run` preloads the native I/O library into every process: non-Python programs counted too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from holoprof.collect import io_native
from holoprof.store import native_dumps
from holoprof.store.reader import load

pytestmark = pytest.mark.skipif(
    io_native.library_path() is None, reason="the native I/O library is not built"
)


def test_cat_in_a_traced_pipeline_has_its_reads_counted(tmp_path: os.PathLike[str]) -> None:
    data = os.path.join(tmp_path, "blob with space.bin")
    with open(data, "wb") as f:
        f.write(os.urandom(1_500_000))
    out = os.path.join(tmp_path, "run")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "holoprof.cli",
            "run",
            "--no-report",
            "--out",
            out,
            "--",
            "bash",
            "-c",
            'cat "$0" > /dev/null',
            data,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    run = load(out)
    rows = run.rows(
        "SELECT layer, CAST(json_extract(counters, '$.POSIX_BYTES_READ') AS BIGINT) FROM io_files WHERE path = ?",
        [data],
    )
    assert rows, "the cat process's dump was not imported"
    assert all(layer == "native" for layer, _ in rows)
    assert sum(b for _, b in rows) == 1_500_000
    assert not [f for f in native_dumps.dump_files(out)], "dumps are imported once, then set aside"


def test_python_layer_only_when_asked(tmp_path: os.PathLike[str]) -> None:
    from holoprof.launch.run import job_environment

    assert io_native.library_path() in job_environment(str(tmp_path), {}).get("LD_PRELOAD", "")
    assert io_native.library_path() not in job_environment(str(tmp_path), {"io_layer": "python"}).get(
        "LD_PRELOAD", ""
    )
