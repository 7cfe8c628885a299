"""`holoprof serve` at its limits, on real sockets: connections that idle or send half a request are
closed after the timeout, many idle connections cost a bounded number of threads (the excess is
answered 503 at once), a long answer is not cut by the timeout, and /metrics answers from per-run
summaries kept in memory and on disk."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_holoprof
from holoprof.bench.synth import generate_run
from holoprof.serve import app
from holoprof.serve.app import Server, make_server
from holoprof.store.chunks import write_chunk
from test_serve_api import Client

#: Generous bound on "closed eventually" (the timeouts below are well under a second).
EVENTUALLY_S = 60.0


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("served")
    generate_run(str(root / "a"), steps=30, seed=1)
    generate_run(str(root / "b"), steps=40, ranks=2, io_files=1, seed=2)
    generate_run(str(root / "c"), steps=50, seed=3)
    return root


@contextlib.contextmanager
def serving(root: Path, **kw: Any) -> Iterator[Server]:
    server = make_server(str(root), port=0, **kw)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        t.join(10)


def connect(server: Server, send: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=EVENTUALLY_S)
    if send:
        s.sendall(send)
    return s


def read_to_end(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a timeout here fails the test)."""
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def wait_until(cond: Any, what: str) -> None:
    deadline = time.monotonic() + EVENTUALLY_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def samples(text: str) -> list[Any]:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


# --- connections ----------------------------------------------------------------------------------------
def test_a_client_gone_before_its_refusal_leaves_no_traceback(
    runs_root: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A request refused (here: a foreign Host header) by a client that closed its end first: writing
    the refusal fails (a broken pipe), which the server takes as the client gone, quietly, as it does
    for an answer that is not a refusal. The request comes over a socket pair whose other end is
    closed before the server answers, so the write always fails."""
    server = make_server(str(runs_root), port=0)
    try:
        ours, theirs = socket.socketpair()
        theirs.sendall(b"GET / HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        theirs.close()
        server.RequestHandlerClass(ours, ("127.0.0.1", 1), server)  # handles the request, as a thread would
        ours.close()
    finally:
        server.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_idle_silent_and_half_sent_connections_are_closed_after_the_timeout(runs_root: Path) -> None:
    with serving(runs_root, request_timeout_s=0.5) as server:
        client = Client(server)
        silent = [connect(server) for _ in range(5)]
        half = [
            connect(server, b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % server.port)
            for _ in range(5)
        ]
        # a keep-alive connection: one request answered, then nothing more
        kept = connect(server)
        kept.sendall(
            f"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Authorization: Bearer {client.token}\r\n\r\n".encode()
        )
        for s in silent + half:
            assert read_to_end(s) == b""  # closed without an answer
        answered = read_to_end(kept)
        assert answered.startswith(b"HTTP/1.1 200 ") and b'"runs"' in answered
        wait_until(lambda: server.connections() == 0, "the server still holds connections")
        assert client.get("/api/runs").status == 200  # and serves on
        for s in [*silent, *half, kept]:
            s.close()


def test_a_client_trickling_its_headers_is_closed_all_the_same(runs_root: Path) -> None:
    """The timeout bounds the whole request, not each read: a byte every 50 ms does not keep a
    connection whose request is due within 0.5 s."""
    with serving(runs_root, request_timeout_s=0.5) as server:
        s = connect(server, b"GET /api/runs HTTP/1.1\r\nX-Slow: ")
        closed = False
        deadline = time.monotonic() + EVENTUALLY_S
        while not closed and time.monotonic() < deadline:
            try:
                s.sendall(b"a")
            except OSError:  # broken pipe or reset: the server has closed it
                closed = True
                break
            s.settimeout(0.05)
            try:
                closed = s.recv(1) == b""
            except TimeoutError:
                pass
            except OSError:
                closed = True
        assert closed, "a trickling client kept its connection"
        s.close()


def test_threads_stay_bounded_under_many_idle_connections(runs_root: Path) -> None:
    before = threading.active_count()
    with serving(runs_root, request_timeout_s=EVENTUALLY_S, max_connections=4) as server:
        client = Client(server)
        idle = [connect(server) for _ in range(60)]
        wait_until(lambda: server.connections() == 4, "4 connections served")
        wait_until(lambda: len(readable(idle)) == 56, "56 connections answered")
        # the serving loop, one thread per served connection; the other 56 were answered without one
        assert threading.active_count() <= before + 1 + 4
        for s in readable(idle):
            answer = read_to_end(s)
            assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer, answer
            assert b"Connection: close" in answer and b"at most 4 connections" in answer
        r = client.get("/api/runs")  # full: answered at once, with when to retry
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        for s in idle:
            s.close()
        wait_until(lambda: server.connections() == 0, "closed connections still held")
        assert client.get("/api/runs").status == 200
        assert client.get("/api/runs", auth=False).status == 401  # the token is still required
    wait_until(lambda: threading.active_count() <= before, "threads left after the server closed")


def readable(socks: list[socket.socket]) -> list[socket.socket]:
    """The connections on which the server has sent something or closed."""
    poll = select.poll()
    for s in socks:
        poll.register(s, select.POLLIN)
    ready = {fd for fd, _ in poll.poll(0)}
    return [s for s in socks if s.fileno() in ready]


def test_a_long_answer_is_not_cut_by_the_request_timeout(tmp_path: Path) -> None:
    """Answering has no deadline while the client reads: a download read slowly over several times
    the timeout arrives whole."""
    root = tmp_path / "runs"
    generate_run(str(root / "r"), steps=10)
    art = root / "r" / "artifacts"
    art.mkdir(exist_ok=True)
    payload = os.urandom(4 << 20)
    (art / "big.bin").write_bytes(payload)
    with serving(root, request_timeout_s=1.0) as server:
        s = connect(server)
        s.sendall(
            f"GET /api/runs/r/artifacts/big.bin HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Authorization: Bearer {server.token}\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        started = time.monotonic()
        while chunk := s.recv(65536):
            data += chunk
            time.sleep(0.02)  # about 3 MB/s at most: the 4 MiB take longer than the timeout
        took = time.monotonic() - started
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and body == payload
        assert took > 1.0, "the download was not slower than the timeout; the test proves nothing"
        s.close()


# --- /metrics from summaries ----------------------------------------------------------------------------


@pytest.fixture
def unhurried(monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics waits for every summary it lacks (however loaded the machine is)."""
    monkeypatch.setattr(app, "METRICS_BUILD_BUDGET_S", 600.0)


@pytest.mark.usefixtures("unhurried")
def test_metrics_answers_from_summaries_stored_on_disk(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    with serving(runs_root, summaries=str(cache)) as server:
        first = Client(server).get("/metrics")
    assert first.status == 200
    assert {s.labels["run"] for s in samples(first.body.decode()) if "run" in s.labels} == {"a", "b", "c"}
    assert len(list(cache.glob("*.json"))) == 3  # one per finished run

    def no_build(*a: Any, **kw: Any) -> None:
        raise AssertionError("a report was built although the summary was stored")

    monkeypatch.setattr(app, "build_report", no_build)
    with serving(runs_root, summaries=str(cache)) as server:
        client = Client(server)
        again = client.get("/metrics")
        listed = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    assert again.status == 200 and again.body == first.body
    assert listed["a"]["steps"] == 30 and listed["c"]["steps"] == 50  # the list shows them too


@pytest.mark.usefixtures("unhurried")
def test_a_finished_runs_summary_follows_a_change_of_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "runs"
    generate_run(str(root / "r"), steps=20)
    runs = app.Runs(str(root), str(tmp_path / "cache"))

    def steps(text: str) -> float:
        (v,) = [s.value for s in samples(text) if s.name == "holoprof_steps_total"]
        return v

    assert steps(runs.metrics_text()) == 20
    start = 2 * 10**18
    write_chunk(str(root / "r"), "spans", {
        "host": ["synth"], "pid": [10_000], "tid": [10_000], "span_id": [10**12], "kind": ["step"],
        "name": ["step"], "start_ns": [start], "end_ns": [start + 10**6], "step": [10**7],
    })  # fmt: skip
    monkeypatch.setattr(app, "RECHECK_S", 0.0)  # checked at once, and rebuilt at once
    monkeypatch.setattr(app, "REPORT_MIN_INTERVAL_S", 0.0)
    monkeypatch.setattr(app, "REPORT_DUTY", 0.0)
    assert steps(runs.metrics_text()) == 21
    again = app.Runs(str(root), str(tmp_path / "cache"))  # and the stored one was replaced
    monkeypatch.setattr(app, "build_report", None)
    assert steps(again.metrics_text()) == 21


def test_a_first_scrape_leaves_runs_it_has_not_summarized_yet_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pending until the background thread has built them; a run that cannot be read is not
    pending once that is known, and is left out as before."""
    root = tmp_path / "runs"
    for name in ("a", "b"):
        generate_run(str(root / name), steps=20)
    (root / "broken").mkdir()
    (root / "broken" / "manifest.json").write_text("{ not json")
    monkeypatch.setattr(app, "METRICS_BUILD_BUDGET_S", 0.0)  # answer at once with what is ready
    with serving(root) as server:
        client = Client(server)
        first = samples(client.get("/metrics").body.decode())
        listed = {s.labels["run"] for s in first if s.name == "holoprof_run_running"}
        (pending,) = [s.value for s in first if s.name == "holoprof_runs_pending"]
        assert pending >= 1 and len(listed) + pending == 3

        def complete() -> bool:
            got = samples(client.get("/metrics").body.decode())
            runs = {s.labels["run"] for s in got if s.name == "holoprof_run_running"}
            return runs == {"a", "b"} and not any(s.name == "holoprof_runs_pending" for s in got)

        wait_until(complete, "the background thread did not summarize every run")
        assert client.get("/api/runs/broken/report").status == 409


@pytest.mark.parametrize(
    "args,message",
    [(["--timeout", "0"], "--timeout"), (["--max-connections", "0"], "--max-connections")],
)
def test_bad_limits_are_refused_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run_holoprof("serve", str(tmp_path), *args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert proc.stderr.startswith("holoprof: error: ")


@pytest.mark.usefixtures("unhurried")
def test_summary_files_that_are_not_ours_are_ignored(runs_root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    runs = app.Runs(str(runs_root), str(cache))
    text = runs.metrics_text()
    for f in cache.glob("*.json"):
        entry = json.loads(f.read_text())
        entry["summary"]["samples"] = "not samples"
        f.write_text(json.dumps(entry))
    assert app.Runs(str(runs_root), str(cache)).metrics_text() == text
    for f in cache.glob("*.json"):
        f.write_text("[" * 100_000)
    assert app.Runs(str(runs_root), str(cache)).metrics_text() == text
