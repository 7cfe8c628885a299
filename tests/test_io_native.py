"""The native I/O capture library (LD_PRELOAD), checked against strace on real processes.

Every workload runs in a real process with ``libholoprof_io.so`` preloaded; where strace is present
the same run is also traced by strace (``-E LD_PRELOAD=...`` so both see the very same system calls)
and, for every data file, the opens, reads and bytes the library counted must equal what the kernel
saw. Non-Python processes and DataLoader workers report through their dump files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import require
from holoprof.collect import io_native
from holoprof.collect.io_native import build
from holoprof.store import native_dumps

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="LD_PRELOAD capture is Linux-only"
)

STRACE = shutil.which("strace")
STRACE_CALLS = (
    "open,openat,creat,read,pread64,readv,preadv,preadv2,write,pwrite64,writev,pwritev,pwritev2,"
    "lseek,close,dup,dup2,dup3,fcntl,close_range,copy_file_range,sendfile"
)
READ_CALLS = {"read", "pread64", "readv", "preadv", "preadv2"}
WRITE_CALLS = {"write", "pwrite64", "writev", "pwritev", "pwritev2"}


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    if build.find_compiler() is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build the native I/O library")
    return build.build(str(tmp_path_factory.mktemp("iolib")))


C_POSIX = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
/* a fixed access pattern whose Darshan counters are known exactly */
int main(int argc, char **argv) {
    static char buf[65536];
    struct stat st;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) return 1;
    read(fd, buf, 100);          /* off 0 */
    read(fd, buf, 100);          /* off 100: consecutive */
    read(fd, buf, 2000);         /* off 200: consecutive */
    pread(fd, buf, 100, 5000);   /* forward gap: sequential only */
    pread(fd, buf, 100, 0);      /* backwards: neither */
    lseek(fd, 9000, SEEK_SET);
    read(fd, buf, 5000);         /* 1000 bytes up to EOF: sequential */
    read(fd, buf, 5000);         /* 0 bytes at EOF: consecutive */
    fstat(fd, &st);
    void *m = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) munmap(m, 4096);
    int d = dup(fd);
    close(d);
    close(fd);
    stat(argv[1], &st);

    int w = open(argv[2], O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (w < 0) return 2;
    write(w, buf, 10);           /* off 0 */
    write(w, buf, 10);           /* off 10: consecutive */
    write(w, buf, 10);           /* off 20: consecutive */
    pwrite(w, buf, 100, 1000);   /* sequential */
    write(w, buf, 5);            /* off 30: backwards from 1099 */
    fsync(w);
    fdatasync(w);
    pread(w, buf, 10, 0);        /* read after write: switch */
    write(w, buf, 10);           /* off 35: consecutive, switch */
    close(w);
    return 0;
}
"""

C_STDIO = r"""
#include <stdio.h>
#include <string.h>
/* STDIO reads and writes; prints its own tally as JSON */
int main(int argc, char **argv) {
    char buf[4096], line[256];
    long reads = 0, bytes = 0;
    FILE *f = fopen(argv[1], "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, 1000, f); reads++; bytes += (long)n;
    if (fgets(line, sizeof line, f)) bytes += (long)strlen(line);
    reads++;
    int c = fgetc(f); reads++; if (c != EOF) bytes++;
    fseek(f, 0, SEEK_SET);
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) { reads++; bytes += (long)n; }
    reads++;
    fclose(f);
    FILE *o = fopen(argv[2], "w");
    if (!o) return 2;
    fwrite(buf, 1, 500, o);
    fprintf(o, "%d\n", 12345);
    fputs("hello\n", o);
    fputc('x', o);
    fflush(o);
    fclose(o);
    printf("{\"reads\": %ld, \"bytes\": %ld, \"writes\": 4, \"bytes_written\": 513}\n", reads, bytes);
    return 0;
}
"""

C_FORK = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
/* threads keep reading and creating files while the main thread forks; each child reads one file */
static const char *A, *B, *DIR_;
static volatile int stop;
static void *hammer(void *arg) {
    char buf[4096], p[4096];
    long i = (long)arg * 100000;
    int fd = open(A, O_RDONLY);
    while (!stop) {
        pread(fd, buf, sizeof buf, 0);
        snprintf(p, sizeof p, "%s/new-%ld", DIR_, i++ % 3000);
        int f = open(p, O_CREAT | O_WRONLY, 0644);
        if (f >= 0) { write(f, "x", 1); close(f); }
    }
    close(fd);
    return NULL;
}
int main(int argc, char **argv) {
    A = argv[1]; B = argv[2]; DIR_ = argv[3];
    int n = atoi(argv[4]);
    pthread_t t[2];
    for (long k = 0; k < 2; k++) pthread_create(&t[k], NULL, hammer, (void *)k);
    usleep(20000);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            char buf[64];
            int fd = open(B, O_RDONLY);
            read(fd, buf, 10);
            close(fd);
            _exit(0);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 3;
    }
    stop = 1;
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    return 0;
}
"""


C_CXX = r"""
#include <cstdio>
#include <fstream>
#include <vector>
/* C++ streams open through libstdc++ (fopen) and read with read(2) on the descriptor */
int main(int argc, char **argv) {
    std::ifstream in(argv[1], std::ios::binary);
    std::vector<char> buf(4096);
    long total = 0;
    while (in.read(buf.data(), (std::streamsize)buf.size()) || in.gcount()) total += in.gcount();
    std::ofstream out(argv[2], std::ios::binary);
    for (int i = 0; i < 10; i++) out.write(buf.data(), 1000);
    out.close();
    std::printf("%ld\n", total);
    return 0;
}
"""


@pytest.fixture(scope="module")
def cprogs(lib: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cc = build.find_compiler()
    assert cc is not None
    d = tmp_path_factory.mktemp("cprogs")
    out: dict[str, str] = {}
    for name, src, flags in (
        ("posix", C_POSIX, ["-O0"]),
        ("stdio", C_STDIO, ["-O0"]),
        ("stdio_fortify", C_STDIO, ["-O2", "-D_FORTIFY_SOURCE=2"]),
        ("fork", C_FORK, ["-O1", "-pthread"]),
    ):
        c = d / f"{name}.c"
        c.write_text(src)
        exe = d / name
        subprocess.run([*cc, *flags, "-o", str(exe), str(c)], check=True, capture_output=True)
        out[name] = str(exe)
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx:
        c = d / "streams.cpp"
        c.write_text(C_CXX)
        subprocess.run([cxx, "-O1", "-o", str(d / "streams"), str(c)], check=True, capture_output=True)
        out["streams"] = str(d / "streams")
    return out


# -- running and strace parsing ---------------------------------------------------------------------
@dataclass
class Seen:
    opens: int = 0
    dups: int = 0
    reads: int = 0
    bytes_read: int = 0
    writes: int = 0
    bytes_written: int = 0
    other_reads: int = 0  # on descriptors duplicated with fcntl(F_DUPFD): stdio's internal reads
    other_bytes: int = 0


_LINE = re.compile(r"^(?P<name>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+)(?:\s.*)?$")
_HEXSTR = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')


def _hexpath(args: str) -> bytes | None:
    m = _HEXSTR.search(args)
    if not m:
        return None
    return bytes.fromhex(m.group(1).replace("\\x", ""))


def parse_strace(trace_dir: Path) -> dict[bytes, Seen]:
    """Per path: the system calls strace saw (one trace file per thread, ``-ff``)."""
    seen: dict[bytes, Seen] = defaultdict(Seen)
    for f in trace_dir.iterdir():
        fds: dict[int, tuple[bytes, str]] = {}
        for line in f.read_text(encoding="latin-1").splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            name, args, ret = m["name"], m["args"], int(m["ret"])
            if ret < 0:
                continue
            first = args.split(",", 1)[0].strip()
            if name in ("open", "openat", "creat"):
                path = _hexpath(args)
                if path is not None and path.startswith(b"/"):
                    fds[ret] = (path, "direct")
                    seen[path].opens += 1
            elif name in ("dup", "dup2", "dup3"):
                old = int(first)
                if old in fds and ret != old:
                    fds[ret] = (fds[old][0], "dup")
                    seen[fds[old][0]].dups += 1
                elif ret != old:
                    fds.pop(ret, None)
            elif name == "fcntl" and "F_DUPFD" in args:
                old = int(first)
                if old in fds:
                    fds[ret] = (fds[old][0], "fcntl")
            elif name == "close":
                fds.pop(int(first), None)
            elif name == "close_range":
                lo, hi = (int(x.strip()) for x in args.split(",")[:2])
                for fd in [fd for fd in fds if lo <= fd <= hi]:
                    del fds[fd]
            elif name in READ_CALLS or name in WRITE_CALLS:
                fd = int(first)
                if fd not in fds:
                    continue
                path, kind = fds[fd]
                s = seen[path]
                if kind == "fcntl":
                    s.other_reads += 1
                    s.other_bytes += ret
                elif name in READ_CALLS:
                    s.reads += 1
                    s.bytes_read += ret
                else:
                    s.writes += 1
                    s.bytes_written += ret
            elif name in ("copy_file_range", "sendfile"):
                parts = [p.strip() for p in args.split(",")]
                fin, fout = (
                    (int(parts[0]), int(parts[2]))
                    if name == "copy_file_range"
                    else (int(parts[1]), int(parts[0]))
                )
                if fin in fds:
                    seen[fds[fin][0]].reads += 1
                    seen[fds[fin][0]].bytes_read += ret
                if fout in fds:
                    seen[fds[fout][0]].writes += 1
                    seen[fds[fout][0]].bytes_written += ret
    return seen


@dataclass
class Run:
    stdout: str
    run_dir: Path
    strace: dict[bytes, Seen] | None

    def dump_rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for f in native_dumps.dump_files(str(self.run_dir)):
            rows.extend(native_dumps.read_dump(f))
        return rows


def run_preloaded(
    argv: list[str],
    lib: str,
    work: Path,
    *,
    strace: bool = True,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> Run:
    run_dir = work / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    # no holoprof state from outside (no agent: these processes are not owned), one torch thread
    full_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("HOLOPROF_")}
    full_env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    full_env["HOLOPROF_RUN_DIR"] = str(run_dir)
    full_env.update(env or {})
    trace_dir = None
    if strace and STRACE:
        trace_dir = work / "strace"
        trace_dir.mkdir()
        cmd = [
            STRACE,
            "-f",
            "--seccomp-bpf",
            "-ff",
            "-xx",
            "-s",
            "0",
            "-o",
            str(trace_dir / "tr"),
            "-e",
            f"trace={STRACE_CALLS}",
            "-E",
            f"LD_PRELOAD={lib}",
            "--",
            *argv,
        ]
    else:
        full_env["LD_PRELOAD"] = lib
        cmd = argv
    proc = subprocess.run(
        cmd, env=full_env, capture_output=True, text=True, errors="replace", timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return Run(proc.stdout, run_dir, parse_strace(trace_dir) if trace_dir else None)


def totals(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """(module, path) -> counters summed over processes."""
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        acc = out[(r["module"], r["path"])]
        for k, v in r["counters"].items():
            acc[k] += v
    return out


def assert_posix_matches_strace(run: Run, counters: dict[str, float], path: str) -> None:
    if run.strace is None:
        return
    s = run.strace[os.fsencode(path)]
    assert counters["POSIX_OPENS"] == s.opens + s.dups, (path, s)
    assert counters["POSIX_DUPS"] == s.dups, (path, s)
    assert counters["POSIX_READS"] == s.reads, (path, s)
    assert counters["POSIX_BYTES_READ"] == s.bytes_read, (path, s)
    assert counters["POSIX_WRITES"] == s.writes, (path, s)
    assert counters["POSIX_BYTES_WRITTEN"] == s.bytes_written, (path, s)


def script(work: Path, body: str) -> str:
    p = work / "workload.py"
    p.write_text(textwrap.dedent(body))
    return str(p)


def data_file(path: Path, size: int, seed: int = 0) -> Path:
    path.write_bytes(bytes((i * 31 + seed) % 251 for i in range(size)))
    return path


# -- tests --------------------------------------------------------------------------------------------
def test_not_loaded_in_this_process() -> None:
    assert not io_native.available()
    assert io_native.snapshot() == []
    assert io_native.trace_drain() == []
    assert io_native.changes(7) == ([], 7)


def test_build_places_library_and_preload_env(lib: str) -> None:
    assert os.path.basename(lib) == io_native.LIBRARY_NAME
    assert os.access(lib, os.X_OK)
    env = io_native.preload_env({"LD_PRELOAD": "/x/other.so"}, lib=lib)
    assert env["LD_PRELOAD"] == f"{lib} /x/other.so"
    assert io_native.preload_env(env, lib=lib)["LD_PRELOAD"] == env["LD_PRELOAD"]


def test_python_reads_match_strace(lib: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    whole = data_file(data / "whole.bin", 300_000)
    chunked = data_file(data / "chunked.bin", 100_003, 1)
    unbuffered = data_file(data / "unbuffered.bin", 50_000, 2)
    vectored = data_file(data / "vectored.bin", 20_000, 3)
    copied = data_file(data / "copied.bin", 70_000, 4)
    out = data / "written.bin"
    prog = script(
        tmp_path,
        """
        import json, os, shutil, sys
        from holoprof.collect import io_native
        whole, chunked, unbuffered, vectored, out, copied = sys.argv[1:7]
        assert io_native.available()
        with open(whole, "rb") as f:
            assert len(f.read()) == 300_000
        with open(chunked, "rb") as f:
            while f.read(4096):
                pass
        with open(unbuffered, "rb", buffering=0) as f:
            while f.read(1000):
                pass
        fd = os.open(vectored, os.O_RDONLY)
        assert os.preadv(fd, [bytearray(5000), bytearray(5000)], 10_000) == 10_000
        assert os.pread(fd, 10_000, 0) and os.readv(fd, [bytearray(20_000)]) == 20_000
        os.close(fd)
        with open(out, "wb") as f:
            for _ in range(10):
                f.write(b"y" * 100_000)
        shutil.copyfile(copied, copied + ".copy")  # sendfile(2) on Linux
        rows = [r for r in io_native.snapshot() if r["path"].startswith(os.path.dirname(whole))]
        print(json.dumps(rows))
        """,
    )
    run = run_preloaded(
        [
            sys.executable,
            prog,
            str(whole),
            str(chunked),
            str(unbuffered),
            str(vectored),
            str(out),
            str(copied),
        ],
        lib,
        tmp_path,
    )
    rows = json.loads(run.stdout)
    assert all(r["layer"] == "native" and r["module"] == "POSIX" for r in rows)
    got = {r["path"]: r["counters"] for r in rows}
    for path, size in ((whole, 300_000), (chunked, 100_003), (unbuffered, 50_000)):
        c = got[str(path)]
        assert c["POSIX_BYTES_READ"] == size
        assert c["POSIX_OPENS"] == 1
        assert c["POSIX_READS"] >= 2  # the data, then the read that returns 0 at EOF
        assert_posix_matches_strace(run, c, str(path))
    c = got[str(unbuffered)]
    assert c["POSIX_READS"] == 51 and c["POSIX_SIZE_READ_100_1K"] == 50 and c["POSIX_SIZE_READ_0_100"] == 1
    assert c["POSIX_CONSEC_READS"] == 50 and c["POSIX_SEQ_READS"] == 50
    c = got[str(vectored)]
    assert c["POSIX_READS"] == 3 and c["POSIX_BYTES_READ"] == 40_000
    assert c["POSIX_MAX_BYTE_READ"] == 19_999
    assert_posix_matches_strace(run, c, str(vectored))
    c = got[str(out)]
    assert c["POSIX_BYTES_WRITTEN"] == 1_000_000 and c["POSIX_WRITES"] >= 1
    assert c["POSIX_MAX_BYTE_WRITTEN"] == 999_999
    assert_posix_matches_strace(run, c, str(out))
    c = got[str(copied)]
    assert c["POSIX_BYTES_READ"] == 70_000
    assert_posix_matches_strace(run, c, str(copied))
    c = got[str(copied) + ".copy"]
    assert c["POSIX_BYTES_WRITTEN"] == 70_000
    assert_posix_matches_strace(run, c, str(copied) + ".copy")
    for c in got.values():
        assert c["POSIX_F_OPEN_START_TIMESTAMP"] <= c["POSIX_F_CLOSE_END_TIMESTAMP"]
        assert c["POSIX_F_META_TIME"] > 0
    # the process was not owned by an agent: its dump has the same files, counted the same way
    dumped = totals(run.dump_rows())
    for path in (whole, chunked, unbuffered, vectored):
        assert dumped[("POSIX", str(path))]["POSIX_BYTES_READ"] == got[str(path)]["POSIX_BYTES_READ"]


def test_numpy_fromfile_and_load(lib: str, tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    raw = tmp_path / "array.f32"
    np.arange(250_000, dtype=np.float32).tofile(raw)
    npy = tmp_path / "array.npy"
    np.save(npy, np.arange(100_000, dtype=np.int64))
    prog = script(
        tmp_path,
        """
        import sys
        import numpy as np
        a = np.fromfile(sys.argv[1], dtype=np.float32)
        b = np.load(sys.argv[2])
        assert a.size == 250_000 and b.size == 100_000
        """,
    )
    run = run_preloaded([sys.executable, prog, str(raw), str(npy)], lib, tmp_path)
    got = totals(run.dump_rows())
    # numpy reads through stdio on a duplicated descriptor: STDIO counters carry the array bytes
    assert got[("STDIO", str(raw))]["STDIO_BYTES_READ"] == 1_000_000
    assert got[("STDIO", str(raw))]["STDIO_OPENS"] == 1
    assert got[("STDIO", str(npy))]["STDIO_BYTES_READ"] == 800_000
    for path in (raw, npy):
        posix = got[("POSIX", str(path))]
        assert posix["POSIX_OPENS"] == 1
        assert_posix_matches_strace(run, posix, str(path))
        if run.strace is not None:
            s = run.strace[os.fsencode(str(path))]
            # what stdio read from the kernel covers what it handed to numpy (no double count)
            assert s.other_bytes >= got[("STDIO", str(path))]["STDIO_BYTES_READ"]
            assert posix["POSIX_BYTES_READ"] == s.bytes_read
    assert got[("POSIX", str(raw))]["POSIX_BYTES_READ"] == 0


def test_dataloader_workers_report_through_dumps(lib: str, tmp_path: Path) -> None:
    require("torch")
    data = tmp_path / "samples"
    data.mkdir()
    files = [data_file(data / f"s{i:03d}.bin", 1000 + 37 * i, i) for i in range(24)]
    prog = script(
        tmp_path,
        """
        import json, os, sys
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Files(Dataset):
            def __init__(self, paths):
                self.paths = paths
            def __len__(self):
                return len(self.paths)
            def __getitem__(self, i):
                with open(self.paths[i], "rb") as f:
                    return torch.tensor([len(f.read()), os.getpid()])

        loader = DataLoader(Files(sys.argv[1:]), batch_size=4, num_workers=2, multiprocessing_context="fork")
        batches = list(loader)
        print(json.dumps({"bytes": int(sum(b[:, 0].sum() for b in batches)),
                          "pids": sorted({int(p) for b in batches for p in b[:, 1]})}))
        """,
    )
    run = run_preloaded([sys.executable, prog, *map(str, files)], lib, tmp_path, timeout=120)
    out = json.loads(run.stdout)
    assert out["bytes"] == sum(f.stat().st_size for f in files)
    rows = run.dump_rows()
    worker_pids = {r["pid"] for r in rows if r["path"].startswith(str(data))}
    assert worker_pids == set(out["pids"]) and len(worker_pids) == 2
    got = totals(rows)
    for f in files:
        c = got[("POSIX", str(f))]
        assert c["POSIX_BYTES_READ"] == f.stat().st_size
        assert c["POSIX_OPENS"] == 1
        assert_posix_matches_strace(run, c, str(f))


def test_native_readers_cat_dd_and_copy(lib: str, tmp_path: Path) -> None:
    src = data_file(tmp_path / "input.bin", 123_457)
    copy = tmp_path / "copy.bin"
    for tool, argv, in_kind in (
        ("cat", ["cat", str(src)], "read"),
        ("dd", ["dd", f"if={src}", "of=/dev/null", "bs=4096", "status=none"], "read"),
        ("copy", ["sh", "-c", f'cat "{src}" > "{copy}"'], "copy"),
    ):
        if shutil.which(argv[0]) is None:
            continue
        work = tmp_path / tool
        work.mkdir()
        run = run_preloaded(argv, lib, work)
        got = totals(run.dump_rows())
        c = got[("POSIX", str(src))]
        assert c["POSIX_BYTES_READ"] == 123_457, tool
        assert_posix_matches_strace(run, c, str(src))
        if tool == "dd":
            assert c["POSIX_DUPS"] == 1  # dd moves the input onto descriptor 0 with dup2
        if in_kind == "copy":
            # whether the shell's redirection is seen or not, the copied bytes land on copy.bin
            w = got[("POSIX", str(copy))]
            assert w["POSIX_BYTES_WRITTEN"] == 123_457


def test_darshan_counter_semantics(lib: str, cprogs: dict[str, str], tmp_path: Path) -> None:
    src = data_file(tmp_path / "pattern.bin", 10_000)
    dst = tmp_path / "written.bin"
    run = run_preloaded([cprogs["posix"], str(src), str(dst)], lib, tmp_path)
    got = totals(run.dump_rows())
    r = got[("POSIX", str(src))]
    expected_read = {
        "POSIX_OPENS": 2,
        "POSIX_DUPS": 1,
        "POSIX_READS": 7,
        "POSIX_BYTES_READ": 3400,
        "POSIX_CONSEC_READS": 3,
        "POSIX_SEQ_READS": 5,
        "POSIX_MAX_BYTE_READ": 9999,
        "POSIX_SEEKS": 1,
        "POSIX_STATS": 2,
        "POSIX_MMAPS": 1,
        "POSIX_WRITES": 0,
        "POSIX_SIZE_READ_0_100": 5,
        "POSIX_SIZE_READ_100_1K": 1,
        "POSIX_SIZE_READ_1K_10K": 1,
        "POSIX_RW_SWITCHES": 0,
    }
    assert {k: r[k] for k in expected_read} == expected_read
    w = got[("POSIX", str(dst))]
    expected_write = {
        "POSIX_OPENS": 1,
        "POSIX_WRITES": 6,
        "POSIX_BYTES_WRITTEN": 145,
        "POSIX_CONSEC_WRITES": 3,
        "POSIX_SEQ_WRITES": 4,
        "POSIX_MAX_BYTE_WRITTEN": 1099,
        "POSIX_RW_SWITCHES": 2,
        "POSIX_FSYNCS": 1,
        "POSIX_FDSYNCS": 1,
        "POSIX_READS": 1,
        "POSIX_SIZE_WRITE_0_100": 6,  # 10, 10, 10, 100, 5 and 10 bytes: all in Darshan's 0-100 bucket
        "POSIX_SIZE_WRITE_100_1K": 0,
    }
    assert {k: w[k] for k in expected_write} == expected_write
    assert (
        w["POSIX_F_WRITE_TIME"] > 0 and w["POSIX_F_WRITE_START_TIMESTAMP"] <= w["POSIX_F_WRITE_END_TIMESTAMP"]
    )
    assert_posix_matches_strace(run, r, str(src))
    assert_posix_matches_strace(run, w, str(dst))


@pytest.mark.parametrize("variant", ["stdio", "stdio_fortify"])
def test_stdio_program(lib: str, cprogs: dict[str, str], tmp_path: Path, variant: str) -> None:
    text = "".join(f"line {i:05d} " + "z" * (i % 40) + "\n" for i in range(2000))
    src = tmp_path / "lines.txt"
    src.write_text(text)
    dst = tmp_path / "out.txt"
    run = run_preloaded([cprogs[variant], str(src), str(dst)], lib, tmp_path)
    tally = json.loads(run.stdout)
    got = totals(run.dump_rows())
    s = got[("STDIO", str(src))]
    assert s["STDIO_OPENS"] == 1
    assert s["STDIO_READS"] == tally["reads"]
    assert s["STDIO_BYTES_READ"] == tally["bytes"] > len(text)
    assert s["STDIO_SEEKS"] == 1
    assert s["STDIO_F_READ_TIME"] > 0 and s["STDIO_F_META_TIME"] > 0
    o = got[("STDIO", str(dst))]
    assert o["STDIO_WRITES"] == tally["writes"] and o["STDIO_BYTES_WRITTEN"] == tally["bytes_written"]
    assert o["STDIO_FLUSHES"] == 1
    assert dst.stat().st_size == 513
    # stdio's own read()/write() calls stay inside libc: nothing is counted twice in POSIX
    for path in (src, dst):
        p = got.get(("POSIX", str(path)), {})
        assert p.get("POSIX_READS", 0) == 0 and p.get("POSIX_WRITES", 0) == 0 and p.get("POSIX_OPENS", 0) == 0
    if run.strace is not None:
        seen = run.strace[os.fsencode(str(src))]
        assert seen.opens == 1 and seen.bytes_read >= len(text.encode())
        assert run.strace[os.fsencode(str(dst))].bytes_written == 513


def test_cxx_streams(lib: str, cprogs: dict[str, str], tmp_path: Path) -> None:
    if "streams" not in cprogs:
        pytest.skip("no C++ compiler (c++, g++ or clang++)")
    src = data_file(tmp_path / "in.bin", 50_000)
    dst = tmp_path / "out.bin"
    run = run_preloaded([cprogs["streams"], str(src), str(dst)], lib, tmp_path)
    assert int(run.stdout) == 50_000
    got = totals(run.dump_rows())
    # libstdc++ opens with fopen (a STDIO open) and then calls read()/write() on the descriptor,
    # which the library attributes to the file on first use
    assert got[("STDIO", str(src))]["STDIO_OPENS"] == 1
    r = got[("POSIX", str(src))]
    assert r["POSIX_BYTES_READ"] == 50_000 and r["POSIX_OPENS"] == 0
    w = got[("POSIX", str(dst))]
    assert w["POSIX_BYTES_WRITTEN"] == 10_000
    if run.strace is not None:
        assert run.strace[os.fsencode(str(src))].bytes_read == 50_000
        assert r["POSIX_READS"] == run.strace[os.fsencode(str(src))].reads


def test_fork_while_threads_do_io(lib: str, cprogs: dict[str, str], tmp_path: Path) -> None:
    a = data_file(tmp_path / "a.bin", 8192)
    b = data_file(tmp_path / "b.bin", 100, 1)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run = run_preloaded(
        [cprogs["fork"], str(a), str(b), str(scratch), "150"], lib, tmp_path, strace=False, timeout=60
    )
    dumps = native_dumps.dump_files(str(run.run_dir))
    children = 0
    for f in dumps:
        head = native_dumps.read_dump_header(f)
        got = totals(native_dumps.read_dump(f))
        if ("POSIX", str(b)) in got:
            children += 1
            # a child starts with zero counters: only its own open+read of b, nothing of a
            assert got[("POSIX", str(b))]["POSIX_READS"] == 1
            assert got[("POSIX", str(b))]["POSIX_BYTES_READ"] == 10
            assert ("POSIX", str(a)) not in got
            assert head["reason"] == "_exit"
        else:
            assert got[("POSIX", str(a))]["POSIX_READS"] > 0  # the parent
    assert children == 150


def test_python_fork_child_counters_and_owner(lib: str, tmp_path: Path) -> None:
    a = data_file(tmp_path / "a.bin", 4096)
    b = data_file(tmp_path / "b.bin", 64, 1)
    prog = script(
        tmp_path,
        """
        import json, os, sys, threading
        from holoprof.collect import io_native
        a, b = sys.argv[1:3]
        io_native.set_owner(True)          # this process is read in process: no dump at exit
        stop = False
        def hammer():
            fd = os.open(a, os.O_RDONLY)
            while not stop:
                os.pread(fd, 4096, 0)
            os.close(fd)
        t = threading.Thread(target=hammer)
        t.start()
        results = []
        for i in range(20):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                with open(b, "rb") as f:
                    f.read()
                rows = {x["path"]: x["counters"] for x in io_native.snapshot()}
                os.write(w, json.dumps([rows.get(b, {}).get("POSIX_READS"), a in rows]).encode())
                os._exit(0)
            os.close(w)
            results.append(json.loads(os.read(r, 1000)))
            os.close(r)
            os.waitpid(pid, 0)
        stop = True
        t.join()
        print(json.dumps(results))
        """,
    )
    run = run_preloaded([sys.executable, prog, str(a), str(b)], lib, tmp_path, strace=False)
    assert json.loads(run.stdout) == [[2, False]] * 20  # read() of the data, then EOF
    pids = {native_dumps.read_dump_header(f)["pid"] for f in native_dumps.dump_files(str(run.run_dir))}
    assert len(pids) == 20  # the children dump (not owned); the owning parent does not


def test_threads_count_exactly(lib: str, tmp_path: Path) -> None:
    shared = data_file(tmp_path / "shared.bin", 65536)
    prog = script(
        tmp_path,
        """
        import json, os, sys, threading
        from holoprof.collect import io_native
        path = sys.argv[1]
        fd = os.open(path, os.O_RDONLY)
        def work(k):
            own = os.open(path, os.O_RDONLY)
            for i in range(5000):
                os.pread(fd if i % 2 else own, 4096, (i * 4096 + k) % 61440)
            os.close(own)
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        c = {r["path"]: r["counters"] for r in io_native.snapshot()}[path]
        print(json.dumps([c["POSIX_READS"], c["POSIX_BYTES_READ"], c["POSIX_OPENS"]]))
        """,
    )
    run = run_preloaded([sys.executable, prog, str(shared)], lib, tmp_path, strace=False)
    assert json.loads(run.stdout) == [20_000, 20_000 * 4096, 5]


def test_vfork_child_leaves_parent_tables_alone(lib: str, tmp_path: Path) -> None:
    log = tmp_path / "log.bin"
    prog = script(
        tmp_path,
        """
        import json, subprocess, sys
        from holoprof.collect import io_native
        path = sys.argv[1]
        with open(path, "wb") as log:
            # the child (vfork) moves log onto its descriptor 1 and closes everything else
            subprocess.run(["true"], stdout=log, close_fds=True, check=True)
            sys.stdout.write("x" * 1000 + "\\n")
            sys.stdout.flush()
            log.write(b"abc")
        c = {r["path"]: r["counters"] for r in io_native.snapshot()}[path]
        print(json.dumps([c["POSIX_BYTES_WRITTEN"], c["POSIX_OPENS"]]))
        """,
    )
    run = run_preloaded([sys.executable, prog, str(log)], lib, tmp_path, strace=False)
    assert json.loads(run.stdout.splitlines()[-1]) == [3, 1]


def test_odd_file_names_round_trip(lib: str, tmp_path: Path) -> None:
    d = tmp_path / "odd"
    d.mkdir()
    names = ["with space.bin", "ünïcødé-日本.bin", "new\nline.bin", 'quo"te\\back.bin', "tab\there.bin"]
    for n in names:
        (d / n).write_bytes(b"abc")
    raw = os.fsencode(str(d)) + b"/bad-\xff\xfe.bin"
    with open(raw, "wb") as f:
        f.write(b"abcd")
    prog = script(
        tmp_path,
        """
        import json, os, sys
        from holoprof.collect import io_native
        d = sys.argv[1]
        for name in os.listdir(os.fsencode(d)):
            with open(os.path.join(os.fsencode(d), name), "rb") as f:
                f.read()
        print(json.dumps(sorted(r["path"] for r in io_native.snapshot() if r["path"].startswith(d))))
        """,
    )
    run = run_preloaded([sys.executable, prog, str(d)], lib, tmp_path, strace=False)
    expected = sorted([str(d / n) for n in names] + [str(d) + "/bad-\\xff\\xfe.bin"])
    assert json.loads(run.stdout) == expected
    assert io_native.path_text(raw) == str(d) + "/bad-\\xff\\xfe.bin"
    dumped = sorted(r["path"] for r in run.dump_rows() if r["path"].startswith(str(d)))
    assert dumped == expected


def test_both_layers_key_a_file_alike_however_its_path_is_spelled(lib: str, tmp_path: Path) -> None:
    """The native layer's normalized path and the Python layer's ``path_key`` agree on spellings with
    ``//`` (leading ones included), ``.``, ``..`` and trailing slashes of directories."""
    d = tmp_path / "keys"
    (d / "sub").mkdir(parents=True)
    target = d / "sub" / "f.bin"
    target.write_bytes(b"abcdef")
    spellings = [
        "/" + str(target),
        "//" + str(target).lstrip("/"),
        str(d) + "//sub/./f.bin",
        str(d) + "/sub/../sub/f.bin",
        str(d) + "/./sub//../sub/./f.bin",
    ]
    prog = script(
        tmp_path,
        """
        import json, sys
        from holoprof.collect import io_native
        from holoprof.collect.io_paths import path_key
        for p in sys.argv[1:]:
            with open(p, "rb") as f:
                f.read()
        native = sorted({r["path"] for r in io_native.snapshot() if r["path"].endswith("f.bin")})
        print(json.dumps({"native": native, "python": sorted({path_key(p) for p in sys.argv[1:]})}))
        """,
    )
    run = run_preloaded([sys.executable, prog, *spellings], lib, tmp_path, strace=False)
    got = json.loads(run.stdout)
    assert got == {"native": [str(target)], "python": [str(target)]}, got


def test_an_exclude_spelled_with_a_leading_double_slash_applies(lib: str, tmp_path: Path) -> None:
    """``--io-exclude //DIR`` reaches the library as the prefix it compares paths with (``/DIR``)."""
    from holoprof.launch.run import native_excludes

    keep, skip = tmp_path / "keep", tmp_path / "skip"
    keep.mkdir()
    skip.mkdir()
    (keep / "a.bin").write_bytes(b"a" * 10)
    (skip / "b.bin").write_bytes(b"b" * 10)
    excludes = native_excludes(str(tmp_path / "run"), {"io_exclude": ["/" + str(skip)]})
    assert str(skip) in excludes, excludes
    prog = script(
        tmp_path,
        """
        import json, sys
        from holoprof.collect import io_native
        for p in sys.argv[1:]:
            with open(p, "rb") as f:
                f.read()
        print(json.dumps(sorted(r["path"] for r in io_native.snapshot() if r["path"].endswith(".bin"))))
        """,
    )
    files = [str(keep / "a.bin"), "/" + str(skip / "b.bin")]
    run = run_preloaded(
        [sys.executable, prog, *files],
        lib,
        tmp_path,
        strace=False,
        env={"HOLOPROF_IO_EXCLUDE": ":".join(excludes)},
    )
    assert json.loads(run.stdout) == [str(keep / "a.bin")], run.stdout


def test_trace_ring_is_bounded(lib: str, tmp_path: Path) -> None:
    f = data_file(tmp_path / "t.bin", 64 * 1024)
    prog = script(
        tmp_path,
        """
        import json, os, sys
        from holoprof.collect import io_native as io
        path = sys.argv[1]
        fd = os.open(path, os.O_RDONLY)
        assert io.trace_drain() == []
        assert io.trace_start(50)
        for i in range(16):
            os.pread(fd, 4096, i * 4096)
        first = io.trace_drain(10)
        for i in range(500):
            os.pread(fd, 100, i)
        io.trace_stop()
        os.pread(fd, 100, 0)          # not recorded after stop
        rest = io.trace_drain(1000)
        dropped = io.trace_dropped()
        assert io.trace_start(5)
        os.close(fd)
        again = io.trace_drain()
        io.trace_stop()
        print(json.dumps({"first": first, "rest": len(rest), "dropped": dropped, "again": again,
                          "last": rest[-1]}))
        """,
    )
    run = run_preloaded([sys.executable, prog, str(f)], lib, tmp_path, strace=False)
    out = json.loads(run.stdout)
    first = out["first"]
    assert [r["offset"] for r in first] == [i * 4096 for i in range(10)]
    assert all(r["op"] == "read" and r["size_bytes"] == 4096 and r["path"] == str(f) for r in first)
    assert all(r["module"] == "POSIX" and 0 < r["start_ns"] <= r["end_ns"] for r in first)
    # 50 slots: 6 reads were still queued, then 44 more fit and the other 456 were dropped
    assert out["rest"] == 50 and out["dropped"] == 456
    assert out["last"]["offset"] == 43 and out["last"]["size_bytes"] == 100
    assert [r["op"] for r in out["again"]] == ["close"]


def test_the_extension_module_and_ctypes_read_the_library_alike(lib: str, tmp_path: Path) -> None:
    """The agent calls the library through ``holoprof.collect._io_api`` where it was built, else
    through ctypes: both give the same rows, traces, paths and counts, and both claim and dump."""
    f = data_file(tmp_path / "e-\xe9.bin", 30_000)
    prog = script(
        tmp_path,
        """
        import json, os, sys
        from holoprof.collect import io_native as io
        from holoprof.collect import _io_api
        from holoprof.store.native_dumps import read_dump
        path, out = sys.argv[1], sys.argv[2]

        def traced_read():
            assert io.trace_start(100)
            with open(path, "rb") as fh:
                fh.read()
            rows = io.trace_drain()
            io.trace_stop()
            return [[r["module"], r["op"], r["path"], r["size_bytes"]] for r in rows]

        def state():
            rows, nxt = io.changes(0)
            mine = sorted([r["module"], r["path"], sorted(r["counters"].items())] for r in rows
                          if r["path"] == path)
            return {"rows": mine, "next": nxt > 0, "dropped": io.dropped(), "trace_dropped": io.trace_dropped()}

        assert _io_api.loaded() and io.available()
        trace = traced_read()
        ext = state()
        assert io.dump(out + ".ext")  # a path: bytes to the library
        ext_dumped = sorted(r["counters"]["POSIX_OPENS"] for r in read_dump(out + ".ext") if r["path"] == path)
        assert io._get().api is _io_api
        io._probed, io._lib = False, None
        import holoprof.collect
        del holoprof.collect._io_api
        sys.modules["holoprof.collect._io_api"] = None  # as where it was not built
        assert io.available() and type(io._get().api).__name__ == "_CtypesApi"
        with_ctypes = state()
        trace2 = traced_read()
        assert io.dump(out)
        dumped = sorted(r["counters"]["POSIX_OPENS"] for r in read_dump(out) if r["path"] == path)
        print(json.dumps({"ext": ext, "ctypes": with_ctypes, "trace": trace, "trace2": trace2,
                          "ext_dumped": ext_dumped, "dumped": dumped}))
        """,
    )
    run = run_preloaded(
        [sys.executable, prog, str(f), str(tmp_path / "dump.jsonl")], lib, tmp_path, strace=False
    )
    out = json.loads(run.stdout)
    assert out["ext"] == out["ctypes"]
    (row,) = out["ext"]["rows"]
    assert row[0] == "POSIX" and dict(row[2])["POSIX_BYTES_READ"] == 30_000
    assert out["trace"] == out["trace2"]
    assert ["POSIX", "read", str(f), 30_000] in out["trace"]
    assert out["ext_dumped"] == [1], "the extension's dump, after the first read"
    assert out["dumped"] == [2], "the dump counts both opens"


def test_table_full_is_counted(lib: str, tmp_path: Path) -> None:
    d = tmp_path / "many"
    d.mkdir()
    for i in range(40):
        (d / f"f{i}").write_bytes(b"x")
    prog = script(
        tmp_path,
        """
        import json, os, sys
        from holoprof.collect import io_native
        d = sys.argv[1]
        before = len(io_native.snapshot())
        for i in range(40):
            with open(os.path.join(d, f"f{i}"), "rb") as f:
                f.read()
        mine = [r for r in io_native.snapshot() if r["path"].startswith(d)]
        print(json.dumps({"before": before, "mine": len(mine), "dropped": io_native.dropped()}))
        """,
    )
    # every Python start-up file under the interpreter's prefix takes records too: leave room for 10
    probe = run_preloaded(
        [sys.executable, "-c", "from holoprof.collect import io_native as n; print(len(n.snapshot()))"],
        lib,
        tmp_path / "probe",
        strace=False,
        env={"HOLOPROF_IO_EXCLUDE": ""},
    )
    cap = int(probe.stdout) + 20
    run = run_preloaded(
        [sys.executable, prog, str(d)],
        lib,
        tmp_path,
        strace=False,
        env={"HOLOPROF_IO_MAX_FILES": str(cap), "HOLOPROF_IO_EXCLUDE": ""},
    )
    out = json.loads(run.stdout)
    assert out["mine"] < 40 and out["dropped"] >= 40 - out["mine"] > 0
    assert (
        native_dumps.read_dump_header(native_dumps.dump_files(str(run.run_dir))[0])["dropped"]
        >= out["dropped"]
    )


def test_excluded_paths_and_run_directory(lib: str, tmp_path: Path) -> None:
    keep = data_file(tmp_path / "keep.bin", 10)
    prog = script(
        tmp_path,
        """
        import os, sys
        run = os.environ["HOLOPROF_RUN_DIR"]
        with open(os.path.join(run, "agent-owned.parquet"), "wb") as f:
            f.write(b"not user I/O")
        for p in ("/proc/self/status", "/etc/hostname", sys.argv[1]):
            try:
                with open(p, "rb") as f:
                    f.read()
            except OSError:
                pass
        """,
    )
    run = run_preloaded([sys.executable, prog, str(keep)], lib, tmp_path, strace=False)
    paths = {r["path"] for r in run.dump_rows()}
    assert str(keep) in paths
    assert not any(p.startswith((str(run.run_dir), "/proc/", "/etc/")) for p in paths)


def test_incremental_changes_and_disable(lib: str, tmp_path: Path) -> None:
    a = data_file(tmp_path / "a.bin", 10)
    b = data_file(tmp_path / "b.bin", 10)
    prog = script(
        tmp_path,
        """
        import json, sys
        from holoprof.collect import io_native as io
        a, b = sys.argv[1:3]
        open(a, "rb").read()
        rows, since = io.changes()
        open(b, "rb").read()
        rows2, since2 = io.changes(since)
        rows3, _ = io.changes(since2)
        print(json.dumps([a in {r["path"] for r in rows}, sorted(r["path"] for r in rows2), rows3]))
        """,
    )
    run = run_preloaded([sys.executable, prog, str(a), str(b)], lib, tmp_path / "on", strace=False)
    assert json.loads(run.stdout) == [True, [str(b)], []]
    off = run_preloaded(
        [sys.executable, prog, str(a), str(b)],
        lib,
        tmp_path / "off",
        strace=False,
        env={io_native.ENV_DISABLE: "1"},
    )
    assert json.loads(off.stdout) == [False, [], []]
    assert native_dumps.dump_files(str(off.run_dir)) == []


def test_read_dump_tolerates_truncation(tmp_path: Path) -> None:
    head = {
        "format": native_dumps.DUMP_FORMAT,
        "host": "h",
        "pid": 5,
        "ts_ns": 9,
        "counter_names": {"POSIX": ["POSIX_READS", "POSIX_F_READ_TIME"]},
    }
    rec = {"module": "POSIX", "path": "/d/\udcff.bin", "counters": {"POSIX_READS": 3}}
    p = tmp_path / "io_native-5.jsonl"
    p.write_text(json.dumps(head) + "\n" + json.dumps(rec) + "\n" + '{"module": "POSIX", "pa')
    rows = native_dumps.read_dump(str(p))
    assert rows == [
        {
            "host": "h",
            "pid": 5,
            "rank": -1,
            "ts_ns": 9,
            "module": "POSIX",
            "layer": "native",
            "path": "/d/\\xff.bin",
            "counters": {"POSIX_READS": 3, "POSIX_F_READ_TIME": 0.0},
        }
    ]
    bad = tmp_path / "other.jsonl"
    bad.write_text('{"format": "x"}\n')
    with pytest.raises(ValueError, match="not a holoprof native I/O dump"):
        native_dumps.read_dump(str(bad))


def test_the_library_gets_no_exclude_nested_in_another(tmp_path: Path) -> None:
    """The library compares every path it sees with each exclude: one under another it also gets is
    left out, unless an --io-include drops the outer one (then the inner one still applies)."""
    from holoprof.launch.run import native_excludes

    outer, inner = tmp_path / "env", tmp_path / "env" / "lib" / "site-packages"
    got = native_excludes(str(tmp_path / "run"), {"io_exclude": [str(outer), str(inner), str(outer) + "/"]})
    assert str(outer) in got and str(inner) not in got, got
    assert not [p for p in got if any(q != p and p.startswith(q + "/") for q in got)], got
    kept = native_excludes(
        str(tmp_path / "run"), {"io_exclude": [str(outer), str(inner)], "io_include": [str(outer / "data")]}
    )
    assert str(outer) not in kept and str(inner) in kept, kept
