"""Agent start-up stays light: a short traced Python process loads nothing heavy at its start, yet it is
in the run with its row, its exit status and its I/O counters (timings: benchmarks/bench_startup.py)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import holoprof
from conftest import run_python, traced
from holoprof.collect import io_native

#: What a process must not pay for at start-up unless it loads it itself: frameworks, the store's
#: engines, psutil; and the agent's parts that wait for a framework, the first flush or a request.
NEVER_AT_START = (
    "pyarrow",
    "duckdb",
    "numpy",
    "pandas",
    "psutil",
    "torch",
    "tensorflow",
    "holoprof.api",
    "holoprof.collect.torch",
    "holoprof.collect.tensorflow",
    "holoprof.collect.memory",
    "holoprof.collect.flops",
    "holoprof.collect.comm",
    "holoprof.collect.control",
    "holoprof.collect.io_native",
    "holoprof.store.mailbox",
)
#: Standard modules that cost milliseconds each; the Python I/O layer (where the native library is not
#: built) loads some of them, the native layer none.
STDLIB_HEAVY = ("typing", "re", "json", "socket", "signal", "ctypes", "importlib.abc", "importlib.util")

PROBE = """
import os, sys
watched = {watched!r}
loaded = sorted(m for m in sys.modules if m in watched or m.split(".")[0] in watched)
core = sys.modules.get("holoprof.agent.core")
running = core is not None and core.get_agent() is not None
with open("probe-%d.txt" % os.getpid(), "w") as f:
    f.write("x" * 4096)
print(repr((loaded, running, os.getpid())))
"""


def test_a_short_process_loads_nothing_heavy_and_is_in_the_run(tmp_path: Path) -> None:
    native = io_native.library_path() is not None
    watched = NEVER_AT_START + (STDLIB_HEAVY if native else ())
    probe = PROBE.format(watched=watched)
    # the same probe untraced: what the interpreter loads by itself (a .pth file may load some)
    plain = run_python("-c", probe, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    plain_loaded, plain_running, _ = ast.literal_eval(plain.stdout.strip())
    assert not plain_running

    sh = '"$PY" -c "$PROBE" > probe.out && "$PY" -c "import os; os._exit(7)"; echo $? > exit.out'
    run = traced(tmp_path, "bash", "-c", sh, env={"PY": sys.executable, "PROBE": probe})
    assert run.proc.returncode == 0, run.proc.stderr
    loaded, running, pid = ast.literal_eval((tmp_path / "probe.out").read_text().strip())
    assert running, "the agent runs in the short process"
    assert set(loaded) <= set(plain_loaded), (
        f"loaded at start-up by the agent: {set(loaded) - set(plain_loaded)}"
    )
    assert (tmp_path / "exit.out").read_text().strip() == "7"

    loaded_run = holoprof.load(run.run_dir)
    rows = loaded_run.rows("SELECT pid, exit_code, end_ns, argv FROM processes")
    ends = {p: e for p, _, e, _ in rows}
    assert ends.get(pid), f"the probe's row ended: {rows}"
    # the child that left through os._exit(7) is in the run with its exit status
    assert any(code == 7 and json.loads(argv) == ["-c"] for _, code, _, argv in rows), rows
    files = loaded_run.rows("SELECT pid, path, counters FROM io_file_totals")
    (counters,) = [json.loads(c) for p, path, c in files if p == pid and path.endswith(f"probe-{pid}.txt")]
    assert counters["POSIX_BYTES_WRITTEN"] == 4096, counters


SPAWN_PARENT = """
import json, multiprocessing as mp, sys
sys.path.insert(0, ".")
import spawn_child

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=spawn_child.report, args=(q,))
    p.start()
    print(json.dumps(q.get()))
    p.join()
"""
SPAWN_CHILD = """
import gc
full = gc.get_stats()[2]["collections"]
import torch  # while the child loads what its parent sent, as a spawned DataLoader worker does

def report(q):
    from holoprof.agent import setup
    q.put({"full_at_import": gc.get_stats()[2]["collections"] - full, **setup._FORK_RESET})
"""


def test_a_spawned_child_that_imports_torch_defers_the_gc_reset_to_its_first_fork(tmp_path: Path) -> None:
    """The full collection after ``import torch`` (see ``reset_gc_clock``) guards forks; a spawned
    child, a DataLoader worker that never forks, does not pay it at its start."""
    (tmp_path / "parent.py").write_text(SPAWN_PARENT)
    (tmp_path / "spawn_child.py").write_text(SPAWN_CHILD)
    run = traced(tmp_path, "parent.py")
    assert run.proc.returncode == 0, run.proc.stderr
    got = json.loads(run.proc.stdout.strip().splitlines()[-1])
    assert got["armed"] and not got["done"], got  # a collection waits for the child's first fork
