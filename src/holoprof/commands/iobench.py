"""`holoprof iobench PATH`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from holoprof.bench.iobench import (
    DEFAULT_MAX_SECONDS,
    DEFAULT_PREFETCH,
    parse_int_list,
    parse_size,
    parse_size_list,
    run_iobench,
    to_json,
)
from holoprof.commands.common import finite_float
from holoprof.errors import HoloprofError
from holoprof.present.iobench import render_html, render_terminal
from holoprof.present.terminal import make_console


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``holoprof iobench``."""
    parser.add_argument("path", metavar="PATH", help="dataset: a directory of files, or one large file")
    parser.add_argument(
        "--threads", default="1,2,4,8", help="reader threads per process, a list (default 1,2,4,8)"
    )
    parser.add_argument("--processes", default="1", help="reader processes, a list (default 1)")
    parser.add_argument(
        "--block-size", default="1M", help="read size, a list with units, e.g. 64k,1M (default 1M)"
    )
    parser.add_argument(
        "--prefetch",
        default=str(DEFAULT_PREFETCH),
        help=f"blocks queued between readers and the consumer, a list; 0 = no queue (default {DEFAULT_PREFETCH})",
    )
    parser.add_argument(
        "--max-seconds",
        type=finite_float,
        default=DEFAULT_MAX_SECONDS,
        help=f"time limit per configuration (default {DEFAULT_MAX_SECONDS:g})",
    )
    parser.add_argument("--max-bytes", default=None, help="read at most this much per configuration, e.g. 4G")
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument(
        "--cold",
        dest="cache",
        action="store_const",
        const="cold",
        help="evict the files before each run (default)",
    )
    cache.add_argument(
        "--warm", dest="cache", action="store_const", const="warm", help="measure with a warm page cache"
    )
    parser.set_defaults(cache="cold")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (holoprof.iobench/1)")
    parser.add_argument(
        "--plot", metavar="FILE", default=None, help="write a self-contained HTML chart to FILE"
    )


def main(args: argparse.Namespace) -> int:
    """Run ``holoprof iobench`` from parsed arguments; returns the exit status."""
    threads = parse_int_list(args.threads, "threads", 1)
    processes = parse_int_list(args.processes, "processes", 1)
    block_sizes = parse_size_list(args.block_size, "block-size")
    prefetch = parse_int_list(args.prefetch, "prefetch", 0)
    max_bytes = None if args.max_bytes in (None, "") else parse_size(args.max_bytes, "max-bytes")
    if args.plot:
        plot_dir = Path(args.plot).resolve().parent
        if not plot_dir.is_dir():
            raise HoloprofError(f"cannot write the plot to {args.plot!r}: {plot_dir} is not a directory")
    result = run_iobench(
        args.path,
        threads=threads,
        processes=processes,
        block_sizes=block_sizes,
        prefetch=prefetch,
        cache=args.cache,
        max_seconds=args.max_seconds,
        max_bytes=max_bytes,
    )
    if args.plot:
        Path(args.plot).write_text(render_html(result), encoding="utf-8")
    if args.json:
        sys.stdout.write(json.dumps(to_json(result), indent=2) + "\n")
    else:
        console = make_console()
        render_terminal(result, console)
        if args.plot:
            console.print(f"plot written to {args.plot}")
    return 0
