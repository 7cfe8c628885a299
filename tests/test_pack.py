"""Packs: a run as one file that every command accepts, unpacked safely."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

import holoprof
from conftest import TracedRun, error_lines, run_holoprof
from holoprof.errors import HoloprofError
from holoprof.store.pack import open_run
from workflows.runs import pipeline


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    return pipeline(tmp_path_factory)


@pytest.fixture(scope="module")
def pack(run: TracedRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pack") / "pipeline.holoprof"
    proc = run_holoprof("pack", run.run_dir, "-o", str(out), cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_pack_is_one_file_that_loads_like_the_run(run: TracedRun, pack: Path) -> None:
    assert pack.is_file() and tarfile.is_tarfile(pack)
    d = open_run(pack)
    assert os.path.isfile(os.path.join(d, "manifest.json"))
    assert stat.S_IMODE(os.stat(os.path.dirname(d)).st_mode) == 0o700, "private temporary directory"
    a, b = holoprof.load(run.run_dir), holoprof.load(d)
    for table in ("spans", "samples", "processes"):
        q = f"SELECT count(*) FROM {table}"
        assert a.rows(q) == b.rows(q), table
    assert open_run(run.run_dir) == os.path.abspath(run.run_dir), "a directory is used as it is"


def test_commands_accept_a_pack(run: TracedRun, pack: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    proc = run_holoprof("export", str(pack), "-f", "chrome", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "step"]
    assert len(steps) == run.report["steps"]["count"]
    proc = run_holoprof("diff", run.run_dir, str(pack), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["a"]["steps"] == d["b"]["steps"] == run.report["steps"]["count"]
    assert d["steps"]["p_value"] == pytest.approx(1.0) and not d["steps"]["significant"]


def _evil(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    with tarfile.open(path, "w") as tar:
        ok = tarfile.TarInfo("run/manifest.json")
        body = b'{"schema_version": 1}'
        ok.size = len(body)
        tar.addfile(ok, io.BytesIO(body))
        if member.isfile():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    return path


def test_a_pack_with_a_dotdot_member_is_refused(tmp_path: Path) -> None:
    evil = _evil(tmp_path / "evil.holoprof", tarfile.TarInfo("run/../../escaped.txt"))
    proc = run_holoprof("export", str(evil), "-f", "chrome", "-o", "t.json", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "leaves its directory" in line and "escaped.txt" in line
    assert not (tmp_path.parent / "escaped.txt").exists() and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("kind", ["absolute", "symlink", "hardlink"])
def test_a_pack_with_an_unsafe_member_is_refused(tmp_path: Path, kind: str) -> None:
    if kind == "absolute":
        m = tarfile.TarInfo(str(tmp_path / "abs.txt"))
    else:
        m = tarfile.TarInfo("run/link")
        m.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
        m.linkname = "/etc/passwd"
    evil = _evil(tmp_path / "evil.holoprof", m)
    with pytest.raises(HoloprofError, match=r"absolute path|link"):
        open_run(evil)
    assert not (tmp_path / "abs.txt").exists()


def test_a_file_that_is_not_a_pack_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(HoloprofError, match="not a holoprof pack"):
        open_run(f)
    proc = run_holoprof("pack", str(tmp_path / "missing"), cwd=tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def _tar_gz(path: Path, members: list[tuple[str, int]], fill: bytes = b"\0") -> Path:
    """A gzipped tar whose members are (name, size) of ``fill`` bytes, written as a stream (the
    members' data is never held whole)."""
    import gzip

    class Repeat(io.RawIOBase):
        def __init__(self, n: int) -> None:
            self.left = n

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            k = min(len(b), self.left)
            b[:k] = fill * k
            self.left -= k
            return k

    with gzip.open(path, "wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, size in members:
            ti = tarfile.TarInfo(name)
            ti.size = size
            tar.addfile(ti, io.BufferedReader(Repeat(size)))
    return path


def _refused_at_limit(pack: Path, var: str, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    proc = run_holoprof("export", str(pack), "-f", "chrome", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert f"{var}=" in line and not out.exists()


def test_a_decompression_bomb_pack_is_refused_before_extracting(tmp_path: Path) -> None:
    """A gzipped pack whose one member inflates a thousandfold: refused at its header."""
    bomb = _tar_gz(tmp_path / "bomb.holoprof", [("run/manifest.json", 64), ("run/x/blob", 64 << 20)])
    assert bomb.stat().st_size < 1 << 20
    _refused_at_limit(bomb, "HOLOPROF_LIMIT_RATIO", tmp_path)
    with pytest.raises(HoloprofError, match="HOLOPROF_LIMIT_RATIO"):
        open_run(bomb)


def test_a_pack_of_too_many_entries_is_refused(tmp_path: Path) -> None:
    from holoprof.store import limits

    n = limits.PACK_FILES.default + 1
    many = _tar_gz(tmp_path / "many.holoprof", [(f"run/f{i}", 0) for i in range(n)])
    _refused_at_limit(many, "HOLOPROF_LIMIT_PACK_FILES", tmp_path)


def test_an_oversized_manifest_in_a_pack_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = _tar_gz(tmp_path / "big.holoprof", [("run/manifest.json", 32 << 20)], fill=b" ")
    monkeypatch.setenv("HOLOPROF_LIMIT_RATIO", str(10**6))  # past the ratio, the manifest's own bound
    with pytest.raises(HoloprofError, match=r"manifest\.json of 33,554,432 bytes"):
        open_run(big)


def test_a_parquet_decompression_bomb_in_a_pack_is_refused(tmp_path: Path) -> None:
    """A chunk whose GZIP page inflates from 64 KiB to 64 MiB when the run is read: refused on opening
    the pack, from the chunk's footer, and nothing of the pack is left extracted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    chunk = tmp_path / "spans-00000000.parquet"
    pq.write_table(pa.table({"name": pa.array([b"\0" * (64 << 20)])}), chunk, compression="gzip")
    assert chunk.stat().st_size < 1 << 20
    manifest = json.dumps({"schema_version": 1, "status": "finished", "command": ["x"]}).encode()
    pack = tmp_path / "bomb.holoprof"
    with tarfile.open(pack, "w") as tar:
        ti = tarfile.TarInfo("run/manifest.json")
        ti.size = len(manifest)
        tar.addfile(ti, io.BytesIO(manifest))
        tar.add(chunk, arcname="run/h-1/spans-00000000.parquet")
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    _refused_at_limit(pack, "HOLOPROF_LIMIT_RATIO", tmp_path)
    with pytest.raises(HoloprofError, match=r"spans-00000000\.parquet"):
        open_run(pack)
    leftovers = set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - before
    assert not [d for d in leftovers if d.startswith("holoprof-pack-")]
