"""`holoprof whatif RUN`."""

from __future__ import annotations

import argparse
import sys

from holoprof.analyze import whatif as wi
from holoprof.commands.common import finite_float
from holoprof.errors import HoloprofError
from holoprof.present.whatif import render, render_html
from holoprof.store.reader import load


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run directory (a single-process run is enough)")
    p.add_argument(
        "--workers", default=",".join(str(n) for n in wi.DEFAULT_WORKERS), help="worker counts, e.g. 2,4,8,16"
    )
    p.add_argument(
        "--bandwidth",
        default=",".join(wi.DEFAULT_BANDWIDTHS),
        help="network bandwidths per worker, e.g. 1Gbit,10Gbit,25Gbit,100Gbit (b = bits, B = bytes)",
    )
    p.add_argument("--latency", default="50us", help="per-message latency, e.g. 50us (default) or 0.2ms")
    p.add_argument(
        "--bucket-mb", type=finite_float, default=wi.DEFAULT_BUCKET_MB, help="DDP bucket_cap_mb (25)"
    )
    p.add_argument("--json", action="store_true", help="print the prediction as JSON (holoprof.whatif/1)")
    p.add_argument("--plot", metavar="FILE", help="write a self-contained HTML file with the plot")


def main(args: argparse.Namespace) -> int:
    workers = wi.parse_workers(args.workers)
    bandwidths = sorted({wi.parse_bandwidth(b) for b in args.bandwidth.split(",") if b.strip()})
    if not bandwidths:
        raise HoloprofError("--bandwidth is empty; use e.g. 1Gbit,10Gbit")
    latency = wi.parse_latency(args.latency)
    result = wi.whatif(load(args.run), workers, bandwidths, latency, args.bucket_mb)
    if args.plot:
        with open(args.plot, "w", encoding="utf-8") as f:
            f.write(render_html(result))
        sys.stderr.write(f"holoprof: wrote {args.plot}\n")
    if args.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        render(result)
    return 0
