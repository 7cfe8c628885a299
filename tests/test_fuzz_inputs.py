"""Fuzzing what comes from outside: torch traces, packs and Darshan logs, mutated byte by byte.

The property, for every input: either a complete import (a run that loads) or holoprof's one-line
error (:class:`~holoprof.errors.HoloprofError`), never another exception, within a bounded address
space (a bomb that got past the limits fails here with MemoryError instead of taking the machine).
Hypothesis runs derandomized, with few examples, so that the test takes seconds and always the same.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import resource
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import holoprof  # noqa: E402
from holoprof.errors import HoloprofError  # noqa: E402

#: Address space the code under test may add to what the test process holds already.
HEADROOM_BYTES = 3 << 30

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Byte strings that matter to the parsers: JSON structure, deep nesting, huge numbers, escapes.
_SPLICES = [
    b"[" * 3000,
    b"{" * 500,
    b'"',
    b"\\",
    b"}",
    b"]",
    b",",
    b"1e999",
    b"-1",
    b"null",
    b"\xff\xfe",
    b"\0" * 64,
]


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "cut", "splice", "insert", "delete"]))
        if kind == "flip":
            data[i] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[i:]
        elif kind == "splice":
            data[i:i] = draw(st.sampled_from(_SPLICES))
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=32))
        else:
            del data[i : i + draw(st.integers(1, 64))]
    return bytes(data)


@contextlib.contextmanager
def bounded_memory() -> Iterator[None]:
    """Lower this process's soft address-space limit for the block (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = used + HEADROOM_BYTES
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _holds(attempt: Callable[[str], str], data: bytes, name: str) -> None:
    """``attempt(path)`` on ``data`` written to ``name``: a run that loads, or a HoloprofError."""
    tmp = tempfile.mkdtemp(prefix="holoprof-fuzz-")
    try:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        try:
            with bounded_memory():
                holoprof.load(attempt(path)).rows("SELECT count(*) FROM processes")
        except HoloprofError as exc:
            assert str(exc) and "\n" not in str(exc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- torch traces ------------------------------------------------------------------------------------
def _trace() -> bytes:
    ev = []
    for step in range(2):
        t = 1000 + step * 100
        ev += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 7,
                "tid": 1,
                "ts": t,
                "dur": 90,
            },
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                "pid": 7,
                "tid": 1,
                "ts": t + 1,
                "dur": 9,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 7,
                "tid": 1,
                "ts": t + 12,
                "dur": 20,
                "args": {"Input Dims": [[4, 4], [4, 4]]},
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "autograd::engine::evaluate_function: MmBackward0",
                "pid": 7,
                "tid": 1,
                "ts": t + 40,
                "dur": 20,
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "gemm",
                "pid": 0,
                "tid": 7,
                "ts": t + 15,
                "dur": 5,
                "args": {"stream": 7, "correlation": step + 1, "device": 0},
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 7,
                "tid": 1,
                "ts": t + 13,
                "dur": 1,
                "args": {"correlation": step + 1},
            },
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "Optimizer.step#SGD.step",
                "pid": 7,
                "tid": 1,
                "ts": t + 70,
                "dur": 10,
            },
        ]
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ev}
    return json.dumps(doc).encode()


TRACE = _trace()


def _import_trace(path: str) -> str:
    from holoprof.store.import_torch_trace import import_torch_trace

    return import_torch_trace(path, os.path.join(os.path.dirname(path), "run"))


def test_the_seed_trace_imports() -> None:
    """The fuzzing starts from a trace that imports: mutations explore around a working input."""
    _holds(_import_trace, TRACE, "seed.json")
    _holds(_import_trace, gzip.compress(TRACE, mtime=0), "seed.json.gz")


@settings(FUZZ, max_examples=12)
@given(data=mutated(TRACE))
def test_mutated_traces_import_or_are_refused_in_one_line(data: bytes) -> None:
    _holds(_import_trace, data, "trace.json")


@settings(FUZZ, max_examples=8)
@given(data=mutated(gzip.compress(TRACE, mtime=0)))
def test_mutated_gzipped_traces_import_or_are_refused_in_one_line(data: bytes) -> None:
    _holds(_import_trace, data, "trace.json.gz")


# --- packs -------------------------------------------------------------------------------------------
def _pack() -> bytes:
    buf = io.BytesIO()
    manifest = json.dumps(
        {"schema_version": 1, "status": "finished", "command": ["x"], "start_ns": 1}
    ).encode()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (
            ("run/manifest.json", manifest),
            ("run/control/", b""),
            ("run/h-1/notes.txt", b"x" * 700),
        ):
            ti = tarfile.TarInfo(name.rstrip("/"))
            if name.endswith("/"):
                ti.type = tarfile.DIRTYPE
            else:
                ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data) if data else None)
    return buf.getvalue()


PACK = _pack()


def _open_pack(path: str) -> str:
    from holoprof.store.pack import open_run

    return open_run(path)


@settings(FUZZ, max_examples=40)
@given(data=mutated(PACK))
def test_mutated_packs_open_or_are_refused_in_one_line(data: bytes) -> None:
    _holds(_open_pack, data, "run.holoprof")


@settings(FUZZ, max_examples=20)
@given(data=mutated(gzip.compress(PACK, mtime=0)))
def test_mutated_gzipped_packs_open_or_are_refused_in_one_line(data: bytes) -> None:
    _holds(_open_pack, data, "run.holoprof")


# --- Darshan logs -------------------------------------------------------------------------------------
darshan = pytest.importorskip("darshan")
LOG = (
    Path(darshan.__file__).resolve().parent / "examples" / "example_logs" / "ior_hdf5_example.darshan"
).read_bytes()


def _import_log(path: str) -> str:
    from holoprof.store.import_darshan import import_darshan

    return import_darshan(path, os.path.join(os.path.dirname(path), "run"))


@settings(FUZZ, max_examples=6)
@given(data=mutated(LOG))
def test_mutated_darshan_logs_import_or_are_refused_in_one_line(data: bytes) -> None:
    _holds(_import_log, data, "job.darshan")
