"""The dashboard in a real browser: headless Chromium driven through its DevTools protocol.

Needs Debian's ``chromium`` package (``apt-get install -y chromium``); skipped without it. The
DevTools client is a few lines of standard-library websocket code below.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from holoprof.serve.app import Server, make_server
from test_control import LiveJob

CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="needs Debian's chromium (apt-get install -y chromium)"
)


class DevTools:
    """A minimal Chrome DevTools protocol client over one websocket (RFC 6455, client side)."""

    def __init__(self, ws_url: str) -> None:
        rest = ws_url.split("://", 1)[1]
        hostport, path = rest.split("/", 1)
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            assert chunk, "the browser closed the DevTools connection"
            head += chunk
        assert b" 101 " in head.split(b"\r\n", 1)[0], head
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        self.sock.close()

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "the browser closed the DevTools connection"
            buf += chunk
        return buf

    def _recv_message(self) -> dict[str, Any]:
        data = b""
        while True:
            b0, b1 = self._recv_exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            payload = self._recv_exact(n)
            opcode = b0 & 0x0F
            if opcode in (0x1, 0x0):
                data += payload
                if b0 & 0x80:
                    doc: dict[str, Any] = json.loads(data)
                    return doc
            elif opcode == 0x8:
                raise AssertionError("the browser closed the DevTools connection")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mid = self.next_id
        payload = json.dumps({"id": mid, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x81])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)
        while True:
            msg = self._recv_message()
            if msg.get("id") == mid:
                assert "error" not in msg, msg
                result: dict[str, Any] = msg.get("result", {})
                return result
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(json.dumps(p.get("args", []))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(json.dumps(p["entry"])[:500])
        return out


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveJob, Server]]:
    root = tmp_path_factory.mktemp("browser")
    job = LiveJob(root)
    server: Server | None = None
    try:
        job.wait_ready()
        server = make_server(job.run_dir, port=0)  # a single run directory
        t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        t.start()
        yield job, server
    finally:
        job.stop()
        if server is not None:
            server.shutdown()
            server.server_close()


@contextmanager
def chromium(profile: Path, width: int, height: int) -> Iterator[DevTools]:
    """A headless Chromium on a blank page with the profile folder ``profile``, driven over DevTools
    (Runtime, Log and Page enabled); closed, and its profile removed, on exit."""
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    tools: DevTools | None = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            assert proc.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        tools = DevTools(pages[0]["webSocketDebuggerUrl"])
        for domain in ("Runtime", "Log", "Page"):
            tools.send(f"{domain}.enable")
        yield tools
    finally:
        if tools is not None:
            tools.close()
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    with chromium(tmp_path_factory.mktemp("chromium-profile"), 1400, 1800) as tools:
        yield tools


def _poll(fn: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.25)
    return fn()


def test_dashboard_of_a_running_job(live_server: tuple[LiveJob, Server], browser: DevTools) -> None:
    server = live_server[1]
    browser.send("Page.navigate", url=f"http://127.0.0.1:{server.port}/?token={server.token}")

    # the page loads, signs in by cookie, drops the token from the address bar, shows the run
    browser.wait_for("document.querySelector('#step-chart .uplot') !== null", 60, "the step chart")
    assert "token=" not in browser.eval("location.href")
    assert browser.eval("document.getElementById('run-status').textContent") == "running"
    assert browser.eval("document.querySelectorAll('#processes-table tbody tr').length") == 1

    # the step chart grows by itself while the job runs
    first = float(browser.eval("document.getElementById('step-chart').dataset.lastStep"))
    grown = _poll(
        lambda: float(browser.eval("document.getElementById('step-chart').dataset.lastStep")) > first, 20
    )
    assert grown, "the step chart did not grow while the job ran"

    # the recent steps: one uPlot chart, a row per step; new steps go into the same chart (its phases
    # unchanged), no chart left behind
    timeline = (
        "(() => { const el = document.getElementById('timeline'); const c = el.querySelector('.uplot canvas');"
        " if (c && !c.dataset.seen) c.dataset.seen = String(Date.now());"
        " return {builds: el.dataset.builds, rows: el.dataset.rows, labels: el.dataset.labels, phases: el.dataset.phases,"
        " seen: c ? c.dataset.seen : null, charts: el.querySelectorAll('.uplot').length,"
        " tips: el.querySelectorAll('.chart-tip').length}; })()"
    )
    before = browser.wait_for(
        f"(() => {{ const r = {timeline}; return r.seen ? r : null; }})()", 30, "the recent steps"
    )
    assert int(before["rows"]) >= 1 and (before["charts"], before["tips"]) == (1, 1), before
    after = _poll(
        lambda: (lambda r: r if r["labels"] != before["labels"] else None)(browser.eval(timeline)), 20
    )
    assert after, "the recent steps did not change while the job ran"
    assert (after["charts"], after["tips"]) == (1, 1), after
    if after["phases"] == before["phases"]:
        assert (after["builds"], after["seen"]) == (before["builds"], before["seen"]), "the chart was rebuilt"
    assert browser.eval("document.querySelectorAll('svg').length") == 0, "SVG on the dashboard"

    # the counted step's FLOPs and the goodput so far
    browser.wait_for("document.querySelector('#compute-card') !== null", 60, "the compute card")
    card = browser.eval("document.getElementById('compute-card').textContent")
    assert "FLOPs per step" in card and "goodput" in card and "startup" in card, card

    # clicking deep profile gives the op table and a downloadable trace
    browser.eval(
        "document.getElementById('in-steps').value = '3'; document.getElementById('btn-deep-profile').click()"
    )
    browser.wait_for("document.querySelectorAll('#op-table tbody tr').length > 0", 90, "the op table")
    ops = browser.eval(
        "[...document.querySelectorAll('#op-table tbody tr td:first-child')].map(td => td.textContent)"
    )
    assert any(o in ("aten::addmm", "aten::linear") for o in ops), ops
    href = browser.eval("document.getElementById('trace-link').getAttribute('href')")
    assert href.startswith("/api/runs/") and "/artifacts/deep-profile-" in href
    download = browser.eval(
        f"fetch({json.dumps(href)}).then(async r => [r.status, r.headers.get('content-disposition'), "
        "(await r.json()).traceEvents.length])"
    )
    status, disposition, events = download
    assert status == 200 and disposition.startswith("attachment") and events > 0
    assert browser.eval("document.querySelectorAll('#requests-table .badge.done').length") >= 1

    assert browser.errors() == [], "console errors on the dashboard"


# --- text from the job, many ranks ----------------------------------------------------------------------

#: A file path and arguments of a traced job that a browser would take for markup.
MARKUP_FILE = os.path.join("in[bold]", "a[/x]<script>alert(1)</script>&amp;.bin")
MARKUP_ARGS = ["[link=http://e]x[/link]", "[bold]", "<script>alert(2)</script>&"]
RANKS = 80


@pytest.fixture(scope="module")
def served_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """A runs folder served: ``markup`` (a traced job with markup and HTML in its file path and
    arguments), ``ranks`` (a generated run of RANKS ranks) and ``hosts`` (HOSTS hosts × 2 ranks).
    Yields the server and the data folder."""
    from conftest import run_holoprof, script
    from holoprof.bench.synth import generate_run
    from holoprof.bench.synth_hosts import generate_hosts_run

    root = tmp_path_factory.mktemp("served")
    data = str(root.parent / (root.name + "-data"))
    proc = run_holoprof(
        "run", "--out", str(root / "markup"), "--no-report", "--", script("markup_names.py"), data, *MARKUP_ARGS,
        cwd=root.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    generate_run(str(root / "ranks"), 2, ranks=RANKS, comm=True)
    generate_hosts_run(str(root / "hosts"), HOSTS, 2, 3, samples_per_host=10)
    server = make_server(str(root), port=0)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        yield server, data
    finally:
        server.shutdown()
        server.server_close()


def test_dashboard_shows_text_from_the_job_as_text(
    served_runs: tuple[Server, str], browser: DevTools
) -> None:
    server, data = served_runs
    browser.events.clear()
    browser.send("Page.navigate", url=f"http://127.0.0.1:{server.port}/?token={server.token}#/run/markup")
    browser.wait_for("document.querySelector('#io-card') !== null", 60, "the I/O card")
    text = browser.eval("document.body.innerText")
    assert os.path.join(data, MARKUP_FILE) in text  # the path, every tag and entity as written
    assert " ".join(MARKUP_ARGS) in browser.eval("document.getElementById('run-sub').textContent")
    assert " ".join(MARKUP_ARGS) in text  # the processes table
    injected = browser.eval(
        "[...document.querySelectorAll('#app script, #app b, #app a[href^=\"http://e\"]')].length"
    )
    assert injected == 0, "an element made of the job's text"
    assert browser.errors() == [], "console errors on the dashboard"


def test_dashboard_summarizes_many_ranks(served_runs: tuple[Server, str], browser: DevTools) -> None:
    server = served_runs[0]
    browser.events.clear()
    browser.send("Page.navigate", url=f"http://127.0.0.1:{server.port}/?token={server.token}#/run/ranks")
    browser.wait_for("document.querySelector('#comm-card') !== null", 60, "the ranks table")
    report = browser.eval("fetch('/api/runs/ranks/report').then(r => r.json())")
    assert len(report["communication"]["per_rank"]) == RANKS, "the API keeps every rank"
    rows = browser.eval("[...document.querySelectorAll('#comm-card tbody tr')].map(tr => tr.innerText)")
    assert len(rows) == 30 and rows[-1].startswith(f"… and {RANKS - 29} more ranks"), rows[-1]
    ranks = [int(r.split()[0]) for r in rows[:-1]]
    assert ranks == sorted(ranks), "ranks in numeric order"
    slowest = sorted(report["communication"]["per_rank"], key=lambda r: -r["step_median_s"])[:29]
    assert set(ranks) == {r["rank"] for r in slowest}
    procs = browser.eval(
        "[...document.querySelectorAll('#processes-table tbody tr')].map(tr => tr.innerText)"
    )
    assert len(procs) == 30 and procs[-1].startswith("… and "), procs[-1]
    # the rank × step heatmap: every rank a row, one column per step; the map chosen is drawn
    heat = browser.wait_for(
        "(() => { const el = document.getElementById('rank-heatmap'); return el && el.dataset.ranks"
        " ? [el.dataset.ranks, el.dataset.columns, el.dataset.map] : null; })()",
        30, "the rank × step heatmap",
    )  # fmt: skip
    assert heat == [str(RANKS), str(len(report["stragglers"]["heatmap"]["steps"])), "step_s"], heat
    browser.eval(
        "(() => { const s = document.querySelector('#rank-heatmap select'); s.value = 'compute_s';"
        " s.dispatchEvent(new Event('change')); })()"
    )
    assert browser.eval("document.getElementById('rank-heatmap').dataset.map") == "compute_s"
    assert browser.errors() == [], "console errors on the dashboard"


HOSTS = 12


def test_dashboard_summarizes_many_hosts(served_runs: tuple[Server, str], browser: DevTools) -> None:
    server = served_runs[0]
    browser.events.clear()
    browser.send("Page.navigate", url=f"http://127.0.0.1:{server.port}/?token={server.token}#/run/hosts")
    browser.wait_for("document.querySelector('#hosts-card') !== null", 60, "the hosts table")
    report = browser.eval("fetch('/api/runs/hosts/report').then(r => r.json())")
    hosts = report["resources"]["hosts"]
    assert len(hosts) == HOSTS, "the API keeps every host"
    rows = browser.eval("[...document.querySelectorAll('#hosts-table tbody tr')].map(tr => tr.innerText)")
    assert len(rows) == 9 and rows[4].startswith(f"… {HOSTS - 8} more hosts"), rows
    shown = browser.eval(
        "[...document.querySelectorAll('#hosts-table tr[data-host]')].map(tr => tr.dataset.host)"
    )
    by_cpu = sorted(hosts, key=lambda h: -h["cpu_percent"]["mean"])
    assert shown == [h["host"] for h in by_cpu[:4] + by_cpu[-4:]], shown
    spread = browser.eval("[...document.querySelectorAll('#hosts-card .spread')].map(d => d.innerText)")
    assert any(line.startswith("CPU:") and f"over {HOSTS} hosts" in line for line in spread), spread
    assert browser.errors() == [], "console errors on the dashboard"
