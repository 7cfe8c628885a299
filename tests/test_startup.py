"""Agent start-up stays light: a short traced Python process loads nothing heavy at its start, yet it is
in the run with its row, its exit status and its I/O counters (timings: benchmarks/bench_startup.py)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import holoprof
from conftest import main_process, run_python, traced
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


SPAWN_LOADER = """
import _thread, json, multiprocessing as mp, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

TRAINING_MODULES = {training!r}


class Files(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        with open(f"data-{{i}}.bin", "rb") as f:
            return torch.tensor([float(len(f.read()))])


def collectors(tag):
    agent = sys.modules["holoprof.agent.core"].get_agent()
    with open(f"{{tag}}-{{os.getpid()}}.json", "w") as f:
        json.dump({{"collectors": sorted(type(c).__name__ for c in agent.collectors),
                   "modules": sorted(m for m in TRAINING_MODULES if m in sys.modules),
                   "flushed": agent._flushed_any, "held": agent.flushes_held_until,
                   "start_s": time.monotonic() - agent.start_ns / 1e9,
                   "threads_while_starting": THREADS_WHILE_STARTING, "threads": _thread._count()}}, f)


THREADS_WHILE_STARTING = None
if __name__ == "__mp_main__":
    time.sleep(1.5)  # a worker's start-up longer than a flush interval (a slow file system)
    THREADS_WHILE_STARTING = _thread._count()  # threads besides the main one


def train(steps):
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(2, 1)).sum().backward()
        opt.step()


def worker_init(_):
    collectors("worker")


def not_a_worker():
    collectors("child")
    train(2)


if __name__ == "__main__":
    for i in range(4):
        with open(f"data-{{i}}.bin", "wb") as f:
            f.write(b"x" * 1000 * (i + 1))
    loader = DataLoader(Files(), batch_size=2, num_workers=2, multiprocessing_context="spawn",
                        worker_init_fn=worker_init)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    # a spawned child that is no worker, started while this process marks the workers it starts (another
    # thread while a DataLoader starts its workers): it gets the training collectors before it trains
    os.environ["HOLOPROF_LOADER_WORKERS"] = str(os.getpid())
    p = mp.get_context("spawn").Process(target=not_a_worker)
    p.start()
    p.join()
    print("exit", p.exitcode)
"""
#: the training-step collectors' modules, which a DataLoader worker has no use for
TRAINING_MODULES = (
    "holoprof.collect.torch.collector",
    "holoprof.collect.torch.forward",
    "holoprof.collect.torch.optimizer",
    "holoprof.collect.memory",
    "holoprof.collect.flops",
    "holoprof.collect.compile",
    "holoprof.collect.comm",
)


def test_a_spawned_dataloader_worker_installs_no_training_collector_and_records_its_io(
    tmp_path: Path,
) -> None:
    """A DataLoader worker started with "spawn" installs its batch fetches, I/O and checkpoint collectors
    only, and its reads, fetches and role are in the run; a spawned child that is no worker still gets
    every collector (timings: benchmarks/bench_startup.py)."""
    (tmp_path / "job.py").write_text(SPAWN_LOADER.format(training=TRAINING_MODULES))
    run = traced(tmp_path, "job.py", env={"HOLOPROF_LOADER_HOLD_S": "60"})  # however slow its start
    assert run.proc.returncode == 0, run.proc.stderr
    assert "exit 0" in run.proc.stdout, run.proc.stdout

    workers = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("worker-*.json")}
    assert len(workers) == 2, workers
    for got in workers.values():
        assert got["modules"] == [], f"training collectors loaded in a worker: {got}"
        # its first flush waits for the end of its start-up, though that took longer than a flush interval
        assert got["start_s"] > 1.5 and not got["flushed"] and got["held"] == 0, got
        # no writer thread while it starts (each malloc would take glibc's locked path); one once it serves
        assert got["threads_while_starting"] == 0 and got["threads"] >= 1, got
        assert "LoaderWorkerCollector" in got["collectors"] and "IoCollector" in got["collectors"], got
        assert not {"TorchCollector", "MemoryCollector", "FlopCollector", "CommCollector"} & set(
            got["collectors"]
        )
    (child,) = [json.loads(p.read_text()) for p in tmp_path.glob("child-*.json")]
    assert {"TorchCollector", "MemoryCollector", "FlopCollector"} <= set(child["collectors"]), child
    assert child["held"] == 0, child
    assert "LoaderWorkerCollector" not in child["collectors"], child

    loaded = holoprof.load(run.run_dir)
    roles = dict(loaded.rows("SELECT pid, max(role) FROM processes GROUP BY pid"))
    assert {roles[pid] for pid in workers} == {"dataloader_worker"}, roles
    # each worker's reads of the files it loaded, and its fetch spans
    reads: dict[int, int] = {}
    for pid, path, counters in loaded.rows("SELECT pid, path, counters FROM io_file_totals"):
        if pid in workers and Path(path).name.startswith("data-"):
            reads[pid] = reads.get(pid, 0) + json.loads(counters)["POSIX_BYTES_READ"]
    assert sum(reads.values()) == 1000 + 2000 + 3000 + 4000, reads
    fetches = loaded.rows("SELECT pid, count(*) FROM spans WHERE kind = 'op' AND name = 'fetch' GROUP BY pid")
    assert sum(n for pid, n in fetches if pid in workers) == 2, fetches
    # the training process and the child that is no worker train with every collector
    steps = {p["pid"]: p["steps"] for p in run.report["processes"]}
    assert steps[main_process(run.report)["pid"]] == 2, run.report["processes"]
    child_pids = [p["pid"] for p in run.report["processes"] if p["role"] == "child" and p["steps"] == 2]
    assert len(child_pids) == 1, run.report["processes"]


HELD = """
import multiprocessing as mp, os, subprocess, sys, time


def flushed():
    return sys.modules["holoprof.agent.core"].get_agent()._flushed_any


def child(q):
    time.sleep(2.5)
    q.put(flushed())


if __name__ == "__main__":
    os.environ["HOLOPROF_LOADER_WORKERS"] = str(os.getpid())  # as while a DataLoader starts its workers
    ctx = mp.get_context("spawn")
    for hold in sys.argv[1:]:
        os.environ["HOLOPROF_LOADER_HOLD_S"] = hold
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        print("spawned", hold, q.get())
        p.join()
    # a process that multiprocessing did not spawn (its resource tracker, a fork server) is not held
    code = "import sys, time; time.sleep(2.5); print(sys.modules['holoprof.agent.core'].get_agent()._flushed_any)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    print("other", out.strip())
"""


def test_a_spawned_child_holds_its_first_flush_for_a_bounded_time(tmp_path: Path) -> None:
    """A child spawned while its parent starts DataLoader workers holds its first flush until it begins
    a worker's loop (above); one that never does flushes once the hold's limit
    (``HOLOPROF_LOADER_HOLD_S``) has passed; a process multiprocessing did not spawn is not held; the
    exit's flush is never held."""
    (tmp_path / "held.py").write_text(HELD)
    run = traced(tmp_path, "held.py", "0.5", "60", options=("--flush-interval", "0.2"))
    assert run.proc.returncode == 0, run.proc.stderr
    lines = run.proc.stdout.strip().split("\n")
    assert lines[-3:] == ["spawned 0.5 True", "spawned 60 False", "other True"], run.proc.stdout
    children = [p for p in run.report["processes"] if p["role"] == "child"]
    spawned = [p for p in children if p["argv"][:1] == ["held.py"]]  # multiprocessing gives them the parent's
    assert len(spawned) == 2 and all(p["traced"] and p["end_ns"] > p["start_ns"] for p in spawned), children


GC_CLOCK = """
import gc, json, os, sys
import torch
from torch.utils.data import DataLoader, Dataset


class Zeros(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.zeros(2)


def clock(_):
    with open(os.environ["CLOCK_OUT"], "w") as f:
        json.dump({"full": gc.get_stats()[2]["collections"], "count": gc.get_count(),
                   "threshold": gc.get_threshold()}, f)


if __name__ == "__main__":
    for _ in DataLoader(Zeros(), batch_size=2, num_workers=1, multiprocessing_context="spawn",
                        worker_init_fn=clock):
        pass
"""


def test_the_agents_allocations_do_not_bring_a_workers_collections_forward(tmp_path: Path) -> None:
    """The agent's own allocations in a spawned DataLoader worker (about 2,000 objects, at its start and
    at ``import torch``) do not bring the job's next full garbage collection (tens of milliseconds)
    into the worker's start, though the untraced worker is a few hundred allocations short of it at
    its init function; the thresholds are the job's again by then."""
    (tmp_path / "clock.py").write_text(GC_CLOCK)
    plain = run_python("clock.py", cwd=tmp_path, env={"CLOCK_OUT": str(tmp_path / "plain.json")})
    assert plain.returncode == 0, plain.stderr
    run = traced(tmp_path, "clock.py", env={"CLOCK_OUT": str(tmp_path / "traced.json")})
    assert run.proc.returncode == 0, run.proc.stderr
    p, t = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("plain", "traced"))
    assert t["threshold"] == p["threshold"], (p, t)
    # the untraced worker is a few hundred allocations short of its next full collection here
    assert t["full"] == p["full"], (p, t)


GC_CALLBACKS = """
import gc
raised = gc.get_threshold()[0]
seen = []
gc.callbacks.append(lambda phase, info: seen.append(phase))
gc.collect()
seen, after = seen[:], gc.get_threshold()[0]
import json
print(json.dumps({"raised": raised, "after": after, "seen": seen}))
"""


def test_the_threshold_is_the_jobs_again_at_its_next_collection(tmp_path: Path) -> None:
    """After the agent's start the young threshold is raised by what the agent allocated; the next
    collection puts it back, and a callback of the job's sees that collection start and stop."""
    (tmp_path / "cb.py").write_text(GC_CALLBACKS)
    plain = run_python("cb.py", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    run = traced(tmp_path, "cb.py")
    assert run.proc.returncode == 0, run.proc.stderr
    p, t = json.loads(plain.stdout), json.loads(run.proc.stdout.strip().splitlines()[-1])
    assert t["raised"] > p["raised"] and t["after"] == p["after"] == p["raised"], (p, t)
    for got in (p, t):  # every collection seen to start, then to stop
        assert got["seen"] and got["seen"] == ["start", "stop"] * (len(got["seen"]) // 2), (p, t)
