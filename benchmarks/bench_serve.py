"""`holoprof serve` over many runs: /metrics latency, and what idle connections cost the server.

Generates RUNS small finished runs (``holoprof.bench.synth``, 200 steps each), starts the real
``holoprof serve`` command over them and measures, over HTTP:

* the first ``/metrics`` (nothing cached), how long until a scrape lists every run, ``/metrics``
  then and 11 s later, and under CLIENTS concurrent clients (median and p99 of all their requests);
* the first ``/metrics`` of a second server over the same runs (summaries cached on disk);
* IDLE connections opened and left silent: the server's thread count with them open, and how many
  the server has closed WAIT seconds later (also for HALF_OPEN connections that sent half a request).

The summary cache goes to a temporary folder (``HOLOPROF_CACHE_DIR``), so every run starts cold.

    python benchmarks/bench_serve.py [--runs 100] [--clients 16] [--idle 1000] [--wait 15]
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any


def generate(root: str, n: int) -> None:
    from holoprof.bench.synth import generate_run

    for i in range(n):
        generate_run(os.path.join(root, f"run{i:04d}"), steps=200, seed=i)


class Served:
    """A `holoprof serve` process and its URL."""

    def __init__(self, root: str, env: dict[str, str]) -> None:
        cmd = [sys.executable, "-m", "holoprof.cli", "serve", root, "--port", "0"]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=(\S+)", line)
        if not m:
            raise SystemExit(f"no URL from holoprof serve: {line!r}")
        self.port, self.token = int(m.group(1)), m.group(2)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {self.token}"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def timed_metrics(self) -> tuple[float, int]:
        t = time.perf_counter()
        status, body = self.get("/metrics")
        took = time.perf_counter() - t
        assert status == 200, status
        runs = sum(1 for line in body.decode().splitlines() if line.startswith("holoprof_run_running{"))
        return took, runs

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def concurrent_metrics(served: Served, clients: int, each: int) -> list[float]:
    times: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(each):
            t, _ = served.timed_metrics()
            with lock:
                times.append(t)

    ts = [threading.Thread(target=client) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sorted(times)


def closed_by_server(socks: list[socket.socket]) -> int:
    """How many of the sockets the server has closed (readable, and at end of file or reset)."""
    closed = 0
    for s in socks:
        poll = select.poll()
        poll.register(s, select.POLLIN)
        if poll.poll(0):
            try:
                data = s.recv(4096, socket.MSG_PEEK)
            except OSError:
                closed += 1
                continue
            closed += data == b"" or data.startswith(b"HTTP/1.1 408") or data.startswith(b"HTTP/1.1 503")
    return closed


def idle_connections(served: Served, n: int, partial: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", served.port), timeout=10)
        if partial:
            s.sendall(partial)
        socks.append(s)
    return socks


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--each", type=int, default=10, help="/metrics requests per concurrent client")
    p.add_argument("--idle", type=int, default=1000, help="silent connections to open")
    p.add_argument("--half-open", type=int, default=50, help="connections that send half a request")
    p.add_argument("--wait", type=float, default=15.0, help="seconds to wait before counting closed ones")
    args = p.parse_args()
    out: dict[str, Any] = {}
    started = time.perf_counter()

    def say(what: str) -> None:
        print(f"{time.perf_counter() - started:7.1f} s  {what}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as d:
        root = os.path.join(d, "runs")
        os.mkdir(root)
        t = time.perf_counter()
        generate(root, args.runs)
        gen_s = time.perf_counter() - t
        say("runs generated")
        env = {**os.environ, "HOLOPROF_CACHE_DIR": os.path.join(d, "cache")}
        served = Served(root, env)
        try:
            t = time.perf_counter()
            out["first"] = served.timed_metrics()
            scrapes = 1
            while out["first"][1] < args.runs and served.timed_metrics()[1] < args.runs:
                scrapes += 1
            out["all"] = (time.perf_counter() - t, scrapes)
            out["second"] = served.timed_metrics()
            time.sleep(11)  # past the interval at which finished runs' files are checked again
            out["later"] = served.timed_metrics()
            conc = concurrent_metrics(served, args.clients, args.each)
            out["conc"] = conc
            say(f"metrics measured: {out['first']}, {out['second']}, {out['later']}")
            threads_before = served.threads()
            socks = idle_connections(served, args.idle, b"")
            half = idle_connections(served, args.half_open, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            say("idle connections open")
            time.sleep(1)
            out["threads"] = (threads_before, served.threads())
            t = time.perf_counter()
            status, _ = served.get("/api/runs")
            out["busy_get"] = (status, time.perf_counter() - t)
            time.sleep(max(0.0, args.wait - 1))
            out["closed"] = (closed_by_server(socks), closed_by_server(half))
            out["threads_after"] = served.threads()
            for s in socks + half:
                s.close()
        finally:
            served.stop()
        again = Served(root, env)
        try:
            out["restart"] = again.timed_metrics()
        finally:
            again.stop()

    conc = out["conc"]
    p99 = conc[min(len(conc) - 1, round(0.99 * (len(conc) - 1)))]
    print("## holoprof serve: /metrics over many runs, idle connections\n")
    print(f"`python benchmarks/bench_serve.py --runs {args.runs} --clients {args.clients} --each {args.each} "
          f"--idle {args.idle} --half-open {args.half_open} --wait {args.wait:g}` "
          f"({os.cpu_count()} cores; {args.runs} runs generated in {gen_s:.1f} s)\n")  # fmt: skip
    print("| measure | value |\n| --- | --- |")
    took, runs = out["first"]
    print(f"| first /metrics | {took:.3f} s ({runs} of {args.runs} runs) |")
    took, scrapes = out["all"]
    print(f"| until a scrape lists every run | {took:.1f} s ({scrapes} scrape(s) back to back) |")
    for name, label in (("second", "/metrics then"), ("later", "/metrics 11 s later"),
                        ("restart", "first /metrics of a second server")):  # fmt: skip
        took, runs = out[name]
        print(f"| {label} | {took:.3f} s ({runs} of {args.runs} runs) |")
    print(f"| /metrics, {args.clients} concurrent clients x {args.each} | median {statistics.median(conc):.3f} s, "
          f"p99 {p99:.3f} s, max {conc[-1]:.3f} s |")  # fmt: skip
    before, with_idle = out["threads"]
    print(
        f"| server threads: before, with {args.idle + args.half_open} idle connections | {before}, {with_idle} |"
    )
    status, took = out["busy_get"]
    print(f"| GET /api/runs while they are open | {status} in {took:.3f} s |")
    idle_closed, half_closed = out["closed"]
    print(f"| closed by the server after {args.wait:g} s: silent, half a request | "
          f"{idle_closed} of {args.idle}, {half_closed} of {args.half_open} |")  # fmt: skip
    print(f"| server threads then | {out['threads_after']} |")


if __name__ == "__main__":
    main()
