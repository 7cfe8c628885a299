"""On-demand actions through the control mailbox: `holoprof ctl` against a real traced training job."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import HOLOPROF, error_lines, job_env, report_json, run_holoprof
from holoprof.store import mailbox

#: A training loop that runs until a stop file appears (or a safety limit), then prints its step count.
LIVE_TRAIN = """
import os, sys, time
import torch

stop_file, limit_s = sys.argv[1], float(sys.argv[2])

# what another module may do: an allowed action without a handler yet, and a handler that raises
from holoprof.collect import control
from holoprof.store import mailbox
mailbox.ACTION_SPECS["test-unhandled"] = {}
mailbox.ACTION_SPECS["test-raises"] = {}
def _raises(job):
    raise RuntimeError("boom")
control.ACTIONS["test-raises"] = _raises

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
steps, t0 = 0, time.monotonic()
while not os.path.exists(stop_file) and time.monotonic() - t0 < limit_s:
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    steps += 1
    time.sleep(0.01)
print(f"steps={steps}", flush=True)
"""


class LiveJob:
    """`holoprof run` on LIVE_TRAIN in the background, until :meth:`stop`."""

    def __init__(self, tmp: Path, name: str = "live", limit_s: float = 150.0) -> None:
        self.tmp = tmp
        self.script = tmp / "live_train.py"
        self.script.write_text(LIVE_TRAIN)
        self.stop_file = tmp / f"stop-{name}"
        self.run_dir = str(tmp / name)
        self.proc = subprocess.Popen(
            [*HOLOPROF, "run", "--out", self.run_dir, "--no-report", "--flush-interval", "0.1", "--",
             str(self.script), str(self.stop_file), str(limit_s)],
            cwd=tmp, env=job_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.stdout = ""
        self.stderr = ""

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Until the training process has flushed steps and phases (its agent is then polling too)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()
            run = Path(self.run_dir)
            spans = {p.relative_to(run / "spans") for p in run.glob("spans/*/*/") if any(p.glob("part-*"))}
            procs = {
                p.relative_to(run / "processes") for p in run.glob("processes/*/*/") if any(p.glob("part-*"))
            }
            if spans & procs:  # a process that wrote both
                return
            time.sleep(0.2)
        raise AssertionError(f"the traced job did not start within {timeout_s} s")

    def main_pid(self) -> int:
        from holoprof.serve.ctl import live_processes

        _, procs = live_processes(self.run_dir)
        return next(p.pid for p in procs if p.role == "main")

    def stop(self) -> int:
        if self.proc.returncode is None:
            self.stop_file.touch()
            try:
                self.stdout, self.stderr = self.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.stdout, self.stderr = self.proc.communicate()
        return int(self.proc.returncode)

    def printed_steps(self) -> int:
        line = next(x for x in self.stdout.splitlines() if x.startswith("steps="))
        return int(line.split("=")[1])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveJob]:
    job = LiveJob(tmp_path_factory.mktemp("control"))
    try:
        job.wait_ready()
        yield job
    finally:
        job.stop()


def ctl(*args: str, cwd: str | os.PathLike[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_holoprof("ctl", *args, cwd=cwd, timeout=timeout)


def ctl_json(live: LiveJob, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = ctl(live.run_dir, *args, "--wait", "--json", "--timeout", "90", cwd=live.tmp)
    lines = proc.stdout.splitlines()
    assert lines, proc.stderr
    return proc, json.loads("\n".join(lines[1:]))


# --- end to end ------------------------------------------------------------------------------------------


def test_stacks_dumps_every_thread_of_the_training_process(live: LiveJob) -> None:
    proc, out = ctl_json(live, "stacks")
    assert proc.returncode == 0, proc.stderr
    req_id = proc.stdout.splitlines()[0]
    assert out["request"]["id"] == req_id
    (state,) = [s for s in out["states"] if s["role"] == "main"]
    assert state["state"] == "done", state
    (path,) = state["artifact_paths"]
    assert os.path.basename(path) == f"stacks-{req_id}-{state['host']}-{state['pid']}.txt"
    text = Path(path).read_text()
    assert '"MainThread"' in text and "live_train.py" in text, text
    assert '"holoprof-writer"' in text
    # the request was claimed once: one state file for this process
    folder = Path(live.run_dir, "control", req_id)
    assert [p.name for p in folder.iterdir()] == [f"{state['host']}-{state['pid']}.state"]


def test_deep_profile_of_five_steps_mid_run(live: LiveJob) -> None:
    proc, out = ctl_json(live, "deep-profile", "--steps", "5")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (state,) = out["states"]
    assert state["state"] == "done", state
    assert state["info"]["steps"] == 5 and state["info"]["partial"] is False
    paths = state["artifact_paths"]
    trace = next(p for p in paths if not p.endswith(".summary.json"))
    summary = next(p for p in paths if p.endswith(".summary.json"))
    assert os.path.basename(trace).startswith(f"deep-profile-{out['request']['id']}-")
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::addmm" in names
    assert sum(1 for n in names if str(n).startswith("ProfilerStep#")) == 5
    doc = json.loads(Path(summary).read_text())
    assert doc["steps"] == 5 and doc["warmup_steps"] == 1
    ops = {o["name"]: o for o in doc["ops"]}
    assert len(doc["ops"]) <= 30
    assert "aten::addmm" in ops or "aten::linear" in ops, list(ops)
    addmm = ops.get("aten::addmm") or ops["aten::linear"]
    assert addmm["calls"] >= 5 and addmm["self_cpu_us"] > 0 and "16" in addmm["input_shapes"]
    selfs = [o["self_cpu_us"] for o in doc["ops"]]
    assert selfs == sorted(selfs, reverse=True)


def test_targeting_a_pid_reaches_only_that_process(live: LiveJob) -> None:
    pid = live.main_pid()
    proc, out = ctl_json(live, "stacks", "--pid", str(pid))
    assert proc.returncode == 0, proc.stderr
    assert [s["pid"] for s in out["states"]] == [pid]
    assert out["request"]["target"] == {"pid": pid}


def _hand_request(live: LiveJob, req_id: str, action: str, params: dict[str, Any]) -> dict[str, Any]:
    """Write a request file directly (as another tool would) and wait for its answer."""
    req = {"id": req_id, "action": action, "target": None, "params": params, "created_ns": time.time_ns()}
    Path(live.run_dir, "control", f"req-{req_id}.json").write_text(json.dumps(req))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = mailbox.request_states(live.run_dir, req_id)
        if states and states[0]["state"] in mailbox.FINAL_STATES:
            break
        time.sleep(0.2)
    (state,) = mailbox.request_states(live.run_dir, req_id)
    return state


def test_an_allowed_action_without_a_handler_fails_with_a_reason(live: LiveJob) -> None:
    state = _hand_request(live, "unhandled-1", "test-unhandled", {})
    assert state["state"] == "failed" and state["reason"] == mailbox.NOT_AVAILABLE


def test_a_handler_that_raises_fails_the_request_not_the_job(live: LiveJob) -> None:
    state = _hand_request(live, "raises-1", "test-raises", {})
    assert state["state"] == "failed" and state["reason"] == "RuntimeError: boom"
    proc, out = ctl_json(live, "stacks")  # the mailbox still works
    assert proc.returncode == 0 and out["states"][0]["state"] == "done"


def test_memory_snapshot_and_io_trace_answer(live: LiveJob) -> None:
    """Both are on the allow-list; where no module handles them yet they fail with a clear reason."""
    other = mailbox.write_request(live.run_dir, "memory-snapshot")
    proc, out = ctl_json(live, "io-trace", "--seconds", "1")
    (io,) = out["states"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = mailbox.request_states(live.run_dir, other["id"])
        if states and states[0]["state"] in mailbox.FINAL_STATES:
            break
        time.sleep(0.2)
    (mem,) = mailbox.request_states(live.run_dir, other["id"])
    for state in (io, mem):
        assert state["state"] in mailbox.FINAL_STATES
        if state["state"] == "failed":
            assert state["reason"], state
    assert proc.returncode == (0 if io["state"] == "done" else 1)


def test_a_request_written_by_hand_with_bad_params_is_refused_by_the_agent(live: LiveJob) -> None:
    """The agent validates too: a request file that skipped the command line's checks is refused."""
    state = _hand_request(live, "handmade-1", "deep-profile", {"steps": 100000})
    assert state["state"] == "refused" and "steps must be between 1 and 100" in state["reason"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("explode",), "unknown action 'explode'; the actions are: stacks, deep-profile"),
        (("deep-profile", "--steps", "0"), "steps must be between 1 and 100"),
        (("deep-profile", "--steps", "five"), "invalid int value: 'five'"),
        (("io-trace", "--seconds", "601"), "seconds must be between 1 and 600"),
        (("stacks", "--steps", "3"), "stacks takes no parameter 'steps'"),
        (("stacks", "--wait", "--timeout", "0"), "--timeout must be a positive number"),
    ],
)
def test_bad_input_is_one_line_and_status_2(live: LiveJob, args: tuple[str, ...], expected: str) -> None:
    before = set(os.listdir(os.path.join(live.run_dir, "control")))
    proc = ctl(live.run_dir, *args, cwd=live.tmp)
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("holoprof: error: "), proc.stderr
    assert expected in lines[0]
    assert set(os.listdir(os.path.join(live.run_dir, "control"))) == before, "nothing was requested"


def test_validation_bounds_and_defaults() -> None:
    assert mailbox.validate("deep-profile", None) == ("deep-profile", {"steps": 5}, None)
    assert mailbox.validate("io-trace", {"seconds": 600}, {"rank": 1}) == (
        "io-trace",
        {"seconds": 600},
        {"rank": 1},
    )
    for action, params, target in (
        ("deep-profile", {"steps": True}, None),
        ("deep-profile", {"steps": 1.5}, None),
        ("deep-profile", [], None),
        ("stacks", {}, {"pid": -1}),
        ("stacks", {}, {"host": "x"}),
        ("stacks", {}, {"role": "../x"}),
        ("memory-snapshot", {"max_entries": 10**9}, None),
    ):
        with pytest.raises(mailbox.RequestError):
            mailbox.validate(action, params, target)


def test_the_job_is_unchanged_by_the_actions(live: LiveJob) -> None:
    """Last: stop the job; it exits normally and every step it ran is a step in the report."""
    assert live.stop() == 0, live.stderr
    doc = report_json(live.run_dir)
    assert doc["steps"]["count"] == live.printed_steps()
    assert not doc["run"]["errors"], doc["run"]["errors"]
    assert "failed" not in live.stderr and "Traceback" not in live.stderr, live.stderr
    # a finished run takes no more requests
    proc = ctl(live.run_dir, "stacks", cwd=live.tmp)
    assert proc.returncode == 2
    assert "is not running (status: finished)" in proc.stderr
    proc = ctl(str(live.tmp), "stacks", cwd=live.tmp)
    assert proc.returncode == 2 and "is not a holoprof run" in proc.stderr
