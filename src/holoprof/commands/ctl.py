"""`holoprof ctl RUN ACTION`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from holoprof import model
from holoprof.commands.common import finite_float
from holoprof.errors import HoloprofError
from holoprof.serve.ctl import request, wait
from holoprof.store import mailbox


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the run directory of a running job")
    p.add_argument("action", help=f"one of: {', '.join(mailbox.ACTION_SPECS)}")
    p.add_argument("--steps", type=int, help="deep-profile: training steps to profile (1-100, default 5)")
    p.add_argument("--seconds", type=int, help="io-trace: seconds to trace (1-600, default 10)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--pid", type=int, help="only the process with this pid")
    g.add_argument("--rank", type=int, help="only the process(es) of this torch.distributed rank")
    g.add_argument("--role", help="only processes of this role (main, rank, dataloader_worker, ...)")
    p.add_argument("--wait", action="store_true", help="wait for every process asked to answer")
    p.add_argument(
        "--timeout", type=finite_float, default=300.0, help="seconds to wait with --wait (default 300)"
    )
    p.add_argument("--json", action="store_true", help="with --wait: print the outcome as JSON")


def main(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {}
    if args.steps is not None:
        params["steps"] = args.steps
    if args.seconds is not None:
        params["seconds"] = args.seconds
    target: dict[str, Any] | None = None
    if args.pid is not None:
        target = {"pid": args.pid}
    elif args.rank is not None:
        target = {"rank": args.rank}
    elif args.role is not None:
        target = {"role": args.role}
    if not args.timeout > 0:
        raise HoloprofError("--timeout must be a positive number of seconds, e.g. --timeout 60")
    run_dir = os.path.abspath(args.run)
    req, procs = request(run_dir, args.action, params, target)
    print(req["id"], flush=True)
    if not procs:
        sys.stderr.write(
            "holoprof: no live traced process matches the target yet; the request stays queued\n"
        )
    if not args.wait:
        return 0
    out = wait(run_dir, req, list(procs), args.timeout)
    if args.json:
        json.dump(out.to_dict(run_dir), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        art = os.path.join(run_dir, model.ARTIFACTS_DIR)
        for s in out.states:
            who = f"{s.get('host')}-{s.get('pid')} ({s.get('role')}, rank {s.get('rank')})"
            reason = f": {s['reason']}" if s.get("reason") else ""
            print(f"{who}: {s.get('state')}{reason}")
            for a in s.get("artifacts", []):
                print(f"  {os.path.join(art, a)}")
        for p in out.gone:
            print(f"{p.key} ({p.role}, rank {p.rank}): ended without answering")
    if out.timed_out:
        keys = ", ".join(p.key for p in out.waiting)
        sys.stderr.write(f"holoprof: timed out after {args.timeout:g} s waiting for {keys}\n")
    return 0 if out.ok else 1
