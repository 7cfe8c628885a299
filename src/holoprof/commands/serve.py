"""`holoprof serve RUNS`."""

from __future__ import annotations

import argparse
import sys

from holoprof.errors import HoloprofError
from holoprof.serve.app import make_server


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", metavar="RUN_OR_RUNS_DIR", help="a run directory, or a directory of runs")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")


def main(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise HoloprofError("--port must be between 0 and 65535 (0: any free port)")
    server = make_server(args.runs, args.host, args.port)
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
