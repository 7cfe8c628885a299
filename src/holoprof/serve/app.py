"""``holoprof serve``: a live dashboard and JSON API over running and finished runs.

Standard library only (``http.server``). The dashboard's charts use uPlot, shipped inside the
package (``present/assets/vendor``) and drawn by the same ``charts.js`` as the HTML report, with the
palette of :mod:`holoprof.present.palette` (served as ``/static/palette.js``); nothing is fetched from
the network at run time.

Security model:

* bound to 127.0.0.1 unless ``--host`` says otherwise (then a warning is printed);
* a random token is printed with the URL; every page and API call needs it — as ``?token=`` once
  (answered with an HttpOnly, SameSite=Strict cookie; the page then drops it from the address
  bar), as that cookie, or as ``Authorization: Bearer TOKEN``. No token: 401; a wrong one: 403;
* on a loopback address the ``Host`` header must name the loopback address (DNS rebinding);
* POSTs also need the ``X-Holoprof-Token`` header (or ``Authorization: Bearer``), which a cross-site
  form or script cannot send, and a same-origin ``Origin`` when one is given; bodies are JSON of at
  most 16 KiB, and actions come from the allow-list of :mod:`holoprof.store.mailbox`;
* files are served only from the package's static folders (a fixed list made at start) and from a
  run's ``artifacts/`` folder (a plain name, resolved and checked to stay inside it);
* at most ``max_connections`` connections at once, each closed when its next request is late
  (``request_timeout_s``): see :mod:`holoprof.serve.connections`.

``/metrics`` answers from per-run summaries (:mod:`holoprof.serve.summaries`): a finished run's is
built once and then read from memory or disk while its files do not change, a running run's follows
its report (rebuilt at most every few seconds). The summaries a scrape lacks are built by a
background thread; the scrape waits for them at most METRICS_BUILD_BUDGET_S and leaves out the runs
still pending, so that a first scrape over hundreds of runs answers within a scrape timeout.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import math
import mimetypes
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from holoprof import model
from holoprof.analyze.report import build_report
from holoprof.errors import HoloprofError
from holoprof.present.palette import ASSETS_DIR, palette_js
from holoprof.present.prometheus import CONTENT_TYPE, render
from holoprof.serve import ctl
from holoprof.serve.connections import MAX_CONNECTIONS, REQUEST_TIMEOUT_S, WRITE_CHUNK, LimitedServer
from holoprof.serve.summaries import Store, summarize
from holoprof.store import hosts, layout, mailbox, rundir, safeio
from holoprof.store.reader import load, skip_corrupt

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
COOKIE = "holoprof_token"
TOKEN_HEADER = "X-Holoprof-Token"
#: A custom header: browsers send it cross-site only after a CORS preflight, which is never granted.
CSRF_HEADER = "X-Holoprof-Request"
MAX_BODY_BYTES = 16 * 1024
REPORT_MIN_INTERVAL_S = 1.0
#: A live run's report is rebuilt at most once per REPORT_DUTY times its last build's duration (and
#: never more than once per REPORT_MIN_INTERVAL_S), so that the dashboard of a large running job takes
#: at most about a tenth of a core from it ...
REPORT_DUTY = 10.0
#: ... but never less often than once per REPORT_MAX_INTERVAL_S: the dashboard and /metrics stay within
#: a few seconds of the job (a build of a compacted running job takes well under a second).
REPORT_MAX_INTERVAL_S = 2.0
#: /metrics waits at most this long for the summaries of runs it has not seen before (built one at a
#: time by a background thread); the runs still without one are left out of that scrape and counted
#: in ``holoprof_runs_pending`` (present while there are any). Half of Prometheus' default scrape
#: timeout.
METRICS_BUILD_BUDGET_S = 5.0
#: The run list waits at most this long for the summaries (steps, step time) of finished runs it has
#: not seen before; the rest show their steps at the list's next refresh.
LIST_BUILD_BUDGET_S = 2.0
#: A finished run's files are checked for changes (its summary rebuilt if they did), and a run that
#: could not be read is read again while its files stay the same, at most this often.
RECHECK_S = 10.0
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")
_ARTIFACT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,250}$")
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --- runs ----------------------------------------------------------------------------------------------


@dataclass
class _Cached:
    key: tuple[float, int] = (0.0, 0)
    built_at: float = 0.0
    build_s: float = 0.0  # how long the last build took
    doc: dict[str, Any] | None = None
    error: str | None = None  # why the run cannot be read (a broken manifest or chunk)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the run's summary for /metrics and the run list, with a number that changes with it
    summary: tuple[dict[str, Any], int] | None = None
    summary_key: tuple[float, int] = (0.0, 0)  # the data it was made from
    summary_of: dict[str, Any] | None = None  # the report it was made from (none: read from disk)
    checked_at: float = 0.0  # when a finished run's files were last checked against summary_key


def _is_run(path: str) -> bool:
    return os.path.isfile(os.path.join(path, model.MANIFEST))


def run_status(manifest: dict[str, Any]) -> str:
    """The run's status, its launchers' liveness checked (a run of several hosts: every one's)."""
    return hosts.run_state(manifest)[0]


def data_key(run_dir: str) -> tuple[float, int]:
    """The newest modification time among the run's chunks and manifest, and how many files there are
    (in the table folders and the staging folders, and the folders of a run of the earlier layout)."""
    newest, count = 0.0, 0
    try:
        newest = os.stat(os.path.join(run_dir, model.MANIFEST)).st_mtime
    except OSError:
        pass
    folders = layout.process_folders(run_dir)
    folders += [d for t in model.TABLES for d in layout.partition_dirs(run_dir, t)]
    for folder in folders:
        try:
            for c in os.scandir(folder):
                count += 1
                newest = max(newest, c.stat(follow_symlinks=False).st_mtime)
        except OSError:
            continue
    return newest, count


class Runs:
    """The runs under the served path (one run directory, or a directory of runs), their reports and
    their summaries (``summaries``: where finished runs' summaries are stored; None: nowhere)."""

    def __init__(self, root: str, summaries: str | None = None) -> None:
        self.root = os.path.realpath(root)
        self.single = _is_run(self.root)
        self.store = Store(summaries)
        self._cache: dict[str, _Cached] = {}
        self._lock = threading.Lock()
        self._versions = itertools.count(1)
        self._text: tuple[Any, str] | None = None  # the last /metrics text, and what it was made of
        self._queue: dict[str, None] = {}  # runs whose summary the background thread is to build
        self._building: str | None = None  # the one it builds now
        self._builder: threading.Thread | None = None
        self._cond = threading.Condition(self._lock)  # notified after each background build

    def paths(self) -> dict[str, str]:
        if self.single:
            return {os.path.basename(self.root) or "run": self.root}
        out: dict[str, str] = {}
        try:
            names = sorted(os.listdir(self.root))
        except OSError:
            return out
        for name in names:
            p = os.path.join(self.root, name)
            if _RUN_ID.match(name) and not os.path.islink(p) and _is_run(p):
                out[name] = p
        return out

    def path(self, run_id: str) -> str:
        p = self.paths().get(run_id) if _RUN_ID.match(run_id) else None
        if p is None:
            raise HttpError(404, f"no run {run_id!r} here")
        return p

    def _entry(self, run_id: str) -> _Cached:
        with self._lock:
            return self._cache.setdefault(run_id, _Cached())

    def summary(self) -> list[dict[str, Any]]:
        """One line per run. A running run's report is brought up to date (as /metrics does), so that
        its step count follows the job; a finished run's steps come from its summary (from memory or
        disk, else built in the background: the list waits for those builds at most
        LIST_BUILD_BUDGET_S, and shows the runs still pending without steps); a run that cannot be
        read is listed as ``broken``, with why."""
        self._summaries_for_list()
        out = []
        for run_id, p in self.paths().items():
            error = None
            try:
                m = rundir.read_manifest(p)
            except HoloprofError as exc:
                m, error = _manifest(p), str(exc)
            status = run_status(m)
            doc = None
            if error is None and status == "running":
                try:
                    doc = self.report(run_id)
                except HttpError as exc:
                    error = exc.message
            cached = self._cache.get(run_id)
            steps, median = None, None
            if cached is not None:
                doc = doc or cached.doc
                error = error or cached.error
            if doc:
                st = doc.get("steps") or {}
                steps, median = st.get("count"), st.get("median_s")
            elif cached is not None and cached.summary is not None:  # a finished run's, from /metrics
                steps, median = cached.summary[0].get("steps"), cached.summary[0].get("median_step_s")
            out.append(
                {
                    "id": run_id,
                    "name": m.get("name"),
                    "status": "broken" if error else status,
                    "error": error,
                    "command": m.get("command"),
                    "start_ns": _int_or_none(m.get("start_ns")),
                    "end_ns": _int_or_none(m.get("end_ns")),
                    "exit_code": m.get("exit_code"),
                    "steps": steps,
                    "median_step_s": median,
                }
            )
        out.sort(key=lambda r: r["start_ns"] or 0, reverse=True)
        return out

    def _summaries_for_list(self) -> None:
        """Every finished run's summary from memory or disk; those that have none are built in the
        background, waited for at most LIST_BUILD_BUDGET_S."""
        deadline = time.monotonic() + LIST_BUILD_BUDGET_S
        new = []
        for run_id, path in self.paths().items():
            try:
                if run_status(rundir.read_manifest(path)) == "running":
                    continue  # its report is brought up to date by the list itself
                if self._run_summary(run_id, path, build=False, wait_s=0.0) is None:
                    new.append(run_id)
            except (HttpError, HoloprofError):
                continue  # broken: listed as such
        if not new:
            return
        self._build_later(new)
        with self._cond:
            self._cond.wait_for(
                lambda: not any(r in self._queue or r == self._building for r in new),
                timeout=max(0.0, deadline - time.monotonic()),
            )

    def report(self, run_id: str) -> dict[str, Any]:
        """The run's report, rebuilt when its data changed (at most once per second, and at most once
        per REPORT_DUTY times the last build's duration)."""
        path = self.path(run_id)
        cached = self._entry(run_id)
        with cached.lock:
            return self._report(cached, path)

    def _report(self, cached: _Cached, path: str) -> dict[str, Any]:
        """report() with the run's lock held."""
        now = time.monotonic()
        every = max(REPORT_MIN_INTERVAL_S, min(REPORT_DUTY * cached.build_s, REPORT_MAX_INTERVAL_S))
        if cached.doc is not None and (now - cached.built_at < every):
            return cached.doc
        key = data_key(path)
        if cached.doc is not None and key == cached.key:
            cached.built_at = now
            return cached.doc
        if _known_broken(cached, key, now):
            raise HttpError(409, cached.error or "")  # not changed since it failed: no use reading it yet
        started = time.monotonic()
        try:
            doc = skip_corrupt(lambda: _build(path), [path])  # a corrupt chunk is skipped, with a warning
        except Exception as exc:  # a broken run must not take the other runs' pages down
            message = str(exc) if isinstance(exc, HoloprofError) else _unreadable(exc)
            cached.error, cached.doc, cached.built_at, cached.key = message, None, time.monotonic(), key
            raise HttpError(409, message)
        cached.key, cached.built_at, cached.doc, cached.error = key, time.monotonic(), doc, None
        cached.build_s = cached.built_at - started
        return doc

    # summaries and /metrics ---------------------------------------------------------------------------
    def run_summary(
        self, run_id: str, build: bool = True, wait_s: float | None = None
    ) -> tuple[dict[str, Any], int] | None:
        """The run's summary (:func:`holoprof.serve.summaries.summarize`) and its version number: a
        finished run's from memory or disk while its files are unchanged, else from its report.
        ``build=False``: never build (the last summary, or None); ``wait_s``: wait at most this long
        for another thread that is building it (then the last summary, or None)."""
        return self._run_summary(run_id, self.path(run_id), build, wait_s)

    def _run_summary(
        self, run_id: str, path: str, build: bool = True, wait_s: float | None = None
    ) -> tuple[dict[str, Any], int] | None:
        cached = self._entry(run_id)
        if not cached.lock.acquire(timeout=-1 if wait_s is None else max(0.0, wait_s)):
            return cached.summary
        try:
            return self._summary(cached, path, build)
        finally:
            cached.lock.release()

    def _summary(self, cached: _Cached, path: str, build: bool) -> tuple[dict[str, Any], int] | None:
        """run_summary() with the run's lock held."""
        now = time.monotonic()
        last = cached.summary
        if last is not None and last[0].get("status") != "running":  # final while the files stay
            if now - cached.checked_at < RECHECK_S:
                return last
            if data_key(path) == cached.summary_key:
                cached.checked_at = now
                return last
        elif last is None:
            key = data_key(path)
            stored = self.store.get(path, key)
            if stored is not None and stored.get("status") != "running":
                return self._keep(cached, stored, key, None)
            if not build and _known_broken(cached, key, now):
                raise HttpError(409, cached.error or "")  # broken: left out, not pending
        if not build:
            return last
        doc = self._report(cached, path)
        if last is None or cached.summary_of is not doc:
            summary = summarize(doc)
            self._keep(cached, summary, cached.key, doc)
            if summary["status"] != "running":
                self.store.put(path, cached.key, summary)
        return cached.summary

    def _keep(
        self, cached: _Cached, summary: dict[str, Any], key: tuple[float, int], doc: dict[str, Any] | None
    ) -> tuple[dict[str, Any], int]:
        cached.summary = (summary, next(self._versions))
        cached.summary_key, cached.summary_of, cached.checked_at = key, doc, time.monotonic()
        return cached.summary

    def metrics_text(self) -> str:
        """``/metrics``: every readable run's samples. A run seen for the first time has its summary
        built by the background thread; the scrape waits for those builds at most
        METRICS_BUILD_BUDGET_S, and counts the runs still without one in ``holoprof_runs_pending``.
        The text is made again only when a summary changed."""
        deadline = time.monotonic() + METRICS_BUILD_BUDGET_S
        known: dict[str, tuple[dict[str, Any], int] | None] = {}
        for run_id, path in self.paths().items():
            try:
                last = self._entry(run_id).summary
                # a running run's summary follows its report here; a new run's is built in the background
                wait_s = max(0.0, deadline - time.monotonic()) if last is not None else 0.0
                known[run_id] = self._run_summary(run_id, path, build=last is not None, wait_s=wait_s)
            except HttpError:
                continue  # broken (or just deleted): left out, as it is from the run's pages
        new = [run_id for run_id, got in known.items() if got is None]
        if new:
            self._build_later(new)
            with self._cond:
                self._cond.wait_for(
                    lambda: not any(r in self._queue or r == self._building for r in new),
                    timeout=max(0.0, deadline - time.monotonic()),
                )
            for run_id in new:
                known[run_id] = self._entry(run_id).summary
        ready = [(run_id, got) for run_id, got in known.items() if got is not None]
        pending = sum(1 for r in new if known[r] is None and self._entry(r).error is None)
        made_of = (tuple((run_id, version) for run_id, (_, version) in ready), pending)
        last_text = self._text
        if last_text is not None and last_text[0] == made_of:
            return last_text[1]
        text = render(((run_id, s["samples"]) for run_id, (s, _) in ready), pending=pending)
        self._text = (made_of, text)
        return text

    def _build_later(self, run_ids: list[str]) -> None:
        """Build these runs' summaries in the background (one thread, one run at a time)."""
        with self._lock:
            self._queue.update(dict.fromkeys(run_ids))
            if self._builder is None:
                self._builder = threading.Thread(
                    target=self._build_queued, name="holoprof-summaries", daemon=True
                )
                self._builder.start()

    def _build_queued(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._builder = None
                    return
                run_id = next(iter(self._queue))
                del self._queue[run_id]
                self._building = run_id
            try:
                self.run_summary(run_id)
            except Exception:
                pass  # broken, or gone: left out of /metrics
            finally:
                with self._cond:
                    self._building = None
                    self._cond.notify_all()


def _build(path: str) -> dict[str, Any]:
    """The report of the run ``path``."""
    run = load(path)
    try:
        return build_report(run)
    finally:
        try:
            run.con.close()
        except Exception:
            pass


# --- static files ---------------------------------------------------------------------------------------


def _static_files() -> dict[str, str]:
    """Every file of the static folder and of the views' shared assets (``charts.js``, uPlot) by its
    relative name (made once: requests only pick from it)."""
    out = {}
    for folder in (ASSETS_DIR, STATIC_DIR):
        for base, _dirs, files in os.walk(folder):
            for f in files:
                full = os.path.join(base, f)
                rel = os.path.relpath(full, folder).replace(os.sep, "/")
                out[rel] = full
    return out


def artifact_file(run_dir: str, name: str) -> str:
    """The path of artifact ``name`` of the run; refuses anything that is not a file inside artifacts/."""
    if not _ARTIFACT.match(name) or ".." in name:
        raise HttpError(400, "an artifact is named by a plain file name")
    folder = os.path.realpath(os.path.join(run_dir, model.ARTIFACTS_DIR))
    path = os.path.realpath(os.path.join(folder, name))
    if os.path.commonpath([folder, path]) != folder or os.path.dirname(path) != folder:
        raise HttpError(403, "that file is outside the run's artifacts")
    if not os.path.isfile(path):
        raise HttpError(404, f"no artifact {name!r}")
    return path


# --- the HTTP server ------------------------------------------------------------------------------------


class Server(LimitedServer):
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        runs: Runs,
        token: str,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.runs = runs
        self.token = token
        self.static = _static_files()
        self.loopback = _is_loopback(address[0])
        super().__init__(address, Handler, request_timeout_s, max_connections)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self) -> str:
        host = self.server_address[0]
        if isinstance(host, bytes):
            host = host.decode()
        shown = f"[{host}]" if ":" in str(host) else str(host)
        return f"http://{shown}:{self.port}/?token={self.token}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    server_version = "holoprof"
    sys_version = ""
    _set_cookie = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet: no access log on stderr
        pass

    # connection limits (holoprof.serve.connections) ----------------------------------------------------
    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout_s)  # each read, each write

    def handle_one_request(self) -> None:
        self.server.waiting(self.connection)  # the request line and headers are due within the timeout
        super().handle_one_request()

    def _write(self, body: bytes) -> None:
        """Write in pieces, so that the timeout bounds a piece, not the whole answer."""
        view = memoryview(body)
        for start in range(0, len(view), WRITE_CHUNK):
            self.wfile.write(view[start : start + WRITE_CHUNK])

    # responses ---------------------------------------------------------------------------------------
    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self._set_cookie:
            self.send_header("Set-Cookie", self._set_cookie)
        self.end_headers()
        if self.command != "HEAD":
            self._write(body)

    def _json(self, status: int, doc: Any) -> None:
        try:
            body = json.dumps(doc, default=str, allow_nan=False)
        except ValueError:  # NaN or infinity: not JSON; browsers would refuse the whole document
            body = json.dumps(_finite(doc), default=str)
        self._send(status, body.encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message, "status": status})

    # authentication -----------------------------------------------------------------------------------
    def _presented_token(self, query: dict[str, list[str]]) -> tuple[str | None, str]:
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip(), "bearer"
        header = self.headers.get(TOKEN_HEADER)
        if header:
            return header.strip(), "header"
        if "token" in query:
            return query["token"][0], "query"
        cookie = SimpleCookie()
        try:
            cookie.load(self.headers.get("Cookie", ""))
        except Exception:
            return None, ""
        if COOKIE in cookie:
            return cookie[COOKIE].value, "cookie"
        return None, ""

    def _check_host(self) -> None:
        if not self.server.loopback:
            return
        host = (self.headers.get("Host") or "").strip().lower()
        port = self.server.port
        allowed = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
        if host not in allowed:
            raise HttpError(403, "unexpected Host header; open the dashboard through the printed URL")

    def _authenticate(self, query: dict[str, list[str]]) -> str:
        token, how = self._presented_token(query)
        if not token:
            raise HttpError(401, "a token is required: open the URL that `holoprof serve` printed")
        if not secrets.compare_digest(token.encode(), self.server.token.encode()):
            raise HttpError(403, "wrong token: open the URL that `holoprof serve` printed")
        return how

    # dispatch ---------------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self.server.answering(self.connection)  # (a POST's body is read under its own deadline)
        self._set_cookie = ""
        try:
            self._check_host()
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            how = self._authenticate(query)
            raw_path = parts.path
            if self.path.startswith("//") or "\x00" in raw_path or "\\" in raw_path:
                raise HttpError(400, "bad path")
            if how == "query" and method == "GET" and not raw_path.startswith(("/api/", "/metrics")):
                # a cookie from now on (the page then drops the token from the address bar)
                self._set_cookie = f"{COOKIE}={self.server.token}; HttpOnly; SameSite=Strict; Path=/"
            self._route(method, raw_path, how)
        except HttpError as exc:
            if method == "POST":
                self.close_connection = True
            try:
                self._error(exc.status, exc.message)
            except OSError:  # the client left before its answer (a broken pipe, a reset): nothing to say
                self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a bug must not kill the server: answer 500 and go on
            try:
                self._error(500, f"{type(exc).__name__}: {exc}")
            except OSError:
                pass

    def _route(self, method: str, path: str, how: str) -> None:
        segs = [unquote(s) for s in path.split("/")[1:]]
        if any(s in (".", "..") or "/" in s or "\\" in s or "\x00" in s for s in segs):
            raise HttpError(400, "bad path")  # dot segments and encoded separators name nothing here
        runs = self.server.runs
        if path in ("/", "/index.html"):
            self._only(method, "GET")
            return self._index()
        if segs and segs[0] == "static":
            self._only(method, "GET")
            return self._static("/".join(segs[1:]))
        if path == "/metrics":
            self._only(method, "GET")
            return self._send(200, runs.metrics_text().encode(), CONTENT_TYPE)
        if path == "/api/runs":
            self._only(method, "GET")
            return self._json(200, {"root": runs.root, "single": runs.single, "runs": runs.summary()})
        if len(segs) >= 4 and segs[0] == "api" and segs[1] == "runs":
            run_dir = runs.path(segs[2])
            what = segs[3]
            if what == "report" and len(segs) == 4:
                self._only(method, "GET")
                return self._json(200, runs.report(segs[2]))
            if what == "actions" and len(segs) == 4:
                if method == "POST":
                    return self._create_action(run_dir, how)
                self._only(method, "GET")
                return self._json(
                    200,
                    {
                        "status": run_status(_manifest(run_dir)),
                        "specs": {
                            k: {p: list(b) for p, b in v.items()} for k, v in mailbox.ACTION_SPECS.items()
                        },
                        "requests": mailbox.list_requests(run_dir),
                    },
                )
            if what == "artifacts" and len(segs) == 5:
                self._only(method, "GET")
                return self._artifact(run_dir, segs[4])
        raise HttpError(404, "no such page")

    def _only(self, method: str, allowed: str) -> None:
        if method != allowed:
            raise HttpError(405, f"use {allowed} here")

    # pages --------------------------------------------------------------------------------------------
    def _index(self) -> None:
        with open(os.path.join(STATIC_DIR, "index.html"), "rb") as f:
            body = f.read()
        self._send(200, body, "text/html; charset=utf-8")

    def _static(self, rel: str) -> None:
        if rel == "palette.js":  # the one list of phases, colours and labels, from the Python side
            body = palette_js().encode()
            return self._send(
                200, body, "application/javascript; charset=utf-8", {"Cache-Control": "no-cache"}
            )
        path = self.server.static.get(rel)
        if path is None:
            raise HttpError(404, "no such file")
        with open(path, "rb") as f:
            body = f.read()
        ctype = mimetypes.guess_type(path)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype in ("application/javascript",):
            ctype += "; charset=utf-8"
        self._send(200, body, ctype, {"Cache-Control": "no-cache"})

    def _artifact(self, run_dir: str, name: str) -> None:
        path = artifact_file(run_dir, name)
        size = os.path.getsize(path)
        if name.endswith(".json"):
            ctype = "application/json"
        elif name.endswith(".gz"):
            ctype = "application/gzip"
        elif name.endswith(".txt"):
            ctype = "text/plain; charset=utf-8"
        else:
            ctype = "application/octet-stream"
        inline = self.headers.get("Accept", "").startswith("application/json") or name.endswith(".txt")
        disp = "inline" if inline else "attachment"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(size))
        self.send_header("Content-Disposition", f'{disp}; filename="{name}"')
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'none'; sandbox")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(path, "rb") as f:
            while chunk := f.read(WRITE_CHUNK):
                self.wfile.write(chunk)

    # POST /api/runs/<id>/actions ----------------------------------------------------------------------
    def _create_action(self, run_dir: str, how: str) -> None:
        if how not in ("header", "bearer") and not self.headers.get(CSRF_HEADER):
            raise HttpError(
                403, f"a POST needs the {CSRF_HEADER} header with the cookie, or the {TOKEN_HEADER} header"
            )
        origin = self.headers.get("Origin")
        if origin is not None:
            host = self.headers.get("Host", "")
            if origin not in (f"http://{host}", f"https://{host}"):
                raise HttpError(403, "cross-site request refused")
        if self.headers.get("Sec-Fetch-Site") not in (None, "same-origin", "none"):
            raise HttpError(403, "cross-site request refused")
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise HttpError(415, "send the request as Content-Type: application/json")
        if self.headers.get("Transfer-Encoding"):
            raise HttpError(411, "send a Content-Length")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise HttpError(411, "send a Content-Length")
        if length < 0:
            raise HttpError(400, "bad Content-Length")
        if length > MAX_BODY_BYTES:
            raise HttpError(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
        self.server.waiting(self.connection)  # the body is due within the timeout
        raw = self.rfile.read(length)
        self.server.answering(self.connection)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise HttpError(400, "the body is not valid JSON")
        if not isinstance(body, dict):
            raise HttpError(400, 'the body must be a JSON object: {"action": ..., "params": {...}}')
        extra = set(body) - {"action", "params", "target"}
        if extra:
            raise HttpError(400, f"unknown field(s): {', '.join(sorted(extra))}")
        try:
            action, params, target = mailbox.validate(
                body.get("action"), body.get("params"), body.get("target")
            )
        except mailbox.RequestError as exc:
            raise HttpError(400, str(exc))
        try:
            req, procs = ctl.request(run_dir, action, params, target)
        except HoloprofError as exc:
            raise HttpError(409, str(exc))
        self._json(201, {**req, "processes": [p.key for p in procs]})


def _known_broken(cached: _Cached, key: tuple[float, int], now: float) -> bool:
    """The run could not be read, its files have not changed since, and that was under RECHECK_S ago
    (a failure that the files do not show, such as too many open files, is tried again)."""
    return (
        cached.doc is None
        and cached.error is not None
        and key == cached.key
        and now - cached.built_at < RECHECK_S
    )


def _unreadable(exc: BaseException) -> str:
    first = " ".join(str(exc).split())[:200] or type(exc).__name__
    return f"cannot read this run ({type(exc).__name__}: {first}); a chunk of it is probably corrupt"


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _finite(doc: Any) -> Any:
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc


def _manifest(run_dir: str) -> dict[str, Any]:
    try:
        m = safeio.read_json(os.path.join(run_dir, model.MANIFEST), rundir.MAX_MANIFEST_BYTES)
        return m if isinstance(m, dict) else {}
    except (OSError, ValueError):
        return {}


# --- command line --------------------------------------------------------------------------------------


def make_server(
    root: str,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    summaries: str | None = None,
) -> Server:
    """The dashboard server over ``root`` (not yet serving). ``summaries``: the folder where finished
    runs' summaries are kept between servers (:mod:`holoprof.serve.summaries`); None: memory only."""
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise HoloprofError(f"{root} is not a directory; pass a run directory or a directory of runs")
    runs = Runs(root, summaries)
    if not runs.single and not runs.paths() and not os.access(root, os.R_OK):
        raise HoloprofError(f"cannot read {root}; check its permissions")
    try:
        return Server(
            (host, port), runs, token or secrets.token_urlsafe(24), request_timeout_s, max_connections
        )
    except OSError as exc:
        raise HoloprofError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port")
