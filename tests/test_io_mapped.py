"""Memory-mapped files and other ways a job reads, against the truth: the file sizes, the bytes the
script itself touched, and strace (mmap and read calls on the data file's descriptor)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import HOLOPROF, job_env, report_json

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "io_scripts"
STRACE = shutil.which("strace")
PAGE = os.sysconf("SC_PAGESIZE")
_CALL = re.compile(r"^(?P<name>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\w+)")


def strace_calls(trace_dir: Path, path: str) -> dict[str, int]:
    """mmap and read calls on descriptors of ``path``, over every process and thread."""
    seen: dict[str, int] = defaultdict(int)
    for f in trace_dir.iterdir():
        fds: set[int] = set()
        for line in f.read_text(errors="replace").splitlines():
            m = _CALL.match(line)
            if not m or m["ret"].startswith("-"):
                continue
            name, args = m["name"], [a.strip() for a in m["args"].split(",")]
            if name == "openat" and args[1] == json.dumps(path):
                fds.add(int(m["ret"]))
            elif name == "close" and int(args[0]) in fds:
                fds.discard(int(args[0]))
            elif name == "mmap" and len(args) == 6 and args[4].lstrip("-").isdigit() and int(args[4]) in fds:
                seen["mmaps"] += 1
                seen["bytes_mapped"] += int(args[1])
            elif name in ("read", "pread64") and int(args[0]) in fds:
                seen["reads"] += 1
                seen["bytes_read"] += int(m["ret"])
    return seen


def traced(tmp: Path, name: str, *argv: str, opts: tuple[str, ...] = ()) -> tuple[dict[str, Any], Any, Path]:
    """``holoprof run`` of a script (under strace when present): the report, the script's JSON line
    and strace's trace folder (None without strace)."""
    out = tmp / name
    cmd = [*HOLOPROF, "run", "--no-report", "--out", str(out), *opts, "--", *argv]
    trace = None
    if STRACE:
        trace = tmp / f"{name}-strace"
        trace.mkdir()
        calls = "openat,close,mmap,read,pread64"
        cmd = [
            STRACE,
            "-f",
            "-ff",
            "--seccomp-bpf",
            "-s",
            "0",
            "-o",
            str(trace / "tr"),
            "-e",
            f"trace={calls}",
            *cmd,
        ]
    p = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    truth = json.loads(p.stdout.strip().splitlines()[-1])
    return report_json(out), truth, trace


def pages(truth: dict[str, Any]) -> int:
    """The file's size rounded up to whole pages."""
    return -(-int(truth["size"]) // PAGE) * PAGE


def file_entry(doc: dict[str, Any], path: str) -> dict[str, Any]:
    (f,) = [f for f in doc["io"]["files_detail"] if f["path"] == path]
    return f


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tokens") / "train.bin"
    np.random.default_rng(0).integers(0, 65535, size=5_000_000, dtype=np.uint16).tofile(path)
    return str(path)


def test_memmap_read_whole_is_the_whole_file(tokens: str, tmp_path: Path) -> None:
    doc, truth, trace = traced(tmp_path, "whole", str(SCRIPTS / "memmap_loader.py"), tokens, "whole", "1")
    size = truth["size"]
    f = file_entry(doc, tokens)
    assert (f["mmaps"], f["bytes_mapped"], f["mmaps_measured"]) == (1, size, 1)
    # the script touched every byte: every page of the mapping was brought in, and no more
    assert size <= f["bytes_mapped_resident"] < size + PAGE
    assert f["bytes_brought_in"] == f["bytes_mapped_resident"] == truth["pages_present_bytes"]
    assert doc["io"]["files_detail"][0]["path"] == tokens  # the largest file, though no read call read it
    assert (
        doc["io"]["mapped"]["files"] == 1
        and doc["io"]["mapped"]["bytes_brought_in"] == f["bytes_mapped_resident"]
    )
    assert "small_file_io" not in {x["id"] for x in doc["findings"]}
    if trace is not None:
        s = strace_calls(trace, tokens)
        assert (f["mmaps"], f["bytes_mapped"], f["reads"], f["bytes_read"]) == (
            s["mmaps"],
            s["bytes_mapped"],
            s["reads"],
            s["bytes_read"],
        )


@pytest.mark.parametrize("layer", ["native", "python"])
def test_memmap_random_windows(tokens: str, tmp_path: Path, layer: str) -> None:
    steps = 12
    doc, truth, trace = traced(
        tmp_path,
        layer,
        str(SCRIPTS / "memmap_loader.py"),
        tokens,
        "windows",
        str(steps),
        opts=("--io-layer", layer),
    )
    assert doc["io"]["layers"] == [layer]
    f = file_entry(doc, tokens)
    # nanoGPT makes the memmap anew for every batch: one mapping of the whole file per step
    assert (f["mmaps"], f["bytes_mapped"]) == (steps, steps * truth["size"])
    if layer == "native":
        # pages brought in: at least what the script touched, at most what it mapped
        assert f["mmaps_measured"] == steps
        assert truth["bytes_touched"] <= f["bytes_mapped_resident"] <= f["bytes_mapped"]
        # the distinct pages: those present when each memmap went, as the script saw its page tables
        assert f["bytes_brought_in"] == truth["pages_present_bytes"]
        assert (
            truth["pages_touched_bytes"]
            <= f["bytes_brought_in"]
            <= min(f["bytes_mapped_resident"], pages(truth))
        )
    else:
        assert f["bytes_mapped_resident"] is None and f["mmaps_measured"] == 0
    assert "small_file_io" not in {x["id"] for x in doc["findings"]}
    if trace is not None:
        s = strace_calls(trace, tokens)
        assert (f["mmaps"], f["bytes_mapped"], f["reads"]) == (s["mmaps"], s["bytes_mapped"], s["reads"])


def test_memmap_made_anew_per_batch_counts_each_page_once(tmp_path: Path) -> None:
    """A loader that makes a new memmap of a small file for every batch: the mappings bring the same
    pages in again and again (their sum is many times the file), the file's figure counts each page
    once: the pages present when each memmap went, as the script saw them, never more than the file."""
    path = tmp_path / "small.bin"
    np.random.default_rng(1).integers(0, 65535, size=1_900_000, dtype=np.uint16).tofile(path)
    steps = 60
    doc, truth, _ = traced(
        tmp_path, "small", str(SCRIPTS / "memmap_loader.py"), str(path), "windows", str(steps)
    )
    f = file_entry(doc, str(path))
    assert (f["mmaps"], f["mmaps_measured"]) == (steps, steps)
    assert f["bytes_mapped_resident"] > 2 * truth["size"]  # summed over the mappings
    assert f["bytes_brought_in"] == truth["pages_present_bytes"]
    assert truth["pages_touched_bytes"] <= f["bytes_brought_in"] <= pages(truth)
    assert doc["io"]["mapped"]["bytes_brought_in"] == f["bytes_brought_in"]
    assert doc["io"]["mapped"]["bytes_brought_in_exact"]


def test_memmap_read_by_forked_workers_through_the_parents_mapping(tmp_path: Path) -> None:
    """DataLoader workers forked after the parent mapped the file read its rows through the inherited
    mapping (the parent touches none): what they brought in is counted, once per page over both."""
    path = tmp_path / "rows.bin"
    np.random.default_rng(2).integers(0, 255, size=4608 * 1999, dtype=np.uint8).tofile(path)
    doc, truth, trace = traced(tmp_path, "workers", str(SCRIPTS / "memmap_workers.py"), str(path))
    f = file_entry(doc, str(path))
    assert (f["mmaps"], f["bytes_mapped"], f["processes"]) == (1, truth["size"], 3)
    assert truth["rows_bytes"] <= truth["pages_touched_bytes"] <= f["bytes_brought_in"] <= pages(truth)
    assert f["bytes_brought_in"] == truth["pages_present_bytes"]
    assert doc["io"]["mapped"]["bytes_brought_in"] == f["bytes_brought_in"]
    roles = doc["io"]["by_role"]
    assert roles["dataloader_worker"]["processes"] == 2
    # each worker's own pages: together at least the union, and the main process brought in none
    assert roles["dataloader_worker"]["bytes_mapped_in"] >= f["bytes_brought_in"]
    assert roles["main"]["bytes_mapped_in"] == 0
    if trace is not None:
        s = strace_calls(trace, str(path))
        assert (f["mmaps"], f["bytes_mapped"], f["reads"]) == (s["mmaps"], s["bytes_mapped"], s["reads"])


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> str:
    pd = pytest.importorskip("pandas")
    path = tmp_path_factory.mktemp("csv") / "table.csv"
    rng = np.random.default_rng(0)
    pd.DataFrame({"k": rng.integers(0, 100, 100_000), "v": rng.random(100_000)}).to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize("how", ["read", "mmap"])
def test_pandas_pipeline(csv: str, tmp_path: Path, how: str) -> None:
    pytest.importorskip("pyarrow")
    dst = str(tmp_path / "groups.parquet")
    doc, truth, trace = traced(tmp_path, how, str(SCRIPTS / "pandas_pipeline.py"), csv, dst, how)
    src = file_entry(doc, csv)
    out = file_entry(doc, dst)
    assert out["bytes_written"] == truth["written_bytes"]
    if how == "read":
        # pandas' C parser reads the file through Python's buffered reader: every byte, once
        assert src["bytes_read"] == truth["read_bytes"] and src["mmaps"] == 0
    else:
        assert (src["mmaps"], src["bytes_mapped"]) == (1, truth["read_bytes"])
        assert truth["read_bytes"] <= src["bytes_mapped_resident"] < truth["read_bytes"] + PAGE
    if trace is not None:
        s = strace_calls(trace, csv)
        assert (src["reads"], src["bytes_read"], src["mmaps"], src["bytes_mapped"]) == (
            s["reads"],
            s["bytes_read"],
            s["mmaps"],
            s["bytes_mapped"],
        )


def test_io_bandwidth_and_small_reads_see_mapped_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Findings that use bytes read count what came through mappings: a job whose data is mapped is
    not judged by the few small header reads it also makes."""
    from types import SimpleNamespace

    from holoprof.analyze import io

    monkeypatch.setattr(io, "_page_sets", lambda run, ctx: {})  # no page sets: each process's own count

    from holoprof import model
    from holoprof.analyze.io import _FLOATS, _SUMS, FileRow, _data_view, _io_bandwidth, _small_file_io

    def row(mapped: bool) -> FileRow:
        # a 1 GiB file: 10 small reads of its header (one open), 64 MiB read slowly, mapped or not
        v = {a: 0.0 for a, _ in list(_SUMS) + list(_FLOATS)}
        v.update(opens=1, reads=10, bytes_read=64 << 20, max_byte_read=(1 << 30) - 1, read_time_s=0.001)
        v.update(read_start=100.0, read_end=164.0)
        if mapped:
            v.update(mmaps=1, bytes_mapped=1 << 30, max_byte_mapped=(1 << 30) - 1, mmaps_measured=1)
            v.update(bytes_mapped_resident=1 << 30)
        sizes = [0] * len(model.DARSHAN_SIZE_BUCKETS)
        sizes[1] = 10
        return FileRow("h", 1, "POSIX", "/data/tokens.bin", "native", v, sizes)

    run: Any = SimpleNamespace(path=str(tmp_path))
    for mapped in (True, False):
        view = _data_view(run, [row(mapped)], None, 10.0)
        view["reference_bandwidth"] = {"bytes_per_s": 1e9, "source": "test"}
        assert view["plain_small_reads"] == (0 if mapped else 10)
        assert (_small_file_io(view, None) is None) == mapped
        assert (_io_bandwidth(view, None) is None) == mapped


def test_python_installation_paths() -> None:
    from holoprof.collect.io_paths import PathPolicy, python_env_path

    for p in (
        "/home/u/venv/lib/python3.12/site-packages/numpy/core/x.so",
        "/opt/conda/lib/python3.11/os.py",
        "/home/u/venv/lib64/python3.12/json/tool.txt",
        "/srv/proj/src/mypkg.egg-info/PKG-INFO",
        "/usr/local/lib/python3.11/dist-packages/torch-2.0.dist-info/METADATA",
        "/home/u/proj/__pycache__/train.cpython-311.pyc",
        "/home/u/venv/pyvenv.cfg",
    ):
        assert python_env_path(p), p
    for p in ("/data/train/shard-0.tar", "/home/u/lib/pythonic/data.bin", "/data/site-packages.csv"):
        assert not python_env_path(p), p
    pol = PathPolicy(include=["/srv/proj/src"])
    assert pol.keep("/srv/proj/src/mypkg.egg-info/PKG-INFO")
    assert not PathPolicy().keep("/srv/proj/src/mypkg.egg-info/PKG-INFO")
    assert not PathPolicy(include=["/srv"], exclude=["/srv/proj"]).keep("/srv/proj/data.bin")


def test_job_in_its_own_venv_has_no_environment_io(tmp_path: Path) -> None:
    """A compute-only job run by the python of its own virtual environment (torch and holoprof come
    from this one through a .pth file): none of its environment's files are counted, no small_file_io;
    --io-include brings them back."""
    venv = tmp_path / "jobenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    import sysconfig

    import holoprof

    purelib = sysconfig.get_paths()["purelib"]
    src = os.path.dirname(os.path.dirname(os.path.abspath(holoprof.__file__)))
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "frameworks.pth").write_text(f"{purelib}\n{src}\n")
    job = tmp_path / "compute.py"
    job.write_text(
        "import importlib.metadata as md\n"
        "import sys\n"
        "names = sorted(d.metadata['Name'] for d in md.distributions())\n"  # reads every dist-info
        "if sys.argv[1] == 'train':\n"
        "    import torch\n"
        "    model = torch.nn.Linear(32, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for _ in range(10):\n"
        "        model(torch.randn(8, 32)).pow(2).mean().backward()\n"
        "        opt.step()\n"
        "        opt.zero_grad()\n"
        "print(len(names))\n"
    )
    python = str(venv / "bin" / "python")
    docs = {}
    for name, opts, arg in (("plain", (), "train"), ("included", ("--io-include", str(venv)), "metadata")):
        out = tmp_path / name
        p = subprocess.run(
            [*HOLOPROF, "run", "--no-report", "--out", str(out), *opts, "--", python, str(job), arg],
            env=job_env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        assert int(p.stdout.split()[-1]) > 10  # the job read its environment's metadata
        docs[name] = report_json(out)
    plain = docs["plain"]
    paths = [f["path"] for f in (plain["io"] or {}).get("files_detail", [])]
    assert not [
        p for p in paths if "dist-info" in p or "egg-info" in p or str(venv) in p or "site-packages" in p
    ]
    assert "small_file_io" not in {f["id"] for f in plain["findings"]}
    included = [f["path"] for f in docs["included"]["io"]["files_detail"]]
    assert any(p.startswith(str(venv)) for p in included), included


@pytest.mark.parametrize("layer", ["native", "python"])
def test_file_renamed_into_place_counts_under_its_final_name(tmp_path: Path, layer: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    out = tmp_path / "run"
    p = subprocess.run(
        [*HOLOPROF, "run", "--no-report", "--out", str(out), "--io-layer", layer, "--",
         str(SCRIPTS / "rename_into_place.py"), str(data)],
        env=job_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    doc = report_json(out)
    files = {f["path"]: f for f in doc["io"]["files_detail"]}
    assert not [f for f in files if "tmp" in os.path.basename(f)], files.keys()
    final, still_open = files[str(data / "final.bin")], files[str(data / "open.bin")]
    # both temporary files' writes (2 x 1000 bytes), the read back of the 1000 bytes on disk
    assert (final["bytes_written"], final["bytes_read"], final["opens"]) == (2000, 1000, 3)
    # written before and after the rename through the same descriptor
    assert (still_open["bytes_written"], still_open["writes"]) == (6, 2)
