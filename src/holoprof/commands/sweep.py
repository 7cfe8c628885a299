"""`holoprof sweep`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from holoprof import model
from holoprof.commands.common import finite_float
from holoprof.errors import HoloprofError
from holoprof.present import sweep as present
from holoprof.workflows.sweep import check_template, parse_knobs, parse_params, sweep


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="a parameter and its values; {NAME} in the command is replaced by each (repeatable: all combinations)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="knob_specs",
        metavar="KNOB=V1,V2,...",
        help="a knob applied inside the job with no code change, and its values (repeatable): num_workers, "
        "prefetch_factor, pin_memory, persistent_workers, batch_size, torch_threads, num_parallel_calls, prefetch, "
        "omp_wait_policy, matmul_precision",
    )
    p.add_argument("--steps", type=int, help="end each configuration cleanly after N optimizer steps")
    p.add_argument(
        "--max-seconds",
        type=finite_float,
        help="stop a configuration that runs longer (kept, marked timeout)",
    )
    p.add_argument("--out", help="directory for the runs (default: ./holoprof-runs/<time>-sweep)")
    p.add_argument("--memory", choices=model.MEMORY_MODES, help="memory accounting of each run")
    p.add_argument("--json", action="store_true", help="print the result as JSON (schema holoprof.sweep/1)")
    p.add_argument("--plot", metavar="FILE", help="write a self-contained HTML plot of throughput and memory")
    p.add_argument(
        "command", nargs=argparse.REMAINDER, help="the command, after --, with {NAME} placeholders"
    )


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    params = parse_params(list(args.param), knobs=bool(args.knob_specs))
    knobs = parse_knobs(list(args.knob_specs), params)
    check_template(command, params)
    if args.steps is not None and args.steps <= 0:
        raise HoloprofError("--steps must be a positive number of steps, e.g. --steps 20")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise HoloprofError("--max-seconds must be a positive number of seconds, e.g. --max-seconds 120")
    out = args.out or os.path.join("holoprof-runs", time.strftime("%Y%m%d-%H%M%S") + "-sweep")

    def progress(i: int, n: int, values: dict[str, str]) -> None:
        sys.stderr.write(f"holoprof: sweep {i + 1}/{n}: {', '.join(f'{k}={v}' for k, v in values.items())}\n")
        sys.stderr.flush()

    result = sweep(command, params, out, args.steps, args.max_seconds, args.memory, progress, knobs)
    if args.plot:
        present.write_html(result.to_dict(), args.plot)
        sys.stderr.write(f"holoprof: wrote {args.plot}\n")
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        present.render(result.to_dict())
    return 0 if any(r.status in ("ok", "timeout") for r in result.rows) else 1
