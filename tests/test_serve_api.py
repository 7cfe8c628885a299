"""`holoprof serve`: the JSON API, its security (token, traversal, cross-site, bodies) and /metrics,
against a real traced training job."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import HOLOPROF, job_env
from holoprof.serve.app import MAX_BODY_BYTES, Server, make_server
from test_control import LiveJob


@dataclass
class Resp:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    def __init__(self, server: Server) -> None:
        self.port = server.port
        self.token = server.token

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> Resp:
        h = dict(headers or {})
        if auth:
            h.setdefault("Authorization", f"Bearer {self.token}")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            return Resp(r.status, r.headers, r.read())
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Resp:
        return self.request("GET", path, **kw)

    def post(self, path: str, doc: Any, headers: dict[str, str] | None = None, **kw: Any) -> Resp:
        h = {"Content-Type": "application/json", **(headers or {})}
        return self.request("POST", path, body=json.dumps(doc).encode(), headers=h, **kw)


@dataclass
class Env:
    live: LiveJob
    server: Server
    client: Client
    root: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from live_env(tmp_path_factory.mktemp("serve"))


def live_env(root: Path) -> Iterator[Env]:
    """A live training job under ``root`` and a dashboard server over it, stopped when done."""
    job = LiveJob(root)
    server = make_server(str(root), port=0)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        job.wait_ready()
        yield Env(job, server, Client(server), root)
    finally:
        job.stop()
        server.shutdown()
        server.server_close()
        t.join(10)


def wait_states(env: Env, req_id: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doc = env.client.get("/api/runs/live/actions").json()
        (req,) = [r for r in doc["requests"] if r["id"] == req_id]
        if req["states"] and all(s["state"] in ("done", "failed") for s in req["states"]):
            return list(req["states"])
        time.sleep(0.25)
    raise AssertionError(f"request {req_id} was not answered within {timeout_s} s")


# --- authentication --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/api/runs", "/api/runs/live/report", "/metrics", "/static/app.js",
                                  "/api/runs/live/artifacts/x.txt", "/nowhere"])  # fmt: skip
def test_every_page_needs_the_token(env: Env, path: str) -> None:
    assert env.client.get(path, auth=False).status == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert env.client.get(path, headers=wrong, auth=False).status == 403
    assert env.client.get(path + ("&" if "?" in path else "?") + "token=nope", auth=False).status == 403
    cookie = {"Cookie": "holoprof_token=nope"}
    assert env.client.get(path, headers=cookie, auth=False).status == 403


def test_the_token_in_the_url_becomes_an_http_only_strict_cookie(env: Env) -> None:
    r = env.client.get(f"/?token={env.server.token}", auth=False)
    assert r.status == 200 and b"<title>holoprof</title>" in r.body
    cookie = r.headers["Set-Cookie"]
    assert cookie.startswith(f"holoprof_token={env.server.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    r = env.client.get("/api/runs", headers={"Cookie": f"holoprof_token={env.server.token}"}, auth=False)
    assert r.status == 200
    assert "default-src 'self'" in r.headers["Content-Security-Policy"]


def test_the_dashboard_draws_its_charts_with_uplot_alone(env: Env) -> None:
    """Every chart of the dashboard is a uPlot canvas: the page and its scripts write no SVG."""
    page = env.client.get("/")
    assert page.status == 200
    scripts = re.findall(r'<script src="(/static/[^"]+)"', page.body.decode())
    assert "/static/vendor/uPlot.iife.min.js" in scripts and "/static/charts.js" in scripts, scripts
    for path in ["/", *[s for s in scripts if "/vendor/" not in s]]:
        r = env.client.get(path)
        assert r.status == 200 and b"<svg" not in r.body.lower(), path


def test_a_foreign_host_header_is_refused(env: Env) -> None:
    """A DNS-rebinding page would reach 127.0.0.1 under its own host name."""
    r = env.client.get("/api/runs", headers={"Host": f"evil.example:{env.server.port}"})
    assert r.status == 403


def test_the_server_listens_on_loopback_by_default(env: Env) -> None:
    assert env.server.server_address[0] == "127.0.0.1"
    assert env.server.url().startswith(f"http://127.0.0.1:{env.server.port}/?token=")


# --- traversal -------------------------------------------------------------------------------------------


def test_no_path_outside_the_served_files_can_be_read(env: Env) -> None:
    arts = Path(env.live.run_dir, "artifacts")
    secret = env.root / "secret.txt"
    secret.write_text("secret")
    os.symlink(secret, arts / "link-out.txt")
    os.symlink("/etc/passwd", arts / "passwd.txt")
    os.symlink(env.root, env.root / "linked-run")
    (arts / "ok.txt").write_text("fine")
    assert env.client.get("/api/runs/live/artifacts/ok.txt").body == b"fine"
    for path in (
        "/static/../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/collect/control.py",
        "/static/..%2f..%2fapp.py",
        "/api/runs/live/artifacts/..%2fmanifest.json",
        "/api/runs/live/artifacts/%2e%2e%2fmanifest.json",
        "/api/runs/live/artifacts/%2e%2e",
        "/api/runs/live/artifacts/%2fetc%2fpasswd",
        "/api/runs/live/artifacts/link-out.txt",
        "/api/runs/live/artifacts/passwd.txt",
        "/api/runs/%2e%2e/report",
        "/api/runs/..%2f..%2f..%2fetc/report",
        "/api/runs/%2ftmp/report",
        "/api/runs/linked-run/report",
        "//etc/passwd",
        "/api/runs/live/artifacts/..\\manifest.json",
        "/api/runs/live/control/req.json",
    ):
        r = env.client.get(path)
        assert r.status in (400, 403, 404), (path, r.status)
        assert b"secret" not in r.body and b"root:" not in r.body and b"schema_version" not in r.body, path
    runs = [r["id"] for r in env.client.get("/api/runs").json()["runs"]]
    assert runs == ["live"], "a symlinked directory is not served as a run"


# --- JSON API --------------------------------------------------------------------------------------------


def test_runs_and_a_live_report(env: Env) -> None:
    doc = env.client.get("/api/runs").json()
    (run,) = doc["runs"]
    assert run["id"] == "live" and run["status"] == "running" and run["name"] == "live_train"
    first = env.client.get("/api/runs/live/report").json()
    assert first["schema"] == "holoprof.report/1"
    assert first["run"]["status"] == "running"
    assert first["steps"]["count"] > 0
    deadline = time.monotonic() + 30
    while (second := env.client.get("/api/runs/live/report").json())["steps"]["count"] == first["steps"][
        "count"
    ]:
        assert time.monotonic() < deadline, "the report follows the running job"
        time.sleep(0.25)
    assert second["steps"]["count"] > first["steps"]["count"]
    assert env.client.get("/api/runs/nope/report").status == 404


def _post(env: Env, doc: Any, headers: dict[str, str] | None = None, **kw: Any) -> Resp:
    return env.client.post("/api/runs/live/actions", doc, headers=headers, **kw)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"action": "rm -rf"}, 400, "unknown action"),
        ({"action": "deep-profile", "params": {"steps": 0}}, 400, "steps must be between 1 and 100"),
        ({"action": "deep-profile", "params": {"steps": "5"}}, 400, "steps must be a whole number"),
        ({"action": "io-trace", "params": {"seconds": 601}}, 400, "seconds must be between 1 and 600"),
        ({"action": "stacks", "params": {"path": "/etc"}}, 400, "takes no parameter 'path'"),
        ({"action": "stacks", "target": {"host": "x"}}, 400, "target must be null"),
        ({"action": "stacks", "exec": "x"}, 400, "unknown field(s): exec"),
        (["stacks"], 400, "must be a JSON object"),
    ],
)
def test_bad_bodies_are_refused(env: Env, body: Any, status: int, message: str) -> None:
    before = os.listdir(Path(env.live.run_dir, "control"))
    r = _post(env, body)
    assert r.status == status, r.body
    assert message in r.json()["error"]
    assert os.listdir(Path(env.live.run_dir, "control")) == before


def test_malformed_and_oversized_bodies_are_refused(env: Env) -> None:
    c = env.client
    h = {"Content-Type": "application/json"}
    assert c.request("POST", "/api/runs/live/actions", body=b"{not json", headers=h).status == 400
    big = json.dumps({"action": "stacks", "pad": "x" * MAX_BODY_BYTES}).encode()
    assert c.request("POST", "/api/runs/live/actions", body=big, headers=h).status == 413
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert c.request("POST", "/api/runs/live/actions", body=b"action=stacks", headers=form).status == 415
    assert c.request("PUT", "/api/runs/live/actions", body=b"{}", headers=h).status == 405


def test_cross_site_posts_are_refused(env: Env) -> None:
    cookie = {"Cookie": f"holoprof_token={env.server.token}"}
    # the cookie alone (what a cross-site form would carry) is not enough
    assert _post(env, {"action": "stacks"}, headers=cookie, auth=False).status == 403
    same = {**cookie, "X-Holoprof-Request": "1"}
    evil = {**same, "Origin": "http://evil.example"}
    assert _post(env, {"action": "stacks"}, headers=evil, auth=False).status == 403
    site = {**same, "Sec-Fetch-Site": "cross-site"}
    assert _post(env, {"action": "stacks"}, headers=site, auth=False).status == 403
    ok = {**same, "Origin": f"http://127.0.0.1:{env.server.port}", "Sec-Fetch-Site": "same-origin"}
    r = _post(env, {"action": "stacks"}, headers=ok, auth=False)
    assert r.status == 201, r.body
    wait_states(env, r.json()["id"])


def test_each_action_end_to_end(env: Env) -> None:
    ids = {}
    for action, params in (("stacks", {}), ("deep-profile", {"steps": 3}), ("memory-snapshot", {}),
                           ("io-trace", {"seconds": 1})):  # fmt: skip
        r = _post(env, {"action": action, "params": params, "target": None})
        assert r.status == 201, r.body
        doc = r.json()
        assert doc["action"] == action and len(doc["processes"]) == 1
        assert Path(env.live.run_dir, "control", f"req-{doc['id']}.json").is_file()
        ids[action] = doc["id"]
    states = {a: wait_states(env, i) for a, i in ids.items()}
    (stacks,) = states["stacks"]
    assert stacks["state"] == "done"
    r = env.client.get(f"/api/runs/live/artifacts/{stacks['artifacts'][0]}")
    assert r.status == 200 and b'"MainThread"' in r.body
    (deep,) = states["deep-profile"]
    assert deep["state"] == "done", deep
    trace = next(a for a in deep["artifacts"] if not a.endswith(".summary.json"))
    summary = next(a for a in deep["artifacts"] if a.endswith(".summary.json"))
    r = env.client.get(f"/api/runs/live/artifacts/{trace}")
    assert r.status == 200 and r.headers["Content-Disposition"].startswith("attachment")
    assert any(e.get("name") == "aten::addmm" for e in json.loads(r.body)["traceEvents"])
    ops = env.client.get(f"/api/runs/live/artifacts/{summary}").json()["ops"]
    assert any(o["name"] in ("aten::addmm", "aten::linear") for o in ops)
    for action in ("memory-snapshot", "io-trace"):  # answered: done, or failed with a reason
        (s,) = states[action]
        assert s["state"] == "done" or (s["state"] == "failed" and s["reason"]), s
        for name in s["artifacts"]:
            assert env.client.get(f"/api/runs/live/artifacts/{name}").status == 200


# --- /metrics --------------------------------------------------------------------------------------------

_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\} (\S+)$'
)


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter"), line
            types[name] = kind
            continue
        if line.startswith("#") or not line:
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        name, labels, value = m.groups()
        assert name in types, f"{name} has no # TYPE line"
        lab = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels))
        out.setdefault(name, []).append((lab, float(value)))
    return out


def test_metrics_parse_as_prometheus_text(env: Env) -> None:
    r = env.client.get("/metrics")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    m = parse_metrics(r.body.decode())
    ((lab, steps),) = m["holoprof_steps_total"]
    assert lab["run"] == "live" and "rank" in lab and steps > 0
    ((_, step_s),) = m["holoprof_step_time_seconds"]
    assert 0 < step_s < 10
    assert m["holoprof_run_running"] == [({"run": "live"}, 1.0)]
    phases = {lab["phase"]: v for lab, v in m["holoprof_phase_ratio"]}
    assert set(phases) >= {"forward", "backward", "optimizer", "other"}
    assert sum(phases.values()) == pytest.approx(1.0, abs=1e-3)
    ((lab, per_s),) = m["holoprof_steps_per_second"]
    assert per_s > 0 and lab["rank"] == m["holoprof_steps_total"][0][0]["rank"]
    ((_, rss),) = m["holoprof_job_rss_bytes"]
    assert rss > 0


def test_serve_prints_a_tokened_loopback_url_and_warns_off_loopback(tmp_path: Path) -> None:
    for host, warned in (("127.0.0.1", False), ("0.0.0.0", True)):
        proc = subprocess.Popen([*HOLOPROF, "serve", str(tmp_path), "--host", host, "--port", "0"],
                                env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=20)
        assert re.match(
            rf"holoprof: dashboard at http://{re.escape(host)}:\d+/\?token=[\w-]{{20,}}$", line.strip()
        )
        assert ("warning: listening on" in err) is warned, err


def test_a_finished_run_takes_no_actions(env: Env) -> None:
    """Last: stop the job; the API then refuses actions with 409 and still serves the report."""
    assert env.live.stop() == 0, env.live.stderr
    r = _post(env, {"action": "stacks"})
    assert r.status == 409 and "not running" in r.json()["error"]
    deadline = time.monotonic() + 10
    while env.client.get("/api/runs/live/report").json()["run"]["status"] != "finished":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert env.client.get("/api/runs/live/actions").json()["status"] == "finished"


def test_a_live_reports_rebuilds_are_spaced_by_their_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard rebuilds a changed run's report no sooner than REPORT_DUTY times the last build
    took, so a large running job is not slowed by a report built back to back."""
    from holoprof.bench.synth import generate_run
    from holoprof.serve import app
    from holoprof.store.chunks import write_chunk

    root = tmp_path / "runs"
    root.mkdir()
    generate_run(str(root / "big"), steps=20_000)
    runs = app.Runs(str(root))
    monkeypatch.setattr(app, "REPORT_MIN_INTERVAL_S", 0.0)
    first = runs.report("big")
    took = runs._cache["big"].build_s
    assert took > 0 and first["steps"]["count"] == 20_000
    folder = root / "big"  # write_chunk puts the rows in the process's partition

    def one_more_step(i: int) -> None:
        start = 2 * 10**18 + i * 10**9
        write_chunk(str(folder), "spans", {
            "host": ["synth"], "pid": [10_000], "tid": [10_000], "span_id": [10**12 + i], "kind": ["step"],
            "name": ["step"], "start_ns": [start], "end_ns": [start + 10**6], "step": [10**7 + i],
        })  # fmt: skip

    one_more_step(0)
    monkeypatch.setattr(app, "REPORT_DUTY", 3600 / took)  # the next build is an hour away ...
    monkeypatch.setattr(app, "REPORT_MAX_INTERVAL_S", 7200.0)  # ... unless the cap says sooner
    assert runs.report("big") is first, "the data changed, but the last build is too recent"
    monkeypatch.setattr(app, "REPORT_MAX_INTERVAL_S", 0.0)
    assert runs.report("big") is not first, "never older than REPORT_MAX_INTERVAL_S, whatever the cost"
    one_more_step(1)
    monkeypatch.setattr(app, "REPORT_DUTY", 0.0)
    again = runs.report("big")
    assert again is not first and again["steps"]["count"] == 20_002
