"""The control mailbox against bad and hostile request files: each is refused with a reason, none blocks
or turns off the mailbox, none makes a process read or write outside its run directory, and the
dashboard's actions endpoint keeps answering. A real traced job, a real server, real files."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import holoprof
from holoprof.agent.core import Agent
from holoprof.collect import control
from holoprof.store import mailbox
from test_serve_api import Env, live_env


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from live_env(tmp_path_factory.mktemp("mailbox"))


def request_doc(req_id: str, action: str = "stacks") -> dict[str, Any]:
    return {"id": req_id, "action": action, "target": None, "params": {}, "created_ns": time.time_ns()}


def control_dir(env: Env) -> Path:
    return Path(env.live.run_dir, "control")


def wait_final(env: Env, req_id: str, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = mailbox.request_states(env.live.run_dir, req_id)
        if states and states[0]["state"] in mailbox.FINAL_STATES:
            (state,) = states
            return state
        time.sleep(0.1)
    raise AssertionError(f"request {req_id} was not answered within {timeout_s} s")


def actions_answer(env: Env) -> dict[str, Any]:
    r = env.client.get("/api/runs/live/actions")
    assert r.status == 200, r.body
    doc = r.json()
    assert isinstance(doc, dict)
    return doc


def a_stacks_request_is_answered(env: Env) -> dict[str, Any]:
    """The mailbox still works: a request through the dashboard is done."""
    r = env.client.post("/api/runs/live/actions", {"action": "stacks", "params": {}, "target": None})
    assert r.status == 201, r.body
    state = wait_final(env, r.json()["id"])
    assert state["state"] == "done", state
    return state


def _write(data: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(data)


def _request(req_id: str, **changes: Any) -> Callable[[Path], None]:
    """A request made when the test writes it (so that it is newer than the job)."""
    return lambda p: p.write_text(json.dumps({**request_doc(req_id), **changes}))


def _nested(depth: int) -> bytes:
    return b'{"id": "x", "params": ' + b"[" * depth + b"]" * depth + b"}"


BAD_REQUESTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "invalid-json": (_write(b'{"id": "invalid-json", "action": '), "not valid JSON"),
    "not-utf8": (_write(b'{"id": "\xff\xfe"}'), "not valid JSON"),
    "array": (_write(b'["stacks"]'), "must be a JSON object, not list"),
    "number": (_write(b"42"), "must be a JSON object, not int"),
    "nested": (_write(_nested(5000)), "nests deeper than 8 levels"),
    "oversized": (_write(b'{"pad": "' + b"x" * (mailbox.MAX_REQUEST_BYTES + 10) + b'"}'), "larger than"),
    "directory": (lambda p: p.mkdir(), "a directory; only regular files are read"),
    "fifo": (lambda p: os.mkfifo(p), "a FIFO; only regular files are read"),
    "wrong-id": (_request("another-id"), "is not the one in its file name"),
    "no-time": (_request("no-time", created_ns="now"), "created_ns"),
    "bad-target": (_request("bad-target", target={"host": "x"}), "invalid request: target must be null"),
    "bad-action": (_request("bad-action", action="rm -rf"), "invalid request: unknown action 'rm -rf'"),
}


@pytest.mark.parametrize("kind", list(BAD_REQUESTS))
def test_a_bad_request_file_is_refused_with_its_reason(env: Env, kind: str) -> None:
    make, reason = BAD_REQUESTS[kind]
    make(control_dir(env) / f"req-{kind}.json")
    state = wait_final(env, kind)
    assert state["state"] == "refused", state
    assert reason in state["reason"], state
    assert state["pid"] == env.live.main_pid()
    actions_answer(env)  # never a 500
    a_stacks_request_is_answered(env)  # one bad request never disables the mailbox


def test_a_request_linked_to_a_file_outside_the_run_is_not_executed(env: Env) -> None:
    outside = env.root / "outside-request.json"
    outside.write_text(json.dumps(request_doc("linked-1")))
    (control_dir(env) / "req-linked-1.json").symlink_to(outside)
    state = wait_final(env, "linked-1")
    assert state["state"] == "refused" and "symbolic link" in state["reason"], state
    assert not list(Path(env.live.run_dir, "artifacts").glob("stacks-linked-1-*")), "it did not run"
    doc = actions_answer(env)
    assert all(r["id"] != "linked-1" for r in doc["requests"]), "the server does not read it either"


def test_a_linked_request_folder_never_redirects_the_state_files(env: Env) -> None:
    outside = env.root / "outside-dir"
    outside.mkdir()
    (outside / "planted.state").write_text(json.dumps({"state": "done", "reason": "planted"}))
    (control_dir(env) / "redirect-1").symlink_to(outside, target_is_directory=True)
    (control_dir(env) / "req-redirect-1.json").write_text(json.dumps(request_doc("redirect-1")))
    a_stacks_request_is_answered(env)  # written after it: by now the process has taken redirect-1
    assert [p.name for p in outside.iterdir()] == ["planted.state"], "nothing written outside the run"
    assert mailbox.request_states(env.live.run_dir, "redirect-1") == []
    (req,) = [r for r in actions_answer(env)["requests"] if r["id"] == "redirect-1"]
    assert req["states"] == [], "the server does not read through the link"


def test_a_fifo_never_blocks_recording(env: Env) -> None:
    os.mkfifo(control_dir(env) / "req-fifo-2.json")

    def spans() -> int:
        return int(holoprof.load(env.live.run_dir).rows("SELECT count(*) FROM spans")[0][0])

    before = spans()
    a_stacks_request_is_answered(env)
    deadline = time.monotonic() + 30
    while spans() <= before:
        assert time.monotonic() < deadline, "the writer thread stopped flushing"
        time.sleep(0.2)
    assert wait_final(env, "fifo-2")["state"] == "refused"


def test_the_job_ran_unchanged_with_the_control_collector_on(env: Env) -> None:
    """Last: the job exits normally, no collector was turned off, nothing was said on stderr."""
    assert env.live.stop() == 0, env.live.stderr
    assert "collector failed" not in env.live.stderr, env.live.stderr
    assert "Traceback" not in env.live.stderr, env.live.stderr


# --- without a job: the folders themselves -----------------------------------------------------------------


def test_a_control_folder_that_is_a_link_is_neither_read_nor_written(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (run / "control").symlink_to(outside, target_is_directory=True)
    (outside / "req-out-1.json").write_text(json.dumps(request_doc("out-1")))
    agent = Agent(str(run))
    col = control.ControlCollector(agent)
    col.poll()
    assert col.enabled and not agent.errors
    assert [p.name for p in outside.iterdir()] == ["req-out-1.json"], "nothing read or written there"
    assert mailbox.list_requests(str(run)) == []
    assert mailbox.read_request(str(run), "out-1") is None
    with pytest.raises(OSError):
        mailbox.write_request(str(run), "stacks")
    assert [p.name for p in outside.iterdir()] == ["req-out-1.json"]


# --- fuzzing the request parser ---------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=40,
)


def _depth(doc: Any) -> int:
    if isinstance(doc, list):
        return 1 + max((_depth(v) for v in doc), default=0)
    if isinstance(doc, dict):
        return 1 + max((_depth(v) for v in doc.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=mailbox.MAX_REQUEST_BYTES + 64))
def test_any_bytes_parse_to_an_object_or_a_refusal(data: bytes) -> None:
    try:
        doc = mailbox.parse_request(data)
    except mailbox.RequestError as exc:
        assert str(exc)
    else:
        assert isinstance(doc, dict)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_any_json_document_is_parsed_or_refused_by_its_nesting(doc: Any) -> None:
    data = json.dumps(doc).encode()
    try:
        parsed = mailbox.parse_request(data)
    except mailbox.RequestError as exc:
        assert not isinstance(doc, dict) or _depth(doc) > mailbox.MAX_REQUEST_DEPTH, exc
    else:
        assert parsed == doc and _depth(doc) <= mailbox.MAX_REQUEST_DEPTH


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=100_000), st.sampled_from([b"[", b'{"a":']))
def test_deep_nesting_is_refused_before_parsing(depth: int, opener: bytes) -> None:
    close = b"]" if opener == b"[" else b"}"
    data = opener * depth + b"1" + close * depth
    if len(data) > mailbox.MAX_REQUEST_BYTES:
        expected = "larger than"
    elif depth > mailbox.MAX_REQUEST_DEPTH:
        expected = "nests deeper than"
    elif opener != b"[" and depth:
        return assert_object(mailbox.parse_request(data))
    else:
        expected = "must be a JSON object"
    with pytest.raises(mailbox.RequestError, match=expected):
        mailbox.parse_request(data)


def assert_object(doc: Any) -> None:
    assert isinstance(doc, dict) and "a" in doc


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=12), _json), _json, _json)
def test_validation_returns_a_request_or_a_refusal(action: Any, params: Any, target: Any) -> None:
    try:
        name, norm, tgt = mailbox.validate(action, params, target)
    except mailbox.RequestError as exc:
        assert str(exc)
    else:
        assert name in mailbox.ACTION_SPECS and isinstance(norm, dict)
        assert tgt is None or (isinstance(tgt, dict) and len(tgt) == 1)
