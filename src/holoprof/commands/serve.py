"""`holoprof serve RUNS`."""

from __future__ import annotations

import argparse
import sys

from holoprof.errors import HoloprofError
from holoprof.serve.app import make_server
from holoprof.serve.connections import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from holoprof.serve.summaries import default_folder


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", metavar="RUN_OR_RUNS_DIR", help="a run directory, or a directory of runs")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    p.add_argument(
        "--timeout",
        type=float,
        default=REQUEST_TIMEOUT_S,
        metavar="S",
        help=f"close a connection whose next request has not arrived within S seconds, idle or half sent "
        f"(default {REQUEST_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        metavar="N",
        help=f"serve at most N connections at once (a thread each); more are answered 503 at once "
        f"(default {MAX_CONNECTIONS})",
    )


def main(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise HoloprofError("--port must be between 0 and 65535 (0: any free port)")
    if not 0 < args.timeout <= 3600:
        raise HoloprofError("--timeout must be more than 0 and at most 3600 seconds")
    if not 1 <= args.max_connections <= 10_000:
        raise HoloprofError("--max-connections must be between 1 and 10000")
    server = make_server(
        args.runs,
        args.host,
        args.port,
        request_timeout_s=args.timeout,
        max_connections=args.max_connections,
        summaries=default_folder(),
    )
    if not server.loopback:
        sys.stderr.write(
            f"holoprof: warning: listening on {args.host}, reachable from other machines; anyone with the "
            "token can see these runs and start profiles (plain HTTP: use an SSH tunnel on untrusted networks)\n"
        )
    print(f"holoprof: dashboard at {server.url()}", flush=True)
    print(f"holoprof: serving {server.runs.root} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
